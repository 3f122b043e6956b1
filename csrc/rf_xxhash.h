/* xxHash, header-only: every function inlined into the including module.
 *
 * On x86-64 built without -mavx2 (a portable build), XXH3_64bits of inputs
 * over 240 bytes (every message line's checksum: reads check the line of
 * every record they return, cached or not) picks its long-input kernel at
 * the first call: the AVX-512 one where the CPU has it, else the AVX2 one
 * (each compiled for its target alone, as xxHash's own xxh_x86dispatch.c
 * does), else the SSE2 one of the build. Same hash, bit for bit
 * (tests/test_core_log.py): ~37 -> ~25 ns an 830-byte line with AVX2; AVX-512
 * took another ~28% off an 830-byte line and ~44% off a 1,500-byte one on the
 * bench machine (AMD EPYC, 2026-12-05: 71 -> 51 and 110 -> 62 ns in a loop
 * under load). RF_NO_XXH_DISPATCH turns it off. */
#ifndef RF_XXHASH_H
#define RF_XXHASH_H
#define XXH_INLINE_ALL
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(__AVX2__) \
    && !defined(RF_NO_XXH_DISPATCH)
#  define RF_XXH_DISPATCH 1
#  define XXH_X86DISPATCH 1        /* secrets and accumulators aligned for every kernel */
#  define XXH_DISPATCH_AVX2 1
#  define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#  define XXH_DISPATCH_AVX512 1
#  define XXH_TARGET_AVX512 __attribute__((__target__("avx512f")))
#  include <immintrin.h>
#endif
#include "xxhash.h"

#ifdef RF_XXH_DISPATCH
XXH_NO_INLINE XXH_TARGET_AVX2 XXH64_hash_t
rf_xxh3_long_avx2(const void *XXH_RESTRICT input, size_t len, XXH64_hash_t seed64,
                  const xxh_u8 *XXH_RESTRICT secret, size_t secret_len)
{
    (void)seed64; (void)secret; (void)secret_len;
    return XXH3_hashLong_64b_internal(input, len, XXH3_kSecret, sizeof(XXH3_kSecret),
                                      XXH3_accumulate_avx2, XXH3_scrambleAcc_avx2);
}

XXH_NO_INLINE XXH_TARGET_AVX512 XXH64_hash_t
rf_xxh3_long_avx512(const void *XXH_RESTRICT input, size_t len, XXH64_hash_t seed64,
                    const xxh_u8 *XXH_RESTRICT secret, size_t secret_len)
{
    (void)seed64; (void)secret; (void)secret_len;
    return XXH3_hashLong_64b_internal(input, len, XXH3_kSecret, sizeof(XXH3_kSecret),
                                      XXH3_accumulate_avx512, XXH3_scrambleAcc_avx512);
}

/* the long-input kernel, chosen at the first call (a race only stores the
 * same pointer twice) */
static XXH3_hashLong64_f rf_xxh3_long = NULL;

static XXH3_hashLong64_f rf_xxh3_pick(void)
{
    XXH3_hashLong64_f f = XXH3_hashLong_64b_default;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        f = rf_xxh3_long_avx512;
    else if (__builtin_cpu_supports("avx2"))
        f = rf_xxh3_long_avx2;
    rf_xxh3_long = f;
    return f;
}

static inline XXH64_hash_t rf_xxh3_64bits(const void *data, size_t len)
{
    XXH3_hashLong64_f f = rf_xxh3_long;
    if (f == NULL)
        f = rf_xxh3_pick();
    return XXH3_64bits_internal(data, len, 0, XXH3_kSecret, sizeof(XXH3_kSecret), f);
}

#  undef XXH3_64bits
#  define XXH3_64bits rf_xxh3_64bits
#endif
#endif
