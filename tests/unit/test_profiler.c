/* Unit tests of profiler/: histogram buckets and quantiles, timed calls with no memory for
 * their histogram, the TSC's cost and rate, the options parser and settings (garbage values
 * warned about and defaulted), row indexing, the report buffer's JSON escaping, our descriptors'
 * table, the seccomp filter interpreter and what a filter refuses, the heap's residency after
 * an unmap alloclens did not see, file capabilities and LD_PRELOAD's reach, the look-up in a
 * loaded object's GNU hash table that spares start-up its failed dlsym calls, the sampler's
 * table of live samples growing from its small start, and its stack walks (the same frames as
 * libunwind's, rules learned once, no memory per thread). */
#include <check.h>
#include <dlfcn.h>
#include <sys/auxv.h>

#include "check_main.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/audit.h>
#include <math.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define UNW_LOCAL_ONLY
#include <alloca.h>
#include <libunwind.h>
#include <signal.h>

#include "profiler.h"
#include "sampler.h"

START_TEST(hist_bucket_bounds)
{
    unsigned prev = 0;
    for (uint64_t v = 0; v < (1u << 20); v++) {
        unsigned b = _al_hist_bucket(v);
        ck_assert_uint_ge(b, prev);
        ck_assert_uint_lt(b, AL_HIST_BUCKETS);
        ck_assert_uint_le(_al_hist_bucket_low(b), v);
        ck_assert_uint_ge(_al_hist_bucket_high(b), v);
        prev = b;
    }
    /* Each bucket is at most 1/16 of its value wide. */
    for (unsigned b = AL_HIST_SUB; b < AL_HIST_BUCKETS - 1; b++) {
        uint64_t lo = _al_hist_bucket_low(b), hi = _al_hist_bucket_high(b);
        ck_assert_uint_le((hi - lo + 1) * AL_HIST_SUB, lo);
        ck_assert_uint_eq(_al_hist_bucket_low(b + 1), hi + 1);
    }
    ck_assert_uint_eq(_al_hist_bucket(UINT64_MAX), AL_HIST_BUCKETS - 1);
    ck_assert_uint_eq(_al_hist_bucket(1ull << 45), AL_HIST_BUCKETS - 1);
}
END_TEST

static uint64_t *hist_of(const uint64_t *values, size_t n)
{
    uint64_t *h = calloc(AL_HIST_BUCKETS, sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[_al_hist_bucket(values[i])]++;
    return h;
}

START_TEST(hist_quantiles)
{
    ck_assert_uint_eq(_al_hist_quantile((uint64_t[AL_HIST_BUCKETS]){ 0 }, 0, 0.5), 0);

    /* Small values are exact. */
    uint64_t small[] = { 3, 3, 7, 9, 12 };
    uint64_t *h = hist_of(small, 5);
    ck_assert_uint_eq(_al_hist_quantile(h, 5, 0.5), 7);
    ck_assert_uint_eq(_al_hist_quantile(h, 5, 0.2), 3);
    ck_assert_uint_eq(_al_hist_quantile(h, 5, 1.0), 12);
    free(h);

    /* 1..100000 uniform: each quantile within the bucket's relative error (1/32). */
    size_t n = 100000;
    uint64_t *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = i + 1;
    h = hist_of(v, n);
    double qs[] = { 0.5, 0.9, 0.99, 0.999 };
    for (size_t i = 0; i < 4; i++) {
        double truth = qs[i] * (double)n;
        double got = (double)_al_hist_quantile(h, n, qs[i]);
        ck_assert_msg(got > truth * (1 - 1.0 / 32) && got < truth * (1 + 1.0 / 32),
                      "q%.3f: got %.0f, truth %.0f", qs[i], got, truth);
    }
    free(h);
    free(v);

    /* A long tail: 99.8% at 100 cycles, 0.2% at 100000. p99 must stay at 100, p99.9 in the tail. */
    uint64_t tail[1000];
    for (int i = 0; i < 1000; i++)
        tail[i] = i < 998 ? 100 : 100000;
    h = hist_of(tail, 1000);
    uint64_t p99 = _al_hist_quantile(h, 1000, 0.99), p999 = _al_hist_quantile(h, 1000, 0.999);
    ck_assert_uint_ge(p99, 97);
    ck_assert_uint_le(p99, 103);
    ck_assert_uint_ge(p999, 97000);
    ck_assert_uint_le(p999, 103000);
    free(h);
}
END_TEST

/* Times OOM_CALLS calls in ROW with the address space full, so that no histogram can be
 * mapped for it, then HIST_CALLS more with memory back. */
#define OOM_CALLS 100
#define HIST_CALLS 50

static void *timed_without_memory(void *arg)
{
    unsigned row = *(const unsigned *)arg;
    struct al_thread *t = _al_thread_attach();
    ck_assert_ptr_nonnull(t);
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fscanf(f, "%lu", &pages), 1);
    fclose(f);
    struct rlimit old, full;
    ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
    full = old;
    full.rlim_cur = pages * (rlim_t)sysconf(_SC_PAGESIZE);
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &full), 0);
    while (_al_mem_alloc(64)) /* what is left of the profiler's arena */
        ;
    for (int i = 0; i < OOM_CALLS; i++)
        _al_record_row(t, row, 1000);
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &old), 0);
    ck_assert_ptr_null(t->hist[row]);
    ck_assert_uint_eq(t->rows[row].timed, OOM_CALLS);
    for (int i = 0; i < HIST_CALLS; i++)
        _al_record_row(t, row, 1000);
    ck_assert_ptr_nonnull(t->hist[row]);
    t->busy = 0;
    return NULL;
}

/* A row's timed calls that found no memory for its histogram are counted all the same, in a
 * thread still running and in one that exited; its percentiles come from those in the
 * histogram. */
START_TEST(hist_out_of_memory_still_timed)
{
    _al_threads_init();
    atomic_store(&_al_first.taken, 1);
    unsigned exited = _al_row_index(AL_OP_MALLOC, 0, AL_REUSE_NEW, AL_PHASE_SERIAL);
    unsigned live = _al_row_index(AL_OP_FREE, 0, AL_REUSE_NA, AL_PHASE_SERIAL);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, timed_without_memory, &exited), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    timed_without_memory(&live);

    static struct al_row rows[AL_ROWS];
    static uint64_t hist[AL_ROWS * AL_HIST_BUCKETS];
    struct al_thread_totals tot;
    struct al_measure_totals extra;
    _al_threads_collect(rows, hist, &tot, &extra);
    unsigned both[] = { exited, live };
    for (unsigned k = 0; k < 2; k++) {
        unsigned r = both[k];
        uint64_t binned = 0;
        for (unsigned b = 0; b < AL_HIST_BUCKETS; b++)
            binned += hist[(size_t)r * AL_HIST_BUCKETS + b];
        ck_assert_uint_eq(rows[r].count, OOM_CALLS + HIST_CALLS);
        ck_assert_uint_eq(rows[r].timed, OOM_CALLS + HIST_CALLS);
        ck_assert_uint_eq(binned, HIST_CALLS);
    }
}
END_TEST

/* math.c's log and 1 - e^-y against libm's, over the ranges the sampler gives them: uniform
 * draws in (0, 1] down to 2^-53, and size/rate ratios from a byte of a huge rate to thousands;
 * within 4 units in the last place (relative 2^-50). */
/* The lock table's claimed slots, as the reports read them: each lock once, in the order its
 * slot was claimed, with its counts; from four threads at once, every lock and no other. */
static char lock_objs[4][100];

static void *claim_locks(void *arg)
{
    char *base = arg;
    struct al_thread t = { 0 };
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < 100; i++) {
            _al_lock_acquired(&t, base + i, false, 0, 0);
            _al_lock_released(&t, base + i, 0);
        }
    return NULL;
}

START_TEST(locks_claimed_in_order)
{
    _al_locks_init();
    ck_assert_ptr_nonnull(_al_locks);
    ck_assert_uint_eq(_al_locks_claimed(), 0);
    struct al_thread t = { 0 };
    static char a, b, c;
    _al_lock_acquired(&t, &b, true, 40, 100);
    _al_lock_released(&t, &b, 150);
    _al_lock_acquired(&t, &a, false, 0, 200);
    _al_lock_acquired(&t, &b, false, 0, 210);
    _al_lock_released(&t, &b, 220);
    _al_lock_released(&t, &a, 230);
    _al_lock_acquired(&t, &c, false, 0, 300);
    ck_assert_uint_eq(_al_locks_claimed(), 3);
    const struct al_lock_stats *l = _al_locks_at(0);
    ck_assert_uint_eq(atomic_load(&l->id), (uintptr_t)&b);
    ck_assert_uint_eq(atomic_load(&l->acquisitions), 2);
    ck_assert_uint_eq(atomic_load(&l->contended), 1);
    ck_assert_uint_eq(atomic_load(&l->wait_cycles), 40);
    ck_assert_uint_eq(atomic_load(&l->hold_cycles), 60);
    ck_assert_uint_eq(atomic_load(&_al_locks_at(1)->id), (uintptr_t)&a);
    ck_assert_uint_eq(atomic_load(&_al_locks_at(1)->hold_cycles), 30);
    ck_assert_uint_eq(atomic_load(&_al_locks_at(2)->id), (uintptr_t)&c);

    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, claim_locks, lock_objs[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    unsigned n = _al_locks_claimed(), seen = 0;
    ck_assert_uint_eq(n, 3 + 400);
    for (unsigned k = 3; k < n; k++) {
        l = _al_locks_at(k);
        ck_assert_ptr_nonnull(l);
        uintptr_t id = atomic_load(&l->id);
        ck_assert(id >= (uintptr_t)lock_objs && id < (uintptr_t)lock_objs + sizeof lock_objs);
        ck_assert_uint_eq(atomic_load(&l->acquisitions), 3);
        seen++;
    }
    ck_assert_uint_eq(seen, 400);
}
END_TEST

START_TEST(math_matches_libm)
{
    uint64_t x = 12345;
    for (int i = 0; i < 200000; i++) {
        x = _al_mix64(x + 0x9e3779b97f4a7c15ull);
        double u = (double)((x >> 11) + 1) * 0x1.0p-53;
        double want = log(u), got = _al_math_log(u);
        ck_assert_msg(fabs(got - want) <= 0x1.0p-50 * fabs(want) + 0x1.0p-1074, "log(%a): %a, libm %a", u, got, want);
    }
    const double edges[] = { 0x1.0p-53, 0x1.0p-52, 0.5, 0x1.6a09e667f3bccp-1, 0x1.6a09e667f3bcdp-1,
                             0.9999999, 1.0 - 0x1.0p-53 };
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++)
        ck_assert_msg(fabs(_al_math_log(edges[i]) - log(edges[i])) <= 0x1.0p-50 * fabs(log(edges[i])),
                      "log(%a)", edges[i]);
    ck_assert(_al_math_log(1.0) == 0.0);
    for (double y = 0x1.0p-60; y < 2000.0; y *= 1.01) {
        double want = -expm1(-y), got = _al_math_one_minus_exp_neg(y);
        ck_assert_msg(fabs(got - want) <= 0x1.0p-50 * want, "1 - e^-%a: %a, libm %a", y, got, want);
    }
    const double at[] = { 0.0, 0.4999999999, 0.5, 0.69314718, 0.6931471805599453, 1.0, 36.0, 744.9, 745.1 };
    for (size_t i = 0; i < sizeof at / sizeof *at; i++)
        ck_assert_msg(fabs(_al_math_one_minus_exp_neg(at[i]) + expm1(-at[i])) <= 0x1.0p-50 * -expm1(-at[i]),
                      "1 - e^-%a", at[i]);
}
END_TEST

START_TEST(tsc_overhead_plausible)
{
    uint64_t o = _al_tsc_measure_overhead();
    ck_assert_uint_gt(o, 0);
    ck_assert_uint_lt(o, 2000);
}
END_TEST

static struct al_clock_pair pair_after(struct al_clock_pair a, long ns)
{
    struct timespec ts = { 0, ns };
    nanosleep(&ts, NULL);
    (void)a;
    return _al_tsc_pair_now();
}

START_TEST(tsc_rate_calibration)
{
    /* Two independent calibrations over 30 ms agree within 0.5%, and a too-short interval is
     * refused rather than guessed. */
    struct al_clock_pair a = _al_tsc_pair_now();
    struct al_clock_pair b = pair_after(a, 30000000);
    struct al_clock_pair c = pair_after(b, 30000000);
    double r1 = _al_tsc_rate(a, b), r2 = _al_tsc_rate(b, c);
    ck_assert(r1 > 0.1 && r1 < 10.0);
    ck_assert_msg(r1 / r2 > 0.995 && r1 / r2 < 1.005, "rates %f and %f", r1, r2);
    ck_assert(_al_tsc_rate(a, a) == 0.0);
    /* Cycles converted with the rate match the clock over a fresh interval within 1%. */
    struct al_clock_pair d = pair_after(c, 20000000);
    double ns = (double)(d.tsc - c.tsc) / r1;
    double truth = (double)(d.ns - c.ns);
    ck_assert_msg(ns / truth > 0.99 && ns / truth < 1.01, "%.0f ns vs %.0f ns", ns, truth);
}
END_TEST

START_TEST(options_parse_numbers)
{
    const struct al_option *o = &_al_options[AL_OPT_LARGE_THRESHOLD];
    long long v;
    ck_assert_int_eq(_al_option_parse_num(o, "4096", &v), 0);
    ck_assert_int_eq(v, 4096);
    ck_assert_int_eq(_al_option_parse_num(o, "128k", &v), 0);
    ck_assert_int_eq(v, 131072);
    ck_assert_int_eq(_al_option_parse_num(o, "1M", &v), 0);
    ck_assert_int_eq(v, 1 << 20);
    ck_assert_int_eq(_al_option_parse_num(o, "2GiB", &v), 0);
    ck_assert_int_eq(v, 2ll << 30);
    ck_assert_int_eq(_al_option_parse_num(o, "3kb", &v), 0);
    ck_assert_int_eq(v, 3072);
    const char *garbage[] = { "", " ", "abc", "12x", "0x10", "1.5", "k", "12 k", "--1", "1MM", NULL };
    for (int i = 0; garbage[i]; i++)
        ck_assert_msg(_al_option_parse_num(o, garbage[i], &v) == -EINVAL, "'%s' accepted", garbage[i]);
    ck_assert_int_eq(_al_option_parse_num(o, "-5", &v), -ERANGE);
    ck_assert_int_eq(_al_option_parse_num(o, "0", &v), -ERANGE);
    ck_assert_int_eq(_al_option_parse_num(o, "99999999999999999999", &v), -ERANGE);
    ck_assert_int_eq(_al_option_parse_num(o, "99999999999G", &v), -ERANGE);
    ck_assert_int_eq(_al_option_parse_num(o, "2T", &v), -EINVAL);
    /* Plain integers take no size suffix. */
    ck_assert_int_eq(_al_option_parse_num(&_al_options[AL_OPT_MAIN_PID], "12k", &v), -EINVAL);
}
END_TEST

START_TEST(options_table_complete)
{
    for (int i = 0; i < AL_OPT_N; i++) {
        const struct al_option *o = &_al_options[i];
        ck_assert_ptr_nonnull(o->name);
        ck_assert_ptr_nonnull(o->desc);
        ck_assert_msg(strncmp(o->env, "ALLOCLENS_", 10) == 0, "%s", o->env);
        if (o->type != AL_OPT_STRING) {
            long long v;
            ck_assert_msg(_al_option_parse_num(o, o->def, &v) == 0, "default of %s out of its own range", o->env);
        }
    }
}
END_TEST

struct keyed {
    unsigned key, order;
};

static int by_key(const void *a, const void *b)
{
    unsigned x = ((const struct keyed *)a)->key, y = ((const struct keyed *)b)->key;
    return x < y ? -1 : x > y;
}

/* _al_sort: sorted, stable (equal keys keep their order), every element kept; lengths around
 * the merge passes' widths. */
START_TEST(sort_stable)
{
    static const size_t lengths[] = { 0, 1, 2, 3, 7, 64, 65, 1000, 5003 };
    static struct keyed v[5003];
    for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
        size_t n = lengths[l];
        uint64_t x = 12345;
        unsigned long sum = 0;
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            v[i] = (struct keyed){ (unsigned)(x >> 33) % 97, (unsigned)i };
            sum += v[i].key;
        }
        _al_sort(v, n, sizeof v[0], by_key);
        unsigned long after = 0;
        for (size_t i = 0; i < n; i++) {
            after += v[i].key;
            if (i > 0) {
                ck_assert_uint_le(v[i - 1].key, v[i].key);
                if (v[i - 1].key == v[i].key)
                    ck_assert_uint_lt(v[i - 1].order, v[i].order);
            }
        }
        ck_assert_uint_eq(after, sum);
    }
}
END_TEST

START_TEST(settings_garbage_defaults)
{
    struct al_settings s;
    setenv("ALLOCLENS_LARGE_THRESHOLD", "lots", 1);
    setenv("ALLOCLENS_MAIN_PID", "-3", 1);
    setenv("ALLOCLENS_TEXT", "off", 1);
    unsetenv("ALLOCLENS_OUTPUT");
    _al_settings_load(&s);
    ck_assert_uint_eq(s.large_threshold, 131072);
    ck_assert_int_eq(s.main_pid, 0);
    ck_assert_ptr_null(s.text);
    ck_assert_ptr_null(s.output);
    setenv("ALLOCLENS_LARGE_THRESHOLD", "64k", 1);
    setenv("ALLOCLENS_TEXT", "-", 1);
    _al_settings_load(&s);
    ck_assert_uint_eq(s.large_threshold, 65536);
    ck_assert_str_eq(s.text, "-");
    /* Relative report paths are taken from the directory at start; absolute ones kept. */
    char cwd[4096], want[4200];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    setenv("ALLOCLENS_OUTPUT", "out/r.json", 1);
    setenv("ALLOCLENS_TEXT", "/abs/r.txt", 1);
    setenv("ALLOCLENS_PPROF", "r.pb.gz", 1);
    _al_settings_load(&s);
    snprintf(want, sizeof want, "%s/out/r.json", cwd);
    ck_assert_str_eq(s.output, want);
    ck_assert_str_eq(s.text, "/abs/r.txt");
    snprintf(want, sizeof want, "%s/r.pb.gz", cwd);
    ck_assert_str_eq(s.pprof, want);
    unsetenv("ALLOCLENS_OUTPUT");
    unsetenv("ALLOCLENS_TEXT");
    unsetenv("ALLOCLENS_PPROF");
}
END_TEST

START_TEST(rows_roundtrip)
{
    bool seen[AL_ROWS] = { false };
    for (unsigned op = 0; op < AL_OP_COUNT; op++)
        for (unsigned large = 0; large < 2; large++)
            for (unsigned reuse = 0; reuse < AL_REUSE_COUNT; reuse++)
                for (unsigned phase = 0; phase < AL_PHASE_COUNT; phase++) {
                    unsigned row = _al_row_index(op, large, reuse, phase);
                    ck_assert_uint_lt(row, AL_ROWS);
                    ck_assert(!seen[row]);
                    seen[row] = true;
                    unsigned o, l, r, p;
                    _al_row_split(row, &o, &l, &r, &p);
                    ck_assert(o == op && l == large && r == reuse && p == phase);
                }
    ck_assert_str_eq(_al_op_name(AL_OP_POSIX_MEMALIGN), "posix_memalign");
    ck_assert_str_eq(_al_reuse_name(AL_REUSE_NA), "n/a");
}
END_TEST

START_TEST(buf_json_escaping)
{
    struct al_buf b = { 0 };
    _al_buf_json_str(&b, "a\"b\\c\n\t\x01z");
    ck_assert_str_eq(b.data, "\"a\\\"b\\\\c\\n\\t\\u0001z\"");
    _al_buf_free(&b);
    /* UTF-8 kept; bytes that are not (stray, overlong, a surrogate, cut short) become U+FFFD. */
    _al_buf_json_str(&b, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80|\xff\xc0\xaf|\xed\xa0\x80|\xe2\x82");
    ck_assert_str_eq(b.data, "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80|\\ufffd\\ufffd\\ufffd|"
                             "\\ufffd\\ufffd\\ufffd|\\ufffd\\ufffd\"");
    for (int i = 0; i < 100000; i++)
        _al_buf_printf(&b, "%d,", i);
    ck_assert(!b.failed);
    ck_assert(strstr(b.data, "99999,") != NULL);
    _al_buf_free(&b);
}
END_TEST

START_TEST(buf_u64_decimal)
{
    struct al_buf b = { 0 };
    const uint64_t v[] = { 0, 7, 10, 99, 100, 4096, 10000000000000000000ull, 18446744073709551615ull };
    _al_buf_puts(&b, "[");
    _al_buf_u64_run(&b, 5, 1, 0); /* nothing */
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        if (i)
            _al_buf_puts(&b, ", ");
        _al_buf_u64_run(&b, v[i], 0, 1);
    }
    _al_buf_puts(&b, "]");
    ck_assert_str_eq(b.data, "[0, 7, 10, 99, 100, 4096, 10000000000000000000, 18446744073709551615]");
    b.len = 0;
    _al_buf_u64_run(&b, 24, 16, 4);
    ck_assert_str_eq(b.data, "24, 40, 56, 72");
    /* A run longer than the buffer's first size (128 KiB): grown to fit it all. */
    enum { N = 20000 };
    size_t before = b.len;
    _al_buf_u64_run(&b, 10000000000000000000ull, 1, N);
    ck_assert(!b.failed);
    ck_assert_uint_eq(b.len - before, N * 20 + (N - 1) * 2);
    ck_assert(memcmp(b.data + before, "10000000000000000000, 10000000000000000001, ", 44) == 0);
    ck_assert(memcmp(b.data + b.len - 20, "10000000000000019999", 20) == 0);
    _al_buf_free(&b);
}
END_TEST

/* A streamed buffer writes the same text as one built whole, never holding more than a chunk
 * of it; a write that fails is told by _al_buf_finish, and what follows is not written. */
START_TEST(buf_streamed)
{
    enum { N = 20000 };
    struct al_buf whole = { 0 };
    _al_buf_puts(&whole, "{ \"classes\": [");
    _al_buf_u64_run(&whole, 24, 16, N);
    _al_buf_printf(&whole, "], \"n\": %d }\n", N);
    ck_assert(!whole.failed);
    ck_assert(strstr(whole.data, "[24, 40, 56, ") && strstr(whole.data, ", 320008], \"n\": 20000 }\n"));

    int fd = memfd_create("streamed", 0);
    ck_assert_int_ge(fd, 0);
    struct al_buf b = { 0 };
    _al_buf_stream(&b, fd);
    _al_buf_puts(&b, "{ \"classes\": [");
    _al_buf_u64_run(&b, 24, 16, N);
    _al_buf_printf(&b, "], \"n\": %d }\n", N);
    ck_assert_uint_le(b.cap, AL_BUF_CHUNK);
    ck_assert_int_eq(_al_buf_finish(&b), 0);
    ck_assert_int_eq(lseek(fd, 0, SEEK_END), (off_t)whole.len);
    char *got = malloc(whole.len);
    ck_assert_int_eq(pread(fd, got, whole.len, 0), (ssize_t)whole.len);
    ck_assert(memcmp(got, whole.data, whole.len) == 0);
    free(got);
    close(fd);
    _al_buf_free(&b);

    /* Held, a streamed buffer writes what it had and then nothing until released. */
    fd = memfd_create("held", 0);
    ck_assert_int_ge(fd, 0);
    struct al_buf h = { 0 };
    _al_buf_stream(&h, fd);
    _al_buf_puts(&h, "[");
    _al_buf_hold(&h, true);
    ck_assert_int_eq(lseek(fd, 0, SEEK_END), 1);
    _al_buf_u64_run(&h, 24, 16, N); /* more than a chunk */
    ck_assert_int_eq(lseek(fd, 0, SEEK_END), 1);
    _al_buf_hold(&h, false);
    _al_buf_puts(&h, "]");
    ck_assert_int_eq(_al_buf_finish(&h), 0);
    ck_assert_int_eq(lseek(fd, 0, SEEK_END), (off_t)(whole.len - strlen("{ \"classes\": ") -
                                                      strlen(", \"n\": 20000 }\n")));
    close(fd);
    _al_buf_free(&h);

    int ro = open("/dev/null", O_RDONLY);
    ck_assert_int_ge(ro, 0);
    struct al_buf bad = { 0 };
    _al_buf_stream(&bad, ro);
    _al_buf_u64_run(&bad, 24, 16, N); /* more than a chunk: a write is tried, and fails */
    _al_buf_puts(&bad, "]");
    ck_assert_int_eq(_al_buf_finish(&bad), -EBADF);
    close(ro);
    _al_buf_free(&bad);
    _al_buf_free(&whole);
}
END_TEST

/* fds.c: the kernel's descriptor table grown to the top at start, while no thread shares it
 * (a shared one grows only after an RCU grace period, and the growing thread waits), and no
 * descriptor left behind. */
START_TEST(fds_table_grown_at_start)
{
    struct rlimit nofile;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &nofile), 0);
    if (nofile.rlim_max < 2048) {
        fprintf(stderr, "fds_table_grown_at_start: skipped, RLIMIT_NOFILE's hard limit is below 2048\n");
        return;
    }
    nofile.rlim_cur = 2048; /* the top: 2032 */
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &nofile), 0);
    long before = _al_proc_status("FDSize");
    int probe = dup(2);
    ck_assert_int_ge(probe, 0);
    close(probe);
    ck_assert_msg(before > 0 && before < 2032, "FDSize %ld before: the test cannot tell", before);
    _al_fds_init(false);
    ck_assert_int_eq(_al_proc_status("FDSize"), before);
    _al_fds_init(true);
    ck_assert_int_ge(_al_proc_status("FDSize"), 2033);
    ck_assert_int_eq(dup(2), probe); /* the lowest free number is still free: nothing kept */
    ck_assert_int_eq(_al_fd_top(dup(2)), 2032);
}
END_TEST

/* proc.c: /proc/self/status is read into one buffer of its own; threads reading it at once
 * take turns, and each gets its values. */
static void *status_reads(void *arg)
{
    long *bad = arg;
    for (int i = 0; i < 300; i++)
        if (_al_proc_status("VmHWM") <= 0 || _al_proc_status("Threads") <= 0)
            (*bad)++;
    return NULL;
}

START_TEST(proc_status_read_by_threads_at_once)
{
    pthread_t th[4];
    long bad[4] = { 0 };
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, status_reads, &bad[i]), 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(bad[i] == 0, "thread %d: %ld reads without a value", i, bad[i]);
    }
}
END_TEST

static bool fd_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1;
}

/* fds.c: libunwind's pipe made during a walk is closed as the walk ends (not a number that is
 * another file's by then), and its numbers are retired until libunwind makes another; where
 * another user of libunwind made its pipe first (shared), the one made in the walk stays open. */
START_TEST(fds_unwinder_pipe_closed_after_walk)
{
    int p[2], q[2];
    ck_assert_int_eq(pipe(p), 0);
    _al_fds_walk_end(); /* no pipe made: nothing to do */
    ck_assert(fd_open(p[0]) && fd_open(p[1]));
    ck_assert(!_al_fds_retired(p[0]) && !_al_fds_retired(-1));

    _al_fds_unwinder_pipe(p, true);
    ck_assert(!_al_fds_retired(p[0]));
    _al_fds_walk_end();
    ck_assert(!fd_open(p[0]) && !fd_open(p[1]));
    ck_assert(_al_fds_retired(p[0]) && _al_fds_retired(p[1]) && !_al_fds_retired(-1));
    _al_fds_walk_end(); /* once only */
    ck_assert(_al_fds_retired(p[0]));

    /* A number the program took over meanwhile (close_range, then its own open) is not closed,
     * and retired all the same. */
    ck_assert_int_eq(pipe(p), 0);
    _al_fds_unwinder_pipe(p, true);
    int null = open("/dev/null", O_RDONLY);
    ck_assert_int_eq(dup2(null, p[1]), p[1]);
    close(null);
    _al_fds_walk_end();
    ck_assert(!fd_open(p[0]) && fd_open(p[1]));
    ck_assert(_al_fds_retired(p[0]) && _al_fds_retired(p[1]));
    close(p[1]);

    /* A pipe libunwind made outside our walks: its numbers are libunwind's now, not closed. */
    ck_assert_int_eq(pipe(q), 0);
    _al_fds_unwinder_pipe(q, false);
    ck_assert(!_al_fds_retired(p[0]) && !_al_fds_retired(q[0]));
    _al_fds_walk_end();
    ck_assert(fd_open(q[0]) && fd_open(q[1]));

    /* Shared: the walk's pipe stands in for the other user's and stays open. */
    ck_assert_int_eq(pipe(p), 0);
    _al_fds_unwinder_shared();
    _al_fds_unwinder_pipe(p, true);
    _al_fds_walk_end();
    ck_assert(fd_open(p[0]) && fd_open(p[1]));
    ck_assert(!_al_fds_retired(p[0]));
    close(p[0]);
    close(p[1]);
    close(q[0]);
    close(q[1]);
}
END_TEST

/* seccomp.c: the program's filters, run as the kernel would. */
static uint32_t run_filter(const struct sock_filter *f, unsigned n, int nr, uint64_t arg0, uint64_t arg2)
{
    struct seccomp_data d = { .nr = nr, .arch = AUDIT_ARCH_X86_64, .args = { arg0, 0, arg2 } };
    return _al_seccomp_run(f, n, &d);
}

START_TEST(seccomp_filter_runs)
{
    /* getppid: EPERM; openat creating a file (arg 2, low word): killed; ioctl with the high
     * word of arg 0 set: trapped; anything else allowed. */
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_CREAT, 0, 5),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]) + 4),
        BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 0, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    unsigned n = sizeof f / sizeof f[0];
    ck_assert_uint_eq(run_filter(f, n, SYS_getppid, 0, 0), SECCOMP_RET_ERRNO | EPERM);
    ck_assert_uint_eq(run_filter(f, n, SYS_openat, 0, O_RDONLY), SECCOMP_RET_ALLOW);
    ck_assert_uint_eq(run_filter(f, n, SYS_openat, 0, O_WRONLY | O_CREAT), SECCOMP_RET_KILL_PROCESS);
    ck_assert_uint_eq(run_filter(f, n, SYS_ioctl, 3, 0), SECCOMP_RET_ALLOW);
    ck_assert_uint_eq(run_filter(f, n, SYS_ioctl, 1ull << 32, 0), SECCOMP_RET_TRAP);
    ck_assert_uint_eq(run_filter(f, n, SYS_read, 0, 0), SECCOMP_RET_ALLOW);

    /* Scratch memory, X and arithmetic: returns ERRNO with data (nr + 5) * 2 via A. */
    struct sock_filter g[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_STMT(BPF_ST, 3),
        BPF_STMT(BPF_LD | BPF_IMM, 5),
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_LD | BPF_MEM, 3),
        BPF_STMT(BPF_ALU | BPF_ADD | BPF_X, 0),
        BPF_STMT(BPF_ALU | BPF_LSH | BPF_K, 1),
        BPF_STMT(BPF_ALU | BPF_OR | BPF_K, SECCOMP_RET_ERRNO),
        BPF_STMT(BPF_RET | BPF_A, 0),
    };
    ck_assert_uint_eq(run_filter(g, sizeof g / sizeof g[0], 7, 0, 0), SECCOMP_RET_ERRNO | 24);

    /* What the kernel would stop on ends the run as killed: a misaligned or out-of-range
     * load, a division by zero, running off the end. */
    struct sock_filter bad1[] = { BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 2), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW) };
    struct sock_filter bad2[] = { BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 64), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW) };
    struct sock_filter bad3[] = { BPF_STMT(BPF_ALU | BPF_DIV | BPF_X, 0), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW) };
    struct sock_filter bad4[] = { BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
                                  BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW) };
    ck_assert_uint_eq(run_filter(bad1, 2, 0, 0, 0), SECCOMP_RET_KILL_PROCESS);
    ck_assert_uint_eq(run_filter(bad2, 2, 0, 0, 0), SECCOMP_RET_KILL_PROCESS);
    ck_assert_uint_eq(run_filter(bad3, 2, 0, 0, 0), SECCOMP_RET_KILL_PROCESS);
    ck_assert_uint_eq(run_filter(bad4, 3, 0, 0, 0), SECCOMP_RET_KILL_PROCESS);
    ck_assert_uint_eq(run_filter(bad4, 3, 1, 0, 0), SECCOMP_RET_ALLOW);
}
END_TEST

START_TEST(seccomp_report_refused)
{
    bool can_say;
    ck_assert_ptr_null(_al_seccomp_refuses_report(&can_say));
    ck_assert_ptr_null(_al_seccomp_note());
    /* A failed install leaves nothing behind. */
    struct sock_filter deny[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mincore, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_LOG),
    };
    struct sock_fprog prog = { sizeof deny / sizeof deny[0], deny };
    ck_assert(_al_seccomp_measures_ok() && _al_seccomp_rusage_ok());
    _al_seccomp_installing(false);
    ck_assert(!_al_seccomp_measures_ok() && !_al_seccomp_rusage_ok()); /* under way */
    _al_seccomp_installed(false, &prog, false);
    ck_assert_ptr_null(_al_seccomp_refuses_report(&can_say));
    ck_assert(!_al_seccomp_on);
    ck_assert(_al_seccomp_measures_ok() && _al_seccomp_rusage_ok());
    /* Two installs overlapping: one failing while the other is under way leaves the filter
     * on and the measurements off until the other has ended. */
    _al_seccomp_installing(false);
    _al_seccomp_installing(false);
    _al_seccomp_installed(false, &prog, false);
    ck_assert(_al_seccomp_on && !_al_seccomp_measures_ok());
    /* The other one ends, installed: later threads are told, the report is refused by name
     * (and a line can say so), the copy kept is what counts (the program's buffer may change
     * after). */
    _al_seccomp_installed(false, &prog, true);
    deny[1].k = SYS_getppid;
    ck_assert(_al_seccomp_on);
    /* It refuses mincore, which measuring takes, not getrusage. */
    ck_assert(!_al_seccomp_measures_ok() && _al_seccomp_rusage_ok());
    ck_assert_ptr_nonnull(_al_seccomp_note());
    const char *why = _al_seccomp_refuses_report(&can_say);
    ck_assert_ptr_nonnull(why);
    ck_assert_str_eq(why, "the program's seccomp filter refuses mincore, which writing it takes");
    ck_assert(can_say);
    /* Strict mode allows write, all a line needs, and no open. */
    _al_seccomp_installing(false);
    _al_seccomp_installed(true, NULL, true);
    why = _al_seccomp_refuses_report(&can_say);
    ck_assert_str_eq(why, "the program's seccomp filter refuses openat, which writing it takes");
    ck_assert(can_say);
}
END_TEST

/* The heap's resident size where part of it was unmapped without alloclens seeing it (a thread
 * without syscall user dispatch): the rest measured, the unmapped pages dropped from the heap's
 * bits, those around kept. */
START_TEST(heap_resident_after_unseen_unmap)
{
    if (!_al_shadow.dir)
        ck_assert_int_eq(_al_shadow_init(), 0);
    ck_assert_int_eq(_al_shadow_heap_init(), 0);
    const size_t page = 4096, len = 64 * page;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(p, MAP_FAILED);
    memset(p, 1, len);
    uint64_t a = (uint64_t)(uintptr_t)p;
    _al_shadow_heap_set(a, a + len, true);
    int pagemap = _al_proc_pagemap_open();
    uint64_t before = _al_heap_resident(pagemap);
    ck_assert_uint_ge(before, len);
    ck_assert_int_eq(munmap(p + 8 * page, 40 * page), 0);
    ck_assert_uint_eq(_al_heap_resident(pagemap), before - 40 * page);
    ck_assert(!_al_shadow_heap_has(a + 8 * page) && !_al_shadow_heap_has(a + 47 * page));
    ck_assert(_al_shadow_heap_has(a + 7 * page) && _al_shadow_heap_has(a + 48 * page));
    _al_proc_pagemap_close(pagemap);
    _al_shadow_heap_set(a, a + len, false);
    munmap(p, 8 * page);
    munmap(p + 48 * page, 16 * page);
}
END_TEST

/* The live samples' table starts small and grows as samples come (what is mapped up front is
 * address space a program's limit counts): thousands of samples live at once, each found
 * again at its free, in another order than they came, and nothing dropped. */
START_TEST(sampler_tables_grow)
{
    if (!_al_shadow.dir)
        ck_assert_int_eq(_al_shadow_init(), 0);
    struct al_settings set = { .sample_rate = 4096, .seed = 7 };
    _al_sampler_init(&set, 0);
    ck_assert(_al_sampler.enabled);
    struct al_thread *t = mmap(NULL, sizeof *t, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(t, MAP_FAILED);
    _al_sampler_thread_init(t);
    enum { N = 5000, STRIDE = 64, SIZE = 48 };
    char *base = mmap(NULL, N * STRIDE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(base, MAP_FAILED);
    for (unsigned i = 0; i < N; i++)
        _al_sample_alloc(t, SIZE, base + (size_t)i * STRIDE);
    ck_assert_uint_eq(_al_sampler.dropped, 0);
    ck_assert_uint_eq(_al_sampler.nsites, 1);
    const struct al_site *st = _al_site(0);
    double each = 1.0 / -expm1(-(SIZE + 1.0) / 4096.0);
    ck_assert_uint_eq(st->count, N);
    ck_assert_double_eq_tol(st->live_objects, N * each, 1e-6 * N * each);
    /* Every seventh first, then the rest: the holes are filled from the end of the table. */
    for (unsigned k = 0; k < 7; k++)
        for (unsigned i = k; i < N; i += 7)
            _al_sample_free(base + (size_t)i * STRIDE, NULL);
    ck_assert_uint_eq(st->nlife, N);
    ck_assert_double_eq(st->live_objects, 0);
    ck_assert_double_eq_tol(st->alloc_objects, N * each, 1e-6 * N * each);
    munmap(base, N * STRIDE);
    munmap(t, sizeof *t);
}
END_TEST

/* ---- stack walks (unwind.c) ------------------------------------------------------------------ */

/* The reference: libunwind's walk, step by step. */
static AL_NOINLINE int reference_walk(void **raw, int max)
{
    unw_context_t uc;
    unw_cursor_t c;
    unw_getcontext(&uc);
    ck_assert_int_eq(unw_init_local(&c, &uc), 0);
    int n = 0;
    do {
        unw_word_t ip;
        ck_assert_int_eq(unw_get_reg(&c, UNW_REG_IP, &ip), 0);
        raw[n++] = (void *)ip;
    } while (n < max && unw_step(&c) > 0);
    return n;
}

enum { WALKS = 3, DEPTH = 48 };
struct walks {
    void *f[WALKS][DEPTH], *ref[DEPTH];
    int n[WALKS], nref;
    unsigned long slow[WALKS];
};

/* WALKS walks from one call site (the first learns, the others use the rules), then the
 * reference. Frames 0 and 1 are the walkers' own and where they were called: compared from 2. */
void walk_here(struct walks *w);
__attribute__((used)) AL_NOINLINE void walk_here(struct walks *w)
{
    for (int i = 0; i < WALKS; i++) {
        unsigned long before = _al_unwind_slow_walks;
        struct al_loader_counts loaded;
        _al_unwind_loader_counts(&loaded);
        w->n[i] = _al_unwind_backtrace(w->f[i], DEPTH, &loaded);
        w->slow[i] = _al_unwind_slow_walks - before;
    }
    w->nref = reference_walk(w->ref, DEPTH);
    __asm__ volatile("" ::: "memory");
}

static void walks_agree(const struct walks *w, const char *what)
{
    for (int i = 0; i < WALKS; i++) {
        ck_assert_msg(w->n[i] == w->nref, "%s: walk %d has %d frames, libunwind's %d", what, i, w->n[i], w->nref);
        for (int k = 2; k < w->nref; k++)
            ck_assert_msg(w->f[i][k] == w->ref[k], "%s: walk %d frame %d %p, libunwind's %p", what, i, k,
                          w->f[i][k], w->ref[k]);
    }
}

static AL_NOINLINE void plain_frames(struct walks *w, int depth)
{
    if (depth)
        plain_frames(w, depth - 1);
    else
        walk_here(w);
    __asm__ volatile("" ::: "memory");
}

/* alloca makes RBP the frame's base: RSP's distance to the CFA differs from call to call. */
static AL_NOINLINE void alloca_frame(struct walks *w, size_t n)
{
    char *p = alloca(n);
    memset(p, 1, n);
    __asm__ volatile("" ::"r"(p) : "memory");
    walk_here(w);
    __asm__ volatile("" ::"r"(p) : "memory");
}

/* A frame larger than the copies rules are learned from, its CFA RSP's (the compiler gives its
 * own big frames RBP's): walked by libunwind every time. The stack below is touched a page at
 * a time first, as the compiler's probes would. */
void big_frame(struct walks *w);
__asm__(".text\n"
        ".type big_frame, @function\n"
        "big_frame:\n"
        ".cfi_startproc\n"
        "  mov %rsp, %rax\n"
        "1: sub $4096, %rax\n"
        "  orq $0, (%rax)\n"
        "  lea -0x19008(%rsp), %rcx\n"
        "  cmp %rcx, %rax\n"
        "  ja 1b\n"
        "  sub $0x19008, %rsp\n"
        ".cfi_adjust_cfa_offset 0x19008\n"
        "  call walk_here\n"
        "  add $0x19008, %rsp\n"
        ".cfi_adjust_cfa_offset -0x19008\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size big_frame, .-big_frame\n");

START_TEST(unwind_agrees_with_libunwind)
{
    struct walks w;
    plain_frames(&w, 5);
    walks_agree(&w, "plain frames");
    ck_assert_uint_eq(w.slow[0], 1);
    ck_assert_uint_eq(w.slow[1], 0);
    ck_assert_uint_eq(w.slow[2], 0);

    /* Learned with one size, walked with others: RBP's rule, not RSP's distance. (The first
     * walk learns this call site of alloca_frame's too.) */
    for (size_t n = 16; n < 20000; n = n * 3 + 8) {
        alloca_frame(&w, n);
        walks_agree(&w, "alloca");
        for (int i = n == 16; i < WALKS; i++)
            ck_assert_msg(w.slow[i] == 0, "alloca %zu walk %d slow", n, i);
    }

    big_frame(&w);
    walks_agree(&w, "big frame");
    for (int i = 0; i < WALKS; i++)
        ck_assert_uint_eq(w.slow[i], 1);

    /* Deeper than the buffer: both stop at its end. */
    plain_frames(&w, 100);
    walks_agree(&w, "deep");
    ck_assert_int_eq(w.nref, DEPTH);
    ck_assert_uint_eq(w.slow[2], 0);

    /* Forgotten once the loader loads something (code may sit where other code was), and
     * again once it unloads it: learned again each time. */
    for (int k = 0; k < 2; k++) {
        static void *lib;
        if (k == 0)
            ck_assert_ptr_nonnull(lib = dlopen("libz.so.1", RTLD_NOW));
        else
            ck_assert_int_eq(dlclose(lib), 0);
        plain_frames(&w, 5);
        walks_agree(&w, "after the loader");
        ck_assert_uint_eq(w.slow[0], 1);
        ck_assert_uint_eq(w.slow[2], 0);
    }
}
END_TEST

/* Code without unwind information (hand-written assembly, JIT code, Go's): a frame-pointer frame,
 * nocfi_frame, called from one whose CFA is RSP's (calls_nocfi, 24 bytes of its own). Its caller
 * is found by RBP, as unw_backtrace did: CFA = RBP + 16. (libunwind's step guesses RBP's chain
 * too, but gives the caller RSP + 16 for its stack pointer, from which calls_nocfi's caller was
 * read wrong.) */
void nocfi_frame(struct walks *w);
void calls_nocfi(struct walks *w);
extern char after_walk_call[], after_nocfi_call[];
__asm__(".text\n"
        ".type nocfi_frame, @function\n"
        "nocfi_frame:\n"
        "  push %rbp\n"
        "  mov %rsp, %rbp\n"
        "  sub $32, %rsp\n"
        "  call walk_here\n"
        "after_walk_call:\n"
        "  leave\n"
        "  ret\n"
        ".size nocfi_frame, .-nocfi_frame\n"
        ".type calls_nocfi, @function\n"
        "calls_nocfi:\n"
        ".cfi_startproc\n"
        "  sub $24, %rsp\n"
        ".cfi_adjust_cfa_offset 24\n"
        "  call nocfi_frame\n"
        "after_nocfi_call:\n"
        "  add $24, %rsp\n"
        ".cfi_adjust_cfa_offset -24\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size calls_nocfi, .-calls_nocfi\n");

static AL_NOINLINE void *run_nocfi(struct walks *w)
{
    calls_nocfi(w);
    __asm__ volatile("" ::: "memory");
    return __builtin_return_address(0);
}

START_TEST(unwind_through_code_without_unwind_info)
{
    struct walks w;
    for (int round = 0; round < 2; round++) {
        void *ra = run_nocfi(&w);
        for (int i = 0; i < WALKS; i++) {
            ck_assert_int_gt(w.n[i], 6);
            ck_assert_ptr_eq(w.f[i][2], after_walk_call);
            ck_assert_ptr_eq(w.f[i][3], after_nocfi_call);
            ck_assert_msg((char *)w.f[i][4] > (char *)run_nocfi && (char *)w.f[i][4] < (char *)run_nocfi + 64,
                          "walk %d frame 4 %p, not in run_nocfi %p", i, w.f[i][4], (void *)run_nocfi);
            ck_assert_ptr_eq(w.f[i][5], ra);
            /* Learned once: the walks after use the rules, the frame without unwind
             * information's too. */
            if (round || i)
                ck_assert_uint_eq(w.slow[i], 0);
        }
    }
}
END_TEST

/* Through a signal frame: walked by libunwind, which knows the kernel's frame, every time. */
static struct walks in_handler;
static void walking_handler(int sig)
{
    (void)sig;
    walk_here(&in_handler);
}

START_TEST(unwind_through_signal_frame)
{
    struct sigaction sa = { .sa_handler = walking_handler };
    ck_assert_int_eq(sigaction(SIGUSR1, &sa, NULL), 0);
    for (int i = 0; i < 2; i++) {
        raise(SIGUSR1);
        walks_agree(&in_handler, "signal handler");
        for (int k = 0; k < WALKS; k++)
            ck_assert_uint_eq(in_handler.slow[k], 1);
    }
}
END_TEST

/* The caller's RBP kept in another register (DW_CFA_register; the CFI leaves RBX's own saving
 * out, so that libunwind 1.6 finds RBP in the register rather than in RBX's slot), equal to RBP
 * when the frame is first walked: its rule is libunwind's step, not "RBP unchanged", which a
 * later walk with RBP changed there (a path that moved it before the call) would follow to the
 * caller's frame at a wrong address. */
void rbp_in_rbx(struct walks *w);
__asm__(".text\n"
        ".type rbp_in_rbx, @function\n"
        "rbp_in_rbx:\n"
        ".cfi_startproc\n"
        "  push %rbx\n"
        ".cfi_adjust_cfa_offset 8\n"
        "  mov %rbp, %rbx\n"
        ".cfi_register %rbp, %rbx\n"
        "  call walk_here\n"
        "  mov %rbx, %rbp\n"
        ".cfi_restore %rbp\n"
        "  pop %rbx\n"
        ".cfi_adjust_cfa_offset -8\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size rbp_in_rbx, .-rbp_in_rbx\n");

START_TEST(unwind_rbp_in_another_register)
{
    struct walks w;
    rbp_in_rbx(&w);
    for (int i = 0; i < WALKS; i++) {
        ck_assert_msg(w.slow[i] == 1, "walk %d through RBP kept in RBX used a rule", i);
        ck_assert_int_eq(w.n[i], w.n[0]);
        for (int k = 2; k < w.n[0]; k++)
            ck_assert_ptr_eq(w.f[i][k], w.f[0][k]);
    }
}
END_TEST

/* A frame on two stacks: a function that calls on another stack (as stacker, psm and
 * segmented stacks do), its CFA RBP's on the stack it came from, its RSP on the new one, a
 * guard page between them. Rules are learned without reading the frame's range from RSP to
 * the CFA, which crosses the guard page. */
void call_on_stack(void (*fn)(struct walks *), struct walks *w, void *sp);
__asm__(".text\n"
        ".type call_on_stack, @function\n"
        "call_on_stack:\n"
        ".cfi_startproc\n"
        "  push %rbp\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_offset %rbp, -16\n"
        "  mov %rsp, %rbp\n"
        ".cfi_def_cfa_register %rbp\n"
        "  mov %rdx, %rsp\n"
        "  mov %rdi, %rax\n"
        "  mov %rsi, %rdi\n"
        "  call *%rax\n"
        "  mov %rbp, %rsp\n"
        "  pop %rbp\n"
        ".cfi_def_cfa %rsp, 8\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size call_on_stack, .-call_on_stack\n");

enum { TWO_GUARD = 4096, TWO_LOW = 32768, TWO_HIGH = 65536 };
static char *two_stacks;

static AL_NOINLINE void on_low_stack(struct walks *w)
{
    walk_here(w);
    __asm__ volatile("" ::: "memory");
}

/* On the higher stack, 2 KiB above its guard page: switches to the lower one's top. */
static AL_NOINLINE void on_high_stack(struct walks *w)
{
    call_on_stack(on_low_stack, w, two_stacks + TWO_GUARD + TWO_LOW);
    __asm__ volatile("" ::: "memory");
}

START_TEST(unwind_frame_across_stacks)
{
    size_t bytes = TWO_GUARD + TWO_LOW + TWO_GUARD + TWO_HIGH;
    two_stacks = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(two_stacks, MAP_FAILED);
    ck_assert_int_eq(mprotect(two_stacks, TWO_GUARD, PROT_NONE), 0);
    ck_assert_int_eq(mprotect(two_stacks + TWO_GUARD + TWO_LOW, TWO_GUARD, PROT_NONE), 0);
    struct walks w;
    for (int i = 0; i < 2; i++) {
        call_on_stack(on_high_stack, &w, two_stacks + 2 * TWO_GUARD + TWO_LOW + 2048);
        walks_agree(&w, "frame across two stacks");
    }
    munmap(two_stacks, bytes);
}
END_TEST

/* The walk runs on a stack of its own: from a 2 KiB stack (a guard page under it), the first
 * walk through new frames, libunwind's steps and the loader binding its calls (some 6 KiB),
 * crashed on the guard page. */
enum { SMALL_GUARD = 4096, SMALL_STACK = 2048 };

static AL_NOINLINE void on_small_stack(struct walks *w)
{
    struct al_loader_counts loaded;
    _al_unwind_loader_counts(&loaded);
    unsigned long before = _al_unwind_slow_walks;
    w->n[0] = _al_unwind_backtrace(w->f[0], DEPTH, &loaded);
    w->slow[0] = _al_unwind_slow_walks - before;
    __asm__ volatile("" ::: "memory");
}

START_TEST(unwind_from_a_small_stack)
{
    char *m = mmap(NULL, SMALL_GUARD + SMALL_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    ck_assert_int_eq(mprotect(m, SMALL_GUARD, PROT_NONE), 0);
    struct walks w;
    /* This program's calls into libunwind and the loader bound first (the library's are, at
     * its load), on this stack. */
    on_small_stack(&w);
    call_on_stack(on_small_stack, &w, m + SMALL_GUARD + SMALL_STACK);
    ck_assert_msg(w.slow[0] == 1, "the first walk from there was libunwind's");
    /* Its own frame, on_small_stack, call_on_stack, this test and its callers. */
    ck_assert_int_ge(w.n[0], 5);
    munmap(m, SMALL_GUARD + SMALL_STACK);
}
END_TEST

/* A library unloaded and another loaded at its address, with another frame at a return
 * address the first had: walked with the second's frame, by the rules and by libunwind, whose
 * own cache of frames keyed by address must be forgotten too. */
static void reload_walk(void *w)
{
    walk_here(w);
}

static uintptr_t reload_run(const char *path, struct walks *w)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(h != NULL, "%s", dlerror());
    void (*call)(void (*)(void *), void *) = (void (*)(void (*)(void *), void *))dlsym(h, "reload_call");
    ck_assert_ptr_nonnull(call);
    call(reload_walk, w);
    ck_assert_int_eq(dlclose(h), 0);
    return (uintptr_t)call;
}

START_TEST(unwind_reload)
{
    const char *a = getenv("UNWIND_RELOAD_A"), *b = getenv("UNWIND_RELOAD_B");
    if (!a || !b) {
        fprintf(stderr, "# unwind_reload: skipped, UNWIND_RELOAD_A/B not set (run by meson)\n");
        return;
    }
    struct walks w;
    uintptr_t at_a = reload_run(a, &w);
    walks_agree(&w, "library A");
    int n_a = w.nref;
    uintptr_t at_b = reload_run(b, &w);
    if (at_b != at_a) {
        fprintf(stderr, "# unwind_reload: B loaded at another address than A, not compared\n");
        return;
    }
    /* The same frames, but for B's in place of A's. */
    ck_assert_msg(w.nref == n_a, "libunwind's walk through B has %d frames, through A %d", w.nref, n_a);
    walks_agree(&w, "library B at A's address");
}
END_TEST

/* Threads that take samples cost no memory of the walks' own each: libunwind's fast walk kept
 * 256 KiB in each such thread. Sixteen threads walk, then are measured while all still live. */
enum { WALKERS = 16 };
static pthread_barrier_t walked, measured;

static void *walker(void *arg)
{
    (void)arg;
    void *raw[DEPTH];
    for (int i = 0; i < 10; i++)
        ck_assert_int_gt(_al_sampler_backtrace(raw, DEPTH), 2);
    pthread_barrier_wait(&walked);
    pthread_barrier_wait(&measured);
    return NULL;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    ck_assert_int_eq(fscanf(f, "%ld %ld", &size, &resident), 2);
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

START_TEST(unwind_threads_memory)
{
    void *raw[DEPTH];
    ck_assert_int_gt(_al_sampler_backtrace(raw, DEPTH), 2);
    pthread_barrier_init(&walked, NULL, WALKERS + 1);
    pthread_barrier_init(&measured, NULL, WALKERS + 1);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    pthread_t th[WALKERS];
    long before = rss_kib();
    for (int i = 0; i < WALKERS; i++)
        ck_assert_int_eq(pthread_create(&th[i], &attr, walker, NULL), 0);
    pthread_barrier_wait(&walked);
    long grown = rss_kib() - before;
    pthread_barrier_wait(&measured);
    for (int i = 0; i < WALKERS; i++)
        pthread_join(th[i], NULL);
    /* Each thread's stack and its start: tens of KiB (libunwind's walk: 256 KiB more each). */
    ck_assert_msg(grown < WALKERS * 64, "%d walking threads added %ld KiB", WALKERS, grown);
}
END_TEST

/* A program with file capabilities is run securely (LD_PRELOAD ignored) for anyone but root:
 * said of it when a user runs it, not when root does, nor of the same file without them. Root
 * makes the file (cap_net_raw, permitted and effective, as ping has); a child turned into
 * nobody asks. */
static const char *reach_as(uid_t uid, const char *path)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        const char *why = (setgid(uid) == 0 && setuid(uid) == 0) ? _al_preload_unreachable(path, false) : "setuid failed";
        ssize_t n = write(fds[1], why ? why : "", why ? strlen(why) : 0);
        _exit(n < 0);
    }
    close(fds[1]);
    static char buf[256];
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    return buf;
}

START_TEST(reach_file_capabilities)
{
    const char *tmp = getenv("TMPDIR");
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/al-caps-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chmod(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/prog", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    ck_assert_int_ge(fd, 0);
    close(fd);
    const uid_t nobody = 65534;
    struct statvfs fs;
    const uint32_t caps[5] = { 0x02000000u | 1u /* revision 2, effective */, 1u << 13, 0, 0, 0 };
    /* Only root can give a file capabilities, and a nosuid file system ignores them. */
    const char *skip = geteuid() != 0                                          ? "not root"
                       : statvfs(dir, &fs) == 0 && (fs.f_flag & ST_NOSUID)     ? "mounted nosuid"
                       : setxattr(path, "security.capability", caps, sizeof caps, 0) != 0 ? strerror(errno)
                                                                               : NULL;
    if (skip) {
        fprintf(stderr, "# reach_file_capabilities: skipped, cannot give %s capabilities: %s\n", path, skip);
    } else {
        ck_assert_ptr_nonnull(strstr(reach_as(nobody, path), "has file capabilities"));
        ck_assert_ptr_null(_al_preload_unreachable(path, false)); /* root */
        ck_assert_int_eq(removexattr(path, "security.capability"), 0);
    }
    if (geteuid() == 0)
        ck_assert_str_eq(reach_as(nobody, path), ""); /* no capabilities */
    unlink(path);
    rmdir(dir);
}
END_TEST

/* Whether the hash table of the object holding ADDR says it may define NAME agrees with dlsym
 * on HANDLE (which searches that object first) landing in it; returns that answer. */
static bool check_defines(void *handle, const void *addr, const char *name)
{
    struct al_object obj, at;
    ck_assert(_al_object_of(addr, &obj));
    void *f = dlsym(handle, name);
    bool in = f && _al_object_of(f, &at) && at.base == obj.base;
    ck_assert_msg(_al_object_may_define(&obj, name) == in, "%s: the hash table says %d, dlsym %d", name, !in, in);
    return in;
}

START_TEST(object_may_define_agrees_with_dlsym)
{
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    ck_assert_ptr_nonnull(libc);
    const void *in_libc = dlsym(libc, "getpid");
    /* Some defined, some never (the C++ operators, made-up names), and those a newer glibc
     * may have (free_sized): the two must agree on each. */
    static const char *const names[] = { "malloc", "free", "getpid", "qsort", "dlsym", "posix_memalign",
                                         "pthread_create", "memcpy", "_exit", "__libc_start_main",
                                         "free_sized", "free_aligned_sized", "mallctl", "tc_version",
                                         "mi_version", "_Znwm", "_ZdlPv", "al_no_such_symbol", "" };
    unsigned found = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        found += check_defines(libc, in_libc, names[i]);
    ck_assert_uint_ge(found, 10);
    ck_assert(!check_defines(libc, in_libc, "_Znwm"));
    ck_assert(!check_defines(libc, in_libc, "al_no_such_symbol"));
    /* libstdc++ defines the C++ operators, and takes malloc from libc (used, not defined). */
    void *cxx = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_LOCAL);
    if (cxx) {
        const void *in_cxx = dlsym(cxx, "_Znwm");
        ck_assert(check_defines(cxx, in_cxx, "_Znwm"));
        ck_assert(check_defines(cxx, in_cxx, "_ZdlPvm"));
        ck_assert(check_defines(cxx, in_cxx, "_ZnwmSt11align_val_t"));
        struct al_object obj;
        ck_assert(_al_object_of(in_cxx, &obj));
        ck_assert(!_al_object_may_define(&obj, "malloc"));
        dlclose(cxx);
    }
    /* The vDSO's dynamic section holds offsets, not addresses: the loader did not map it. */
    struct al_object vdso;
    const void *v = (const void *)getauxval(AT_SYSINFO_EHDR);
    if (v && _al_object_of(v, &vdso)) {
        ck_assert(!vdso.dynamic_relocated);
        ck_assert(_al_object_may_define(&vdso, "__vdso_clock_gettime"));
        ck_assert(!_al_object_may_define(&vdso, "__vdso_no_such_call"));
    }
    dlclose(libc);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("profiler");
    TCase *tc = tcase_create("profiler");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, hist_bucket_bounds);
    tcase_add_test(tc, sort_stable);
    tcase_add_test(tc, sampler_tables_grow);
    tcase_add_test(tc, unwind_agrees_with_libunwind);
    tcase_add_test(tc, unwind_through_signal_frame);
    tcase_add_test(tc, unwind_through_code_without_unwind_info);
    tcase_add_test(tc, unwind_rbp_in_another_register);
    tcase_add_test(tc, unwind_reload);
    tcase_add_test(tc, unwind_frame_across_stacks);
    tcase_add_test(tc, unwind_from_a_small_stack);
    tcase_add_test(tc, unwind_threads_memory);
    tcase_add_test(tc, hist_quantiles);
    tcase_add_test(tc, hist_out_of_memory_still_timed);
    tcase_add_test(tc, locks_claimed_in_order);
    tcase_add_test(tc, math_matches_libm);
    tcase_add_test(tc, tsc_overhead_plausible);
    tcase_add_test(tc, tsc_rate_calibration);
    tcase_add_test(tc, options_parse_numbers);
    tcase_add_test(tc, options_table_complete);
    tcase_add_test(tc, settings_garbage_defaults);
    tcase_add_test(tc, rows_roundtrip);
    tcase_add_test(tc, buf_json_escaping);
    tcase_add_test(tc, buf_u64_decimal);
    tcase_add_test(tc, buf_streamed);
    tcase_add_test(tc, fds_table_grown_at_start);
    tcase_add_test(tc, fds_unwinder_pipe_closed_after_walk);
    tcase_add_test(tc, proc_status_read_by_threads_at_once);
    tcase_add_test(tc, seccomp_filter_runs);
    tcase_add_test(tc, seccomp_report_refused);
    tcase_add_test(tc, reach_file_capabilities);
    tcase_add_test(tc, heap_resident_after_unseen_unmap);
    tcase_add_test(tc, object_may_define_agrees_with_dlsym);
    suite_add_tcase(s, tc);
    return al_check_run(s);
}
