/* pthread_create: threads are counted from the moment they are asked for until they exit,
 * which decides the serial/parallel phase of every call. The new thread starts in a
 * trampoline that attaches its state before running the program's function, so its exit is
 * seen (through the thread-exit destructor it registers) however it ends: return,
 * pthread_exit or cancel. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>

#include "interpose.h"

struct start {
    void *(*fn)(void *);
    void *arg;
    struct start *next;
};

/* Start records are recycled through a lock-free list: a thread start must not allocate
 * from the allocator being measured. The list head packs a pointer (our arena lives below
 * 2^47: mmap without a hint never goes higher) with a 17-bit tag that makes the pop safe
 * against ABA. */
#define PTR_BITS 47
#define PTR_MASK ((1ull << PTR_BITS) - 1)

static _Atomic uint64_t free_starts;

static struct start *start_get(void)
{
    uint64_t old = atomic_load(&free_starts), new;
    struct start *s;
    do {
        s = (struct start *)(uintptr_t)(old & PTR_MASK);
        if (!s)
            return _al_mem_alloc(sizeof(struct start));
        new = (((old >> PTR_BITS) + 1) << PTR_BITS) | ((uint64_t)(uintptr_t)s->next & PTR_MASK);
    } while (!atomic_compare_exchange_weak(&free_starts, &old, new));
    return s;
}

static void start_put(struct start *s)
{
    if ((uint64_t)(uintptr_t)s & ~PTR_MASK)
        return; /* cannot be packed: give it up rather than corrupt the list */
    uint64_t old = atomic_load(&free_starts), new;
    do {
        s->next = (struct start *)(uintptr_t)(old & PTR_MASK);
        new = (((old >> PTR_BITS) + 1) << PTR_BITS) | (uint64_t)(uintptr_t)s;
    } while (!atomic_compare_exchange_weak(&free_starts, &old, new));
}

static void *trampoline(void *p)
{
    struct start *s = p;
    void *(*fn)(void *) = s->fn;
    void *arg = s->arg;
    start_put(s);
    _al_thread_announced();
    /* A signal sent to the new thread at once waits until its state is made and it is no
     * longer busy: a handler that allocates is then counted as the program's call it is. */
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSYS);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    struct al_thread *t = _al_tls ? _al_tls : _al_enter_slow();
    if (t) {
        _al_thread_started(t);
        _al_unbusy(t);
    }
    _al_signals_restore(&old);
    return fn(arg);
}

static int (*real_pthread_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

void _al_threads_resolve(void)
{
    AL_NEXT(real_pthread_create, "pthread_create");
}

AL_EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    if (AL_UNLIKELY(!real_pthread_create)) {
        struct al_thread *t = _al_enter_slow(); /* a thread started before any allocation */
        if (t)
            _al_unbusy(t);
        if (!real_pthread_create)
            return EAGAIN;
    }
    struct start *s = start_get();
    if (!s)
        return real_pthread_create(th, attr, fn, arg);
    s->fn = fn;
    s->arg = arg;
    _al_thread_spawning();
    int rc = real_pthread_create(th, attr, trampoline, s);
    if (rc != 0) {
        _al_thread_spawn_failed();
        start_put(s);
    }
    return rc;
}
