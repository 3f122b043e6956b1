"""Text output shared by the command line, the demo and the canary: a
progress bar on stderr, aligned tables, key/value lists, message rows and JSON
on stdout. No store is opened here; nothing here imports the rest of rune_fast."""
from __future__ import annotations

import datetime as _dt
import json
import shutil
import sys
import time
from typing import Any, Iterable, Sequence

__all__ = ["Progress", "format_table", "kv_table", "render_value", "print_records", "print_json", "fmt_time",
           "term_width", "content_of", "indent"]

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
# tables and values


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


def fmt_time(ts: float) -> str:
    try:
        return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(ts)


def term_width() -> int | None:
    """The terminal width when stdout is a terminal; None (no cutting) when piped."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size((140, 24)).columns


def content_of(rec: Any) -> str:
    text = rec.content
    if rec.tool_calls:
        calls = ", ".join(f"{c.get('name')}({json.dumps(c.get('arguments'), ensure_ascii=False)})"
                          for c in rec.tool_calls)
        text = (text + " " if text else "") + f"[tool_calls: {calls}]"
    if rec.tool_call_id:
        text = f"[result of {rec.tool_call_id}] " + text
    return text


def print_records(records: Sequence[Any], *, show_channel: bool = False, tiers: Sequence[str] | None = None) -> None:
    headers = ["time", "role"]
    if show_channel:
        headers.append("channel")
    headers += ["task", "msg_id"]
    if tiers is not None:
        headers.append("tier")
    headers.append("content")
    rows = []
    for i, r in enumerate(records):
        row = [fmt_time(r.ts), r.role]
        if show_channel:
            row.append(r.channel_id)
        row += [r.task_id or "-", r.msg_id]
        if tiers is not None:
            row.append(tiers[i])
        row.append(content_of(r))
        rows.append(row)
    print(format_table(headers, rows, max_width=term_width(), flex=len(headers) - 1))


def print_json(obj: Any) -> None:
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


def kv_table(pairs: Iterable[tuple[str, Any]]) -> str:
    rows = [(k, render_value(v)) for k, v in pairs]
    w = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)


def render_value(v: Any) -> str:
    if v == "" or v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        if not v:
            return "none"
        return "; ".join(render_value(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={render_value(x)}" for k, x in v.items()) or "none"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.3f}"
    return str(v)


def indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
