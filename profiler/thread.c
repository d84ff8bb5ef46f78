/* Per-thread state and the registry of threads.
 *
 * Each thread counts into its own state, found through one initial-exec TLS pointer, so the
 * hot path takes no lock and shares no cache line. The registry (a list under a spinlock,
 * touched only when a thread starts, exits or a report is gathered) lets the report sum the
 * threads still running, and keeps what exited threads counted. States of exited threads are
 * zeroed and reused, so a program that starts a million short threads does not grow us.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "profiler.h"

#define HIST_BYTES ((size_t)AL_ROWS * AL_HIST_BUCKETS * sizeof(uint64_t))
#define ROW_HIST_BYTES (AL_HIST_BUCKETS * sizeof(uint64_t))

/* glibc's registration of a thread's exit callback (what C++ thread_local destructors use):
 * unlike a pthread key it takes nothing from the program's own limits. */
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *obj, void *dso);
extern void *__dso_handle;

__thread struct al_thread *_al_tls __attribute__((tls_model("initial-exec")));
__thread char _al_lock_owner __attribute__((tls_model("initial-exec"))); /* its address: spin.h */

/* What every start writes comes first, on one page; the tables only exiting threads write
 * come after it. */
static struct {
    _Atomic int lock;
    struct al_thread *live;
    struct al_thread *spare;
    int live_threads;              /* started through our pthread_create, and the first */
    uint64_t total, max_live;
    uint64_t phase_since;
    uint64_t serial_cycles, parallel_cycles;
    uint64_t *hist;                /* exited threads */
    struct al_row rows[AL_ROWS];   /* exited threads */
    uint64_t *hist_rows[AL_ROWS];  /* the same, a pointer per row, NULL while the row is empty */
    struct al_measure_totals extra; /* exited threads */
    _Atomic unsigned nlate;        /* live states with a late_tid (changed under the lock) */
} reg = { .live_threads = 1, .total = 1, .max_live = 1 };

/* The lock is held with every signal blocked but SIGSYS (syscall user dispatch needs it
 * deliverable; nothing here raises it): a handler of the program's that allocates, or ends the
 * process with a report, on a thread holding the lock would take it again and spin for ever. A
 * timer's handler that allocated did so on a thread making its state (whose first allocation,
 * with no state yet to mark it busy, takes the lock for the spare list), and every other thread
 * then spun at its exit, and the report at the program's. Only rare paths take it: a thread's
 * start and end, pthread_create, fork, snapshots and the report. */
static __thread sigset_t unlocked_mask, fork_mask;

static void block_signals(void)
{
    _al_signals_block_all(&unlocked_mask);
}

static void restore_signals(void)
{
    _al_signals_restore(&unlocked_mask);
}

static void lock(void)
{
    block_signals();
    _al_spin_lock(&reg.lock);
}

static void unlock(void)
{
    _al_spin_unlock(&reg.lock);
    restore_signals();
}

/* Adds SRC's rows and histograms (one array per row, NULL for rows never timed) to DST's
 * (one flat AL_ROWS x AL_HIST_BUCKETS table, or NULL). A row's `timed` counts only the timed
 * calls that are in no histogram of its owner (there was no memory for one, see
 * _al_thread_hist_row); the others are its histogram's total, kept nowhere else. A histogram
 * that DST has no table for becomes such calls of DST's. */
static void add_rows(struct al_row *dst, uint64_t *dst_hist, const struct al_row *src, uint64_t *const *src_hist)
{
    for (unsigned i = 0; i < AL_ROWS; i++) {
        dst[i].count += AL_READ(src[i].count);
        dst[i].cycles += AL_READ(src[i].cycles);
        dst[i].timed += AL_READ(src[i].timed);
        const uint64_t *s = __atomic_load_n(&src_hist[i], __ATOMIC_ACQUIRE);
        if (!s)
            continue;
        uint64_t *d = dst_hist ? dst_hist + (size_t)i * AL_HIST_BUCKETS : NULL;
        for (unsigned b = 0; b < AL_HIST_BUCKETS; b++) {
            uint64_t n = AL_READ(s[b]);
            if (d)
                d[b] += n;
            else
                dst[i].timed += n;
        }
    }
}

static void add_extra(struct al_measure_totals *d, const struct al_thread *t)
{
    uint64_t *dst = (uint64_t *)d;
    const uint64_t *src = (const uint64_t *)&t->m;
    for (size_t i = 0; i < sizeof *d / sizeof *dst; i++)
        dst[i] += AL_READ(src[i]);
}

/* Set once this thread's exit callback ran: calls it still makes (later destructors, and the
 * free of the callback's own list entry) get a state that is not registered again, or the
 * C library's loop over exit callbacks would never end. That state is kept, uncycled. */
static __thread bool exited __attribute__((tls_model("initial-exec")));

void _al_thread_measure_init(struct al_thread *t)
{
    /* A state made after the thread's exit (the C library's last frees, on its exit path,
     * where it blocks every signal, SIGSYS too) has its system calls go straight through: a
     * dispatched one would end the process. */
    _al_syscalls_thread_init(t, !exited);
    bool counting = _al_counters.available && !atomic_load_explicit(&_al_seccomp_on, memory_order_relaxed);
    t->ctr.countdown = counting ? _al_counters.sample_every : 0;
}

/* FORGET_HIST: in a forked child, whose copies of the histograms are the parent's pages until
 * written: dropped (a new one is made when the row is next timed) rather than zeroed, which
 * would copy them. The dropped copies cost the child nothing it ever touches. */
static void clear_state(struct al_thread *t, bool forget_hist)
{
    memset(t->rows, 0, sizeof t->rows);
    memset(&t->m, 0, sizeof t->m);
    t->nheld = 0;
    if (forget_hist)
        memset(t->hist, 0, sizeof t->hist);
    else
        for (unsigned i = 0; i < AL_ROWS; i++)
            if (t->hist[i])
                memset(t->hist[i], 0, ROW_HIST_BYTES);
    t->spawned = 0;
    t->late_tid = 0;
}

/* A row's histogram, made the first time the row is timed: a thread uses a handful of the
 * rows, so whole-table histograms per thread would be mostly empty. Kept with the state when
 * it is reused. */
AL_NOINLINE uint64_t *_al_thread_hist_row(struct al_thread *t, unsigned row)
{
    static uint64_t overflow[AL_HIST_BUCKETS] AL_LARGE_BSS; /* out of memory: counted, not attributed */
    uint64_t *h = _al_mem_alloc(ROW_HIST_BYTES);
    if (!h) { /* counted as timed but in no histogram; a later call tries again */
        AL_BUMP(t->rows[row].timed, 1);
        return overflow;
    }
    __atomic_store_n(&t->hist[row], h, __ATOMIC_RELEASE);
    return h;
}

/* Phase time: cycles spent with one live thread (serial) or more (parallel). Lock held. */
static void phase_account(int live_before)
{
    uint64_t now = _al_tsc();
    if (reg.phase_since) {
        if (live_before > 1)
            reg.parallel_cycles += now - reg.phase_since;
        else
            reg.serial_cycles += now - reg.phase_since;
    }
    reg.phase_since = now;
}

/* The live-thread count changes by D (registry lock held): the time so far goes to the phase
 * it ends, and the phase every call reads (a byte of _al_hot) follows. Returns the count
 * before. */
static int live_threads_add(int d)
{
    int before = reg.live_threads;
    reg.live_threads = before + d;
    bool parallel = reg.live_threads > 1;
    /* Written only when it changes: its line is read by every call on every CPU. */
    if (atomic_load_explicit(&_al_hot.parallel, memory_order_relaxed) != parallel)
        atomic_store_explicit(&_al_hot.parallel, parallel, memory_order_relaxed);
    phase_account(before);
    return before;
}

/* The exit callback's list entry: the C library allocates it while the callback is
 * registered and frees it right after the callback returns, with no state left here. Neither
 * call is the program's, and neither goes to the allocator: the entry is a thread-local of
 * ours, known at its free by its address. The allocator's, it made the main thread's exit()
 * call the allocator where the program did not: from a signal handler that interrupted the
 * allocator holding its lock, that free waited for the lock for ever (a helper's stress run,
 * jemalloc); and where the allocator had nothing left to give (an address-space limit the
 * program runs into), the C library ended the process over it. */
static __thread bool registering __attribute__((tls_model("initial-exec")));
static __thread void *entry __attribute__((tls_model("initial-exec")));
static __thread _Alignas(16) char entry_room[64] __attribute__((tls_model("initial-exec")));
/* From the callback's end to the entry's free, right after it, signals are blocked: a handler
 * that allocated in between would give the thread a state again, and the entry's free would
 * then take the path to the allocator, which never gave it. */
static __thread sigset_t entry_mask;

/* A thread a library's constructor or destructor started (interpose/threads.c): its creator
 * holds the loader's lock, and may wait for it, while registering an exit callback takes that
 * lock. Such a thread registers none; its start function's end is taken as its exit. */
static __thread bool exit_at_end __attribute__((tls_model("initial-exec")));

/* Set where the thread's exit callback is registered: that one takes its exit. */
static __thread bool registered __attribute__((tls_model("initial-exec")));

void _al_thread_exit_at_end(void)
{
    exit_at_end = true;
}

bool _al_thread_exits_at_end(void)
{
    return exit_at_end && !registered;
}

void *_al_thread_exit_entry(size_t size, size_t align)
{
    if (AL_LIKELY(!registering) || entry || size > sizeof entry_room || align > 16)
        return NULL;
    memset(entry_room, 0, sizeof entry_room); /* calloc's, as the C library asks */
    entry = entry_room;
    return entry;
}

bool _al_thread_exit_entry_free(const void *p)
{
    if (!p || p != entry)
        return false;
    entry = NULL;
    _al_signals_restore(&entry_mask);
    return true;
}

AL_COLD void _al_thread_ending_signal(struct al_thread *t)
{
    int sig = t->ending_signal;
    t->ending_signal = 0;
    raise(sig); /* to our handler again (signals.c), the thread no longer busy */
}

/* Lock held: T's counts into the registry's, and T off the live list, cleared. */
static void retire(struct al_thread *t)
{
    add_rows(reg.rows, reg.hist, t->rows, t->hist);
    for (unsigned i = 0; reg.hist && i < AL_ROWS; i++)
        if (t->hist[i])
            reg.hist_rows[i] = reg.hist + (size_t)i * AL_HIST_BUCKETS;
    add_extra(&reg.extra, t);
    _al_waste_thread_retire(t);
    for (struct al_thread **pp = &reg.live; *pp; pp = &(*pp)->next) {
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    }
    if (t->spawned)
        live_threads_add(-1);
    if (t->late_tid)
        reg.nlate--;
    clear_state(t, false);
}

static void thread_exit(void *arg)
{
    struct al_thread *t = arg;
    exited = true;
    t->busy = AL_BUSY_EXITING;
    /* Before the state can be handed to a new thread, which must not read these fds nor have
     * its selector read for this one; system calls, so not with the registry's lock held. */
    _al_counters_thread_close(&t->ctr, false);
    bool reusable = _al_syscalls_thread_exit(t);
    lock();
    retire(t);
    if (reusable) {
        t->next = reg.spare;
        reg.spare = t;
    }
    unlock();
    /* Calls this thread still makes (later TLS destructors) start a fresh state, not
     * registered again (see exited). */
    if (entry == entry_room)
        _al_signals_block_all(&entry_mask);
    _al_tls = NULL;
}

void _al_thread_end(void)
{
    struct al_thread *t = _al_tls;
    if (!exit_at_end || registered || !t || exited)
        return;
    /* Its counters' close(2) is a cancellation point, where a cancel still pending at the
     * function's return would act halfway through. */
    int cancel = _al_nocancel_begin();
    thread_exit(t);
    _al_nocancel_end(cancel);
}

void _al_threads_init(void)
{
    reg.hist = _al_mem_map(HIST_BYTES);
    reg.phase_since = _al_tsc();
}

void _al_threads_phase_restart(void)
{
    lock();
    reg.serial_cycles = reg.parallel_cycles = 0;
    reg.phase_since = _al_tsc();
    unlock();
}

/* The C library still calls free at a thread's very end, after its exit callback (its own
 * buffers, at __libc_thread_freeres): each such thread got a state of its own that was never
 * reused, 12 KiB a thread for good, and the report and every fork walked them all. Such a
 * state is retired, its counts kept, and reused once its thread is gone: the kernel no longer
 * knows the thread's id. (A reused id only keeps it a while longer.) Checked when a state is
 * wanted and none is spare, the oldest few at a time; the checks are system calls, so not under
 * the lock. */
#define LATE_BATCH 8

static void reap_late(void)
{
    struct al_thread *cand[LATE_BATCH];
    pid_t tid[LATE_BATCH];
    /* The oldest ones, likeliest gone: the list has the newest first. */
    unsigned seen = 0;
    lock();
    for (struct al_thread *t = reg.nlate ? reg.live : NULL; t; t = t->next)
        if (t->late_tid) {
            cand[seen % LATE_BATCH] = t;
            tid[seen++ % LATE_BATCH] = t->late_tid;
        }
    unlock();
    unsigned n = seen < LATE_BATCH ? seen : LATE_BATCH;
    if (!n)
        return;
    int saved = errno;
    pid_t pid = getpid();
    for (unsigned i = 0; i < n; i++)
        if (!(syscall(SYS_tgkill, pid, tid[i], 0) < 0 && errno == ESRCH))
            cand[i] = NULL;
    errno = saved;
    /* Another thread may have retired one meanwhile: only one still late for the same id is. */
    lock();
    for (unsigned i = 0; i < n; i++) {
        if (cand[i] && cand[i]->late_tid == tid[i])
            retire(cand[i]);
        else
            cand[i] = NULL;
    }
    unlock();
    for (unsigned i = 0; i < n; i++)
        if (cand[i])
            _al_counters_thread_close(&cand[i]->ctr, false);
    lock();
    for (unsigned i = 0; i < n; i++) {
        if (cand[i]) {
            cand[i]->next = reg.spare;
            reg.spare = cand[i];
        }
    }
    unlock();
}

static struct al_thread *take_spare(void)
{
    lock();
    struct al_thread *t = reg.spare;
    if (t)
        reg.spare = t->next;
    unlock();
    return t;
}

/* Set on a thread pthread_create started, by its first instructions (interpose/threads.c),
 * which counted it already. Threads the C library starts itself (a SIGEV_THREAD timer's
 * helper and the threads it starts per expiry, by internal calls past the interposed
 * pthread_create) are counted when they first allocate: before, they were missing from the
 * report's thread counts, and their calls counted as the serial phase's. */
static __thread bool announced __attribute__((tls_model("initial-exec")));

void _al_thread_announced(void)
{
    announced = true;
}

/* Lock held: one more thread live (of the ones started since the report's counts began). */
static void thread_born(void)
{
    int before = live_threads_add(1);
    reg.total++;
    if ((uint64_t)before + 1 > reg.max_live)
        reg.max_live = (uint64_t)before + 1;
}

static struct al_thread *attach(void)
{
    struct al_thread *t = take_spare();
    if (!t && atomic_load_explicit(&reg.nlate, memory_order_relaxed)) {
        reap_late();
        t = take_spare();
    }
    if (!t) {
        t = _al_mem_map(sizeof *t);
        if (!t)
            return NULL;
    }
    t->busy = 1;
    t->ending_signal = 0; /* a state copied into a fork child may hold its thread's */
    for (unsigned i = 0; i < AL_SHADOW_CACHE_WAYS; i++)
        t->region.e[i].key = AL_SHADOW_NO_KEY;
    _al_sampler_thread_init(t);
    _al_waste_thread_init(t);
    _al_thread_measure_init(t);
    _al_tls = t;
    pid_t late = exited ? gettid() : 0;
    bool unseen = !exited && !announced && gettid() != getpid();
    lock();
    t->late_tid = late;
    reg.nlate += late != 0;
    if (unseen) {
        thread_born();
        t->spawned = 1;
    }
    t->next = reg.live;
    reg.live = t;
    unlock();
    /* Allocates its list entry: busy is set, so that nested call is forwarded, not counted.
     * If it fails the thread's counts stay in the registry as if it were still running. */
    if (!exited && !exit_at_end) {
        registering = true;
        entry = NULL;
        registered = __cxa_thread_atexit_impl(thread_exit, t, &__dso_handle) == 0;
        registering = false;
    }
    return t;
}

/* With every signal blocked but SIGSYS, as the registry's lock: a handler that allocates on a
 * thread making its state, before _al_tls names it, would make a second state inside the first,
 * and both would register the one exit entry (a loop in the C library's list, freed twice). */
struct al_thread *_al_thread_attach(void)
{
    sigset_t old;
    _al_signals_block_all(&old);
    struct al_thread *t = attach();
    _al_thread_signals_restore(t, &old);
    return t;
}

void _al_thread_signals_restore(const struct al_thread *t, sigset_t *old)
{
    if (t && t->dispatching)
        sigdelset(old, SIGSYS); /* unblocked by the state's making (syscalls.c), and kept so */
    _al_signals_restore(old);
}

void _al_thread_spawning(void)
{
    lock();
    thread_born();
    unlock();
}

void _al_thread_spawn_failed(void)
{
    lock();
    live_threads_add(-1);
    reg.total--;
    unlock();
}

void _al_thread_started(struct al_thread *t)
{
    t->spawned = 1;
}

void _al_threads_atfork_prepare(void)
{
    lock();
}

void _al_threads_atfork_parent(void)
{
    unlock();
}

void _al_threads_after_fork_child(void)
{
    /* Only the forking thread exists in the child, and the child's report covers the child
     * alone: every other state goes back to the spare list, every count starts at zero. */
    struct al_thread *self = _al_tls;
    struct al_thread *t = reg.live;
    reg.live = NULL;
    while (t) {
        struct al_thread *next = t->next;
        _al_counters_thread_close(&t->ctr, true);
        if (t != self)
            _al_waste_thread_retire(t); /* its objects live on in the child */
        clear_state(t, true);
        if (t == self) {
            t->next = reg.live;
            reg.live = t;
        } else {
            t->next = reg.spare;
            reg.spare = t;
        }
        t = next;
    }
    memset(reg.rows, 0, sizeof reg.rows);
    memset(&reg.extra, 0, sizeof reg.extra);
    reg.nlate = 0; /* every state cleared: the child's threads are new */
    /* Zero without touching: writing the table would copy or fault in every page of it. */
    memset(reg.hist_rows, 0, sizeof reg.hist_rows);
    if (reg.hist)
        madvise(reg.hist, HIST_BYTES, MADV_DONTNEED);
    reg.live_threads = 1;
    atomic_store_explicit(&_al_hot.parallel, false, memory_order_relaxed);
    reg.total = reg.max_live = 1;
    reg.serial_cycles = reg.parallel_cycles = 0;
    reg.phase_since = _al_tsc();
    /* Signals stay blocked until _al_threads_fork_done. */
    fork_mask = unlocked_mask;
    _al_spin_unlock(&reg.lock);
}

void _al_threads_fork_done(void)
{
    _al_signals_restore(&fork_mask);
}

void _al_threads_collect(struct al_row *rows, uint64_t *hist, struct al_thread_totals *tot,
                         struct al_measure_totals *extra)
{
    lock();
    add_rows(rows, hist, reg.rows, reg.hist_rows);
    *extra = reg.extra;
    for (struct al_thread *t = reg.live; t; t = t->next) {
        add_rows(rows, hist, t->rows, t->hist);
        add_extra(extra, t);
    }
    /* The report's rows count every timed call; its histograms hold those they could. */
    for (unsigned i = 0; hist && i < AL_ROWS; i++)
        for (unsigned b = 0; rows[i].count && b < AL_HIST_BUCKETS; b++)
            rows[i].timed += hist[(size_t)i * AL_HIST_BUCKETS + b];
    phase_account(reg.live_threads);
    tot->total = reg.total;
    tot->max_live = reg.max_live;
    tot->serial_cycles = reg.serial_cycles;
    tot->parallel_cycles = reg.parallel_cycles;
    unlock();
}

uint64_t _al_threads_calls(void)
{
    uint64_t n = 0;
    lock();
    for (unsigned i = 0; i < AL_ROWS; i++)
        n += reg.rows[i].count;
    for (struct al_thread *t = reg.live; t; t = t->next)
        for (unsigned i = 0; i < AL_ROWS; i++)
            n += AL_READ(t->rows[i].count);
    unlock();
    return n;
}

static void add_classes(int64_t (*dst)[AL_CLS_N], int64_t (*src)[AL_CLS_N], uint32_t nslots, int pagemap)
{
    if (!src)
        return;
    uint64_t written[AL_TABLE_WORDS];
    _al_table_written(pagemap, src, nslots, sizeof *src, written);
    for (uint32_t s = 0; s < nslots; s++)
        if (_al_table_row_written(written, s, sizeof *src))
            for (unsigned k = 0; k < AL_CLS_N; k++)
                _al_add_nonzero(&dst[s][k], AL_READ(src[s][k]));
}

void _al_threads_sum_classes(int64_t (*dst)[AL_CLS_N], uint32_t nslots, int pagemap)
{
    lock();
    add_classes(dst, _al_waste.exited, nslots, pagemap);
    for (struct al_thread *t = reg.live; t; t = t->next)
        add_classes(dst, t->cls, nslots, pagemap);
    unlock();
}
