/* The shadow table's level 1 and the creation of region records (the rare path: once per
 * MiB of address space that ever holds an object). */
#include <errno.h>
#include <sys/mman.h>

#include "shadow.h"

struct al_shadow _al_shadow;

static size_t dir_bytes;

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

/* Installs *slot from a fresh zeroed mapping of SIZE bytes unless another thread got there
 * first; returns what the slot holds. */
static void *install(_Atomic(void *) *slot, size_t size, _Atomic uint64_t *made)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    void *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(slot, &expected, p, memory_order_acq_rel, memory_order_acquire)) {
        munmap(p, size);
        return expected;
    }
    atomic_fetch_add_explicit(made, 1, memory_order_relaxed);
    return p;
}

struct al_shadow_region *_al_shadow_region_create(uint64_t a)
{
    uint64_t d = a >> AL_SHADOW_SLICE_SHIFT;
    if (!_al_shadow.dir || d >= _al_shadow.dir_entries) {
        atomic_fetch_add_explicit(&_al_shadow.untracked, 1, memory_order_relaxed);
        return NULL;
    }
    struct al_shadow_slice *s = atomic_load_explicit(&_al_shadow.dir[d], memory_order_acquire);
    if (!s)
        s = install((_Atomic(void *) *)&_al_shadow.dir[d], sizeof *s, &_al_shadow.slices);
    if (!s)
        return NULL;
    _Atomic(struct al_shadow_region *) *slot = &s->region[(a >> AL_SHADOW_REGION_SHIFT) & (AL_SHADOW_SLICE_ENTRIES - 1)];
    struct al_shadow_region *r = atomic_load_explicit(slot, memory_order_acquire);
    if (!r)
        r = install((_Atomic(void *) *)slot, sizeof *r, &_al_shadow.regions);
    return r;
}

size_t _al_shadow_footprint(void)
{
    uint64_t regions = atomic_load_explicit(&_al_shadow.regions, memory_order_relaxed);
    uint64_t slices = atomic_load_explicit(&_al_shadow.slices, memory_order_relaxed);
    /* The directory is touched a page at a time: at most one page per slice. */
    size_t dir = slices * 4096 < dir_bytes ? slices * 4096 : dir_bytes;
    return regions * sizeof(struct al_shadow_region) + slices * sizeof(struct al_shadow_slice) + dir;
}

/* The mark must change: set the seen bit and the large bit as the object wants them. Only the
 * allocation that owns the address changes its bits, but neighbours share the word. */
bool _al_shadow_mark_slow(_Atomic uint64_t *w, uint64_t old, uint64_t seen, uint64_t big, bool large)
{
    if (large)
        old = atomic_fetch_or_explicit(w, seen | big, memory_order_relaxed);
    else if (!(old & seen))
        old = atomic_fetch_or_explicit(w, seen, memory_order_relaxed);
    if (!large && (old & big))
        atomic_fetch_and_explicit(w, ~big, memory_order_relaxed);
    return (old & seen) != 0;
}

void _al_shadow_set_sampled(const void *p, bool sampled)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region(a);
    if (!r && sampled)
        r = _al_shadow_region_create(a);
    if (!r)
        return;
    uint64_t g = AL_SHADOW_GRANULE(a);
    uint64_t bit = (uint64_t)AL_SHADOW_SAMPLED << ((g % AL_SHADOW_PER_WORD) * AL_SHADOW_BITS);
    if (sampled)
        atomic_fetch_or_explicit(&r->marks[g / AL_SHADOW_PER_WORD], bit, memory_order_relaxed);
    else
        atomic_fetch_and_explicit(&r->marks[g / AL_SHADOW_PER_WORD], ~bit, memory_order_relaxed);
}
