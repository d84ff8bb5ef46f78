/* Gathering the report of this process image and writing it where the settings say.
 *
 * The main process writes OUTPUT itself and the human report; every other process of the run
 * (forked children, images replaced by exec) writes OUTPUT.<pid>.json beside it, taking the
 * next free OUTPUT.<pid>.<n>.json when an earlier image of the same pid already wrote one (or
 * OUTPUT itself where it is not a regular file, such as /dev/null).
 * Everything here works from mmap'd memory: threads still running keep using the allocator.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "profiler.h"

static _Atomic int written, finished;

const struct al_ending_signal _al_ending_signals[AL_ENDING_SIGNALS] = {
    { SIGHUP, false }, { SIGINT, false }, { SIGQUIT, false }, { SIGPIPE, false }, /* asked to stop */
    { SIGALRM, false }, { SIGTERM, false }, { SIGUSR1, false }, { SIGUSR2, false },
    { SIGXCPU, false }, { SIGXFSZ, false },                                       /* over a limit */
    { SIGABRT, true }, { SIGSEGV, true }, { SIGBUS, true }, { SIGFPE, true }, { SIGILL, true },
};
static struct al_clock_pair image_start;
static char exec_report_path[PATH_MAX + 64] AL_LARGE_BSS;
/* The command line as the image started, whole: programs rewrite theirs (redis sets a process
 * title over it), and the report must name what was run. NUL-terminated arguments, as
 * /proc/self/cmdline has them. */
static char *cmdline;
static size_t cmdline_len;

void _al_report_restart(int argc, char *const argv[])
{
    atomic_store(&written, 0);
    image_start = _al_tsc_pair_now();
    if (!argv)
        return; /* a forked child runs the same command line */
    _al_stderr_note(_al_settings.stderr_id);
    size_t len = 0;
    for (int i = 0; i < argc && argv[i]; i++)
        len += strlen(argv[i]) + 1;
    cmdline = len ? _al_mem_map(len) : NULL;
    cmdline_len = 0;
    for (int i = 0; cmdline && i < argc && argv[i]; i++) {
        size_t n = strlen(argv[i]) + 1;
        memcpy(cmdline + cmdline_len, argv[i], n);
        cmdline_len += n;
    }
}

static void read_cmdline(struct al_report *r)
{
    r->argv = cmdline ? cmdline : "";
    r->argv_len = cmdline_len;
}

/* --mode sample tells neither reuse nor a free's size class, and times nothing (the report
 * has no histograms: a call timed was counted in its row's `timed`, cleared here); calls counted
 * before the mode was known (another library's constructor allocating before ours read the
 * environment) were counted as full mode counts them, and are folded into the rows this mode
 * has. */
static void sample_mode_rows(struct al_report *r)
{
    for (unsigned i = 0; i < AL_ROWS; i++) {
        unsigned op, large, reuse, phase;
        _al_row_split(i, &op, &large, &reuse, &phase);
        unsigned to = _al_row_index(op, op == AL_OP_FREE || op == AL_OP_DELETE ? 0 : large,
                                    AL_REUSE_NA, phase);
        r->rows[i].timed = r->rows[i].cycles = 0;
        if (to != i) {
            r->rows[to].count += r->rows[i].count;
            r->rows[i].count = 0;
        }
    }
}

static void gather(struct al_report *r, enum al_report_kind kind, bool has_status, int status)
{
    r->pid = getpid();
    read_cmdline(r);
    r->has_exit_status = has_status;
    r->exit_status = has_status ? status : 0;
    r->end_signal = kind == AL_REPORT_SIGNAL ? status : 0;
    struct al_clock_pair now = _al_tsc_pair_now();
    r->cycles_per_ns = _al_tsc_rate(_al_tsc_start(), now);
    if (r->cycles_per_ns == 0.0) {
        /* A very short run: spend a millisecond now so the rate is good to 0.1%. */
        struct al_clock_pair a = _al_tsc_pair_now(), b;
        do
            b = _al_tsc_pair_now();
        while (b.ns - a.ns < 1000000);
        r->cycles_per_ns = _al_tsc_rate(a, b);
        now = b;
    }
    r->runtime_ns = now.ns - image_start.ns;
    r->allocator = _al_allocator;
    r->large_threshold = _al_hot.large_threshold;
    _al_threads_collect(r->rows, r->hist, &r->threads, &r->measure);
    if (!_al_hot.timed) {
        sample_mode_rows(r);
    } else if (atomic_load(&_al_first.taken)) {
        r->first_excluded = true;
        r->first_in_run = _al_first.start >= image_start.tsc;
        r->first_row = _al_first.row;
        r->first_cycles = _al_first.cycles;
    }
    _al_waste_final();
    if (_al_sampler.enabled)
        _al_sampler_collect();
    r->start_tsc = image_start.tsc;
    r->shadow_bytes = _al_shadow_footprint();
    r->profiler_bytes = _al_mem_footprint() + r->shadow_bytes;
    /* Read before the symbolizer runs: what it takes is its own process's. */
    long hwm = _al_proc_status("VmHWM");
    r->peak_rss_bytes = hwm > 0 ? (size_t)hwm * 1024 : 0;
}

void _al_report_syscall_total(const struct al_report *r, unsigned k, uint64_t *count, uint64_t *cycles)
{
    *count = *cycles = 0;
    for (unsigned i = 0; i < AL_OP_COUNT * 2; i++) {
        *count += r->measure.sys.count[k][i];
        *cycles += r->measure.sys.cycles[k][i];
    }
}

double _al_report_counter(const struct al_report *r, unsigned op, unsigned e)
{
    return _al_counter_per_op(e, r->measure.ctr_sums[op][e], r->measure.ctr_off_cpu_ns[op],
                              r->measure.ctr_ops[op], r->cycles_per_ns);
}

double _al_report_ns(const struct al_report *r, double cycles)
{
    return r->cycles_per_ns > 0 ? cycles / r->cycles_per_ns : 0.0;
}

uint64_t _al_report_alloc_cycles(const struct al_report *r)
{
    /* The first call is the allocator's: in the run's time only where it was made in the run
     * (jemalloc's start-up, made before, was 139% of /bin/true's run time). */
    uint64_t cycles = r->first_excluded && r->first_in_run ? r->first_cycles : 0;
    for (unsigned i = 0; i < AL_ROWS; i++)
        cycles += r->rows[i].cycles;
    return cycles;
}

void _al_report_row(const struct al_report *r, unsigned i, struct al_row_stats *s)
{
    const struct al_row *row = &r->rows[i];
    unsigned op, large, reuse, phase;
    _al_row_split(i, &op, &large, &reuse, &phase);
    s->op = _al_op_name(op);
    /* --mode sample does not look a freed object up: its size class is not known. */
    s->size_class = !_al_hot.timed && (op == AL_OP_FREE || op == AL_OP_DELETE) ? "unknown" : large ? "large" : "small";
    s->reuse = _al_reuse_name(reuse);
    s->phase = _al_phase_name(phase);
    s->mean = row->timed ? (double)row->cycles / (double)row->timed : 0.0;
    s->p50 = s->p99 = s->p999 = 0;
    if (!r->hist) /* --mode sample times nothing */
        return;
    const uint64_t *h = r->hist + (size_t)i * AL_HIST_BUCKETS;
    /* Percentiles of the calls the histogram holds: all timed ones, unless memory ran out. */
    uint64_t binned = 0;
    for (unsigned b = 0; b < AL_HIST_BUCKETS; b++)
        binned += h[b];
    s->p50 = _al_hist_quantile(h, binned, 0.50);
    s->p99 = _al_hist_quantile(h, binned, 0.99);
    s->p999 = _al_hist_quantile(h, binned, 0.999);
}

/* Whether FD is open on the same file as ST (by device and inode). */
static bool same_file(int fd, const struct stat *st)
{
    struct stat o;
    return fd >= 0 && fstat(fd, &o) == 0 && o.st_dev == st->st_dev && o.st_ino == st->st_ino;
}

#define NOT_A_STREAM (-2)

/* The program's descriptor that PATH names (/dev/stdout, /dev/stderr, /dev/fd/N,
 * /proc/self/fd/N), NOT_A_STREAM for any other path. Its stderr is the one the run began with,
 * kept (log.c): -1 where the program put a file of its own there, which gets nothing of ours.
 * Written through, not opened again: a socket (journald's streams) cannot be opened by its
 * name, and the program may have closed its fd 2. */
static int stream_fd(const char *path)
{
    if (!strcmp(path, "/dev/stdout"))
        return STDOUT_FILENO;
    if (!strcmp(path, "/dev/stderr"))
        return _al_stderr_fd();
    const char *n = !strncmp(path, "/dev/fd/", 8) ? path + 8 : !strncmp(path, "/proc/self/fd/", 14) ? path + 14 : NULL;
    char *end;
    long fd = n && *n >= '0' && *n <= '9' ? strtol(n, &end, 10) : -1;
    if (fd < 0 || *end || fd > INT_MAX)
        return NOT_A_STREAM;
    return fd == STDERR_FILENO ? _al_stderr_fd() : (int)fd;
}

/* PATH opened for a report, and how: *FRESH where it is a regular file of its own, emptied
 * (a failed write may remove it). A file that is one of the program's standard streams
 * (--text /dev/stderr, -o /dev/stdout on a log file) is written through the program's own
 * descriptor, where the program writes next, never emptied nor removed: what its stdio still
 * holds at exit then follows the report instead of overwriting it. A FIFO with no reader is an
 * error (ENXIO) rather than a wait, with the ending signals blocked, that nothing but SIGKILL
 * ends. -1 with errno. */
static int open_report(const char *path, bool *fresh)
{
    *fresh = false;
    int stream = stream_fd(path);
    if (stream != NOT_A_STREAM) {
        int flags = stream >= 0 ? fcntl(stream, F_GETFL) : -1;
        errno = flags < 0 ? EBADF : EACCES; /* closed (or the program's own stderr); read-only */
        return flags >= 0 && (flags & O_ACCMODE) != O_RDONLY ? fcntl(stream, F_DUPFD_CLOEXEC, 3) : -1;
    }
    /* No controlling terminal taken, where PATH is one and this a session leader. */
    int fd = open(path, O_WRONLY | O_CREAT | O_NOCTTY | O_CLOEXEC | O_NONBLOCK, 0644);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return fd;
    if (S_ISREG(st.st_mode)) {
        const int streams[] = { STDOUT_FILENO, STDERR_FILENO, _al_stderr_fd() };
        for (unsigned i = 0; i < 3; i++)
            if (streams[i] != fd && same_file(streams[i], &st) &&
                (fcntl(streams[i], F_GETFL) & O_ACCMODE) != O_RDONLY) {
                close(fd);
                return fcntl(streams[i], F_DUPFD_CLOEXEC, 3);
            }
        *fresh = ftruncate(fd, 0) == 0;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* OUTPUT.<pid>.json, or OUTPUT.<pid>.<n>.json when taken; opened with O_EXCL, *MADE set. Where
 * OUTPUT is there and not a regular file (-o /dev/null, a pipe), or names one of the program's
 * streams (-o /dev/stdout), OUTPUT itself: no file is made beside it (in /dev), and none may be
 * removed (a failed exec's, _al_report_forget_exec). */
static int open_side_report(const char *output, pid_t pid, char *path, size_t cap, bool *made)
{
    struct stat st;
    bool fresh;
    *made = false;
    /* -o /dev/stdout, /dev/null, a FIFO: every process's report there, opened as the main one's
     * is (a FIFO without a reader is no wait). */
    if (stream_fd(output) != NOT_A_STREAM || (stat(output, &st) == 0 && !S_ISREG(st.st_mode))) {
        snprintf(path, cap, "%s", output);
        return open_report(path, &fresh);
    }
    *made = true;
    size_t len = strlen(output);
    const char *ext = "";
    if (len > 5 && strcmp(output + len - 5, ".json") == 0) {
        ext = ".json";
        len -= 5;
    }
    for (int n = 0; n < 1000; n++) {
        int w = n == 0 ? snprintf(path, cap, "%.*s.%d%s", (int)len, output, (int)pid, ext)
                       : snprintf(path, cap, "%.*s.%d.%d%s", (int)len, output, (int)pid, n, ext);
        if (w < 0 || (size_t)w >= cap) { /* a name cut short would be another file's */
            snprintf(path, cap, "%.*s.%d%s", (int)len, output, (int)pid, ext);
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    return -1;
}

/* The text MAKE writes for R, to FD as it is made (-1: its open failed, errno says why). FD is
 * ours where OWN: closed after, and a failure told naming PATH (stderr full or gone leaves
 * nowhere to say so). FRESH: FD is a regular file of its own at PATH, to be removed if the
 * report is cut short. ENDING: the buffer is kept, as write_report says. */
static void write_to(int fd, const char *path, bool own, bool fresh,
                     void (*make)(struct al_buf *, const struct al_report *), const struct al_report *r, bool ending)
{
    int e = fd < 0 ? -errno : 0;
    if (fd >= 0) {
        struct al_buf b = { 0 };
        _al_buf_stream(&b, fd);
        make(&b, r);
        e = _al_buf_finish(&b);
        if (!ending)
            _al_buf_free(&b);
    }
    if (!own)
        return;
    /* A report cut short (a full disk, the program's file size limit) is not left to be read
     * as a whole one: its file is removed, and the line says so; only where PATH is still that
     * file itself (not a link to it, which would be what is removed). */
    struct stat st;
    bool cut = e < 0 && fresh && lstat(path, &st) == 0 && S_ISREG(st.st_mode) && same_file(fd, &st) &&
               unlink(path) == 0;
    if (fd >= 0)
        close(fd);
    /* A path of thousands of bytes would push the reason out of the line: its end is shown. */
    size_t len = strlen(path);
    bool fifo = e == -ENXIO && stat(path, &st) == 0 && S_ISFIFO(st.st_mode);
    if (e < 0)
        _al_log("cannot write the report to %s%s: %s%s", len > 400 ? "..." : "", len > 400 ? path + len - 400 : path,
                fifo ? "a FIFO with no reader" : e == -EBADF ? "the program has closed it" : strerror(-e),
                cut ? " (the part written is removed)" : "");
}

struct write_args {
    enum al_report_kind kind;
    bool has_status;
    int status;
    bool main_image; /* the run's main process at its exit: writes OUTPUT itself, text, pprof */
};

static void write_report(struct write_args *w)
{
    enum al_report_kind kind = w->kind;
    bool has_status = w->has_status, main_image = w->main_image;
    /* A process that is ending keeps the report's memory: unmapping it would be system calls,
     * with TLB shootdowns to the CPUs the process ran on, for memory its exit frees anyway. */
    bool ending = kind != AL_REPORT_EXEC;
    int status = w->status;
    struct al_thread *t = _al_tls;
    int was_busy = t ? t->busy : 0;
    if (t)
        t->busy = 1;

    struct al_report *r = NULL;
    uint64_t *hist = NULL;
    struct rlimit nofile;
    bool room = false, can_say;
    const char *refused = _al_seccomp_refuses_report(&can_say);
    if (refused) {
        if (can_say)
            _al_log("no report: %s", refused);
        goto out;
    }
    room = _al_fds_report_room(&nofile);
    /* Before the report's own memory could raise the process's peak RSS. */
    _al_sampler_report_begins();
    r = _al_mem_map(sizeof *r);
    /* --mode sample has no histograms to gather (a table of them is 150 pages to clear, more
     * than the rest of a short program's run under alloclens touches). */
    if (_al_hot.timed)
        hist = _al_mem_map((size_t)AL_ROWS * AL_HIST_BUCKETS * sizeof(uint64_t));
    if (!r || (_al_hot.timed && !hist)) {
        _al_log("out of memory while gathering the report: no report written");
        goto out;
    }
    r->hist = hist;
    gather(r, kind, has_status, status);
    /* The sites' frames are named once for every writer below: from debug information in the
     * main process (the only one to write text and pprof), else the dynamic symbol table. */
    if (_al_sampler.enabled)
        _al_symbols_begin(main_image);

    if (_al_settings.output) {
        static char path[PATH_MAX + 64] AL_LARGE_BSS;
        int fd;
        bool made = false, fresh;
        if (main_image) {
            snprintf(path, sizeof path, "%s", _al_settings.output);
            fd = open_report(path, &fresh);
        } else {
            fd = open_side_report(_al_settings.output, r->pid, path, sizeof path, &made);
            fresh = made;
        }
        write_to(fd, path, true, fresh, _al_report_json, r, ending);
        if (kind == AL_REPORT_EXEC && fd >= 0 && made)
            snprintf(exec_report_path, sizeof exec_report_path, "%s", path);
    }
    if (main_image && _al_settings.pprof)
        _al_report_pprof(_al_settings.pprof, r->runtime_ns);
    if (main_image && _al_settings.text) {
        if (strcmp(_al_settings.text, "-") == 0) {
            int fd = _al_stderr_fd();
            if (fd >= 0)
                write_to(fd, "stderr", false, false, _al_report_text, r, ending);
        } else {
            bool fresh;
            int fd = open_report(_al_settings.text, &fresh);
            write_to(fd, _al_settings.text, true, fresh, _al_report_text, r, ending);
        }
    }
out:
    if (room)
        _al_fds_report_done(&nofile);
    if (hist && !ending)
        _al_mem_unmap(hist, (size_t)AL_ROWS * AL_HIST_BUCKETS * sizeof(uint64_t));
    if (r && !ending)
        _al_mem_unmap(r, sizeof *r);
    if (t && !was_busy)
        _al_unbusy(t);
}

/* The report is gathered and formatted on a stack of its own: exit() or exec may come from a
 * thread whose stack is as small as PTHREAD_STACK_MIN. */
#define REPORT_STACK (256u << 10)

static struct write_args pending;
static ucontext_t caller_ctx, report_ctx;

static void report_on_own_stack(void)
{
    write_report(&pending);
}

/* Whether the process ending as KIND (exit or a signal) is the run's main one. */
static bool main_at_end(enum al_report_kind kind)
{
    return kind != AL_REPORT_EXEC && getpid() == _al_settings.main_pid;
}

/* Whether a process ending as KIND has anything to write: OUTPUT, or the main image's text or
 * pprof (a shell's subshells, without -o, have nothing). */
static bool planned(enum al_report_kind kind)
{
    return _al_settings.output || (main_at_end(kind) && (_al_settings.text || _al_settings.pprof));
}

bool _al_report_planned(void)
{
    return planned(AL_REPORT_EXIT);
}

void _al_report_stderr_closing(void)
{
    if (planned(AL_REPORT_EXIT) && _al_stderr_copy_due())
        _al_stderr_keep(_al_fd_high(fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3)));
}

bool _al_report_writes_pprof(void)
{
    return _al_settings.pprof && main_at_end(AL_REPORT_EXIT);
}

static void write_on_own_stack(enum al_report_kind kind, bool has_status, int status)
{
    if (!planned(kind))
        return; /* nothing to gather */
    /* A side process's only output is its JSON, written only where it made calls: a program
     * that allocates nothing (a shell's /bin/true) has no report, and gathers nothing. */
    if (!main_at_end(kind) && _al_threads_calls() == 0)
        return;
    pending = (struct write_args){ kind, has_status, status, main_at_end(kind) };
    void *stack = _al_mem_map(REPORT_STACK);
    if (!stack || getcontext(&report_ctx) < 0) {
        write_report(&pending); /* no memory for a stack: try on the caller's */
        return;
    }
    report_ctx.uc_stack.ss_sp = stack;
    report_ctx.uc_stack.ss_size = REPORT_STACK;
    report_ctx.uc_link = &caller_ctx;
    makecontext(&report_ctx, report_on_own_stack, 0);
    if (swapcontext(&caller_ctx, &report_ctx) < 0)
        write_report(&pending);
    if (kind == AL_REPORT_EXEC) /* kept by a process that is ending, as write_report says */
        _al_mem_unmap(stack, REPORT_STACK);
}

__thread bool _al_reporting __attribute__((tls_model("initial-exec")));

void _al_report_write(enum al_report_kind kind, bool has_status, int status)
{
    if (atomic_exchange(&written, 1))
        return;
    atomic_store(&finished, 0); /* a first try, or another after an exec that failed */
    /* One arriving now waits for the report to be whole (then ends the process as it would). */
    sigset_t ending, old;
    sigemptyset(&ending);
    for (unsigned i = 0; i < AL_ENDING_SIGNALS; i++)
        sigaddset(&ending, _al_ending_signals[i].sig);
    pthread_sigmask(SIG_BLOCK, &ending, &old);
    /* Calls the C library makes for the report (few are left) are not the program's.
     * write_report marks the thread's state busy; a thread with none (one that never
     * allocated, or whose exit callback ran: exit() runs those before its handlers) gets none
     * made for them, they are forwarded (_al_enter_slow). Counted, one sampled while the sites are made under the
     * sampler's lock would wait on it for ever. */
    _al_reporting = true;
    write_on_own_stack(kind, has_status, status);
    _al_reporting = false;
    atomic_store(&finished, 1);
    _al_signals_restore(&old);
}

void _al_report_wait_written(unsigned ms)
{
    const struct timespec tick = { 0, 1000000 };
    for (unsigned i = 0; i < ms && atomic_load(&written) && !atomic_load(&finished); i++)
        nanosleep(&tick, NULL);
}

void _al_report_forget_exec(void)
{
    /* The exec failed and this image goes on: its report will be written at exit instead. */
    if (exec_report_path[0])
        unlink(exec_report_path);
    exec_report_path[0] = '\0';
    atomic_store(&written, 0);
}
