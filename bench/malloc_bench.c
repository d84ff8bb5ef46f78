/* malloc_bench: a malloc-heavy multithreaded workload that counts its own calls.
 *
 *   malloc_bench [--direct LIB] [THREADS [OPS_PER_THREAD [SEED]]]
 *                                                     defaults: 4 threads, 1500000 ops, seed 42
 *
 * Each thread runs OPS_PER_THREAD steps over two rings of live objects: a small hot ring (short
 * lifetimes, most steps) and a larger warm ring (longer lifetimes), so frees and allocations
 * interleave the way they do in services. A step picks a slot: an empty slot gets a new object;
 * a full slot has its object freed (or, now and then, handed to the next thread, which frees it)
 * and replaced, or resized in place with realloc. Allocations are mostly malloc, some calloc.
 *
 * Sizes are skewed like real heaps: ~88% small (8..512 B, most of them 16..64 B), ~12% medium
 * (513 B..16 KiB), 1 in 2000 large (256 KiB + a little). Every object is written at both ends.
 *
 * The size sequence, the operation sequence and the call counts depend only on THREADS,
 * OPS_PER_THREAD and SEED. Which thread frees a handed-off object can depend on timing (a full
 * handoff queue makes the producer free it itself), but every object is freed exactly once, so
 * the totals are exact and the same on every run.
 *
 * stdout, one line of key=value fields (for scripts, e.g. bench/overhead.py):
 *   calls=N malloc=N calloc=N realloc=N free=N threads=T ops_per_thread=N seed=S elapsed_ns=N
 * calls is malloc+calloc+realloc+free made by the workload itself (not by libc or the runtime);
 * elapsed_ns is CLOCK_MONOTONIC from the moment the first thread starts its steps (all are
 * created and released together) to the moment the last one has freed its last object, as the
 * threads read it (thread start-up and exit, and process start and exit, are not included).
 * stderr: one human-readable summary line (this program doubles as `alloclens demo`).
 *
 * --direct LIB (an allocator library the process has loaded already: libc.so.6, or the one
 * preloaded) runs the steps in 2 x AB_ROUNDS rounds taking turns, A B B A A B...: A through
 * the program's symbols (alloclens, where it is preloaded), B through LIB's own functions, past
 * it. A round starts with empty rings and ends with every object of the round freed by the
 * functions that made it, so the two kinds never meet. stdout adds
 *   rounds=N symbols_calls=N symbols_ns=N direct_ns=N ab_ratio=R
 * the rounds, the calls made through the symbols (all that alloclens sees), the summed round
 * times of each kind (elapsed_ns is then their sum), and the median over adjacent pairs of
 * rounds of symbols/direct: what an interposer costs this workload, measured in one process,
 * so that the machine's speed, which drifts between runs, changes both alike. The calls of B
 * rounds are the program's too (in calls=...), but alloclens does not see them.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "direct.h"

#define HOT_SLOTS 64u           /* short-lived objects: most steps land here */
#define WARM_SLOTS 4096u        /* longer-lived objects */
#define HOT_SHARE 80u           /* percent of steps on the hot ring */
#define REALLOC_SHARE 6u        /* percent of full-slot steps that realloc instead of free */
#define CALLOC_SHARE 5u         /* percent of allocations made with calloc */
#define HANDOFF_PER_MILLE 20u   /* per mille of freed objects handed to the next thread */
#define QUEUE_CAP 1024u         /* handoff queue capacity (power of two) */
#define DRAIN_EVERY 64u         /* steps between checks of the incoming handoff queue */
#define MAX_THREADS 1024
#define AB_ROUNDS 20            /* --direct: rounds of each kind */

/* splitmix64: tiny, fast, good enough, and the same everywhere. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint32_t rng_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(((rng_next(s) >> 32) * (uint64_t)n) >> 32);
}

/* Request size: a skewed mix of small, some medium and rare large sizes. */
static size_t pick_size(uint64_t *s)
{
    uint32_t r = rng_below(s, 100000);
    if (r < 50)                                  /* 0.05%: large */
        return 256u * 1024u + rng_below(s, 4096);
    if (r < 12050) {                             /* 12%: medium, 513 B .. 16 KiB */
        uint32_t m = rng_below(s, 100);
        if (m < 55) return 513 + rng_below(s, 512);        /* 513..1024 */
        if (m < 85) return 1025 + rng_below(s, 3072);      /* 1 KiB..4 KiB */
        return 4097 + rng_below(s, 12288);                 /* 4 KiB..16 KiB */
    }
    uint32_t m = rng_below(s, 100);              /* 88%: small, 8 .. 512 B */
    if (m < 18) return 8 + rng_below(s, 9);                /* 8..16 */
    if (m < 46) return 17 + rng_below(s, 16);              /* 17..32 */
    if (m < 68) return 33 + rng_below(s, 32);              /* 33..64 */
    if (m < 84) return 65 + rng_below(s, 64);              /* 65..128 */
    if (m < 94) return 129 + rng_below(s, 128);            /* 129..256 */
    return 257 + rng_below(s, 256);                        /* 257..512 */
}

/* Single-producer single-consumer queue of pointers from thread i to thread i+1. */
struct queue {
    _Alignas(64) _Atomic uint32_t head;   /* written by the consumer */
    _Alignas(64) _Atomic uint32_t tail;   /* written by the producer */
    _Alignas(64) void *slot[QUEUE_CAP];
};

struct counts {
    uint64_t malloc_n, calloc_n, realloc_n, free_n, handed, received;
    uint64_t symbols_calls; /* the calls made in rounds through the program's symbols */
};

static uint64_t calls_of(const struct counts *c)
{
    return c->malloc_n + c->calloc_n + c->realloc_n + c->free_n;
}

struct worker {
    _Alignas(64) struct counts c;
    const struct bench_fns *f; /* the functions this round calls */
    uint64_t started, ended;   /* this round's, CLOCK_MONOTONIC */
    unsigned idx;
    uint64_t ops;
    uint64_t seed;
    struct queue *in;       /* objects handed to this thread */
    struct queue *out;      /* objects this thread hands on; NULL with one thread */
    void *hot[HOT_SLOTS];
    void *warm[WARM_SLOTS];
    pthread_t tid;
};

static pthread_barrier_t start_barrier;   /* all threads + main: a round starts after it */
static pthread_barrier_t drain_barrier;   /* all threads: nobody hands off after it */
static pthread_barrier_t end_barrier;     /* all threads + main: a round is over (--direct) */
static const struct bench_fns *round_fns; /* set by main before a round's start */
static unsigned rounds = 1;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void touch(void *p, size_t n)
{
    volatile unsigned char *b = p;
    b[0] = (unsigned char)n;
    b[n - 1] = (unsigned char)(n >> 8);
}

static inline void do_free(struct worker *w, void *p)
{
    w->f->free(p);
    w->c.free_n++;
}

/* A fresh object of N bytes (WHAT: the call, for the message), touched; out of memory ends
 * the run. */
static void *ready(void *p, size_t n, const char *what)
{
    if (!p) {
        fprintf(stderr, "malloc_bench: out of memory (%s%zu bytes)\n", what, n);
        exit(1);
    }
    touch(p, n);
    return p;
}

static void *alloc_one(struct worker *w)
{
    size_t n = pick_size(&w->seed);
    void *p;
    if (rng_below(&w->seed, 100) < CALLOC_SHARE) {
        p = w->f->calloc(1, n);
        w->c.calloc_n++;
    } else {
        p = w->f->malloc(n);
        w->c.malloc_n++;
    }
    return ready(p, n, "");
}

static int queue_push(struct queue *q, void *p)
{
    uint32_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    uint32_t h = atomic_load_explicit(&q->head, memory_order_acquire);
    if (t - h == QUEUE_CAP)
        return 0;
    q->slot[t & (QUEUE_CAP - 1)] = p;
    atomic_store_explicit(&q->tail, t + 1, memory_order_release);
    return 1;
}

static void drain(struct worker *w)
{
    struct queue *q = w->in;
    uint32_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
    uint32_t t = atomic_load_explicit(&q->tail, memory_order_acquire);
    for (; h != t; h++) {
        void *p = q->slot[h & (QUEUE_CAP - 1)];
        (void)*(volatile unsigned char *)p;   /* the consumer uses the object before freeing it */
        do_free(w, p);
        w->c.received++;
    }
    atomic_store_explicit(&q->head, h, memory_order_release);
}

/* A full slot: realloc it in place, or free it (maybe via the next thread) and refill it. */
static void *replace(struct worker *w, void *p)
{
    uint32_t r = rng_below(&w->seed, 1000);
    if (r < REALLOC_SHARE * 10) {
        size_t n = pick_size(&w->seed);
        if (n > 16384)
            n = 16384;
        void *q = w->f->realloc(p, n);
        w->c.realloc_n++;
        return ready(q, n, "realloc ");
    }
    if (w->out && r >= 1000 - HANDOFF_PER_MILLE) {
        if (queue_push(w->out, p))
            w->c.handed++;
        else
            do_free(w, p);                  /* queue full: free it here; totals stay exact */
    } else {
        do_free(w, p);
    }
    return alloc_one(w);
}

/* A round: OPS steps of the workload, then every object freed. */
static void run_round(struct worker *w, uint64_t ops)
{
    for (uint64_t i = 0; i < ops; i++) {
        void **slot;
        if (rng_below(&w->seed, 100) < HOT_SHARE)
            slot = &w->hot[rng_below(&w->seed, HOT_SLOTS)];
        else
            slot = &w->warm[rng_below(&w->seed, WARM_SLOTS)];
        *slot = *slot ? replace(w, *slot) : alloc_one(w);
        if (w->out && (i % DRAIN_EVERY) == DRAIN_EVERY - 1)
            drain(w);
    }

    if (w->out) {
        pthread_barrier_wait(&drain_barrier);   /* every producer is done */
        drain(w);
    }
    for (unsigned i = 0; i < HOT_SLOTS; i++)
        if (w->hot[i])
            do_free(w, w->hot[i]);
    for (unsigned i = 0; i < WARM_SLOTS; i++)
        if (w->warm[i])
            do_free(w, w->warm[i]);
    memset(w->hot, 0, sizeof w->hot);
    memset(w->warm, 0, sizeof w->warm);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (unsigned r = 0; r < rounds; r++) {
        pthread_barrier_wait(&start_barrier);
        w->f = round_fns;
        uint64_t before = calls_of(&w->c);
        w->started = now_ns();
        /* The first rounds take the remainder, so every thread makes exactly OPS steps. */
        run_round(w, w->ops / rounds + (r < w->ops % rounds));
        w->ended = now_ns();
        if (w->f == &bench_symbols)
            w->c.symbols_calls += calls_of(&w->c) - before;
        if (rounds > 1)
            pthread_barrier_wait(&end_barrier);
    }
    return NULL;
}

/* A round's time: from the first worker's start to the last one's end, as the workers saw
 * them. Not main's clock around the barriers: with more threads than CPUs, main may run
 * only after the workers have done much of the round. */
static uint64_t round_ns(const struct worker *w, uint64_t threads)
{
    uint64_t first = UINT64_MAX, last = 0;
    for (uint64_t i = 0; i < threads; i++) {
        first = w[i].started < first ? w[i].started : first;
        last = w[i].ended > last ? w[i].ended : last;
    }
    return last - first;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int parse_u64(const char *s, const char *what, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < min || v > max) {
        fprintf(stderr, "malloc_bench: bad %s '%s' (want %" PRIu64 "..%" PRIu64 ")\n",
                what, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t threads = 4, ops = 1500000, seed = 42;
    struct bench_fns direct;
    const char *lib = NULL;

    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: %s [--direct LIB] [THREADS [OPS_PER_THREAD [SEED]]]   (defaults 4 1500000 42)\n"
               "A malloc-heavy multithreaded workload; prints its exact allocation-call counts\n"
               "and its own work time on stdout, a summary on stderr. --direct LIB: rounds\n"
               "through the program's symbols and through LIB's own functions, in turns.\n",
               argv[0]);
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "--direct")) {
        lib = argv[2];
        argv += 2;
        argc -= 2;
        if (bench_direct("malloc_bench", lib, &direct) != 0)
            return 2;
        rounds = 2 * AB_ROUNDS;
    }
    if (argc > 4 ||
        (argc > 1 && parse_u64(argv[1], "thread count", 1, MAX_THREADS, &threads)) ||
        (argc > 2 && parse_u64(argv[2], "ops per thread", 0, UINT64_MAX / 4, &ops)) ||
        (argc > 3 && parse_u64(argv[3], "seed", 0, UINT64_MAX, &seed))) {
        if (argc > 4)
            fprintf(stderr, "usage: %s [--direct LIB] [THREADS [OPS_PER_THREAD [SEED]]]\n", argv[0]);
        return 2;
    }

    /* Workers and queues are allocated before the clock starts: part of start-up. Both types
     * are cache-line aligned (and so sized in whole lines), so aligned_alloc is exact. */
    struct worker *w = aligned_alloc(64, threads * sizeof *w);
    struct queue *q = aligned_alloc(64, threads * sizeof *q);
    if (!w || !q) {
        fprintf(stderr, "malloc_bench: out of memory\n");
        return 1;
    }
    memset(w, 0, threads * sizeof *w);
    memset(q, 0, threads * sizeof *q);
    pthread_barrier_init(&start_barrier, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&drain_barrier, NULL, (unsigned)threads);
    pthread_barrier_init(&end_barrier, NULL, (unsigned)threads + 1);
    for (unsigned i = 0; i < threads; i++) {
        w[i].idx = i;
        w[i].ops = ops;
        w[i].seed = seed * 0x2545f4914f6cdd1dull + i + 1;
        w[i].in = &q[i];
        w[i].out = threads > 1 ? &q[(i + 1) % threads] : NULL;
    }
    for (unsigned i = 0; i < threads; i++) {
        int rc = pthread_create(&w[i].tid, NULL, worker_main, &w[i]);
        if (rc) {
            fprintf(stderr, "malloc_bench: pthread_create: %s\n", strerror(rc));
            return 1;
        }
    }

    uint64_t elapsed, kind_ns[2] = { 0, 0 };
    double ratio[AB_ROUNDS];
    if (rounds == 1) {
        round_fns = &bench_symbols;
        pthread_barrier_wait(&start_barrier);
        for (unsigned i = 0; i < threads; i++)
            pthread_join(w[i].tid, NULL);
        elapsed = round_ns(w, threads);
    } else {
        /* Pairs of rounds, symbols first in even pairs and second in odd ones (A B B A ...), so
         * a steady drift of the machine's speed favours neither. */
        uint64_t pair[2];
        for (unsigned r = 0; r < rounds; r++) {
            unsigned kind = (r ^ (r >> 1)) & 1; /* 0: symbols, 1: direct */
            round_fns = kind ? &direct : &bench_symbols;
            pthread_barrier_wait(&start_barrier);
            pthread_barrier_wait(&end_barrier);
            pair[kind] = round_ns(w, threads);
            kind_ns[kind] += pair[kind];
            if (r & 1)
                ratio[r / 2] = (double)pair[0] / (double)pair[1];
        }
        for (unsigned i = 0; i < threads; i++)
            pthread_join(w[i].tid, NULL);
        elapsed = kind_ns[0] + kind_ns[1];
        qsort(ratio, AB_ROUNDS, sizeof *ratio, cmp_double);
    }

    struct counts sum = { 0 };
    for (unsigned i = 0; i < threads; i++) {
        sum.malloc_n += w[i].c.malloc_n;
        sum.calloc_n += w[i].c.calloc_n;
        sum.realloc_n += w[i].c.realloc_n;
        sum.free_n += w[i].c.free_n;
        sum.handed += w[i].c.handed;
        sum.symbols_calls += w[i].c.symbols_calls;
    }
    uint64_t calls = calls_of(&sum);
    if (sum.free_n != sum.malloc_n + sum.calloc_n) {
        fprintf(stderr, "malloc_bench: internal error: %" PRIu64 " frees for %" PRIu64
                " objects\n", sum.free_n, sum.malloc_n + sum.calloc_n);
        return 1;
    }

    printf("calls=%" PRIu64 " malloc=%" PRIu64 " calloc=%" PRIu64 " realloc=%" PRIu64
           " free=%" PRIu64 " threads=%" PRIu64 " ops_per_thread=%" PRIu64 " seed=%" PRIu64
           " elapsed_ns=%" PRIu64,
           calls, sum.malloc_n, sum.calloc_n, sum.realloc_n, sum.free_n, threads, ops, seed,
           elapsed);
    if (lib)
        printf(" rounds=%u symbols_calls=%" PRIu64 " symbols_ns=%" PRIu64 " direct_ns=%" PRIu64
               " ab_ratio=%.4f", rounds, sum.symbols_calls, kind_ns[0], kind_ns[1],
               (ratio[AB_ROUNDS / 2 - 1] + ratio[AB_ROUNDS / 2]) / 2);
    printf("\n");
    fflush(stdout);
    fprintf(stderr,
            "malloc_bench: %" PRIu64 " thread%s made %" PRIu64 " allocation calls "
            "(%" PRIu64 " malloc, %" PRIu64 " calloc, %" PRIu64 " realloc, %" PRIu64 " free; "
            "%" PRIu64 " objects freed by another thread) in %.3f s\n",
            threads, threads == 1 ? "" : "s", calls, sum.malloc_n, sum.calloc_n, sum.realloc_n,
            sum.free_n, sum.handed, elapsed / 1e9);

    pthread_barrier_destroy(&start_barrier);
    pthread_barrier_destroy(&drain_barrier);
    pthread_barrier_destroy(&end_barrier);
    free(q);
    free(w);
    return 0;
}
