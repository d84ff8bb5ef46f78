/* _exit and _Exit: a process that ends without exit() still writes its report. dash ends that
 * way (so every `sh -c` and #!/bin/sh script on Debian), as do forked children that are done,
 * and programs leaving from a signal handler. exit() itself reaches libc's _exit internally,
 * not through here, after our exit handler has written the report.
 *
 * _exit is async-signal-safe and may interrupt the allocator holding a lock: while the report
 * is written, this thread's allocations come from our own pool (bootstrap.c), never from the
 * allocator. */
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "interpose.h"

/* Resolved at start-up: a vfork child calling _exit must not need the dynamic loader. */
static void (*next_exit)(int) __attribute__((noreturn));

void _al_exit_resolve(void)
{
    next_exit = (__typeof__(next_exit))dlsym(RTLD_NEXT, "_exit");
}

static _Noreturn void exit_now(int status)
{
    /* Not set here: a vfork child shares this thread's flag with its parent. */
    _al_process_before_exit_syscall(status, &_al_own_memory);
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
