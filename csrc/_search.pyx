"""Substring search over spans of one buffer, at memmem speed.

The Python layer hands a buffer (a mapped file, an Arrow string column's data)
and the spans to search; it gets back the indices of the matching spans and
decodes only those.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

cimport cython
from rf_core cimport (rf_find, rf_find_nonascii, rf_gram_acc, rf_gram_acc_add, rf_gram_acc_done,
                      rf_gram_acc_init, rf_gram_acc_roll, rf_gram_may, rf_has_nonascii, rf_lower, rf_pow2_log)

import numpy as np

from rune_fast.errors import FramingError


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int64_t find_in_spans(const unsigned char *data, Py_ssize_t data_len,
                           const int64_t *starts, const int64_t *ends, Py_ssize_t n,
                           const unsigned char *needle, size_t m, bint ci, bint nonascii,
                           int64_t *out) noexcept nogil:
    """Write to `out` the index of every span [starts[i], ends[i]) of data that
    contains needle (already ASCII-lowercased when ci), or, with nonascii, that
    holds a byte >= 0x80; return how many. Spans outside data are clipped."""
    cdef Py_ssize_t i
    cdef int64_t s, e, k = 0
    for i in range(n):
        s = starts[i]
        e = ends[i]
        if s < 0:
            s = 0
        if e > data_len:
            e = data_len
        if e < s:
            continue
        if rf_find(data + s, <size_t>(e - s), needle, m, ci) != NULL:
            out[k] = i
            k += 1
        elif nonascii and rf_has_nonascii(data + s, <size_t>(e - s)):
            out[k] = i
            k += 1
    return k


cdef tuple _spans(starts, ends):
    """``(starts, ends)`` as contiguous int64 arrays of one length, else
    FramingError naming what is wrong."""
    try:
        s_arr = np.ascontiguousarray(starts, dtype=np.int64)
        e_arr = np.ascontiguousarray(ends, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise FramingError(f"starts/ends must be integer arrays: {exc}") from None
    if s_arr.ndim != 1 or e_arr.shape != s_arr.shape:
        raise FramingError(f"starts has {s_arr.shape[0] if s_arr.ndim else 0} spans but ends has "
                           f"{e_arr.shape[0] if e_arr.ndim else 0}")
    return s_arr, e_arr


def find_spans(data, starts, ends, needle, bint ignore_ascii_case=False,
               bint nonascii_candidates=False):
    """Indices i (int64 array, ascending) whose ``data[starts[i]:ends[i]]``
    contains `needle`; ASCII letters match either case with
    `ignore_ascii_case`; with `nonascii_candidates`, spans holding any byte
    >= 0x80 are returned too (for the caller to check Unicode casefolding).
    An empty needle matches every span."""
    cdef Py_buffer dv, nv
    cdef const int64_t[::1] s_arr
    cdef const int64_t[::1] e_arr
    cdef int64_t[::1] ov
    cdef Py_ssize_t n, k
    cdef unsigned char *nd = NULL
    cdef size_t m
    s_arr, e_arr = _spans(starts, ends)
    n = s_arr.shape[0]
    try:
        PyObject_GetBuffer(data, &dv, PyBUF_SIMPLE)
    except (TypeError, BufferError) as exc:
        raise FramingError(f"data must be a contiguous bytes-like object: {exc}") from None
    try:
        try:
            PyObject_GetBuffer(needle, &nv, PyBUF_SIMPLE)
        except (TypeError, BufferError) as exc:
            raise FramingError(f"needle must be bytes: {exc}") from None
        try:
            m = <size_t>nv.len
            nd = <unsigned char *>malloc(m + 1)
            if nd == NULL:
                raise MemoryError("find_spans: needle copy")
            for k in range(<Py_ssize_t>m):
                nd[k] = rf_lower((<const unsigned char *>nv.buf)[k]) if ignore_ascii_case \
                    else (<const unsigned char *>nv.buf)[k]
        finally:
            PyBuffer_Release(&nv)
        out = np.empty(n, dtype=np.int64)
        if n == 0:
            return out
        ov = out
        with nogil:
            k = find_in_spans(<const unsigned char *>dv.buf, dv.len, &s_arr[0], &e_arr[0], n,
                              nd, m, ignore_ascii_case, nonascii_candidates,
                              &ov[0])
        return out[:k].copy()
    finally:
        free(nd)
        PyBuffer_Release(&dv)



# ---- trigram filters over blocks of rows ----------------------------------
#
# A block's filter is a bitset of the hashed trigrams of its rows' bytes, ASCII
# letters lowercased, trigrams never spanning two rows. A row holding a needle
# holds each of the needle's trigrams (lowercased alike), so a block whose
# filter lacks one cannot hold a match: the cool tier tests the filter before
# opening a compressed block. A false pass only costs the block's check.

def _check_bits(Py_ssize_t nbits) -> int:
    cdef int lg = rf_pow2_log(nbits, 64)
    if lg < 0:
        raise FramingError(f"nbits must be a power of two in [64, 2**24], got {nbits}")
    return lg


@cython.boundscheck(False)
@cython.wraparound(False)
def block_grams(data, offsets, Py_ssize_t block_rows, Py_ssize_t nbits=4096) -> bytes:
    """The trigram filters (``nbits`` bits each, concatenated) of the blocks of
    ``block_rows`` rows of a string column: row i is
    ``data[offsets[i]:offsets[i + 1]]`` (``offsets``: int32, n + 1 of them)."""
    return _grams_of(data, offsets, block_rows, nbits, False)


@cython.boundscheck(False)
@cython.wraparound(False)
def gram_blocks(grams, Py_ssize_t nbits, needle):
    """Indices (int64, ascending) of the blocks whose filter holds every
    trigram of ``needle``: all blocks when the needle is shorter than 3 bytes."""
    cdef int lg = _check_bits(nbits)
    cdef const unsigned char[::1] g = grams
    cdef const unsigned char[::1] nd = needle
    cdef size_t words = <size_t>(nbits // 64)
    cdef Py_ssize_t nblocks = g.shape[0] // <Py_ssize_t>(words * 8), b, k = 0, m = nd.shape[0]
    cdef const uint64_t *w
    out = np.empty(nblocks, dtype=np.int64)
    cdef int64_t[::1] ov = out
    if nblocks == 0:
        return out
    w = <const uint64_t *>&g[0]
    if m < 3:
        return np.arange(nblocks, dtype=np.int64)
    with nogil:
        for b in range(nblocks):
            if rf_gram_may(w + b * words, &nd[0], <size_t>m, lg):
                ov[k] = b
                k += 1
    return out[:k].copy()


# ---- exact casefold matching in compiled code ------------------------------
#
# str.casefold folds each code point alone (rune_fast._casefold.fold_table),
# so whether a text's fold holds a folded needle is decided by decoding the
# text's code points, folding each through the table and looking for the
# needle's code points in what comes out: no str is built. Candidates come
# from the anchors' byte scans; this decides them. Hot lines hold their
# content JSON-escaped (\", \\, \n, and \u with four hex digits, surrogate
# pairs included); archived values are plain UTF-8. A span that does not
# decode (bad UTF-8, a lone surrogate, an unknown escape) is left to the
# caller's Python check, which names the damage or decides as str does.

cdef const uint32_t *_f_keys = NULL
cdef const uint32_t *_f_offs = NULL
cdef const uint32_t *_f_vals = NULL
cdef const unsigned char *_f_bits = NULL
cdef Py_ssize_t _f_n = 0
_f_arrays = None


cdef int _load_fold_table() except -1:
    global _f_keys, _f_offs, _f_vals, _f_bits, _f_n, _f_arrays
    cdef const uint32_t[::1] k
    cdef const uint32_t[::1] o
    cdef const uint32_t[::1] v
    cdef const unsigned char[::1] b
    if _f_arrays is not None:
        return 0
    from rune_fast._casefold import fold_table
    arrays = fold_table()
    k, o, v, b = arrays
    _f_n = k.shape[0]
    _f_keys = &k[0]
    _f_offs = &o[0]
    _f_vals = &v[0]
    _f_bits = &b[0]
    _f_arrays = arrays          # (keeps the buffers alive)
    return 0


cdef inline int _hexval(unsigned char c) noexcept nogil:
    if c >= c'0' and c <= c'9':
        return c - c'0'
    if c >= c'a' and c <= c'f':
        return c - c'a' + 10
    if c >= c'A' and c <= c'F':
        return c - c'A' + 10
    return -1


cdef inline Py_ssize_t _hex4(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, uint32_t *cp) noexcept nogil:
    """The code unit of the 4 hex digits at p[i:i+4]; -1 if not there."""
    cdef int d, k
    cdef uint32_t v = 0
    if i + 4 > n:
        return -1
    for k in range(4):
        d = _hexval(p[i + k])
        if d < 0:
            return -1
        v = (v << 4) | <uint32_t>d
    cp[0] = v
    return i + 4


cdef inline Py_ssize_t _next_cp(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, bint esc,
                                uint32_t *cp) noexcept nogil:
    """Decode the code point at p[i] into cp; the index after it, or -1
    where the bytes do not decode (left to the caller's Python check)."""
    cdef unsigned char b = p[i], c
    cdef uint32_t lo
    if b < 0x80:
        if esc and b == c'\\':
            if i + 1 >= n:
                return -1
            c = p[i + 1]
            if c == c'"' or c == c'\\' or c == c'/':
                cp[0] = c
            elif c == c'n':
                cp[0] = 10
            elif c == c't':
                cp[0] = 9
            elif c == c'r':
                cp[0] = 13
            elif c == c'b':
                cp[0] = 8
            elif c == c'f':
                cp[0] = 12
            elif c == c'u':
                i = _hex4(p, i + 2, n, cp)
                if i < 0:
                    return -1
                if 0xD800 <= cp[0] < 0xDC00:
                    if i + 6 > n or p[i] != c'\\' or p[i + 1] != c'u' or _hex4(p, i + 2, n, &lo) < 0 \
                            or not 0xDC00 <= lo < 0xE000:
                        return -1
                    cp[0] = 0x10000 + ((cp[0] - 0xD800) << 10) + (lo - 0xDC00)
                    return i + 6
                if 0xDC00 <= cp[0] < 0xE000:
                    return -1
                return i
            else:
                return -1
            return i + 2
        cp[0] = b
        return i + 1
    if b < 0xC2:
        return -1
    if b < 0xE0:
        if i + 1 >= n or (p[i + 1] & 0xC0) != 0x80:
            return -1
        cp[0] = ((<uint32_t>b & 0x1F) << 6) | (p[i + 1] & 0x3F)
        return i + 2
    if b < 0xF0:
        if i + 2 >= n or (p[i + 1] & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80:
            return -1
        if (b == 0xE0 and p[i + 1] < 0xA0) or (b == 0xED and p[i + 1] >= 0xA0):
            return -1           # overlong, or a surrogate
        cp[0] = ((<uint32_t>b & 0x0F) << 12) | ((<uint32_t>p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F)
        return i + 3
    if b < 0xF5:
        if i + 3 >= n or (p[i + 1] & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80 or (p[i + 3] & 0xC0) != 0x80:
            return -1
        if (b == 0xF0 and p[i + 1] < 0x90) or (b == 0xF4 and p[i + 1] >= 0x90):
            return -1
        cp[0] = ((<uint32_t>b & 0x07) << 18) | ((<uint32_t>p[i + 1] & 0x3F) << 12) \
            | ((<uint32_t>p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F)
        return i + 4
    return -1


cdef inline Py_ssize_t _fold_cp(uint32_t cp, uint32_t *out) noexcept nogil:
    """Write cp's casefold to out (at most 3 code points); how many."""
    cdef Py_ssize_t lo, hi, mid
    cdef uint32_t k
    if cp < 0x80:
        out[0] = cp | 0x20 if cp >= 0x41 and cp <= 0x5A else cp
        return 1
    if not (_f_bits[cp >> 3] >> (cp & 7)) & 1:
        out[0] = cp
        return 1
    lo = 0
    hi = _f_n
    while lo < hi:
        mid = (lo + hi) >> 1
        if _f_keys[mid] < cp:
            lo = mid + 1
        else:
            hi = mid
    if lo >= _f_n or _f_keys[lo] != cp:
        out[0] = cp
        return 1
    for k in range(_f_offs[lo], _f_offs[lo + 1]):
        out[k - _f_offs[lo]] = _f_vals[k]
    return <Py_ssize_t>(_f_offs[lo + 1] - _f_offs[lo])


cdef int _fold_has(const unsigned char *p, Py_ssize_t n, bint esc, const uint32_t *nd, Py_ssize_t m,
                   uint32_t *buf) noexcept nogil:
    """1 if the casefold of the text p[0:n) holds nd[0:m), 0 if not, -1 if
    the bytes do not decode. buf has room for 3 * n code points."""
    cdef Py_ssize_t i = 0, k = 0, j, t
    cdef uint32_t cp, first
    if m == 0:
        return 1
    first = nd[0]
    while i < n:
        i = _next_cp(p, i, n, esc, &cp)
        if i < 0:
            return -1
        k += _fold_cp(cp, buf + k)
    if k < m:
        return 0
    for j in range(k - m + 1):
        if buf[j] != first:
            continue
        t = 1
        while t < m and buf[j + t] == nd[t]:
            t += 1
        if t == m:
            return 1
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
def fold_find(data, starts, ends, str folded, bint escaped=False):
    """``(hits, unsure)``: the indices i (int64, ascending) whose text
    ``data[starts[i]:ends[i]]`` (UTF-8; JSON-escaped string content with
    `escaped`) has a casefold that holds ``folded`` (a casefolded needle),
    and those whose bytes do not decode, for the caller to check in Python.
    Spans outside data are clipped."""
    cdef Py_buffer dv
    cdef const int64_t[::1] s_arr
    cdef const int64_t[::1] e_arr
    cdef int64_t[::1] hv
    cdef int64_t[::1] uv
    cdef Py_ssize_t n, i, m, nh = 0, nu = 0, longest = 0
    cdef int64_t s, e
    cdef uint32_t *nd = NULL
    cdef uint32_t *buf = NULL
    cdef int r
    _load_fold_table()
    s_arr, e_arr = _spans(starts, ends)
    n = s_arr.shape[0]
    nd_arr = np.frombuffer(folded.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    m = nd_arr.shape[0]
    cdef const uint32_t[::1] nd_view = nd_arr
    hits = np.empty(n, dtype=np.int64)
    unsure = np.empty(n, dtype=np.int64)
    if n == 0:
        return hits, unsure
    try:
        PyObject_GetBuffer(data, &dv, PyBUF_SIMPLE)
    except (TypeError, BufferError) as exc:
        raise FramingError(f"data must be a contiguous bytes-like object: {exc}") from None
    try:
        for i in range(n):
            s = max(s_arr[i], 0)
            e = min(e_arr[i], dv.len)
            if e - s > longest:
                longest = e - s
        nd = <uint32_t *>malloc(<size_t>(m + 1) * sizeof(uint32_t))
        buf = <uint32_t *>malloc(<size_t>(3 * longest + 3) * sizeof(uint32_t))
        if nd == NULL or buf == NULL:
            raise MemoryError("fold_find: buffers")
        for i in range(m):
            nd[i] = <uint32_t>nd_view[i]
        hv = hits
        uv = unsure
        with nogil:
            for i in range(n):
                s = s_arr[i]
                e = e_arr[i]
                if s < 0:
                    s = 0
                if e > dv.len:
                    e = dv.len
                if e < s:
                    e = s
                r = _fold_has(<const unsigned char *>dv.buf + s, <Py_ssize_t>(e - s), escaped, nd, m, buf)
                if r > 0:
                    hv[nh] = i
                    nh += 1
                elif r < 0:
                    uv[nu] = i
                    nu += 1
        return hits[:nh].copy(), unsure[:nu].copy()
    finally:
        free(nd)
        free(buf)
        PyBuffer_Release(&dv)


def fold_find_list(values, str folded, bint escaped=False):
    """:func:`fold_find` over a sequence of bytes values: (hits, unsure),
    indices into ``values``. A list of bytes (a limited search's few
    candidate lines) is read where each value lies, without joining them or
    making the span arrays (~10 us of numpy calls for 2 values)."""
    cdef list vals
    cdef Py_ssize_t n, i, m, longest = 0, ln
    cdef uint32_t *nd = NULL
    cdef uint32_t *buf = NULL
    cdef int r
    cdef list hits, unsure
    if type(values) is not list or any(type(v) is not bytes for v in values):
        lens = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
        ends = np.cumsum(lens)
        return fold_find(b"".join(values), ends - lens, ends, folded, escaped)
    vals = <list>values
    n = len(vals)
    hits, unsure = [], []
    if n:
        _load_fold_table()
        cps = folded.encode("utf-32-le", "surrogatepass")
        m = len(cps) // 4
        for i in range(n):
            ln = PyBytes_GET_SIZE(vals[i])
            if ln > longest:
                longest = ln
        nd = <uint32_t *>malloc(<size_t>(m + 1) * sizeof(uint32_t))
        buf = <uint32_t *>malloc(<size_t>(3 * longest + 3) * sizeof(uint32_t))
        try:
            if nd == NULL or buf == NULL:
                raise MemoryError("fold_find_list: buffers")
            memcpy(nd, PyBytes_AS_STRING(cps), <size_t>m * sizeof(uint32_t))
            for i in range(n):
                v = vals[i]
                r = _fold_has(<const unsigned char *>PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), escaped,
                              nd, m, buf)
                if r > 0:
                    hits.append(i)
                elif r < 0:
                    unsure.append(i)
        finally:
            free(nd)
            free(buf)
    return np.array(hits, dtype=np.int64), np.array(unsure, dtype=np.int64)


# ---- filters of the casefolded text ----------------------------------------
#
# The archive's search filter of a block of rows is the bitset of the hashed
# trigrams (rf_gram) of the UTF-8 of each row's casefold, trigrams never
# spanning two rows. casefold folds each code point alone, so a row whose
# casefold holds a folded needle holds each trigram of that needle's UTF-8:
# a block whose filter lacks one holds no hit, whatever the needle's script
# or case (an expansion such as 'ß' -> 'ss' included). A case-sensitive
# needle is tested by its casefold (a substring's fold is a substring of the
# text's fold). A row that does not decode sets every bit of its block.

cdef inline Py_ssize_t _put_utf8(uint32_t cp, unsigned char *o) noexcept nogil:
    if cp < 0x80:
        o[0] = <unsigned char>cp
        return 1
    if cp < 0x800:
        o[0] = <unsigned char>(0xC0 | (cp >> 6))
        o[1] = <unsigned char>(0x80 | (cp & 0x3F))
        return 2
    if cp < 0x10000:
        o[0] = <unsigned char>(0xE0 | (cp >> 12))
        o[1] = <unsigned char>(0x80 | ((cp >> 6) & 0x3F))
        o[2] = <unsigned char>(0x80 | (cp & 0x3F))
        return 3
    o[0] = <unsigned char>(0xF0 | (cp >> 18))
    o[1] = <unsigned char>(0x80 | ((cp >> 12) & 0x3F))
    o[2] = <unsigned char>(0x80 | ((cp >> 6) & 0x3F))
    o[3] = <unsigned char>(0x80 | (cp & 0x3F))
    return 4


cdef int _fold_gram_add(rf_gram_acc *acc, const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """rf_gram_acc_add of the UTF-8 of the casefold of the UTF-8 text
    p[0:n) (each code point folded alone, as str.casefold does), fed as it
    is folded, without a copy of the text: the bytes as they are up to
    each code point whose fold is not itself (the filter lowers ASCII
    letters itself; a code point that folds to itself has the same UTF-8,
    which _next_cp only takes in its shortest form), then that fold's
    UTF-8. (A row folded into a buffer first, code point by code point,
    was half the filters' time.) -1 if p does not decode (the caller sets
    every bit of the block), else 0."""
    cdef Py_ssize_t i = 0, at = 0, nx, j, c, k
    cdef const unsigned char *q
    cdef uint32_t cp, x = 0
    cdef uint32_t f[3]
    cdef unsigned char u[12]
    cdef int seen = 0
    while i < n:
        q = rf_find_nonascii(p + i, <size_t>(n - i))
        if q == NULL:
            break
        i = q - p
        nx = _next_cp(p, i, n, False, &cp)
        if nx < 0:
            return -1
        if (_f_bits[cp >> 3] >> (cp & 7)) & 1:
            c = _fold_cp(cp, f)
            if c != 1 or f[0] != cp:
                rf_gram_acc_roll(acc, &x, &seen, p + at, <size_t>(i - at))
                k = 0
                for j in range(c):
                    k += _put_utf8(f[j], u + k)
                rf_gram_acc_roll(acc, &x, &seen, u, <size_t>k)
                at = nx
        i = nx
    rf_gram_acc_roll(acc, &x, &seen, p + at, <size_t>(n - at))
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
def fold_block_grams(data, offsets, Py_ssize_t block_rows, Py_ssize_t nbits=4096) -> bytes:
    """:func:`block_grams` of the casefold of each row (see above): the
    filters (``nbits`` bits each, concatenated) of the blocks of
    ``block_rows`` rows of a UTF-8 string column, row i being
    ``data[offsets[i]:offsets[i + 1]]`` (``offsets``: int32, n + 1 of
    them). A block holding a row that does not decode has every bit set."""
    return _grams_of(data, offsets, block_rows, nbits, True)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef bytes _grams_of(data, offsets, Py_ssize_t block_rows, Py_ssize_t nbits, bint fold):
    """:func:`block_grams` (``fold`` False: the rows' bytes as they are) and
    :func:`fold_block_grams` (``fold`` True: each row's casefold)."""
    cdef int lg = _check_bits(nbits)
    cdef Py_buffer dv
    cdef rf_gram_acc acc
    cdef const int32_t[::1] o = np.ascontiguousarray(np.frombuffer(offsets, dtype=np.int32)
                                                     if not isinstance(offsets, np.ndarray) else offsets,
                                                     dtype=np.int32)
    cdef Py_ssize_t n = o.shape[0] - 1, nblocks, r, s, e, blk
    cdef size_t words, q
    cdef const unsigned char *p
    cdef uint64_t *w
    cdef bint full = False
    if block_rows < 1:
        raise FramingError(f"block_rows must be >= 1, got {block_rows}")
    if n < 0:
        raise FramingError("offsets must hold at least one entry")
    if fold:
        _load_fold_table()
    nblocks = (n + block_rows - 1) // block_rows
    words = <size_t>(nbits // 64)
    out = bytearray(nblocks * words * 8)
    if nblocks == 0:
        return bytes(out)
    try:
        PyObject_GetBuffer(data, &dv, PyBUF_SIMPLE)
    except (TypeError, BufferError) as exc:
        raise FramingError(f"data must be a contiguous bytes-like object: {exc}") from None
    try:
        p = <const unsigned char *>dv.buf
        w = <uint64_t *>(<char *>out)
        with nogil:
            for r in range(n):
                s = o[r]
                e = o[r + 1]
                if s < 0:
                    s = 0
                if e > dv.len:
                    e = dv.len
                blk = r // block_rows
                if r % block_rows == 0:
                    rf_gram_acc_init(&acc, w + blk * words, lg)
                    full = False
                if e > s and not full:
                    if not fold or not rf_has_nonascii(p + s, <size_t>(e - s)):
                        # (as they are; the filter lowers ASCII letters itself)
                        rf_gram_acc_add(&acc, p + s, <size_t>(e - s))
                    elif _fold_gram_add(&acc, p + s, e - s) < 0:
                        full = True
                if r % block_rows == block_rows - 1 or r == n - 1:
                    rf_gram_acc_done(&acc)
                    if full:
                        for q in range(words):
                            w[blk * words + q] = ~(<uint64_t>0)
    finally:
        PyBuffer_Release(&dv)
    return bytes(out)


@cython.boundscheck(False)
@cython.wraparound(False)
def gram_blocks_any(grams, Py_ssize_t nbits, needles, Py_ssize_t start=0, Py_ssize_t stop=-1):
    """Indices (int64, ascending) of the blocks ``[start, stop)`` (stop -1:
    to the last) of ``grams`` (concatenated filters of ``nbits`` bits) whose
    filter holds every trigram of at least one of ``needles`` (bytes): a
    needle shorter than 3 bytes passes every block. One call for a whole
    file's filters, which may be a read-only map."""
    cdef int lg = _check_bits(nbits)
    cdef Py_buffer gv
    cdef size_t words = <size_t>(nbits // 64)
    cdef Py_ssize_t nblocks, b, k = 0, j, nn = len(needles)
    cdef const uint64_t *w
    cdef const unsigned char **nds = NULL
    cdef size_t *lens = NULL
    needles = [bytes(x) for x in needles]
    for x in needles:
        if len(x) < 3:
            needles = []
            break
    PyObject_GetBuffer(grams, &gv, PyBUF_SIMPLE)
    try:
        nblocks = gv.len // <Py_ssize_t>(words * 8)
        if stop < 0 or stop > nblocks:
            stop = nblocks
        if start < 0:
            start = 0
        if start >= stop:
            return np.zeros(0, dtype=np.int64)
        if not needles:
            return np.arange(start, stop, dtype=np.int64)
        nn = len(needles)
        out = np.empty(stop - start, dtype=np.int64)
        nds = <const unsigned char **>malloc(nn * sizeof(void *))
        lens = <size_t *>malloc(nn * sizeof(size_t))
        if nds == NULL or lens == NULL:
            raise MemoryError()
        for j in range(nn):
            nds[j] = <const unsigned char *><char *>needles[j]
            lens[j] = <size_t>len(needles[j])
        k = _any_blocks(<const uint64_t *>gv.buf, words, start, stop, nds, lens, nn, lg, out)
        return out[:k].copy()
    finally:
        free(nds)
        free(lens)
        PyBuffer_Release(&gv)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef Py_ssize_t _any_blocks(const uint64_t *w, size_t words, Py_ssize_t start, Py_ssize_t stop,
                            const unsigned char **nds, size_t *lens, Py_ssize_t nn, int lg,
                            int64_t[::1] ov):
    cdef Py_ssize_t b, j, k = 0
    with nogil:
        for b in range(start, stop):
            for j in range(nn):
                if rf_gram_may(w + b * words, nds[j], lens[j], lg):
                    ov[k] = b
                    k += 1
                    break
    return k
