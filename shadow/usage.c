/* Levels 2 and 3: bytes in use on each page and each cache line, and which threads own objects
 * on a line.
 *
 * Objects of a page or more count in the page entries as they are made and freed: the pages
 * they cover whole are theirs alone (a plain store), only the two at their ends take an atomic.
 * Smaller objects would cost an atomic on every call (another thread's object may share the
 * page or line), which is most of what a call costs: their bytes are summed from the object
 * records when a page or line is read instead (reads are rare: snapshots, sampled accesses).
 * A line entry keeps its owners: the first thread to put an object there, and a bit once a
 * second one does; an allocation writes it only when that changes.
 */
#include "shadow.h"

AL_SHADOW_COLD void _al_shadow_own_slow(_Atomic uint16_t *l, unsigned tag)
{
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

void _al_shadow_own_lines(struct al_shadow_region *r, uint64_t a, uint64_t n, unsigned tag)
{
    uint64_t end = a + (n ? n : 1);
    for (uint64_t la = a & ~63ull; la < end; la += 64) {
        if ((la & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) == 0 && la != (a & ~63ull))
            r = _al_shadow_region_get(la);
        if (!r)
            return;
        _al_shadow_own(&r->line[AL_SHADOW_PAGE_INDEX(la)][(la >> AL_SHADOW_LINE_SHIFT) & (AL_SHADOW_LINES - 1)], tag);
    }
}

void _al_shadow_use_big(uint64_t a, uint64_t n, int sign)
{
    uint64_t end = a + n;
    struct al_shadow_region *r = NULL;
    for (uint64_t pa = a; pa < end;) {
        uint64_t page = pa & ~(uint64_t)(AL_SHADOW_PAGE_SIZE - 1);
        uint64_t pend = page + AL_SHADOW_PAGE_SIZE < end ? page + AL_SHADOW_PAGE_SIZE : end;
        if (!r || (page & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) == 0)
            r = sign > 0 ? _al_shadow_region_get(page) : _al_shadow_region(page);
        if (!r)
            return;
        _Atomic uint32_t *u = &r->page_used[AL_SHADOW_PAGE_INDEX(page)];
        uint32_t bytes = (uint32_t)(pend - pa);
        if (bytes == AL_SHADOW_PAGE_SIZE)
            atomic_store_explicit(u, sign > 0 ? AL_SHADOW_PAGE_SIZE : 0, memory_order_relaxed);
        else if (sign > 0)
            atomic_fetch_add_explicit(u, bytes, memory_order_relaxed);
        else
            atomic_fetch_sub_explicit(u, bytes, memory_order_relaxed);
        pa = pend;
    }
}

/* Bytes of live objects under a page that lie in [lo, hi): the records starting up to a page
 * before lo (no such object is longer) through hi. */
static uint32_t small_bytes(uint64_t lo, uint64_t hi)
{
    uint64_t from = lo > AL_SHADOW_PAGE_SIZE ? lo - AL_SHADOW_PAGE_SIZE + 8 : 0, total = 0;
    struct al_shadow_region *r = NULL;
    for (uint64_t g = from & ~7ull; g < hi; g += 8) {
        if (!r || (g & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) == 0 || g == (from & ~7ull))
            r = _al_shadow_region(g);
        if (!r) {
            g = (g | ((1u << AL_SHADOW_REGION_SHIFT) - 1)) + 1 - 8;
            continue;
        }
        uint8_t b = __atomic_load_n(&r->granule[AL_SHADOW_GRANULE(g)], __ATOMIC_RELAXED);
        if (!(b & AL_SHADOW_LIVE))
            continue;
        struct al_shadow_object o;
        if (!_al_shadow_object_read(g, &o) || o.requested >= AL_SHADOW_BIG)
            continue;
        uint64_t s = g > lo ? g : lo, e = g + o.requested < hi ? g + o.requested : hi;
        if (e > s)
            total += e - s;
    }
    return (uint32_t)total;
}

uint32_t _al_shadow_page_used(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p, page = a & ~(uint64_t)(AL_SHADOW_PAGE_SIZE - 1);
    struct al_shadow_region *r = _al_shadow_region(a);
    uint32_t big = r ? atomic_load_explicit(&r->page_used[AL_SHADOW_PAGE_INDEX(a)], memory_order_relaxed) : 0;
    return big + small_bytes(page, page + AL_SHADOW_PAGE_SIZE);
}

uint16_t _al_shadow_line(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p, line = a & ~63ull;
    struct al_shadow_region *r = _al_shadow_region(a);
    if (!r)
        return 0;
    uint16_t owners = atomic_load_explicit(&r->line[AL_SHADOW_PAGE_INDEX(a)][(a >> AL_SHADOW_LINE_SHIFT) & (AL_SHADOW_LINES - 1)],
                                           memory_order_relaxed);
    uint32_t used = small_bytes(line, line + 64);
    return (uint16_t)((owners & ~AL_LINE_USED_MASK) | (used > 64 ? 64 : used));
}
