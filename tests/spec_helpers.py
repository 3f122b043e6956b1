"""Helpers for the black-box suite written from ../shared/SPEC.md.

Only the public API and the on-disk promises of SPEC.md are used here; where the
SPEC leaves a shape open (the form of an envelope, of ``stats()`` or of a
``verify()`` report) the helpers look for it generously and say so.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Iterable

from rune_fast.records import ConversationMessageRecord, TaskStateRecord


def msg(content: str = "hello", channel_id: str = "ch", role: str = "user", **kw: Any) -> ConversationMessageRecord:
    return ConversationMessageRecord(role=role, content=content, channel_id=channel_id, **kw)


def task(title: str = "t", channel_id: str = "ch", **kw: Any) -> TaskStateRecord:
    return TaskStateRecord(title=title, channel_id=channel_id, **kw)


def canonical_hash(body: dict) -> str:
    """SPEC section 5: sha256 of the canonical JSON of the record body."""
    data = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def _walk_values(obj: Any) -> Iterable[Any]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _walk_values(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk_values(v)
    else:
        yield obj


def _find_key(obj: Any, key: str) -> list[Any]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                out.append(v)
            out.extend(_find_key(v, key))
    elif isinstance(obj, list):
        for v in obj:
            out.extend(_find_key(v, key))
    return out


def read_envelopes(path: Path) -> list[dict]:
    """Every complete JSON line of an event store (each envelope is one line)."""
    if not Path(path).exists():
        return []
    out = []
    for line in Path(path).read_bytes().split(b"\n"):
        line = line.strip(b"\x00").strip()
        if not line:
            continue
        out.append(json.loads(line))
    return out


ENVELOPE_TYPES = {
    "task_state.created", "task_state.amended", "task_state.transition", "task_state.imported",
    "conversation.message", "conversation.deleted",
}


def envelope_type(env: dict) -> str | None:
    # ASSUMPTION: the envelope's type string ("conversation.message", ...) appears
    # as a value somewhere in the envelope line (the key name is not specified).
    found = [v for v in _walk_values(env) if isinstance(v, str) and v in ENVELOPE_TYPES]
    return found[0] if found else None


def envelope_hash(env: dict) -> str | None:
    vals = [v for v in _find_key(env, "payload_hash") if isinstance(v, str)]
    if not vals:
        return None
    v = vals[0]
    # ASSUMPTION: the hash is the hex digest, possibly written as "sha256:<hex>".
    if v.startswith("sha256:"):
        v = v[len("sha256:"):]
    return v.lower()


def envelopes_of(path: Path, typ: str) -> list[dict]:
    return [e for e in read_envelopes(path) if envelope_type(e) == typ]


def hashes_of(path: Path, typ: str) -> list[str]:
    return [envelope_hash(e) for e in envelopes_of(path, typ)]


def tree_snapshot(root: Path) -> dict:
    """Every path under root with its kind, mode, size, mtime and bytes."""
    snap = {}
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISREG(st.st_mode):
                snap[rel] = ("f", st.st_mode, st.st_size, st.st_mtime_ns, p.read_bytes())
            else:
                snap[rel] = ("d", st.st_mode, st.st_mtime_ns)
    return snap


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.is_file())


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in all_files(root) if needle in p.read_bytes()]


def message_line_files(state_dir: Path, needle: bytes) -> list[Path]:
    """The line files (*.jsonl under hot/) whose bytes hold ``needle``."""
    hot = Path(state_dir) / "hot"
    found = [p for p in sorted(hot.rglob("*.jsonl")) if needle in p.read_bytes()]
    if not found:  # the tail may use another extension
        found = [p for p in sorted(hot.rglob("*")) if p.is_file() and "conversation_cool" not in p.parts
                 and needle in p.read_bytes()]
    return found


def lookup(obj: Any, fragment: str) -> list[Any]:
    """Values of every key (in a mapping, or attribute of an object) whose name
    contains ``fragment`` (case-insensitive), searched recursively."""
    out = []
    fragment = fragment.lower()
    if isinstance(obj, dict):
        items = list(obj.items())
    elif hasattr(obj, "to_dict") and callable(obj.to_dict):
        try:
            items = list(obj.to_dict().items())
        except Exception:  # noqa: BLE001 - only a probe of an unspecified shape
            items = []
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).items())
    else:
        items = []
    for k, v in items:
        if isinstance(k, str) and fragment in k.lower():
            out.append(v)
        if isinstance(v, (dict, list)) or hasattr(v, "__dict__"):
            if isinstance(v, list):
                for x in v:
                    out.extend(lookup(x, fragment))
            else:
                out.extend(lookup(v, fragment))
    return out


def truthy_any(values: list[Any]) -> bool:
    return any(bool(v) for v in values)


def verify_problems(report: Any) -> list[Any]:
    """The problems of a verify() report.

    ASSUMPTION: the report is a mapping or object with a ``problems`` (or
    ``errors``/``issues``) collection, or is itself a list of problems.
    """
    if isinstance(report, (list, tuple)):
        return list(report)
    for name in ("problems", "errors", "issues"):
        if isinstance(report, dict) and name in report:
            return list(report[name])
        if hasattr(report, name):
            return list(getattr(report, name))
        try:
            return list(report[name])
        except (KeyError, TypeError, IndexError):
            pass
    raise AssertionError(f"cannot find the problems of verify() report {report!r}")


def verify_ok(report: Any) -> bool:
    return len(verify_problems(report)) == 0


def problems_text(report: Any) -> str:
    parts = []
    for p in verify_problems(report):
        parts.append(str(p))
        parts.append(repr(p))
        if isinstance(p, dict):
            parts.append(json.dumps(p, default=str))
        elif hasattr(p, "__dict__"):
            parts.append(repr(vars(p)))
    return "\n".join(parts)
