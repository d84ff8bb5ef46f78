/* host_quick_exit: processes that end without exit(), each after an exactly known number of
 * valloc calls (nothing else in the program or libc calls valloc), printed as "valloc=N".
 *
 * usage: host_quick_exit MODE
 *   _exit      1000 vallocs, then _exit(3)
 *   _Exit      1000 vallocs, then _Exit(4)
 *   atexit     1000 vallocs, then exit(0); an atexit handler calls _exit(9) before the
 *              library's own exit handler has run
 *   fork       a forked child makes 500 vallocs and _exit(6)s; the parent, 1000, exits 0
 *   vfork      a vfork child calls _exit(2) (it shares the parent's memory: nothing may be
 *              written for it); then the parent makes 1000 vallocs and exits 0
 *   sh         10 vallocs, then exec /bin/sh -c 'echo ...; exit 3' in place (dash, Debian's
 *              sh, ends with _exit)
 *   quick_exit 1000 vallocs, then quick_exit(5); its at_quick_exit handler makes 200 more
 *   in-malloc  two threads; the main one frees and allocates 5000-byte blocks (past glibc's
 *              per-thread cache, so under its arena lock) until an interval timer's handler
 *              calls _exit(7), most likely from inside the allocator */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static void vallocs(int n)
{
    for (int i = 0; i < n; i++) {
        void *p = valloc(64 + (size_t)i % 512);
        if (!p) {
            printf("valloc failed\n");
            _exit(99);
        }
        free(p);
    }
    printf("valloc=%d\n", n);
    fflush(stdout);
}

static void exit_from_atexit(void)
{
    _exit(9);
}

static void vallocs_at_quick_exit(void)
{
    vallocs(200);
}

static volatile sig_atomic_t ticks;

static void on_alarm(int sig)
{
    (void)sig;
    if (++ticks == 20)
        _exit(7);
}

static void *idle(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static int wait_status(pid_t pid)
{
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The parent of a fork or vfork child: waits for it, makes 1000 vallocs, says how it ended. */
static int parent_goes_on(pid_t pid)
{
    int st = wait_status(pid);
    vallocs(1000);
    printf("child %d\n", st);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "_exit")) {
        vallocs(1000);
        _exit(3);
    }
    if (!strcmp(mode, "_Exit")) {
        vallocs(1000);
        _Exit(4);
    }
    if (!strcmp(mode, "atexit")) {
        atexit(exit_from_atexit);
        vallocs(1000);
        exit(0);
    }
    if (!strcmp(mode, "fork")) {
        pid_t pid = fork();
        if (pid == 0) {
            vallocs(500);
            _exit(6);
        }
        return parent_goes_on(pid);
    }
    if (!strcmp(mode, "vfork")) {
        pid_t pid = vfork();
        if (pid == 0)
            _exit(2);
        return parent_goes_on(pid);
    }
    if (!strcmp(mode, "quick_exit")) {
        at_quick_exit(vallocs_at_quick_exit);
        vallocs(1000);
        quick_exit(5);
    }
    if (!strcmp(mode, "sh")) {
        vallocs(10);
        execl("/bin/sh", "sh", "-c", "echo from sh; exit 3", (char *)NULL);
        perror("execl /bin/sh");
        return 127;
    }
    if (!strcmp(mode, "in-malloc")) {
        pthread_t t;
        if (pthread_create(&t, NULL, idle, NULL) != 0)
            return 98;
        struct sigaction sa = { .sa_handler = on_alarm };
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval it = { .it_interval = { 0, 1000 }, .it_value = { 0, 1000 } };
        setitimer(ITIMER_REAL, &it, NULL);
        void *keep[64] = { 0 };
        for (unsigned i = 0;; i++) {
            free(keep[i % 64]);
            keep[i % 64] = malloc(5000 + i % 64);
        }
    }
    fprintf(stderr, "usage: host_quick_exit _exit|_Exit|atexit|fork|vfork|quick_exit|sh|in-malloc\n");
    return 2;
}
