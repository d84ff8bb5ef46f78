/* The pages the allocator holds from the kernel, one bit per page in the region records, and
 * the list of regions holding any, so a snapshot can measure the resident heap without
 * walking the whole table. */
#include <sys/mman.h>

#include "shadow.h"

#define HEAP_MAX (1u << 20)

static _Atomic(struct al_shadow_region *) *heap_list;
static _Atomic uint32_t nheap;

static void list(struct al_shadow_region *r)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong_explicit(&r->heap_listed, &expected, 1, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    if (!heap_list) {
        void *p = mmap(NULL, HEAP_MAX * sizeof *heap_list, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        void *none = NULL;
        if (p == MAP_FAILED)
            return;
        if (!atomic_compare_exchange_strong((_Atomic(void *) *)&heap_list, &none, p))
            munmap(p, HEAP_MAX * sizeof *heap_list);
    }
    uint32_t i = atomic_fetch_add_explicit(&nheap, 1, memory_order_relaxed);
    if (i < HEAP_MAX)
        atomic_store_explicit(&heap_list[i], r, memory_order_release);
}

void _al_shadow_heap_set(uint64_t start, uint64_t end, bool on)
{
    start &= ~(uint64_t)(AL_SHADOW_PAGE_SIZE - 1);
    for (uint64_t a = start; a < end;) {
        uint64_t rend = (a | ((1u << AL_SHADOW_REGION_SHIFT) - 1)) + 1;
        if (rend > end)
            rend = end;
        struct al_shadow_region *r = on ? _al_shadow_region_get(a) : _al_shadow_region(a);
        if (r) {
            if (on)
                list(r);
            unsigned first = (unsigned)AL_SHADOW_PAGE_INDEX(a);
            unsigned last = (unsigned)AL_SHADOW_PAGE_INDEX(rend - 1);
            for (unsigned w = first / 64; w <= last / 64; w++) {
                unsigned lo = w == first / 64 ? first % 64 : 0, hi = w == last / 64 ? last % 64 : 63;
                uint64_t bits = (hi == 63 ? ~0ull : (1ull << (hi + 1)) - 1) & ~((1ull << lo) - 1);
                if (on)
                    atomic_fetch_or_explicit(&r->heap[w], bits, memory_order_relaxed);
                else
                    atomic_fetch_and_explicit(&r->heap[w], ~bits, memory_order_relaxed);
            }
        }
        a = rend;
    }
}

void _al_shadow_heap_runs(void (*fn)(uint64_t start, uint64_t end, void *arg), void *arg)
{
    uint32_t n = atomic_load_explicit(&nheap, memory_order_acquire);
    if (n > HEAP_MAX)
        n = HEAP_MAX;
    for (uint32_t i = 0; i < n; i++) {
        struct al_shadow_region *r = atomic_load_explicit(&heap_list[i], memory_order_acquire);
        if (!r)
            continue;
        uint64_t base = r->base & ~(uint64_t)1;
        unsigned run = 0;
        bool in = false;
        for (unsigned pg = 0; pg <= AL_SHADOW_PAGES; pg++) {
            bool has = pg < AL_SHADOW_PAGES &&
                       ((atomic_load_explicit(&r->heap[pg / 64], memory_order_relaxed) >> (pg % 64)) & 1);
            if (has && !in) {
                run = pg;
                in = true;
            } else if (!has && in) {
                fn(base + ((uint64_t)run << AL_SHADOW_PAGE_SHIFT), base + ((uint64_t)pg << AL_SHADOW_PAGE_SHIFT), arg);
                in = false;
            }
        }
    }
}
