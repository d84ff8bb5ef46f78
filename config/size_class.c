/* O(1) request size -> size class: two linear tables of class indexes, one for requests up to
 * AL_CLASS_SPLIT and one above, each at the coarsest power-of-two granularity that keeps
 * every class boundary on a granule boundary (8 KiB and more above 64 KiB for the BiBOP
 * allocators), so the tables stay small whatever the threshold. Classes that are one run with
 * a power-of-two step are worked out instead: glibc's 8190 took 64 KiB of tables (8-byte
 * granules) and 64 KiB of class list, built and faulted in by every process in full mode. */
#include <errno.h>
#include <string.h>

#include "alloc_config.h"

#define MAX_ENTRIES (1u << 22)

/* Largest power of two (as a shift) dividing every boundary of the range (lo, hi]. */
static unsigned granularity(const struct al_alloc_config *c, uint64_t lo, uint64_t hi)
{
    unsigned shift = 16;
    for (uint32_t i = 0; i < c->nclasses; i++) {
        uint64_t b = c->classes[i];
        if (b <= lo || b >= hi)
            continue;
        unsigned z = (unsigned)__builtin_ctzll(b - lo);
        if (z < shift)
            shift = z;
    }
    return shift;
}

static void layout(const struct al_alloc_config *c, unsigned *s_lo, unsigned *s_hi, uint32_t *n_lo, uint32_t *n_hi)
{
    uint64_t top = c->large_threshold - 1; /* the largest small request */
    uint64_t lo_top = top < AL_CLASS_SPLIT ? top : AL_CLASS_SPLIT;
    *s_lo = granularity(c, 0, lo_top);
    *n_lo = (uint32_t)((lo_top + (1ull << *s_lo) - 1) >> *s_lo);
    *s_hi = 0;
    *n_hi = 0;
    if (top > AL_CLASS_SPLIT) {
        *s_hi = granularity(c, AL_CLASS_SPLIT, top);
        uint64_t n = (top - AL_CLASS_SPLIT + (1ull << *s_hi) - 1) >> *s_hi;
        *n_hi = n > MAX_ENTRIES ? MAX_ENTRIES + 1 : (uint32_t)n;
    }
}

bool _al_class_table_one_run(const struct al_alloc_config *c)
{
    if (c->nruns != 1 || c->runs[0].count != c->nclasses)
        return false;
    uint64_t step = c->runs[0].step;
    return c->runs[0].count == 1 || (step && !(step & (step - 1)));
}

size_t _al_class_table_bytes(const struct al_alloc_config *c)
{
    unsigned s_lo, s_hi;
    uint32_t n_lo, n_hi;
    if (!c->nclasses || c->large_threshold < 2 || _al_class_table_one_run(c))
        return 0;
    layout(c, &s_lo, &s_hi, &n_lo, &n_hi);
    return ((size_t)n_lo + n_hi) * sizeof(uint32_t);
}

/* Granules [BASE, BASE + N << SHIFT) of one of the two tables, K the class reached so far:
 * the class of a granule is the first class at or above its largest request. The last granule
 * may reach past the largest small request (threshold - 1), and classes above that are no
 * boundary: stop there. */
static void fill(uint32_t *out, uint32_t n, uint64_t base, unsigned shift, const struct al_alloc_config *c,
                 uint32_t *k)
{
    uint64_t top = c->large_threshold - 1;
    for (uint32_t g = 0; g < n; g++) {
        uint64_t last = base + (((uint64_t)g + 1) << shift);
        if (last > top)
            last = top;
        while (*k + 1 < c->nclasses && c->classes[*k] < last)
            (*k)++;
        out[g] = *k;
    }
}

int _al_class_table_build(struct al_class_table *t, const struct al_alloc_config *c, void *mem)
{
    if (_al_class_table_one_run(c)) {
        const struct al_class_run *r = &c->runs[0];
        if (c->large_threshold < 2 || _al_config_last_class(c) + 1 < c->large_threshold)
            return -EINVAL;
        *t = (struct al_class_table){ .threshold = c->large_threshold, .one_run = true, .first = r->first,
                                      .step_shift = r->count > 1 ? (unsigned)__builtin_ctzll(r->step) : 0 };
        return 0;
    }
    if (!c->nclasses || c->large_threshold < 2 || c->classes[c->nclasses - 1] + 1 < c->large_threshold)
        return -EINVAL;
    layout(c, &t->shift_lo, &t->shift_hi, &t->n_lo, &t->n_hi);
    if (t->n_hi > MAX_ENTRIES || t->n_lo > MAX_ENTRIES)
        return -EINVAL;
    t->lo = mem;
    t->hi = t->lo + t->n_lo;
    t->threshold = c->large_threshold;
    t->classes = c->classes;
    t->one_run = false;
    uint32_t k = 0; /* the classes rise through both tables */
    fill(t->lo, t->n_lo, 0, t->shift_lo, c, &k);
    fill(t->hi, t->n_hi, AL_CLASS_SPLIT, t->shift_hi, c, &k);
    return 0;
}
