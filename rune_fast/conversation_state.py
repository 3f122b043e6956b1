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

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any, Iterable


from . import codec
from . import sync as _sync
from .sync.bridge import export_ops_of
from ._memory import collector_paused
from ._names import EVENTS_NAME, HOT_DIR
from .atomic import check_path
from .errors import (
    CorruptStateCheckpointError,
    DurabilityError,
    IllegalTaskTransitionError,
    ReadOnlyStoreError,
    RuneError,
    StateLockedError,
    StoreClosedError,
)
from .events import EventStore
from .locking import DirLock
from .records import ConversationMessageRecord
from .records import TaskStateRecord  # noqa: F401  (the records beside the repositories, as a frontend imports them)
from .tasks import TaskStateRepository
from ._conv.common import (COOL_DIR, DEVICE_NAME, DURABILITY_MODES, FOLDS_TO_ASCII, LEGACY_NAME,  # noqa: F401
                           MANIFEST_NAME, QUARANTINE_DIR, SNAPSHOT_NAME, TOMBSTONES_NAME, CompactionReport,
                           MessageRead, Problem, ReadStatus, SearchHit, VerifyReport, _str_arg, _WRITE_FAULTS,
                           own_calls)
from ._conv import tuning
from ._conv.compaction import Compaction
from ._conv.cooling import Cooling
from ._conv.exchange import Exchange
from ._conv.reads import HotReads
from ._conv.recovery import Recovery
from ._conv.search import Search
from ._conv.snapshot import IndexSnapshot
from ._conv.tombstones import Tombstones
from ._conv.verify import Verify
from ._conv.viewer import ReadOnlyViewer, viewer_of
from ._conv.writes import WritePath
from ._encode import OWN_CALLS_C
from ._index import repo_get_message, repo_get_setup, repo_window, repo_window_setup

repo_window_setup(own_calls, OWN_CALLS_C)     # (each window's records with read-only tool calls)
repo_get_setup(MessageRead, ReadStatus.FOUND_VERIFIED)

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

# the result types keep the module a caller imports them from
for _t in (ReadStatus, MessageRead, SearchHit, CompactionReport, Problem, VerifyReport):
    _t.__module__ = __name__

class ConversationStateRepository(Recovery, IndexSnapshot, Tombstones, HotReads, WritePath, Search, Compaction,
                                  Cooling, Exchange, Verify):
    """Durable, verified message history for one state directory.

    ``durability``: ``"fsync"`` (each write call durable on return),
    ``"batch"`` (group commit: concurrent appends share one sync, with no wait
    added; each call still durable on return: "fsync" groups concurrent
    appends the same way), ``"none"`` (left to the OS:
    survives a process crash, not a power loss). ``read_only=True`` opens beside
    a running writer without its lock and without changing any file.
    ``cache_bytes`` bounds what the caches of decoded data hold together --
    decoded records of both tiers and the cool tier's row groups -- so that
    resident memory after reads does not grow with the store; by default
    (None) it grows with the store, 1/16 of its bytes on disk between 4 and
    48 MiB (see docs/API.md and _conv/tuning.py).
    """

    def __init__(self, state_dir: str | os.PathLike, *, events: EventStore | str | os.PathLike | None = None,
                 compact_every: int = 64, hot_window: int = 512, durability: str = "fsync",
                 read_only: bool = False, cache_bytes: int | None = None) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability: {durability!r} is not one of {', '.join(DURABILITY_MODES)}")
        if isinstance(compact_every, bool) or not isinstance(compact_every, int) or compact_every < 1:
            raise ValueError(f"compact_every: must be a positive int, got {compact_every!r}")
        if isinstance(hot_window, bool) or not isinstance(hot_window, int) or hot_window < 0:
            raise ValueError(f"hot_window: must be a non-negative int, got {hot_window!r}")
        if cache_bytes is not None and (isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int)
                                        or cache_bytes < 0):
            raise ValueError(f"cache_bytes: must be a non-negative int or None, got {cache_bytes!r}")
        if not isinstance(read_only, bool):
            # ("false" would open a viewer: bool() of any non-empty str is True)
            raise TypeError(f"read_only: expected bool, got {type(read_only).__name__}")
        if read_only and not isinstance(self, ReadOnlyViewer):
            # a viewer is an instance of the viewer type of this class (_conv/viewer.py)
            self.__class__ = viewer_of(type(self))
        check_path("state_dir", state_dir)
        if events is not None and not isinstance(events, EventStore):
            check_path("events", events)
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        self.hot_dir = os.path.join(self.state_dir, HOT_DIR)
        self.durability = durability
        self.compact_every = compact_every
        self.hot_window = hot_window
        # None: the default, which grows with the store (HotReads._scale_caches)
        self.cache_bytes = cache_bytes
        self.read_only = bool(read_only)
        self._lock = threading.RLock()
        self._closed = False
        self._lockfile: DirLock | None = None
        self._own_events = False
        self._events: EventStore | None = None
        # the event store is this store's own file (state_dir/events.jsonl):
        # only then is a message envelope in it one of this store's appends
        self._events_private = events is None
        self._events_path: str | None = None    # a viewer's: the event store its verify() reads
        # each room's first state, set by the room that owns it (_conv/host.py)
        self._init_reads_state()
        self._init_recovery_state()
        self._init_snapshot_state()
        self._init_schedule()
        self._init_search_state()
        self._init_exchange_state()
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
        # a writer's idle watcher: merges and adoptions of the background
        # work when no change comes (tuning.IDLE_MERGE_SECONDS)
        self._watch_idle()

    # ------------------------------------------------------------------
    # helpers
    # ------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"conversation repository {self.state_dir} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        error = self._writes.error
        if error is not None:
            raise DurabilityError(f"conversation repository {self.state_dir} refuses writes after a "
                                  f"failed write or sync ({error}); reopen it") from error

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
        # encoded outside the lock (compiled: csrc/_encode.pyx); a large
        # batch's payload hashes are computed by a C thread meanwhile
        bodies, hashing, keys = codec.encode_batch(msgs, hash_job=len(msgs) >= tuning.SYNC_OVERLAP_MIN)
        failed: BaseException | None = None
        compacted = False
        with self._lock:
            self._check_writable()
            target, added, sync, journal = self._write_messages(msgs, bodies, hashing, keys)
            if sync is not None and added and self._since_compact >= self.compact_every:
                # the automatic compaction runs while the batch's sync is in
                # flight: what needs no sync (the fold, a cooling run's next
                # part, the start of the next run: most of them) overlaps
                # the disk's work; one that syncs ends the batch's sync
                # first (WriteThread.sync_now), so the manifest it writes
                # vouches only for durable lines
                compacted = True
                try:
                    self._auto_compact()
                except BaseException as exc:
                    failed = exc        # (raised once the sync and the journal are ended)
        if sync is not None:
            try:
                # started after the write (see _write_messages); nothing to
                # do if the compaction ended it
                self._writes.sync_end(sync)
            except BaseException:
                self._journal_given_up(journal, added)
                raise
        if journal is not None:
            if failed is not None:
                self._journal_given_up(journal, added)
            else:
                self._journal_end(journal, added)   # (begun after the tail's write, see there)
        if failed is not None:
            raise failed
        if added:
            self._writes.wait_durable(target)
            if not compacted and self._since_compact >= self.compact_every:
                with self._lock:
                    if self._since_compact >= self.compact_every and not self._closed:
                        self._auto_compact()
        return added

    def flush(self) -> None:
        """Make everything written so far durable (whatever the mode)."""
        with self._lock:
            self._check_open()
            self._writes.sync_now()
            self._sync_tombstones()
            assert self._events is not None     # a writer always has its event store
            self._events.sync()

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
            # (every message's id; their order does not matter)
            ids = [r.msg_id for r, _t in self._hot_channel(channel_id)]
            if self._cool_has_channel(channel_id):
                ids += self._cool_channel_ids(channel_id)
            return self._delete_ids(ids, record_unknown=False, stored_in=channel_id)

    # ------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------
    # get_message(msg_id) -> MessageRead: exact read across tiers, verified
    # against the stored checksum or digest. Compiled (_index.repo_get_message):
    # an archived record an exact read kept, in one call with the locks held;
    # anything else here
    get_message = repo_get_message

    def _get_message_general(self, msg_id: str) -> MessageRead:
        """get_message() past its compiled common case."""
        if type(msg_id) is not str or not msg_id.isascii():     # (the common case checked inline)
            _str_arg("msg_id", msg_id)
        with self._lock:
            if self._closed:
                self._check_open()
            return self._get_message(msg_id)

    # window(channel_id, n=8): the last ``n`` messages of the channel, oldest
    # first ([] for n <= 0 or an unknown channel). Compiled
    # (_index.repo_window): the common window (hot, cached, not interleaved
    # with the cool tier) in one call, the lock held; anything else here
    window = repo_window

    def _window_general(self, channel_id: str, n: int) -> list[ConversationMessageRecord]:
        """window() past its compiled common case: the arguments checked,
        then every tier read under the lock."""
        _str_arg("channel_id", channel_id)
        if type(n) is not int and (not isinstance(n, int) or isinstance(n, bool)):
            raise TypeError(f"n: expected int, got {type(n).__name__}")
        with self._lock:
            self._check_open()
            return self._last_n(channel_id, n)

    def messages_for_task(self, task_id: str) -> list[ConversationMessageRecord]:
        """Every message of the task, all tiers, oldest first."""
        _str_arg("task_id", task_id)
        with self._lock:
            self._check_open()
            return self._messages_for_task(task_id)

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
            return self._search(text, channel_id, limit=limit, case_sensitive=case_sensitive)

    def latest_task(self, channel_id: str) -> str | None:
        """task_id of the newest message on the channel that has one, or None."""
        _str_arg("channel_id", channel_id)
        with self._lock:
            self._check_open()
            return self._latest_task(channel_id)

    def channels(self) -> list[str]:
        """Every channel that holds at least one message, sorted."""
        with self._lock:
            self._check_open()
            return self._channels()

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

    def export_ops(self, since: "_sync.Hlc | str | None" = None) -> list:
        """Every stored message (all tiers) and every tombstone as ops, by
        ``(hlc, op_id)``; with ``since`` (exclusive) only those stamped after it."""
        if since is not None and not isinstance(since, _sync.Hlc):
            if not isinstance(since, str):
                raise TypeError(f"since: expected an Hlc, its str or None, got {type(since).__name__}")
            since = _sync.Hlc.parse(since)
        with collector_paused():      # (millions of new containers, no cycle: see _memory)
            records, tomb_ops = self._export_all(since)
            # (consume: the list emptied, the records freed as their ops are made)
            return export_ops_of(records, tomb_ops, since, consume=True)

    def merge_ops(self, ops: Iterable[Any]) -> int:
        """Store the messages and apply the tombstones of ``ops`` (from another
        store's ``export_ops``); returns how many messages were new."""
        if isinstance(ops, (str, bytes, Mapping)) or not isinstance(ops, Iterable):
            raise TypeError(f"ops: expected an iterable of ops, got {type(ops).__name__}")
        return self._merge_ops(ops)

    # ------------------------------------------------------------------
    # compaction
    # ------------------------------------------------------------------
    def compact(self) -> CompactionReport:
        """Fold the tail into the hot checkpoint, cool each channel's messages
        beyond its newest ``hot_window`` into a Parquet archive, and erase the
        bytes of deleted messages. Work is proportional to what moves."""
        return self._compact(full=True)

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
            return 0        # (a viewer's type does it: _conv/viewer.py)

    # ------------------------------------------------------------------
    # integrity
    # ------------------------------------------------------------------
    def verify(self) -> VerifyReport:
        """A full check of every tier; raises nothing, reports every problem
        with its file and offset. A viewer whose writer replaced files during
        the check (a compaction moved the manifest) checks again from the
        new state, as its reads do, instead of reporting the files it missed."""
        return self._verify()

    # ------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------
    def stats(self) -> dict:
        """Counts, sizes and recovery notes of the store."""
        with self._lock:
            self._check_open()
            hot_bytes = sum(s.size for s in self._segs.values()) + (self._tail.size if self._tail else 0)
            cool = self._cool.stats()
            return {
                "messages": len(self),
                "hot_and_tail": len(self._index),
                "cool": len(self._cool) - len(self._cool_deleted),
                "channels": len(self.channels()),
                "segments": len(self._seg_order),
                "tail_bytes": (self._tail.size - self._covered) if self._tail else 0,
                "hot_bytes": hot_bytes,
                "cool_files": len(self._manifest["cool_files"]),
                "cool_bytes": cool["bytes"],
                "cool_index_bytes": cool["index_bytes"] + cool["filter_bytes"],
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
        self._stop_idle()
        with self._lock:
            if self._closed:
                return
            try:
                self._join_chore()      # (file work of the last compaction: its snapshot first)
                merge = self._bg_merge
                if merge is not None and not merge.done.is_set():
                    # a merge still being written is given up, not waited for
                    # (at 1,000,000 messages one takes tens of seconds); the
                    # files stay as they are and the next session merges them
                    merge.cancel.set()
                if (self._bg is not None or merge is not None) and self._writes.error is None:
                    self._compact(full=False, start_bg=False)   # adopt the staged work
                if not self.read_only and self._writes.error is None and self._tail is not None:
                    self._writes.sync_now()
                    assert self._events is not None     # a writer always has its event store
                    self._events.sync()
                    if self._manifest_dirty or (self._clock_text() != self._manifest.get("clock", "")
                                                and not self._clock_held()):
                        # (the clock too: stamps it issued, stored or not, stay behind the next session's)
                        self._write_manifest(list(self._manifest["cool_files"]))
                    # (a merge adopted here, after the last snapshot, moved
                    # rows to a new file: the next open would read its ids)
                    moved = self._snap_files is not None and self._snap_files != self._snap_layout()
                    if (self._snap_changes or moved) and not self._snapshot_serves():
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

    def _acquire(self, events: EventStore | str | os.PathLike | None) -> None:
        """The lock of a writer and the event store (the open's first step)."""
        if not self.read_only:
            self._lockfile = DirLock(self.state_dir, "conversation")
        if isinstance(events, EventStore):
            self._events = events
        else:
            path = os.fspath(events) if events is not None else os.path.join(self.state_dir, EVENTS_NAME)
            if not self.read_only:
                self._events = EventStore(path)
                self._own_events = True
            else:
                self._events_path = path

    def _release(self) -> None:
        if getattr(self, "_chore", None) is not None:
            self._join_chore()
        for job in (getattr(self, "_bg", None), getattr(self, "_bg_merge", None)):
            if job is None:
                continue
            # a staged run nobody adopted (close failed): its file is a stray
            job.stop_feeding()          # (a cooling run still waiting for lines ends)
            job.thread.join()
            self._drop_staged(job)
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
        writes = getattr(self, "_writes", None)
        if writes is not None:
            writes.close()
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
