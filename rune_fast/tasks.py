"""The task ledger: :class:`TaskStateRepository`.

On disk, under ``state_dir``:

- ``hot/task_log-<gen>.jsonl``: every change since the last checkpoint, one
  framed line each, ``{"x":...,"n":<seq>,"op":"created|amended|transition|imported","r":{record},"e":{...}}``
  holding the whole record after the change and where its envelope was
  written (``e``: event store path, offset, extra fields).
- ``hot/task_state.json``: the checkpoint (an :class:`~rune_fast.atomic.AtomicStore`),
  the fold of every change up to sequence number ``seq``, naming the log
  generation ``gen`` that holds the changes after it.
- ``events.jsonl`` (or the shared event store): one ``task_state.*`` envelope
  per change.

A change appends its envelope, then its log line, then syncs the log: one
fsync, durable on return. The envelope is durable too after any process crash
(it was written first); if a power loss drops it while the log line survives,
opening finds it missing at its recorded offset and re-journals it. Every
``max(checkpoint_every, tasks // 4)`` changes (and on close) the event store is
synced and the fold is written to a new checkpoint that points at a fresh, empty log
generation; the old log is deleted. Opening reads the checkpoint and replays
its log.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from typing import Any

from .atomic import AtomicStore, check_path
from .codec import MAX_RECORD_BYTES
from .errors import (
    CorruptStateCheckpointError,
    IllegalTaskTransitionError,
    RecordTooLargeError,
    StoreClosedError,
    UnknownTaskError,
)
from .events import EventStore, ensure_private_dir, fsync_dir
from .framed_log import FramedLog, frame_object, parse_checked
from ._names import EVENTS_NAME, HOT_DIR, TASK_LOG_RE, TASK_STATE_NAME, task_log_name
from .locking import DirLock
from .records import (
    TASK_STATUSES,
    TASK_TRANSITIONS,
    TERMINAL_STATUSES,
    TaskStateRecord,
    payload_hash,
    record_canonical_json,
)

__all__ = ["TaskStateRepository"]

log = logging.getLogger("rune_fast.tasks")

_LOG_RE = TASK_LOG_RE
_OPS = ("created", "amended", "transition", "imported")
_CHECKPOINT_FORMAT = 1
#: A checkpoint rewrites every task, so the log grows to at least
#: 1/_LOG_SHARE of the ledger's tasks before one (never fewer changes than
#: ``checkpoint_every``): a change's share of the rewrites stays the same
#: whatever the ledger's size. Every 64 changes, a create cost ~85 us more
#: for each 1,000 tasks (2.6 ms at 30,000: the 7.8 MB checkpoint written
#: every 64 creates); the open replays at most that share of the tasks.
_LOG_SHARE = 4


class TaskStateRepository:
    """The canonical task ledger of one state directory.

    ``events``: an :class:`EventStore` to share (not closed by :meth:`close`),
    a path for an events file this repository opens and owns, or ``None`` for
    ``state_dir/events.jsonl``. ``checkpoint_every``: the fewest changes
    between checkpoint rewrites (see _LOG_SHARE: the log replayed on open
    is at most the larger of that and a quarter of the tasks).

    Holds the ``"task"`` :class:`DirLock` of ``state_dir`` while open: a second
    writer, in any process, gets :class:`StateLockedError`. Every public method
    is thread-safe (one re-entrant lock); every change is durable when it
    returns; calls after :meth:`close` raise :class:`StoreClosedError`.
    Opening raises :class:`CorruptStateCheckpointError` (file, offset) for a
    damaged checkpoint or log line, and recovers a torn final log line by
    quarantining it with a warning (it was never acknowledged).
    """

    def __init__(self, state_dir: str | os.PathLike[str], *,
                 events: EventStore | str | os.PathLike[str] | None = None,
                 checkpoint_every: int = 64) -> None:
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be an int >= 1, got {checkpoint_every!r}")
        check_path("state_dir", state_dir)
        if events is not None and not isinstance(events, EventStore):
            check_path("events", events)
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        self.checkpoint_every = checkpoint_every
        self._lock = threading.RLock()
        self._closed = True
        self._dirlock: DirLock | None = None
        self._events: EventStore | None = None
        self._own_events = False
        self._log: FramedLog | None = None
        ensure_private_dir(self.state_dir)
        self._hot = os.path.join(self.state_dir, HOT_DIR)
        self._dirlock = DirLock(self.state_dir, "task")
        try:
            ensure_private_dir(self._hot)
            if isinstance(events, EventStore):
                self._events = events
            else:
                path = os.path.join(self.state_dir, EVENTS_NAME) if events is None else os.fspath(events)
                self._events = EventStore(path)
                self._own_events = True
            self._checkpoint = AtomicStore(os.path.join(self._hot, TASK_STATE_NAME))
            self._tasks: dict[str, TaskStateRecord] = {}   # insertion = creation order
            self._touched: dict[str, int] = {}             # seq of last create/amend/import
            self._by_channel: dict[str, list[str]] = {}    # task ids, creation order
            self._seq = 0
            self._since_checkpoint = 0
            self.rejournaled = 0  # envelopes re-appended on open (after a power loss)
            self._load()
        except BaseException:
            self._release()
            raise
        self._closed = False

    # ------------------------------------------------------------ loading

    def _log_path(self, gen: int) -> str:
        return os.path.join(self._hot, task_log_name(gen))

    def _load(self) -> None:
        cp = self._checkpoint.read()
        logs = {}
        temp_prefix = "." + os.path.basename(self._checkpoint.path) + "."
        for name in os.listdir(self._hot):
            m = _LOG_RE.fullmatch(name)
            if m:
                logs[int(m.group(1))] = os.path.join(self._hot, name)
            elif name.startswith(temp_prefix) and name.endswith(".tmp"):
                # a checkpoint write cut short by a crash; we hold the lock, so no one else is writing it
                os.unlink(os.path.join(self._hot, name))
        if cp is None:
            # No checkpoint yet: generation 0. An empty later log is the first
            # checkpoint's new log whose checkpoint a crash kept from being
            # written (removed below); a non-empty one is damage (raised below).
            # The log of generation 0 goes only once a checkpoint is written:
            # without it, a later log means the checkpoint was lost.
            gen = 0
            later = sorted(g for g in logs if g > 0)
            if later and 0 not in logs:
                raise CorruptStateCheckpointError(
                    f"the task checkpoint is missing, but task log generation {later[-1]} shows "
                    f"one was written: its tasks would be lost", path=self._checkpoint.path)
        else:
            gen = self._apply_checkpoint(cp)
            if gen not in logs:
                raise CorruptStateCheckpointError(
                    f"task log generation {gen} named by the checkpoint is missing",
                    path=self._log_path(gen))
        for g, path in logs.items():
            if g < gen:  # superseded by the checkpoint; a crash kept it
                os.unlink(path)
            elif g > gen:  # made before a checkpoint write that did not happen
                if os.path.getsize(path) != 0:
                    raise CorruptStateCheckpointError(
                        f"task log generation {g} is newer than the checkpoint's ({gen}) and not empty",
                        path=path, offset=0)
                os.unlink(path)
        self._gen = gen
        self._log = FramedLog(self._log_path(gen))
        if cp is None and not logs:
            # A new ledger records generation 0 at once (its log first, so a
            # crash between the two leaves the layout of a ledger without a
            # checkpoint yet): from then on a lost log is refused above
            # instead of reading as an empty ledger.
            self._checkpoint.write({"format": _CHECKPOINT_FORMAT, "gen": 0, "seq": 0, "tasks": []})
        entries = []
        for offset, line in self._log.iter_lines(0):
            entry = parse_checked(line, path=self._log.path, offset=offset)     # (iter_lines checked it)
            self._replay(entry, self._log.path, offset)
            entries.append(entry)
            self._since_checkpoint += 1
        self._rejournal_missing(entries)

    def _rejournal_missing(self, entries: list[dict[str, Any]]) -> None:
        """Re-append the envelope of every logged change whose envelope did
        not reach the event store (possible only after a power loss: a change
        is acknowledged after one fsync, of the task log)."""
        assert self._events is not None
        readers: dict[Any, EventStore | None] = {}     # keyed by whatever the entry says ("in")
        missing = []
        try:
            for entry in entries:
                ref = entry.get("e")
                if not isinstance(ref, dict):
                    continue  # written before envelopes were referenced: synced with the change
                record = entry["r"]
                etype = f"task_state.{entry['op']}"
                expected = (etype, record["task_id"], payload_hash(TaskStateRecord.from_dict(record)))
                where = ref.get("in")
                if where == self._events.path:
                    store: EventStore | None = self._events
                else:
                    if where not in readers:
                        readers[where] = (EventStore(where, read_only=True)
                                          if isinstance(where, str) and os.path.isfile(where) else None)
                    store = readers[where]
                # a complete line there that fails its check is damage, not
                # an envelope a power loss took (SPEC: damage is loud)
                env = store.envelope_at(ref.get("at", -1), loud=True) if store is not None else None
                if env is None or (env.get("type"), env.get("id"), env.get("payload_hash")) != expected:
                    missing.append((expected, ref.get("extra") or {}))
        finally:
            for reader in readers.values():
                if reader is not None:
                    reader.close()
        for (etype, task_id, digest), extra in missing:
            self._events.append(etype, task_id, digest, **extra)
        if missing:
            self._events.sync()
            self.rejournaled = len(missing)
            log.warning("task ledger %s: re-journaled %d envelope(s) missing from %s",
                        self.state_dir, len(missing), self._events.path)

    def _apply_checkpoint(self, cp: Any) -> int:
        path = self._checkpoint.path
        try:
            if cp.get("format") != _CHECKPOINT_FORMAT:
                raise CorruptStateCheckpointError(f"unknown task checkpoint format {cp.get('format')!r}", path=path)
            gen = cp["gen"]
            seq = cp["seq"]
            if not isinstance(gen, int) or not isinstance(seq, int) or gen < 0 or seq < 0:
                raise CorruptStateCheckpointError("task checkpoint gen/seq are not non-negative ints", path=path)
            for item in cp["tasks"]:
                record = TaskStateRecord.from_dict(item["r"])
                if record.task_id in self._tasks:
                    raise CorruptStateCheckpointError(
                        f"task checkpoint holds task {record.task_id} twice", path=path)
                touched = item["t"]
                if not isinstance(touched, int):
                    raise CorruptStateCheckpointError(
                        f"task {record.task_id}: recency {touched!r} is not an int", path=path)
                self._put(record, touched)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptStateCheckpointError(f"task checkpoint has a bad structure: {exc!r}", path=path) from None
        self._seq = seq
        return gen

    def _replay(self, entry: dict[str, Any], path: str, offset: int) -> None:
        try:
            n = entry["n"]
            op = entry["op"]
            record = TaskStateRecord.from_dict(entry["r"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStateCheckpointError(f"task log entry does not parse: {exc!r}", path=path, offset=offset) from None
        if n != self._seq + 1:
            raise CorruptStateCheckpointError(
                f"task log sequence gap: expected {self._seq + 1}, found {n!r}", path=path, offset=offset)
        known = record.task_id in self._tasks
        if op in ("created", "imported"):
            if known:
                raise CorruptStateCheckpointError(
                    f"task log {op} entry for existing task {record.task_id}", path=path, offset=offset)
            self._put(record, n)
        elif op in ("amended", "transition"):
            if not known:
                raise CorruptStateCheckpointError(
                    f"task log {op} entry for unknown task {record.task_id}", path=path, offset=offset)
            self._tasks[record.task_id] = record
            if op == "amended":
                self._touched[record.task_id] = n
        else:
            raise CorruptStateCheckpointError(f"task log entry has unknown op {op!r}", path=path, offset=offset)
        self._seq = n

    def _put(self, record: TaskStateRecord, touched: int) -> None:
        self._tasks[record.task_id] = record
        self._touched[record.task_id] = touched
        self._by_channel.setdefault(record.channel_id, []).append(record.task_id)

    # ------------------------------------------------------------ writing

    def _commit(self, op: str, record: TaskStateRecord, **extra: Any) -> None:
        """Journal one change (envelope + log line), make both durable, then
        apply it in memory; checkpoint when due. A record whose JSON exceeds
        MAX_RECORD_BYTES raises RecordTooLargeError before anything is written."""
        assert self._log is not None and self._events is not None
        canon = record_canonical_json(record)
        if len(canon) > MAX_RECORD_BYTES:
            raise RecordTooLargeError(
                f"task {record.task_id}: the record's JSON is {len(canon)} bytes, over the "
                f"{MAX_RECORD_BYTES}-byte limit (title: {len(record.title)} characters)")
        n = self._seq + 1
        extra = {"task_id": record.task_id, "channel_id": record.channel_id, "status": record.status, **extra}
        at = self._events.append(f"task_state.{op}", record.task_id, hashlib.sha256(canon).hexdigest(), **extra)
        line = frame_object({"n": n, "op": op, "r": record.to_dict(),
                             "e": {"in": self._events.path, "at": at, "extra": extra}})
        self._log.append_bytes(line)
        # One fsync per change. The envelope was written first; should a power
        # loss drop it while the log line survives, open re-journals it (see
        # _rejournal_missing), and the event store is synced before any
        # checkpoint folds the log away.
        self._log.sync()
        self._seq = n
        if op in ("created", "imported"):
            self._put(record, n)
        else:
            self._tasks[record.task_id] = record
            if op == "amended":
                self._touched[record.task_id] = n
        self._since_checkpoint += 1
        if self._since_checkpoint >= max(self.checkpoint_every, len(self._tasks) // _LOG_SHARE):
            self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        """Fold the ledger into a new checkpoint naming a fresh empty log."""
        assert self._log is not None
        assert self._events is not None
        self._events.sync()  # envelopes reach disk before the checkpoint that drops the log
        new_gen = self._gen + 1
        new_path = self._log_path(new_gen)
        new_log = FramedLog(new_path)  # created empty and fsynced with its folder
        try:
            self._checkpoint.write({
                "format": _CHECKPOINT_FORMAT,
                "gen": new_gen,
                "seq": self._seq,
                "tasks": [{"r": r.to_dict(), "t": self._touched[tid]} for tid, r in self._tasks.items()],
            })
        except BaseException:
            new_log.close()
            raise
        old = self._log
        self._log, self._gen = new_log, new_gen
        self._since_checkpoint = 0
        old.close()
        os.unlink(old.path)
        fsync_dir(self._hot)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"TaskStateRepository on {self.state_dir} is closed")

    def _require(self, task_id: str) -> TaskStateRecord:
        record = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if record is None:
            raise UnknownTaskError(f"unknown task_id {task_id!r} in {self.state_dir}")
        return record

    def _next_updated_at(self, record: TaskStateRecord) -> float:
        # Strictly after the previous value even if the clock stalls or steps
        # back (the largest float, which nothing is after, stays as it is).
        after = math.nextafter(record.updated_at, math.inf)
        return max(time.time(), record.updated_at if after == math.inf else after)

    def create(self, title: str, channel_id: str, model: str | None = None,
               parent_task_id: str | None = None) -> TaskStateRecord:
        """Create a task (status ``created``) on ``channel_id`` and return it;
        it becomes the channel's active task. ``TypeError``/``ValueError``
        naming the field for a bad argument (nothing is written then).
        Durable on return; journaled as ``task_state.created``."""
        record = TaskStateRecord(
            title=title,
            channel_id=channel_id,
            assigned_model="" if model is None else model,
            parent_task_id="" if parent_task_id is None else parent_task_id,
        )
        with self._lock:
            self._check_open()
            self._commit("created", record)
            return record

    def amend(self, task_id: str, title: str) -> TaskStateRecord:
        """Give an open task a new title (same ``task_id``, ``updated_at``
        bumped) and make it the channel's most recent task. ``KeyError``
        (:class:`UnknownTaskError`) for an unknown id,
        :class:`IllegalTaskTransitionError` for a terminal task (nothing changes
        then). Durable on return; journaled as ``task_state.amended``."""
        with self._lock:
            self._check_open()
            current = self._require(task_id)
            if current.status in TERMINAL_STATUSES:
                raise IllegalTaskTransitionError(
                    f"task {task_id}: cannot amend a task in terminal status {current.status!r}")
            record = TaskStateRecord(
                task_id=current.task_id, title=title, status=current.status,
                channel_id=current.channel_id, parent_task_id=current.parent_task_id,
                assigned_model=current.assigned_model, created_at=current.created_at,
                updated_at=self._next_updated_at(current), outcome_ref=current.outcome_ref)
            self._commit("amended", record)
            return record

    def transition(self, task_id: str, new_status: str, outcome_ref: str = "") -> TaskStateRecord:
        """Move a task along one edge of ``TASK_TRANSITIONS`` and return the new
        record (``updated_at`` bumped; ``outcome_ref`` replaced when non-empty).
        ``KeyError`` (:class:`UnknownTaskError`) for an unknown id;
        :class:`IllegalTaskTransitionError` for any other move, including an
        unknown status (nothing changes, no envelope). Durable on return;
        journaled as ``task_state.transition``."""
        with self._lock:
            self._check_open()
            current = self._require(task_id)
            if not isinstance(outcome_ref, str):
                raise TypeError(f"task {task_id}: outcome_ref must be str, got {type(outcome_ref).__name__}")
            allowed = TASK_TRANSITIONS[current.status]
            if not isinstance(new_status, str) or new_status not in allowed:
                if not isinstance(new_status, str) or new_status not in TASK_STATUSES:
                    raise IllegalTaskTransitionError(
                        f"task {task_id}: unknown status {new_status!r} (one of {', '.join(TASK_STATUSES)})")
                raise IllegalTaskTransitionError(
                    f"task {task_id}: illegal transition {current.status!r} -> {new_status!r} "
                    f"(allowed: {', '.join(sorted(allowed)) or 'none, the status is terminal'})")
            record = TaskStateRecord(
                task_id=current.task_id, title=current.title, status=new_status,
                channel_id=current.channel_id, parent_task_id=current.parent_task_id,
                assigned_model=current.assigned_model, created_at=current.created_at,
                updated_at=self._next_updated_at(current),
                outcome_ref=outcome_ref or current.outcome_ref)
            self._commit("transition", record, **{"from": current.status, "to": new_status})
            return record

    def import_task(self, record: TaskStateRecord) -> bool:
        """Store a task made elsewhere (legacy migration) exactly as given,
        keeping its ``task_id``. Returns ``False`` (nothing written) if the id
        is already in the ledger. Durable on return; journaled as
        ``task_state.imported``."""
        if not isinstance(record, TaskStateRecord):
            raise TypeError(f"import_task: expected a TaskStateRecord, got {type(record).__name__}")
        with self._lock:
            self._check_open()
            if record.task_id in self._tasks:
                return False
            self._commit("imported", record)
            return True

    # ------------------------------------------------------------ reading

    def get(self, task_id: str) -> TaskStateRecord | None:
        """The task with ``task_id``, or ``None``."""
        with self._lock:
            self._check_open()
            return self._tasks.get(task_id) if isinstance(task_id, str) else None

    def get_active(self, channel_id: str) -> TaskStateRecord | None:
        """The channel's most recently created or amended non-terminal task,
        or ``None``. Transitions do not make a task more recent."""
        with self._lock:
            self._check_open()
            best = None
            best_touch = -1
            tasks, touched = self._tasks, self._touched
            for tid in self._by_channel.get(channel_id, ()):
                record = tasks[tid]
                if record.status not in TERMINAL_STATUSES and touched[tid] > best_touch:
                    best, best_touch = record, touched[tid]
            return best

    def list_open(self, channel_id: str) -> list[TaskStateRecord]:
        """The channel's non-terminal tasks, oldest (first created) first."""
        with self._lock:
            self._check_open()
            tasks = self._tasks
            return [tasks[tid] for tid in self._by_channel.get(channel_id, ())
                    if tasks[tid].status not in TERMINAL_STATUSES]

    def latest(self, channel_id: str) -> TaskStateRecord | None:
        """The channel's most recently created task of any status, or ``None``."""
        with self._lock:
            self._check_open()
            ids = self._by_channel.get(channel_id)
            return self._tasks[ids[-1]] if ids else None

    def list_tasks(self, channel_id: str | None = None) -> list[TaskStateRecord]:
        """Every task (of ``channel_id``, if given), in creation order."""
        with self._lock:
            self._check_open()
            if channel_id is None:
                return list(self._tasks.values())
            return [self._tasks[tid] for tid in self._by_channel.get(channel_id, ())]

    def __len__(self) -> int:
        with self._lock:
            self._check_open()
            return len(self._tasks)

    def __contains__(self, task_id: object) -> bool:
        with self._lock:
            self._check_open()
            return task_id in self._tasks

    @property
    def events(self) -> EventStore:
        """The event store this ledger journals into."""
        self._check_open()
        assert self._events is not None
        return self._events

    def stats(self) -> dict[str, Any]:
        """Counts and recovery facts: tasks, open tasks, sequence number,
        changes since the last checkpoint, quarantined torn lines."""
        with self._lock:
            self._check_open()
            assert self._log is not None and self._events is not None
            return {
                "tasks": len(self._tasks),
                "open": sum(1 for r in self._tasks.values() if r.status not in TERMINAL_STATUSES),
                "seq": self._seq,
                "since_checkpoint": self._since_checkpoint,
                "quarantined": list(self._log.quarantined) + [dict(q) for q in self._events.quarantined],
                "rejournaled": self.rejournaled,
            }

    # ------------------------------------------------------------ lifecycle

    def checkpoint(self) -> None:
        """Fold the ledger into the checkpoint now (durable on return)."""
        with self._lock:
            self._check_open()
            if self._since_checkpoint:
                self._write_checkpoint()

    def close(self) -> None:
        """Checkpoint if there are changes since the last one, then release
        the files and the lock (idempotent). Every change was already durable."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._since_checkpoint:
                    self._write_checkpoint()
            finally:
                self._closed = True
                self._release()

    def _release(self) -> None:
        if self._log is not None:
            self._log.close()
        if self._own_events and self._events is not None:
            self._events.close()
        if self._dirlock is not None:
            self._dirlock.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "TaskStateRepository":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._tasks)} tasks"
        return f"TaskStateRepository({self.state_dir!r}, {state})"
