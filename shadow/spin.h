/* The profiler's own locks: spin locks, only ever on rare paths (a sample, a snapshot, a thread
 * starting or ending, the report, a region record kept for reuse), never a lock of the
 * allocator being measured. Here, in the lowest of the libraries, so that the shadow table's
 * rare paths take the same ones as the profiler's. */
#ifndef ALLOCLENS_SPIN_H
#define ALLOCLENS_SPIN_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

static inline __attribute__((always_inline)) bool _al_spin_trylock(_Atomic int *l)
{
    return !atomic_exchange_explicit(l, 1, memory_order_acquire);
}

/* The Nth wait of a spin lock's loop: a pause, and past 64 the CPU given up. */
static inline __attribute__((always_inline)) void _al_spin_wait(unsigned n)
{
    if (n > 64)
        sched_yield();
    else
        __builtin_ia32_pause();
}

static inline __attribute__((always_inline)) void _al_spin_lock(_Atomic int *l)
{
    for (unsigned n = 0; !_al_spin_trylock(l); n++)
        _al_spin_wait(n);
}

static inline __attribute__((always_inline)) void _al_spin_unlock(_Atomic int *l)
{
    atomic_store_explicit(l, 0, memory_order_release);
}

/* Owned locks hold their owner, the address of a thread-local of the holding thread's, rather
 * than block signals (two system calls each time): a signal handler that interrupts the holder
 * and comes to the lock finds it its own, and its caller decides what to do then, where a
 * plain spin lock would wait for good. */
extern __thread char _al_lock_owner __attribute__((tls_model("initial-exec"), visibility("hidden")));

static inline bool _al_owned_by_me(_Atomic uintptr_t *l)
{
    return atomic_load_explicit(l, memory_order_relaxed) == (uintptr_t)&_al_lock_owner;
}

/* The lock at L, *TOOK false where it was this thread's already. The wait gives up once UNLESS
 * (may be NULL) reads true: false then, the lock not held. */
static inline bool _al_owned_lock_unless(_Atomic uintptr_t *l, _Atomic bool *unless, bool *took)
{
    uintptr_t me = (uintptr_t)&_al_lock_owner, none;
    *took = false;
    if (atomic_load_explicit(l, memory_order_relaxed) == me)
        return true;
    for (unsigned n = 0;; n++) {
        none = 0;
        if (atomic_compare_exchange_weak_explicit(l, &none, me, memory_order_acquire, memory_order_relaxed))
            return *took = true;
        if (unless && atomic_load(unless))
            return false;
        _al_spin_wait(n);
    }
}

/* Whether the lock at L was taken now (false: it was this thread's already). */
static inline bool _al_owned_lock(_Atomic uintptr_t *l)
{
    bool took;
    _al_owned_lock_unless(l, NULL, &took);
    return took;
}

static inline void _al_owned_unlock(_Atomic uintptr_t *l, bool took)
{
    if (took)
        atomic_store_explicit(l, 0, memory_order_release);
}

#endif
