/* host_signals: signals delivered while the program allocates.
 *
 * usage: host_signals MODE
 *   handlers      SIGALRM (interval timer, 500 us) and SIGUSR1 (sent 200 times by a second
 *                 thread) interrupt a main loop that allocates; the handlers only count (they
 *                 never allocate). Prints the counts it waited for and exits 0.
 *   term          allocates, then raise(SIGTERM): dies by SIGTERM
 *   term-threads  4 threads allocate without pause; main sends SIGTERM to the process
 *   term-busy     the same, but SIGTERM goes to one of the allocating threads (pthread_kill),
 *                 most likely inside the allocator
 *   pipe          allocates, then writes to a pipe whose reader is gone: dies by SIGPIPE
 *   dispositions  prints the dispositions of the signals that end a process by default, as
 *                 sigaction reports them; installs a SIGINT handler and puts the default back,
 *                 printing what signal() returned each time; ignores SIGHUP and raises it;
 *                 then raises SIGINT: dies by SIGINT
 *   resethand     a one-shot SIGTERM handler (SA_RESETHAND, as node's) cleans up, prints the
 *                 disposition it sees and raises SIGTERM again: dies by SIGTERM
 *   abort         allocates, then abort(): dies by SIGABRT
 *   overflow      as Rust's runtime does: a SIGSEGV handler on an alternate stack of
 *                 max(SIGSTKSZ, AT_MINSIGSTKSZ) bytes calls abort() when the stack
 *                 overflows, in a recursion that allocates now and then: dies by SIGABRT
 *   segv          allocates, then writes through a bad pointer: dies by SIGSEGV
 *   fpe-threads   4 threads allocate without pause; main divides by zero: dies by SIGFPE
 *   segv-caught   its own SIGSEGV handler leaves a bad access with siglongjmp, 100 times,
 *                 allocating in between; puts the default back and exits 0
 *   raw-sigaction the handlers case's SIGALRM timer with a handler installed by the
 *                 rt_sigaction system call itself (so no wrapper of alloclens sees it),
 *                 interrupting allocations that map and unmap memory
 *   exit-handler  a SIGUSR1 handler calls _exit(5) while the main loop allocates
 *   mask          SIGUSR1 blocked around allocation, then delivered by sigsuspend; exits 0
 *   legacy        the C library's older calls: bsd_signal, siginterrupt then signal, sigset
 *                 (a handler, SIG_HOLD, SIG_DFL), sighold, sigrelse, sigignore, sigblock and
 *                 sigsetmask, printing each disposition and mask as sigaction and sigprocmask
 *                 report them; allocates (mapped blocks: system calls) with every signal
 *                 blocked by sigblock and by sighold and sigset(SIG_HOLD) of SIGSYS; a SIGUSR1
 *                 handler that allocates runs inside sigsuspend, sigpause, pselect, ppoll and
 *                 epoll_pwait, each given every signal but SIGUSR1 as its mask; then a one-shot SIGTERM
 *                 handler set by sysv_signal runs once and raises SIGTERM again: dies by SIGTERM
 *   contexts      a coroutine (makecontext) whose context has every signal blocked, as some
 *                 coroutine libraries make theirs, entered with swapcontext three times and
 *                 left with swapcontext and with setcontext, allocates mapped blocks (system
 *                 calls) in it; prints the mask it ran with and the one main has back; then a
 *                 swapcontext from a context into itself (its mask full before the call), and
 *                 mapped blocks allocated with the mask it leaves; exits 0
 *   sigchld       a SIGCHLD handler that writes a line for each signal; allocates enough for
 *                 sampled sites (whose names the report finds at exit), starts no child and
 *                 returns 0: no line may appear
 *   fork-handler  a SIGALRM handler (interval timer, 300 us) forks, the child ends at once
 *                 with _exit(0) and the handler waits for it, while the main loop allocates:
 *                 100 times; prints how many children ended with 0 and exits 0. With every
 *                 allocation sampled, most forks come inside alloclens's sampler.
 *   exit-in-handler  a SIGUSR1 handler calls exit(6) (not async-signal-safe, and common);
 *                 allocates until it comes (host_raise_in_malloc raises it inside malloc)
 *   sigev-thread [US MS]  a periodic timer (every US microseconds, default 1000) whose
 *                 expiries run a function on the C library's helper thread (SIGEV_THREAD),
 *                 which allocates, while main allocates for MS milliseconds (default 50; up to
 *                 10 s until the function first ran); prints whether it ran and exits 0. The
 *                 helper thread waits for the timer's signal with it blocked: unblocked, it ends
 *                 the process.
 *   handler-pipe  a thread allocates without pause while main sends it SIGUSR1 5000 times;
 *                 the handler writes a byte to a pipe of the program's and reads it back, as
 *                 libuv's and glib's signal handlers do; prints whether every read got its
 *                 byte. With every allocation sampled, the handler often runs inside the
 *                 sampler's stack walk, whose descriptors used to be told from the program's
 *                 by the thread alone: the handler's read failed (EBADF). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/auxv.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

static volatile sig_atomic_t alarms, usr1s;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

static void on_usr1(int sig)
{
    (void)sig;
    usr1s++;
}

static void on_chld(int sig)
{
    (void)sig;
    static const char line[] = "SIGCHLD\n";
    ssize_t w = write(1, line, sizeof line - 1);
    (void)w;
}

static sigjmp_buf recover;
static volatile sig_atomic_t segvs;

static void on_segv(int sig)
{
    (void)sig;
    segvs++;
    siglongjmp(recover, 1);
}

/* A bad address, hidden from the compiler. */
static int *volatile nowhere = (int *)16;

static const char *disposition(int sig);

/* PARTS, then a newline, on stdout with write(2) alone: what a handler may call. */
static void say(const char *const *parts, size_t n)
{
    ssize_t w = 0;
    for (size_t i = 0; i < n; i++)
        w += write(1, parts[i], strlen(parts[i]));
    w += write(1, "\n", 1);
    (void)w;
}

static void on_term_once(int sig)
{
    const char *parts[] = { "resethand: handler ran, SIGTERM now ", disposition(sig) };
    say(parts, 2);
    raise(sig);
}

static void on_overflow(int sig)
{
    /* Formatted in a buffer, as Rust's handler formats its message: room taken on the
     * alternate stack. */
    volatile char used[2048];
    char *line = (char *)used;
    int n = snprintf(line, sizeof used, "overflow: the stack overflowed (signal %d), aborting\n", sig);
    ssize_t w = write(1, line, (size_t)n);
    (void)w;
    abort();
}

static volatile unsigned long depth_limit = ~0ul; /* never reached: the stack ends first */

static unsigned long recurse(unsigned long n)
{
    volatile char frame[1024];
    frame[0] = (char)n;
    if (n % 64 == 0)
        free(malloc(64 + n % 1000));
    return n == depth_limit ? 0 : recurse(n + 1) + frame[0];
}

static volatile sig_atomic_t forks, forks_ok;

static void on_alarm_fork(int sig)
{
    (void)sig;
    if (forks >= 100) /* a handler slower than the timer runs back to back: the loop waits */
        return;
    int saved = errno, status;
    pid_t c = fork();
    if (c == 0)
        _exit(0);
    if (c > 0 && waitpid(c, &status, 0) == c && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        forks_ok++;
    forks++;
    errno = saved;
}

static atomic_int notified;

static int handler_pipe[2];
static volatile sig_atomic_t pipe_failures, pipe_stop;

static void on_usr1_pipe(int sig)
{
    (void)sig;
    int e = errno;
    char c;
    if (write(handler_pipe[1], "x", 1) != 1 || read(handler_pipe[0], &c, 1) != 1)
        pipe_failures++;
    errno = e;
}

static void *allocate_until_stopped(void *arg)
{
    void *v[64] = { 0 };
    for (unsigned i = 0; !pipe_stop; i++) {
        free(v[i % 64]);
        v[i % 64] = malloc(64 + (i % 4096));
    }
    for (int k = 0; k < 64; k++)
        free(v[k]);
    return arg;
}

static void on_timer_thread(union sigval v)
{
    (void)v;
    char *p = malloc(100);
    if (p)
        p[0] = 1;
    free(p);
    atomic_fetch_add(&notified, 1);
}

static void on_usr1_exit_atexit(int sig)
{
    (void)sig;
    exit(6);
}

static void on_usr1_exit(int sig)
{
    (void)sig;
    _exit(5);
}

static void churn_once(int i)
{
    size_t size = 16 + (size_t)(i % 53) * 48;
    if (i % 97 == 0)
        size += 300000;
    void *p = malloc(size);
    if (!p)
        _exit(90);
    memset(p, 1, 16);
    void *q = realloc(p, size * 2);
    if (!q)
        _exit(91);
    free(q);
    void *r = calloc(4, size / 4 + 1);
    free(r);
}

/* Allocates (N rounds), then prints LINE, flushed: it must be out before the process ends. */
static void churn_then_say(int n, const char *line)
{
    for (int i = 0; i < n; i++)
        churn_once(i);
    printf("%s\n", line);
    fflush(stdout);
}

/* A handler that allocates a mapped block (system calls, in most allocators). */
static void on_usr1_alloc(int sig)
{
    (void)sig;
    volatile char *p = malloc(33u << 20);
    if (p) {
        p[0] = 1;
        free((void *)p);
    }
    usr1s++;
}

static void big_blocks(void)
{
    for (int i = 0; i < 3; i++) {
        volatile char *p = malloc(33u << 20);
        if (!p)
            exit(93);
        p[i] = 1;
        free((void *)p);
    }
}

static const char *blocked(int sig);

static ucontext_t main_context, co_context;

static void coroutine(void)
{
    for (int round = 0; round < 3; round++) {
        big_blocks();
        printf("contexts: coroutine round %d: SIGTERM %s, SIGUSR1 %s\n", round, blocked(SIGTERM),
               blocked(SIGUSR1));
        if (round < 2) {
            swapcontext(&co_context, &main_context);
        } else {
            fflush(stdout);
            setcontext(&main_context);
        }
    }
}

static int contexts(void)
{
    static char stack[256 << 10];
    getcontext(&co_context);
    co_context.uc_stack.ss_sp = stack;
    co_context.uc_stack.ss_size = sizeof stack;
    co_context.uc_link = NULL;
    sigfillset(&co_context.uc_sigmask);
    makecontext(&co_context, coroutine, 0);
    for (int i = 0; i < 3; i++) {
        swapcontext(&main_context, &co_context);
        big_blocks();
        printf("contexts: main after round %d: SIGTERM %s\n", i, blocked(SIGTERM));
    }
    /* Into itself, from a context whose mask had every signal blocked: the registers are
     * saved first, so the call just returns (a switch to the context as it was would loop
     * here), with that mask; then allocate with it. */
    static ucontext_t self;
    static volatile int returns;
    getcontext(&self);
    if (++returns > 1) {
        printf("contexts: swapcontext into itself resumed an older context\n");
        return 1;
    }
    sigfillset(&self.uc_sigmask);
    ucontext_t *volatile same = &self; /* the prototype says the two may not alias: glibc copes */
    swapcontext(&self, same);
    big_blocks();
    printf("contexts: swapcontext into itself returned; SIGTERM %s\n", blocked(SIGTERM));
    return 0;
}

static void on_term_sysv(int sig)
{
    const char *parts[] = { "legacy: one-shot SIGTERM handler ran, SIGTERM now ", disposition(sig), ", ",
                            blocked(sig) };
    say(parts, 4);
}

static const char *blocked(int sig)
{
    sigset_t now;
    sigprocmask(SIG_BLOCK, NULL, &now);
    return sigismember(&now, sig) ? "blocked" : "not blocked";
}

static const char *restarts(int sig)
{
    struct sigaction sa;
    sigaction(sig, NULL, &sa);
    return sa.sa_flags & SA_RESTART ? "restarts" : "interrupts";
}

/* SIGUSR1 pending, then WAIT run with every signal but SIGUSR1 as its mask: its handler
 * allocates there. */
static void wait_with_mask(const char *what, int (*wait)(const sigset_t *))
{
    sigset_t all, usr1;
    sigfillset(&all);
    sigdelset(&all, SIGUSR1);
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, NULL);
    int before = usr1s;
    raise(SIGUSR1);
    int r = wait(&all);
    sigprocmask(SIG_UNBLOCK, &usr1, NULL);
    printf("legacy: %s with every signal but SIGUSR1 masked: returned %d, handler ran %d time(s)\n",
           what, r, (int)(usr1s - before));
}

static int in_sigsuspend(const sigset_t *m)
{
    return sigsuspend(m);
}

/* BSD's: not declared by glibc's headers since POSIX.1-2008 dropped it, still exported. */
extern sighandler_t bsd_signal(int sig, sighandler_t handler);
#define BSD_MASK(sig) (1 << ((sig) - 1)) /* BSD's sigmask(), deprecated in the headers */

/* BSD's sigpause (what the exported sigpause is; <signal.h> gives programs X/Open's), with
 * the mask as an int: every signal but SIGUSR1. */
extern int __sigpause(int sig_or_mask, int is_sig);

static int in_sigpause(const sigset_t *m)
{
    (void)m;
    return __sigpause(~BSD_MASK(SIGUSR1), 0);
}

static int in_pselect(const sigset_t *m)
{
    struct timespec ts = { 1, 0 };
    return pselect(0, NULL, NULL, NULL, &ts, m);
}

static int in_ppoll(const sigset_t *m)
{
    struct timespec ts = { 1, 0 };
    struct pollfd none[1];
    return ppoll(none, 0, &ts, m);
}

static int in_epoll_pwait(const sigset_t *m)
{
    int fd = epoll_create1(0);
    struct epoll_event ev[1];
    int r = epoll_pwait(fd, ev, 1, 1000, m);
    close(fd);
    return r;
}

static int legacy(void)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* old, and still used */
    sighandler_t was = bsd_signal(SIGUSR1, on_usr1);
    printf("legacy: bsd_signal returned %s; SIGUSR1 %s, %s\n", was == SIG_DFL ? "default" : "other",
           disposition(SIGUSR1), restarts(SIGUSR1));
    siginterrupt(SIGUSR1, 1);
    printf("legacy: after siginterrupt(SIGUSR1, 1): %s, %s\n", disposition(SIGUSR1), restarts(SIGUSR1));
    siginterrupt(SIGUSR2, 1);
    signal(SIGUSR2, on_usr1);
    printf("legacy: siginterrupt(SIGUSR2, 1) then signal: SIGUSR2 %s\n", restarts(SIGUSR2));
    siginterrupt(SIGUSR2, 0);
    signal(SIGUSR2, SIG_DFL);
    was = sigset(SIGHUP, on_usr1);
    printf("legacy: sigset(SIGHUP, handler) returned %s; SIGHUP %s\n", was == SIG_DFL ? "default" : "other",
           disposition(SIGHUP));
    raise(SIGHUP);
    printf("legacy: SIGHUP raised, handled: %d\n", (int)usr1s);
    sighandler_t held = sigset(SIGUSR2, SIG_HOLD);
    printf("legacy: sigset(SIGUSR2, SIG_HOLD) returned %s; SIGUSR2 %s\n",
           held == SIG_DFL ? "default" : held == SIG_HOLD ? "hold" : "other", blocked(SIGUSR2));
    sigrelse(SIGUSR2);
    printf("legacy: sigrelse: SIGUSR2 %s\n", blocked(SIGUSR2));
    sighold(SIGUSR2);
    printf("legacy: sighold: SIGUSR2 %s\n", blocked(SIGUSR2));
    held = sigset(SIGUSR2, SIG_DFL);
    printf("legacy: sigset(SIGUSR2, SIG_DFL) returned %s; SIGUSR2 %s, %s\n",
           held == SIG_HOLD ? "hold" : "other", disposition(SIGUSR2), blocked(SIGUSR2));
    sigignore(SIGHUP);
    raise(SIGHUP);
    printf("legacy: sigignore(SIGHUP): %s, survived its raise\n", disposition(SIGHUP));
    int old = sigblock(BSD_MASK(SIGUSR2));
    printf("legacy: sigblock: SIGUSR2 %s, SIGUSR2 in the old mask: %d\n", blocked(SIGUSR2),
           (old & BSD_MASK(SIGUSR2)) != 0);
    sigsetmask(old);
    printf("legacy: sigsetmask(old): SIGUSR2 %s\n", blocked(SIGUSR2));

    old = sigblock(~0);
    big_blocks();
    sigsetmask(old);
    printf("legacy: allocated with every signal blocked by sigblock\n");
    sighold(SIGSYS);
    big_blocks();
    sigrelse(SIGSYS);
    printf("legacy: allocated after sighold(SIGSYS)\n");
    held = sigset(SIGSYS, SIG_HOLD);
    big_blocks();
    sigrelse(SIGSYS);
    printf("legacy: allocated after sigset(SIGSYS, SIG_HOLD), which returned %s\n",
           held == SIG_DFL ? "default" : "other");

    bsd_signal(SIGUSR1, on_usr1_alloc);
    wait_with_mask("sigsuspend", in_sigsuspend);
    wait_with_mask("sigpause", in_sigpause);
    wait_with_mask("pselect", in_pselect);
    wait_with_mask("ppoll", in_ppoll);
    wait_with_mask("epoll_pwait", in_epoll_pwait);

    was = sysv_signal(SIGTERM, on_term_sysv);
    printf("legacy: sysv_signal(SIGTERM) returned %s; SIGTERM %s\n", was == SIG_DFL ? "default" : "other",
           disposition(SIGTERM));
    fflush(stdout);
    raise(SIGTERM);
    printf("legacy: raising SIGTERM again\n");
    fflush(stdout);
    raise(SIGTERM);
#pragma GCC diagnostic pop
    printf("legacy: still alive?\n");
    return 1;
}

/* The kernel's rt_sigaction, made with the syscall instruction: no C library function (and so
 * no wrapper) between. The handler returns through a restorer of our own, as the C library's
 * sigaction supplies its own. */
void raw_restorer(void);
__asm__(".pushsection .text\n"
        ".type raw_restorer, @function\n"
        "raw_restorer:\n"
        "    mov $15, %eax\n" /* rt_sigreturn */
        "    syscall\n"
        ".popsection\n");

static int raw_sigaction(int sig, void (*handler)(int))
{
    struct {
        void (*handler)(int);
        unsigned long flags;
        void (*restorer)(void);
        unsigned long mask;
    } k = { handler, 0x04000000 | SA_RESTART /* SA_RESTORER */, raw_restorer, 0 };
    long r;
    register long size __asm__("r10") = 8; /* the kernel's sigset_t */
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "0"(13L /* rt_sigaction */), "D"((long)sig), "S"(&k), "d"(0L), "r"(size)
                     : "rcx", "r11", "memory");
    return (int)r;
}

static pthread_t main_thread;
static atomic_int stop;

static void *sender(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200; i++) {
        pthread_kill(main_thread, SIGUSR1);
        /* wait until it has been handled, so none is merged with the next one */
        while (usr1s <= i)
            usleep(50);
    }
    return NULL;
}

static void *spinner(void *arg)
{
    int i = (int)(long)arg;
    while (!atomic_load(&stop))
        churn_once(i++);
    return NULL;
}

/* Four threads allocating without pause, given a moment to get going. */
static void start_spinners(pthread_t t[4])
{
    for (long k = 0; k < 4; k++)
        pthread_create(&t[k], NULL, spinner, (void *)(k * 1000));
    usleep(20000);
}

static const char *disposition(int sig)
{
    struct sigaction sa;
    if (sigaction(sig, NULL, &sa) != 0)
        return "error";
    return sa.sa_handler == SIG_DFL ? "default" : sa.sa_handler == SIG_IGN ? "ignored" : "handler";
}

static int install(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "handlers";
    if (!strcmp(mode, "handlers")) {
        install(SIGALRM, on_alarm, SA_RESTART);
        install(SIGUSR1, on_usr1, SA_RESTART);
        main_thread = pthread_self();
        struct itimerval it = { { 0, 500 }, { 0, 500 } };
        setitimer(ITIMER_REAL, &it, NULL);
        pthread_t t;
        pthread_create(&t, NULL, sender, NULL);
        long i = 0;
        while (alarms < 100 || usr1s < 200)
            churn_once((int)i++);
        struct itimerval off = { { 0, 0 }, { 0, 0 } };
        setitimer(ITIMER_REAL, &off, NULL);
        pthread_join(t, NULL);
        printf("handlers: at least 100 SIGALRM and exactly %d SIGUSR1 handled while allocating\n",
               (int)usr1s);
        printf("handlers: the loop went on after them: %s\n", i > 0 ? "yes" : "no");
        return 0;
    }
    if (!strcmp(mode, "term")) {
        churn_then_say(5000, "term: about to raise SIGTERM");
        raise(SIGTERM);
        printf("term: still alive?\n");
        return 1;
    }
    if (!strcmp(mode, "term-threads") || !strcmp(mode, "term-busy")) {
        bool busy = !strcmp(mode, "term-busy");
        pthread_t t[4];
        start_spinners(t);
        printf("%s: sending SIGTERM to %s\n", mode, busy ? "an allocating thread" : "the process");
        fflush(stdout);
        if (busy)
            pthread_kill(t[0], SIGTERM);
        else
            kill(getpid(), SIGTERM);
        for (;;)
            pause();
    }
    if (!strcmp(mode, "pipe")) {
        churn_then_say(3000, "pipe: writing to a pipe nobody reads");
        int p[2];
        if (pipe(p) != 0)
            return 1;
        close(p[0]);
        ssize_t w = write(p[1], "x", 1);
        printf("pipe: still alive? %zd\n", w);
        return 1;
    }
    if (!strcmp(mode, "dispositions")) {
        static const int sigs[] = { SIGHUP, SIGINT, SIGQUIT, SIGPIPE, SIGALRM, SIGTERM, SIGUSR1, SIGUSR2,
                                    SIGXCPU, SIGXFSZ, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP };
        for (unsigned k = 0; k < sizeof sigs / sizeof *sigs; k++)
            printf("dispositions: SIG%s %s\n", sigabbrev_np(sigs[k]), disposition(sigs[k]));
        sighandler_t was = signal(SIGINT, on_usr1);
        printf("dispositions: signal(SIGINT, handler) returned %s\n", was == SIG_DFL ? "SIG_DFL" : "something else");
        was = signal(SIGINT, SIG_DFL);
        printf("dispositions: signal(SIGINT, SIG_DFL) returned %s; now %s\n",
               was == on_usr1 ? "the handler" : "something else", disposition(SIGINT));
        signal(SIGHUP, SIG_IGN);
        raise(SIGHUP);
        printf("dispositions: SIGHUP ignored, still here; %s\n", disposition(SIGHUP));
        for (int i = 0; i < 2000; i++)
            churn_once(i);
        fflush(stdout);
        raise(SIGINT);
        printf("dispositions: still alive after SIGINT?\n");
        return 1;
    }
    if (!strcmp(mode, "resethand")) {
        install(SIGTERM, on_term_once, SA_RESETHAND);
        char line[64];
        snprintf(line, sizeof line, "resethand: SIGTERM %s; raising it", disposition(SIGTERM));
        churn_then_say(2000, line);
        raise(SIGTERM);
        printf("resethand: still alive?\n");
        return 1;
    }
    if (!strcmp(mode, "overflow")) {
        size_t size = getauxval(AT_MINSIGSTKSZ) > (size_t)SIGSTKSZ ? getauxval(AT_MINSIGSTKSZ) : (size_t)SIGSTKSZ;
        stack_t ss = { .ss_sp = malloc(size), .ss_size = size };
        if (!ss.ss_sp || sigaltstack(&ss, NULL) != 0 || install(SIGSEGV, on_overflow, SA_ONSTACK) != 0)
            return 1;
        printf("overflow: recursing\n");
        fflush(stdout);
        return (int)recurse(1);
    }
    if (!strcmp(mode, "abort")) {
        churn_then_say(2000, "abort: calling abort()");
        abort();
    }
    if (!strcmp(mode, "raw-sigaction")) {
        if (raw_sigaction(SIGALRM, on_alarm) != 0)
            return 92;
        struct itimerval it = { { 0, 200 }, { 0, 200 } };
        setitimer(ITIMER_REAL, &it, NULL);
        for (int i = 0; alarms < 1000; i++) {
            void *p = malloc(16 + (size_t)(i % 5000) * 64);
            if (!p)
                return 90;
            memset(p, 1, 16);
            void *q = realloc(p, 200000 + (size_t)(i % 7) * 4096); /* mapped: system calls */
            if (!q)
                return 91;
            free(q);
        }
        struct itimerval off = { { 0, 0 }, { 0, 0 } };
        setitimer(ITIMER_REAL, &off, NULL);
        printf("raw-sigaction: 1000 SIGALRM handled while allocating\n");
        return 0;
    }
    if (!strcmp(mode, "segv")) {
        churn_then_say(2000, "segv: writing through a bad pointer");
        *nowhere = 1;
        printf("segv: still alive?\n");
        return 1;
    }
    if (!strcmp(mode, "fpe-threads")) {
        pthread_t t[4];
        start_spinners(t);
        printf("fpe-threads: dividing by zero while 4 threads allocate\n");
        fflush(stdout);
        volatile int zero = 0;
        printf("fpe-threads: still alive? %d\n", 1000 / zero);
        return 1;
    }
    if (!strcmp(mode, "segv-caught")) {
        install(SIGSEGV, on_segv, SA_RESTART);
        for (int i = 0; i < 100; i++) {
            churn_once(i);
            if (sigsetjmp(recover, 1) == 0)
                *nowhere = i;
        }
        signal(SIGSEGV, SIG_DFL);
        printf("segv-caught: %d bad accesses caught; SIGSEGV now %s\n", (int)segvs, disposition(SIGSEGV));
        return segvs == 100 ? 0 : 1;
    }
    if (!strcmp(mode, "exit-handler")) {
        install(SIGUSR1, on_usr1_exit, SA_RESTART);
        printf("exit-handler: the SIGUSR1 handler will _exit(5)\n");
        fflush(stdout);
        main_thread = pthread_self();
        for (int i = 0;; i++) {
            churn_once(i);
            if (i == 3000)
                pthread_kill(main_thread, SIGUSR1);
        }
    }
    if (!strcmp(mode, "mask")) {
        install(SIGUSR1, on_usr1, SA_RESTART);
        sigset_t block, old;
        sigemptyset(&block);
        sigaddset(&block, SIGUSR1);
        sigprocmask(SIG_BLOCK, &block, &old);
        raise(SIGUSR1);
        for (int i = 0; i < 3000; i++)
            churn_once(i);
        printf("mask: handled while blocked: %d\n", (int)usr1s);
        sigsuspend(&old);
        sigprocmask(SIG_SETMASK, &old, NULL);
        printf("mask: handled after sigsuspend: %d\n", (int)usr1s);
        return usr1s == 1 ? 0 : 1;
    }
    if (!strcmp(mode, "legacy"))
        return legacy();
    if (!strcmp(mode, "contexts"))
        return contexts();
    if (!strcmp(mode, "sigchld")) {
        install(SIGCHLD, on_chld, SA_RESTART);
        static void *keep[256];
        for (int i = 0; i < 256; i++)
            keep[i] = malloc(64 << 10);
        printf("sigchld: %d blocks of 64 KiB kept\n", (int)(sizeof keep / sizeof keep[0]));
        return keep[255] ? 0 : 1;
    }
    if (!strcmp(mode, "exit-in-handler")) {
        install(SIGUSR1, on_usr1_exit_atexit, SA_RESTART);
        printf("exit-in-handler: the SIGUSR1 handler will exit(6)\n");
        fflush(stdout);
        for (int i = 0; i < 1000000; i++)
            churn_once(i);
        return 1;
    }
    if (!strcmp(mode, "sigev-thread")) {
        struct sigevent se;
        memset(&se, 0, sizeof se);
        se.sigev_notify = SIGEV_THREAD;
        se.sigev_notify_function = on_timer_thread;
        timer_t timer;
        if (timer_create(CLOCK_MONOTONIC, &se, &timer) != 0) {
            perror("timer_create");
            return 1;
        }
        long us = argc > 2 ? atol(argv[2]) : 1000, ms = argc > 3 ? atol(argv[3]) : 50;
        struct itimerspec every = { { 0, us * 1000 }, { 0, us * 1000 } };
        timer_settime(timer, 0, &every, NULL);
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int i = 0;
        long elapsed;
        do {
            churn_once(i++);
            clock_gettime(CLOCK_MONOTONIC, &t);
            elapsed = (t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec);
            /* On a loaded machine the first expiry's thread may start late: waited for. */
        } while (elapsed < ms * 1000000L || (atomic_load(&notified) == 0 && elapsed < 10000000000L));
        timer_delete(timer);
        printf("sigev-thread: the timer's function ran: %s\n", atomic_load(&notified) > 0 ? "yes" : "no");
        return 0;
    }
    if (!strcmp(mode, "handler-pipe")) {
        if (pipe(handler_pipe) != 0)
            return 1;
        install(SIGUSR1, on_usr1_pipe, SA_RESTART);
        pthread_t t;
        if (pthread_create(&t, NULL, allocate_until_stopped, NULL) != 0)
            return 1;
        for (int i = 0; i < 5000; i++) {
            pthread_kill(t, SIGUSR1);
            usleep(20);
        }
        pipe_stop = 1;
        pthread_join(t, NULL);
        printf("handler-pipe: %s\n", pipe_failures ? "a read or write failed" : "every read got its byte");
        return pipe_failures != 0;
    }
    if (!strcmp(mode, "fork-handler")) {
        install(SIGALRM, on_alarm_fork, SA_RESTART);
        struct itimerval it = { { 0, 300 }, { 0, 300 } };
        setitimer(ITIMER_REAL, &it, NULL);
        for (int i = 0; forks < 100; i++)
            churn_once(i);
        struct itimerval off = { { 0, 0 }, { 0, 0 } };
        setitimer(ITIMER_REAL, &off, NULL);
        printf("fork-handler: %d children of a handler's fork ended with 0\n", (int)forks_ok);
        return forks_ok == forks ? 0 : 1;
    }
    fprintf(stderr, "host_signals: unknown mode %s\n", mode);
    return 2;
}
