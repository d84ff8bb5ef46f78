/* sites_stats: allocation sites of known size mix, for the sampler's statistical tests.
 *
 * Each site is a function of its own (noinline, noclone, never a tail call of malloc) whose name
 * the test looks for in the report's stacks. The program prints its own truth as one JSON object
 * on stdout, per site: the requested bytes and objects allocated over the run, the bytes still
 * live when the program ends, and the histogram of request sizes (the test derives the
 * estimator's theoretical variance from it):
 *
 *   {"sites":{"site_small_objects":{"bytes":N,"objects":N,"live_bytes":N,
 *                                   "sizes":{"8":1000000},"usable":{"8":24}},...}}
 *
 * "usable" is malloc_usable_size of an object of each size, as the site got it (the
 * internal fragmentation of the site is the sum over its objects of usable - requested).
 *
 * Order, so that the process's peak of live memory is at the end, with everything the live sites
 * allocated still live:
 *   1. site_medium_objects: 16384 x 64 KiB, each freed at once (transient 64 KiB)
 *   2. site_mixed_sizes:    8 B, 512 B, 64 KiB and 8 MiB requests, each freed at once
 *   3. site_small_objects:  1,000,000 x 8 B, all live until exit (8 MB requested)
 *   4. site_huge_objects:   8 x 8 MiB, all live until exit (64 MiB requested)
 * Nothing of the program's own bookkeeping comes from malloc (static arrays; output through a
 * static buffer and write(2)), so the sites above are the program's only ones.
 *
 * --churn runs instead, for where the peak is:
 *   1. site_churn_batches:  20 batches of 160 x 64 KiB (10 MiB live at once), each batch freed
 *                           before the next; the heap shrinks back after each
 *   2. site_small_objects:  as above (1,000,000 x 8 B: 32 MB of heap), live until exit
 * Under glibc (the test's allocator: 32-byte chunks for the small objects, and the heap trimmed
 * after each batch) the heap's peak is at the end, where the batches hold nothing; the
 * sampler's estimate of what is live is higher in some batch (a batch is about 18 samples, so
 * its estimate varies by a quarter, and the highest of 20 is nearly twice the small site's).
 *
 * usage: sites_stats [--small N] [--no-transient] [--churn]
 *   --small N         N objects in site_small_objects (default 1000000; 0 skips the site)
 *   --no-transient    skip site_medium_objects and site_mixed_sizes
 *   --churn           site_churn_batches and site_small_objects only
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINL __attribute__((noinline, noclone))
#define KiB 1024ul
#define MiB (1024ul * 1024ul)

#define SMALL_MAX 4000000
static void *small_live[SMALL_MAX];
static void *huge_live[8];
/* Keeps the compiler from dropping a malloc whose result is freed unused. */
static void *volatile sink;

struct truth {
    const char *name;
    unsigned long bytes, objects, live_bytes;
    unsigned long size[8], count[8], usable[8];
    int nsizes;
};
static struct truth truths[5];
static int ntruths;

static struct truth *truth(const char *name)
{
    struct truth *t = &truths[ntruths++];
    t->name = name;
    return t;
}

/* malloc_usable_size of the first object of each size each site got, by site and size. */
struct usable { unsigned long size, usable; };
static struct usable usables[5][8];

static void note_usable(int site, unsigned long size, void *p)
{
    for (int i = 0; i < 8; i++) {
        if (usables[site][i].size == size)
            return;
        if (!usables[site][i].size) {
            usables[site][i].size = size;
            usables[site][i].usable = malloc_usable_size(p);
            return;
        }
    }
}

static void count(struct truth *t, unsigned long size, unsigned long n)
{
    int i;
    for (i = 0; i < t->nsizes && t->size[i] != size; i++)
        ;
    if (i == t->nsizes) {
        t->size[i] = size;
        t->nsizes++;
    }
    t->count[i] += n;
    for (int j = 0; j < 8; j++)
        if (usables[t - truths][j].size == size)
            t->usable[i] = usables[t - truths][j].usable;
    t->bytes += size * n;
    t->objects += n;
}

NOINL static void site_medium_objects(unsigned long n)
{
    for (unsigned long i = 0; i < n; i++) {
        void *p = malloc(64 * KiB);
        if (!p)
            abort();
        if (i == 0)
            note_usable(0, 64 * KiB, p);
        sink = p;
        free(p);
    }
}

/* One malloc call (one line): the size comes from a table. */
static const unsigned long mixed_sizes[] = { 8, 8, 8, 8, 8, 8, 8, 8, 512, 512, 64 * KiB };
NOINL static void site_mixed_sizes(unsigned long rounds, unsigned long huge_every)
{
    const unsigned long k = sizeof mixed_sizes / sizeof mixed_sizes[0];
    for (unsigned long i = 0; i < rounds * k; i++) {
        unsigned long sz = mixed_sizes[i % k];
        if (i % k == 0 && (i / k) % huge_every == huge_every - 1)
            sz = 8 * MiB;
        void *p = malloc(sz);
        if (!p)
            abort();
        note_usable(1, sz, p);
        sink = p;
        free(p);
    }
}

NOINL static void site_small_objects(unsigned long n)
{
    for (unsigned long i = 0; i < n; i++) {
        small_live[i] = malloc(8);
        if (!small_live[i])
            abort();
        if (i == 0)
            note_usable(2, 8, small_live[i]);
    }
}

#define CHURN_PER_BATCH 160

NOINL static void site_churn_batches(unsigned long batches, unsigned long per_batch)
{
    static void *batch[CHURN_PER_BATCH];
    for (unsigned long b = 0; b < batches; b++) {
        for (unsigned long i = 0; i < per_batch; i++) {
            batch[i] = malloc(64 * KiB);
            if (!batch[i])
                abort();
            if (b == 0 && i == 0)
                note_usable(4, 64 * KiB, batch[i]);
        }
        for (unsigned long i = 0; i < per_batch; i++)
            free(batch[i]);
    }
}

NOINL static void site_huge_objects(void)
{
    for (int i = 0; i < 8; i++) {
        huge_live[i] = malloc(8 * MiB);
        if (!huge_live[i])
            abort();
        if (i == 0)
            note_usable(3, 8 * MiB, huge_live[i]);
    }
}

static char out[8192];

int main(int argc, char **argv)
{
    unsigned long nsmall = 1000000;
    int transient = 1, churn = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--small") == 0 && i + 1 < argc)
            nsmall = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--no-transient") == 0)
            transient = 0;
        else if (strcmp(argv[i], "--churn") == 0)
            churn = 1;
        else
            nsmall = SMALL_MAX + 1;
    }
    if (nsmall > SMALL_MAX) {
        static const char msg[] = "usage: sites_stats [--small N (at most 4000000)] [--no-transient] [--churn]\n";
        if (write(2, msg, sizeof msg - 1) < 0)
            return 2;
        return 2;
    }

    /* truths[] in the order of usables[]: medium, mixed, small, huge, churn */
    struct truth *medium = truth("site_medium_objects"), *mixed = truth("site_mixed_sizes");
    struct truth *small = truth("site_small_objects"), *huge = truth("site_huge_objects");
    struct truth *batches = truth("site_churn_batches");
    const unsigned long nmedium = 16384, mixed_rounds = 16384, huge_every = 1024;
    const unsigned long nbatches = 20, per_batch = CHURN_PER_BATCH;

    if (churn) {
        site_churn_batches(nbatches, per_batch);
        count(batches, 64 * KiB, nbatches * per_batch);
        transient = 0;
    }
    if (transient) {
        site_medium_objects(nmedium);
        count(medium, 64 * KiB, nmedium);

        site_mixed_sizes(mixed_rounds, huge_every);
        const unsigned long k = sizeof mixed_sizes / sizeof mixed_sizes[0];
        for (unsigned long i = 0; i < mixed_rounds * k; i++) {
            unsigned long sz = mixed_sizes[i % k];
            if (i % k == 0 && (i / k) % huge_every == huge_every - 1)
                sz = 8 * MiB;
            count(mixed, sz, 1);
        }
    }

    if (nsmall) {
        site_small_objects(nsmall);
        count(small, 8, nsmall);
        small->live_bytes = small->bytes;
    }

    if (!churn) {
        site_huge_objects();
        count(huge, 8 * MiB, 8);
        huge->live_bytes = huge->bytes;
    }

    size_t len = 0;
    len += snprintf(out + len, sizeof out - len, "{\"sites\":{");
    for (int i = 0, n = 0; i < ntruths; i++) {
        const struct truth *s = &truths[i];
        if (!s->objects)
            continue; /* a site the run skipped */
        len += snprintf(out + len, sizeof out - len,
                        "%s\"%s\":{\"bytes\":%lu,\"objects\":%lu,\"live_bytes\":%lu,\"sizes\":{",
                        n++ ? "," : "", s->name, s->bytes, s->objects, s->live_bytes);
        for (int j = 0; j < s->nsizes; j++)
            len += snprintf(out + len, sizeof out - len, "%s\"%lu\":%lu", j ? "," : "",
                            s->size[j], s->count[j]);
        len += snprintf(out + len, sizeof out - len, "},\"usable\":{");
        for (int j = 0; j < s->nsizes; j++)
            len += snprintf(out + len, sizeof out - len, "%s\"%lu\":%lu", j ? "," : "",
                            s->size[j], s->usable[j]);
        len += snprintf(out + len, sizeof out - len, "}}");
    }
    len += snprintf(out + len, sizeof out - len, "}}\n");
    if (write(1, out, len) != (ssize_t)len)
        return 1;
    return 0; /* small_live and huge_live stay live until exit */
}
