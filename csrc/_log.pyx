"""The frame of every line rune_fast writes, the scan that checks it, and the
append-only writer.

A line is ``{"x":"<16 hex>"<rest>\\n`` where the hex digits are xxh3_64 of
``rest`` (see docs/FORMAT.md). Everything here works on any object with the
buffer protocol (bytes, bytearray, memoryview, mmap) and raises a
:class:`rune_fast.errors.RuneError` subclass on bad input.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport (PyThread_acquire_lock, PyThread_allocate_lock,
                               PyThread_free_lock, PyThread_release_lock)
from libc.errno cimport EINTR, EINVAL, EIO, ENOSYS, ENXIO, EOPNOTSUPP, errno
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memchr, memcmp, memcpy, memset
from posix.fcntl cimport O_APPEND, O_CLOEXEC, O_CREAT, O_RDONLY, O_WRONLY
from posix.fcntl cimport open as c_open
from posix.stat cimport fstat, struct_stat
from posix.unistd cimport close as c_close
from posix.unistd cimport fdatasync, ftruncate
from posix.unistd cimport pwrite as c_pwrite
from posix.types cimport off_t


cdef extern from "<unistd.h>" nogil:
    off_t lseek(int fd, off_t offset, int whence)
    const int SEEK_DATA
    const int SEEK_HOLE


cdef extern from "<fcntl.h>" nogil:
    int fallocate(int fd, int mode, off_t offset, off_t len)
    const int FALLOC_FL_KEEP_SIZE
    const int FALLOC_FL_PUNCH_HOLE
from posix.unistd cimport write as c_write

cimport _xxh
cimport cython

cdef extern from "sys/file.h" nogil:
    int flock(int fd, int operation)
    enum:
        LOCK_SH
        LOCK_UN
from rf_core cimport (RF_MAX_LINE, RF_OK, RF_PREFIX_LEN, rf_check_frame,
                      rf_i64vec, rf_reason, rf_scan, rf_scan_result,
                      rf_write_prefix)

import os

import numpy as np

from rune_fast.errors import DurabilityError, FramingError, RuneError, StoreClosedError

PREFIX_LEN = RF_PREFIX_LEN
MAX_LINE = RF_MAX_LINE


cdef int _get_buffer(object obj, Py_buffer *view, str what) except -1:
    """Acquire a simple (contiguous byte) buffer or raise FramingError naming `what`."""
    try:
        PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)
    except (TypeError, BufferError) as exc:
        raise FramingError(f"{what} must be a contiguous bytes-like object, "
                           f"got {type(obj).__name__}: {exc}") from None
    return 0


cdef object _vec_to_array(rf_i64vec *v):
    arr = np.empty(v.n, dtype=np.int64)
    cdef int64_t[::1] out = arr
    if v.n:
        memcpy(&out[0], v.v, v.n * sizeof(int64_t))
    return arr


def hash64(data) -> int:
    """xxh3_64 (seed 0) of the bytes of any buffer, as an unsigned int."""
    cdef Py_buffer view
    cdef uint64_t h
    _get_buffer(data, &view, "data")
    with nogil:
        h = _xxh.XXH3_64bits(view.buf, <size_t>view.len)
    PyBuffer_Release(&view)
    return h


def utf8_hashes(offsets, data, Py_ssize_t start, Py_ssize_t n):
    """uint64 array of xxh3_64 (seed 0) of the n strings of an Arrow string
    array: ``offsets`` its int32 offsets buffer, ``data`` its data buffer,
    ``start`` the array's offset into them (what ``hash64`` gives each
    string's UTF-8 bytes)."""
    cdef Py_buffer ov, dv
    cdef const int32_t *offs
    cdef const unsigned char *d
    cdef Py_ssize_t i
    cdef int32_t a, b
    out = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    if n == 0:
        return out
    _get_buffer(offsets, &ov, "offsets")
    try:
        _get_buffer(data, &dv, "data")
        try:
            if start < 0 or (start + n + 1) * 4 > ov.len:
                raise FramingError(f"utf8_hashes: {n} strings at {start} need {(start + n + 1) * 4} "
                                   f"offset bytes, the buffer has {ov.len}")
            offs = <const int32_t *>ov.buf
            d = <const unsigned char *>dv.buf
            for i in range(n):
                a = offs[start + i]
                b = offs[start + i + 1]
                if a < 0 or b < a or b > dv.len:
                    raise FramingError(f"utf8_hashes: string {i} spans [{a}, {b}) of {dv.len} bytes")
                o[i] = _xxh.XXH3_64bits(d + a, <size_t>(b - a))
        finally:
            PyBuffer_Release(&dv)
    finally:
        PyBuffer_Release(&ov)
    return out


def digest128(data) -> str:
    """xxh3_128 (seed 0) of the bytes of any buffer, as 32 lowercase hex digits
    (the canonical big-endian form, as ``xxhash.xxh3_128_hexdigest``)."""
    cdef Py_buffer view
    cdef _xxh.XXH128_hash_t h
    _get_buffer(data, &view, "data")
    with nogil:
        h = _xxh.XXH3_128bits(view.buf, <size_t>view.len)
    PyBuffer_Release(&view)
    return "%016x%016x" % (h.high64, h.low64)


# The fixed parts of a message envelope as EventStore writes it (after the
# frame's ``{"x":"<16 hex>"``): what message_envelope_keys takes in C.
cdef bytes _ENV_TYPE = b',"type":"conversation.message","id":"'
cdef bytes _ENV_HASH = b'","payload_hash":"'
cdef bytes _ENV_TS = b'","ts":'


# each byte's value as a lowercase hex digit, 0x10 for any other byte
cdef unsigned char _HEX[256]
memset(_HEX, 0x10, 256)
for _c in range(10):
    _HEX[48 + _c] = _c
for _c in range(6):
    _HEX[97 + _c] = 10 + _c


cdef inline bint _plain_number(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """Whether p[:n] is a JSON number of the plain form ``-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,20})?``
    (a ts as json.dumps of a float writes it; any other spelling is left to
    the JSON parser)."""
    cdef Py_ssize_t i = 0, k
    if i < n and p[i] == b'-':
        i += 1
    k = i
    while i < n and p[i] >= b'0' and p[i] <= b'9':
        i += 1
    if i == k or i - k > 15 or (p[k] == b'0' and i - k > 1):
        return 0
    if i < n and p[i] == b'.':
        i += 1
        k = i
        while i < n and p[i] >= b'0' and p[i] <= b'9':
            i += 1
        if i == k or i - k > 20:
            return 0
    return i == n


@cython.boundscheck(False)
@cython.wraparound(False)
def message_envelope_keys(buf, offsets, lengths, int64_t base):
    """``(entries, taken)`` of the lines of ``buf`` at ``offsets`` (their
    ``lengths``, without the newline; lines whose frame was checked) that
    are message envelopes spelled exactly as EventStore writes them:
    ``{"x":"<16 hex>","type":"conversation.message","id":"<id>",
    "payload_hash":"<64 hex>","ts":<number>}`` with an id of printable
    ASCII but ``"`` and ``\\``, lowercase hex digits and a plain number.
    ``entries``: 32 bytes a line taken, in order (the xxh3_128 digest of
    its id, the first 8 bytes of its hash, and ``base`` + its offset as a
    little-endian int64: what verify keeps of each envelope); ``taken``: a
    uint8 array, 1 for each line taken. Any other line (another type, an
    escape, a key out of place) is the caller's to parse."""
    cdef Py_buffer view
    cdef const int64_t[::1] offs = np.ascontiguousarray(offsets, dtype=np.int64)
    cdef const int64_t[::1] lens = np.ascontiguousarray(lengths, dtype=np.int64)
    cdef Py_ssize_t n = offs.shape[0], i, j, jj, k, idn, ln
    cdef const unsigned char *line
    cdef const unsigned char *d
    cdef const unsigned char *tp = _ENV_TYPE
    cdef const unsigned char *hp = _ENV_HASH
    cdef const unsigned char *sp = _ENV_TS
    cdef Py_ssize_t tn = len(_ENV_TYPE), hn = len(_ENV_HASH), sn = len(_ENV_TS)
    cdef _xxh.XXH128_hash_t h
    cdef unsigned char *o
    cdef int64_t at
    cdef unsigned char bad
    if lens.shape[0] != n:
        raise FramingError(f"message_envelope_keys: {n} offsets, {lens.shape[0]} lengths")
    taken = np.zeros(n, dtype=np.uint8)
    cdef unsigned char[::1] t = taken
    out = bytearray(32 * n)
    cdef unsigned char[::1] ob = out
    cdef Py_ssize_t m = 0
    _get_buffer(buf, &view, "buf")
    try:
        d = <const unsigned char *>view.buf
        for i in range(n):
            if offs[i] < 0 or lens[i] < 0 or offs[i] + lens[i] > view.len:
                raise FramingError(f"message_envelope_keys: line {i} at {offs[i]} ({lens[i]} bytes) "
                                   f"is outside the buffer of {view.len} bytes")
        with nogil:
            for i in range(n):
                line = d + offs[i]
                ln = lens[i]
                # {"x":"<16 hex>" then the type, the id, the hash and ts, then }
                k = 23
                if ln < k + tn + 1 + hn + 64 + sn + 2 or line[ln - 1] != b'}' \
                        or memcmp(line + k, tp, <size_t>tn) != 0:
                    continue
                k += tn
                j = k
                while j < ln and line[j] >= 0x20 and line[j] < 0x7f and line[j] != b'"' and line[j] != b'\\':
                    j += 1
                idn = j - k
                if idn == 0 or j + hn + 64 + sn + 2 > ln or memcmp(line + j, hp, <size_t>hn) != 0:
                    continue
                j += hn
                bad = 0
                for jj in range(64):
                    bad |= _HEX[line[j + jj]]
                if bad & 0x10 or memcmp(line + j + 64, sp, <size_t>sn) != 0 \
                        or not _plain_number(line + j + 64 + sn, ln - 1 - (j + 64 + sn)):
                    continue
                h = _xxh.XXH3_128bits(line + k, <size_t>idn)
                o = &ob[32 * m]
                for jj in range(8):
                    o[jj] = <unsigned char>((h.high64 >> (56 - 8 * jj)) & 0xFF)
                    o[8 + jj] = <unsigned char>((h.low64 >> (56 - 8 * jj)) & 0xFF)
                    o[16 + jj] = <unsigned char>(_HEX[line[j + 2 * jj]] * 16 + _HEX[line[j + 2 * jj + 1]])
                at = base + offs[i]
                memcpy(o + 24, &at, 8)      # (little-endian: the platforms rune_fast builds on)
                t[i] = 1
                m += 1
    finally:
        PyBuffer_Release(&view)
    return bytes(out[:32 * m]), taken


cdef int _check_rest(const unsigned char *p, Py_ssize_t n) except -1:
    if n < 3 or p[0] != b',' or p[1] != b'"' or p[n - 1] != b'}':
        raise FramingError(f'rest must start with \',"\' and end with \'}}\' (got {n} bytes '
                           f'starting {bytes(p[:min(n, 16)])!r})')
    if memchr(p, b'\n', <size_t>n) != NULL:
        raise FramingError("rest holds a raw newline byte at offset "
                           f"{<const unsigned char *>memchr(p, b'\n', <size_t>n) - p}")
    if <size_t>n + RF_PREFIX_LEN + 1 > RF_MAX_LINE:
        raise FramingError(f"line of {n + RF_PREFIX_LEN + 1} bytes exceeds MAX_LINE "
                           f"({RF_MAX_LINE} bytes)")
    return 0


def frame(rest) -> bytes:
    """The full line (prefix, rest, newline) for `rest`.

    `rest` starts with ``,"`` and ends with ``}``, holds no newline and fits in
    MAX_LINE with its prefix; anything else raises FramingError.
    """
    cdef Py_buffer view
    cdef bytes out
    cdef unsigned char *o
    _get_buffer(rest, &view, "rest")
    try:
        _check_rest(<const unsigned char *>view.buf, view.len)
        out = PyBytes_FromStringAndSize(NULL, view.len + RF_PREFIX_LEN + 1)
        o = <unsigned char *>PyBytes_AS_STRING(out)
        with nogil:
            rf_write_prefix(<const unsigned char *>view.buf, <size_t>view.len, o)
            memcpy(o + RF_PREFIX_LEN, view.buf, <size_t>view.len)
            o[RF_PREFIX_LEN + view.len] = b'\n'
    finally:
        PyBuffer_Release(&view)
    return out


def frame_many(rests) -> bytes:
    """The concatenated lines of every rest in `rests` (see :func:`frame`)."""
    cdef list items = list(rests)
    cdef Py_ssize_t total = 0, i, n = len(items), pos = 0
    cdef Py_buffer view
    cdef bytes out
    cdef unsigned char *o
    for i in range(n):
        _get_buffer(items[i], &view, f"rests[{i}]")
        try:
            _check_rest(<const unsigned char *>view.buf, view.len)
            total += view.len + RF_PREFIX_LEN + 1
        finally:
            PyBuffer_Release(&view)
    out = PyBytes_FromStringAndSize(NULL, total)
    o = <unsigned char *>PyBytes_AS_STRING(out)
    for i in range(n):
        _get_buffer(items[i], &view, f"rests[{i}]")
        if pos + view.len + RF_PREFIX_LEN + 1 > total:
            PyBuffer_Release(&view)
            raise FramingError(f"rests[{i}] changed size while framing")
        rf_write_prefix(<const unsigned char *>view.buf, <size_t>view.len, o + pos)
        memcpy(o + pos + RF_PREFIX_LEN, view.buf, <size_t>view.len)
        pos += view.len + RF_PREFIX_LEN + 1
        o[pos - 1] = b'\n'
        PyBuffer_Release(&view)
    return out


cdef class FrameScan:
    """Verdict of :func:`scan_frames` over a region of a file.

    ``offsets``/``lengths`` (int64 arrays; lengths exclude the newline) list the
    good complete lines; ``good_end`` is the offset just past the last of them;
    ``torn_offset`` is the offset of a torn final line (bytes after the last
    newline that are not all zero) or -1; ``damaged_offset`` is the offset of
    the first complete line that fails its check or -1, and ``damage`` says why.
    """

    def __repr__(self):
        return (f"FrameScan(lines={len(self.offsets)}, good_end={self.good_end}, "
                f"torn_offset={self.torn_offset}, damaged_offset={self.damaged_offset}, "
                f"damage={self.damage!r})")


def scan_frames(buf, Py_ssize_t start=0, Py_ssize_t end=-1) -> FrameScan:
    """Check every line of ``buf[start:end]`` (end -1: the whole buffer).

    The scan stops at the first damaged complete line; `start` must be the
    offset of a line. Runs without the GIL.
    """
    cdef Py_buffer view
    cdef rf_i64vec offs, lens
    cdef rf_scan_result r
    cdef FrameScan fs
    _get_buffer(buf, &view, "buf")
    memset(&offs, 0, sizeof(offs))
    memset(&lens, 0, sizeof(lens))
    try:
        if end < 0:
            end = view.len
        if start < 0 or start > end or end > view.len:
            raise FramingError(f"scan region [{start}, {end}) is outside the buffer "
                               f"of {view.len} bytes")
        with nogil:
            rf_scan(<const unsigned char *>view.buf, start, end, &offs, &lens, &r)
        if r.oom:
            raise MemoryError("scan_frames: out of memory for the line table")
        fs = FrameScan.__new__(FrameScan)
        fs.offsets = _vec_to_array(&offs)
        fs.lengths = _vec_to_array(&lens)
        fs.good_end = r.good_end
        fs.torn_offset = r.torn_offset
        fs.damaged_offset = r.damaged_offset
        fs.damage = rf_reason(r.damage).decode("ascii")
        return fs
    finally:
        free(offs.v)
        free(lens.v)
        PyBuffer_Release(&view)


def check_line(buf, Py_ssize_t offset) -> int:
    """Length (without the newline) of the complete, verified line at `offset`
    of `buf`, or -1 if there is no such line there."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef const unsigned char *nl
    cdef Py_ssize_t avail
    cdef int v = -1
    _get_buffer(buf, &view, "buf")
    try:
        if offset < 0 or offset >= view.len:
            return -1
        p = <const unsigned char *>view.buf + offset
        avail = view.len - offset
        if <size_t>avail > RF_MAX_LINE:
            avail = RF_MAX_LINE
        with nogil:
            nl = <const unsigned char *>memchr(p, b'\n', <size_t>avail)
            if nl != NULL:
                v = rf_check_frame(p, <size_t>(nl - p))
        if nl == NULL or v != RF_OK:
            return -1
        return nl - p
    finally:
        PyBuffer_Release(&view)


def line_verdict(buf, Py_ssize_t offset) -> str:
    """Why the line at `offset` fails its check ("" if it is sound, "torn" if
    it has no newline)."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef const unsigned char *nl
    cdef Py_ssize_t avail
    _get_buffer(buf, &view, "buf")
    try:
        if offset < 0 or offset >= view.len:
            return "offset outside the buffer"
        p = <const unsigned char *>view.buf + offset
        avail = view.len - offset
        nl = <const unsigned char *>memchr(p, b'\n', <size_t>avail)
        if nl == NULL:
            return "torn"
        return rf_reason(rf_check_frame(p, <size_t>(nl - p))).decode("ascii")
    finally:
        PyBuffer_Release(&view)


def pwrite_all(int fd, data, int64_t offset) -> None:
    """Write every byte of ``data`` at ``offset`` of ``fd`` with pwrite(2),
    looping over partial writes, in one release of the GIL (the append path
    of a store: one call, no Python between the system calls). EINTR runs
    the signal handlers (an exception of one is raised) and goes on. OSError
    with the errno and the bytes written so far in its message on failure
    (the bytes before may be written); a write of no bytes is EIO."""
    cdef Py_buffer view
    cdef const char *p
    cdef Py_ssize_t left, done = 0, w
    cdef int err = 0
    if offset < 0:
        raise ValueError(f"pwrite_all: negative offset {offset}")
    _get_buffer(data, &view, "data")
    try:
        p = <const char *>view.buf
        left = view.len
        while True:
            with nogil:
                while left > 0:
                    w = c_pwrite(fd, p + done, <size_t>left, offset + done)
                    if w <= 0:
                        err = errno if w < 0 else EIO
                        break
                    done += w
                    left -= w
            if err != EINTR:
                break
            err = 0
            PyErr_CheckSignals()
        if err:
            raise OSError(err, f"{os.strerror(err)} (pwrite of {view.len} bytes at offset {offset}: "
                               f"{done} written)")
    finally:
        PyBuffer_Release(&view)


cdef extern from "<fcntl.h>" nogil:
    int sync_file_range(int fd, off_t offset, off_t nbytes, unsigned int flags)
    const unsigned int SYNC_FILE_RANGE_WRITE


def start_writeback(int fd, int64_t offset, int64_t length) -> bool:
    """Start the write-out of the dirty pages of ``fd`` that hold bytes
    ``[offset, offset + length)`` (sync_file_range(2) with
    SYNC_FILE_RANGE_WRITE: the pages are submitted to the disk and the call
    returns without waiting). Durability is still the next fdatasync's,
    which then waits for these writes and flushes the disk's cache: what
    runs between the two (a single append's indexing, caching and journal)
    overlaps the write (measured: a 700-byte append with 40 us of work
    between write and sync 145 us against 182 us with the work after the
    sync). Advisory: False where the call fails (the sync writes them)."""
    cdef int rc
    if offset < 0 or length <= 0:
        return False
    with nogil:
        rc = sync_file_range(fd, <off_t>offset, <off_t>length, SYNC_FILE_RANGE_WRITE)
    return rc == 0


cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t *th, const void *attr, void *(*run)(void *) noexcept nogil, void *arg)
    int pthread_join(pthread_t th, void **ret)


cdef extern from "<unistd.h>" nogil:
    int dup(int fd)


cdef inline void _join_once(pthread_t *th, bint *running) noexcept:
    # join a background job's thread once; later calls do nothing
    if running[0]:
        with nogil:
            pthread_join(th[0], NULL)
        running[0] = False


cdef struct _SyncJob:
    int fd
    int err


cdef void *_sync_run(void *arg) noexcept nogil:
    cdef _SyncJob *job = <_SyncJob *>arg
    cdef int rc
    while True:
        rc = fdatasync(job.fd)
        if rc == 0 or errno != EINTR:
            break
    job.err = errno if rc != 0 else 0
    return NULL


cdef class BackgroundSync:
    """One ``fdatasync`` of ``fd`` run in a C thread of its own, without the
    GIL, so that the caller's CPU work overlaps the disk's (append_many: the
    index, the decode cache and the journal after the tail write). The file
    is synced through a ``dup`` of ``fd``, so a close of ``fd`` meanwhile (a
    tail roll, which syncs it first) neither fails nor misdirects it.
    :meth:`wait` joins it: OSError with the errno if the sync failed. The
    thread is joined, whatever happens, before the object goes away."""
    cdef pthread_t _th
    cdef _SyncJob _job
    cdef bint _running

    def __cinit__(self, int fd):
        cdef int rc
        self._running = False
        self._job.err = 0
        self._job.fd = dup(fd)
        if self._job.fd < 0:
            rc = errno
            raise OSError(rc, f"{os.strerror(rc)} (dup of fd {fd} for a background sync)")
        rc = pthread_create(&self._th, NULL, _sync_run, &self._job)
        if rc != 0:
            c_close(self._job.fd)
            self._job.fd = -1
            raise OSError(rc, f"{os.strerror(rc)} (thread of a background sync)")
        self._running = True

    cdef void _join(self) noexcept:
        _join_once(&self._th, &self._running)
        if self._job.fd >= 0:
            c_close(self._job.fd)
            self._job.fd = -1

    def wait(self) -> None:
        """Return once the sync is done; OSError if it failed (each call after
        the first reports the same)."""
        self._join()
        if self._job.err:
            raise OSError(self._job.err, os.strerror(self._job.err))

    def __dealloc__(self):
        self._join()


cdef extern from "<fcntl.h>" nogil:
    int posix_fadvise(int fd, off_t offset, off_t length, int advice)
    int POSIX_FADV_WILLNEED

cdef extern from "<pthread.h>" nogil:
    int pthread_detach(pthread_t th)


cdef struct _WarmJob:
    int fd
    int64_t off
    int64_t length


cdef void *_warm_run(void *arg) noexcept nogil:
    cdef _WarmJob *job = <_WarmJob *>arg
    posix_fadvise(job.fd, <off_t>job.off, <off_t>job.length, POSIX_FADV_WILLNEED)
    c_close(job.fd)
    free(job)
    return NULL


def warm_ahead(int fd, int64_t offset, int64_t length) -> bool:
    """Bring the file pages of ``fd`` from ``offset`` for ``length`` bytes
    into the page cache, in a detached C thread of its own (through a
    ``dup`` of ``fd``, closed by the thread; nothing to join or wait for).
    The tail's space reserved ahead of its lines reads as zeros, without a
    disk read: a later write of those pages then copies into cached pages
    instead of making each one on the write path, which on a busy file
    system waits for its journal (measured: a 700 KB pwrite at the end of a
    file 7.7-11.9 ms on the shared machine, 120-195 us once its pages were
    cached). Advisory: False if no thread or descriptor was to be had."""
    cdef _WarmJob *job
    cdef pthread_t th
    if offset < 0 or length <= 0:
        return False
    job = <_WarmJob *>malloc(sizeof(_WarmJob))
    if job == NULL:
        return False
    job.fd = dup(fd)
    job.off = offset
    job.length = length
    if job.fd < 0:
        free(job)
        return False
    if pthread_create(&th, NULL, _warm_run, job) != 0:
        c_close(job.fd)
        free(job)
        return False
    pthread_detach(th)
    return True


cdef Py_ssize_t _locked_write_once(int fd, const char *buf, Py_ssize_t n, int *err, int *step) noexcept nogil:
    """One try of :func:`locked_write` (no GIL): flock(LOCK_SH), write(2),
    flock(LOCK_UN). The bytes written; ``err`` the errno of a failure (0
    if none), ``step`` where it happened (0 the lock, 1 the write, 2 the
    release after the write); the lock is released either way."""
    cdef Py_ssize_t w = 0
    err[0] = 0
    step[0] = 0
    if flock(fd, LOCK_SH) != 0:
        err[0] = errno
        return 0
    step[0] = 1
    w = c_write(fd, buf, <size_t>n)
    if w < 0:
        err[0] = errno
    if flock(fd, LOCK_UN) != 0 and not err[0]:
        err[0] = errno
        step[0] = 2
    return w


cdef object _write_error(int err, int step, Py_ssize_t n):
    """The OSError of a failed :func:`_locked_write_once` of ``n`` bytes,
    its ``step`` attribute saying where."""
    what = ("flock(LOCK_SH)", f"write of {n} bytes", "flock(LOCK_UN)")[step]
    exc = OSError(err, f"{os.strerror(err)} ({what})")
    exc.step = step
    return exc


def locked_write(int fd, data) -> int:
    """One write(2) of ``data`` to ``fd`` under a shared flock(2) of ``fd``,
    taken and released in the same call, with one release of the GIL: the
    shared event store's append (see rune_fast/framed_log.py). EINTR (a signal
    while waiting for the lock) runs the signal handlers (an exception of one
    is raised, nothing written) and tries again. Returns the bytes written,
    which may be fewer than ``len(data)`` (the caller decides). OSError with
    the errno on failure, its ``step`` attribute saying where: 0 taking the
    lock (nothing written), 1 the write, 2 releasing the lock after the
    write; the lock is released either way."""
    cdef Py_buffer view
    cdef Py_ssize_t w = 0
    cdef int err = 0, step = 0
    _get_buffer(data, &view, "data")
    try:
        while True:
            with nogil:
                w = _locked_write_once(fd, <const char *>view.buf, view.len, &err, &step)
            if err != EINTR or step == 2:
                break
            PyErr_CheckSignals()    # (a write cut by a signal before any byte: nothing written)
        if err:
            raise _write_error(err, step, view.len)
        return w
    finally:
        PyBuffer_Release(&view)


cdef extern from "<signal.h>" nogil:
    ctypedef struct sigset_t:
        pass
    int sigfillset(sigset_t *s)
    int pthread_sigmask(int how, const sigset_t *s, sigset_t *old)
    int SIG_BLOCK


cdef struct _WriteJob:
    int fd
    const char *buf
    Py_ssize_t length
    Py_ssize_t written
    int err
    int step


cdef void *_write_run(void *arg) noexcept nogil:
    cdef _WriteJob *job = <_WriteJob *>arg
    cdef sigset_t every
    # (no signal is delivered to this thread: the process's handlers run
    # in the main thread; a call that still ends with EINTR is tried again)
    sigfillset(&every)
    pthread_sigmask(SIG_BLOCK, &every, NULL)
    while True:
        job.written = _locked_write_once(job.fd, job.buf, job.length, &job.err, &job.step)
        if job.err != EINTR or job.step == 2:
            break
    return NULL


cdef class BackgroundWrite:
    """:func:`locked_write` of ``data`` to ``fd`` (flock(LOCK_SH), one
    write(2), flock(LOCK_UN)) run in a C thread of its own, without the
    GIL: the event store's journal of a large batch, whose write makes a
    new page-cache page for every 4 KiB (1.5 ms of kernel time for the 200
    KB of 1,000 envelopes on the shared machine), overlaps the caller's
    indexing and its wait for the tail's sync. ``data`` is kept until the
    thread is joined; ``fd`` must stay open until then. :meth:`wait` joins
    it and returns the bytes written (fewer than ``len(data)``: the caller
    decides), or raises OSError with the errno and a ``step`` attribute as
    locked_write does. The thread is joined, whatever happens, before the
    object goes away."""
    cdef pthread_t _th
    cdef _WriteJob _job
    cdef Py_buffer _view
    cdef bint _running
    cdef bint _held

    def __cinit__(self, int fd, data):
        cdef int rc
        self._running = False
        self._held = False
        _get_buffer(data, &self._view, "data")
        self._held = True
        self._job.fd = fd
        self._job.buf = <const char *>self._view.buf
        self._job.length = self._view.len
        self._job.written = 0
        self._job.err = 0
        self._job.step = 0
        rc = pthread_create(&self._th, NULL, _write_run, &self._job)
        if rc != 0:
            raise OSError(rc, f"{os.strerror(rc)} (thread of a background write)")
        self._running = True

    cdef void _join(self) noexcept:
        _join_once(&self._th, &self._running)
        if self._held:
            PyBuffer_Release(&self._view)
            self._held = False

    def wait(self) -> int:
        """Join the write; the bytes written, or OSError (each call after
        the first reports the same)."""
        self._join()
        if self._job.err:
            raise _write_error(self._job.err, self._job.step, self._job.length)
        return self._job.written

    def __dealloc__(self):
        self._join()


cdef class TailWriter:
    """Append-only writer of one file (``O_WRONLY|O_APPEND|O_CREAT|O_CLOEXEC``,
    mode 0600). Safe to share between threads: appends are serialised, and the
    GIL is released around write(2) and fdatasync(2).

    A failed write or sync raises DurabilityError naming the path; after that
    the writer refuses appends (a failed write may have left a partial line:
    recover with :meth:`truncate`; a failed sync is final: reopen).
    """

    def __cinit__(self, *args, **kwargs):
        self._c_fd = -1
        self._c_lock = PyThread_allocate_lock()
        if self._c_lock == NULL:
            raise MemoryError("TailWriter: cannot allocate its lock")
        self._failed = ""
        self._sync_failed = False

    def __init__(self, path, bint create=True):
        cdef bytes bpath = os.fsencode(path)
        cdef const char *cpath = bpath
        cdef int flags = O_WRONLY | O_APPEND | O_CLOEXEC
        cdef int fd
        cdef struct_stat st
        if self._c_fd >= 0:
            raise RuneError(f"TailWriter of {self.path} is already open")
        self.path = os.fsdecode(path)
        if create:
            flags |= O_CREAT
        with nogil:
            fd = c_open(cpath, flags, 0o600)
        if fd < 0:
            err = errno
            raise OSError(err, f"cannot open tail {self.path} for appending: {os.strerror(err)}",
                          self.path)
        if fstat(fd, &st) != 0:
            err = errno
            c_close(fd)
            raise OSError(err, f"cannot stat tail {self.path}: {os.strerror(err)}", self.path)
        self._c_fd = fd
        self._size = st.st_size

    def __dealloc__(self):
        if self._c_fd >= 0:
            c_close(self._c_fd)
            self._c_fd = -1
        if self._c_lock != NULL:
            PyThread_free_lock(self._c_lock)
            self._c_lock = NULL

    cdef int _check_open(self) except -1:
        if self._c_fd < 0:
            raise StoreClosedError(f"tail writer of {self.path} is closed")
        return 0

    @property
    def size(self) -> int:
        """Bytes in the file (as far as this writer knows: it is the only writer)."""
        return self._size

    @property
    def closed(self) -> bool:
        return self._c_fd < 0

    def fileno(self) -> int:
        self._check_open()
        return self._c_fd

    def append(self, data) -> int:
        """Append the bytes of `data` with write(2) (looping over partial writes
        and EINTR) and return the offset where they start. Not durable until
        :meth:`sync`."""
        cdef Py_buffer view
        cdef const char *p
        cdef Py_ssize_t left, done = 0
        cdef Py_ssize_t w
        cdef int64_t start
        cdef int err = 0
        _get_buffer(data, &view, "data")
        try:
            with nogil:
                PyThread_acquire_lock(self._c_lock, 1)
            try:
                self._check_open()
                if self._failed:
                    raise DurabilityError(f"tail {self.path} refuses appends: {self._failed}")
                start = self._size
                p = <const char *>view.buf
                left = view.len
                with nogil:
                    while left > 0:
                        w = c_write(self._c_fd, p + done, <size_t>left)
                        if w < 0:
                            if errno == EINTR:
                                continue
                            err = errno
                            break
                        done += w
                        left -= w
                self._size += done
                if err:
                    self._failed = (f"write of {view.len} bytes at offset {start} failed after "
                                    f"{done} bytes: [Errno {err}] {os.strerror(err)}")
                    raise DurabilityError(f"append to {self.path} failed: {self._failed}") \
                        from OSError(err, os.strerror(err), self.path)
                return start
            finally:
                PyThread_release_lock(self._c_lock)
        finally:
            PyBuffer_Release(&view)

    def sync(self) -> None:
        """fdatasync(2) the file: every append made before the call is on stable
        storage when it returns. Failure raises DurabilityError and is final."""
        cdef int rc, err = 0
        self._check_open()
        if self._sync_failed:
            raise DurabilityError(f"tail {self.path} refuses sync: {self._failed}")
        with nogil:
            rc = fdatasync(self._c_fd)
            if rc != 0:
                err = errno
        if rc != 0:
            self._sync_failed = True
            self._failed = f"fdatasync failed: [Errno {err}] {os.strerror(err)}"
            raise DurabilityError(f"sync of {self.path} failed: {self._failed}") \
                from OSError(err, os.strerror(err), self.path)

    def truncate(self, Py_ssize_t size) -> None:
        """Cut the file to `size` bytes (recovery of a torn tail or of a failed
        append; never grows the file). Clears a failed-write state, not a
        failed sync."""
        cdef int rc, err = 0
        with nogil:
            PyThread_acquire_lock(self._c_lock, 1)
        try:
            self._check_open()
            if size < 0 or size > self._size:
                raise FramingError(f"truncate({size}) of {self.path}: size must be within "
                                   f"[0, {self._size}]")
            with nogil:
                rc = ftruncate(self._c_fd, size)
                if rc != 0:
                    err = errno
            if rc != 0:
                raise OSError(err, f"cannot truncate {self.path} to {size}: {os.strerror(err)}",
                              self.path)
            self._size = size
            if not self._sync_failed:
                self._failed = ""
        finally:
            PyThread_release_lock(self._c_lock)

    def close(self) -> None:
        """Close the file descriptor (idempotent). Does not sync."""
        with nogil:
            PyThread_acquire_lock(self._c_lock, 1)
        try:
            if self._c_fd >= 0:
                c_close(self._c_fd)
                self._c_fd = -1
        finally:
            PyThread_release_lock(self._c_lock)

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._c_fd < 0 else f"size={self._size}"
        return f"TailWriter({self.path!r}, {state})"


cdef extern from "sys/mman.h" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int madvise(void *addr, size_t length, int advice)
    int PROT_READ
    int MAP_SHARED
    int MADV_DONTNEED
    void *MAP_FAILED


cdef class MappedFile:
    """A read-only shared map of a whole file, exposed through the buffer
    protocol (the map of a sealed segment). The file descriptor is closed once
    the file is mapped (Python's ``mmap`` keeps a duplicate of it open per
    map); the map is released when the last view of it is."""

    cdef void *_base
    cdef Py_ssize_t _size

    def __len__(self) -> int:
        return self._size

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self._base, self._size, 1, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def release_pages(self) -> None:
        """Drop the page-table entries reads made in this map
        (``madvise(MADV_DONTNEED)``): the file's pages stay in the page
        cache, the next read of one maps it again, and they no longer count
        in the process's resident memory. The map is shared and read-only:
        nothing it shows can be lost. OSError if the call fails."""
        if self._base != NULL and madvise(self._base, <size_t>self._size, MADV_DONTNEED) != 0:
            raise OSError(errno, os.strerror(errno))

    def __dealloc__(self):
        if self._base != NULL:
            munmap(self._base, <size_t>self._size)


cdef off_t _data_end(int fd, off_t size) noexcept nogil:
    """Where the file's last data ends: a hole after it (space reserved by
    ftruncate, never written) is left out, so that no read of the map
    faults on a page the file system cannot back (a full tmpfs raises
    SIGBUS there). ``size`` where the file system cannot tell."""
    cdef off_t pos = 0, data, hole, end = 0
    cdef int i
    for i in range(4096):
        data = lseek(fd, pos, SEEK_DATA)
        if data < 0:
            return end if errno == ENXIO else size
        hole = lseek(fd, data, SEEK_HOLE)
        if hole < 0:
            return size
        end = hole
        if hole >= size:
            return size
        pos = hole
    return size


def data_end(int fd, Py_ssize_t size):
    """Where the data of the open file ``fd`` (of ``size`` bytes) ends: the
    start of its last hole, ``size`` without one (see map_file)."""
    return _data_end(fd, size)


def punch_hole(int fd, Py_ssize_t start, Py_ssize_t end):
    """Give back the blocks of bytes ``[start, end)`` of the open file
    ``fd`` (they read as zeros; the length stays, so a map of the file
    elsewhere stays valid). False where the file system cannot (nothing
    changes then); OSError for any other failure."""
    cdef int rc
    if end <= start:
        return True
    with nogil:
        rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, start, end - start)
    if rc == 0:
        return True
    if errno in (EOPNOTSUPP, ENOSYS, EINVAL):
        return False
    raise OSError(errno, os.strerror(errno))


def map_file(path):
    """(map, size) of the file at `path`: a read-only :class:`MappedFile`, or
    None for an empty file. A hole at its end (space reserved and never
    written: zeros) is left out of the map and of ``size``. OSError (naming
    the file) if it cannot be opened or mapped."""
    cdef bytes p = os.fsencode(path)
    cdef int fd = c_open(p, O_RDONLY | O_CLOEXEC)
    cdef struct_stat st
    cdef off_t size
    cdef void *base
    if fd < 0:
        raise OSError(errno, os.strerror(errno), os.fsdecode(path))
    try:
        if fstat(fd, &st) != 0:
            raise OSError(errno, os.strerror(errno), os.fsdecode(path))
        size = _data_end(fd, st.st_size)
        if size == 0:
            return None, 0
        base = mmap(NULL, <size_t>size, PROT_READ, MAP_SHARED, fd, 0)
        if base == MAP_FAILED:
            raise OSError(errno, os.strerror(errno), os.fsdecode(path))
    finally:
        c_close(fd)
    cdef MappedFile m = MappedFile.__new__(MappedFile)
    m._base = base
    m._size = <Py_ssize_t>size
    return m, m._size
