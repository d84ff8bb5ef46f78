/* The rare work of recording a call: the first allocation of the process, whose time is the
 * allocator's own start-up and would swamp every statistic of its row, is counted but kept
 * out of the cycle figures (the report shows it on its own line); a counted call's events go
 * to its op's sums. */
#include "profiler.h"

struct al_hot _al_hot __attribute__((aligned(4096))) = {
    .timed = true, .records = true, .large_threshold = 131072,
};
enum al_mode _al_mode = AL_MODE_FULL;
struct al_first_call _al_first;

/* Whether this call is the process's first: it is then kept apart, out of its row's times. */
AL_NOINLINE bool _al_record_first(unsigned row, uint64_t cycles)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&_al_first.taken, &expected, 1))
        return false;
    _al_first.row = row;
    _al_first.cycles = cycles;
    _al_first.start = _al_tsc() - cycles;
    return true;
}

AL_NOINLINE void _al_call_counted(struct al_thread *t, unsigned op, uint64_t cycles)
{
    enum al_counted r = _al_counters_after(&t->ctr, cycles, t->m.ctr_sums[op], &t->m.ctr_off_cpu_ns[op]);
    if (r == AL_CTR_COUNTED)
        AL_BUMP(t->m.ctr_ops[op], 1);
    else if (r == AL_CTR_DROPPED)
        AL_BUMP(t->m.ctr_dropped, 1);
}
