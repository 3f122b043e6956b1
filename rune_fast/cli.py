"""The ``rune-fast`` command: inspect, feed, check and repair a state directory.

Every subcommand takes ``--state DIR`` (default ``./rune-state``) and
``--json`` (one JSON document on stdout, for scripts; tables otherwise).
Exit status: 0 success; 1 a negative answer (``get``: not found, ``verify``:
damage found, ``canary``: a promise failed); 2 an error (one line on stderr,
never a traceback for an expected failure) -- also ``get`` of a corrupt record.

The reading subcommands (``window``, ``task``, ``get``, ``search``, ``stats``,
``verify``, ``export``) open the conversation store with ``read_only=True``:
they work beside a running writer and change no file; ``verify`` reads the
task ledger's files read-only too. ``tasks`` and ``stats`` open the task
ledger itself (it has no read-only mode) when it is free, and beside a running
frontend read a snapshot of its files instead (:class:`TaskLedgerView`).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import shutil
import sys
import time
import warnings
from typing import Any, Callable, Iterable, Iterator, Sequence

from .errors import CorruptStateCheckpointError, RuneError

__all__ = ["main", "build_parser", "Progress", "format_table", "detect_import_kind", "InputError"]

DEFAULT_STATE = "./rune-state"
BATCH = 1000


class InputError(RuneError, ValueError):
    """Bad input given to the command (a line of JSON, a file of the wrong kind)."""


# ---------------------------------------------------------------------------
# progress bar (stderr, only on a terminal)


_SPINNER = "|/-\\"


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a TTY.

    ``Progress(label, total)``; ``update(done, note="")`` (absolute) or
    ``advance(k=1)``; ``close()`` clears the line. ``total=None`` shows a
    counter without a bar. Redraws at most ~12 times a second.
    """

    def __init__(self, label: str, total: int | None = None, *, stream: Any = None,
                 enabled: bool | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.note = ""
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._last = 0.0
        self._drawn = False
        self._spin = 0

    def update(self, done: int | None = None, note: str | None = None, *, force: bool = False) -> None:
        if done is not None:
            self.done = done
        if note is not None:
            self.note = note
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.08:
            return
        self._last = now
        self._draw()

    def advance(self, k: int = 1, note: str | None = None) -> None:
        self.update(self.done + k, note)

    def _draw(self) -> None:
        width = shutil.get_terminal_size((80, 24)).columns
        if self.total:
            frac = min(1.0, self.done / self.total)
            bar_w = 24
            fill = int(frac * bar_w)
            bar = "#" * fill + "-" * (bar_w - fill)
            text = f"{self.label} [{bar}] {frac * 100:3.0f}% {self.done:,}/{self.total:,}"
        else:
            self._spin = (self._spin + 1) % 4
            text = f"{self.label} {_SPINNER[self._spin]} {self.done:,}"
        if self.note:
            text += f"  {self.note}"
        text = text[: max(10, width - 1)]
        self.stream.write("\r" + text.ljust(max(10, width - 1)))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            width = shutil.get_terminal_size((80, 24)).columns
            self.stream.write("\r" + " " * max(10, width - 1) + "\r")
            self.stream.flush()
        self._drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# output helpers


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Sequence[int] = (),
                 max_width: int | None = None, flex: int | None = None) -> str:
    """Aligned columns with a dashed rule under the headers. ``right``: indexes
    of right-aligned columns; ``flex``: the index of the column cut short
    (with ``...``) to fit ``max_width``."""
    data = [[_cell(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in data:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    if max_width and flex is not None:
        others = sum(w for i, w in enumerate(widths) if i != flex) + 2 * (len(widths) - 1)
        room = max(12, max_width - others)
        if widths[flex] > room:
            widths[flex] = room
            for row in data:
                if len(row[flex]) > room:
                    row[flex] = row[flex][: room - 3] + "..."

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(cells):
            out.append(c.rjust(widths[i]) if i in right else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    lines = [line(list(headers)), line(["-" * w for w in widths])]
    lines.extend(line(row) for row in data)
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    text = str(value)
    return text.replace("\r", " ").replace("\n", " \u21b5 ").replace("\t", " ")


def _time(ts: float) -> str:
    try:
        return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(ts)


def _term_width() -> int | None:
    """The terminal width when stdout is a terminal; None (no cutting) when piped."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size((140, 24)).columns


def _content_of(rec: Any) -> str:
    text = rec.content
    if rec.tool_calls:
        calls = ", ".join(f"{c.get('name')}({json.dumps(c.get('arguments'), ensure_ascii=False)})"
                          for c in rec.tool_calls)
        text = (text + " " if text else "") + f"[tool_calls: {calls}]"
    if rec.tool_call_id:
        text = f"[result of {rec.tool_call_id}] " + text
    return text


def _print_records(records: Sequence[Any], *, show_channel: bool = False, tiers: Sequence[str] | None = None) -> None:
    headers = ["time", "role"]
    if show_channel:
        headers.append("channel")
    headers += ["task", "msg_id"]
    if tiers is not None:
        headers.append("tier")
    headers.append("content")
    rows = []
    for i, r in enumerate(records):
        row = [_time(r.ts), r.role]
        if show_channel:
            row.append(r.channel_id)
        row += [r.task_id or "-", r.msg_id]
        if tiers is not None:
            row.append(tiers[i])
        row.append(_content_of(r))
        rows.append(row)
    print(format_table(headers, rows, max_width=_term_width(), flex=len(headers) - 1))


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, ensure_ascii=False, indent=2, default=_json_default)
    sys.stdout.write("\n")


def _json_default(obj: Any) -> Any:
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if hasattr(obj, "value") and hasattr(obj, "name"):  # enums
        return obj.value
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def _kv_table(pairs: Iterable[tuple[str, Any]]) -> str:
    rows = [(k, _render_value(v)) for k, v in pairs]
    w = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)


def _render_value(v: Any) -> str:
    if v == "" or v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        if not v:
            return "none"
        return "; ".join(_render_value(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_render_value(x)}" for k, x in v.items()) or "none"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.3f}"
    return str(v)


# ---------------------------------------------------------------------------
# opening the stores


def _state(args: argparse.Namespace) -> str:
    return os.path.abspath(args.state)


def _require_state(args: argparse.Namespace) -> str:
    state = _state(args)
    if not os.path.isdir(state):
        raise RuneError(f"no state directory at {state} (give one with --state DIR)")
    return state


def _conversation_cls() -> Any:
    from .conversation_state import ConversationStateRepository

    return ConversationStateRepository


def _open_reader(args: argparse.Namespace) -> Any:
    """The conversation store, read-only (no lock taken, no file changed)."""
    return _conversation_cls()(_require_state(args), read_only=True)


def _open_writer(args: argparse.Namespace, **options: Any) -> Any:
    return _conversation_cls()(_state(args), **options)


def _open_tasks(args: argparse.Namespace) -> Any:
    from .tasks import TaskStateRepository

    return TaskStateRepository(_require_state(args))


class TaskLedgerView:
    """A read-only snapshot of a state directory's task ledger, folded from
    its documented files (``hot/task_state.json`` and the ``task_log`` it
    names; see the task ledger section of the format page) without taking
    the writer's lock or changing a file. Used when a frontend holds the
    ledger open. Same reads as the repository: ``get``, ``get_active``,
    ``list_open``, ``list_tasks``, ``latest``, ``stats``."""

    def __init__(self, state_dir: str) -> None:
        from .atomic import AtomicStore
        from .events import FramedLog, parse_checked
        from .records import TERMINAL_STATUSES, TaskStateRecord

        self._terminal = TERMINAL_STATUSES
        hot = os.path.join(state_dir, "hot")
        for attempt in range(5):
            tasks: dict[str, Any] = {}
            touched: dict[str, int] = {}
            cp = AtomicStore(os.path.join(hot, "task_state.json")).read()
            gen = 0
            if cp is not None:
                try:
                    gen = int(cp["gen"])
                    for item in cp["tasks"]:
                        rec = TaskStateRecord.from_dict(item["r"])
                        tasks[rec.task_id] = rec
                        touched[rec.task_id] = int(item["t"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise CorruptStateCheckpointError(f"task checkpoint has a bad structure: {exc!r}",
                                                      path=os.path.join(hot, "task_state.json")) from None
            path = os.path.join(hot, f"task_log-{gen:08d}.jsonl")
            try:
                log = FramedLog(path, read_only=True)
            except FileNotFoundError:
                if cp is None:
                    break          # no ledger yet
                continue           # the writer checkpointed meanwhile: read again
            try:
                for offset, line in log.iter_lines(0):
                    entry = parse_checked(line, path=path, offset=offset)     # (iter_lines checked it)
                    try:
                        rec = TaskStateRecord.from_dict(entry["r"])
                        op, n = entry["op"], int(entry["n"])
                    except (KeyError, TypeError, ValueError) as exc:
                        raise CorruptStateCheckpointError(f"task log entry does not parse: {exc!r}",
                                                          path=path, offset=offset) from None
                    tasks[rec.task_id] = rec
                    if op in ("created", "imported", "amended"):
                        touched[rec.task_id] = n
            finally:
                log.close()
            break
        self._tasks, self._touched = tasks, touched

    def get(self, task_id: str) -> Any:
        return self._tasks.get(task_id)

    def list_tasks(self, channel_id: str | None = None) -> list[Any]:
        return [t for t in self._tasks.values() if channel_id is None or t.channel_id == channel_id]

    def list_open(self, channel_id: str) -> list[Any]:
        return [t for t in self.list_tasks(channel_id) if t.status not in self._terminal]

    def get_active(self, channel_id: str) -> Any:
        open_ = self.list_open(channel_id)
        return max(open_, key=lambda t: self._touched.get(t.task_id, -1)) if open_ else None

    def latest(self, channel_id: str) -> Any:
        mine = self.list_tasks(channel_id)
        return mine[-1] if mine else None

    def stats(self) -> dict[str, Any]:
        return {"tasks": len(self._tasks),
                "open": sum(1 for t in self._tasks.values() if t.status not in self._terminal),
                "note": "read-only view: the ledger is open in a writer"}

    def close(self) -> None:
        pass

    def __enter__(self) -> "TaskLedgerView":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _tasks_for_reading(args: argparse.Namespace) -> Any:
    """The task ledger for a read: the repository, or -- when a frontend
    holds its lock -- a :class:`TaskLedgerView` of its files."""
    from .errors import StateLockedError

    try:
        return _open_tasks(args)
    except StateLockedError:
        return TaskLedgerView(_require_state(args))


# ---------------------------------------------------------------------------
# input


def _derived_id(d: dict, seen: dict[str, int]) -> str:
    """A deterministic msg_id for an imported message that has none: digest of
    its canonical JSON plus how many identical messages came before it, so a
    second import of the same file stores nothing new."""
    import xxhash

    body = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    h = xxhash.xxh3_128_hexdigest(body.encode("utf-8"))
    n = seen.get(h, 0)
    seen[h] = n + 1
    return f"msg_imp_{h[:24]}" + (f"_{n}" if n else "")


def _record_from(d: Any, where: str, *, channel: str | None, role: str | None, task: str | None,
                 derive: dict[str, int] | None) -> Any:
    from .records import ConversationMessageRecord

    if not isinstance(d, dict):
        raise InputError(f"{where}: expected a JSON object (a message), got {type(d).__name__}")
    d = dict(d)
    if derive is not None and not d.get("msg_id"):
        d["msg_id"] = _derived_id(d, derive)
    if channel and not d.get("channel_id"):
        d["channel_id"] = channel
    if role and not d.get("role"):
        d["role"] = role
    if task and not d.get("task_id"):
        d["task_id"] = task
    if d.get("tool_calls") is None:
        d.pop("tool_calls", None)
    try:
        return ConversationMessageRecord.from_dict(d)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: {exc}") from None


def _json_lines(stream: Any, name: str) -> Iterator[tuple[int, Any]]:
    for lineno, line in enumerate(stream, 1):
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name} line {lineno}: not JSON ({exc.msg} at column {exc.colno})") from None


def _store_batches(repo: Any, records: Iterable[Any], progress: Progress | None = None,
                   size_of: Callable[[], int] | None = None) -> tuple[int, int]:
    new = seen = 0
    batch: list[Any] = []

    def flush() -> None:
        nonlocal new, seen, batch
        if batch:
            new += repo.append_many(batch)
            seen += len(batch)
            batch = []
            if progress is not None:
                progress.update(size_of() if size_of else seen, f"{seen:,} messages")

    for rec in records:
        batch.append(rec)
        if len(batch) >= BATCH:
            flush()
    flush()
    return new, seen


# ---------------------------------------------------------------------------
# subcommands


def cmd_append(args: argparse.Namespace) -> int:
    """Store messages given as arguments, or as JSON lines on stdin."""
    from .records import ConversationMessageRecord

    if args.content is not None:
        if not args.channel:
            raise InputError("append: --channel is required with --content")
        try:
            kwargs: dict[str, Any] = dict(role=args.role or "user", content=args.content,
                                          channel_id=args.channel, task_id=args.task or "")
            if args.msg_id:
                kwargs["msg_id"] = args.msg_id
            records = [ConversationMessageRecord(**kwargs)]
        except (TypeError, ValueError) as exc:
            raise InputError(f"append: {exc}") from None
    else:
        if sys.stdin.isatty():
            raise InputError("append: give --channel/--role/--content, or pipe JSON lines of messages on stdin")
        records = [_record_from(d, f"stdin line {n}", channel=args.channel, role=args.role, task=args.task,
                                derive=None)
                   for n, d in _json_lines(sys.stdin, "stdin")]
    with _open_writer(args) as repo:
        new, total = _store_batches(repo, records)
    if args.json:
        _print_json({"stored": new, "duplicates": total - new, "msg_ids": [r.msg_id for r in records]})
    else:
        if len(records) == 1:
            print(f"{'stored' if new else 'already stored'} {records[0].msg_id}")
        else:
            print(f"stored {new:,} new messages ({total - new:,} already stored)")
    return 0


def cmd_window(args: argparse.Namespace) -> int:
    """Print the last N messages of a channel, oldest first."""
    with _open_reader(args) as repo:
        recs = repo.window(args.channel, args.n)
    if args.json:
        _print_json([r.to_dict() for r in recs])
    elif not recs:
        print(f"no messages on channel {args.channel!r}")
    else:
        _print_records(recs)
    return 0


def cmd_task(args: argparse.Namespace) -> int:
    """Print every message of a task (all tiers), oldest first."""
    with _open_reader(args) as repo:
        recs = repo.messages_for_task(args.task_id)
    if args.json:
        _print_json([r.to_dict() for r in recs])
    elif not recs:
        print(f"no messages for task {args.task_id!r}")
    else:
        _print_records(recs, show_channel=True)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    """Exact read of one message with its verdict: exit 0 found and verified,
    1 not found, 2 stored but corrupt."""
    with _open_reader(args) as repo:
        read = repo.get_message(args.msg_id)
    status = getattr(read.status, "name", str(read.status))
    if args.json:
        _print_json({"msg_id": args.msg_id, "status": status, "tier": read.tier,
                     "record": read.record.to_dict() if read.record is not None else None})
    else:
        print(f"{args.msg_id}: {status}" + (f" (tier {read.tier})" if read.tier else ""))
        if read.record is not None:
            rec = read.record
            pairs = [(k, v) for k, v in rec.to_dict().items() if k not in ("msg_id",)]
            pairs = [(k, _time(v) + f" ({v})" if k == "ts" else v) for k, v in pairs]
            print(_kv_table(pairs))
    if status == "FOUND_VERIFIED":
        return 0
    if status == "SOURCE_CORRUPT":
        print(f"rune-fast: {args.msg_id} is stored but its bytes fail their check; run `rune-fast verify`",
              file=sys.stderr)
        return 2
    return 1


def cmd_search(args: argparse.Namespace) -> int:
    """Print the messages whose content contains TEXT, oldest first."""
    with _open_reader(args) as repo:
        hits = repo.search(args.text, args.channel, limit=args.limit, case_sensitive=args.case_sensitive)
    if args.json:
        _print_json([{"tier": h.tier, "record": h.record.to_dict()} for h in hits])
    elif not hits:
        print(f"no message contains {args.text!r}")
    else:
        _print_records([h.record for h in hits], show_channel=args.channel is None, tiers=[h.tier for h in hits])
        print(f"{len(hits):,} hit{'s' if len(hits) != 1 else ''}")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    """Print the open tasks of a channel (oldest first; * marks the active one)."""
    with _tasks_for_reading(args) as tasks:
        if args.all:
            lister = getattr(tasks, "list_tasks", None)
            if lister is None:
                raise RuneError("tasks --all needs TaskStateRepository.list_tasks, missing in this build")
            recs = lister(args.channel)
        else:
            recs = tasks.list_open(args.channel)
        active = tasks.get_active(args.channel)
    active_id = active.task_id if active is not None else None
    if args.json:
        _print_json({"channel_id": args.channel, "active": active_id, "tasks": [t.to_dict() for t in recs]})
        return 0
    if not recs:
        print(f"no {'' if args.all else 'open '}tasks on channel {args.channel!r}")
        return 0
    rows = [("*" if t.task_id == active_id else "", t.task_id, t.status, _time(t.created_at), _time(t.updated_at),
             t.parent_task_id or "-", t.title) for t in recs]
    print(format_table(["", "task_id", "status", "created", "updated", "parent", "title"], rows,
                       max_width=_term_width(), flex=6))
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """Fold the tail into the hot checkpoint, cool old messages, erase deleted ones."""
    options: dict[str, Any] = {}
    if args.hot_window is not None:
        options["hot_window"] = args.hot_window
    with _open_writer(args, **options) as repo:
        report = repo.compact()
    d = report.to_dict() if hasattr(report, "to_dict") else dict(report)
    if args.json:
        _print_json(d)
    else:
        print(_kv_table(d.items()))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Counts, sizes and recovery notes of the conversation store and the task ledger."""
    with _open_reader(args) as repo:
        conv = repo.stats()
    with _tasks_for_reading(args) as tasks:
        tstats = tasks.stats()
    if args.json:
        _print_json({"conversation": conv, "tasks": tstats})
    else:
        print("conversation")
        print(_indent(_kv_table(conv.items())))
        print("tasks")
        print(_indent(_kv_table(tstats.items())))
    return 0


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


# -- verify ------------------------------------------------------------------


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
    # Every problem goes into the report; the store's own error log lines
    # (one per failed read) would only repeat them.
    store_log = logging.getLogger("rune_fast")
    level = store_log.level
    store_log.setLevel(logging.CRITICAL)
    try:
        return _verify_state(state, progress, add, problems, checked, tick)
    finally:
        store_log.setLevel(level)


def _verify_state(state: str, progress: Progress | None, add: Callable[..., None], problems: list[dict[str, Any]],
                  checked: dict[str, Any], tick: Callable[[str], None]) -> dict[str, Any]:
    opened = False
    try:
        repo = _conversation_cls()(state, read_only=True)
    except CorruptStateCheckpointError as exc:
        add(exc.path, exc.offset, f"the conversation store does not open: {exc}")
    else:
        opened = True
        with repo:
            report = repo.verify()
            for p in report.problems:
                add(getattr(p, "file", None), getattr(p, "offset", None), getattr(p, "message", str(p)))
            checked.update(getattr(report, "checked", {}) or {})
            if not checked.get("envelopes"):
                # A read-only store has no event store of its own: check the
                # message envelopes against the stored records here.
                _verify_message_envelopes(state, repo, add, checked, progress)
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

    path = os.path.join(state, "events.jsonl")
    if not os.path.exists(path):
        return
    with EventStore(path, read_only=True) as store:
        try:
            yield from store.iter_envelopes(0)
        except CorruptStateCheckpointError as exc:
            add(exc.path or path, exc.offset, str(exc))


def _verify_message_envelopes(state: str, repo: Any, add: Callable[..., None], checked: dict[str, Any],
                              progress: Progress | None) -> None:
    """Each ``conversation.message`` envelope whose message is stored must
    carry that record's payload_hash (an envelope whose message is absent is
    an append a crash cut short, or a deleted message: not damage)."""
    from .records import payload_hash

    path = os.path.join(state, "events.jsonl")
    size = max(1, os.path.getsize(path)) if os.path.exists(path) else 1
    n = 0
    for env in _envelopes(state, add):
        n += 1
        if env.get("type") != "conversation.message":
            continue
        read = repo.get_message(env.get("id", ""))
        if read.record is not None and env.get("payload_hash") != payload_hash(read.record):
            add(path, env.get("offset"), f"envelope of {env.get('id')} does not match its stored record")
        if progress is not None and n % 4096 == 0:
            progress.update(None, f"envelopes {100 * env.get('offset', 0) // size}%")
    checked["envelopes"] = n


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
            add(os.path.join(state, "events.jsonl"), None,
                f"task {tid}: no envelope carries the payload_hash of its current record (a power loss "
                f"can drop one; the ledger re-journals it when a writer next opens it)")
    checked["task_envelopes"] = len(tasks)


def _verify_tasks(state: str, add: Callable[..., None], checked: dict[str, Any]) -> dict[str, Any]:
    """Check the task checkpoint and log read-only; return the folded
    records (task_id -> record) of what parsed."""
    import re

    from .atomic import AtomicStore
    from .events import FramedLog, parse_line
    from .records import TaskStateRecord

    hot = os.path.join(state, "hot")
    cp_path = os.path.join(hot, "task_state.json")
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
        if not re.fullmatch(r"task_log-\d{8}\.jsonl", name):
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
    from .events import FramedLog

    paths = []
    events = os.path.join(state, "events.jsonl")
    if os.path.exists(events):
        paths.append(events)
    hot = os.path.join(state, "hot")
    if conversation and os.path.isdir(hot):
        for name in sorted(os.listdir(hot)):
            if name.endswith(".jsonl") and not name.startswith("task_log-"):
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
    import pyarrow.parquet as pq

    cool = os.path.join(state, "hot", "conversation_cool")
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
        except (OSError, ValueError) as exc:
            add(path, None, f"unreadable Parquet archive: {exc}")
            continue
        try:
            for i in range(pf.num_row_groups):
                try:
                    pf.read_row_group(i)
                except (OSError, ValueError) as exc:
                    add(path, None, f"row group {i} unreadable: {exc}")
        finally:
            pf.close()
    checked["archives_scanned"] = n


def cmd_verify(args: argparse.Namespace) -> int:
    """Full check of every tier; exit 1 with a report naming file and offset of
    each problem if anything is damaged."""
    state = _require_state(args)
    with Progress("verify", 4) as bar:
        result = verify_state(state, bar)
    if args.json:
        _print_json(result)
    elif result["ok"]:
        checked = ", ".join(f"{k}={_render_value(v)}" for k, v in result["checked"].items())
        print(f"OK: no damage in {state}" + (f" ({checked})" if checked else ""))
    else:
        n = len(result["problems"])
        print(f"DAMAGE: {n} problem{'s' if n != 1 else ''} in {state}")
        rows = [(p["file"], p["offset"], p["message"]) for p in result["problems"]]
        print(format_table(["file", "offset", "problem"], rows, right=(1,)))
    return 0 if result["ok"] else 1


# -- export / import ---------------------------------------------------------


def _all_messages(repo: Any, channel: str | None, progress: Progress | None = None) -> Iterator[Any]:
    channels = [channel] if channel is not None else repo.channels()
    if progress is not None:
        progress.total = len(channels)
    total = max(1, len(repo))
    for i, ch in enumerate(channels, 1):
        yield from repo.window(ch, total)
        if progress is not None:
            progress.update(i, ch)


PARQUET_COLUMNS = ("msg_id", "channel_id", "task_id", "hlc", "content", "ts", "role", "token_estimate",
                   "tool_calls", "tool_call_id", "origin", "schema_version")


def cmd_export(args: argparse.Namespace) -> int:
    """Write every message (or a channel's), oldest first per channel, as JSON
    lines (to stdout or --out) or as one Parquet file (--format parquet --out FILE)."""
    if args.format == "parquet" and not args.out:
        raise InputError("export --format parquet needs --out FILE")
    with _open_reader(args) as repo, Progress("export") as bar:
        if args.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            cols: dict[str, list[Any]] = {c: [] for c in PARQUET_COLUMNS}
            for rec in _all_messages(repo, args.channel, bar):
                d = rec.to_dict()
                d["tool_calls"] = json.dumps(d["tool_calls"], ensure_ascii=False, sort_keys=True)
                for c in PARQUET_COLUMNS:
                    cols[c].append(d.get(c))
            schema = pa.schema([("msg_id", pa.string()), ("channel_id", pa.string()), ("task_id", pa.string()),
                                ("hlc", pa.string()), ("content", pa.string()), ("ts", pa.float64()),
                                ("role", pa.string()), ("token_estimate", pa.int64()),
                                ("tool_calls", pa.string()), ("tool_call_id", pa.string()),
                                ("origin", pa.string()), ("schema_version", pa.int64())])
            table = pa.table(cols, schema=schema)
            pq.write_table(table, args.out)
            count = table.num_rows
        else:
            out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
            count = 0
            try:
                for rec in _all_messages(repo, args.channel, bar):
                    out.write(json.dumps(rec.to_dict(), ensure_ascii=False) + "\n")
                    count += 1
            finally:
                if args.out:
                    out.close()
    if args.out:
        if args.json:
            _print_json({"exported": count, "file": args.out, "format": args.format})
        else:
            print(f"exported {count:,} messages to {args.out}")
    return 0


def detect_import_kind(path: str) -> str:
    """``"parquet"``, ``"operator"`` (legacy operator.json), ``"checkpoint"``
    (legacy fat checkpoint: a JSON list of messages or ``{"messages": [...]}``)
    or ``"jsonl"`` (one message per line), from the file's content."""
    with open(path, "rb") as f:
        head = f.read(4)
        if head == b"PAR1":
            return "parquet"
        f.seek(0)
        first = f.readline()
        stripped = first.strip()
        while not stripped:
            nxt = f.readline()
            if not nxt:
                raise InputError(f"{path}: the file is empty")
            stripped = nxt.strip()
        if stripped.startswith(b"["):
            return "checkpoint"
        try:
            obj = json.loads(stripped)
        except (json.JSONDecodeError, UnicodeDecodeError):
            obj = None
        if obj is None:
            # A multi-line (pretty-printed) JSON document.
            f.seek(0)
            try:
                obj = json.loads(f.read().decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InputError(f"{path}: neither JSON lines nor a JSON document ({exc})") from None
        if isinstance(obj, dict):
            if "tasks" in obj:
                return "operator"
            if isinstance(obj.get("messages"), list):
                return "checkpoint"
            return "jsonl"
        if isinstance(obj, list):
            return "checkpoint"
        raise InputError(f"{path}: not a kind rune-fast imports (JSON lines of messages, a legacy "
                         f"checkpoint, a legacy operator.json, or Parquet)")


def _import_messages(args: argparse.Namespace, kind: str, path: str) -> dict[str, Any]:
    derive: dict[str, int] = {}
    size = os.path.getsize(path) if path != "-" else None
    with _open_writer(args) as repo, Progress("import", size) as bar:
        if kind == "jsonl":
            f = sys.stdin.buffer if path == "-" else open(path, "rb")
            try:
                recs: Iterable[Any] = (
                    _record_from(d, f"{path} line {n}", channel=args.channel, role=None, task=None,
                                 derive=derive) for n, d in _json_lines(f, path))
                size_of = (lambda: f.tell()) if path != "-" else None
                new, total = _store_batches(repo, recs, bar, size_of)
            finally:
                if path != "-":
                    f.close()
        elif kind == "checkpoint":
            data = _load_json(path)
            items = data.get("messages") if isinstance(data, dict) else data
            if not isinstance(items, list):
                raise InputError(f"{path}: a legacy checkpoint is a JSON list of messages or {{\"messages\": [...]}}")
            bar.total = len(items)
            # Every entry is checked before the first write.
            recs = [_record_from(d, f"{path} messages[{i}]", channel=args.channel, role=None, task=None,
                                 derive=derive) for i, d in enumerate(items)]
            new, total = _store_batches(repo, recs, bar)
        elif kind == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            rows = table.to_pylist()
            bar.total = len(rows)

            def parquet_records() -> Iterator[Any]:
                for i, row in enumerate(rows):
                    calls = row.get("tool_calls")
                    if isinstance(calls, str):
                        row["tool_calls"] = json.loads(calls) if calls else []
                    yield _record_from(row, f"{path} row {i}", channel=args.channel, role=None, task=None,
                                       derive=derive)

            new, total = _store_batches(repo, list(parquet_records()), bar)
        else:
            raise InputError(f"unknown import kind {kind!r}")
    return {"kind": kind, "source": path, "messages_imported": new, "messages_already_present": total - new}


def _load_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a JSON document ({exc})") from None


def cmd_import(args: argparse.Namespace) -> int:
    """Import JSON lines of messages, a legacy fat checkpoint, a legacy
    operator.json, or a Parquet export; ids already stored are skipped, so
    importing the same file twice stores nothing the second time."""
    path = args.file
    if path != "-" and not os.path.exists(path):
        raise InputError(f"import: no such file {path}")
    kind = args.kind or ("jsonl" if path == "-" else detect_import_kind(path))
    if path == "-" and kind != "jsonl":
        raise InputError("import from stdin reads JSON lines only; give a file for other kinds")
    if kind == "operator":
        from .composition import build_conversation_state
        from .operator import migrate_operator_tasks

        with build_conversation_state({"state": _state(args)}) as root, Progress("import") as bar:
            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done)

            report = migrate_operator_tasks(path, root.get("task_state"), root.get("conversation_state"),
                                            default_channel=args.channel or "default",
                                            progress=progress)
        result = {"kind": "operator", **report.to_dict()}
        if args.json:
            _print_json(result)
        else:
            print(f"imported {report.tasks_imported:,} tasks and {report.messages_imported:,} messages "
                  f"from {path} ({report.tasks_already_present:,} tasks and "
                  f"{report.messages_already_present:,} messages already present)")
            if report.current_task:
                print(f"current task {report.current_task}: "
                      f"{'active' if report.current_task_active else 'not active'}")
            for tid, how in report.unknown_statuses.items():
                print(f"note: task {tid}: unknown legacy status {how}")
            for w in report.warnings:
                print(f"note: {w}")
        return 0
    result = _import_messages(args, kind, path)
    if args.json:
        _print_json(result)
    else:
        print(f"imported {result['messages_imported']:,} messages from {path} ({kind}; "
              f"{result['messages_already_present']:,} already present)")
    return 0


# -- delete -------------------------------------------------------------------


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete messages by id (reads stop returning them at once; the next
    compact erases their bytes)."""
    with _open_writer(args) as repo:
        done = {mid: repo.delete(mid) for mid in args.msg_ids}
    if args.json:
        _print_json({"deleted": [m for m, ok in done.items() if ok], "not_found": [m for m, ok in done.items() if not ok]})
    else:
        for mid, ok in done.items():
            print(f"{'deleted' if ok else 'not found'} {mid}")
    return 0 if all(done.values()) else 1


# -- bench and canary ---------------------------------------------------------


def load_bench() -> Any:
    """``bench.compare`` from the source checkout this package lives in (bench/
    is not installed with the package); ``RuneError`` saying how to run it
    otherwise."""
    import importlib

    # The checkout this package was imported from (editable install or
    # in-place build), else the current directory (a checkout's root).
    for root in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()):
        if os.path.isfile(os.path.join(root, "bench", "compare.py")):
            if root not in sys.path:
                sys.path.insert(0, root)
            break
    try:
        mod = importlib.import_module("bench.compare")
    except ImportError as exc:
        raise RuneError(
            f"the SQLite comparison (bench/compare.py) is not importable ({exc}); it ships with the source "
            f"checkout, not the installed package: from the repository root run `python -m bench.compare --quick`"
        ) from None
    if not hasattr(mod, "run_comparison"):
        raise RuneError(f"bench.compare at {getattr(mod, '__file__', '?')} has no run_comparison")
    return mod


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the side-by-side comparison against SQLite (WAL, same durability)."""
    bc = load_bench()
    if args.smoke:
        cfg = bc.Config.tiny()
    else:
        cfg = bc.Config.quick() if args.quick else bc.Config()
    if args.n is not None:
        cfg.n = args.n
    if args.repeats is not None:
        cfg.repeats = args.repeats
    with Progress("bench") as bar:
        def log(line: str) -> None:
            if bar.enabled:
                bar.advance(1, line.strip()[:70])
            else:
                print(line, file=sys.stderr, flush=True)

        report = bc.run_comparison(cfg, log=log)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=2)
    if args.plot:
        if bc.plot(report, args.plot):
            print(f"plot: {args.plot}", file=sys.stderr)
        else:
            print("plot skipped: matplotlib is not installed (pip install 'rune_fast[demo]')", file=sys.stderr)
    if args.json:
        _print_json(report.to_json())
    else:
        print(bc.format_table(report))
        for note in report.notes:
            print(f"note: {note}")
    return 0


def cmd_canary(args: argparse.Namespace) -> int:
    """Exercise every contract promise against a fresh directory; exit 1 if any fails."""
    from . import canary

    argv = ["--state", args.dir] if args.dir else []
    if args.json:
        argv.append("--json")
    return canary.main(argv)


# ---------------------------------------------------------------------------
# parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rune_fast")
    except PackageNotFoundError:
        return "(source checkout, not installed)"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state", metavar="DIR", default=argparse.SUPPRESS,
                        help=f"the state directory (default {DEFAULT_STATE})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print one JSON document instead of tables (for scripts)")

    p = argparse.ArgumentParser(
        prog="rune-fast",
        description="Inspect, feed, check and repair a rune_fast state directory.",
        epilog="exit status: 0 ok; 1 negative answer (not found, damage found, canary failure); 2 error",
    )
    p.add_argument("--version", action="version", version=f"rune-fast {_version()}")
    p.add_argument("--state", metavar="DIR", default=DEFAULT_STATE,
                   help=f"the state directory (default {DEFAULT_STATE})")
    p.add_argument("--json", action="store_true", default=False,
                   help="print one JSON document instead of tables (for scripts)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], int], help: str, description: str | None = None) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, parents=[common], help=help, description=description or help)
        sp.set_defaults(func=func)
        return sp

    sp = add("append", cmd_append, "store messages (from arguments, or JSON lines on stdin)",
             "Store one message from --channel/--role/--content [--task], or JSON lines of messages "
             "on stdin (each a message dict; --channel/--role/--task fill in missing fields). "
             "A msg_id already stored is skipped.")
    sp.add_argument("--channel", help="channel id")
    sp.add_argument("--role", choices=("user", "assistant", "system", "tool"), help="role (default user)")
    sp.add_argument("--content", help="message text; without it, JSON lines are read from stdin")
    sp.add_argument("--task", help="task id the message belongs to")
    sp.add_argument("--msg-id", help="use this msg_id instead of a new one")

    sp = add("window", cmd_window, "the last N messages of a channel")
    sp.add_argument("--channel", required=True, help="channel id")
    sp.add_argument("-n", type=int, default=8, help="how many (default 8)")

    sp = add("task", cmd_task, "every message of a task, all tiers")
    sp.add_argument("task_id", help="task id")

    sp = add("get", cmd_get, "exact read of one message with its verdict",
             "Exact read by msg_id with its verdict: exit 0 FOUND_VERIFIED, 1 NOT_FOUND_CONFIRMED, "
             "2 SOURCE_CORRUPT.")
    sp.add_argument("msg_id", help="message id")

    sp = add("search", cmd_search, "messages whose content contains TEXT")
    sp.add_argument("text", help="the text to find (case-insensitive unless --case-sensitive)")
    sp.add_argument("--channel", help="only this channel")
    sp.add_argument("--limit", type=int, help="only the newest LIMIT hits")
    sp.add_argument("--case-sensitive", action="store_true", help="exact case")

    sp = add("tasks", cmd_tasks, "open tasks of a channel (* marks the active one)")
    sp.add_argument("--channel", required=True, help="channel id")
    sp.add_argument("--all", action="store_true", help="every task of the channel, finished ones too")

    sp = add("compact", cmd_compact, "fold the tail, cool old messages, erase deleted ones")
    sp.add_argument("--hot-window", type=int, help="messages kept hot per channel (default: the store's, 512)")

    add("stats", cmd_stats, "counts, sizes and recovery notes")

    add("verify", cmd_verify, "full check of every tier (exit 1 and a report on damage)",
        "Full check of every tier: line checksums, archive digests, the index snapshot against the "
        "tail, envelopes against records, the task ledger. Changes nothing. Exit 1 with a report "
        "naming the file and offset of each problem if anything is damaged.")

    sp = add("export", cmd_export, "write messages as JSON lines or Parquet")
    sp.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl", help="default jsonl")
    sp.add_argument("--out", "-o", help="output file (default stdout; required for parquet)")
    sp.add_argument("--channel", help="only this channel")

    sp = add("import", cmd_import, "import messages, a legacy checkpoint or a legacy operator.json",
             "Import FILE: JSON lines of messages, a legacy fat checkpoint (a JSON list of messages or "
             "{\"messages\": [...]}), a legacy operator.json (see the legacy formats in docs/FORMAT.md), or a Parquet export. "
             "The kind is detected from the content unless --kind is given. Ids already stored are "
             "skipped (messages without msg_id get one derived from their content), so a second import "
             "of the same file stores nothing.")
    sp.add_argument("file", help="the file to import, or - for JSON lines on stdin")
    sp.add_argument("--kind", choices=("jsonl", "checkpoint", "operator", "parquet"), help="skip detection")
    sp.add_argument("--channel", help="channel for entries that name none (operator.json default: 'default')")

    sp = add("delete", cmd_delete, "delete messages by id")
    sp.add_argument("msg_ids", nargs="+", metavar="MSG_ID")

    sp = add("bench", cmd_bench, "side-by-side comparison against SQLite (source checkout only)",
             "Run bench/compare.py: the same seeded workload against rune_fast and SQLite (WAL, same "
             "durability), with ratios. bench/ is part of the source checkout, not the installed package.")
    sp.add_argument("--quick", action="store_true", help="20,000 messages, well under a minute")
    sp.add_argument("--smoke", action="store_true",
                    help="a few hundred messages, one repeat: checks that the harness runs (numbers mean nothing)")
    sp.add_argument("--n", type=int, help="messages in the main stores (default 100,000)")
    sp.add_argument("--repeats", type=int, help="repeats per timed line (median reported)")
    sp.add_argument("--out", help="write the report as JSON to this file")
    sp.add_argument("--plot", help="write a PNG bar chart here (needs matplotlib)")

    sp = add("canary", cmd_canary, "exercise every contract promise in a fresh directory",
             "Exercise every contract method in a fresh directory (not --state), crash a writer on "
             "purpose, reopen, verify; one PASS/FAIL line per promise; exit 1 if any fails.")
    sp.add_argument("--dir", help="run in this (new or empty) directory and keep it")
    return p


def _warning_line(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    print(f"rune-fast: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Recovery notes arrive both as a warning and a log record: show the
    # warning (one line), and of the log only errors (e.g. a failed exact read).
    warnings.showwarning = _warning_line
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter("rune-fast: %(message)s"))
    logging.getLogger("rune_fast").addHandler(handler)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("rune-fast: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): not an error; silence the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (RuneError, OSError, ValueError) as exc:
        print(f"rune-fast: {_one_line(exc)}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
        text = f"{text}: {exc.filename}"
    if not isinstance(exc, RuneError):
        text = f"{type(exc).__name__}: {text}"
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())
