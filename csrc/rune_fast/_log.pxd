# Declarations of rune_fast._log: the frame, the frame scan and the tail writer.
from cpython.pythread cimport PyThread_type_lock
from libc.stdint cimport int64_t


cdef class FrameScan:
    cdef readonly object offsets
    cdef readonly object lengths
    cdef readonly int64_t good_end
    cdef readonly int64_t torn_offset
    cdef readonly int64_t damaged_offset
    cdef readonly str damage


cdef class TailWriter:
    cdef int _c_fd
    cdef PyThread_type_lock _c_lock
    cdef int64_t _size
    cdef readonly str path
    cdef str _failed          # why appends are refused ("" while healthy)
    cdef bint _sync_failed    # a failed fdatasync is never cleared

    cdef int _check_open(self) except -1
