/* host_fork: fork under the profiler. Parent and child both allocate; the output is written
 * so its order is fixed (the parent prints only after waiting for the child).
 *
 * usage: host_fork basic     child allocates and exits 7; parent prints the child's status
 *        host_fork nested    child forks a grandchild (exits 3), child exits 4
 *        host_fork threads   4 threads allocate without pause while main forks 16 children,
 *                            each of which allocates (from malloc state copied mid-call) and
 *                            exits with its index mod 8
 *        host_fork atexit    the child runs an atexit handler that allocates, then exits 9
 *        host_fork tree      4 levels: at each, 2 threads allocate without pause while the
 *                            main thread forks; the child starts 2 threads of its own and
 *                            forks the next level. The deepest exits 0, each above it its
 *                            child's status + 1; the top prints the status it got (3). A
 *                            fork while another thread was inside the profiler's unwinder left
 *                            a lock of libunwind's held in the child: its threads waited for
 *                            good (about one run in two)
 *        host_fork exit-forking  3 threads fork without pause (each child allocates and
 *                            _exits 0), 2 allocate, and main calls exit(7) after 20 ms: exit
 *                            took the profiler's fork handlers away while a fork was between
 *                            them, its locks stayed held and the report waited for good (or,
 *                            under jemalloc, glibc aborted)
 *        host_fork raw       children made without fork(), each allocating: the clone system
 *                            call (same stack) exits 11, clone3 _exits 12, glibc's clone()
 *                            runs a function that returns 13, the fork system call exits 14.
 *                            The C library's fork handlers do not run for them: a child's
 *                            first counted call read the parent's event ring, which it does
 *                            not inherit (SIGSEGV), and none wrote its report
 *        host_fork daemon    a child calls daemon(0, 0): its parent side ends inside glibc's
 *                            daemon() (whose own _exit wrote no report), the daemon allocates
 *                            and exits 0; the main process waits for both (the daemon holds a
 *                            pipe's end until it is gone, its report written) */
#include <linux/sched.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static unsigned long churn(int n, int seed)
{
    unsigned long sum = 0;
    void *keep[64] = { 0 };
    for (int i = 0; i < n; i++) {
        int slot = (i * 7 + seed) & 63;
        free(keep[slot]);
        size_t size = 8 + (size_t)((i * 13 + seed) % 97) * 40;
        if (i % 50 == 0)
            size += 200000; /* some large ones (mmap territory for glibc) */
        keep[slot] = malloc(size);
        if (!keep[slot])
            exit(90);
        memset(keep[slot], 0x5a, size < 256 ? size : 256);
        sum += size;
    }
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    return sum;
}

static void describe(const char *who, int status)
{
    if (WIFEXITED(status))
        printf("%s: exited %d\n", who, WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        printf("%s: killed by signal %d\n", who, WTERMSIG(status));
    else
        printf("%s: status 0x%x\n", who, status);
}

static int basic(void)
{
    char *before = strdup("allocated before fork");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        unsigned long s = churn(5000, 1);
        printf("child: churn %lu, inherited '%s'\n", s, before);
        free(before);
        exit(7);
    }
    unsigned long s = churn(5000, 2);
    int status;
    if (waitpid(pid, &status, 0) != pid) {
        perror("waitpid");
        return 1;
    }
    printf("parent: churn %lu, still '%s'\n", s, before);
    describe("parent: child", status);
    free(before);
    return WIFEXITED(status) && WEXITSTATUS(status) == 7 ? 0 : 1;
}

static int nested(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        churn(1000, 3);
        fflush(stdout);
        pid_t g = fork();
        if (g == 0) {
            printf("grandchild: churn %lu\n", churn(1000, 4));
            exit(3);
        }
        int st;
        waitpid(g, &st, 0);
        describe("child: grandchild", st);
        exit(4);
    }
    int status;
    waitpid(pid, &status, 0);
    describe("parent: child", status);
    return 0;
}

static atomic_int stop;
static atomic_long rounds;

static void *spinner(void *arg)
{
    int seed = (int)(long)arg;
    while (!atomic_load(&stop)) {
        churn(200, seed++);
        atomic_fetch_add(&rounds, 1);
    }
    return NULL;
}

static int threads(void)
{
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, spinner, (void *)(i * 100));
    while (atomic_load(&rounds) < 8)
        usleep(100);
    int bad = 0;
    for (int k = 0; k < 16; k++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            /* Only this thread exists here; the allocator and the profiler must work. */
            churn(500, k);
            char *s = strdup("child ok");
            int ok = s && strcmp(s, "child ok") == 0;
            free(s);
            exit(ok ? k % 8 : 99); /* exit, not _exit: the child writes its report */
        }
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != k % 8) {
            describe("parent: unexpected child", status);
            bad++;
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    printf("parent: 16 children forked while 4 threads allocated, %d unexpected\n", bad);
    return bad ? 1 : 0;
}

/* Frees and allocates without pause, sizes 1 to 5000 at random. */
static void *tree_spinner(void *arg)
{
    void *keep[64] = { 0 };
    unsigned x = (unsigned)(long)arg * 7 + 1;
    while (!atomic_load(&stop)) {
        x = x * 1103515245u + 12345u;
        unsigned slot = (x >> 8) & 63;
        free(keep[slot]);
        keep[slot] = malloc((x >> 16) % 5000 + 1);
    }
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    return NULL;
}

static void start_spinners(pthread_t t[2], long seed)
{
    atomic_store(&stop, 0);
    for (long i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, tree_spinner, (void *)(seed * 2 + i));
}

static void stop_spinners(pthread_t t[2])
{
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
}

static int tree(void)
{
    pthread_t t[2];
    start_spinners(t, 0);
    for (int level = 0; level < 4; level++) {
        /* The top forks as its threads start (their first samples), the others 2 ms later. */
        if (level > 0)
            usleep(2000);
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid > 0) {
            int status = 0;
            waitpid(pid, &status, 0);
            stop_spinners(t);
            int got = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
            if (level == 0)
                printf("tree: 4 levels forked with threads allocating; the top's child exited %d\n", got);
            return level == 0 ? 0 : got + 1;
        }
        start_spinners(t, level + 1);
    }
    stop_spinners(t);
    return 0;
}

static void child_atexit(void)
{
    char *p = malloc(1000);
    if (p) {
        snprintf(p, 1000, "child atexit handler allocated");
        puts(p);
        free(p);
    }
}

static int with_atexit(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        atexit(child_atexit);
        churn(300, 5);
        exit(9);
    }
    int status;
    waitpid(pid, &status, 0);
    describe("parent: child", status);
    return 0;
}

static void *fork_forever(void *arg)
{
    (void)arg;
    for (;;) {
        pid_t p = fork();
        if (p == 0) {
            for (int i = 0; i < 10; i++)
                free(malloc(10));
            _exit(0);
        }
        if (p > 0)
            waitpid(p, NULL, 0);
    }
    return NULL;
}

static void *churn_forever(void *arg)
{
    for (int i = (int)(long)arg;; i++)
        churn(200, i);
    return NULL;
}

static int exit_forking(void)
{
    pthread_t t;
    for (long i = 0; i < 5; i++)
        if (pthread_create(&t, NULL, i < 3 ? fork_forever : churn_forever, (void *)i) != 0)
            return 1;
    struct timespec pause = { 0, 20000000 };
    nanosleep(&pause, NULL);
    printf("exit-forking: exiting\n");
    fflush(stdout);
    exit(7);
}

static _Noreturn void raw_child(int status, int underscore)
{
    unsigned long s = churn(3000, status);
    printf("child %d: churn %lu\n", status, s);
    fflush(stdout);
    if (underscore)
        _exit(status);
    exit(status);
}

static int clone_function(void *arg)
{
    (void)arg;
    unsigned long s = churn(3000, 13);
    printf("child 13: churn %lu\n", s);
    fflush(stdout);
    return 13;
}

/* Child I of raw()'s, made its way; waited for before the next, so the output's order is
 * fixed. */
static pid_t raw_spawn(int i)
{
    static char clone_stack[256 * 1024] __attribute__((aligned(16)));
    struct clone_args args = { .exit_signal = SIGCHLD };
    pid_t pid = -1;
    fflush(stdout);
    switch (i) {
    case 0:
        pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid == 0)
            raw_child(11, 0);
        break;
    case 1:
        pid = (pid_t)syscall(SYS_clone3, &args, sizeof args);
        if (pid == 0)
            raw_child(12, 1);
        break;
    case 2:
        pid = clone(clone_function, clone_stack + sizeof clone_stack, SIGCHLD, NULL);
        break;
    default:
        pid = (pid_t)syscall(SYS_fork);
        if (pid == 0)
            raw_child(14, 0);
    }
    return pid;
}

static int raw(void)
{
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        int status;
        pid_t pid = raw_spawn(i);
        if (pid < 0 || waitpid(pid, &status, 0) != pid) {
            perror("raw: child");
            return 1;
        }
        describe("parent: raw child", status);
        ok &= WIFEXITED(status) && WEXITSTATUS(status) == 11 + i;
    }
    return ok ? 0 : 1;
}

static int with_daemon(void)
{
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pipe");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        churn(2000, 5);
        if (daemon(0, 0) != 0)
            _exit(20);
        churn(2000, 6);
        exit(0);
    }
    close(fds[1]);
    int status;
    char c;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
        perror("daemon: fork or wait");
        return 1;
    }
    describe("parent: daemon's parent", status);
    printf("parent: the daemon is gone: %s\n", read(fds[0], &c, 1) == 0 ? "yes" : "no");
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "basic";
    if (!strcmp(mode, "basic"))
        return basic();
    if (!strcmp(mode, "nested"))
        return nested();
    if (!strcmp(mode, "threads"))
        return threads();
    if (!strcmp(mode, "exit-forking"))
        return exit_forking();
    if (!strcmp(mode, "atexit"))
        return with_atexit();
    if (!strcmp(mode, "tree"))
        return tree();
    if (!strcmp(mode, "raw"))
        return raw();
    if (!strcmp(mode, "daemon"))
        return with_daemon();
    fprintf(stderr, "host_fork: unknown mode %s\n", mode);
    return 2;
}
