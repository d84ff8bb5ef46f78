/* Running the probe: a child process with the allocator preloaded, traced with ptrace so
 * its mmaps and the bytes it maps and unmaps (mmap, munmap, mremap) are counted at the syscall
 * level into a page the probe reads (the allocator's internal calls included, which no wrapper
 * would see).
 * Where ptrace is refused, the probe runs untraced and says so in its confidence line. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prerun.h"

#define OUT_MAX (1u << 20)

static void count(struct al_probe_counters *c, const struct user_regs_struct *r)
{
    long ret = (long)r->rax;
    if (ret < 0 && ret > -4096)
        return; /* failed calls map nothing */
    switch (r->orig_rax) {
    case SYS_mmap: c->mmaps++; c->mmap_bytes += r->rsi; break;
    case SYS_munmap: c->munmap_bytes += r->rsi; break;
    case SYS_mremap: c->mmap_bytes += r->rdx; c->munmap_bytes += r->rsi; break;
    default: break;
    }
}

/* Follows the child through its syscalls until it exits; its exit status, or -1. */
static int trace(pid_t pid, struct al_probe_counters *c)
{
    int status;
    if (waitpid(pid, &status, 0) < 0 || !WIFSTOPPED(status))
        return -1;
    ptrace(PTRACE_SETOPTIONS, pid, 0, PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL);
    c->traced = 1;
    int sig = 0;
    for (;;) {
        if (ptrace(PTRACE_SYSCALL, pid, 0, sig) < 0)
            return -1;
        sig = 0;
        if (waitpid(pid, &status, 0) < 0)
            return -1;
        if (WIFEXITED(status))
            return WEXITSTATUS(status);
        if (WIFSIGNALED(status))
            return 128 + WTERMSIG(status);
        if (!WIFSTOPPED(status))
            continue;
        if (WSTOPSIG(status) == (SIGTRAP | 0x80)) {
            struct user_regs_struct r;
            /* At a syscall's entry the kernel has set rax to -ENOSYS; count at the exit. */
            if (ptrace(PTRACE_GETREGS, pid, 0, &r) == 0 && (long)r.rax != -ENOSYS)
                count(c, &r);
        } else if (WSTOPSIG(status) != SIGTRAP) {
            sig = WSTOPSIG(status);
        }
    }
}

int _al_prerun_probe(const char *allocator_path, const char *probe_exe, struct al_alloc_config *out,
                     bool verbose, char *err, size_t errcap)
{
    int cfd = memfd_create("alloclens-probe-counters", 0);
    if (cfd < 0 || ftruncate(cfd, sizeof(struct al_probe_counters)) < 0) {
        int e = errno;
        if (cfd >= 0)
            close(cfd);
        snprintf(err, errcap, "cannot share counters with the probe: %s", strerror(e));
        return -e;
    }
    struct al_probe_counters *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0);
    if (c == MAP_FAILED) {
        close(cfd);
        snprintf(err, errcap, "cannot share counters with the probe: %s", strerror(errno));
        return -ENOMEM;
    }
    memset(c, 0, sizeof *c);
    c->magic = AL_PROBE_MAGIC;
    /* The probe's config goes to a memory file (no pipe to fill up while it is traced); ptrace
     * needs a child of our own that asks for it before exec. */
    int ofd = memfd_create("alloclens-probe-output", MFD_CLOEXEC), sync[2] = { -1, -1 };
    pid_t pid = ofd < 0 || pipe2(sync, O_CLOEXEC) < 0 ? -1 : fork();
    if (pid < 0) {
        int e = errno;
        snprintf(err, errcap, "cannot start the probe: %s", strerror(e));
        int fds[] = { ofd, sync[0], sync[1], cfd };
        for (unsigned i = 0; i < sizeof fds / sizeof *fds; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        munmap(c, sizeof *c);
        return -e;
    }
    if (pid == 0) {
        dup2(ofd, STDOUT_FILENO);
        if (!verbose) {
            int null = open("/dev/null", O_WRONLY);
            if (null >= 0)
                dup2(null, STDERR_FILENO);
        }
        char fdtext[16];
        snprintf(fdtext, sizeof fdtext, "%d", cfd);
        setenv(AL_PROBE_FD_ENV, fdtext, 1);
        setenv("LD_PRELOAD", allocator_path, 1);
        unsetenv("ALLOCLENS_OUTPUT");
        bool traced = ptrace(PTRACE_TRACEME, 0, 0, 0) == 0;
        char ok = traced;
        (void)!write(sync[1], &ok, 1);
        if (traced)
            raise(SIGSTOP);
        execl(probe_exe, "alloclens-probe", (char *)NULL);
        _exit(127);
    }
    close(sync[1]);
    char traced = 0;
    (void)!read(sync[0], &traced, 1);
    close(sync[0]);
    int rc;
    if (traced) {
        rc = trace(pid, c);
    } else {
        int status;
        rc = waitpid(pid, &status, 0) < 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    static char text[OUT_MAX];
    size_t len = 0;
    for (ssize_t n; (n = pread(ofd, text + len, sizeof text - len, (off_t)len)) > 0;)
        len += (size_t)n;
    close(ofd);
    munmap(c, sizeof *c);
    close(cfd);
    if (rc != 0) {
        snprintf(err, errcap, "the probe under %s failed (status %d)", allocator_path, rc);
        return -EIO;
    }
    char perr[512];
    if (_al_config_parse(text, len, "probe output", out, perr, sizeof perr) < 0) {
        snprintf(err, errcap, "the probe under %s gave a bad config: %s", allocator_path, perr);
        return -EIO;
    }
    if (!realpath(allocator_path, out->allocator))
        snprintf(out->allocator, sizeof out->allocator, "%s", allocator_path);
    _al_config_identity(out->allocator, &out->identity);
    return 0;
}
