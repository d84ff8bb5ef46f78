/* The rare work of recording a call: the first allocation of the process, whose time is the
 * allocator's own start-up and would swamp every statistic of its row, is counted but kept
 * out of the cycle figures (the report shows it on its own line). */
#include "profiler.h"

uint64_t _al_large_threshold = 131072;
bool _al_full = true;
uint64_t _al_tsc_overhead;
struct al_first_call _al_first;

AL_NOINLINE void _al_record_first(struct al_thread *t, unsigned row, uint64_t cycles)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&_al_first.taken, &expected, 1)) {
        _al_first.row = row;
        _al_first.cycles = cycles;
        return;
    }
    struct al_row *r = &t->rows[row];
    cycles = cycles > _al_tsc_overhead ? cycles - _al_tsc_overhead : 0;
    AL_BUMP(r->timed, 1);
    AL_BUMP(r->cycles, cycles);
    uint64_t *h = t->hist[row] ? t->hist[row] : _al_thread_hist_row(t, row);
    AL_BUMP(h[_al_hist_bucket(cycles)], 1);
}
