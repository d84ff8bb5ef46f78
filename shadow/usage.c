/* Levels 2 and 3: bytes in use on each page and each cache line, and which threads own objects
 * on a line.
 *
 * Objects under a page count in the line entries of the lines they touch and the page entries
 * of their pages; bigger ones in page entries only (their lines hold one object each, and
 * itemizing them would make the table back memory for pages the program may never touch). A
 * line or page an object covers whole is its alone: a plain store sets it. Only the partial
 * ones at an object's ends, shared with neighbours, take an atomic.
 */
#include "shadow.h"

static void line_add(_Atomic uint16_t *l, unsigned bytes, unsigned tag)
{
    uint16_t old = atomic_fetch_add_explicit(l, (uint16_t)bytes, memory_order_relaxed);
    unsigned owner = (old & AL_LINE_OWNER_MASK) >> AL_LINE_OWNER_SHIFT;
    if (__builtin_expect(owner == tag || (old & AL_LINE_SHARED), 1))
        return;
    if (owner != 0) {
        atomic_fetch_or_explicit(l, (uint16_t)AL_LINE_SHARED, memory_order_relaxed);
        return;
    }
    uint16_t cur = atomic_load_explicit(l, memory_order_relaxed);
    for (;;) {
        unsigned o = (cur & AL_LINE_OWNER_MASK) >> AL_LINE_OWNER_SHIFT;
        uint16_t want = o == 0 ? (uint16_t)(cur | tag << AL_LINE_OWNER_SHIFT)
                               : o == tag ? cur : (uint16_t)(cur | AL_LINE_SHARED);
        if (want == cur || atomic_compare_exchange_weak_explicit(l, &cur, want, memory_order_relaxed,
                                                                 memory_order_relaxed))
            return;
    }
}

static void line_sub(_Atomic uint16_t *l, unsigned bytes)
{
    uint16_t old = atomic_fetch_sub_explicit(l, (uint16_t)bytes, memory_order_relaxed);
    if ((old & AL_LINE_USED_MASK) != bytes)
        return;
    /* Empty now: its owners go with its last object (unless a new one came in between). */
    uint16_t cur = (uint16_t)(old - bytes);
    atomic_compare_exchange_strong_explicit(l, &cur, 0, memory_order_relaxed, memory_order_relaxed);
}

void _al_shadow_use(uint64_t a, uint64_t n, int sign, unsigned tag)
{
    if (n == 0)
        return;
    uint64_t end = a + n;
    bool big = n >= AL_SHADOW_BIG;
    struct al_shadow_region *r = NULL;
    for (uint64_t pa = a; pa < end;) {
        uint64_t page = pa & ~(uint64_t)(AL_SHADOW_PAGE_SIZE - 1);
        uint64_t pend = page + AL_SHADOW_PAGE_SIZE < end ? page + AL_SHADOW_PAGE_SIZE : end;
        if (!r || (page & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) == 0 || pa == a)
            r = sign > 0 ? _al_shadow_region_get(page) : _al_shadow_region(page);
        if (!r)
            return;
        unsigned pg = (unsigned)AL_SHADOW_PAGE_INDEX(page);
        uint32_t bytes = (uint32_t)(pend - pa);
        if (bytes == AL_SHADOW_PAGE_SIZE)
            atomic_store_explicit(&r->page_used[pg], sign > 0 ? AL_SHADOW_PAGE_SIZE : 0, memory_order_relaxed);
        else if (sign > 0)
            atomic_fetch_add_explicit(&r->page_used[pg], bytes, memory_order_relaxed);
        else
            atomic_fetch_sub_explicit(&r->page_used[pg], bytes, memory_order_relaxed);
        if (!big) {
            for (uint64_t la = pa; la < pend;) {
                uint64_t lend = (la | 63) + 1 < pend ? (la | 63) + 1 : pend;
                _Atomic uint16_t *l = &r->line[pg][(la >> AL_SHADOW_LINE_SHIFT) & (AL_SHADOW_LINES - 1)];
                unsigned lb = (unsigned)(lend - la);
                if (lb == 64)
                    atomic_store_explicit(l, sign > 0 ? (uint16_t)(64 | tag << AL_LINE_OWNER_SHIFT) : 0,
                                          memory_order_relaxed);
                else if (sign > 0)
                    line_add(l, lb, tag);
                else
                    line_sub(l, lb);
                la = lend;
            }
        }
        pa = pend;
    }
}

uint32_t _al_shadow_page_used(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region(a);
    return r ? atomic_load_explicit(&r->page_used[AL_SHADOW_PAGE_INDEX(a)], memory_order_relaxed) : 0;
}

uint16_t _al_shadow_line(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region(a);
    return r ? atomic_load_explicit(&r->line[AL_SHADOW_PAGE_INDEX(a)][(a >> AL_SHADOW_LINE_SHIFT) & (AL_SHADOW_LINES - 1)],
                                    memory_order_relaxed)
             : 0;
}
