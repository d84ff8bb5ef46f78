/* pipe2, open, read and close, for the one caller that is ours: libunwind, while the sampler
 * unwinds (_al_fds_ours, and a call from libunwind's code); close, fclose, dup2 and dup3 also
 * for fd 2, where the text report is to go (a shell's `exec 2>log` is a dup2 onto it).
 * Every other call goes straight through.
 *
 * libunwind makes a pipe when it first checks that an address is readable (by writing from
 * it), and may open a file; the C library would number them among the program's
 * lowest: what it makes while we unwind is moved up out of the program's way (profiler/fds.c)
 * and noted here. It keeps its pipe's numbers in a variable of its own, and the pipe may not be
 * one we moved: another user of the same libunwind made it first (tcmalloc unwinds at its start,
 * so the pipe is the program's descriptors 3 and 4), or the program closed every descriptor
 * and opened its own under those numbers. libunwind would then read a byte from the program's
 * descriptor, write one to another, and close both. So while we unwind, a descriptor it did
 * not make reads as closed and is not closed: libunwind then makes a new pipe, which is
 * moved up. The walk's pipe is closed as the walk ends (profiler/fds.c), and libunwind's reads
 * and closes of the numbers it still holds then, by whoever calls it, go the same way. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "interpose.h"

static int (*real_pipe2)(int[2], int);
static int (*real_open)(const char *, int, ...);
static ssize_t (*real_read)(int, void *, size_t);
static int (*real_close)(int);
static int (*real_fclose)(FILE *);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);

void _al_fds_resolve(void)
{
    AL_NEXT(real_pipe2, "pipe2");
    AL_NEXT(real_open, "open");
    AL_NEXT(real_read, "read");
    AL_NEXT(real_close, "close");
    AL_NEXT(real_fclose, "fclose");
    AL_NEXT(real_dup2, "dup2");
    AL_NEXT(real_dup3, "dup3");
}

/* The descriptors libunwind made while we unwound, as moved up, each + 1 (0: a free slot).
 * It holds at most its pipe and a file at a time; past MADE_MAX, one is not noted, and reads
 * as closed to it (it then makes another). */
#define MADE_MAX 8
static _Atomic int made[MADE_MAX];
static _Atomic unsigned nmade;

static bool was_made(int fd)
{
    for (unsigned i = 0; i < MADE_MAX; i++)
        if (atomic_load_explicit(&made[i], memory_order_relaxed) == fd + 1)
            return true;
    return false;
}

static void forget(int fd)
{
    for (unsigned i = 0; i < MADE_MAX; i++) {
        int want = fd + 1;
        if (atomic_compare_exchange_strong(&made[i], &want, 0))
            atomic_fetch_sub(&nmade, 1);
    }
}

/* A call made by libunwind while we unwind (CALLER: where it returns to), not by a signal
 * handler of the program's that interrupted the stack walk on this thread: the handler's
 * descriptors are its own (libuv's signal handler reads its lock pipe; read as closed, the
 * signal was lost, and node waited for its child for good). */
static inline bool unwinders(const void *caller)
{
    return AL_UNLIKELY(_al_fds_ours) && _al_code_holds(&_al_unwinder_code, caller);
}

/* libunwind (CALLER in its code, whoever called it) at FD, a number of a pipe of its that we
 * closed after a walk (profiler/fds.c): it reads as closed and is not closed. */
static inline bool retired_for(int fd, const void *caller)
{
    return _al_fds_retired(fd) && _al_code_holds(&_al_unwinder_code, caller);
}

/* FD, made while we unwind, moved up and noted. The move's own close of the low number is the
 * move's, not libunwind's: not filtered. */
static int made_here(int fd)
{
    _al_fds_ours = false;
    fd = _al_fd_top(fd);
    _al_fds_ours = true;
    for (unsigned i = 0; i < MADE_MAX; i++) {
        int empty = 0;
        if (atomic_compare_exchange_strong(&made[i], &empty, fd + 1)) {
            atomic_fetch_add(&nmade, 1);
            break;
        }
    }
    return fd;
}

AL_EXPORT int pipe2(int fds[2], int flags)
{
    const void *caller = __builtin_return_address(0);
    int r = real_pipe2 ? real_pipe2(fds, flags) : (int)syscall(SYS_pipe2, fds, flags);
    if (r == 0 && AL_UNLIKELY(_al_code_holds(&_al_unwinder_code, caller))) {
        bool ours = unwinders(caller);
        if (ours) {
            fds[0] = made_here(fds[0]);
            fds[1] = made_here(fds[1]);
        }
        _al_fds_unwinder_pipe(fds, ours);
    }
    return r;
}

/* The C library's header names open64 where large files are the default (as here): this is
 * open itself, the name libunwind calls. */
AL_EXPORT int open_entry(const char *path, int flags, ...) __asm__("open");
AL_EXPORT int open_entry(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    int fd = real_open ? real_open(path, flags, mode) : (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
    if (unwinders(__builtin_return_address(0)) && fd >= 0)
        fd = made_here(fd);
    return fd;
}

AL_EXPORT ssize_t read(int fd, void *buf, size_t n)
{
    const void *caller = __builtin_return_address(0);
    if (retired_for(fd, caller) || (unwinders(caller) && !was_made(fd))) {
        errno = EBADF;
        return -1;
    }
    return real_read ? real_read(fd, buf, n) : syscall(SYS_read, fd, buf, n);
}

AL_EXPORT int close(int fd)
{
    const void *caller = __builtin_return_address(0);
    if (retired_for(fd, caller))
        return 0; /* perhaps the program's now */
    if (unwinders(caller) && !was_made(fd)) {
        /* The pipe of another user of libunwind's, made before our walks (never -1, which
         * its first pipe's making closes), or the program's under those numbers: kept. */
        if (fd >= 0)
            _al_fds_unwinder_shared();
        return 0;
    }
    if (AL_UNLIKELY(fd == STDERR_FILENO))
        _al_report_stderr_closing(); /* the text report may still be due there */
    /* Closed by libunwind, or by the program: no longer libunwind's either way. */
    if (AL_UNLIKELY(atomic_load_explicit(&nmade, memory_order_relaxed) != 0))
        forget(fd);
    return real_close ? real_close(fd) : (int)syscall(SYS_close, fd);
}

/* The C library's fclose closes the descriptor itself, not through close: fclose(stderr) is how
 * most programs close fd 2 (every coreutils program does at exit). */
AL_EXPORT int fclose(FILE *f)
{
    if (AL_UNLIKELY(!real_fclose))
        _al_fds_resolve();
    if (AL_UNLIKELY(f && fileno_unlocked(f) == STDERR_FILENO))
        _al_report_stderr_closing();
    return real_fclose(f);
}

/* Another file put on fd 2 closes the stderr that was there. */
static void duplicating(int fd, int to)
{
    if (AL_UNLIKELY(to == STDERR_FILENO && fd != to))
        _al_report_stderr_closing();
}

AL_EXPORT int dup2(int fd, int to)
{
    duplicating(fd, to);
    return real_dup2 ? real_dup2(fd, to) : (int)syscall(SYS_dup2, fd, to);
}

AL_EXPORT int dup3(int fd, int to, int flags)
{
    duplicating(fd, to);
    return real_dup3 ? real_dup3(fd, to, flags) : (int)syscall(SYS_dup3, fd, to, flags);
}
