/* Lock contention inside the allocator: per lock (by address), acquisitions, contended
 * acquisitions, cycles spent waiting and cycles held, for the pthread mutexes and spin locks
 * taken while an allocator call is in progress. The table is lock-free: a slot is claimed by
 * compare-and-swap on its address, counters are atomic adds (locks are few; this is the rare
 * path of a call that took a lock). */
#include "profiler.h"

struct al_lock_stats *_al_locks;

/* The slots in the order they were claimed, each as its index + 1 (0 while it is being
 * written), so that a report reads the claimed slots alone: a scan of the whole table read
 * its 10 pages in every process, with or without locks, a fault each. A report made in the
 * few instructions between a slot's claim and its entry here misses that lock. */
_Static_assert(AL_LOCKS_MAX < 65536, "slot index + 1 in 16 bits");
static _Atomic uint16_t claimed[AL_LOCKS_MAX] AL_LARGE_BSS;
static _Atomic unsigned nclaimed;

unsigned _al_locks_claimed(void)
{
    return _al_locks ? atomic_load_explicit(&nclaimed, memory_order_acquire) : 0;
}

const struct al_lock_stats *_al_locks_at(unsigned k)
{
    unsigned i = atomic_load_explicit(&claimed[k], memory_order_acquire);
    return i ? &_al_locks[i - 1] : NULL;
}

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
            if (atomic_compare_exchange_strong(&_al_locks[i].id, &expected, id)) {
                unsigned k = atomic_fetch_add_explicit(&nclaimed, 1, memory_order_acq_rel);
                atomic_store_explicit(&claimed[k], (uint16_t)(i + 1), memory_order_release);
                return &_al_locks[i];
            }
            if (expected == id)
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
