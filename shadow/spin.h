/* The profiler's own locks: spin locks, only ever on rare paths (a sample, a snapshot, a thread
 * starting or ending, the report, a region record kept for reuse), never a lock of the
 * allocator being measured. Here, in the lowest of the libraries, so that the shadow table's
 * rare paths take the same ones as the profiler's. */
#ifndef ALLOCLENS_SPIN_H
#define ALLOCLENS_SPIN_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

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

#endif
