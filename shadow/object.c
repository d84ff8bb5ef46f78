/* Object records: a live object's requested size (and, for objects of a page or more, the
 * most pages its address ever covered) in the payload nibbles of its first granules.
 *
 * The first nibble says how the rest reads: 0-11 is the size itself; 12, 13 and 14 announce
 * 1, 2 and 4 more nibbles holding size - 12; 15 announces 16 nibbles holding the size. An
 * object of a page or more adds 8 nibbles: the pages it is accounted for, so its free takes
 * back exactly what its allocation counted. A size needs at most ceil(size / 8)
 * nibbles this way (12 bytes: 2, 28: 3, 268: 5, 65548: 17), so in 8-byte granules the record
 * never leaves the object, whose granules no other live object can share. In 16-byte granules
 * it does not either where no object's usable size is in 12..16 or 28..32 bytes
 * (_al_shadow_record_fits): glibc's smallest is 24, and the next 40.
 */
#include "shadow.h"

#define MAX_NIBBLES AL_SHADOW_MAX_NIBBLES

unsigned _al_shadow_record_nibbles(uint64_t req)
{
    unsigned n = req < 12 ? 1 : req < 28 ? 2 : req < 268 ? 3 : req < 65548 ? 5 : 17;
    return req >= AL_SHADOW_BIG ? n + 8 : n;
}

bool _al_shadow_record_fits(uint64_t usable, unsigned shift)
{
    return _al_shadow_record_nibbles(usable) <= (usable + (1ull << shift) - 1) >> shift;
}

static void put(uint8_t *nib, unsigned n, uint64_t v)
{
    for (unsigned i = 0; i < n; i++, v >>= 4)
        nib[i] = (uint8_t)(v & 0xf);
}

static uint64_t get(const uint8_t *nib, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;)
        v = v << 4 | nib[i];
    return v;
}

unsigned _al_shadow_record_encode(uint8_t *nib, uint64_t req, uint32_t pages)
{
    unsigned n;
    if (req < 12) {
        nib[0] = (uint8_t)req;
        n = 1;
    } else if (req < 268) {
        nib[0] = req < 28 ? 12 : 13;
        n = req < 28 ? 2 : 3;
        put(nib + 1, n - 1, req - 12);
    } else if (req < 65548) {
        nib[0] = 14;
        put(nib + 1, 4, req - 12);
        n = 5;
    } else {
        nib[0] = 15;
        put(nib + 1, 16, req);
        n = 17;
    }
    if (req >= AL_SHADOW_BIG) {
        put(nib + n, 8, pages);
        n += 8;
    }
    return n;
}

/* Nibbles of a record's size after its first one, which is FIRST. */
static unsigned size_nibbles_after(unsigned first)
{
    static const unsigned extra[4] = { 1, 2, 4, 16 };
    return first >= 12 ? extra[first - 12] : 0;
}

bool _al_shadow_record_decode(const uint8_t *nib, unsigned avail, uint64_t *req, uint32_t *pages)
{
    unsigned n = 1;
    uint64_t v = nib[0];
    if (v >= 12) {
        n += size_nibbles_after(nib[0]);
        if (n > avail)
            return false;
        v = get(nib + 1, n - 1) + (nib[0] == 15 ? 0 : 12);
    }
    *req = v;
    *pages = 0;
    if (v >= AL_SHADOW_BIG) {
        if (n + 8 > avail)
            return false;
        *pages = (uint32_t)get(nib + n, 8);
    }
    return true;
}

/* The bytes of the N granules from A: in one region, or (an object straddling the end of a
 * region, rare) gathered across two. Only 8-byte granules come here: in 16-byte ones the
 * record of a region's last object runs on into the unused second half of its bytes. */
static unsigned granules(uint64_t a, unsigned n, uint8_t **bytes)
{
    struct al_shadow_region *r = NULL;
    for (unsigned i = 0; i < n; i++) {
        uint64_t x = a + ((uint64_t)i << _al_shadow.granule_shift);
        if (!r || AL_SHADOW_GRANULE(x) == 0)
            r = _al_shadow_region_get(x);
        if (!r)
            return i;
        bytes[i] = &r->granule[AL_SHADOW_GRANULE(x)];
    }
    return n;
}

static bool read_record_far(uint64_t a, uint64_t *req, uint32_t *pages);

/* The common case inline: the record lies in A's own region R. */
static inline bool read_record(struct al_shadow_region *r, uint64_t a, uint64_t *req, uint32_t *pages)
{
    uint64_t g = AL_SHADOW_GRANULE(a);
    if (__builtin_expect(g + MAX_NIBBLES > AL_SHADOW_GRANULES, 0))
        return read_record_far(a, req, pages);
    const uint8_t *b = &r->granule[g];
    unsigned first = b[0] >> 4;
    *pages = 0;
    if (first < 12) {
        *req = first;
        return true;
    }
    uint8_t nib[MAX_NIBBLES];
    for (unsigned i = 0; i < MAX_NIBBLES; i++)
        nib[i] = b[i] >> 4;
    return _al_shadow_record_decode(nib, MAX_NIBBLES, req, pages);
}

static bool read_record_far(uint64_t a, uint64_t *req, uint32_t *pages)
{
    uint8_t *b[MAX_NIBBLES], nib[MAX_NIBBLES];
    if (!granules(a, 1, b))
        return false;
    unsigned n = 1 + size_nibbles_after(*b[0] >> 4);
    /* Only the object's own granules are read: the size says whether pages follow. */
    for (int pass = 0; pass < 2; pass++) {
        unsigned got = granules(a, n, b);
        for (unsigned i = 0; i < got; i++)
            nib[i] = *b[i] >> 4;
        if (!_al_shadow_record_decode(nib, got, req, pages)) {
            if (pass || got < n)
                return false;
            n += 8;
            continue;
        }
        return true;
    }
    return false;
}

bool _al_shadow_object_new_any(struct al_shadow_region *r, uint64_t a, uint64_t req, bool odd, unsigned tag,
                               uint32_t *pages)
{
    uint8_t *head = &r->granule[AL_SHADOW_GRANULE(a)];
    uint8_t old = *head;
    *pages = 0;
    if (req >= AL_SHADOW_BIG) {
        /* The most pages an object starting on this page ever covered: the kernel backs what
         * was touched, and a smaller object there now does not give those pages back. */
        _Atomic uint32_t *span = &r->page_span[AL_SHADOW_PAGE_INDEX(a)];
        *pages = _al_shadow_pages_of(a, req);
        uint32_t before = atomic_load_explicit(span, memory_order_relaxed);
        if (before > *pages)
            *pages = before;
        else
            atomic_store_explicit(span, *pages, memory_order_relaxed);
    }
    uint8_t nib[MAX_NIBBLES], *b[MAX_NIBBLES];
    unsigned n = _al_shadow_record_encode(nib, req, *pages);
    if (AL_SHADOW_GRANULE(a) + n <= AL_SHADOW_GRANULES) {
        for (unsigned i = 1; i < n; i++)
            head[i] = (uint8_t)((head[i] & 0xf) | nib[i] << 4);
    } else {
        n = granules(a, n, b);
        for (unsigned i = 1; i < n; i++)
            *b[i] = (uint8_t)((*b[i] & 0xf) | nib[i] << 4);
    }
    __atomic_store_n(head, (uint8_t)(nib[0] << 4 | AL_SHADOW_SEEN | AL_SHADOW_LIVE | (odd ? AL_SHADOW_ODD : 0)),
                     __ATOMIC_RELAXED);
    if (req >= AL_SHADOW_BIG) {
        _al_shadow_use_big(a, req, 1);
        _al_shadow_own_slow(r, a, req, tag);
    } else {
        _al_shadow_own(r, a, req, tag);
    }
    return (old & AL_SHADOW_SEEN) != 0;
}

bool _al_shadow_object_end_any(struct al_shadow_region *r, uint64_t a, struct al_shadow_object *o)
{
    uint8_t *head = &r->granule[AL_SHADOW_GRANULE(a)];
    uint8_t v = *head;
    if (!(v & AL_SHADOW_LIVE) || !read_record(r, a, &o->requested, &o->pages))
        return false;
    o->odd = (v & AL_SHADOW_ODD) != 0;
    /* The payload stays: the next big object here reads the pages it covered. */
    __atomic_store_n(head, (uint8_t)(v & ~(AL_SHADOW_LIVE | AL_SHADOW_ODD | AL_SHADOW_SAMPLED)), __ATOMIC_RELAXED);
    if (o->requested >= AL_SHADOW_BIG)
        _al_shadow_use_big(a, o->requested, -1);
    return true;
}

bool _al_shadow_object_read(uint64_t a, struct al_shadow_object *o)
{
    struct al_shadow_region *r = _al_shadow_region(a);
    if (!r)
        return false;
    uint8_t v = __atomic_load_n(&r->granule[AL_SHADOW_GRANULE(a)], __ATOMIC_RELAXED);
    o->odd = (v & AL_SHADOW_ODD) != 0;
    return (v & AL_SHADOW_LIVE) && read_record(r, a, &o->requested, &o->pages);
}
