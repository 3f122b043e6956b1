"""Substring search over spans of one buffer, at memmem speed.

The Python layer hands a buffer (a mapped file, an Arrow string column's data)
and the spans to search; it gets back the indices of the matching spans and
decodes only those.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc

cimport cython
from rf_core cimport rf_find, rf_has_nonascii, rf_lower

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

