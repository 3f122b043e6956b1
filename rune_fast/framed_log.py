"""The framed append-only log: one file of checksummed lines.

Every line of a rune_fast log is one *frame* (docs/DESIGN.md, "The frame")::

    {"x":"<16 lowercase hex of xxh3_64(rest)>"<rest>\\n

``rest`` starts with ``,"`` and ends with ``}`` and holds no raw newline, so each
line is a JSON object by itself and a flipped byte anywhere in it is caught.

:class:`FramedLog` owns one such file: appends are single ``write(2)`` calls on
an ``O_APPEND`` descriptor (so several processes may append to one file), a
sync makes everything appended so far durable, and opening recovers from a
crash (a torn final line is quarantined, never silently dropped). The event
store (:mod:`rune_fast.events`) and the task store build on it; the
conversation tail writes the same frames through the compiled core.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Callable, Literal, cast, overload

import orjson
import xxhash

from ._log import BackgroundWrite, locked_write, scan_frames
from .fsutil import _close_fd, ensure_private_dir, fsync_dir
from .errors import (
    RecoveryWarning,
    CorruptStateCheckpointError,
    DurabilityError,
    FramingError,
    ReadOnlyStoreError,
    StoreClosedError,
)

log = logging.getLogger("rune_fast.framed_log")

MAX_LINE = 16 * 1024 * 1024
"""Largest frame in bytes, prefix and newline included."""

_PREFIX_LEN = 23  # len('{"x":"') + 16 hex + len('"')
_HEX = frozenset(b"0123456789abcdef")
_READ_CHUNK = 1 << 20
NEWLINE = b"\n"


# ----------------------------------------------------------------- the frame
# The one place that computes line checksums. It matches the compiled core's
# rune_fast._log.frame byte for byte (xxh3_64, seed 0), so this can switch to it.


def frame(rest: bytes) -> bytes:
    """Return the full framed line for ``rest`` (newline included).

    ``rest`` must start with ``,"``, end with ``}``, hold no ``\\n`` byte, and
    the line must fit in :data:`MAX_LINE`; otherwise :class:`FramingError`.
    """
    if not rest.startswith(b',"') or not rest.endswith(b"}"):
        raise FramingError(f"frame: rest must start with ',\"' and end with '}}', got {bytes(rest[:16])!r}...")
    if b"\n" in rest:
        raise FramingError(f"frame: rest holds a raw newline at byte {rest.index(NEWLINE)}")
    if len(rest) + _PREFIX_LEN + 1 > MAX_LINE:
        raise FramingError(f"frame: line of {len(rest) + _PREFIX_LEN + 1} bytes exceeds MAX_LINE {MAX_LINE}")
    return b'{"x":"' + xxhash.xxh3_64_hexdigest(rest).encode("ascii") + b'"' + rest + b"\n"


def frame_object(obj: Mapping[str, Any]) -> bytes:
    """Frame a non-empty JSON object whose keys do not include ``"x"``:
    ``rest`` is its compact JSON with the opening brace replaced by a comma."""
    if not obj:
        raise FramingError("frame_object: the object must not be empty")
    if "x" in obj:
        raise FramingError("frame_object: the key 'x' is reserved for the checksum")
    try:
        body = orjson.dumps(obj)
    except TypeError as exc:
        raise FramingError(f"frame_object: not JSON-serialisable: {exc}") from None
    return frame(b"," + body[1:])


def check_line(line: bytes | memoryview) -> str:
    """Check one line (without its newline). Return ``""`` if sound, else a
    short reason (``"bad prefix"``, ``"bad hex"``, ``"checksum mismatch"``)."""
    if len(line) < _PREFIX_LEN + 3 or line[:6] != b'{"x":"' or line[22:25] != b'","':
        return "bad prefix"
    hexpart = bytes(line[6:22])
    if not _HEX.issuperset(hexpart):
        return "bad hex"
    if line[-1:] != b"}":
        return "bad prefix"
    if xxhash.xxh3_64_hexdigest(line[_PREFIX_LEN:]).encode("ascii") != hexpart:
        return "checksum mismatch"
    return ""


def parse_line(line: bytes, *, path: str = "", offset: int = 0) -> dict[str, Any]:
    """Verify one line (without newline) and return its JSON object without the
    ``"x"`` key. :class:`CorruptStateCheckpointError` naming ``path`` and
    ``offset`` if it fails its check or does not parse."""
    reason = check_line(line)
    if reason:
        raise CorruptStateCheckpointError(f"damaged line: {reason}", path=path, offset=offset)
    return parse_checked(line, path=path, offset=offset)


def parse_checked(line: bytes, *, path: str = "", offset: int = 0) -> dict[str, Any]:
    """:func:`parse_line` of a line that passed :func:`check_line` already
    (one that :meth:`FramedLog.iter_lines` yields)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise CorruptStateCheckpointError(f"damaged line: JSON error {exc}", path=path, offset=offset) from None
    if not isinstance(obj, dict):
        raise CorruptStateCheckpointError("damaged line: not a JSON object", path=path, offset=offset)
    del obj["x"]
    return obj


@contextmanager
def _exclusive(fd: int) -> Iterator[None]:
    """Hold the file's ``flock`` exclusively: no appender (each holds it
    shared for its one write) is inside a write meanwhile."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


class _Pending:
    """A write :meth:`FramedLog.append_bytes_begin` started: its bytes, its
    thread until joined, the error it ended with."""
    __slots__ = ("log", "n", "job", "error")

    def __init__(self, log: "FramedLog", n: int) -> None:
        self.log = log
        self.n = n
        self.job: BackgroundWrite | None = None
        self.error: DurabilityError | None = None

    def end(self) -> None:
        """Wait for the write; DurabilityError naming the file if it failed."""
        self.log.append_bytes_end(self)


class FramedLog:
    """One append-only file of framed lines.

    ``FramedLog(path)`` opens (creating it 0600, its folder 0700) for appending
    and recovers: a final line without newline is a torn append that was never
    acknowledged -- its bytes move to ``<path>.quarantine-<n>``, the file is cut
    back, and a :class:`RecoveryWarning` plus a log record report it (also kept
    in :attr:`quarantined`). Zero bytes after the last complete line
    (preallocation) are cut away. A complete final line that fails its check is
    damage: :class:`CorruptStateCheckpointError` naming the file and offset --
    unless it holds a zero byte: a page of an unsynced append that a power
    loss lost, quarantined as a torn final line. Damage further back is found
    by :meth:`iter_lines` and :meth:`verify` (with ``zeroed_lost``, the event
    store's, a line there that holds a zero byte is skipped as torn).

    ``read_only=True`` changes nothing on disk (no recovery, appends raise
    :class:`ReadOnlyStoreError`); an incomplete final line is then read as an
    append in flight and skipped.

    Appends are one ``write(2)`` each on an ``O_APPEND`` descriptor and are not
    durable until :meth:`sync`. Other processes may append to the same file;
    appenders hold a shared ``flock`` on it while writing and recovery an
    exclusive one, so recovery never cuts another process's append in half.
    All methods are thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False,
                 zeroed_lost: bool = False) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.read_only = read_only
        # (the event store) a complete line that holds a zero byte and fails
        # its check is a write a power loss tore, not damage: see iter_lines
        self.zeroed_lost = zeroed_lost
        self._zeroed_seen: set[int] = set()
        self.quarantined: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        self._failed: str | None = None
        self._closed = False
        self._unsynced = False   # appends since the last sync
        self._closed_size = 0
        self._pending: _Pending | None = None     # (see append_bytes_begin)
        if read_only:
            self._fd = -1
            if not os.path.exists(self.path):
                raise FileNotFoundError(errno.ENOENT, "log file does not exist (read-only open)", self.path)
            self._closer = None
            return
        ensure_private_dir(os.path.dirname(self.path))
        created = not os.path.exists(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._closer = weakref.finalize(self, _close_fd, self._fd)
        try:
            if created:
                os.fsync(self._fd)
                fsync_dir(os.path.dirname(self.path))
            self._recover()
        except BaseException:
            self._closer()
            raise

    # -- recovery -----------------------------------------------------------

    def _recover(self) -> None:
        with _exclusive(self._fd):
            size = os.fstat(self._fd).st_size
            if size == 0:
                return
            with open(self.path, "rb") as f:
                end_of_lines, tail = _find_tail(f, size, self.path)
                if end_of_lines > 0:
                    start = _line_start(f, end_of_lines - 1)
                    f.seek(start)
                    last = f.read(end_of_lines - 1 - start)
                    reason = check_line(last)
                    if reason and b"\0" in last:
                        # a page a power loss did not write: a torn final line
                        end_of_lines, tail = start, (last + b"\n" + tail).strip(b"\0")
                    elif reason:
                        raise CorruptStateCheckpointError(
                            f"damaged final line: {reason}", path=self.path, offset=start)
            if end_of_lines == size:
                return
            if not tail:  # zero padding (preallocation): not damage; cut it so appends stay contiguous
                os.ftruncate(self._fd, end_of_lines)
                os.fsync(self._fd)
                return
            qpath = self._quarantine(tail)
            os.ftruncate(self._fd, end_of_lines)
            os.fsync(self._fd)
            entry = {"path": self.path, "offset": end_of_lines, "length": len(tail), "quarantine": qpath}
            self.quarantined.append(entry)
            message = (f"torn final line in {self.path} at offset {end_of_lines} "
                       f"({len(tail)} bytes) moved to {qpath}")
            log.warning("%s", message)
            warnings.warn(message, RecoveryWarning, stacklevel=4)

    def _quarantine(self, data: bytes) -> str:
        n = 0
        while True:
            qpath = f"{self.path}.quarantine-{n}"
            try:
                fd = os.open(qpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                n += 1
                continue
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            except OSError as exc:
                # (a full disk: no empty quarantine file is left behind)
                os.close(fd)
                os.unlink(qpath)
                raise OSError(exc.errno, exc.strerror, qpath) from exc
            os.close(fd)
            fsync_dir(os.path.dirname(qpath))
            return qpath

    # -- writing -----------------------------------------------------------

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"log {self.path} is closed")
        if self.read_only:
            raise ReadOnlyStoreError(f"log {self.path} is open read-only")
        if self._failed is not None:
            raise DurabilityError(f"log {self.path} refuses writes after a failed write or sync: {self._failed}")

    @overload
    def append_bytes(self, data: bytes, *, offset: Literal[True] = ...) -> int: ...
    @overload
    def append_bytes(self, data: bytes, *, offset: bool) -> int | None: ...

    def append_bytes(self, data: bytes, *, offset: bool = True) -> int | None:
        """Append already framed lines with one ``write(2)``; return the offset
        where they start (None with ``offset=False``, which saves the
        ``lseek``). Not durable until :meth:`sync`."""
        with self._lock:
            self._settle()
            self._check_writable()
            fd = self._fd
            self._unsynced = True
            try:
                # flock(LOCK_SH), write(2), flock(LOCK_UN) in one compiled call
                written = locked_write(fd, data)
                end = os.lseek(fd, 0, os.SEEK_CUR) if offset or written != len(data) else None
            except OSError as exc:
                raise self._write_failed(exc) from exc
            if written != len(data):
                # (end is known: a short write takes the lseek)
                raise self._short_write(written, len(data), f" at offset {cast(int, end) - written}")
            return None if end is None else end - written

    def _write_failed(self, exc: OSError) -> DurabilityError:
        """The error of a locked write that raised (lock held); the log then
        refuses writes, unless the lock was not taken (nothing written)."""
        if getattr(exc, "step", 1) >= 1:
            self._failed = str(exc)
        return DurabilityError(f"append to {self.path} failed: {exc}")

    def _short_write(self, written: int, n: int, where: str = "") -> DurabilityError:
        """The error of a write of ``n`` bytes that wrote ``written`` (lock
        held); the log then refuses writes."""
        self._failed = f"short write {written} of {n} bytes"
        return DurabilityError(f"append to {self.path}: {self._failed}{where}")

    def append_bytes_begin(self, data: bytes) -> "_Pending":
        """:meth:`append_bytes` of ``data`` (no offset) in a C thread
        (``_log.BackgroundWrite``; its new page-cache pages cost 1.5 ms for
        append_many(1,000)'s envelopes, now beside the caller's work). Every
        other call of this log waits for it first (the file keeps the order
        of the calls); :meth:`append_bytes_end` raises what
        :meth:`append_bytes` would have."""
        with self._lock:
            self._settle()
            self._check_writable()
            token = _Pending(self, len(data))
            try:
                token.job = BackgroundWrite(self._fd, data)
            except OSError:                 # (no thread to be had: written here)
                try:
                    self.append_bytes(data, offset=False)
                except DurabilityError as exc:
                    token.error = exc
                return token
            self._unsynced = True
            self._pending = token
            return token

    def append_bytes_end(self, token: "_Pending") -> None:
        """Wait for the write :meth:`append_bytes_begin` started;
        DurabilityError naming the file if it failed."""
        with self._lock:
            if self._pending is token:
                self._settle()
        if token.error is not None:
            raise token.error

    def _settle(self) -> None:
        """Join the write in flight, if any (lock held); a failed one makes
        the log refuse writes, as a failed :meth:`append_bytes` does."""
        token, self._pending = self._pending, None
        if token is None or token.job is None:
            return
        job, token.job = token.job, None
        try:
            written = job.wait()
        except OSError as exc:
            token.error = self._write_failed(exc)
            return
        if written != token.n:
            token.error = self._short_write(written, token.n)

    def sync(self) -> None:
        """Make every append so far durable (one ``fdatasync``).
        :class:`DurabilityError` naming the file if it fails; the log then
        refuses further writes (a failed sync may have lost pages). After a
        clean :meth:`close` (which synced) there is nothing left to sync: a
        repository sharing the log may still ask, whatever order a caller
        closes them in. Nor after a sync with no append since (a store
        opened, read and closed syncs nothing: each fdatasync is a cache
        flush of the device, 0.1-10 ms on a shared disk)."""
        with self._lock:
            self._settle()
            if self._closed and self._failed is None and not self.read_only:
                return
            self._check_writable()
            if not self._unsynced:
                return
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                self._failed = f"fdatasync failed: {exc}"
                raise DurabilityError(f"sync of {self.path} failed: {exc}") from exc
            self._unsynced = False

    @property
    def size(self) -> int:
        """Current size of the file in bytes."""
        with self._lock:
            self._settle()
            if self._closed:
                if self._failed is None and not self.read_only:
                    return self._closed_size   # a repository sharing the log may close after it
                raise StoreClosedError(f"log {self.path} is closed")
            if self._fd >= 0:
                return os.fstat(self._fd).st_size
            return os.stat(self.path).st_size

    def line_end(self) -> int:
        """Where the file's complete lines end now: its size read while no
        appender is inside its write. Every appender (an EventStore of this
        or another repository, in this or another process) writes whole
        lines holding a shared ``flock``; this takes it exclusively for the
        ``fstat``. A size read without it can fall inside a line another
        appender is writing (a long envelope grows the file a page at a
        time): a checkpoint that recorded it would point mid-line."""
        with self._lock:
            self._settle()      # (this process's write in flight holds the lock too)
            if self._closed:
                return self.size
            fd = self._fd if self._fd >= 0 else os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                with _exclusive(fd):
                    return os.fstat(fd).st_size
            finally:
                if fd != self._fd:
                    os.close(fd)

    def next_line_start(self, offset: int) -> int:
        """``offset`` if a line starts there (or it is 0 or past the end),
        else where the next line starts: a checkpoint of an earlier build may
        have recorded a size read while another appender's line was half
        written (see :meth:`line_end`)."""
        if offset <= 0:
            return 0
        with open(self.path, "rb") as f:
            f.seek(offset - 1)
            pos = offset - 1
            while True:
                chunk = f.read(4096)
                if not chunk:
                    return max(offset, pos)
                nl = chunk.find(b"\n")
                if nl >= 0:
                    return pos + nl + 1
                pos += len(chunk)

    # -- reading -----------------------------------------------------------

    def iter_lines(self, start: int = 0) -> Iterator[tuple[int, bytes]]:
        """Yield ``(offset, line)`` for every verified complete line from
        ``start`` (a line boundary) on; ``line`` excludes the newline.

        A complete line that fails its check raises
        :class:`CorruptStateCheckpointError` naming the file and offset. An
        incomplete final line (another writer's append in flight) and zero
        padding end the iteration.
        """
        for offset, line, reason in self._scan(start):
            if reason is None:
                return
            if reason and self.zeroed_lost and b"\0" in line:
                # SPEC: bytes written after the last durable point may come
                # back torn anywhere after a power loss (a page lost, read as
                # zeros, before a later one kept); no sound line holds a zero
                # byte. Skipped and reported: the repository that wrote it
                # writes its envelope again from the record it holds
                if offset not in self._zeroed_seen:
                    self._zeroed_seen.add(offset)
                    log.warning("%s: the line at offset %d holds zero bytes and fails its check (%s): "
                                "a write a power loss tore, skipped", self.path, offset, reason)
                continue
            if reason:
                raise CorruptStateCheckpointError(f"damaged line: {reason}", path=self.path, offset=offset)
            yield offset, line

    def _scan(self, start: int, stop: int | None = None) -> Iterator[tuple[int, bytes, str | None]]:
        """Yield (offset, line, reason) for complete lines (reason "" if sound)
        and, at the end, (offset, tail, None) for non-zero bytes after the last
        newline, if any. Zero padding at the end is skipped. ``stop``: read
        no byte at or past it (what was appended after a :meth:`line_end`)."""
        if self._closed:
            raise StoreClosedError(f"log {self.path} is closed")
        with open(self.path, "rb") as f:
            f.seek(start)
            offset = start          # file offset of buf[0]
            zeros_from = -1         # start of a skipped run of zero bytes, if any
            buf = b""
            left = -1 if stop is None else max(0, stop - start)
            while True:
                chunk = f.read(_READ_CHUNK if left < 0 else min(_READ_CHUNK, left))
                if left >= 0:
                    left -= len(chunk)
                if not chunk:
                    break
                buf += chunk
                pos = 0
                while True:
                    nl = buf.find(b"\n", pos)
                    if nl < 0:
                        break
                    if zeros_from >= 0:
                        yield zeros_from, b"", "zero bytes inside the log"
                        return
                    line = buf[pos:nl]
                    yield offset, line, check_line(line)
                    offset += nl + 1 - pos
                    pos = nl + 1
                buf = buf[pos:]
                if len(buf) > MAX_LINE:
                    if buf.count(0) != len(buf):
                        yield offset, b"", "line longer than MAX_LINE"
                        return
                    if zeros_from < 0:
                        zeros_from = offset
                    offset += len(buf)
                    buf = b""
            if buf and buf.count(0) != len(buf):
                yield (zeros_from if zeros_from >= 0 else offset), buf, None

    def verify(self, stop: int | None = None, sound: Callable[[int, bytes], str] | None = None,
               taken: Callable[[bytes, Any, Any, int], Any] | None = None) -> list[dict[str, Any]]:
        """Check every line; never raises for damage. Return one
        ``{"path", "offset", "problem"}`` dict per damaged line (and one for a
        non-zero incomplete final line). The lines checked end where complete
        lines ended when it started (``stop``, default :meth:`line_end`): an
        append in flight then is not an incomplete line. ``sound(offset,
        line)`` is called for each line that passes its check (in the same
        pass) and returns a problem of its content, or ``""``; but not for
        those ``taken(data, offsets, lengths, base)`` takes (called first for
        each part of the file read, ``base`` its offset, with the offsets and
        lengths of its sound lines in ``data``; returns a uint8 array, 1 for
        each line it took as sound: a compiled check of the usual lines)."""
        problems: list[dict[str, Any]] = []
        end = self.line_end() if stop is None else stop
        for offset, line, reason in self._scan(self._verify_sound(end, sound, problems, taken), end):
            if reason is None:
                reason = "incomplete final line (torn, or an append in flight)"
            elif not reason and sound is not None:
                reason = sound(offset, line)
            if reason:
                problems.append({"path": self.path, "offset": offset, "problem": reason})
        return problems

    def _verify_sound(self, end: int, sound: Callable[[int, bytes], str] | None,
                      problems: list[dict[str, Any]],
                      taken: Callable[[bytes, Any, Any, int], Any] | None = None) -> int:
        """:meth:`verify`'s lines from the start checked in compiled code
        (``_log.scan_frames``, the same check as :func:`check_line`: a
        million lines in ~0.1 s, where the Python loop took ~1.5 s), each
        sound one handed to ``sound``, a _READ_CHUNK x 16 of the file at a
        time; returns the offset of the first line it did not take (a line
        that fails, zero bytes, a line past a chunk, the end), from which
        :meth:`_scan`'s loop goes on and names what it finds."""
        if self._closed:
            raise StoreClosedError(f"log {self.path} is closed")
        pos = 0
        with open(self.path, "rb") as f:
            while pos < end:
                data = f.read(min(_READ_CHUNK * 16, end - pos))
                complete = data.rfind(b"\n") + 1
                if not complete:
                    return pos
                scan = scan_frames(data, 0, complete)
                if sound is not None:
                    offsets, lengths = scan.offsets, scan.lengths
                    if taken is not None:
                        rest = taken(data, offsets, lengths, pos) == 0
                        offsets, lengths = offsets[rest], lengths[rest]
                    for at, n in zip(offsets.tolist(), lengths.tolist()):
                        reason = sound(pos + at, data[at:at + n])
                        if reason:
                            problems.append({"path": self.path, "offset": pos + at, "problem": reason})
                if scan.good_end != complete:
                    return pos + scan.good_end
                pos += complete
                f.seek(pos)
        return pos

    # -- lifecycle ---------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """Sync what was appended since the last sync, then close the
        descriptor (idempotent). A failed sync closes it all the same and
        raises :class:`DurabilityError` naming the file."""
        with self._lock:
            self._settle()
            failed = None
            if self._closer is not None:
                self._closed_size = os.fstat(self._fd).st_size
                if self._unsynced and self._failed is None:
                    try:
                        os.fdatasync(self._fd)
                        self._unsynced = False
                    except OSError as exc:
                        self._failed = failed = f"fdatasync failed: {exc}"
                self._closer()
                self._closer = None
            self._fd = -1
            self._closed = True
            if failed is not None:
                raise DurabilityError(f"sync of {self.path} at close failed: {failed}")

    def __enter__(self) -> "FramedLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _find_tail(f: Any, size: int, path: str) -> tuple[int, bytes]:
    """Return (offset just past the last newline, the bytes after it with
    trailing zero bytes stripped). Reads backwards; a zero-filled
    (preallocated) region of any length costs no memory. Non-zero trailing
    bytes longer than any frame are damage, not a tear."""
    pos = size
    pieces: list[bytes] = []
    kept = 0
    seen_data = False
    while pos > 0:
        step = min(_READ_CHUNK, pos)
        pos -= step
        f.seek(pos)
        chunk = f.read(step)
        nl = chunk.rfind(b"\n")
        part = chunk[nl + 1:] if nl >= 0 else chunk
        if not seen_data:
            part = part.rstrip(b"\0")
            seen_data = bool(part)
        if part:
            pieces.append(part)
            kept += len(part)
            if kept > MAX_LINE:
                raise CorruptStateCheckpointError(
                    f"{kept} bytes without a newline at the end of the file: longer than any line",
                    path=path, offset=pos + (nl + 1 if nl >= 0 else 0))
        if nl >= 0:
            return pos + nl + 1, b"".join(reversed(pieces))
    return 0, b"".join(reversed(pieces))


def _line_start(f: Any, newline_at: int) -> int:
    """Offset of the start of the line whose newline is at ``newline_at``."""
    pos = newline_at
    while pos > 0:
        step = min(65536, pos)
        f.seek(pos - step)
        chunk = f.read(step)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            return pos - step + nl + 1
        pos -= step
        if newline_at - pos > MAX_LINE:
            return pos
    return 0
