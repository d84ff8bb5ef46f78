/* pthread mutexes and spin locks: forwarded untouched, except while an allocator call is in
 * progress on the thread, when each acquisition is counted, a contended one (the lock was
 * taken when we tried) with its waiting time, and the time it is held until its unlock. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

#include "interpose.h"

/* glibc's own entry points, under the names it exports for exactly this (as non-default
 * versions, so they are named with theirs): usable from the first call, before dlsym. */
__asm__(".symver __pthread_mutex_lock, __pthread_mutex_lock@GLIBC_2.2.5");
__asm__(".symver __pthread_mutex_trylock, __pthread_mutex_trylock@GLIBC_2.2.5");
__asm__(".symver __pthread_mutex_unlock, __pthread_mutex_unlock@GLIBC_2.2.5");
extern int __pthread_mutex_lock(pthread_mutex_t *);
extern int __pthread_mutex_trylock(pthread_mutex_t *);
extern int __pthread_mutex_unlock(pthread_mutex_t *);

static int (*real_spin_lock)(pthread_spinlock_t *);
static int (*real_spin_trylock)(pthread_spinlock_t *);
static int (*real_spin_unlock)(pthread_spinlock_t *);

void _al_locks_resolve(void)
{
    real_spin_lock = (__typeof__(real_spin_lock))dlsym(RTLD_NEXT, "pthread_spin_lock");
    real_spin_trylock = (__typeof__(real_spin_trylock))dlsym(RTLD_NEXT, "pthread_spin_trylock");
    real_spin_unlock = (__typeof__(real_spin_unlock))dlsym(RTLD_NEXT, "pthread_spin_unlock");
}

static inline struct al_thread *in_allocator(void)
{
    struct al_thread *t = _al_tls;
    return AL_UNLIKELY(t && t->in_call) ? t : NULL;
}

/* The lock under measurement: try first, so a wait is seen as contention and timed. */
#define TIMED_LOCK(lock, trylock, m)                                   \
    do {                                                               \
        uint64_t c0 = _al_tsc();                                       \
        int r_ = trylock(m);                                           \
        bool contended_ = r_ == EBUSY;                                 \
        if (contended_)                                                \
            r_ = lock(m);                                              \
        uint64_t c1 = _al_tsc();                                       \
        if (r_ == 0)                                                   \
            _al_lock_acquired(t, (const void *)(uintptr_t)(m), contended_, c1 - c0, c1);          \
        return r_;                                                     \
    } while (0)

AL_EXPORT int pthread_mutex_lock(pthread_mutex_t *m)
{
    struct al_thread *t = in_allocator();
    if (AL_LIKELY(!t))
        return __pthread_mutex_lock(m);
    TIMED_LOCK(__pthread_mutex_lock, __pthread_mutex_trylock, m);
}

AL_EXPORT int pthread_mutex_trylock(pthread_mutex_t *m)
{
    struct al_thread *t = in_allocator();
    int r = __pthread_mutex_trylock(m);
    if (AL_UNLIKELY(t != NULL) && r == 0)
        _al_lock_acquired(t, m, false, 0, _al_tsc());
    return r;
}

AL_EXPORT int pthread_mutex_unlock(pthread_mutex_t *m)
{
    struct al_thread *t = in_allocator();
    if (AL_UNLIKELY(t != NULL))
        _al_lock_released(t, m, _al_tsc());
    return __pthread_mutex_unlock(m);
}

/* Spin locks before start-up resolved them (nothing takes one that early in practice): the
 * same protocol as glibc's, 0 free, nonzero held. */
static int spin_lock_early(pthread_spinlock_t *l)
{
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE))
        __builtin_ia32_pause();
    return 0;
}

static int spin_trylock_early(pthread_spinlock_t *l)
{
    return __atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE) ? EBUSY : 0;
}

static int spin_unlock_early(pthread_spinlock_t *l)
{
    __atomic_store_n(l, 0, __ATOMIC_RELEASE);
    return 0;
}

#define SPIN(fn) (real_spin_##fn ? real_spin_##fn : spin_##fn##_early)

AL_EXPORT int pthread_spin_lock(pthread_spinlock_t *l)
{
    struct al_thread *t = in_allocator();
    if (AL_LIKELY(!t))
        return SPIN(lock)(l);
    TIMED_LOCK(SPIN(lock), SPIN(trylock), l);
}

AL_EXPORT int pthread_spin_trylock(pthread_spinlock_t *l)
{
    struct al_thread *t = in_allocator();
    int r = SPIN(trylock)(l);
    if (AL_UNLIKELY(t != NULL) && r == 0)
        _al_lock_acquired(t, (const void *)(uintptr_t)l, false, 0, _al_tsc());
    return r;
}

AL_EXPORT int pthread_spin_unlock(pthread_spinlock_t *l)
{
    struct al_thread *t = in_allocator();
    if (AL_UNLIKELY(t != NULL))
        _al_lock_released(t, (const void *)(uintptr_t)l, _al_tsc());
    return SPIN(unlock)(l);
}
