"""Substring search over spans of one buffer, at memmem speed.

The Python layer hands a buffer (a mapped file, an Arrow string column's data)
and the spans to search; it gets back the indices of the matching spans and
decodes only those.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc

cimport cython
from rf_core cimport (rf_find, rf_gram_acc, rf_gram_acc_add, rf_gram_acc_done, rf_gram_acc_init, rf_gram_may,
                      rf_has_nonascii, rf_lower, rf_pow2_log)

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
    try:
        s_arr = np.ascontiguousarray(starts, dtype=np.int64)
        e_arr = np.ascontiguousarray(ends, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise FramingError(f"starts/ends must be integer arrays: {exc}") from None
    n = s_arr.shape[0]
    if e_arr.shape[0] != n:
        raise FramingError(f"starts has {n} spans but ends has {e_arr.shape[0]}")
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
    cdef int lg = _check_bits(nbits)
    cdef Py_buffer dv
    cdef rf_gram_acc acc
    cdef const int32_t[::1] o = np.ascontiguousarray(np.frombuffer(offsets, dtype=np.int32)
                                                     if not isinstance(offsets, np.ndarray) else offsets,
                                                     dtype=np.int32)
    cdef Py_ssize_t n = o.shape[0] - 1, nblocks, r, j, s, e
    cdef size_t words
    cdef const unsigned char *p
    cdef uint64_t *w
    cdef uint32_t h
    if block_rows < 1:
        raise FramingError(f"block_rows must be >= 1, got {block_rows}")
    if n < 0:
        raise FramingError("offsets must hold at least one entry")
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
                if r % block_rows == 0:
                    rf_gram_acc_init(&acc, w + (r // block_rows) * words, lg)
                if e > s:
                    rf_gram_acc_add(&acc, p + s, <size_t>(e - s))
                if r % block_rows == block_rows - 1 or r == n - 1:
                    rf_gram_acc_done(&acc)
    finally:
        PyBuffer_Release(&dv)
    return bytes(out)


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
