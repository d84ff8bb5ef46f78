/* sys_sigsys: the program's own SIGSYS handling must be untouched by a profiler that uses
 * syscall user dispatch (which delivers SIGSYS itself).
 *  part 1: own SA_SIGINFO handler; raise(SIGSYS) twice with allocations in between; prints the
 *          count and the si_code seen.
 *  part 2: no_new_privs + a seccomp filter: getppid -> ERRNO(EPERM), getpgrp? no: uname ->
 *          TRAP (SIGSYS to our handler); then a lot of allocation including 33 MiB blocks, and
 *          the filtered calls; prints what it saw.
 * sys_sigsys exec CMD ARGS...: under a seccomp filter that ends the process at any
 *          perf_event_open (as a systemd service's SystemCallFilter does), execs CMD.
 * sys_sigsys trapalloc: a seccomp filter that traps munmap and madvise (SECCOMP_RET_TRAP, as
 *          sandboxes do) and a SIGSYS handler that has them return 0; then allocation and
 *          frees of big blocks, whose munmap the allocator makes; prints whether any came.
 * sys_sigsys later HOW: installs, once running, a filter that ends the process at
 *          perf_event_open and at the prctl that starts syscall user dispatch (HOW: prctl, or
 *          syscall for the seccomp system call, as libseccomp does; nofiles: with prctl, and a
 *          second filter that ends it at any open that would create a file; nomincore: at
 *          mincore; norusage: at getrusage; noprlimit: at prlimit64, which getrlimit and
 *          setrlimit make), then starts threads and a child that allocate;
 *          prints what they did.
 * sys_sigsys strict HOW: exactly 1000 mallocs (some kept), then seccomp's strict mode (HOW:
 *          prctl, or the seccomp system call), which allows read, write and exit only and turns
 *          rdtsc off; then 5000 mallocs from memory the heap already has, one line written, and
 *          the thread's exit system call. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <ucontext.h>
#include <unistd.h>

static volatile sig_atomic_t seen, last_code, last_sysno, trap_seen;

static void handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    if (si->si_code == SI_TKILL || si->si_code == SI_USER) {
        seen++;
        last_code = si->si_code;
    } else {
        trap_seen++;
        last_code = si->si_code;
        last_sysno = si->si_syscall;
        /* the trapped syscall returns whatever is in the return register: leave it (-ENOSYS
         * is what the kernel puts there) */
    }
}

static void churn(int rounds)
{
    for (int r = 0; r < rounds; r++) {
        void *v[256];
        for (int i = 0; i < 256; i++) {
            v[i] = malloc((size_t)(16 + 37 * i));
            memset(v[i], i, 16);
        }
        for (int i = 0; i < 256; i++)
            free(v[i]);
        char *big = malloc(33u << 20);
        if (!big)
            abort();
        big[0] = 1;
        big = realloc(big, 34u << 20);
        big[1] = 2;
        free(big);
    }
}

/* Filter instructions: load the system call's number (or argument I), return V; a filter that
 * ends the process at system call SYSNO and lets everything else through. */
#define LD_NR BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define LD_ARG(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i]))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
/* A filter's start: a system call of another architecture goes through. */
#define X86_64_ONLY                                                                     \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),            \
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0), RET(SECCOMP_RET_ALLOW)

static int handle_sigsys(void (*fn)(int, siginfo_t *, void *))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fn;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSYS, &sa, NULL);
}
#define KILL_AT(sysno)                                                                            \
    { LD_NR, BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (sysno), 0, 1), RET(SECCOMP_RET_KILL_PROCESS), \
      RET(SECCOMP_RET_ALLOW) }

/* The filter a sandboxed service starts under: perf_event_open ends the process. */
static int exec_filtered(char **cmd)
{
    struct sock_filter f[] = KILL_AT(SYS_perf_event_open);
    struct sock_fprog prog = { sizeof f / sizeof f[0], f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
        return 20;
    execvp(cmd[0], cmd);
    return 127;
}

static void *churner(void *arg)
{
    churn(2);
    return arg;
}

/* A sandbox's filter, installed by the running program: a new thread of a profiler that
 * started syscall user dispatch or event counting in it would end the process. */
static int later_filtered(const char *how)
{
    struct sock_filter f[] = {
        LD_NR,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_perf_event_open, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_prctl, 0, 3),
        LD_ARG(0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_SET_SYSCALL_USER_DISPATCH, 0, 1),
        RET(SECCOMP_RET_KILL_PROCESS),
        RET(SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { sizeof f / sizeof f[0], f };
    churn(1);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        return 20;
    if (strcmp(how, "syscall") ? prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)
                               : syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog))
        return 21;
    struct sock_filter nofiles[] = {
        LD_NR,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 0, 3),
        LD_ARG(2),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_CREAT, 0, 1),
        RET(SECCOMP_RET_KILL_PROCESS),
        RET(SECCOMP_RET_ALLOW),
    };
    struct sock_fprog second = { sizeof nofiles / sizeof nofiles[0], nofiles };
    if (!strcmp(how, "nofiles") && syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &second))
        return 24;
    /* nomincore, norusage, noprlimit: a filter ending the process at that one system call */
    long one = !strcmp(how, "nomincore") ? SYS_mincore
               : !strcmp(how, "norusage") ? SYS_getrusage
               : !strcmp(how, "noprlimit") ? SYS_prlimit64
                                           : -1;
    struct sock_filter kill_one[] = KILL_AT((uint32_t)one);
    struct sock_fprog third = { sizeof kill_one / sizeof kill_one[0], kill_one };
    if (one >= 0 && syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &third))
        return 25;
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        if (pthread_create(&th[i], NULL, churner, NULL))
            return 22;
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        churn(2);
        _exit(7);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return 23;
    printf("threads done, child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    return 0;
}

#ifndef SYS_SECCOMP
#define SYS_SECCOMP 1 /* si_code of a seccomp trap (the kernel's siginfo.h) */
#endif

static void pretend(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    if (si->si_code == SYS_SECCOMP) {
        trap_seen++;
        ((ucontext_t *)uc)->uc_mcontext.gregs[REG_RAX] = 0;
    }
}

static int trap_alloc(void)
{
    if (handle_sigsys(pretend))
        return 10;
    struct sock_filter f[] = {
        X86_64_ONLY,
        LD_NR,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_munmap, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_madvise, 0, 1),
        RET(SECCOMP_RET_TRAP),
        RET(SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { .len = sizeof f / sizeof f[0], .filter = f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
        return 11;
    churn(5);
    printf("trapalloc: done, trapped %s\n", trap_seen ? "some" : "none");
    return 0;
}

static int strict(const char *how)
{
    static void *keep[64];
    for (int i = 0; i < 1000; i++) {
        free(keep[i % 64]);
        keep[i % 64] = malloc((size_t)(i % 97) * 40 + 8);
    }
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    free(malloc(1 << 16)); /* room for what follows, in the heap already */
    int r = !strcmp(how, "syscall") ? (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_STRICT, 0, NULL)
                                    : prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT);
    if (r != 0)
        return 20;
    for (int i = 0; i < 5000; i++)
        free(malloc(16));
    static const char done[] = "strict: 5000 allocations in strict mode\n";
    if (write(STDOUT_FILENO, done, sizeof done - 1) != sizeof done - 1)
        syscall(SYS_exit, 21);
    syscall(SYS_exit, 0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "strict"))
        return strict(argv[2]);
    if (argc > 1 && !strcmp(argv[1], "trapalloc"))
        return trap_alloc();
    if (argc > 2 && !strcmp(argv[1], "exec"))
        return exec_filtered(argv + 2);
    if (argc > 2 && !strcmp(argv[1], "later"))
        return later_filtered(argv[2]);
    if (handle_sigsys(handler))
        return 10;

    raise(SIGSYS);
    churn(3);
    raise(SIGSYS);
    printf("raise: seen=%d si_code=%d\n", (int)seen, (int)last_code);
    fflush(stdout);

    /* the handler must still be ours */
    struct sigaction cur;
    sigaction(SIGSYS, NULL, &cur);
    printf("handler still ours: %d\n", cur.sa_sigaction == handler && (cur.sa_flags & SA_SIGINFO));

    struct sock_filter f[] = {
        X86_64_ONLY,
        LD_NR,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1),
        RET(SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_uname, 0, 1),
        RET(SECCOMP_RET_TRAP),
        RET(SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { .len = sizeof f / sizeof f[0], .filter = f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        return 11;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
        return 12;

    churn(5);
    errno = 0;
    long r = syscall(SYS_getppid);
    int e = errno;
    printf("getppid: ret=%ld errno=%s\n", r, e == EPERM ? "EPERM" : strerror(e));
    churn(2);
    struct utsname u;
    long ru = syscall(SYS_uname, &u);
    printf("uname: ret=%ld trapped=%d si_code=%d sysno_is_uname=%d\n", ru, (int)trap_seen,
           (int)last_code, last_sysno == SYS_uname);
    churn(2);
    printf("done\n");
    return 0;
}
