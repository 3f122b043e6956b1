"""Records: small immutable value objects, their ids, statuses and dict form.

Everything a repository stores is one of these records. A record checks its
fields when it is built (a bad one never exists), compares by value, and turns
into a plain JSON-safe dict with :meth:`to_dict` and back with
:meth:`from_dict`: ``R.from_dict(r.to_dict()) == r`` for every record.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from ._encode import MISSING, ReadOnlyDict, ReadOnlyList, json_safe, message_init, message_init_setup, read_only_calls

__all__ = [
    "new_id",
    "OrchestrationRecord",
    "TaskStateRecord",
    "ConversationMessageRecord",
    "TASK_STATUSES",
    "TERMINAL_STATUSES",
    "OPEN_STATUSES",
    "ROLES",
    "TASK_TRANSITIONS",
    "canonical_json",
    "record_canonical_json",
    "payload_hash",
]

# --------------------------------------------------------------------------- ids

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RAND_BITS = 80
_RAND_LIMIT = 1 << _RAND_BITS


class _MonotonicUlid:
    """ULID-like 128-bit values (48-bit ms time + 80 random bits), strictly
    increasing within the process.

    This is the one piece of process-wide mutable state in this module, and it
    has to be: ids must sort as text in creation order across every caller and
    every prefix, so all callers draw from one generator under one lock. Within
    one millisecond the random part is incremented instead of redrawn; if the
    clock goes backwards the last time is kept.
    """

    __slots__ = ("_lock", "_last_ms", "_last_rand")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0

    def reseed(self) -> None:
        """Forget the last value's random part (called in a forked child so
        parent and child never continue the same sequence)."""
        self._lock = threading.Lock()
        self._last_rand = int.from_bytes(os.urandom(10), "big") >> 1

    def next(self) -> int:
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            if now_ms > self._last_ms:
                ms = now_ms
                # top bit clear leaves room to increment many times within one ms
                rand = int.from_bytes(os.urandom(10), "big") >> 1
            else:
                ms = self._last_ms
                rand = self._last_rand + 1
                if rand >= _RAND_LIMIT:  # 2**79 ids in one ms: borrow the next ms
                    ms += 1
                    rand = int.from_bytes(os.urandom(10), "big") >> 1
            self._last_ms = ms
            self._last_rand = rand
        return (ms << _RAND_BITS) | rand


_ULID = _MonotonicUlid()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ULID.reseed)


_PAIRS = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)  # 10 bits -> 2 chars


def _encode_base32(value: int) -> str:
    """26 Crockford base32 characters of a 128-bit value (most significant first)."""
    p = _PAIRS
    return "".join([
        p[(value >> 120) & 1023], p[(value >> 110) & 1023], p[(value >> 100) & 1023],
        p[(value >> 90) & 1023], p[(value >> 80) & 1023], p[(value >> 70) & 1023],
        p[(value >> 60) & 1023], p[(value >> 50) & 1023], p[(value >> 40) & 1023],
        p[(value >> 30) & 1023], p[(value >> 20) & 1023], p[(value >> 10) & 1023],
        p[value & 1023],
    ])


def new_id(prefix: str) -> str:
    """Return ``prefix + "_" + 26`` Crockford base32 characters.

    The 26 characters encode 48 bits of milliseconds and 80 bits that are random
    for the first id of a millisecond and incremented after it, so ids made in
    one process are unique and sort as text in creation order, across prefixes
    too (compare the part after the prefix). Raises ``TypeError`` if ``prefix``
    is not a str, ``ValueError`` if it is empty or not valid UTF-8.
    """
    if not isinstance(prefix, str):
        raise TypeError(f"new_id: prefix must be str, got {type(prefix).__name__}")
    if not prefix:
        raise ValueError("new_id: prefix must be a non-empty str")
    _check_utf8("prefix", prefix)
    return prefix + "_" + _encode_base32(_ULID.next())


# ------------------------------------------------------------------ vocabulary

TASK_STATUSES: tuple[str, ...] = (
    "created",
    "running",
    "awaiting_approval",
    "completed",
    "failed",
    "cancelled",
    "superseded",
)
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "superseded"})
OPEN_STATUSES: frozenset[str] = frozenset(TASK_STATUSES) - TERMINAL_STATUSES
ROLES: tuple[str, ...] = ("user", "assistant", "system", "tool")

TASK_TRANSITIONS: dict[str, frozenset[str]] = {
    "created": frozenset({"running", "cancelled", "superseded"}),
    "running": frozenset({"awaiting_approval", "completed", "failed", "cancelled", "superseded"}),
    "awaiting_approval": frozenset({"running", "completed", "failed", "cancelled", "superseded"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
    "superseded": frozenset(),
}

_ROLE_SET = frozenset(ROLES)
_STATUS_SET = frozenset(TASK_STATUSES)

# ------------------------------------------------------------------ validation


def _check_utf8(field: str, value: str) -> None:
    """Refuse strings that cannot be encoded as UTF-8 (lone surrogates)."""
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{field}: not valid UTF-8 (lone surrogate at index {exc.start})"
        ) from None


def _check_str(owner: str, field: str, value: Any, *, nonempty: bool = False) -> None:
    if type(value) is not str:
        if not isinstance(value, str):
            raise TypeError(f"{owner}.{field} must be str, got {type(value).__name__}")
    if nonempty and not value:
        raise ValueError(f"{owner}.{field} must be a non-empty str")
    _check_utf8(f"{owner}.{field}", value)


def _check_time(owner: str, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}.{field} must be a float (epoch seconds), got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{owner}.{field} must be finite, got an int too large for a float") from None
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{field} must be finite, got {value!r}")
    return value


def _json_value(field: str, value: Any) -> Any:
    """Return a detached copy of a JSON value (tuples become lists), or raise
    ``TypeError``/``ValueError`` naming ``field`` for anything JSON cannot hold
    exactly (non-str keys, NaN, sets, objects, lone surrogates)."""
    if value is None or value is True or value is False:
        return value
    tp = type(value)
    if tp is str:
        _check_utf8(field, value)
        return value
    if tp is int:
        return value
    if tp is float:
        if not math.isfinite(value):
            raise ValueError(f"{field}: non-finite number {value!r} is not JSON")
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise TypeError(f"{field}: JSON object keys must be str, got {type(k).__name__}")
            _check_utf8(f"{field} key", k)
            out[k] = _json_value(f"{field}.{k}", v)
        return out
    if isinstance(value, (list, tuple)):
        return [_json_value(f"{field}[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, str):
        return _json_value(field, str(value))
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _json_value(field, float(value))
    raise TypeError(f"{field}: {type(value).__name__} is not a JSON value")


def _norm_tool_calls(owner: str, value: Any) -> tuple[dict[str, Any], ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{owner}.tool_calls must be a tuple or list of dicts, got {type(value).__name__}"
        )
    calls = []
    for i, call in enumerate(value):
        where = f"{owner}.tool_calls[{i}]"
        if not isinstance(call, Mapping):
            raise TypeError(f"{where} must be a dict with id, name, arguments; got {type(call).__name__}")
        for key in ("id", "name", "arguments"):
            if key not in call:
                raise ValueError(f"{where} is missing the key {key!r}")
        _check_str(where, "id", call["id"])
        _check_str(where, "name", call["name"])
        calls.append(_json_value(where, call))
    return tuple(calls)


def check_tool_calls(record: "ConversationMessageRecord") -> tuple[dict[str, Any], ...]:
    """Check a record's tool calls again before they are stored, and return
    them as they are to be stored: the record is frozen, but the dicts
    inside ``tool_calls`` are plain dicts that a caller may have edited since
    the constructor checked them. A value it would refuse raises
    ``TypeError``/``ValueError`` naming the message and the field (else it
    would be written, and every later open would refuse the store as
    damaged); one it would take as another type (a tuple, a Mapping) is
    returned as the constructor stores it (a list, a dict). The common case
    -- plain dicts of plain JSON values that orjson encodes -- is one
    compiled walk and one encode, and returns the record's own calls; the
    field-by-field check names what is wrong."""
    calls = record.tool_calls
    if _plain_calls(calls):
        try:
            orjson.dumps(calls)         # refuses lone surrogates
            return calls
        except orjson.JSONEncodeError:
            pass
    return _norm_tool_calls(f"message {record.msg_id!r}: ConversationMessageRecord", calls)


def _plain_calls(calls: Iterable[Any]) -> bool:
    """Whether tool calls are stored as they are: plain dicts with str ids
    and names, of values orjson spells as json does (a lone surrogate or an
    int past 64 bits is still for orjson.dumps to refuse)."""
    calls = list(calls)
    return _stored_calls_ok(calls) and json_safe(calls)


def _copy_json(value: Any) -> Any:
    """A detached copy of an already validated JSON value (for to_dict):
    plain dicts and lists, read-only ones (a record read from the store)
    copied as plain ones."""
    tp = type(value)
    if tp is dict or tp is ReadOnlyDict:
        return {k: _copy_json(v) for k, v in value.items()}
    if tp is list or tp is ReadOnlyList:
        return [_copy_json(v) for v in value]
    return value


# ----------------------------------------------------------------- canonical form


def canonical_json(d: Mapping[str, Any]) -> bytes:
    """The canonical bytes of a JSON-safe dict: sorted keys, no spaces, UTF-8
    (``json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``)."""
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def json_safe_py(v: Any) -> bool:
    """True if orjson spells ``v`` exactly as json.dumps does: plain str,
    int, bool, None, lists and str-keyed dicts of them, and floats that
    both write without an exponent (shortest round-trip digits). The model
    of the compiled :func:`json_safe` (which also refuses nesting past 256
    levels: json, the fallback, then judges the value)."""
    t = type(v)
    if t is str or t is int or t is bool or v is None:
        return True
    if t is float:
        return v == 0.0 or 1e-4 <= abs(v) < 1e16
    if t is list or t is ReadOnlyList:
        return all(json_safe_py(x) for x in v)
    if t is dict or t is ReadOnlyDict:
        return all(type(k) is str and json_safe_py(x) for k, x in v.items())
    return False


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fast_canonical_json(value: Any) -> bytes:
    """:func:`canonical_json` of any JSON value: by orjson (several times
    faster) when it spells the value exactly as json does (:func:`json_safe`),
    else by json, which also names what cannot be encoded."""
    if json_safe(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass    # lone surrogates: json names the problem
    return _CANONICAL.encode(value).encode("utf-8")


def _orjson_float_ok(v: float) -> bool:
    # In this range orjson prints floats exactly as repr() does (shortest
    # round-trip digits, no exponent); outside it the exponent forms differ.
    return v == 0.0 or 1e-4 <= abs(v) < 1e16


def message_canonical_json(record: "ConversationMessageRecord", d: dict) -> bytes:
    """:func:`record_canonical_json` of a message whose ``to_dict()`` is ``d``."""
    if not record.tool_calls and _orjson_float_ok(record.ts) and record.token_estimate < 1 << 63:
        return orjson.dumps(d, option=orjson.OPT_SORT_KEYS)
    return canonical_json(d)


def record_canonical_json(record: "OrchestrationRecord") -> bytes:
    """``canonical_json(record.to_dict())``, computed with orjson when the
    record holds only values both encoders print identically (the common
    case: no tool calls, epoch-range times, checked by field; otherwise
    :func:`fast_canonical_json` judges the whole value)."""
    if type(record) is ConversationMessageRecord:
        if not record.tool_calls and _orjson_float_ok(record.ts) and record.token_estimate < 1 << 63:
            return orjson.dumps(record.to_dict(), option=orjson.OPT_SORT_KEYS)
    elif type(record) is TaskStateRecord:
        if _orjson_float_ok(record.created_at) and _orjson_float_ok(record.updated_at):
            return orjson.dumps(record.to_dict(), option=orjson.OPT_SORT_KEYS)
    return fast_canonical_json(record.to_dict())


def payload_hash(record: "OrchestrationRecord | Mapping[str, Any]") -> str:
    """sha256 hex of the canonical JSON (:func:`canonical_json`) of
    ``record.to_dict()``, or of the mapping itself (e.g. ``{"msg_id": ...}``
    for a deletion)."""
    if isinstance(record, OrchestrationRecord):
        return hashlib.sha256(record_canonical_json(record)).hexdigest()
    return hashlib.sha256(fast_canonical_json(record)).hexdigest()


# ----------------------------------------------------------------------- records


def _schema_version(cls: type[OrchestrationRecord], d: Mapping[str, Any]) -> None:
    version = d.get("schema_version", cls.SCHEMA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"{cls.__name__}.from_dict: schema_version must be int, got {version!r}")
    if version > cls.SCHEMA_VERSION:
        raise ValueError(
            f"{cls.__name__}.from_dict: schema_version {version} is newer than "
            f"the known version {cls.SCHEMA_VERSION}"
        )
    if version < 1:
        raise ValueError(f"{cls.__name__}.from_dict: schema_version {version} is not valid")


@dataclasses.dataclass(frozen=True, slots=True)
class OrchestrationRecord:
    """Base of every record: immutable, compared by value, hashable by id,
    JSON round-trippable. Subclasses define ``SCHEMA_VERSION``, ``to_dict`` and
    ``from_dict``."""

    SCHEMA_VERSION: ClassVar[int] = 1

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise TypeError(f"{type(self).__name__}.to_dict: OrchestrationRecord is abstract; "
                        "use TaskStateRecord or ConversationMessageRecord")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OrchestrationRecord":  # pragma: no cover
        raise TypeError(f"{cls.__name__}.from_dict: OrchestrationRecord is abstract; "
                        "use TaskStateRecord or ConversationMessageRecord")


@dataclasses.dataclass(frozen=True, slots=True)
class TaskStateRecord(OrchestrationRecord):
    """One task of the ledger.

    ``status`` is one of :data:`TASK_STATUSES`; ``channel_id`` is non-empty;
    ``created_at``/``updated_at`` are float epoch seconds (default: now, the
    same instant for both). Bad fields raise ``TypeError``/``ValueError`` naming
    the field.
    """

    SCHEMA_VERSION: ClassVar[int] = 1

    task_id: str = dataclasses.field(default_factory=lambda: new_id("task"))
    title: str = ""
    status: str = "created"
    channel_id: str = ""
    parent_task_id: str = ""
    assigned_model: str = ""
    created_at: float = None  # type: ignore[assignment]  # None -> now
    updated_at: float = None  # type: ignore[assignment]  # None -> created_at
    outcome_ref: str = ""

    def __post_init__(self) -> None:
        owner = "TaskStateRecord"
        _check_str(owner, "task_id", self.task_id, nonempty=True)
        _check_str(owner, "title", self.title)
        _check_str(owner, "status", self.status)
        if self.status not in _STATUS_SET:
            raise ValueError(f"{owner}.status: unknown status {self.status!r} (one of {', '.join(TASK_STATUSES)})")
        _check_str(owner, "channel_id", self.channel_id, nonempty=True)
        _check_str(owner, "parent_task_id", self.parent_task_id)
        _check_str(owner, "assigned_model", self.assigned_model)
        _check_str(owner, "outcome_ref", self.outcome_ref)
        created = time.time() if self.created_at is None else _check_time(owner, "created_at", self.created_at)
        updated = created if self.updated_at is None else _check_time(owner, "updated_at", self.updated_at)
        object.__setattr__(self, "created_at", created)
        object.__setattr__(self, "updated_at", updated)

    def __hash__(self) -> int:
        # Equal records have equal ids, so hashing the id is consistent with
        # value equality.
        return hash(("task", self.task_id))

    @property
    def is_terminal(self) -> bool:
        """True for completed, failed, cancelled and superseded tasks."""
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict of every field plus ``schema_version``."""
        return {
            "task_id": self.task_id,
            "title": self.title,
            "status": self.status,
            "channel_id": self.channel_id,
            "parent_task_id": self.parent_task_id,
            "assigned_model": self.assigned_model,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "outcome_ref": self.outcome_ref,
            "schema_version": self.SCHEMA_VERSION,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TaskStateRecord":
        """Build from a dict made by :meth:`to_dict` (or an older/sparser one:
        missing optional fields get their defaults; unknown keys are ignored).
        ``ValueError`` for a ``schema_version`` newer than :attr:`SCHEMA_VERSION`."""
        if not isinstance(d, Mapping):
            raise TypeError(f"TaskStateRecord.from_dict: expected a dict, got {type(d).__name__}")
        _schema_version(cls, d)
        kwargs = {f: d[f] for f in _TASK_FIELDS if f in d}
        return cls(**kwargs)


_TASK_FIELDS = tuple(f.name for f in dataclasses.fields(TaskStateRecord))


#: a left-out ``msg_id`` or ``ts`` of the message constructor (shown as <default>)
_MISSING: Any = MISSING


def _utf8_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _checked_message(msg_id: Any, ts: Any, role: Any, content: Any, channel_id: Any, task_id: Any,
                     token_estimate: Any, tool_calls: Any, tool_call_id: Any, origin: Any,
                     hlc: Any) -> tuple[Any, ...]:
    """Validate every field of a message the slow way; return them normalised
    or raise ``TypeError``/``ValueError`` naming the first bad field."""
    owner = "ConversationMessageRecord"
    _check_str(owner, "msg_id", msg_id, nonempty=True)
    ts = _check_time(owner, "ts", ts)
    if not isinstance(role, str):
        raise TypeError(f"{owner}.role must be str, got {type(role).__name__}")
    if role not in _ROLE_SET:
        raise ValueError(f"{owner}.role: unknown role {role!r} (one of {', '.join(ROLES)})")
    if not isinstance(content, str):
        raise TypeError(f"{owner}.content must be str, got {type(content).__name__}")
    _check_utf8(f"{owner}.content", content)
    _check_str(owner, "channel_id", channel_id, nonempty=True)
    _check_str(owner, "task_id", task_id)
    if token_estimate is None:
        token_estimate = -(-len(content) // 4)
    elif isinstance(token_estimate, bool) or not isinstance(token_estimate, int):
        raise TypeError(f"{owner}.token_estimate must be int, got {type(token_estimate).__name__}")
    token_estimate = int(token_estimate)
    if token_estimate < 0:
        raise ValueError(f"{owner}.token_estimate must be >= 0, got {token_estimate}")
    tool_calls = _norm_tool_calls(owner, tool_calls)
    _check_str(owner, "tool_call_id", tool_call_id)
    _check_str(owner, "origin", origin)
    _check_str(owner, "hlc", hlc)
    return (msg_id, ts, role, content, channel_id, task_id, token_estimate, tool_calls,
            tool_call_id, origin, hlc)


def check_message_fields(record: Any) -> None:
    """Check every field of a message record as its constructor would, for
    the write path: a caller can set a field of the frozen record with
    ``object.__setattr__``, and a line the store could not read back must
    never be written. ``TypeError``/``ValueError`` naming the field."""
    ts, tok = record.ts, record.token_estimate
    if type(ts) is not float:
        raise TypeError(f"ConversationMessageRecord.ts must be float, got {type(ts).__name__}")
    if tok is None:
        raise TypeError("ConversationMessageRecord.token_estimate must be int, got NoneType")
    _checked_message(record.msg_id, ts, record.role, record.content, record.channel_id, record.task_id,
                     tok, record.tool_calls, record.tool_call_id, record.origin, record.hlc)


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class ConversationMessageRecord(OrchestrationRecord):
    """One message of a conversation.

    ``role`` is one of :data:`ROLES`, ``content`` a str, ``channel_id`` a
    non-empty str; ``token_estimate`` defaults to ``ceil(len(content)/4)``;
    ``tool_calls`` is a tuple of dicts each holding at least ``id`` (str),
    ``name`` (str) and ``arguments`` (any JSON value, kept as given; a list or
    tuple of calls is accepted and stored as a tuple). Bad fields raise
    ``TypeError``/``ValueError`` naming the field.
    """

    SCHEMA_VERSION: ClassVar[int] = 1

    msg_id: str = dataclasses.field(default_factory=lambda: new_id("msg"))
    ts: float = dataclasses.field(default_factory=time.time)
    role: str = "user"
    content: str = ""
    channel_id: str = ""
    task_id: str = ""
    token_estimate: int = None  # type: ignore[assignment]  # None -> ceil(len(content)/4)
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str = ""
    origin: str = ""
    hlc: str = ""

    # The constructor is compiled (csrc/_encode.pyx, message_init; the class
    # is declared with init=False): it runs on every record a caller builds,
    # so the common case -- exact str fields that encode as UTF-8, a finite
    # float time, a known role, tool calls of plain JSON values -- is checked
    # and stored in C, and anything else goes through _checked_message,
    # which normalises it or names the bad field. message_init_setup also
    # puts the compiled constructor in the type's tp_init slot, so that
    # R(**d) skips slot_tp_init's lookup and its kwargs unpacking. Measured
    # on the bench's workload (17% with tool calls, 65% non-ASCII), CPU time
    # a record: 3.8 us with a Python __init__ using object.__setattr__, 2.9
    # us with the slots' own setters, 0.92 us compiled through slot_tp_init,
    # 0.71 us through tp_init (a third of it the dict copy **d makes and
    # the content's scan for lone surrogates, mostly a wait for memory).
    if TYPE_CHECKING:
        def __init__(self, msg_id: str = ..., ts: float = ..., role: str = "user",
                     content: str = "", channel_id: str = "", task_id: str = "",
                     token_estimate: int | None = None, tool_calls: Any = (),
                     tool_call_id: str = "", origin: str = "", hlc: str = "") -> None: ...
    else:
        __init__ = message_init

    def __hash__(self) -> int:
        # tool_calls holds dicts, so the fields are not all hashable; equal
        # records have equal ids, so hashing the id is consistent with equality.
        return hash(("msg", self.msg_id))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict of every field plus ``schema_version``.

        Key order is fixed and starts ``msg_id, channel_id, task_id, hlc,
        content`` (the tail line format relies on it); ``tool_calls`` is a list
        of fresh dicts.
        """
        calls = self.tool_calls
        return {
            "msg_id": self.msg_id,
            "channel_id": self.channel_id,
            "task_id": self.task_id,
            "hlc": self.hlc,
            "content": self.content,
            "ts": self.ts,
            "role": self.role,
            "token_estimate": self.token_estimate,
            "tool_calls": [_copy_json(c) for c in calls] if calls else [],
            "tool_call_id": self.tool_call_id,
            "origin": self.origin,
            "schema_version": self.SCHEMA_VERSION,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ConversationMessageRecord":
        """Build from a dict made by :meth:`to_dict` (or an older/sparser one:
        missing optional fields get their defaults; unknown keys are ignored).
        ``ValueError`` for a ``schema_version`` newer than :attr:`SCHEMA_VERSION`."""
        if not isinstance(d, Mapping):
            raise TypeError(f"ConversationMessageRecord.from_dict: expected a dict, got {type(d).__name__}")
        _schema_version(cls, d)
        try:  # fast path: a dict made by to_dict() has every field
            args = (d["msg_id"], d["ts"], d["role"], d["content"], d["channel_id"], d["task_id"],
                    d["token_estimate"], d["tool_calls"], d["tool_call_id"], d["origin"], d["hlc"])
        except KeyError:
            kwargs = {f: d[f] for f in _MSG_FIELDS if f in d}
            if kwargs.get("tool_calls", ()) is None:
                del kwargs["tool_calls"]
            return cls(**kwargs)
        if args[7] is None:
            args = args[:7] + ((),) + args[8:]
        return cls(*args)


def _stored_calls_ok(calls: Iterable[Any]) -> bool:
    for c in calls:
        if (type(c) is not dict and type(c) is not ReadOnlyDict) or type(c.get("id")) is not str or type(c.get("name")) is not str \
                or "arguments" not in c or not c["id"].isascii() and not _utf8_ok(c["id"]):
            return False
    return True


def message_from_stored(d: dict, *, fresh_json: bool) -> ConversationMessageRecord:
    """A record from a dict the store just decoded from its own verified bytes.

    With ``fresh_json`` (the dict came from a strict JSON decoder that refuses
    lone surrogates and non-finite numbers, and shares nothing), tool calls
    are taken as they are instead of being checked and deep-copied value by
    value (the slow part of building a record that has them); every other
    field gets the checks of the constructor. Anything unusual goes through
    :meth:`ConversationMessageRecord.from_dict`, which names the bad field."""
    try:
        calls = d["tool_calls"]
        sv = d["schema_version"]
        if type(sv) is int and sv == 1 and len(d) == 12 and type(calls) is list \
                and (not calls or (fresh_json and _stored_calls_ok(calls))):
            mid, ch, task, hlc, content = d["msg_id"], d["channel_id"], d["task_id"], d["hlc"], d["content"]
            ts, role, tok, tcid, origin = d["ts"], d["role"], d["token_estimate"], d["tool_call_id"], d["origin"]
            # Both sources decode UTF-8 strictly (orjson; the archive's
            # bytes.decode), so the strings need no UTF-8 check: the types,
            # the required values and a finite time are what is left.
            if (type(mid) is str and mid and type(ch) is str and ch and type(task) is str
                    and type(hlc) is str and type(content) is str and type(role) is str
                    and role in _ROLE_SET and type(ts) is float and ts - ts == 0.0
                    and type(tok) is int and tok >= 0 and type(tcid) is str and type(origin) is str):
                rec = _new_message(ConversationMessageRecord)
                _set_msg_id(rec, mid)
                _set_ts(rec, ts)
                _set_role(rec, role)
                _set_content(rec, content)
                _set_channel(rec, ch)
                _set_task(rec, task)
                _set_tok(rec, tok)
                # (read-only: the caches hand the record out as it is)
                _set_calls(rec, read_only_calls(calls) if calls else ())
                _set_tcid(rec, tcid)
                _set_origin(rec, origin)
                _set_hlc(rec, hlc)
                return rec
    except KeyError:
        pass
    return ConversationMessageRecord.from_dict(d)


message_init_setup(ConversationMessageRecord, lambda: new_id("msg"), lambda: time.time(), _checked_message)

_new_message = object.__new__
# the slots' own setters: a frozen dataclass's fields set without __setattr__
(_set_msg_id, _set_ts, _set_role, _set_content, _set_channel, _set_task, _set_tok, _set_calls,
 _set_tcid, _set_origin, _set_hlc) = (
    getattr(ConversationMessageRecord, f).__set__
    for f in ("msg_id", "ts", "role", "content", "channel_id", "task_id", "token_estimate",
              "tool_calls", "tool_call_id", "origin", "hlc"))


_MSG_FIELDS = tuple(f.name for f in dataclasses.fields(ConversationMessageRecord))
