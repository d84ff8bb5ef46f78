/* interpose/ internal API: the resolved forwarding targets, the slow entry, the bootstrap
 * pool. The exported entry points themselves live in wrappers.c (allocation), threads.c,
 * exec.c, exit.c, fds.c, locks.c, seccomp.c and signals.c. */
#ifndef ALLOCLENS_INTERPOSE_H
#define ALLOCLENS_INTERPOSE_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

#include "profiler.h"

#define AL_EXPORT __attribute__((visibility("default")))

/* FN, a pointer of ours, set to the next definition of NAME after this library's (the C
 * library's, or the allocator's), as FN's own type. */
#define AL_NEXT(fn, name) ((fn) = (__typeof__(fn))dlsym(RTLD_NEXT, name))

/* (size_t n) -> size_t n: lets a row's parameter list be spliced into a longer one. */
#define AL_UNPAREN_(...) __VA_ARGS__
#define AL_STRIP(x) AL_UNPAREN_ x

#define AL_RET_ALLOC void *
#define AL_RET_REALLOC void *
#define AL_RET_FREE void
#define AL_RET_MEMALIGN int

struct al_real_fns {
#define AL_ENTRY(kind, op, sym, params, args, size, align, target) AL_RET_##kind (*sym) params;
#include "entries.def"
#undef AL_ENTRY
    size_t (*malloc_usable_size)(void *);
};

/* Where each entry point forwards to, and (for the C++ operators we build on the malloc
 * family) the next definition, used only when the allocator fails: it runs the new-handler
 * loop and throws std::bad_alloc, which C cannot. */
extern struct al_real_fns _al_real AL_HIDDEN, _al_next AL_HIDDEN;

/* unwind_glue.c: finds libgcc_s's unwinder routines where the process has it loaded (at
 * start-up, a process hook, and when first needed). */
void _al_unwind_glue_resolve(void);

/* calloc's and reallocarray's byte count; SIZE_MAX when it overflows (the call then fails in
 * the allocator, and the report counts it as a large request). */
static inline size_t _al_mul_size(size_t k, size_t n)
{
    size_t r;
    return __builtin_mul_overflow(k, n, &r) ? SIZE_MAX : r;
}

/* exec.c, exit.c, fds.c, seccomp.c, threads.c, locks.c, signals.c, signal_compat.c: their
 * forwarding targets, resolved with the rest at start-up */
void _al_exec_resolve(void);
const void *_al_exec_real_posix_spawn(void); /* the C library's, which exec.c's wrapper calls */
void _al_fds_resolve(void);
void _al_seccomp_resolve(void);
void _al_exit_resolve(void);
void _al_exit_start(void); /* from our constructor: registers the quick_exit handler */
void _al_threads_resolve(void);
void _al_locks_resolve(void);
void _al_signals_resolve(void);
void _al_signals_start(void); /* from our constructor: stands in for ending signals' defaults */
/* The mask change HOW SET asks for, SIGSYS left deliverable while system calls are dispatched
 * (in *COPY where it must change). */
const sigset_t *_al_signals_deliverable(int how, const sigset_t *set, sigset_t *copy);
/* signal_compat.c */
void _al_signal_compat_resolve(void);

/* clone.c */
void _al_clone_resolve(void);
void _al_dlclose_resolve(void);
/* iterate_phdr.c */
void _al_iterate_phdr_resolve(void);
/* syscall()'s clone, clone3 and fork (NR, args A), made through REAL. */
long _al_clone_syscall(long (*real)(long, ...), long nr, const long a[6]);

/* real.c */
/* The first call of a thread, a nested call, or a call before start-up finished: returns the
 * thread's state with busy set when the call is to be counted, NULL when it must only be
 * forwarded. */
struct al_thread *_al_enter_slow(void);
/* A call made while the thread is inside an operator new (AL_BUSY_NEW), from the return
 * address RA: the thread's state when the program's code made it (the new-handler; the C++
 * runtime making the std::bad_alloc it throws), the interrupted call set aside in NEST; NULL
 * for the allocator's own calls, and the C++ runtime's operator new's that ours falls back on
 * (their retries), which are forwarded. */
struct al_thread *_al_enter_nested(struct al_thread *t, const void *ra, struct al_nest *nest);

/* An entry point's slow path, called from the program at RA: as _al_enter_slow, but for a call
 * nested in an operator new, which may be the program's (_al_enter_nested). */
AL_INLINE struct al_thread *_al_enter_call(const void *ra, struct al_nest *nest)
{
    struct al_thread *t = _al_tls;
    if (AL_LIKELY(t != NULL))
        return AL_UNLIKELY(t->busy == AL_BUSY_NEW) ? _al_enter_nested(t, ra, nest) : NULL;
    return _al_enter_slow();
}

/* bootstrap.c: memory of our own, for dlsym's allocations while the real functions are being
 * resolved, and for the thread writing a report from _exit (_al_own_memory set) */
void *_al_bootstrap_alloc(size_t size);
void *_al_bootstrap_realloc(void *p, size_t size);
size_t _al_bootstrap_usable_size(const void *p);
void *_al_own_alloc(size_t size, size_t alignment);
void *_al_own_realloc(void *p, size_t size);
extern __thread bool _al_own_memory __attribute__((tls_model("initial-exec"))) AL_HIDDEN;
#define AL_BOOTSTRAP_POOL_SIZE (4u << 20)
#define AL_PAGE 4096u /* what valloc and pvalloc align to on x86-64 */
extern char _al_bootstrap_pool[AL_BOOTSTRAP_POOL_SIZE] AL_HIDDEN;

static inline int _al_bootstrap_owns(const void *p)
{
    /* One compare on every free: below the pool (NULL included) wraps to a huge offset. */
    return (uintptr_t)p - (uintptr_t)_al_bootstrap_pool < AL_BOOTSTRAP_POOL_SIZE;
}

#endif
