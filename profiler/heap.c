/* The allocator's heap: the address ranges it holds from the kernel, and how much of them is
 * resident.
 *
 * Ranges come from the allocator's own system calls, seen by the SIGSYS handler while a thread
 * is inside an allocator call (mmap, munmap, mremap, brk). An object found on a page no range
 * covers (memory the allocator mapped before alloclens started, or everything where syscall
 * dispatch is unavailable) makes the mapping around it, read from /proc/self/maps, part of the
 * heap. Residency is measured with mincore when a snapshot is taken.
 */
#include <errno.h>
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
    if (!_al_spin_trylock(&discover_lock))
        return; /* another thread is reading the maps: this object's page is found next time */
    uint64_t page = a & ~(uint64_t)4095;
    static char buf[16384]; /* under discover_lock */
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

static unsigned char vec[VEC_PAGES];

/* Resident bytes of [start, end); pages no longer mapped (a range released outside any
 * allocator call, unseen) are found by halving and dropped from the heap. */
static uint64_t resident(uint64_t start, uint64_t end)
{
    uint64_t total = 0;
    for (uint64_t a = start; a < end;) {
        uint64_t n = (end - a) >> 12;
        if (n > VEC_PAGES)
            n = VEC_PAGES;
        if (mincore((void *)(uintptr_t)a, n << 12, vec) == 0) {
            for (uint64_t i = 0; i < n; i++)
                total += (vec[i] & 1) ? 4096 : 0;
        } else if (errno == ENOMEM && n > 1) {
            uint64_t half = a + ((n / 2) << 12);
            total += resident(a, half) + resident(half, a + (n << 12));
        } else {
            _al_shadow_heap_set(a, a + (n << 12), false);
        }
        a += n << 12;
    }
    return total;
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
