/* shadow/: the address-space shadow table.
 *
 * Level 1 has one entry per 1 MiB of the user address space; each entry points to a region
 * record created on first use from mmap. Level 1 itself comes in 4 GiB slices (4096 entries,
 * 32 KiB) hung off a small directory, both made on first use: a flat reservation over the
 * whole address space would cost nothing in memory but a GiB of address space, and programs
 * run under `ulimit -v` would feel it. A region records, per 8-byte granule (the smallest alignment any allocator
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
#define AL_SHADOW_BITS 4 /* per granule: seen, large, sampled */
#define AL_SHADOW_PER_WORD (64 / AL_SHADOW_BITS)
#define AL_SHADOW_WORDS (AL_SHADOW_GRANULES / AL_SHADOW_PER_WORD)

struct al_shadow_region {
    _Atomic uint64_t marks[AL_SHADOW_WORDS];
};

#define AL_SHADOW_SLICE_SHIFT 32
#define AL_SHADOW_SLICE_ENTRIES (1u << (AL_SHADOW_SLICE_SHIFT - AL_SHADOW_REGION_SHIFT))

struct al_shadow_slice {
    _Atomic(struct al_shadow_region *) region[AL_SHADOW_SLICE_ENTRIES];
};

struct al_shadow {
    _Atomic(struct al_shadow_slice *) *dir;
    uint64_t dir_entries;
    _Atomic uint64_t slices;      /* level-1 slices created */
    _Atomic uint64_t regions;     /* region records created */
    _Atomic uint64_t untracked;   /* addresses beyond the table (should stay 0) */
};

extern struct al_shadow _al_shadow;

/* Maps the directory for this machine's address-space size (47 or 56 bits); 0 or -errno. */
int _al_shadow_init(void);
struct al_shadow_region *_al_shadow_region_create(uint64_t address);
uint64_t _al_shadow_address_bits(void);
size_t _al_shadow_footprint(void);

/* The region record of address A, or NULL where none was made yet (or A is beyond the table). */
static inline __attribute__((always_inline)) struct al_shadow_region *_al_shadow_region(uint64_t a)
{
    uint64_t d = a >> AL_SHADOW_SLICE_SHIFT;
    if (__builtin_expect(d >= _al_shadow.dir_entries, 0))
        return NULL;
    struct al_shadow_slice *s = atomic_load_explicit(&_al_shadow.dir[d], memory_order_acquire);
    if (__builtin_expect(s == NULL, 0))
        return NULL;
    return atomic_load_explicit(&s->region[(a >> AL_SHADOW_REGION_SHIFT) & (AL_SHADOW_SLICE_ENTRIES - 1)],
                                memory_order_acquire);
}

/* A region records, per 8-byte granule (the smallest alignment any allocator hands out),
 * whether an allocation ever returned that address, whether the object living there now is
 * large, and whether it is a sampled one: new/reused detection without any lock, and an
 * object's class and sampling at free time from one load near the object itself. */
#define AL_SHADOW_SEEN 1u
#define AL_SHADOW_LARGE 2u
#define AL_SHADOW_SAMPLED 4u

#define AL_SHADOW_GRANULE(a) (((a) & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) >> AL_SHADOW_GRANULE_SHIFT)

bool _al_shadow_mark_slow(_Atomic uint64_t *w, uint64_t old, uint64_t seen, uint64_t big, bool large);

/* Records that an allocation returned p, for an object of the given class. Returns true when
 * some earlier allocation had already returned p. */
static inline __attribute__((always_inline)) bool _al_shadow_mark(const void *p, bool large)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region(a);
    if (__builtin_expect(r == NULL, 0)) {
        r = _al_shadow_region_create(a);
        if (!r)
            return false;
    }
    uint64_t g = AL_SHADOW_GRANULE(a);
    unsigned shift = (unsigned)(g % AL_SHADOW_PER_WORD) * AL_SHADOW_BITS;
    uint64_t seen = (uint64_t)AL_SHADOW_SEEN << shift, big = (uint64_t)AL_SHADOW_LARGE << shift;
    _Atomic uint64_t *w = &r->marks[g / AL_SHADOW_PER_WORD];
    /* Most allocations return an address seen before whose mark is already right: a plain
     * load settles those. Only a change takes an atomic (other granules share the word). */
    uint64_t want = large ? seen | big : seen;
    uint64_t old = atomic_load_explicit(w, memory_order_relaxed);
    if (__builtin_expect((old & (seen | big)) == want, 1))
        return true;
    return _al_shadow_mark_slow(w, old, seen, big, large);
}

/* The marks of the object at p (about to be freed): AL_SHADOW_LARGE, AL_SHADOW_SAMPLED. */
static inline __attribute__((always_inline)) unsigned _al_shadow_flags(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region(a);
    if (!r)
        return 0;
    uint64_t g = AL_SHADOW_GRANULE(a);
    uint64_t w = atomic_load_explicit(&r->marks[g / AL_SHADOW_PER_WORD], memory_order_relaxed);
    return (unsigned)(w >> ((g % AL_SHADOW_PER_WORD) * AL_SHADOW_BITS)) & 0xf;
}

/* Marks or unmarks the object at p as sampled (the rare path). */
void _al_shadow_set_sampled(const void *p, bool sampled);

#endif
