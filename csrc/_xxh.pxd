# The vendored xxHash (csrc/vendor/xxhash/xxhash.h), used header-only (XXH_INLINE_ALL).
from libc.stdint cimport uint64_t

cdef extern from "rf_xxhash.h" nogil:
    ctypedef struct XXH128_hash_t:
        uint64_t low64
        uint64_t high64
    uint64_t XXH3_64bits(const void *data, size_t length)
    XXH128_hash_t XXH3_128bits(const void *data, size_t length)
