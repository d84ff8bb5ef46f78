/* exact_counts: makes exactly known numbers of every malloc-family call, from a serial part
 * (main thread only) and a parallel part (T threads + main, all alive), and prints its own
 * truth as one JSON object on stdout:
 *
 *   {"truth":[{"op":"malloc","size_class":"small","reuse":"new","phase":"serial","count":N},...]}
 *
 * The truth covers only this program's own calls. libc makes calls of its own (pthread_create's
 * TLS vector, ...), so the test runs the program twice, with --scale 0 (the same threads and
 * barriers, none of its own calls) and --scale 1, and compares the difference of the two
 * reports with this truth. To make libc's calls identical in both runs the program
 *   - creates and joins the same threads once before the measured work (glibc caches the thread
 *     stacks and their TLS, so the later pthread_create calls do not allocate),
 *   - uses no stdio: output is formatted into a static buffer and written with write(2),
 *   - never gets memory for its own bookkeeping from malloc (static arrays only).
 *
 * Reuse is tracked the way alloclens defines it: an address returned by any earlier allocation
 * call of the process is "reused" (an in-place realloc returning its argument included).
 *
 * usage: exact_counts [--scale N] [--threads T] [--large-threshold BYTES] [--no-pvalloc]
 */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* free_sized / free_aligned_sized (C23) are counted as free. glibc 2.36 has neither; where the
 * C library has them (alloclens then interposes them too), the program uses them for some frees. */
extern void free_sized(void *, size_t) __attribute__((weak));
extern void free_aligned_sized(void *, size_t, size_t) __attribute__((weak));

enum op { OP_MALLOC, OP_CALLOC, OP_REALLOC, OP_FREE, OP_POSIX_MEMALIGN, OP_ALIGNED_ALLOC,
          OP_MEMALIGN, OP_VALLOC, OP_PVALLOC, OP_COUNT };
static const char *const op_names[OP_COUNT] = {
    "malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc",
    "memalign", "valloc", "pvalloc" };
enum { SC_SMALL, SC_LARGE };
enum { RU_NEW, RU_REUSED, RU_NA };
enum { PH_SERIAL, PH_PARALLEL };
static const char *const sc_names[] = { "small", "large" };
static const char *const ru_names[] = { "new", "reused", "n/a" };
static const char *const ph_names[] = { "serial", "parallel" };

static unsigned long truth[OP_COUNT][2][3][2];
static size_t large_threshold = 131072;
static int no_pvalloc;
/* A null pointer the compiler cannot see through: GCC folds free(NULL) away and
 * realloc(NULL, n) into malloc(n). */
static void *volatile null_ptr;
static __thread int cur_phase = PH_SERIAL;

/* ---- every address any of our calls got back: lock-free open-addressing set (static) ---- */
#define SEEN_BITS 20
#define SEEN_SLOTS (1u << SEEN_BITS)
static uintptr_t seen[SEEN_SLOTS];

/* Inserts P; returns 1 when it was there already. */
static int seen_insert(void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint64_t h = ((uint64_t)a * 0x9E3779B97F4A7C15ull) >> (64 - SEEN_BITS);
    for (uint32_t i = 0; i < SEEN_SLOTS; i++) {
        uintptr_t *slot = &seen[(h + i) & (SEEN_SLOTS - 1)];
        uintptr_t cur = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        if (cur == a)
            return 1;
        if (cur == 0) {
            uintptr_t expect = 0;
            if (__atomic_compare_exchange_n(slot, &expect, a, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                return 0;
            if (expect == a)
                return 1;
        }
    }
    static const char msg[] = "exact_counts: address set full\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(99);
}

static int size_class(size_t n) { return n >= large_threshold ? SC_LARGE : SC_SMALL; }

static void count(int op, int sc, int ru)
{
    __atomic_fetch_add(&truth[op][sc][ru][cur_phase], 1, __ATOMIC_RELAXED);
}

/* Keeps the compiler from pairing away an allocation with its free. */
static inline void sink(void *p)
{
    if (p)
        *(volatile char *)p = 1;
    __asm__ volatile("" : : "r"(p) : "memory");
}

/* Counts an allocation call of OP with request size N that returned P. */
static void *note_alloc(int op, size_t n, void *p)
{
    count(op, size_class(n), p ? (seen_insert(p) ? RU_REUSED : RU_NEW) : RU_NA);
    sink(p);
    return p;
}

/* ---- objects: pointer, request size, whether it was made by an aligned call ---- */
struct obj {
    void *p;
    size_t n;
    size_t align; /* 0 unless from posix_memalign/aligned_alloc/memalign/valloc/pvalloc */
};

/* Simple deterministic generator, one per worker. */
struct rng { uint64_t s; };
static uint32_t rnd(struct rng *r)
{
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(r->s >> 33);
}

static size_t small_size(struct rng *r)
{
    /* mostly tiny, sometimes up to 16 KiB: far below the 128 KiB threshold */
    switch (rnd(r) % 4) {
    case 0: return 1 + rnd(r) % 64;
    case 1: return 1 + rnd(r) % 512;
    case 2: return 1 + rnd(r) % 4096;
    default: return 1 + rnd(r) % 16384;
    }
}

#define LARGE_SIZE (1u << 20) /* 1 MiB */

static size_t any_size(struct rng *r)
{
    return rnd(r) % 128 == 0 ? LARGE_SIZE + rnd(r) % 65536 : small_size(r);
}

static size_t any_align(struct rng *r)
{
    static const size_t aligns[] = { 16, 32, 64, 128, 256, 4096 };
    return aligns[rnd(r) % (sizeof aligns / sizeof aligns[0])];
}

static void make(struct obj *o, struct rng *r)
{
    size_t n = any_size(r), al = 0;
    void *p = NULL;
    int kind = rnd(r) % (no_pvalloc ? 9 : 10);
    switch (kind) {
    case 0: case 1:
        p = note_alloc(OP_MALLOC, n, malloc(n));
        break;
    case 2: {
        size_t k = 1 + rnd(r) % 8, e = n / k + 1;
        n = k * e;
        p = note_alloc(OP_CALLOC, n, calloc(k, e));
        break;
    }
    case 3:
        p = note_alloc(OP_REALLOC, n, realloc(null_ptr, n));
        break;
    case 4: {
        size_t k = 1 + rnd(r) % 8, e = n / k + 1;
        n = k * e;
        p = note_alloc(OP_REALLOC, n, reallocarray(null_ptr, k, e)); /* counts as realloc */
        break;
    }
    case 5: {
        al = any_align(r);
        void *q = NULL;
        int rc = posix_memalign(&q, al, n);
        p = note_alloc(OP_POSIX_MEMALIGN, n, rc == 0 ? q : NULL);
        break;
    }
    case 6:
        al = any_align(r);
        n = (n + al - 1) / al * al;
        p = note_alloc(OP_ALIGNED_ALLOC, n, aligned_alloc(al, n));
        break;
    case 7:
        al = any_align(r);
        p = note_alloc(OP_MEMALIGN, n, memalign(al, n));
        break;
    case 8:
        al = 4096;
        p = note_alloc(OP_VALLOC, n, valloc(n));
        break;
    default:
        al = 4096;
        p = note_alloc(OP_PVALLOC, n, pvalloc(n));
        break;
    }
    o->p = p;
    o->n = p ? n : 0;
    o->align = al;
}

static void destroy(struct obj *o, struct rng *r)
{
    int sc = size_class(o->n);
    unsigned k = r ? rnd(r) % 8 : 0;
    if (k == 0 && o->align == 0 && free_sized)
        free_sized(o->p, o->n);
    else if (k == 1 && o->align != 0 && free_aligned_sized && o->n % o->align == 0)
        free_aligned_sized(o->p, o->align, o->n);
    else
        free(o->p);
    count(OP_FREE, o->p ? sc : SC_SMALL, RU_NA);
    o->p = NULL;
    o->n = 0;
    o->align = 0;
}

/* realloc (or reallocarray) of a live object: grows or shrinks it, keeps the old size's
 * first bytes. Never size 0 (whose meaning differs between allocators). */
static void resize(struct obj *o, struct rng *r)
{
    size_t n;
    if (o->n >= large_threshold)
        n = rnd(r) % 4 == 0 ? small_size(r) : LARGE_SIZE + rnd(r) % (2 * LARGE_SIZE);
    else if (rnd(r) % 64 == 0)
        n = LARGE_SIZE + rnd(r) % 65536;
    else if (rnd(r) % 2)
        n = o->n + 1 + rnd(r) % 2048;            /* grow */
    else
        n = o->n > 1 ? 1 + rnd(r) % o->n : 8;    /* shrink (or grow a 1-byte one) */
    void *q;
    if (rnd(r) % 4 == 0) {
        size_t k = 1 + rnd(r) % 4, e = n / k + 1;
        n = k * e;
        q = reallocarray(o->p, k, e);
    } else {
        q = realloc(o->p, n);
    }
    note_alloc(OP_REALLOC, n, q);
    if (q) {
        o->p = q;
        o->n = n;
        o->align = 0;
    }
}

/* A fixed, seeded sequence of STEPS random operations on NSLOT slots, then everything freed. */
static void churn(uint64_t seed, long steps, struct obj *slots, int nslot)
{
    struct rng r = { seed };
    for (long s = 0; s < steps; s++) {
        struct obj *o = &slots[rnd(&r) % nslot];
        if (!o->p) {
            make(o, &r);
            continue;
        }
        unsigned k = rnd(&r) % 10;
        if (k < 5)
            destroy(o, &r);
        else if (k < 9)
            resize(o, &r);
        else {
            destroy(o, &r);
            make(o, &r);
        }
    }
    for (int i = 0; i < nslot; i++)
        if (slots[i].p)
            destroy(&slots[i], &r);
}

/* LIFO churn of one size: the pattern whose addresses every allocator reuses. */
static void lifo(int n_rounds, int depth, size_t size)
{
    void *stack[64];
    for (int round = 0; round < n_rounds; round++) {
        for (int i = 0; i < depth; i++)
            stack[i] = note_alloc(OP_MALLOC, size, malloc(size));
        for (int i = depth - 1; i >= 0; i--) {
            free(stack[i]);
            count(OP_FREE, size_class(size), RU_NA);
        }
    }
}

static void free_nulls(int n)
{
    for (int i = 0; i < n; i++) {
        free(null_ptr);
        count(OP_FREE, SC_SMALL, RU_NA);
    }
}

/* ---------------------------------- threads ---------------------------------- */
#define MAX_THREADS 16
#define SERIAL_SLOTS 256
#define THREAD_SLOTS 128
#define HANDOFF 64

static int nthreads = 4;
static long scale = 1;
static pthread_t tid[MAX_THREADS];
static pthread_barrier_t bar_warm, bar_start, bar_mid, bar_end;
static struct obj serial_slots[SERIAL_SLOTS];
static struct obj thread_slots[MAX_THREADS + 1][THREAD_SLOTS];
static struct obj handoff[MAX_THREADS + 1][HANDOFF];   /* made by t, freed by t+1 */
static struct obj leftover[MAX_THREADS + 1][HANDOFF];  /* made in parallel, freed after join */

/* Threads exit one at a time, in a fixed order: thread t joins thread t-1 first, main joins
 * the last. libc frees per-thread buffers on the way out; this way the number of threads alive
 * at each of those calls, so their phase, is the same in every run. */
static void exit_in_turn(int t)
{
    if (t > 0)
        pthread_join(tid[t - 1], NULL);
}

static void *warm_thread(void *arg)
{
    pthread_barrier_wait(&bar_warm);
    exit_in_turn((int)(intptr_t)arg);
    return NULL;
}

/* Creates nthreads threads running FN, which end with exit_in_turn. */
static void run_threads(pthread_attr_t *attr, void *(*fn)(void *))
{
    for (int t = 0; t < nthreads; t++)
        if (pthread_create(&tid[t], attr, fn, (void *)(intptr_t)t))
            _exit(97);
}

/* Addresses that libc (or the allocator's own initialisation) got from the allocator and freed
 * before main are invisible to the address set, but the workload may get them back, which
 * alloclens rightly calls "reused". So before the measured work, in every run, we take a few
 * objects of every size class up to 64 KiB, note their addresses, and give them back: such
 * freed objects are the first an allocator hands out again, so they end up in the set. */
#define ABSORB_EACH 4
static void *absorbed[2048];

static void absorb(void)
{
    int n = 0;
    for (size_t size = 16; size <= 65536;
         size += size < 1024 ? 16 : size < 16384 ? 64 : 4096)
        for (int k = 0; k < ABSORB_EACH; k++) {
            void *p = malloc(size);
            if (p)
                seen_insert(p);
            sink(p);
            absorbed[n++] = p;
        }
    while (n > 0)
        free(absorbed[--n]);
}

/* Parallel work of participant T (0..nthreads-1 threads, nthreads = main). */
static void parallel_work(int t)
{
    int parties = nthreads + 1;
    struct rng r = { 1000 + (uint64_t)t };
    pthread_barrier_wait(&bar_start);
    if (scale > 0) {
        for (long s = 0; s < scale; s++) {
            churn(77 + 31 * (uint64_t)t + (uint64_t)s, 1500, thread_slots[t], THREAD_SLOTS);
            lifo(20, 16, 48 + 16 * (size_t)t);
            free_nulls(25);
        }
        for (int i = 0; i < HANDOFF; i++) {
            make(&handoff[t][i], &r);
            make(&leftover[t][i], &r);
        }
    }
    pthread_barrier_wait(&bar_mid);
    if (scale > 0)
        for (int i = 0; i < HANDOFF; i++)
            if (handoff[(t + 1) % parties][i].p)
                destroy(&handoff[(t + 1) % parties][i], &r);
    pthread_barrier_wait(&bar_end);
}

static void *worker(void *arg)
{
    cur_phase = PH_PARALLEL;
    parallel_work((int)(intptr_t)arg);
    exit_in_turn((int)(intptr_t)arg);
    return NULL;
}

/* ---------------------------------- output ---------------------------------- */
static char out[1 << 16];

static void emit(void)
{
    size_t len = 0;
    len += (size_t)snprintf(out + len, sizeof out - len,
                            "{\"scale\":%ld,\"threads\":%d,\"large_threshold\":%zu,"
                            "\"truth\":[", scale, nthreads, large_threshold);
    int first = 1;
    for (int op = 0; op < OP_COUNT; op++)
        for (int sc = 0; sc < 2; sc++)
            for (int ru = 0; ru < 3; ru++)
                for (int ph = 0; ph < 2; ph++) {
                    unsigned long c = truth[op][sc][ru][ph];
                    if (!c)
                        continue;
                    len += (size_t)snprintf(out + len, sizeof out - len,
                        "%s\n{\"op\":\"%s\",\"size_class\":\"%s\",\"reuse\":\"%s\","
                        "\"phase\":\"%s\",\"count\":%lu}", first ? "" : ",",
                        op_names[op], sc_names[sc], ru_names[ru], ph_names[ph], c);
                    first = 0;
                }
    len += (size_t)snprintf(out + len, sizeof out - len, "]}\n");
    for (size_t off = 0; off < len;) {
        ssize_t w = write(1, out + off, len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            _exit(98);
        }
        off += (size_t)w;
    }
}

static void usage(void)
{
    static const char msg[] =
        "usage: exact_counts [--scale N] [--threads T] [--large-threshold BYTES] [--no-pvalloc]\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(2);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--scale") && i + 1 < argc)
            scale = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            nthreads = (int)strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--large-threshold") && i + 1 < argc)
            large_threshold = (size_t)strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--no-pvalloc"))
            no_pvalloc = 1;
        else
            usage();
    }
    if (nthreads < 1 || nthreads > MAX_THREADS || scale < 0)
        usage();

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);

    /* Warm-up: libc's own allocations for threads happen here, identically in every run. */
    pthread_barrier_init(&bar_warm, NULL, (unsigned)nthreads + 1);
    run_threads(&attr, warm_thread);
    pthread_barrier_wait(&bar_warm);
    pthread_join(tid[nthreads - 1], NULL);
    absorb();

    /* Serial part: main thread only. */
    if (scale > 0) {
        for (long s = 0; s < scale; s++) {
            churn(12345 + (uint64_t)s, 6000, serial_slots, SERIAL_SLOTS);
            lifo(40, 32, 100);
            lifo(4, 4, LARGE_SIZE);
            free_nulls(100);
        }
    }

    /* Parallel part: nthreads threads and main, all alive between bar_start and bar_end. */
    pthread_barrier_init(&bar_start, NULL, (unsigned)nthreads + 1);
    pthread_barrier_init(&bar_mid, NULL, (unsigned)nthreads + 1);
    pthread_barrier_init(&bar_end, NULL, (unsigned)nthreads + 1);
    run_threads(&attr, worker);
    cur_phase = PH_PARALLEL;
    parallel_work(nthreads);
    pthread_join(tid[nthreads - 1], NULL);
    cur_phase = PH_SERIAL;

    /* Serial again: free what the threads left, then some more calls. */
    if (scale > 0) {
        struct rng r = { 4242 };
        for (int t = 0; t <= nthreads; t++)
            for (int i = 0; i < HANDOFF; i++)
                if (leftover[t][i].p)
                    destroy(&leftover[t][i], &r);
        for (long s = 0; s < scale; s++)
            churn(999 + (uint64_t)s, 1000, serial_slots, SERIAL_SLOTS);
    }
    pthread_attr_destroy(&attr);
    emit();
    return 0;
}
