/* The profiler's own descriptors, kept above the numbers a program counts on: open, pipe and
 * socket give the lowest free number, and a program's descriptors must be numbered as they
 * would be without us. A program may also close every descriptor it did not open (as daemons
 * do) and be given those numbers again: ours are moved where that is unlikely, and whoever
 * closes one of ours checks first that it still is. */
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "profiler.h"

static int base = 3;
__thread bool _al_fds_ours __attribute__((tls_model("initial-exec")));

void _al_fds_init(void)
{
    /* Half way up a small limit, at 512 under a large one: far above what most programs open,
     * without growing the kernel's descriptor table much. */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0)
        base = nofile.rlim_cur >= 1024 ? 512 : nofile.rlim_cur >= 16 ? (int)(nofile.rlim_cur / 2) : 3;
}

int _al_fd_high(int fd)
{
    if (fd < 0 || fd >= base)
        return fd;
    int high = fcntl(fd, F_DUPFD_CLOEXEC, base);
    if (high < 0)
        return fd; /* no room up there: it stays where it is */
    close(fd);
    return high;
}
