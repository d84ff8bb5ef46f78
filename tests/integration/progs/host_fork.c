/* host_fork: fork under the profiler. Parent and child both allocate; the output is written
 * so its order is fixed (the parent prints only after waiting for the child).
 *
 * usage: host_fork basic     child allocates and exits 7; parent prints the child's status
 *        host_fork nested    child forks a grandchild (exits 3), child exits 4
 *        host_fork threads   4 threads allocate without pause while main forks 16 children,
 *                            each of which allocates (from malloc state copied mid-call) and
 *                            exits with its index mod 8
 *        host_fork atexit    the child runs an atexit handler that allocates, then exits 9 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "basic";
    if (!strcmp(mode, "basic"))
        return basic();
    if (!strcmp(mode, "nested"))
        return nested();
    if (!strcmp(mode, "threads"))
        return threads();
    if (!strcmp(mode, "atexit"))
        return with_atexit();
    fprintf(stderr, "host_fork: unknown mode %s\n", mode);
    return 2;
}
