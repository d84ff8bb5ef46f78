/* alloclens-probe: finds an allocator's style, size classes and large-object threshold by
 * experiment. It runs with the allocator preloaded (and, normally, under the tracer of
 * runner.c, which counts the mmap/munmap calls the allocator really makes) and knows nothing
 * about any particular allocator.
 *
 * - Style: objects of two different small sizes allocated alternately share pages in a
 *   sequential allocator and never do in a BiBOP one.
 * - Size classes, BiBOP: allocate a batch of one request size; objects of one class sit a
 *   class size apart in their bag, so the smallest distance between two of them is the class
 *   size. The next size probed is the class size + 8. malloc_usable_size, where the allocator
 *   has it, cross-checks every class.
 * - Size classes, sequential: the distinct usable sizes over every request size in steps of 8.
 * - Large threshold: a request is large when (a) every allocation of it gets a mapping of its
 *   own (net bytes mapped by the call close to the request), or (b) it can grow in place
 *   with realloc, or (c) two freed neighbours merge to serve a request twice as big: a
 *   size-class slot can do neither (a bigger class lives in other bags; a freed slot waits in
 *   its class's free list). Each signal must hold on repetition; the threshold is one past
 *   the last class seen before it. For a sequential allocator only (a) applies, refined to
 *   the byte.
 *
 * Thread caches and first-use initialisation are kept out by a warm-up, by taking fresh
 * objects for every measurement and never freeing while scanning (freed objects would come
 * back from a cache). The probe's own bookkeeping lives in mmap'd memory, never the heap.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc_config.h"
#include "prerun.h"

#define MAX_SCAN (96ull << 20)  /* the largest request size the scan looks at */
#define MAX_HELD (2ull << 30)   /* and the most it keeps allocated while scanning */
#define MAX_BATCH 32
#define CONFIRM 4               /* repetitions a large-object signal must hold for */

static struct al_alloc_config cfg;
static const volatile struct al_probe_counters *counters;
static size_t (*usable)(void *);
static uint64_t page;

/* ---- measurements ------------------------------------------------------------------------ */

/* Net bytes the allocator mapped during one call: from the tracer when there is one, else from
 * the process's virtual size (which also moves with brk, so it is the weaker signal). */
static long long vsize_bytes(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    return atoll(buf) * (long long)page;
}

struct mark {
    uint64_t mmaps;
    long long net;
};

static struct mark mark_now(void)
{
    if (counters)
        return (struct mark){ counters->mmaps, (long long)(counters->mmap_bytes - counters->munmap_bytes) };
    return (struct mark){ 0, vsize_bytes() };
}

/* Did the call between A and B map memory of its own for a request of S bytes? */
static bool own_mapping(struct mark a, struct mark b, uint64_t s)
{
    long long net = b.net - a.net;
    uint64_t slack = s / 8 > (1u << 20) ? s / 8 : (1u << 20);
    if (counters && b.mmaps == a.mmaps)
        return false;
    return net >= (long long)s && (uint64_t)net <= s + slack;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

struct batch {
    uint64_t size;
    unsigned n;
    uintptr_t p[MAX_BATCH];
    unsigned own_mappings; /* allocations that each got a mapping of their own */
    uint64_t stride;       /* smallest distance between two of them */
    uint64_t usable;       /* malloc_usable_size of the first, 0 when unknown */
};

/* Allocates a batch of S-byte objects, kept alive for the rest of the run. */
static void take_batch(struct batch *b, uint64_t s, unsigned n)
{
    memset(b, 0, sizeof *b);
    b->size = s;
    for (unsigned i = 0; i < n; i++) {
        struct mark a = mark_now();
        void *p = malloc(s);
        struct mark z = mark_now();
        if (!p)
            break;
        b->own_mappings += own_mapping(a, z, s);
        b->p[b->n++] = (uintptr_t)p;
    }
    if (b->n && usable)
        b->usable = usable((void *)b->p[0]);
    uintptr_t sorted[MAX_BATCH];
    memcpy(sorted, b->p, b->n * sizeof *sorted);
    qsort(sorted, b->n, sizeof *sorted, cmp_ptr);
    b->stride = UINT64_MAX;
    for (unsigned i = 1; i < b->n; i++)
        if (sorted[i] - sorted[i - 1] < b->stride && sorted[i] != sorted[i - 1])
            b->stride = sorted[i] - sorted[i - 1];
}

/* Can an object of S bytes (class C) grow past its class without moving? */
static unsigned grows_in_place(uint64_t s, uint64_t c)
{
    unsigned stayed = 0;
    for (int i = 0; i < CONFIRM; i++) {
        void *p = malloc(s);
        if (!p)
            continue;
        void *q = realloc(p, c + page);
        if (q == p)
            stayed++;
    }
    return stayed;
}

/* Do two neighbouring objects of S bytes, once freed, serve one request of twice the size at
 * the first one's address? Slots of a size class never can: freed, they wait in their class's
 * free lists (or a thread cache) for a request of that class. Memory handed out by the page or
 * extent (its own run per object) goes back to a pool where neighbours merge. */
static unsigned coalesces(uint64_t s)
{
    unsigned hits = 0;
    for (int i = 0; i < CONFIRM; i++) {
        /* Two neighbours: a run of allocations holds some (a freed slot reused first may
         * break the first pair); the others stay allocated. */
        uintptr_t p[8];
        unsigned n = 0;
        for (; n < 8; n++) {
            p[n] = (uintptr_t)malloc(s);
            if (!p[n])
                break;
        }
        qsort(p, n, sizeof *p, cmp_ptr);
        unsigned best = 0;
        for (unsigned k = 1; k + 1 < n; k++)
            if (p[k + 1] - p[k] < p[best + 1] - p[best])
                best = k;
        if (n < 2)
            continue;
        free((void *)p[best]);
        free((void *)p[best + 1]);
        if ((uintptr_t)malloc(2 * s) == p[best])
            hits++;
    }
    return hits;
}

/* ---- style ------------------------------------------------------------------------------- */

static unsigned style_trials, style_shared;

static enum al_style find_style(void)
{
    static const uint64_t pairs[][2] = { { 40, 200 }, { 56, 520 }, { 24, 1000 }, { 120, 2600 }, { 88, 328 } };
    for (size_t t = 0; t < sizeof pairs / sizeof pairs[0]; t++) {
        uintptr_t a[16], b[16];
        for (int i = 0; i < 16; i++) {
            a[i] = (uintptr_t)malloc(pairs[t][0]);
            b[i] = (uintptr_t)malloc(pairs[t][1]);
        }
        unsigned shared = 0;
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++)
                if (a[i] / page == b[j] / page) {
                    shared++;
                    j = 16;
                }
        style_trials++;
        style_shared += shared >= 8;
    }
    return style_shared * 2 > style_trials ? AL_STYLE_SEQUENTIAL : AL_STYLE_BIBOP;
}

/* ---- sequential allocators ---------------------------------------------------------------- */

static unsigned class_checks, class_disagreements;
static char threshold_how[160];

/* CONFIRM allocations in a row each got a mapping of their own. A sequential allocator may
 * first serve a few from free space it already holds (glibc's top chunk), so up to
 * 4 * CONFIRM tries use that up first. */
static bool large_at(uint64_t s)
{
    int row = 0;
    for (int i = 0; i < 4 * CONFIRM && row < CONFIRM; i++) {
        struct mark a = mark_now();
        void *p = malloc(s);
        struct mark z = mark_now();
        if (!p)
            return false;
        row = own_mapping(a, z, s) ? row + 1 : 0;
    }
    return row >= CONFIRM;
}

static void add_class(uint64_t c)
{
    if (cfg.nclasses && c <= cfg.classes[cfg.nclasses - 1])
        return;
    if (cfg.nclasses < AL_CONFIG_MAX_CLASSES)
        cfg.classes[cfg.nclasses++] = c;
}

static int probe_sequential(void)
{
    /* Threshold first, before anything large is freed: some allocators (glibc) raise their
     * mapping threshold when a mapped chunk comes back. Coarse steps of a page, then the byte. */
    uint64_t lo = 8, hi = 0;
    for (uint64_t s = page; s <= MAX_SCAN; s += s < (1u << 20) ? page : s / 16) {
        if (large_at(s)) {
            hi = s;
            break;
        }
        lo = s;
    }
    if (!hi) {
        snprintf(threshold_how, sizeof threshold_how, "none found up to %llu bytes", (unsigned long long)MAX_SCAN);
        cfg.large_threshold = MAX_SCAN + 1;
    } else {
        while (hi - lo > 1) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (large_at(mid))
                hi = mid;
            else
                lo = mid;
        }
        cfg.large_threshold = hi;
        snprintf(threshold_how, sizeof threshold_how, "own mapping per allocation from %llu bytes (%d/%d, to the byte)",
                 (unsigned long long)hi, CONFIRM, CONFIRM);
    }
    if (!usable) {
        fprintf(stderr, "alloclens-probe: a sequential allocator without malloc_usable_size: size classes cannot be told\n");
        return -1;
    }
    for (uint64_t s = 8; s < cfg.large_threshold; s += 8) {
        void *p = malloc(s);
        if (!p)
            return -1;
        add_class(usable(p));
        free(p);
    }
    /* The last requests below the threshold may not be multiples of 8. */
    void *p = malloc(cfg.large_threshold - 1);
    if (p) {
        add_class(usable(p));
        free(p);
    }
    class_checks = cfg.nclasses;
    return 0;
}

/* ---- BiBOP allocators --------------------------------------------------------------------- */

static int probe_bibop(void)
{
    static struct batch b;
    uint64_t s = 8, held = 0;
    while (s <= MAX_SCAN && held <= MAX_HELD) {
        unsigned n = s <= 1024 ? 32 : s <= 65536 ? 8 : CONFIRM;
        take_batch(&b, s, n);
        if (b.n < 2)
            return -1;
        held += (n + 3 * CONFIRM) * s;
        uint64_t c = b.stride;
        if (b.usable) {
            class_checks++;
            if (b.usable != c) {
                /* Non-adjacent slots (a bag of one object, or bags apart): the stride is an
                 * upper bound; the allocator's own usable size is the class when it fits. */
                class_disagreements += b.usable > c || b.usable < s;
                if (b.usable >= s && b.usable < c)
                    c = b.usable;
            }
        }
        if (c < s)
            c = s;
        uint64_t last = cfg.nclasses ? cfg.classes[cfg.nclasses - 1] : 0;
        if (b.own_mappings == b.n && b.n >= CONFIRM) {
            cfg.large_threshold = last + 1;
            snprintf(threshold_how, sizeof threshold_how, "own mapping per allocation from %llu bytes (%u/%u)",
                     (unsigned long long)s, b.own_mappings, b.n);
            return 0;
        }
        unsigned grew = grows_in_place(s, c);
        if (grew) {
            cfg.large_threshold = last + 1;
            snprintf(threshold_how, sizeof threshold_how, "grows in place with realloc from %llu bytes (%u/%d)",
                     (unsigned long long)s, grew, CONFIRM);
            return 0;
        }
        unsigned merged = coalesces(s);
        if (merged) {
            cfg.large_threshold = last + 1;
            snprintf(threshold_how, sizeof threshold_how,
                     "freed neighbours merge for a bigger request from %llu bytes (%u/%d)",
                     (unsigned long long)s, merged, CONFIRM);
            return 0;
        }
        add_class(c);
        s = (c + 8) & ~(uint64_t)7;
    }
    cfg.large_threshold = cfg.classes[cfg.nclasses - 1] + 1;
    snprintf(threshold_how, sizeof threshold_how, "none found up to %llu bytes", (unsigned long long)MAX_SCAN);
    return 0;
}

/* ---- main -------------------------------------------------------------------------------- */

static void attach_counters(void)
{
    const char *fd = getenv(AL_PROBE_FD_ENV);
    if (!fd)
        return;
    void *p = mmap(NULL, sizeof(struct al_probe_counters), PROT_READ, MAP_SHARED, atoi(fd), 0);
    if (p == MAP_FAILED)
        return;
    counters = p;
    if (counters->magic != AL_PROBE_MAGIC || !counters->traced)
        counters = NULL;
}

static void warm_up(void)
{
    /* The allocator's own first-use initialisation, its thread cache's first fills. */
    for (uint64_t s = 8; s <= 4096; s += 8)
        free(malloc(s));
    void *keep[64];
    for (int i = 0; i < 64; i++)
        keep[i] = malloc(64);
    for (int i = 0; i < 64; i++)
        free(keep[i]);
}

int main(void)
{
    page = (uint64_t)sysconf(_SC_PAGESIZE);
    usable = (size_t (*)(void *))dlsym(RTLD_DEFAULT, "malloc_usable_size");
    attach_counters();
    warm_up();
    cfg.page_size = page;
    cfg.style = find_style();
    int r = cfg.style == AL_STYLE_SEQUENTIAL ? probe_sequential() : probe_bibop();
    if (r < 0 || cfg.nclasses == 0) {
        fprintf(stderr, "alloclens-probe: the experiment failed (no usable size classes found)\n");
        return 1;
    }
    snprintf(cfg.confidence, sizeof cfg.confidence,
             "style %s (%u/%u trials); %u classes, %u/%u cross-checked with malloc_usable_size%s; "
             "threshold: %s; syscalls %s",
             _al_config_style_name(cfg.style),
             cfg.style == AL_STYLE_SEQUENTIAL ? style_shared : style_trials - style_shared, style_trials,
             cfg.nclasses, class_checks - class_disagreements, class_checks,
             usable ? "" : " (not available)", threshold_how, counters ? "traced" : "not traced (virtual size only)");
    /* Filled in by the runner, which knows the file. */
    strcpy(cfg.allocator, "/");
    static char text[1 << 20];
    long n = _al_config_format(&cfg, text, sizeof text);
    if (n < 0)
        return 1;
    fwrite(text, 1, (size_t)n, stdout);
    fprintf(stderr, "alloclens-probe: %s\n", cfg.confidence);
    return 0;
}
