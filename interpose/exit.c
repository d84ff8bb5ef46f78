/* _exit, _Exit, quick_exit and daemon: a process that ends without exit() still writes its
 * report.
 * dash ends that way (so every `sh -c` and #!/bin/sh script on Debian), as do forked children
 * that are done, and programs leaving from a signal handler. exit() itself reaches libc's _exit
 * internally, not through here, after our exit handler has written the report; quick_exit
 * does too, after the at_quick_exit handlers, the last of which is ours (the first
 * registered).
 *
 * _exit is async-signal-safe and may interrupt the allocator holding a lock: while the report
 * is written, this thread's allocations come from our own pool (bootstrap.c), never from the
 * allocator. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <paths.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "interpose.h"

/* Resolved at start-up: a vfork child calling _exit must not need the dynamic loader. */
static void (*next_exit)(int) __attribute__((noreturn));
static void (*next_quick_exit)(int) __attribute__((noreturn));

/* What quick_exit was given, for our handler: the handlers take no argument. */
static _Atomic int quick_exit_status;

void _al_exit_resolve(void)
{
    AL_NEXT(next_exit, "_exit");
    AL_NEXT(next_quick_exit, "quick_exit");
}

static void report_before_exit(int status)
{
    /* Not set here: a vfork child shares this thread's flag with its parent. */
    _al_process_before_exit_syscall(status, &_al_own_memory);
}

static void quick_exit_report(void)
{
    report_before_exit(atomic_load(&quick_exit_status));
}

void _al_exit_start(void)
{
    /* From our constructor, before the program registers its own: ours runs last. */
    at_quick_exit(quick_exit_report);
}

static _Noreturn void exit_now(int status)
{
    report_before_exit(status);
    if (AL_LIKELY(next_exit != NULL))
        next_exit(status);
    for (;;)
        syscall(SYS_exit_group, status);
}

AL_EXPORT void _exit(int status)
{
    exit_now(status);
}

AL_EXPORT void _Exit(int status)
{
    exit_now(status);
}

AL_EXPORT void quick_exit(int status)
{
    atomic_store(&quick_exit_status, status);
    if (AL_LIKELY(next_quick_exit != NULL))
        next_quick_exit(status);
    exit_now(status);
}

/* glibc's daemon() ends the parent with its own _exit, which does not come here: made here as
 * glibc 2.36 makes it (the same steps, results and errno), the parent leaving through ours. */
AL_EXPORT int daemon(int nochdir, int noclose)
{
    switch (fork()) {
    case -1:
        return -1;
    case 0:
        break;
    default:
        exit_now(0);
    }
    if (setsid() == -1)
        return -1;
    if (!nochdir)
        (void)chdir("/");
    if (noclose)
        return 0;
    struct stat st;
    int fd = open(_PATH_DEVNULL, O_RDWR, 0);
    if (fd == -1)
        return -1;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISCHR(st.st_mode) || st.st_rdev != makedev(1, 3)) {
        close(fd);
        errno = ENODEV; /* no call failed: glibc says this */
        return -1;
    }
    (void)dup2(fd, STDIN_FILENO);
    (void)dup2(fd, STDOUT_FILENO);
    (void)dup2(fd, STDERR_FILENO);
    if (fd > 2)
        (void)close(fd);
    return 0;
}
