"""The hot loops of reading a Parquet file page by page: parsing a page
header (Thrift compact protocol), finding the j-th value of a PLAIN
BYTE_ARRAY page, and turning such a page into an Arrow string layout.

The Python layer (``rune_fast.pages``) asks where a column chunk's pages lie
(:func:`chunk_pages` walks their headers in C) and decides what to do with
anything these functions refuse; a point read of rows (:func:`take_rows`)
reads, checks and decompresses their pages here (zlib's CRC-32 and the
system's libzstd without the GIL, csrc/rf_zstd.h; without libzstd, the zstd
callable it is given), as does a search's scan of a column's pages
(:func:`find_pages`). Every malformed input raises ValueError, never reads
out of bounds.
"""
from libc.errno cimport EINTR, errno
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.stat cimport fstat, struct_stat
from posix.unistd cimport pread

cimport cython
from cpython.object cimport PyObject, PyTypeObject
from rf_core cimport rf_find, rf_gram_acc, rf_gram_acc_add, rf_gram_acc_done, rf_gram_acc_init, rf_gram_may, rf_pow2_log

cdef extern from "rf_zstd.h" nogil:
    int rf_zstd_ready()
    long long rf_zstd_dec(void *dst, size_t cap, const void *src, size_t n, const char **err)
    int rf_lz4_ready()
    long long rf_lz4_dec(void *dst, size_t cap, const void *src, size_t n, const char **err)
    void rf_zstd_release()
    uint32_t rf_crc32(const unsigned char *p, size_t n)


cdef enum:
    # a page's codec (chunk_pages' ``codec``; the flags' zstd or lz4 bit)
    C_NONE = 0
    C_ZSTD = 1
    C_LZ4 = 2           # LZ4_RAW: an LZ4 block, no framing
    F_ZSTD = 1
    F_LZ4 = 128


cdef enum:
    FP_OK = 0
    FP_CRC = 1
    FP_CODEC = 2        # a page that does not decompress (zstd or LZ4)
    FP_SIZE = 3
    FP_SHORT = 4
    FP_LONG = 5
    FP_TAIL = 6
    FP_READ = 7
    FP_NOMEM = 8


cdef int _check_unpack(const unsigned char *comp, int64_t csize, uint32_t crc, int codec, unsigned char *raw,
                       int64_t usize, const unsigned char **page, long long *got, const char **zerr) noexcept nogil:
    """A stored page's CRC-32 checked (FP_CRC) and, with ``codec`` C_ZSTD
    or C_LZ4, decompressed into ``raw`` (FP_CODEC with the library's
    ``zerr``, or FP_SIZE with ``got`` another size than ``usize``);
    ``page``: its bytes (``comp`` when not decompressed here)."""
    if rf_crc32(comp, <size_t>csize) != crc:
        return FP_CRC
    page[0] = comp
    if codec == C_NONE:
        return FP_OK
    if codec == C_LZ4:
        got[0] = rf_lz4_dec(raw, <size_t>usize, comp, <size_t>csize, zerr)
    else:
        got[0] = rf_zstd_dec(raw, <size_t>usize, comp, <size_t>csize, zerr)
    page[0] = raw
    if got[0] < 0:
        return FP_CODEC
    return FP_OK if got[0] == usize else FP_SIZE


cdef int _raise_page(int code, int64_t off, long long got, int64_t usize, const char *zerr) except -1:
    """ValueError naming the page at ``off`` for what :func:`_check_unpack`
    found (FP_CRC, FP_CODEC with the library's ``zerr``, FP_SIZE with ``got``
    bytes for ``usize``); nothing for FP_OK (or a code it does not give)."""
    if code == FP_CRC:
        raise ValueError(f"page at offset {off} fails its CRC-32")
    if code == FP_CODEC:
        raise ValueError(f"page at offset {off} does not decompress: "
                         f"{(<bytes>zerr).decode('utf-8', 'replace')}")
    if code == FP_SIZE:
        raise ValueError(f"page at offset {off} decompresses to {got} bytes, its header says {usize}")
    return 0

import os

import numpy as np


def zstd_direct():
    """Whether pages are decompressed by the system's libzstd without the
    GIL (else through the zstandard module's callable, holding it)."""
    return bool(rf_zstd_ready())


def zstd_release():
    """Free this thread's libzstd context (~96 KB; remade at its next page):
    what the search pools' threads call after each job, so that threads
    between searches hold none."""
    rf_zstd_release()


class Unsupported(Exception):
    """The file's layout is not one the page reader reads (use pyarrow)."""


# Thrift compact protocol field types
cdef enum:
    T_TRUE = 1
    T_FALSE = 2
    T_BYTE = 3
    T_I16 = 4
    T_I32 = 5
    T_I64 = 6
    T_DOUBLE = 7
    T_BINARY = 8
    T_LIST = 9
    T_SET = 10
    T_MAP = 11
    T_STRUCT = 12
    MAX_DEPTH = 16


cdef class _Cursor:
    cdef const unsigned char *p
    cdef Py_ssize_t n
    cdef Py_ssize_t i

    cdef inline int byte(self) except -1:
        if self.i >= self.n:
            raise ValueError("page header runs past the bytes read")
        self.i += 1
        return self.p[self.i - 1]

    cdef inline uint64_t varint(self) except? 0xFFFFFFFFFFFFFFFF:
        cdef uint64_t r = 0
        cdef int shift = 0
        cdef int b
        while True:
            b = self.byte()
            r |= (<uint64_t>(b & 0x7F)) << shift
            if b < 0x80:
                return r
            shift += 7
            if shift > 63:
                raise ValueError("varint too long in page header")

    cdef inline int64_t zigzag(self) except? -0x7FFFFFFFFFFFFFFF:
        cdef uint64_t v = self.varint()
        return <int64_t>(v >> 1) ^ -(<int64_t>(v & 1))

    cdef int skip(self, int t, int depth) except -1:
        cdef uint64_t n, k
        cdef int h, et, kt, vt
        if depth > MAX_DEPTH:
            raise ValueError("page header nests too deep")
        if t == T_TRUE or t == T_FALSE:
            return 0
        if t == T_BYTE:
            self.byte()
        elif t == T_I16 or t == T_I32 or t == T_I64:
            self.varint()
        elif t == T_DOUBLE:
            self.advance(8)
        elif t == T_BINARY:
            self.advance(self.varint())
        elif t == T_LIST or t == T_SET:
            h = self.byte()
            n = h >> 4
            et = h & 15
            if n == 15:
                n = self.varint()
            for k in range(n):
                self.skip(et, depth + 1)
        elif t == T_MAP:
            n = self.varint()
            if n:
                h = self.byte()
                kt, vt = h >> 4, h & 15
                for k in range(n):
                    self.skip(kt, depth + 1)
                    self.skip(vt, depth + 1)
        elif t == T_STRUCT:
            self.skip_struct(depth + 1)
        else:
            raise ValueError(f"unknown Thrift type {t} in page header")
        return 0

    cdef inline int advance(self, uint64_t k) except -1:
        if k > <uint64_t>(self.n - self.i):
            raise ValueError("page header runs past the bytes read")
        self.i += <Py_ssize_t>k
        return 0

    cdef int field(self, int *fid) except -1:
        """Read a field header; returns its type (0 at the struct's end)."""
        cdef int h = self.byte()
        cdef int t = h & 15
        if h == 0:
            return 0
        if h >> 4:
            fid[0] += h >> 4
        else:
            fid[0] = <int>self.zigzag()
        return t

    cdef int skip_struct(self, int depth) except -1:
        cdef int fid = 0
        cdef int t
        while True:
            t = self.field(&fid)
            if t == 0:
                return 0
            self.skip(t, depth)


cdef int _header(const unsigned char *p, Py_ssize_t n, Py_ssize_t pos, int64_t *out) except -1:
    """Parse the PageHeader at ``p[pos:n]`` into ``out``: what
    :func:`page_header` returns, in its order."""
    cdef _Cursor c = _Cursor()
    cdef int fid = 0, sfid, t, st
    cdef int64_t ptype = -1, usize = -1, csize = -1, crc = -1, nvals = -1, enc = -1
    if pos < 0 or pos > n:
        raise ValueError("page header position out of range")
    c.p = p
    c.n = n
    c.i = pos
    while True:
        t = c.field(&fid)
        if t == 0:
            break
        if fid == 1 and t == T_I32:
            ptype = c.zigzag()
        elif fid == 2 and t == T_I32:
            usize = c.zigzag()
        elif fid == 3 and t == T_I32:
            csize = c.zigzag()
        elif fid == 4 and t == T_I32:
            crc = c.zigzag() & 0xFFFFFFFF
        elif (fid == 5 or fid == 7) and t == T_STRUCT:
            # a v1 data page's header, or a dictionary page's: the same two
            # first fields (num_values, encoding)
            sfid = 0
            while True:
                st = c.field(&sfid)
                if st == 0:
                    break
                if sfid == 1 and st == T_I32:
                    nvals = c.zigzag()
                elif sfid == 2 and st == T_I32:
                    enc = c.zigzag()
                else:
                    c.skip(st, 1)
        else:
            c.skip(t, 0)
    if ptype < 0 or usize < 0 or csize < 0:
        raise ValueError("page header lacks its type or sizes")
    out[0] = c.i - pos
    out[1] = ptype
    out[2] = usize
    out[3] = csize
    out[4] = crc
    out[5] = nvals
    out[6] = enc
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
def page_header(const unsigned char[::1] buf, Py_ssize_t pos=0):
    """Parse the PageHeader at ``buf[pos:]``.

    Returns ``(header_len, page_type, uncompressed_size, compressed_size, crc,
    num_values, encoding)``: ``crc`` is the unsigned CRC-32 or -1 when the
    header has none; ``num_values`` and ``encoding`` come from a v1 data page
    header or a dictionary page header (-1 for other page types). ValueError when the bytes are not a
    complete header (also when ``buf`` ends inside it: read more and retry)."""
    cdef int64_t h[7]
    _header(&buf[0] if buf.shape[0] else NULL, buf.shape[0], pos, h)
    return h[0], h[1], h[2], h[3], h[4], h[5], h[6]


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline Py_ssize_t _plain_value(const unsigned char *page, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t k,
                                    uint32_t *ln) except -1:
    """Start of value ``k`` of a PLAIN BYTE_ARRAY page whose length prefix is
    at ``pos`` (4-byte little-endian), its length in ``ln``; ValueError if
    the page ends first."""
    if n - pos < 4:
        raise ValueError(f"PLAIN page ends before value {k}")
    ln[0] = (<uint32_t>page[pos] | (<uint32_t>page[pos + 1] << 8)
             | (<uint32_t>page[pos + 2] << 16) | (<uint32_t>page[pos + 3] << 24))
    pos += 4
    if <uint64_t>ln[0] > <uint64_t>(n - pos):
        raise ValueError(f"PLAIN value {k} runs past its page")
    return pos


cdef extern from *:
    """
    #include <string.h>
    /* a little-endian u32 at p, in one load (a PLAIN length prefix) */
    static inline uint32_t rf_le32(const unsigned char *p) {
        uint32_t v;
        memcpy(&v, p, 4);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
    #endif
        return v;
    }
    """
    uint32_t rf_le32(const unsigned char *p) noexcept nogil


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline Py_ssize_t _plain_skip(const unsigned char *page, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t k,
                                   Py_ssize_t j, uint32_t *ln) noexcept nogil:
    """From the length prefix of value ``k`` at ``pos``, the start of value
    ``j`` (>= k) of a PLAIN BYTE_ARRAY page, its length in ``ln``; -1 if
    the page ends first (the caller names where: no exception is set up
    per value, so that walking a page of hundreds of short values to the
    row asked costs a few ns a value, not a try block each)."""
    cdef uint32_t v
    while True:
        if n - pos < 4:
            return -1
        v = rf_le32(page + pos)
        pos += 4
        if <uint64_t>v > <uint64_t>(n - pos):
            return -1
        if k == j:
            ln[0] = v
            return pos
        pos += v
        k += 1


def byte_array_at(const unsigned char[::1] page, Py_ssize_t j):
    """``(start, stop)`` of value ``j`` of a PLAIN BYTE_ARRAY page (each value:
    4-byte little-endian length, then its bytes). ValueError if the page
    ends first."""
    cdef Py_ssize_t n = page.shape[0], pos = 0, k
    cdef uint32_t ln
    cdef const unsigned char *b = &page[0] if n else NULL
    if j < 0:
        raise ValueError("negative value index")
    for k in range(j + 1):
        pos = _plain_value(b, n, pos, k, &ln)
        if k == j:
            return pos, pos + <Py_ssize_t>ln
        pos += ln


@cython.boundscheck(False)
@cython.wraparound(False)
def plain_strings(const unsigned char[::1] page, Py_ssize_t count):
    """``(data, offsets)`` of the ``count`` values of a PLAIN BYTE_ARRAY page:
    the values' bytes back to back, and int32 offsets (``count + 1``) into
    them, the layout of an Arrow string array. ValueError if the page holds
    fewer values or bytes past the last one."""
    cdef Py_ssize_t n = page.shape[0], pos = 0, k, out = 0
    cdef uint32_t ln
    cdef const unsigned char *b = &page[0] if n else NULL
    if count < 0:
        raise ValueError("negative value count")
    offs = np.empty(count + 1, dtype=np.int32)
    cdef int32_t[::1] o = offs
    data = bytearray(n - 4 * count if n >= 4 * count else 0)
    cdef unsigned char[::1] d = data
    o[0] = 0
    for k in range(count):
        pos = _plain_value(b, n, pos, k, &ln)
        if <uint64_t>out + ln > <uint64_t>d.shape[0]:
            raise ValueError(f"PLAIN value {k} runs past its page")
        if ln:
            memcpy(&d[out], &page[pos], ln)
        pos += ln
        out += ln
        o[k + 1] = <int32_t>out
    if pos != n:
        raise ValueError(f"{n - pos} bytes past the last PLAIN value")
    return bytes(data), offs


@cython.boundscheck(False)
@cython.wraparound(False)
def plain_find(const unsigned char[::1] page, Py_ssize_t count, const unsigned char[::1] needle,
               bint ignore_ascii_case=False):
    """Indices (int64, ascending) of the values of a PLAIN BYTE_ARRAY page of
    ``count`` values that hold ``needle`` (ASCII letters either case with
    ``ignore_ascii_case``: the needle given lowercased). ValueError as
    :func:`plain_strings`."""
    cdef Py_ssize_t n = page.shape[0], pos = 0, k, nh = 0
    cdef size_t m = needle.shape[0]
    cdef uint32_t ln
    cdef const unsigned char *nd = &needle[0] if m else <const unsigned char *>b""
    cdef const unsigned char *b = &page[0] if n else NULL
    if count < 0:
        raise ValueError("negative value count")
    hits = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] h = hits
    for k in range(count):
        pos = _plain_value(b, n, pos, k, &ln)
        if rf_find(b + pos, ln, nd, m, ignore_ascii_case) != NULL:
            h[nh] = k
            nh += 1
        pos += ln
    if pos != n:
        raise ValueError(f"{n - pos} bytes past the last PLAIN value")
    return hits[:nh]




cdef inline int _utf8_len(unsigned char c) noexcept nogil:
    """Bytes of the UTF-8 character whose lead byte is c (0: not a lead byte
    of a multi-byte character)."""
    if c >= 0xF0:
        return 4 if c < 0xF8 else 0
    if c >= 0xE0:
        return 3
    if c >= 0xC0:
        return 2
    return 0


cdef inline uint32_t _char_bit(const unsigned char *p, int n, int lg) noexcept nogil:
    cdef uint32_t x = 0
    cdef int i
    for i in range(n):
        x = (x << 8) | p[i]
    return (x * 2654435761u) >> (32 - lg)


cdef int _grams_lg(Py_ssize_t nbits) except -1:
    cdef int lg = rf_pow2_log(nbits, 256)
    if lg < 0:
        raise ValueError(f"nbits must be a power of two in [256, 2**24], got {nbits}")
    return lg


@cython.boundscheck(False)
@cython.wraparound(False)
def plain_grams(const unsigned char[::1] page, Py_ssize_t count, Py_ssize_t nbits=4096) -> bytes:
    """The search filter of the values of a PLAIN BYTE_ARRAY page of
    ``count`` values: ``nbits // 8`` bytes of trigram filter (the
    ``rf_gram_acc`` bits of each value: trigrams within it, ASCII letters
    lowercased), then ``nbits // 32`` bytes of character filter (a bit per
    multi-byte UTF-8 character), which :func:`grams_pages` tests.
    ``nbits``: a power of two in [256, 2**24]. ValueError as
    :func:`plain_strings`."""
    cdef Py_ssize_t n = page.shape[0], pos = 0, k, j, bad = -1
    cdef uint32_t ln, h
    cdef int lg = _grams_lg(nbits), cl
    cdef const unsigned char *b = &page[0] if n else NULL
    if count < 0:
        raise ValueError("negative value count")
    out = bytearray(nbits // 8 + nbits // 32)
    cdef uint64_t *w = <uint64_t *>(<char *>out)
    cdef uint64_t *wc = w + nbits // 64
    cdef rf_gram_acc acc
    with nogil:
        rf_gram_acc_init(&acc, w, lg)
        for k in range(count):
            if n - pos < 4:
                bad = k
                break
            ln = (<uint32_t>b[pos] | (<uint32_t>b[pos + 1] << 8)
                  | (<uint32_t>b[pos + 2] << 16) | (<uint32_t>b[pos + 3] << 24))
            pos += 4
            if <uint64_t>ln > <uint64_t>(n - pos):
                bad = k
                break
            rf_gram_acc_add(&acc, b + pos, ln)
            j = pos
            while j < pos + <Py_ssize_t>ln:
                if b[j] < 0xC0:
                    j += 1
                    continue
                cl = _utf8_len(b[j])
                if cl and j + cl <= pos + <Py_ssize_t>ln:
                    h = _char_bit(b + j, cl, lg - 2)
                    wc[h >> 6] |= (<uint64_t>1) << (h & 63)
                    j += cl
                else:
                    j += 1
            pos += ln
        rf_gram_acc_done(&acc)
    if bad >= 0:
        raise ValueError(f"PLAIN value {bad} runs past its page")
    if pos != n:
        raise ValueError(f"{n - pos} bytes past the last PLAIN value")
    return bytes(out)


@cython.boundscheck(False)
@cython.wraparound(False)
def grams_pages(grams, Py_ssize_t nbits, needle):
    """Indices (int64, ascending) of the pages whose filter (the
    concatenated :func:`plain_grams` of pages) may hold ``needle``: one
    multi-byte UTF-8 character is looked up in the character filter, a
    longer needle by its trigrams; a shorter one passes every page."""
    cdef int lg = _grams_lg(nbits)
    cdef const unsigned char[::1] g = grams
    cdef const unsigned char[::1] nd = needle
    cdef Py_ssize_t per = nbits // 8 + nbits // 32, m = nd.shape[0], k = 0, i
    cdef Py_ssize_t npages = g.shape[0] // per
    cdef const uint64_t *w
    cdef uint32_t h = 0
    cdef bint one_char = m >= 2 and _utf8_len(nd[0]) == m
    if g.shape[0] != npages * per:
        raise ValueError(f"{g.shape[0]} bytes of filters are not a whole number of pages of {per}")
    out = np.empty(npages, dtype=np.int64)
    cdef int64_t[::1] ov = out
    if npages == 0 or (m < 3 and not one_char):
        return np.arange(npages, dtype=np.int64)
    if one_char:
        h = _char_bit(&nd[0], <int>m, lg - 2)
    with nogil:
        for i in range(npages):
            w = <const uint64_t *>&g[i * per]
            if one_char:
                if not (w[nbits // 64 + (h >> 6)] >> (h & 63)) & 1:
                    continue
            elif not rf_gram_may(w, &nd[0], <size_t>m, lg):
                continue
            ov[k] = i
            k += 1
    return out[:k].copy()


cdef enum:
    # bytes read at a page header that lies past what was read before; a
    # header that does not parse in them (statistics make it longer) is read
    # again, up to HEADER_MAX
    HEADER_PROBE = 512
    HEADER_MAX = 64 * 1024
    # bytes read at once from the start of a column chunk: the headers of a
    # chunk of small pages all lie in them
    CHUNK_WINDOW = 16 * 1024
    DATA_PAGE = 0
    DICTIONARY_PAGE = 2
    PLAIN = 0
    PLAIN_DICTIONARY = 2
    DELTA_BINARY_PACKED = 5
    RLE_DICTIONARY = 8
    # a page's kind, in a directory's sixth field above its zstd bit
    # (``flags = zstd | kind << 1 | lz4 << 7``; 0 or 1 before there were
    # kinds, no lz4 bit before LZ4_RAW pages)
    K_PLAIN = 0         # a PLAIN data page
    K_DICT = 1          # a column chunk's dictionary page (PLAIN values)
    K_RLE_DICT = 2      # a data page of dictionary indices (RLE/bit-packed hybrid)
    K_DELTA = 3         # a DELTA_BINARY_PACKED data page (INT32/INT64)
    K_MAX = 3
    K_MASK = 63         # the kind's bits, above the zstd bit and below the lz4 bit


cdef inline int _kind(int64_t flags) noexcept nogil:
    """A directory entry's page kind (its flags without the codec bits)."""
    return <int>((flags >> 1) & K_MASK)


cdef inline int _codec(int64_t flags) noexcept nogil:
    """A directory entry's codec: C_ZSTD, C_LZ4 or C_NONE."""
    if flags & F_ZSTD:
        return C_ZSTD
    if flags & F_LZ4:
        return C_LZ4
    return C_NONE


cdef inline int64_t _flags(int codec, int kind) noexcept nogil:
    return (F_ZSTD if codec == C_ZSTD else 0) | (<int64_t>kind << 1) | (F_LZ4 if codec == C_LZ4 else 0)


cdef inline bint _known_flags(int64_t flags) noexcept nogil:
    """A directory entry's flags: a known kind, at most one codec bit."""
    return (0 <= flags and (flags & ~(<int64_t>(F_ZSTD | F_LZ4 | (K_MASK << 1)))) == 0
            and _kind(flags) <= K_MAX and not (flags & F_ZSTD and flags & F_LZ4))


cdef inline int _here(int64_t flags, bint direct) noexcept nogil:
    """The codec a page is decompressed with by :func:`_check_unpack`:
    LZ4_RAW always, zstd with the system's libzstd (``direct``), else none
    (a zstd page's bytes are then left to the caller's zstd callable)."""
    if flags & F_LZ4:
        return C_LZ4
    if flags & F_ZSTD and direct:
        return C_ZSTD
    return C_NONE


def page_codecs():
    """The codecs :func:`chunk_pages` takes: ``{"none": 0, "zstd": 1,
    "lz4_raw": 2}``; a directory's sixth field holds 1 for zstd, 128 for
    LZ4_RAW."""
    return {"none": C_NONE, "zstd": C_ZSTD, "lz4_raw": C_LZ4}


def lz4_direct():
    """Whether LZ4_RAW pages are decompressed here (by the system's
    liblz4, without the GIL); else the reader declines them."""
    return bool(rf_lz4_ready())


def page_kinds():
    """The page kinds a directory's sixth field holds above its zstd bit:
    ``{"plain": 0, "dictionary": 1, "rle_dictionary": 2, "delta": 3}``."""
    return {"plain": K_PLAIN, "dictionary": K_DICT, "rle_dictionary": K_RLE_DICT, "delta": K_DELTA}


cdef Py_ssize_t _read_at(int fd, unsigned char *buf, Py_ssize_t size, int64_t offset) except -1:
    """pread exactly ``size`` bytes at ``offset``: OSError if the read fails,
    ValueError naming the offset if the file ends first."""
    cdef Py_ssize_t got = 0, r
    while got < size:
        with nogil:
            r = pread(fd, buf + got, <size_t>(size - got), offset + got)
        if r < 0:
            if errno == EINTR:
                continue
            raise OSError(errno, os.strerror(errno))
        if r == 0:
            raise ValueError(f"{size} bytes at offset {offset} run past the end of the file")
        got += r
    return got


cdef int _check_page(const int64_t *h, int64_t pos, int64_t end, int64_t rows, int64_t first,
                     int codec, Py_ssize_t npage, bint has_dict) except -1:
    """The checks of one page header ``h`` (at ``pos``, page ``npage`` of a
    column chunk ending at ``end`` of ``rows`` values, ``first`` of them
    before it; ``has_dict``: the chunk began with a dictionary page) that
    both walks of a chunk's headers make, and the page's kind: a page with
    a CRC, either a dictionary page (PLAIN values; only as the chunk's
    first) or a v1 data page PLAIN, of dictionary indices (only after a
    dictionary page) or DELTA_BINARY_PACKED; a count that fits what is
    left, bytes that stay in the chunk (checked before they are added: no
    sum can overflow)."""
    cdef int kind
    if h[4] < 0:
        raise Unsupported(f"page at offset {pos} has no CRC")
    if h[1] == DICTIONARY_PAGE and npage == 0 and (h[6] == PLAIN or h[6] == PLAIN_DICTIONARY):
        kind = K_DICT
    elif h[1] != DATA_PAGE:
        raise Unsupported(f"page at offset {pos} (type {h[1]}, encoding {h[6]})")
    elif h[6] == PLAIN:
        kind = K_PLAIN
    elif (h[6] == RLE_DICTIONARY or h[6] == PLAIN_DICTIONARY) and has_dict:
        kind = K_RLE_DICT
    elif h[6] == DELTA_BINARY_PACKED:
        kind = K_DELTA
    else:
        raise Unsupported(f"page at offset {pos} (type {h[1]}, encoding {h[6]})")
    if h[5] <= 0 or (codec == C_NONE and h[2] != h[3]):
        raise ValueError(f"page header at offset {pos} has {h[5]} values")
    if h[5] > (rows if kind == K_DICT else rows - first):
        raise ValueError(f"page at offset {pos} holds {h[5]} values, {rows - first} "
                         f"left of the chunk's {rows}")
    if h[3] > end - pos - h[0]:
        raise ValueError(f"page at offset {pos} ({h[0]} + {h[3]} bytes) runs past its "
                         f"column chunk, which ends at {end}")
    return kind


def chunk_pages(int fd, int64_t offset, int64_t total, int64_t rows, int codec):
    """The pages of one column chunk, from their headers: ``total`` bytes at
    ``offset`` of the file open as ``fd``, holding ``rows`` values (the
    chunk's first page: its dictionary page if it has one). Returns
    ``(firsts, pages)``: the first row of each page, and ``(first, data
    offset, compressed size, uncompressed size, crc, flags, values)`` of
    each, ``flags`` being 1 if zstd-compressed (``codec`` 1), 128 if LZ4_RAW
    (``codec`` 2), plus the page's kind (:func:`page_kinds`) times 2. A dictionary page (the chunk's first, if
    any) has first row 0 and its dictionary's values; it holds no rows.

    Only pages with a CRC, v1 data pages PLAIN, RLE_DICTIONARY or
    DELTA_BINARY_PACKED and a PLAIN dictionary page are read here: any
    other page raises :class:`Unsupported` (the caller reads the file
    another way). A chunk
    that runs past the end of the file, a header that does not parse, a
    page of no values (or, uncompressed, of two sizes), or pages that do
    not fill the chunk exactly with ``rows`` values raise ValueError naming
    the offset; a failed read, OSError."""
    cdef list firsts = [], pages = []
    cdef int64_t end, pos = offset, first = 0, base = offset
    cdef int64_t h[7]
    cdef int kind
    cdef Py_ssize_t have = 0, want
    cdef struct_stat st
    cdef unsigned char *buf
    if offset < 0 or total < 0 or rows < 0 or total > INT64_MAX - offset:
        raise ValueError(f"column chunk at offset {offset}: {total} bytes, {rows} values")
    end = offset + total
    if fstat(fd, &st) != 0:
        raise OSError(errno, os.strerror(errno))
    if end > st.st_size:
        # (the pages walked would otherwise end past what the file holds)
        raise ValueError(f"column chunk at offset {offset} ({total} bytes) runs past the end "
                         f"of the file ({st.st_size} bytes)")
    buf = <unsigned char *>malloc(HEADER_MAX)
    if buf == NULL:
        raise MemoryError()
    try:
        if total > 0:
            have = _read_at(fd, buf, <Py_ssize_t>min(total, <int64_t>CHUNK_WINDOW), offset)
        while pos < end:
            if pos - base >= have:
                base = pos
                have = _read_at(fd, buf, <Py_ssize_t>min(end - pos, <int64_t>HEADER_PROBE), pos)
            try:
                _header(buf, have, <Py_ssize_t>(pos - base), h)
            except ValueError:
                # the header may run past the bytes read: read it where it starts
                want = <Py_ssize_t>min(end - pos, <int64_t>HEADER_MAX)
                base = pos
                have = _read_at(fd, buf, want, pos)
                try:
                    _header(buf, have, 0, h)
                except ValueError as exc:
                    raise ValueError(f"page header at offset {pos}: {exc}") from None
            kind = _check_page(h, pos, end, rows, first, codec, len(pages),
                               len(pages) > 0 and _kind(pages[0][5]) == K_DICT)
            firsts.append(first)
            pages.append((first, pos + h[0], h[3], h[2], h[4], _flags(codec, kind), h[5]))
            if kind != K_DICT:
                first += h[5]
            pos += h[0] + h[3]
    finally:
        free(buf)
    if pos != end or first != rows:
        raise ValueError(f"column chunk at offset {offset} holds {first} values "
                         f"in {pos - offset} bytes, expected {rows} in {total}")
    return firsts, pages


# ---------------------------------------------------------------- rows to records
#
# A cool read (a task, a window reaching into the archive, an exact read)
# gathers the values of just the rows it returns from the pages holding them
# (plain_gather), then turns each row into its record here: the canonical
# JSON rebuilt from the stored bytes, hashed and compared with the row's
# digest, the strings decoded, the record's slots set (the checks of
# records.message_from_stored). A row this path does not take -- extra
# fields, tool calls not spelled canonically, a digest that does not match,
# anything unusual -- is None, and the caller's Python path reads it (and
# names what is wrong): nothing is served here that the Python path would
# refuse.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBuffer_Release, PyObject_GetBuffer
from cpython.mem cimport PyMem_Free
from libc.stdlib cimport realloc
from libc.string cimport memcmp, strlen

cimport _xxh

cdef extern from "Python.h":
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)
    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    object PyFloat_FromDouble(double v)
    object PyLong_FromLongLong(long long v)
    char *PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int *ptype) except NULL
    int Py_DTSF_ADD_DOT_0
    const char *PyUnicode_AsUTF8(object o) except NULL
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *size) except NULL
    void Py_INCREF(object o)
    void PyObject_GC_UnTrack(void *op)
    int PyObject_GC_IsTracked(object op)

cdef extern from "rf_json.h" nogil:
    size_t rf_json_escape(const unsigned char *s, size_t n, unsigned char *out)

cdef extern from "rf_core.h" nogil:
    void rf_write_hex16(uint64_t v, unsigned char *out)

cdef extern from "rf_float.h" nogil:
    int rf_float_repr(double v, char *out)

cdef extern from "math.h" nogil:
    bint isfinite(double x)


@cython.boundscheck(False)
@cython.wraparound(False)
def plain_gather(list pages, const int64_t[::1] counts, const int64_t[::1] rows):
    """``(data, offsets)`` of the values ``rows`` (ascending) of the PLAIN
    BYTE_ARRAY pages ``pages`` taken as one run of values (page i holding
    ``counts[i]``): the values' bytes back to back and int32 offsets
    (``len(rows) + 1``), the layout of an Arrow string array. ValueError if
    a row is out of order or past the pages, or a page ends before a value
    it is asked for."""
    cdef Py_ssize_t m = rows.shape[0], j, p = -1, k = 0, pos = 0, n = 0, out = 0, total = 0
    cdef int64_t first = 0, want, end = 0
    cdef uint32_t ln
    cdef const unsigned char *b = NULL
    cdef bytes page
    if counts.shape[0] != len(pages):
        raise ValueError("plain_gather: a count for each page")
    for page in pages:
        total += PyBytes_GET_SIZE(page)
    offs = np.empty(m + 1, dtype=np.int32)
    cdef int32_t[::1] o = offs
    data = bytearray(min(total, <Py_ssize_t>0x7FFFFFFF))
    cdef unsigned char[::1] d = data
    o[0] = 0
    for j in range(m):
        want = rows[j]
        if want < first + k:
            raise ValueError(f"plain_gather: value {want} asked out of order")
        while want >= end:
            p += 1
            if p >= len(pages):
                raise ValueError(f"plain_gather: value {want} is past the pages' {end}")
            first = end
            end += counts[p]
            page = <bytes>pages[p]
            b = <const unsigned char *>PyBytes_AS_STRING(page)
            n = PyBytes_GET_SIZE(page)
            k = 0
            pos = 0
        while True:
            pos = _plain_value(b, n, pos, k, &ln)
            if first + k == want:
                break
            pos += ln
            k += 1
        if <uint64_t>out + ln > <uint64_t>d.shape[0]:
            raise ValueError(f"PLAIN value {k} runs past its page")
        if ln:
            memcpy(&d[out], b + pos, ln)
        out += ln
        pos += ln
        k += 1
        o[j + 1] = <int32_t>out
    return bytes(d[:out]), offs


cdef struct _Buf:
    unsigned char *p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _grow(_Buf *b, Py_ssize_t more) except -1:
    cdef Py_ssize_t cap
    cdef unsigned char *q
    if b.n + more <= b.cap:
        return 0
    cap = max(2 * b.cap, b.n + more + 256)
    q = <unsigned char *>realloc(b.p, <size_t>cap)
    if q == NULL:
        raise MemoryError()
    b.p, b.cap = q, cap
    return 0


cdef int _raw(_Buf *b, const char *s, Py_ssize_t n) except -1:
    _grow(b, n)
    memcpy(b.p + b.n, s, <size_t>n)
    b.n += n
    return 0


cdef int _jstr(_Buf *b, const unsigned char *s, Py_ssize_t n) except -1:
    """``"s"``, JSON-escaped as json.dumps(ensure_ascii=False) spells it."""
    _grow(b, 6 * n + 2)
    b.p[b.n] = c'"'
    b.n += 1
    b.n += <Py_ssize_t>rf_json_escape(s, <size_t>n, b.p + b.n)
    b.p[b.n] = c'"'
    b.n += 1
    return 0


cdef int _jint(_Buf *b, long long v) except -1:
    """``v`` in decimal (as ``%lld`` spells it; printf's machinery cost
    more than the rest of a row's integers)."""
    cdef char tmp[24]
    cdef int k = 0
    cdef unsigned long long u
    _grow(b, 24)
    if v < 0:
        b.p[b.n] = c'-'
        b.n += 1
        u = <unsigned long long>(-(v + 1)) + 1
    else:
        u = <unsigned long long>v
    while True:
        tmp[k] = <char>(c'0' + <int>(u % 10))
        k += 1
        u //= 10
        if u == 0:
            break
    while k > 0:
        k -= 1
        b.p[b.n] = <unsigned char>tmp[k]
        b.n += 1
    return 0


cdef class _Scratch:
    """The canonical-JSON buffer of one records_from_columns call."""
    cdef _Buf buf

    def __dealloc__(self):
        free(self.buf.p)


cdef class _Views:
    """The buffers records_from_columns reads its fixed-width columns and
    offsets from (any C-contiguous buffer: bytes, an ndarray), held for the
    call and released with it. Taken through the buffer protocol: a numpy
    view of each costs more than a single row's whole record."""
    cdef Py_buffer views[16]
    cdef Py_ssize_t n[16]
    cdef int used

    cdef const void *take(self, object obj, Py_ssize_t align) except NULL:
        if self.used >= 16:
            raise ValueError("records_from_columns: too many buffers")
        cdef Py_buffer *b = &self.views[self.used]
        PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS)
        if (<size_t>b.buf) % align:
            # (a view at an odd offset: its values copied into aligned bytes)
            PyBuffer_Release(b)
            PyObject_GetBuffer(bytes(memoryview(obj)), b, PyBUF_C_CONTIGUOUS)
        self.used += 1
        self.n[self.used - 1] = b.len
        if b.len % align or (<size_t>b.buf) % align:
            raise ValueError(f"records_from_columns: a buffer of {b.len} bytes is not of "
                             f"{align}-byte values")
        return b.buf if b.buf != NULL else <const void *>&self.n[0]    # (no bytes: never read)

    def __dealloc__(self):
        cdef int i
        for i in range(self.used):
            PyBuffer_Release(&self.views[i])


# string columns of the cool schema (rune_fast.cool.schema.COOL_SCHEMA), in
# the order records_from_columns takes them
cdef enum:
    S_MSG_ID, S_CHANNEL, S_TASK, S_HLC, S_CONTENT, S_ROLE, S_TOOL_CALLS, S_TOOL_CALL_ID,
    S_ORIGIN, S_EXTRA, S_DIGEST, N_S

cdef tuple _READ_ROLES = ("user", "assistant", "system", "tool")
# the record's str slots set from a string column (the class is frozen)
cdef tuple _STR_SLOTS = (("msg_id", S_MSG_ID), ("channel_id", S_CHANNEL), ("task_id", S_TASK),
                         ("hlc", S_HLC), ("content", S_CONTENT), ("tool_call_id", S_TOOL_CALL_ID),
                         ("origin", S_ORIGIN))

# The record's fields, in the order of _FIELDS: where records_from_columns
# puts each value (see _layout).
cdef enum:
    F_MSG_ID, F_CHANNEL, F_TASK, F_HLC, F_CONTENT, F_TOOL_CALL_ID, F_ORIGIN, F_TS, F_ROLE, F_TOK,
    F_CALLS, N_F

cdef tuple _FIELDS = ("msg_id", "channel_id", "task_id", "hlc", "content", "tool_call_id", "origin",
                      "ts", "role", "token_estimate", "tool_calls")
# the string column of each of the first seven fields
cdef int _FIELD_COL[7]
_FIELD_COL[:] = [S_MSG_ID, S_CHANNEL, S_TASK, S_HLC, S_CONTENT, S_TOOL_CALL_ID, S_ORIGIN]
#: Bytes of an object's header: where the first slot of a slotted instance lies.
cdef Py_ssize_t _HEAD = object.__basicsize__
cdef object _ZERO = 0
cdef object _ONE = 1

cdef extern from *:
    """
    /* a blank instance of the type t, as object.__new__(t) makes it */
    static PyObject *rf_pages_blank(PyObject *t) {
        PyTypeObject *tp = (PyTypeObject *)t;
        return tp->tp_alloc(tp, 0);
    }
    """
    object rf_pages_blank(object t)

# The layout of the last record type records_from_columns made (a derived
# constant of that type, found once: which of its pointer slots holds each
# field), or _lay_direct False: the fields are set by name. Each call takes
# a copy (_layout) before its loop: a call in another thread, for another
# type, may replace it while this one waits on the GIL.
cdef type _lay_type = None
cdef bint _lay_direct = False
cdef Py_ssize_t _lay[N_F]


cdef bint _layout(type t, Py_ssize_t *out) except -1:
    """Whether an instance of ``t`` is filled by storing each field of
    _FIELDS in its pointer slot (``out[k]``: the slot of field k): when the
    instance is its header and eleven field pointers (slots, no
    ``__dict__``, no weak references), a probe's fields are set to
    sentinels by name and each is looked for. Records are then filled by
    storing the pointers (a dozen descriptor lookups and calls a row, a
    fifth of its assembly, saved); any other type by name, as before."""
    global _lay_type, _lay_direct
    cdef Py_ssize_t k, j, found
    cdef Py_ssize_t found_at[N_F]
    cdef PyObject **at
    cdef list sentinels
    if t is _lay_type:
        for k in range(N_F):
            out[k] = _lay[k]
        return _lay_direct
    if (t.__dictoffset__ != 0 or t.__weakrefoffset__ != 0 or t.__itemsize__ != 0
            or t.__basicsize__ != _HEAD + N_F * <Py_ssize_t>sizeof(void *)):
        _lay_type, _lay_direct = t, False
        return False
    probe = rf_pages_blank(t)
    sentinels = [object() for k in range(N_F)]
    try:
        for k in range(N_F):
            PyObject_GenericSetAttr(probe, _FIELDS[k], sentinels[k])
    except (AttributeError, TypeError):
        _lay_type, _lay_direct = t, False
        return False
    at = <PyObject **>(<char *><void *>probe + _HEAD)
    for k in range(N_F):
        found = -1
        for j in range(N_F):
            if at[j] == <PyObject *>sentinels[k]:
                found = j
        if found < 0:
            _lay_type, _lay_direct = t, False
            return False
        found_at[k] = found
    # (published and copied out with no Python code between: no thread switch)
    for k in range(N_F):
        _lay[k] = found_at[k]
        out[k] = found_at[k]
    _lay_type, _lay_direct = t, True
    return True


cdef inline void _put(PyObject **at, const Py_ssize_t *lay, Py_ssize_t k, object v) noexcept:
    """Store ``v`` (a new reference taken) in the blank slot of field ``k``."""
    Py_INCREF(v)
    at[lay[k]] = <PyObject *>v


import orjson

from rune_fast._encode import fresh_read_only_calls

cdef object _loads = orjson.loads
cdef object _dumps = orjson.dumps
#: the calls as a record read from the store holds them (read-only: the
#: caches hand the record out as it is)
cdef object _read_only = fresh_read_only_calls
cdef object _SORTED = orjson.OPT_SORT_KEYS


cdef object _calls_of(const unsigned char *s, Py_ssize_t n):
    """``(calls tuple, canonical JSON)`` (the calls read-only) of a stored
    non-empty tool-call list in the common shape -- a JSON list of objects, each with an
    ASCII str ``id``, a str ``name`` and an ``arguments`` -- as the
    caller's ``calls_read`` (rune_fast.cool.reads._calls_read) makes it,
    without its Python frames; None for anything else, which
    ``calls_read`` then decides."""
    cdef object calls, c, v
    cdef Py_ssize_t i
    try:
        calls = _loads(PyBytes_FromStringAndSize(<const char *>s, n))
    except ValueError:
        return None
    if type(calls) is not list or not calls:
        return None
    for i in range(len(<list>calls)):
        c = (<list>calls)[i]
        if type(c) is not dict:
            return None
        v = (<dict>c).get("id")
        if type(v) is not str or not (<str>v).isascii():
            return None
        if type((<dict>c).get("name")) is not str or "arguments" not in <dict>c:
            return None
    try:
        canonical = _dumps(calls, option=_SORTED)
    except (TypeError, ValueError):
        return None
    return _read_only(calls), canonical


cdef object _same_or_new(object prev, const unsigned char *pb, Py_ssize_t plen,
                         const unsigned char *s, Py_ssize_t n):
    """The str of the UTF-8 bytes ``s[:n]``: ``prev`` itself when its bytes
    ``pb[:plen]`` are the same (a run of rows of one channel, one task,
    one device shares one object), else decoded."""
    if prev is not None and plen == n and memcmp(pb, s, <size_t>n) == 0:
        return prev
    return PyUnicode_DecodeUTF8(<const char *>s, n, NULL)


@cython.boundscheck(False)
@cython.wraparound(False)
def records_from_columns(list strings, ts, tok, sv, ords, type record_type, object calls_read,
                         bint pairs=True, str task=None, bint keyed=False, list canon=None):
    """``(record, ord)`` of each row of cool columns already gathered for
    just the rows a read returns, or None for a row left to the caller's
    Python path (see the section comment). ``pairs=False``: two lists
    instead, the records (None for a row left) and their ords (a search's
    hundreds of thousands of hits then make no tuple each that holds a
    record: the cyclic collector walks every such tuple while it lives).
    ``keyed=True`` (with ``pairs=False``): the first list holds ``(order
    key, record)`` instead, the key as ``rune_fast._order.order_key(hlc,
    msg_id, ord)`` makes it (a task read sorts its rows by it).

    ``task``: the rows must be of this task; a row of another is left to
    the caller (whose Python path names the damage), and the rows of the
    task share this str as their ``task_id``. ``canon``: a list of one
    slot a row, given each built row's canonical JSON (the bytes its digest
    was checked over: a check's payload hash needs no second encoding). The channel and origin of
    consecutive rows that spell them alike share one str too.

    ``strings``: the eleven string columns msg_id, channel_id, task_id, hlc,
    content, role, tool_calls, tool_call_id, origin, extra, digest, each
    ``(data, int32 offsets)``; ``ts`` float64, ``tok`` and ``ords`` int64,
    ``sv`` int32 values (any buffers). ``calls_read(raw) -> (calls tuple,
    canonical JSON bytes) | None`` reads a non-empty tool-call list.
    A record without tool calls of a type without ``__dict__`` is
    untracked by the cyclic garbage collector (it holds no container)."""
    cdef _Views views = _Views()
    cdef const double *t = <const double *>views.take(ts, 8)
    cdef Py_ssize_t m = views.n[0] // 8, i, k, a, ln
    cdef const int64_t *tk = <const int64_t *>views.take(tok, 8)
    cdef const int32_t *v = <const int32_t *>views.take(sv, 4)
    cdef const int64_t *od = <const int64_t *>views.take(ords, 8)
    cdef const unsigned char *sp[N_S]
    cdef const int32_t *so[N_S]
    cdef list keep = []
    cdef list out
    cdef object rec, role, calls, got, s, ordv, key, pair
    cdef list vals = [None] * 7
    cdef object prev_ch = None, prev_origin = None
    cdef Py_ssize_t prev_ch_i = 0, prev_origin_i = 0
    cdef const char *task_p = NULL
    cdef Py_ssize_t task_n = 0
    cdef PyObject **at
    cdef bytes canon_calls
    cdef _Scratch sc = _Scratch()
    cdef _Buf *b = &sc.buf
    cdef _xxh.XXH128_hash_t h
    cdef unsigned char hexd[32]
    cdef char *tsr
    cdef char fts[48]
    cdef int version = record_type.SCHEMA_VERSION
    # a record of str, float and int fields (no tool calls) cannot be part
    # of a reference cycle: it is left out of the cyclic collector's walks,
    # as CPython leaves out tuples and dicts of such values (a search may
    # return hundreds of thousands; each full collection walked them all)
    cdef bint untrack = record_type.__dictoffset__ == 0
    if (len(strings) != N_S or views.n[1] != 8 * m or views.n[2] != 4 * m
            or views.n[3] != 8 * m):
        raise ValueError("records_from_columns: columns of different lengths")
    if keyed and pairs:
        raise ValueError("records_from_columns: keyed=True takes pairs=False")
    if task is not None:
        task_p = PyUnicode_AsUTF8AndSize(task, &task_n)
    cdef Py_ssize_t lay[N_F]
    cdef bint direct = _layout(record_type, lay)
    cdef Py_ssize_t size[N_S]
    for k in range(N_S):
        data, offs = strings[k]
        if not isinstance(data, bytes):
            data = bytes(data)
        keep.append(data)
        so[k] = <const int32_t *>views.take(offs, 4)
        if views.n[views.used - 1] != 4 * (m + 1):
            raise ValueError(f"records_from_columns: string column {k} has "
                             f"{views.n[views.used - 1] // 4} offsets for {m} rows")
        sp[k] = <const unsigned char *>PyBytes_AS_STRING(data)
        size[k] = PyBytes_GET_SIZE(data)
    out = [None] * m
    cdef list ords_out = [0] * m if not pairs else None
    if canon is not None and len(canon) != m:
        raise ValueError(f"records_from_columns: canon holds {len(canon)} slots for {m} rows")
    for i in range(m):
        for k in range(N_S):
            if so[k][i] < 0 or so[k][i] > so[k][i + 1] or so[k][i + 1] > size[k]:
                raise ValueError(f"records_from_columns: string column {k} offsets of row {i} "
                                 f"do not fit its data")
        # extra fields, or a schema this build does not make: the Python path
        if so[S_EXTRA][i + 1] - so[S_EXTRA][i] != 2 or memcmp(sp[S_EXTRA] + so[S_EXTRA][i], b"{}", 2) != 0:
            continue
        if v[i] != version or not isfinite(t[i]) or tk[i] < 0:
            continue
        if so[S_MSG_ID][i + 1] == so[S_MSG_ID][i] or so[S_CHANNEL][i + 1] == so[S_CHANNEL][i]:
            continue
        if so[S_DIGEST][i + 1] - so[S_DIGEST][i] != 32:
            continue
        if task_p != NULL and (so[S_TASK][i + 1] - so[S_TASK][i] != task_n
                               or memcmp(sp[S_TASK] + so[S_TASK][i], task_p, <size_t>task_n) != 0):
            continue        # another task's row where the index said this one's: the caller names it
        role = None
        a, ln = so[S_ROLE][i], so[S_ROLE][i + 1] - so[S_ROLE][i]
        for s in _READ_ROLES:
            if ln == len(<str>s) and memcmp(sp[S_ROLE] + a, PyUnicode_AsUTF8(s), <size_t>ln) == 0:
                role = s
                break
        if role is None:
            continue
        calls = ()
        canon_calls = None
        a, ln = so[S_TOOL_CALLS][i], so[S_TOOL_CALLS][i + 1] - so[S_TOOL_CALLS][i]
        if not (ln == 2 and memcmp(sp[S_TOOL_CALLS] + a, b"[]", 2) == 0):
            got = _calls_of(sp[S_TOOL_CALLS] + a, ln)
            if got is None:
                got = calls_read(PyBytes_FromStringAndSize(<const char *>sp[S_TOOL_CALLS] + a, ln))
                if got is None:
                    continue
            calls, canon_calls = got
        # the canonical JSON, keys sorted (the digest's input, schema.record_digest)
        b.n = 0
        _raw(b, '{"channel_id":', 14)
        _jstr(b, sp[S_CHANNEL] + so[S_CHANNEL][i], so[S_CHANNEL][i + 1] - so[S_CHANNEL][i])
        _raw(b, ',"content":', 11)
        _jstr(b, sp[S_CONTENT] + so[S_CONTENT][i], so[S_CONTENT][i + 1] - so[S_CONTENT][i])
        _raw(b, ',"hlc":', 7)
        _jstr(b, sp[S_HLC] + so[S_HLC][i], so[S_HLC][i + 1] - so[S_HLC][i])
        _raw(b, ',"msg_id":', 10)
        _jstr(b, sp[S_MSG_ID] + so[S_MSG_ID][i], so[S_MSG_ID][i + 1] - so[S_MSG_ID][i])
        _raw(b, ',"origin":', 10)
        _jstr(b, sp[S_ORIGIN] + so[S_ORIGIN][i], so[S_ORIGIN][i + 1] - so[S_ORIGIN][i])
        _raw(b, ',"role":', 8)
        _jstr(b, sp[S_ROLE] + so[S_ROLE][i], so[S_ROLE][i + 1] - so[S_ROLE][i])
        _raw(b, ',"schema_version":', 18)
        _jint(b, v[i])
        _raw(b, ',"task_id":', 11)
        _jstr(b, sp[S_TASK] + so[S_TASK][i], so[S_TASK][i + 1] - so[S_TASK][i])
        _raw(b, ',"token_estimate":', 18)
        _jint(b, tk[i])
        _raw(b, ',"tool_call_id":', 16)
        _jstr(b, sp[S_TOOL_CALL_ID] + so[S_TOOL_CALL_ID][i],
              so[S_TOOL_CALL_ID][i + 1] - so[S_TOOL_CALL_ID][i])
        _raw(b, ',"tool_calls":', 14)
        if canon_calls is None:
            _raw(b, "[]", 2)
        else:
            _raw(b, PyBytes_AS_STRING(canon_calls), PyBytes_GET_SIZE(canon_calls))
        _raw(b, ',"ts":', 6)
        # repr(ts): rf_float_repr where it decides it (a time of the epoch,
        # ~0.3 us less than dtoa's bignums), else dtoa as repr() itself
        ln = rf_float_repr(t[i], fts)
        if ln >= 0:
            _raw(b, fts, ln)
        else:
            tsr = PyOS_double_to_string(t[i], c'r', 0, Py_DTSF_ADD_DOT_0, NULL)
            try:
                _raw(b, tsr, <Py_ssize_t>strlen(tsr))
            finally:
                PyMem_Free(tsr)
        _raw(b, "}", 1)
        h = _xxh.XXH3_128bits(b.p, <size_t>b.n)
        rf_write_hex16(h.high64, hexd)
        rf_write_hex16(h.low64, hexd + 16)
        if memcmp(hexd, sp[S_DIGEST] + so[S_DIGEST][i], 32) != 0:
            continue        # damage, or a spelling this path does not make: the caller decides
        if canon is not None:
            canon[i] = PyBytes_FromStringAndSize(<const char *>b.p, b.n)
        try:
            for k in range(7):
                a, ln = so[_FIELD_COL[k]][i], so[_FIELD_COL[k]][i + 1] - so[_FIELD_COL[k]][i]
                if k == F_TASK and task_p != NULL:
                    vals[k] = task
                elif k == F_CHANNEL:
                    vals[k] = prev_ch = _same_or_new(prev_ch, sp[S_CHANNEL] + so[S_CHANNEL][prev_ch_i],
                                                     so[S_CHANNEL][prev_ch_i + 1] - so[S_CHANNEL][prev_ch_i],
                                                     sp[S_CHANNEL] + a, ln)
                    prev_ch_i = i
                elif k == F_ORIGIN:
                    vals[k] = prev_origin = _same_or_new(
                        prev_origin, sp[S_ORIGIN] + so[S_ORIGIN][prev_origin_i],
                        so[S_ORIGIN][prev_origin_i + 1] - so[S_ORIGIN][prev_origin_i], sp[S_ORIGIN] + a, ln)
                    prev_origin_i = i
                else:
                    vals[k] = PyUnicode_DecodeUTF8(<const char *>sp[_FIELD_COL[k]] + a, ln, NULL)
        except UnicodeDecodeError:
            continue
        if direct:
            rec = rf_pages_blank(record_type)
            at = <PyObject **>(<char *><void *>rec + _HEAD)
            for k in range(7):
                _put(at, lay, k, vals[k])
            _put(at, lay, F_TS, PyFloat_FromDouble(t[i]))
            _put(at, lay, F_ROLE, role)
            _put(at, lay, F_TOK, PyLong_FromLongLong(tk[i]))
            _put(at, lay, F_CALLS, calls)
        else:
            rec = record_type.__new__(record_type)
            for k in range(7):
                PyObject_GenericSetAttr(rec, _FIELDS[k], vals[k])
            PyObject_GenericSetAttr(rec, "ts", PyFloat_FromDouble(t[i]))
            PyObject_GenericSetAttr(rec, "role", role)
            PyObject_GenericSetAttr(rec, "token_estimate", PyLong_FromLongLong(tk[i]))
            PyObject_GenericSetAttr(rec, "tool_calls", calls)
        if untrack and canon_calls is None:
            PyObject_GC_UnTrack(<void *>rec)
        ordv = PyLong_FromLongLong(od[i])
        if pairs:
            out[i] = (rec, ordv)
            continue
        ords_out[i] = ordv
        if not keyed:
            out[i] = rec
            continue
        if so[S_HLC][i + 1] > so[S_HLC][i]:
            key = (_ONE, vals[F_HLC], vals[F_MSG_ID])
        else:
            key = (_ZERO, ordv, "")
        pair = (key, rec)
        # (a key of str and int, and a pair of it and an untracked record,
        # hold no container: out of the collector's walks, as the records
        # are; each young collection of a task read walked all of them)
        PyObject_GC_UnTrack(<void *>key)
        if not PyObject_GC_IsTracked(rec):
            PyObject_GC_UnTrack(<void *>pair)
        out[i] = pair
    return out if pairs else (out, ords_out)


cdef tuple _NO_ARGS = ()


def search_hits(type hit_type, list recs, list tiers):
    """``[hit_type(record=r, tier=t) for r, t in zip(recs, tiers)]``, each
    made without its ``__init__`` (its two fields set as a frozen
    dataclass's ``__init__`` sets them), and left out of the cyclic
    collector's walks when its record is (a record of str, float and int
    fields, see records_from_columns): such a hit holds no container, so
    no reference cycle can pass through it. A search that returns hundreds
    of thousands of hits then leaves nothing for each full collection to
    walk (each walked them all: a third of a common needle's search)."""
    cdef Py_ssize_t i, n = len(recs)
    cdef list out = [None] * n
    cdef object hit, rec
    cdef PyTypeObject *tp = <PyTypeObject *>hit_type
    if len(tiers) != n:
        raise ValueError("search_hits: a tier for each record")
    if tp.tp_new == NULL:
        raise TypeError(f"search_hits: {hit_type!r} cannot be made")
    for i in range(n):
        rec = recs[i]
        hit = tp.tp_new(hit_type, <PyObject *>_NO_ARGS, NULL)     # (hit_type.__new__(hit_type))
        PyObject_GenericSetAttr(hit, "record", rec)
        PyObject_GenericSetAttr(hit, "tier", tiers[i])
        if not PyObject_GC_IsTracked(rec):
            PyObject_GC_UnTrack(<void *>hit)
        out[i] = hit
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
def chunk_pages_mem(const unsigned char[::1] mem, int64_t base, int64_t offset, int64_t total, int64_t rows,
                    int codec):
    """:func:`chunk_pages` of a column chunk whose bytes were read already:
    ``mem`` holds the file's bytes from offset ``base`` on (a row group's
    span, read in one ``pread``). Same answer, same errors; a chunk that
    is not wholly in ``mem`` raises ValueError."""
    cdef list firsts = [], pages = []
    cdef int64_t end, pos = offset, first = 0
    cdef int64_t h[7]
    cdef int kind
    cdef Py_ssize_t n = mem.shape[0]
    cdef const unsigned char *p = &mem[0] if n else NULL
    if offset < 0 or total < 0 or rows < 0 or total > INT64_MAX - offset:
        raise ValueError(f"column chunk at offset {offset}: {total} bytes, {rows} values")
    end = offset + total
    if offset < base or end > base + n:
        raise ValueError(f"column chunk at offset {offset} ({total} bytes) is not in the {n} bytes "
                         f"read at {base}")
    while pos < end:
        try:
            _header(p, <Py_ssize_t>(end - base), <Py_ssize_t>(pos - base), h)
        except ValueError as exc:
            raise ValueError(f"page header at offset {pos}: {exc}") from None
        kind = _check_page(h, pos, end, rows, first, codec, len(pages),
                           len(pages) > 0 and _kind(pages[0][5]) == K_DICT)
        firsts.append(first)
        pages.append((first, pos + h[0], h[3], h[2], h[4], _flags(codec, kind), h[5]))
        if kind != K_DICT:
            first += h[5]
        pos += h[0] + h[3]
    if pos != end or first != rows:
        raise ValueError(f"column chunk at offset {offset} holds {first} values "
                         f"in {pos - offset} bytes, expected {rows} in {total}")
    return firsts, pages


# ---------------------------------------------------------------- rows of a row group
#
# PageReader.take's loop (a cool read's rows of one row group, column by
# column) in one call: find the pages holding the rows in the group's packed
# directory, read each run of adjacent pages once, check each page's CRC-32
# and decompress it (without the GIL: zlib's crc32, the system's libzstd
# opened at the first call; without libzstd, the zstd callable given), and
# gather just the rows' values. Every failure is a ValueError naming the page's offset (the caller
# turns it into PageError); nothing here is served without the row digest
# check that follows (records_from_columns).

cdef int64_t _frame_size(bytes comp) noexcept:
    """The content size the header of the zstd frame ``comp`` declares, or
    -1 (not a frame, no size in its header, a header cut short). A page
    whose frame declares the size its page header says is decompressed
    without ``max_output_size``: zstandard then takes its one-shot path
    (~8% of a point read's zstd time; the size is still checked after)."""
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(comp)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(comp), pos, k, i
    cdef int fhd, fcs
    cdef uint64_t v = 0
    cdef int did_bytes[4]
    cdef int fcs_bytes[4]
    did_bytes[:] = [0, 1, 2, 4]
    fcs_bytes[:] = [0, 2, 4, 8]
    if n < 6 or p[0] != 0x28 or p[1] != 0xB5 or p[2] != 0x2F or p[3] != 0xFD:
        return -1
    fhd = p[4]
    # window descriptor unless single segment, then the dictionary id
    pos = 5 + (0 if fhd & 0x20 else 1) + did_bytes[fhd & 3]
    fcs = fhd >> 6
    k = (1 if fhd & 0x20 else 0) if fcs == 0 else fcs_bytes[fcs]
    if k == 0 or pos + k > n:
        return -1
    for i in range(k - 1, -1, -1):
        v = (v << 8) | p[pos + i]
    if k == 2:
        v += 256
    return <int64_t>v if v <= <uint64_t>INT64_MAX else -1


# ---------------------------------------------------------------- encoded pages
#
# The cool files store their low-cardinality columns dictionary-encoded
# (a dictionary page of PLAIN values, then data pages of indices in the
# RLE/bit-packed hybrid) and their integer columns DELTA_BINARY_PACKED,
# both uncompressed: a point read then decodes a few bytes instead of
# decompressing a zstd page of ~4 KB per column. These decode such pages
# (the Parquet format's definitions) for take_rows; every malformed input
# is a ValueError, never a read out of bounds.

cdef inline uint64_t _bits(const unsigned char *p, Py_ssize_t nbytes, uint64_t bitpos, int bw) noexcept nogil:
    """The ``bw``-bit value (bw <= 64) at bit ``bitpos`` of ``p``, packed
    least significant bit first; the caller checks ``bitpos + bw`` bits lie
    within ``nbytes`` bytes."""
    cdef Py_ssize_t at = <Py_ssize_t>(bitpos >> 3), t
    cdef int sh = <int>(bitpos & 7)
    cdef uint64_t acc = 0, v
    if bw == 0:
        return 0
    if at + 8 <= nbytes:
        memcpy(&acc, p + at, 8)
    else:
        for t in range(nbytes - at):
            acc |= (<uint64_t>p[at + t]) << (8 * t)
    v = acc >> sh
    if sh + bw > 64:
        v |= (<uint64_t>p[at + 8]) << (64 - sh)
    if bw < 64:
        v &= ((<uint64_t>1) << bw) - 1
    return v


cdef int _uleb(const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos, uint64_t *out,
               const char **why) noexcept nogil:
    """The varint at ``pos[0]`` into ``out`` (``pos`` moved past it); -1
    and ``why`` if it runs past ``n`` or is too long."""
    cdef uint64_t r = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos[0] >= n:
            why[0] = "encoded page ends inside a varint"
            return -1
        b = p[pos[0]]
        pos[0] += 1
        r |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = r
            return 0
        shift += 7
        if shift > 63:
            why[0] = "varint too long in an encoded page"
            return -1


cdef int _rle_indices(const unsigned char *p, Py_ssize_t n, Py_ssize_t count, uint32_t *out,
                      const char **why) noexcept nogil:
    """The first ``count`` dictionary indices of a v1 RLE_DICTIONARY data
    page's bytes ``p[:n]`` (its bit width, then RLE and bit-packed runs)."""
    cdef Py_ssize_t pos = 1, got = 0, k, take, nbytes, width, t
    cdef uint64_t h, groups, rep
    cdef uint32_t v
    cdef int bw
    if n < 1:
        why[0] = "dictionary-index page is empty"
        return -1
    bw = p[0]
    if bw > 32:
        why[0] = "dictionary-index page has a bit width above 32"
        return -1
    width = (bw + 7) >> 3
    while got < count:
        if _uleb(p, n, &pos, &h, why) < 0:
            return -1
        if h & 1:
            groups = h >> 1
            if groups == 0 or groups > <uint64_t>(n - pos):
                why[0] = "bit-packed run runs past its page"
                return -1
            nbytes = <Py_ssize_t>groups * bw
            if nbytes > n - pos:
                why[0] = "bit-packed run runs past its page"
                return -1
            take = min(<Py_ssize_t>groups * 8, count - got)
            for k in range(take):
                out[got + k] = <uint32_t>_bits(p + pos, nbytes, <uint64_t>k * bw, bw)
            got += take
            pos += nbytes
        else:
            rep = h >> 1
            if rep == 0 or width > n - pos:
                why[0] = "RLE run is empty or runs past its page"
                return -1
            v = 0
            for t in range(width):
                v |= (<uint32_t>p[pos + t]) << (8 * t)
            pos += width
            take = <Py_ssize_t>min(rep, <uint64_t>(count - got))
            for k in range(take):
                out[got + k] = v
            got += take
    return 0


cdef int _delta_values(const unsigned char *p, Py_ssize_t n, Py_ssize_t count, int64_t nvals, int w,
                       unsigned char *out, const char **why) noexcept nogil:
    """The first ``count`` values of a DELTA_BINARY_PACKED page's bytes
    ``p[:n]`` (whose header says ``nvals``), as ``w``-byte little-endian
    integers (4 or 8) into ``out``. Arithmetic wraps, as the format's."""
    cdef Py_ssize_t pos = 0, got, m, k, take, mbytes, avail
    cdef uint64_t block, minis, total, zz, last, md, per, mask, bit, acc = 0
    cdef uint32_t v32
    cdef int bw
    cdef const unsigned char *widths
    if _uleb(p, n, &pos, &block, why) < 0:
        return -1
    if _uleb(p, n, &pos, &minis, why) < 0:
        return -1
    if _uleb(p, n, &pos, &total, why) < 0:
        return -1
    if _uleb(p, n, &pos, &zz, why) < 0:
        return -1
    if (block == 0 or block % 128 or minis == 0 or block % minis or (block // minis) % 32
            or block > 1 << 20 or <int64_t>total != nvals or count > nvals):
        why[0] = "DELTA_BINARY_PACKED header does not hold together"
        return -1
    per = block // minis
    last = (zz >> 1) ^ (-(zz & 1))
    got = 0

    if count > 0:
        if w == 8:
            memcpy(out, &last, 8)
        else:
            v32 = <uint32_t>last
            memcpy(out, &v32, 4)
        got = 1
    while got < count:
        if _uleb(p, n, &pos, &zz, why) < 0:
            return -1
        md = (zz >> 1) ^ (-(zz & 1))
        if <uint64_t>(n - pos) < minis:
            why[0] = "DELTA_BINARY_PACKED block ends inside its bit widths"
            return -1
        widths = p + pos
        pos += <Py_ssize_t>minis
        for m in range(<Py_ssize_t>minis):
            if got >= count:
                break
            bw = widths[m]
            if bw > 64:
                why[0] = "DELTA_BINARY_PACKED miniblock of a bit width above 64"
                return -1
            mbytes = <Py_ssize_t>(per * bw // 8)
            avail = min(mbytes, n - pos)
            take = <Py_ssize_t>min(per, <uint64_t>(count - got))
            if <uint64_t>take * bw > <uint64_t>avail * 8:
                why[0] = "DELTA_BINARY_PACKED miniblock runs past its page"
                return -1
            if bw <= 56 and w == 8:
                # (the common case in one tight loop: an 8-byte load a value)
                mask = ((<uint64_t>1) << bw) - 1
                for k in range(take):
                    bit = <uint64_t>k * bw
                    if (bit >> 3) + 8 <= avail:
                        memcpy(&acc, p + pos + (bit >> 3), 8)
                        last = last + md + ((acc >> (bit & 7)) & mask)
                    else:
                        last = last + md + _bits(p + pos, avail, bit, bw)
                    memcpy(out + 8 * (got + k), &last, 8)
            else:
                for k in range(take):
                    last = last + md + _bits(p + pos, avail, <uint64_t>k * bw, bw)
                    if w == 8:
                        memcpy(out + 8 * (got + k), &last, 8)
                    else:
                        v32 = <uint32_t>last
                        memcpy(out + 4 * (got + k), &v32, 4)
            got += take
            pos += mbytes
    return 0


def decode_rle_indices(bytes page, Py_ssize_t count):
    """The first ``count`` indices of a dictionary-index page's bytes, as a
    list (tests; take_rows decodes in place)."""
    cdef bytes buf = PyBytes_FromStringAndSize(NULL, max(count, 1) * 4)
    cdef uint32_t *o = <uint32_t *>PyBytes_AS_STRING(buf)
    cdef const char *why = NULL
    if _rle_indices(<const unsigned char *>PyBytes_AS_STRING(page), PyBytes_GET_SIZE(page), count, o, &why) < 0:
        raise ValueError(why.decode())
    return [o[k] for k in range(count)]


def decode_delta(bytes page, Py_ssize_t count, int64_t nvals, int w=8):
    """The first ``count`` values of a DELTA_BINARY_PACKED page's bytes
    (whose header says ``nvals``) as ``w``-byte little-endian integers
    (tests; take_rows decodes in place)."""
    if w != 4 and w != 8:
        raise ValueError("decode_delta: w is 4 or 8")
    cdef bytes buf = PyBytes_FromStringAndSize(NULL, count * w)
    cdef const char *why = NULL
    if _delta_values(<const unsigned char *>PyBytes_AS_STRING(page), PyBytes_GET_SIZE(page), count, nvals, w,
                     <unsigned char *>PyBytes_AS_STRING(buf), &why) < 0:
        raise ValueError(why.decode())
    return buf


cdef enum:
    # a point read of one row (take_rows of one row) reads the pages of
    # its columns in runs: pages of different columns at most GAP_BYTES
    # apart share one pread (the small columns' chunks lie side by side:
    # ~15 reads a row become ~8), a run at most RUN_BYTES long
    GAP_BYTES = 4096
    RUN_BYTES = 64 * 1024
    # a page said to unpack to more is not fetched ahead (read alone: its
    # size is then checked against what it decompresses to)
    MAX_PAGE = 16 << 20


cdef inline Py_ssize_t _page_at_p(const int64_t *firsts, Py_ssize_t lo, Py_ssize_t n, int64_t row) noexcept nogil:
    """The last of the ``n`` pages from ``lo`` whose first row is at most
    ``row`` (0 if none is): a binary search of their first rows."""
    cdef Py_ssize_t a = 0, hi = n - 1, mid
    while a < hi:
        mid = (a + hi + 1) // 2
        if firsts[lo + mid] <= row:
            a = mid
        else:
            hi = mid - 1
    return a


cdef inline Py_ssize_t _page_at(const int64_t[::1] firsts, Py_ssize_t lo, Py_ssize_t n, int64_t row) noexcept:
    """_page_at_p of a memoryview."""
    return _page_at_p(&firsts[0], lo, n, row) if n > 1 else 0


cdef list _row_runs(int fd, const int64_t[::1] counts, const int64_t[::1] starts, const int64_t[::1] flat,
                    const int64_t[::1] firsts, object cols, int64_t row):
    """The bytes of the pages holding ``row`` in each column of ``cols``,
    read in runs (see GAP_BYTES): ``[(file offset, bytes), ...]``. A column
    whose directory entry looks wrong is left out (take_rows's own checks
    then name it when it reads it alone)."""
    cdef Py_ssize_t ncols = counts.shape[0], npg = firsts.shape[0], nc = 0, i, t, lo, n, a, c
    cdef int64_t off, sz, rlo, rhi
    cdef list runs = []
    cdef bytes buf
    cdef int64_t *offs
    cdef int64_t *ends
    cdef list sel = list(range(ncols)) if cols is None else list(cols)
    cdef list want = []
    offs = <int64_t *>malloc((2 * len(sel) + 1) * sizeof(int64_t))
    ends = <int64_t *>malloc((2 * len(sel) + 1) * sizeof(int64_t))
    if offs == NULL or ends == NULL:
        free(offs); free(ends)
        raise MemoryError()
    try:
        for c in sel:
            if not 0 <= c < ncols:
                continue
            lo, n = starts[c], counts[c]
            if n <= 0 or lo < 0 or lo + n > npg or row < firsts[lo]:
                continue
            a = _page_at(firsts, lo, n, row)
            want.append(lo + a)
            if _kind(flat[7 * (lo + a) + 5]) == K_RLE_DICT:
                want.append(lo)         # (its dictionary page: the chunk's first)
        for a in want:
            off, sz = flat[7 * a + 1], flat[7 * a + 2]
            if off < 0 or sz < 0 or sz > RUN_BYTES or off > INT64_MAX - sz:
                continue
            # insertion by offset (a row's columns are few)
            i = nc
            while i > 0 and offs[i - 1] > off:
                offs[i], ends[i] = offs[i - 1], ends[i - 1]
                i -= 1
            offs[i], ends[i] = off, off + sz
            nc += 1
        t = 0
        while t < nc:
            rlo, rhi = offs[t], ends[t]
            t += 1
            while t < nc and rhi <= offs[t] <= rhi + GAP_BYTES and ends[t] - rlo <= RUN_BYTES:
                rhi = ends[t]
                t += 1
            buf = PyBytes_FromStringAndSize(NULL, rhi - rlo)
            if rhi > rlo:
                _read_at(fd, <unsigned char *>PyBytes_AS_STRING(buf), rhi - rlo, rlo)
            runs.append((rlo, buf))
    finally:
        free(offs)
        free(ends)
    return runs



cdef list _rows_pages(const int64_t[::1] counts, const int64_t[::1] starts, const int64_t[::1] flat,
                      const int64_t[::1] firsts, object cols, const int64_t[::1] rows):
    """The directory indices of the pages holding ``rows`` (ascending) in
    each column of ``cols`` (None: all), and of the dictionary page of a
    column whose page of rows holds dictionary indices, each once (a
    column asked twice: its pages twice). A column whose
    directory entry looks wrong is left out (take_rows's own checks then
    name it when it reads it alone)."""
    cdef Py_ssize_t ncols = counts.shape[0], npg = firsts.shape[0], m = rows.shape[0], lo, n, a, i
    cdef Py_ssize_t last, c
    cdef list want = []
    for c in (range(ncols) if cols is None else cols):
        if not 0 <= c < ncols:
            continue
        lo, n = starts[c], counts[c]
        if n <= 0 or lo < 0 or lo + n > npg or rows[0] < firsts[lo]:
            continue
        a = _page_at(firsts, lo, n, rows[0])
        last = -1
        for i in range(m):
            while a + 1 < n and firsts[lo + a + 1] <= rows[i]:
                a += 1
            if a != last:
                want.append(lo + a)
                if last == -1 and _kind(flat[7 * (lo + a) + 5]) == K_RLE_DICT:
                    want.append(lo)         # (its dictionary page: the chunk's first)
                last = a
    return want


cdef bint _fetchable(int64_t off, int64_t sz, int64_t us, int64_t flags) noexcept:
    return (0 <= off <= INT64_MAX - sz and 0 <= sz <= RUN_BYTES and 0 <= us <= MAX_PAGE
            and (_codec(flags) != C_NONE or us == sz))


cdef dict _fetch_pages(int fd, const int64_t[::1] flat, list want):
    """Pages ``want`` (directory indices, each once: :func:`_rows_pages`)
    fetched by :func:`_fetch_rows`: ``{index: page bytes}``. A page whose
    directory entry looks wrong is left out (the caller reads it alone,
    which names it)."""
    cdef list keep = []
    cdef int64_t a
    for a in want:
        if _fetchable(flat[7 * a + 1], flat[7 * a + 2], flat[7 * a + 3], flat[7 * a + 5]):
            keep.append(a)
    if not keep:
        return {}
    return dict(zip(keep, _fetch_rows(fd, page_fields(flat, keep))))


@cython.boundscheck(False)
@cython.wraparound(False)
def page_fields(const int64_t[::1] flat, list pages):
    """``[data offset, stored size, size, crc, flags]`` of the directory's
    ``pages`` (indices), a row each: what :func:`fetch_pages` reads."""
    cdef Py_ssize_t n = len(pages), i, j, npg = flat.shape[0] // 7
    out = np.empty((n, 5), dtype=np.int64)
    cdef int64_t[:, ::1] o = out
    for i in range(n):
        j = pages[i]
        if not 0 <= j < npg:
            raise ValueError(f"page_fields: no page {j}")
        o[i, 0], o[i, 1], o[i, 2], o[i, 3], o[i, 4] = (flat[7 * j + 1], flat[7 * j + 2], flat[7 * j + 3],
                                                       flat[7 * j + 4], flat[7 * j + 5])
    return out

@cython.boundscheck(False)
@cython.wraparound(False)
def fetch_pages(int fd, const int64_t[:, ::1] pages):
    """The pages described by the rows of ``pages`` (``[data offset,
    stored size, size, crc, flags]``, the directory's fields 1-5), read,
    CRC-32 checked and decompressed without the GIL (:func:`_fetch_rows`):
    their bytes, in the rows' order. Only with the system's libzstd
    (:func:`zstd_direct`). ValueError naming a page whose fields look wrong
    or that fails its checks; OSError if a read fails."""
    cdef Py_ssize_t i
    if not rf_zstd_ready():
        raise ValueError("fetch_pages: no libzstd")
    if pages.shape[1] != 5:
        raise ValueError("fetch_pages: 5 fields a page")
    for i in range(pages.shape[0]):
        if not _fetchable(pages[i, 0], pages[i, 1], pages[i, 2], pages[i, 4]):
            raise ValueError(f"page at offset {pages[i, 0]} has fields {list(pages[i])}")
    return _fetch_rows(fd, pages)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef list _fetch_rows(int fd, const int64_t[:, ::1] pf):
    """Pages (rows of ``[offset, stored size, size, crc, flags]``, fields
    :func:`_fetchable`) read in runs (pages at most GAP_BYTES apart share one
    pread, a run at most RUN_BYTES long), each CRC-32 checked and, when
    compressed, decompressed by libzstd to its size, all in one stretch
    without the GIL: their bytes in the rows' order. ValueError naming the
    first page (by offset) that fails its CRC or size or does not
    decompress; OSError if a read fails."""
    cdef Py_ssize_t n = pf.shape[0], i, t, nr = 0, bad = -1, code = FP_OK, a
    cdef int64_t off, sz, total = 0, rlo, rhi
    cdef Py_ssize_t *js = NULL
    cdef int64_t *run_lo = NULL
    cdef Py_ssize_t *run_of = NULL
    cdef int64_t *run_at = NULL
    cdef char **dst = NULL
    cdef unsigned char *buf = NULL
    cdef const unsigned char *p
    cdef const unsigned char *page
    cdef Py_ssize_t got = 0, r, e = 0
    cdef long long zgot = 0
    cdef const char *zerr = NULL
    cdef list keep = []
    cdef bytes b
    js = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
    run_lo = <int64_t *>malloc((n + 1) * sizeof(int64_t))
    run_at = <int64_t *>malloc((n + 1) * sizeof(int64_t))
    run_of = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
    dst = <char **>malloc((n + 1) * sizeof(char *))
    try:
        if js == NULL or run_lo == NULL or run_at == NULL or run_of == NULL or dst == NULL:
            raise MemoryError()
        for i in range(n):
            b = PyBytes_FromStringAndSize(NULL, pf[i, 2])
            keep.append(b)
            dst[i] = PyBytes_AS_STRING(b)
        with nogil:
            # the rows by offset (insertion, from an order that is mostly sorted already)
            for i in range(n):
                t = i
                while t > 0 and pf[js[t - 1], 0] > pf[i, 0]:
                    js[t] = js[t - 1]
                    t -= 1
                js[t] = i
            # runs, and where each starts in one buffer
            i = 0
            while i < n:
                rlo = pf[js[i], 0]
                rhi = rlo + pf[js[i], 1]
                run_of[i] = nr
                i += 1
                while i < n and rlo <= pf[js[i], 0] <= rhi + GAP_BYTES and pf[js[i], 0] + pf[js[i], 1] - rlo <= RUN_BYTES:
                    if pf[js[i], 0] + pf[js[i], 1] > rhi:
                        rhi = pf[js[i], 0] + pf[js[i], 1]
                    run_of[i] = nr
                    i += 1
                run_lo[nr] = rlo
                run_at[nr] = total
                total += rhi - rlo
                nr += 1
            run_at[nr] = total
            buf = <unsigned char *>malloc(total + 1)
            if buf == NULL:
                code = FP_NOMEM
            for r in range(nr):
                if code != FP_OK:
                    break
                got = 0
                sz = run_at[r + 1] - run_at[r]
                while got < sz:
                    e = pread(fd, buf + run_at[r] + got, <size_t>(sz - got), run_lo[r] + got)
                    if e < 0 and errno == EINTR:
                        continue
                    if e <= 0:
                        e = errno if e < 0 else 0
                        code = FP_READ
                        bad = r
                        break
                    got += e
            i = 0
            while code == FP_OK and i < n:
                a = js[i]
                p = buf + run_at[run_of[i]] + (pf[a, 0] - run_lo[run_of[i]])
                code = _check_unpack(p, pf[a, 1], <uint32_t>pf[a, 3], _here(pf[a, 4], 1),
                                     <unsigned char *>dst[a], pf[a, 2], &page, &zgot, &zerr)
                if code != FP_OK:
                    bad = a
                elif _codec(pf[a, 4]) == C_NONE:
                    memcpy(dst[a], p, pf[a, 1])
                i += 1
        if code == FP_NOMEM:
            raise MemoryError()
        if code == FP_READ:
            if e:
                raise OSError(e, os.strerror(e))
            raise ValueError(f"{run_at[bad + 1] - run_at[bad]} bytes at offset {run_lo[bad]} "
                             f"run past the end of the file")
        if code != FP_OK:
            _raise_page(code, pf[bad, 0], zgot, pf[bad, 2], zerr)
    finally:
        free(js); free(run_lo); free(run_at); free(run_of); free(dst); free(buf)
    return keep

def lz4_page(const unsigned char[::1] comp, Py_ssize_t usize):
    """The ``usize`` bytes the LZ4_RAW page ``comp`` decompresses to
    (without the GIL); ValueError saying how it does not (malformed, or
    another size). Only with the system's liblz4 (:func:`lz4_direct`)."""
    cdef long long got = 0
    cdef const char *err = NULL
    cdef bytes raw
    cdef char *dst
    if not rf_lz4_ready():
        raise ValueError("no liblz4 to decompress an LZ4_RAW page with")
    if usize < 0:
        raise ValueError(f"has a size of {usize} bytes")
    raw = PyBytes_FromStringAndSize(NULL, usize)
    dst = PyBytes_AS_STRING(raw)
    with nogil:
        got = rf_lz4_dec(dst, <size_t>usize, &comp[0] if comp.shape[0] else <const unsigned char *>"",
                         <size_t>comp.shape[0], &err)
    if got < 0:
        raise ValueError(f"does not decompress: {(<bytes>err).decode('utf-8', 'replace')}")
    if got != usize:
        raise ValueError(f"decompresses to {got} bytes, its header says {usize}")
    return raw


def zstd_frame_size(bytes comp):
    """The content size the header of the zstd frame ``comp`` declares, or
    -1 (not a frame, no size in its header, a header cut short): what
    :func:`take_rows` compares with a page's size."""
    return _frame_size(comp)


cdef object _run_bytes(int fd, object span, int64_t span_lo, int64_t off, int64_t size,
                       list runs=None):
    """``size`` bytes at file offset ``off``: sliced from ``span`` (the
    group's bytes read at ``span_lo``) or from one of ``runs`` (``(offset,
    bytes)``, :func:`_row_runs`) when it holds them, else read."""
    cdef bytes buf, rb
    cdef int64_t rlo
    cdef const unsigned char[::1] sp
    if runs is not None:
        for rlo, rb in runs:
            if rlo <= off and off - rlo + size <= PyBytes_GET_SIZE(rb):
                if rlo == off and size == PyBytes_GET_SIZE(rb):
                    return rb
                return PyBytes_FromStringAndSize(PyBytes_AS_STRING(rb) + (off - rlo), size)
    if span is not None:
        sp = span
        if span_lo <= off and off - span_lo + size <= sp.shape[0]:
            return PyBytes_FromStringAndSize(<const char *>&sp[0] + (off - span_lo), size)
    buf = PyBytes_FromStringAndSize(NULL, size)
    if size:
        _read_at(fd, <unsigned char *>PyBytes_AS_STRING(buf), size, off)
    return buf


cdef object _np_empty = np.empty
cdef object _I32 = np.dtype(np.int32)


cdef tuple _str_column(Py_ssize_t m, Py_ssize_t total, str who, Py_ssize_t c):
    """The ``(data, int32 offsets)`` of a string column of ``m`` values of
    ``total`` bytes, to be filled; ValueError from 2 GiB on."""
    if total >= 0x7FFFFFFF:
        raise ValueError(f"{who}: column {c} values hold 2 GiB or more")
    return PyBytes_FromStringAndSize(NULL, total), _np_empty(m + 1, _I32)


cdef inline Py_ssize_t _run_last(const Py_ssize_t *ks, Py_ssize_t q, Py_ssize_t nk) noexcept:
    """The last of the run of consecutive page numbers ``ks[q:]`` starts."""
    while q + 1 < nk and ks[q + 1] == ks[q] + 1:
        q += 1
    return q


cdef int _run_bounds(const int64_t[::1] flat, Py_ssize_t first, Py_ssize_t last, int64_t *base,
                     int64_t *stop) except -1:
    """Where the bytes of directory pages ``first`` to ``last`` (adjacent)
    start and end; ValueError if they do not hold together."""
    base[0] = flat[7 * first + 1]
    stop[0] = flat[7 * last + 1] + flat[7 * last + 2]
    if base[0] < 0 or stop[0] < base[0]:
        raise ValueError(f"page at offset {base[0]} is out of place")
    return 0


cdef bytes _checked_page(bytes run, int64_t at, const int64_t[::1] flat, Py_ssize_t j, object decompress):
    """Page ``j`` of a directory whose stored bytes are ``run[at:at +
    size]``: its CRC-32 checked and, when compressed, decompressed to its
    size -- both without the GIL when the system's libzstd is there
    (:func:`zstd_direct`; LZ4_RAW always), else through ``decompress``
    (``bytes`` or ``bytes, max_output_size=n``). ValueError naming the
    page's offset."""
    cdef int64_t off = flat[7 * j + 1], csize = flat[7 * j + 2], usize = flat[7 * j + 3]
    cdef const unsigned char *p
    cdef char *dst
    cdef const unsigned char *page
    cdef uint32_t crc
    cdef long long got = 0
    cdef int err
    cdef const char *zerr = NULL
    cdef bytes comp, raw
    if at < 0 or csize < 0 or usize < 0 or at + csize > PyBytes_GET_SIZE(run):
        raise ValueError(f"take_rows: page at offset {off} is out of place")
    p = <const unsigned char *>PyBytes_AS_STRING(run) + at
    crc = <uint32_t>flat[7 * j + 4]
    cdef int codec = _here(flat[7 * j + 5], rf_zstd_ready())
    if codec != C_NONE:
        raw = PyBytes_FromStringAndSize(NULL, usize)
        dst = PyBytes_AS_STRING(raw)
        with nogil:
            err = _check_unpack(p, csize, crc, codec, <unsigned char *>dst, usize, &page, &got, &zerr)
        _raise_page(err, off, got, usize, zerr)
        return raw
    with nogil:
        err = _check_unpack(p, csize, crc, C_NONE, NULL, 0, &page, &got, &zerr)
    _raise_page(err, off, got, usize, zerr)
    comp = run if at == 0 and csize == PyBytes_GET_SIZE(run) else \
        PyBytes_FromStringAndSize(<const char *>p, csize)
    if _codec(flat[7 * j + 5]) == C_NONE:
        return comp
    if _frame_size(comp) == usize:
        raw = decompress(comp)
    else:
        raw = decompress(comp, max_output_size=usize)
    _raise_page(FP_SIZE if PyBytes_GET_SIZE(raw) != usize else FP_OK, off, PyBytes_GET_SIZE(raw), usize, NULL)
    return raw


cdef bytes _page_bytes(int fd, object span, int64_t span_lo, list runs, const int64_t[::1] flat,
                       Py_ssize_t j, object decompress):
    """Page ``j`` of a directory read (from ``span`` or ``runs`` when they
    hold it), checked and decompressed (:func:`_checked_page`): what
    take_rows reads a page alone for (a dictionary page)."""
    cdef int64_t off = flat[7 * j + 1], csize = flat[7 * j + 2]
    if off < 0 or csize < 0:
        raise ValueError(f"take_rows: page at offset {off} is out of place")
    return _checked_page(_run_bytes(fd, span, span_lo, off, csize, runs), 0, flat, j, decompress)


@cython.boundscheck(False)
@cython.wraparound(False)
def take_rows(int fd, const int64_t[::1] counts, const int64_t[::1] starts, const int64_t[::1] flat,
              const int64_t[::1] firsts, object cols, const int64_t[::1] rows,
              const int64_t[::1] widths, object decompress, object span=None, int64_t span_lo=0,
              dict fetched=None):
    """The values of the rows ``rows`` (ascending, within the row group) of
    one row group, column by column (``cols``: these columns in this order,
    None for all): ``(data, int32 offsets)`` of a string column
    (``widths[c] == 0``), the values' little-endian bytes of a fixed-width
    one (``widths[c]`` bytes each) -- what ``PageReader.take`` returns.

    The directory is ``rune_fast.pages._pack_dir``'s: ``counts[c]`` pages
    of column c starting at page ``starts[c]``, page j's 7 fields at
    ``flat[7 * j:]`` (first row, data offset, compressed size, uncompressed
    size, crc, flags, values) and its first row at ``firsts[j]``; flags: 1
    if zstd-compressed, 128 if LZ4_RAW, plus the page's kind times 2 (:func:`page_kinds`:
    a PLAIN data page; the column's dictionary page, its first; a data page
    of dictionary indices; a DELTA_BINARY_PACKED one). Each page read is
    checked against its CRC-32 and, when compressed, decompressed
    (:func:`_checked_page`: both without the GIL where the system's libzstd
    is, else through ``decompress``); an encoded page's values are decoded
    up to the last row asked of it.
    ``fetched``: directory index -> the bytes of a page already read,
    checked and decompressed (:func:`fetch_pages`), taken instead of reading
    it. ``span``: the group's bytes read at ``span_lo`` (pages inside it are
    sliced from it). Without one, the pages of a single row are read in
    runs across columns first (:func:`_row_runs`). ValueError (naming the
    page's offset) for a row not
    in the group, a CRC mismatch, a page that decompresses to another size
    or whose values do not parse; OSError if a read fails."""
    cdef Py_ssize_t m = rows.shape[0], ncols = counts.shape[0], npg = flat.shape[0] // 7
    cdef Py_ssize_t i, j, q, u, lo, n, a, b, nk, w, total, cnt, ndict = 0, dk
    cdef int64_t base, end, off, csize, stop
    cdef Py_ssize_t *page_of
    cdef Py_ssize_t *ks
    cdef Py_ssize_t *vpos
    cdef uint32_t *vlen
    cdef Py_ssize_t *need
    cdef uint32_t ln
    cdef Py_ssize_t k = 0, pos = 0, plen = 0
    cdef int64_t pfirst = 0, nvals = 0
    cdef int kind
    cdef const unsigned char *pb = NULL
    cdef const unsigned char *db = NULL
    cdef const uint32_t *ix = NULL
    cdef Py_ssize_t *dpos = NULL
    cdef uint32_t *dlen = NULL
    cdef list out = [], raws, idxs, runs = None
    cdef bytes run, comp, raw, data, dict_raw, dict_at, got, idx
    cdef unsigned char *dp
    cdef int32_t[::1] ov
    cdef Py_ssize_t c
    cdef const char *why = NULL
    if m == 0:
        return out
    if starts.shape[0] != ncols or widths.shape[0] != ncols or firsts.shape[0] != npg:
        raise ValueError("take_rows: the directory's arrays do not agree")
    for i in range(1, m):
        if rows[i] <= rows[i - 1]:
            raise ValueError(f"take_rows: rows not ascending at {rows[i]}")
    page_of = <Py_ssize_t *>malloc(m * sizeof(Py_ssize_t))
    ks = <Py_ssize_t *>malloc(m * sizeof(Py_ssize_t))
    vpos = <Py_ssize_t *>malloc(m * sizeof(Py_ssize_t))
    vlen = <uint32_t *>malloc(m * sizeof(uint32_t))
    need = <Py_ssize_t *>malloc(m * sizeof(Py_ssize_t))
    if page_of == NULL or ks == NULL or vpos == NULL or vlen == NULL or need == NULL:
        free(page_of); free(ks); free(vpos); free(vlen); free(need)
        raise MemoryError()
    try:
        if fetched is None and span is None and rf_zstd_ready():
            # every page the rows need, read, checked and decompressed in one
            # stretch without the GIL (a search's scan threads run side by side)
            fetched = _fetch_pages(fd, flat, _rows_pages(counts, starts, flat, firsts, cols, rows))
        elif m == 1 and span is None:
            runs = _row_runs(fd, counts, starts, flat, firsts, cols, rows[0])
        for c in (range(ncols) if cols is None else cols):
            if not 0 <= c < ncols:
                raise ValueError(f"take_rows: no column {c}")
            lo, n, w = starts[c], counts[c], widths[c]
            if n <= 0 or lo < 0 or lo + n > npg:
                raise ValueError(f"take_rows: column {c} has no pages")
            end = flat[7 * (lo + n - 1)] + flat[7 * (lo + n - 1) + 6]
            if rows[0] < firsts[lo] or rows[m - 1] >= end:
                raise ValueError(f"rows {rows[0]}..{rows[m - 1]} are not all in the row group "
                                 f"(column {c})")
            # the page of each row: a binary search for the first, then forward
            a = _page_at(firsts, lo, n, rows[0])
            nk = 0
            for i in range(m):
                while a + 1 < n and firsts[lo + a + 1] <= rows[i]:
                    a += 1
                if nk == 0 or ks[nk - 1] != a:
                    ks[nk] = a
                    nk += 1
                page_of[i] = nk - 1
                need[nk - 1] = rows[i] - firsts[lo + a] + 1     # (an encoded page: decoded this far)
            # read, check and decompress each page once (a run of adjacent ones in one read)
            raws = []
            idxs = []
            dict_raw = None
            q = 0
            while q < nk:
                u = _run_last(ks, q, nk)
                _run_bounds(flat, lo + ks[q], lo + ks[u], &base, &stop)
                run = None
                for k in range(q, u + 1):
                    j = 7 * (lo + ks[k])
                    off, csize = flat[j + 1], flat[j + 2]
                    kind = _kind(flat[j + 5])
                    raw = None if fetched is None else fetched.get(lo + ks[k])
                    if raw is None:
                        if run is None:
                            run = _run_bytes(fd, span, span_lo, base, stop - base, runs)
                        raw = _checked_page(run, off - base, flat, lo + ks[k], decompress)
                    cnt = need[k]
                    if kind == K_PLAIN:
                        if w and PyBytes_GET_SIZE(raw) != w * flat[j + 6]:
                            raise ValueError(f"page at offset {off} holds {PyBytes_GET_SIZE(raw)} bytes "
                                             f"for {flat[j + 6]} values of {w}")
                        raws.append(raw)
                        idxs.append(None)
                    elif kind == K_DELTA:
                        if w != 4 and w != 8:
                            raise ValueError(f"page at offset {off}: DELTA_BINARY_PACKED values "
                                             f"of a column of {w}-byte values")
                        got = PyBytes_FromStringAndSize(NULL, cnt * w)
                        if _delta_values(<const unsigned char *>PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw),
                                         cnt, flat[j + 6], <int>w, <unsigned char *>PyBytes_AS_STRING(got),
                                         &why) < 0:
                            raise ValueError(f"page at offset {off}: {why.decode()}")
                        raws.append(got)
                        idxs.append(None)
                    elif kind == K_RLE_DICT:
                        if dict_raw is None:
                            # the column's dictionary: its first page
                            if _kind(flat[7 * lo + 5]) != K_DICT:
                                raise ValueError(f"page at offset {off} holds dictionary indices, "
                                                 f"its column no dictionary")
                            dict_raw = None if fetched is None else fetched.get(lo)
                            if dict_raw is None:
                                dict_raw = _page_bytes(fd, span, span_lo, runs, flat, lo, decompress)
                            ndict = flat[7 * lo + 6]
                            db = <const unsigned char *>PyBytes_AS_STRING(dict_raw)
                            if w:
                                if PyBytes_GET_SIZE(dict_raw) != w * ndict:
                                    raise ValueError(f"dictionary page at offset {flat[7 * lo + 1]} holds "
                                                     f"{PyBytes_GET_SIZE(dict_raw)} bytes for {ndict} values of {w}")
                            else:
                                # where each of its values starts, and its length
                                dict_at = PyBytes_FromStringAndSize(NULL, ndict * (sizeof(Py_ssize_t) + 4))
                                dpos = <Py_ssize_t *>PyBytes_AS_STRING(dict_at)
                                dlen = <uint32_t *>(dpos + ndict)
                                pos = 0
                                for dk in range(ndict):
                                    pos = _plain_skip(db, PyBytes_GET_SIZE(dict_raw), pos, dk, dk, &ln)
                                    if pos < 0:
                                        raise ValueError(f"dictionary page at offset {flat[7 * lo + 1]}: PLAIN "
                                                         f"page ends before value {dk} or a value runs past it")
                                    dpos[dk], dlen[dk] = pos, ln
                                    pos += ln
                        if cnt > flat[j + 6]:
                            raise ValueError(f"row {cnt - 1} is past the page at offset {off}")
                        idx = PyBytes_FromStringAndSize(NULL, cnt * 4)
                        ix = <const uint32_t *>PyBytes_AS_STRING(idx)
                        if _rle_indices(<const unsigned char *>PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw),
                                        cnt, <uint32_t *>ix, &why) < 0:
                            raise ValueError(f"page at offset {off}: {why.decode()}")
                        for dk in range(cnt):
                            if ix[dk] >= ndict:
                                raise ValueError(f"page at offset {off}: dictionary index {ix[dk]} "
                                                 f"of a dictionary of {ndict}")
                        if w:
                            got = PyBytes_FromStringAndSize(NULL, cnt * w)
                            dp = <unsigned char *>PyBytes_AS_STRING(got)
                            for dk in range(cnt):
                                memcpy(dp + dk * w, db + ix[dk] * w, w)
                            raws.append(got)
                            idxs.append(None)
                        else:
                            raws.append(dict_raw)
                            idxs.append(idx)
                    else:
                        raise ValueError(f"page at offset {off} is a dictionary page, "
                                         f"not a page of rows")
                q = u + 1
            if w:
                data = PyBytes_FromStringAndSize(NULL, m * w)
                dp = <unsigned char *>PyBytes_AS_STRING(data)
                for i in range(m):
                    raw = <bytes>raws[page_of[i]]
                    pfirst = flat[7 * (lo + ks[page_of[i]])]
                    memcpy(dp + i * w, PyBytes_AS_STRING(raw) + (rows[i] - pfirst) * w, w)
                out.append(data)
                continue
            # strings: walk each page's values up to the rows asked (rows
            # ascending), or look each row's index up in the dictionary
            total = 0
            b = -1
            for i in range(m):
                if page_of[i] != b:
                    b = page_of[i]
                    raw = <bytes>raws[b]
                    pb = <const unsigned char *>PyBytes_AS_STRING(raw)
                    plen = PyBytes_GET_SIZE(raw)
                    pfirst = flat[7 * (lo + ks[b])]
                    nvals = flat[7 * (lo + ks[b]) + 6]
                    ix = NULL if idxs[b] is None else <const uint32_t *>PyBytes_AS_STRING(<bytes>idxs[b])
                    k, pos = 0, 0
                if rows[i] - pfirst >= nvals:
                    raise ValueError(f"row {rows[i]} is past the page at offset {flat[7 * (lo + ks[b]) + 1]}")
                if ix != NULL:
                    vpos[i], vlen[i] = dpos[ix[rows[i] - pfirst]], dlen[ix[rows[i] - pfirst]]
                    total += vlen[i]
                    continue
                pos = _plain_skip(pb, plen, pos, k, rows[i] - pfirst, &ln)
                if pos < 0:
                    raise ValueError(f"page at offset {flat[7 * (lo + ks[b]) + 1]}: PLAIN page ends "
                                     f"before value {rows[i] - pfirst} or a value runs past it")
                k = rows[i] - pfirst
                vpos[i], vlen[i] = pos, ln
                total += ln
                pos += ln
                k += 1
            data, offs = _str_column(m, total, "take_rows", c)
            dp = <unsigned char *>PyBytes_AS_STRING(data)
            ov = offs
            total = 0
            ov[0] = 0
            for i in range(m):
                raw = <bytes>raws[page_of[i]]
                if vlen[i]:
                    memcpy(dp + total, PyBytes_AS_STRING(raw) + vpos[i], vlen[i])
                total += vlen[i]
                ov[i + 1] = total
            out.append((data, offs))
    finally:
        free(page_of)
        free(ks)
        free(vpos)
        free(vlen)
        free(need)
    return out


cdef struct _TGroup:
    const int64_t *counts
    const int64_t *starts
    const int64_t *flat
    const int64_t *firsts
    const int64_t *rows
    Py_ssize_t ncols, npg, m, at       # at: the group's first row in the outputs
    bint bad


cdef inline const int64_t *_i64p(object a, Py_ssize_t *n) except? NULL:
    cdef const int64_t[::1] v = a
    n[0] = v.shape[0]
    return &v[0] if v.shape[0] else NULL


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _take_col(_TGroup *g, Py_ssize_t c, Py_ssize_t w, const Py_ssize_t *slots, Py_ssize_t dslot,
                   const unsigned char **pp, const Py_ssize_t *pn, unsigned char *fixed,
                   const unsigned char **sp, uint32_t *sl, Py_ssize_t stride, Py_ssize_t ci) noexcept nogil:
    """Column ``c`` of group ``g``'s rows from its fetched pages (``slots``:
    each (row, column)'s page among ``pp``/``pn``; ``dslot``: the column's dictionary
    page, or -1): fixed-width values into ``fixed`` (``w`` bytes a row),
    strings as (pointer, length) pairs at ``sp``/``sl`` (``stride`` a row,
    column ``ci``). -1 where the pages do not hold the rows as the
    directory says (no exception: the caller reads the group alone, which
    names what is wrong)."""
    cdef Py_ssize_t lo = g.starts[c], i = 0, a, j, cnt, q, k = 0, pos = 0, plen, ndict = 0, dk
    cdef int64_t pfirst, nvals
    cdef int kind
    cdef uint32_t ln, ix
    cdef const unsigned char *pb
    cdef const unsigned char *db = NULL
    cdef Py_ssize_t dn = 0
    cdef unsigned char *scratch = NULL
    cdef Py_ssize_t *dpos = NULL
    cdef uint32_t *dlen = NULL
    cdef const char *why = NULL
    try:
        while i < g.m:
            # rows i..q-1 share a page
            q = i + 1
            while q < g.m and slots[(g.at + q) * stride + ci] == slots[(g.at + i) * stride + ci]:
                q += 1
            a = _page_at_p(g.firsts, lo, g.counts[c], g.rows[i])
            j = 7 * (lo + a)
            pfirst, nvals = g.flat[j], g.flat[j + 6]
            kind = _kind(g.flat[j + 5])
            pb, plen = pp[slots[(g.at + i) * stride + ci]], pn[slots[(g.at + i) * stride + ci]]
            cnt = g.rows[q - 1] - pfirst + 1
            if g.rows[i] < pfirst or cnt > nvals:
                return -1
            if kind == K_PLAIN and w:
                if plen != w * nvals:
                    return -1
                for k in range(i, q):
                    memcpy(fixed + (g.at + k) * w, pb + (g.rows[k] - pfirst) * w, w)
            elif kind == K_PLAIN:
                k, pos = 0, 0
                for dk in range(i, q):
                    pos = _plain_skip(pb, plen, pos, k, g.rows[dk] - pfirst, &ln)
                    if pos < 0:
                        return -1
                    sp[(g.at + dk) * stride + ci] = pb + pos
                    sl[(g.at + dk) * stride + ci] = ln
                    k = g.rows[dk] - pfirst + 1
                    pos += ln
            elif kind == K_DELTA:
                if w != 4 and w != 8:
                    return -1
                scratch = <unsigned char *>malloc(cnt * w)
                if scratch == NULL:
                    return -1
                if _delta_values(pb, plen, cnt, nvals, <int>w, scratch, &why) < 0:
                    return -1
                for k in range(i, q):
                    memcpy(fixed + (g.at + k) * w, scratch + (g.rows[k] - pfirst) * w, w)
                free(scratch)
                scratch = NULL
            elif kind == K_RLE_DICT:
                if dslot < 0 or _kind(g.flat[7 * lo + 5]) != K_DICT:
                    return -1
                if db == NULL:
                    db, dn, ndict = pp[dslot], pn[dslot], g.flat[7 * lo + 6]
                    if w and dn != w * ndict:
                        return -1
                    if not w:
                        dpos = <Py_ssize_t *>malloc((ndict + 1) * sizeof(Py_ssize_t))
                        dlen = <uint32_t *>malloc((ndict + 1) * sizeof(uint32_t))
                        if dpos == NULL or dlen == NULL:
                            return -1
                        pos = 0
                        for dk in range(ndict):
                            pos = _plain_skip(db, dn, pos, dk, dk, &ln)
                            if pos < 0:
                                return -1
                            dpos[dk], dlen[dk] = pos, ln
                            pos += ln
                scratch = <unsigned char *>malloc(cnt * 4)
                if scratch == NULL:
                    return -1
                if _rle_indices(pb, plen, cnt, <uint32_t *>scratch, &why) < 0:
                    return -1
                for k in range(i, q):
                    ix = (<uint32_t *>scratch)[g.rows[k] - pfirst]
                    if ix >= ndict:
                        return -1
                    if w:
                        memcpy(fixed + (g.at + k) * w, db + ix * w, w)
                    else:
                        sp[(g.at + k) * stride + ci] = db + dpos[ix]
                        sl[(g.at + k) * stride + ci] = dlen[ix]
                free(scratch)
                scratch = NULL
            else:
                return -1
            i = q
    finally:
        free(scratch)
        free(dpos)
        free(dlen)
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
def take_many(int fd, list dirs, list rowss, list cols, const int64_t[::1] widths):
    """:func:`take_rows` of many row groups of one file at once: group g's
    directory ``dirs[g]`` (``(counts, flat, firsts, starts)``, as
    ``PageReader`` keeps it) and rows ``rowss[g]`` (int64, ascending), the
    columns ``cols`` of each. Every page they need is read, CRC-32 checked
    and decompressed in one stretch without the GIL (:func:`_fetch_rows`),
    then the rows' values are found in them, also without the GIL: the
    search's scan threads read the hits of many groups while its own
    thread builds records. ``(columns, declined)``: ``columns`` as
    take_rows gives them, of the rows of every group but those in
    ``declined`` (their indices: a group whose directory, pages or values
    do not hold together; the caller reads it alone, which names the
    damage), one group after another.
    ValueError naming the page (by offset) for a page of the batch that
    fails its CRC or does not decompress; OSError if a read fails. Only
    with the system's libzstd (:func:`zstd_direct`)."""
    cdef Py_ssize_t G = len(dirs), nc = len(cols), gi, ci, c, i, a, n, last, ns = 0, R = 0, w, total
    cdef Py_ssize_t n1, n2, n3, n4, n5, k
    cdef _TGroup *gs = NULL
    cdef Py_ssize_t *slots = NULL          # (row, column) -> its page's slot
    cdef Py_ssize_t *dslots = NULL         # (group, column) -> its dictionary page's slot, or -1
    cdef const unsigned char **pp = NULL
    cdef Py_ssize_t *pn = NULL
    cdef unsigned char **fixed = NULL
    cdef const unsigned char **sp = NULL
    cdef uint32_t *sl = NULL
    cdef int64_t[:, ::1] fields
    cdef list want = [], pages, out, declined
    cdef bytes b, data
    cdef unsigned char *dp
    cdef int32_t[::1] ov
    cdef int64_t j
    cdef int *cs = NULL
    cdef _TGroup *g
    cdef object d
    if not rf_zstd_ready():
        raise ValueError("take_many: no libzstd")
    if len(rowss) != G:
        raise ValueError("take_many: a list of rows a group")
    try:
        gs = <_TGroup *>malloc((G + 1) * sizeof(_TGroup))
        dslots = <Py_ssize_t *>malloc((G * nc + 1) * sizeof(Py_ssize_t))
        cs = <int *>malloc((nc + 1) * sizeof(int))
        if gs == NULL or dslots == NULL or cs == NULL:
            raise MemoryError()
        for ci in range(nc):
            c = cols[ci]
            cs[ci] = <int>c
        for gi in range(G):
            d = dirs[gi]
            gs[gi].counts = _i64p(d[0], &n1)
            gs[gi].flat = _i64p(d[1], &n2)
            gs[gi].firsts = _i64p(d[2], &n3)
            gs[gi].starts = _i64p(d[3], &n4)
            gs[gi].rows = _i64p(rowss[gi], &n5)
            gs[gi].ncols, gs[gi].npg, gs[gi].m, gs[gi].at = n1, n3, n5, R
            gs[gi].bad = n4 != n1 or widths.shape[0] != n1 or n2 != 7 * n3
            R += n5
        slots = <Py_ssize_t *>malloc((R * nc + 1) * sizeof(Py_ssize_t))
        if slots == NULL:
            raise MemoryError()
        # which pages: each page of a column once, its dictionary page once
        for gi in range(G):
            g = &gs[gi]
            for i in range(1, g.m):
                if g.rows[i] <= g.rows[i - 1]:
                    g.bad = True
            for ci in range(nc):
                dslots[gi * nc + ci] = -1
                if g.bad or g.m == 0:
                    break
                c = cs[ci]
                if not 0 <= c < g.ncols:
                    g.bad = True
                    break
                a, n = g.starts[c], g.counts[c]
                if n <= 0 or a < 0 or a + n > g.npg or g.rows[0] < g.firsts[a] \
                        or g.rows[g.m - 1] >= g.flat[7 * (a + n - 1)] + g.flat[7 * (a + n - 1) + 6]:
                    g.bad = True
                    break
                if _kind(g.flat[7 * a + 5]) == K_DICT:
                    # (the chunk's first page: fetched in file order, before its data pages)
                    if not _fetchable(g.flat[7 * a + 1], g.flat[7 * a + 2], g.flat[7 * a + 3], g.flat[7 * a + 5]):
                        g.bad = True
                        break
                    want.append((gi, a))
                    dslots[gi * nc + ci] = ns
                    ns += 1
                last = -1
                for i in range(g.m):
                    k = a + _page_at_p(g.firsts, a, n, g.rows[i])
                    if k != last:
                        if not _fetchable(g.flat[7 * k + 1], g.flat[7 * k + 2], g.flat[7 * k + 3],
                                          g.flat[7 * k + 5]):
                            g.bad = True
                            break
                        want.append((gi, k))
                        ns += 1
                        last = k
                    slots[(g.at + i) * nc + ci] = ns - 1
                if g.bad:
                    break
        fields = np.empty((ns, 5), dtype=np.int64)
        for i in range(ns):
            gi, k = want[i]
            for a in range(5):
                fields[i, a] = gs[gi].flat[7 * k + 1 + a]
        pages = _fetch_rows(fd, fields) if ns else []
        pp = <const unsigned char **>malloc((ns + 1) * sizeof(char *))
        pn = <Py_ssize_t *>malloc((ns + 1) * sizeof(Py_ssize_t))
        fixed = <unsigned char **>malloc((nc + 1) * sizeof(char *))
        sp = <const unsigned char **>malloc((R * nc + 1) * sizeof(char *))
        sl = <uint32_t *>malloc((R * nc + 1) * sizeof(uint32_t))
        if pp == NULL or pn == NULL or fixed == NULL or sp == NULL or sl == NULL:
            raise MemoryError()
        for ci in range(nc):
            fixed[ci] = NULL
        for ci in range(nc):
            w = widths[cs[ci]] if 0 <= cs[ci] < widths.shape[0] else 0
            if w:
                fixed[ci] = <unsigned char *>malloc(R * w + 1)
                if fixed[ci] == NULL:
                    raise MemoryError()
        for i in range(ns):
            b = <bytes>pages[i]
            pp[i] = <const unsigned char *>PyBytes_AS_STRING(b)
            pn[i] = PyBytes_GET_SIZE(b)
        with nogil:
            for gi in range(G):
                g = &gs[gi]
                if g.bad or g.m == 0:
                    continue
                for ci in range(nc):
                    w = widths[cs[ci]]
                    if _take_col(g, cs[ci], w, slots, dslots[gi * nc + ci], pp, pn, fixed[ci], sp, sl,
                                 nc, ci) < 0:
                        g.bad = True
                        break
        # the accepted groups' rows, one after another, column by column
        declined = []
        good = 0
        for gi in range(G):
            if gs[gi].bad and gs[gi].m:
                declined.append(gi)
            else:
                good += gs[gi].m
        out = []
        for ci in range(nc):
            w = widths[cs[ci]] if 0 <= cs[ci] < widths.shape[0] else 0
            if w:
                data = PyBytes_FromStringAndSize(NULL, good * w)
                dp = <unsigned char *>PyBytes_AS_STRING(data)
                total = 0
                for gi in range(G):
                    g = &gs[gi]
                    if not g.bad and g.m:
                        memcpy(dp + total, fixed[ci] + g.at * w, g.m * w)
                        total += g.m * w
                out.append(data)
                continue
            total = 0
            for gi in range(G):
                g = &gs[gi]
                if not g.bad:
                    for i in range(g.m):
                        total += sl[(g.at + i) * nc + ci]
            data, offs = _str_column(good, total, "take_many", cs[ci])
            dp = <unsigned char *>PyBytes_AS_STRING(data)
            ov = offs
            total = 0
            ov[0] = 0
            a = 0
            for gi in range(G):
                g = &gs[gi]
                if g.bad:
                    continue
                for i in range(g.m):
                    k = (g.at + i) * nc + ci
                    if sl[k]:
                        memcpy(dp + total, sp[k], sl[k])
                    total += sl[k]
                    a += 1
                    ov[a] = <int32_t>total
            out.append((data, offs))
        return out, declined
    finally:
        if fixed != NULL:
            for ci in range(nc):
                free(fixed[ci])
        free(gs); free(slots); free(dslots); free(pp); free(pn); free(fixed); free(sp); free(sl); free(cs)




@cython.boundscheck(False)
@cython.wraparound(False)
def check_dir(const int64_t[::1] counts, const int64_t[::1] starts, const int64_t[::1] flat,
              const int64_t[::1] firsts, int64_t rows, int64_t file_size=-1, int64_t max_value=-1):
    """Why a row group's page directory (``rune_fast.pages._pack_dir``'s
    four arrays, as a cool sidecar keeps them) cannot be read from, or ""
    if it can: each column's pages follow one another from ``starts[c]``,
    the first starting at row 0, each next one where the one before ends
    (first row + values) and the last at ``rows``; ``firsts`` holds each
    page's first row; sizes are not negative (an uncompressed page's both
    the same), the flags a codec bit (zstd or LZ4_RAW) and a known kind (:func:`page_kinds`:
    a dictionary page only as a column's first, at row 0, followed by a
    page of rows; dictionary indices only in a column with a dictionary),
    the CRC 32 bits. (Each page read is
    still checked by its CRC-32 and its size; this keeps a page from being
    taken for another row's.) ``file_size`` (>= 0): no page runs past it;
    ``max_value`` (>= 0): no page unpacks to more than its values can hold
    (``values * max_value + 4096`` bytes), so that a wrong size becomes
    no read or allocation of gigabytes."""
    cdef Py_ssize_t ncols = counts.shape[0], npg = firsts.shape[0], c, j, at = 0
    cdef int64_t want, kind
    cdef bint has_dict
    if starts.shape[0] != ncols or flat.shape[0] != 7 * npg:
        return f"{ncols} columns, {starts.shape[0]} column starts, {flat.shape[0]} words for {npg} pages"
    for c in range(ncols):
        if starts[c] != at or counts[c] <= 0 or counts[c] > npg - at:
            return f"column {c}: {counts[c]} pages from page {starts[c]} (expected from page {at})"
        want = 0
        has_dict = counts[c] > 1 and _kind(flat[7 * at + 5]) == K_DICT
        for j in range(at, at + counts[c]):
            if flat[7 * j] != want or firsts[j] != want:
                return f"column {c}: page {j - at} starts at row {flat[7 * j]}, not {want}"
            kind = _kind(flat[7 * j + 5])
            if (flat[7 * j + 1] < 0 or flat[7 * j + 2] < 0 or flat[7 * j + 3] < 0
                    or not 0 <= flat[7 * j + 4] <= 0xFFFFFFFF or not _known_flags(flat[7 * j + 5])
                    or (kind == K_DICT and j != at) or (kind == K_RLE_DICT and not has_dict)
                    or flat[7 * j + 6] <= 0 or flat[7 * j + 6] > (rows if kind == K_DICT else rows - want)):
                return f"column {c}: page {j - at} has fields {list(flat[7 * j:7 * j + 7])}"
            if _codec(flat[7 * j + 5]) == C_NONE and flat[7 * j + 2] != flat[7 * j + 3]:
                return (f"column {c}: page {j - at} is stored uncompressed in {flat[7 * j + 2]} bytes "
                        f"for {flat[7 * j + 3]}")
            if file_size >= 0 and flat[7 * j + 1] > file_size - flat[7 * j + 2]:
                return f"a page runs past the end of the file ({file_size} bytes)"
            if max_value >= 0 and flat[7 * j + 3] > flat[7 * j + 6] * max_value + 4096:
                return "a page unpacks to more bytes than its values can hold"
            if kind != K_DICT:
                want += flat[7 * j + 6]
        if want != rows:
            return f"column {c}: its pages hold {want} rows, the group {rows}"
        at += counts[c]
    if at != npg:
        return f"{npg - at} pages after the last column's"
    return ""


cdef int _find_page(const unsigned char *b, Py_ssize_t n, int64_t count, const unsigned char **nds,
                    const size_t *nls, const int *cis, Py_ssize_t np_, int64_t *hits, Py_ssize_t *nh,
                    int64_t *bad) noexcept nogil:
    """The values of a PLAIN BYTE_ARRAY page (``count`` values in ``b[:n]``)
    that hold each probe: ``(probe, value index, start, length)`` appended
    to ``hits`` (4 words each, ``nh`` of them so far; room for ``count *
    np_``). FP_SHORT / FP_LONG with the value's index in ``bad``, FP_TAIL
    with the bytes past the last value."""
    cdef Py_ssize_t pos = 0, q
    cdef int64_t k
    cdef uint32_t ln
    for k in range(count):
        if n - pos < 4:
            bad[0] = k
            return FP_SHORT
        ln = rf_le32(b + pos)
        pos += 4
        if <uint64_t>ln > <uint64_t>(n - pos):
            bad[0] = k
            return FP_LONG
        for q in range(np_):
            if rf_find(b + pos, ln, nds[q], nls[q], cis[q]) != NULL:
                hits[4 * nh[0]] = q
                hits[4 * nh[0] + 1] = k
                hits[4 * nh[0] + 2] = pos
                hits[4 * nh[0] + 3] = ln
                nh[0] += 1
        pos += ln
    if pos != n:
        bad[0] = n - pos
        return FP_TAIL
    return FP_OK


cdef Py_ssize_t _span_sel(const int64_t[::1] firsts, Py_ssize_t at, Py_ssize_t n, object spans,
                          Py_ssize_t *sel) except -1:
    """Into ``sel`` (room for ``n``), ascending, the pages (0 to n - 1) of
    the chunk at ``at`` holding a row of one of ``spans`` (int64 ``[lo,
    hi)`` pairs, ascending; None: every page); their number."""
    cdef Py_ssize_t nsel = 0, i, a, b, k
    cdef int64_t lo, hi
    cdef const int64_t[:, ::1] sp
    if spans is None:
        for i in range(n):
            sel[i] = i
        return n
    sp = spans
    if sp.shape[0] and sp.shape[1] != 2:
        raise ValueError("spans: [lo, hi) pairs")
    for i in range(sp.shape[0]):
        lo, hi = sp[i, 0], sp[i, 1]
        # a: the last page starting at or before lo; b: the first starting at or after hi
        a = 0
        while a + 1 < n and firsts[at + a + 1] <= lo:
            a += 1
        if nsel and sel[nsel - 1] + 1 > a:
            a = sel[nsel - 1] + 1
        b = a
        while b < n and firsts[at + b] < hi:
            b += 1
        for k in range(a, b):
            sel[nsel] = k
            nsel += 1
    return nsel


def span_pages(const int64_t[::1] firsts, Py_ssize_t at, Py_ssize_t n, object spans):
    """The directory indices (``at`` + k) of the pages of the chunk at
    ``at`` (``n`` pages) that :func:`find_pages` reads for ``spans``."""
    cdef Py_ssize_t *sel
    cdef Py_ssize_t nsel, i
    if n <= 0:
        return []
    if at < 0 or at + n > firsts.shape[0]:
        raise ValueError("span_pages: pages outside the directory")
    sel = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
    if sel == NULL:
        raise MemoryError()
    try:
        nsel = _span_sel(firsts, at, n, spans, sel)
        return [at + sel[i] for i in range(nsel)]
    finally:
        free(sel)


def rows_pages(const int64_t[::1] counts, const int64_t[::1] starts, const int64_t[::1] flat,
               const int64_t[::1] firsts, object cols, const int64_t[::1] rows):
    """The directory indices of the pages :func:`take_rows` reads for
    ``rows`` of the columns ``cols`` (None: all), dictionary pages included."""
    if rows.shape[0] == 0:
        return []
    return _rows_pages(counts, starts, flat, firsts, cols, rows)


@cython.boundscheck(False)
@cython.wraparound(False)
def find_pages(int fd, const int64_t[::1] flat, const int64_t[::1] firsts, Py_ssize_t at, Py_ssize_t n,
               object spans, list probes, object decompress, list seen=None, dict fetched=None):
    """For each probe ``(needle, ignore_ascii_case)`` (the needle ASCII-
    lowercased for the latter), the values of one column chunk's pages that
    hold it: lists of ``(row within the group, the value's bytes)``,
    ascending -- what ``PageReader.find`` returns. The chunk is pages ``at``
    to ``at + n`` of a packed directory (``flat``: 7 fields a page, see
    :func:`take_rows`; ``firsts``: each page's first row).

    ``spans``: int64 ``[lo, hi)`` row pairs (ascending): only the pages
    holding one of their rows are read; None: every page. Adjacent pages are
    read in one ``pread``. Each page is CRC-32 checked, decompressed (by
    libzstd without the GIL when :func:`zstd_direct`, else
    ``decompress(bytes, max_output_size=size)``) and searched, all but the
    callback without the GIL. ``seen``: a list the data offset of each page
    read is appended to (the tests' count). ``fetched``: directory index ->
    the bytes of a page already read, checked and decompressed
    (:func:`fetch_pages`), taken instead of reading it. ValueError naming the page's offset for a CRC
    mismatch, a page that does not decompress to its size or whose values
    do not parse; Unsupported for a page that is not PLAIN; OSError if a
    read fails."""
    cdef Py_ssize_t np_ = len(probes), q, i, nsel = 0, r0, r1, nh, k
    cdef int64_t base, end, off, csize, usize, count, bad = 0
    cdef int direct = rf_zstd_ready(), err = FP_OK, ci
    cdef const char *zerr = NULL
    cdef long long got = 0
    cdef bint whole
    cdef Py_ssize_t *sel = NULL
    cdef const unsigned char **nds = NULL
    cdef size_t *nls = NULL
    cdef int *cis = NULL
    cdef int64_t *hits = NULL
    cdef unsigned char *run = NULL
    cdef unsigned char *raw = NULL
    cdef const unsigned char *page = NULL
    cdef Py_ssize_t run_cap = 0, raw_cap = 0, hits_cap = 0
    cdef list out = [[] for _ in range(np_)], needles = []
    cdef bytes nb, pyraw
    if n <= 0:
        return out
    if at < 0 or at + n > firsts.shape[0] or 7 * (at + n) > flat.shape[0]:
        raise ValueError("find_pages: pages outside the directory")
    sel = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
    nds = <const unsigned char **>malloc((np_ + 1) * sizeof(char *))
    nls = <size_t *>malloc((np_ + 1) * sizeof(size_t))
    cis = <int *>malloc((np_ + 1) * sizeof(int))
    try:
        if sel == NULL or nds == NULL or nls == NULL or cis == NULL:
            raise MemoryError()
        for q in range(np_):
            nb, ci = probes[q]
            needles.append(nb)
            nds[q] = <const unsigned char *>PyBytes_AS_STRING(nb)
            nls[q] = <size_t>PyBytes_GET_SIZE(nb)
            cis[q] = ci
        nsel = _span_sel(firsts, at, n, spans, sel)
        r0 = 0
        while r0 < nsel:
            r1 = _run_last(sel, r0, nsel)
            _run_bounds(flat, at + sel[r0], at + sel[r1], &base, &end)
            whole = fetched is not None
            if whole:
                for i in range(r0, r1 + 1):
                    if (at + sel[i]) not in fetched:
                        whole = False
                        break
            if whole:
                pass
            elif end - base > run_cap:
                free(run)
                run = <unsigned char *>malloc(end - base)
                run_cap = end - base if run != NULL else 0
                if run == NULL:
                    raise MemoryError()
            if end > base and not whole:
                _read_at(fd, run, end - base, base)
            for i in range(r0, r1 + 1):
                k = at + sel[i]
                off, csize, usize, count = flat[7 * k + 1], flat[7 * k + 2], flat[7 * k + 3], flat[7 * k + 6]
                if _kind(flat[7 * k + 5]) != K_PLAIN:
                    raise Unsupported(f"page at offset {off} is not a PLAIN data page")
                if (not whole and (off < base or off + csize > end)) or usize < 0 or count < 0:
                    raise ValueError(f"page at offset {off} is out of place")
                if count * np_ > hits_cap:
                    free(hits)
                    hits = <int64_t *>malloc(4 * count * np_ * sizeof(int64_t) + 1)
                    hits_cap = count * np_ if hits != NULL else 0
                    if hits == NULL:
                        raise MemoryError()
                if _codec(flat[7 * k + 5]) != C_NONE and usize > raw_cap and not whole:
                    free(raw)
                    raw = <unsigned char *>malloc(usize + 1)
                    raw_cap = usize if raw != NULL else 0
                    if raw == NULL:
                        raise MemoryError()
                nh = 0
                pyraw = None
                if seen is not None:
                    seen.append(off)
                if whole:       # (read and checked by fetch_pages)
                    pyraw = <bytes>fetched[k]
                    page = <const unsigned char *>PyBytes_AS_STRING(pyraw)
                    if PyBytes_GET_SIZE(pyraw) != usize:
                        got, err = PyBytes_GET_SIZE(pyraw), FP_SIZE
                else:
                    with nogil:
                        err = _check_unpack(run + (off - base), csize, <uint32_t>flat[7 * k + 4],
                                            _here(flat[7 * k + 5], direct), raw, usize, &page, &got, &zerr)
                    if _codec(flat[7 * k + 5]) == C_NONE:
                        usize = csize
                if err == FP_OK and (flat[7 * k + 5] & F_ZSTD) and not direct and not whole:
                    try:
                        pyraw = decompress(PyBytes_FromStringAndSize(<const char *>run + (off - base), csize),
                                           max_output_size=usize)
                    except Exception as exc:
                        raise ValueError(f"page at offset {off} does not decompress: {exc}") from None
                    got = PyBytes_GET_SIZE(pyraw)
                    page = <const unsigned char *>PyBytes_AS_STRING(pyraw)
                    if got != usize:
                        err = FP_SIZE
                if err == FP_OK:
                    with nogil:
                        err = _find_page(page, usize, count, nds, nls, cis, np_, hits, &nh, &bad)
                _raise_page(err, off, got, usize, zerr)
                if err == FP_SHORT:
                    raise ValueError(f"page at offset {off}: PLAIN page ends before value {bad}")
                if err == FP_LONG:
                    raise ValueError(f"page at offset {off}: PLAIN value {bad} runs past its page")
                if err == FP_TAIL:
                    raise ValueError(f"page at offset {off}: {bad} bytes past the last PLAIN value")
                for q in range(nh):
                    out[hits[4 * q]].append((firsts[k] + hits[4 * q + 1], PyBytes_FromStringAndSize(
                        <const char *>page + hits[4 * q + 2], hits[4 * q + 3])))
            r0 = r1 + 1
    finally:
        free(sel); free(nds); free(nls); free(cis); free(hits); free(run); free(raw)
    return out

