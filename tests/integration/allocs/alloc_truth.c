/* alloc_truth: the truth about the allocator this process runs on, as JSON on stdout.
 *
 *   LD_PRELOAD=/path/to/liballoc.so alloc_truth      (or plain, for glibc)
 *
 * prints {"allocator": NAME, "library": PATH, "style": "bibop"|"sequential", "page_size": N,
 *         "large_threshold": N, "size_classes": [...], "style_experiment": {...},
 *         "derivation": "...", "crosschecks": [...], "errors": [...]}
 * and exits 0, or 1 when a cross-check failed (the JSON still says what was measured), or 2 when
 * the allocator is not one it knows how to question.
 *
 * No number here is typed in: everything comes from the allocator at run time.
 *
 * - size classes: malloc_usable_size of EVERY request size 1..large_threshold-1; the distinct
 *   values are the classes (the sizes the allocator actually serves requests with).
 * - large threshold, the smallest request no longer served from a size class, from the
 *   allocator's own introspection where it has one:
 *     tiny_bibop  its tiny_bibop_truth() (and its usable sizes must agree);
 *     jemalloc    mallctl("arenas.nbins") and "arenas.bin.<i>.size": the bins are the classes,
 *                 the largest bin + 1 is the threshold; the usable-size classes must equal the
 *                 bins; "arenas.lextent.0.size" (the smallest large class) must lie above;
 *     tcmalloc    (gperftools) usable sizes alone cannot tell: from 64 KiB up its classes are
 *                 8 KiB apart, exactly like the page-rounded sizes of large requests. But a
 *                 freed class object goes to the thread cache and a freed large object (a span
 *                 of its own) goes straight back to the page heap, which
 *                 MallocExtension_GetNumericProperty("tcmalloc.thread_cache_free_bytes" /
 *                 "tcmalloc.pageheap_free_bytes") shows. Every distinct usable size is
 *                 allocated and freed once and classified that way; the threshold is the first
 *                 request whose usable size is classified large. (gperftools' common.h has
 *                 kMaxSize = 256 KiB, so 262145 is expected; that is not used here.)
 *     mimalloc    no bin listing, and usable sizes of large objects (64 KiB slices in v2) can
 *                 coincide with bins; mi_stats_print shows no per-kind counts in release
 *                 builds. mi_heap_visit_blocks() does describe each page (mi_heap_area_t:
 *                 reserved bytes, block size): a block served from a bin (size class) sits in a
 *                 page shared with other blocks of its bin, a large object has a page of its
 *                 own (reserved == one block). Every distinct usable size is allocated once and
 *                 its page looked up; the threshold is the first request whose page holds a
 *                 single block. mi_good_size() must agree with the usable sizes below it.
 *                 (mimalloc's mi_bin() sends every size above MI_MEDIUM_OBJ_SIZE_MAX, 128 KiB
 *                 on 64-bit, to MI_BIN_HUGE, so 131073 is expected; that is not used here.)
 *     glibc       the mmap threshold: the smallest n whose chunk is mmapped. Found in a fresh
 *                 process by allocating n = 1, 2, ... and never freeing an mmapped chunk (glibc
 *                 raises its threshold when one is freed). Mmapped is read from the chunk's
 *                 IS_MMAPPED bit and checked twice more: its usable size is page-granular - 16
 *                 (heap chunks: 8 mod 16), and /proc/self/maps shows it outside [heap].
 *                 (Expected with the default M_MMAP_THRESHOLD: request2size(n) >= 131072, i.e.
 *                 n >= 131049; not used here.)
 * - style, by experiment: 64 objects each of two sizes in different classes, allocated
 *   alternately; if any 4 KiB page holds objects of both sizes the allocator is sequential,
 *   otherwise BiBOP.
 *
 * The scans allocate and free one object at a time, so they stay well under a second.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CLASSES 16384
#define SCAN_CAP ((size_t)64 << 20) /* give up looking for a threshold beyond 64 MiB */

static size_t classes[MAX_CLASSES];
static int nclasses;
static size_t threshold;
static size_t page_size;
static const char *style;
static const char *allocator = "unknown";
static char library[4096];
static char derivation[2048];
static char crosschecks[16384];
static char errors[16384];
static int nerrors;
static size_t style_pairs, style_shared;

static void appendf(char *buf, size_t cap, const char *fmt, va_list ap)
{
    size_t len = strlen(buf);
    if (len + 8 >= cap)
        return;
    if (len)
        buf[len++] = '\x1f';   /* separator, turned into JSON list items at the end */
    vsnprintf(buf + len, cap - len, fmt, ap);
}

static void error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    appendf(errors, sizeof errors, fmt, ap);
    va_end(ap);
    nerrors++;
}

static void crosscheck(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (ok) {
        appendf(crosschecks, sizeof crosschecks, fmt, ap);
    } else {
        appendf(errors, sizeof errors, fmt, ap);
        nerrors++;
    }
    va_end(ap);
}

static size_t usable_of(size_t n)
{
    void *p = malloc(n);
    if (!p)
        return 0;
    size_t u = malloc_usable_size(p);
    free(p);
    return u;
}

static void add_class(size_t u)
{
    if (nclasses && classes[nclasses - 1] == u)
        return;
    if (nclasses == MAX_CLASSES) {
        error("more than %d distinct usable sizes", MAX_CLASSES);
        return;
    }
    classes[nclasses++] = u;
}

/* Distinct usable sizes of every request 1..limit-1 (every allocator but glibc). Checks that
 * the usable size covers the request and never decreases. */
static void scan_classes(size_t limit)
{
    size_t prev = 0;
    for (size_t n = 1; n < limit; n++) {
        size_t u = usable_of(n);
        if (u < n || u < prev) {
            error("usable size of %zu is %zu (previous %zu)", n, u, prev);
            return;
        }
        add_class(u);
        prev = u;
    }
}

/* ---- style ------------------------------------------------------------------------------- */

static void style_experiment(void)
{
    enum { K = 64 };
    const size_t a_size = 16, b_size = 100;
    void *a[K], *b[K];
    for (int i = 0; i < K; i++) {
        a[i] = malloc(a_size);
        b[i] = malloc(b_size);
    }
    size_t ua = malloc_usable_size(a[0]), ub = malloc_usable_size(b[0]);
    if (ua == ub)
        error("style experiment: sizes %zu and %zu share a class", a_size, b_size);
    const uintptr_t mask = ~(uintptr_t)4095;
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++) {
            style_pairs++;
            if (((uintptr_t)a[i] & mask) == ((uintptr_t)b[j] & mask))
                style_shared++;
        }
    for (int i = 0; i < K; i++) {
        free(a[i]);
        free(b[i]);
    }
    style = style_shared ? "sequential" : "bibop";
}

/* ---- classify-by-introspection scan (tcmalloc, mimalloc) ------------------------------- */

enum where { W_CLASS, W_LARGE, W_UNSURE };

/* Every request n = 1, 2, ... while its usable size is served from a class, classifying each
 * new distinct usable size with CLASSIFY; past the first large one, a few more usable sizes
 * (n jumps to usable + 1) must all be large too. */
static void classify_scan(enum where (*classify)(size_t), const char *how)
{
    size_t prev = 0, n = 1, larges = 0, last_class = 0;
    while (n < SCAN_CAP) {
        size_t u = usable_of(n);
        if (u < n || u < prev) {
            error("usable size of %zu is %zu (previous %zu)", n, u, prev);
            return;
        }
        if (u != prev) {
            enum where w = classify(u);
            for (int retry = 0; w == W_UNSURE && retry < 4; retry++)
                w = classify(u);
            if (w == W_UNSURE) {
                error("%s: cannot classify usable size %zu", how, u);
                return;
            }
            if (w == W_CLASS) {
                if (larges) {
                    error("%s: usable size %zu is a class, but %zu (smaller) was large", how,
                          u, threshold);
                    return;
                }
                add_class(u);
                last_class = u;
            } else {
                if (!larges)
                    threshold = n;
                if (++larges >= 8)
                    break;
            }
        }
        prev = u;
        n = larges ? u + 1 : n + 1;
    }
    if (!larges) {
        error("%s: no large request found below %zu", how, SCAN_CAP);
        return;
    }
    crosscheck(threshold == last_class + 1,
               "%s: threshold %zu is the largest class %zu + 1", how, threshold, last_class);
}

/* ---- tcmalloc (gperftools) ------------------------------------------------------------- */

static int (*tc_property)(const char *, size_t *);

static enum where tc_classify(size_t u)
{
    size_t t0, t1, h0, h1;
    void *p = malloc(u);
    if (!p)
        return W_UNSURE;
    size_t real = malloc_usable_size(p);
    if (!tc_property("tcmalloc.thread_cache_free_bytes", &t0) ||
        !tc_property("tcmalloc.pageheap_free_bytes", &h0)) {
        free(p);
        return W_UNSURE;
    }
    free(p);
    tc_property("tcmalloc.thread_cache_free_bytes", &t1);
    tc_property("tcmalloc.pageheap_free_bytes", &h1);
    if (t1 == t0 + real)
        return W_CLASS;       /* went to this thread's cache: an object of a size class */
    if (t1 == t0 && h1 > h0)
        return W_LARGE;       /* went back to the page heap: a span of its own */
    return W_UNSURE;          /* a scavenge moved things meanwhile: ask again */
}

static void truth_tcmalloc(void)
{
    allocator = "tcmalloc";
    tc_property = (int (*)(const char *, size_t *))dlsym(RTLD_DEFAULT,
                                                          "MallocExtension_GetNumericProperty");
    snprintf(derivation, sizeof derivation,
             "classes: distinct malloc_usable_size of every request below the threshold; "
             "threshold: first request whose freed block goes back to the page heap "
             "(MallocExtension_GetNumericProperty tcmalloc.pageheap_free_bytes) instead of the "
             "thread cache (tcmalloc.thread_cache_free_bytes)");
    classify_scan(tc_classify, "tcmalloc free-destination");
    size_t (*nallocx)(size_t, int) = (size_t (*)(size_t, int))dlsym(RTLD_DEFAULT, "nallocx");
    if (nallocx && threshold) {
        size_t bad = 0;
        for (size_t n = 1; n < threshold && !bad; n++)
            if (nallocx(n, 0) != usable_of(n))
                bad = n;
        crosscheck(!bad, "tcmalloc nallocx(n) == usable size for every n below the threshold "
                   "(first difference at %zu, 0: none)", bad);
    }
}

/* ---- mimalloc ------------------------------------------------------------------------- */

struct mi_area {            /* the leading fields of mimalloc's mi_heap_area_t */
    void *blocks;
    size_t reserved, committed, used, block_size;
};
typedef bool mi_visit_fn(const void *heap, const struct mi_area *area, void *block,
                         size_t block_size, void *arg);
static bool (*mi_visit)(const void *heap, bool all, mi_visit_fn *fn, void *arg);
static void *(*mi_default_heap)(void);

struct mi_find {
    const char *p;
    size_t reserved, block_size;
    bool found;
};

static bool mi_find_page(const void *heap, const struct mi_area *area, void *block,
                         size_t block_size, void *arg)
{
    struct mi_find *f = arg;
    const char *start = area->blocks;
    if (f->p >= start && f->p < start + area->reserved) {
        f->found = true;
        f->reserved = area->reserved;
        f->block_size = area->block_size;
        return false;
    }
    return true;
}

static enum where mi_classify(size_t u)
{
    struct mi_find f = {0};
    void *p = malloc(u);
    if (!p)
        return W_UNSURE;
    f.p = p;
    mi_visit(mi_default_heap(), false, mi_find_page, &f);
    free(p);
    if (!f.found || !f.block_size)
        return W_UNSURE;
    /* a page of several blocks of one size: a bin; a page of one block: a large object */
    return f.reserved / f.block_size >= 2 ? W_CLASS : W_LARGE;
}

static void truth_mimalloc(void)
{
    allocator = "mimalloc";
    mi_visit = (bool (*)(const void *, bool, mi_visit_fn *, void *))dlsym(RTLD_DEFAULT,
                                                                  "mi_heap_visit_blocks");
    mi_default_heap = (void *(*)(void))dlsym(RTLD_DEFAULT, "mi_heap_get_default");
    if (!mi_default_heap) {
        error("mimalloc without mi_heap_get_default");
        return;
    }
    snprintf(derivation, sizeof derivation,
             "classes: distinct malloc_usable_size of every request below the threshold; "
             "threshold: first request whose page (mi_heap_visit_blocks area) holds a single "
             "block instead of several blocks of its bin");
    classify_scan(mi_classify, "mimalloc page occupancy");
    size_t (*good)(size_t) = (size_t (*)(size_t))dlsym(RTLD_DEFAULT, "mi_good_size");
    if (good && threshold) {
        size_t bad = 0;
        for (size_t n = 1; n < threshold && !bad; n++)
            if (good(n) != usable_of(n))
                bad = n;
        crosscheck(!bad, "mimalloc mi_good_size(n) == usable size for every n below the "
                   "threshold (first difference at %zu, 0: none)", bad);
    }
}

/* ---- jemalloc --------------------------------------------------------------------------- */

static void truth_jemalloc(void)
{
    allocator = "jemalloc";
    int (*mallctl)(const char *, void *, size_t *, void *, size_t) =
        (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallctl");
    unsigned nbins = 0;
    size_t sz = sizeof nbins;
    if (mallctl("arenas.nbins", &nbins, &sz, NULL, 0) || !nbins || nbins > MAX_CLASSES) {
        error("mallctl arenas.nbins failed");
        return;
    }
    static size_t bins[MAX_CLASSES];
    for (unsigned i = 0; i < nbins; i++) {
        char name[64];
        snprintf(name, sizeof name, "arenas.bin.%u.size", i);
        sz = sizeof bins[i];
        if (mallctl(name, &bins[i], &sz, NULL, 0)) {
            error("mallctl %s failed", name);
            return;
        }
        if (i && bins[i] <= bins[i - 1]) {
            error("jemalloc bins not ascending at %u", i);
            return;
        }
    }
    threshold = bins[nbins - 1] + 1;
    snprintf(derivation, sizeof derivation,
             "threshold: largest of mallctl arenas.bin.<i>.size (i < arenas.nbins = %u) + 1; "
             "classes: distinct malloc_usable_size of every request below it, checked equal to "
             "the bins", nbins);
    scan_classes(threshold);
    bool same = (unsigned)nclasses == nbins;
    for (int i = 0; same && i < nclasses; i++)
        same = classes[i] == bins[i];
    crosscheck(same, "jemalloc usable-size classes (%d) equal mallctl bins (%u)", nclasses,
               nbins);
    size_t lext = 0;
    sz = sizeof lext;
    if (!mallctl("arenas.lextent.0.size", &lext, &sz, NULL, 0))
        crosscheck(lext >= threshold && usable_of(threshold) == lext,
                   "jemalloc smallest large extent %zu lies above the largest bin and serves "
                   "request %zu", lext, threshold);
    size_t (*nallocx)(size_t, int) = (size_t (*)(size_t, int))dlsym(RTLD_DEFAULT, "nallocx");
    if (nallocx) {
        size_t bad = 0;
        for (size_t n = 1; n < threshold && !bad; n++)
            if (nallocx(n, 0) != usable_of(n))
                bad = n;
        crosscheck(!bad, "jemalloc nallocx(n) == usable size for every n below the threshold "
                   "(first difference at %zu, 0: none)", bad);
    }
}

/* ---- tiny_bibop ------------------------------------------------------------------------- */

static void truth_tiny(void)
{
    allocator = "tiny_bibop";
    void (*truth)(int *, const size_t **, size_t *) =
        (void (*)(int *, const size_t **, size_t *))dlsym(RTLD_DEFAULT, "tiny_bibop_truth");
    int n;
    const size_t *own;
    truth(&n, &own, &threshold);
    snprintf(derivation, sizeof derivation,
             "threshold and classes: tiny_bibop_truth(); checked against the distinct "
             "malloc_usable_size of every request below the threshold");
    scan_classes(threshold);
    bool same = nclasses == n;
    for (int i = 0; same && i < n; i++)
        same = classes[i] == own[i];
    crosscheck(same, "tiny_bibop usable-size classes (%d) equal its own list (%d)", nclasses, n);
    size_t u = usable_of(threshold);
    crosscheck(u >= threshold && u % page_size == 0,
               "tiny_bibop serves request %zu page-granular (%zu)", threshold, u);
}

/* ---- glibc -------------------------------------------------------------------------------- */

/* IS_MMAPPED in the size field of the chunk header just before P (out of line: the compiler
 * would otherwise object to reading before the start of an allocation). */
__attribute__((noinline)) static bool chunk_is_mmapped(void *p)
{
    size_t size_field;
    memcpy(&size_field, (const char *)(uintptr_t)p - sizeof size_field, sizeof size_field);
    return size_field & 2;
}

/* Whether ADDR lies in a mapping of /proc/self/maps other than [heap]; read without stdio. */
static int in_non_heap_mapping(const void *addr)
{
    static char buf[1 << 20];
    int fd = open("/proc/self/maps", O_RDONLY);
    if (fd < 0)
        return -1;
    size_t len = 0;
    ssize_t r;
    while (len < sizeof buf - 1 && (r = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t)r;
    close(fd);
    buf[len] = 0;
    uintptr_t a = (uintptr_t)addr;
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        uintptr_t lo, hi;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2 && a >= lo && a < hi)
            return strstr(line, "[heap]") ? 0 : 1;
        line = nl ? nl + 1 : NULL;
    }
    return -1;
}

/* Whether glibc serves a request of N bytes with mmap when it needs new memory: N is allocated
 * again and again (from the top chunk) until the heap must grow; then glibc either mmaps the
 * chunk (N at or above its mmap threshold) or extends the heap with brk (N below it). A single
 * malloc(N) cannot tell: while the top chunk is big enough glibc serves any size from it.
 * An mmapped chunk is never freed (that would raise the threshold): it goes to *KEPT.
 * 1, 0, or -1 when it could not tell. */
static int glibc_mmaps(size_t n, void **kept)
{
    static void *held[65536];
    size_t nheld = 0;
    int result = -1;
    void *brk0 = sbrk(0);
    while (nheld < sizeof held / sizeof held[0]) {
        void *p = malloc(n);
        if (!p)
            break;
        if (chunk_is_mmapped(p)) {
            *kept = p;
            result = 1;
            break;
        }
        held[nheld++] = p;
        if (sbrk(0) != brk0) {
            result = 0;
            break;
        }
    }
    while (nheld)
        free(held[--nheld]);
    return result;
}

static void truth_glibc(void)
{
    allocator = "glibc";
    snprintf(derivation, sizeof derivation,
             "threshold: smallest request glibc serves with mmap once its top chunk is used up "
             "(binary search; mmapped read from the chunk's IS_MMAPPED bit, checked against the "
             "usable size, page-granular - 16, and /proc/self/maps), in a fresh process without "
             "freeing an mmapped chunk; classes: distinct malloc_usable_size of every request "
             "below it");
    /* the binary search: mmapped(n) is monotone in n */
    size_t lo = 1, hi = SCAN_CAP;   /* mmaps(lo - 1) false, mmaps(hi) true */
    void *kept = NULL, *at_hi = NULL;
    int r = glibc_mmaps(hi, &at_hi);
    if (r != 1) {
        error("glibc: request %zu is not mmapped (%d)", hi, r);
        return;
    }
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        r = glibc_mmaps(mid, &kept);
        if (r < 0) {
            error("glibc: cannot tell whether request %zu is mmapped", mid);
            return;
        }
        if (r) {
            hi = mid;
            at_hi = kept;
        } else {
            lo = mid + 1;
        }
    }
    threshold = hi;
    size_t u = malloc_usable_size(at_hi);
    crosscheck(u >= threshold && (u + 16) % page_size == 0,
               "glibc chunk of request %zu has the mmapped usable size %zu (pages - 16)",
               threshold, u);
    crosscheck(in_non_heap_mapping(at_hi) == 1,
               "glibc chunk of request %zu lies outside [heap] in /proc/self/maps", threshold);
    crosscheck(threshold == 1 || glibc_mmaps(threshold - 1, &kept) == 0,
               "glibc request %zu is still served from the heap", threshold - 1);

    size_t prev = 0;
    for (size_t n = 1; n < threshold; n++) {
        void *p = malloc(n);
        if (!p) {
            error("malloc(%zu) failed", n);
            return;
        }
        u = malloc_usable_size(p);
        bool mm = chunk_is_mmapped(p);
        if (mm || u < n || u < prev || u % 16 != 8) {
            error("glibc chunk for %zu has usable size %zu (previous %zu)%s", n, u, prev,
                  mm ? ", mmapped" : "");
            return;   /* not freed: it may be mmapped */
        }
        add_class(u);
        prev = u;
        free(p);
    }
}

/* ---- output ------------------------------------------------------------------------------- */

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", (unsigned char)*s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void json_list(const char *joined)
{
    putchar('[');
    char item[4096];
    const char *s = joined;
    bool first = true;
    while (*s) {
        const char *e = strchr(s, '\x1f');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len >= sizeof item)
            len = sizeof item - 1;
        memcpy(item, s, len);
        item[len] = 0;
        if (!first)
            printf(", ");
        json_string(item);
        first = false;
        s += len;
        if (*s == '\x1f')
            s++;
    }
    putchar(']');
}

int main(void)
{
    page_size = (size_t)sysconf(_SC_PAGESIZE);

    void *real_malloc = dlsym(RTLD_DEFAULT, "malloc");
    Dl_info info;
    if (real_malloc && dladdr(real_malloc, &info) && info.dli_fname)
        snprintf(library, sizeof library, "%s", info.dli_fname);

    void (*run)(void) = NULL;
    if (dlsym(RTLD_DEFAULT, "tiny_bibop_truth"))
        run = truth_tiny;
    else if (dlsym(RTLD_DEFAULT, "mallctl"))
        run = truth_jemalloc;
    else if (dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty"))
        run = truth_tcmalloc;
    else if (dlsym(RTLD_DEFAULT, "mi_heap_visit_blocks"))
        run = truth_mimalloc;
    else if (strstr(library, "/libc.so"))
        run = truth_glibc;
    if (!run) {
        fprintf(stderr, "alloc_truth: malloc comes from %s, which it cannot question\n",
                library[0] ? library : "an unknown object");
        return 2;
    }

    style_experiment();    /* small sizes only: glibc's mmap threshold is untouched */
    run();

    printf("{\"allocator\": ");
    json_string(allocator);
    printf(", \"library\": ");
    json_string(library);
    printf(", \"style\": \"%s\", \"page_size\": %zu, \"large_threshold\": %zu,\n", style,
           page_size, threshold);
    printf(" \"size_classes\": [");
    for (int i = 0; i < nclasses; i++)
        printf("%s%zu", i ? ", " : "", classes[i]);
    printf("],\n \"style_experiment\": {\"pairs\": %zu, \"same_page\": %zu},\n", style_pairs,
           style_shared);
    printf(" \"derivation\": ");
    json_string(derivation);
    printf(",\n \"crosschecks\": ");
    json_list(crosschecks);
    printf(",\n \"errors\": ");
    json_list(errors);
    printf("}\n");
    fflush(stdout);
    return nerrors ? 1 : 0;
}
