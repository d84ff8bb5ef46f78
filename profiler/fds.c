/* The profiler's own descriptors, kept above the numbers a program counts on: open, pipe and
 * socket give the lowest free number, and a program's descriptors must be numbered as they
 * would be without us. A program may also close every descriptor it did not open (as daemons
 * do) and be given those numbers again: ours are moved where that is unlikely, and whoever
 * closes one of ours checks first that it still is. libunwind cannot be made to check: when it
 * finds its pipe gone it closes the two numbers blindly, so its pipe goes higher still. */
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "profiler.h"

static int base = 3, top = 3;
__thread bool _al_fds_ours __attribute__((tls_model("initial-exec")));

/* Half way up a small limit CUR, at 512 under a large one: far above what most programs open,
 * without growing the kernel's descriptor table much. */
static int base_for(rlim_t cur)
{
    return cur >= 1024 ? 512 : cur >= 16 ? (int)(cur / 2) : 3;
}

/* The top: just under the limit, or under 4096 (the table grows to the highest number in
 * use); the base under a small limit. */
static int top_for(rlim_t cur)
{
    return cur >= 1024 ? (int)((cur < 4096 ? cur : 4096) - 16) : base_for(cur);
}

void _al_fds_init(bool grow)
{
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) != 0)
        return;
    base = base_for(nofile.rlim_cur);
    top = top_for(nofile.rlim_cur);
    /* The kernel grows a table shared by threads only after an RCU grace period, milliseconds
     * to tens of them, and the thread waits: grown to the top now, before the program starts
     * threads, no later move up waits (libunwind's pipe at the first sampled allocation cost
     * a worker thread 13 ms, a seventh of a short benchmark's run). The table never shrinks;
     * a fork copies only its numbers in use. Not under a seccomp filter (GROW false), which
     * may end the process at fcntl. */
    for (int fd = 0; grow && fd <= 2; fd++) {
        int high = fcntl(fd, F_DUPFD_CLOEXEC, top);
        if (high >= 0) {
            close(high);
            break;
        }
    }
}

int _al_fd_move_up(int fd, int at)
{
    if (fd < 0 || fd >= at)
        return fd;
    int high = fcntl(fd, F_DUPFD_CLOEXEC, at);
    struct rlimit nofile;
    if (high < 0 && getrlimit(RLIMIT_NOFILE, &nofile) == 0 && (rlim_t)at >= nofile.rlim_cur &&
        top_for(nofile.rlim_cur) > fd)
        /* The program lowered its limit since start-up (to 1024, for select): as high as the
         * limit lets, rather than the lowest number, which the program's next open would have
         * had. */
        high = fcntl(fd, F_DUPFD_CLOEXEC, top_for(nofile.rlim_cur));
    if (high < 0)
        return fd; /* no room up there: it stays where it is */
    close(fd);
    return high;
}

int _al_fd_high(int fd)
{
    return _al_fd_move_up(fd, base);
}

int _al_fd_top(int fd)
{
    return _al_fd_move_up(fd, top);
}
