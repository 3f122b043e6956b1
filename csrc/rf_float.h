/* repr() of a float, fast, for the append path's times (csrc/_encode.pyx).
 *
 * repr() writes the shortest decimal that reads back as the same double
 * (and of those the nearest), through David Gay's dtoa: bignum arithmetic,
 * about 0.36 us a time of the epoch. For a double v = M * 2^e with e < 0
 * the exact value is N / 10^q with q = -e and N = M * 5^q, and the doubles
 * next to it are 5^q away in those units: a decimal with at most q places,
 * c / 10^q, reads back as v when |c - N| < 5^q / 2 (strictly: 5^q is odd,
 * so no such c lies on the boundary; an M of 2^52, whose lower neighbour is
 * nearer, is left to dtoa). The shortest such c is a multiple of the largest
 * 10^j that has one within reach; of two at that j the nearer; an exact tie
 * is left to dtoa. Pure C, no Python.
 */
#ifndef RF_FLOAT_H
#define RF_FLOAT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Write repr(v) at out (room for 40 bytes, no terminator) for
 * 1e-4 <= |v| < 1e16 (where repr uses fixed notation); returns its length,
 * or -1 where this path does not decide it (the caller asks dtoa). */
static inline int rf_float_repr(double v, char *out)
{
    static const uint64_t P10[20] = {
        1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
        100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL,
        10000000000000ULL, 100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL,
        100000000000000000ULL, 1000000000000000000ULL, 10000000000000000000ULL};
    int neg = v < 0, exp, q, j, k, n, nd, point, len = 0;
    double a = neg ? -v : v, m;
    uint64_t M, f, lo, hi, r, rj[20], best;
    unsigned __int128 N;
    unsigned char d[40];        /* digits of N, least significant first */
    if (!(a >= 1e-4 && a < 1e16))
        return -1;
    m = frexp(a, &exp);         /* a = m * 2^exp, 0.5 <= m < 1 */
    M = (uint64_t)ldexp(m, 53);
    q = 53 - exp;               /* a = M / 2^q */
    if (q <= 0 || q > 27 || M == (1ULL << 52))
        return -1;              /* (|v| from 2^25 to 2^53: the epoch's times) */
    f = 1;
    for (k = 0; k < q; k++)
        f *= 5;                 /* 5^q < 2^63 for q <= 27 */
    N = (unsigned __int128)M * f;
    hi = (uint64_t)(N / P10[19]);
    lo = (uint64_t)(N - (unsigned __int128)hi * P10[19]);     /* (one division, not two) */
    /* the remainder of N by 10^j for j <= 19, from lo's digits */
    r = lo;
    rj[0] = 0;
    for (k = 0; k < 19; k++) {
        d[k] = (unsigned char)(r % 10);
        r /= 10;
        rj[k + 1] = rj[k] + d[k] * P10[k];
    }
    nd = 19;
    r = hi;
    while (r) {
        d[nd++] = (unsigned char)(r % 10);
        r /= 10;
    }
    while (nd > 1 && d[nd - 1] == 0)
        nd--;                   /* (lo's leading zeros when hi is 0) */
    /* a multiple of 10^j within reach for some j > 19 needs lo within 5^q/2
     * of 0 or of 10^19: not decided here (never for the times the bench
     * and real clocks give) */
    if (2 * (unsigned __int128)lo < f || 2 * (unsigned __int128)(P10[19] - lo) < f)
        return -1;
    best = 0;
    for (j = 19; j >= 0; j--) {
        uint64_t down = rj[j], up = P10[j] - rj[j];
        int in_down = 2 * (unsigned __int128)down < f;
        int in_up = j > 0 && 2 * (unsigned __int128)up < f;
        if (!in_down && !in_up)
            continue;
        if (in_down && in_up) {
            if (down == up)
                return -1;      /* a tie: dtoa decides */
            in_up = up < down;
        }
        best = in_up ? 1 : 0;
        break;
    }
    if (j < 0 || j > 19)
        return -1;              /* (cannot happen: c = N itself is within reach) */
    /* the digits of c = N - rj[j] (+ 10^j if up): N's from place j on, plus one if up */
    for (k = 0; k < j && k < 19; k++)
        d[k] = 0;
    if (best) {
        k = j;
        while (k < nd && d[k] == 9)
            d[k++] = 0;
        if (k == nd)
            d[nd++] = 1;
        else
            d[k]++;
    }
    /* fixed notation: integer part (at least "0"), point, the places down to the
     * last non-zero digit (at least one) */
    point = q;                  /* digits below this place are the fraction */
    if (neg)
        out[len++] = '-';
    if (nd <= point)
        out[len++] = '0';
    else
        for (k = nd - 1; k >= point; k--)
            out[len++] = (char)('0' + d[k]);
    out[len++] = '.';
    n = j > point ? point : j;  /* the lowest place that may be non-zero */
    while (n < point && d[n] == 0)
        n++;
    if (n >= point) {
        out[len++] = '0';
        return len;
    }
    for (k = point - 1; k >= n; k--)
        out[len++] = (char)('0' + (k < nd ? d[k] : 0));
    return len;
}

#endif
