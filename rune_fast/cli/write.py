"""The writing subcommands: append, compact, delete, import, export.

``export`` only reads, but it moves messages out as ``import`` moves them in,
so the two live together with the input checks they share."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Iterable, Iterator

from .._fmt import Progress, kv_table, print_json
from ._common import InputError, open_reader, open_writer, state_dir

Add = Callable[..., argparse.ArgumentParser]
BATCH = 1000


def register(add: Add) -> None:
    sp = add("append", cmd_append, "store messages (from arguments, or JSON lines on stdin)",
             "Store one message from --channel/--role/--content [--task], or JSON lines of messages "
             "on stdin (each a message dict; --channel/--role/--task fill in missing fields). "
             "A msg_id already stored is skipped.")
    sp.add_argument("--channel", help="channel id")
    sp.add_argument("--role", choices=("user", "assistant", "system", "tool"), help="role (default user)")
    sp.add_argument("--content", help="message text; without it, JSON lines are read from stdin")
    sp.add_argument("--task", help="task id the message belongs to")
    sp.add_argument("--msg-id", help="use this msg_id instead of a new one")

    sp = add("compact", cmd_compact, "fold the tail, cool old messages, erase deleted ones")
    sp.add_argument("--hot-window", type=int, help="messages kept hot per channel (default: the store's, 512)")

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


def cmd_append(args: argparse.Namespace) -> int:
    """Store messages given as arguments, or as JSON lines on stdin."""
    from ..records import ConversationMessageRecord

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
    with open_writer(args) as repo:
        new, total = _store_batches(repo, records)
    if args.json:
        print_json({"stored": new, "duplicates": total - new, "msg_ids": [r.msg_id for r in records]})
    else:
        if len(records) == 1:
            print(f"{'stored' if new else 'already stored'} {records[0].msg_id}")
        else:
            print(f"stored {new:,} new messages ({total - new:,} already stored)")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """Fold the tail into the hot checkpoint, cool old messages, erase deleted ones."""
    options: dict[str, Any] = {}
    if args.hot_window is not None:
        options["hot_window"] = args.hot_window
    with open_writer(args, **options) as repo:
        report = repo.compact()
    d = report.to_dict() if hasattr(report, "to_dict") else dict(report)
    if args.json:
        print_json(d)
    else:
        print(kv_table(d.items()))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete messages by id (reads stop returning them at once; the next
    compact erases their bytes)."""
    with open_writer(args) as repo:
        done = {mid: repo.delete(mid) for mid in args.msg_ids}
    if args.json:
        print_json({"deleted": [m for m, ok in done.items() if ok], "not_found": [m for m, ok in done.items() if not ok]})
    else:
        for mid, ok in done.items():
            print(f"{'deleted' if ok else 'not found'} {mid}")
    return 0 if all(done.values()) else 1


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
    from ..records import ConversationMessageRecord

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
#: rows of a row group of ``export --format parquet``
EXPORT_GROUP_ROWS = 16384


def cmd_export(args: argparse.Namespace) -> int:
    """Write every message (or a channel's), oldest first per channel, as JSON
    lines (to stdout or --out) or as one Parquet file (--format parquet --out FILE)."""
    if args.format == "parquet" and not args.out:
        raise InputError("export --format parquet needs --out FILE")
    with open_reader(args) as repo, Progress("export") as bar:
        if args.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pa.schema([("msg_id", pa.string()), ("channel_id", pa.string()), ("task_id", pa.string()),
                                ("hlc", pa.string()), ("content", pa.string()), ("ts", pa.float64()),
                                ("role", pa.string()), ("token_estimate", pa.int64()),
                                ("tool_calls", pa.string()), ("tool_call_id", pa.string()),
                                ("origin", pa.string()), ("schema_version", pa.int64())])
            # written a row group of EXPORT_GROUP_ROWS at a time: what the
            # export holds is one group's values and one channel's records,
            # not the store (every value of 1,000,000 messages was ~2 GB)
            cols: dict[str, list[Any]] = {c: [] for c in PARQUET_COLUMNS}
            count = 0
            with pq.ParquetWriter(args.out, schema) as writer:
                for rec in _all_messages(repo, args.channel, bar):
                    d = rec.to_dict()
                    d["tool_calls"] = json.dumps(d["tool_calls"], ensure_ascii=False, sort_keys=True)
                    for c in PARQUET_COLUMNS:
                        cols[c].append(d.get(c))
                    count += 1
                    if len(cols["msg_id"]) == EXPORT_GROUP_ROWS:
                        writer.write_table(pa.table(cols, schema=schema))
                        cols = {c: [] for c in PARQUET_COLUMNS}
                if cols["msg_id"] or count == 0:        # (an empty store: a file with the schema)
                    writer.write_table(pa.table(cols, schema=schema))
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
            print_json({"exported": count, "file": args.out, "format": args.format})
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
    with open_writer(args) as repo, Progress("import", size) as bar:
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
        from ..composition import build_conversation_state
        from ..operator import migrate_operator_tasks

        with build_conversation_state({"state": state_dir(args)}) as root, Progress("import") as bar:
            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done)

            report = migrate_operator_tasks(path, root.get("task_state"), root.get("conversation_state"),
                                            default_channel=args.channel or "default",
                                            progress=progress)
        result = {"kind": "operator", **report.to_dict()}
        if args.json:
            print_json(result)
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
        print_json(result)
    else:
        print(f"imported {result['messages_imported']:,} messages from {path} ({kind}; "
              f"{result['messages_already_present']:,} already present)")
    return 0
