/* The shadow table's level 1 and the creation of region records (the rare path: once per
 * MiB of address space that ever holds an object). */
#include <errno.h>
#include <sys/mman.h>

#include "shadow.h"

struct al_shadow _al_shadow;

static size_t l1_bytes;

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
    uint64_t entries = 1ull << (bits - AL_SHADOW_REGION_SHIFT);
    size_t bytes = entries * sizeof(*_al_shadow.l1);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    l1_bytes = bytes;
    _al_shadow.l1 = p;
    _al_shadow.l1_entries = entries;
    return 0;
}

struct al_shadow_region *_al_shadow_region_create(uint64_t index)
{
    if (!_al_shadow.l1)
        return NULL;
    void *p = mmap(NULL, sizeof(struct al_shadow_region), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    struct al_shadow_region *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(&_al_shadow.l1[index], &expected, p,
                                                 memory_order_acq_rel, memory_order_acquire)) {
        /* Another thread created it first. */
        munmap(p, sizeof(struct al_shadow_region));
        return expected;
    }
    atomic_fetch_add_explicit(&_al_shadow.regions, 1, memory_order_relaxed);
    return p;
}

size_t _al_shadow_footprint(void)
{
    /* Level 1 is reserved, not committed: count one page of it per 512 regions at most. */
    uint64_t regions = atomic_load_explicit(&_al_shadow.regions, memory_order_relaxed);
    uint64_t l1_pages = (regions + 511) / 512;
    size_t l1_resident = l1_pages * 4096;
    if (l1_resident > l1_bytes)
        l1_resident = l1_bytes;
    return regions * sizeof(struct al_shadow_region) + l1_resident;
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
