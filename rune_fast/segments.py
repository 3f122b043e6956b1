"""Tail append: the segment files of the hot tier and the open tail.

Segment ``n`` is the file ``hot/conversation_seg-<n:08d>.jsonl`` once sealed;
the open tail is ``hot/conversation_tail.jsonl``. Lines are frames (see
docs/FORMAT.md). The tail is written with ``pwrite`` at its logical end and
preallocated ahead in zero-filled chunks, so one read-only memory map covers
every appended byte without a remap per append; the zeros past the last line
are preallocation, not damage. No line is ever written through a map (only
the two words of the durable mark, :class:`DurableMark`, which tells viewers
where the synced lines end).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import struct
import threading
import time
import warnings
from typing import Callable, TypeVar

import xxhash

from ._encode import FrameBuffer
from ._log import BackgroundSync, data_end, map_file, punch_hole, pwrite_all, start_writeback, warm_ahead
from ._names import MARK_NAME, TAIL_NAME, filters_name, seg_name
from .errors import DurabilityError, FramingError, StoreClosedError, RecoveryWarning
from .events import fsync_dir

__all__ = ["TAIL_NAME", "MARK_NAME", "seg_name", "filters_name", "segment_ident", "encode_filters",
           "decode_filters", "seal", "unseal", "read_kept", "write_kept", "fsync_dir", "write_file", "release_pages", "Segment",
           "TailFile", "DurableMark", "quarantine_bytes"]

log = logging.getLogger("rune_fast")
T = TypeVar("T")

_MIN_CHUNK = 1 << 20
_MAX_CHUNK = 64 << 20
#: The tail keeps the pages of its reserved space from its end on cached,
#: WARM_MIN to WARM_MAX bytes ahead (four writes' worth), brought in by a
#: thread of their own (_log.warm_ahead) once less than half is left: a
#: write into cached pages skips making them on the write path, which on
#: a busy ext4 waited for the journal (a 700 KB append_many write: 7.7-11.9
#: ms on the shared machine, 120-195 us into cached pages).
_WARM_MIN = 1 << 20
_WARM_MAX = 16 << 20


#: A sealed segment's search filters (HotIndex.seg_filters), kept once a
#: search built them: magic, version, the filter layout (block, overlap, bits,
#: words), the length of the segment's lines and the xxh3_64 of their first
#: and last 4 KiB, the block count, the filters, then the xxh3_64 of
#: everything before it.
#: Version 2 pads the header to 56 bytes, so that the filters' 8-byte words
#: lie aligned in a map of the file and the index reads them there (file
#: pages, not the process's memory); version 1 files (52 bytes) are copied.
#: Version 3 (same header) binds the filters to the bytes up to the
#: segment's last newline (:func:`lines_end`), where versions 1 and 2 bound
#: them to the whole map: the zeros a tail had reserved ahead lie in an
#: unwritten extent whose last block ext4 reports as data while its page is
#: cached and as a hole once evicted, so the map of the same sealed file
#: was ~1 MB shorter after the page cache let it go, and its kept filters
#: were refused as "made for other bytes" (removed, built again). The
#: filters themselves only ever covered blocks before the last newline.
_FILTERS_MAGIC = b"RFSEGGR1"
_FILTERS_HEAD = struct.Struct("<8sIIIIIQQQ")
_FILTERS_HEADS = {1: _FILTERS_HEAD.size, 2: _FILTERS_HEAD.size + 4, 3: _FILTERS_HEAD.size + 4}
_FILTERS_VERSION = 3
_SUM = struct.Struct("<Q")
#: lines_end reads back from a map's end in steps of this many bytes
_BACK_STEP = 64 << 10


def seal(body: bytes) -> bytes:
    """``body`` followed by the xxh3_64 of it: a kept cache file's bytes."""
    return body + _SUM.pack(xxhash.xxh3_64_intdigest(body))


def unseal(raw: bytes | memoryview, head: int) -> int:
    """Where the body of :func:`seal`'s bytes ``raw`` ends (its checksum
    starts); ValueError if it is shorter than a ``head``-byte header or
    fails its checksum."""
    end = len(raw) - _SUM.size
    if end < head:
        raise ValueError(f"{len(raw)} bytes: too short")
    if _SUM.unpack_from(raw, end)[0] != xxhash.xxh3_64_intdigest(memoryview(raw)[:end]):
        raise ValueError("fails its checksum")
    return end


def lines_end(buf) -> int:
    """Where segment bytes ``buf`` end after their last newline (0 if they
    hold none): what a sealed segment's lines hold, however many of the
    zeros reserved after them its map shows (see _FILTERS_VERSION); read
    back from the end a step at a time (those zeros: about 1 MB at most)."""
    mv = memoryview(buf)
    end = len(mv)
    while end > 0:
        start = max(0, end - _BACK_STEP)
        at = mv[start:end].tobytes().rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def segment_ident(buf) -> int:
    """xxh3_64 of a segment's length, its first and its last 4 KiB (what
    binds kept filters to the bytes they were built over: a sealed segment
    never changes, and a new one takes a new number)."""
    mv = memoryview(buf)
    return xxhash.xxh3_64_intdigest(b"".join((len(mv).to_bytes(8, "little"), mv[:4096], mv[-4096:])))


def encode_filters(layout: tuple, buf, words: bytes) -> bytes:
    """The bytes of a kept filters file for segment bytes ``buf``, bound to
    its lines (:func:`lines_end`)."""
    block = layout[3] * 8
    lines = memoryview(buf)[:lines_end(buf)]
    head = _FILTERS_HEAD.pack(_FILTERS_MAGIC, _FILTERS_VERSION, *layout, len(lines), segment_ident(lines),
                              len(words) // block)
    return seal(head + bytes(_FILTERS_HEADS[_FILTERS_VERSION] - _FILTERS_HEAD.size) + words)


def decode_filters(raw: bytes | memoryview, layout: tuple, buf) -> memoryview:
    """The filter words of a kept filters file made for segment bytes
    ``buf`` with ``layout`` (a view of ``raw``: a map stays a map);
    ValueError saying what does not hold."""
    end = unseal(raw, _FILTERS_HEAD.size)
    magic, version, *got, length, ident, blocks = _FILTERS_HEAD.unpack_from(raw, 0)
    if magic != _FILTERS_MAGIC or version not in _FILTERS_HEADS or tuple(got) != tuple(layout):
        raise ValueError(f"format {magic!r} version {version}, layout {tuple(got)}: not this build's")
    bound = memoryview(buf)[:lines_end(buf)] if version >= 3 else buf
    if length != len(bound) or ident != segment_ident(bound):
        raise ValueError("made for other bytes than the segment's")
    head = _FILTERS_HEADS[version]
    if end - head != blocks * layout[3] * 8:
        raise ValueError(f"{end - head} bytes of filters for {blocks} blocks")
    return memoryview(raw)[head:end]


def filters_current(raw: bytes | memoryview) -> bool:
    """Whether kept filters bytes ``raw`` (decoded already) are of this
    build's version: a writer keeps an older one again in it."""
    return _FILTERS_HEAD.unpack_from(raw, 0)[1] == _FILTERS_VERSION


def read_kept(path: str, decode: Callable[[bytes | memoryview], T], *, remove_bad: bool,
              mapped: bool = False) -> T | None:
    """``decode`` of the kept cache file at ``path`` (search filters), None
    if there is none or it does not hold: one that cannot be read, or that
    ``decode`` refuses (ValueError saying why), is named in a log warning and,
    with ``remove_bad`` (a writer), removed; the search builds it again.
    ``mapped``: ``decode`` gets a read-only map of the file instead of its
    bytes (a kept file is replaced by a rename, never written in place: the
    map keeps what it mapped)."""
    raw: bytes | memoryview
    try:
        if mapped:
            m, _size = map_file(path)        # (no descriptor kept open)
            raw = b"" if m is None else memoryview(m)
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s: search filters not read (%s); a later search builds them again", path, exc)
        return None
    try:
        return decode(raw)
    except (ValueError, struct.error) as exc:
        log.warning("%s: search filters not used: %s; a later search builds them again", path, exc)
        if remove_bad:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return None


def _reserve(fd: int, start: int, end: int) -> None:
    """Back bytes ``[start, end)`` of the file with blocks (posix_fallocate;
    the file grows to ``end`` if shorter), so that writing or reading them
    through a map never meets a full disk. A file system that cannot
    (EOPNOTSUPP, EINVAL) gets the length alone (ftruncate: a hole)."""
    try:
        os.posix_fallocate(fd, start, end - start)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        if os.fstat(fd).st_size < end:
            os.ftruncate(fd, end)


def _map(fd: int, size: int):
    if size == 0:
        return None
    return mmap.mmap(fd, size, access=mmap.ACCESS_READ)


def write_kept(path: str, data: "bytes | bytearray | list[bytes]", *, tmp: str, sync: bool) -> bool:
    """Write the kept cache file ``path`` (search filters; ``data``: its
    bytes, or their pieces, see ``write_file``): temp file ``tmp``
    (0600; fsynced when ``sync``), renamed over it; the folder is not synced
    (a cache: one a crash loses or cuts is built again). A failed write is
    named in a log warning and False returned: the search that built the
    filters has its answer."""
    try:
        write_file(tmp, data, sync=sync)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("%s: search filters not kept: %s", path, exc)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        return False
    return True


def release_pages(buf) -> None:
    """Drop the page-table entries that reads made in a segment's or the
    tail's map (``madvise(MADV_DONTNEED)``; None: no map). The file's pages
    stay in the page cache and the next read maps them again; meanwhile they
    no longer count in the process's resident memory. The maps are shared
    and read-only: nothing can be lost. OSError if the call fails."""
    if buf is None:
        return
    if isinstance(buf, mmap.mmap):
        buf.madvise(mmap.MADV_DONTNEED)
    else:
        buf.release_pages()


class Segment:
    """A sealed segment: a read-only file and its map. ``size`` is where
    its data ends (what is mapped: the zeros a tail had reserved ahead are
    left out where they are a hole); ``file_size`` is the file's length,
    which index snapshots record (a sealed file never changes)."""

    def __init__(self, path: str, seg: int) -> None:
        self.path = path
        self.seg = seg
        self.buf, self.size = map_file(path)
        self.file_size = os.stat(path).st_size

    def close(self) -> None:
        self.buf = None


class TailFile:
    """The open tail: appends at the logical end, one map over the whole file.

    ``size`` is the logical end (bytes of complete lines); the file may be
    longer, zero-filled. ``remapped`` counts how often the map was replaced, so
    the caller knows when to hand the index the new buffer.
    """

    def __init__(self, path: str, seg: int, *, logical_size: int | None = None,
                 read_only: bool = False) -> None:
        self.path = path
        self.seg = seg
        self.read_only = read_only
        flags = os.O_CLOEXEC | (os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT)
        self._fd = os.open(path, flags, 0o600)
        self.file_size = os.fstat(self._fd).st_size
        if not read_only:
            self.file_size = self._backed_size()
        self.size = self.file_size if logical_size is None else logical_size
        self.buf = _map(self._fd, self.file_size)
        self.failed: BaseException | None = None
        self._warm_end = self.size        # cached from the end up to here (see _WARM_MIN)
        if not read_only and self.file_size > self.size:
            stop = min(self.size + _WARM_MIN, self.file_size)
            if warm_ahead(self._fd, self.size, stop - self.size):
                self._warm_end = stop
        self._io_lock = threading.Lock()
        #: the folder's entry for this file is not known durable: the first
        #: :meth:`sync` fsyncs the folder before it reports any line durable
        self.entry_unsynced = False

    # -- reading -------------------------------------------------------
    def refresh_map(self) -> bool:
        """Re-map if the file grew (a reader beside a writer). True if remapped."""
        st = os.fstat(self._fd).st_size
        if st == self.file_size:
            return False
        self.file_size = st
        self.buf = _map(self._fd, st)
        return True

    # -- writing -------------------------------------------------------
    def _backed_size(self) -> int:
        """The part of the file the writer maps: all of it once the space
        reserved ahead is backed by blocks (a tail written by an older build
        reserved it as a hole). Where the file system cannot back it (a full
        disk), only the bytes before the hole: a read of a hole that a full
        tmpfs cannot back kills the process (SIGBUS), and the hole holds no
        line; appends reserve it again."""
        end = data_end(self._fd, self.file_size)
        if end < self.file_size:
            try:
                _reserve(self._fd, end, self.file_size)
            except OSError as exc:
                log.warning("%s: the %d bytes reserved after offset %d cannot be backed (%s): "
                            "left out of the map", self.path, self.file_size - end, end, exc)
                return end
        return self.file_size

    def _ensure_capacity(self, need: int, write: int = 0) -> bool:
        """Reserve space for the file to hold ``need`` bytes (blocks, not a
        hole: see _reserve), a chunk ahead (at least four writes of
        ``write`` bytes: an append_many of 1,000 messages, 470 KB, remapped
        the tail, and re-attached it to the index, every other call with
        1 MiB chunks); on a disk too full for the chunk, just what the
        write needs. OSError naming the file if even that cannot be had:
        nothing is written then."""
        if need <= self.file_size:
            return False
        chunk = min(max(self.file_size // 4, _MIN_CHUNK, 4 * write), _MAX_CHUNK)
        new_size = max(need, self.file_size + chunk)
        try:
            _reserve(self._fd, self.file_size, new_size)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise OSError(exc.errno, exc.strerror, self.path) from exc
            new_size = need
            try:
                _reserve(self._fd, self.file_size, new_size)
            except OSError as exc2:
                raise OSError(exc2.errno, exc2.strerror, self.path) from exc2
        self.file_size = new_size
        self.buf = _map(self._fd, new_size)
        return True

    def append(self, data: bytes | FrameBuffer) -> tuple[int, bool]:
        """Write ``data`` at the logical end. Returns (offset, remapped).

        Not durable until :meth:`sync`. A failed write leaves the tail refusing
        further appends (``DurabilityError``), never half-acknowledged.
        """
        if self._fd < 0:
            raise StoreClosedError(f"tail {self.path} is closed")
        if self.read_only:
            raise FramingError(f"tail {self.path} is open read-only")
        if self.failed is not None:
            raise DurabilityError(f"tail {self.path} refused the append: an earlier write or sync "
                                  f"failed ({self.failed}); reopen the store") from self.failed
        off = self.size
        try:
            remapped = self._ensure_capacity(off + len(data), len(data))
            pwrite_all(self._fd, data, off)
        except OSError as exc:
            self.failed = exc
            raise DurabilityError(f"write to {self.path} at offset {off} failed: {exc}") from exc
        self.size = end = off + len(data)
        ahead = min(max(4 * len(data), _WARM_MIN), _WARM_MAX)
        if self._warm_end - end < ahead // 2 and end < self.file_size:
            start = max(end, self._warm_end)
            stop = min(end + ahead, self.file_size)
            if stop > start and warm_ahead(self._fd, start, stop - start):
                self._warm_end = stop
        return off, remapped

    def start_writeback(self, off: int, n: int) -> None:
        """Start writing the ``n`` bytes appended at ``off`` to the disk
        without waiting (_log.start_writeback): the :meth:`sync` that makes
        them durable then waits for less. Advisory: nothing fails here."""
        start_writeback(self._fd, off, n)

    def sync(self) -> None:
        """fdatasync the tail; on failure the tail refuses every later write."""
        if self.failed is not None:
            raise DurabilityError(f"tail {self.path}: an earlier write or sync failed "
                                  f"({self.failed}); reopen the store") from self.failed
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            self.failed = exc
            raise DurabilityError(f"fdatasync of {self.path} failed: {exc}") from exc
        if self.entry_unsynced:
            try:
                fsync_dir(os.path.dirname(self.path))
            except DurabilityError as exc:
                self.failed = exc
                raise
            self.entry_unsynced = False

    def sync_begin(self) -> BackgroundSync:
        """Start an fdatasync of the tail in a thread of its own (see
        BackgroundSync: the caller's work overlaps it); :meth:`sync_end`
        waits for it. DurabilityError if the tail refuses (an earlier
        failure); OSError if the thread cannot be had (the caller syncs
        with :meth:`sync` instead)."""
        if self.failed is not None:
            raise DurabilityError(f"tail {self.path}: an earlier write or sync failed "
                                  f"({self.failed}); reopen the store") from self.failed
        return BackgroundSync(self._fd)

    def sync_end(self, job: BackgroundSync) -> None:
        """Wait for the sync :meth:`sync_begin` started; on failure the tail
        refuses every later write, as after a failed :meth:`sync`."""
        try:
            job.wait()
        except OSError as exc:
            self.failed = exc
            raise DurabilityError(f"fdatasync of {self.path} failed: {exc}") from exc

    def release_reserved(self) -> None:
        """Give back the space reserved after the last line (a tail about to
        be sealed): it stays zeros, as a hole. A file system that cannot
        keeps it as it is."""
        try:
            punch_hole(self._fd, self.size, self.file_size)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.path) from exc

    def discard_from(self, size: int) -> None:
        """Zero every byte from ``size`` on and make ``size`` the logical end
        (recovery of a torn final line, whose bytes were quarantined first).

        The file never shrinks: a viewer in another process may have it mapped,
        and a map past the end of a shrunk file faults (SIGBUS). Zeros after the
        last line read as preallocation."""
        zeros = bytes(min(self.file_size - size, 1 << 20)) if self.file_size > size else b""
        pos = size
        while pos < self.file_size:
            n = min(len(zeros), self.file_size - pos)
            pos += os.pwrite(self._fd, zeros[:n], pos)
        os.fsync(self._fd)
        self.size = size

    def close(self) -> None:
        if self._fd >= 0:
            # The preallocated zeros stay: shrinking a file that a viewer may
            # have mapped would fault its reads (SIGBUS).
            os.close(self._fd)
            self._fd = -1
        self.buf = None


class DurableMark:
    """``hot/conversation_tail.durable``: where the writer's durable tail
    lines end, for viewers (a viewer reads the tail's bytes as the writer
    writes them, before they are synced). 24 bytes: ``RFDURBL1``, the
    location ``(tail_seg << 40) | offset`` as a little-endian uint64, and its
    bitwise complement as a check, each stored and read as one aligned
    8-byte word through a shared map (no system call per append; not synced:
    a writer's open writes it again).

    The writer opens it with ``writer=True`` (created 0600, zeros, if missing
    or not this format; the magic follows the words at the first
    :meth:`publish`); a viewer with ``writer=False`` reads it, and reads
    ``None`` while it is missing or not (yet) this format (a store whose
    writer predates it), or when its check fails (damage: one log record):
    every complete line is then visible, as before there was a mark --
    damage here may show a viewer a line before its sync, never hide one."""

    MAGIC = b"RFDURBL1"
    SIZE = 24
    _ONES = (1 << 64) - 1

    def __init__(self, path: str, *, writer: bool) -> None:
        self.path = path
        self.writer = writer
        self._map: mmap.mmap | None = None
        self._magic = False         # (writer) the magic is in place
        self._bad: tuple[int, int] | None = None    # (viewer) words found failing their check
        if writer:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                self._magic = os.fstat(fd).st_size == self.SIZE and os.pread(fd, 8, 0) == self.MAGIC
                if not self._magic:
                    # no mark until the first publish: a viewer sees every line meanwhile
                    os.ftruncate(fd, 0)
                    os.ftruncate(fd, self.SIZE)
                self._map = mmap.mmap(fd, self.SIZE, access=mmap.ACCESS_WRITE)
            finally:
                os.close(fd)

    def _attach(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            if os.fstat(fd).st_size < self.SIZE or os.pread(fd, 8, 0) != self.MAGIC:
                return False
            self._map = mmap.mmap(fd, self.SIZE, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        return True

    def read(self) -> int | None:
        """The location the writer last published, or None (no mark, or a
        damaged one)."""
        if self._map is None and (self.writer or not self._attach()):
            return None
        m = self._map
        assert m is not None
        for attempt in range(20):
            loc, check = _WORDS.unpack_from(m, 8)
            if check == loc ^ self._ONES:
                self._bad = None
                return loc
            if (loc, check) == self._bad:
                return None         # the damage already reported
            time.sleep(0.001 if attempt else 0)    # the writer is between its two stores
        log.warning("%s: the durable mark fails its check (%#x, %#x); every complete tail "
                    "line is visible", self.path, loc, check)
        self._bad = (loc, check)
        return None

    def stored(self) -> int | None:
        """(writer) The location a writer published before this one opened
        the mark, as the file holds it; None when it holds none (a new mark,
        or one that fails its check). Stores are not synced: after a power
        loss it may lag the tail's durable end, never pass it (it is
        published after the sync) -- except in "none" mode, which publishes
        without one."""
        if self._map is None or not self._magic:
            return None
        loc, check = _WORDS.unpack_from(self._map, 8)
        return loc if check == loc ^ self._ONES else None

    def publish(self, loc: int) -> None:
        """Store ``loc`` (writer; the caller keeps it from moving backwards)."""
        assert self._map is not None
        _WORDS.pack_into(self._map, 8, loc, loc ^ self._ONES)    # one call: no other thread runs in between
        if not self._magic:
            self._map[0:8] = self.MAGIC         # after the words: a viewer that sees it sees them
            self._magic = True

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


#: the mark's location and its check: two little-endian words after the magic
_WORDS = struct.Struct("<QQ")


def write_file(path: str, data: "bytes | bytearray | list[bytes]", *, exclusive: bool = False,
               sync: bool = True) -> None:
    """Create ``path`` (0600; ``exclusive``: it must not exist) holding
    ``data`` (or its pieces, one after the other), fsynced unless ``sync``
    is false. The caller fsyncs the folder."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        for piece in data if isinstance(data, list) else (data,):
            view = memoryview(piece)
            while view:
                view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    except OSError as exc:
        # (os.write and os.fsync name no file)
        raise OSError(exc.errno, exc.strerror, path) from exc
    finally:
        os.close(fd)


def quarantine_bytes(qdir: str, source: str, offset: int, data: bytes) -> str:
    """Keep the bytes of a torn final line in a quarantine file; returns its path.

    Reported with a ``warnings`` warning and a log record: nothing is dropped
    silently.
    """
    os.makedirs(qdir, mode=0o700, exist_ok=True)
    name = f"{os.path.basename(source)}.{offset}.{time.time_ns()}.torn"
    path = os.path.join(qdir, name)
    try:
        write_file(path, data, exclusive=True)
    except OSError:
        # (a full disk: no empty quarantine file is left behind)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    fsync_dir(qdir)
    msg = (f"rune_fast: {source}: a final line cut short at offset {offset} ({len(data)} bytes, "
           f"an append that was never acknowledged) was moved to {path}")
    log.warning(msg)
    warnings.warn(msg, RecoveryWarning, stacklevel=3)
    return path
