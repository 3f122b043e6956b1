"""The indexes of the hot tier and the tail: message id -> location, and per
channel and per task the ordered locations of their messages.

A location ("loc") is ``(seg << 40) | offset`` of a line in segment file
``seg``. The index never copies message bytes: it reads keys and order fields
from the read-only buffers the caller attaches per segment, and verifies a hash
hit against the id bytes in the line. Not thread-safe by itself: the repository
serialises calls (a call that finds another one running without the GIL raises
RuneError instead of corrupting memory).
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_GET_LENGTH
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF, PyObject
from libc.stdint cimport INT64_MIN, int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memchr, memcmp, memcpy, memmove, memset

cimport _xxh

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)

cdef extern from "<sys/mman.h>" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int PROT_READ
    int PROT_WRITE
    int MAP_PRIVATE
    void *MAP_FAILED
from rf_core cimport (RF_ID_OFF, RF_MAX_LINE, RF_OK, RF_SEQ_ORDER, rf_all_zero, rf_check_frame,
                      rf_cmp_json, rf_content_has, rf_find, rf_find_nonascii, rf_gram, rf_gram_acc,
                      rf_gram_acc_add, rf_gram_acc_done, rf_gram_acc_init,
                      rf_has_nonascii, rf_i64vec, rf_line_start, rf_prefault, rf_check_slots, rf_first_negative,
                      rf_prefetch,
                      rf_i64vec_push, rf_line_seq, rf_lower, rf_msg, rf_parse_msg, rf_reason,
                      rf_scan_result)

import os
import sys

import numpy as np

from rune_fast.errors import CorruptStateCheckpointError, FramingError, RuneError

cdef int64_t OFF_MASK = (<int64_t>1 << 40) - 1
cdef int64_t LOC_MASK = 0x7FFFFFFFFFFFFFFFLL
cdef int64_t DEAD_BIT = INT64_MIN
cdef int64_t MAX_SEG = (<int64_t>1 << 23) - 1
cdef Py_ssize_t CHUNK = 4096      # lines per scan pass: the parsed records stay in L2

SEG_SHIFT = 40
SNAPSHOT_MAGIC = b"RFHOTIX\x00"
SNAPSHOT_VERSION = 2     # 2: the line lengths section (1 is still read)
cdef Py_ssize_t HEADER_LEN = 64


cdef inline uint64_t _mix(uint64_t h) noexcept nogil:
    h ^= h >> 33
    h *= 0xff51afd7ed558ccdULL
    h ^= h >> 33
    h *= 0xc4ceb9fe1a85ec53ULL
    h ^= h >> 33
    return h


cdef inline uint64_t _home(uint64_t tag, uint64_t n_slots) noexcept nogil:
    # fastrange: map the 32-bit tag onto [0, n_slots) without a modulo
    return (tag * n_slots) >> 32


cdef bytes _key_bytes(object key, str what):
    if isinstance(key, bytes):
        return <bytes>key
    try:
        return bytes(memoryview(key))
    except TypeError:
        raise FramingError(f"{what} must be bytes (the escaped key), "
                           f"got {type(key).__name__}") from None


cdef object _vec_array(rf_i64vec *v):
    arr = np.empty(v.n, dtype=np.int64)
    cdef int64_t[::1] out = arr
    if v.n:
        memcpy(&out[0], v.v, v.n * sizeof(int64_t))
    return arr


# The module is one extension built from this file and the files it includes
# (Cython `include`: textual, so cdef functions stay inline across them);
# each holds one type or one job. A change of any of them rebuilds it.

include "_index_hash.pxi"
include "_index_search.pxi"
include "_index_ingest.pxi"
include "_index_cache.pxi"
include "_index_hot.pxi"
include "_index_repo.pxi"
include "_index_snapshot.pxi"
