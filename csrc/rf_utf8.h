/* Whether a str's code points encode as UTF-8 -- none of them a lone
 * surrogate (0xD800-0xDFFF) -- for the record constructor's checks
 * (csrc/_encode.pyx, _utf8_str). Pure C, no Python.
 *
 * The scan ORs a run of code points before it looks (a loop the compiler
 * vectorises, each lane as wide as a code point); with AVX2 (chosen once at
 * the first call) it takes twice the code points a step.
 */
#ifndef RF_UTF8_H
#define RF_UTF8_H

#include <stddef.h>
#include <stdint.h>

#define RF_UTF8_BLOCK 512       /* code points ORed before a look */

/* the scan of n code points of type T, a surrogate being (cp & MASK) == 0xD800 */
#define RF_UTF8_SCAN_KIND(T, MASK)                                              \
    {                                                                           \
        const T *p = (const T *)data;                                           \
        for (i = 0; i < n; i += RF_UTF8_BLOCK) {                                \
            T bad = 0;                                                          \
            end = n - i < RF_UTF8_BLOCK ? n : i + RF_UTF8_BLOCK;                \
            for (j = i; j < end; j++)                                           \
                bad |= (T)((p[j] & (MASK)) == 0xD800u);                         \
            if (bad)                                                            \
                return 0;                                                       \
        }                                                                       \
    }

#define RF_UTF8_SCAN_BODY                                                       \
    size_t i, j, end;                                                           \
    if (kind == 2)                                                              \
        RF_UTF8_SCAN_KIND(uint16_t, 0xF800u)                                    \
    else                                                                        \
        RF_UTF8_SCAN_KIND(uint32_t, 0xFFFFF800u)                                \
    return 1;

typedef int (*rf_ucs_scan_f)(int kind, const void *data, size_t n);

/* 1 if none of the n code points (kind 2 or 4 bytes each) is a surrogate */
static int rf_ucs_scan_plain(int kind, const void *data, size_t n)
{
    RF_UTF8_SCAN_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"), noinline))
static int rf_ucs_scan_avx2(int kind, const void *data, size_t n)
{
    RF_UTF8_SCAN_BODY
}
#endif
#undef RF_UTF8_SCAN_BODY
#undef RF_UTF8_SCAN_KIND

static rf_ucs_scan_f rf_ucs_scan_fn = NULL;

static rf_ucs_scan_f rf_ucs_scan_pick(void)
{
    rf_ucs_scan_f f = rf_ucs_scan_plain;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        f = rf_ucs_scan_avx2;
#endif
    rf_ucs_scan_fn = f;     /* (a race only stores the same pointer twice) */
    return f;
}

static inline int rf_ucs_no_surrogate(int kind, const void *data, size_t n)
{
    rf_ucs_scan_f f = rf_ucs_scan_fn;
    if (f == NULL)
        f = rf_ucs_scan_pick();
    return f(kind, data, n);
}

#endif
