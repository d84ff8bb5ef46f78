/* Unit tests of profiler/counters.c: event-name resolution through libpfm4, the default set's
 * hardware/software choice (whichever this machine allows, checked independently here), the
 * per-thread group around a counted call, the two read paths, and the perf ring-buffer parser
 * on a synthetic ring (records across the wrap, malformed records) and on a real sampled
 * page-fault event. */
#include <check.h>

#include "check_main.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "profiler.h"
#include "counters.h"

static size_t page(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

static int open_event(uint32_t type, uint64_t config, bool exclude_kernel)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = type;
    a.config = config;
    a.exclude_kernel = exclude_kernel;
    a.exclude_hv = 1;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
}

/* Fresh anonymous pages, each faulted on its own (no transparent huge pages). */
static char *fresh_pages(size_t n)
{
    char *p = mmap(NULL, n * page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(p, MAP_FAILED);
    madvise(p, n * page(), MADV_NOHUGEPAGE);
    return p;
}

static void touch(char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ((volatile char *)p)[i * page()] = 1;
}

/* ---- resolution --------------------------------------------------------------------------- */

START_TEST(resolve_valid)
{
    static const struct {
        const char *name;
        uint32_t type;
        uint64_t config;
    } cases[] = {
        { "page-faults", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS },
        { "task-clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK },
        { "context-switches", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES },
        /* Resolves without a PMU too: opening is what fails there. */
        { "cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES },
        { "instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS },
        { "cache-misses", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct perf_event_attr a;
        char err[256] = "x";
        int r = _al_event_resolve(cases[i].name, &a, err, sizeof err);
        ck_assert_msg(r == 0, "%s: %d %s", cases[i].name, r, err);
        ck_assert_str_eq(err, "");
        if (cases[i].type == PERF_TYPE_SOFTWARE) {
            ck_assert_uint_eq(a.type, cases[i].type);
            ck_assert_uint_eq(a.config, cases[i].config);
        } else {
            /* The generic event, or the PMU's own where libpfm4 finds it there first. */
            ck_assert_uint_ne(a.type, PERF_TYPE_SOFTWARE);
            if (a.type == PERF_TYPE_HARDWARE)
                ck_assert_uint_eq(a.config, cases[i].config);
        }
        ck_assert_uint_eq(a.size, sizeof a);
        ck_assert(a.exclude_kernel);
        ck_assert(a.exclude_hv);
        ck_assert(!a.exclude_user);
    }
    /* A cache event libpfm4 spells out itself. */
    struct perf_event_attr a;
    char err[256];
    ck_assert_int_eq(_al_event_resolve("dTLB-load-misses", &a, err, sizeof err), 0);
    ck_assert_uint_ne(a.type, PERF_TYPE_SOFTWARE);
}
END_TEST

/* What 'alloclens run' resolves ahead is what the profiled process then resolves to, without
 * libpfm4 for the names it has: a name libpfm4 does not know resolves from the table. */
START_TEST(resolve_ahead_roundtrip)
{
    char text[4096];
    size_t len = _al_counters_resolve_ahead("page-faults,task-clock,page-faults", text, sizeof text);
    ck_assert_uint_gt(len, 0);
    ck_assert_uint_eq(strlen(text), len);
    ck_assert_ptr_null(strstr(strstr(text, "=page-faults") + 1, "=page-faults")); /* once */
    struct perf_event_attr want, got;
    ck_assert_int_eq(_al_event_resolve("task-clock", &want, NULL, 0), 0);
    /* The same bytes under a name of our own. */
    char *task = strstr(text, "=task-clock");
    ck_assert_ptr_nonnull(task);
    size_t hex = 2 * sizeof(struct perf_event_attr);
    char renamed[1024];
    snprintf(renamed, sizeof renamed, "%.*s=al-test-event", (int)hex, task - hex);
    ck_assert(_al_event_names_load(renamed));
    ck_assert_int_eq(_al_event_resolve("al-test-event", &got, NULL, 0), 0);
    ck_assert_mem_eq(&got, &want, sizeof got);
    /* Malformed: none of it is used. */
    snprintf(renamed + hex / 2, sizeof renamed - hex / 2, "zz;");
    ck_assert(!_al_event_names_load(renamed));
    ck_assert_int_eq(_al_event_resolve("al-test-event", &got, NULL, 0), -ENOENT);
    ck_assert(_al_event_names_load(""));
    _al_event_names_done();
}
END_TEST

START_TEST(resolve_invalid)
{
    struct perf_event_attr a;
    char err[256];
    ck_assert_int_eq(_al_event_resolve("no-such-event", &a, err, sizeof err), -ENOENT);
    ck_assert_msg(strstr(err, "unknown event 'no-such-event'") && strstr(err, "(libpfm4: "), "%s", err);
    ck_assert_int_eq(_al_event_resolve("", &a, err, sizeof err), -ENOENT);
    ck_assert_msg(strstr(err, "unknown event ''"), "%s", err);
    /* No room for the message: still the error. */
    ck_assert_int_eq(_al_event_resolve("no-such-event", &a, NULL, 0), -ENOENT);
}
END_TEST

/* ---- init --------------------------------------------------------------------------------- */

/* What this machine can count, found independently of counters.c. */
enum pmu { PMU_YES, PMU_NO, PMU_DENIED };

static enum pmu machine_pmu(int *err)
{
    int fd = open_event(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, true);
    *err = errno;
    if (fd >= 0) {
        close(fd);
        return PMU_YES;
    }
    return *err == EACCES || *err == EPERM ? PMU_DENIED : PMU_NO;
}

static bool has_event(const char *name)
{
    for (unsigned i = 0; i < _al_counters.nevents; i++)
        if (strcmp(_al_counters.events[i].name, name) == 0)
            return true;
    return false;
}

START_TEST(init_default_set)
{
    int err;
    enum pmu pmu = machine_pmu(&err);
    _al_counters_init(NULL, 1, NULL);
    if (pmu == PMU_DENIED) {
        ck_assert(!_al_counters.available);
        ck_assert_msg(strstr(_al_counters.reason, "perf_event_paranoid"), "%s", _al_counters.reason);
        return;
    }
    ck_assert_msg(_al_counters.available, "%s", _al_counters.reason);
    if (pmu == PMU_NO) {
        ck_assert(_al_counters.software);
        ck_assert_msg(strstr(_al_counters.reason, "no hardware PMU on this machine (perf_event_open: ") &&
                      strstr(_al_counters.reason, strerror(err)) &&
                      strstr(_al_counters.reason, "software events instead"), "%s", _al_counters.reason);
        ck_assert_uint_eq(_al_counters.nevents, 3);
        ck_assert_str_eq(_al_counters.events[0].name, "page-faults");
        ck_assert_str_eq(_al_counters.events[1].name, "context-switches");
        ck_assert_str_eq(_al_counters.events[2].name, "task-clock");
        for (unsigned i = 0; i < 3; i++)
            ck_assert_uint_eq(_al_counters.events[i].attr.type, PERF_TYPE_SOFTWARE);
    } else {
        ck_assert(!_al_counters.software);
        ck_assert_uint_ge(_al_counters.nevents, 2);
        ck_assert_str_eq(_al_counters.events[0].name, "instructions");
        ck_assert(has_event("page-faults"));
    }
    /* Software events count kernel side too wherever the kernel lets us. */
    for (unsigned i = 0; i < _al_counters.nevents; i++) {
        const struct perf_event_attr *a = &_al_counters.events[i].attr;
        if (a->type == PERF_TYPE_SOFTWARE && geteuid() == 0)
            ck_assert(!a->exclude_kernel);
        if (a->type != PERF_TYPE_SOFTWARE)
            ck_assert(a->exclude_kernel);
    }
    ck_assert_uint_eq(_al_counters.sample_every, 1);
}
END_TEST

START_TEST(init_user_events)
{
    int err;
    enum pmu pmu = machine_pmu(&err);
    if (pmu == PMU_DENIED)
        return;

    /* An unknown name is warned about and dropped; the rest are counted. */
    _al_counters_init("page-faults,no-such-event,task-clock", 100, NULL);
    ck_assert_msg(_al_counters.available, "%s", _al_counters.reason);
    ck_assert_uint_eq(_al_counters.nevents, 2);
    ck_assert_str_eq(_al_counters.events[0].name, "page-faults");
    ck_assert_str_eq(_al_counters.events[1].name, "task-clock");
    ck_assert(_al_counters.software);
    ck_assert_uint_eq(_al_counters.sample_every, 100);

    /* Nothing left: unavailable, and the reason names the events. */
    _al_counters_init("no-such-event", 1, NULL);
    ck_assert(!_al_counters.available);
    ck_assert_uint_eq(_al_counters.nevents, 0);
    ck_assert_msg(strstr(_al_counters.reason, "no-such-event"), "%s", _al_counters.reason);

    /* A hardware event: dropped where there is no PMU, counted where there is one. */
    _al_counters_init("cycles,page-faults", 1, NULL);
    ck_assert(_al_counters.available);
    ck_assert(has_event("page-faults"));
    ck_assert(has_event("cycles") == (pmu == PMU_YES));
    ck_assert(_al_counters.software == (pmu == PMU_NO));
    _al_counters_init("cycles", 1, NULL);
    ck_assert(_al_counters.available == (pmu == PMU_YES));
    if (pmu == PMU_NO)
        ck_assert_msg(strstr(_al_counters.reason, "cycles"), "%s", _al_counters.reason);

    /* More than AL_MAX_EVENTS: the extra ones are ignored. */
    _al_counters_init("page-faults,task-clock,context-switches,cpu-clock,page-faults,task-clock,"
                      "context-switches", 1, NULL);
    ck_assert(_al_counters.available);
    ck_assert_uint_eq(_al_counters.nevents, AL_MAX_EVENTS);

    /* sample_every is kept in 1..1e6. */
    _al_counters_init("page-faults", 0, NULL);
    ck_assert_uint_eq(_al_counters.sample_every, 1);
    _al_counters_init("page-faults", 5000000, NULL);
    ck_assert_uint_eq(_al_counters.sample_every, 1000000);
}
END_TEST

/* ---- counting around a call --------------------------------------------------------------- */

/* Counting EVENTS on every call, into a fresh thread state C; false where perf_event_open is
 * not permitted here (nothing to test). */
static bool counting(const char *events, struct al_thread_counters *c)
{
    int err;
    if (machine_pmu(&err) == PMU_DENIED)
        return false;
    _al_counters_init(events, 1, NULL);
    ck_assert_msg(_al_counters.available, "%s", _al_counters.reason);
    memset(c, 0, sizeof *c);
    c->countdown = 1;
    return true;
}

START_TEST(count_page_faults)
{
    enum { N = 64 };
    struct al_thread_counters c;
    if (!counting("page-faults", &c))
        return;
    uint64_t sums[AL_MAX_EVENTS] = { 0 }, off = 0;
    for (int round = 0; round < 3; round++) {
        char *p = fresh_pages(N);
        ck_assert(_al_counters_due(&c));
        uint64_t before = sums[0];
        _al_counters_before(&c);
        ck_assert_int_eq(c.state, 1);
        touch(p, N);
        ck_assert_int_eq(_al_counters_after(&c, 0, sums, &off), AL_CTR_COUNTED);
        ck_assert_uint_eq(c.countdown, 1);
        uint64_t d = sums[0] - before;
        ck_assert_msg(d >= N && d <= N + 8, "round %d: %llu page faults for %d pages", round,
                      (unsigned long long)d, N);
        munmap(p, N * page());
    }

    /* Not due: nothing happens until the countdown runs out. */
    _al_counters_init("page-faults", 3, NULL);
    c.countdown = 3;
    ck_assert(!_al_counters_due(&c));
    ck_assert(!_al_counters_due(&c));
    ck_assert(_al_counters_due(&c));
    _al_counters_before(&c);
    _al_counters_after(&c, 0, sums, &off);
    ck_assert_uint_eq(c.countdown, 3);

    /* Closed: back to "not opened", so a state reused by another thread opens its own. */
    _al_counters_thread_close(&c, false);
    ck_assert_int_eq(c.state, 0);
    ck_assert_int_eq(c.fd[0], -1);
    _al_counters_thread_close(&c, false); /* twice: harmless */
    uint64_t keep = sums[0];
    _al_counters_before(&c);
    ck_assert_int_eq(c.state, 1);
    touch(fresh_pages(4), 4);
    _al_counters_after(&c, 0, sums, &off);
    ck_assert_uint_ge(sums[0] - keep, 4);
    _al_counters_thread_close(&c, false);
}
END_TEST

START_TEST(count_default_set)
{
    struct al_thread_counters c;
    if (!counting(NULL, &c))
        return;
    uint64_t sums[AL_MAX_EVENTS] = { 0 }, off = 0;
    char *p = fresh_pages(32);
    _al_counters_before(&c);
    ck_assert_int_eq(c.state, 1);
    uint64_t c0 = _al_tsc();
    touch(p, 32); /* a short window: a stale counter would read 0 here */
    uint64_t c1 = _al_tsc();
    ck_assert_int_eq(_al_counters_after(&c, c1 - c0, sums, &off), AL_CTR_COUNTED);
    for (unsigned i = 0; i < _al_counters.nevents; i++) {
        const char *n = _al_counters.events[i].name;
        if (!strcmp(n, "page-faults"))
            ck_assert_uint_ge(sums[i], 32);
        if (!strcmp(n, "instructions"))
            ck_assert_msg(sums[i] > 0, "%s: 0", n);
        /* A clock event is the call's cycles, the measurement's own cost taken off. */
        if (!strcmp(n, "task-clock"))
            ck_assert_uint_eq(sums[i], c1 - c0 - _al_hot.tsc_overhead);
    }
    _al_counters_thread_close(&c, false);

    /* A group that cannot open on this thread: state -1, never retried, nothing counted,
     * the countdown still reset. */
    _al_counters.available = false;
    memset(&c, 0, sizeof c);
    c.countdown = 1;
    uint64_t keep[AL_MAX_EVENTS];
    memcpy(keep, sums, sizeof keep);
    _al_counters_before(&c);
    ck_assert_int_eq(c.state, -1);
    _al_counters.available = true;
    _al_counters_before(&c);
    ck_assert_int_eq(c.state, -1);
    touch(fresh_pages(4), 4);
    ck_assert_int_eq(_al_counters_after(&c, 1000, sums, &off), AL_CTR_NONE);
    ck_assert_uint_eq(c.countdown, 1);
    ck_assert(memcmp(keep, sums, sizeof keep) == 0);
}
END_TEST

/* A fork child inherits the state with fds that count the parent's thread (and, for hardware
 * counters, rdpmc pages that are not mapped in the child): closing the copied state makes
 * the child's next counted call open a group of its own. */
START_TEST(fork_child_reopens)
{
    struct al_thread_counters c;
    if (!counting(NULL, &c))
        return;
    uint64_t sums[AL_MAX_EVENTS] = { 0 }, off = 0;
    _al_counters_before(&c);
    _al_counters_after(&c, 0, sums, &off);
    ck_assert_int_eq(c.state, 1);
    int pf = -1;
    for (unsigned i = 0; i < _al_counters.nevents; i++)
        if (!strcmp(_al_counters.events[i].name, "page-faults"))
            pf = (int)i;
    ck_assert_int_ge(pf, 0);

    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* The kernel does not copy perf mappings into a child: nothing to unmap. */
        void *ring = c.ring;
        if (ring && (msync(ring, page(), MS_ASYNC) == 0 || errno != ENOMEM))
            _exit(2);
        _al_counters_thread_close(&c, true);
        uint64_t s[AL_MAX_EVENTS] = { 0 };
        char *p = mmap(NULL, 32 * page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(p, 32 * page(), MADV_NOHUGEPAGE);
        _al_counters_before(&c);
        touch(p, 32);
        _al_counters_after(&c, 0, s, &off);
        _exit(c.state == 1 && s[pf] >= 32 && s[pf] <= 40 ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    _al_counters_thread_close(&c, false);
}
END_TEST

/* ---- software events through the ring ----------------------------------------------------- */

/* Records of a counted call, fed by hand: samples by id, switch-out/in pairs by time. */
START_TEST(ring_window_records)
{
    memset(&_al_counters, 0, sizeof _al_counters);
    _al_counters.nevents = 3;
    _al_counters.events[0].kind = AL_EV_RING;
    _al_counters.events[1].kind = AL_EV_RING;
    _al_counters.events[2].kind = AL_EV_CLOCK;
    struct al_thread_counters c;
    memset(&c, 0, sizeof c);
    c.id[0] = 11;
    c.id[1] = 22;
    struct al_ring_window w = { .c = &c };
    struct {
        struct perf_event_header h;
        uint64_t v;
    } rec[] = {
        { { PERF_RECORD_SWITCH, 0, 16 }, 900 },                            /* an in before any out */
        { { PERF_RECORD_SAMPLE, 0, 16 }, 11 },
        { { PERF_RECORD_SWITCH, PERF_RECORD_MISC_SWITCH_OUT, 16 }, 1000 },
        { { PERF_RECORD_SWITCH, 0, 16 }, 1500 },
        { { PERF_RECORD_SAMPLE, 0, 16 }, 22 },
        { { PERF_RECORD_SAMPLE, 0, 16 }, 33 },                             /* not ours */
        { { PERF_RECORD_SAMPLE, 0, 16 }, 11 },
        { { PERF_RECORD_LOST, 0, 16 }, 11 },
        { { PERF_RECORD_SWITCH, PERF_RECORD_MISC_SWITCH_OUT, 16 }, 2000 },
        { { PERF_RECORD_SWITCH, 0, 16 }, 2600 },
    };
    for (size_t i = 0; i < sizeof rec / sizeof rec[0]; i++)
        _al_ring_window_add(&rec[i].h, &w);
    ck_assert_uint_eq(w.count[0], 2);
    ck_assert_uint_eq(w.count[1], 1);
    ck_assert_uint_eq(w.count[2], 0);
    ck_assert_uint_eq(w.off_cpu_ns, 1100);

    /* Per op: counts averaged; a clock event's cycles in ns less the time switched out. */
    ck_assert_double_eq_tol(_al_counter_per_op(0, 7, 0, 2, 2.0), 3.5, 1e-12);
    ck_assert_double_eq_tol(_al_counter_per_op(2, 3000, 500, 2, 2.0), 500.0, 1e-9);
    ck_assert_double_eq_tol(_al_counter_per_op(2, 3000, 2000, 2, 2.0), 0.0, 1e-12);
    ck_assert_double_eq_tol(_al_counter_per_op(0, 7, 0, 0, 2.0), 0.0, 1e-12);
    ck_assert_double_eq_tol(_al_counter_per_op(3, 7, 0, 1, 2.0), 0.0, 1e-12);
}
END_TEST

/* A call that sleeps: its context switch is counted, its time off the CPU is taken out of its
 * task-clock (a read(2) of task-clock would also count the reads' own kernel time). */
START_TEST(clock_less_switched_out)
{
    struct al_thread_counters c;
    if (!counting("context-switches,task-clock", &c))
        return;
    ck_assert_int_eq(_al_counters.events[0].kind, AL_EV_RING);
    ck_assert_int_eq(_al_counters.events[1].kind, AL_EV_CLOCK);
    uint64_t sums[AL_MAX_EVENTS] = { 0 }, off = 0;
    struct al_clock_pair a = _al_tsc_pair_now();
    _al_counters_before(&c);
    ck_assert_int_eq(c.state, 1);
    ck_assert_int_eq(c.fd[1], -1); /* a clock event has no fd of its own */
    uint64_t c0 = _al_tsc();
    usleep(20000);
    uint64_t c1 = _al_tsc();
    ck_assert_int_eq(_al_counters_after(&c, c1 - c0, sums, &off), AL_CTR_COUNTED);
    struct al_clock_pair b = _al_tsc_pair_now();
    double cpn = _al_tsc_rate(a, b);
    ck_assert(cpn > 0);
    ck_assert_uint_ge(sums[0], 1);
    double wall = (double)(c1 - c0) / cpn;
    ck_assert_msg(off >= 19000000 && (double)off <= wall, "off the CPU %llu ns of %.0f",
                  (unsigned long long)off, wall);
    double on = _al_counter_per_op(1, sums[1], off, 1, cpn);
    ck_assert_msg(on < 2e6, "task-clock of a 20 ms sleep: %.0f ns", on);
    _al_counters_thread_close(&c, false);
}
END_TEST

/* The ring's window is a little wider than the timed call: a switch just outside the call's
 * two rdtsc is not taken off its cycles (it would take a preemption's milliseconds off a call
 * of nanoseconds). */
START_TEST(switch_outside_call_kept_out)
{
    struct al_thread_counters c;
    if (!counting("task-clock", &c))
        return;
    uint64_t sums[AL_MAX_EVENTS] = { 0 }, off = 0;
    _al_counters_before(&c);
    usleep(20000);
    uint64_t c0 = _al_tsc();
    uint64_t c1 = _al_tsc();
    ck_assert_int_eq(_al_counters_after(&c, c1 - c0 + 1000, sums, &off), AL_CTR_COUNTED);
    ck_assert_uint_eq(off, 0);
    ck_assert_uint_eq(sums[0], c1 - c0 + 1000 - _al_hot.tsc_overhead);
    _al_counters_thread_close(&c, false);
}
END_TEST

/* A call with more records than the ring holds is not counted (some were dropped); the next
 * one is, from a freed ring. */
START_TEST(ring_overflow_not_counted)
{
    struct al_thread_counters c;
    if (!counting("page-faults", &c))
        return;
    uint64_t sums[AL_MAX_EVENTS] = { 0 }, off = 0;
    size_t big = AL_RING_PAGES * page() / 16 + 64;
    char *p = fresh_pages(big);
    _al_counters_before(&c);
    touch(p, big);
    ck_assert_int_eq(_al_counters_after(&c, 0, sums, &off), AL_CTR_DROPPED);
    ck_assert_uint_eq(sums[0], 0);
    struct perf_event_mmap_page *pc = c.ring;
    ck_assert_uint_eq(pc->data_tail, pc->data_head);
    munmap(p, big * page());

    /* Faults between counted calls fill the ring; the next counted call frees it first. */
    touch(fresh_pages(big), big);
    p = fresh_pages(8);
    _al_counters_before(&c);
    touch(p, 8);
    ck_assert_int_eq(_al_counters_after(&c, 0, sums, &off), AL_CTR_COUNTED);
    ck_assert_uint_ge(sums[0], 8);
    ck_assert_uint_le(sums[0], 12);
    _al_counters_thread_close(&c, false);
}
END_TEST

/* ---- read paths --------------------------------------------------------------------------- */

START_TEST(read_rdpmc_software)
{
    int fd = open_event(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS, true);
    if (fd < 0 && (errno == EACCES || errno == EPERM))
        return;
    ck_assert_int_ge(fd, 0);
    void *pg = mmap(NULL, page(), PROT_READ, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(pg, MAP_FAILED);
    uint64_t v = 12345;
    ck_assert_int_eq(_al_counter_read_rdpmc(pg, &v), -EAGAIN);
    ck_assert_uint_eq(v, 12345);
    ck_assert_int_eq(_al_counter_read_rdpmc(NULL, &v), -EAGAIN);
    munmap(pg, page());
    close(fd);

    /* Where there is a PMU and the kernel allows user reads, rdpmc agrees with read(). */
    fd = open_event(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, true);
    if (fd < 0)
        return;
    pg = mmap(NULL, page(), PROT_READ, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(pg, MAP_FAILED);
    uint64_t a, b, f;
    if (_al_counter_read_rdpmc(pg, &a) == 0) {
        ck_assert_int_eq(_al_counter_read_rdpmc(pg, &b), 0);
        ck_assert_uint_ge(b, a);
        ck_assert_int_eq(_al_counter_read_fd(fd, &f), 0);
        ck_assert_uint_ge(f, b);
    }
    munmap(pg, page());
    close(fd);
}
END_TEST

START_TEST(read_fd_monotonic)
{
    int fd = open_event(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, true);
    if (fd < 0 && (errno == EACCES || errno == EPERM))
        return;
    ck_assert_int_ge(fd, 0);
    uint64_t prev = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t v;
        ck_assert_int_eq(_al_counter_read_fd(fd, &v), 0);
        ck_assert_uint_ge(v, prev);
        prev = v;
    }
    uint64_t v;
    volatile uint64_t x = 0;
    for (int i = 0; i < 1000000; i++)
        x += (uint64_t)i;
    ck_assert_int_eq(_al_counter_read_fd(fd, &v), 0);
    ck_assert_uint_gt(v, prev); /* task-clock: nanoseconds this thread ran */
    close(fd);

    fd = open_event(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS, true);
    ck_assert_int_ge(fd, 0);
    uint64_t a, b;
    ck_assert_int_eq(_al_counter_read_fd(fd, &a), 0);
    char *p = fresh_pages(16);
    touch(p, 16);
    ck_assert_int_eq(_al_counter_read_fd(fd, &b), 0);
    ck_assert_uint_ge(b - a, 16);
    close(fd);

    ck_assert_int_eq(_al_counter_read_fd(-1, &v), -EBADF);
}
END_TEST

/* ---- ring buffer -------------------------------------------------------------------------- */

struct ring {
    void *base;
    struct perf_event_mmap_page *meta;
    char *data;
    size_t size, map;
};

static struct ring ring_new(size_t data_size)
{
    struct ring r;
    r.size = data_size;
    r.map = page() + data_size;
    r.base = mmap(NULL, r.map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(r.base, MAP_FAILED);
    r.meta = r.base;
    r.data = (char *)r.base + page();
    return r;
}

/* Writes a record at position POS (wrapping): header, then bytes derived from SEQ. */
static void ring_put(struct ring *r, uint64_t pos, uint16_t size, uint16_t seq)
{
    char rec[65536];
    struct perf_event_header h = { .type = PERF_RECORD_SAMPLE, .misc = seq, .size = size };
    memcpy(rec, &h, sizeof h);
    for (size_t j = sizeof h; j < size; j++)
        rec[j] = (char)(seq * 31 + j);
    for (size_t j = 0; j < size; j++)
        r->data[(pos + j) & (r->size - 1)] = rec[j];
}

struct seen {
    bool unaligned; /* records of sizes that are not multiples of 8 */
    unsigned n;
    uint16_t sizes[64];
    bool bad;
};

static void check_rec(const struct perf_event_header *h, void *arg)
{
    struct seen *s = arg;
    if (!s->unaligned && (uintptr_t)h % 8)
        s->bad = true;
    if (h->type != PERF_RECORD_SAMPLE || h->misc != s->n || h->size != s->sizes[s->n])
        s->bad = true;
    const unsigned char *b = (const unsigned char *)h;
    for (size_t j = sizeof *h; j < h->size; j++)
        if (b[j] != (unsigned char)(h->misc * 31 + j))
            s->bad = true;
    s->n++;
}

START_TEST(ring_synthetic)
{
    struct ring r = ring_new(4096);
    /* Positions far past the first lap, so only their low bits index the data. */
    static const uint16_t sizes[] = { 40, 24, 3000, 16, 32, 1000, 8, 56, 2000, 4096, 48, 24 };
    enum { NREC = sizeof sizes / sizeof sizes[0] };
    struct seen s = { .unaligned = false };
    memcpy(s.sizes, sizes, sizeof sizes);

    uint64_t pos = 5 * 4096 - 80; /* the third record wraps */
    r.meta->data_tail = pos;
    unsigned delivered = 0;
    for (unsigned i = 0; i < NREC; i++) {
        /* Fill as much as fits, drain, repeat: the way the kernel and a reader alternate. */
        if (pos + sizes[i] - r.meta->data_tail > r.size) {
            r.meta->data_head = pos;
            int n = _al_perf_ring_drain(r.base, r.size, check_rec, &s);
            ck_assert_int_ge(n, 1);
            delivered += (unsigned)n;
            ck_assert_uint_eq(r.meta->data_tail, pos);
        }
        ring_put(&r, pos, sizes[i], (uint16_t)i);
        pos += sizes[i];
    }
    r.meta->data_head = pos;
    int n = _al_perf_ring_drain(r.base, r.size, check_rec, &s);
    ck_assert_int_ge(n, 1);
    delivered += (unsigned)n;
    ck_assert_uint_eq(delivered, NREC);
    ck_assert_uint_eq(s.n, NREC);
    ck_assert(!s.bad);
    ck_assert_uint_eq(r.meta->data_tail, pos);

    /* Empty: nothing delivered, tail unchanged. */
    ck_assert_int_eq(_al_perf_ring_drain(r.base, r.size, check_rec, &s), 0);
    ck_assert_uint_eq(r.meta->data_tail, pos);

    /* A header split by the wrap (sizes that are not multiples of 8): a 12-byte record ending
     * 4 bytes before the end of the data, then a 20-byte one whose header is cut 4 + 4. */
    struct seen s2 = { .unaligned = true };
    s2.sizes[0] = 12;
    s2.sizes[1] = 20;
    pos = 7 * 4096 - 16;
    ring_put(&r, pos, 12, 0);
    ring_put(&r, pos + 12, 20, 1);
    r.meta->data_tail = pos;
    r.meta->data_head = pos + 32;
    ck_assert_int_eq(_al_perf_ring_drain(r.base, r.size, check_rec, &s2), 2);
    ck_assert_uint_eq(s2.n, 2);
    ck_assert(!s2.bad);
    ck_assert_uint_eq(r.meta->data_tail, pos + 32);
    pos += 32;

    /* The metadata page says where the data is, when it says so. */
    r.meta->data_offset = page();
    r.meta->data_size = r.size;
    struct seen s3 = { .unaligned = false };
    s3.sizes[0] = 64;
    ring_put(&r, pos, 64, 0);
    r.meta->data_head = pos + 64;
    ck_assert_int_eq(_al_perf_ring_drain(r.base, r.size, check_rec, &s3), 1);
    ck_assert(!s3.bad);
    munmap(r.base, r.map);
}
END_TEST

static void count_rec(const struct perf_event_header *h, void *arg)
{
    (*(unsigned *)arg)++;
}

START_TEST(ring_malformed)
{
    struct ring r = ring_new(4096);
    unsigned n = 0;

    /* A good record, then one of size 0: the first is delivered, then -EINVAL, and the rest
     * is dropped so the ring does not stay stuck. */
    ring_put(&r, 100, 32, 0);
    memset(r.data + 132, 0, 8);
    r.meta->data_tail = 100;
    r.meta->data_head = 300;
    ck_assert_int_eq(_al_perf_ring_drain(r.base, r.size, count_rec, &n), -EINVAL);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(r.meta->data_tail, 300);

    /* Larger than the data area. */
    n = 0;
    struct perf_event_header h = { .type = PERF_RECORD_SAMPLE, .size = 8192 - 8 };
    memcpy(r.data, &h, sizeof h);
    r.meta->data_tail = 4096;
    r.meta->data_head = 4096 + 64;
    ck_assert_int_eq(_al_perf_ring_drain(r.base, r.size, count_rec, &n), -EINVAL);
    ck_assert_uint_eq(n, 0);

    /* Running past data_head. */
    ring_put(&r, 0, 128, 0);
    r.meta->data_tail = 0;
    r.meta->data_head = 64;
    ck_assert_int_eq(_al_perf_ring_drain(r.base, r.size, count_rec, &n), -EINVAL);
    ck_assert_uint_eq(n, 0);

    /* A data size that is not a power of two. */
    r.meta->data_tail = r.meta->data_head = 0;
    ck_assert_int_eq(_al_perf_ring_drain(r.base, 3000, count_rec, &n), -EINVAL);
    ck_assert_int_eq(_al_perf_ring_drain(NULL, 4096, count_rec, &n), -EINVAL);
    munmap(r.base, r.map);
}
END_TEST

struct fault_check {
    uintptr_t lo, hi;
    unsigned samples, inside;
};

static void fault_rec(const struct perf_event_header *h, void *arg)
{
    struct fault_check *f = arg;
    if (h->type != PERF_RECORD_SAMPLE)
        return;
    f->samples++;
    const uint64_t *body = (const uint64_t *)(h + 1); /* ip, addr */
    if (h->size >= sizeof *h + 16 && body[1] >= f->lo && body[1] < f->hi)
        f->inside++;
}

START_TEST(ring_real_page_faults)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_PAGE_FAULTS;
    a.sample_period = 1;
    a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_ADDR;
    a.disabled = 1;
    a.exclude_kernel = 1; /* the faults are taken on user accesses: user regs, still sampled */
    a.exclude_hv = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0 && (errno == EACCES || errno == EPERM))
        return;
    ck_assert_msg(fd >= 0, "perf_event_open: %s", strerror(errno));
    size_t data = 8 * page();
    void *base = mmap(NULL, page() + data, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(base, MAP_FAILED);

    enum { N = 16 };
    char *p = fresh_pages(N);
    ck_assert_int_eq(ioctl(fd, PERF_EVENT_IOC_ENABLE, 0), 0);
    touch(p, N);
    ck_assert_int_eq(ioctl(fd, PERF_EVENT_IOC_DISABLE, 0), 0);

    struct fault_check f = { (uintptr_t)p, (uintptr_t)p + N * page(), 0, 0 };
    int n = _al_perf_ring_drain(base, data, fault_rec, &f);
    ck_assert_int_ge(n, N);
    ck_assert_uint_ge(f.samples, N);
    ck_assert_msg(f.inside >= N, "%u of %u samples inside the touched pages", f.inside, f.samples);
    struct perf_event_mmap_page *pc = base;
    ck_assert_uint_eq(pc->data_tail, pc->data_head);
    ck_assert_int_eq(_al_perf_ring_drain(base, data, fault_rec, &f), 0);

    munmap(base, page() + data);
    close(fd);
}
END_TEST

static Suite *counters_suite(void)
{
    Suite *s = suite_create("counters");
    TCase *t = tcase_create("resolve");
    tcase_add_test(t, resolve_valid);
    tcase_add_test(t, resolve_invalid);
    tcase_add_test(t, resolve_ahead_roundtrip);
    suite_add_tcase(s, t);
    t = tcase_create("init");
    tcase_add_test(t, init_default_set);
    tcase_add_test(t, init_user_events);
    suite_add_tcase(s, t);
    t = tcase_create("count");
    tcase_add_test(t, count_page_faults);
    tcase_add_test(t, count_default_set);
    tcase_add_test(t, fork_child_reopens);
    tcase_add_test(t, ring_window_records);
    tcase_add_test(t, clock_less_switched_out);
    tcase_add_test(t, switch_outside_call_kept_out);
    tcase_add_test(t, ring_overflow_not_counted);
    tcase_add_test(t, read_rdpmc_software);
    tcase_add_test(t, read_fd_monotonic);
    suite_add_tcase(s, t);
    t = tcase_create("ring");
    tcase_add_test(t, ring_synthetic);
    tcase_add_test(t, ring_malformed);
    tcase_add_test(t, ring_real_page_faults);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return al_check_run(counters_suite());
}
