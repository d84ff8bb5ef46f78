/* shadow/: the address-space shadow table.
 *
 * Level 1 has one entry per 1 MiB of the user address space (reserved with MAP_NORESERVE, so
 * only the parts in use cost memory); each entry points to a region record created on first
 * use from mmap. A region records, per 8-byte granule (the smallest alignment any allocator
 * hands out), whether an allocation ever returned that address and whether the object that
 * lives there now is large: that gives new/reused detection without any lock and the size
 * class of an object at free time. Page and cache-line levels hang off the same region record.
 */
#ifndef ALLOCLENS_SHADOW_H
#define ALLOCLENS_SHADOW_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AL_SHADOW_REGION_SHIFT 20
#define AL_SHADOW_GRANULE_SHIFT 3
#define AL_SHADOW_GRANULES (1u << (AL_SHADOW_REGION_SHIFT - AL_SHADOW_GRANULE_SHIFT))
#define AL_SHADOW_WORDS (AL_SHADOW_GRANULES / 32) /* 2 bits per granule, 32 granules a word */

struct al_shadow_region {
    _Atomic uint64_t marks[AL_SHADOW_WORDS];
};

struct al_shadow {
    _Atomic(struct al_shadow_region *) *l1;
    uint64_t l1_entries;
    _Atomic uint64_t regions;     /* region records created */
    _Atomic uint64_t untracked;   /* addresses beyond the table (should stay 0) */
};

extern struct al_shadow _al_shadow;

/* Reserves level 1 for this machine's address-space size (47 or 56 bits); 0 or -errno. */
int _al_shadow_init(void);
struct al_shadow_region *_al_shadow_region_create(uint64_t index);
uint64_t _al_shadow_address_bits(void);
size_t _al_shadow_footprint(void);

#define AL_SHADOW_SEEN 1u
#define AL_SHADOW_LARGE 2u

bool _al_shadow_mark_slow(_Atomic uint64_t *w, uint64_t old, uint64_t seen, uint64_t big, bool large);

/* Records that an allocation returned p, for an object of the given class. Returns true when
 * some earlier allocation had already returned p. */
static inline __attribute__((always_inline)) bool _al_shadow_mark(const void *p, bool large)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    uint64_t i1 = a >> AL_SHADOW_REGION_SHIFT;
    if (__builtin_expect(i1 >= _al_shadow.l1_entries, 0)) {
        atomic_fetch_add_explicit(&_al_shadow.untracked, 1, memory_order_relaxed);
        return false;
    }
    struct al_shadow_region *r = atomic_load_explicit(&_al_shadow.l1[i1], memory_order_acquire);
    if (__builtin_expect(r == NULL, 0)) {
        r = _al_shadow_region_create(i1);
        if (!r)
            return false;
    }
    uint64_t g = (a & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) >> AL_SHADOW_GRANULE_SHIFT;
    unsigned shift = (unsigned)(g & 31) * 2;
    uint64_t seen = (uint64_t)AL_SHADOW_SEEN << shift, big = (uint64_t)AL_SHADOW_LARGE << shift;
    _Atomic uint64_t *w = &r->marks[g >> 5];
    /* Most allocations return an address seen before whose mark is already right: a plain
     * load settles those. Only a change takes an atomic (other granules share the word). */
    uint64_t want = large ? seen | big : seen;
    uint64_t old = atomic_load_explicit(w, memory_order_relaxed);
    if (__builtin_expect((old & (seen | big)) == want, 1))
        return true;
    return _al_shadow_mark_slow(w, old, seen, big, large);
}

/* Whether the object at p (about to be freed) was allocated as a large object. */
static inline __attribute__((always_inline)) bool _al_shadow_is_large(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    uint64_t i1 = a >> AL_SHADOW_REGION_SHIFT;
    if (i1 >= _al_shadow.l1_entries)
        return false;
    struct al_shadow_region *r = atomic_load_explicit(&_al_shadow.l1[i1], memory_order_acquire);
    if (!r)
        return false;
    uint64_t g = (a & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) >> AL_SHADOW_GRANULE_SHIFT;
    uint64_t w = atomic_load_explicit(&r->marks[g >> 5], memory_order_relaxed);
    return (w >> ((g & 31) * 2)) & AL_SHADOW_LARGE;
}

#endif
