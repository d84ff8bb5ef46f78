/* Log-linear latency histograms: bucket bounds and quantiles. The bucket function itself is
 * inline in profiler.h because every timed call uses it. */
#include "profiler.h"

uint64_t _al_hist_bucket_low(unsigned b)
{
    if (b < AL_HIST_SUB)
        return b;
    unsigned e = (b - AL_HIST_SUB) / AL_HIST_SUB + AL_HIST_SUB_BITS;
    unsigned m = (b - AL_HIST_SUB) % AL_HIST_SUB;
    return (1ull << e) + ((uint64_t)m << (e - AL_HIST_SUB_BITS));
}

uint64_t _al_hist_bucket_high(unsigned b)
{
    if (b < AL_HIST_SUB)
        return b;
    if (b >= AL_HIST_BUCKETS - 1)
        return UINT64_MAX;
    return _al_hist_bucket_low(b + 1) - 1;
}

uint64_t _al_hist_rank(uint64_t n, double q)
{
    if (n == 0)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)n);
    if ((double)rank < q * (double)n)
        rank++;
    if (rank < 1)
        rank = 1;
    return rank > n ? n : rank;
}

uint64_t _al_hist_quantile(const uint64_t *buckets, uint64_t n, double q)
{
    uint64_t rank = _al_hist_rank(n, q);
    if (rank == 0)
        return 0;
    uint64_t seen = 0;
    for (unsigned b = 0; b < AL_HIST_BUCKETS; b++) {
        seen += buckets[b];
        if (seen >= rank) {
            uint64_t lo = _al_hist_bucket_low(b);
            if (b >= AL_HIST_BUCKETS - 1)
                return lo;
            return lo + (_al_hist_bucket_high(b) - lo) / 2;
        }
    }
    return _al_hist_bucket_low(AL_HIST_BUCKETS - 1);
}
