/* host_spawn: posix_spawn, posix_spawnp, system() and popen() (read and write).
 *
 * usage: host_spawn */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int wait_status(pid_t pid)
{
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(void)
{
    char *keep = malloc(5000);
    pid_t pid;
    char *a[] = { "echo", "posix_spawn", "echo", NULL };
    fflush(stdout);
    int rc = posix_spawn(&pid, "/bin/echo", NULL, NULL, a, environ);
    printf("posix_spawn rc %d, child status %d\n", rc, rc ? -1 : wait_status(pid));
    fflush(stdout);

    char *b[] = { "sh", "-c", "echo posix_spawnp sh; exit 4", NULL };
    rc = posix_spawnp(&pid, "sh", NULL, NULL, b, environ);
    printf("posix_spawnp rc %d, child status %d\n", rc, rc ? -1 : wait_status(pid));
    fflush(stdout);

    char *c[] = { "missing", NULL };
    rc = posix_spawn(&pid, "/nonexistent/alloclens/missing", NULL, NULL, c, environ);
    printf("posix_spawn missing: rc %s\n", rc == 0 ? "0" : "non-zero");
    if (rc == 0)
        printf("posix_spawn missing: child status %d\n", wait_status(pid));
    fflush(stdout);

    int st = system("echo hi");
    printf("system: %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    fflush(stdout);
    st = system("exit 9");
    printf("system exit 9: %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    fflush(stdout);

    FILE *p = popen("echo from popen; echo second line", "r");
    char line[256];
    int n = 0;
    while (p && fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        printf("popen read %d: %s\n", ++n, line);
    }
    st = p ? pclose(p) : -1;
    printf("pclose: %d\n", st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    fflush(stdout);

    p = popen("tr a-z A-Z", "w");
    if (p) {
        fputs("written through popen\n", p);
        st = pclose(p);
        fflush(stdout);
        printf("pclose write: %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    free(keep);
    return 0;
}
