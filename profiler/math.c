/* The two functions of libm the sampler needs: the natural log (its exponential draws) and
 * 1 - e^-y (a sample's probability, to unbias it).
 *
 * Here rather than from libm because libm would be loaded into every program under alloclens
 * for them: mapping and relocating it, and its first page touches, cost each process some 40 us
 * and a dozen page faults on these VMs (/bin/true: 0.8 ms of CPU in all), far more than these
 * dozen lines. Both are series on a reduced argument, accurate to a few units in the last
 * place (the unit test compares them with libm's). */
#include <string.h>

#include "profiler.h"

#define LN2_HI 0x1.62e42fefa3800p-1 /* ln 2 in two parts: e * LN2_HI is exact for |e| < 2^11 */
#define LN2_LO 0x1.ef35793c76730p-45

double _al_math_log(double x)
{
    /* x = m * 2^e with m in [sqrt(1/2), sqrt(2)); then ln m = 2 atanh(s), s = (m-1)/(m+1),
     * |s| <= 0.172, whose odd series has converged to double precision by s^23. */
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    int e = (int)((b >> 52) & 0x7ff) - 1023;
    b = (b & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
    double m;
    memcpy(&m, &b, sizeof m);
    if (m > 0x1.6a09e667f3bcdp+0) {
        m *= 0.5;
        e++;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 1.0 / 23;
    for (int k = 21; k >= 3; k -= 2)
        p = p * s2 + 1.0 / k;
    return e * LN2_HI + (e * LN2_LO + 2.0 * s + 2.0 * s * s2 * p);
}

double _al_math_one_minus_exp_neg(double y)
{
    if (y < 0.5) {
        /* 1 - e^-y = y - y^2/2! + y^3/3! - ...: no cancellation for small y; y^18/18! is
         * below 2^-53 of the sum. */
        double p = 0.0;
        for (int k = 18; k >= 1; k--)
            p = (1.0 - p) * (y / k);
        return p;
    }
    if (y > 40.0) /* e^-40 is below half a unit in the last place of 1: lost beside it */
        return 1.0;
    /* e^-y = 2^-k e^-r with y = k ln 2 + r, 0 <= r < ln 2 (k <= 57); e^-r by its series. */
    int k = (int)(y / (LN2_HI + LN2_LO));
    double r = (y - k * LN2_HI) - k * LN2_LO;
    double q = 1.0;
    for (int j = 17; j >= 1; j--)
        q = 1.0 - q * (r / j);
    uint64_t b = (uint64_t)(1023 - k) << 52;
    double scale;
    memcpy(&scale, &b, sizeof scale);
    return 1.0 - q * scale;
}
