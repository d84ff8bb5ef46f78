/* host_exec: the exec family under the profiler.
 *
 * usage: host_exec MODE LEAF     (LEAF: path of host_leaf)
 *   echo      fork; child execl("/bin/echo"); parent prints the child's status
 *   execvp    fork; child execvp("echo") found through PATH
 *   execlp    fork; child execlp("sh", "-c", ...) through PATH
 *   execle    fork; child execle("/bin/sh") with an environment of its own (no preload in it)
 *   leaf      fork; child execv(LEAF) which allocates and exits 5
 *   inplace   allocate, then execv(LEAF) in place (no fork): LEAF's status (6) is ours
 *   fexecve   fork; child fexecve(open(LEAF)) exits 8
 *   spawn     posix_spawn(LEAF), which exits 9, then posix_spawnp of LEAF's name with LEAF's
 *             directory first in PATH, which exits 10
 *   enoent    execl of a missing path, execvp of a missing command, execv of a directory:
 *             each fails with its errno (ENOENT, ENOENT, EACCES), then the program carries on,
 *             allocates, and exits 0 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static unsigned long churn(int n)
{
    unsigned long sum = 0;
    for (int i = 0; i < n; i++) {
        size_t size = 24 + (size_t)(i % 40) * 32;
        char *p = malloc(size);
        if (!p)
            exit(90);
        p[0] = (char)i;
        sum += size;
        free(p);
    }
    return sum;
}

static int wait_child(pid_t pid, const char *what)
{
    int status;
    if (pid < 0) {
        perror("fork");
        return -1;
    }
    if (waitpid(pid, &status, 0) != pid) {
        perror("waitpid");
        return -1;
    }
    if (WIFEXITED(status))
        printf("parent: %s exited %d\n", what, WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        printf("parent: %s killed by signal %d\n", what, WTERMSIG(status));
    fflush(stdout);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static const char *errname(int e)
{
    switch (e) {
    case ENOENT: return "ENOENT";
    case EACCES: return "EACCES";
    case ENOEXEC: return "ENOEXEC";
    case 0: return "0";
    default: return "other";
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: host_exec MODE LEAF\n");
        return 2;
    }
    const char *mode = argv[1], *leaf = argv[2];
    printf("host_exec %s: churn %lu\n", mode, churn(2000));
    fflush(stdout);

    if (!strcmp(mode, "echo")) {
        pid_t pid = fork();
        if (pid == 0) {
            execl("/bin/echo", "echo", "hello", "from", "echo", (char *)NULL);
            _exit(126);
        }
        return wait_child(pid, "echo") == 0 ? 0 : 1;
    }
    if (!strcmp(mode, "execvp")) {
        pid_t pid = fork();
        if (pid == 0) {
            char *args[] = { "echo", "found", "through", "PATH", NULL };
            execvp("echo", args);
            _exit(126);
        }
        return wait_child(pid, "execvp echo") == 0 ? 0 : 1;
    }
    if (!strcmp(mode, "execlp")) {
        pid_t pid = fork();
        if (pid == 0) {
            execlp("sh", "sh", "-c", "echo sh says $((6 * 7)); exit 12", (char *)NULL);
            _exit(126);
        }
        return wait_child(pid, "execlp sh") == 12 ? 0 : 1;
    }
    if (!strcmp(mode, "execle")) {
        pid_t pid = fork();
        if (pid == 0) {
            char *env[] = { "HOST_VAR=from execle", "PATH=/usr/bin:/bin", NULL };
            execle("/bin/sh", "sh", "-c", "echo \"$HOST_VAR\"; exit 3", (char *)NULL, env);
            _exit(126);
        }
        return wait_child(pid, "execle sh") == 3 ? 0 : 1;
    }
    if (!strcmp(mode, "leaf")) {
        pid_t pid = fork();
        if (pid == 0) {
            char *args[] = { (char *)leaf, "5", "3000", "exec'd leaf", NULL };
            execv(leaf, args);
            _exit(126);
        }
        return wait_child(pid, "leaf") == 5 ? 0 : 1;
    }
    if (!strcmp(mode, "inplace")) {
        char *keep = strdup("leaked across the exec");
        (void)keep;
        char *args[] = { (char *)leaf, "6", "2000", "in-place leaf", NULL };
        execv(leaf, args);
        perror("execv");
        return 1;
    }
    if (!strcmp(mode, "spawn")) {
        pid_t pid;
        char *args[] = { (char *)leaf, "9", "500", "posix_spawn'd leaf", NULL };
        int rc = posix_spawn(&pid, leaf, NULL, NULL, args, environ);
        if (rc != 0 || wait_child(pid, "posix_spawn leaf") != 9)
            return 1;
        char dir[4096], *slash = strrchr(leaf, '/');
        if (!slash || snprintf(dir, sizeof dir, "%.*s:%s", (int)(slash - leaf), leaf, getenv("PATH")) >= (int)sizeof dir)
            return 1;
        setenv("PATH", dir, 1);
        char *pargs[] = { slash + 1, "10", "500", "posix_spawnp'd leaf", NULL };
        rc = posix_spawnp(&pid, slash + 1, NULL, NULL, pargs, environ);
        return rc == 0 && wait_child(pid, "posix_spawnp leaf") == 10 ? 0 : 1;
    }
    if (!strcmp(mode, "fexecve")) {
        pid_t pid = fork();
        if (pid == 0) {
            int fd = open(leaf, O_RDONLY);
            char *args[] = { (char *)leaf, "8", "500", "fexecve'd leaf", NULL };
            fexecve(fd, args, environ);
            _exit(126);
        }
        return wait_child(pid, "fexecve leaf") == 8 ? 0 : 1;
    }
    if (!strcmp(mode, "enoent")) {
        int bad = 0;
        errno = 0;
        int rc = execl("/nonexistent/alloclens/prog", "prog", (char *)NULL);
        printf("execl missing path: rc %d errno %s\n", rc, errname(errno));
        bad += errno != ENOENT;
        errno = 0;
        char *args[] = { "alloclens-no-such-command", NULL };
        rc = execvp(args[0], args);
        printf("execvp missing command: rc %d errno %s\n", rc, errname(errno));
        bad += errno != ENOENT;
        errno = 0;
        char *dargs[] = { "/", NULL };
        rc = execv("/", dargs);
        printf("execv of a directory: rc %d errno %s\n", rc, errname(errno));
        bad += errno != EACCES;
        errno = 0;
        rc = execve("/nonexistent/x", dargs, environ);
        printf("execve missing path: rc %d errno %s\n", rc, errname(errno));
        bad += errno != ENOENT;
        printf("after failed execs: churn %lu\n", churn(3000));
        return bad ? 1 : 0;
    }
    fprintf(stderr, "host_exec: unknown mode %s\n", mode);
    return 2;
}
