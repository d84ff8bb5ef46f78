/* The profiler's own descriptors, kept above the numbers a program counts on: open, pipe and
 * socket give the lowest free number, and a program's descriptors must be numbered as they
 * would be without us. A program may also close every descriptor it did not open (as daemons
 * do) and be given those numbers again: ours are moved where that is unlikely, and whoever
 * closes one of ours checks first that it still is. libunwind cannot be made to check: when it
 * finds its pipe gone it closes the two numbers blindly, so its pipe goes higher still. */
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
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

/* libunwind's pipe. libunwind checks that an address can be read by writing a byte from it into
 * a pipe of its own (after mincore, which says only that it is mapped), makes the pipe at its
 * start, keeps its numbers, and makes a new pipe whenever a read from the old one fails. Kept
 * open, it was two descriptors of ours in the program for good, which a program listing its own
 * finds (/proc/self/fd: CPython's test_subprocess checks that a child has nothing open but what
 * it was given). So a pipe made during a walk of ours is closed as the walk ends (a walk needs
 * one only at a page libunwind has not checked before: a few walks in a program's life), and
 * its numbers are retired: libunwind's next read from them, in our walk or another user's of
 * the same library, reads as closed, and it makes a new pipe; its closes of them close nothing
 * (the number may be the program's by then). Where libunwind had a pipe before our first walk
 * (tcmalloc uses it at its start), the one we made stands in for it and stays open: that user
 * may look at memory after us, and a pipe of its own made then would take the program's next
 * numbers. walk_pipe is written under the sampler's unwind lock only. */
static int walk_pipe[2] = { -1, -1 };
static struct stat walk_pipe_st; /* both ends' inode */
_Atomic int _al_fds_retired_pipe[2] = { -1, -1 };
static _Atomic bool pipe_shared;

void _al_fds_unwinder_pipe(const int fds[2], bool in_walk)
{
    atomic_store_explicit(&_al_fds_retired_pipe[0], -1, memory_order_relaxed);
    atomic_store_explicit(&_al_fds_retired_pipe[1], -1, memory_order_relaxed);
    if (in_walk && fstat(fds[0], &walk_pipe_st) == 0) {
        walk_pipe[0] = fds[0];
        walk_pipe[1] = fds[1];
    }
}

/* Whether FD is still the walk's pipe: a program may close every descriptor behind our back
 * (close_range, which no wrapper sees) and be given the number again for one of its own. */
static bool still_walk_pipe(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && st.st_ino == walk_pipe_st.st_ino &&
           st.st_dev == walk_pipe_st.st_dev;
}

void _al_fds_unwinder_shared(void)
{
    atomic_store_explicit(&pipe_shared, true, memory_order_relaxed);
}

void _al_fds_walk_end(void)
{
    if (walk_pipe[0] < 0)
        return;
    if (!atomic_load_explicit(&pipe_shared, memory_order_relaxed)) {
        /* Through the interposed close, which forgets them as libunwind's. Retired either way:
         * a number that is the program's now is kept from libunwind too. */
        for (int i = 0; i < 2; i++)
            if (still_walk_pipe(walk_pipe[i]))
                close(walk_pipe[i]);
        atomic_store_explicit(&_al_fds_retired_pipe[0], walk_pipe[0], memory_order_relaxed);
        atomic_store_explicit(&_al_fds_retired_pipe[1], walk_pipe[1], memory_order_relaxed);
    }
    walk_pipe[0] = walk_pipe[1] = -1;
}

/* Room for the report's descriptors (its files, the symbolizer's) at the program's end: a
 * program that ends with every descriptor its limit allows still open left none, and got one
 * line instead of its report. The soft limit is raised by REPORT_FDS for the report's time, as
 * far as the hard limit lets (a process may raise its own up to that), and put back after: an
 * exec'd image, and whatever runs after the report, see the limit the program set. Not under a
 * seccomp filter of the program's, which may end the process at prlimit64. */
#define REPORT_FDS 8

bool _al_fds_report_room(struct rlimit *saved)
{
    if (atomic_load(&_al_seccomp_on) || getrlimit(RLIMIT_NOFILE, saved) != 0 ||
        saved->rlim_cur >= saved->rlim_max)
        return false;
    struct rlimit more = *saved;
    more.rlim_cur = saved->rlim_max - saved->rlim_cur > REPORT_FDS ? saved->rlim_cur + REPORT_FDS : saved->rlim_max;
    return setrlimit(RLIMIT_NOFILE, &more) == 0;
}

void _al_fds_report_done(const struct rlimit *saved)
{
    setrlimit(RLIMIT_NOFILE, saved);
}
