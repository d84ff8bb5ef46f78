/* Lock contention inside the allocator: per lock (by address), acquisitions, contended
 * acquisitions, cycles spent waiting and cycles held, for the pthread mutexes and spin locks
 * taken while an allocator call is in progress. The table is lock-free: a slot is claimed by
 * compare-and-swap on its address, counters are atomic adds (locks are few; this is the rare
 * path of a call that took a lock). */
#include "profiler.h"

struct al_lock_stats *_al_locks;

void _al_locks_init(void)
{
    _al_locks = _al_mem_map(AL_LOCKS_MAX * sizeof *_al_locks);
}

static struct al_lock_stats *slot(const void *lock)
{
    if (!_al_locks)
        return NULL;
    uintptr_t id = (uintptr_t)lock;
    for (unsigned i = (unsigned)_al_fib_hash(id >> 4, AL_LOCKS_BITS), n = 0; n < AL_LOCKS_MAX;
         i = (i + 1) % AL_LOCKS_MAX, n++) {
        uintptr_t cur = atomic_load_explicit(&_al_locks[i].id, memory_order_acquire);
        if (cur == id)
            return &_al_locks[i];
        if (cur == 0) {
            uintptr_t expected = 0;
            if (atomic_compare_exchange_strong(&_al_locks[i].id, &expected, id) || expected == id)
                return &_al_locks[i];
        }
    }
    return NULL; /* table full: further locks go uncounted */
}

void _al_lock_acquired(struct al_thread *t, const void *lock, bool contended, uint64_t wait, uint64_t now)
{
    struct al_lock_stats *s = slot(lock);
    if (s) {
        atomic_fetch_add_explicit(&s->acquisitions, 1, memory_order_relaxed);
        if (contended) {
            atomic_fetch_add_explicit(&s->contended, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->wait_cycles, wait, memory_order_relaxed);
        }
    }
    if (t->nheld < AL_HELD_MAX)
        t->held[t->nheld++] = (struct al_held){ lock, now };
}

void _al_lock_released(struct al_thread *t, const void *lock, uint64_t now)
{
    for (unsigned i = t->nheld; i-- > 0;) {
        if (t->held[i].lock != lock)
            continue;
        struct al_lock_stats *s = slot(lock);
        if (s)
            atomic_fetch_add_explicit(&s->hold_cycles, now - t->held[i].since, memory_order_relaxed);
        t->held[i] = t->held[--t->nheld];
        return;
    }
}
