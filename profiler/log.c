/* What the profiler writes to descriptors: the one line on stderr it talks to the user with
 * while the program runs (formatted on the stack and written with write(2): no stdio, no
 * allocation; capped so a misbehaving run cannot flood the program's stderr), and whole
 * reports. Neither may end the program by SIGPIPE, nor go into a file of the program's that
 * took over fd 2. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "profiler.h"

/* What stderr was when the image started: a program may close it and open a file of its own,
 * which then gets fd 2 (a data file, a log of its own) and must receive nothing of ours. A
 * copy of the first stderr held all along would cost the program a descriptor and keep a pipe
 * it closed open for whoever reads it. Only in the run's main process (which writes the text
 * report there, and says there what became of its reports), where the program closes fd 2 while
 * it is still that stderr (every coreutils program does, at exit), a copy is taken then, kept to
 * the end (not by a fork child, not across exec). */
static struct {
    bool known, open;
    dev_t dev;
    ino_t ino;
    int saved; /* the copy, or -1 */
} stderr_start = { .saved = -1 };

void _al_stderr_note(const char *run_stderr)
{
    stderr_start.known = true;
    stderr_start.saved = -1;
    /* Under `alloclens run`, the stderr it was started with: an image that a program which
     * had put a file of its own on fd 2 then exec'd finds that file there at its start. */
    unsigned long long dev, ino;
    int end = 0;
    if (run_stderr && strcmp(run_stderr, "closed") == 0) {
        stderr_start.open = false;
        return;
    }
    if (run_stderr && sscanf(run_stderr, "%llu:%llu%n", &dev, &ino, &end) == 2 && !run_stderr[end]) {
        stderr_start.open = true;
        stderr_start.dev = (dev_t)dev;
        stderr_start.ino = (ino_t)ino;
        return;
    }
    struct stat st;
    stderr_start.open = fstat(STDERR_FILENO, &st) == 0;
    stderr_start.dev = st.st_dev;
    stderr_start.ino = st.st_ino;
    if (run_stderr)
        _al_log("ALLOCLENS_STDERR='%s' is not DEVICE:INODE; using this image's fd 2", run_stderr);
}

static bool is_start(int fd)
{
    struct stat now;
    return stderr_start.open && fstat(fd, &now) == 0 && now.st_dev == stderr_start.dev &&
           now.st_ino == stderr_start.ino;
}

bool _al_stderr_copy_due(void)
{
    return stderr_start.saved < 0 && stderr_start.known && is_start(STDERR_FILENO);
}

void _al_stderr_keep(int copy)
{
    stderr_start.saved = copy;
}

void _al_stderr_after_fork_child(void)
{
    if (stderr_start.saved >= 0)
        close(stderr_start.saved);
    stderr_start.saved = -1;
}

int _al_stderr_fd(void)
{
    if (!stderr_start.known || is_start(STDERR_FILENO))
        return STDERR_FILENO;
    return stderr_start.saved >= 0 && is_start(stderr_start.saved) ? stderr_start.saved : -1;
}

static int write_loop(int fd, const char *p, size_t len)
{
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Into a pipe nobody reads (the text report on a stderr piped to `head`) the write raises
 * SIGPIPE, and past the program's file size limit (ulimit -f: a report bigger than anything the
 * program writes) SIGXFSZ: either would end the program. Both are blocked for the write, and
 * one the write raised taken back; the write's error says what happened. */
static void take_back(int sig)
{
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    const struct timespec now = { 0, 0 };
    while (sigtimedwait(&one, NULL, &now) < 0 && errno == EINTR)
        ;
}

/* Blocking leaves the C library's own signals as they were (its sigfillset and pthread_sigmask
 * leave them out), which is what blocking wants. */
void _al_signals_block_all(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    sigdelset(&all, SIGSYS);
    pthread_sigmask(SIG_BLOCK, &all, old);
}

/* pthread_sigmask leaves the C library's own signals out of any mask it is given (SIGCANCEL,
 * SIGSETXID and SIGTIMER, 32): putting back a mask with it unblocked the SIGTIMER that a
 * SIGEV_THREAD timer's helper thread keeps blocked to wait for it, and the timer's next
 * expiry killed the process (its first malloc took the registry's lock; a helper's stress run
 * found it). The system call puts back exactly what was there. */
void _al_signals_restore(const sigset_t *old)
{
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, old, NULL, _NSIG / 8);
}

int _al_write_all(int fd, const void *data, size_t len)
{
    sigset_t raised, old, pending;
    sigemptyset(&raised);
    sigaddset(&raised, SIGPIPE);
    sigaddset(&raised, SIGXFSZ);
    bool had = sigpending(&pending) == 0;
    bool pipe_pending = had && sigismember(&pending, SIGPIPE), xfsz_pending = had && sigismember(&pending, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &raised, &old);
    int r = write_loop(fd, data, len);
    if (r == -EPIPE && !pipe_pending)
        take_back(SIGPIPE);
    if (r == -EFBIG && !xfsz_pending)
        take_back(SIGXFSZ);
    _al_signals_restore(&old);
    return r;
}

#define MAX_MESSAGES 32

static _Atomic int messages;

void _al_log(const char *fmt, ...)
{
    int n = atomic_fetch_add_explicit(&messages, 1, memory_order_relaxed);
    if (n >= MAX_MESSAGES)
        return;
    char text[1024], line[1024];
    int off = snprintf(line, sizeof line, "alloclens[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (len < 0)
        return;
    size_t total = (size_t)off + _al_escape_controls(text, (size_t)len < sizeof text ? (size_t)len : sizeof text - 1,
                                                 line + off, sizeof line - (size_t)off - 1);
    line[total++] = '\n';
    int fd = _al_stderr_fd();
    if (fd < 0)
        return;
    if (n == MAX_MESSAGES - 1) {
        static const char more[] = "alloclens: further messages suppressed\n";
        (void)_al_write_all(fd, line, total);
        (void)_al_write_all(fd, more, sizeof more - 1);
        return;
    }
    (void)_al_write_all(fd, line, total);
}
