/* JSON string escaping for the compiled encoder (csrc/_encode.pyx): the bytes
 * between the quotes of a JSON string, spelled as orjson and the standard
 * library spell them (ensure_ascii off): '"' and '\\' and the control bytes
 * below 0x20 are escaped (\b \t \n \f \r, else \u00XX in lower-case hex);
 * every other byte, UTF-8 included, stands as it is. Pure C, no Python.
 */
#ifndef RF_JSON_H
#define RF_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The length of the run at the start of s[0:n) that holds no '"', no '\\'
 * and no control byte below 0x20 (the bytes a JSON string body takes as they are). */
static inline size_t rf_json_plain_run(const unsigned char *s, size_t n)
{
    size_t i = 0;
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    const __m128i ctl = _mm_set1_epi8(0x1F);
    while (i + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i bad = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                                   _mm_cmpeq_epi8(_mm_max_epu8(v, ctl), ctl));
        int mask = _mm_movemask_epi8(bad);
        if (mask)
            return i + (size_t)__builtin_ctz((unsigned)mask);
        i += 16;
    }
#endif
    while (i < n && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\')
        i++;
    return i;
}

/* Escape s[0:n) into out, which has room for 6 * n bytes; returns the bytes written. */
static inline size_t rf_json_escape(const unsigned char *s, size_t n, unsigned char *out)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char *o = out;
    size_t i = 0, run;
    while (i < n) {
        run = rf_json_plain_run(s + i, n - i);
        memcpy(o, s + i, run);
        o += run;
        i += run;
        if (i == n)
            break;
        unsigned char c = s[i++];
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\b': *o++ = 'b'; break;
        case '\t': *o++ = 't'; break;
        case '\n': *o++ = 'n'; break;
        case '\f': *o++ = 'f'; break;
        case '\r': *o++ = 'r'; break;
        default:
            *o++ = 'u'; *o++ = '0'; *o++ = '0';
            *o++ = (unsigned char)hex[c >> 4];
            *o++ = (unsigned char)hex[c & 15];
        }
    }
    return (size_t)(o - out);
}


/* Escape the UTF-8 form of a str's n code points into out, straight from
 * CPython's compact representation (kind 1, 2 or 4: bytes, uint16 or
 * uint32 a code point), without the UTF-8 bytes object in between: the
 * escapes of rf_json_escape, every other code point as its UTF-8 bytes.
 * out has room for 6 * n bytes. Returns the bytes written, or (size_t)-1
 * at a lone surrogate (no UTF-8 form: the caller takes the Python path).
 * In a str of one byte a code point (Latin-1: most of a chat line in a
 * Latin script is ASCII), plain ASCII goes 16 code points at a time
 * (SSE2: looked at once, stored at once); a block that holds anything
 * else is written a code point at a time from there (RF_ESC_ONE). */
#define RF_ESC_ONE(c)                                                         \
    do {                                                                      \
        if (c < 0x80) {                                                       \
            if (c >= 0x20 && c != '"' && c != '\\') {                         \
                *o++ = (unsigned char)c;                                      \
                break;                                                        \
            }                                                                 \
            *o++ = '\\';                                                      \
            switch (c) {                                                      \
            case '"': *o++ = '"'; break;                                      \
            case '\\': *o++ = '\\'; break;                                    \
            case '\b': *o++ = 'b'; break;                                     \
            case '\t': *o++ = 't'; break;                                     \
            case '\n': *o++ = 'n'; break;                                     \
            case '\f': *o++ = 'f'; break;                                     \
            case '\r': *o++ = 'r'; break;                                     \
            default:                                                          \
                *o++ = 'u'; *o++ = '0'; *o++ = '0';                           \
                *o++ = (unsigned char)hex[c >> 4];                            \
                *o++ = (unsigned char)hex[c & 15];                            \
            }                                                                 \
        } else if (c < 0x800) {                                               \
            *o++ = (unsigned char)(0xC0 | (c >> 6));                          \
            *o++ = (unsigned char)(0x80 | (c & 0x3F));                        \
        } else if (c < 0x10000) {                                             \
            if ((c & 0xF800) == 0xD800)                                       \
                return (size_t)-1;                                            \
            *o++ = (unsigned char)(0xE0 | (c >> 12));                         \
            *o++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));                 \
            *o++ = (unsigned char)(0x80 | (c & 0x3F));                        \
        } else {                                                              \
            *o++ = (unsigned char)(0xF0 | (c >> 18));                         \
            *o++ = (unsigned char)(0x80 | ((c >> 12) & 0x3F));                \
            *o++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));                 \
            *o++ = (unsigned char)(0x80 | (c & 0x3F));                        \
        }                                                                     \
    } while (0)

#if defined(__SSE2__)
/* The lanes of 16 bytes that a JSON string body does not take as they are:
 * '"', '\\', a control byte, or a byte with its high bit set (a code point
 * past ASCII). */
static inline int rf_json_odd_lanes(__m128i v)
{
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    const __m128i ctl = _mm_set1_epi8(0x1F);
    __m128i bad = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                               _mm_cmpeq_epi8(_mm_max_epu8(v, ctl), ctl));
    return _mm_movemask_epi8(bad) | _mm_movemask_epi8(v);
}
#endif

static inline size_t rf_json_escape_ucs(int kind, const void *data, size_t n, unsigned char *out)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char *o = out;
    size_t i = 0;
    uint32_t c;
    if (kind == 1) {
        const uint8_t *s = (const uint8_t *)data;
#if defined(__SSE2__)
        while (i + 16 <= n) {
            __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
            int mask = rf_json_odd_lanes(v);
            if (!mask) {
                _mm_storeu_si128((__m128i *)o, v);
                o += 16; i += 16;
                continue;
            }
            int k = __builtin_ctz((unsigned)mask);
            size_t end = i + 16;
            memcpy(o, s + i, (size_t)k);
            o += k; i += k;
            for (; i < end; i++) { c = s[i]; RF_ESC_ONE(c); }
        }
#endif
        for (; i < n; i++) { c = s[i]; RF_ESC_ONE(c); }
    } else if (kind == 2) {
        /* (a str of two or four bytes a code point holds a script past
         * Latin-1: its runs of ASCII are short, and a block test per 8 or 4
         * code points measured slower than this loop) */
        const uint16_t *s = (const uint16_t *)data;
        for (; i < n; i++) { c = s[i]; RF_ESC_ONE(c); }
    } else {
        const uint32_t *s = (const uint32_t *)data;
        for (; i < n; i++) { c = s[i]; RF_ESC_ONE(c); }
    }
    return (size_t)(o - out);
}
#undef RF_ESC_ONE

#endif
