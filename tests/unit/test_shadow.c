/* Unit tests of shadow/: new/reused detection (records and --mode time's marks), object
 * records, page and line entries, heap pages, the pagemap's written pages, concurrency,
 * addresses the table does not cover. */
#include <check.h>

#include "check_main.h"
#include <pthread.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shadow.h"

static void setup(void)
{
    if (!_al_shadow.dir)
        ck_assert_int_eq(_al_shadow_init(), 0);
    ck_assert_int_eq(_al_shadow_heap_init(), 0);
}

/* An allocation of REQ bytes at p, as the profiler records it: returns whether p was seen. */
static bool mark(void *p, uint64_t req)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    uint32_t pages;
    return _al_shadow_object_new(_al_shadow_region_get(a), a, req, false, 1, &pages);
}

static bool retire(void *p, struct al_shadow_object *o)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region(a);
    return r && _al_shadow_object_end(r, a, r->granule[AL_SHADOW_GRANULE(a)], o);
}

START_TEST(mark_new_then_reused)
{
    char *base = (char *)(uintptr_t)0x7f0000100000ull;
    struct al_shadow_object o;
    ck_assert(!mark(base, 8));
    ck_assert(retire(base, &o));
    ck_assert(mark(base, 8));
    ck_assert(retire(base, &o));
    /* Neighbouring granules are independent. */
    ck_assert(!mark(base + 8, 8));
    ck_assert(!mark(base + 16, 8));
    ck_assert(retire(base + 8, &o));
    ck_assert(mark(base + 8, 8));
}
END_TEST

/* --mode time: the seen bit and the large-object marks, without records. */
START_TEST(time_marks)
{
    uint64_t a = 0x7f0000300000ull + 4096 + 40;
    struct al_shadow_region *r = _al_shadow_region_get(a);
    ck_assert(!_al_shadow_seen(r, a));
    ck_assert(_al_shadow_seen(r, a));
    ck_assert(!_al_shadow_seen(r, a + 8)); /* the next granule, same word: its own bit */
    ck_assert(!_al_shadow_seen(r, a - 8));
    ck_assert(_al_shadow_seen(r, a + 8));
    /* No large object on the page: a free finds nothing, reading only the page's count. */
    ck_assert(!_al_shadow_take_large(r, a));
    _al_shadow_mark_large(r, a);
    _al_shadow_mark_large(r, a); /* marked twice (freed behind our back): counted once */
    ck_assert_uint_eq(atomic_load(&r->page_large[AL_SHADOW_PAGE_INDEX(a)]), 1);
    ck_assert(!_al_shadow_take_large(r, a + 16)); /* a small neighbour on the same page */
    _al_shadow_mark_large(r, a + 64);
    ck_assert_uint_eq(atomic_load(&r->page_large[AL_SHADOW_PAGE_INDEX(a)]), 2);
    ck_assert(_al_shadow_take_large(r, a));
    ck_assert(!_al_shadow_take_large(r, a)); /* taken once */
    ck_assert(_al_shadow_take_large(r, a + 64));
    ck_assert_uint_eq(atomic_load(&r->page_large[AL_SHADOW_PAGE_INDEX(a)]), 0);
    /* The marks leave the seen bits alone. */
    ck_assert(_al_shadow_seen(r, a));
}
END_TEST

START_TEST(records_round_trip)
{
    /* Every size from 0 to past the largest short form, and big ones, read back exactly; the
     * record never needs more nibbles than the object has granules. */
    static const uint64_t big[] = { 4095, 4096, 4097, 65547, 65548, 65549, 1ull << 20, 33ull << 20, 1ull << 40 };
    uint8_t nib[32];
    for (uint64_t req = 0; req < 70000 + sizeof big / sizeof *big; req++) {
        uint64_t n = req < 70000 ? req : big[req - 70000];
        uint32_t pages_in = n >= AL_SHADOW_BIG ? (uint32_t)(n / 4096 + 2) : 0, pages;
        unsigned k = _al_shadow_record_encode(nib, n, pages_in);
        ck_assert_uint_eq(k, _al_shadow_record_nibbles(n));
        ck_assert_uint_le(k, n < 8 ? 1 : (n + 7) / 8);
        uint64_t back;
        ck_assert(_al_shadow_record_decode(nib, k, &back, &pages));
        ck_assert_uint_eq(back, n);
        ck_assert_uint_eq(pages, pages_in);
        if (k > 1)
            ck_assert(!_al_shadow_record_decode(nib, k - 1, &back, &pages));
    }
}
END_TEST

START_TEST(records_in_the_table)
{
    char *p = (char *)(uintptr_t)0x7f0000300040ull;
    struct al_shadow_object o;
    ck_assert(!(AL_SHADOW_LIVE & _al_shadow_flags(p)));
    mark(p, 300);
    ck_assert(AL_SHADOW_LIVE & _al_shadow_flags(p));
    /* A neighbour written right after the object's own granules leaves its record alone. */
    mark(p + 304, 5);
    ck_assert(retire(p, &o));
    ck_assert_uint_eq(o.requested, 300);
    ck_assert(!o.odd);
    ck_assert(!retire(p, &o)); /* no longer live: a second free has nothing to retire */
    ck_assert(retire(p + 304, &o));
    ck_assert_uint_eq(o.requested, 5);
    ck_assert(!(AL_SHADOW_LIVE & _al_shadow_flags((char *)(uintptr_t)0x7f0000500000ull))); /* no region there */
    /* The sampled mark is independent of the record. */
    mark(p, 40);
    _al_shadow_set_sampled(p, true);
    ck_assert(_al_shadow_flags(p) & AL_SHADOW_SAMPLED);
    _al_shadow_set_sampled(p, false);
    ck_assert(!(_al_shadow_flags(p) & AL_SHADOW_SAMPLED));
    ck_assert(_al_shadow_flags(p) & AL_SHADOW_SEEN);
    ck_assert(retire(p, &o));
}
END_TEST

START_TEST(every_size_through_the_table)
{
    /* Inline records (under a page), the general ones (a page and more), and records near the
     * end of a region, each read back by a free and by a plain read. */
    static const uint64_t at[] = { 0x7f0001100000ull, 0x7f00011fff00ull };
    struct al_shadow_object o;
    for (unsigned k = 0; k < 2; k++)
        for (uint64_t req = 0; req <= 8200; req++) {
            char *p = (char *)(uintptr_t)at[k];
            mark(p, req);
            ck_assert(_al_shadow_object_read((uint64_t)(uintptr_t)p, &o));
            ck_assert_uint_eq(o.requested, req);
            ck_assert(retire(p, &o));
            ck_assert_uint_eq(o.requested, req);
        }
}
END_TEST

static void mark_by(uint64_t a, uint64_t req, unsigned tag)
{
    uint32_t pages;
    _al_shadow_object_new(_al_shadow_region_get(a), a, req, false, tag, &pages);
}

/* A page-aligned object of a page and more, on two pages its thread owns already: when a
 * second thread comes to the page it ends on, its last line is still its thread's (the spill
 * looks back less than a page for records, and finds the rest from the page's bytes in use). */
START_TEST(big_object_keeps_its_last_line)
{
    uint64_t page = 0x7f0001800000ull;
    struct al_shadow_object o;
    mark_by(page, 8, 5);
    ck_assert(retire((void *)(uintptr_t)page, &o));
    mark_by(page + 4096 + 1024, 8, 5);
    ck_assert(retire((void *)(uintptr_t)(page + 4096 + 1024), &o));
    mark_by(page, 5000, 5);
    mark_by(page + 4096 + 2048, 8, 6);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 4999))), 5);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 4096 + 2048))), 6);
}
END_TEST

/* A big object of a second thread that starts two pages back: its bytes on the first owner's
 * page are its own, not taken for the first owner's far-back big object. */
START_TEST(new_big_object_from_pages_back)
{
    uint64_t page = 0x7f0001700000ull;
    mark_by(page + 2048, 64, 1);
    mark_by(page - 8192, 2 * 4096 + 100, 2);
    uint16_t l = _al_shadow_line((void *)(uintptr_t)page);
    ck_assert_uint_eq(AL_LINE_OWNER(l), 2);
    ck_assert(!(l & AL_LINE_SHARED));
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 2048))), 1);
}
END_TEST

/* The pages of R's region record that hold only level 3, and the kernel backs (or maps the zero
 * page into: reads of the fields around it must not count). */
static unsigned level3_pages(struct al_shadow_region *r)
{
    static unsigned char vec[sizeof r->line / 4096];
    uintptr_t lo = ((uintptr_t)r->line + 4095) & ~(uintptr_t)4095;
    uintptr_t hi = ((uintptr_t)r->line + sizeof r->line) & ~(uintptr_t)4095;
    ck_assert_int_eq(mincore((void *)lo, hi - lo, vec), 0);
    unsigned n = 0;
    for (uintptr_t k = 0; k < (hi - lo + 4095) / 4096; k++)
        n += vec[k] & 1;
    return n;
}

/* One thread's big objects, each ending part way into a page: no line entry is written (the
 * pages' owner stands for their lines), so the kernel backs none of level 3 for them. Pages
 * with two owners far apart in the region get their lines in one block after another. */
START_TEST(line_entries_only_where_shared)
{
    uint64_t region = 0x7f0002400000ull, base = region + 64 * 4096;
    for (unsigned i = 0; i < 8; i++)
        mark_by(base + i * 3 * 4096 + 100, 2 * 4096 + 500, 9);
    struct al_shadow_region *r = _al_shadow_region(base);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->line_blocks, 0);
    unsigned before = level3_pages(r);
    ck_assert_uint_eq(before, 0);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(base + 2 * 4096 + 599))), 9);
    /* Another region: twenty pages 8 apart, whose lines would span five pages of a table by
     * page index. */
    r = _al_shadow_region_get(region + (1u << 20));
    before = level3_pages(r);
    for (unsigned i = 0; i < 20; i++) {
        uint64_t page = region + (1u << 20) + (uint64_t)i * 8 * 4096 + 4096;
        mark_by(page, 64, 3);
        mark_by(page + 64, 64, 4);
        ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)page)), 3);
        ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 64))), 4);
        ck_assert_uint_eq(_al_shadow_line((void *)(uintptr_t)(page + 128)), 0);
    }
    ck_assert_uint_eq(r->line_blocks, 20);
    ck_assert_uint_le(level3_pages(r), before + 1);
}
END_TEST

START_TEST(page_owners_stand_for_their_lines)
{
    uint64_t page = 0x7f0001400000ull;
    struct al_shadow_object o;
    /* One thread's page: its lines with an object (live or freed) are that thread's. */
    mark_by(page, 40, 3);
    mark_by(page + 256, 40, 3);
    mark_by(page + 512, 16, 3);
    ck_assert(retire((void *)(uintptr_t)(page + 512), &o));
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)page)), 3);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 256))), 3);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 512))), 3);
    ck_assert_uint_eq(_al_shadow_line((void *)(uintptr_t)(page + 128)), 0); /* never used */
    ck_assert(!(_al_shadow_line((void *)(uintptr_t)page) & AL_LINE_SHARED));
    /* A second thread comes: the first one's lines are written out, the new one's added. */
    mark_by(page + 64, 16, 4);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)page)), 3);
    ck_assert(!(_al_shadow_line((void *)(uintptr_t)page) & AL_LINE_SHARED));
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 64))), 4);
    ck_assert(!(_al_shadow_line((void *)(uintptr_t)(page + 64)) & AL_LINE_SHARED));
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 256))), 3);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 512))), 3);
    ck_assert_uint_eq(_al_shadow_line((void *)(uintptr_t)(page + 128)), 0);
    /* Two threads on one line. */
    mark_by(page + 40, 8, 4);
    ck_assert(_al_shadow_line((void *)(uintptr_t)page) & AL_LINE_SHARED);
    /* A big object's last line, on a page it reaches from far back, is its thread's too. */
    uint64_t big = 0x7f0001500000ull + 100, end = big + 3 * 4096;
    mark_by(big, 3 * 4096, 5);
    mark_by(end, 16, 6);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(end - 1))), 5);
    ck_assert(_al_shadow_line((void *)(uintptr_t)end) & AL_LINE_SHARED);
    /* The pages a big object covers whole are its thread's, also where the pages at its two
     * ends were its thread's already. */
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(big + 4096))), 5);
    uint64_t span = 0x7f0001600000ull;
    mark_by(span, 16, 7);
    mark_by(span + 3 * 4096, 16, 7);
    mark_by(span + 64, 3 * 4096, 7);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(span + 4096))), 7);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(span + 2 * 4096))), 7);
}
END_TEST

START_TEST(big_objects_keep_their_most_pages)
{
    char *p = (char *)(uintptr_t)0x7f0000e00010ull; /* 16 bytes into a page */
    struct al_shadow_object o;
    uint32_t pages;
    uint64_t a = (uint64_t)(uintptr_t)p;
    _al_shadow_object_new(_al_shadow_region_get(a), a, 5 * 4096, false, 1, &pages);
    ck_assert_uint_eq(pages, 6); /* 16 + 20480 bytes reach into a sixth page */
    ck_assert(retire(p, &o));
    ck_assert_uint_eq(o.pages, 6);
    _al_shadow_object_new(_al_shadow_region_get(a), a, 2 * 4096, false, 1, &pages);
    ck_assert_uint_eq(pages, 6); /* the page once started six */
    ck_assert(retire(p, &o));
    ck_assert_uint_eq(o.pages, 6);
    /* Another offset on the same page: the same pages backed. */
    _al_shadow_object_new(_al_shadow_region_get(a + 256), a + 256, 4096, false, 1, &pages);
    ck_assert_uint_eq(pages, 6);
    ck_assert(retire(p + 256, &o));
}
END_TEST

START_TEST(objects_straddling_regions)
{
    char *p = (char *)(uintptr_t)(0x7f0000b00000ull - 16);
    struct al_shadow_object o;
    ck_assert(!mark(p, 70000)); /* 17 + 8 nibbles: most of them in the next region */
    ck_assert(retire(p, &o));
    ck_assert_uint_eq(o.requested, 70000);
    ck_assert_uint_eq(o.pages, _al_shadow_pages_of((uint64_t)(uintptr_t)p, 70000));
}
END_TEST

START_TEST(records_fit_their_granules)
{
    /* In 8-byte granules every object's record fits (object.c's claim, checked). */
    for (uint64_t u = 1; u <= 70000; u++)
        ck_assert(_al_shadow_record_fits(u, 3));
    /* In 16-byte ones all but usable sizes of 12-16 and 28-32 bytes: glibc's all do. */
    for (uint64_t u = 1; u <= 70000; u++)
        ck_assert(_al_shadow_record_fits(u, 4) == !((u >= 12 && u <= 16) || (u >= 28 && u <= 32)));
    ck_assert(!_al_shadow_record_fits(0, 4));
}
END_TEST

/* glibc's layout in 16-byte granules: blocks of usable size 24 + 16k, each 8 bytes short of
 * the next, every request its class holds; records written in both orders read back exact,
 * across a region's end too, with big blocks among them. */
START_TEST(records_in_16_byte_granules)
{
    _al_shadow.granule_shift = 4;
    static const uint64_t starts[] = { 0x7f0003000010ull, 0x7f00032ff000ull };
    enum { N = 3000 };
    static uint64_t at[N], req[N];
    struct al_shadow_object o;
    uint64_t seed = 7;
    for (unsigned k = 0; k < 2; k++) {
        uint64_t a = starts[k];
        for (unsigned i = 0; i < N; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t usable = i % 97 == 5 ? 4096 + 16 * (seed >> 52) + 8 : 24 + 16 * ((seed >> 33) % 40);
            at[i] = a;
            req[i] = usable - (usable == 24 ? (seed >> 20) % 25 : (seed >> 20) % 16);
            a += usable + 8;
        }
        for (int pass = 0; pass < 2; pass++) {
            for (unsigned j = 0; j < N; j++) {
                unsigned i = pass ? N - 1 - j : j;
                ck_assert(mark((void *)(uintptr_t)at[i], req[i]) == (pass == 1));
            }
            for (unsigned i = 0; i < N; i++) {
                ck_assert(_al_shadow_object_read(at[i], &o));
                ck_assert_uint_eq(o.requested, req[i]);
            }
            for (unsigned i = 0; i < N; i++) {
                ck_assert(retire((void *)(uintptr_t)at[i], &o));
                ck_assert_uint_eq(o.requested, req[i]);
            }
        }
    }
    /* A second thread on a page: the first one's lines are found from its records. */
    uint64_t page = 0x7f0003600000ull;
    mark_by(page, 24, 3);
    mark_by(page + 32, 40, 3);
    mark_by(page + 256, 24, 3);
    mark_by(page + 128, 24, 4);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)page)), 3);
    ck_assert_uint_eq(_al_shadow_line((void *)(uintptr_t)page) & AL_LINE_USED_MASK, 56);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 256))), 3);
    ck_assert_uint_eq(AL_LINE_OWNER(_al_shadow_line((void *)(uintptr_t)(page + 128))), 4);
    _al_shadow.granule_shift = AL_SHADOW_GRANULE_SHIFT;
}
END_TEST

START_TEST(pages_and_lines)
{
    char *page = (char *)(uintptr_t)0x7f0000c00000ull;
    struct al_shadow_object o;
    uint64_t a = (uint64_t)(uintptr_t)page;
    uint32_t pages;
    /* Thread 1: 40 bytes at 0; thread 2: 100 bytes at 48 (lines 0, 1, 2). */
    _al_shadow_object_new(_al_shadow_region_get(a), a, 40, false, 1, &pages);
    _al_shadow_object_new(_al_shadow_region_get(a), a + 48, 100, false, 2, &pages);
    ck_assert_uint_eq(_al_shadow_page_used(page), 140);
    uint16_t l0 = _al_shadow_line(page), l1 = _al_shadow_line(page + 64), l2 = _al_shadow_line(page + 128);
    ck_assert_uint_eq(l0 & AL_LINE_USED_MASK, 40 + 16);
    ck_assert(l0 & AL_LINE_SHARED);
    ck_assert_uint_eq(l1 & AL_LINE_USED_MASK, 64);
    ck_assert_uint_eq(AL_LINE_OWNER(l1), 2);
    ck_assert(!(l1 & AL_LINE_SHARED));
    ck_assert_uint_eq(l2 & AL_LINE_USED_MASK, 148 - 128);
    ck_assert(retire(page + 48, &o));
    ck_assert_uint_eq(_al_shadow_page_used(page), 40);
    ck_assert_uint_eq(_al_shadow_line(page + 64) & AL_LINE_USED_MASK, 0);
    ck_assert(retire(page, &o));
    ck_assert_uint_eq(_al_shadow_line(page) & AL_LINE_USED_MASK, 0);
    /* An object reaching into the next page counts on both. */
    _al_shadow_object_new(_al_shadow_region_get(a + 4000), a + 4000, 200, false, 1, &pages);
    ck_assert_uint_eq(_al_shadow_page_used(page), 96);
    ck_assert_uint_eq(_al_shadow_page_used(page + 4096), 104);
    ck_assert(retire(page + 4000, &o));
    /* A big object counts in page entries only. */
    _al_shadow_object_new(_al_shadow_region_get(a + 100), a + 100, 3 * 4096, false, 1, &pages);
    ck_assert_uint_eq(_al_shadow_page_used(page), 4096 - 100);
    ck_assert_uint_eq(_al_shadow_page_used(page + 4096), 4096);
    ck_assert_uint_eq(_al_shadow_page_used(page + 3 * 4096), 100);
    ck_assert_uint_eq(_al_shadow_line(page + 4096) & AL_LINE_USED_MASK, 0);
    ck_assert(retire(page + 100, &o));
    ck_assert_uint_eq(_al_shadow_page_used(page + 4096), 0);
    ck_assert_uint_eq(_al_shadow_page_used(page + 3 * 4096), 0);
}
END_TEST

/* The pagemap's written pages, which the heap walk and the waste tables read. */
START_TEST(written_pages)
{
    const size_t pages = 70; /* more than one word of bits */
    char *m = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(m != MAP_FAILED);
    m[1 * 4096] = 1;
    m[66 * 4096 + 100] = 1;
    int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(pagemap, 0);
    uint64_t w[2];
    _al_shadow_written_pages(pagemap, m, pages, w);
    for (size_t i = 0; i < pages; i++)
        ck_assert_msg(((w[i / 64] >> (i % 64)) & 1) == (i == 1 || i == 66), "page %zu", i);
    _al_shadow_written_pages(-1, m, pages, w);
    for (size_t i = 0; i < pages; i++)
        ck_assert((w[i / 64] >> (i % 64)) & 1);
    close(pagemap);
    munmap(m, pages * 4096);
}
END_TEST

static uint64_t heap_bytes;

/* The pagemap the walks take (see _al_shadow_heap_runs), opened once. */
static int pagemap_fd(void)
{
    static int fd = -2;
    if (fd == -2)
        fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    return fd;
}

static void count_run(uint64_t start, uint64_t end, void *arg)
{
    (void)arg;
    heap_bytes += end - start;
}

START_TEST(heap_pages)
{
    uint64_t a = 0x7f0002000000ull;
    _al_shadow_heap_set(a + 4096, a + 3 * 4096 + 1, true); /* pages 1, 2, 3 */
    _al_shadow_heap_set(a + (1u << 20) - 4096, a + (1u << 20) + 8192, true); /* across a region */
    ck_assert(_al_shadow_heap_has(a + 4096));
    ck_assert(!_al_shadow_heap_has(a));
    heap_bytes = 0;
    _al_shadow_heap_runs(pagemap_fd(), count_run, NULL);
    ck_assert_uint_eq(heap_bytes, 6 * 4096);
    _al_shadow_heap_set(a + 8192, a + 12288, false);
    heap_bytes = 0;
    _al_shadow_heap_runs(pagemap_fd(), count_run, NULL);
    ck_assert_uint_eq(heap_bytes, 5 * 4096);
}
END_TEST

/* The heap's page bits are part of the table's footprint: a page marked in a 4 GiB slice of
 * its own adds that slice's touched page and a page of the slices' directory. Walking the bits
 * (every snapshot does) adds nothing: the slice's other 31 pages, never written, are not read
 * (mincore would count the zero page mapped by a read as resident). */
START_TEST(heap_footprint)
{
    uint64_t a = 0x7e0000000000ull;
    size_t before = _al_shadow_footprint();
    _al_shadow_heap_set(a, a + 4096, true);
    ck_assert_uint_eq(_al_shadow_footprint(), before + 2 * 4096);
    heap_bytes = 0;
    _al_shadow_heap_runs(pagemap_fd(), count_run, NULL);
    ck_assert_uint_ge(heap_bytes, 4096);
    ck_assert_uint_eq(_al_shadow_footprint(), before + 2 * 4096);
    /* Without the pagemap every page is read: the same runs. */
    uint64_t with = heap_bytes;
    heap_bytes = 0;
    _al_shadow_heap_runs(-1, count_run, NULL);
    ck_assert_uint_eq(heap_bytes, with);
}
END_TEST

/* A level-1 slice (32 KiB) counts the pages its entries were written on, not all of it: one
 * object in a fresh 4 GiB adds the slice's page, a directory page and the pages of the region
 * record it touched (a page of level 2 and one of the granule bytes). */
START_TEST(slice_footprint)
{
    char *p = (char *)(uintptr_t)0x7d0000000000ull;
    size_t before = _al_shadow_footprint();
    ck_assert(!mark(p, 64));
    ck_assert_uint_eq(_al_shadow_footprint(), before + 4 * 4096);
}
END_TEST

START_TEST(region_boundaries)
{
    uint64_t before = atomic_load(&_al_shadow.regions);
    char *last = (char *)(uintptr_t)(0x7f0000700000ull - 8);
    char *first = (char *)(uintptr_t)0x7f0000700000ull;
    ck_assert(!mark(last, 8));
    ck_assert(!mark(first, 8));
    ck_assert_uint_eq(atomic_load(&_al_shadow.regions), before + 2);
    ck_assert_uint_ge(_al_shadow_mapped(), 2 * sizeof(struct al_shadow_region));
    ck_assert_uint_ge(_al_shadow_footprint(), 2 * 4096); /* what the two marks touched */
}
END_TEST

START_TEST(beyond_the_table)
{
    uint64_t before = atomic_load(&_al_shadow.untracked);
    void *far = (void *)(uintptr_t)(_al_shadow.dir_entries << AL_SHADOW_SLICE_SHIFT);
    ck_assert(_al_shadow_region_get((uint64_t)(uintptr_t)far) == NULL);
    ck_assert_uint_eq(atomic_load(&_al_shadow.untracked), before + 1);
    ck_assert(_al_shadow_address_bits() == 47 || _al_shadow_address_bits() == 56);
}
END_TEST

#define THREADS 4
#define PER_THREAD 50000

static _Atomic uint64_t reused_total;

static void *marker(void *arg)
{
    /* Each thread owns every THREADS-th 8-byte granule: neighbours in the same word and line
     * belong to other threads, as objects of different threads do in a real heap. */
    uint64_t me = (uint64_t)(uintptr_t)arg, reused = 0;
    struct al_shadow_object o;
    for (int round = 0; round < 2; round++)
        for (uint64_t i = 0; i < PER_THREAD; i++) {
            char *p = (char *)(uintptr_t)(0x7f1000000000ull + (i * THREADS + me) * 8);
            reused += mark(p, 8);
            ck_assert(retire(p, &o));
            ck_assert_uint_eq(o.requested, 8);
        }
    atomic_fetch_add(&reused_total, reused);
    return NULL;
}

START_TEST(concurrent_records_are_exact)
{
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, marker, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    /* Second round: every address seen before, exactly once per thread and granule. */
    ck_assert_uint_eq(atomic_load(&reused_total), (uint64_t)THREADS * PER_THREAD);
    for (uint64_t i = 0; i < (uint64_t)THREADS * PER_THREAD * 8; i += 64)
        ck_assert_uint_eq(_al_shadow_line((char *)(uintptr_t)(0x7f1000000000ull + i)) & AL_LINE_USED_MASK, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shadow");
    TCase *tc = tcase_create("shadow");
    tcase_add_unchecked_fixture(tc, setup, NULL);
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, mark_new_then_reused);
    tcase_add_test(tc, time_marks);
    tcase_add_test(tc, records_round_trip);
    tcase_add_test(tc, records_in_the_table);
    tcase_add_test(tc, big_objects_keep_their_most_pages);
    tcase_add_test(tc, objects_straddling_regions);
    tcase_add_test(tc, records_fit_their_granules);
    tcase_add_test(tc, records_in_16_byte_granules);
    tcase_add_test(tc, pages_and_lines);
    tcase_add_test(tc, every_size_through_the_table);
    tcase_add_test(tc, page_owners_stand_for_their_lines);
    tcase_add_test(tc, big_object_keeps_its_last_line);
    tcase_add_test(tc, new_big_object_from_pages_back);
    tcase_add_test(tc, line_entries_only_where_shared);
    tcase_add_test(tc, written_pages);
    tcase_add_test(tc, heap_pages);
    tcase_add_test(tc, heap_footprint);
    tcase_add_test(tc, slice_footprint);
    tcase_add_test(tc, region_boundaries);
    tcase_add_test(tc, beyond_the_table);
    tcase_add_test(tc, concurrent_records_are_exact);
    suite_add_tcase(s, tc);
    return al_check_run(s);
}
