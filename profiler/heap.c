/* The allocator's heap: the address ranges it holds from the kernel, and how much of them is
 * resident.
 *
 * Ranges come from the allocator's own system calls, seen by the SIGSYS handler while a thread
 * is inside an allocator call (mmap, munmap, mremap, brk). An object found on a page no range
 * covers (memory the allocator mapped before alloclens started, or everything where syscall
 * dispatch is unavailable) makes the mapping around it, read from /proc/self/maps, part of the
 * heap. Residency is measured with mincore when a snapshot is taken.
 */
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "profiler.h"

static _Atomic uint64_t brk_last;
static _Atomic int discover_lock;
static _Atomic uint64_t discovered; /* mappings found through their objects */

void _al_heap_init(void)
{
    atomic_store(&brk_last, (uint64_t)syscall(SYS_brk, 0));
}

void _al_heap_syscall(long nr, const long *args, long ret)
{
    if (!_al_waste.enabled || (ret < 0 && ret > -4096))
        return;
    switch (nr) {
    case SYS_mmap:
        _al_shadow_heap_set((uint64_t)ret, (uint64_t)ret + (uint64_t)args[1], true);
        break;
    case SYS_munmap:
        _al_shadow_heap_set((uint64_t)args[0], (uint64_t)args[0] + (uint64_t)args[1], false);
        break;
    case SYS_mremap:
        _al_shadow_heap_set((uint64_t)args[0], (uint64_t)args[0] + (uint64_t)args[1], false);
        _al_shadow_heap_set((uint64_t)ret, (uint64_t)ret + (uint64_t)args[2], true);
        break;
    case SYS_brk: {
        uint64_t now = (uint64_t)ret, before = atomic_exchange(&brk_last, now);
        if (before && now > before)
            _al_shadow_heap_set(before, now, true);
        else if (before && now < before)
            _al_shadow_heap_set(now, before, false);
        break;
    }
    default:
        break;
    }
}

AL_NOINLINE void _al_heap_discover(uint64_t a)
{
    if (!_al_seccomp_measures_ok())
        return; /* the program's seccomp filter may refuse reading the maps: for good */
    if (!_al_spin_trylock(&discover_lock))
        return; /* another thread is reading the maps: this object's page is found next time */
    uint64_t page = a & ~(uint64_t)4095;
    static char buf[16384] AL_LARGE_BSS; /* under discover_lock */
    struct al_map_span c = { 0 };
    int cancel = _al_nocancel_begin();
    bool found = _al_maps_find(a, buf, sizeof buf, &c);
    _al_nocancel_end(cancel);
    if (found) {
        _al_shadow_heap_set(c.lo, c.hi, true);
        atomic_fetch_add_explicit(&discovered, 1, memory_order_relaxed);
    } else {
        _al_shadow_heap_set(page, page + 4096, true);
    }
    _al_spin_unlock(&discover_lock);
}

/* A thread reading the maps when the program forked is not in the child: its lock is free. */
void _al_heap_after_fork_child(void)
{
    atomic_store(&discover_lock, 0);
}

uint64_t _al_heap_discovered(void)
{
    return atomic_load_explicit(&discovered, memory_order_relaxed);
}

/* ---- residency ----------------------------------------------------------------------------- */

#define VEC_PAGES 65536u

static unsigned char vec[VEC_PAGES] AL_LARGE_BSS;

/* Resident bytes of [start, end) into *TOTAL; false if some page of it is not mapped. */
static bool mapped_resident(uint64_t start, uint64_t end, uint64_t *total)
{
    *total = 0;
    for (uint64_t a = start; a < end;) {
        uint64_t n = (end - a) >> 12;
        if (n > VEC_PAGES)
            n = VEC_PAGES;
        if (mincore((void *)(uintptr_t)a, n << 12, vec) != 0)
            return false;
        for (uint64_t i = 0; i < n; i++)
            *total += (vec[i] & 1) ? 4096 : 0;
        a += n << 12;
    }
    return true;
}

/* Without the maps: pages no longer mapped are found by halving, one mincore per page at the
 * bottom, and dropped from the heap. */
static uint64_t resident_halving(uint64_t start, uint64_t end)
{
    uint64_t total;
    if (mapped_resident(start, end, &total))
        return total;
    if (end - start > 4096) {
        uint64_t half = start + (((end - start) >> 13) << 12);
        return resident_halving(start, half) + resident_halving(half, end);
    }
    _al_shadow_heap_set(start, end, false);
    return 0;
}

struct clip {
    uint64_t at, end, total;
    bool read; /* the maps had a line */
};

/* A mapping: its part of [at, end) measured, the gap before it (unmapped) dropped from the
 * heap; true once past END. */
static bool clip_one(const struct al_map *m, void *arg)
{
    struct clip *c = arg;
    c->read = true;
    if (m->hi <= c->at)
        return false;
    if (m->lo >= c->end)
        return true;
    uint64_t lo = m->lo > c->at ? m->lo : c->at, hi = m->hi < c->end ? m->hi : c->end, t;
    if (lo > c->at)
        _al_shadow_heap_set(c->at, lo, false);
    if (mapped_resident(lo, hi, &t)) /* else changed since the maps were read: next time */
        c->total += t;
    c->at = hi;
    return hi >= c->end;
}

/* Resident bytes of [start, end). Where some of it is no longer mapped (released outside any
 * allocator call alloclens saw: by a thread without syscall user dispatch, or where the kernel
 * has none), the maps say which parts are, in one read: halving down to single pages took a
 * mincore per page of a freed 33 MiB block at every snapshot. */
static uint64_t resident(uint64_t start, uint64_t end)
{
    uint64_t total;
    if (mapped_resident(start, end, &total))
        return total;
    static char buf[16384] AL_LARGE_BSS; /* under waste.c's snapshot lock, as every caller is */
    struct clip c = { start, end, 0, false };
    _al_maps_each(buf, sizeof buf, clip_one, &c);
    if (!c.read)
        return resident_halving(start, end);
    if (c.at < end)
        _al_shadow_heap_set(c.at, end, false);
    return c.total;
}

struct runs {
    uint64_t start, end, total;
};

static void add_run(uint64_t start, uint64_t end, void *arg)
{
    struct runs *r = arg;
    if (r->end == start) { /* one system call for contiguous runs across regions */
        r->end = end;
        return;
    }
    if (r->end > r->start)
        r->total += resident(r->start, r->end);
    r->start = start;
    r->end = end;
}

uint64_t _al_heap_resident(int pagemap)
{
    struct runs r = { 0, 0, 0 };
    _al_shadow_heap_runs(pagemap, add_run, &r);
    if (r.end > r.start)
        r.total += resident(r.start, r.end);
    return r.total;
}
