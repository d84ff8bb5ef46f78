/* host_fds: a program that closes its stderr and then opens a data file, which takes fd 2 (as
 * daemons do, or any program run with 2>&-). Whatever is written to that file is the
 * program's own; a profiler writing its report "to stderr" must not land in it.
 *
 * usage: host_fds data DATAFILE
 *        host_fds count      prints which descriptors above 2 are open at start (a profiler
 *                            or its launcher must not leave any of its own open in the
 *                            program), then exits 0
 *        host_fds closed     keeps 16 MiB allocated (sampled sites), closes its stdin and
 *                            stdout, and exits 0: the report's symbolizer still gets its
 *                            input and output */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int count(void)
{
    int n = 0;
    for (int fd = 3; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) != -1) {
            printf("open at start: fd %d\n", fd);
            n++;
        }
    printf("%d descriptors above 2 open at start\n", n);
    return 0;
}

int main(int argc, char **argv)
{
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
