/* zstd and LZ4 decompression and CRC-32 that run without the GIL, for the
 * page reader (csrc/_pages.pyx).
 *
 * libzstd is the system's (libzstd.so.1, opened once with dlopen): a missing
 * one is not an error, rf_zstd_ready() says 0 and the caller decompresses
 * through the zstandard module under the GIL as before. Only the one-shot
 * calls of zstd's stable API are used (present since 1.0). Each thread has
 * its own decompression context (freed when the thread ends).
 * CRC-32 is zlib's (the same function as Python's zlib.crc32).
 */
#ifndef RF_ZSTD_H
#define RF_ZSTD_H

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <zlib.h>

typedef void *(*rf_zstd_create_f)(void);
typedef size_t (*rf_zstd_free_f)(void *);
typedef size_t (*rf_zstd_dec_f)(void *, void *, size_t, const void *, size_t);
typedef unsigned (*rf_zstd_iserr_f)(size_t);
typedef const char *(*rf_zstd_name_f)(size_t);

static struct {
    rf_zstd_create_f create;
    rf_zstd_free_f free;
    rf_zstd_dec_f dec;
    rf_zstd_iserr_f iserr;
    rf_zstd_name_f name;
    int ready;
} rf_zstd_lib;

static pthread_once_t rf_zstd_once = PTHREAD_ONCE_INIT;
static pthread_key_t rf_zstd_key;

static void rf_zstd_drop(void *dctx) {
    if (dctx)
        rf_zstd_lib.free(dctx);
}

/* The system library `soname`, opened for good (never closed), or NULL:
 * not found, or `no_env` set (the tests' way to the fallback). */
static void *rf_lib_open(const char *soname, const char *no_env) {
    if (getenv(no_env))
        return NULL;
    return dlopen(soname, RTLD_NOW | RTLD_LOCAL);
}

static void rf_zstd_load(void) {
    void *h = rf_lib_open("libzstd.so.1", "RUNE_FAST_NO_LIBZSTD");
    if (h == NULL)
        return;
    rf_zstd_lib.create = (rf_zstd_create_f)dlsym(h, "ZSTD_createDCtx");
    rf_zstd_lib.free = (rf_zstd_free_f)dlsym(h, "ZSTD_freeDCtx");
    rf_zstd_lib.dec = (rf_zstd_dec_f)dlsym(h, "ZSTD_decompressDCtx");
    rf_zstd_lib.iserr = (rf_zstd_iserr_f)dlsym(h, "ZSTD_isError");
    rf_zstd_lib.name = (rf_zstd_name_f)dlsym(h, "ZSTD_getErrorName");
    if (!rf_zstd_lib.create || !rf_zstd_lib.free || !rf_zstd_lib.dec || !rf_zstd_lib.iserr
            || !rf_zstd_lib.name || pthread_key_create(&rf_zstd_key, rf_zstd_drop) != 0)
        return;
    rf_zstd_lib.ready = 1;
}

/* 1 if libzstd was found (loaded at the first call) */
static int rf_zstd_ready(void) {
    pthread_once(&rf_zstd_once, rf_zstd_load);
    return rf_zstd_lib.ready;
}

/* Decompress the frame src[0:n] into dst (cap bytes): the bytes it came
 * out to, or -1 with *err zstd's message (one that would not fit in cap
 * among them). Only after rf_zstd_ready() said 1. */
static long long rf_zstd_dec(void *dst, size_t cap, const void *src, size_t n, const char **err) {
    void *dctx = pthread_getspecific(rf_zstd_key);
    size_t got;
    if (dctx == NULL) {
        dctx = rf_zstd_lib.create();
        if (dctx == NULL || pthread_setspecific(rf_zstd_key, dctx) != 0) {
            if (dctx)
                rf_zstd_lib.free(dctx);
            *err = "no zstd context (out of memory)";
            return -1;
        }
    }
    got = rf_zstd_lib.dec(dctx, dst, cap, src, n);
    if (rf_zstd_lib.iserr(got)) {
        *err = rf_zstd_lib.name(got);
        return -1;
    }
    return (long long)got;
}

/* Free the calling thread's context, if it has one (the next rf_zstd_dec
 * on this thread makes another): ~96 KB that a pool thread would otherwise
 * hold between the searches it serves. */
static void rf_zstd_release(void) {
    void *dctx;
    if (!rf_zstd_ready())
        return;
    dctx = pthread_getspecific(rf_zstd_key);
    if (dctx != NULL) {
        pthread_setspecific(rf_zstd_key, NULL);
        rf_zstd_lib.free(dctx);
    }
}

/* LZ4_RAW pages (Parquet's LZ4 block codec, no framing): the system's
 * liblz4 (liblz4.so.1, opened once with dlopen), its bounds-checked block
 * decoder LZ4_decompress_safe; a missing one is not an error,
 * rf_lz4_ready() says 0 and the page reader declines such chunks (the
 * caller reads them through pyarrow). */
typedef int (*rf_lz4_dec_f)(const char *, char *, int, int);

static struct {
    rf_lz4_dec_f dec;
    int ready;
} rf_lz4_lib;

static pthread_once_t rf_lz4_once = PTHREAD_ONCE_INIT;

static void rf_lz4_load(void) {
    void *h = rf_lib_open("liblz4.so.1", "RUNE_FAST_NO_LIBLZ4");
    if (h == NULL)
        return;
    rf_lz4_lib.dec = (rf_lz4_dec_f)dlsym(h, "LZ4_decompress_safe");
    if (rf_lz4_lib.dec)
        rf_lz4_lib.ready = 1;
}

/* 1 if liblz4 was found (loaded at the first call) */
static int rf_lz4_ready(void) {
    pthread_once(&rf_lz4_once, rf_lz4_load);
    return rf_lz4_lib.ready;
}

/* Decompress the LZ4 block src[0:n] into dst (cap bytes): the bytes it
 * came out to, or -1 with *err saying why (a block that would not fit in
 * cap, or does not decode, among them). Only after rf_lz4_ready() said 1. */
static long long rf_lz4_dec(void *dst, size_t cap, const void *src, size_t n, const char **err) {
    int got;
    if (!rf_lz4_ready()) {
        *err = "no liblz4";
        return -1;
    }
    if (n > 0x7FFFFFFFu || cap > 0x7FFFFFFFu) {
        *err = "LZ4 block past 2 GiB";
        return -1;
    }
    got = rf_lz4_lib.dec((const char *)src, (char *)dst, (int)n, (int)cap);
    if (got < 0) {
        *err = "malformed LZ4 block";
        return -1;
    }
    return (long long)got;
}

static uint32_t rf_crc32(const unsigned char *p, size_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {                 /* (zlib takes a uInt length) */
        uInt step = n > 0x40000000u ? 0x40000000u : (uInt)n;
        c = crc32(c, p, step);
        p += step;
        n -= step;
    }
    return (uint32_t)c;
}

#endif
