/* The shadow table's level 1, the creation of region records (the rare path: once per MiB of
 * address space that comes to hold an object) and their taking down when the allocator unmaps
 * that MiB (kept for the next, their memory given back), what the table costs, and the rare
 * flag changes of a granule byte (sampled, --mode time's large-object mark). */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shadow.h"
#include "spin.h"

struct al_shadow _al_shadow = { .granule_shift = AL_SHADOW_GRANULE_SHIFT };

static size_t dir_bytes;

/* Every level-1 slice made, for the footprint (one per 4 GiB of address space holding objects;
 * the region records are found through them): a slice past the end of the list is counted as
 * wholly resident and its regions as nothing, one being installed as nothing. */
#define SLICES_MAX 4096
static _Atomic(struct al_shadow_slice *) slice_list[SLICES_MAX] AL_LARGE_BSS;

uint64_t _al_shadow_address_bits(void)
{
    /* With 5-level paging the kernel hands out addresses above 2^47 only to those who ask:
     * ask once; if it obliges, the table must cover 56 bits. */
    void *hint = (void *)(1ull << 50);
    void *p = mmap(hint, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return 47;
    munmap(p, 4096);
    return ((uint64_t)(uintptr_t)p >> 47) ? 56 : 47;
}

int _al_shadow_init(void)
{
    uint64_t bits = _al_shadow_address_bits();
    uint64_t entries = 1ull << (bits - AL_SHADOW_SLICE_SHIFT);
    size_t bytes = entries * sizeof(*_al_shadow.dir);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    dir_bytes = bytes;
    _al_shadow.dir = p;
    _al_shadow.dir_entries = entries;
    return 0;
}

void *_al_shadow_install(_Atomic(void *) *slot, size_t size, int flags, bool *won)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    void *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(slot, &expected, p, memory_order_acq_rel, memory_order_acquire)) {
        munmap(p, size);
        return expected;
    }
    *won = true;
    return p;
}

/* Records taken down are kept mapped, their pages given back, for the next region to be made:
 * never unmapped, as a lookup without the cache (the owners of the lines of an object that
 * starts in the MiB before, shadow/usage.c) may still be reading one, and then reads zeros or
 * another MiB's counts rather than fault. Linked through their first word, under a lock: both
 * ends are rare paths. */
static struct al_shadow_region *spares;
static _Atomic int spares_lock;
static _Atomic uint64_t nspares;

static struct al_shadow_region *spare_pop(void)
{
    _al_spin_lock(&spares_lock);
    struct al_shadow_region *r = spares;
    if (r) {
        memcpy(&spares, r, sizeof spares);
        memset(r, 0, sizeof(void *)); /* the link: the rest reads zero since given back */
        atomic_fetch_sub_explicit(&nspares, 1, memory_order_relaxed);
    }
    _al_spin_unlock(&spares_lock);
    return r;
}

/* A thread of the parent was taking or giving a spare when the program forked. */
void _al_shadow_after_fork_child(void)
{
    _al_spin_unlock(&spares_lock);
}

static void spare_push(struct al_shadow_region *r)
{
    _al_spin_lock(&spares_lock);
    memcpy(r, &spares, sizeof spares);
    spares = r;
    atomic_fetch_add_explicit(&nspares, 1, memory_order_relaxed);
    _al_spin_unlock(&spares_lock);
}

struct al_shadow_region *_al_shadow_region_create(uint64_t a)
{
    uint64_t d = a >> AL_SHADOW_SLICE_SHIFT;
    if (!_al_shadow.dir || d >= _al_shadow.dir_entries) {
        atomic_fetch_add_explicit(&_al_shadow.untracked, 1, memory_order_relaxed);
        return NULL;
    }
    bool won = false;
    struct al_shadow_slice *s = atomic_load_explicit(&_al_shadow.dir[d], memory_order_acquire);
    if (!s) {
        s = _al_shadow_install((_Atomic(void *) *)&_al_shadow.dir[d], sizeof *s, 0, &won);
        if (won) {
            uint64_t i = atomic_fetch_add_explicit(&_al_shadow.slices, 1, memory_order_relaxed);
            if (i < SLICES_MAX)
                atomic_store_explicit(&slice_list[i], s, memory_order_release);
        }
    }
    if (!s)
        return NULL;
    _Atomic(struct al_shadow_region *) *slot = &s->region[(a >> AL_SHADOW_REGION_SHIFT) & (AL_SHADOW_SLICE_ENTRIES - 1)];
    struct al_shadow_region *r = atomic_load_explicit(slot, memory_order_acquire);
    if (!r && (r = spare_pop()) != NULL) {
        struct al_shadow_region *expected = NULL;
        if (!atomic_compare_exchange_strong_explicit(slot, &expected, r, memory_order_acq_rel, memory_order_acquire)) {
            spare_push(r);
            r = expected;
        }
    } else if (!r) {
        won = false;
        r = _al_shadow_install((_Atomic(void *) *)slot, sizeof *r, 0, &won);
        if (won)
            atomic_fetch_add_explicit(&_al_shadow.regions, 1, memory_order_relaxed);
    }
    return r;
}

/* Records taken down at a time: cleared, then the epoch bumped, then given back. */
#define RELEASE_BATCH 64

static void spare_batch(struct al_shadow_region **batch, unsigned n)
{
    if (!n)
        return;
    /* After the slots are cleared: a thread filling its cache reads the epoch before the slot,
     * so any pointer it keeps from before is of an older epoch. */
    atomic_fetch_add_explicit(&_al_shadow.epoch, 1, memory_order_seq_cst);
    for (unsigned i = 0; i < n; i++) {
        madvise(batch[i], sizeof *batch[i], MADV_DONTNEED);
        spare_push(batch[i]);
    }
}

void _al_shadow_release(uint64_t lo, uint64_t hi)
{
    uint64_t first = (lo + (1ull << AL_SHADOW_REGION_SHIFT) - 1) >> AL_SHADOW_REGION_SHIFT;
    uint64_t end = hi >> AL_SHADOW_REGION_SHIFT;
    if (!_al_shadow.dir || hi < lo)
        return;
    struct al_shadow_region *batch[RELEASE_BATCH];
    unsigned n = 0;
    for (uint64_t k = first; k < end;) {
        uint64_t d = k >> (AL_SHADOW_SLICE_SHIFT - AL_SHADOW_REGION_SHIFT);
        struct al_shadow_slice *s =
            d < _al_shadow.dir_entries ? atomic_load_explicit(&_al_shadow.dir[d], memory_order_acquire) : NULL;
        uint64_t slice_end = (d + 1) << (AL_SHADOW_SLICE_SHIFT - AL_SHADOW_REGION_SHIFT);
        if (!s) { /* nothing of this slice's 4 GiB was ever recorded */
            k = slice_end;
            continue;
        }
        for (; k < end && k < slice_end; k++) {
            struct al_shadow_region *r = atomic_exchange_explicit(
                &s->region[k & (AL_SHADOW_SLICE_ENTRIES - 1)], NULL, memory_order_acq_rel);
            if (!r)
                continue;
            batch[n++] = r;
            if (n == RELEASE_BATCH) {
                spare_batch(batch, n);
                n = 0;
            }
        }
    }
    spare_batch(batch, n);
}

__attribute__((noinline)) struct al_shadow_region *_al_shadow_region_fill(struct al_shadow_cache *c, uint64_t a,
                                                                          bool create)
{
    uint64_t epoch = atomic_load_explicit(&_al_shadow.epoch, memory_order_acquire);
    if (c->epoch != epoch) { /* records were taken down: none kept is sure to be good */
        for (unsigned i = 0; i < AL_SHADOW_CACHE_WAYS; i++)
            c->e[i].key = AL_SHADOW_NO_KEY;
        c->epoch = epoch;
    }
    struct al_shadow_region *r = create ? _al_shadow_region_get(a) : _al_shadow_region(a);
    if (r) {
        uint64_t key = a >> AL_SHADOW_REGION_SHIFT;
        c->e[key % AL_SHADOW_CACHE_WAYS] = (struct al_shadow_cache_entry){ .key = key, .r = r };
    }
    return r;
}

size_t _al_shadow_dir_touched(uint64_t slices, size_t bytes)
{
    /* A directory is touched a page at a time: at most one page per slice. */
    return slices * 4096 < bytes ? slices * 4096 : bytes;
}

static size_t mapped(uint64_t regions, uint64_t slices)
{
    return regions * sizeof(struct al_shadow_region) + slices * sizeof(struct al_shadow_slice) +
           _al_shadow_dir_touched(slices, dir_bytes);
}

size_t _al_shadow_mapped(void)
{
    return mapped(atomic_load_explicit(&_al_shadow.regions, memory_order_relaxed),
                  atomic_load_explicit(&_al_shadow.slices, memory_order_relaxed));
}

/* Bytes of [p, p + bytes) the kernel backs; all of them if it cannot tell. */
size_t _al_shadow_resident(const void *p, size_t bytes)
{
    unsigned char vec[64];
    size_t total = 0;
    for (size_t off = 0; off < bytes; off += sizeof vec * 4096) {
        size_t n = bytes - off < sizeof vec * 4096 ? bytes - off : sizeof vec * 4096;
        if (mincore((char *)p + off, n, vec) < 0) {
            total += n;
            continue;
        }
        for (size_t k = 0; k < (n + 4095) / 4096; k++)
            total += (vec[k] & 1) ? 4096 : 0;
    }
    return total;
}

size_t _al_shadow_pagemap_read(int pagemap, uint64_t first_page, size_t n, uint64_t *entries)
{
    ssize_t got = pagemap < 0 ? -1 : pread(pagemap, entries, n * sizeof *entries, (off_t)(first_page * sizeof *entries));
    return got > 0 ? (size_t)got / sizeof *entries : 0;
}

void _al_shadow_written_pages(int pagemap, const void *p, size_t pages, uint64_t *written)
{
    memset(written, 0xff, (pages + 63) / 64 * sizeof *written);
    uint64_t first = (uintptr_t)p / 4096, entries[128];
    for (size_t i = 0; i < pages;) {
        size_t got = _al_shadow_pagemap_read(pagemap, first + i, pages - i < 128 ? pages - i : 128, entries);
        if (!got)
            return; /* the rest count as written */
        for (size_t j = 0; j < got; j++, i++)
            if (!(entries[j] >> 62)) /* neither present (bit 63) nor swapped (bit 62) */
                written[i / 64] &= ~(1ull << (i % 64));
    }
}

/* Region records and heap slices are mostly untouched address space: count what the kernel
 * backs. */
size_t _al_shadow_footprint(void)
{
    uint64_t slices = atomic_load_explicit(&_al_shadow.slices, memory_order_relaxed);
    size_t total = _al_shadow_dir_touched(slices, dir_bytes) + _al_shadow_heap_footprint();
    if (slices > SLICES_MAX)
        total += (slices - SLICES_MAX) * sizeof(struct al_shadow_slice);
    total += atomic_load_explicit(&nspares, memory_order_relaxed) * 4096; /* the page with the link */
    for (uint64_t i = 0; i < slices && i < SLICES_MAX; i++) {
        struct al_shadow_slice *s = atomic_load_explicit(&slice_list[i], memory_order_acquire);
        if (!s)
            continue;
        total += _al_shadow_resident(s, sizeof *s);
        for (unsigned j = 0; j < AL_SHADOW_SLICE_ENTRIES; j++) {
            struct al_shadow_region *r = atomic_load_explicit(&s->region[j], memory_order_acquire);
            total += r ? _al_shadow_resident(r, sizeof *r) : 0;
        }
    }
    return total;
}

void _al_shadow_set_sampled(const void *p, bool sampled)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = sampled ? _al_shadow_region_get(a) : _al_shadow_region(a);
    if (!r)
        return;
    /* One read-modify-write, not a load and a store: a fresh page of the record is then faulted
     * in for writing at once, instead of as the zero page first and copied at the store, with
     * a TLB flush on every CPU the process runs on. */
    uint8_t *b = &r->granule[AL_SHADOW_GRANULE(a)];
    if (sampled)
        __atomic_fetch_or(b, AL_SHADOW_SAMPLED, __ATOMIC_RELAXED);
    else
        __atomic_fetch_and(b, (uint8_t)~AL_SHADOW_SAMPLED, __ATOMIC_RELAXED);
}

void _al_shadow_mark_large(struct al_shadow_region *r, uint64_t a)
{
    uint8_t *b = &r->granule[AL_SHADOW_GRANULE(a)];
    if (!(__atomic_fetch_or(b, AL_SHADOW_MARK_LARGE, __ATOMIC_RELAXED) & AL_SHADOW_MARK_LARGE))
        atomic_fetch_add_explicit(&r->page_large[AL_SHADOW_PAGE_INDEX(a)], 1, memory_order_relaxed);
}

bool _al_shadow_unmark_large(struct al_shadow_region *r, uint64_t a)
{
    uint8_t *b = &r->granule[AL_SHADOW_GRANULE(a)];
    if (!(__atomic_load_n(b, __ATOMIC_RELAXED) & AL_SHADOW_MARK_LARGE))
        return false;
    if (!(__atomic_fetch_and(b, (uint8_t)~AL_SHADOW_MARK_LARGE, __ATOMIC_RELAXED) & AL_SHADOW_MARK_LARGE))
        return false;
    atomic_fetch_sub_explicit(&r->page_large[AL_SHADOW_PAGE_INDEX(a)], 1, memory_order_relaxed);
    return true;
}
