/* host_vfork: vfork + execve, the way shells and old spawn code do it; the child shares the
 * parent's memory until the exec, so it must not allocate (and alloclens must not either).
 * Last, the way gdb starts a program: the parent handles SIGCHLD and SIGUSR1, and the vfork
 * child puts every signal back to its default before its exec; the parent's handlers must
 * still run after it.
 *
 * usage: host_vfork */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The status the child PID (as vfork returned it) ended with, 128 + N for signal N; -1 when
 * there is no such child. */
static int wait_for(pid_t pid)
{
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* vfork and exec PATH; with DEFAULTS the child first sets SIGCHLD and SIGUSR1 to their
 * defaults (through sigaction and signal). */
__attribute__((noinline)) static int run(const char *path, char *const argv[], bool defaults)
{
    pid_t pid = vfork();
    if (pid == 0) {
        if (defaults) {
            struct sigaction dfl = { .sa_handler = SIG_DFL };
            sigaction(SIGCHLD, &dfl, NULL);
            signal(SIGUSR1, SIG_DFL);
        }
        execve(path, argv, environ);
        _exit(errno == ENOENT ? 127 : 126);
    }
    return wait_for(pid);
}

__attribute__((noinline)) static int vfork_exit(int code)
{
    pid_t pid = vfork();
    if (pid == 0)
        _exit(code);
    return wait_for(pid);
}

static volatile sig_atomic_t chlds, usr1s;

static void on_chld(int sig)
{
    (void)sig;
    chlds++;
}

static void on_usr1(int sig)
{
    (void)sig;
    usr1s++;
}

int main(void)
{
    int bad = 0;
    for (int i = 0; i < 20; i++) {
        char *keep = malloc(100 + (size_t)i * 1000);
        char *t[] = { "true", NULL };
        int st = run("/bin/true", t, false);
        if (st != 0)
            bad++;
        free(keep);
    }
    printf("vfork /bin/true x20: %d failed\n", bad);
    char *f[] = { "false", NULL };
    printf("vfork /bin/false: %d\n", run("/bin/false", f, false));
    char *m[] = { "missing", NULL };
    printf("vfork missing program: %d\n", run("/nonexistent/alloclens/missing", m, false));
    printf("vfork child _exit(11): %d\n", vfork_exit(11));
    char *after = strdup("parent allocates after vfork");
    puts(after);
    free(after);

    struct sigaction sa = { .sa_handler = on_chld, .sa_flags = SA_RESTART };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGUSR1, on_usr1);
    char *t[] = { "true", NULL };
    int st = run("/bin/true", t, true);
    raise(SIGUSR1);
    printf("vfork child resets signals, then /bin/true: %d; parent's handlers ran: SIGCHLD %d, SIGUSR1 %d\n",
           st, (int)chlds, (int)usr1s);
    struct sigaction now;
    sigaction(SIGCHLD, NULL, &now);
    printf("parent's SIGCHLD handler is still its own: %s\n", now.sa_handler == on_chld ? "yes" : "no");
    return bad ? 1 : 0;
}
