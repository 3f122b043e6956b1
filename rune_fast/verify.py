"""Full check of a state directory, changing nothing (``rune-fast verify``).

:func:`verify_state` runs the conversation store's ``verify()`` (every tier,
the index snapshot, the envelopes), checks the task ledger's checkpoint and
log read-only, and -- when the store cannot even open -- scans every framed
file and Parquet archive offline, so that all damage is listed with its file
and offset.

It leaves logging configuration alone (it is safe from several threads at
once). The store logs an error for each read that fails its check; during a
verify each of those is also a problem in the report. A handler that should
not repeat them takes :class:`DuringVerifyFilter`, which drops the records
emitted by a thread (or task) while it is inside :func:`verify_state`.
"""
from __future__ import annotations

import contextvars
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ._names import COOL_DIR, EVENTS_NAME, HOT_DIR, TASK_LOG_PREFIX, TASK_LOG_RE, TASK_STATE_NAME
from .errors import CorruptStateCheckpointError

if TYPE_CHECKING:
    from ._fmt import Progress

__all__ = ["verify_state", "DuringVerifyFilter"]

_VERIFYING: contextvars.ContextVar[bool] = contextvars.ContextVar("rune_fast_verifying", default=False)


class DuringVerifyFilter(logging.Filter):
    """Drops the log records emitted inside :func:`verify_state` (in the
    verifying thread or task only; every other record passes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _VERIFYING.get()


def verify_state(state: str, progress: Progress | None = None) -> dict[str, Any]:
    """Full check of a state directory, changing nothing: the conversation
    store's ``verify()`` (every tier, the index snapshot, the envelopes), the
    task ledger's checkpoint and log, and -- when the store cannot even open --
    an offline scan of every framed file so that all damage is listed.
    Returns ``{"ok", "problems": [{"file","offset","message"}], "checked"}``."""
    problems: list[dict[str, Any]] = []
    checked: dict[str, Any] = {}
    seen: set[tuple[str, Any]] = set()

    def add(file: Any, offset: Any, message: str) -> None:
        key = (os.path.realpath(file) if file else "", offset)
        if key in seen:
            return
        seen.add(key)
        problems.append({"file": file, "offset": offset, "message": message})

    step = 0

    def tick(note: str) -> None:
        nonlocal step
        step += 1
        if progress is not None:
            progress.update(step, note, force=True)

    tick("conversation store")
    token = _VERIFYING.set(True)
    try:
        return _verify_state(state, progress, add, problems, checked, tick)
    finally:
        _VERIFYING.reset(token)


def _verify_state(state: str, progress: Progress | None, add: Callable[..., None], problems: list[dict[str, Any]],
                  checked: dict[str, Any], tick: Callable[[str], None]) -> dict[str, Any]:
    opened = False
    try:
        from .conversation_state import ConversationStateRepository

        repo = ConversationStateRepository(state, read_only=True)
    except CorruptStateCheckpointError as exc:
        add(exc.path, exc.offset, f"the conversation store does not open: {exc}")
    else:
        opened = True
        with repo:
            report = repo.verify()
            for p in report.problems:
                add(getattr(p, "file", None), getattr(p, "offset", None), getattr(p, "message", str(p)))
            checked.update(getattr(report, "checked", {}) or {})     # (envelopes too: a viewer's verify reads them)
    tick("task ledger")
    tasks = _verify_tasks(state, add, checked)
    _verify_task_envelopes(state, tasks, add, checked)
    tick("offline scan" if not opened else "events")
    _scan_framed_files(state, add, checked, conversation=not opened)
    if not opened:
        _scan_archives(state, add, checked)
    tick("done")
    problems.sort(key=lambda p: (str(p["file"]), p["offset"] if isinstance(p["offset"], int) else -1))
    return {"ok": not problems, "problems": problems, "checked": checked, "state_dir": state}


def _envelopes(state: str, add: Callable[..., None]) -> Iterator[dict[str, Any]]:
    """Every envelope of ``state/events.jsonl`` (read-only); damage is reported
    by the frame scan, so iteration just stops there."""
    from .events import EventStore

    path = os.path.join(state, EVENTS_NAME)
    if not os.path.exists(path):
        return
    with EventStore(path, read_only=True) as store:
        try:
            yield from store.iter_envelopes(0)
        except CorruptStateCheckpointError as exc:
            add(exc.path or path, exc.offset, str(exc))


def _verify_task_envelopes(state: str, tasks: dict[str, Any], add: Callable[..., None],
                           checked: dict[str, Any]) -> None:
    """Every task's current record must have been journaled: some
    ``task_state.*`` envelope of its id carries its payload_hash (the ledger
    syncs the envelope before the change)."""
    from .records import payload_hash

    if not tasks:
        return
    seen: dict[str, set[str]] = {}
    for env in _envelopes(state, add):
        if str(env.get("type", "")).startswith("task_state."):
            seen.setdefault(env.get("id", ""), set()).add(env.get("payload_hash", ""))
    for tid, rec in tasks.items():
        if payload_hash(rec) not in seen.get(tid, ()):
            add(os.path.join(state, EVENTS_NAME), None,
                f"task {tid}: no envelope carries the payload_hash of its current record (a power loss "
                f"can drop one; the ledger re-journals it when a writer next opens it)")
    checked["task_envelopes"] = len(tasks)


def _verify_tasks(state: str, add: Callable[..., None], checked: dict[str, Any]) -> dict[str, Any]:
    """Check the task checkpoint and log read-only; return the folded
    records (task_id -> record) of what parsed."""
    from .atomic import AtomicStore
    from .framed_log import FramedLog, parse_line
    from .records import TaskStateRecord

    hot = os.path.join(state, HOT_DIR)
    cp_path = os.path.join(hot, TASK_STATE_NAME)
    tasks: dict[str, Any] = {}
    try:
        cp = AtomicStore(cp_path).read()
        if cp is not None:
            for item in cp.get("tasks", []):
                rec = TaskStateRecord.from_dict(item["r"])
                tasks[rec.task_id] = rec
            checked["task_checkpoint_tasks"] = len(cp.get("tasks", []))
    except CorruptStateCheckpointError as exc:
        add(exc.path or cp_path, exc.offset, str(exc))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        add(cp_path, None, f"task checkpoint has a bad structure: {exc}")
    if not os.path.isdir(hot):
        return tasks
    n = 0
    for name in sorted(os.listdir(hot)):
        if not TASK_LOG_RE.fullmatch(name):
            continue
        path = os.path.join(hot, name)
        log = FramedLog(path, read_only=True)
        try:
            bad = log.verify()
            for p in bad:
                add(p["path"], p["offset"], f"task log: {p['problem']}")
            bad_offsets = {p["offset"] for p in bad}
            for offset, line in _good_lines(log, bad_offsets):
                n += 1
                try:
                    entry = parse_line(line, path=path, offset=offset)
                    rec = TaskStateRecord.from_dict(entry["r"])
                    tasks[rec.task_id] = rec
                except CorruptStateCheckpointError as exc:
                    add(path, offset, str(exc))
                except (KeyError, TypeError, ValueError) as exc:
                    add(path, offset, f"task log entry does not parse: {exc}")
        finally:
            log.close()
    checked["task_log_lines"] = n
    return tasks


def _good_lines(log: Any, bad: set[int]) -> Iterator[tuple[int, bytes]]:
    try:
        for offset, line in log.iter_lines(0):
            if offset not in bad:
                yield offset, line
    except CorruptStateCheckpointError:
        return  # already reported by verify()


def _scan_framed_files(state: str, add: Callable[..., None], checked: dict[str, Any], *, conversation: bool) -> None:
    """Frame check of events.jsonl (always: the store's verify may not own it)
    and, when ``conversation``, of every other framed file under hot/."""
    from .framed_log import FramedLog

    paths = []
    events = os.path.join(state, EVENTS_NAME)
    if os.path.exists(events):
        paths.append(events)
    hot = os.path.join(state, HOT_DIR)
    if conversation and os.path.isdir(hot):
        for name in sorted(os.listdir(hot)):
            if name.endswith(".jsonl") and not name.startswith(TASK_LOG_PREFIX):
                paths.append(os.path.join(hot, name))
    n = 0
    for path in paths:
        log = FramedLog(path, read_only=True)
        try:
            for p in log.verify():
                add(p["path"], p["offset"], p["problem"])
            n += 1
        finally:
            log.close()
    checked["framed_files_scanned"] = n


def _scan_archives(state: str, add: Callable[..., None], checked: dict[str, Any]) -> None:
    """Read every Parquet archive under hot/conversation_cool/ (footer, schema,
    every row group; Parquet's page checksums are verified) -- for when the
    store cannot open and so cannot check their digests itself."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # (pyarrow raises more than OSError and ValueError for a damaged footer:
    # ArrowNotImplementedError, say, for an integer type of 4 bits)
    unreadable = (OSError, ValueError, pa.ArrowException)
    cool = os.path.join(state, HOT_DIR, COOL_DIR)
    if not os.path.isdir(cool):
        return
    n = 0
    for name in sorted(os.listdir(cool)):
        if not name.endswith(".parquet"):
            continue
        path = os.path.join(cool, name)
        n += 1
        try:
            pf = pq.ParquetFile(path, page_checksum_verification=True)
        except unreadable as exc:
            add(path, None, f"unreadable Parquet archive: {exc}")
            continue
        try:
            for i in range(pf.num_row_groups):
                try:
                    pf.read_row_group(i)
                except unreadable as exc:
                    add(path, None, f"row group {i} unreadable: {exc}")
        finally:
            pf.close()
    checked["archives_scanned"] = n
