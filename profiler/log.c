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
#include <sys/stat.h>
#include <unistd.h>

#include "profiler.h"

/* What stderr was when the image started: a program may close it and open a file of its own,
 * which then gets fd 2 (a data file, a log of its own) and must receive nothing of ours. A
 * copy of the first stderr would cost the program a descriptor and keep a pipe it closed open
 * for whoever reads it, so a line that cannot go where stderr was is not written. */
static struct {
    bool known, open;
    dev_t dev;
    ino_t ino;
} stderr_start;

void _al_stderr_note(void)
{
    struct stat st;
    stderr_start.open = fstat(STDERR_FILENO, &st) == 0;
    stderr_start.dev = st.st_dev;
    stderr_start.ino = st.st_ino;
    stderr_start.known = true;
}

bool _al_stderr_ours(void)
{
    struct stat now;
    if (!stderr_start.known)
        return true; /* start-up: the program has not run yet */
    return stderr_start.open && fstat(STDERR_FILENO, &now) == 0 && now.st_dev == stderr_start.dev &&
           now.st_ino == stderr_start.ino;
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

/* Into a pipe nobody reads (the text report on a stderr piped to `head`), SIGPIPE is blocked
 * for the write, and the one the write raised, if any, taken back. */
int _al_write_all(int fd, const void *data, size_t len)
{
    sigset_t pipe_only, old, pending;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
    int r = write_loop(fd, data, len);
    if (r == -EPIPE && !was_pending) {
        const struct timespec now = { 0, 0 };
        while (sigtimedwait(&pipe_only, NULL, &now) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r;
}

#define MAX_MESSAGES 32

static _Atomic int messages;

void _al_log(const char *fmt, ...)
{
    int n = atomic_fetch_add_explicit(&messages, 1, memory_order_relaxed);
    if (n >= MAX_MESSAGES)
        return;
    char line[1024];
    int off = snprintf(line, sizeof line, "alloclens[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(line + off, sizeof line - (size_t)off - 1, fmt, ap);
    va_end(ap);
    if (len < 0)
        return;
    size_t total = (size_t)off + (size_t)len;
    if (total > sizeof line - 2)
        total = sizeof line - 2;
    line[total++] = '\n';
    if (!_al_stderr_ours())
        return;
    if (n == MAX_MESSAGES - 1) {
        static const char more[] = "alloclens: further messages suppressed\n";
        (void)_al_write_all(STDERR_FILENO, line, total);
        (void)_al_write_all(STDERR_FILENO, more, sizeof more - 1);
        return;
    }
    (void)_al_write_all(STDERR_FILENO, line, total);
}
