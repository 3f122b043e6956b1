"""What the rooms of the conversation store share: the file names (from
rune_fast._names), the result
types of the public API, and pure helpers over records and line bytes. No
state lives here."""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import mmap
import operator
import os
import re
import threading
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Iterator

import numpy as np
import xxhash

# (the ordering rule, rune_fast._order, under the names the rooms use)
from .._order import channel_key as _order_key, record_key as _xkey  # noqa: F401
from .._order import record_sorts_before as _sorts_before  # noqa: F401
from .. import codec
from .. import sync as _sync
from ..cool import SPECIAL_FOLD
from ..errors import CorruptStateCheckpointError, RuneError, StoreClosedError
from ..records import ConversationMessageRecord, _utf8_ok
from ..segments import fsync_dir, write_file

# (the file names, spelled in rune_fast._names, re-exported for the rooms)
from .._names import (COOL_DIR, DEVICE_NAME, LEGACY_NAME, MANIFEST_NAME,  # noqa: F401
                      QUARANTINE_DIR, SNAPSHOT_NAME, TOMBSTONES_NAME)
DURABILITY_MODES = ("fsync", "batch", "none")
_OFF_MASK = (1 << 40) - 1
_SEQ_END_RE = re.compile(rb'\},"s":(\d{1,18})\}\Z')
_REPEATED = "a message line repeated (its id is on an earlier line)"
#: The manifest format this build writes, and those it reads. 2 (session
#: 27): cool files may cluster a channel's rows by task (docs/FORMAT.md); a
#: build that reads only 1 would take such a channel's last rows for its
#: newest, so it refuses the store instead.
_FORMAT = 2
_READ_FORMATS = (1, 2)
#: The non-ASCII characters whose casefold holds an ASCII character (Unicode
#: 15, checked by a test against this Python's unicodedata): one table for
#: the hot and cool tiers' searches.
FOLDS_TO_ASCII = SPECIAL_FOLD
#: The largest count a read passes to the index (an int64): more than any store holds.
_MAX_N = 1 << 62
_STATM = "/proc/self/statm"




class ReadStatus(enum.Enum):
    """Verdict of an exact read."""

    FOUND_VERIFIED = "found_verified"
    SOURCE_CORRUPT = "source_corrupt"
    NOT_FOUND_CONFIRMED = "not_found_confirmed"


@dataclasses.dataclass(frozen=True)
class MessageRead:
    """Result of ``get_message``: ``status``, ``record`` (or None), ``tier``."""

    status: ReadStatus
    record: ConversationMessageRecord | None = None
    tier: str | None = None

    @property
    def found(self) -> bool:
        return self.status is ReadStatus.FOUND_VERIFIED


@dataclasses.dataclass(frozen=True)
class SearchHit:
    """One ``search`` result: the record and the tier it was read from."""

    record: ConversationMessageRecord
    tier: str


class _Report:
    """Attribute and mapping access, for callers that expect either."""

    if TYPE_CHECKING:
        # every subclass is a dataclass (to_dict's dataclasses.asdict needs one)
        __dataclass_fields__: ClassVar[dict[str, Any]]

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class CompactionReport(_Report):
    """What one ``compact()`` did."""

    folded: int = 0            # tail lines folded into the hot checkpoint
    cooled: int = 0            # messages moved to a Parquet archive
    erased: int = 0            # deleted messages whose bytes were erased
    segments_rewritten: int = 0
    segments_reclaimed: int = 0
    cool_files_written: int = 0
    cool_files_removed: int = 0
    bytes_written: int = 0
    snapshot_written: bool = False
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem ``verify()`` found: the file, the byte offset (or row), what."""

    file: str
    offset: int | None
    message: str

    def __str__(self) -> str:
        where = self.file if self.offset is None else f"{self.file} @ {self.offset}"
        return f"{where}: {self.message}"


@dataclasses.dataclass
class VerifyReport(_Report):
    """Result of ``verify()``: ``ok`` and every ``problems`` entry."""

    ok: bool
    problems: list[Problem]
    checked: dict[str, int]

    def __bool__(self) -> bool:
        return self.ok


def _unkey(k: bytes) -> str:
    return codec.orjson.loads(b'"' + k + b'"')


_first = operator.itemgetter(0)

#: Reads hand out records from their caches: one that has tool calls holds
#: them read-only (see codec.own_calls), so no caller can change what
#: another read returns.
own_calls = codec.own_calls


def _own(rec: ConversationMessageRecord) -> ConversationMessageRecord:
    return own_calls([rec])[0] if rec.tool_calls else rec


def _fold_key(rec: ConversationMessageRecord) -> tuple:
    """A message's place in the fold order: (the stamp of its op, as
    ``export_ops`` makes it; msg_id)."""
    return (_sync.record_stamp(rec.hlc, rec.ts, rec.origin), rec.msg_id)


_COOL_RANK = 0
_HOT_RANK = 1


#: how often a viewer's read retries after meeting a file its writer replaced
_VIEWER_ATTEMPTS = 50


def _str_arg(field: str, value: Any) -> None:
    """TypeError unless ``value`` is a str, ValueError if it is not valid
    UTF-8 (a lone surrogate: no id, channel or task can hold one); both name
    ``field``."""
    if not isinstance(value, str):
        raise TypeError(f"{field}: expected str, got {type(value).__name__}")
    if not value.isascii() and not _utf8_ok(value):
        raise ValueError(f"{field}: {value!r} is not valid UTF-8 (a lone surrogate)")


def _tag_matches(line: Any, key: bytes, path: str, offset: int) -> bool:
    """Whether the id on the message line ``line`` hashes to the 32-bit tag
    of ``key`` (the id table's slot tag), as every indexed line's own id does."""
    rec, _seq = codec.record_from_line(line, path=path, offset=offset)
    own = xxhash.xxh3_64_intdigest(codec.key(rec.msg_id))
    return own >> 32 == xxhash.xxh3_64_intdigest(key) >> 32


def _line_seq_ending(buf: Any, end: int) -> int:
    """The append sequence of the line of ``buf`` that ends (its newline)
    at ``end``; -1 if none ends there or it has none."""
    if buf is None or end <= 0:
        return -1
    with memoryview(buf) as view:
        if end > len(view) or view[end - 1] != 0x0A:
            return -1
        return _line_seq_of(view[:end - 1])


def _first_line_seq(buf: Any, size: int) -> int:
    """The append sequence of the first line in the first ``size`` bytes of
    ``buf`` (a sealed segment); -1 if no line ends there or it has none
    (the ingest that reads the segment names any damage)."""
    if buf is None or size <= 0:
        return -1
    with memoryview(buf) as view:
        at = 0
        while at < size:
            nl = bytes(view[at:min(size, at + 65536)]).find(b"\n")
            if nl >= 0:
                return _line_seq_of(view[:at + nl])
            at += 65536
    return -1


def _line_seq_of(line: Any) -> int:
    """The append sequence at the end of a message line (bytes-like, without
    its newline); -1 if it has none."""
    m = _SEQ_END_RE.search(bytes(line[max(0, len(line) - 48):]))
    return int(m.group(1)) if m else -1


_TAIL_MARK = -1
#: a snapshot key: the tail bytes the snapshot covers were synced before it was written
_SYNCED_MARK = -(1 << 62)
#: key of the snapshot's ``covered`` map whose value is the size of the event
#: store when the snapshot was written: the envelopes after it are those of
#: the tail lines after the snapshot (see ``_note_unheld``)
_EVENTS_MARK = -(1 << 61)


def _check_line_starts(starts: np.ndarray, offsets: np.ndarray, path: str) -> None:
    """CorruptStateCheckpointError at the first of ``offsets`` (ascending)
    that is none of the line starts ``starts`` (ascending) of a sound scan."""
    if not len(offsets):
        return
    at = np.searchsorted(starts, offsets)
    bad = (at >= len(starts)) | (starts[np.minimum(at, len(starts) - 1)] != offsets)
    if bad.any():
        raise CorruptStateCheckpointError("an indexed message's line does not start at this offset "
                                          "(lines moved)", path=path, offset=int(offsets[bad][0]))


@contextlib.contextmanager
def _noted(problems: list[Problem], path: str, what: str) -> Iterator[None]:
    """verify()'s guard around one of its checks: a file it cannot read (gone,
    cut, replaced by a folder) is a problem named in the report, never an
    exception (SPEC: verify raises nothing). A repository closed meanwhile
    (a writer's check lets other calls in between its files) raises
    StoreClosedError, as a verify called after the close does."""
    try:
        yield
    except StoreClosedError:
        raise
    except (OSError, RuneError) as exc:
        offset = exc.offset if isinstance(exc, CorruptStateCheckpointError) else None
        problems.append(Problem(getattr(exc, "path", None) or getattr(exc, "filename", None) or path,
                                offset, f"{what} failed: {exc!r}"))


def _cool_no(name: str) -> int:
    """The number n of a cool file ``cool-<n>.parquet``."""
    return int(name.split("-", 1)[1].split(".", 1)[0])


#: /proc/self/statm kept open by _resident_file_bytes (None: not yet), and
#: the lock of its first open
_statm_fd: int | None = None
_statm_lock = threading.Lock()


def _statm_forget() -> None:
    """In a forked child: the descriptor named the parent's /proc/self."""
    global _statm_fd, _statm_lock
    if _statm_fd is not None:
        with contextlib.suppress(OSError):
            os.close(_statm_fd)
    _statm_fd, _statm_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_statm_forget)


def _resident_file_bytes() -> int | None:
    """Resident file-backed (shared) bytes of this process, from
    /proc/self/statm; None where it cannot be read (not Linux). The file is
    kept open and read again from its start (procfs makes it anew at each
    read at offset 0): a few us a look, where an open, a read and a close
    cost ~20 us, paid by a limited search every few calls."""
    global _statm_fd
    try:
        fd = _statm_fd
        if fd is None:
            with _statm_lock:
                if _statm_fd is None:
                    _statm_fd = os.open(_STATM, os.O_RDONLY | os.O_CLOEXEC)
                fd = _statm_fd
        return int(os.pread(fd, 256, 0).split()[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


#: errno values of a write the disk could not take: an open's recovery that
#: meets one raises DurabilityError
_WRITE_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


def _message_lines(buf: Any, path: str, lines: Iterable[tuple[int, int]]
                   ) -> Iterator[tuple[int, ConversationMessageRecord]]:
    """(offset, record) of each message line among ``lines`` ((offset,
    length) of checked lines in ``buf``); task lines are passed over."""
    with memoryview(buf) as view:        # (released: a map with a view cannot close)
        for off, ln in lines:
            line = view[off:off + ln]
            if bytes(line[23:30]) == codec.MESSAGE_PREFIX[:7]:
                yield off, codec.record_from_line(line, path=path, offset=off)[0]


def _holds_bytes(path: str) -> bool:
    """Whether the file at ``path`` exists and holds a byte other than zero
    (zeros are preallocation: a tail that took no line)."""
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                if chunk.strip(b"\0"):
                    return True
    except FileNotFoundError:
        pass
    return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _write_small_file(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    write_file(tmp, data)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))
