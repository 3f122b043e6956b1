"""The hot loops of reading a Parquet file page by page: parsing a page
header (Thrift compact protocol), finding the j-th value of a PLAIN
BYTE_ARRAY page, and turning such a page into an Arrow string layout.

The Python layer (``rune_fast.pages``) locates the pages, checks their CRC,
decompresses them and decides what to do with anything these functions refuse:
every malformed input raises ValueError, never reads out of bounds.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

cimport cython
from rf_core cimport rf_find

import numpy as np

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


@cython.boundscheck(False)
@cython.wraparound(False)
def page_header(const unsigned char[::1] buf, Py_ssize_t pos=0):
    """Parse the PageHeader at ``buf[pos:]``.

    Returns ``(header_len, page_type, uncompressed_size, compressed_size, crc,
    num_values, encoding)``: ``crc`` is the unsigned CRC-32 or -1 when the
    header has none; ``num_values`` and ``encoding`` come from a v1 data page
    header (-1 for other page types). ValueError when the bytes are not a
    complete header (also when ``buf`` ends inside it: read more and retry)."""
    cdef _Cursor c = _Cursor()
    cdef int fid = 0, sfid, t, st
    cdef int64_t ptype = -1, usize = -1, csize = -1, crc = -1, nvals = -1, enc = -1
    if pos < 0 or pos > buf.shape[0]:
        raise ValueError("page header position out of range")
    c.p = &buf[0] if buf.shape[0] else NULL
    c.n = buf.shape[0]
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
        elif fid == 5 and t == T_STRUCT:
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
    return c.i - pos, ptype, usize, csize, crc, nvals, enc


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
