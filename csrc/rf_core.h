/* Byte-level kernels of the rune_fast core: the frame check, the message line
 * parser and the substring search. Pure C, no Python, safe to call without
 * the GIL. The on-disk format they read is described in docs/FORMAT.md.
 */
#ifndef RF_CORE_H
#define RF_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include "rf_xxhash.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define RF_PREFIX_LEN 23                        /* {"x":"<16 hex>" */
#define RF_MAX_LINE ((size_t)16 * 1024 * 1024)  /* prefix + rest + newline */

/* Verdicts of rf_check_frame / rf_parse_msg. */
enum {
    RF_OK = 0,
    RF_BAD_PREFIX = 1,
    RF_BAD_HEX = 2,
    RF_BAD_CHECKSUM = 3,
    RF_BAD_REST = 4,
    RF_TOO_LONG = 5,
    RF_NOT_MESSAGE = 6,
    RF_BAD_FIELDS = 7,
    RF_SEQ_ORDER = 8
};

static inline const char *rf_reason(int code)
{
    switch (code) {
    case RF_OK: return "";
    case RF_BAD_PREFIX: return "bad prefix";
    case RF_BAD_HEX: return "bad checksum hex";
    case RF_BAD_CHECKSUM: return "checksum mismatch";
    case RF_BAD_REST: return "bad rest";
    case RF_TOO_LONG: return "line too long";
    case RF_NOT_MESSAGE: return "not a message line";
    case RF_BAD_FIELDS: return "message fields do not parse";
    case RF_SEQ_ORDER: return "append sequence not above the line before (a line moved or repeated)";
    default: return "unknown damage";
    }
}

/* The append sequence "s" of a message line p[0:len) (its newline may be
 * included): the line ends `},"s":<digits>}`; -1 if it has none (lines
 * written before the sequence existed end `}}`). */
static inline int64_t rf_line_seq(const unsigned char *p, size_t len)
{
    size_t e = len, i, nd = 0;
    int64_t v = 0, mul = 1;
    if (e && p[e - 1] == '\n') e--;
    if (e < 8 || p[e - 1] != '}') return -1;
    i = e - 1;
    while (i > 0 && p[i - 1] >= '0' && p[i - 1] <= '9' && nd < 18) {
        v += (int64_t)(p[i - 1] - '0') * mul;
        mul *= 10;
        i--;
        nd++;
    }
    if (nd == 0 || i < 6 || memcmp(p + i - 6, "},\"s\":", 6) != 0) return -1;
    return v;
}

/* ---- hex --------------------------------------------------------------- */

static const signed char rf_hexval[256] = {
    ['0'] = 1, ['1'] = 2, ['2'] = 3, ['3'] = 4, ['4'] = 5, ['5'] = 6, ['6'] = 7,
    ['7'] = 8, ['8'] = 9, ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13,
    ['d'] = 14, ['e'] = 15, ['f'] = 16,
};

/* 16 lowercase hex digits -> value; -1 if any digit is not [0-9a-f]. */
static inline int rf_parse_hex16(const unsigned char *p, uint64_t *out)
{
    uint64_t v = 0;
    int bad = 0;
    for (int i = 0; i < 16; i++) {
        int d = rf_hexval[p[i]];
        bad |= (d == 0);
        v = (v << 4) | (uint64_t)((d - 1) & 15);
    }
    *out = v;
    return bad ? -1 : 0;
}

static inline void rf_write_hex16(uint64_t v, unsigned char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--) {
        out[i] = (unsigned char)digits[v & 15];
        v >>= 4;
    }
}

/* Write the 23-byte prefix for `rest` at out. */
static inline void rf_write_prefix(const unsigned char *rest, size_t n, unsigned char *out)
{
    memcpy(out, "{\"x\":\"", 6);
    rf_write_hex16(XXH3_64bits(rest, n), out + 6);
    out[22] = '"';
}

/* ---- frame ------------------------------------------------------------- */

/* Check the complete line p[0:len) (len excludes the newline). */
static inline int rf_check_frame(const unsigned char *p, size_t len)
{
    uint64_t want;
    if (len + 1 > RF_MAX_LINE) return RF_TOO_LONG;
    if (len < RF_PREFIX_LEN || memcmp(p, "{\"x\":\"", 6) != 0 || p[22] != '"')
        return RF_BAD_PREFIX;
    if (rf_parse_hex16(p + 6, &want) != 0) return RF_BAD_HEX;
    if (len < RF_PREFIX_LEN + 3 || p[23] != ',' || p[24] != '"' || p[len - 1] != '}')
        return RF_BAD_REST;
    if (XXH3_64bits(p + RF_PREFIX_LEN, len - RF_PREFIX_LEN) != want) return RF_BAD_CHECKSUM;
    return RF_OK;
}

/* Are all n bytes at p zero? */
static inline int rf_all_zero(const unsigned char *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w) return 0;
    }
    for (; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* ---- JSON strings ------------------------------------------------------ */

/* The closing quote of the JSON string whose bytes start at s (just past the
 * opening quote), or NULL if there is none before e. */
static inline const unsigned char *rf_str_end(const unsigned char *s, const unsigned char *e)
{
    const unsigned char *p = s;
    while (p < e) {
        const unsigned char *q = (const unsigned char *)memchr(p, '"', (size_t)(e - p));
        const unsigned char *b;
        if (q == NULL) return NULL;
        b = q;
        while (b > s && b[-1] == '\\') b--;
        if (((q - b) & 1) == 0) return q;
        p = q + 1;
    }
    return NULL;
}

/* Short string scan (ids, channel, task, hlc): 16 bytes at a time for the
 * first quote or backslash, without memchr's call overhead. */
static inline const unsigned char *rf_short_str_end(const unsigned char *s, const unsigned char *e)
{
    const unsigned char *p = s;
#if defined(__SSE2__)
    const __m128i Q = _mm_set1_epi8('"'), B = _mm_set1_epi8('\\');
    while (p + 16 <= e) {
        __m128i a = _mm_loadu_si128((const __m128i *)p);
        unsigned mask = (unsigned)_mm_movemask_epi8(
            _mm_or_si128(_mm_cmpeq_epi8(a, Q), _mm_cmpeq_epi8(a, B)));
        if (mask == 0) {
            p += 16;
            continue;
        }
        p += __builtin_ctz(mask);
        if (*p == '"') return p;
        p += 2;                      /* a backslash escapes the next byte */
    }
#endif
    while (p < e) {
        unsigned char c = *p;
        if (c == '"') return p;
        if (c == '\\') p += 2;
        else p++;
    }
    return NULL;
}

/* ---- message lines ----------------------------------------------------- */

#define RF_M_HEAD ",\"k\":\"m\",\"r\":{\"msg_id\":\""
#define RF_HEAD_LEN 24
#define RF_ID_OFF (RF_PREFIX_LEN + RF_HEAD_LEN)     /* 47: first byte of the id */

typedef struct {
    int kind;              /* 'm' (message) or 'd' (deletion tombstone) */
    uint32_t id_off, id_len;
    uint32_t ch_off, ch_len;
    uint32_t task_off, task_len;
    uint32_t hlc_off, hlc_len;
    uint32_t content_off;  /* first byte of the content string */
    uint32_t content_len;  /* only set by rf_parse_msg with full=1 */
} rf_msg;

static inline int rf_expect(const unsigned char **pp, const unsigned char *e, const char *lit, size_t n)
{
    if ((size_t)(e - *pp) < n || memcmp(*pp, lit, n) != 0) return -1;
    *pp += n;
    return 0;
}

/* Parse the leading fields of the message line p[0:len) (a line whose frame
 * was checked). full=1 also finds the end of the content and checks what
 * follows it; full=0 stops at the start of the content. */
static inline int rf_parse_msg(const unsigned char *p, size_t len, rf_msg *m, int full)
{
    const unsigned char *e = p + len;
    const unsigned char *q = p + RF_PREFIX_LEN, *s;
    if (len < RF_ID_OFF) return RF_NOT_MESSAGE;
    if (memcmp(q, ",\"k\":\"", 6) != 0 || (q[6] != 'm' && q[6] != 'd')
        || memcmp(q + 7, "\",\"r\":{\"msg_id\":\"", 17) != 0)
        return RF_NOT_MESSAGE;
    m->kind = q[6];
    s = p + RF_ID_OFF;
    if ((q = rf_short_str_end(s, e)) == NULL) return RF_BAD_FIELDS;
    m->id_off = (uint32_t)(s - p); m->id_len = (uint32_t)(q - s);
    if (rf_expect(&q, e, "\",\"channel_id\":\"", 16)) return RF_BAD_FIELDS;
    s = q;
    if ((q = rf_short_str_end(s, e)) == NULL) return RF_BAD_FIELDS;
    m->ch_off = (uint32_t)(s - p); m->ch_len = (uint32_t)(q - s);
    if (rf_expect(&q, e, "\",\"task_id\":\"", 13)) return RF_BAD_FIELDS;
    s = q;
    if ((q = rf_short_str_end(s, e)) == NULL) return RF_BAD_FIELDS;
    m->task_off = (uint32_t)(s - p); m->task_len = (uint32_t)(q - s);
    if (rf_expect(&q, e, "\",\"hlc\":\"", 9)) return RF_BAD_FIELDS;
    s = q;
    if ((q = rf_short_str_end(s, e)) == NULL) return RF_BAD_FIELDS;
    m->hlc_off = (uint32_t)(s - p); m->hlc_len = (uint32_t)(q - s);
    if (rf_expect(&q, e, "\",\"content\":\"", 13)) return RF_BAD_FIELDS;
    m->content_off = (uint32_t)(q - p);
    m->content_len = 0;
    if (full) {
        s = q;
        if ((q = rf_str_end(s, e)) == NULL) return RF_BAD_FIELDS;
        m->content_len = (uint32_t)(q - s);
        if (q + 1 >= e || (q[1] != ',' && q[1] != '}')) return RF_BAD_FIELDS;
    }
    return RF_OK;
}

/* Hint the cache (never faults, so a stale address is harmless). */
static inline void rf_prefetch(const void *p)
{
    __builtin_prefetch(p, 0, 1);
}

/* Compare the order keys (hlc, msg_id) of two parsed lines. */
static inline int rf_cmp_bytes(const unsigned char *a, size_t na, const unsigned char *b, size_t nb)
{
    size_t n = na < nb ? na : nb;
    int c = n ? memcmp(a, b, n) : 0;
    if (c) return c;
    return (na > nb) - (na < nb);
}

/* ---- order of JSON string bodies ---------------------------------------- */

/* A reader of the bytes a JSON string body (between its quotes) stands for,
 * as UTF-8: escapes decoded (\u and four hex digits, surrogate pairs joined), other bytes as
 * they are. A malformed escape is read as its bytes. */
typedef struct {
    const unsigned char *p, *end;
    unsigned char pend[4];
    int npend, ipend;
} rf_jdec;

static inline int rf_hex4(const unsigned char *p, const unsigned char *end, uint32_t *out)
{
    uint32_t v = 0;
    if (end - p < 4) return 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

static inline int rf_jdec_next(rf_jdec *d)
{
    uint32_t cp, lo;
    unsigned char c, e;
    if (d->ipend < d->npend) return d->pend[d->ipend++];
    if (d->p >= d->end) return -1;
    c = *d->p++;
    if (c != '\\' || d->p >= d->end) return c;
    e = *d->p;
    switch (e) {
    case 'b': d->p++; return 0x08;
    case 'f': d->p++; return 0x0c;
    case 'n': d->p++; return 0x0a;
    case 'r': d->p++; return 0x0d;
    case 't': d->p++; return 0x09;
    case 'u':
        if (!rf_hex4(d->p + 1, d->end, &cp)) return c;
        d->p += 5;
        if (cp >= 0xD800 && cp <= 0xDBFF && d->end - d->p >= 6 && d->p[0] == '\\' && d->p[1] == 'u'
                && rf_hex4(d->p + 2, d->end, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            d->p += 6;
        }
        d->ipend = 1;
        if (cp < 0x80) { d->npend = 0; d->ipend = 0; return (int)cp; }
        if (cp < 0x800) {
            d->pend[0] = (unsigned char)(0xC0 | (cp >> 6));
            d->pend[1] = (unsigned char)(0x80 | (cp & 0x3F));
            d->npend = 2;
        } else if (cp < 0x10000) {
            d->pend[0] = (unsigned char)(0xE0 | (cp >> 12));
            d->pend[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            d->pend[2] = (unsigned char)(0x80 | (cp & 0x3F));
            d->npend = 3;
        } else {
            d->pend[0] = (unsigned char)(0xF0 | (cp >> 18));
            d->pend[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
            d->pend[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            d->pend[3] = (unsigned char)(0x80 | (cp & 0x3F));
            d->npend = 4;
        }
        return d->pend[0];
    default:            /* \" \\ \/ */
        d->p++;
        return e;
    }
}

/* Order of two JSON string bodies by the strings they spell: UTF-8 byte
 * order, which is code point order, i.e. Python's str order. Bodies without
 * a backslash are their own UTF-8. */
static inline int rf_cmp_json(const unsigned char *a, size_t na, const unsigned char *b, size_t nb)
{
    rf_jdec x, y;
    int ca, cb;
    if (!memchr(a, '\\', na) && !memchr(b, '\\', nb))
        return rf_cmp_bytes(a, na, b, nb);
    x.p = a; x.end = a + na; x.npend = x.ipend = 0;
    y.p = b; y.end = b + nb; y.npend = y.ipend = 0;
    for (;;) {
        ca = rf_jdec_next(&x);
        cb = rf_jdec_next(&y);
        if (ca != cb) return ca < cb ? -1 : 1;
        if (ca < 0) return 0;
    }
}

/* ---- substring search -------------------------------------------------- */

static inline unsigned char rf_lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c | 0x20) : c;
}

/* Bit of a trigram in a filter of 2**lg bits: ASCII letters lowercased, so
 * one filter serves exact and ASCII-case-blind searches (the search tiers'
 * block filters: rune_fast._search.block_grams, HotIndex.search). */
static inline uint32_t rf_gram(unsigned char a, unsigned char b, unsigned char c, int lg)
{
    uint32_t x = ((uint32_t)rf_lower(a) << 16) | ((uint32_t)rf_lower(b) << 8) | rf_lower(c);
    return (x * 2654435761u) >> (32 - lg);
}

/* A filter w of 2**lg bits (lg in [6, 24]) being built: the bit of each
 * trigram of every span added. Filters of up to 8192 bits go through a byte
 * map (one store a trigram instead of a read-modify-write of a shared word;
 * about 1.6x faster), packed into w by rf_gram_acc_done; larger ones are set
 * bit by bit. init, add any number of spans, done. */
#define RF_GRAM_ACC_BITS 8192
typedef struct {
    unsigned char m[RF_GRAM_ACC_BITS];   /* 0xFF: the trigram's bit is set */
    uint64_t *w;
    int lg;
} rf_gram_acc;

static inline int rf_gram_acc_mapped(const rf_gram_acc *a)
{
    return ((size_t)1 << a->lg) <= RF_GRAM_ACC_BITS;
}

static inline void rf_gram_acc_init(rf_gram_acc *a, uint64_t *w, int lg)
{
    a->w = w;
    a->lg = lg;
    if (rf_gram_acc_mapped(a))
        memset(a->m, 0, (size_t)1 << lg);
}

/* rf_gram_acc_add of a text fed in pieces: p[0:n) continues the bytes fed
 * before, whose last two (rolled, lowered) are in *x and whose count
 * (capped at 2) is in *seen; trigrams span the pieces. Pieces of one text
 * give the bits rf_gram_acc_add gives the whole. With the byte map, the
 * trigrams that lie inside the piece are taken six at a time from an
 * 8-byte word lowered at once (no chain through the rolled key: about
 * twice as fast as byte by byte). */
static inline void rf_gram_acc_roll(rf_gram_acc *a, uint32_t *x, int *seen, const unsigned char *p, size_t n)
{
    uint32_t v = *x;
    int sh = 32 - a->lg;
    size_t j = 0;
    if (!rf_gram_acc_mapped(a)) {
        for (; j < n && *seen < 2; j++, (*seen)++)
            v = (v << 8) | rf_lower(p[j]);
        for (; j < n; j++) {
            uint32_t h;
            v = (v << 8) | rf_lower(p[j]);
            h = ((v & 0xFFFFFFu) * 2654435761u) >> sh;
            a->w[h >> 6] |= (uint64_t)1 << (h & 63);
        }
        *x = v;
        return;
    }
    /* the trigrams ending at p[0] and p[1] start in the bytes fed before */
    for (; j < n && j < 2; j++) {
        v = (v << 8) | rf_lower(p[j]);
        if (*seen >= 2)
            a->m[((v & 0xFFFFFFu) * 2654435761u) >> sh] = 0xFF;
        else
            (*seen)++;
    }
    if (j < 2) {
        *x = v;
        return;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; j + 6 <= n; j += 6) {
        uint64_t w, up;
        memcpy(&w, p + j - 2, 8);
        /* ASCII 'A'..'Z' bytes (high bit clear, heptet in [0x41, 0x5A]) get 0x20 */
        up = ((w & 0x7F7F7F7F7F7F7F7Full) + 0x3F3F3F3F3F3F3F3Full)
             & ~((w & 0x7F7F7F7F7F7F7F7Full) + 0x2525252525252525ull) & ~w & 0x8080808080808080ull;
        w = __builtin_bswap64(w | (up >> 2));      /* p[j - 2] in the top byte */
        a->m[(((uint32_t)(w >> 40) & 0xFFFFFFu) * 2654435761u) >> sh] = 0xFF;
        a->m[(((uint32_t)(w >> 32) & 0xFFFFFFu) * 2654435761u) >> sh] = 0xFF;
        a->m[(((uint32_t)(w >> 24) & 0xFFFFFFu) * 2654435761u) >> sh] = 0xFF;
        a->m[(((uint32_t)(w >> 16) & 0xFFFFFFu) * 2654435761u) >> sh] = 0xFF;
        a->m[(((uint32_t)(w >> 8) & 0xFFFFFFu) * 2654435761u) >> sh] = 0xFF;
        a->m[(((uint32_t)w & 0xFFFFFFu) * 2654435761u) >> sh] = 0xFF;
    }
#endif
    v = ((uint32_t)rf_lower(p[j - 2]) << 8) | rf_lower(p[j - 1]);
    for (; j < n; j++) {
        v = (v << 8) | rf_lower(p[j]);
        a->m[((v & 0xFFFFFFu) * 2654435761u) >> sh] = 0xFF;
    }
    *x = v;
}

/* Add the bits of the trigrams of p[0:n) (none if n < 3). */
static inline void rf_gram_acc_add(rf_gram_acc *a, const unsigned char *p, size_t n)
{
    uint32_t x = 0;
    int seen = 0;
    rf_gram_acc_roll(a, &x, &seen, p, n);
}

/* OR the byte map's bits into the filter (nothing to do bit by bit). */
static inline void rf_gram_acc_done(rf_gram_acc *a)
{
    size_t nb = (size_t)1 << a->lg;
    if (!rf_gram_acc_mapped(a)) return;
    for (size_t i = 0; i < nb; i += 64) {
        uint64_t word = 0;
#if defined(__SSE2__)
        for (int k = 0; k < 4; k++) {
            __m128i v = _mm_loadu_si128((const __m128i *)(a->m + i + 16 * k));
            word |= (uint64_t)(uint32_t)_mm_movemask_epi8(v) << (16 * k);
        }
#else
        for (int k = 0; k < 64; k++)
            word |= (uint64_t)(a->m[i + k] & 1) << k;
#endif
        a->w[i >> 6] |= word;
    }
}

/* log2 of n if n is a power of two in [lo, 2**24], else -1 (the size check
 * of the filters' bit counts). */
static inline int rf_pow2_log(int64_t n, int64_t lo)
{
    int lg = 0;
    while (((int64_t)1 << lg) < n && lg < 62) lg++;
    return (n >= lo && ((int64_t)1 << lg) == n && lg <= 24) ? lg : -1;
}

/* Can bytes whose filter (rf_gram_acc) is w hold nd[0:m)? 1 also when the
 * needle is shorter than a trigram. */
static inline int rf_gram_may(const uint64_t *w, const unsigned char *nd, size_t m, int lg)
{
    uint32_t h;
    for (size_t j = 0; j + 2 < m; j++) {
        h = rf_gram(nd[j], nd[j + 1], nd[j + 2], lg);
        if (!((w[h >> 6] >> (h & 63)) & 1)) return 0;
    }
    return 1;
}

static inline unsigned char rf_upper(unsigned char c)
{
    return (c >= 'a' && c <= 'z') ? (unsigned char)(c & ~0x20) : c;
}

static inline int rf_eq_ci(const unsigned char *h, const unsigned char *lower_needle, size_t m)
{
    for (size_t i = 0; i < m; i++)
        if (rf_lower(h[i]) != lower_needle[i]) return 0;
    return 1;
}

/* First occurrence of needle nd[0:m) in h[0:n), or NULL. With ci, ASCII letters
 * match either case and nd must already be ASCII-lowercased. SSE2 filter on the
 * first and last needle byte (W. Mula's generic SIMD substring search). */
static inline const unsigned char *rf_find(const unsigned char *h, size_t n,
                                           const unsigned char *nd, size_t m, int ci)
{
    size_t i = 0;
    unsigned char f1, f2, l1, l2;
    if (m == 0) return h;
    if (m > n) return NULL;
    if (!ci && m == 1) return (const unsigned char *)memchr(h, nd[0], n);
    f1 = nd[0]; l1 = nd[m - 1];
    f2 = ci ? rf_upper(f1) : f1;
    l2 = ci ? rf_upper(l1) : l1;
#if defined(__SSE2__)
    {
        const __m128i F1 = _mm_set1_epi8((char)f1), F2 = _mm_set1_epi8((char)f2);
        const __m128i L1 = _mm_set1_epi8((char)l1), L2 = _mm_set1_epi8((char)l2);
        for (; i + m + 15 <= n; i += 16) {
            __m128i a = _mm_loadu_si128((const __m128i *)(h + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(h + i + m - 1));
            __m128i ea = _mm_or_si128(_mm_cmpeq_epi8(a, F1), _mm_cmpeq_epi8(a, F2));
            __m128i eb = _mm_or_si128(_mm_cmpeq_epi8(b, L1), _mm_cmpeq_epi8(b, L2));
            unsigned mask = (unsigned)_mm_movemask_epi8(_mm_and_si128(ea, eb));
            while (mask) {
                size_t pos = i + (size_t)__builtin_ctz(mask);
                if (m <= 2) return h + pos;
                if (ci ? rf_eq_ci(h + pos + 1, nd + 1, m - 2)
                       : memcmp(h + pos + 1, nd + 1, m - 2) == 0)
                    return h + pos;
                mask &= mask - 1;
            }
        }
    }
#endif
    for (; i + m <= n; i++) {
        unsigned char c = h[i];
        if ((c == f1 || c == f2) && (ci ? rf_eq_ci(h + i, nd, m) : memcmp(h + i, nd, m) == 0))
            return h + i;
    }
    return NULL;
}

/* Does h[0:n) hold a byte >= 0x80? */
static inline int rf_has_nonascii(const unsigned char *h, size_t n)
{
    size_t i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(h + i));
        if (_mm_movemask_epi8(a)) return 1;
    }
#endif
    for (; i < n; i++)
        if (h[i] & 0x80) return 1;
    return 0;
}

/* First byte >= 0x80 in h[0:n), or NULL. */
static inline const unsigned char *rf_find_nonascii(const unsigned char *h, size_t n)
{
    size_t i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(h + i));
        int mask = _mm_movemask_epi8(a);
        if (mask) return h + i + __builtin_ctz((unsigned)mask);
    }
#endif
    for (; i < n; i++)
        if (h[i] & 0x80) return h + i;
    return NULL;
}

#include <sys/mman.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* Ask the kernel to map the pages of [p, p+n) in one call (a mapped file is
 * then read without a page fault per 4 KiB). Advice only: errors are ignored
 * (old kernels, buffers that are not file maps). */
static inline void rf_prefault(const unsigned char *p, size_t n)
{
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095;
    size_t len = (size_t)((uintptr_t)p + n - a);
    if (n < (1u << 20)) return;
    if (madvise((void *)a, len, MADV_POPULATE_READ) != 0)
        (void)madvise((void *)a, len, MADV_WILLNEED);
}

/* Check an id table of n slots against the live entries (bit e of live set:
 * entry e is live; live NULL: all n_entries are): an occupied slot names entry
 * (slot & 0xffffffff) - 1, which must exist and be live. Returns the index of
 * the first bad slot, or n if none, and counts the occupied slots in *used.
 * Branch-free per slot: half the slots of a table are empty at random, which
 * a branch mispredicts. */
static inline int rf_slot_bad(uint64_t s, const uint64_t *live, uint32_t n_entries)
{
    uint32_t x = (uint32_t)s - 1u;                  /* 0 - 1 wraps: out of range */
    return s && (x >= n_entries || (live && !((live[x >> 6] >> (x & 63)) & 1)));
}

static inline uint64_t rf_check_slots(const uint64_t *slots, uint64_t n, const uint64_t *live,
                                      uint32_t n_entries, uint64_t *used)
{
    uint64_t u = 0, bad = 0, i;
    if (live) {
        for (i = 0; i < n; i++) {
            uint64_t s = slots[i];
            uint64_t nz = s != 0;
            uint32_t x = (uint32_t)s - 1u;
            uint64_t in = x < n_entries;
            uint32_t e = x & (uint32_t)(0u - (uint32_t)in);    /* x, or 0 when out of range */
            uint64_t ok = in & (live[e >> 6] >> (e & 63));
            u += nz;
            bad |= nz & ~ok & 1u;
        }
    } else {
        for (i = 0; i < n; i++) {
            uint64_t s = slots[i];
            uint64_t nz = s != 0;
            u += nz;
            bad |= nz & (uint64_t)((uint32_t)s - 1u >= n_entries);
        }
    }
    *used = u;
    if (bad)
        for (i = 0; i < n; i++)
            if (rf_slot_bad(slots[i], live, n_entries))
                return i;
    return n;
}

/* Index of the first negative value of a[0:n], or n if none. */
static inline uint64_t rf_first_negative(const int64_t *a, uint64_t n)
{
    uint64_t i;
    int64_t acc = 0;
    for (i = 0; i < n; i++)
        acc |= a[i];
    if (acc >= 0)
        return n;
    for (i = 0; i < n; i++)
        if (a[i] < 0)
            return i;
    return n;
}

/* Start of the line holding p, not before lo. */
static inline const unsigned char *rf_line_start(const unsigned char *lo, const unsigned char *p)
{
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    const unsigned char *q = (const unsigned char *)memrchr(lo, '\n', (size_t)(p - lo));
    return q ? q + 1 : lo;
#else
    while (p > lo && p[-1] != '\n') p--;
    return p;
#endif
}

/* Is position p of the escaped JSON string starting at s on a character
 * boundary (not inside a backslash escape)? */
static inline int rf_at_boundary(const unsigned char *s, const unsigned char *p)
{
    const unsigned char *b = p;
    while (b > s && b[-1] == '\\') b--;
    if ((p - b) & 1) return 0;           /* p follows an escaping backslash */
    /* inside a \u escape (backslash, u, four hex digits): a boundary backslash + u within the 5 bytes before p */
    for (int k = 2; k <= 5 && p - k >= s; k++) {
        const unsigned char *u = p - k;
        if (u[0] == '\\' && u[1] == 'u') {
            const unsigned char *c = u;
            while (c > s && c[-1] == '\\') c--;
            if (((u - c) & 1) == 0) return 0;
        }
    }
    return 1;
}

/* Does the escaped content string starting at s (line ends at e) contain the
 * escaped needle at a character boundary? */
static inline int rf_content_has(const unsigned char *s, const unsigned char *e,
                                 const unsigned char *nd, size_t m, int ci)
{
    const unsigned char *cur = s, *cend = NULL, *hit;
    if (m == 0) return 1;
    while ((hit = rf_find(cur, (size_t)(e - cur), nd, m, ci)) != NULL) {
        if (cend == NULL) {
            cend = rf_str_end(s, e);
            if (cend == NULL) cend = e;
        }
        if (hit + m > cend) return 0;
        if (rf_at_boundary(s, hit)) return 1;
        cur = hit + 1;
    }
    return 0;
}

/* ---- growable int64 array --------------------------------------------- */

typedef struct {
    int64_t *v;
    size_t n, cap;
} rf_i64vec;

static inline int rf_i64vec_push(rf_i64vec *a, int64_t x)
{
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 256;
        int64_t *nv = (int64_t *)realloc(a->v, nc * sizeof(int64_t));
        if (nv == NULL) return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return 0;
}

/* ---- frame scan -------------------------------------------------------- */

typedef struct {
    int64_t good_end;
    int64_t torn_offset;
    int64_t damaged_offset;
    int damage;          /* RF_* verdict of the damaged line */
    int oom;
} rf_scan_result;

/* Scan buf[start:end): record offset and length of each good line until
 * damage. Lines are checked with rf_check_frame. */
static inline void rf_scan(const unsigned char *buf, int64_t start, int64_t end,
                           rf_i64vec *offs, rf_i64vec *lens, rf_scan_result *r)
{
    int64_t pos = start;
    r->torn_offset = -1;
    r->damaged_offset = -1;
    r->damage = RF_OK;
    r->oom = 0;
    while (pos < end) {
        const unsigned char *nl = (const unsigned char *)memchr(buf + pos, '\n', (size_t)(end - pos));
        int64_t len;
        int v;
        if (nl == NULL) {
            if (!rf_all_zero(buf + pos, (size_t)(end - pos))) r->torn_offset = pos;
            break;
        }
        len = (int64_t)(nl - (buf + pos));
        v = rf_check_frame(buf + pos, (size_t)len);
        if (v != RF_OK) {
            r->damaged_offset = pos;
            r->damage = v;
            break;
        }
        if (rf_i64vec_push(offs, pos) || rf_i64vec_push(lens, len)) {
            r->oom = 1;
            break;
        }
        pos += len + 1;
    }
    r->good_end = pos;
}

#endif /* RF_CORE_H */
