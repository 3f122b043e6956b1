# Declarations of rune_fast._search: substring kernels over spans of a buffer.
from libc.stdint cimport int64_t

cdef int64_t find_in_spans(const unsigned char *data, Py_ssize_t data_len,
                           const int64_t *starts, const int64_t *ends, Py_ssize_t n,
                           const unsigned char *needle, size_t m, bint ci, bint nonascii,
                           int64_t *out) noexcept nogil
