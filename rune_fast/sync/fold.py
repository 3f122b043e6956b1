"""Turns, canonical JSON and the fold: the ops of one conversation become
a transcript ordered by ``(hlc, op_id)``, byte-identical on every device.
"""
from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import orjson

from ..records import _copy_json
from .clock import Hlc, _as_hlc
from .ops import DEFAULT_CONVERSATION, OpRecord, Surface, _CONVERSATION, _OP_NEW, as_op


# ------------------------------------------------------------- canonical


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no whitespace, UTF-8 (the same bytes
    as ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False).encode()`` for JSON-safe data). :class:`Turn` and
    :class:`Hlc` values are written as ``Turn.to_dict()`` and ``str(hlc)``."""
    try:
        return orjson.dumps(obj, default=_json_default, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        # Integers beyond 64 bits, say: the stdlib writes them.
        try:
            return json.dumps(_plain(obj), default=_json_default, sort_keys=True,
                              separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ValueError(f"value is not canonical JSON: {e}") from None


def _plain(o: Any) -> Any:
    """``o`` with Turn, OpRecord and Hlc values written as canonical_json
    writes them (the stdlib would write the tuple subclasses as arrays)."""
    if isinstance(o, (Turn, OpRecord)):
        return _plain(o.to_dict())
    if isinstance(o, Hlc):
        return str(o)
    if isinstance(o, Mapping):
        return {k: _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    return o


def _json_default(o: Any) -> Any:
    if isinstance(o, Turn):
        return o.to_dict()
    if isinstance(o, Hlc):
        return str(o)
    if isinstance(o, OpRecord):
        return o.to_dict()
    if isinstance(o, (tuple, frozenset, set)):
        return list(o) if isinstance(o, tuple) else sorted(o)
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def transcript_hash(turns_or_messages: Iterable[Any]) -> str:
    """sha256 (hex) of the canonical JSON of a transcript: a list of
    :class:`Turn` (as ``to_dict()``) or of message dicts."""
    items = [t.to_dict() if isinstance(t, Turn) else t for t in turns_or_messages]
    return hashlib.sha256(canonical_json(items)).hexdigest()


# -------------------------------------------------------------- turns


class Role(enum.StrEnum):
    """A transcript turn's role; the value is the snake_case serialised form."""

    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


_USER, _ASSISTANT, _TOOL = Role.USER, Role.ASSISTANT, Role.TOOL

# Role spellings accepted in payloads and message dicts. None: not part of a
# transcript (system prompts are the caller's, not history).
_ROLE_OF: dict[str, Role | None] = {
    "user": _USER, "human": _USER,
    "assistant": _ASSISTANT, "ai": _ASSISTANT,
    "tool": _TOOL, "tool_result": _TOOL,
    "system": None, "developer": None,
}


#: legacy ``speaker`` names of the assistant side, besides the role names
_LEGACY_ASSISTANTS = frozenset(("bot", "agent", "model", "llm"))


def _legacy_role(speaker: Any) -> Role | None:
    """The role of a legacy ``{speaker, text, timestamp}`` turn: a role name
    in any case, an assistant-side name (bot, agent, model, llm), else a
    person's name (``"alice"``), which is a user turn."""
    name = speaker.strip().lower() if isinstance(speaker, str) else ""
    if name in _ROLE_OF:
        return _ROLE_OF[name]
    return _ASSISTANT if name in _LEGACY_ASSISTANTS else _USER


class _TurnFields(NamedTuple):
    op_id: str
    hlc: Hlc
    conversation_id: str
    role: Role
    content: str
    tool_calls: tuple[dict[str, Any], ...]
    tool_use_id: str
    timestamp: Any


class Turn(_TurnFields):
    """One folded transcript turn: ``op_id, hlc, conversation_id, role,
    content, tool_calls, tool_use_id, timestamp``.

    ``tool_calls`` is a tuple of ``{"id", "name", "arguments"}`` dicts (only
    meaningful on assistant turns); ``tool_use_id`` names the call a tool turn
    answers. Turns compare by value. A Turn built by hand is normalised as a
    folded one is: ``hlc`` given as its string becomes an :class:`Hlc`,
    ``role`` a :class:`Role`, ``tool_calls`` a tuple (``TypeError`` /
    ``ValueError`` naming the field otherwise).
    """

    __slots__ = ()

    def __new__(cls, op_id: str, hlc: Hlc | str, conversation_id: str, role: Role | str, content: str,
                tool_calls: Iterable[dict[str, Any]], tool_use_id: str, timestamp: Any) -> Turn:
        try:
            h = _as_hlc(hlc)
        except (TypeError, ValueError) as e:
            raise type(e)(f"Turn {op_id!r}: hlc: {e}") from None
        try:
            r = Role(role)
        except ValueError:
            raise ValueError(f"Turn {op_id!r}: role must be one of user, assistant, tool; "
                             f"got {role!r}") from None
        return tuple.__new__(cls, (op_id, h, conversation_id, r, content,
                                   tuple(tool_calls or ()), tool_use_id, timestamp))

    def to_message(self) -> dict[str, Any]:
        """``{"role": "user", "content"}``, ``{"role": "assistant", "content",
        "tool_calls"}`` or ``{"role": "tool_result", "tool_use_id",
        "content"}`` (fresh dicts and lists; call dicts are deep copies)."""
        r = self.role
        if r == "assistant":
            return {"role": "assistant", "content": self.content,
                    "tool_calls": [_copy_json(dict(c)) for c in self.tool_calls]}
        if r == "tool":
            return {"role": "tool_result", "tool_use_id": self.tool_use_id,
                    "content": self.content}
        return {"role": "user", "content": self.content}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict of every field (``hlc`` as its string)."""
        return {"op_id": self.op_id, "hlc": str(self.hlc),
                "conversation_id": self.conversation_id, "role": str(self.role),
                "content": self.content,
                "tool_calls": [_copy_json(dict(c)) for c in self.tool_calls],
                "tool_use_id": self.tool_use_id, "timestamp": self.timestamp}

    def to_op(self) -> OpRecord:
        """The op that folds back into this turn (a normalised payload)."""
        return OpRecord(self.op_id, self.hlc, {
            "conversation_id": self.conversation_id, "role": str(self.role),
            "content": self.content, "tool_calls": [_copy_json(dict(c)) for c in self.tool_calls],
            "tool_use_id": self.tool_use_id, "timestamp": self.timestamp})


def _TURN_KEY(t: Turn) -> tuple[int, int, str, str]:
    # A flat tuple of exact ints and strs: list.sort compares these with its
    # type-specialised fast paths (an Hlc, a tuple subclass, would not).
    h = t[1]
    return (h[0], h[1], h[2], t[0])


class _NulInDeviceId(Exception):
    pass


def _str_key(t: Turn) -> str:
    # The same order as _TURN_KEY as one str (which the garbage collector does
    # not track, unlike 100,000 live key tuples): the hlc string sorts like the
    # tuple, and "\x00" sorts below every other character, so it ends the
    # device id unambiguously unless the device id itself holds one.
    h = t[1]
    d = h[2]
    if "\x00" in d:
        raise _NulInDeviceId
    return "%015d-%010d-%s\x00%s" % (h[0], h[1], d, t[0])


def _sort_turns(turns: list[Turn]) -> None:
    """Sort in place by (hlc, op_id)."""
    try:
        turns.sort(key=_str_key)
    except _NulInDeviceId:
        turns.sort(key=_TURN_KEY)


def _norm_calls(raw: Any, where: Callable[[], str]) -> tuple[dict[str, Any], ...]:
    """Tool calls as ``{"id", "name", "arguments"}`` dicts. Also accepts the
    OpenAI shape ``{"id", "type": "function", "function": {"name",
    "arguments"}}``."""
    if not raw:
        return ()
    if type(raw) is not list and type(raw) is not tuple and (
            isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Iterable)):
        raise TypeError(f"{where()}: tool_calls must be a list of dicts, got {raw!r}")
    out = []
    for c in raw:
        if type(c) is not dict and not isinstance(c, Mapping):
            raise TypeError(f"{where()}: a tool call must be a dict, got {c!r}")
        if "name" not in c and isinstance(c.get("function"), Mapping):
            f = c["function"]
            name, args = f.get("name", ""), f.get("arguments")
        else:
            name, args = c.get("name", ""), c.get("arguments")
        cid = c.get("id", "")
        if cid is None:
            cid = ""
        if not isinstance(cid, str):
            raise TypeError(f"{where()}: tool call id must be a str, got {cid!r}")
        if name is None:
            name = ""
        if not isinstance(name, str):
            raise TypeError(f"{where()}: tool call {cid!r} name must be a str, got {name!r}")
        out.append({"id": cid, "name": name, "arguments": {} if args is None else args})
    return tuple(out)


_MISSING = object()
_BAD = object()


def _turn_from(op_id: str, hlc: Hlc, cid: str, payload: Mapping[str, Any]) -> Turn | None:
    """The turn a payload describes, or None for a system turn."""
    get = payload.get
    role_s: Any = get("role")
    if role_s is None and "speaker" in payload:
        role = _legacy_role(get("speaker"))
    else:
        try:
            role = _ROLE_OF[role_s]
        except (KeyError, TypeError):
            raise ValueError(f"op {op_id!r}: unknown role {role_s!r} (expected user, "
                             "assistant, tool or system)") from None
    if role is None:
        return None
    content = get("content", _MISSING)
    if content is _MISSING:
        content = get("text", "")
    if type(content) is not str:
        if content is None:
            content = ""
        elif isinstance(content, str):
            content = str(content)
        else:
            raise TypeError(f"op {op_id!r}: content must be a str, got "
                            f"{type(content).__name__}")
    calls: tuple[dict[str, Any], ...] = ()
    tuid = ""
    if role is _ASSISTANT:
        raw = get("tool_calls")
        if raw:
            calls = _norm_calls(raw, lambda: f"op {op_id!r}")
    elif role is _TOOL:
        tuid = get("tool_use_id") or get("tool_call_id") or ""
        if type(tuid) is not str:
            if not isinstance(tuid, str):
                raise TypeError(f"op {op_id!r}: tool_use_id must be a str, got {tuid!r}")
            tuid = str(tuid)
    ts = get("timestamp", _MISSING)
    if ts is _MISSING:
        ts = get("ts")
    return _OP_NEW(Turn, (op_id, hlc, cid, role, content, calls, tuid, ts))


def _conv_of(payload: Mapping[str, Any]) -> str:
    cid = payload.get("conversation_id")
    return cid if cid else DEFAULT_CONVERSATION


def _wins(new: OpRecord, old: OpRecord) -> bool:
    """Duplicate op_id with different versions: the smaller (hlc, canonical
    payload) wins, so every device picks the same one."""
    if new.hlc != old.hlc:
        return new.hlc < old.hlc
    if new.payload is old.payload:
        return False
    # (the bytes, not ==: payloads equal as Python values can still spell
    # apart, 1 and 1.0 or True, and the winner must not depend on arrival)
    return canonical_json(new.payload) < canonical_json(old.payload)


def _winners(ops: Iterable[Any]) -> tuple[dict[str, OpRecord], set[str]]:
    """Deduplicated conversation-surface ops by op_id, and deleted op_ids."""
    best: dict[str, OpRecord] = {}
    deleted: set[str] = set()
    conv = Surface.CONVERSATION
    for x in ops:
        op = x if type(x) is OpRecord else as_op(x)
        if op.surface is not conv:
            continue
        op_id = op.op_id
        if op.payload.get("deleted") is True:
            deleted.add(op_id)
            continue
        prev = best.get(op_id)
        if prev is None or (prev is not op and _wins(op, prev)):
            best[op_id] = op
    return best, deleted


def fold(ops: Iterable[Any], conversation_id: str = DEFAULT_CONVERSATION) -> list[Turn]:
    """The transcript of ``conversation_id``: its conversation-surface ops,
    deduplicated by ``op_id``, minus deleted ones, without system turns,
    ordered by ``(hlc, op_id)``.

    The result depends only on the *set* of ops, never on delivery order or
    repetition: a resent op counts once, two ops with identical payloads but
    distinct ids are two turns, a tombstone removes the op it names whenever
    it arrives (delete wins), and two versions of one ``op_id`` resolve to the
    one with the smaller ``(hlc, canonical payload)``. Ops whose payload has no
    ``conversation_id`` belong to :data:`DEFAULT_CONVERSATION`; legacy
    ``speaker``/``text`` keys stand for ``role``/``content``; an empty or
    ``None`` ``conversation_id`` argument means the default conversation too.

    Raises ``ValueError``/``TypeError`` naming the op for a malformed op or a
    kept payload with an unknown role or non-str content.
    """
    if not conversation_id:
        conversation_id = DEFAULT_CONVERSATION
    # One pass: deduplicate (the conflict rule of _wins) and build the turn of
    # each current winner, so every payload is read once.
    best: dict[str, OpRecord] = {}
    turn_of: dict[str, Any] = {}
    deleted: set[str] = set()
    conv = _CONVERSATION
    default = DEFAULT_CONVERSATION
    saw_bad = False
    for x in ops:
        op = x if type(x) is OpRecord else as_op(x)
        if op.surface is not conv:
            continue
        op_id = op.op_id
        payload = op.payload
        if payload.get("deleted") is True:
            deleted.add(op_id)
            continue
        prev = best.get(op_id)
        if prev is not None and (prev is op or not _wins(op, prev)):
            continue
        best[op_id] = op
        cid = payload.get("conversation_id") or default
        if cid != conversation_id:
            turn_of[op_id] = None
            continue
        try:
            turn_of[op_id] = _turn_from(op_id, op.hlc, cid, payload)
        except (TypeError, ValueError):
            turn_of[op_id] = _BAD  # raised below, only if this version wins
            saw_bad = True
    if deleted:
        for op_id in deleted:
            turn_of.pop(op_id, None)
    if saw_bad:
        bad = [k for k, t in turn_of.items() if t is _BAD]
        if bad:
            k = min(bad)
            op = best[k]
            _turn_from(k, op.hlc, op.payload.get("conversation_id") or default, op.payload)
    turns = [t for t in turn_of.values() if t is not None]
    _sort_turns(turns)
    return turns
