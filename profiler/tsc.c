/* The cycle counter: what a measurement itself costs, and how cycles convert to time.
 *
 * The TSC is invariant on the machines we run on (constant_tsc, nonstop_tsc), so one rate
 * holds for the whole run: it is taken between the image's start and the report, against
 * CLOCK_MONOTONIC, which costs nothing at start-up and gets more precise the longer the run.
 * The start is kept across fork (the counter is the machine's), so a short-lived child's
 * report has its parent's run to measure the rate over.
 */
#include <time.h>

#include "profiler.h"

uint64_t _al_tsc_measure_overhead(void)
{
    /* The median of many back-to-back pairs: the minimum would under-correct calls that
     * pay for a pipeline drain around the counter, a mean would let one interrupt skew it. */
    enum { N = 255 };
    uint64_t d[N];
    for (int i = 0; i < N; i++) {
        uint64_t a = _al_tsc();
        uint64_t b = _al_tsc();
        d[i] = b - a;
    }
    for (int i = 1; i < N; i++) {
        uint64_t v = d[i];
        int j = i - 1;
        while (j >= 0 && d[j] > v) {
            d[j + 1] = d[j];
            j--;
        }
        d[j + 1] = v;
    }
    return d[N / 2];
}

static struct al_clock_pair start;

void _al_tsc_start_init(void)
{
    if (start.ns == 0)
        start = _al_tsc_pair_now();
}

struct al_clock_pair _al_tsc_start(void)
{
    return start;
}

struct al_clock_pair _al_tsc_pair_now(void)
{
    /* Bracket the clock read with two counter reads and keep the tightest of a few tries, so
     * the pair refers to one instant to within a few dozen cycles. */
    struct al_clock_pair best = { 0, 0 };
    uint64_t best_width = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        struct timespec ts;
        uint64_t a = _al_tsc();
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t b = _al_tsc();
        if (b - a < best_width) {
            best_width = b - a;
            best.tsc = a + (b - a) / 2;
            best.ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        }
    }
    return best;
}

double _al_tsc_rate(struct al_clock_pair a, struct al_clock_pair b)
{
    if (b.ns <= a.ns || b.tsc <= a.tsc || b.ns - a.ns < 100000)
        return 0.0;
    return (double)(b.tsc - a.tsc) / (double)(b.ns - a.ns);
}
