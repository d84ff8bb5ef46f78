/* shadow/: the address-space shadow table, in three levels.
 *
 * Level 1 has one entry per 1 MiB of the user address space (47-bit or 56-bit); it comes in
 * 4 GiB slices (4096 entries, 32 KiB) hung off a small directory, both made on first use: a
 * flat reservation over the whole address space would cost nothing in memory but a GiB of
 * address space, and programs run under `ulimit -v` would feel it. Each entry points to a
 * region record made on first use from mmap, which holds level 2 (256 page entries: bytes in
 * use on the page, and which threads own objects on it) and level 3 (64 cache-line entries per
 * page: bytes in use on the line and which threads own objects on it; see usage.c for what is
 * kept and what is summed on read). A page gets its line entries when it first needs them (a
 * second thread comes to it): a block of the region's level 3, handed out in that order, so
 * that the pages of level 3 the kernel backs are those that hold some page's lines. The kernel
 * backs a region record's pages only as they are written, so an entry costs memory in
 * proportion to the heap it describes.
 *
 * The region record also holds, per granule, one byte: four flags (an allocation ever returned
 * this address; the object here now is live, is sampled, has a class the size table cannot
 * tell) and a nibble of payload. A granule is 8 bytes (the smallest alignment allocators hand
 * out), or 16 where every object is 16-byte aligned and no size class is too small for its
 * record in 16-byte granules (glibc's: the byte per granule, most of the table's memory, then
 * costs half as much). A live object's record is the payload of its first granules: its
 * requested size (and, for objects of a page or more, the pages it is accounted for), in no
 * more nibbles than the object has granules, so it always fits inside the object itself. The
 * granules of a live object belong to it alone: records are written with plain byte stores, no
 * lock, no atomic instruction, and grow with the heap, not with the number of objects.
 *
 * Beside it, a bitmap says which pages the allocator holds from the kernel (its mmap and brk
 * ranges), so that the resident heap can be measured at a snapshot: 32 bytes per MiB, in 4 GiB
 * slices of their own, since allocators reserve far more address space than they put objects
 * in and a region record for all of it would cost address space (ulimit -v) for nothing.
 */
#ifndef ALLOCLENS_SHADOW_H
#define ALLOCLENS_SHADOW_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* For a zero-initialised static array that most runs never touch (report buffers, tables of
 * rare events): placed after every other static (.lbss follows .bss), so the small ones a
 * process touches as it starts share a few pages, each page a fault, rather than being spread
 * between the arrays. */
#define AL_LARGE_BSS __attribute__((section(".lbss.alloclens")))

#define AL_SHADOW_REGION_SHIFT 20
#define AL_SHADOW_PAGE_SHIFT 12
#define AL_SHADOW_LINE_SHIFT 6
#define AL_SHADOW_GRANULE_SHIFT 3 /* the smaller granule: what region records are sized for */
#define AL_SHADOW_PAGE_SIZE (1u << AL_SHADOW_PAGE_SHIFT)
#define AL_SHADOW_PAGES (1u << (AL_SHADOW_REGION_SHIFT - AL_SHADOW_PAGE_SHIFT))
#define AL_SHADOW_LINES (1u << (AL_SHADOW_PAGE_SHIFT - AL_SHADOW_LINE_SHIFT))
#define AL_SHADOW_GRANULES (1u << (AL_SHADOW_REGION_SHIFT - AL_SHADOW_GRANULE_SHIFT))

/* A line entry (and a page's owners): the tag of the first thread owning an object on the line
 * in bits 7-14 (0: none), bit 15 set once a second thread owns one too; as read, bytes in use
 * (0..64) in bits 0-6. */
#define AL_LINE_USED_MASK 0x7fu
#define AL_LINE_OWNER_SHIFT 7
#define AL_LINE_OWNER_MASK (0xffu << AL_LINE_OWNER_SHIFT)
#define AL_LINE_SHARED 0x8000u
#define AL_LINE_OWNER(v) (((v) & AL_LINE_OWNER_MASK) >> AL_LINE_OWNER_SHIFT)

struct al_shadow_region {
    _Atomic uint32_t page_used[AL_SHADOW_PAGES];    /* level 2 */
    _Atomic uint32_t page_span[AL_SHADOW_PAGES];    /* most pages an object from here covered */
    _Atomic uint16_t page_owner[AL_SHADOW_PAGES];   /* owners, as a line entry (usage.c) */
    _Atomic uint16_t page_large[AL_SHADOW_PAGES];   /* --mode time: live large objects starting here */
    _Atomic uint16_t page_lines[AL_SHADOW_PAGES];   /* 1 + the page's block of line[]; 0: none yet */
    _Atomic uint32_t line_blocks;                   /* blocks of line[] handed out */
    _Atomic uint64_t seen[AL_SHADOW_GRANULES / 64]; /* --mode time: a bit per granule ever returned */
    _Atomic uint16_t line[AL_SHADOW_PAGES][AL_SHADOW_LINES]; /* level 3, a block per page */
    uint8_t granule[AL_SHADOW_GRANULES];            /* flags | payload << 4; 16-byte granules
                                                       use the first half, and the records of
                                                       the region's last objects run on into
                                                       the second */
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
    _Atomic uint64_t regions;     /* region records mapped (in use, or spare) */
    /* Bumped when region records are taken down (_al_shadow_release): threads' caches of
     * region pointers kept from before are dropped at their next look. */
    _Atomic uint64_t epoch;
    _Atomic uint64_t untracked;   /* addresses beyond the table (should stay 0) */
    /* log2 of the granule's bytes: AL_SHADOW_GRANULE_SHIFT, or one more where full mode found
     * that the allocator's objects fit 16-byte granules (waste.c). Set once, before the first
     * record. */
    unsigned granule_shift;
};

extern struct al_shadow _al_shadow;

/* Maps the directory for this machine's address-space size (47 or 56 bits); 0 or -errno. */
int _al_shadow_init(void);
struct al_shadow_region *_al_shadow_region_create(uint64_t address);
/* The allocator is about to unmap [LO, HI): the region records of the MiBs wholly inside it
 * are taken down (nothing lives there any more), their memory given back and the records kept
 * for MiBs to come. Without it an allocator that maps its big blocks at ever new addresses
 * (mimalloc) had the table grow with every block: 19.6 GiB for a program of 2 MiB, over two
 * minutes. */
void _al_shadow_release(uint64_t lo, uint64_t hi);
/* In a forked child: the lock of the records kept for reuse freed (a thread of the parent may
 * have held it). */
void _al_shadow_after_fork_child(void);
/* Installs *SLOT from a fresh zeroed mapping of SIZE bytes (mmap FLAGS added) unless another
 * thread got there first; returns what the slot holds, *WON set if it is the new mapping. */
void *_al_shadow_install(_Atomic(void *) *slot, size_t size, int flags, bool *won);
uint64_t _al_shadow_address_bits(void);
/* Bytes of the table the kernel backs now (resident), and bytes mapped. */
size_t _al_shadow_footprint(void);
/* Bytes of a directory of BYTES bytes that SLICES slices have touched. */
size_t _al_shadow_dir_touched(uint64_t slices, size_t bytes);
/* Bytes of [p, p + bytes) the kernel backs (mincore); all of them if it cannot tell. */
size_t _al_shadow_resident(const void *p, size_t bytes);
/* N entries of /proc/self/pagemap (open at PAGEMAP) from FIRST_PAGE into ENTRIES: how many it
 * read (0 on failure, or with PAGEMAP < 0). */
size_t _al_shadow_pagemap_read(int pagemap, uint64_t first_page, size_t n, uint64_t *entries);
/* Which pages of a private anonymous mapping may hold anything but zeros: bit I of WRITTEN
 * ((PAGES + 63) / 64 words) is clear only where the pagemap says page I of
 * [P, P + PAGES * 4096) is neither resident nor swapped out, which in such a mapping means
 * never written. Bits the pagemap cannot tell (PAGEMAP < 0) are set. */
void _al_shadow_written_pages(int pagemap, const void *p, size_t pages, uint64_t *written);
size_t _al_shadow_mapped(void);

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

static inline __attribute__((always_inline)) struct al_shadow_region *_al_shadow_region_get(uint64_t a)
{
    struct al_shadow_region *r = _al_shadow_region(a);
    if (__builtin_expect(r == NULL, 0))
        r = _al_shadow_region_create(a);
    return r;
}

/* A thread's last regions, one per MiB modulo AL_SHADOW_CACHE_WAYS: a thread's calls mostly
 * fall in the few MiB of heap it works in, and one compare saves the walk from the directory.
 * One entry was not enough: malloc_bench's heap of a few MiB sent two calls in five down the
 * walk, eight send almost none (18 walks in 1.9 million calls). The pointers kept are good
 * while the table's epoch is the one they were kept in: a record taken down since may serve
 * another MiB now. A thread looks a record up only for an address it was handed by the
 * allocator, after the unmapping that took it down, so the new epoch is seen first.
 * AL_SHADOW_NO_KEY: nothing kept yet. */
#define AL_SHADOW_CACHE_WAYS 8
struct al_shadow_cache {
    uint64_t epoch;
    struct al_shadow_cache_entry {
        uint64_t key; /* address >> AL_SHADOW_REGION_SHIFT */
        struct al_shadow_region *r;
    } e[AL_SHADOW_CACHE_WAYS];
};

#define AL_SHADOW_NO_KEY UINT64_MAX /* no address shifts down to it */

/* A miss of the cache below: the walk from the directory (and, with CREATE, the record made),
 * out of line, so that each wrapper holds only the compare. */
struct al_shadow_region *_al_shadow_region_fill(struct al_shadow_cache *c, uint64_t a, bool create);

static inline __attribute__((always_inline)) struct al_shadow_region *
_al_shadow_region_cached(struct al_shadow_cache *c, uint64_t a, bool create)
{
    uint64_t key = a >> AL_SHADOW_REGION_SHIFT;
    struct al_shadow_cache_entry *e = &c->e[key % AL_SHADOW_CACHE_WAYS];
    if (__builtin_expect(e->key == key && c->epoch == atomic_load_explicit(&_al_shadow.epoch, memory_order_relaxed), 1))
        return e->r;
    return _al_shadow_region_fill(c, a, create);
}

#define AL_SHADOW_SEEN 1u
#define AL_SHADOW_ODD 2u      /* class not the size table's: ask the allocator at free */
#define AL_SHADOW_SAMPLED 4u
#define AL_SHADOW_LIVE 8u

#define AL_SHADOW_GRANULE_AT(a, shift) (((a) & ((1u << AL_SHADOW_REGION_SHIFT) - 1)) >> (shift))
#define AL_SHADOW_GRANULE(a) AL_SHADOW_GRANULE_AT(a, _al_shadow.granule_shift)
#define AL_SHADOW_PAGE_INDEX(a) (((a) >> AL_SHADOW_PAGE_SHIFT) & (AL_SHADOW_PAGES - 1))

/* The flags of the object at p: AL_SHADOW_LIVE, AL_SHADOW_SAMPLED, ... (0 where no region). */
static inline __attribute__((always_inline)) unsigned _al_shadow_flags(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region(a);
    if (!r)
        return 0;
    return __atomic_load_n(&r->granule[AL_SHADOW_GRANULE(a)], __ATOMIC_RELAXED) & 0xfu;
}

/* --mode time keeps no records, and reads nothing per granule on the common path: a bit per
 * granule says whether an allocation ever returned the address (a bitmap 1/64 the size of the
 * heap it describes, mostly in cache), and a count per page says how many live large objects
 * start there; only where that count is not 0 does a free look at its granule, whose payload
 * marks a large object's start. */
#define AL_SHADOW_MARK_LARGE 0x10u

/* Whether an allocation returned A before; marks it returned. The bits are per 8 bytes
 * whatever the granule (only full mode, which does not use them, has larger ones). */
static inline __attribute__((always_inline)) bool _al_shadow_seen(struct al_shadow_region *r, uint64_t a)
{
    uint64_t g = AL_SHADOW_GRANULE_AT(a, AL_SHADOW_GRANULE_SHIFT);
    _Atomic uint64_t *w = &r->seen[g >> 6];
    uint64_t bit = 1ull << (g & 63);
    if (__builtin_expect((atomic_load_explicit(w, memory_order_relaxed) & bit) != 0, 1))
        return true;
    atomic_fetch_or_explicit(w, bit, memory_order_relaxed); /* neighbours are other threads' */
    return false;
}

/* Marks (LARGE) or clears the large-object mark of the object at A: the rare paths. Clearing
 * returns whether A had the mark. */
void _al_shadow_mark_large(struct al_shadow_region *r, uint64_t a);
bool _al_shadow_unmark_large(struct al_shadow_region *r, uint64_t a);

/* An object at A was made or is being freed: whether a large object started at A (and the
 * mark is gone now). Only a page with such an object on it costs more than one dense load. */
static inline __attribute__((always_inline)) bool _al_shadow_take_large(struct al_shadow_region *r, uint64_t a)
{
    if (__builtin_expect(atomic_load_explicit(&r->page_large[AL_SHADOW_PAGE_INDEX(a)], memory_order_relaxed) == 0, 1))
        return false;
    return _al_shadow_unmark_large(r, a);
}

/* Marks or unmarks the object at p as sampled (the rare path). */
void _al_shadow_set_sampled(const void *p, bool sampled);

/* ---- usage.c: levels 2 and 3, bytes in use ------------------------------------------------- */

/* _al_shadow_own's case of a page with a second owner, and every object of a page or more:
 * out of line (the inline caller marks the first case unlikely). */
void _al_shadow_own_slow(struct al_shadow_region *r, uint64_t a, uint64_t n, unsigned tag);

/* Records that the thread with tag TAG (1..255) owns the object of N bytes at A, in A's region
 * R, N under a page (bigger objects go to the slow path, which walks every page they cover). A page
 * only that thread has put objects on stands for its lines, so the common case (an object on
 * one or two pages already its thread's) is the load of their page entries and no write; line
 * entries are kept once a second thread comes to the page. */
static inline __attribute__((always_inline)) void _al_shadow_own(struct al_shadow_region *r, uint64_t a, uint64_t n,
                                                                  unsigned tag)
{
    uint64_t last = a + (n ? n - 1 : 0);
    uint16_t mine = (uint16_t)(tag << AL_LINE_OWNER_SHIFT);
    if (__builtin_expect((last >> AL_SHADOW_REGION_SHIFT) == (a >> AL_SHADOW_REGION_SHIFT) &&
                             atomic_load_explicit(&r->page_owner[AL_SHADOW_PAGE_INDEX(a)],
                                                  memory_order_relaxed) == mine &&
                             atomic_load_explicit(&r->page_owner[AL_SHADOW_PAGE_INDEX(last)],
                                                  memory_order_relaxed) == mine,
                         1))
        return;
    _al_shadow_own_slow(r, a, n, tag);
}

/* Adds (or, with SIGN -1, removes) the N bytes of an object of AL_SHADOW_BIG or more at A to
 * the page entries. */
void _al_shadow_use_big(uint64_t a, uint64_t n, int sign);
/* Bytes in use on the page of p; the line entry of p (owners, and bytes in use in the low bits,
 * summed from the records of the objects under a page there). */
uint32_t _al_shadow_page_used(const void *p);
uint16_t _al_shadow_line(const void *p);

/* ---- object.c: the object records ---------------------------------------------------------- */

/* Objects of this many requested bytes or more also record the most pages their address ever
 * covered, and count in page entries rather than line entries. */
#define AL_SHADOW_BIG AL_SHADOW_PAGE_SIZE

struct al_shadow_object {
    uint64_t requested;
    uint32_t pages;   /* objects of AL_SHADOW_BIG bytes or more: the most pages ever covered by
                         an object starting on its page, when it was allocated */
    bool odd;
};

/* The records as nibble strings (exposed for the tests): the nibbles an object of REQ bytes
 * needs, encoding, decoding. */
unsigned _al_shadow_record_nibbles(uint64_t req);
/* The most nibbles a record takes. */
#define AL_SHADOW_MAX_NIBBLES (17u + 8u)
/* Whether the record of any object of at most USABLE bytes fits in the granules of 1 << SHIFT
 * bytes that an object of USABLE bytes, aligned to them, has to itself (always true from
 * AL_SHADOW_MAX_NIBBLES << SHIFT bytes up). */
bool _al_shadow_record_fits(uint64_t usable, unsigned shift);
unsigned _al_shadow_record_encode(uint8_t *nib, uint64_t req, uint32_t pages);
bool _al_shadow_record_decode(const uint8_t *nib, unsigned avail, uint64_t *req, uint32_t *pages);

/* The general forms of the two below (object.c): any size, records across regions. */
bool _al_shadow_object_new_any(struct al_shadow_region *r, uint64_t a, uint64_t req, bool odd, unsigned tag,
                               uint32_t *pages);
bool _al_shadow_object_end_any(struct al_shadow_region *r, uint64_t a, struct al_shadow_object *o);

/* Objects under a page have records of at most 5 nibbles, read and written inline. */
#define AL_SHADOW_INLINE_NIBBLES 5u

/* Records a live object of REQ bytes at p allocated by the thread with tag TAG (1..255), and
 * the bytes it uses in the page and line entries. Returns whether an earlier allocation had
 * returned p; *pages is the most pages an object of AL_SHADOW_BIG or more starting on p's page
 * ever covered (this one included). */
static inline __attribute__((always_inline)) bool _al_shadow_object_new(struct al_shadow_region *r, uint64_t a,
                                                                         uint64_t req, bool odd, unsigned tag,
                                                                         uint32_t *pages)
{
    uint64_t g = AL_SHADOW_GRANULE(a);
    if (__builtin_expect(req >= AL_SHADOW_BIG || g + AL_SHADOW_INLINE_NIBBLES > AL_SHADOW_GRANULES, 0))
        return _al_shadow_object_new_any(r, a, req, odd, tag, pages);
    uint8_t *b = &r->granule[g];
    uint8_t old = b[0];
    unsigned first = req < 12 ? (unsigned)req : req < 28 ? 12u : req < 268 ? 13u : 14u;
    uint64_t v = req - 12;
    /* The size's nibbles after the first: 1, 2 or 4 of them (see object.c). */
    if (req >= 12) {
        b[1] = (uint8_t)((b[1] & 0xf) | (v & 0xf) << 4);
        if (req >= 28) {
            b[2] = (uint8_t)((b[2] & 0xf) | ((v >> 4) & 0xf) << 4);
            if (req >= 268) {
                b[3] = (uint8_t)((b[3] & 0xf) | ((v >> 8) & 0xf) << 4);
                b[4] = (uint8_t)((b[4] & 0xf) | ((v >> 12) & 0xf) << 4);
            }
        }
    }
    __atomic_store_n(b, (uint8_t)(first << 4 | AL_SHADOW_SEEN | AL_SHADOW_LIVE | (odd ? AL_SHADOW_ODD : 0)),
                     __ATOMIC_RELAXED);
    *pages = 0;
    _al_shadow_own(r, a, req, tag);
    return (old & AL_SHADOW_SEEN) != 0;
}

/* The requested size in the inline record whose first granule byte is V, at B; UINT64_MAX
 * where the record is not an inline one (a big object's, or too near the end of the region). */
static inline __attribute__((always_inline)) uint64_t _al_shadow_record_inline(const uint8_t *b, uint8_t v, uint64_t g)
{
    unsigned first = v >> 4;
    if (__builtin_expect(first == 15 || g + AL_SHADOW_INLINE_NIBBLES > AL_SHADOW_GRANULES, 0))
        return UINT64_MAX;
    if (first < 12)
        return first;
    uint64_t req = 12u + (b[1] >> 4);
    if (first >= 13)
        req += (uint64_t)(b[2] >> 4) << 4;
    if (first == 14) {
        req += (uint64_t)(b[3] >> 4) << 8 | (uint64_t)(b[4] >> 4) << 12;
        if (req >= AL_SHADOW_BIG)
            return UINT64_MAX;
    }
    return req;
}

/* Retires the live object at p (before the allocator gets it back): false where p holds no
 * live record (an object made before alloclens started, or outside its view). V is the byte
 * of p's granule, which the caller has read already. */
static inline __attribute__((always_inline)) bool _al_shadow_object_end(struct al_shadow_region *r, uint64_t a,
                                                                         uint8_t v, struct al_shadow_object *o)
{
    uint64_t g = AL_SHADOW_GRANULE(a);
    uint8_t *b = &r->granule[g];
    if (!(v & AL_SHADOW_LIVE))
        return false;
    uint64_t req = _al_shadow_record_inline(b, v, g);
    if (__builtin_expect(req == UINT64_MAX, 0))
        return _al_shadow_object_end_any(r, a, o);
    o->requested = req;
    o->pages = 0;
    o->odd = (v & AL_SHADOW_ODD) != 0;
    __atomic_store_n(b, (uint8_t)(v & ~(AL_SHADOW_LIVE | AL_SHADOW_ODD | AL_SHADOW_SAMPLED)), __ATOMIC_RELAXED);
    return true;
}

/* The live record at A, read (not retired); false where none. */
bool _al_shadow_object_read(uint64_t a, struct al_shadow_object *o);

/* Pages an object of N bytes at A covers. */
static inline uint32_t _al_shadow_pages_of(uint64_t a, uint64_t n)
{
    uint64_t first = a >> AL_SHADOW_PAGE_SHIFT, last = (a + (n ? n : 1) - 1) >> AL_SHADOW_PAGE_SHIFT;
    return (uint32_t)(last - first + 1);
}

/* ---- heap.c: the pages the allocator holds from the kernel --------------------------------- */

struct al_heap_slice {
    _Atomic uint64_t bits[AL_SHADOW_SLICE_ENTRIES][AL_SHADOW_PAGES / 64];
};

extern _Atomic(struct al_heap_slice *) *_al_heap_dir;

/* Maps the directory of heap slices (after _al_shadow_init); 0 or -errno. */
int _al_shadow_heap_init(void);
/* Marks [start, end) as the allocator's (on) or no longer (off). */
void _al_shadow_heap_set(uint64_t start, uint64_t end, bool on);

/* Whether the page of A is known to be the allocator's. */
static inline __attribute__((always_inline)) bool _al_shadow_heap_has(uint64_t a)
{
    uint64_t d = a >> AL_SHADOW_SLICE_SHIFT;
    if (__builtin_expect(d >= _al_shadow.dir_entries || !_al_heap_dir, 0))
        return true; /* nothing to learn about it, or nowhere to keep it */
    struct al_heap_slice *s = atomic_load_explicit(&_al_heap_dir[d], memory_order_acquire);
    if (__builtin_expect(s == NULL, 0))
        return false;
    unsigned pg = (unsigned)AL_SHADOW_PAGE_INDEX(a);
    return (atomic_load_explicit(&s->bits[(a >> AL_SHADOW_REGION_SHIFT) & (AL_SHADOW_SLICE_ENTRIES - 1)][pg / 64],
                                 memory_order_relaxed) >> (pg % 64)) & 1;
}

/* Resident bytes of the heap slices and their directory (part of _al_shadow_footprint). */
size_t _al_shadow_heap_footprint(void);
/* Calls FN for each maximal run [start, end) of the allocator's pages (in address order
 * within a 4 GiB slice). PAGEMAP (/proc/self/pagemap, or -1) tells which pages of the bits
 * were ever written: only those are read. */
void _al_shadow_heap_runs(int pagemap, void (*fn)(uint64_t start, uint64_t end, void *arg), void *arg);

#endif
