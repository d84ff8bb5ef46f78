/* Signals: the report of a process that a signal ends, and syscall user dispatch's SIGSYS.
 *
 * A signal whose default action ends the process (Ctrl-C, a broken pipe, kill, a resource
 * limit, abort(), a bad memory access) would end it with no report. While the program leaves
 * such a signal at its default, our handler stands in for the default: it writes the report,
 * puts the default back and raises the signal again, so the process ends by it as it would
 * have (a crash's core dump then shows the raise, with the faulting frame below our handler's,
 * as glibc's old libSegFault left it). The program is told the disposition is the default,
 * and whatever it sets replaces ours (its own default brings ours back). For SIGSEGV and
 * SIGBUS the handler runs on the thread's alternate signal stack where it has one, so that a
 * stack overflow gets its report; without one no handler can run on the overflowed stack, and
 * the kernel ends the process as it would have.
 *
 * While alloclens counts the allocator's system calls with syscall user dispatch:
 * The kernel turns a dispatched system call into SIGSYS, and if SIGSYS is blocked at that
 * moment it kills the process instead. So: SIGSYS belongs to the program but our handler must
 * stay installed (sigaction and signal for SIGSYS record what the program asks for and report
 * it back; our handler passes every SIGSYS that is not ours to it); no mask the program sets,
 * for a thread or for a handler, may block SIGSYS; and the program's handlers run with the
 * selector open, since one may interrupt an allocator call and make system calls of its own.
 * Without dispatch every call goes straight through. */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "interpose.h"

static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);
static int (*real_sigprocmask)(int, const sigset_t *, sigset_t *);
static int (*real_pthread_sigmask)(int, const sigset_t *, sigset_t *);
static void (*real_abort)(void) __attribute__((noreturn));

/* The program's handlers, as it asked for them. Those we wrap are installed as
 * run_program_handler, which the program is never handed: it is told what it asked for. */
static struct sigaction program[_NSIG];

/* Those of _al_ending_signals whose default our handler stands in for in this process, at
 * start and whenever the program puts the default back: one ignored at start (nohup, a
 * non-interactive shell's background job) is left ignored, but a program may set its default
 * itself (node does, for every signal, then installs one-shot handlers of its own). */
static bool ending[_NSIG];

void _al_signals_resolve(void)
{
    AL_NEXT(real_sigaction, "sigaction");
    AL_NEXT(real_sigprocmask, "sigprocmask");
    AL_NEXT(real_pthread_sigmask, "pthread_sigmask");
    AL_NEXT(real_abort, "abort");
}

static bool dispatching(void)
{
    return _al_syscalls.dispatch;
}

static int set_action(int sig, const struct sigaction *act, struct sigaction *old);
static void end_by_signal(int sig, siginfo_t *si, void *ctx);

/* SIG unblocked on this thread. */
static void unblock(int sig)
{
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    real_pthread_sigmask(SIG_UNBLOCK, &only, NULL);
}

/* The program's handler for SIG, installed as this one where we must step in: while system
 * calls are dispatched (its handler runs with the selector open), and for a handler of an
 * ending signal that asks for the default back on the way in (SA_RESETHAND, as node's for
 * SIGINT and SIGTERM, which then raise the signal again): the kernel would put SIG_DFL back,
 * past our wrappers; the program's SIG_DFL, set as the wrapper sets it, brings ours back
 * instead, so the raise writes the report. */
static void run_program_handler(int sig, siginfo_t *si, void *ctx)
{
    _al_selector_open();
    struct sigaction a = program[sig];
    if (a.sa_flags & SA_RESETHAND) {
        set_action(sig, &(struct sigaction){ .sa_handler = SIG_DFL }, NULL);
        /* Blocked until now (set_action) so that a second one waited for the default, as the
         * kernel's reset on delivery makes it: deliverable in the handler again if asked. */
        if ((a.sa_flags & SA_NODEFER) && !sigismember(&a.sa_mask, sig))
            unblock(sig);
    }
    _al_signal_run(&a, sig, si, ctx);
}

static bool ours(const struct sigaction *a)
{
    return a->sa_sigaction == run_program_handler || a->sa_sigaction == end_by_signal;
}

static void put_default(int sig)
{
    struct sigaction dfl = { .sa_handler = SIG_DFL };
    real_sigaction(sig, &dfl, NULL);
}

/* Whether SIG, one of _al_ending_signals, can wait for the end of the call it interrupted: not
 * a crash, whose faulting instruction would run again, unless another process sent it with
 * kill (then no instruction of ours faulted). */
static bool can_wait(int sig, const siginfo_t *si)
{
    if (si && si->si_code == SI_USER && si->si_pid != getpid())
        return true;
    for (unsigned i = 0; i < AL_ENDING_SIGNALS; i++)
        if (_al_ending_signals[i].sig == sig)
            return !_al_ending_signals[i].crash;
    return false;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* How long after a held signal another one is taken as coming with it. */
#define HELD_TOGETHER_NS (50u * 1000000u)

/* A signal the program leaves at its default is about to end the process. Inside one of our
 * calls, whose state is half-updated (with the allocator's locks perhaps held), the report
 * cannot be gathered: a signal that can wait is raised again where the call ends
 * (_al_unbusy), microseconds later, with no code of the program's run in between. */
static void end_by_signal(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    /* Open for the rest of an allocator call this interrupted, as for the program's handlers
     * (run_program_handler): returning takes a system call outside our trampoline. */
    struct al_thread *t = _al_selector_open();
    if (t && _al_busy_in_call(t)) {
        if (!t->ending_signal && can_wait(sig, si)) {
            t->ending_signal = sig;
            t->ending_since = now_ns();
            return;
        }
        /* Another right behind the held one (timeout(1) signals the process, then its group)
         * comes with it, as a signal already pending absorbs the next: the held one ends the
         * process when the call ends. Later, the thread may be busy for good (a handler of the
         * program's jumped out of the call with siglongjmp) and the held one never raised:
         * this one ends the process, with a line instead of the report. */
        if (t->ending_signal && now_ns() - t->ending_since < HELD_TOGETHER_NS)
            return;
    }
    _al_process_before_fatal_signal(sig, &_al_own_memory);
    /* Another thread may be writing the report already (a second signal, or exit). */
    _al_report_wait_written(2000);
    put_default(sig);
    unblock(sig);
    raise(sig);
    for (;;) /* not reached: the default action of every signal here ends the process */
        syscall(SYS_exit_group, 128 + sig);
}

static struct sigaction end_action(int sig)
{
    struct sigaction a = { .sa_sigaction = end_by_signal, .sa_flags = SA_SIGINFO | SA_RESTART };
    /* A stack overflow's signal, on the thread's alternate stack where it has one; no other:
     * such a stack may be small, and it is the program's. */
    if (sig == SIGSEGV || sig == SIGBUS)
        a.sa_flags |= SA_ONSTACK;
    /* Nothing of the program's runs while the report is written; SIGSYS must stay open. */
    sigfillset(&a.sa_mask);
    sigdelset(&a.sa_mask, SIGSYS);
    return a;
}

void _al_signals_start(void)
{
    if (!_al_report_planned())
        return; /* nothing to write at the end: the defaults stay as they are */
    struct sigaction cur;
    for (unsigned i = 0; i < AL_ENDING_SIGNALS; i++) {
        int sig = _al_ending_signals[i].sig;
        struct sigaction mine = end_action(sig);
        ending[sig] = true;
        /* Ignored or handled already: left alone until the program sets the default. */
        if (real_sigaction(sig, NULL, &cur) == 0 && cur.sa_handler == SIG_DFL)
            real_sigaction(sig, &mine, NULL);
    }
}

/* abort() called through its symbol (the C library's own calls, assert's, come to our handler):
 * while our handler stands in for SIGABRT's default, the report is written here, on the
 * caller's stack, and the default put back before the C library raises it. abort() may be
 * called from a handler running on a small alternate stack (Rust's, on a stack overflow),
 * where the kernel has no room left for our handler's frame and would end the process with
 * SIGSEGV instead. */
AL_EXPORT void abort(void)
{
    if (AL_UNLIKELY(!real_sigaction))
        _al_signals_resolve();
    struct sigaction cur;
    if (ending[SIGABRT] && real_sigaction(SIGABRT, NULL, &cur) == 0 && cur.sa_sigaction == end_by_signal) {
        _al_process_before_fatal_signal(SIGABRT, &_al_own_memory);
        put_default(SIGABRT);
    }
    if (AL_LIKELY(real_abort != NULL))
        real_abort();
    raise(SIGABRT);
    for (;;) /* not reached */
        syscall(SYS_exit_group, 128 + SIGABRT);
}

/* The mask change HOW SET asks for, SIGSYS left deliverable (in *COPY where it must change). */
const sigset_t *_al_signals_deliverable(int how, const sigset_t *set, sigset_t *copy)
{
    if (how == SIG_UNBLOCK || !set || !dispatching() || !sigismember(set, SIGSYS))
        return set;
    *copy = *set;
    sigdelset(copy, SIGSYS);
    return copy;
}

/* sigaction in a vfork child, which shares its parent's memory but not its dispositions (gdb's
 * puts every signal back to its default before its exec): the change is the child's alone, so
 * none of the tables above may record it. Its SIGSYS stays ours until the exec, which puts
 * the default back anyway; only "ignored" outlives an exec, so that one is passed on. */
static int child_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (sig == SIGSYS && _al_syscalls_owns_sigsys() && !(act && act->sa_handler == SIG_IGN))
        return _al_syscalls_program_sigaction(NULL, old);
    int r = real_sigaction(sig, act, old);
    if (r == 0 && old && sig > 0 && sig < _NSIG && ours(old))
        *old = program[sig];
    return r;
}

AL_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (AL_UNLIKELY(!real_sigaction))
        _al_signals_resolve();
    if (AL_UNLIKELY(_al_process_shared_child()))
        return child_sigaction(sig, act, old);
    if (sig == SIGSYS && _al_syscalls_owns_sigsys())
        return _al_syscalls_program_sigaction(act, old);
    if (sig <= 0 || sig >= _NSIG || (!dispatching() && !ending[sig]))
        return real_sigaction(sig, act, old);
    return set_action(sig, act, old);
}

/* sigaction for a signal whose handlers we step in for (while dispatching, or an ending one):
 * the program's request recorded, and what stands in for it installed. */
static int set_action(int sig, const struct sigaction *act, struct sigaction *old)
{
    struct sigaction prev = program[sig];
    struct sigaction mine;
    const struct sigaction *use = act;
    if (act && act->sa_handler == SIG_DFL && ending[sig]) {
        mine = end_action(sig);
        use = &mine;
    } else if (act && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN &&
               (dispatching() || (act->sa_flags & SA_RESETHAND))) {
        mine = *act;
        mine.sa_flags = (mine.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
        mine.sa_sigaction = run_program_handler;
        if (act->sa_flags & SA_RESETHAND) { /* see run_program_handler */
            mine.sa_flags &= ~SA_NODEFER;
            sigaddset(&mine.sa_mask, sig);
        }
        if (dispatching())
            sigdelset(&mine.sa_mask, SIGSYS);
        use = &mine;
    }
    int r = real_sigaction(sig, use, old);
    if (r == 0) {
        if (old && ours(old))
            *old = prev;
        if (act)
            program[sig] = *act;
    }
    return r;
}

extern __typeof__(sigaction) __sigaction __attribute__((alias("sigaction"), copy(sigaction), visibility("default")));

/* libunwind blocks signals around its locks with sigprocmask(SIG_SETMASK) of a set made by
 * sigfillset, and puts the saved mask back the same way; the C library leaves SIGCANCEL and
 * SIGSETXID (SIGTIMER, 32, is SIGCANCEL) out of both the filled set and any mask it sets. A
 * sample taken on a SIGEV_THREAD timer's helper thread, which keeps SIGTIMER blocked to wait
 * for it, unblocked it, and an expiry that came before the helper waited again killed the
 * process (one run in five with a 100 us timer, every mode). libunwind's calls (made from its
 * code) are made here as the system call, which sets exactly the mask given, and its blocking
 * one (a mask set with the old one kept) blocks that set on top of the mask there was. */
static int unwinder_sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
    if (how == SIG_SETMASK && set && old)
        how = SIG_BLOCK;
    long r = syscall(SYS_rt_sigprocmask, how, set, old, _NSIG / 8);
    return r < 0 ? -1 : 0;
}

AL_EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
    if (AL_UNLIKELY(!real_sigprocmask))
        _al_signals_resolve();
    sigset_t copy;
    if (AL_UNLIKELY(_al_code_holds(&_al_unwinder_code, __builtin_return_address(0))))
        return unwinder_sigprocmask(how, _al_signals_deliverable(how, set, &copy), old);
    return real_sigprocmask(how, _al_signals_deliverable(how, set, &copy), old);
}

AL_EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
    if (AL_UNLIKELY(!real_pthread_sigmask))
        _al_signals_resolve();
    sigset_t copy;
    if (AL_UNLIKELY(_al_code_holds(&_al_unwinder_code, __builtin_return_address(0)))) {
        int r = unwinder_sigprocmask(how, _al_signals_deliverable(how, set, &copy), old);
        return r < 0 ? errno : 0;
    }
    return real_pthread_sigmask(how, _al_signals_deliverable(how, set, &copy), old);
}
