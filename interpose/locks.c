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

/* Spin locks taken before start-up resolved them (a program's preinit function can) resolve
 * them first: glibc's protocol is its own (on x86-64, 1 is free), so nothing of ours may stand
 * in. After that the pointers lead straight to glibc. */
static int spin_lock_first(pthread_spinlock_t *l);
static int spin_trylock_first(pthread_spinlock_t *l);
static int spin_unlock_first(pthread_spinlock_t *l);

static int (*real_spin_lock)(pthread_spinlock_t *) = spin_lock_first;
static int (*real_spin_trylock)(pthread_spinlock_t *) = spin_trylock_first;
static int (*real_spin_unlock)(pthread_spinlock_t *) = spin_unlock_first;

#define SPIN_FIRST(name)                                                                   \
    static int spin_##name##_first(pthread_spinlock_t *l)                                  \
    {                                                                                      \
        _al_locks_resolve();                                                               \
        return real_spin_##name != spin_##name##_first ? real_spin_##name(l) : ENOSYS;     \
    }
SPIN_FIRST(lock)
SPIN_FIRST(trylock)
SPIN_FIRST(unlock)
#undef SPIN_FIRST

void _al_locks_resolve(void)
{
    void *f;
    if ((f = dlsym(RTLD_NEXT, "pthread_spin_lock")))
        real_spin_lock = (__typeof__(real_spin_lock))f;
    if ((f = dlsym(RTLD_NEXT, "pthread_spin_trylock")))
        real_spin_trylock = (__typeof__(real_spin_trylock))f;
    if ((f = dlsym(RTLD_NEXT, "pthread_spin_unlock")))
        real_spin_unlock = (__typeof__(real_spin_unlock))f;
}

static inline struct al_thread *in_allocator(void)
{
    struct al_thread *t = _al_tls;
    return AL_UNLIKELY(t && t->in_call) ? t : NULL;
}

/* Every lock and unlock of the program passes here: outside an allocator call the export is
 * the thread-state test and a jump to the real function, and the measurement is out of line.
 * The lock under measurement is tried first, so a wait is seen as contention and timed. */
#define LOCK_WRAPPERS(kind, type, lock, trylock, unlock)                                      \
    static AL_NOINLINE int timed_##kind##_lock(struct al_thread *t, type *m)                  \
    {                                                                                          \
        uint64_t c0 = _al_tsc();                                                               \
        int r = trylock(m);                                                                    \
        bool contended = r == EBUSY;                                                           \
        if (contended)                                                                         \
            r = lock(m);                                                                       \
        uint64_t c1 = _al_tsc();                                                               \
        if (r == 0)                                                                            \
            _al_lock_acquired(t, (const void *)(uintptr_t)m, contended, c1 - c0, c1);          \
        return r;                                                                              \
    }                                                                                          \
    static AL_NOINLINE int timed_##kind##_trylock(struct al_thread *t, type *m)               \
    {                                                                                          \
        int r = trylock(m);                                                                    \
        if (r == 0)                                                                            \
            _al_lock_acquired(t, (const void *)(uintptr_t)m, false, 0, _al_tsc());             \
        return r;                                                                              \
    }                                                                                          \
    static AL_NOINLINE int timed_##kind##_unlock(struct al_thread *t, type *m)                \
    {                                                                                          \
        _al_lock_released(t, (const void *)(uintptr_t)m, _al_tsc());                           \
        return unlock(m);                                                                      \
    }                                                                                          \
    AL_EXPORT int pthread_##kind##_lock(type *m)                                               \
    {                                                                                          \
        struct al_thread *t = in_allocator();                                                  \
        return AL_LIKELY(!t) ? lock(m) : timed_##kind##_lock(t, m);                            \
    }                                                                                          \
    AL_EXPORT int pthread_##kind##_trylock(type *m)                                            \
    {                                                                                          \
        struct al_thread *t = in_allocator();                                                  \
        return AL_LIKELY(!t) ? trylock(m) : timed_##kind##_trylock(t, m);                      \
    }                                                                                          \
    AL_EXPORT int pthread_##kind##_unlock(type *m)                                             \
    {                                                                                          \
        struct al_thread *t = in_allocator();                                                  \
        return AL_LIKELY(!t) ? unlock(m) : timed_##kind##_unlock(t, m);                        \
    }

LOCK_WRAPPERS(mutex, pthread_mutex_t, __pthread_mutex_lock, __pthread_mutex_trylock, __pthread_mutex_unlock)
LOCK_WRAPPERS(spin, pthread_spinlock_t, real_spin_lock, real_spin_trylock, real_spin_unlock)
