/* host_vfork: vfork + execve, the way shells and old spawn code do it; the child shares the
 * parent's memory until the exec, so it must not allocate (and alloclens must not either).
 *
 * usage: host_vfork */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

__attribute__((noinline)) static int run(const char *path, char *const argv[])
{
    pid_t pid = vfork();
    if (pid == 0) {
        execve(path, argv, environ);
        _exit(errno == ENOENT ? 127 : 126);
    }
    if (pid < 0)
        return -1;
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

__attribute__((noinline)) static int vfork_exit(int code)
{
    pid_t pid = vfork();
    if (pid == 0)
        _exit(code);
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WEXITSTATUS(status);
}

int main(void)
{
    int bad = 0;
    for (int i = 0; i < 20; i++) {
        char *keep = malloc(100 + (size_t)i * 1000);
        char *t[] = { "true", NULL };
        int st = run("/bin/true", t);
        if (st != 0)
            bad++;
        free(keep);
    }
    printf("vfork /bin/true x20: %d failed\n", bad);
    char *f[] = { "false", NULL };
    printf("vfork /bin/false: %d\n", run("/bin/false", f));
    char *m[] = { "missing", NULL };
    printf("vfork missing program: %d\n", run("/nonexistent/alloclens/missing", m));
    printf("vfork child _exit(11): %d\n", vfork_exit(11));
    char *after = strdup("parent allocates after vfork");
    puts(after);
    free(after);
    return bad ? 1 : 0;
}
