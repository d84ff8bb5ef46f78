/* The pages the allocator holds from the kernel: one bit per page, in 4 GiB slices (128 KiB
 * each, made on first use) hung off a directory like level 1's. */
#include <errno.h>
#include <sys/mman.h>

#include "shadow.h"

_Atomic(struct al_heap_slice *) *_al_heap_dir;

/* The slices made, in order, so a snapshot need not walk the directory (2^24 entries with a
 * 56-bit address space). */
#define LISTED_MAX 4096
static _Atomic uint64_t listed[LISTED_MAX] AL_LARGE_BSS;
static _Atomic uint32_t nlisted;

int _al_shadow_heap_init(void)
{
    if (_al_heap_dir)
        return 0;
    if (!_al_shadow.dir)
        return -EINVAL;
    size_t bytes = _al_shadow.dir_entries * sizeof *_al_heap_dir;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    _al_heap_dir = p;
    return 0;
}

static struct al_heap_slice *slice(uint64_t d, bool create)
{
    if (!_al_heap_dir)
        return NULL;
    struct al_heap_slice *s = atomic_load_explicit(&_al_heap_dir[d], memory_order_acquire);
    if (s || !create)
        return s;
    bool won = false;
    s = _al_shadow_install((_Atomic(void *) *)&_al_heap_dir[d], sizeof *s, MAP_NORESERVE, &won);
    if (!won)
        return s;
    uint32_t i = atomic_fetch_add(&nlisted, 1);
    if (i < LISTED_MAX)
        atomic_store(&listed[i], d + 1);
    return s;
}

void _al_shadow_heap_set(uint64_t start, uint64_t end, bool on)
{
    start &= ~(uint64_t)(AL_SHADOW_PAGE_SIZE - 1);
    for (uint64_t a = start; a < end;) {
        uint64_t rend = (a | ((1u << AL_SHADOW_REGION_SHIFT) - 1)) + 1;
        if (rend > end)
            rend = end;
        uint64_t d = a >> AL_SHADOW_SLICE_SHIFT;
        struct al_heap_slice *s = d < _al_shadow.dir_entries ? slice(d, on) : NULL;
        if (s) {
            _Atomic uint64_t *w = s->bits[(a >> AL_SHADOW_REGION_SHIFT) & (AL_SHADOW_SLICE_ENTRIES - 1)];
            unsigned first = (unsigned)AL_SHADOW_PAGE_INDEX(a);
            unsigned last = (unsigned)AL_SHADOW_PAGE_INDEX(rend - 1);
            for (unsigned i = first / 64; i <= last / 64; i++) {
                unsigned lo = i == first / 64 ? first % 64 : 0, hi = i == last / 64 ? last % 64 : 63;
                uint64_t bits = (hi == 63 ? ~0ull : (1ull << (hi + 1)) - 1) & ~((1ull << lo) - 1);
                if (on)
                    atomic_fetch_or_explicit(&w[i], bits, memory_order_relaxed);
                else if (atomic_load_explicit(&w[i], memory_order_relaxed) & bits)
                    /* Else nothing to clear, and no page dirtied for it (though a read of a page
                     * never written maps the zero page there, which the footprint counts). */
                    atomic_fetch_and_explicit(&w[i], ~bits, memory_order_relaxed);
            }
        }
        a = rend;
    }
}

/* The K-th slice made, and its directory index; NULL while it is being installed. */
static struct al_heap_slice *listed_slice(uint32_t k, uint64_t *d)
{
    uint64_t v = atomic_load(&listed[k]);
    *d = v ? v - 1 : 0;
    return v ? atomic_load_explicit(&_al_heap_dir[v - 1], memory_order_acquire) : NULL;
}

size_t _al_shadow_heap_footprint(void)
{
    uint32_t n = atomic_load(&nlisted);
    if (n > LISTED_MAX)
        n = LISTED_MAX;
    size_t total = _al_shadow_dir_touched(n, _al_heap_dir ? _al_shadow.dir_entries * sizeof *_al_heap_dir : 0);
    for (uint32_t k = 0; k < n; k++) {
        uint64_t d;
        struct al_heap_slice *s = listed_slice(k, &d);
        if (s)
            total += _al_shadow_resident(s, sizeof *s);
    }
    return total;
}

/* A slice's pages, and the regions whose bits each holds. */
#define SLICE_PAGES (sizeof(struct al_heap_slice) / 4096)
#define REGIONS_PER_PAGE (4096 / sizeof(((struct al_heap_slice *)0)->bits[0]))
_Static_assert(sizeof(struct al_heap_slice) % 4096 == 0, "a slice is whole pages");

_Static_assert(SLICE_PAGES <= 64, "a slice's written pages are one word");

void _al_shadow_heap_runs(int pagemap, void (*fn)(uint64_t start, uint64_t end, void *arg), void *arg)
{
    uint32_t n = atomic_load(&nlisted);
    for (uint32_t k = 0; k < n && k < LISTED_MAX; k++) {
        uint64_t d;
        struct al_heap_slice *s = listed_slice(k, &d);
        if (!s)
            continue;
        /* Only the pages ever written: a page never written holds no bit, and reading it would
         * map the kernel's zero page there, which mincore counts as resident (the table's
         * footprint would grow by memory it does not use). */
        uint64_t written;
        _al_shadow_written_pages(pagemap, s, SLICE_PAGES, &written);
        uint64_t base = d << AL_SHADOW_SLICE_SHIFT, run = 0;
        bool in = false;
        for (unsigned r = 0; r < AL_SHADOW_SLICE_ENTRIES; r++) {
            bool backed = (written >> (r / REGIONS_PER_PAGE)) & 1;
            for (unsigned i = 0; i < AL_SHADOW_PAGES / 64; i++) {
                uint64_t w = backed ? atomic_load_explicit(&s->bits[r][i], memory_order_relaxed) : 0;
                if ((w == 0 && !in) || (w == ~0ull && in))
                    continue;
                for (unsigned b = 0; b < 64; b++) {
                    bool has = (w >> b) & 1;
                    uint64_t at = base + ((uint64_t)r << AL_SHADOW_REGION_SHIFT) +
                                  ((uint64_t)(i * 64 + b) << AL_SHADOW_PAGE_SHIFT);
                    if (has && !in) {
                        run = at;
                        in = true;
                    } else if (!has && in) {
                        fn(run, at, arg);
                        in = false;
                    }
                }
            }
        }
        if (in)
            fn(run, base + (1ull << AL_SHADOW_SLICE_SHIFT), arg);
    }
}
