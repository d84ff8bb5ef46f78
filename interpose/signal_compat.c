/* The C library's other ways to set a disposition or a signal mask, made on our sigaction and
 * sigprocmask (signals.c) with the C library's semantics.
 *
 * The C library builds signal, sigset, sysv_signal, sighold, sigblock and the rest on its own
 * sigaction and sigprocmask, inside itself, past our wrappers: a handler set so was not
 * recorded (sigaction then reported the default, and a one-shot handler's reset skipped the
 * report), and a mask set so could block SIGSYS while system calls are dispatched, which ends
 * the process at the allocator's next system call. The waits that take a mask of their own
 * (sigsuspend, sigpause, pselect, ppoll, epoll_pwait) run the handlers of the signals they let
 * in with it: SIGSYS is taken out of it, as out of every other mask the program sets.
 * So do setcontext and swapcontext, with the mask of the context they switch to (a coroutine
 * library may give its contexts every signal blocked).
 * One difference: SIG_ERR as a disposition is refused (EINVAL) by sigset too, not only by
 * signal and sysv_signal. Not covered: sigvec (a compatibility symbol no program can link
 * against now), and the context of uc_link, which the C library switches to itself when a
 * makecontext function returns. */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <ucontext.h>

#include "interpose.h"

static int (*real_sigsuspend)(const sigset_t *);
static int (*real_pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
static int (*real_ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
static int (*real_ppoll_chk)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *, size_t);
static int (*real_epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);
static int (*real_epoll_pwait2)(int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
static int (*real_setcontext)(const ucontext_t *);
static int (*real_swapcontext)(ucontext_t *, const ucontext_t *);

static _Atomic bool resolved_all;

void _al_signal_compat_resolve(void)
{
    AL_NEXT(real_sigsuspend, "sigsuspend");
    AL_NEXT(real_pselect, "pselect");
    AL_NEXT(real_ppoll, "ppoll");
    AL_NEXT(real_ppoll_chk, "__ppoll_chk");
    AL_NEXT(real_epoll_pwait, "epoll_pwait");
    AL_NEXT(real_epoll_pwait2, "epoll_pwait2");
    AL_NEXT(real_setcontext, "setcontext");
    AL_NEXT(real_swapcontext, "swapcontext");
    atomic_store_explicit(&resolved_all, true, memory_order_release);
}

/* ---- dispositions -------------------------------------------------------------------------- */

/* siginterrupt's signals: signal() sets their handlers without SA_RESTART, as the C library's
 * does with its own record. */
static sigset_t interrupting;

static bool bad_signal(int sig, sighandler_t handler)
{
    if (handler != SIG_ERR && sig >= 1 && sig < _NSIG)
        return false;
    errno = EINVAL;
    return true;
}

/* BSD's: calls restarted (unless siginterrupt said otherwise), the signal blocked in its
 * handler. */
AL_EXPORT sighandler_t signal(int sig, sighandler_t handler)
{
    if (bad_signal(sig, handler))
        return SIG_ERR;
    struct sigaction act = { .sa_handler = handler }, old;
    act.sa_flags = sigismember(&interrupting, sig) == 1 ? 0 : SA_RESTART;
    sigemptyset(&act.sa_mask);
    sigaddset(&act.sa_mask, sig);
    return sigaction(sig, &act, &old) == 0 ? old.sa_handler : SIG_ERR;
}

extern __typeof__(signal) bsd_signal __attribute__((alias("signal"), copy(signal), visibility("default")));
extern __typeof__(signal) ssignal __attribute__((alias("signal"), copy(signal), visibility("default")));

/* System V's: a one-shot handler, the signal not blocked in it, calls interrupted. */
AL_EXPORT sighandler_t sysv_signal(int sig, sighandler_t handler)
{
    if (bad_signal(sig, handler))
        return SIG_ERR;
    struct sigaction act = { .sa_handler = handler, .sa_flags = SA_RESETHAND | SA_NODEFER }, old;
    sigemptyset(&act.sa_mask);
    return sigaction(sig, &act, &old) == 0 ? old.sa_handler : SIG_ERR;
}

extern __typeof__(sysv_signal) __sysv_signal __attribute__((alias("sysv_signal"), copy(sysv_signal), visibility("default")));

/* Sets DISP (a handler, SIG_DFL, SIG_IGN) and takes SIG out of the mask, or with SIG_HOLD
 * adds it to the mask; returns the disposition before, or SIG_HOLD if SIG was blocked. */
AL_EXPORT sighandler_t sigset(int sig, sighandler_t disp)
{
    if (bad_signal(sig, disp))
        return SIG_ERR;
    sigset_t set, before;
    struct sigaction act = { .sa_handler = disp }, old;
    sigemptyset(&set);
    if (sigaddset(&set, sig) < 0)
        return SIG_ERR;
    if (disp == SIG_HOLD) {
        if (sigprocmask(SIG_BLOCK, &set, &before) < 0)
            return SIG_ERR;
        if (sigismember(&before, sig))
            return SIG_HOLD;
        return sigaction(sig, NULL, &old) == 0 ? old.sa_handler : SIG_ERR;
    }
    sigemptyset(&act.sa_mask);
    if (sigaction(sig, &act, &old) < 0 || sigprocmask(SIG_UNBLOCK, &set, &before) < 0)
        return SIG_ERR;
    return sigismember(&before, sig) ? SIG_HOLD : old.sa_handler;
}

AL_EXPORT int sigignore(int sig)
{
    struct sigaction act = { .sa_handler = SIG_IGN };
    sigemptyset(&act.sa_mask);
    return sigaction(sig, &act, NULL);
}

/* Whether SIG's handler interrupts system calls (1) or has them restarted (0): the flag
 * changed in the disposition now, and kept for signal() to set later. */
AL_EXPORT int siginterrupt(int sig, int interrupt)
{
    struct sigaction act;
    if (sigaction(sig, NULL, &act) < 0)
        return -1;
    if (interrupt) {
        sigaddset(&interrupting, sig);
        act.sa_flags &= ~SA_RESTART;
    } else {
        sigdelset(&interrupting, sig);
        act.sa_flags |= SA_RESTART;
    }
    return sigaction(sig, &act, NULL) < 0 ? -1 : 0;
}

/* ---- masks --------------------------------------------------------------------------------- */

static int one_signal(int how, int sig)
{
    sigset_t set;
    sigemptyset(&set);
    if (sigaddset(&set, sig) < 0)
        return -1;
    return sigprocmask(how, &set, NULL);
}

AL_EXPORT int sighold(int sig)
{
    return one_signal(SIG_BLOCK, sig);
}

AL_EXPORT int sigrelse(int sig)
{
    return one_signal(SIG_UNBLOCK, sig);
}

/* BSD's masks: an int whose bit n stands for signal n + 1. */
static void from_bsd_mask(int mask, sigset_t *set)
{
    int saved = errno; /* sigaddset refuses the C library's own signals, as its mask does */
    sigemptyset(set);
    for (int sig = 1; sig <= 32; sig++)
        if ((unsigned)mask & (1u << (sig - 1)))
            sigaddset(set, sig);
    errno = saved;
}

static int bsd_mask(int how, int mask)
{
    sigset_t set, before;
    from_bsd_mask(mask, &set);
    sigemptyset(&before);
    sigprocmask(how, &set, &before);
    unsigned old = 0;
    for (int sig = 1; sig <= 32; sig++)
        if (sigismember(&before, sig) == 1)
            old |= 1u << (sig - 1);
    return (int)old;
}

AL_EXPORT int sigblock(int mask)
{
    return bsd_mask(SIG_BLOCK, mask);
}

AL_EXPORT int sigsetmask(int mask)
{
    return bsd_mask(SIG_SETMASK, mask);
}

/* ---- waits with a mask of their own ----------------------------------------------------------- */

/* Resolved at start-up (real.c); a call before that resolves them itself. */
static void resolved(void)
{
    if (AL_UNLIKELY(!atomic_load_explicit(&resolved_all, memory_order_acquire)))
        _al_signal_compat_resolve();
}

AL_EXPORT int sigsuspend(const sigset_t *mask)
{
    resolved();
    sigset_t copy;
    return real_sigsuspend(_al_signals_deliverable(SIG_SETMASK, mask, &copy));
}

extern __typeof__(sigsuspend) __sigsuspend __attribute__((alias("sigsuspend"), copy(sigsuspend), visibility("default")));

/* sigsuspend with the mask of the moment less SIG (IS_SIG: X/Open's sigpause), or with BSD's
 * mask SIG_OR_MASK. */
AL_EXPORT int __sigpause(int sig_or_mask, int is_sig)
{
    sigset_t set;
    if (is_sig) {
        sigprocmask(SIG_BLOCK, NULL, &set);
        if (sigdelset(&set, sig_or_mask) < 0)
            return -1;
    } else {
        from_bsd_mask(sig_or_mask, &set);
    }
    return sigsuspend(&set);
}

/* The exported sigpause is BSD's; <signal.h> names X/Open's __xpg_sigpause "sigpause" in C
 * (so this one is defined under another C name). */
int bsd_sigpause(int mask) __asm__("sigpause");

AL_EXPORT int bsd_sigpause(int mask)
{
    return __sigpause(mask, 0);
}

AL_EXPORT int __xpg_sigpause(int sig)
{
    return __sigpause(sig, 1);
}

AL_EXPORT int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *timeout,
                      const sigset_t *mask)
{
    resolved();
    sigset_t copy;
    return real_pselect(n, r, w, e, timeout, _al_signals_deliverable(SIG_SETMASK, mask, &copy));
}

AL_EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *timeout, const sigset_t *mask)
{
    resolved();
    sigset_t copy;
    return real_ppoll(fds, n, timeout, _al_signals_deliverable(SIG_SETMASK, mask, &copy));
}

/* ppoll as a program built with _FORTIFY_SOURCE calls it. */
AL_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *timeout,
                          const sigset_t *mask, size_t fds_len)
{
    resolved();
    sigset_t copy;
    return real_ppoll_chk(fds, n, timeout, _al_signals_deliverable(SIG_SETMASK, mask, &copy), fds_len);
}

AL_EXPORT int epoll_pwait(int fd, struct epoll_event *ev, int max, int timeout, const sigset_t *mask)
{
    resolved();
    sigset_t copy;
    return real_epoll_pwait(fd, ev, max, timeout, _al_signals_deliverable(SIG_SETMASK, mask, &copy));
}

AL_EXPORT int epoll_pwait2(int fd, struct epoll_event *ev, int max, const struct timespec *timeout,
                           const sigset_t *mask)
{
    resolved();
    if (!real_epoll_pwait2) { /* a C library older than 2.35 */
        errno = ENOSYS;
        return -1;
    }
    sigset_t copy;
    return real_epoll_pwait2(fd, ev, max, timeout, _al_signals_deliverable(SIG_SETMASK, mask, &copy));
}

/* ---- contexts -------------------------------------------------------------------------------- */

/* UCP as it may be switched to: where its mask blocks SIGSYS while system calls are
 * dispatched, a copy without, in the thread's state rather than on this stack, which
 * setcontext leaves before it has read all of the context. The C library reads the copy until
 * its last register is loaded, after the new mask lets signals in: a handler that switches
 * contexts itself there (a preemptive scheduler's SIGALRM) takes the next of the thread's
 * slots, not this one. (A thread with no state has no dispatch on.) */
static const ucontext_t *deliverable_context(const ucontext_t *ucp)
{
    struct al_thread *t = _al_tls;
    sigset_t mask;
    if (!t || !ucp || _al_signals_deliverable(SIG_SETMASK, &ucp->uc_sigmask, &mask) == &ucp->uc_sigmask)
        return ucp;
    ucontext_t *c = &t->contexts[t->next_context++ % AL_CONTEXT_SLOTS];
    *c = *ucp; /* its FP state pointer still points into UCP, which is read there */
    c->uc_sigmask = mask;
    return c;
}

AL_EXPORT int setcontext(const ucontext_t *ucp)
{
    resolved();
    return real_setcontext(deliverable_context(ucp));
}

AL_EXPORT int swapcontext(ucontext_t *oucp, const ucontext_t *ucp)
{
    resolved();
    /* Into itself: the C library saves the registers into OUCP, sets the mask it reads from
     * UCP while the old one is written over it, and loads the registers just saved. A copy
     * would be loaded instead; the mask, the one field read before it is written, is taken
     * out of SIGSYS where it is. */
    if (oucp == ucp && oucp) {
        sigset_t mask;
        if (_al_tls && _al_signals_deliverable(SIG_SETMASK, &oucp->uc_sigmask, &mask) != &oucp->uc_sigmask)
            oucp->uc_sigmask = mask;
        return real_swapcontext(oucp, oucp);
    }
    return real_swapcontext(oucp, deliverable_context(ucp));
}
