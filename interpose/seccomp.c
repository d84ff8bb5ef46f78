/* prctl and syscall, for the one thing the profiler must know of either: the program
 * installing a seccomp filter, with prctl(PR_SET_SECCOMP) or the seccomp system call (as
 * libseccomp makes it). profiler/seccomp.c is told before and after; every call goes on to the
 * C library's function with its arguments as they came. (syscall()'s clone, clone3 and fork
 * go through clone.c, which runs our fork handlers around them.) */
#include <dlfcn.h>
#include <linux/seccomp.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "interpose.h"

static long (*real_syscall)(long, ...);
static int (*real_prctl)(int, ...);

void _al_seccomp_resolve(void)
{
    AL_NEXT(real_syscall, "syscall");
    AL_NEXT(real_prctl, "prctl");
}

/* Both take their arguments as the C library's do: read as six words whatever the call, as
 * its own syscall() does (the x86-64 calling convention makes that safe). */
AL_EXPORT long syscall(long nr, ...)
{
    va_list ap;
    va_start(ap, nr);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    if (AL_UNLIKELY(!real_syscall))
        _al_seccomp_resolve();
    if (AL_UNLIKELY(nr == SYS_clone || nr == SYS_clone3 || nr == SYS_fork))
        return _al_clone_syscall(real_syscall, nr, a);
    bool installs = nr == SYS_seccomp && (a[0] == SECCOMP_SET_MODE_STRICT || a[0] == SECCOMP_SET_MODE_FILTER);
    if (AL_LIKELY(!installs))
        return real_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
    _al_seccomp_installing(a[0] == SECCOMP_SET_MODE_STRICT);
    long r = real_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
    /* A new listener's descriptor, or 0; with TSYNC, a thread's id says which thread failed. */
    bool ok = a[1] & SECCOMP_FILTER_FLAG_NEW_LISTENER ? r >= 0 : r == 0;
    _al_seccomp_installed(a[0] == SECCOMP_SET_MODE_STRICT, (const struct sock_fprog *)a[2], ok);
    return r;
}

AL_EXPORT int prctl(int option, ...)
{
    va_list ap;
    va_start(ap, option);
    unsigned long a[4];
    for (int i = 0; i < 4; i++)
        a[i] = va_arg(ap, unsigned long);
    va_end(ap);
    if (AL_UNLIKELY(!real_prctl))
        _al_seccomp_resolve();
    bool installs = option == PR_SET_SECCOMP && (a[0] == SECCOMP_MODE_STRICT || a[0] == SECCOMP_MODE_FILTER);
    if (AL_LIKELY(!installs))
        return real_prctl(option, a[0], a[1], a[2], a[3]);
    _al_seccomp_installing(a[0] == SECCOMP_MODE_STRICT);
    int r = real_prctl(option, a[0], a[1], a[2], a[3]);
    _al_seccomp_installed(a[0] == SECCOMP_MODE_STRICT, (const struct sock_fprog *)a[1], r == 0);
    return r;
}
