/* pipe2, for the one caller that is ours: libunwind makes a pipe on its first look at memory
 * (it checks an address is readable by writing from it), which the C library would number
 * among the program's lowest. While the sampler unwinds, what pipe2 makes is moved up out of
 * the program's way (profiler/fds.c); every other call goes straight through. */
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "interpose.h"

static int (*real_pipe2)(int[2], int);

void _al_fds_resolve(void)
{
    real_pipe2 = (__typeof__(real_pipe2))dlsym(RTLD_NEXT, "pipe2");
}

AL_EXPORT int pipe2(int fds[2], int flags)
{
    int r = real_pipe2 ? real_pipe2(fds, flags) : (int)syscall(SYS_pipe2, fds, flags);
    if (AL_UNLIKELY(_al_fds_ours) && r == 0) {
        fds[0] = _al_fd_top(fds[0]);
        fds[1] = _al_fd_top(fds[1]);
    }
    return r;
}
