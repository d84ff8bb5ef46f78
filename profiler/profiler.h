/* profiler/ internal API: what the interposer forwards to, and what the report writers read.
 *
 * Declarations are grouped by the file that defines them. Everything here is internal to the
 * shared library (hidden visibility): the only exported symbols are the interposed entry points.
 */
#ifndef ALLOCLENS_PROFILER_H
#define ALLOCLENS_PROFILER_H

#include <elf.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <ucontext.h>

#include "alloc_config.h"
#include "counters.h"
#include "shadow.h"
#include "spin.h"

struct al_thread;
struct al_settings;

#define AL_LIKELY(x) __builtin_expect(!!(x), 1)
#define AL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define AL_NOINLINE __attribute__((noinline))
#define AL_COLD __attribute__((cold, noinline))
#define AL_INLINE static inline __attribute__((always_inline))
#define AL_HIDDEN __attribute__((visibility("hidden")))

/* Counters only their thread writes and another may read at report time. Read relaxed; added
 * to with one add to memory, an aligned 8-byte store as whole to a reader as a relaxed store
 * (the compiler makes a relaxed load, add and store three instructions, on every call's path). */
#define AL_READ(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define AL_BUMP(x, v)                                                                \
    do {                                                                             \
        _Static_assert(sizeof(x) == 8, "a 64-bit counter");                          \
        __asm__("addq %1, %0" : "+m"(x) : "er"((uint64_t)(v)));                      \
    } while (0)

/* ---- ops.c: the operation kinds and the ops-table row layout -------------------------------- */

enum al_op {
    AL_OP_MALLOC,
    AL_OP_CALLOC,
    AL_OP_REALLOC,
    AL_OP_FREE,
    AL_OP_POSIX_MEMALIGN,
    AL_OP_ALIGNED_ALLOC,
    AL_OP_MEMALIGN,
    AL_OP_VALLOC,
    AL_OP_PVALLOC,
    AL_OP_NEW,
    AL_OP_DELETE,
    AL_OP_COUNT
};

enum al_reuse { AL_REUSE_NEW, AL_REUSE_REUSED, AL_REUSE_NA, AL_REUSE_COUNT };
enum al_phase { AL_PHASE_SERIAL, AL_PHASE_PARALLEL, AL_PHASE_COUNT };

#define AL_ROWS (AL_OP_COUNT * 2 * AL_REUSE_COUNT * AL_PHASE_COUNT)

AL_INLINE unsigned _al_row_index(unsigned op, unsigned large, unsigned reuse, unsigned phase)
{
    return ((op * 2 + large) * AL_REUSE_COUNT + reuse) * AL_PHASE_COUNT + phase;
}

const char *_al_op_name(unsigned op);
const char *_al_reuse_name(unsigned reuse);
const char *_al_phase_name(unsigned phase);
void _al_row_split(unsigned row, unsigned *op, unsigned *large, unsigned *reuse, unsigned *phase);

/* ---- hist.c: log-linear latency histograms ------------------------------------------------- */

/* Values below 2^AL_HIST_SUB_BITS are exact; above, each power of two is split into
 * 2^AL_HIST_SUB_BITS buckets (relative error of a bucket midpoint at most 1/32). */
#define AL_HIST_SUB_BITS 4
#define AL_HIST_SUB (1u << AL_HIST_SUB_BITS)
#define AL_HIST_MAX_EXP 40 /* 2^40 cycles: several minutes; larger values land in the top bucket */
#define AL_HIST_BUCKETS (AL_HIST_SUB + (AL_HIST_MAX_EXP - AL_HIST_SUB_BITS) * AL_HIST_SUB)

AL_INLINE unsigned _al_hist_bucket(uint64_t v)
{
    if (v < AL_HIST_SUB)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v);
    if (AL_UNLIKELY(e >= AL_HIST_MAX_EXP))
        return AL_HIST_BUCKETS - 1;
    /* v's top AL_HIST_SUB_BITS + 1 bits: the leading 1 stands for the AL_HIST_SUB exact
     * buckets below, the rest pick the sub-bucket. */
    return (e - AL_HIST_SUB_BITS) * AL_HIST_SUB + (unsigned)(v >> (e - AL_HIST_SUB_BITS));
}

uint64_t _al_hist_bucket_low(unsigned b);
uint64_t _al_hist_bucket_high(unsigned b);
/* Value at quantile q (0 < q <= 1) of a histogram holding n samples: the midpoint of the
 * bucket holding the ceil(q*n)-th smallest sample; 0 for an empty histogram. */
uint64_t _al_hist_quantile(const uint64_t *buckets, uint64_t n, double q);
/* The rank of quantile Q among N samples: ceil(q*n), within 1..n; 0 where n is. */
uint64_t _al_hist_rank(uint64_t n, double q);

/* SplitMix64's finaliser: 64 well-mixed bits from any 64 (the sampler's generator, pprof's
 * hash tables). */
AL_INLINE uint64_t _al_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Fibonacci hashing: the top BITS bits of X times 2^64 / phi, for tables indexed by address. */
AL_INLINE uint64_t _al_fib_hash(uint64_t x, unsigned bits)
{
    return (x * 0x9e3779b97f4a7c15ull) >> (64 - bits);
}

/* Buckets of _al_hot.sample_pages: a page's number modulo AL_SAMPLE_PAGES, so the pages of
 * any 16 MiB of heap each have a bucket of their own. A free finds its bit with two shifts and
 * a mask. The same page of heaps 16 MiB apart (glibc's 64 MiB arenas) shares a bucket: a free
 * there may look for its address among the sampler's in vain, which is rare next to the
 * instructions a fold of the higher bits would add to every free. */
#define AL_SAMPLE_PAGES 4096

AL_INLINE unsigned _al_sample_page(const void *p)
{
    uintptr_t page = (uintptr_t)p >> 12;
    return (unsigned)page & (AL_SAMPLE_PAGES - 1);
}

/* The globals every allocation call reads, on one page of their own (record.c). Beyond its
 * instructions, a call costs the program misses on what it touches while the program's own
 * data crowds it out of the caches and the TLB: a forwarding shim that reads a line on each
 * of five pages per call cost malloc_bench about 6% more than one that reads none. So an
 * allocation call touches this page, the first page of the thread's state, the GOT entry of
 * that state's TLS slot and the allocator's entry points, and nothing else. (Against globals
 * on three pages, the free path's table on a fourth and its row on the state's second page,
 * --mode sample measured 0.99x: within the noise of these machines.) */
struct al_hot {
    /* timed: every call is timed (--mode full, the default, and --mode time); records: every
     * object has a record (--mode full). --mode sample only counts calls and samples
     * allocation sites. */
    bool timed, records;
    _Atomic bool parallel; /* more than one thread is live: the phase of a call (thread.c) */
    uint64_t large_threshold;
    uint64_t tsc_overhead; /* cycles a back-to-back rdtsc pair reports: what every timed call
                              over-counts (measured at start-up) */
    /* A bit per bucket of pages (_al_sample_page) holding a live sampled object, outside
     * --mode full (sampler.c): a free or realloc looks here before it looks for its address
     * among the sampler's.
     * Lines of their own: a sample's update of a word leaves the fields above, read by every
     * call on every CPU, in their caches. */
    _Alignas(64) _Atomic uint64_t sample_pages[AL_SAMPLE_PAGES / 64];
};

extern struct al_hot _al_hot AL_HIDDEN;

AL_INLINE bool _al_sample_page_maybe(const void *p)
{
    unsigned b = _al_sample_page(p);
    return (atomic_load_explicit(&_al_hot.sample_pages[b / 64], memory_order_relaxed) >> (b % 64)) & 1;
}

#include "sampler.h"

/* ---- math.c: what the sampler needs of libm, without loading it --------------------------- */

double _al_math_log(double x);               /* x positive and normal */
double _al_math_one_minus_exp_neg(double y); /* 1 - e^-y, y >= 0 */

/* ---- tsc.c: cycle counter, its own cost, conversion to ns ---------------------------------- */

AL_INLINE uint64_t _al_tsc(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}

struct al_clock_pair {
    uint64_t tsc;
    uint64_t ns; /* CLOCK_MONOTONIC */
};

/* Cycles a back-to-back pair of rdtsc reports: what every timed call over-counts. */
uint64_t _al_tsc_measure_overhead(void);
struct al_clock_pair _al_tsc_pair_now(void);
/* Cycles per nanosecond between two pairs; 0 when the interval is too short to tell. */
double _al_tsc_rate(struct al_clock_pair a, struct al_clock_pair b);
/* The pair taken when this image started (a forked child keeps its parent's): what rates
 * are measured from. _al_tsc_start_init takes it if it is not taken yet. */
void _al_tsc_start_init(void);
struct al_clock_pair _al_tsc_start(void);

/* ---- mem.c: the profiler's own memory, from mmap only -------------------------------------- */

void *_al_mem_map(size_t size);   /* zeroed, page-granular; NULL on failure */
/* qsort's contract (stable), with no call to the allocator (sort.c). */
void _al_sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *));
void _al_mem_unmap(void *p, size_t size);
void *_al_mem_alloc(size_t size); /* small, zeroed, never freed; lock-free bump arena */
size_t _al_mem_footprint(void);   /* bytes the profiler holds mapped */

/* Faults in the page of p for writing, for a slow path about to read memory it may then
 * write: a read of a fresh anonymous page maps the shared zero page, and the write after it
 * must replace that page and flush the TLB of every CPU the process runs on (an IPI each). An
 * atomic add of 0 is a write to the page that leaves any value there as it was. */
AL_INLINE void _al_mem_touch(void *p)
{
    __atomic_fetch_add((unsigned char *)p, 0, __ATOMIC_RELAXED);
}

/* The rare paths read /proc files and counters with read(2), a cancellation point, some of
 * them holding one of the profiler's locks: a pthread_cancel acted on there would leave the
 * lock held for good, and the next thread to want it (the report at exit, at the latest)
 * waiting forever. They run with cancellation disabled; a cancel that comes meanwhile is
 * acted on at the program's next cancellation point, as it would be without us. */
AL_INLINE int _al_nocancel_begin(void)
{
    int old = PTHREAD_CANCEL_ENABLE;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    return old;
}

AL_INLINE void _al_nocancel_end(int old)
{
    pthread_setcancelstate(old, NULL);
}

/* ---- log.c: one capped, non-allocating writer for warnings --------------------------------- */

void _al_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- buf.c: growable text buffer in mmap'd memory (reports) --------------------------------- */

struct al_buf {
    char *data;
    size_t len, cap;
    bool failed;    /* out of memory: the report says so instead of being silently cut */
    bool streaming; /* the text goes to fd as it is made (_al_buf_stream) */
    bool held;      /* streaming, but nothing written until released (_al_buf_hold) */
    int fd, werr;   /* streaming: where, and the first write's error (a negative errno) */
};

void _al_buf_putn(struct al_buf *b, const char *s, size_t n);
void _al_buf_puts(struct al_buf *b, const char *s);
/* FIRST, FIRST + STEP, ... (COUNT numbers) in decimal, ", "-separated. */
void _al_buf_u64_run(struct al_buf *b, uint64_t first, uint64_t step, uint32_t count);
void _al_buf_printf(struct al_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void _al_buf_json_str(struct al_buf *b, const char *s); /* quoted, escaped */
/* S (N bytes) as one shell word (_al_shell_word). */
void _al_buf_shell_word(struct al_buf *b, const char *s, size_t n);

/* ---- escape.c: text made safe to show ------------------------------------------------------ */

/* TEXT (LEN bytes) into OUT (CAP bytes, no NUL added) with its control characters written as C
 * escapes (\n, \t, \r, \xHH): a value that holds a newline (an option set to "5\n") stays on
 * its message's one line. Cut short, at a whole character or escape, where OUT is full; the
 * length written. */
size_t _al_escape_controls(const char *text, size_t len, char *out, size_t cap);

/* The length of the well-formed UTF-8 sequence at P, whose first byte is 0x80 or more; 0 where
 * it is none (a stray byte, overlong, a surrogate, past U+10FFFF, cut short). */
size_t _al_utf8_len(const unsigned char *p);
/* S (N bytes) given to PUT as one shell word: as it is where a shell takes it so, else in
 * $'...' with its control bytes, quotes and invalid UTF-8 escaped (a terminal shows no escape
 * sequence of an argument's, and each argument reads as one). */
void _al_shell_word(const char *s, size_t n, void (*put)(void *ctx, const char *p, size_t n), void *ctx);
void _al_buf_free(struct al_buf *b);
/* log.c: writes all of DATA (LEN bytes) to FD, through short writes and EINTR, never ending
 * the program by SIGPIPE; 0 or a negative errno. */
int _al_write_all(int fd, const void *data, size_t len);
/* Notes what fd 2 is as the image starts. Where our lines and the text report go: fd 2 while
 * it is still that (or nothing was noted yet), else the copy kept as the program closed it
 * (report.c: whether one is due, and the copy), else -1: the program put a file of its own on
 * fd 2, and nothing of ours may go into it. A fork child drops the copy. */
void _al_stderr_note(const char *run_stderr); /* the run's stderr, DEV:INO, or NULL */
bool _al_stderr_copy_due(void);
void _al_stderr_keep(int copy);
void _al_stderr_after_fork_child(void);
int _al_stderr_fd(void);
/* Writes the whole buffer to fd; 0 or a negative errno. */
int _al_buf_write_fd(const struct al_buf *b, int fd);
/* From now on the text of B (empty) goes to FD a chunk at a time, so that it never holds
 * more than about AL_BUF_CHUNK bytes of it: a short program's JSON report is some 60 KB, most
 * of it the allocator's size classes, 15 fresh pages to fault in were it made whole. */
#define AL_BUF_CHUNK (16u << 10)
void _al_buf_stream(struct al_buf *b, int fd);
/* ON: what a streaming buffer holds is written, and what follows kept, however long, until
 * released (OFF): text made under a lock that other threads wait for. */
void _al_buf_hold(struct al_buf *b, bool on);
/* Writes what a streaming buffer holds yet; 0, or a negative errno (of a write, or -ENOMEM
 * where the text could not be made whole). */
int _al_buf_finish(struct al_buf *b);

/* ---- options.c: every tunable, one row of one table ---------------------------------------- */

enum al_opt_type { AL_OPT_STRING, AL_OPT_SIZE, AL_OPT_INT };

struct al_option {
    const char *name;    /* CLI long option, without the dashes */
    const char *env;     /* environment variable */
    enum al_opt_type type;
    const char *def;     /* default, as text */
    long long min, max;  /* range, numeric options */
    const char *desc;
    bool set_by_run;     /* 'alloclens run' sets it itself: no command-line flag */
    bool written_at_exit; /* a file the program writes at its exit, perhaps after a chdir:
                             'alloclens run' makes it absolute, and checks it now */
};

enum al_opt_id {
    AL_OPT_OUTPUT,
    AL_OPT_TEXT,
    AL_OPT_LARGE_THRESHOLD,
    AL_OPT_CONFIG,
    AL_OPT_MODE,
    AL_OPT_SAMPLE_RATE,
    AL_OPT_SEED,
    AL_OPT_PPROF,
    AL_OPT_EVENTS,
    AL_OPT_SAMPLE_EVERY,
    AL_OPT_SYSCALLS,
    AL_OPT_ALLOCATOR,
    AL_OPT_MAIN_PID,
    AL_OPT_EVENT_ATTRS,
    AL_OPT_STDERR,
    AL_OPT_N
};

extern const struct al_option _al_options[AL_OPT_N] AL_HIDDEN;

/* Parses a numeric option value ("4096", "128k", "1M", "2G"); 0 on success, -EINVAL on
 * garbage, -ERANGE outside [min, max]. */
int _al_option_parse_num(const struct al_option *o, const char *text, long long *ret);

/* What a run measures (--mode). */
enum al_mode {
    AL_MODE_FULL,   /* every call timed, every object recorded: the memory waste report */
    AL_MODE_TIME,   /* every call timed, new/reused from a mark per address; no records */
    AL_MODE_SAMPLE, /* op counts and the site sampler only */
    AL_MODE_COUNT
};

const char *_al_mode_name(unsigned mode);
int _al_mode_parse(const char *text); /* the mode named TEXT, or -1 (NULL included) */

#define AL_SETTING_STRING_MAX 4096 /* bytes of a string setting, its NUL included */
#define AL_SETTING_EVENTS_MAX 1024

struct al_settings {
    const char *output;     /* JSON report path, or NULL */
    const char *text;       /* text report path; "-" is stderr; NULL is none */
    uint64_t large_threshold;
    bool large_threshold_set; /* given explicitly: wins over the allocator's config */
    const char *config;     /* allocator description file, or NULL */
    enum al_mode mode;
    uint64_t sample_rate;   /* mean bytes between sampled allocations; 0: no sampling */
    uint64_t seed;          /* 0: a fresh seed each run */
    const char *pprof;      /* pprof heap profile path, or NULL */
    const char *events;     /* events to count, or NULL for the default set */
    unsigned sample_every;  /* count events around 1 op in N */
    bool syscalls;          /* count the allocator's system calls (syscall user dispatch) */
    const char *allocator;  /* the allocator the user asked for (path), or NULL */
    pid_t main_pid;         /* the process whose report is OUTPUT itself; 0: unknown */
    const char *event_attrs; /* the events' encodings, resolved by 'alloclens run', or NULL */
    const char *stderr_id;  /* the run's stderr, DEV:INO or "closed" (set by 'alloclens run'), or NULL */
    bool under_valgrind;    /* its preload is in LD_PRELOAD: the program runs on its synthetic CPU */
    bool told_already;      /* a process of a run whose main one (not this) has told what is
                               wrong with the settings, the same for every process: not again */
    /* The string values, one after the other: a short program's settings touch one page of
     * this, not one each. Each has its own limit too (AL_SETTING_STRING_MAX, events less). */
    char strings[7 * AL_SETTING_STRING_MAX + AL_SETTING_EVENTS_MAX]; /* seven strings and the events */
    size_t strings_used;
};

/* Reads every option from the environment; a bad value is warned about (one line naming the
 * variable, by the run's main process only) and the default kept; an empty one is the
 * default. Never allocates. */
void _al_settings_load(struct al_settings *s);
/* PATH made absolute against the working directory into OUT: 0, -ENAMETOOLONG where it does
 * not fit CAP, -1 where the directory has no name (removed). */
int _al_path_absolute(const char *path, char *out, size_t cap);
/* Whether the report paths X and Y are one file. A file that is there is compared by
 * identity, so that another name of it (a link) is seen too; one not made yet by its
 * directory's identity and its own name ("d/../r.json", a linked directory). Devices and FIFOs
 * may take both. The library ignores the later of two such settings; 'alloclens run' refuses
 * them before anything runs. */
bool _al_same_report_file(const char *x, const char *y);
/* NAME's value in the process's environment (environ itself, not the program's getenv), or
 * NULL. */
const char *_al_env(const char *name);
/* The same in the environment ENV (an exec's). */
const char *_al_env_in(char *const env[], const char *name);

/* reach.c: why LD_PRELOAD cannot reach the program CMD (a path, or with SEARCH a name looked
 * up in PATH as execvp does), as "is ...", or NULL when it can (or CMD is not found). */
const char *_al_preload_unreachable(const char *cmd, bool search);
/* Whether FD is a 64-bit ELF file, its header read into *EH. */
bool _al_elf64_header(int fd, Elf64_Ehdr *eh);
/* Whether this process runs a Go program (cgo's): its runtime ends the process with a system
 * call of its own, past the C library's exit handlers that write the report. */
bool _al_program_is_go(void);

/* ---- fds.c: our descriptors, above the program's ------------------------------------------- */

/* Our numbers from RLIMIT_NOFILE; GROW: the kernel's table grown to hold them now. */
void _al_fds_init(bool grow);
/* FD moved to AT or above (closed, its close-on-exec copy returned), or FD as it came where
 * there is no room. _al_fd_high: out of the program's way; _al_fd_top: higher still, for
 * libunwind's pipe. */
int _al_fd_move_up(int fd, int at);
int _al_fd_high(int fd);
int _al_fd_top(int fd);
/* Set while a library works for us (libunwind's first look at memory makes a pipe of its own):
 * the pipe wrapper moves what it makes up. */
extern __thread bool _al_fds_ours __attribute__((tls_model("initial-exec"))) AL_HIDDEN;
/* Room for the report's descriptors: the soft limit raised (true, the old one in *SAVED) for
 * the report's time, and put back (see fds.c). */
struct rlimit;
bool _al_fds_report_room(struct rlimit *saved);
void _al_fds_report_done(const struct rlimit *saved);
/* libunwind's pipe (see fds.c): the pipe wrapper tells of one libunwind made (IN_WALK: during a
 * walk of ours, moved up) and of a descriptor of another user's it closed during one (shared);
 * the sampler, of the end of its walk, which closes the walk's pipe and retires its numbers. */
void _al_fds_unwinder_pipe(const int fds[2], bool in_walk);
void _al_fds_unwinder_shared(void);
void _al_fds_walk_end(void);
extern _Atomic int _al_fds_retired_pipe[2] AL_HIDDEN;

/* Whether FD is a number of a pipe of libunwind's we closed, which it still holds. */
AL_INLINE bool _al_fds_retired(int fd)
{
    return AL_UNLIKELY(fd >= 0 && (fd == atomic_load_explicit(&_al_fds_retired_pipe[0], memory_order_relaxed) ||
                                   fd == atomic_load_explicit(&_al_fds_retired_pipe[1], memory_order_relaxed)));
}

/* ---- thread.c: per-thread state, registry, live-thread accounting --------------------------- */

struct al_row {
    uint64_t count;  /* calls */
    uint64_t timed;  /* calls whose cycles are in cycles (all but the first of the process). Per
                        thread, only those in no histogram (none could be mapped); the others
                        are summed from the histogram when collected. */
    uint64_t cycles; /* overhead-corrected cycles, summed */
};

/* ---- syscalls.c: the allocator's own system calls ------------------------------------------ */

enum { AL_SYS_MMAP, AL_SYS_MUNMAP, AL_SYS_MREMAP, AL_SYS_BRK, AL_SYS_MADVISE, AL_SYS_MPROTECT,
       AL_SYS_FUTEX, AL_SYS_N };

#ifndef SYSCALL_DISPATCH_FILTER_ALLOW
#define SYSCALL_DISPATCH_FILTER_ALLOW 0
#define SYSCALL_DISPATCH_FILTER_BLOCK 1
#endif

/* Per thread, by kind and by the op * 2 + large being served. */
struct al_thread_syscalls {
    uint64_t count[AL_SYS_N][AL_OP_COUNT * 2];
    uint64_t cycles[AL_SYS_N][AL_OP_COUNT * 2];
    uint64_t futex_waits;
};

/* What a thread measures besides the ops rows: syscalls, event counts. Only uint64_t: the
 * totals add up word by word. */
struct al_measure_totals {
    struct al_thread_syscalls sys;
    uint64_t ctr_sums[AL_OP_COUNT][AL_MAX_EVENTS];
    uint64_t ctr_off_cpu_ns[AL_OP_COUNT];  /* counted calls' time switched out */
    uint64_t ctr_ops[AL_OP_COUNT];
    uint64_t ctr_dropped;                  /* calls due to be counted, left out */
};
_Static_assert(sizeof(struct al_measure_totals) ==
                   (2 * AL_SYS_N * AL_OP_COUNT * 2 + 1 + AL_OP_COUNT * (AL_MAX_EVENTS + 2) + 1) * 8,
               "struct al_measure_totals holds uint64_t words only");

struct al_syscalls_state {
    bool dispatch;           /* syscall user dispatch works here */
    bool handler_installed;
    char reason[256];
};

extern struct al_syscalls_state _al_syscalls AL_HIDDEN;

/* ---- seccomp.c: the program's own seccomp filters ------------------------------------------ */

struct sock_filter;
struct sock_fprog;
struct seccomp_data;

/* True from the moment the program starts installing a seccomp filter (as long as one it
 * installed holds): later threads start no syscall user dispatch and no event counting. */
extern _Atomic bool _al_seccomp_on AL_HIDDEN;

/* Around the program's install of a filter (PROG; STRICT: strict mode, before which this
 * thread's report is written and its calls left unmeasured, _al_process_before_strict): the
 * second keeps a copy of the filter if OK (it was installed). Installs may overlap (several
 * threads). */
void _al_seccomp_installing(bool strict);
void _al_seccomp_installed(bool strict, const struct sock_fprog *prog, bool ok);
/* Why a report cannot be written now (NULL: it can): a system call it takes that a filter the
 * program installed would refuse. *CAN_SAY: whether a line on stderr may still be written. */
const char *_al_seccomp_refuses_report(bool *can_say);
/* Whether the filters the program installed let through every system call measuring takes
 * while it runs (the heap's resident size, the pagemap, stack walks); and getrusage (the
 * sampler's peak RSS). True while there are none, false while one is being installed. Where
 * they do not, those measurements stop. */
bool _al_seccomp_measures_ok(void);
bool _al_seccomp_rusage_ok(void);
bool _al_seccomp_stack_reads_ok(void); /* getpid and process_vm_readv (profiler/unwind.c) */
/* What the report says of the syscall and counter sections once a filter is on; NULL before. */
const char *_al_seccomp_note(void);
/* The action filter F (N instructions) returns for D, as the kernel would run it. */
uint32_t _al_seccomp_run(const struct sock_filter *f, unsigned n, const struct seccomp_data *d);

/* ---- locks.c: lock acquisitions inside allocator calls --------------------------------------- */

#define AL_LOCKS_BITS 10
#define AL_LOCKS_MAX (1u << AL_LOCKS_BITS)
#define AL_HELD_MAX 8

struct al_lock_stats {
    _Atomic uintptr_t id;    /* the lock's address; 0: free slot */
    _Atomic uint64_t acquisitions, contended, wait_cycles, hold_cycles;
};

struct al_held {
    const void *lock;
    uint64_t since;
};

extern struct al_lock_stats *_al_locks AL_HIDDEN;

#define AL_CONTEXT_SLOTS 4

/* The fields every call touches come first, on one cache line (the rows and histograms aside):
 * the rest is for the rare paths. */
struct al_thread {
    int busy;        /* inside an interposed call: nested calls are forwarded, not counted;
                        AL_BUSY_EXITING once the thread's exit callback has run */
    int ending_signal;       /* one that came while busy, to be raised again by _al_unbusy */
    unsigned in_call;        /* inside the real allocator call: op * 2 + large + 1; else 0 */
    char sud_selector;       /* syscall user dispatch: block while in_call */
    unsigned tag;            /* 1..255: this thread in the shadow table's line entries */
    int64_t snap_countdown;  /* bytes to allocate until the next look at the footprint */
    int64_t free_look;       /* large bytes to free until the next look before a free */
    int64_t (*cls)[4];       /* per size-class row: live objects, requested bytes, extra, blowup
                                credit (waste.c) */
    int64_t sample_countdown; /* bytes until the next sampled allocation */
    uint64_t rng;             /* this thread's generator for the countdowns */
    /* The region records this thread looked at last (the timed modes' calls; lines of their
     * own, after the line every call reads). */
    _Alignas(64) struct al_shadow_cache region;
    /* The rows, on the same page as the fields above (the state is a mapping of its own): a
     * call touches no other page of it (see struct al_hot for why that matters). */
    struct al_row rows[AL_ROWS];
    struct al_thread_counters ctr;
    unsigned nheld;
    struct al_held held[AL_HELD_MAX];
    struct al_measure_totals m;
    int spawned;     /* started through our pthread_create: counts in the live-thread total */
    pid_t late_tid;  /* made for calls after its thread's exit callback: that thread's kernel id
                        (thread.c retires the state once the thread is gone); else 0 */
    bool dispatching; /* syscall user dispatch is on for this thread (reads sud_selector) */
    struct al_thread *next;
    uint64_t *hist[AL_ROWS]; /* AL_HIST_BUCKETS each, made when the row is first timed */
    /* The contexts setcontext and swapcontext were given, less SIGSYS in their masks, in turn
     * (signal_compat.c); their pages are touched only once used. */
    ucontext_t contexts[AL_CONTEXT_SLOTS];
    unsigned next_context;
    uint64_t ending_since;   /* CLOCK_MONOTONIC ns when ending_signal was held */
};

_Static_assert(offsetof(struct al_thread, rows) + AL_ROWS * sizeof(struct al_row) <= 4096 &&
                   offsetof(struct al_thread, ctr.countdown) + sizeof(unsigned) <= 4096,
               "a call's fields of struct al_thread fit on its first page");

extern __thread struct al_thread *_al_tls __attribute__((tls_model("initial-exec"))) AL_HIDDEN;

#define AL_BUSY_EXITING 2 /* busy for good: no _al_unbusy will come */
/* Busy inside the real call of an operator new, whose new-handler is the program's code: a
 * call that handler makes is counted as the program's (interpose.h, _al_enter_call). */
#define AL_BUSY_NEW 3

/* Inside one of our calls, which will end (not busy for good: AL_BUSY_EXITING). */
AL_INLINE bool _al_busy_in_call(const struct al_thread *t)
{
    return t->busy && t->busy != AL_BUSY_EXITING;
}

/* A signal that ends the process came while the thread was busy (signals.c): raises it again,
 * the thread's state whole now. */
void _al_thread_ending_signal(struct al_thread *t);

/* Every end of a busy time but the thread's last. */
AL_INLINE void _al_unbusy(struct al_thread *t)
{
    t->busy = 0;
    /* The handler runs on this thread: the flag must be stored before the signal is looked at,
     * or one landing in between would see the thread busy and be left for a look already made. */
    atomic_signal_fence(memory_order_seq_cst);
    if (AL_UNLIKELY(t->ending_signal))
        _al_thread_ending_signal(t);
}

struct al_thread *_al_thread_attach(void); /* creates this thread's state; busy is set */
/* An allocation nested in one of our calls, of SIZE bytes aligned to ALIGN (0: malloc's): the
 * thread's exit-callback entry, from memory of our own, where it is the one the C library
 * asks for while the callback is registered; NULL for any other (the allocator serves it).
 * Whether a free of P, made with no state, is the C library's free of that entry (true once). */
void *_al_thread_exit_entry(size_t size, size_t align);
bool _al_thread_exit_entry_free(const void *p);
void _al_thread_measure_init(struct al_thread *t); /* syscall dispatch and event counting */
void _al_thread_spawning(void);            /* pthread_create is about to start a thread */
void _al_thread_announced(void);           /* ... which runs: counted already */
void _al_thread_spawn_failed(void);
void _al_thread_started(struct al_thread *t);
/* The calling thread, about to make its state, registers no exit callback: its start
 * function's end (_al_thread_end, on return, pthread_exit or cancel) is taken as its exit. */
void _al_thread_exit_at_end(void);
void _al_thread_end(void);
bool _al_thread_exits_at_end(void); /* the calling thread's exit is its function's end */
/* Puts back OLD, a mask pthread_sigmask returned, exactly (log.c): the C library's own
 * signals included, which pthread_sigmask would leave unblocked. */
void _al_signals_restore(const sigset_t *old);
/* Every signal blocked but SIGSYS (syscall user dispatch raises it, and a blocked one ends the
 * process), the mask as it was in *OLD, for _al_signals_restore (log.c). */
void _al_signals_block_all(sigset_t *old);
/* System call NR made from the page syscall user dispatch always lets through (syscalls.c); the
 * result as the kernel gives it (-errno on failure). */
long _al_sud_syscall(long nr, long a1, long a2, long a3, long a4, long a5, long a6);
/* The same, around the making of T's state (NULL: none made): SIGSYS left deliverable where T
 * has its system calls dispatched, however OLD had it. */
void _al_thread_signals_restore(const struct al_thread *t, sigset_t *old);
/* Around fork: the registry's lock, taken with signals blocked; the child's unlocks it and
 * leaves them blocked until _al_threads_fork_done, the child's last step. */
void _al_threads_atfork_prepare(void);
void _al_threads_atfork_parent(void);
void _al_threads_after_fork_child(void);
void _al_threads_fork_done(void);
void _al_threads_init(void);
/* The serial and parallel times count from now: from where the report's runtime does. */
void _al_threads_phase_restart(void);

struct al_thread_totals {
    uint64_t total, max_live;
    uint64_t serial_cycles, parallel_cycles;
};

/* Calls counted so far, every thread together (what the report's rows will add up to). */
uint64_t _al_threads_calls(void);
/* Sums every thread's rows and histograms (those that exited and those still running) into
 * the caller's arrays. */
void _al_threads_collect(struct al_row *rows, uint64_t *hist, struct al_thread_totals *tot,
                         struct al_measure_totals *extra);

/* ---- symbols.c: names for the sampled frames, after the run -------------------------------- */

struct al_symbol {
    const char *function; /* NULL when unknown */
    bool mangled;         /* function is as the symbol table has it */
    const char *file;     /* NULL without debug information */
    int line;
    const char *module;
    uint64_t module_offset;
    bool unloaded;        /* module is a library the program unloaded, not read again */
    /* Where the call at the address is in code inlined from FUNCTION: the function that code
     * was inlined into, with the line of that inlined call (and its own inlined_into, up to
     * the function the code was compiled into, whose is NULL). Owned by the symbol table. */
    const struct al_symbol *inlined_into;
};

/* Before a report names frames: with FULL, every frame of every site is named at once from
 * debug information by alloclens-symbolize, each with the chain of its inlined calls; otherwise,
 * and where that fails, frames get the dynamic symbol table's names (no inlined calls). */
void _al_symbols_begin(bool full);
void _al_symbolize(uintptr_t pc, struct al_symbol *s);
/* Why the names are not from debug information (not asked for in this process, or missing);
 * NULL when they are. */
const char *_al_symbols_unavailable(void);
/* Where the names come from, for the report: "debug information" or "dynamic symbols". */
const char *_al_symbols_source(void);
/* S's function name, demangled into BUF (CAP bytes) where it is mangled. */
const char *_al_symbol_function(const struct al_symbol *s, char *buf, size_t cap);

/* ---- unloaded.c: sampled frames in libraries the program unloads -------------------------- */

#define AL_UNLOADED_MAX 1024
#define AL_UNLOADED_BASE (UINT64_C(1) << 62) /* above every process's addresses */
#define AL_UNLOADED_SPAN (UINT64_C(1) << 40)

/* A file the program unloaded while sampled frames were in its code: those frames now read
 * BIAS + their offset from the file's load bias. Its code is [BIAS + LO, BIAS + HI), at file
 * offset OFFSET. */
struct al_unloaded {
    const char *path;
    uint64_t dev, ino, size, mtime_ns; /* which file PATH was (a library rebuilt in place may keep its inode) */
    uintptr_t bias, lo, hi, offset;
};

/* Around the C library's dlclose: what is loaded before (NULL where no frame can be in it),
 * then the frames in what was unloaded moved (and BEFORE given back). */
struct al_objects *_al_unloaded_before(void);
void _al_unloaded_after(struct al_objects *before);
unsigned _al_unloaded_count(void);
const struct al_unloaded *_al_unloaded_file(unsigned k);
/* Whether U's path still names the file that was unloaded (not one rebuilt in place since). */
bool _al_unloaded_same_file(const struct al_unloaded *u);
/* The file a moved frame PC is in; NULL for any other address. */
const struct al_unloaded *_al_unloaded_of(uintptr_t pc);

/* ---- proc.c: the /proc files, read without stdio or allocation ------------------------------ */

struct al_map {
    uint64_t lo, hi, offset;
    char perms[5];
    const char *path; /* "" for anonymous mappings; valid during the callback */
};

/* Calls FN for each mapping, in address order, until it returns true; returns whether it did.
 * BUF (CAP bytes, a few KiB: more than the longest line) is where the lines are read. */
bool _al_maps_each(char *buf, size_t cap, bool (*fn)(const struct al_map *m, void *arg), void *arg);
/* The mapping holding address A into OUT (its path too, where OUT->path is given); whether
 * there is one. BUF and CAP as for _al_maps_each. */
struct al_map_span {
    uint64_t lo, hi;
    char *path; /* NULL, or PATH_CAP bytes */
    size_t path_cap;
};
bool _al_maps_find(uint64_t a, char *buf, size_t cap, struct al_map_span *out);
/* The file at PATH in one read into BUF (CAP bytes), NUL-terminated: its length, or -1. */
ssize_t _al_proc_read(const char *path, char *buf, size_t cap);
/* The number after "FIELD:" in /proc/self/status (TracerPid, Seccomp...), or -1. */
long _al_proc_status(const char *field);
/* The same for N fields at once, from one read: VALUES[i] for FIELDS[i]. */
void _al_proc_status_fields(const char *const fields[], long values[], unsigned n);
void _al_proc_after_fork_child(void); /* the status read another thread had under way: no one's */
/* The process's resident size now, in bytes (/proc/self/statm), or -1. */
int64_t _al_proc_rss(void);
/* The whole file at PATH appended to B, however long; whether it was read to its end. */
bool _al_proc_append(const char *path, struct al_buf *b);
/* The unsigned number at *S in BASE (10 or 16, lower-case digits); *S is left after it. */
uint64_t _al_proc_num(const char **s, unsigned base);
/* /proc/self/pagemap, opened for one measurement (a descriptor kept open would go on reading
 * the parent's pages in a forked child); read with _al_shadow_pagemap_read and
 * _al_shadow_written_pages. */
int _al_proc_pagemap_open(void);
void _al_proc_pagemap_close(int fd);

/* ---- heap.c: the allocator's heap ranges and their residency ------------------------------- */

void _al_heap_init(void);
/* From the SIGSYS handler: a system call the allocator made (NR, its arguments, its result). */
void _al_heap_syscall(long nr, const long *args, long ret);
void _al_heap_discover(uint64_t a);
void _al_heap_after_fork_child(void);

/* An object at A: its page is one of the allocator's known ones, or the mapping holding it is
 * found now. Only for addresses not returned before: those lie on pages already looked at. */
AL_INLINE void _al_heap_see(uint64_t a)
{
    if (!_al_shadow_heap_has(a))
        _al_heap_discover(a);
}
uint64_t _al_heap_discovered(void);
/* Resident bytes of the allocator's heap; PAGEMAP as for _al_shadow_heap_runs. */
uint64_t _al_heap_resident(int pagemap);

/* ---- waste.c: memory waste, per size class, snapshots at the peak -------------------------- */

enum { AL_CLS_OBJECTS, AL_CLS_REQUESTED, AL_CLS_EXTRA, AL_CLS_CREDIT, AL_CLS_N };

/* Blowup freed by a thread is its credit first, taken back by its own allocations of the class
 * without an atomic; past this many bytes it goes to the class's global count, where every
 * thread's allocations take from it. */
#define AL_CREDIT_FLUSH (64 << 10)
enum { AL_SLOT_OBJECTS, AL_SLOT_REQUESTED, AL_SLOT_INTERNAL, AL_SLOT_BLOWUP, AL_SLOT_N };

#define AL_SNAP_CHECK_BYTES (256 << 10)
#define AL_SNAP_STEP (1u << 20) /* a snapshot when the footprint passes its peak by this */
/* Large objects freed between two looks at the footprint made before a free: pages the program
 * wrote after their allocation's look are seen before they go (waste.c). */
#define AL_SNAP_FREE_LOOK_BYTES (4 << 20)

/* The class tables (a row per size class, page-aligned mappings of their own) are large and
 * mostly zero. What sums them writes only rows it has something to add to, and skips pages
 * never written, so that pages no class uses cost neither memory nor time (in a forked child,
 * whose tables are its parent's pages until written, a fault and a copy each). */
#define AL_TABLE_PAGES_MAX (((size_t)AL_CONFIG_MAX_CLASSES + 2) * AL_CLS_N * sizeof(int64_t) / 4096 + 1)
#define AL_TABLE_WORDS ((AL_TABLE_PAGES_MAX + 63) / 64)

/* Which pages of a table of ROWS rows of ROW_BYTES may hold rows not zero, into WRITTEN (see
 * _al_shadow_written_pages). */
AL_INLINE void _al_table_written(int pagemap, const void *table, uint32_t rows, size_t row_bytes, uint64_t *written)
{
    _al_shadow_written_pages(pagemap, table, (rows * row_bytes + 4095) / 4096, written);
}

/* Whether ROW of a table whose rows are ROW_BYTES long is on a page WRITTEN marks; and marking
 * it so. */
AL_INLINE bool _al_table_row_written(const uint64_t *written, uint32_t row, size_t row_bytes)
{
    size_t page = row * row_bytes / 4096;
    return (written[page / 64] >> (page % 64)) & 1;
}

AL_INLINE void _al_table_mark_row(uint64_t *written, uint32_t row, size_t row_bytes)
{
    size_t page = row * row_bytes / 4096;
    written[page / 64] |= 1ull << (page % 64);
}

struct al_waste_snapshot {
    bool taken;
    uint64_t tsc;
    uint64_t total, live, internal, blowup, objects;
    uint64_t blowup_uncapped;      /* blowup before the cap at total - live - internal */
    int64_t external;              /* total - live - internal - blowup (negative: unbacked) */
    int64_t (*cls)[AL_SLOT_N];     /* per row */
    uint64_t pages[AL_TABLE_WORDS]; /* the pages of cls that may hold rows not zero */
};

/* The allocator's malloc_usable_size (ours, first in the global scope, only forwards to it),
 * resolved with the rest at start-up; NULL if it has none. */
typedef size_t al_usable_size_fn(void *);
extern al_usable_size_fn *_al_usable_size AL_HIDDEN;

struct al_waste_state {
    bool enabled;
    char reason[256];
    char classes_reason[768];      /* why there is no per-class table */
    bool has_table;
    /* A request may get more than its class: a sequential allocator hands a free chunk over
     * whole where the rest would be too small to split (glibc: 16 bytes more). Every small
     * object's usable size is then asked, not only the odd calls'. */
    bool inexact;
    struct al_class_table table;
    uint32_t nclasses;             /* rows 0..nclasses-1: the table's classes */
    uint32_t slot_any, slot_large, nslots; /* small objects without a table; large objects */
    _Atomic int64_t *blowup;       /* per row: freed bytes not yet taken again */
    int64_t (*exited)[AL_CLS_N];   /* rows of exited threads */
    struct al_waste_snapshot peak, final;
    uint64_t snapshots;
};

extern struct al_waste_state _al_waste AL_HIDDEN;

struct al_waste_undo {
    uint64_t requested;
    uint32_t slot;
    int64_t extra, bytes;
    bool odd;
};

void _al_waste_init(const struct al_alloc_config *c);
void _al_waste_thread_init(struct al_thread *t);
bool _al_waste_thread_rows(struct al_thread *t);
void _al_waste_thread_retire(struct al_thread *t);
unsigned _al_waste_alloc_slow(struct al_thread *t, struct al_shadow_region *r, uint64_t a, uint64_t req,
                              unsigned large, bool maybe_odd);
/* The accounting half of _al_waste_free for the objects its inline path leaves out (large,
 * odd, no class table), O being the record just ended at p: 2 | large. */
unsigned _al_waste_count_free(struct al_thread *t, void *p, const struct al_shadow_object *o,
                              struct al_waste_undo *undo);
void _al_waste_restore(struct al_thread *t, void *p, const struct al_waste_undo *u);
void _al_waste_check(struct al_thread *t);
void _al_waste_final(void);
void _al_waste_after_fork_child(void);
/* Adds every running thread's class rows, and those of the threads that exited, to DST,
 * skipping the pages of their tables never written (PAGEMAP: see _al_shadow_written_pages). */
void _al_threads_sum_classes(int64_t (*dst)[AL_CLS_N], uint32_t nslots, int pagemap);

/* Adds V to *D, writing only if V is not zero. */
AL_INLINE void _al_add_nonzero(int64_t *d, int64_t v)
{
    if (v)
        *d += v;
}

/* An allocation of SIZE bytes of class SLOT takes back freed bytes: its thread's credit first,
 * else the global count while it is positive. */
AL_INLINE void _al_waste_take_blowup(int64_t *row, uint32_t slot, int64_t size)
{
    int64_t credit = AL_READ(row[AL_CLS_CREDIT]);
    if (AL_LIKELY(credit >= size)) {
        __atomic_store_n(&row[AL_CLS_CREDIT], credit - size, __ATOMIC_RELAXED);
        return;
    }
    _Atomic int64_t *b = &_al_waste.blowup[slot];
    if (atomic_load_explicit(b, memory_order_relaxed) > 0)
        atomic_fetch_sub_explicit(b, size, memory_order_relaxed);
}

/* The look it makes due is made by _al_record_alloc, once the object is sampled if it is to be:
 * the peak a look finds is the sites' too, and the object that made it belongs in it. */
AL_INLINE void _al_waste_countdown(struct al_thread *t, uint64_t req)
{
    t->snap_countdown -= (int64_t)req + 16;
}

/* The object a call returned: its record, its class row, blowup, and the countdown to the next
 * look at the footprint. Returns whether the address was returned before. */
AL_INLINE unsigned _al_waste_alloc(struct al_thread *t, void *p, size_t req, unsigned large, bool maybe_odd)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region_cached(&t->region, a, true);
    if (AL_UNLIKELY(r == NULL))
        return AL_REUSE_NEW;
    if (AL_UNLIKELY(large | maybe_odd | !_al_waste.has_table | !t->cls))
        return _al_waste_alloc_slow(t, r, a, req, large, maybe_odd);
    uint32_t slot = _al_class_index(&_al_waste.table, req), pages;
    int64_t *row = t->cls[slot], size = (int64_t)_al_class_size(&_al_waste.table, slot);
    if (AL_UNLIKELY(_al_waste.inexact) && _al_usable_size(p) != (size_t)size)
        return _al_waste_alloc_slow(t, r, a, req, large, true);
    bool reused = _al_shadow_object_new(r, a, req, false, t->tag, &pages);
    if (AL_UNLIKELY(!reused))
        _al_heap_see(a);
    AL_BUMP(row[AL_CLS_OBJECTS], 1);
    AL_BUMP(row[AL_CLS_REQUESTED], (int64_t)req);
    _al_waste_take_blowup(row, slot, size);
    _al_waste_countdown(t, req);
    return reused ? AL_REUSE_REUSED : AL_REUSE_NEW;
}

/* ---- record.c: the hot path and its rare work ---------------------------------------------- */

struct al_first_call {
    _Atomic int taken;
    unsigned row;
    uint64_t cycles;
    uint64_t start;  /* the cycle counter when it began */
};

/* A call's cycles less the cost of measuring them. */
AL_INLINE uint64_t _al_tsc_net(uint64_t cycles)
{
    return cycles > _al_hot.tsc_overhead ? cycles - _al_hot.tsc_overhead : 0;
}
extern struct al_first_call _al_first AL_HIDDEN;

bool _al_record_first(unsigned row, uint64_t cycles);
uint64_t *_al_thread_hist_row(struct al_thread *t, unsigned row);

AL_INLINE void _al_record_row(struct al_thread *t, unsigned row, uint64_t cycles)
{
    struct al_row *r = &t->rows[row];
    AL_BUMP(r->count, 1);
    uint64_t *h = t->hist[row];
    if (AL_UNLIKELY(h == NULL)) {
        /* No histogram has been made before the process's first timed call, so that call
         * always comes this way. */
        if (!atomic_load_explicit(&_al_first.taken, memory_order_relaxed) && _al_record_first(row, cycles))
            return;
        h = _al_thread_hist_row(t, row);
    }
    cycles = _al_tsc_net(cycles);
    AL_BUMP(r->cycles, cycles);
    AL_BUMP(h[_al_hist_bucket(cycles)], 1);
}

AL_INLINE unsigned _al_phase_now(void)
{
    return atomic_load_explicit(&_al_hot.parallel, memory_order_relaxed);
}

/* Around the real allocator call: what the SIGSYS handler and the lock wrappers need to know
 * (which op, small or large), the syscall selector, and the 1-in-N event counting. */
AL_INLINE bool _al_call_begin(struct al_thread *t, unsigned op, unsigned large)
{
    t->in_call = op * 2 + large + 1;
    bool counted = _al_counters_due(&t->ctr);
    if (AL_UNLIKELY(counted))
        _al_counters_before(&t->ctr);
    t->sud_selector = SYSCALL_DISPATCH_FILTER_BLOCK;
    return counted;
}

/* A call the program makes while the thread is inside an operator new (its new-handler's) is
 * counted like any other: the call it interrupts is set aside meanwhile, and not counted
 * twice for events. */
struct al_nest {
    struct al_thread *t; /* NULL: nothing set aside */
    int busy;
    unsigned in_call;
    char sud_selector;
    unsigned countdown;
};

AL_INLINE void _al_nest_enter(struct al_thread *t, struct al_nest *n)
{
    *n = (struct al_nest){ t, t->busy, t->in_call, t->sud_selector, t->ctr.countdown };
    t->in_call = 0;
    t->sud_selector = SYSCALL_DISPATCH_FILTER_ALLOW;
    t->ctr.countdown = UINT_MAX; /* this call's events are not counted */
}

/* Puts the interrupted call back (a cleanup: also when the nested call throws). */
AL_INLINE void _al_nest_leave(struct al_nest *n)
{
    struct al_thread *t = n->t;
    if (!t)
        return;
    t->busy = n->busy;
    t->in_call = n->in_call;
    t->ctr.countdown = n->countdown;
    atomic_signal_fence(memory_order_seq_cst);
    t->sud_selector = n->sud_selector;
}

/* The counted call's events, added to its op's sums (record.c). */
void _al_call_counted(struct al_thread *t, unsigned op, uint64_t cycles);

AL_INLINE void _al_call_end(struct al_thread *t, unsigned op, bool counted, uint64_t cycles)
{
    t->sud_selector = SYSCALL_DISPATCH_FILTER_ALLOW;
    t->in_call = 0;
    if (AL_UNLIKELY(counted))
        _al_call_counted(t, op, cycles);
}

/* In a signal handler: the syscall selector of the thread it runs on opened (the handler's
 * own system calls, and its return, run natively); the thread's state, or NULL. */
AL_INLINE struct al_thread *_al_selector_open(void)
{
    struct al_thread *t = _al_tls;
    if (t)
        t->sud_selector = SYSCALL_DISPATCH_FILTER_ALLOW;
    return t;
}

const char *_al_syscall_name(unsigned kind);
void _al_syscalls_init(void);
/* The thread's selector, and with DISPATCH its system calls dispatched to us. */
void _al_syscalls_thread_init(struct al_thread *t, bool dispatch);
/* False when the state must not be handed to another thread: dispatch is on for this one and
 * cannot be turned off (a seccomp filter may refuse the prctl), so the kernel goes on reading
 * its selector until it is gone. */
bool _al_syscalls_thread_exit(struct al_thread *t);
bool _al_syscalls_owns_sigsys(void);
int _al_syscalls_program_sigaction(const struct sigaction *act, struct sigaction *old);
/* Runs the program's handler A for SIG as the kernel would have (nothing for SIG_DFL and
 * SIG_IGN, which the caller decides about). */
void _al_signal_run(const struct sigaction *a, int sig, siginfo_t *si, void *ctx);

void _al_lock_acquired(struct al_thread *t, const void *lock, bool contended, uint64_t wait, uint64_t now);
void _al_lock_released(struct al_thread *t, const void *lock, uint64_t now);
void _al_locks_init(void);
/* The claimed slots, in the order they were claimed: K below _al_locks_claimed(); NULL for one
 * still being written. */
unsigned _al_locks_claimed(void);
const struct al_lock_stats *_al_locks_at(unsigned k);

extern enum al_mode _al_mode AL_HIDDEN;

/* The sampler's hot path: one subtraction, one branch (sampler.c has the rest). An
 * allocation of SIZE counts down SIZE + 1 bytes (the estimator relies on the + 1); true when
 * it is the one to sample. */
AL_INLINE bool _al_sample_due(struct al_thread *t, size_t size)
{
    t->sample_countdown -= (int64_t)size + 1;
    return AL_UNLIKELY(t->sample_countdown < 0);
}

AL_INLINE void _al_sample_countdown(struct al_thread *t, size_t size, void *p)
{
    if (_al_sample_due(t, size))
        _al_sample_alloc(t, size, p);
}

/* A free gives its bytes to its thread's credit, passed on to the global count in batches. */
AL_INLINE void _al_waste_raise_blowup(int64_t *row, uint32_t slot, int64_t bytes)
{
    int64_t credit = AL_READ(row[AL_CLS_CREDIT]) + bytes;
    if (AL_UNLIKELY(credit > AL_CREDIT_FLUSH)) {
        atomic_fetch_add_explicit(&_al_waste.blowup[slot], credit, memory_order_relaxed);
        credit = 0;
    }
    __atomic_store_n(&row[AL_CLS_CREDIT], credit, __ATOMIC_RELAXED);
}

/* The footprint is looked at after a thread's allocations outgrow its frees by a step: a
 * thread that frees what it allocates never pays for the look. */
AL_INLINE void _al_waste_countback(struct al_thread *t, uint64_t req)
{
    t->snap_countdown += (int64_t)req + 16;
    if (t->snap_countdown > AL_SNAP_CHECK_BYTES)
        t->snap_countdown = AL_SNAP_CHECK_BYTES;
}

/* The object at p is about to be freed (or moved by realloc): its record retired, its class
 * row and blowup counted, and a sampled object forgotten by the sampler, before the allocator
 * has the address back and another thread may be handed it. The sampler forgets it last: a
 * large object's free may first look at the footprint (_al_waste_count_free), and the peak
 * that look finds is the sites' too, this object in it. Returns 0 where it had no record,
 * else 2 | large; UNDO and SAMPLE_UNDO (may be NULL) keep what realloc needs to put the record
 * and the sample back if the call fails. The common case, an object whose class the table
 * tells, is counted without a call. */
AL_INLINE unsigned _al_waste_free(struct al_thread *t, void *p, struct al_waste_undo *undo,
                                   struct al_sample_undo *sample_undo)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region_cached(&t->region, a, false);
    if (AL_UNLIKELY(r == NULL))
        return 0;
    unsigned flags = __atomic_load_n(&r->granule[AL_SHADOW_GRANULE(a)], __ATOMIC_RELAXED), had = 0;
    struct al_shadow_object o;
    if (!(flags & AL_SHADOW_LIVE) || (AL_UNLIKELY(!t->cls) && !_al_waste_thread_rows(t)) ||
        !_al_shadow_object_end(r, a, (uint8_t)flags, &o)) {
        /* no record */
    } else if (AL_UNLIKELY((o.requested >= _al_hot.large_threshold) | o.odd | !_al_waste.has_table)) {
        had = _al_waste_count_free(t, p, &o, undo);
    } else {
        uint32_t slot = _al_class_index(&_al_waste.table, o.requested);
        int64_t *row = t->cls[slot], bytes = (int64_t)_al_class_size(&_al_waste.table, slot);
        _al_waste_countback(t, o.requested);
        AL_BUMP(row[AL_CLS_OBJECTS], -1);
        AL_BUMP(row[AL_CLS_REQUESTED], -(int64_t)o.requested);
        _al_waste_raise_blowup(row, slot, bytes);
        if (undo)
            *undo = (struct al_waste_undo){ .requested = o.requested, .slot = slot, .bytes = bytes };
        had = 2;
    }
    if (AL_UNLIKELY(flags & AL_SHADOW_SAMPLED))
        _al_sample_free(p, sample_undo);
    return had;
}

/* --mode time: whether the address was returned before, and the mark a large object leaves
 * for its free. An allocation clears a mark left at its address by a large object freed
 * without us seeing it (realloc's old object is unmarked first). */
AL_INLINE unsigned _al_mark_alloc(struct al_thread *t, void *p, unsigned large)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region_cached(&t->region, a, true);
    if (AL_UNLIKELY(r == NULL))
        return AL_REUSE_NEW;
    bool seen = _al_shadow_seen(r, a);
    if (AL_UNLIKELY(large))
        _al_shadow_mark_large(r, a);
    else
        _al_shadow_take_large(r, a);
    return seen ? AL_REUSE_REUSED : AL_REUSE_NEW;
}

/* The object at p is about to be freed: whether it was large (sampled objects forgotten by
 * the sampler first, SAMPLE_UNDO as for _al_waste_free). */
AL_INLINE unsigned _al_mark_free(struct al_thread *t, void *p, struct al_sample_undo *sample_undo)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    struct al_shadow_region *r = _al_shadow_region_cached(&t->region, a, false);
    if (AL_UNLIKELY(r == NULL))
        return 0;
    _al_sample_forget(p, sample_undo);
    return _al_shadow_take_large(r, a);
}

/* A call that returned address p (NULL: failed) for a request of size bytes, of the size class
 * LARGE (the caller decided it once, before the call), ALIGNED where it asked for an alignment.
 * Only malloc, calloc and new without one are sure to get the class the size table says (where
 * the allocator's classes are exact: _al_waste.inexact): the others may get a bigger one. */
AL_INLINE void _al_record_alloc(struct al_thread *t, unsigned op, size_t size, unsigned large, bool aligned,
                                void *p, uint64_t cycles)
{
    unsigned reuse = AL_REUSE_NA;
    if (AL_LIKELY(p != NULL))
        reuse = AL_LIKELY(_al_hot.records)
                    ? _al_waste_alloc(t, p, size, large,
                                      aligned || (op != AL_OP_MALLOC && op != AL_OP_CALLOC && op != AL_OP_NEW))
                    : _al_mark_alloc(t, p, large);
    _al_record_row(t, _al_row_index(op, large, reuse, _al_phase_now()), cycles);
    _al_sample_countdown(t, size, p);
    if (AL_UNLIKELY(t->snap_countdown < 0))
        _al_waste_check(t);
    _al_unbusy(t);
}

/* A free of p, classified by the object's own size class (looked up before it was freed). */
AL_INLINE void _al_record_free(struct al_thread *t, unsigned op, unsigned large, uint64_t cycles)
{
    _al_record_row(t, _al_row_index(op, large, AL_REUSE_NA, _al_phase_now()), cycles);
    _al_unbusy(t);
}

/* --mode sample: a count per row (no timing, no address tracking: reuse is n/a, and a free's
 * size class is not known), and the sampler's countdown. The export counts a small request
 * before the call (LARGE a constant 0: its row is a constant and the phase), so it can jump to
 * the allocator and leave it to return to the program: the thread is not marked busy, which is
 * safe only for targets that never call back into an interposed function. False when this
 * allocation is the one to sample: the caller then makes the call with the thread busy, and
 * samples it. */
AL_INLINE bool _al_count_alloc_first(struct al_thread *t, unsigned op, unsigned large, size_t size)
{
    AL_BUMP(t->rows[_al_row_index(op, large, AL_REUSE_NA, _al_phase_now())].count, 1);
    return !_al_sample_due(t, size);
}

AL_INLINE void _al_count_free_first(struct al_thread *t, unsigned op)
{
    unsigned row = _al_row_index(op, 0, AL_REUSE_NA, _al_phase_now());
    AL_BUMP(t->rows[row].count, 1);
}

/* The same after the call, with the thread busy: ends the call. */
AL_INLINE void _al_count_alloc(struct al_thread *t, unsigned op, size_t size, void *p)
{
    if (AL_UNLIKELY(!_al_count_alloc_first(t, op, size >= _al_hot.large_threshold, size)))
        _al_sample_alloc(t, size, p);
    _al_unbusy(t);
}

AL_INLINE void _al_count_free(struct al_thread *t, unsigned op)
{
    _al_count_free_first(t, op);
    _al_unbusy(t);
}

/* ---- process.c: start-up, fork, exec and exit ---------------------------------------------- */

enum al_state { AL_STATE_NEW, AL_STATE_INITIALIZING, AL_STATE_READY };

extern _Atomic int _al_state AL_HIDDEN;
extern struct al_settings _al_settings AL_HIDDEN;

/* Interposer callbacks, so process.c can resolve symbols without depending on interpose/. */
struct al_process_hooks {
    int (*resolve)(void);              /* looks up the real functions; 0 or negative errno */
    const void *(*malloc_addr)(void);  /* the real malloc */
    const void *(*own_malloc)(void);   /* our exported malloc */
    al_usable_size_fn *(*usable_size)(void); /* the allocator's malloc_usable_size, or NULL */
    const void *(*posix_spawn_addr)(void); /* the C library's posix_spawn, or NULL */
    void (*started)(void); /* lookups of interpose's own that need libc ready (the unwind
                              glue's), run with the thread busy: the loader may allocate */
};

/* The C library's posix_spawn, resolved likewise (ours checks whether LD_PRELOAD reaches the
 * program's children), or NULL: what starts the symbolizer helper. */
extern const void *_al_real_posix_spawn AL_HIDDEN;

void _al_process_init(const struct al_process_hooks *hooks);
/* From our constructor, once libc is set up, with the arguments glibc gives constructors: the
 * command line as the image started. */
void _al_process_start(int argc, char *const argv[]);
/* About to exec FILE (a path, or with SEARCH a name looked up in PATH; NULL: an fd) with the
 * environment ENVP: the report of this image first, and a line when the new image will write
 * none because LD_PRELOAD cannot reach it. */
void _al_process_before_exec(const char *file, bool search, char *const envp[]);
/* FILE is about to be exec'd (here, or in a new process by posix_spawn): a line if LD_PRELOAD
 * cannot reach it, so its report will be missing. */
void _al_process_say_unreachable(const char *file, bool search, char *const envp[]);
void _al_process_exec_failed(void);
/* A thread asks for seccomp's strict mode (process.c): the report now, the thread unmeasured. */
void _al_process_before_strict(void);
/* A process other than the image's own that never ran our fork handlers: a vfork child, whose
 * writes to our memory land in its parent's (or a child of a raw clone, taken for one). */
bool _al_process_shared_child(void);
/* _exit or _Exit called by the program, or quick_exit's handlers done: exit() and so our
 * handler will not run. Writes the report unless this is a vfork child or the thread is inside
 * one of our calls, setting *OWN_MEMORY first (the thread's allocations then bypass the
 * allocator). */
void _al_process_before_exit_syscall(int status, bool *own_memory);
/* A fork's handlers (registered with the C library; also run around a clone system call that
 * makes a process of its own, which the C library's fork does not see: interpose/clone.c). */
void _al_process_atfork_prepare(void);
void _al_process_atfork_parent(void);
void _al_process_atfork_child(void);
/* SIG, left at its default action by the program, is about to end the process: the same, but
 * the report says the process ended by SIG. */
void _al_process_before_fatal_signal(int sig, bool *own_memory);

/* ---- allocator.c: which library really serves the calls ----------------------------------- */

struct al_allocator_info {
    char name[64];
    char path[512];
    char version[64];
    char requested[512];   /* what the user asked for, when it differs from what serves */
    bool program_defines_malloc;
    const struct al_alloc_config *config; /* what the pre-run probe found, or NULL; classes[]
                                             filled only where indexed (full mode) */
    char config_path[512];
    char config_reason[512]; /* why there is no config */
    const char *threshold_source; /* "config", "option" or "default" */
};

extern struct al_allocator_info _al_allocator AL_HIDDEN;

void _al_allocator_identify(struct al_allocator_info *a, const void *real_malloc,
                            const void *own_malloc, const char *requested);

/* The loaded object holding ADDR: where its mappings start (one value per object), its path
 * ("" for the program itself), and the bounds of the segment holding ADDR; and, for
 * _al_object_may_define, its dynamic section (NULL: none). */
struct al_object {
    uintptr_t base;
    const char *path;
    uintptr_t seg_lo, seg_hi;
    uintptr_t bias, end;           /* its load bias; the end of its last segment */
    const Elf64_Dyn *dynamic;
    bool dynamic_relocated;        /* the loader wrote addresses over its offsets */
};
bool _al_object_of(const void *addr, struct al_object *out);
/* A library's code, [lo, hi) (empty where unknown): whose code a return address is in tells
 * whose call it is. */
struct al_code {
    uintptr_t lo, hi;
};
/* The code segment holding FN, into *C (left as it was where none does). */
void _al_code_of(const void *fn, struct al_code *c);
AL_INLINE bool _al_code_holds(const struct al_code *c, const void *pc)
{
    return (uintptr_t)pc - c->lo < c->hi - c->lo;
}
/* Our own code (process.c sets it at start-up) and libunwind's (sampler.c): our frames are
 * left out of sampled stacks; a call of read, close, pipe2, open or sigprocmask made from
 * libunwind's code while the sampler unwinds is libunwind's, one from elsewhere comes from a
 * signal handler of the program's that interrupted the stack walk, and is the program's. */
extern struct al_code _al_self_code, _al_unwinder_code AL_HIDDEN;
/* False only where O's GNU hash table says it defines no symbol NAME (any version): what
 * spares start-up a failed dlsym, each of which formats and allocates an error message (twenty
 * of them, the C++ operators, in a C program under glibc). True where it cannot tell. */
bool _al_object_may_define(const struct al_object *o, const char *name);
/* Loads the allocator's description (ALLOCLENS_CONFIG, else the cached probe result for the
 * library serving the calls); a config that cannot be read, or that describes another library
 * than the one serving the calls, is reported and not used. Its classes are kept as runs
 * alone unless CLASSES asks for classes[] too (what full mode's class table indexes, but for
 * one run of classes, which it works out). */
void _al_allocator_load_config(struct al_allocator_info *a, const char *path, bool classes);

/* ---- report.c / report_json.c / report_text.c --------------------------------------------- */

struct al_report {
    pid_t pid;
    const char *argv;      /* the command line as the image started, NUL-separated */
    size_t argv_len;
    uint64_t runtime_ns;
    bool has_exit_status;
    int exit_status;
    int end_signal;        /* the signal ending the process (no exit status), or 0 */
    double cycles_per_ns;
    struct al_allocator_info allocator;
    uint64_t large_threshold;
    struct al_thread_totals threads;
    struct al_measure_totals measure;
    struct al_row rows[AL_ROWS];
    uint64_t *hist;        /* AL_ROWS x AL_HIST_BUCKETS */
    bool first_excluded;
    bool first_in_run;     /* made after the image started (else in its start-up, or a parent's) */
    unsigned first_row;
    uint64_t first_cycles;
    size_t profiler_bytes; /* mapped for the profiler's state (the shadow table: resident) */
    size_t shadow_bytes;   /* of profiler_bytes, the shadow table's (resident) */
    size_t peak_rss_bytes; /* the process's peak resident size so far (VmHWM), 0: unknown */
    uint64_t start_tsc;    /* when the image started */
};

/* report.c: figures both writers print, computed once. */
double _al_report_ns(const struct al_report *r, double cycles);
/* System calls of kind K inside allocator calls, all ops together: how many, and their cycles. */
void _al_report_syscall_total(const struct al_report *r, unsigned k, uint64_t *count, uint64_t *cycles);
/* Event E's average per counted call of OP. */
double _al_report_counter(const struct al_report *r, unsigned op, unsigned e);
uint64_t _al_report_alloc_cycles(const struct al_report *r); /* every row, and the first call */
struct al_row_stats {
    const char *op, *size_class, *reuse, *phase;
    double mean;                 /* cycles */
    uint64_t p50, p99, p999;     /* cycles */
};
void _al_report_row(const struct al_report *r, unsigned row, struct al_row_stats *s);

void _al_report_json(struct al_buf *b, const struct al_report *r);
void _al_report_memory_json(struct al_buf *b, const struct al_report *r);
void _al_report_memory_text(struct al_buf *b, const struct al_report *r);
void _al_report_text(struct al_buf *b, const struct al_report *r);

enum al_report_kind {
    AL_REPORT_EXIT,   /* STATUS: the exit status */
    AL_REPORT_EXEC,   /* the image is about to be replaced */
    AL_REPORT_SIGNAL, /* STATUS: the signal about to end the process */
    AL_REPORT_STRICT, /* a thread is about to enter seccomp's strict mode: the state now */
};
/* Gathers the process's report and writes it where the settings say. */
void _al_report_write(enum al_report_kind kind, bool has_status, int status);
/* Whether this process has a report to write at its end (not a side process without -o). */
bool _al_report_planned(void);
/* The program closes fd 2: in a process with a report to write, which says on stderr what
 * became of it (the run's main one may write the text report there), a copy of it is kept. */
void _al_report_stderr_closing(void);
/* Whether this process writes the pprof profile at its end (the run's main one, asked to). */
bool _al_report_writes_pprof(void);
/* Set while this thread writes a report: calls it makes with no state are forwarded, uncounted. */
extern __thread bool _al_reporting __attribute__((tls_model("initial-exec"))) AL_HIDDEN;
/* Waits, up to MS milliseconds, for a report another thread has begun to be written. */
void _al_report_wait_written(unsigned ms);
/* The signals that end a process by default, asking it to stop, telling it it is over a limit
 * or that it crashed (SIGTRAP left out: debuggers): blocked while the report is written;
 * where the program leaves them at their default, they write it (signals.c). A crash cannot
 * wait for the end of one of our calls that it interrupted: a fault would come again at once,
 * and abort() goes on to its own default. */
#define AL_ENDING_SIGNALS 15
struct al_ending_signal {
    int sig;
    bool crash;
};
extern const struct al_ending_signal _al_ending_signals[AL_ENDING_SIGNALS] AL_HIDDEN;
void _al_report_forget_exec(void);
/* A new image (ARGV: its command line) or a forked child (ARGV NULL: its parent's): its report
 * is still to come. */
void _al_report_restart(int argc, char *const argv[]);


#endif
