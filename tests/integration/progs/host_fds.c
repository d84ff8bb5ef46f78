/* host_fds: a program that closes its stderr and then opens a data file, which takes fd 2 (as
 * daemons do, or any program run with 2>&-). Whatever is written to that file is the
 * program's own; a profiler writing its report "to stderr" must not land in it.
 *
 * usage: host_fds data DATAFILE
 *        host_fds count      prints which descriptors from 3 to 511 are open at start (a
 *                            profiler or its launcher must not leave any of its own open in
 *                            the program; alloclens's own, made in the process, sit at 512
 *                            and up under the default limit: libunwind's pipe is there
 *                            whenever an allocation before main was sampled, 1-3% of runs
 *                            under tcmalloc), then exits 0
 *        host_fds closed     keeps 16 MiB allocated (sampled sites), closes its stdin and
 *                            stdout, and exits 0: the report's symbolizer still gets its
 *                            input and output
 *        host_fds numbers    allocates 12 MiB in small pieces (sampled sites, counted calls),
 *                            then prints the numbers a file and a pipe get (the lowest free
 *                            ones, as without a profiler); then closes every descriptor above
 *                            2, as daemons do, makes a pipe, puts its write end on 512..527
 *                            too (where a profiler may have had its own) and forks: the child
 *                            allocates and writes through each, the parent prints what it read
 *        host_fds lowered    the same after lowering its descriptor limit to 256 (as programs
 *                            that use select() lower it to 1024), before anything is sampled
 *        host_fds stdclose   allocates, then closes stdout and stderr with fclose, as every
 *                            coreutils program does at exit, and exits 0: the text report
 *                            still reaches the stderr the run began with
 *        host_fds unwinder   closes every descriptor above 2, makes a pipe (3 and 4, where
 *                            tcmalloc's libunwind made its own at start) holding "hello", then
 *                            allocates 80 MiB 4 KiB at a time (stacks unwound at each sample)
 *                            and prints what the pipe holds and whether both ends are open
 *        host_fds listed     allocates 16 MiB 4 KiB at a time (stacks unwound at each sample),
 *                            opens a file and a pipe, allocates as much from another function,
 *                            then prints every descriptor open above 2 (but the listing's
 *                            own) that /proc/self/fd lists, as programs that close what they
 *                            did not open, or check that a child has only what it was given,
 *                            find them
 *        host_fds full       lowers its soft descriptor limit to 64, allocates (sampled
 *                            sites), opens files until none is left (EMFILE) and exits with
 *                            them all open: the report still finds room for its own */
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static int count(void)
{
    int n = 0;
    for (int fd = 3; fd < 512; fd++)
        if (fcntl(fd, F_GETFD) != -1) {
            printf("open at start: fd %d\n", fd);
            n++;
        }
    printf("%d descriptors from 3 to 511 open at start\n", n);
    return 0;
}

static char *volatile sink; /* the compiler may not drop an allocation nobody uses */

static void churn(void)
{
    for (int i = 0; i < 5000; i++) {
        sink = malloc(32 + (size_t)i);
        free(sink);
    }
}

static int numbers(void)
{
    churn();
    int fd = open("/dev/null", O_RDONLY);
    int p[2];
    if (fd < 0 || pipe(p) != 0)
        return 1;
    printf("numbers: a file got fd %d, a pipe fds %d and %d\n", fd, p[0], p[1]);
    for (int d = 3; d < 4096; d++)
        close(d);
    if (pipe(p) != 0)
        return 1;
    for (int d = 512; d < 528; d++)
        if (dup2(p[1], d) != d)
            return 1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        churn();
        int wrote = 0;
        for (int d = 512; d < 528; d++)
            wrote += write(d, "x", 1) == 1;
        _exit(write(p[1], "hello", 5) == 5 && wrote == 16 ? 0 : 1);
    }
    close(p[1]);
    for (int d = 512; d < 528; d++)
        close(d);
    char buf[32] = { 0 };
    ssize_t n = 0, r;
    while (n < 21 && (r = read(p[0], buf + n, (size_t)(21 - n))) > 0)
        n += r;
    int status;
    waitpid(pid, &status, 0);
    printf("numbers: after closing every descriptor, the child wrote '%s' (%zd bytes), status %d\n",
           buf, n, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}

static int unwinder(void)
{
    for (int d = 3; d < 4096; d++)
        close(d);
    int p[2];
    if (pipe(p) != 0 || fcntl(p[0], F_SETFL, O_NONBLOCK) != 0 || write(p[1], "hello", 5) != 5)
        return 1;
    for (int i = 0; i < 20000; i++) {
        sink = malloc(4096);
        free(sink);
    }
    char buf[16] = { 0 };
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    bool open_both = fcntl(p[0], F_GETFD) != -1 && fcntl(p[1], F_GETFD) != -1;
    printf("unwinder: a pipe at fds %d and %d holds '%s' (%zd bytes); both ends open: %s\n", p[0], p[1],
           n > 0 ? buf : "", n, open_both ? "yes" : "no");
    return 0;
}

static void __attribute__((noinline)) pages_first(void)
{
    for (int i = 0; i < 4096; i++) {
        sink = malloc(4096);
        free(sink);
    }
}

static void __attribute__((noinline)) pages_then(void)
{
    for (int i = 0; i < 4096; i++) {
        sink = calloc(1, 4096);
        free(sink);
    }
}

static int listed(void)
{
    pages_first();
    int p[2];
    int fd = open("/dev/null", O_RDONLY);
    if (fd < 0 || pipe(p) != 0)
        return 1;
    pages_then();
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return 1;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        int n = atoi(e->d_name);
        if (e->d_name[0] != '.' && n > 2 && n != dirfd(dir))
            printf("listed: fd %d open\n", n);
    }
    closedir(dir);
    return 0;
}

static int full(void)
{
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) != 0)
        return 1;
    if (nofile.rlim_max < 128) {
        puts("full: the hard descriptor limit is below 128, not tried");
        return 0;
    }
    nofile.rlim_cur = 64;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0)
        return 1;
    pages_first();
    int last = -1, fd;
    while ((fd = open("/dev/null", O_RDONLY)) >= 0)
        last = fd;
    if (last < 0)
        return 1;
    /* Not the count: the timed modes' event counters hold three of the 64. */
    puts("full: files opened until none was left");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "full"))
        return full();
    if (argc == 2 && !strcmp(argv[1], "listed"))
        return listed();
    if (argc == 2 && !strcmp(argv[1], "unwinder"))
        return unwinder();
    if (argc == 2 && !strcmp(argv[1], "stdclose")) {
        churn();
        puts("stdclose: closing stdout and stderr");
        return fclose(stdout) == 0 && fclose(stderr) == 0 ? 0 : 1;
    }
    if (argc == 2 && !strcmp(argv[1], "lowered")) {
        struct rlimit nofile;
        if (getrlimit(RLIMIT_NOFILE, &nofile) != 0)
            return 1;
        if (nofile.rlim_cur > 256) {
            nofile.rlim_cur = 256;
            if (setrlimit(RLIMIT_NOFILE, &nofile) != 0)
                return 1;
        }
        return numbers();
    }
    if (argc == 2 && !strcmp(argv[1], "numbers"))
        return numbers();
    if (argc == 2 && !strcmp(argv[1], "count"))
        return count();
    if (argc == 2 && !strcmp(argv[1], "closed")) {
        static void *keep[256];
        for (int i = 0; i < 256; i++)
            keep[i] = malloc(64 << 10);
        close(STDIN_FILENO);
        close(STDOUT_FILENO);
        return keep[255] ? 0 : 1;
    }
    if (argc < 3 || strcmp(argv[1], "data"))
        return 2;
    close(STDERR_FILENO);
    int fd = open(argv[2], O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0)
        return 3;
    for (int i = 0; i < 100; i++) {
        char *line = malloc(64);
        if (!line)
            return 4;
        int n = snprintf(line, 64, "record %d\n", i);
        if (write(fd, line, (size_t)n) != n)
            return 5;
        free(line);
    }
    printf("wrote 100 records to fd %d\n", fd);
    return 0; /* the data file stays open, as files of a running program do */
}
