/* Processes made without the C library's fork: the clone, clone3 and fork system calls made
 * through syscall(), and glibc's clone(). fork() runs our fork handlers, which set the child's
 * state right (its thread's event counters, whose ring the child does not inherit; whose
 * process it is; the locks); these do not, and a child's first counted call read the parent's
 * ring (SIGSEGV) and its report was never written. Around a call that makes a process of its
 * own (no CLONE_VM) and goes on on the same stack, or runs a function of ours, the same
 * handlers run here. A child sharing its parent's memory (CLONE_VM) is left alone, as a vfork
 * child is.
 */
#include <linux/sched.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/syscall.h>

#include "interpose.h"

static int (*next_clone)(int (*)(void *), void *, int, void *, ...);

void _al_clone_resolve(void)
{
    AL_NEXT(next_clone, "clone");
}

static bool ready(void)
{
    return atomic_load_explicit(&_al_state, memory_order_acquire) == AL_STATE_READY;
}

long _al_clone_syscall(long (*real)(long, ...), long nr, const long a[6])
{
    bool own = false;
    if (nr == SYS_fork) {
        own = true;
    } else if (nr == SYS_clone) {
        own = !(a[0] & CLONE_VM) && a[1] == 0; /* the child returns here, on this stack */
    } else if (nr == SYS_clone3 && a[0] && (size_t)a[1] >= offsetof(struct clone_args, stack_size)) {
        const struct clone_args *args = (const struct clone_args *)a[0];
        own = !(args->flags & CLONE_VM) && args->stack == 0;
    }
    if (!own || !ready())
        return real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
    _al_process_atfork_prepare();
    long r = real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
    if (r == 0)
        _al_process_atfork_child();
    else
        _al_process_atfork_parent();
    return r;
}

/* The child's start: its state set right, the program's function run, and its return taken as
 * the process's end (glibc's clone then makes the exit system call itself). The parent's frame
 * holding this is the child's too: it has a copy of the parent's memory. */
struct start {
    int (*fn)(void *);
    void *arg;
};

static int child_start(void *p)
{
    const struct start *s = p;
    _al_process_atfork_child();
    int status = s->fn(s->arg);
    _al_process_before_exit_syscall(status, &_al_own_memory);
    return status;
}

AL_EXPORT int clone(int (*fn)(void *), void *stack, int flags, void *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    void *ptid = va_arg(ap, void *), *tls = va_arg(ap, void *), *ctid = va_arg(ap, void *);
    va_end(ap);
    if (AL_UNLIKELY(!next_clone))
        _al_clone_resolve();
    if ((flags & CLONE_VM) || !ready())
        return next_clone(fn, stack, flags, arg, ptid, tls, ctid);
    struct start s = { fn, arg };
    _al_process_atfork_prepare();
    int r = next_clone(child_start, stack, flags, &s, ptid, tls, ctid);
    _al_process_atfork_parent();
    return r;
}
