/* The allocator's own system calls: count and cycles of mmap, munmap, mremap, brk, madvise,
 * mprotect and futex made inside allocator calls, by the op and size class being served.
 *
 * glibc's malloc makes these calls internally, not through the interposable libc wrappers, so
 * they are caught with Linux syscall user dispatch: each thread asks the kernel to turn every
 * system call made outside our own trampoline page into a SIGSYS, but only while its selector
 * byte says "block", which the entry points set for the duration of the real allocator call.
 * The SIGSYS handler performs the call from the trampoline page, timed, and accounts for the
 * kinds above. A change of the signal mask is applied to the mask our sigreturn restores; a
 * call that cannot be made from a signal handler (rt_sigreturn of another handler, clone,
 * exec, sigsuspend...) is restarted where it was made with the selector open, so it runs
 * natively. Our handler returns through a restorer in the trampoline page.
 *
 * SIGSYS signals that are not ours (seccomp's, the program's own raise) go to the handler the
 * program installed, which the sigaction/signal wrappers record instead of installing. Where
 * the kernel lacks syscall user dispatch (or a seccomp filter refuses it), the section is
 * reported unavailable with the reason.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/futex.h>

#include "profiler.h"

#ifndef PR_SET_SYSCALL_USER_DISPATCH
#define PR_SET_SYSCALL_USER_DISPATCH 59
#define PR_SYS_DISPATCH_OFF 0
#define PR_SYS_DISPATCH_ON 1
#endif
#ifndef SYS_USER_DISPATCH
#define SYS_USER_DISPATCH 2
#endif
#define SA_RESTORER 0x04000000 /* the kernel's flag; glibc keeps it to itself */

/* ---- the trampoline page: every syscall we make on the program's behalf, and our restorer */

__asm__(".pushsection al_sud_text,\"ax\",@progbits\n"
        ".balign 4096\n"
        ".globl _al_sud_syscall\n"
        ".hidden _al_sud_syscall\n"
        "_al_sud_syscall:\n"          /* long (nr, a1, a2, a3, a4, a5, a6) */
        "  mov %rdi, %rax\n"
        "  mov %rsi, %rdi\n"
        "  mov %rdx, %rsi\n"
        "  mov %rcx, %rdx\n"
        "  mov %r8, %r10\n"
        "  mov %r9, %r8\n"
        "  mov 8(%rsp), %r9\n"
        "  syscall\n"
        "  ret\n"
        ".globl _al_sud_restorer\n"
        ".hidden _al_sud_restorer\n"
        "_al_sud_restorer:\n"
        "  mov $15, %rax\n"           /* rt_sigreturn */
        "  syscall\n"
        "  ud2\n"
        ".balign 64\n"
        ".popsection\n");

extern void _al_sud_restorer(void);
extern char __start_al_sud_text[], __stop_al_sud_text[];

struct al_syscalls_state _al_syscalls;

static const int tracked[AL_SYS_N] = {
    [AL_SYS_MMAP] = SYS_mmap, [AL_SYS_MUNMAP] = SYS_munmap, [AL_SYS_MREMAP] = SYS_mremap,
    [AL_SYS_BRK] = SYS_brk, [AL_SYS_MADVISE] = SYS_madvise, [AL_SYS_MPROTECT] = SYS_mprotect,
    [AL_SYS_FUTEX] = SYS_futex,
};

static const char *const names[AL_SYS_N] = {
    "mmap", "munmap", "mremap", "brk", "madvise", "mprotect", "futex",
};

const char *_al_syscall_name(unsigned k)
{
    return k < AL_SYS_N ? names[k] : "?";
}

static int kind_of(long nr)
{
    for (int k = 0; k < AL_SYS_N; k++)
        if (tracked[k] == nr)
            return k;
    return -1;
}

/* Counts one call of KIND made inside the allocator call T is in. */
static void account(struct al_thread *t, int kind, uint64_t cycles, bool futex_wait)
{
    unsigned slot = t->in_call - 1; /* op * 2 + large */
    AL_BUMP(t->m.sys.count[kind][slot], 1);
    AL_BUMP(t->m.sys.cycles[kind][slot], cycles);
    if (futex_wait)
        AL_BUMP(t->m.sys.futex_waits, 1);
}

/* ---- SIGSYS ------------------------------------------------------------------------------ */

/* SIGSYS's action set with the kernel directly, in the kernel's own layout: glibc's sigaction
 * would supply its own restorer, and the wrapper (signals.c) only records the program's.
 * Ours runs with every other signal blocked: a handler the program installed where our
 * wrappers did not see it (one set by a raw system call) must not run on top of ours once it
 * has set the selector back to "block": its return, a system call outside our trampoline,
 * would then be dispatched. Pending, it runs where the allocator call was. SIGSYS itself stays
 * deliverable (SA_NODEFER): the call we make for the allocator may be one the program's own
 * seccomp filter traps (SECCOMP_RET_TRAP, as sandboxes use), whose SIGSYS, blocked, the kernel
 * would turn into the end of the process; deliverable, it comes to this handler inside the
 * first and goes to the program's (forward_to_program), whose answer our call returns. */
static int kernel_sigaction(void *handler, unsigned long flags, void *restorer)
{
    struct {
        void *handler;
        unsigned long flags;
        void *restorer;
        uint64_t mask;
    } k = { handler, flags, restorer, handler == SIG_DFL ? 0 : ~0ull & ~(1ull << (SIGSYS - 1)) };
    return (int)syscall(SYS_rt_sigaction, SIGSYS, &k, NULL, 8);
}

static struct sigaction program_sigsys; /* what the program asked for SIGSYS (zero: SIG_DFL) */

static void forward_to_program(int sig, siginfo_t *si, void *ctx)
{
    struct sigaction a = program_sigsys;
    if (a.sa_handler == SIG_DFL) {
        /* As without us: the default action, which ends the process with a core. The
         * sigaction wrapper would only record the request: ask the kernel directly. */
        kernel_sigaction(SIG_DFL, 0, NULL);
        raise(SIGSYS);
        return;
    }
    if (a.sa_handler == SIG_IGN)
        return;
    /* As the kernel would run it: with the mask it asked for added to the one it interrupted
     * (not ours, which blocks every signal), and with the selector open, as the program's
     * other handlers run (a seccomp trap may come inside an allocator call). */
    _al_selector_open();
    uint64_t mask, asked;
    memcpy(&mask, &((ucontext_t *)ctx)->uc_sigmask, sizeof mask);
    memcpy(&asked, &a.sa_mask, sizeof asked);
    mask |= asked;
    if (!(a.sa_flags & SA_NODEFER))
        mask |= 1ull << (SIGSYS - 1);
    _al_sud_syscall(SYS_rt_sigprocmask, SIG_SETMASK, (long)&mask, 0, sizeof mask, 0, 0);
    _al_signal_run(&a, sig, si, ctx);
}

void _al_signal_run(const struct sigaction *a, int sig, siginfo_t *si, void *ctx)
{
    if (a->sa_handler == SIG_IGN || a->sa_handler == SIG_DFL)
        return;
    if (a->sa_flags & SA_SIGINFO)
        a->sa_sigaction(sig, si, ctx);
    else
        a->sa_handler(sig);
}

static bool must_run_in_place(long nr)
{
    switch (nr) {
    case SYS_rt_sigreturn: case SYS_clone: case SYS_clone3: case SYS_fork: case SYS_vfork:
    case SYS_execve: case SYS_execveat: case SYS_sigaltstack: case SYS_rt_sigsuspend:
    case SYS_rt_sigtimedwait: case SYS_pause: case SYS_exit:
        return true;
    default:
        return false;
    }
}

static long emulate_sigprocmask(ucontext_t *uc, int how, const uint64_t *set, uint64_t *old, size_t size)
{
    if (size != 8)
        return -EINVAL;
    uint64_t *mask = (uint64_t *)&uc->uc_sigmask;
    if (old)
        *old = *mask;
    if (!set)
        return 0;
    uint64_t v = *set, keep = (1ull << (SIGKILL - 1)) | (1ull << (SIGSTOP - 1)) | (1ull << (SIGSYS - 1));
    switch (how) {
    case SIG_BLOCK: *mask |= v; break;
    case SIG_UNBLOCK: *mask &= ~v; break;
    case SIG_SETMASK: *mask = v; break;
    default: return -EINVAL;
    }
    *mask &= ~keep;
    return 0;
}

static void sigsys(int sig, siginfo_t *si, void *ctx)
{
    if (si->si_code != SYS_USER_DISPATCH) {
        forward_to_program(sig, si, ctx);
        return;
    }
    struct al_thread *t = _al_selector_open();
    ucontext_t *uc = ctx;
    greg_t *g = uc->uc_mcontext.gregs;
    long nr = si->si_syscall;
    int kind = kind_of(nr);
    if (nr == SYS_rt_sigprocmask) {
        /* Performed here, the change would be undone by our own sigreturn: apply it to the
         * mask that sigreturn restores. SIGSYS itself stays deliverable. */
        g[REG_RAX] = emulate_sigprocmask(uc, (int)g[REG_RDI], (const uint64_t *)g[REG_RSI],
                                         (uint64_t *)g[REG_RDX], (size_t)g[REG_R10]);
        if (t)
            t->sud_selector = SYSCALL_DISPATCH_FILTER_BLOCK;
        return;
    }
    if (must_run_in_place(nr)) {
        /* A call that cannot be made from a signal handler (it returns elsewhere, or works on
         * the handler's own frame): run it natively where it was made, with the selector open
         * for the rest of this allocator call. si_call_addr is where the call returns to, just
         * past its two-byte syscall instruction. */
        g[REG_RIP] = (greg_t)(uintptr_t)si->si_call_addr - 2;
        g[REG_RAX] = nr;
        return;
    }
    int saved = errno;
    /* Before the unmapping: once it is done another thread's allocator may map the range
     * again and record its objects there. */
    if (nr == SYS_munmap && kind >= 0 && t && t->in_call)
        _al_shadow_release((uint64_t)g[REG_RDI], (uint64_t)g[REG_RDI] + (uint64_t)g[REG_RSI]);
    uint64_t c0 = _al_tsc();
    long r = _al_sud_syscall(nr, g[REG_RDI], g[REG_RSI], g[REG_RDX], g[REG_R10], g[REG_R8], g[REG_R9]);
    uint64_t c1 = _al_tsc();
    g[REG_RAX] = r;
    bool wait = kind == AL_SYS_FUTEX && ((g[REG_RSI] & FUTEX_CMD_MASK) == FUTEX_WAIT ||
                                         (g[REG_RSI] & FUTEX_CMD_MASK) == FUTEX_WAIT_BITSET);
    if (kind >= 0 && t && t->in_call) {
        account(t, kind, c1 - c0, wait);
        const long args[3] = { (long)g[REG_RDI], (long)g[REG_RSI], (long)g[REG_RDX] };
        _al_heap_syscall(nr, args, r); /* the allocator's mappings and brk */
    }
    errno = saved;
    if (t)
        t->sud_selector = SYSCALL_DISPATCH_FILTER_BLOCK;
}

/* Installs our SIGSYS handler with our own restorer: glibc's sigaction always supplies its
 * own, whose rt_sigreturn would be outside the trampoline page. */
static int install_handler(void)
{
    struct sigaction old;
    if (sigaction(SIGSYS, NULL, &old) == 0 && old.sa_handler != SIG_DFL)
        program_sigsys = old;
    int r = kernel_sigaction((void *)sigsys, SA_SIGINFO | SA_RESTORER | SA_RESTART | SA_ONSTACK | SA_NODEFER,
                             (void *)_al_sud_restorer);
    _al_syscalls.handler_installed = r == 0;
    return r;
}

void _al_syscalls_init(void)
{
    if (install_handler() < 0) {
        snprintf(_al_syscalls.reason, sizeof _al_syscalls.reason, "cannot install the SIGSYS handler (%s)",
                 strerror(errno));
        return;
    }
    /* Probe on this thread: the kernel may lack syscall user dispatch, or a seccomp filter
     * may refuse the prctl. */
    char sel = SYSCALL_DISPATCH_FILTER_ALLOW;
    if (prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_ON, (unsigned long)__start_al_sud_text,
              (unsigned long)(__stop_al_sud_text - __start_al_sud_text), &sel) < 0) {
        snprintf(_al_syscalls.reason, sizeof _al_syscalls.reason,
                 "no syscall user dispatch here (prctl: %s); it needs Linux 5.11 and no seccomp filter "
                 "refusing it", strerror(errno));
        /* Our handler stays, passing every SIGSYS on: put the program's own back instead. */
        _al_syscalls.handler_installed = false;
        sigaction(SIGSYS, &program_sigsys, NULL);
        return;
    }
    prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_OFF, 0, 0, 0);
    _al_syscalls.dispatch = true;
}

void _al_syscalls_thread_init(struct al_thread *t, bool dispatch)
{
    t->sud_selector = SYSCALL_DISPATCH_FILTER_ALLOW;
    t->dispatching = false;
    if (!dispatch || !_al_syscalls.dispatch || atomic_load_explicit(&_al_seccomp_on, memory_order_relaxed))
        return;
    /* A signal mask inherited across exec (from a thread of the parent that blocked every
     * signal, say) may block SIGSYS: the first system call the allocator made would end the
     * process. This image never asked for it; the wrappers keep it from asking later. (Where
     * the thread's first allocator call, which comes here, is in a signal handler, the mask
     * the handler's return restores still has it: not undone here.) */
    sigset_t sys;
    sigemptyset(&sys);
    sigaddset(&sys, SIGSYS);
    pthread_sigmask(SIG_UNBLOCK, &sys, NULL);
    t->dispatching = prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_ON, (unsigned long)__start_al_sud_text,
                           (unsigned long)(__stop_al_sud_text - __start_al_sud_text), &t->sud_selector) == 0;
}

/* The calling thread's state is about to be handed to another thread, which will set its
 * selector to "block" in its own allocator calls: the kernel must stop reading it for this
 * thread, still running its exit path (where glibc blocks every signal: a SIGSYS then would
 * kill the process). */
bool _al_syscalls_thread_exit(struct al_thread *t)
{
    if (!t->dispatching)
        return true;
    if (atomic_load_explicit(&_al_seccomp_on, memory_order_relaxed))
        return false;
    prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_OFF, 0, 0, 0);
    t->dispatching = false;
    return true;
}

/* ---- the program's own SIGSYS handler ---------------------------------------------------- */

bool _al_syscalls_owns_sigsys(void)
{
    return _al_syscalls.handler_installed; /* dispatch is only ever on with it */
}

int _al_syscalls_program_sigaction(const struct sigaction *act, struct sigaction *old)
{
    if (old)
        *old = program_sigsys;
    if (act)
        program_sigsys = *act;
    return 0;
}
