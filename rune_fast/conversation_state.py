"""The conversation and task repositories (SPEC sections 3-5).

``ConversationStateRepository`` stores messages in three tiers:

- ``tail``: lines appended since the last compaction, in the open tail file;
- ``hot``: lines folded into the hot checkpoint (the manifest), in sealed
  segments or in the covered part of the tail file;
- ``cool``: rows of Parquet archives under ``hot/conversation_cool/``.

The compiled ``HotIndex`` maps ids, channels and tasks to packed line locations
in the hot and tail tiers; ``CoolArchive`` does the same for the cool tier. A
read goes id/channel/task -> location -> bytes -> checksum -> record.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import functools
import logging
import math
import mmap
import operator
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Iterator, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from . import codec
from . import sync as _sync
from ._casefold import anchor_forms
from ._encode import frame_messages, message_envelopes
from ._index import SEARCH_FILTER_LAYOUT, HotIndex, LocCache
from ._log import frame_many, scan_frames
from .atomic import AtomicStore, check_path
from .cool import SPECIAL_FOLD, CoolArchive, relevant_specials, table_from_lines
from .errors import (
    CorruptStateCheckpointError,
    DurabilityError,
    IllegalTaskTransitionError,
    ReadOnlyStoreError,
    RuneError,
    StateLockedError,
    StoreClosedError,
)
from .events import EventStore, ensure_private_dir, fdatasync_path
from .locking import DirLock
from .records import ConversationMessageRecord, _utf8_ok, message_from_stored, payload_hash
from .records import TaskStateRecord  # noqa: F401  (the records beside the repositories, as a frontend imports them)
from .segments import (MARK_NAME, TAIL_NAME, DurableMark, Segment, TailFile, decode_filters, encode_filters,
                       filters_name, fsync_dir, quarantine_bytes, read_kept, release_pages, seg_name,
                       write_file, write_kept)
from .tasks import TaskStateRepository

__all__ = [
    "ConversationStateRepository",
    "TaskStateRepository",
    "ReadStatus",
    "MessageRead",
    "SearchHit",
    "CompactionReport",
    "VerifyReport",
    "Problem",
    "RuneError",
    "CorruptStateCheckpointError",
    "IllegalTaskTransitionError",
    "StateLockedError",
    "ReadOnlyStoreError",
    "StoreClosedError",
    "DurabilityError",
]

log = logging.getLogger("rune_fast")

MANIFEST_NAME = "conversation_manifest.json"
SNAPSHOT_NAME = "conversation_index.snap"
TOMBSTONES_NAME = "conversation_tombstones.jsonl"
LEGACY_NAME = "conversation_messages.json"
DEVICE_NAME = "device_id"
COOL_DIR = "conversation_cool"
QUARANTINE_DIR = "quarantine"
DURABILITY_MODES = ("fsync", "batch", "none")
#: Roll the tail into a sealed segment past this size at a compaction.
ROLL_BYTES = 8 << 20
#: Rewrite a segment (the tail: roll, then rewrite) when less than this
#: fraction of its bytes is live and it is larger than SPARSE_MIN_BYTES: cooled
#: lines do not linger (dead bytes stay under 60% of the hot files), and each
#: line is copied at most 1/(1 - 0.4) times on average. Measured on a bulk
#: load of 100,000 messages: 0.25 left 110-134 MiB on disk at 2.5 bytes
#: written per content byte; 0.4 leaves 94-104 MiB at 2.6-2.8.
SPARSE_FRACTION = 0.4
SPARSE_MIN_BYTES = 64 << 10
#: An automatic cooling run of at least this many messages is written by a
#: background thread (appends go on meanwhile); smaller runs, and every run of
#: an explicit compact(), are written inline.
BG_COOL_MIN_ROWS = 512
#: lines a background cooling run parses per call (see _stage_cooling)
_PARSE_PART = 256
#: close() leaves the index snapshot as it is when it still matches the files
#: (the same sealed segments, tail and cool files) and at most this many
#: changes (appended lines, deletions) came after it: the next open scans those
#: tail lines (about 1 ms, then 3 us a line, measured at 100,000 messages)
#: instead of this close rewriting the whole index (10 ms at 100,000 messages,
#: 70-100 ms and 17 MB at 1,000,000).
SNAPSHOT_SLACK = 256
_OFF_MASK = (1 << 40) - 1
_SEQ_END_RE = re.compile(rb'\},"s":(\d{1,18})\}\Z')
_REPEATED = "a message line repeated (its id is on an earlier line)"
_FORMAT = 1
#: The non-ASCII characters whose casefold holds an ASCII character (Unicode
#: 15, checked by a test against this Python's unicodedata): one table for
#: the hot and cool tiers' searches.
FOLDS_TO_ASCII = SPECIAL_FOLD
#: Decoded records kept by location (the newest appends and reads), so a
#: window read decodes nothing; bytes are still checksummed on every read.
#: 8,192 (about 10 MiB at most) holds the last 8 messages of 1,000 channels:
#: measured on a 1,000,000-message store, window(ch, 8) over random channels
#: takes 7.7 us with it and 52 us with 1,024.
_DECODE_CACHE = 8192
#: Resident file pages (the segment and tail maps' share) that the hot reads
#: may add before the pages they mapped are released (see ``_release_maps``),
#: looked at every MAP_RELEASE_READS lines decoded from the maps. A read
#: fault maps a whole page-cache folio (64 KiB to 2 MiB on a kernel with
#: large folios; about 110 KiB a read measured on a 1,000,000-message store),
#: so reads spread over 700 MB of segments left them all resident: ~290 of
#: 470 bytes a message after touching every channel once. A release costs
#: one madvise a map (0.15-0.35 ms for that store's 65 maps) and, after it,
#: a fault for each page a read maps again: up to ~110 us for the first read
#: of a cached task of 40 messages. The budget keeps a working set under it
#: mapped (no release at all), and a larger one from growing without bound.
MAP_BUDGET_BYTES = 128 << 20
#: The largest count a read passes to the index (an int64): more than any store holds.
_MAX_N = 1 << 62
MAP_RELEASE_READS = 256
_STATM = "/proc/self/statm"
#: Decoded Parquet row groups the cool tier keeps (bounded memory, see stats()):
#: the whole cool tier of a 100,000-message store of the bench's workload.
COOL_CACHE_BYTES = 48 << 20


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


def _order_key(rec: ConversationMessageRecord, tier_rank: int, pos: Any) -> tuple:
    """Sort key of SPEC's "oldest first": unstamped first, in append order
    (cool before hot), then stamped by (hlc, msg_id)."""
    if rec.hlc:
        return (1, rec.hlc, rec.msg_id)
    return (0, tier_rank, pos)


def _sorts_before(rec: ConversationMessageRecord, stamp: tuple) -> bool:
    """Whether ``rec`` sorts before the stamped message whose ``(hlc,
    msg_id)`` is ``stamp`` (an unstamped message sorts before every stamped
    one; no two messages share an id)."""
    return not rec.hlc or (rec.hlc, rec.msg_id) < stamp


def _xkey(rec: ConversationMessageRecord, seq: int | None) -> tuple:
    """Sort key of "oldest first" across channels and tiers: unstamped
    messages first by append sequence, then stamped by (hlc, msg_id)."""
    if rec.hlc:
        return (1, rec.hlc, rec.msg_id)
    return (0, -1 if seq is None else seq, "")


_first = operator.itemgetter(0)

#: Reads hand out records from their caches: one that has tool calls is
#: handed out with dicts of its own (see codec.own_calls), so a caller that
#: edits them changes nothing another read returns.
own_calls = codec.own_calls


def _own(rec: ConversationMessageRecord) -> ConversationMessageRecord:
    return own_calls([rec])[0] if rec.tool_calls else rec


def _fold_key(rec: ConversationMessageRecord) -> tuple:
    """A message's place in the fold order: (the stamp of its op, as
    ``export_ops`` makes it; msg_id)."""
    return (_sync.record_stamp(rec.hlc, rec.ts, rec.origin), rec.msg_id)


_COOL_RANK = 0
_HOT_RANK = 1


_VIEWER_ATTEMPTS = 50


def _str_arg(field: str, value: Any) -> None:
    """TypeError unless ``value`` is a str, ValueError if it is not valid
    UTF-8 (a lone surrogate: no id, channel or task can hold one); both name
    ``field``."""
    if not isinstance(value, str):
        raise TypeError(f"{field}: expected str, got {type(value).__name__}")
    if not value.isascii() and not _utf8_ok(value):
        raise ValueError(f"{field}: {value!r} is not valid UTF-8 (a lone surrogate)")


def _viewer_retry(method):
    """For a read-only viewer: a read that met a file the writer's compaction
    replaced reloads the state once the manifest shows it moved, and retries
    (backing off a little each time) for as long as the manifest keeps
    moving: a writer compacting every few milliseconds can replace files
    again between a reload and the read after it. Damage raises at once."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if not self.read_only:
            return method(self, *args, **kwargs)
        last = _VIEWER_ATTEMPTS - 1
        for attempt in range(_VIEWER_ATTEMPTS):
            seen = self._reloads      # another thread's refresh() may reload meanwhile
            try:
                out = method(self, *args, **kwargs)
            except CorruptStateCheckpointError:
                with self._lock:
                    if attempt == last or self._closed:
                        raise
                    if self._reloads == seen:
                        if not self._stale_view():
                            raise
                        self._load_state()
                time.sleep(0.001 * min(attempt, 10))
                continue
            if (isinstance(out, MessageRead) and out.status is ReadStatus.SOURCE_CORRUPT
                    and attempt < last):
                with self._lock:
                    if not self._closed and self._reloads != seen:
                        continue
                    if not self._closed and self._stale_view():
                        self._load_state()
                        continue
            if isinstance(out, MessageRead) and out.status is ReadStatus.SOURCE_CORRUPT:
                log.error("exact read of %s in viewer of %s: SOURCE_CORRUPT (the state did not move: "
                          "damage, not a replaced file)", args[0] if args else kwargs.get("msg_id"),
                          self.state_dir)
            return out
        return method(self, *args, **kwargs)
    return wrapper


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


def _line_seq_of(line: Any) -> int:
    """The append sequence at the end of a message line (bytes-like, without
    its newline); -1 if it has none."""
    m = _SEQ_END_RE.search(bytes(line[max(0, len(line) - 48):]))
    return int(m.group(1)) if m else -1


class _Staged:
    """Archive work done by a background thread: a cooling run (``kind``
    "cool": the lines were copied under the repository lock; the thread
    makes their table and :meth:`CoolArchive.stage_table` writes and syncs
    their Parquet file without it)
    or a merge of cool files ("merge": :meth:`CoolArchive.stage_merge`). The
    next compaction adopts the result, or discards it. Until then its files
    are strays that no manifest names (a crash leaves them to the next open)."""

    def __init__(self, kind: str, work: Callable[["_Staged"], Any], locs: Sequence[int] = ()) -> None:
        self.kind = kind
        self.locs = locs
        self.table: Any = None  # a cooling run's rows, in the order of locs (set by its thread)
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(work,), name=f"rune-fast-{kind}",
                                       daemon=True)
        self.thread.start()

    def _run(self, work: Callable[["_Staged"], Any]) -> None:
        try:
            self.result = work(self)
        except BaseException as exc:   # reported by the compaction that settles the job
            self.error = exc
        finally:
            self.done.set()

    def discard(self, cool: CoolArchive) -> None:
        if self.result is not None:
            if self.kind == "cool":
                cool.discard(self.result)
            else:
                cool.discard_merge(self.result)


class ConversationStateRepository:
    """Durable, verified message history for one state directory.

    ``durability``: ``"fsync"`` (each write call durable on return),
    ``"batch"`` (group commit: concurrent appends share one sync, with no wait
    added; each call still durable on return: "fsync" groups concurrent
    appends the same way), ``"none"`` (left to the OS:
    survives a process crash, not a power loss). ``read_only=True`` opens beside
    a running writer without its lock and without changing any file.
    """

    def __init__(self, state_dir: str | os.PathLike, *, events: EventStore | str | os.PathLike | None = None,
                 compact_every: int = 64, hot_window: int = 512, durability: str = "fsync",
                 read_only: bool = False) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability: {durability!r} is not one of {', '.join(DURABILITY_MODES)}")
        if isinstance(compact_every, bool) or not isinstance(compact_every, int) or compact_every < 1:
            raise ValueError(f"compact_every: must be a positive int, got {compact_every!r}")
        if isinstance(hot_window, bool) or not isinstance(hot_window, int) or hot_window < 0:
            raise ValueError(f"hot_window: must be a non-negative int, got {hot_window!r}")
        if not isinstance(read_only, bool):
            # ("false" would open a viewer: bool() of any non-empty str is True)
            raise TypeError(f"read_only: expected bool, got {type(read_only).__name__}")
        check_path("state_dir", state_dir)
        if events is not None and not isinstance(events, EventStore):
            check_path("events", events)
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        self.hot_dir = os.path.join(self.state_dir, "hot")
        self.durability = durability
        self.compact_every = compact_every
        self.hot_window = hot_window
        self.read_only = bool(read_only)
        self._lock = threading.RLock()
        self._sync_cond = threading.Condition(threading.Lock())
        self._closed = False
        self._map_reads = 0             # lines decoded from the maps since the last look
        self._map_release = True        # False once a release failed (logged)
        self._map_base: int | None = None   # resident file pages after the last release
        self._lockfile: DirLock | None = None
        self._own_events = False
        self._events: EventStore | None = None
        self._quarantined: list[dict] = []
        self._lost: list[dict] = []     # vouched final lines found gone (see _report_lost)
        self._snap_events = 0           # event store size the index snapshot in use recorded
        self._snap_files: tuple | None = None    # the files the snapshot on disk matches (_snap_layout)
        self._tail_read = 0             # tail lines the open's index read after its snapshot (or all)
        # (see _clock_held) stamps clock.now() returned when the manifest was
        # written, and whether merge_ops observed one since
        self._clock_nows = 0
        self._clock_unheld = False
        # (covered, tail size, msg_ids) of the tail's message lines after the
        # last compaction, as the open read them (_observe_stored_stamps)
        self._uncovered: tuple[int, int, list[str]] | None = None
        # the event store is this store's own file (state_dir/events.jsonl):
        # only then is a message envelope in it one of this store's appends
        self._events_private = events is None
        # channels where a hot message may sort before a cool row (None: not
        # known yet, every channel with stamped cool rows is checked once)
        self._behind: set[str] | None = None
        self._rejournaled = 0           # envelopes written again (see _rederive_lost_envelopes)
        self._compactions = 0
        self._last_compaction: CompactionReport | None = None
        self._bg: _Staged | None = None
        self._special_cache: dict[int, dict[str, tuple[int, list[int]]]] = {}
        # the tail location after the last write (what the next sync makes
        # durable), and the one last published to viewers (see _publish)
        self._wmark: int = -1
        self._published: int = -1
        try:
            self._open(events)
        except OSError as exc:
            self._release()
            if exc.errno not in _WRITE_FAULTS:
                raise
            # (recovery writes: a quarantined line, a finished roll, envelopes)
            raise DurabilityError(f"open of {self.state_dir} failed writing "
                                  f"{exc.filename or self.state_dir}: {exc.strerror or exc}; "
                                  "a read-only open still reads the store") from exc
        except BaseException:
            self._release()
            raise

    # ------------------------------------------------------------------
    # open and recovery
    # ------------------------------------------------------------------
    def _open(self, events: Any) -> None:
        if not self.read_only:
            for d in (self.state_dir, self.hot_dir):
                if not os.path.isdir(d):
                    # each new folder's entry synced in its parent: a power
                    # loss must not take a new store with its acknowledged lines
                    ensure_private_dir(d)
                    os.chmod(d, 0o700)
            self._lockfile = DirLock(self.state_dir, "conversation")
        if isinstance(events, EventStore):
            self._events = events
        else:
            path = os.fspath(events) if events is not None else os.path.join(self.state_dir, "events.jsonl")
            if not self.read_only:
                self._events = EventStore(path)
                self._own_events = True
        self._manifest_store = AtomicStore(os.path.join(self.hot_dir, MANIFEST_NAME))
        self._clock = _sync.HlcClock(self._device_id())
        # where the durable tail lines end, for viewers (see DurableMark)
        self._mark = DurableMark(os.path.join(self.hot_dir, MARK_NAME), writer=not self.read_only)
        self._load_state()
        if not self.read_only:
            # the lines this writer found (a killed writer's unsynced ones
            # too) are durable from here on: viewers may show them
            assert self._tail is not None       # a writer always has its tail
            if self.durability != "none":
                self._tail.sync()
            self._wmark = (self._tail_seg << 40) | self._tail.size
            self._publish(self._wmark, force=True)
            if not self._rederive_lost_envelopes():
                self._rederive_envelopes()
            self._import_legacy()

    def _publish(self, loc: int, *, force: bool = False) -> None:
        """Tell viewers that the tail lines up to ``loc`` (a location) are
        durable: what ``refresh()`` may show (SPEC: "what the writer has made
        durable"). Never backwards but at open (which runs alone). Callers
        hold ``_sync_cond`` (a sync), or the repository lock in "none" mode,
        where nothing publishes without it."""
        if loc > self._published or force:
            self._mark.publish(loc)
            self._published = loc

    def _device_id(self) -> str:
        path = os.path.join(self.hot_dir, DEVICE_NAME)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raw = b""
        try:
            dev = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise CorruptStateCheckpointError(f"device id is not UTF-8 text: {exc}", path=path,
                                              offset=exc.start) from None
        if any(c < " " or c == "\x7f" for c in dev):
            raise CorruptStateCheckpointError("device id holds a control character", path=path)
        if dev:
            return dev
        from .records import new_id
        dev = new_id("dev")
        if self.read_only:
            return dev
        _write_small_file(path, dev.encode())
        return dev

    def _load_state(self) -> None:
        """Read the manifest, map every segment, load or rebuild the index.

        A read-only viewer races the writer's compactions (a file the manifest
        it read named may be gone by the time it opens it): it reads again
        while the manifest keeps changing under it."""
        self._reloads = getattr(self, "_reloads", -1) + 1
        if not self.read_only:
            return self._load_state_once()
        # a reload replaces the tail, segments and cool archive: the replaced
        # ones (and those of attempts that failed) are closed once it is done,
        # or a viewer refreshing beside a compacting writer leaks descriptors
        replaced = self._state_files()
        try:
            for attempt in range(50):
                seen = self._manifest_store.read()
                try:
                    return self._load_state_once()
                except (CorruptStateCheckpointError, FileNotFoundError):
                    replaced += self._state_files()
                    if attempt >= 3 and self._manifest_store.read() == seen:
                        raise
                    time.sleep(0.002 * (attempt + 1))
            return self._load_state_once()
        finally:
            current = {id(f) for f in self._state_files()}
            closed: set[int] = set()
            for f in replaced:
                if id(f) not in current and id(f) not in closed:
                    closed.add(id(f))
                    f.close()

    def _state_files(self) -> list[Any]:
        """The open tail, segments and cool archive of the loaded state."""
        out: list[Any] = list(getattr(self, "_segs", {}).values())
        for name in ("_tail", "_cool"):
            f = getattr(self, name, None)
            if f is not None:
                out.append(f)
        return out

    def _stale_view(self) -> bool:
        """Whether the writer moved the manifest since this viewer read it."""
        try:
            return self._manifest_store.read() != self._manifest
        except CorruptStateCheckpointError:
            return True

    def _load_state_once(self) -> None:
        m = self._manifest_store.read()
        if m is None:
            m = {"format": _FORMAT, "segments": [], "tail_seg": 1, "covered": 0,
                 "cool_files": [], "events_offset": 0, "next_seg": 2, "next_seq": 0}
            self._check_new_store()
            if not self.read_only:
                # a store's first file: from now on a missing manifest is damage
                self._manifest_store.write(m)
        if m.get("format") != _FORMAT:
            raise CorruptStateCheckpointError(
                f"manifest format {m.get('format')!r} is not one this build reads ({_FORMAT})",
                path=self._manifest_store.path)
        self._manifest = m
        self._covered = int(m["covered"])
        # the size events.jsonl had when the tail was folded up to _covered:
        # the envelopes of the lines after _covered lie after it (see
        # _rederive_envelopes); the manifest records the two together
        self._covered_events = int(m.get("events_offset", 0))
        self._tail_seg = int(m["tail_seg"])
        self._next_seg = int(m["next_seg"])
        self._next_seq = int(m.get("next_seq", 0))
        # Sealed segments, in logical (append) order.
        self._segs: dict[int, Segment] = {}
        self._seg_order: list[int] = list(m["segments"])
        # where each sealed segment's lines end (its bytes were synced when it
        # was sealed): a rebuild must find complete lines exactly that far
        self._seg_ends: dict[int, int] = {int(k): int(v) for k, v in (m.get("segment_ends") or {}).items()}
        for seg in self._seg_order:
            path = os.path.join(self.hot_dir, seg_name(seg))
            try:
                self._segs[seg] = Segment(path, seg)
            except FileNotFoundError:
                raise CorruptStateCheckpointError(f"segment {seg} named by the manifest is missing",
                                                  path=path) from None
        self._recover_roll()
        if not self.read_only:
            self._remove_stray_segments()
        tail_path = os.path.join(self.hot_dir, TAIL_NAME)
        sealed_tail = os.path.join(self.hot_dir, seg_name(self._tail_seg))
        if self.read_only and self._tail_seg not in self._segs and os.path.exists(sealed_tail):
            tail_path = sealed_tail     # the writer is rolling the tail right now
        if self.read_only and not os.path.exists(tail_path):
            self._tail = None
        else:
            self._tail = TailFile(tail_path, self._tail_seg, read_only=self.read_only)
            if not self.read_only and self._tail.file_size == 0:
                fsync_dir(self.hot_dir)
        self._cool = CoolArchive.open(os.path.join(self.hot_dir, COOL_DIR), list(m["cool_files"]),
                                      read_only=self.read_only, durable=self.durability != "none",
                                      cache_bytes=COOL_CACHE_BYTES, expect=m.get("cool_meta"))
        if not self.read_only:
            # files a crash left unreferenced (written before the manifest moved,
            # or replaced by it before they were unlinked)
            self._cool.gc(list(m["cool_files"]))
        # channel -> (hlc, msg_id) of its newest stamped cool row (kept in the
        # manifest; an erasure may leave it higher than needed, never lower)
        self._cool_max: dict[str, tuple] = {ch: tuple(v) for ch, v in m.get("cool_max", {}).items()}
        self._tombstones: dict[str, str] = self._load_tombstones()   # msg_id -> channel_id
        self._pending_erase: set[str] = set()    # deleted ids whose bytes are still on disk
        self._dirty_segs: set[int] = set()        # segments holding lines of deleted messages
        self._cool_deleted: set[str] = set()      # deleted ids still present in a cool file
        # location -> (record, append sequence) of lines decoded, at most
        # _DECODE_CACHE, the oldest dropped first (a dict-like table the
        # compiled window and task reads look up)
        self._decoded = LocCache(_DECODE_CACHE)
        # cool_loc (file number << 32 | row) -> (record, ord): cool rows read
        # and verified once, so a task, an exact read or a search asked again
        # skips their assembly and digest (file numbers are never reused: a
        # merged or erased file's rows are simply never looked up again)
        self._cool_decoded = LocCache(_DECODE_CACHE)
        # channel -> [store order agrees with fold order, last fold key] (lazily)
        self._fold_order: dict[str, list] = {}
        # channel -> whether a hot message sorts before a cool one (computed lazily)
        self._interleaved: dict[str, bool] = {}
        self._since_compact = 0
        self._segs_unchecked = True     # the first full compaction (or adoption) looks at every segment
        # what search has checked line by line: sealed segments, and the
        # tail (its number, up to which offset); see _check_hot_lines
        self._lines_checked: set[int] = set()
        self._tail_checked = (-1, 0)
        # sealed segments' search filters: read from their kept files at the
        # first search; seg -> blocks kept on disk (see _keep_seg_filters)
        self._filters_read = False
        self._filters_kept: dict[int, int] = {}
        # segments whose line check met a damaged dead line or zeros: their
        # bytes do not parse as one line after another, which the search
        # pass over whole segments needs (see search)
        self._ragged: set[int] = set()
        self._manifest_dirty = False    # an in-memory fold the manifest does not show yet
        self._index = self._load_index()
        # seg -> where the bytes that were there at this load end: the region
        # an index snapshot may vouch for, whose line starts the first search
        # checks once (lines this process appends, ingests or rewrites are
        # placed by the index itself); see _check_lines
        self._vouched: dict[int, int] = {seg: s.size for seg, s in self._segs.items()}
        if self._tail is not None:
            self._vouched[self._tail_seg] = self._tail.size
        # (the last line's sequence: the tail's, else the last sealed segment's)
        self._next_seq = max(self._next_seq,
                             self._seq_floor(self._tail.size if self._tail is not None else 0) + 1)
        self._observe_stored_stamps()
        # Group commit counts bytes appended in this session, across tail rolls.
        self._wpos = 0
        self._synced = 0
        self._syncing = False
        self._sync_error: BaseException | None = None
        # Deletions whose erasure no compaction has finished yet: the cool rows
        # are hidden, and the next compaction looks for any hot line left.
        self._unlocated: set[str] = set()
        for mid in self._unerased:
            self._pending_erase.add(mid)
            if self._cool.contains(mid):
                self._cool_deleted.add(mid)
            else:
                self._unlocated.add(mid)

    def _observe_stored_stamps(self) -> None:
        """Move the clock past every stamp stored: the manifest keeps the
        clock as of the last checkpoint; tail lines after it are read here
        (their ids kept for _rederive_envelopes); tombstones carry their own
        stamps. Those lines count towards the next automatic compaction
        (SPEC: one every ``compact_every`` stored messages, however many
        sessions stored them), which keeps them bounded by ``compact_every``."""
        if self._manifest.get("clock"):
            self._observe(self._manifest["clock"])
        self._uncovered = None
        if self._tail is not None and self._tail.size > self._covered:
            found = list(self._uncovered_records())
            self._observe_stamps([rec for _off, rec in found])
            ids = [rec.msg_id for _off, rec in found]
            self._since_compact += len(ids)
            self._uncovered = (self._covered, self._tail.size, ids)
        for hlc in self._tomb_hlcs:
            self._observe(hlc)

    def _uncovered_records(self) -> Iterator[tuple[int, ConversationMessageRecord]]:
        """(offset, record) of each message line of the tail after the last
        compaction (``_covered``)."""
        assert self._tail is not None       # only called with a tail
        yield from _message_lines(self._tail.buf, self._tail.path,
                                  self._tail_lines(self._covered, self._tail.size))

    def _seq_floor(self, start: int) -> int:
        """The append sequence of the line before tail offset ``start`` (at
        0: the last line of the last sealed segment, where the manifest
        records its end): the tail's lines from ``start`` rise above it; -1
        when that cannot say."""
        if start > 0:
            return _line_seq_ending(self._tail.buf if self._tail is not None else None, start)
        for seg in reversed(self._seg_order):
            end = self._seg_ends.get(seg)
            s = self._segs.get(seg)
            if end is None or s is None:
                return -1
            if end > 0:
                return _line_seq_ending(s.buf, end)
        return -1

    def _check_new_store(self) -> None:
        """A state directory without a manifest must hold no messages: a
        writer writes the manifest before anything else (stores made before
        it did, killed before their first compaction, hold a tail and maybe
        a snapshot or tombstones). Anything more means the manifest was lost,
        and reading on would drop the segments and archives it names."""
        if not os.path.isdir(self.hot_dir):
            return      # (a viewer of a store not made yet)
        found = sorted(n for n in os.listdir(self.hot_dir)
                       if n.startswith("conversation_seg-") and n.endswith(".jsonl"))
        cool_dir = os.path.join(self.hot_dir, COOL_DIR)
        if os.path.isdir(cool_dir):
            found += [os.path.join(COOL_DIR, n) for n in sorted(os.listdir(cool_dir)) if n.endswith(".parquet")]
        if found:
            raise CorruptStateCheckpointError(
                f"the manifest is missing, but the store holds {', '.join(found[:3])}"
                f"{' and more' if len(found) > 3 else ''}: its messages would be lost",
                path=self._manifest_store.path)

    def _remove_stray_segments(self) -> None:
        """Unlink segment files the manifest does not name: a rewrite whose
        manifest never moved, or an old segment a crash kept from being
        unlinked after it did (it may hold erased content)."""
        keep = {seg_name(s) for s in self._seg_order} | {seg_name(self._tail_seg)}
        keep |= {filters_name(s) for s in self._seg_order}
        removed = False
        for name in os.listdir(self.hot_dir):
            if name.startswith("conversation_seg-") and name.endswith((".jsonl", ".grams", ".grams.tmp")) \
                    and name not in keep:
                _unlink(os.path.join(self.hot_dir, name))
                removed = True
        if removed:
            fsync_dir(self.hot_dir)

    def _recover_roll(self) -> None:
        """Finish or undo a tail roll the manifest does not show: the tail
        was renamed to sealed segment ``tail_seg`` (synced, then the folder
        synced) and a new tail made, and then a crash, or a compaction that
        failed (a full disk), kept the manifest from moving.

        A new tail holding nothing but zeros (or missing) is undone: the
        sealed file becomes the tail again. One holding bytes took appends
        after the roll: the roll is finished as the compaction would have
        (segment ``tail_seg`` sealed, the tail is segment ``next_seg``), the
        envelopes of the sealed lines after the last compaction are derived
        again where missing, and the manifest is written (a viewer does the
        same in memory and writes nothing)."""
        sealed = os.path.join(self.hot_dir, seg_name(self._tail_seg))
        if self._tail_seg in self._segs or not os.path.exists(sealed):
            return
        tail_path = os.path.join(self.hot_dir, TAIL_NAME)
        if _holds_bytes(tail_path):
            self._finish_roll(sealed)
            return
        if self.read_only:
            # The writer is mid-roll; read the sealed file as the tail.
            return
        os.replace(sealed, tail_path)
        fsync_dir(self.hot_dir)

    def _finish_roll(self, sealed: str) -> None:
        """The second half of an interrupted roll (see _recover_roll)."""
        seg = self._tail_seg
        s = self._segs[seg] = Segment(sealed, seg)
        scan = scan_frames(s.buf if s.buf is not None else b"")
        if scan.damaged_offset >= 0 or scan.torn_offset >= 0:
            at = scan.damaged_offset if scan.damaged_offset >= 0 else scan.torn_offset
            raise CorruptStateCheckpointError(
                f"sealed segment {seg} of an interrupted tail roll holds a damaged line: "
                f"{scan.damage or 'cut short'}", path=sealed, offset=at)
        covered, self._covered = self._covered, 0
        self._seg_order.append(seg)
        self._seg_ends[seg] = scan.good_end
        self._tail_seg = self._next_seg
        self._next_seg += 1
        log.warning("%s: a tail roll was interrupted (a crash or a failed compaction) after "
                    "appends to the new tail: finished as segment %d", sealed, seg)
        if self.read_only:
            return
        assert self._events is not None     # a writer always has its event store
        # envelopes of the sealed lines after the last compaction: written
        # after their lines, maybe lost with the compaction that failed
        start = self._events.next_line_start(self._covered_events)
        journaled = {env["id"] for env in self._events.iter_envelopes(start)
                     if env.get("type") == "conversation.message" and type(env.get("id")) is str}
        lines = [(off, ln) for off, ln in zip(scan.offsets.tolist(), scan.lengths.tolist()) if off >= covered]
        missing = [rec for _off, rec in _message_lines(s.buf, sealed, lines) if rec.msg_id not in journaled]
        for rec in missing:
            self._events.append("conversation.message", rec.msg_id, payload_hash(rec))
        if missing:
            self._events.sync()
            self._rejournaled += len(missing)
        m = dict(self._manifest)
        m.update(segments=list(self._seg_order), tail_seg=self._tail_seg, next_seg=self._next_seg,
                 covered=0, segment_ends={str(g): e for g, e in self._seg_ends.items()
                                          if g in self._segs})
        self._manifest_store.write(m)
        self._manifest = m

    def _attach_all(self, index: HotIndex) -> None:
        for seg in self._seg_order:
            index.attach(seg, self._segs[seg].buf, self._segs[seg].path)
        if self._tail is not None:
            index.attach(self._tail_seg, self._tail.buf, self._tail.path, growing=True)

    def _reattach_tail(self) -> None:
        tail = cast("TailFile", self._tail)    # only called with a tail (a writer's, or refresh's)
        self._index.attach(self._tail_seg, tail.buf, tail.path, growing=True)

    def _load_index(self) -> HotIndex:
        """The hot index: the snapshot if it matches the manifest (then only
        the tail bytes after it are scanned), else a rebuild from every segment."""
        snap_path = os.path.join(self.hot_dir, SNAPSHOT_NAME)
        index = None
        self._snap_files = None         # (set below when the snapshot serves as it is)
        if os.path.exists(snap_path):
            try:
                index, covered = HotIndex.load_snapshot(snap_path)
            except CorruptStateCheckpointError as exc:
                log.warning("index snapshot %s not used, rebuilding from the tail: %s", snap_path, exc)
                index = covered = None
            if covered is not None:     # (its tail lines' envelopes come after this size)
                self._snap_events = covered.get(_EVENTS_MARK, 0)
            # a tail that lost lines the snapshot vouches for raises here
            meta = None if covered is None else self._snapshot_meta(covered)
            if meta is not None:
                start, snap_cool = meta
                # cool files written after the snapshot: their rows left the hot tier
                known = set(snap_cool)
                cooled_since = [f for f in self._manifest["cool_files"] if f not in known]
                index = self._finish_index(cast("HotIndex", index), start, cooled_since)
                # the tail lines after the snapshot count as changes since it
                self._snap_changes = self._tail_read
                segs = set(self._seg_order) | {self._tail_seg}
                if not any(s >= 0 and s not in segs for s in cast("dict", covered)):
                    if not cooled_since:
                        self._snap_files = self._snap_layout()
                    return index
                live = index.seg_stats()
                if not any(seg not in segs and lines > 0 for seg, (lines, _b) in live.items()):
                    return index        # (it names a segment gone empty: close writes a new one)
                log.warning("index snapshot %s names a segment that is gone; rebuilding", snap_path)
        index = HotIndex()
        seq = -1        # the append sequence rises across the segments too
        for seg in self._seg_order:
            index.attach(seg, self._segs[seg].buf, self._segs[seg].path)
            rep = index.ingest(seg, 0, self._segs[seg].size, seq)
            self._check_ingest(rep, self._segs[seg].path, sealed=True)
            seq = rep.last_seq
            end = self._seg_ends.get(seg)
            if end is not None and rep.good_end != end:
                raise CorruptStateCheckpointError(
                    f"sealed segment {seg} holds complete lines up to offset {rep.good_end}, but the "
                    f"manifest records its lines ending at {end} (cut off or zeroed after it was sealed)",
                    path=self._segs[seg].path, offset=min(rep.good_end, end))
        index = self._finish_index(index, 0, list(self._manifest["cool_files"]), seq)
        self._bound_maps()          # the rebuild read every line through the maps
        return index

    def _finish_index(self, index: HotIndex, start: int, cooled_files: list[str],
                      min_seq: int | None = None) -> HotIndex:
        """Scan the tail from ``start`` (its lines' sequence rising from
        ``min_seq``, default: the line's before ``start``), then drop what
        was cooled or deleted."""
        self._attach_all(index)
        self._tail_read = 0
        if self._tail is not None:
            rep = index.ingest(self._tail_seg, start, max(start, self._visible_end()),
                               self._seq_floor(start) if min_seq is None else min_seq)
            self._check_ingest(rep, self._tail.path, sealed=False, durable_end=self._tail_durable_end(start))
            self._tail.size = rep.good_end
            self._tail_read = len(rep.added)
        cooled = self._cool_ids_in(cooled_files)
        if cooled:
            index.remove_many([codec.key(m) for m in cooled])
        for mid in self._tombstones:
            loc = index.remove(codec.key(mid))
            if loc >= 0:
                self._pending_erase.add(mid)
                self._dirty_segs.add(loc >> 40)
        self._snap_changes = 0
        return index

    def _visible_end(self) -> int:
        """Where the tail lines to read end: the whole file for a writer; for
        a viewer, where the writer's durable lines end (its DurableMark), as
        SPEC's refresh() shows "what the writer has made durable" (a line in
        the file may still await its sync). Lines of a tail the writer has
        sealed since are all durable; a store without a mark (its writer
        predates it) shows every complete line."""
        assert self._tail is not None
        end = self._tail.file_size
        loc = self._mark.read() if self.read_only else None
        if loc is None:
            return end
        seg = loc >> 40
        if seg == self._tail_seg:
            return min(end, loc & ((1 << 40) - 1))
        return end if seg > self._tail_seg else 0

    def _snapshot_meta(self, covered: dict) -> tuple[int, list[str]] | None:
        """Whether a loaded snapshot matches the manifest; (tail start, cool files) if so.

        ``covered`` (see ``_write_snapshot``): ``seg -> size`` for each sealed
        segment and ``tail_seg -> offset``; ``_TAIL_MARK -> tail_seg``;
        ``-(n + 1) -> 0`` for each cool file number n the index had left; and
        ``_SYNCED_MARK -> last + 1`` when the tail bytes it covers were synced
        before it was written (every snapshot since the sixth session), ``last``
        being where the last line it covers starts.

        Such a snapshot vouches for the complete lines of the tail before
        ``last``, and for the size of each sealed segment (they never change
        once sealed): a tail that lost any of those lines (cut off or zeroed
        past its final line), or a sealed segment of another size, raises
        CorruptStateCheckpointError naming the file and offset. Only the final line may be found cut short (a torn append, as
        a crash leaves it): the snapshot is then not used and the rebuild
        quarantines it, as without a snapshot.
        """
        if covered.get(_TAIL_MARK) != self._tail_seg:
            return None
        sealed = {s: o for s, o in covered.items() if s >= 0 and s != self._tail_seg}
        now = {seg: self._segs[seg].file_size for seg in self._seg_order}
        if sealed != now:
            if covered.get(_SYNCED_MARK) and sealed.keys() == now.keys():
                # the same segments, one of another size: a sealed segment
                # never changes (a rewrite makes a new one), so it was damaged
                seg = next(s for s in self._seg_order if sealed[s] != now[s])
                raise CorruptStateCheckpointError(
                    f"sealed segment {seg} holds {now[seg]} bytes, but the index snapshot "
                    f"{SNAPSHOT_NAME} vouches for {sealed[seg]} (cut off or grown after it was "
                    f"sealed)", path=self._segs[seg].path, offset=min(now[seg], sealed[seg]))
            return None
        start = int(covered.get(self._tail_seg, -1))
        if self._tail is None or start < 0:
            return None
        tail = self._tail

        def cut(end: int) -> bool:      # no complete line ends at ``end``
            return end > tail.file_size or (end > 0 and (tail.buf is None or tail.buf[end - 1] != 0x0A))
        if cut(start) and self.read_only:
            # a viewer may have mapped the tail before the writer appended the
            # lines this newer snapshot covers: look again before judging
            tail.refresh_map()
        if cut(start):
            last = covered.get(_SYNCED_MARK, 0) - 1
            if last > 0 and cut(last):
                if last > tail.file_size:
                    what, at = f"the file ends at {tail.file_size}", tail.file_size
                else:
                    what, at = f"byte {last - 1} is not the newline", last - 1
                raise CorruptStateCheckpointError(
                    f"the tail lost complete lines that the index snapshot {SNAPSHOT_NAME} vouches "
                    f"for: they end at offset {last}, but {what} (damaged or cut off after they "
                    f"were synced)", path=tail.path, offset=at)
            end = min(start, tail.file_size)
            nl = tail.buf.rfind(b"\n", 0, end) + 1 if tail.buf is not None else 0
            if tail.buf is not None and bytes(tail.buf[nl:end]).strip(b"\0"):
                # what is left of it is quarantined and reported by the rescan
                log.warning("%s: the final line that the index snapshot vouches for (ending at "
                            "offset %d) is cut short; reading the tail again", tail.path, start)
            else:
                self._report_lost(tail.path, start, "the final tail line the index snapshot "
                                  "vouches for (an acknowledged append) is gone")
            return None
        cool_nums = {-(s + 1) for s in covered if s < 0 and s not in (_TAIL_MARK, _SYNCED_MARK, _EVENTS_MARK)}
        snap_cool = [f for f in self._manifest["cool_files"] if _cool_no(f) in cool_nums]
        return start, snap_cool

    def _report_lost(self, path: str, offset: int, what: str, *, where: str = "it ended at offset") -> None:
        """Note a final line a checkpoint vouched for that is gone whole (cut
        at its start, or zeroed: SPEC reads zeros past the last complete line
        as no damage, and a crash may cut the final line): read as a crash
        leaves it, and noted -- a log record and ``stats()["lost"]``."""
        msg = f"rune_fast: {path}: {what} ({where} {offset})"
        if self.read_only:
            # a viewer may meet the writer mid-roll: the writer's own open judges
            log.info(msg)
            return
        log.warning(msg)
        self._lost.append({"path": path, "offset": offset, "what": what})

    def _tail_durable_end(self, start: int) -> int | None:
        """Where the tail's bytes the store knows to be durable end, for a
        writer's open (None for a viewer): the most of the snapshot's start
        (``start``: its tail lines were synced before it), the manifest's
        ``covered`` and the durable mark (published after each sync)."""
        if self.read_only:
            return None
        end = max(start, self._covered)
        loc = self._mark.stored()
        if loc is not None and loc >> 40 == self._tail_seg:
            end = max(end, loc & _OFF_MASK)
        return end

    def _check_ingest(self, rep, path: str, *, sealed: bool, durable_end: int | None = None) -> None:
        torn_at = rep.torn_offset
        if rep.damaged_offset >= 0:
            if durable_end is None or rep.damaged_offset < durable_end:
                raise CorruptStateCheckpointError(f"damaged line: {rep.damage}", path=path,
                                                  offset=rep.damaged_offset)
            # SPEC: bytes after the last point the store knows to be durable
            # may come back torn anywhere after a power loss (a page lost
            # before a later page kept): no later line was synced either
            # (a sync covers every earlier byte), so none was acknowledged;
            # all of them are quarantined as a torn final line is
            torn_at = rep.damaged_offset
        if len(rep.dup_locs):
            # no writer stores an id twice: a line repeated (each copy sound)
            raise CorruptStateCheckpointError(f"damaged line: {_REPEATED}", path=path,
                                              offset=int(rep.dup_locs[0]) & _OFF_MASK)
        if torn_at >= 0:
            if sealed:
                raise CorruptStateCheckpointError("sealed segment ends in a cut-short line",
                                                  path=path, offset=torn_at)
            if self.read_only:
                return  # the writer's append in flight: skipped, not quarantined
            assert self._tail is not None      # a writer always has its tail
            data = bytes(self._tail.buf[torn_at:self._tail.file_size])
            qpath = quarantine_bytes(os.path.join(self.hot_dir, QUARANTINE_DIR), path,
                                     torn_at, data.strip(b"\0"))
            self._quarantined.append({"path": path, "offset": torn_at,
                                      "length": len(data.strip(b"\0")), "quarantine": qpath})
            self._tail.discard_from(torn_at)
        # zero padding (preallocation) needs nothing: appends overwrite it

    def _load_tombstones(self) -> dict[str, str]:
        path = os.path.join(self.hot_dir, TOMBSTONES_NAME)
        self._tomb_path = path
        out: dict[str, str] = {}
        self._tomb_size = self._tomb_last = 0
        self._tomb_erased = 0           # tombstones before this offset: erased by a compaction
        self._tomb_unsynced = self._tomb_dir_unsynced = False
        self._unerased: list[str] = []
        self._tomb_hlcs: list[str] = []
        # (size, start of its last line) the manifest vouches for: synced before it was written
        vouched = self._manifest.get("tombstones_synced") or [0, 0]
        if not os.path.exists(path):
            if vouched[0] > 0:
                raise CorruptStateCheckpointError(
                    f"the tombstone file is missing; the manifest vouches for {vouched[0]} bytes of it",
                    path=path)
            return out
        with open(path, "rb") as f:
            data = f.read()
        self._tomb_size = len(data)
        scan = scan_frames(data)
        torn_at = scan.torn_offset
        if scan.damaged_offset >= 0:
            bad = data[scan.damaged_offset:data.find(b"\n", scan.damaged_offset)]
            if scan.damaged_offset < vouched[0] or b"\0" not in bad:
                raise CorruptStateCheckpointError(f"damaged tombstone line: {scan.damage}", path=path,
                                                  offset=scan.damaged_offset)
            # past what the manifest vouches for, a line holding zeros is a
            # deletion a power loss tore (a page lost before a later one
            # kept): never acknowledged (each deletion is synced before it
            # returns, and a sync covers every earlier byte), nor any after it
            torn_at = scan.damaged_offset
        if scan.good_end < vouched[1]:
            # deletions before the last one the manifest vouches for are gone
            # (cut off or zeroed): they would come back; only the final line
            # may read as torn, as a crash leaves it
            raise CorruptStateCheckpointError(
                f"the tombstone file lost deletions the manifest vouches for: its complete lines "
                f"end at {scan.good_end}, the manifest's reach past {vouched[1]}", path=path,
                offset=scan.good_end)
        if scan.good_end < vouched[0] and torn_at < 0 and not self.read_only:
            # (a part left of it is quarantined and reported below)
            self._report_lost(path, vouched[0], "the final deletion the manifest vouches for is "
                              "gone (the message it deleted reads again)")
        if torn_at >= 0 and not self.read_only:
            torn = data[torn_at:].rstrip(b"\0")
            qpath = quarantine_bytes(os.path.join(self.hot_dir, QUARANTINE_DIR), path, torn_at, torn)
            self._quarantined.append({"path": path, "offset": torn_at,
                                      "length": len(torn), "quarantine": qpath})
            with open(path, "r+b") as f:
                f.truncate(torn_at)
                os.fsync(f.fileno())
        elif scan.good_end < len(data) and not self.read_only:
            # zero padding: cut it so the next tombstone follows the last line
            with open(path, "r+b") as f:
                f.truncate(scan.good_end)
                os.fsync(f.fileno())
        erased_upto = int(self._manifest.get("tombstones_erased", 0))
        self._tomb_erased = erased_upto
        # a killed "none" session may have left deletions (or the file's
        # folder entry) unsynced: synced before a manifest vouches for them
        self._tomb_unsynced = self._tomb_dir_unsynced = not self.read_only
        offsets = scan.offsets.tolist()
        self._tomb_size = scan.good_end if not self.read_only else len(data)
        self._tomb_last = offsets[-1] if offsets else 0
        for off, ln in zip(offsets, scan.lengths.tolist()):
            body = codec.decode_body(data[off + len(codec.TOMBSTONE_PREFIX) + 23: off + ln - 1],
                                     path=path, offset=off)
            out[body["msg_id"]] = body["channel_id"]
            self._tomb_hlcs.append(body["hlc"])
            if off >= erased_upto:
                self._unerased.append(body["msg_id"])
        return out

    def _rederive_lost_envelopes(self) -> bool:
        """An event store shorter than the manifest's ``events_offset`` lost
        envelopes a checkpoint relied on (cut, emptied or replaced after they
        were synced): write again the ``conversation.message`` envelope of
        every stored message that has none (the records hold the bodies), and
        say so -- a log record and ``stats()["rejournaled"]`` (a torn final
        envelope is also quarantined and warned about by the event store).
        True if it did (every stored message has its envelope then)."""
        assert self._events is not None     # a writer always has its event store
        vouched = int(self._manifest.get("events_offset", 0))
        size = self._events.size
        if size >= vouched:
            return False
        have = {env.get("id") for env in self._events.iter_envelopes(0)
                if env.get("type") == "conversation.message"}
        missing = [rec for rec, _t in self._all_records() if rec.msg_id not in have]
        for rec in missing:
            self._events.append("conversation.message", rec.msg_id, payload_hash(rec))
        self._events.sync()
        self._rejournaled += len(missing)
        # the recorded offset lies past the end (or mid-line) now: every open
        # reads the envelopes from the start until a compaction records anew
        self._covered_events = 0
        self._write_manifest(list(self._manifest["cool_files"]))
        msg = (f"rune_fast: {self._events.path} ends at offset {size}, before the {vouched} bytes the "
               f"manifest vouches for (cut or replaced after they were synced): the envelopes of "
               f"{len(missing)} stored message(s) were written again from their records")
        log.warning(msg)
        return True

    def _rederive_envelopes(self) -> None:
        """Write the ``conversation.message`` envelope of every tail message a
        crash kept out of the event store (the tail holds the body), and note
        messages journaled since the index snapshot that no tier holds."""
        assert self._events is not None     # a writer always has its event store
        # (a checkpoint of an earlier build may have recorded a size read
        # while a task envelope was half written: its lines start after it)
        start = self._events.next_line_start(int(self._manifest.get("events_offset", 0)))
        unheld_from = self._events.next_line_start(max(start, self._snap_events))
        lines_after = self._tail is not None and self._tail.size > self._covered
        if not lines_after and self._events.size <= unheld_from:
            return
        journaled: dict[str, int] = {}      # msg_id -> offset of its envelope
        for env in self._events.iter_envelopes(start if lines_after else unheld_from):
            if env.get("type") == "conversation.message" and type(env.get("id")) is str:
                journaled.setdefault(env["id"], env["offset"])
        if self._events_private:
            self._note_unheld([m for m, at in journaled.items() if at >= unheld_from], journaled)
        if not lines_after:
            return
        assert self._tail is not None       # (lines_after)
        # the ids the open read (_observe_stored_stamps), if the tail is as it was
        known, self._uncovered = self._uncovered, None
        if (known is not None and known[:2] == (self._covered, self._tail.size)
                and all(mid in journaled for mid in known[2])):
            missing = []        # (the common case: no line decoded again)
        else:
            missing = [rec for _off, rec in self._uncovered_records() if rec.msg_id not in journaled]
        if missing:
            for rec in missing:
                self._events.append("conversation.message", rec.msg_id, payload_hash(rec))
            self._events.sync()

    def _note_unheld(self, ids: list[str], journaled: dict[str, int]) -> None:
        """A ``conversation.message`` envelope is written after its tail line,
        so after a crash every message journaled since the index snapshot
        (``ids``; ``journaled`` gives each envelope's offset) is in some tier,
        deleted, or a torn final line that was quarantined. One that is none
        of these was acknowledged and then lost (its complete lines cut or
        zeroed: SPEC reads zeros past the last complete line as no damage, so
        the open goes on): noted as :meth:`_report_lost` notes a vouched line
        gone (a log record and ``stats()["lost"]``). A power loss between the
        two writes of an append that was never acknowledged would also leave
        such an envelope."""
        ids = [m for m in ids if m not in self._tombstones]
        if not ids:
            return
        found = self._index.find_many([codec.key(m) for m in ids]).tolist()
        ids = [m for m, f in zip(ids, found) if f < 0]
        if ids and self._cool.has_files():
            ids = [m for m, hit in zip(ids, self._cool.contains_many(ids).tolist()) if not hit]
        if not ids:
            return
        torn = b"\n".join(data for _path, data in self._torn_lines())
        assert self._events is not None     # a writer always has its event store
        for mid in ids:
            if codec.key(mid) in torn:
                continue        # its line was a torn final one: never acknowledged
            self._report_lost(self._events.path, journaled[mid],
                              f"message {mid!r} was journaled (an acknowledged append) but no tier "
                              f"holds it: its tail line is gone", where="its envelope is at offset")

    def _torn_lines(self) -> list[tuple[str, bytes]]:
        """(path, bytes) of each torn line kept in the quarantine folder (this
        open's and earlier ones)."""
        qdir = os.path.join(self.hot_dir, QUARANTINE_DIR)
        try:
            names = sorted(os.listdir(qdir))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            path = os.path.join(qdir, name)
            with open(path, "rb") as f:
                out.append((path, f.read()))
        return out

    def _tail_lines(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        assert self._tail is not None       # only called with a tail
        scan = scan_frames(self._tail.buf, start, end)
        yield from zip(scan.offsets.tolist(), scan.lengths.tolist())

    def _import_legacy(self) -> None:
        path = os.path.join(self.hot_dir, LEGACY_NAME)
        if not os.path.exists(path):
            return
        try:
            with open(path, "rb") as f:
                data = codec.loads_exact(f.read())
        except (ValueError, OSError) as exc:
            raise CorruptStateCheckpointError(f"legacy checkpoint is not readable JSON: {exc}",
                                              path=path) from None
        items = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise CorruptStateCheckpointError(
                "legacy checkpoint holds neither a list of messages nor {\"messages\": [...]}", path=path)
        records = []
        for i, d in enumerate(items):
            try:
                records.append(ConversationMessageRecord.from_dict(d))
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                raise CorruptStateCheckpointError(f"legacy message {i} does not validate: {exc}",
                                                  path=path, offset=i) from None
        self.append_many(records)
        os.unlink(path)
        fsync_dir(self.hot_dir)
        log.info("imported %d messages from legacy checkpoint %s", len(records), path)

    # ------------------------------------------------------------------
    # helpers
    # ------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"conversation repository {self.state_dir} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise ReadOnlyStoreError(f"conversation repository {self.state_dir} is open read-only")
        if self._sync_error is not None:
            raise DurabilityError(f"conversation repository {self.state_dir} refuses writes after a "
                                  f"failed write or sync ({self._sync_error}); reopen it") from self._sync_error

    def _path_of(self, seg: int) -> str:
        if seg == self._tail_seg and self._tail is not None:
            return self._tail.path
        s = self._segs.get(seg)
        return s.path if s is not None else os.path.join(self.hot_dir, seg_name(seg))

    def _tier_of(self, loc: int) -> str:
        seg, off = loc >> 40, loc & ((1 << 40) - 1)
        return "tail" if seg == self._tail_seg and off >= self._covered else "hot"

    def _read_loc(self, loc: int) -> ConversationMessageRecord:
        """The verified record at ``loc``; CorruptStateCheckpointError if damaged."""
        return self._read_loc_seq(loc)[0]

    def _read_loc_seq(self, loc: int) -> tuple[ConversationMessageRecord, int | None]:
        """The verified record at ``loc`` and its append sequence."""
        hit = self._decoded.get(loc)
        if hit is None:
            hit = self._decode_loc(loc)
            self._cache(loc, hit)
        else:
            self._index.line(loc)        # verifies the checksum, names seg and offset
        return hit

    def _exact_hit(self, loc: int) -> tuple[ConversationMessageRecord, int | None] | None:
        """The decode cache's entry for ``loc`` if it is what was appended:
        not one with tool calls, whose dicts a reader may have edited in
        place. For the reads whose result leaves the store (export: _all_records)."""
        hit = self._decoded.get(loc)
        return hit if hit is not None and not hit[0].tool_calls else None

    def _decode_loc(self, loc: int) -> tuple[ConversationMessageRecord, int | None]:
        """The record at ``loc`` and its append sequence, decoded from its
        checked bytes (never from the decode cache)."""
        self._map_reads += 1
        if self._map_reads >= MAP_RELEASE_READS:
            self._bound_maps()
        return codec.record_from_line(self._index.line(loc), path=self._path_of(loc >> 40),
                                      offset=loc & ((1 << 40) - 1))

    def _bound_maps(self) -> None:
        """Release the mapped pages (lock held) if the resident file pages
        grew past MAP_BUDGET_BYTES since the last release (Linux:
        /proc/self/statm, whose third field counts them; elsewhere, at every
        call). Called every MAP_RELEASE_READS decoded lines and after the
        passes that read lines by the thousand: a search (the first after an
        open checks every hot line), a compaction, verify(), a rebuild."""
        self._map_reads = 0
        now = _resident_file_bytes()
        if now is None or self._map_base is None or now - self._map_base > MAP_BUDGET_BYTES:
            self._release_maps()
        elif now < self._map_base:
            self._map_base = now        # (the kernel reclaimed pages meanwhile)

    def _release_maps(self) -> None:
        """Drop the pages reads mapped in the segment and tail maps from this
        process's page tables (``segments.release_pages``; lock held): they
        stay in the page cache, and a read of one maps it again. Called when
        reads mapped more than MAP_BUDGET_BYTES (:meth:`_bound_maps`) and at
        close, so resident memory follows the lines read lately, not every
        line read since the open. Record-cache hits check their lines through
        the maps too: the pages of a working set under the budget stay
        mapped."""
        if not self._map_release:
            return
        self._map_base = None
        bufs = [seg.buf for seg in self._segs.values()]
        if self._tail is not None:
            bufs.append(self._tail.buf)
        try:
            for buf in bufs:
                release_pages(buf)
        except (OSError, ValueError) as exc:     # (ValueError: a map closed meanwhile)
            self._map_release = False
            log.warning("%s: mapped segment pages cannot be released (%s); they stay resident",
                        self.hot_dir, exc)
            return
        self._map_base = _resident_file_bytes()

    def _cache(self, loc: int, hit: tuple[ConversationMessageRecord, int | None]) -> None:
        if len(self._decoded) >= _DECODE_CACHE:
            self._trim_cache(1)
        self._decoded[loc] = hit

    def _trim_cache(self, room: int) -> None:
        self._decoded.make_room(room)

    @staticmethod
    def _cool_record(row) -> ConversationMessageRecord:
        d = row.record if hasattr(row, "record") else row
        try:
            return message_from_stored(d, fresh_json=getattr(row, "plain", False))
        except (TypeError, ValueError, KeyError) as exc:
            raise CorruptStateCheckpointError(f"archived record does not validate: {exc}",
                                              path=getattr(row, "file", None),
                                              offset=getattr(row, "row", None)) from None

    def _cool_has_channel(self, channel_id: str) -> bool:
        return self._cool.channel_len(channel_id) > 0

    def _cool_max_order(self, channel_id: str) -> tuple | None:
        """(hlc, msg_id) of the channel's newest stamped cool row, or None."""
        return self._cool_max.get(channel_id)

    def _cool_ids_in(self, files: Sequence[str]) -> list[str]:
        import pyarrow.parquet as pq
        out: list[str] = []
        for name in files:
            path = os.path.join(self._cool.cool_dir, name)
            try:
                out.extend(pq.read_table(path, columns=["msg_id"]).column(0).to_pylist())
            except (OSError, ValueError) as exc:
                raise CorruptStateCheckpointError(f"cool archive is not readable: {exc}",
                                                  path=path) from None
        return out

    def append(self, msg: ConversationMessageRecord) -> bool:
        """Store ``msg``. True if stored, False if its ``msg_id`` was already
        stored or deleted (nothing is written then). Durable on return as the
        ``durability`` mode says."""
        return self.append_many([msg]) == 1

    def append_many(self, msgs: Iterable[ConversationMessageRecord]) -> int:
        """Store a batch with one sync at the end; returns how many were new."""
        msgs = msgs if type(msgs) is list else list(msgs)
        if not msgs:
            with self._lock:
                self._check_writable()      # a viewer or a closed store refuses even an empty batch
            return 0
        # encoded outside the lock (compiled: csrc/_encode.pyx)
        bodies, hashes, keys = codec.encode_batch(msgs)
        with self._lock:
            self._check_writable()
            target, added = self._write_messages(msgs, bodies, hashes, keys)
        if added:
            self._wait_durable(target)
            if self._since_compact >= self.compact_every:
                with self._lock:
                    if self._since_compact >= self.compact_every and not self._closed:
                        self._auto_compact()
        return added

    def _fresh(self, msgs: list[ConversationMessageRecord], keys: list[bytes]) -> list[int]:
        """Indexes of the messages of a batch to write: the first of each id
        that no tier holds and no tombstone names (lock held)."""
        tombs = self._tombstones
        if len(msgs) == 1:
            fresh = [] if msgs[0].msg_id in tombs or self._index.find(keys[0]) >= 0 else [0]
        else:
            found = self._index.find_many(keys)
            if not tombs and not (found >= 0).any() and len(set(keys)) == len(keys):
                fresh = list(range(len(msgs)))      # the common batch: every id new, none twice
            else:
                seen: set[str] = set()
                fresh = []
                for i, (m, f) in enumerate(zip(msgs, found.tolist())):
                    mid = m.msg_id
                    if f >= 0 or mid in seen or mid in tombs:
                        continue
                    seen.add(mid)
                    fresh.append(i)
        if fresh and self._cool.has_files():
            if len(fresh) == 1:
                fresh = [] if self._cool.contains(msgs[fresh[0]].msg_id) else fresh
            else:
                archived = self._cool.contains_many([msgs[i].msg_id for i in fresh]).tolist()
                fresh = [i for i, hit in zip(fresh, archived) if not hit]
        return fresh

    def _write_messages(self, msgs: list[ConversationMessageRecord], bodies: list[bytes],
                        hashes: list[str], keys: list[bytes]) -> tuple[int, int]:
        """Write the new ones among ``msgs`` to the tail and index them (lock held)."""
        fresh = self._fresh(msgs, keys)
        if not fresh:
            return 0, 0
        seq0 = self._next_seq
        data, lengths = frame_messages(bodies, fresh, seq0)
        self._next_seq += len(fresh)
        # a writer always has its tail and event store (None only in a viewer)
        tail = cast("TailFile", self._tail)
        try:
            off, remapped = tail.append(data)
        except DurabilityError as exc:
            self._fail(exc)
            raise
        seg = self._tail_seg
        # _wmark before _wpos: a syncer reads _wpos first, so one that sees
        # these bytes counted also sees (and publishes) where they end
        self._wmark = (seg << 40) | (off + len(data))
        self._wpos += len(data)
        if remapped:
            self._reattach_tail()
        if self.durability == "none":
            self._publish(self._wmark)      # (the OS has it: all this mode promises)
        if len(fresh) == 1:
            if not self._index.add((seg << 40) | off):   # cannot happen: checked above under the lock
                raise RuneError(f"index refused new message {msgs[fresh[0]].msg_id!r} at "
                                f"{tail.path}:{off}")
        else:
            rep = self._index.ingest(seg, off, off + len(data))
            if rep.good_end != off + len(data) or len(rep.added) != len(fresh):
                raise RuneError(f"index took {len(rep.added)} of the {len(fresh)} new messages "
                                f"written at {tail.path}:{off}")
        # the decode cache keeps the batch's newest records (at most its size)
        skip = max(0, len(fresh) - _DECODE_CACHE)
        if len(self._decoded) + len(fresh) - skip > _DECODE_CACHE:
            self._trim_cache(len(fresh) - skip)
        decoded, interleaved, fold = self._decoded, self._interleaved, self._fold_order
        behind, cool_max = self._behind, self._cool_max
        pos = (seg << 40) | off
        for j, i in enumerate(fresh):
            m = msgs[i]
            if j >= skip:
                # (a caller's later edit of its record's tool calls is not the stored value)
                decoded[pos] = (_own(m), seq0 + j)
            pos += lengths[j]
            ch = m.channel_id
            if ch in interleaved:
                self._note_order(m)
            if behind is not None and ch in cool_max and ch not in behind \
                    and _sorts_before(m, cool_max[ch]):
                behind.add(ch)          # it sorts before a cool row (see _excess_behind_cool)
            if ch in fold:
                self._note_fold_order(m)
        self._observe_stamps(msgs if len(fresh) == len(msgs) else [msgs[i] for i in fresh])
        self._since_compact += len(fresh)
        self._snap_changes += len(fresh)
        # journaled with one write; durable by the next checkpoint, re-derived
        # from the tail by recovery if a crash loses it first
        events = cast("EventStore", self._events)
        try:
            events.append_encoded(message_envelopes(keys, hashes, fresh, codec.dumps(time.time())), offset=False)
        except (OSError, DurabilityError) as exc:
            # (the lines are in the tail: "maybe stored", as after a failed sync)
            self._fail(exc)
            raise DurabilityError(f"journal of {len(fresh)} message(s) in {events.path} failed: {exc}; "
                                  "the store refuses writes until reopened") from exc
        return self._wpos, len(fresh)

    def _observe_stamps(self, recs: list[ConversationMessageRecord]) -> None:
        """Let the clock observe the stamps of stored records: each ``hlc``,
        and for the unstamped ones the latest ``ts`` once (its section 7
        stamp passes the others')."""
        newest = -math.inf
        for m in recs:
            if m.hlc:
                self._observe(m.hlc)
            elif m.ts > newest:
                newest = m.ts
        if newest * 1000 > self._clock.last_wall:
            self._observe_derived(newest)

    def _observe(self, hlc: Any) -> None:
        """Let the clock observe a stored stamp. A stamp that is not in the
        section 7 form, or one at the clock's very end, is stored as given but
        cannot move the clock."""
        try:
            self._clock.observe(hlc)
        except ValueError as exc:
            log.debug("clock does not observe %r: %s", hlc, exc)

    def _observe_derived(self, ts: float) -> None:
        """Let the clock pass the stamp section 7 gives an unstamped message
        of time ``ts``, ``Hlc(round(ts*1000), 0, origin)``: a later stamp of
        this store (a deletion's tombstone, a caller's ``clock.now()``) then
        sorts after it, as one from a store that merged it would. Appends call
        it once a batch, for the latest such ts, when it is past the clock's
        wall time; a ts outside the Hlc's range makes no stamp and moves
        nothing."""
        try:
            self._clock.pass_wall(round(ts * 1000))
        except (ValueError, OverflowError):
            pass

    def _note_order(self, m: ConversationMessageRecord) -> None:
        """Keep the interleave verdict of the channel true after an append."""
        if self._interleaved.get(m.channel_id) is False:
            last = self._cool_max_order(m.channel_id)
            if last is not None and _sorts_before(m, last):
                self._interleaved[m.channel_id] = True

    def _is_interleaved(self, channel_id: str) -> bool:
        """Whether some hot message of the channel sorts before one of its cool
        rows (a late merge or an unstamped message after stamped ones were
        cooled): reads then merge the tiers in full. The hot array is sorted,
        so its first message decides."""
        verdict = self._interleaved.get(channel_id)
        if verdict is None:
            verdict = False
            last = self._cool_max_order(channel_id)
            if last is not None:
                locs = self._index.channel_locs(codec.key(channel_id), -1)
                if len(locs):
                    first = self._read_loc(int(locs[0]))
                    # (the cool tier asked last: a first read of a channel
                    # whose hot messages are newer never opens its index)
                    verdict = (_sorts_before(first, last)
                               and self._cool_has_channel(channel_id))
            self._interleaved[channel_id] = verdict
        return verdict

    def _wait_durable(self, target: int) -> None:
        """Return once the tail is synced up to ``target`` (group commit)."""
        if self.durability == "none":
            return
        cond = self._sync_cond
        with cond:
            while True:
                if self._sync_error is not None:
                    raise DurabilityError(f"sync of {cast('TailFile', self._tail).path} failed: "
                                          f"{self._sync_error}") from self._sync_error
                if self._synced >= target:
                    return
                if not self._syncing:
                    self._syncing = True
                    break
                cond.wait()
        # the leader syncs at once: appenders that write meanwhile wait behind
        # this sync, and the next leader syncs all they wrote (group commit).
        # Measured: with 2-4 appending threads in "batch" mode, a leader that
        # waited 0.5 ms for them first had 1.5-2x less throughput.
        self._sync_as_syncer()

    def _fail(self, exc: BaseException) -> None:
        """Refuse every later write until the store is reopened: a write or
        sync failed (SPEC: reported, never retried silently). Waiters of a
        group commit are woken to see it."""
        with self._sync_cond:
            if self._sync_error is None:
                self._sync_error = exc
            self._sync_cond.notify_all()

    def _sync_now(self) -> None:
        """Sync the tail now (lock held); records a failure for every waiter."""
        if self._tail is None:
            return
        with self._sync_cond:
            while self._syncing:
                self._sync_cond.wait()
            if self._sync_error is not None:
                raise DurabilityError(f"sync of {self._tail.path} failed: {self._sync_error}")
            self._syncing = True
        self._sync_as_syncer()

    def _sync_as_syncer(self) -> None:
        """The sync of the thread that set ``_syncing`` (group commit): sync
        what was written so far, publish where it ends to viewers, wake the
        waiters; a failure is recorded for every waiter (the store then
        refuses writes) and raised."""
        cond = self._sync_cond
        try:
            upto, mark = self._wpos, self._wmark    # (_wpos first: see _write_messages)
            cast("TailFile", self._tail).sync()     # a writer always has its tail
        except BaseException as exc:
            with cond:
                self._sync_error = exc
                self._syncing = False
                cond.notify_all()
            raise
        with cond:
            self._synced = max(self._synced, upto)
            self._publish(mark)
            self._syncing = False
            cond.notify_all()

    def flush(self) -> None:
        """Make everything written so far durable (whatever the mode)."""
        with self._lock:
            self._check_open()
            if self.read_only:
                return
            self._sync_now()
            self._sync_tombstones()
            assert self._events is not None     # a writer always has its event store
            self._events.sync()

    def _sync_tombstones(self) -> None:
        """fdatasync the tombstones file (and fsync the folder that names it)
        if deletions since the last sync, or a session before this open that
        ``durability="none"`` let off, may not be on disk; lock held."""
        if (self._tomb_unsynced or self._tomb_dir_unsynced) and os.path.exists(self._tomb_path):
            if self._tomb_unsynced:
                fdatasync_path(self._tomb_path)
            if self._tomb_dir_unsynced:
                fsync_dir(self.hot_dir)
        self._tomb_unsynced = self._tomb_dir_unsynced = False

    # ------------------------------------------------------------------
    # deletion
    # ------------------------------------------------------------------
    def delete(self, msg_id: str) -> bool:
        """Delete a stored message. True if one was deleted. Durable on return;
        the bytes are erased from every tier by the next ``compact()``."""
        _str_arg("msg_id", msg_id)
        with self._lock:
            self._check_writable()
            return self._delete_ids([msg_id], record_unknown=False) == 1

    def clear_channel(self, channel_id: str) -> int:
        """Delete every message of the channel; returns how many."""
        _str_arg("channel_id", channel_id)
        with self._lock:
            self._check_writable()
            ids = [r.msg_id for r, _t in self._channel_all(channel_id)]
            return self._delete_ids(ids, record_unknown=False)

    def _delete_ids(self, ids: Sequence[str], *, record_unknown: bool,
                    hlcs: dict[str, str] | None = None, channels: dict[str, str] | None = None) -> int:
        """Tombstone ``ids`` (lock held): one sync for the batch. Returns how many
        stored messages were deleted. With ``record_unknown`` an id that is not
        stored is tombstoned too (a tombstone op merged ahead of its message)."""
        assert self._events is not None     # a writer always has its event store
        lines = []
        todo: list[tuple[str, str, int, bool]] = []  # (id, channel, loc, in_cool)
        for mid in dict.fromkeys(ids):
            if mid in self._tombstones:
                continue
            k = codec.key(mid)
            loc = self._index.find(k)
            channel = None
            in_cool = False
            if loc >= 0:
                channel = self._read_loc(loc).channel_id
            elif self._cool.contains(mid):
                in_cool = True
                channel = cast("dict", self._cool.get(mid))["channel_id"]   # contains() just found it
            elif record_unknown:
                channel = (channels or {}).get(mid, "")
            else:
                continue
            hlc = (hlcs or {}).get(mid) or str(self._clock.now())
            lines.append(codec.tombstone_rest(mid, channel, hlc))
            todo.append((mid, channel, loc, in_cool))
        if not todo:
            return 0
        data = frame_many(lines)
        fd = os.open(self._tomb_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            new_file = os.fstat(fd).st_size == 0
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.durability != "none":
                os.fdatasync(fd)
        except OSError as exc:
            self._fail(exc)
            raise DurabilityError(f"write of tombstones to {self._tomb_path} failed: {exc}; the store "
                                  "refuses writes until reopened") from exc
        finally:
            os.close(fd)
        self._tomb_last = self._tomb_size + data.rfind(b"\n", 0, len(data) - 1) + 1
        self._tomb_size += len(data)
        self._tomb_unsynced = self.durability == "none"
        self._manifest_dirty = True     # its close records the tombstones it can vouch for
        if new_file:
            if self.durability != "none":
                fsync_dir(self.hot_dir)
            else:
                self._tomb_dir_unsynced = True
        deleted = 0
        for mid, channel, loc, in_cool in todo:
            self._tombstones[mid] = channel
            if loc >= 0:
                self._index.remove(codec.key(mid))
                self._decoded.pop(loc, None)
                self._dirty_segs.add(loc >> 40)
                self._pending_erase.add(mid)
                deleted += 1
            elif in_cool:
                self._cool_deleted.add(mid)
                self._pending_erase.add(mid)
                deleted += 1
        self._snap_changes += len(todo)
        # (after the reads see the deletions: the tombstones are durable, and
        # every read must agree with what the next open will read)
        try:
            for mid, channel, _loc, _in_cool in todo:
                self._events.append("conversation.deleted", mid, payload_hash({"msg_id": mid}),
                                    channel_id=channel)
            if self.durability != "none":
                self._events.sync()
        except (OSError, DurabilityError) as exc:
            self._fail(exc)
            raise DurabilityError(f"journal of {len(todo)} deletion(s) in {self._events.path} failed: {exc}; "
                                  "the store refuses writes until reopened") from exc
        return deleted

    # ------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------
    @_viewer_retry
    def get_message(self, msg_id: str) -> MessageRead:
        """Exact read across tiers, verified against the stored checksum or digest."""
        _str_arg("msg_id", msg_id)
        with self._lock:
            self._check_open()
            if msg_id in self._tombstones:
                return MessageRead(ReadStatus.NOT_FOUND_CONFIRMED)
            k = codec.key(msg_id)
            loc = self._index.find(k)
            rec: ConversationMessageRecord | None
            if loc >= 0:
                tier = self._tier_of(loc)
                try:
                    rec = self._read_loc(loc)
                except CorruptStateCheckpointError as exc:
                    self._read_damage("exact read of %s: %s", msg_id, exc)
                    return MessageRead(ReadStatus.SOURCE_CORRUPT, None, tier)
                if rec.msg_id != msg_id:
                    return MessageRead(ReadStatus.SOURCE_CORRUPT, None, tier)
                return MessageRead(ReadStatus.FOUND_VERIFIED, _own(rec), tier)
            try:
                # the rows whose id hashes like msg_id (usually one): kept records, or read now
                rec = next((r for r, _o in self._cool_records(self._cool.id_locs(msg_id))
                            if r.msg_id == msg_id), None)
            except CorruptStateCheckpointError as exc:
                self._read_damage("exact read of %s: %s", msg_id, exc)
                return MessageRead(ReadStatus.SOURCE_CORRUPT, None, "cool")
            if rec is None:
                # A hot line indexed under this id's hash whose bytes fail their
                # checksum may be this message with a damaged id: not "not found".
                for cand in self._index.candidates(k).tolist():
                    try:
                        line = self._index.line(cand)
                        moved = not _tag_matches(line, k, self._path_of(cand >> 40), cand & _OFF_MASK)
                    except CorruptStateCheckpointError as exc:
                        self._read_damage("exact read of %s: %s", msg_id, exc)
                        return MessageRead(ReadStatus.SOURCE_CORRUPT, None, self._tier_of(cand))
                    if moved:
                        # a sound line, but not of the id whose hash put it in
                        # this slot: a line moved there (another id sharing the
                        # tag would match it)
                        self._read_damage("exact read of %s: the line at %s:%d is another message's",
                                  msg_id, self._path_of(cand >> 40), cand & _OFF_MASK)
                        return MessageRead(ReadStatus.SOURCE_CORRUPT, None, self._tier_of(cand))
                return MessageRead(ReadStatus.NOT_FOUND_CONFIRMED)
            return MessageRead(ReadStatus.FOUND_VERIFIED, _own(rec), "cool")

    def _read_damage(self, fmt: str, *args: Any) -> None:
        """Log what made an exact read SOURCE_CORRUPT: an error in a writer;
        in a viewer a debug record, as the read may have met a file its
        writer's compaction just replaced (``_viewer_retry`` reloads and
        reads again, and logs the error if the read stays SOURCE_CORRUPT)."""
        (log.debug if self.read_only else log.error)(fmt, *args)

    def _hot_channel(self, channel_id: str, n: int = -1) -> list[tuple[ConversationMessageRecord, str]]:
        locs = self._index.channel_locs(codec.key(channel_id), n)
        return [(self._read_loc(loc), self._tier_of(loc)) for loc in locs.tolist()]

    def _cool_rows(self, rows) -> list[ConversationMessageRecord]:
        if self._cool_deleted:
            rows = [r for r in rows if r.record["msg_id"] not in self._cool_deleted]
        return [self._cool_record(r) for r in rows]

    def _channel_all(self, channel_id: str) -> list[tuple[ConversationMessageRecord, str]]:
        """Every live message of a channel, all tiers, oldest first."""
        hot = self._hot_channel(channel_id)
        if not self._cool_has_channel(channel_id):
            return hot
        cool = self._cool_rows(self._cool.channel_rows(channel_id))
        return self._merge(cool, hot)

    @staticmethod
    def _merge(cool: list[ConversationMessageRecord], hot: list[tuple[ConversationMessageRecord, str]],
               ) -> list[tuple[ConversationMessageRecord, str]]:
        keyed = [(_order_key(r, _COOL_RANK, i), r, "cool") for i, r in enumerate(cool)]
        keyed += [(_order_key(r, _HOT_RANK, i), r, t) for i, (r, t) in enumerate(hot)]
        keyed.sort(key=lambda e: e[0])
        return [(r, t) for _k, r, t in keyed]

    @_viewer_retry
    def window(self, channel_id: str, n: int = 8) -> list[ConversationMessageRecord]:
        """The last ``n`` messages of the channel, oldest first ([] for n <= 0
        or an unknown channel)."""
        _str_arg("channel_id", channel_id)
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"n: expected int, got {type(n).__name__}")
        with self._lock:
            self._check_open()
            if n <= 0:
                return []
            n = min(n, _MAX_N)      # (a larger n asks for every message the channel can hold)
            if not self._is_interleaved(channel_id):
                # the last n messages, every line's checksum checked, every read
                locs, recs, misses = self._index.window_hits(codec.key(channel_id), n, self._decoded)
                if len(locs) >= n or not self._cool_has_channel(channel_id):
                    if misses:
                        recs = [r if r is not None else self._read_loc(loc) for loc, r in zip(locs, recs)]
                    return own_calls(recs)
            return own_calls([r for r, _t in self._window(channel_id, n)])

    def _window(self, channel_id: str, n: int) -> list[tuple[ConversationMessageRecord, str]]:
        if self._is_interleaved(channel_id):
            return self._channel_all(channel_id)[-n:]
        hot = self._hot_channel(channel_id, n)
        if len(hot) >= n or not self._cool_has_channel(channel_id):
            return hot
        need = n - len(hot)
        rows = self._cool.channel_tail(channel_id, need + len(self._cool_deleted))
        cool = self._cool_rows(rows)[-need:]
        return self._merge(cool, hot)[-n:]

    @_viewer_retry
    def messages_for_task(self, task_id: str) -> list[ConversationMessageRecord]:
        """Every message of the task, all tiers, oldest first."""
        _str_arg("task_id", task_id)
        with self._lock:
            self._check_open()
            if task_id == "":
                return []
            locs, hot, misses = self._index.task_hits(codec.key(task_id), self._decoded)
            if misses:
                hot = [h if h is not None else self._read_loc_seq(loc) for loc, h in zip(locs, hot)]
            cool_locs = self._cool.task_locs(task_id)
            if not cool_locs:
                return own_calls([r for r, _seq in hot])       # the index keeps them in order
            cool = self._cool_records(cool_locs)
            if {rec.task_id for rec, _o in cool} != {task_id}:
                rec = next(rec for rec, _o in cool if rec.task_id != task_id)
                raise CorruptStateCheckpointError(
                    f"cool index says {rec.msg_id!r} is a message of task {task_id!r}, "
                    f"the file says {rec.task_id!r}", path=self._cool.cool_dir)
            deleted = self._cool_deleted
            keyed = [(_xkey(r, seq), r) for r, seq in hot]
            keyed += [(_xkey(rec, o), rec) for rec, o in cool if rec.msg_id not in deleted]
            keyed.sort(key=_first)
            return own_calls([r for _k, r in keyed])

    def _cool_records(self, locs: list[int]) -> list[tuple[ConversationMessageRecord, int]]:
        """(record, ord) of the cool rows at ``locs`` (cool_loc): from the
        cache of rows verified before, the others read (and verified) now
        and kept."""
        got, misses = self._cool_decoded.get_many(locs)
        if not misses:
            return got
        miss = [loc for loc, hit in zip(locs, got) if hit is None]
        read = {loc: (self._cool_record(row), row.ord) for loc, row in zip(miss, self._cool.rows_at(miss))}
        self._cool_keep(list(read.items()))
        return [hit if hit is not None else read[loc] for loc, hit in zip(locs, got)]

    def _cool_keep(self, items: list[tuple[int, tuple[ConversationMessageRecord, int]]]) -> None:
        """Keep verified cool records (at most _DECODE_CACHE; the oldest quarter goes first)."""
        items = items[-_DECODE_CACHE:]
        cache = self._cool_decoded
        if len(cache) + len(items) > _DECODE_CACHE:
            cache.make_room(len(items))
        for loc, hit in items:
            cache[loc] = hit

    @_viewer_retry
    def search(self, text: str, channel_id: str | None = None, *, limit: int | None = None,
               case_sensitive: bool = False) -> list[SearchHit]:
        """Every message whose content contains ``text`` (hot and cool tiers),
        oldest first; with ``limit``, the newest ``limit`` hits.

        Case-insensitive means ``text.casefold() in content.casefold()``."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        if channel_id is not None and not isinstance(channel_id, str):
            raise TypeError(f"channel_id: expected str or None, got {type(channel_id).__name__}")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            raise TypeError(f"limit: expected int or None, got {type(limit).__name__}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit: must be >= 0, got {limit}")
        with self._lock:
            self._check_open()
            if limit == 0:
                return []
            ch_key = codec.key(channel_id) if channel_id is not None else None
            self._check_hot_lines()
            if not self._filters_read:
                self._read_seg_filters()
            # A pass over whole segments finds a hit's line by the newline
            # before it: a segment holding a damaged dead line or zeros (left
            # for verify() to report) is searched line by line from the index
            # instead, channel by channel, so its live lines are all seen.
            ragged = bool(self._ragged & (set(self._seg_order) | {self._tail_seg}))
            chans = [ch_key] if ch_key is not None or not ragged else list(self._index.channels())

            def hot(needle: bytes, ci: bool, na: bool) -> list[int]:
                if len(chans) == 1:
                    return self._index.search(needle, ci, na, chans[0]).tolist()
                return [loc for ch in chans for loc in self._index.search(needle, ci, na, ch).tolist()]
            if case_sensitive:
                check = (lambda c: text in c)
                locs = hot(codec.key(text), False, False)
            else:
                folded = text.casefold()
                check = (lambda c: folded in c.casefold())
                specials = relevant_specials(folded) if folded.isascii() else ()
                if folded.isascii() and not (specials and ragged):
                    # ASCII-case-insensitive candidates are exact, except where a
                    # non-ASCII character folds to ASCII letters of the needle
                    # ('ß' -> 'ss', Kelvin sign -> 'k'): the lines holding one
                    # that can take part in a match join too (kept per segment).
                    locs = hot(codec.key(folded), True, False)
                    if specials:
                        seen = set(locs)
                        extra = [loc for loc in self._special_lines(specials) if loc not in seen]
                        locs.extend(self._live_in(extra, channel_id))
                elif folded.isascii():
                    # ragged segments: every line holding a non-ASCII byte joins
                    locs = hot(codec.key(folded), True, True)
                else:
                    locs = self._anchored(hot, folded)
            if not self.read_only:
                self._keep_seg_filters()
            keyed = []
            for loc in locs:
                rec, seq = self._read_loc_seq(loc)
                if check(rec.content):
                    keyed.append((_xkey(rec, seq), rec, self._tier_of(loc)))
            # cool hits whose verified records the cache holds are not read
            # again (a search asked twice); the rows read join the cache
            cached = self._cool_decoded
            rows, known = self._cool.search_known(text, channel_id, case_sensitive=case_sensitive, known=cached)
            deleted = self._cool_deleted
            for rec, o in (cached[loc] for loc in known):
                if channel_id is not None and rec.channel_id != channel_id:
                    raise CorruptStateCheckpointError(
                        f"cool index says {rec.msg_id!r} is a message of channel {channel_id!r}, "
                        f"its row says {rec.channel_id!r}", path=self._cool.cool_dir)
                if rec.msg_id not in deleted and check(rec.content):
                    keyed.append((_xkey(rec, o), rec, "cool"))
            read = [(self._cool_record(row), row) for row in rows]
            keyed += [(_xkey(rec, row.ord), rec, "cool") for rec, row in read if rec.msg_id not in deleted]
            self._cool_keep([(self._cool.loc_of(row), (rec, row.ord)) for rec, row in read[-_DECODE_CACHE:]])
            keyed.sort(key=lambda e: e[0])
            if limit is not None:
                keyed = keyed[-limit:]
            recs = own_calls([r for _k, r, _t in keyed])
            self._bound_maps()          # the pass mapped every block its filters passed
            return [SearchHit(r, t) for r, (_k, _r, t) in zip(recs, keyed)]

    @staticmethod
    def _anchored(hot: Callable[[bytes, bool, bool], list[int]], folded: str) -> list[int]:
        """Candidate hot lines of a casefolded needle that is not ASCII: those
        holding one of its anchors' stored forms (byte searches of the
        compiled scan; _casefold.anchor_forms: no match is missed), each
        checked by the caller's fold. Without an anchor, every line holding
        a non-ASCII byte."""
        forms = anchor_forms(folded)
        if forms is None:
            return hot(b"", True, True)
        if len(forms) == 1:
            return hot(codec.key(forms[0]), False, False)
        return sorted(set().union(*(hot(codec.key(f), False, False) for f in forms)))

    def _check_hot_lines(self) -> None:
        """Check the checksum of every hot line once (lock held): a search
        reads only the lines its needle can match, so a flipped byte that
        unmade a match would otherwise drop a message from its hits without a
        word. Sealed segments never change and are checked once; the tail
        from where the last check stopped. A damaged line of a live message
        raises CorruptStateCheckpointError; one of a message that is gone
        (cooled or deleted, its bytes kept until a compaction rewrites the
        segment) is left to verify()."""
        live_arr: list[np.ndarray] = []

        def live(lo: int, hi: int) -> np.ndarray:
            """The indexed locations in [lo, hi), ascending (all of them
            sorted once, at the first call that needs them)."""
            if not live_arr:
                live_arr.append(np.sort(self._index.excess(0)))
            a = live_arr[0]
            return a[np.searchsorted(a, lo):np.searchsorted(a, hi)]
        for seg in self._seg_order:
            if seg not in self._lines_checked:
                s = self._segs[seg]
                self._check_lines(seg, s.buf, 0, s.size, s.path, live, self._vouched.pop(seg, 0))
                self._lines_checked.add(seg)
        if self._tail is not None:
            seg, start = self._tail_checked
            if seg != self._tail_seg:
                start = 0
            if self._tail.size > start:
                self._check_lines(self._tail_seg, self._tail.buf, start, self._tail.size, self._tail.path, live,
                                  self._vouched.pop(self._tail_seg, 0))
            self._tail_checked = (self._tail_seg, self._tail.size)

    def _read_seg_filters(self) -> None:
        """Hand the index the search filters kept for the sealed segments
        (lock held; once an open, at its first search, after the line check):
        a whole-store search skips their blocks that cannot hold its needle
        from the first search on. A file that does not hold for its segment
        (damaged, cut, another build's layout, other bytes) is named in a log
        warning and removed by a writer (a viewer leaves it); the index
        builds the filters again at its second search."""
        self._filters_read = True
        for seg in self._seg_order:
            s = self._segs.get(seg)
            if s is None or s.buf is None:
                continue
            buf = s.buf
            kept = read_kept(os.path.join(self.hot_dir, filters_name(seg)),
                             lambda raw: self._index.set_seg_filters(
                                 seg, decode_filters(raw, SEARCH_FILTER_LAYOUT, buf)),
                             remove_bad=not self.read_only)
            if kept is not None:
                self._filters_kept[seg] = kept

    def _keep_seg_filters(self) -> None:
        """Write the filters the index built over sealed segments since they
        were last kept (lock held; a writer's, after a search): a cache, so
        the next open's first search skips blocks too (building them costs
        about five plain scans: ~1.5 s over the 600 MB of hot segments of
        the 1,000,000-message bench store). Temp file, fsync (not in "none"
        mode), rename; the folder is not synced (a power loss may cost the
        next open a build, or a warning for a file it left cut).
        A failed write is logged and skipped: the search has its answer."""
        for seg in self._seg_order:
            n = self._index.seg_filter_blocks(seg)
            s = self._segs.get(seg)
            if n <= self._filters_kept.get(seg, 0) or s is None or s.buf is None:
                continue
            path = os.path.join(self.hot_dir, filters_name(seg))
            if write_kept(path, encode_filters(SEARCH_FILTER_LAYOUT, s.buf, self._index.seg_filters(seg)),
                          tmp=path + ".tmp", sync=self.durability != "none"):
                self._filters_kept[seg] = n

    def _check_lines(self, seg: int, buf: Any, start: int, end: int, path: str,
                     live: Callable[[int, int], np.ndarray], vouched_end: int = 0) -> None:
        """Check the lines of ``seg`` in [start, end) (see _check_hot_lines),
        and that every indexed message before ``vouched_end`` (the bytes that
        were there at the open: see _vouched) starts a line: sound lines moved
        in the region an index snapshot vouches for would otherwise hide the
        messages from a search (its hits are found in the bytes, then looked
        up by offset). A segment where the scan meets a damaged line, a cut
        one, or zeros with live lines after them is noted as ragged (see
        search)."""
        base = seg << 40
        while start < end:
            scan = scan_frames(buf if buf is not None else b"", start, end)
            sound_end = min(vouched_end, scan.good_end if scan.damaged_offset < 0 else scan.damaged_offset)
            if sound_end > start:
                _check_line_starts(scan.offsets, live(base | start, base | sound_end) & _OFF_MASK, path)
            if scan.damaged_offset < 0:
                if scan.good_end < end:
                    # zeros (a segment's trailing preallocation, or zeroed
                    # lines) or a cut line: any live line from there on is
                    # checked by itself (a damaged one raises)
                    rest = live(base | scan.good_end, base | end)
                    if len(rest) or scan.torn_offset >= 0:
                        self._ragged.add(seg)
                    if len(rest):
                        self._index.check_lines(rest.tolist())
                return
            self._ragged.add(seg)
            off = scan.damaged_offset
            if len(live(base | off, base | off + 1)):
                raise CorruptStateCheckpointError(f"damaged line: {scan.damage}", path=path, offset=off)
            nl = memoryview(buf)[off:end].tobytes().find(b"\n")
            if nl < 0:
                return
            start = off + nl + 1

    def _special_lines(self, chars: Sequence[str]) -> list[int]:
        """Locations of the hot and tail lines (live or not) whose content
        holds one of ``chars``, found once per segment and kept: a sealed
        segment never changes, and the tail is scanned on from where the last
        search stopped. A rewritten segment has a new number."""
        segs = list(self._seg_order)
        if self._tail is not None and self._tail.size > 0:     # (an empty tail is not attached)
            segs.append(self._tail_seg)
        cache = self._special_cache
        for stale in [seg for seg in cache if seg not in segs]:
            del cache[stale]
        out: list[int] = []
        for seg in segs:
            per = cache.setdefault(seg, {})
            # not the tail's zero padding (segs holds the tail's number only when there is a tail)
            stop = cast("TailFile", self._tail).size if seg == self._tail_seg else -1
            for c in chars:
                end, locs = per.get(c, (0, []))
                new, end = self._index.scan_segment(seg, end, codec.key(c), stop)
                if len(new):
                    locs = locs + new.tolist()
                per[c] = (end, locs)
                out.extend(locs)
        return out

    def _live_in(self, locs: list[int], channel_id: str | None) -> list[int]:
        """The ``locs`` that are indexed messages (of ``channel_id``, if given)."""
        out = []
        find = self._index.find
        for loc in dict.fromkeys(locs):
            rec = self._read_loc(loc)
            if find(codec.key(rec.msg_id)) == loc and (channel_id is None or rec.channel_id == channel_id):
                out.append(loc)
        return out

    @_viewer_retry
    def latest_task(self, channel_id: str) -> str | None:
        """task_id of the newest message on the channel that has one, or None."""
        _str_arg("channel_id", channel_id)
        with self._lock:
            self._check_open()
            if not self._is_interleaved(channel_id):
                k = self._index.latest_task(codec.key(channel_id))
                if k is not None:
                    return _unkey(k)
                if not self._cool_has_channel(channel_id):
                    return None
            for rec, _t in reversed(self._channel_all(channel_id)):
                if rec.task_id:
                    return rec.task_id
            return None

    @_viewer_retry
    def channels(self) -> list[str]:
        """Every channel that holds at least one message, sorted."""
        with self._lock:
            self._check_open()
            out = {_unkey(k) for k in self._index.channels() if self._index.channel_len(k) > 0}
            for ch in self._cool.channels():
                if ch in out:
                    continue
                if not self._cool_deleted or self._cool_rows(self._cool.channel_rows(ch)):
                    out.add(ch)
            return sorted(out)

    def __len__(self) -> int:
        with self._lock:
            self._check_open()
            return len(self._index) + len(self._cool) - len(self._cool_deleted)

    def __contains__(self, msg_id: object) -> bool:
        if not isinstance(msg_id, str):
            return False
        return self.get_message(msg_id).status is not ReadStatus.NOT_FOUND_CONFIRMED

    # ------------------------------------------------------------------
    # transcripts and sync
    # ------------------------------------------------------------------
    @property
    def clock(self) -> "_sync.HlcClock":
        """The store's hybrid logical clock (device id persisted in the state dir)."""
        return self._clock

    @_viewer_retry
    def resume_messages(self, channel_id: str, n: int | None = None) -> list[dict]:
        """The channel's transcript as a provider-valid message list: fold of its
        ops, then ``LastN(n)``, then ``repair`` (system messages left out)."""
        _str_arg("channel_id", channel_id)
        if n is not None and (not isinstance(n, int) or isinstance(n, bool)):
            raise TypeError(f"n: expected int or None, got {type(n).__name__}")
        if n is not None and n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        with self._lock:
            self._check_open()
            records = self._resume_candidates(channel_id, n)
        ops = [_sync.op_from_record_dict(r.to_dict(), lenient=True) for r in records if r.role != "system"]
        turns = _sync.fold(ops, channel_id)
        if n is not None:
            turns = _sync.LastN(n).apply(turns)
        return _sync.repair(turns)

    def _resume_candidates(self, channel_id: str, n: int | None) -> list[ConversationMessageRecord]:
        """The channel's messages that ``LastN(n)`` can keep (lock held).

        When the channel's store order agrees with the fold order (checked once
        per channel, then kept up to date on append), that is a suffix of the
        channel: the cost follows ``n``, not the size of the channel or store."""
        if n is not None and self._fold_consistent(channel_id):
            k = n + 16
            while True:
                recs = [r for r, _t in self._window(channel_id, k)] if k else []
                if len(recs) < k or sum(1 for r in recs if r.role != "system") >= n:
                    return recs
                k *= 4
        return [r for r, _t in self._channel_all(channel_id)]

    def _fold_consistent(self, channel_id: str) -> bool:
        """Whether the channel's messages (system ones aside) stand in the
        fold order in the store order. Kept per channel as ``[verdict, fold
        key of the last message, (hlc, msg_id) of the last stamped one]``."""
        state = self._fold_order.get(channel_id)
        if state is None:
            state = [True, None, None]
            for r, _t in self._channel_all(channel_id):
                if r.hlc:
                    state[2] = (r.hlc, r.msg_id)    # stamped messages come last, in this order
                if r.role == "system":
                    continue
                k = _fold_key(r)
                if state[1] is not None and k < state[1]:
                    state[0] = False
                    break
                state[1] = k
            self._fold_order[channel_id] = state
        return state[0]

    def _note_fold_order(self, m: ConversationMessageRecord) -> None:
        """Keep the fold-order verdict of the channel true after an append:
        the new message must land last in the store order (an unstamped one
        lands before every stamped one, a stamped one by its (hlc, msg_id))
        and last in the fold order."""
        state = self._fold_order.get(m.channel_id)
        if state is None or not state[0]:
            return
        if m.hlc:
            at = (m.hlc, m.msg_id)
            if state[2] is not None and at < state[2]:
                if m.role != "system":     # a system message's place does not matter
                    state[0] = False
                return
            state[2] = at
        elif state[2] is not None and m.role != "system":
            state[0] = False
            return
        if m.role == "system":
            return
        k = _fold_key(m)
        if state[1] is not None and k < state[1]:
            state[0] = False
        else:
            state[1] = k

    def _all_records(self) -> list[tuple[ConversationMessageRecord, str]]:
        """Every live record, for an export: those with tool calls decoded
        from their bytes (a reader may have edited a cached record's dicts in
        place; another store must get what was appended)."""
        out = []
        for k in self._index.channels():
            for loc in self._index.channel_locs(k, -1).tolist():
                hit = self._exact_hit(loc)
                if hit is not None:
                    self._index.line(loc)       # checks the line
                rec = (hit or self._decode_loc(loc))[0]
                out.append((rec, self._tier_of(loc)))
        for ch in self._cool.channels():
            out.extend((r, "cool") for r in self._cool_rows(self._cool.channel_rows(ch)))
        return out

    @_viewer_retry
    def export_ops(self, since: "_sync.Hlc | str | None" = None) -> list:
        """Every stored message (all tiers) and every tombstone as ops, by
        ``(hlc, op_id)``; with ``since`` (exclusive) only those stamped after it."""
        if since is not None and not isinstance(since, _sync.Hlc):
            if not isinstance(since, str):
                raise TypeError(f"since: expected an Hlc, its str or None, got {type(since).__name__}")
            since = _sync.Hlc.parse(since)
        with self._lock:
            self._check_open()
            records = self._all_records()
            tombs = dict(self._tombstones)
            tomb_hlc = self._tombstone_hlcs()
        ops = [_sync.op_from_record_dict(r.to_dict(), lenient=True) for r, _t in records]
        for mid, ch in tombs.items():
            ops.append(_sync.tombstone_op(mid, tomb_hlc.get(mid) or str(self._clock.now()), ch))
        if since is not None:
            ops = [op for op in ops if _sync.as_op(op).hlc > since]
        ops.sort(key=lambda op: (_sync.as_op(op).hlc, _sync.as_op(op).op_id))
        return ops

    def _tombstone_hlcs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if not os.path.exists(self._tomb_path):
            return out
        with open(self._tomb_path, "rb") as f:
            data = f.read()
        scan = scan_frames(data)
        for off, ln in zip(scan.offsets.tolist(), scan.lengths.tolist()):
            body = codec.decode_body(data[off + len(codec.TOMBSTONE_PREFIX) + 23: off + ln - 1],
                                     path=self._tomb_path, offset=off)
            out[body["msg_id"]] = body["hlc"]
        return out

    def merge_ops(self, ops: Iterable[Any]) -> int:
        """Store the messages and apply the tombstones of ``ops`` (from another
        store's ``export_ops``); returns how many messages were new."""
        if isinstance(ops, (str, bytes, Mapping)) or not isinstance(ops, Iterable):
            raise TypeError(f"ops: expected an iterable of ops, got {type(ops).__name__}")
        with self._lock:
            self._check_writable()
            records: list[ConversationMessageRecord] = []
            tomb_ids: list[str] = []
            tomb_hlc: dict[str, str] = {}
            tomb_ch: dict[str, str] = {}
            for raw in ops:
                op = _sync.as_op(raw)
                payload = op.payload
                self._observe(op.hlc)
                self._clock_unheld = True       # (an op refused or a duplicate: its stamp is stored nowhere)
                if payload.get("deleted") is True:     # (sync.is_tombstone: fold's rule, one test)
                    tomb_ids.append(op.op_id)
                    tomb_hlc[op.op_id] = str(op.hlc)
                    tomb_ch[op.op_id] = payload.get("conversation_id", "")
                    continue
                d = _sync.record_dict_from_op(op)
                if d is None:
                    continue
                try:
                    records.append(ConversationMessageRecord.from_dict(d))
                except (TypeError, ValueError, KeyError) as exc:
                    raise ValueError(f"op {op.op_id!r}: payload is not a storable message: {exc}") from None
            if tomb_ids:
                self._delete_ids(tomb_ids, record_unknown=True, hlcs=tomb_hlc, channels=tomb_ch)
        return self.append_many(records) if records else 0

    # ------------------------------------------------------------------
    # compaction
    # ------------------------------------------------------------------
    def compact(self) -> CompactionReport:
        """Fold the tail into the hot checkpoint, cool each channel's messages
        beyond its newest ``hot_window`` into a Parquet archive, and erase the
        bytes of deleted messages. Work is proportional to what moves."""
        return self._compact(full=True)

    def _erase_quarantined(self, ids: set[str]) -> None:
        """Unlink the quarantined torn lines of deleted messages: a line cut
        short by a crash names its message before its content, so a file
        holding a deleted id's record is the only one that can hold its
        content (SPEC: after the erasing compaction no file holds it)."""
        needles = [b'"msg_id":"' + codec.key(m) + b'"' for m in ids]
        removed = False
        for path, data in self._torn_lines():
            if any(n in data for n in needles):
                _unlink(path)
                removed = True
                log.info("erased quarantined line %s: it held a deleted message", path)
        if removed:
            fsync_dir(os.path.join(self.hot_dir, QUARANTINE_DIR))

    def _compact_segments(self, rep: CompactionReport, cool_erase: list[str],
                          old_segs: list[int]) -> list[int]:
        """Steps 3-4 of a compaction (lock held); returns the new segment order."""
        assert self._tail is not None       # a writer always has its tail
        # 3. segments: roll the tail if it holds deleted lines or grew large
        stats = self._index.seg_stats()
        if cool_erase or self._unlocated:
            self._find_cooled_lines(cool_erase + sorted(self._unlocated), stats)
        tail_live = stats.get(self._tail_seg, (0, 0))
        roll = (self._tail_seg in self._dirty_segs or self._tail.size >= ROLL_BYTES
                or (self._tail.size > 0 and tail_live[0] == 0)
                or self._sparse(self._tail.size, tail_live[1]))
        if roll:
            self._roll_tail()
            stats = self._index.seg_stats()
        # 4. rewrite sealed segments holding deleted lines or mostly dead (a run
        # of them in the segment order into one new segment, up to ROLL_BYTES
        # of live lines); drop empty ones
        new_order: list[int] = []
        run: list[tuple[int, np.ndarray]] = []
        run_bytes = 0
        run_seq: int | None = None     # the append sequence of the run's last line

        def end_run() -> None:
            nonlocal run, run_bytes
            if run:
                new_seg = self._rewrite_segments(run)
                rep.bytes_written += self._segs[new_seg].size
                rep.segments_rewritten += len(run)
                old_segs.extend(seg for seg, _locs in run)
                new_order.append(new_seg)
                run, run_bytes = [], 0

        for seg in self._seg_order:
            lines, live_bytes = stats.get(seg, (0, 0))
            size = self._segs[seg].size
            if lines == 0:
                old_segs.append(seg)
                rep.segments_reclaimed += 1
                continue
            if seg in self._dirty_segs or self._sparse(size, live_bytes):
                locs = self._index.seg_locs(seg)
                first = self._line_seq(int(locs[0]))
                if run and (run_bytes + live_bytes > ROLL_BYTES or run_seq is None
                            or first is None or first <= run_seq):
                    end_run()
                run.append((seg, locs))
                run_bytes += live_bytes
                run_seq = self._line_seq(int(locs[-1]))
            else:
                end_run()
                new_order.append(seg)
        end_run()
        if rep.segments_rewritten:
            fsync_dir(self.hot_dir)
        return new_order

    def _line_seq(self, loc: int) -> int | None:
        """The append sequence of the (checked) message line at ``loc``; None
        if it has none."""
        seq = _line_seq_of(self._index.line(loc))
        return seq if seq >= 0 else None

    def _fold_only(self) -> bool:
        """Whether an automatic compaction has nothing to move but the fold."""
        assert self._tail is not None       # a writer always has its tail
        return (not self._pending_erase and not self._segs_unchecked
                and self._tail.size < ROLL_BYTES and not self._cooling_due()
                and not self._cool.plan_merge())

    def _cooling_due(self) -> bool:
        """Whether some channel's excess over ``hot_window`` reaches a quarter
        window (any excess for a window under 64 messages, whose runs are
        small anyway): the automatic compaction's reason to cool."""
        due = 1 if self.hot_window < 64 else self.hot_window // 4
        return self._index.max_channel_len() - self.hot_window >= due

    def _merge_rows(self, groups: list[list[str]]) -> int:
        rows = self._cool.file_rows()
        return sum(rows.get(name, 0) for g in groups for name in g)

    def _excess(self, full: bool) -> list[int]:
        """Locations to cool: every channel's messages beyond its newest
        ``hot_window``. The automatic compaction (``full=False``) cools only
        once some channel's excess reaches a quarter window (windows of 64
        messages or more; smaller ones: any excess), and then cools
        every channel's excess: one larger Parquet run now and then instead
        of a small run (and its merges) every few ``compact_every``."""
        if not full and not self._cooling_due():
            return []
        excess = self._index.excess(self.hot_window).tolist()
        cands = list(self._cool_max) if self._behind is None else list(self._behind)
        behind: set[str] = set()
        if cands:
            counted = set(excess)
            for ch in cands:
                extra, still = self._excess_behind_cool(ch, counted)
                excess.extend(extra)
                if still:
                    behind.add(ch)
        self._behind = behind
        return excess

    def _excess_behind_cool(self, channel_id: str, counted: set[int]) -> tuple[list[int], bool]:
        """(hot locations beyond the channel's newest ``hot_window`` once its
        cool rows are counted too, whether a hot message sorts before its
        newest stamped cool row). Such a message arrived late (or unstamped)
        after newer ones were cooled; once a newer hot one is deleted it can
        lie beyond the window although ``HotIndex.excess``, which counts the
        hot ones only, keeps it. ``counted``: what that excess already cools."""
        last = self._cool_max.get(channel_id)
        locs = self._index.channel_locs(codec.key(channel_id), -1).tolist()
        if last is None or not locs:
            return [], False
        first = self._read_loc(locs[0])
        if not _sorts_before(first, last):
            return [], False            # every hot message sorts after every cool row
        kept = [loc for loc in locs if loc not in counted]
        if not kept:
            return [], True
        oldest = self._read_loc(kept[0])
        n = self.hot_window
        if not _sorts_before(oldest, last) or n == 0:
            return [], True             # only messages cooled anyway sort before a cool row
        rows = self._cool.channel_tail(channel_id, n + len(self._cool_deleted))
        cool = self._cool_rows(rows)[-n:]
        keyed = [(_order_key(r, _COOL_RANK, i), None) for i, r in enumerate(cool)]
        keyed += [(_order_key(self._read_loc(loc), _HOT_RANK, i), loc) for i, loc in enumerate(kept)]
        keyed.sort(key=_first)
        keep = {loc for _k, loc in keyed[len(keyed) - n:]}
        return [loc for loc in kept if loc not in keep], True

    def _compact(self, *, full: bool, start_bg: bool = True, settle: bool = True,
                 cool_excess: bool = True) -> CompactionReport:
        """A compaction (lock held; see _compact_now). A write, sync or
        rename that fails in it (a full disk, an I/O error) makes the store
        refuse writes until reopened, as a failed append does: its files may
        be half moved (a rolled tail, a cooled run) where only the manifest,
        which did not move, says what is stored, and the next open finishes
        or undoes them. DurabilityError names the file."""
        with self._lock:
            try:
                return self._compact_now(full=full, start_bg=start_bg, settle=settle,
                                         cool_excess=cool_excess)
            except DurabilityError as exc:
                self._fail(exc)
                raise
            except OSError as exc:
                self._fail(exc)
                raise DurabilityError(
                    f"compaction of {self.state_dir} failed writing {exc.filename or self.hot_dir}: "
                    f"{exc.strerror or exc}; every acknowledged message is on disk, and the store "
                    f"refuses writes until reopened") from exc

    def _compact_now(self, *, full: bool, start_bg: bool = True, settle: bool = True,
                     cool_excess: bool = True) -> CompactionReport:
        """A compaction (lock held). ``settle=False``: leave a background
        merge running (the caller checked that one runs and that nothing is
        to be erased): nothing is cooled or merged then, only the tail and
        the segments are seen to. ``cool_excess=False``: adopt what the
        background staged, but leave the excess to the caller."""
        with self._lock:
            self._check_writable()
            assert self._tail is not None and self._events is not None     # (a writer's)
            t0 = time.perf_counter()
            rep = CompactionReport()
            staged = self._settle_bg() if settle else None
            if staged is None and not full and self._fold_only():
                return self._fold(rep, t0)
            durable = self.durability != "none"
            if durable:
                self._sync_now()
            rep.folded = self._since_compact
            old_segs: list[int] = []
            old_cool: list[str] = []
            manifest_cool = list(self._manifest["cool_files"])
            # 1. cooling: first a run staged in the background, then the rest
            if staged is not None and staged.kind == "cool":
                manifest_cool = self._cool.adopt(staged.result)
                self._cooled(staged.locs, staged.table, staged=True)
                rep.cooled += staged.table.num_rows
                rep.cool_files_written += 1
            elif staged is not None:
                # a merge, adopted before any erasure rewrites its sources
                change = self._cool.adopt_merge(staged.result)
                manifest_cool = list(change.files)
                old_cool.extend(change.removed)
                rep.cool_files_written += len(change.added)
            excess = self._excess(full) if settle and cool_excess else []
            if excess:
                table = self._cool_table_at(excess)
                run = self._cool.cool_table(table)
                manifest_cool = list(run.files)
                self._cooled(excess, table)
                rep.cooled += table.num_rows
                rep.cool_files_written += 1
            # 2. erasure in the cool tier
            cool_erase = [m for m in self._pending_erase if m in self._cool_deleted]
            if cool_erase:
                change = self._cool.erase(cool_erase)
                manifest_cool = list(change.files)
                old_cool.extend(change.removed)
                rep.cool_files_written += len(change.added)
            groups = self._cool.plan_merge() if settle else []
            if groups and not full and start_bg and self._merge_rows(groups) >= BG_COOL_MIN_ROWS:
                # merged in the background; the next compaction adopts it
                # (meanwhile automatic compactions cool nothing: a small
                # merge runs here, so a small store's tiers never depend on
                # a thread's timing)
                self._bg = _Staged("merge", lambda _job: self._cool.stage_merge(groups, durable=durable))
                groups = []
            merged = bool(groups)
            while groups:
                change = self._cool.merge(groups)
                manifest_cool = list(change.files)
                old_cool.extend(change.removed)
                rep.cool_files_written += len(change.added)
                # a merge can fill the next tier: an explicit compact() leaves
                # nothing to merge (O(log n) rounds); an automatic one, one round
                groups = self._cool.plan_merge() if full else []
            if staged is not None or excess or cool_erase or merged:
                self._interleaved.clear()
            # 3-4. segments (only when live lines moved: cooling, deletion, a
            # fresh open, or a tail past ROLL_BYTES): roll the tail if it holds
            # deleted lines, grew large or is mostly dead; rewrite sealed
            # segments holding deleted lines or mostly dead; drop empty ones
            new_order: list[int] = list(self._seg_order)
            if (staged is not None or excess or self._pending_erase or self._segs_unchecked
                    or self._tail.size >= ROLL_BYTES):
                new_order = self._compact_segments(rep, cool_erase, old_segs)
                self._segs_unchecked = False
            if self._pending_erase:
                self._erase_quarantined(self._pending_erase)
            rep.erased = len(self._pending_erase)
            # 5. envelopes before the checkpoint that depends on them (the
            # size taken first: another writer of a shared event store may
            # append between the sync and a later look, unsynced)
            events_size = self._events.line_end()
            if durable:
                self._events.sync()
            self._seg_order = new_order
            self._covered = self._tail.size
            self._covered_events = events_size
            self._tomb_erased = self._tomb_size     # every pending erasure is done by now
            self._write_manifest(manifest_cool, durable=durable)
            # 6. now the old files are unreferenced: remove them
            for seg in old_segs:
                s = self._segs.pop(seg, None)
                self._index.detach(seg)
                if s is not None:
                    s.close()
                    _unlink(s.path)
                _unlink(os.path.join(self.hot_dir, filters_name(seg)))
                self._filters_kept.pop(seg, None)
            if old_cool:
                self._cool.unlink_files(old_cool)
                rep.cool_files_removed += len(old_cool)
            if (old_segs or old_cool) and durable:
                fsync_dir(self.hot_dir)
            self._dirty_segs.clear()
            self._pending_erase.clear()
            self._unlocated.clear()
            self._cool_deleted.clear()
            self._interleaved.clear()
            self._since_compact = 0
            if self._snapshot_due():
                self._write_snapshot()
                rep.snapshot_written = True
            self._bound_maps()          # the lines cooled or rewritten were read through the maps
            rep.seconds = time.perf_counter() - t0
            self._compactions += 1
            self._last_compaction = rep
            return rep

    def _fold(self, rep: CompactionReport, t0: float) -> CompactionReport:
        """Fold the tail into the hot tier in memory (lock held). The manifest
        records it at the next checkpoint that moves files (or at close); a
        crash meanwhile only relabels those lines "tail"."""
        assert self._tail is not None and self._events is not None     # (a writer's)
        rep.folded = self._since_compact
        self._covered = self._tail.size
        self._covered_events = self._events.line_end()
        self._since_compact = 0
        self._manifest_dirty = True
        self._compactions += 1
        rep.seconds = time.perf_counter() - t0
        self._last_compaction = rep
        return rep

    def _auto_compact(self) -> None:
        """The compaction that runs every ``compact_every`` messages (lock
        held). A large cooling run is staged in a background thread (Parquet
        encoding and its syncs run while appenders go on); the compaction after
        it finishes adopts it. Everything else runs here, as ``compact()``."""
        assert self._tail is not None       # a writer always has its tail
        t0 = time.perf_counter()
        job = self._bg
        if job is not None and not job.done.is_set():
            if job.kind == "merge" and not self._pending_erase and self._tail.size >= ROLL_BYTES:
                # a merge of cool files is being written: the tail still
                # rolls (segments stay bounded); the excess waits and is
                # cooled in one run when the merge is adopted
                self._compact(full=False, start_bg=False, settle=False)
            else:
                self._fold(CompactionReport(), t0)    # a cooling job's rows stay put meanwhile
            return
        if job is not None:
            # adopt the finished job; the excess grown meanwhile is staged
            # below when it is large enough, not cooled here (on the caller's time)
            self._compact(full=False, cool_excess=False)
            if self._bg is not None:            # it started a merge
                return
        if not self._pending_erase:
            # (also the first compaction of an open: its look at every segment
            # waits for the adoption, which runs it; cooling a large excess
            # inline there stalled an append 0.25 s at 1,000,000 messages)
            excess = self._excess(False)
            if len(excess) >= BG_COOL_MIN_ROWS:
                self._bg = self._stage_cooling(excess)
                if job is None:
                    self._fold(CompactionReport(), t0)
                return
        if job is None:
            self._compact(full=False)

    def _settle_bg(self) -> "_Staged | None":
        """Wait for the background job, if any (lock held; the job never takes
        the repository lock). Returns it if it can be adopted: a cooling run
        whose messages are all still indexed where they were read (a deletion
        since then discards it, and the compaction cools inline), or a merge."""
        job = self._bg
        if job is None:
            return None
        job.thread.join()
        self._bg = None
        if job.error is not None:
            log.warning("background %s failed, done inline instead: %s", job.kind, job.error)
            return None
        if job.result is None:
            return None
        if job.kind == "cool":
            ids = job.table.column("msg_id").to_pylist()
            found = self._index.find_many([codec.key(m) for m in ids])
            if not self._tombstones.keys().isdisjoint(ids) \
                    or not np.array_equal(found, np.asarray(job.locs, dtype=np.int64)):
                job.discard(self._cool)
                return None
        return job

    def _stage_cooling(self, locs: list[int]) -> _Staged:
        """Start the background cooling run of the hot lines at ``locs``
        (lock held). Only their copy is made here (each line checked); the
        thread makes their table, a few hundred lines at a time (the parser
        holds the GIL: an appender waits for a part, not the whole, which
        took 10 ms of an append at 1,000,000 messages), and writes it."""
        data, starts = self._gather(locs)
        durable = self.durability != "none"

        def work(job: _Staged) -> Any:
            job.table = self._lines_table(locs, data, starts, _PARSE_PART)
            return self._cool.stage_table(job.table, durable=durable)

        return _Staged("cool", work, locs)

    def _cool_table_at(self, locs: Sequence[int]) -> pa.Table:
        """The cool-schema table of the hot lines at ``locs`` (each checked
        against its checksum), row i from ``locs[i]``."""
        data, starts = self._gather(locs)
        return self._lines_table(locs, data, starts)

    def _gather(self, locs: Sequence[int]) -> tuple[bytes, np.ndarray]:
        """A copy of the hot lines at ``locs``, each checked (lock held):
        ``HotIndex.gather_lines``."""
        self._map_reads += len(locs)
        return self._index.gather_lines(locs)

    def _lines_table(self, locs: Sequence[int], data: bytes, starts: np.ndarray,
                     part: int | None = None) -> pa.Table:
        """The cool-schema table of the lines :meth:`_gather` copied from
        ``locs``, row i from line i, parsed ``part`` lines a call (all at
        once: None). A line the compiled reader does not take is decoded
        from the copied bytes; nothing here reads the index or its maps, so
        a background run may call it without the lock."""
        n = len(starts)

        def fallback(i: int, first: int = 0) -> tuple[dict, int | None]:
            # row i of the part that starts at line ``first``
            i += first
            end = int(starts[i + 1]) if i + 1 < n else len(data)
            loc = locs[i]
            d = codec.decode_body(memoryview(data)[int(starts[i]):end - 1],
                                  path=self._path_of(loc >> 40), offset=loc & ((1 << 40) - 1))
            return d["r"], d.get("s")

        if part is None or n <= part:
            return table_from_lines(data, starts, fallback)
        parts = []
        for a in range(0, n, part):
            b = min(n, a + part)
            lo, hi = int(starts[a]), int(starts[b]) if b < n else len(data)
            parts.append(table_from_lines(data[lo:hi], starts[a:b] - lo, functools.partial(fallback, first=a)))
        return pa.concat_tables(parts).combine_chunks()

    def _cooled(self, locs: Sequence[int], table: pa.Table, *, staged: bool = False) -> None:
        """Drop messages now served by the cool tier from the hot index.
        ``staged``: a run written in the background, which appends may have
        overtaken (a late one can sort before its rows; an inline run cools
        the oldest messages and those already behind a cool row)."""
        ids = table.column("msg_id").to_pylist()
        cool_max = self._cool_max
        behind = self._behind if staged else None
        stamped = table.filter(pc.not_equal(table.column("hlc"), ""))    # (order kept)
        if stamped.num_rows:
            for hlc, mid, ch in zip(stamped.column("hlc").to_pylist(), stamped.column("msg_id").to_pylist(),
                                    stamped.column("channel_id").to_pylist()):
                k = (hlc, mid)
                if k > cool_max.get(ch, ("", "")):
                    cool_max[ch] = k
                    if behind is not None:
                        behind.add(ch)      # a late append may sort before the new maximum
        self._index.remove_many([codec.key(m) for m in ids])
        pop = self._decoded.pop
        for loc in locs:
            pop(loc, None)
        self._snap_changes += len(ids)
        self._interleaved.clear()       # the verdicts read the cool rows' maxima just moved

    def _find_cooled_lines(self, ids: list[str], stats: dict) -> None:
        """Mark the segments that still hold the (dead) hot line of a message
        that was cooled and then deleted, so erasure rewrites them too. Only
        segments with dead bytes are scanned, each by a throwaway index."""
        assert self._tail is not None       # a writer always has its tail
        keys = [codec.key(m) for m in ids]
        files = [(seg, self._segs[seg].buf, self._segs[seg].path, self._segs[seg].size)
                 for seg in self._seg_order]
        files.append((self._tail_seg, self._tail.buf, self._tail.path, self._tail.size))
        for seg, buf, path, size in files:
            if seg in self._dirty_segs or size == 0 or stats.get(seg, (0, 0))[1] >= size:
                continue
            probe = HotIndex()
            probe.attach(seg, buf, path)
            probe.ingest(seg, 0, size)
            if (probe.find_many(keys) >= 0).any():
                self._dirty_segs.add(seg)
            probe.detach(seg)

    @staticmethod
    def _sparse(size: int, live_bytes: int) -> bool:
        return size > SPARSE_MIN_BYTES and live_bytes < SPARSE_FRACTION * size

    def _roll_tail(self) -> None:
        """Seal the tail as segment ``tail_seg`` and open an empty tail (lock held)."""
        assert self._tail is not None       # a writer always has its tail
        self._tail.sync()
        old = self._tail
        seg = self._tail_seg
        self._seg_ends[seg] = old.size
        old.release_reserved()
        old.close()
        sealed = os.path.join(self.hot_dir, seg_name(seg))
        os.replace(old.path, sealed)
        fsync_dir(self.hot_dir)
        self._segs[seg] = Segment(sealed, seg)
        self._seg_order.append(seg)
        self._index.attach(seg, self._segs[seg].buf, sealed)
        self._tail_seg = self._next_seg
        self._next_seg += 1
        self._tail = TailFile(os.path.join(self.hot_dir, TAIL_NAME), self._tail_seg)
        fsync_dir(self.hot_dir)
        with self._sync_cond:       # (the sealed lines were synced above)
            self._wmark = self._tail_seg << 40
            self._publish(self._wmark)
        # the decode cache is keyed by location; locations in the sealed file are unchanged

    def _rewrite_segments(self, run: list[tuple[int, np.ndarray]]) -> int:
        """Copy the live lines of a run of sealed segments (each with its
        sorted live locations; neighbours in the segment order, each one's
        append sequences after the one before's) into one new segment, in
        that order: the append sequence still rises line by line (lock held;
        the caller fsyncs the folder)."""
        locs = np.concatenate([seg_locs for _seg, seg_locs in run])
        data, starts = self._index.gather_lines(locs)
        new_seg = self._next_seg
        self._next_seg += 1
        path = os.path.join(self.hot_dir, seg_name(new_seg))
        write_file(path, data)
        self._seg_ends[new_seg] = len(data)
        self._segs[new_seg] = Segment(path, new_seg)
        self._index.attach(new_seg, self._segs[new_seg].buf, path)
        new_locs = starts | (new_seg << 40)
        self._index.relocate(locs, new_locs)
        self._decoded.move_many(locs, new_locs)
        return new_seg

    def _write_manifest(self, cool_files: list[str], *, durable: bool = True) -> None:
        self._sync_tombstones()      # the manifest vouches for them
        meta = self._cool.file_meta()
        m = {"format": _FORMAT, "segments": list(self._seg_order), "tail_seg": self._tail_seg,
             "segment_ends": {str(g): self._seg_ends[g] for g in self._seg_order if g in self._seg_ends},
             "covered": self._covered, "cool_files": list(cool_files),
             "cool_meta": {n: meta[n] for n in cool_files if n in meta},
             "events_offset": self._covered_events, "next_seg": self._next_seg,
             "next_seq": self._next_seq,
             "clock": self._clock_text(),
             "tombstones_erased": self._tomb_erased,
             "tombstones_synced": [self._tomb_size, self._tomb_last],
             "cool_max": {ch: list(k) for ch, k in self._cool_max.items()}}
        self._manifest_store.write(m, durable=durable)
        self._manifest = m
        self._manifest_dirty = False
        self._clock_unheld = False
        self._clock_nows = self._clock.nows

    def _clock_held(self) -> bool:
        """Whether the manifest's clock, with the stamps the next open reads
        (the tail's lines after the last compaction, the tombstones), puts
        that session's clock past every stamp this one returned or observed:
        true unless ``clock.now()`` returned a stamp or ``merge_ops`` observed
        one since the manifest was written (a stamp a caller may hold, or one
        no file keeps)."""
        return not self._clock_unheld and self._clock.nows == self._clock_nows

    def _clock_text(self) -> str:
        """The clock's last stamp as the manifest records it ("" before any)."""
        return str(self._clock.last) if self._clock.last is not None else ""

    def _snapshot_due(self) -> bool:
        return self._snap_changes >= max(4096, len(self._index) // 4)

    def _write_snapshot(self) -> None:
        """Save the index snapshot (lock held). The tail bytes it covers are
        synced first, so that it can vouch for them (see ``_snapshot_meta``)."""
        # always: tail bytes a killed "none" session left unsynced are not
        # counted in _wpos (an fdatasync with nothing to write is cheap)
        self._sync_now()
        assert self._tail is not None       # a writer always has its tail
        covered = {seg: self._segs[seg].file_size for seg in self._seg_order}
        covered[self._tail_seg] = self._tail.size
        covered[_TAIL_MARK] = self._tail_seg
        if self._events is not None:
            covered[_EVENTS_MARK] = self._events.line_end()
        size = self._tail.size
        buf = self._tail.buf
        covered[_SYNCED_MARK] = (buf.rfind(b"\n", 0, size - 1) + 1 if size > 1 and buf is not None else 0) + 1
        for f in self._manifest["cool_files"]:
            covered[-(_cool_no(f) + 1)] = 0
        self._index.save_snapshot(os.path.join(self.hot_dir, SNAPSHOT_NAME), covered)
        self._snap_changes = 0
        self._snap_files = self._snap_layout()

    def _snap_layout(self) -> tuple:
        """The files an index snapshot is written against: the sealed
        segments with their sizes, the tail's number and the cool files."""
        return (tuple((seg, self._segs[seg].file_size) for seg in self._seg_order), self._tail_seg,
                tuple(self._manifest["cool_files"]))

    def _snapshot_serves(self) -> bool:
        """Whether close() may leave the snapshot on disk as it is: it was
        written (or read at open) against the files as they are now, and at
        most SNAPSHOT_SLACK changes came after it (the next open reads those
        tail lines, as after a crash, and applies the tombstones as always)."""
        return (self._snap_changes <= SNAPSHOT_SLACK and self._snap_files is not None
                and self._snap_files == self._snap_layout())

    # ------------------------------------------------------------------
    # read-only viewers
    # ------------------------------------------------------------------
    def refresh(self) -> int:
        """Pick up what the writer made durable since open or the last refresh
        (read-only stores). Returns how many more messages it shows than
        before: ``len`` after minus ``len`` before (negative when the writer
        deleted more than it appended meanwhile; 0 on a writer)."""
        with self._lock:
            self._check_open()
            if not self.read_only:
                return 0
            before = len(self)
            m = self._manifest_store.read()
            if m != self._manifest:
                self._load_state()
            elif self._tail is not None:
                try:
                    start = self._tail.size
                    if self._tail.refresh_map():
                        self._reattach_tail()
                    rep = self._index.ingest(self._tail_seg, start, max(start, self._visible_end()),
                                             self._seq_floor(start))
                    self._check_ingest(rep, self._tail.path, sealed=False)
                    self._tail.size = rep.good_end
                    self._fold_order.clear()
                    self._interleaved.clear()
                    self._refresh_tombstones()
                except CorruptStateCheckpointError:
                    # the writer moved the manifest meanwhile (a file read here
                    # was replaced): read the new state whole; damage raises
                    if not self._stale_view():
                        raise
                    self._load_state()
            else:
                self._load_state()
            return len(self) - before

    def _refresh_tombstones(self) -> None:
        """Apply deletions the writer made since the tombstones were read."""
        try:
            size = os.path.getsize(self._tomb_path)
        except FileNotFoundError:
            return
        if size == self._tomb_size:
            return
        for mid, ch in self._load_tombstones().items():
            if mid in self._tombstones:
                continue
            self._tombstones[mid] = ch
            loc = self._index.remove(codec.key(mid))
            if loc >= 0:
                self._decoded.pop(loc, None)
            elif self._cool.contains(mid):
                self._cool_deleted.add(mid)

    # ------------------------------------------------------------------
    # integrity
    # ------------------------------------------------------------------
    def verify(self) -> VerifyReport:
        """A full check of every tier; raises nothing, reports every problem
        with its file and offset. A viewer whose writer replaced files during
        the check (a compaction moved the manifest) checks again from the
        new state, as its reads do, instead of reporting the files it missed."""
        report = self._verify_once()
        attempt = 0
        while self.read_only and not report.ok and attempt < _VIEWER_ATTEMPTS - 1:
            with self._lock:
                if self._closed or not self._stale_view():
                    break
                try:
                    self._load_state()
                except CorruptStateCheckpointError as exc:     # the new state is damaged
                    return VerifyReport(ok=False, problems=[Problem(exc.path or self.hot_dir, exc.offset,
                                                                    str(exc))], checked=report.checked)
            time.sleep(0.001 * min(attempt, 10))
            attempt += 1
            report = self._verify_once()
        with self._lock:
            if not self._closed:
                self._bound_maps()      # the check read every line through the maps
        return report

    def _verify_once(self) -> VerifyReport:
        problems: list[Problem] = []
        checked: dict[str, int] = {"lines": 0, "cool_rows": 0, "envelopes": 0, "records": 0}
        with self._lock:
            self._check_open()
            files = [(seg, self._segs[seg].path, self._segs[seg].buf, self._segs[seg].size)
                     for seg in self._seg_order]
            if self._tail is not None:
                files.append((self._tail_seg, self._tail.path, self._tail.buf, self._tail.size))
            fresh = HotIndex()
            for seg, path, buf, size in files:
                scan = scan_frames(buf if buf is not None else b"", 0, size)
                checked["lines"] += len(scan.offsets)
                if scan.damaged_offset >= 0:
                    problems.append(Problem(path, scan.damaged_offset, f"damaged line: {scan.damage}"))
                if scan.torn_offset >= 0:
                    problems.append(Problem(path, scan.torn_offset, "final line cut short"))
            try:
                for seg, path, buf, size in files:
                    fresh.attach(seg, buf)
                seq = -1
                for seg, path, buf, size in files:
                    rep = fresh.ingest(seg, 0, size, seq)
                    seq = rep.last_seq
                    if rep.damaged_offset >= 0 and rep.damage.startswith("append sequence"):
                        problems.append(Problem(path, rep.damaged_offset, f"damaged line: {rep.damage}"))
                    for loc in rep.dup_locs.tolist():
                        problems.append(Problem(path, loc & _OFF_MASK, _REPEATED))
            except RuneError as exc:
                problems.append(Problem(self.hot_dir, None, f"index rebuild failed: {exc}"))
            hashes: dict[str | None, str] = {}     # msg_id (as a record's .get gives it) -> payload hash
            gone = self._cool_deleted

            def sound(rec: dict) -> None:     # a cool record, for the envelope check below
                mid = rec.get("msg_id")
                if mid not in gone:
                    hashes[mid] = payload_hash(rec)
            with _noted(problems, self._cool.cool_dir, "cool archive check"):
                for p in self._cool.verify(checked, sound):
                    problems.append(Problem(self._cool.path_of(p.file), p.row, p.problem))
            # index snapshot against the tail
            snap_path = os.path.join(self.hot_dir, SNAPSHOT_NAME)
            if os.path.exists(snap_path):
                with _noted(problems, snap_path, "index snapshot check"):
                    try:
                        HotIndex.load_snapshot(snap_path, lazy_tasks=False)
                    except CorruptStateCheckpointError as exc:
                        problems.append(Problem(snap_path, getattr(exc, "offset", None), str(exc)))
            # live index against the files: every indexed line verifies and
            # decodes (from its bytes: not the decode cache's record)
            with _noted(problems, self.hot_dir, "index check"):
                for ch in list(self._index.channels()):
                    for loc in self._index.channel_locs(ch, -1).tolist():
                        try:
                            rec, _seq = self._decode_loc(loc)
                            hashes[rec.msg_id] = payload_hash(rec)
                        except CorruptStateCheckpointError as exc:
                            problems.append(Problem(self._path_of(loc >> 40), loc & ((1 << 40) - 1), str(exc)))
            checked["records"] = len(hashes)
            # envelopes against records
            if self._events is not None:
                try:
                    for ep in self._events.verify():
                        problems.append(Problem(ep["path"], ep["offset"], ep["problem"]))
                    journaled = set()
                    for env in self._events.iter_envelopes(0):
                        checked["envelopes"] += 1
                        if env.get("type") != "conversation.message":
                            continue
                        mid = env.get("id")
                        journaled.add(mid)
                        if mid in hashes and env.get("payload_hash") != hashes[mid]:
                            problems.append(Problem(self._events.path, env.get("offset"),
                                                    f"envelope of {mid} does not match its record"))
                    unjournaled = [mid for mid in hashes if mid not in journaled]
                    if unjournaled:
                        problems.append(Problem(
                            self._events.path, self._events.size,
                            f"{len(unjournaled)} stored message(s) have no envelope, e.g. "
                            f"{', '.join(map(repr, unjournaled[:3]))}"))
                except CorruptStateCheckpointError as exc:
                    if not any(p.file == self._events.path and p.offset == exc.offset for p in problems):
                        problems.append(Problem(self._events.path, exc.offset, str(exc)))
                except (OSError, RuneError) as exc:     # (a file gone or replaced by another kind)
                    problems.append(Problem(self._events.path, None, f"event store check failed: {exc!r}"))
        return VerifyReport(ok=not problems, problems=problems, checked=checked)

    # ------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------
    def stats(self) -> dict:
        """Counts, sizes and recovery notes of the store."""
        with self._lock:
            self._check_open()
            hot_bytes = sum(s.size for s in self._segs.values()) + (self._tail.size if self._tail else 0)
            return {
                "messages": len(self),
                "hot_and_tail": len(self._index),
                "cool": len(self._cool) - len(self._cool_deleted),
                "channels": len(self.channels()),
                "segments": len(self._seg_order),
                "tail_bytes": (self._tail.size - self._covered) if self._tail else 0,
                "hot_bytes": hot_bytes,
                "cool_files": len(self._manifest["cool_files"]),
                "cool_bytes": self._cool.stats()["bytes"],
                "tombstones": len(self._tombstones),
                "pending_erase": len(self._pending_erase),
                "index_bytes": self._index.nbytes,
                "compactions": self._compactions,
                "durability": self.durability,
                "read_only": self.read_only,
                "quarantined": list(self._quarantined) + [
                    dict(q) for q in (self._events.quarantined if self._events is not None else [])],
                "lost": list(self._lost),
                "rejournaled": self._rejournaled,
                "device_id": self._clock.device_id,
                "state_dir": self.state_dir,
            }

    def close(self) -> None:
        """Make everything durable, write the index snapshot (unless the one on
        disk still serves: ``SNAPSHOT_SLACK``), release the lock."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._bg is not None and self._sync_error is None:
                    self._compact(full=False, start_bg=False)   # adopt the staged work
                if not self.read_only and self._sync_error is None and self._tail is not None:
                    self._sync_now()
                    assert self._events is not None     # a writer always has its event store
                    self._events.sync()
                    if self._manifest_dirty or (self._clock_text() != self._manifest.get("clock", "")
                                                and not self._clock_held()):
                        # (the clock too: stamps it issued, stored or not, stay behind the next session's)
                        self._write_manifest(list(self._manifest["cool_files"]))
                    if self._snap_changes and not self._snapshot_serves():
                        try:
                            self._write_snapshot()
                        except OSError as exc:
                            # a cache: the next open reads the tail lines after the old one
                            log.warning("%s: index snapshot not written at close: %s", self.hot_dir, exc)
            except OSError as exc:
                raise DurabilityError(f"close of {self.state_dir} failed writing "
                                      f"{exc.filename or self.hot_dir}: {exc.strerror or exc}") from exc
            finally:
                self._closed = True
                self._release()

    def _release(self) -> None:
        job = getattr(self, "_bg", None)
        if job is not None:
            # a staged run nobody adopted (close failed): its file is a stray
            job.thread.join()
            self._bg = None
            try:
                job.discard(self._cool)
            except (OSError, ValueError) as exc:
                log.warning("cannot remove the files of an unadopted %s: %s", job.kind, exc)
        if hasattr(self, "_segs") and hasattr(self, "_tail"):
            # the maps live on while the index holds views of them (as long
            # as this object does): their pages need not stay resident
            self._release_maps()
        tail = getattr(self, "_tail", None)
        if tail is not None:
            tail.close()
        mark = getattr(self, "_mark", None)
        if mark is not None:
            mark.close()
        for s in getattr(self, "_segs", {}).values():
            s.close()
        cool = getattr(self, "_cool", None)
        if cool is not None:
            cool.close()
        try:
            if self._own_events and self._events is not None:
                self._events.close()
        finally:
            if self._lockfile is not None:
                self._lockfile.release()
                self._lockfile = None

    def __enter__(self) -> "ConversationStateRepository":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ConversationStateRepository({self.state_dir!r}, durability={self.durability!r})"


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
    exception (SPEC: verify raises nothing)."""
    try:
        yield
    except (OSError, RuneError) as exc:
        offset = exc.offset if isinstance(exc, CorruptStateCheckpointError) else None
        problems.append(Problem(getattr(exc, "path", None) or getattr(exc, "filename", None) or path,
                                offset, f"{what} failed: {exc!r}"))


def _cool_no(name: str) -> int:
    """The number n of a cool file ``cool-<n>.parquet``."""
    return int(name.split("-", 1)[1].split(".", 1)[0])


def _resident_file_bytes() -> int | None:
    """Resident file-backed (shared) bytes of this process, from
    /proc/self/statm; None where it cannot be read (not Linux)."""
    try:
        with open(_STATM, "rb") as f:
            return int(f.read().split()[2]) * mmap.PAGESIZE
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
