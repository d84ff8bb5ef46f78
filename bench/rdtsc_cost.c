/* rdtsc_cost: what the bare measurement costs, next to what it measures.
 *
 *   rdtsc_cost [--direct LIB] [REPS [ITERS]]     defaults: 201 repetitions of 20000 iterations
 *
 * Repetitions are short (a few hundred microseconds), so the median skips those the scheduler
 * interrupted.
 *
 * Prints, as the median over REPS repetitions of a loop of ITERS iterations timed with
 * clock_gettime(CLOCK_MONOTONIC):
 *   rdtsc_pair_ns        two back-to-back rdtsc (what timing one allocator call costs at least)
 *   malloc_free_pair_ns  malloc(32) followed by free (the call being timed, in whatever
 *                        allocator the process uses: preload one to measure it)
 *   loop_ns              the empty loop, for reference (already included in both figures)
 * With --direct LIB (an allocator library already loaded in the process: libc.so.6, or the
 * one preloaded), a fourth loop makes the same pair through LIB's own malloc and free, looked
 * up in LIB itself, so past any library interposed in front of it (alloclens), and it prints
 *   direct_pair_ns       that pair
 *   added_ns_per_call    the median over repetitions of (malloc_free_pair - direct_pair) / 2:
 *                        what an interposer adds to each call, measured within one process,
 *                        loops side by side, so a slow moment on the machine cancels out
 *                        (run plain it is the cost of the PLT's jump, about 0).
 * stdout, one line of key=value fields; stderr, a human-readable line.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

#include "direct.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static volatile uint64_t sink;

__attribute__((noinline)) static double loop_empty(uint64_t iters)
{
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++)
        __asm__ volatile("" ::: "memory");
    return (double)(now_ns() - t0) / (double)iters;
}

__attribute__((noinline)) static double loop_rdtsc(uint64_t iters)
{
    uint64_t acc = 0;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++) {
        uint64_t a = __rdtsc();
        __asm__ volatile("" ::: "memory");   /* the timed call would sit here */
        uint64_t b = __rdtsc();
        acc += b - a;
    }
    double r = (double)(now_ns() - t0) / (double)iters;
    sink = acc;
    return r;
}

__attribute__((noinline)) static double loop_malloc(uint64_t iters)
{
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++) {
        void *p = malloc(32);
        __asm__ volatile("" : : "r"(p) : "memory");   /* keep the pair from being elided */
        free(p);
    }
    return (double)(now_ns() - t0) / (double)iters;
}

static struct bench_fns direct;

__attribute__((noinline)) static double loop_direct(uint64_t iters)
{
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++) {
        void *p = direct.malloc(32);
        __asm__ volatile("" : : "r"(p) : "memory");
        direct.free(p);
    }
    return (double)(now_ns() - t0) / (double)iters;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, unsigned n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    unsigned long reps = 201, iters = 20000;
    const char *lib = NULL;
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: %s [--direct LIB] [REPS [ITERS]]   (defaults 201 20000)\n", argv[0]);
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "--direct")) {
        lib = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc > 1)
        reps = strtoul(argv[1], NULL, 10);
    if (argc > 2)
        iters = strtoul(argv[2], NULL, 10);
    if (reps < 1 || reps > 100000 || iters < 1) {
        fprintf(stderr, "usage: %s [--direct LIB] [REPS [ITERS]]\n", argv[0]);
        return 2;
    }
    if (lib && bench_direct("rdtsc_cost", lib, &direct) != 0)
        return 2;

    /* The loops take turns, so a slow moment on the machine hits all of them alike. */
    double *v = malloc(5 * reps * sizeof *v);
    if (!v)
        return 1;
    double *ve = v, *vt = v + reps, *vm = v + 2 * reps, *vd = v + 3 * reps, *va = v + 4 * reps;
    loop_empty(iters / 10 + 1);              /* warm up: page in, settle the allocator */
    loop_rdtsc(iters / 10 + 1);
    loop_malloc(iters / 10 + 1);
    if (lib)
        loop_direct(iters / 10 + 1);
    for (unsigned long r = 0; r < reps; r++) {
        ve[r] = loop_empty(iters);
        vt[r] = loop_rdtsc(iters);
        vm[r] = loop_malloc(iters);
        if (lib) {
            vd[r] = loop_direct(iters);
            va[r] = (vm[r] - vd[r]) / 2;     /* two calls per pair */
        }
    }
    double loop = median(ve, (unsigned)reps);
    double tsc = median(vt, (unsigned)reps);
    double pair = median(vm, (unsigned)reps);

    printf("rdtsc_pair_ns=%.2f malloc_free_pair_ns=%.2f loop_ns=%.2f", tsc, pair, loop);
    if (lib)
        printf(" direct_pair_ns=%.2f added_ns_per_call=%.2f", median(vd, (unsigned)reps),
               median(va, (unsigned)reps));
    printf(" reps=%lu iters=%lu\n", reps, iters);
    fflush(stdout);
    fprintf(stderr, "rdtsc_cost: two back-to-back rdtsc %.1f ns; malloc(32)+free %.1f ns", tsc, pair);
    if (lib)
        fprintf(stderr, ", %.1f ns through %s's own functions (%.1f ns added per call)",
                median(vd, (unsigned)reps), lib, median(va, (unsigned)reps));
    fprintf(stderr, " (medians of %lu x %lu)\n", reps, iters);
    free(v);
    return 0;
}
