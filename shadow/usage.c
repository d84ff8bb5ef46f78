/* Levels 2 and 3: bytes in use on each page and each cache line, and which threads own objects
 * on a page and on a line.
 *
 * Objects of a page or more count in the page entries as they are made and freed: the pages
 * they cover whole are theirs alone (a plain store), only the two at their ends take an atomic.
 * Smaller objects would cost an atomic on every call (another thread's object may share the
 * page or line), which is most of what a call costs: their bytes are summed from the object
 * records when a page or line is read instead (reads are rare: snapshots, sampled accesses).
 *
 * Owners, of a page and of a line: the first thread to put an object there, and a bit once a
 * second one does; an allocation writes them only when that changes. Most pages only ever hold
 * one thread's objects (allocators hand each thread its own runs of pages), and their owner
 * stands for every line on them: line entries are written once a second thread comes to the
 * page, starting with the first owner's lines found from the records then. A big object that
 * reaches the page from further back than the records are looked for is found from the page's
 * bytes in use instead, so a page nobody shares costs no line entry at all (most of the level
 * 3 memory of a program with big objects, were each to write its last line itself). A thread
 * that puts an object on such a page at the very moment another one comes can have that one
 * line missed.
 */
#include "shadow.h"

static void own_line(_Atomic uint16_t *l, unsigned tag)
{
    if (!l)
        return;
    uint16_t cur = atomic_load_explicit(l, memory_order_relaxed);
    for (;;) {
        unsigned o = AL_LINE_OWNER(cur);
        uint16_t want = o == 0 ? (uint16_t)(cur | tag << AL_LINE_OWNER_SHIFT)
                               : o == tag ? cur : (uint16_t)(cur | AL_LINE_SHARED);
        if (want == cur || atomic_compare_exchange_weak_explicit(l, &cur, want, memory_order_relaxed,
                                                                 memory_order_relaxed))
            return;
    }
}

/* The line entry of A, NULL where its page has none yet. */
static _Atomic uint16_t *line_find(struct al_shadow_region *r, uint64_t a)
{
    uint16_t b = atomic_load_explicit(&r->page_lines[AL_SHADOW_PAGE_INDEX(a)], memory_order_acquire);
    return b ? &r->line[b - 1][(a >> AL_SHADOW_LINE_SHIFT) & (AL_SHADOW_LINES - 1)] : NULL;
}

/* The same, the page's block handed out first where it has none. Two threads that come at once
 * each take a block and one keeps it; the other's is lost, so in a long run of such races the
 * region's blocks could run out: that page's lines then go unrecorded (NULL), nothing worse.
 * No thread ever waits on another here (one stopped by fork or a signal mid-way cannot hang
 * the rest). */
static _Atomic uint16_t *line_of(struct al_shadow_region *r, uint64_t a)
{
    _Atomic uint16_t *l = line_find(r, a);
    if (l)
        return l;
    uint32_t k = atomic_load_explicit(&r->line_blocks, memory_order_relaxed);
    if (k >= AL_SHADOW_PAGES ||
        (k = atomic_fetch_add_explicit(&r->line_blocks, 1, memory_order_relaxed)) >= AL_SHADOW_PAGES)
        return NULL;
    uint16_t none = 0;
    atomic_compare_exchange_strong_explicit(&r->page_lines[AL_SHADOW_PAGE_INDEX(a)], &none, (uint16_t)(k + 1),
                                            memory_order_acq_rel, memory_order_acquire);
    return line_find(r, a);
}

/* The lines of [lo, hi), all within R's region. */
static void own_lines(struct al_shadow_region *r, uint64_t lo, uint64_t hi, unsigned tag)
{
    for (uint64_t la = lo & ~63ull; la < hi; la += 64)
        own_line(line_of(r, la), tag);
}

/* The objects around [lo, hi): FN gets each granule from a page before LO (no object under a
 * page is longer) up to HI that an allocation ever returned, with its record if the object
 * there is live (NULL otherwise). */
static void each_object(uint64_t lo, uint64_t hi,
                        void (*fn)(uint64_t g, const struct al_shadow_object *live, void *arg), void *arg)
{
    uint64_t step = 1ull << _al_shadow.granule_shift;
    uint64_t from = (lo > AL_SHADOW_PAGE_SIZE ? lo - AL_SHADOW_PAGE_SIZE + step : 0) & ~(step - 1);
    struct al_shadow_region *r = NULL;
    for (uint64_t g = from; g < hi; g += step) {
        if (!r || (g & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) == 0)
            r = _al_shadow_region(g);
        if (!r) {
            g = (g | ((1u << AL_SHADOW_REGION_SHIFT) - 1)) + 1 - step;
            continue;
        }
        uint8_t b = __atomic_load_n(&r->granule[AL_SHADOW_GRANULE(g)], __ATOMIC_RELAXED);
        if (!(b & AL_SHADOW_SEEN))
            continue;
        struct al_shadow_object o;
        fn(g, (b & AL_SHADOW_LIVE) && _al_shadow_object_read(g, &o) ? &o : NULL, arg);
    }
}

struct spill {
    struct al_shadow_region *r;
    uint64_t page, skip;
    unsigned owner;
    uint64_t big; /* bytes on the page of the big objects found, or the new one's */
};

static void spill_one(uint64_t g, const struct al_shadow_object *live, void *arg)
{
    struct spill *s = arg;
    if (g == s->skip)
        return;
    /* The live object's part of the page: [lo, hi). */
    uint64_t lo = g > s->page ? g : s->page, hi = lo, end = s->page + AL_SHADOW_PAGE_SIZE;
    if (live) {
        hi = g + (live->requested ? live->requested : 1);
        hi = hi < end ? hi : end;
        if (live->requested >= AL_SHADOW_BIG && hi > lo)
            s->big += hi - lo;
    }
    if (g >= s->page)
        own_line(line_of(s->r, g), s->owner);
    if (hi > lo)
        own_lines(s->r, lo, hi, s->owner);
}

/* The page at PAGE, so far OWNER's alone, is about to get a second owner: OWNER's lines on it
 * are written out. They are those an object was ever put on (a seen granule) and those a live
 * object reaches. SKIP is the new owner's object of N bytes, recorded already, its big bytes on
 * the page counted already. The page's other big bytes that no record found belong to the one
 * big object from further back that covers the page's start (objects do not overlap); it is
 * OWNER's, since its allocation took every page it covers. */
static void spill_owner(uint64_t page, unsigned owner, uint64_t skip, uint64_t n)
{
    struct spill s = { _al_shadow_region(page), page, skip, owner, 0 };
    if (!s.r)
        return;
    uint64_t end = page + AL_SHADOW_PAGE_SIZE;
    if (n >= AL_SHADOW_BIG) {
        uint64_t lo = skip > page ? skip : page, hi = skip + n < end ? skip + n : end;
        s.big = hi > lo ? hi - lo : 0;
    }
    each_object(page, end, spill_one, &s);
    uint32_t used = atomic_load_explicit(&s.r->page_used[AL_SHADOW_PAGE_INDEX(page)], memory_order_relaxed);
    if (used > s.big)
        own_lines(s.r, page, page + (used - s.big), owner);
}

void _al_shadow_own_slow(struct al_shadow_region *r, uint64_t a, uint64_t n, unsigned tag)
{
    uint64_t end = a + (n ? n : 1);
    uint16_t mine = (uint16_t)(tag << AL_LINE_OWNER_SHIFT);
    for (uint64_t page = a & ~(uint64_t)(AL_SHADOW_PAGE_SIZE - 1); page < end; page += AL_SHADOW_PAGE_SIZE) {
        if (page > a && (page & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) == 0)
            r = _al_shadow_region_get(page);
        if (!r)
            return;
        _Atomic uint16_t *po = &r->page_owner[AL_SHADOW_PAGE_INDEX(page)];
        uint16_t v = atomic_load_explicit(po, memory_order_relaxed);
        bool lines = false;
        while (v != mine) {
            if (v & AL_LINE_SHARED) {
                lines = true;
                break;
            }
            if (v != 0)
                spill_owner(page, AL_LINE_OWNER(v), a, n);
            uint16_t want = v == 0 ? mine : (uint16_t)(v | AL_LINE_SHARED);
            if (atomic_compare_exchange_weak_explicit(po, &v, want, memory_order_relaxed, memory_order_relaxed)) {
                lines = v != 0;
                break;
            }
        }
        if (lines) {
            uint64_t lo = page > a ? page : a, hi = page + AL_SHADOW_PAGE_SIZE < end ? page + AL_SHADOW_PAGE_SIZE : end;
            own_lines(r, lo, hi, tag);
        }
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

struct span {
    uint64_t lo, hi, total;
    bool seen; /* an object was ever put in [lo, hi) */
};

static void add_small(uint64_t g, const struct al_shadow_object *live, void *arg)
{
    struct span *s = arg;
    s->seen |= g >= s->lo;
    if (!live || live->requested >= AL_SHADOW_BIG)
        return;
    uint64_t lo = g > s->lo ? g : s->lo, hi = g + live->requested < s->hi ? g + live->requested : s->hi;
    if (hi > lo)
        s->total += hi - lo;
}

/* Bytes of live objects under a page that lie in [lo, hi); *SEEN (where not NULL): whether an
 * allocation ever returned an address there. */
static uint32_t small_bytes(uint64_t lo, uint64_t hi, bool *seen)
{
    struct span s = { lo, hi, 0, false };
    each_object(lo, hi, add_small, &s);
    if (seen)
        *seen = s.seen;
    return (uint32_t)s.total;
}

uint32_t _al_shadow_page_used(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p, page = a & ~(uint64_t)(AL_SHADOW_PAGE_SIZE - 1);
    struct al_shadow_region *r = _al_shadow_region(a);
    uint32_t big = r ? atomic_load_explicit(&r->page_used[AL_SHADOW_PAGE_INDEX(a)], memory_order_relaxed) : 0;
    return big + small_bytes(page, page + AL_SHADOW_PAGE_SIZE, NULL);
}

uint16_t _al_shadow_line(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p, line = a & ~63ull;
    struct al_shadow_region *r = _al_shadow_region(a);
    if (!r)
        return 0;
    _Atomic uint16_t *l = line_find(r, a);
    uint16_t owners = l ? atomic_load_explicit(l, memory_order_relaxed) : 0;
    bool seen;
    uint32_t used = small_bytes(line, line + 64, &seen);
    /* A page with one owner stands for its lines where an object is or was. */
    uint16_t page = atomic_load_explicit(&r->page_owner[AL_SHADOW_PAGE_INDEX(a)], memory_order_relaxed);
    if (!(page & AL_LINE_SHARED) && !(owners & AL_LINE_OWNER_MASK) &&
        (seen || used || atomic_load_explicit(&r->page_used[AL_SHADOW_PAGE_INDEX(a)], memory_order_relaxed)))
        owners = page;
    return (uint16_t)((owners & ~AL_LINE_USED_MASK) | (used > 64 ? 64 : used));
}
