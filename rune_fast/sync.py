"""Multi-device transcripts: hybrid logical clocks, ops, the transcript fold,
provider-valid repair, request renderers and retention (SPEC section 7).

A conversation turn is an *op* ``(op_id, hlc, payload)``. Every device that
holds the same set of ops folds them into a byte-identical transcript, whatever
order they arrived in, and :func:`repair` turns any transcript (or any window
of one) into a message list that the Anthropic Messages API and the OpenAI Chat
Completions API both accept once rendered with :func:`to_anthropic` /
:func:`to_openai`.

Data path::

    ops (OpRecord | 3-tuple | mapping)  --as_op-->  OpRecord
      --fold(ops, conversation_id)-->   [Turn] ordered by (hlc, op_id)
      --LastN(n)-->                     newest n turns
      --repair-->                       [{"role": "user"|"assistant"|"tool_result", ...}]
      --to_anthropic / to_openai-->     provider request ``messages``

The provider rules that :func:`repair` and the renderers guarantee, and that
:func:`check_repaired`, :func:`check_anthropic` and :func:`check_openai`
verify, are written down once, in ``docs/PROVIDER_RULES.md``; every violation
string these checkers return starts with the rule id from that page.

Surfaces (:class:`Surface`): the conversation surface is an event stream keyed
by ``op_id`` whose entries are independent, so it tolerates retention
(``LastN``). The routing surface is an event stream that is replayed in order
(each entry updates a running estimate), so it forbids any trimming. Entity
surfaces are keyed by content (the same fact written twice is one entry) and
forbid trimming too: dropping an entity loses state, not history.

Decisions a caller should know:

- Identity is the op: a resent op (same ``op_id``) is one turn; two ops with
  byte-identical payloads are two turns. If two *different* versions of one
  ``op_id`` meet, the one with the smaller ``(hlc, canonical JSON of the
  payload)`` wins on every device. A tombstone (payload ``{"deleted": true}``)
  removes its ``op_id`` whatever the order of arrival.
- ``system`` turns are not part of a transcript; user/assistant turns whose
  text is blank (and that carry no tool calls) are skipped by :func:`repair`,
  because both providers reject or ignore empty messages.
- :func:`repair` keeps a leading assistant message (OpenAI accepts it);
  :func:`to_anthropic` drops everything before the first user message rather
  than invent a user turn.
- Malformed input raises ``TypeError``/``ValueError`` naming the op, message
  or tool call; nothing is silently replaced.

Nothing here does I/O and nothing holds module-level mutable state; the only
objects with state are :class:`HlcClock` (thread-safe) and :class:`SyncState`.
"""
from __future__ import annotations

import enum
import hashlib
import json
import logging
import operator
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from .records import _copy_json

log = logging.getLogger("rune_fast.sync")

__all__ = [
    "DEFAULT_CONVERSATION",
    "Hlc",
    "HlcClock",
    "Surface",
    "OpRecord",
    "as_op",
    "Role",
    "Turn",
    "fold",
    "repair",
    "to_anthropic",
    "to_openai",
    "check_repaired",
    "check_anthropic",
    "check_openai",
    "LastN",
    "compact",
    "SyncState",
    "resume_messages",
    "canonical_json",
    "transcript_hash",
    "is_tombstone",
    "tombstone_op",
    "op_from_record_dict",
    "record_dict_from_op",
    "turns_from_records",
]

#: The conversation a turn belongs to when its payload names none (legacy
#: ``{speaker, text, timestamp}`` turns, or an empty/``None`` id).
DEFAULT_CONVERSATION = "default"

_WALL_MAX = 10**15 - 1      # 15 decimal digits in the string form
_COUNTER_MAX = 10**10 - 1   # 10 decimal digits in the string form


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------- HLC


class _HlcFields(NamedTuple):
    wall_ms: int
    counter: int
    device_id: str


class Hlc(_HlcFields):
    """A hybrid logical clock stamp: ``Hlc(wall_ms, counter, device_id)``.

    Immutable and hashable; ordered by the tuple ``(wall_ms, counter,
    device_id)``, and equal to (and ordered consistently with) its string. ``str(hlc)`` is ``"%015d-%010d-%s" % (wall_ms, counter,
    device_id)``, which sorts as text exactly like the tuple, and
    :meth:`parse` reads it back. ``wall_ms`` must lie in ``0 .. 10**15-1`` and
    ``counter`` in ``0 .. 10**10-1`` (so the string form keeps its widths);
    ``device_id`` is any str, possibly empty (messages with no ``origin``).
    Bad fields raise ``TypeError``/``ValueError`` naming the field.
    """

    __slots__ = ()

    def __new__(cls, wall_ms: int, counter: int, device_id: str) -> Hlc:
        if type(wall_ms) is not int:
            if isinstance(wall_ms, bool) or not isinstance(wall_ms, int):
                raise TypeError(f"Hlc.wall_ms must be an int, got {wall_ms!r}")
            wall_ms = int(wall_ms)
        if type(counter) is not int:
            if isinstance(counter, bool) or not isinstance(counter, int):
                raise TypeError(f"Hlc.counter must be an int, got {counter!r}")
            counter = int(counter)
        if not isinstance(device_id, str):
            raise TypeError(f"Hlc.device_id must be a str, got {device_id!r}")
        if not 0 <= wall_ms <= _WALL_MAX:
            raise ValueError(f"Hlc.wall_ms out of range 0..{_WALL_MAX}: {wall_ms}")
        if not 0 <= counter <= _COUNTER_MAX:
            raise ValueError(f"Hlc.counter out of range 0..{_COUNTER_MAX}: {counter}")
        return tuple.__new__(cls, (wall_ms, counter, str(device_id)))

    def __str__(self) -> str:
        return "%015d-%010d-%s" % self

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    # An Hlc and its string form are interchangeable (SPEC: "hlc an Hlc or its
    # string"): they compare equal, hash alike, and order consistently, since
    # the string sorts like the tuple.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self == other
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self != other
        return tuple.__ne__(self, other)

    def __hash__(self) -> int:
        return hash("%015d-%010d-%s" % self)

    def __lt__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self < other
        # (typeshed wants a tuple here; any other object gives NotImplemented, as it should)
        return tuple.__lt__(self, other)  # type: ignore[operator]

    def __le__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self <= other
        # (typeshed wants a tuple here; any other object gives NotImplemented, as it should)
        return tuple.__le__(self, other)  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self > other
        # (typeshed wants a tuple here; any other object gives NotImplemented, as it should)
        return tuple.__gt__(self, other)  # type: ignore[operator]

    def __ge__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self >= other
        # (typeshed wants a tuple here; any other object gives NotImplemented, as it should)
        return tuple.__ge__(self, other)  # type: ignore[operator]

    @classmethod
    def parse(cls, s: str | Hlc) -> Hlc:
        """Read back ``str(hlc)``. An :class:`Hlc` is returned as it is.

        Raises ``ValueError`` naming the input if it is not exactly 15 ASCII
        digits, ``-``, 10 ASCII digits, ``-``, and the device id (``TypeError``
        for a non-str).
        """
        if type(s) is Hlc:
            return s
        if not isinstance(s, str):
            if isinstance(s, Hlc):
                return tuple.__new__(Hlc, tuple(s))
            raise TypeError(f"Hlc.parse expects a str, got {type(s).__name__}: {s!r}")
        w = s[:15]
        c = s[16:26]
        if (len(s) < 27 or s[15] != "-" or s[26] != "-" or not w.isdigit()
                or not c.isdigit() or not w.isascii() or not c.isascii()):
            raise ValueError(f"malformed hlc {s!r}: expected "
                             "'<15 digits>-<10 digits>-<device_id>'")
        return tuple.__new__(Hlc, (int(w), int(c), s[27:]))


def _as_hlc(h: Any) -> Hlc:
    t = type(h)
    if t is Hlc:
        return h
    if t is str:
        return Hlc.parse(h)
    if isinstance(h, Hlc):
        return tuple.__new__(Hlc, tuple(h))
    if isinstance(h, str):
        return Hlc.parse(str(h))
    if isinstance(h, (tuple, list)) and len(h) == 3:
        return Hlc(*h)
    raise TypeError(f"hlc must be an Hlc or its string form, got {h!r}")


class HlcClock:
    """A hybrid logical clock for one device (thread-safe).

    ``now()`` stamps a local event; ``observe(remote)`` merges a stamp seen on
    another device (an :class:`Hlc` or its string) and returns the stamp of the
    receive event. Every stamp returned is strictly greater than every stamp
    this clock returned or observed before, whatever the wall clock does: when
    the wall clock stands still or goes backwards the counter advances instead
    (and if the counter would overflow its 10 digits, ``wall_ms`` moves on by
    one). ``wall`` is the millisecond wall clock (injectable for tests).
    """

    __slots__ = ("_device_id", "_wall", "_l", "_c", "_lock", "_issued", "_nows")

    def __init__(self, device_id: str, *, wall: Callable[[], int] | None = None) -> None:
        if not isinstance(device_id, str):
            raise TypeError(f"HlcClock device_id must be a str, got {device_id!r}")
        self._device_id = device_id
        self._wall = wall if wall is not None else _wall_ms
        self._l = 0
        self._c = 0
        self._issued = False
        self._nows = 0      # stamps now() returned (see ``nows``)
        self._lock = threading.Lock()

    @property
    def device_id(self) -> str:
        return self._device_id

    @property
    def last(self) -> Hlc | None:
        """The latest stamp returned or observed, or ``None`` before any."""
        with self._lock:
            if not self._issued:
                return None
            return tuple.__new__(Hlc, (self._l, self._c, self._device_id))

    @property
    def last_wall(self) -> int:
        """``wall_ms`` of the latest stamp returned or observed (0 before
        any): every later stamp is after any stamp of an earlier wall time.
        Read without the lock (it only grows)."""
        return self._l

    def pass_wall(self, wall_ms: int) -> None:
        """Make every later stamp of this clock sort after every stamp of
        ``wall_ms`` with counter 0, whatever its device (the stamp section 7
        gives an unstamped message), without issuing one: a cheaper
        ``observe`` for a store's appends."""
        if not 0 <= wall_ms <= _WALL_MAX:
            raise ValueError(f"HlcClock.pass_wall: {wall_ms!r} is outside 0..10**15-1")
        with self._lock:
            if wall_ms > self._l:
                # the next stamp is (wall_ms, 1) or a later wall time
                self._l, self._c, self._issued = wall_ms, 0, True

    def _read_wall(self) -> int:
        pt = self._wall()
        if type(pt) is not int:
            if isinstance(pt, bool) or not isinstance(pt, (int, float)) or pt != pt:
                raise TypeError(f"HlcClock wall() must return milliseconds as a number, "
                                f"got {pt!r}")
            pt = int(pt)
        # A wall clock before the epoch (or absurdly far ahead) cannot be
        # written in the string form; the logical part carries on regardless.
        return min(max(pt, 0), _WALL_MAX)

    def _stamp(self, l: int, c: int) -> Hlc:
        if c > _COUNTER_MAX:
            l, c = l + 1, 0
            if l > _WALL_MAX:
                raise ValueError("HlcClock exhausted: wall_ms past 10**15-1")
        self._l, self._c, self._issued = l, c, True
        return tuple.__new__(Hlc, (l, c, self._device_id))

    @property
    def nows(self) -> int:
        """How many stamps :meth:`now` returned: a store keeps the clock on
        disk when a caller may hold one that nothing stored carries."""
        return self._nows

    def now(self) -> Hlc:
        """Stamp a local event (send): strictly after everything seen so far."""
        with self._lock:
            self._nows += 1
            pt = self._read_wall()
            if pt > self._l:
                return self._stamp(pt, 0)
            return self._stamp(self._l, self._c + 1)

    def observe(self, remote: Hlc | str) -> Hlc:
        """Merge a remote stamp (receive) and return the receive event's stamp,
        strictly after ``remote`` and after every earlier stamp of this clock.
        A malformed string raises ``ValueError`` naming it."""
        r = _as_hlc(remote)
        with self._lock:
            pt = self._read_wall()
            l, c = self._l, self._c
            lm, cm = r[0], r[1]
            nl = max(l, lm, pt)
            if nl == l and nl == lm:
                nc = max(c, cm) + 1
            elif nl == l:
                nc = c + 1
            elif nl == lm:
                nc = cm + 1
            else:
                nc = 0
            return self._stamp(nl, nc)

    def __repr__(self) -> str:
        return f"HlcClock({self._device_id!r}, last={self.last})"


# ------------------------------------------------------------ ops, surfaces


class Surface(enum.StrEnum):
    """The kind of state an op belongs to, and how its entries are keyed.

    ============  ============  ==================  ===================
    surface       keyed by      replayed in order   retention (LastN)
    ============  ============  ==================  ===================
    CONVERSATION  op_id         no (independent)    tolerated
    ROUTING       op_id         yes (running EMA)   forbidden
    ENTITY        content       no                  forbidden
    ============  ============  ==================  ===================
    """

    CONVERSATION = "conversation"
    ROUTING = "routing"
    ENTITY = "entity"

    @property
    def is_event_stream(self) -> bool:
        """True when entries are keyed by ``op_id`` (a resent op is one entry;
        two distinct ops with identical payloads are two), False when keyed by
        content (entity surfaces)."""
        return self is not Surface.ENTITY

    @property
    def is_replay_stream(self) -> bool:
        """True when the fold replays entries in order and each one depends on
        those before it, so no prefix may be dropped."""
        return self is Surface.ROUTING

    @property
    def tolerates_retention(self) -> bool:
        """True only for CONVERSATION: its turns are independent, so keeping
        the newest n loses history but never corrupts what is kept. ROUTING
        (replay) and ENTITY (state) forbid trimming."""
        return self is Surface.CONVERSATION


class _OpFields(NamedTuple):
    op_id: str
    hlc: Hlc
    payload: Mapping[str, Any]


class OpRecord(_OpFields):
    """One op: ``OpRecord(op_id, hlc, payload, surface=Surface.CONVERSATION)``.

    A 3-tuple ``(op_id, hlc, payload)``: it unpacks and compares like one
    (the surface is an attribute beside the tuple; two ops of different
    surfaces are not equal), and reads like the mapping form too
    (``op["payload"]``). ``hlc`` may be given as an :class:`Hlc` or its
    string and is always stored as an :class:`Hlc`. ``op_id`` must be a
    non-empty str and ``payload`` a mapping (``TypeError``/``ValueError``
    naming the field otherwise).
    """

    # no __slots__: an op of another surface keeps it in its instance dict
    surface: Surface = Surface.CONVERSATION

    def __new__(cls, op_id: str, hlc: Hlc | str, payload: Mapping[str, Any],
                surface: Surface | str = Surface.CONVERSATION) -> OpRecord:
        if type(op_id) is not str:
            if not isinstance(op_id, str):
                raise TypeError(f"op_id must be a str, got {op_id!r}")
            op_id = str(op_id)
        if not op_id:
            raise ValueError("op_id must be a non-empty str")
        try:
            h = _as_hlc(hlc)
        except (TypeError, ValueError) as e:
            raise type(e)(f"op {op_id!r}: {e}") from None
        if type(payload) is not dict and not isinstance(payload, Mapping):
            raise TypeError(f"op {op_id!r}: payload must be a mapping, got "
                            f"{type(payload).__name__}")
        if type(surface) is not Surface:
            try:
                surface = Surface(surface)
            except ValueError:
                raise ValueError(f"op {op_id!r}: unknown surface {surface!r}") from None
        self = tuple.__new__(cls, (op_id, h, payload))
        if surface is not Surface.CONVERSATION:
            self.surface = surface
        return self

    def __getitem__(self, key: Any) -> Any:
        if type(key) is str:
            if key in _OP_KEYS:
                return getattr(self, key)
            raise KeyError(key)
        return tuple.__getitem__(self, key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OpRecord) and self.surface is not other.surface:
            return False
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        extra = "" if self.surface is Surface.CONVERSATION else f", surface={self.surface.value!r}"
        return f"OpRecord(op_id={self.op_id!r}, hlc={self.hlc!r}, payload={self.payload!r}{extra})"

    def __reduce__(self) -> tuple:
        return OpRecord, (*self, self.surface)

    def _replace(self, **changes: Any) -> OpRecord:
        """A copy with ``changes`` (``surface`` among them, if given; kept otherwise)."""
        surface = changes.pop("surface", self.surface)
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise ValueError(f"OpRecord has no fields {sorted(unknown)!r}")
        # (mypy maps a starred iterable onto every positional parameter, surface too)
        return OpRecord(*(changes.get(f, v) for f, v in zip(self._fields, self)), surface)  # type: ignore[call-arg]

    def to_dict(self) -> dict[str, Any]:
        """The wire form ``{"op_id", "hlc": str, "payload"}`` (plus
        ``"surface"`` when it is not the conversation surface)."""
        d = {"op_id": self.op_id, "hlc": str(self.hlc), "payload": dict(self.payload)}
        if self.surface is not Surface.CONVERSATION:
            d["surface"] = self.surface.value
        return d


_OP_KEYS = frozenset(("op_id", "hlc", "payload", "surface"))

_OP_NEW = tuple.__new__
_CONVERSATION = Surface.CONVERSATION


def as_op(x: Any) -> OpRecord:
    """Normalise an op given as an :class:`OpRecord`, a plain 3-tuple (or
    4-tuple with a surface) ``(op_id, hlc, payload)``, or a mapping with the
    keys ``op_id``, ``hlc``, ``payload`` (and optionally ``surface``).

    Raises ``TypeError``/``ValueError`` naming what is wrong."""
    t = type(x)
    if t is OpRecord:
        return x
    if t is dict:
        # Fast path for the wire form; anything unusual takes the checked path
        # below, which names what is wrong.
        op_id = x.get("op_id")
        h = x.get("hlc")
        p = x.get("payload")
        if (type(op_id) is str and op_id and type(p) is dict and x.get("surface") is None
                and type(h) is str):
            try:
                return _OP_NEW(OpRecord, (op_id, Hlc.parse(h), p))
            except ValueError:
                pass
    if t is dict or isinstance(x, Mapping):
        try:
            op_id, hlc, payload = x["op_id"], x["hlc"], x["payload"]
        except KeyError as e:
            raise ValueError(f"op mapping lacks key {e.args[0]!r}: "
                             f"keys are {sorted(map(str, x))}") from None
        s = x.get("surface")
        return OpRecord(op_id, hlc, payload, Surface.CONVERSATION if s is None else s)
    if t is tuple or isinstance(x, (tuple, list)):
        if isinstance(x, OpRecord):
            return OpRecord(*x, x.surface)
        if len(x) in (3, 4):
            return OpRecord(*x)
        raise ValueError(f"an op tuple has 3 items (op_id, hlc, payload), got {len(x)}")
    raise TypeError(f"not an op (OpRecord, 3-tuple or mapping): {type(x).__name__}")


def is_tombstone(op: Any) -> bool:
    """True when the op's payload is a deletion ``{"deleted": true, ...}``."""
    return as_op(op).payload.get("deleted") is True


def tombstone_op(msg_id: str, hlc: Hlc | str, conversation_id: str) -> OpRecord:
    """The op that deletes ``msg_id``: ``payload {"deleted": True,
    "conversation_id"}``. Delete wins over the op it names in any order."""
    return OpRecord(msg_id, hlc, {"deleted": True, "conversation_id": conversation_id})


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


# ---------------------------------------------------------------- repair

# Working message: [kind, text parts, calls, tool_use_id or tool text]
_K_USER, _K_ASSISTANT, _K_TOOL = 0, 1, 2


_KIND_OF = {_USER: _K_USER, _ASSISTANT: _K_ASSISTANT, _TOOL: _K_TOOL}


def _blank(s: str) -> bool:
    return not s or s.isspace()


def _extract(m: Any, i: int) -> tuple[int, str, Any, str] | None:
    """(kind, text, calls, tool_use_id) of a Turn or message dict; None for a
    turn that is not part of a transcript (system)."""
    r: object       # a Turn's role, or whatever a dict holds under "role"
    if isinstance(m, Turn):
        r = m.role
        if r == "user":
            return _K_USER, m.content, (), ""
        if r == "assistant":
            return _K_ASSISTANT, m.content, m.tool_calls, ""
        if r == "tool":
            return _K_TOOL, m.content, (), m.tool_use_id
        role = _ROLE_OF.get(r, False) if isinstance(r, str) else False
        if role is None:
            return None
        raise ValueError(f"turn {i} ({m.op_id!r}): unknown role {r!r}")
    if not isinstance(m, Mapping):
        raise TypeError(f"message {i}: expected a Turn or a message dict, got "
                        f"{type(m).__name__}")
    r = m.get("role")
    role = _ROLE_OF.get(r, False) if isinstance(r, str) else False
    if role is False:
        raise ValueError(f"message {i}: unknown role {r!r}")
    if role is None:
        return None
    content = m.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str):
        raise TypeError(f"message {i}: content must be a str, got {type(content).__name__}")
    if role is _USER:
        return _K_USER, content, (), ""
    if role is _ASSISTANT:
        raw = m.get("tool_calls")
        return _K_ASSISTANT, content, (_norm_calls(raw, lambda: f"message {i}") if raw else ()), ""
    tuid = m.get("tool_use_id")
    if not tuid:
        tuid = m.get("tool_call_id") or ""
    if not isinstance(tuid, str):
        raise TypeError(f"message {i}: tool_use_id must be a str, got {tuid!r}")
    return _K_TOOL, content, (), tuid


def repair(turns: Iterable[Any]) -> list[dict[str, Any]]:
    """A provider-valid message list from an ordered transcript (a list of
    :class:`Turn`, or of message dicts as :meth:`Turn.to_message` makes them;
    OpenAI-shaped ``tool`` messages with ``tool_call_id`` are read too).

    Rules (``docs/PROVIDER_RULES.md``, section R):

    1. system turns and user/assistant turns with blank text and no tool calls
       are not part of the transcript and are skipped;
    2. adjacent user/user or assistant/assistant turns are coalesced: texts
       joined with ``"\\n"`` (blank texts contribute nothing), tool calls
       concatenated; tool results are never merged with each other;
    3. a tool result survives only in the run of tool results right after the
       assistant message that made its call (matched by ``tool_use_id`` ==
       call ``id``; the first result for a call wins, later ones are dropped);
    4. a call with no result in that run is stripped, call by call; so is a
       call with an empty id or an id already used earlier in the transcript;
    5. an assistant message left with no text and no calls is dropped;
    6. coalescing runs again after the drops and strips.

    The result never contains two adjacent user or assistant messages, and
    ``repair(repair(x)) == repair(x)``. A leading assistant message is kept
    (OpenAI accepts it); :func:`to_anthropic` drops what precedes the first
    user message. Output dicts: ``{"role": "user", "content"}``,
    ``{"role": "assistant", "content", "tool_calls"}``, ``{"role":
    "tool_result", "tool_use_id", "content"}``.
    """
    # Working messages live in parallel lists (kind, text, calls, tool_use_id)
    # rather than one small object each: repair runs over whole transcripts,
    # and every live container costs the garbage collector. A text is a str,
    # or a list of str once two non-blank texts have been coalesced.
    kinds: list[int] = []
    texts: list[Any] = []
    callsl: list[Any] = []
    tuids: list[str] = []
    last = -1  # kind of the last working message
    kind_of = _KIND_OF
    calls: Sequence[dict[str, Any]]
    # Pass 1: coalesce the raw sequence.
    for i, t in enumerate(turns):
        if type(t) is Turn and t[3] in kind_of:
            k = kind_of[t[3]]
            text = t[4]
            calls = t[5] if k == _K_ASSISTANT else ()
            if calls:  # fresh, normalised dicts: the output never aliases a turn
                calls = _norm_calls(calls, lambda: f"turn {i} ({t[0]!r})")
            tuid = t[6]
        else:
            e = _extract(t, i)
            if e is None:
                continue
            k, text, calls, tuid = e
        if k != _K_TOOL:
            if not text or text.isspace():
                if not calls:
                    continue
                text = ""
            if last == k:
                if text:
                    prev = texts[-1]
                    if not prev:
                        texts[-1] = text
                    elif type(prev) is str:
                        texts[-1] = [prev, text]
                    else:
                        prev.append(text)
                if calls:
                    callsl[-1] = [*callsl[-1], *calls]
                continue
        kinds.append(k)
        texts.append(text)
        callsl.append(calls)
        tuids.append(tuid)
        last = k

    # Pass 2: keep tool results only in the block right after their call;
    # strip unanswered calls; drop what is left empty. `kept` holds indices.
    kept: list[int] = []
    seen: set[str] = set()
    n = len(kinds)
    i = 0
    while i < n:
        k = kinds[i]
        if k == _K_USER:
            kept.append(i)
            i += 1
            continue
        if k == _K_TOOL:  # not right after an assistant message: orphan
            i += 1
            continue
        j = i + 1
        while j < n and kinds[j] == _K_TOOL:
            j += 1
        calls = callsl[i]
        if calls:
            cand: dict[str, dict] = {}
            for c in calls:
                cid = c["id"]
                if cid and cid not in seen and cid not in cand:
                    cand[cid] = c
            results = []
            answered: set[str] = set()
            for r in range(i + 1, j):
                tu = tuids[r]
                if tu in cand and tu not in answered:
                    answered.add(tu)
                    results.append(r)
            callsl[i] = calls = [c for cid, c in cand.items() if cid in answered]
            seen.update(answered)
            if texts[i] or calls:
                kept.append(i)
                kept.extend(results)
        elif texts[i]:
            kept.append(i)
        i = j

    # Pass 3: coalesce again (after the drops and strips) while building the
    # message dicts.
    out: list[dict[str, Any]] = []
    append = out.append
    last = -1
    for i in kept:
        k = kinds[i]
        text = texts[i]
        if type(text) is not str:
            text = "\n".join(text)
        if k == last and k != _K_TOOL:
            m = out[-1]
            if text:
                m["content"] = f"{m['content']}\n{text}" if m["content"] else text
            if k == _K_ASSISTANT and callsl[i]:
                m["tool_calls"].extend(callsl[i])
            continue
        last = k
        if k == _K_USER:
            append({"role": "user", "content": text})
        elif k == _K_ASSISTANT:
            c = callsl[i]
            append({"role": "assistant", "content": text,
                    "tool_calls": c if type(c) is list else list(c)})
        else:
            append({"role": "tool_result", "tool_use_id": tuids[i], "content": text})
    return out


def _rule(code: str, i: int | None, text: str) -> str:
    return f"{code} messages[{i}]: {text}" if i is not None else f"{code}: {text}"


def check_repaired(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Violations of the repaired-transcript rules (R1-R7 in
    ``docs/PROVIDER_RULES.md``) in a :func:`repair` output; ``[]`` if valid."""
    v: list[str] = []
    seen: set[str] = set()
    open_calls: set[str] | None = None  # calls of the assistant whose block is open
    answered: set[str] = set()
    prev_role = None
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            v.append(_rule("R1", i, f"not a dict: {m!r}"))
            continue
        role = m.get("role")
        if role not in ("user", "assistant", "tool_result"):
            v.append(_rule("R1", i, f"role {role!r} is not user, assistant or tool_result"))
            continue
        content = m.get("content")
        if not isinstance(content, str):
            v.append(_rule("R7", i, "content is not a str"))
            content = ""
        if role != "tool_result" and role == prev_role:
            v.append(_rule("R2", i, f"two adjacent {role} messages"))
        if role != "tool_result" and open_calls is not None:
            missing = open_calls - answered
            if missing:
                v.append(_rule("R4", i - 1, f"calls without a result: {sorted(missing)}"))
            open_calls = None
        if role == "user":
            if _blank(content):
                v.append(_rule("R6", i, "empty user message"))
        elif role == "assistant":
            calls = m.get("tool_calls", [])
            if not isinstance(calls, list):
                v.append(_rule("R7", i, "tool_calls is not a list"))
                calls = []
            if _blank(content) and not calls:
                v.append(_rule("R6", i, "assistant message with no text and no calls"))
            open_calls = set()
            answered = set()
            for c in calls:
                if not isinstance(c, Mapping) or set(c) != {"id", "name", "arguments"}:
                    v.append(_rule("R7", i, f"tool call is not {{id, name, arguments}}: {c!r}"))
                    continue
                cid = c["id"]
                if not isinstance(cid, str) or not cid:
                    v.append(_rule("R5", i, f"tool call id {cid!r} is empty or not a str"))
                    continue
                if cid in seen:
                    v.append(_rule("R5", i, f"tool call id {cid!r} used twice"))
                seen.add(cid)
                open_calls.add(cid)
        else:
            tu = m.get("tool_use_id")
            if open_calls is None:
                v.append(_rule("R3", i, f"tool result {tu!r} not right after an assistant message"))
            elif tu not in open_calls:
                v.append(_rule("R3", i, f"tool result {tu!r} answers no call of the assistant message"))
            elif tu in answered:
                v.append(_rule("R3", i, f"second tool result for call {tu!r}"))
            else:
                answered.add(tu)
        prev_role = role
    if open_calls is not None and open_calls - answered:
        v.append(_rule("R4", len(messages) - 1,
                       f"calls without a result: {sorted(open_calls - answered)}"))
    return v


# -------------------------------------------------------------- renderers

_ANTHROPIC_ID = re.compile(r"[A-Za-z0-9_-]+")
_ANTHROPIC_BAD = re.compile(r"[^A-Za-z0-9_-]")
_OPENAI_ID_MAX = 40


def _anthropic_id(cid: str) -> str:
    """Anthropic tool ids match ``^[a-zA-Z0-9_-]+$``: other ids map, the same
    way every time, to ``t_<cleaned>_<8 hex of sha256>``."""
    if _ANTHROPIC_ID.fullmatch(cid):
        return cid
    h = hashlib.sha256(cid.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"t_{_ANTHROPIC_BAD.sub('_', cid)[:48]}_{h}"


def _openai_id(cid: str) -> str:
    """OpenAI tool call ids are at most 40 characters: longer ids map, the
    same way every time, to ``call_<32 hex of sha256>``."""
    if len(cid) <= _OPENAI_ID_MAX:
        return cid
    return "call_" + hashlib.sha256(cid.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _args_object(args: Any, cid: str) -> dict[str, Any]:
    if isinstance(args, dict):
        return args
    if args is None or args == "":
        return {}
    if isinstance(args, str):
        try:
            obj = json.loads(args)
        except ValueError as e:
            raise ValueError(f"tool call {cid!r}: arguments are not JSON ({e}): {args!r}") from None
        if isinstance(obj, dict):
            return obj
        raise ValueError(f"tool call {cid!r}: arguments are not a JSON object: {args!r}")
    if isinstance(args, Mapping):
        return dict(args)
    raise ValueError(f"tool call {cid!r}: arguments must be an object or a JSON "
                     f"string of one, got {args!r}")


def _args_string(args: Any) -> str:
    # no arguments (None or "") are the empty object, as in _args_object
    if args is None or args == "":
        return "{}"
    if isinstance(args, str):
        return args
    try:
        return json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"tool call arguments are not JSON-serialisable: {e}") from None


def _messages_in(messages: Iterable[Any]) -> list[tuple[int, str, Any, str]]:
    out = []
    for i, m in enumerate(messages):
        e = _extract(m, i)
        if e is not None:
            out.append(e)
    return out


def to_anthropic(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Render a repaired message list as Anthropic Messages API ``messages``.

    Every message's content is a list of blocks: ``{"type": "text", "text"}``
    (blank text is left out), ``{"type": "tool_use", "id", "name", "input"}``
    (``input`` the arguments object; a JSON-string argument is parsed) and, in
    user-role messages, ``{"type": "tool_result", "tool_use_id", "content"}``.
    Adjacent same-role messages are merged into one block list with tool
    results first. Messages before the first user message are dropped (the
    API requires the first message from the user; nothing is invented to
    precede them). Trailing whitespace of a final assistant message is
    removed (the API rejects it). Tool ids outside ``[A-Za-z0-9_-]+`` are
    mapped deterministically. Raises ``ValueError`` naming the call whose
    arguments are not a JSON object.
    """
    items = _messages_in(messages)
    start = next((i for i, e in enumerate(items) if e[0] == _K_USER and not _blank(e[1])),
                 len(items))
    out: list[dict[str, Any]] = []
    for k, text, calls, tuid in items[start:]:
        if k == _K_TOOL:
            role = "user"
            blocks: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": _anthropic_id(tuid),
                                             "content": text}]
        else:
            role = "user" if k == _K_USER else "assistant"
            blocks = [] if _blank(text) else [{"type": "text", "text": text}]
            for c in calls if k == _K_ASSISTANT else ():
                blocks.append({"type": "tool_use", "id": _anthropic_id(c["id"]),
                               "name": c["name"], "input": _args_object(c["arguments"], c["id"])})
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for m in out:
        if m["role"] == "user":
            blocks = m["content"]
            # Tool results must open the user turn that answers the calls.
            if any(b["type"] == "tool_result" for b in blocks[1:]):
                m["content"] = ([b for b in blocks if b["type"] == "tool_result"]
                                + [b for b in blocks if b["type"] != "tool_result"])
    while out and out[-1]["role"] == "assistant":
        blocks = out[-1]["content"]
        last = blocks[-1]
        if last["type"] != "text" or last["text"] == last["text"].rstrip():
            break
        stripped = last["text"].rstrip()
        if stripped:
            blocks[-1] = {"type": "text", "text": stripped}
            break
        blocks.pop()
        if blocks:
            continue
        out.pop()
    return out


def to_openai(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Render a repaired message list as OpenAI Chat Completions ``messages``.

    ``{"role": "user", "content"}``; ``{"role": "assistant", "content",
    "tool_calls": [{"id", "type": "function", "function": {"name",
    "arguments": <JSON string>}}]}`` (``tool_calls`` left out when there are
    none, ``content`` ``None`` when blank beside calls); ``{"role": "tool",
    "tool_call_id", "content"}`` for tool results. Tool ids longer than 40
    characters are mapped deterministically.
    """
    out: list[dict[str, Any]] = []
    for k, text, calls, tuid in _messages_in(messages):
        if k == _K_USER:
            out.append({"role": "user", "content": text})
        elif k == _K_TOOL:
            out.append({"role": "tool", "tool_call_id": _openai_id(tuid), "content": text})
        elif calls:
            out.append({"role": "assistant", "content": None if _blank(text) else text,
                        "tool_calls": [{"id": _openai_id(c["id"]), "type": "function",
                                        "function": {"name": c["name"],
                                                     "arguments": _args_string(c["arguments"])}}
                                       for c in calls]})
        else:
            out.append({"role": "assistant", "content": text})
    return out


def _req_list(req: Any) -> Sequence[Any]:
    if isinstance(req, Mapping):
        return req.get("messages", [])
    return req


def check_anthropic(req_messages: Any) -> list[str]:
    """Violations of the Anthropic request rules (A1-A10 in
    ``docs/PROVIDER_RULES.md``) in a ``messages`` list (or a request dict
    holding one); ``[]`` if valid."""
    msgs = _req_list(req_messages)
    v: list[str] = []
    tool_ids: set[str] = set()
    prev_role = None
    prev_uses: set[str] = set()
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping):
            v.append(_rule("A1", i, f"not a dict: {m!r}"))
            continue
        role = m.get("role")
        if role not in ("user", "assistant"):
            v.append(_rule("A1", i, f"role {role!r} is not user or assistant"))
            continue
        if i == 0 and role != "user":
            v.append(_rule("A2", i, "first message is not from the user"))
        if role == prev_role:
            v.append(_rule("A3", i, f"roles do not alternate ({role} after {role})"))
        blocks = m.get("content")
        if isinstance(blocks, str):
            if _blank(blocks):
                v.append(_rule("A4", i, "empty or whitespace-only content"))
            blocks = [{"type": "text", "text": blocks}]
        if not isinstance(blocks, list) or not blocks:
            v.append(_rule("A4", i, "content is empty or not a list of blocks"))
            blocks = []
        uses: set[str] = set()
        results: set[str] = set()
        seen_non_result = False
        for b in blocks:
            t = b.get("type") if isinstance(b, Mapping) else None
            if t == "text":
                if not isinstance(b.get("text"), str) or _blank(b["text"]):
                    v.append(_rule("A5", i, "text block empty or whitespace-only"))
                seen_non_result = True
            elif t == "tool_use":
                if role != "assistant":
                    v.append(_rule("A6", i, "tool_use block in a user message"))
                bid = b.get("id")
                if not isinstance(bid, str) or not _ANTHROPIC_ID.fullmatch(bid):
                    v.append(_rule("A7", i, f"tool_use id {bid!r} does not match ^[a-zA-Z0-9_-]+$"))
                elif bid in tool_ids:
                    v.append(_rule("A7", i, f"tool_use id {bid!r} used twice"))
                else:
                    tool_ids.add(bid)
                    uses.add(bid)
                if not isinstance(b.get("name"), str) or not isinstance(b.get("input"), dict):
                    v.append(_rule("A6", i, "tool_use block needs a str name and an object input"))
                seen_non_result = True
            elif t == "tool_result":
                if role != "user":
                    v.append(_rule("A6", i, "tool_result block in an assistant message"))
                tu = b.get("tool_use_id")
                if tu not in prev_uses:
                    v.append(_rule("A8", i, f"tool_result {tu!r} answers no tool_use of the "
                                            "previous message"))
                elif tu in results:
                    v.append(_rule("A8", i, f"second tool_result for {tu!r}"))
                results.add(tu)
                if seen_non_result:
                    v.append(_rule("A9", i, "tool_result block after another block"))
                if not isinstance(b.get("content", ""), (str, list)):
                    v.append(_rule("A6", i, "tool_result content is not a str or block list"))
            else:
                v.append(_rule("A6", i, f"unknown block {b!r}"))
        if prev_uses:
            missing = prev_uses - (results if role == "user" else set())
            if missing:
                v.append(_rule("A8", i - 1, f"tool_use without a tool_result in the next "
                                            f"message: {sorted(missing)}"))
        prev_uses = uses
        prev_role = role
    if prev_uses:
        v.append(_rule("A8", len(msgs) - 1, f"tool_use without a tool_result: {sorted(prev_uses)}"))
    if msgs and isinstance(msgs[-1], Mapping) and msgs[-1].get("role") == "assistant":
        blocks = msgs[-1].get("content")
        last = blocks[-1] if isinstance(blocks, list) and blocks else None
        text = blocks if isinstance(blocks, str) else (
            last.get("text") if isinstance(last, Mapping) and last.get("type") == "text" else None)
        if isinstance(text, str) and text != text.rstrip():
            v.append(_rule("A10", len(msgs) - 1, "final assistant content ends with whitespace"))
    return v


def check_openai(req_messages: Any) -> list[str]:
    """Violations of the OpenAI Chat Completions rules (O1-O7 in
    ``docs/PROVIDER_RULES.md``) in a ``messages`` list (or a request dict
    holding one); ``[]`` if valid."""
    msgs = _req_list(req_messages)
    v: list[str] = []
    ids: set[str] = set()
    open_calls: set[str] | None = None
    answered: set[str] = set()
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping):
            v.append(_rule("O1", i, f"not a dict: {m!r}"))
            continue
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            v.append(_rule("O1", i, f"unknown role {role!r}"))
            continue
        if role != "tool" and open_calls is not None:
            if open_calls - answered:
                v.append(_rule("O4", i - 1, f"tool_calls without a tool reply: "
                                            f"{sorted(open_calls - answered)}"))
            open_calls = None
        content = m.get("content")
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list) or not calls:
                    v.append(_rule("O3", i, "tool_calls present but empty or not a list"))
                    calls = []
            if content is None and not calls:
                v.append(_rule("O2", i, "assistant message with neither content nor tool_calls"))
            elif content is not None and not isinstance(content, str):
                v.append(_rule("O2", i, "assistant content is not a str"))
            if calls:
                open_calls = set()
                answered = set()
                for c in calls:
                    f = c.get("function") if isinstance(c, Mapping) else None
                    if (not isinstance(f, Mapping) or c.get("type") != "function"
                            or not isinstance(f.get("name"), str)
                            or not isinstance(f.get("arguments"), str)):
                        v.append(_rule("O3", i, f"malformed tool call {c!r}"))
                        continue
                    cid = c.get("id")
                    if not isinstance(cid, str) or not cid or len(cid) > _OPENAI_ID_MAX:
                        v.append(_rule("O5", i, f"tool call id {cid!r} empty, not a str or "
                                                f"longer than {_OPENAI_ID_MAX}"))
                        continue
                    if cid in ids:
                        v.append(_rule("O5", i, f"tool call id {cid!r} used twice"))
                    ids.add(cid)
                    open_calls.add(cid)
        elif role == "tool":
            tu = m.get("tool_call_id")
            if not isinstance(content, str):
                v.append(_rule("O2", i, "tool content is not a str"))
            if open_calls is None:
                v.append(_rule("O6", i, f"tool reply {tu!r} does not follow an assistant "
                                        "message with tool_calls"))
            elif tu not in open_calls:
                v.append(_rule("O6", i, f"tool reply {tu!r} answers no preceding tool call"))
            elif tu in answered:
                v.append(_rule("O6", i, f"second tool reply for {tu!r}"))
            else:
                answered.add(tu)
        else:
            if not isinstance(content, str):
                v.append(_rule("O2", i, f"{role} content is not a str"))
            if "tool_calls" in m:
                v.append(_rule("O7", i, f"tool_calls on a {role} message"))
    if open_calls is not None and open_calls - answered:
        v.append(_rule("O4", len(msgs) - 1, f"tool_calls without a tool reply: "
                                            f"{sorted(open_calls - answered)}"))
    return v


# -------------------------------------------------------------- retention


class LastN:
    """Retention that keeps the newest ``n`` turns by ``(hlc, op_id)``,
    returned oldest first. ``n=0`` keeps nothing; a negative or non-int ``n``
    raises ``ValueError``/``TypeError``. ``LastN(n).apply(turns)`` and
    ``LastN(n)(turns)`` are the same. Only surfaces whose
    :attr:`Surface.tolerates_retention` is true may be trimmed.

    Because "the newest n of a set" satisfies ``top(A | B) == top(top(A) |
    B)``, applying it to a compacted state (:func:`compact`, :class:`SyncState`)
    gives the same turns as applying it to a fresh fold of every op.
    """

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        if isinstance(n, bool):
            raise TypeError(f"LastN n must be an int, got {n!r}")
        try:
            n = operator.index(n)
        except TypeError:
            raise TypeError(f"LastN n must be an int, got {n!r}") from None
        if n < 0:
            raise ValueError(f"LastN n must be >= 0, got {n}")
        self.n = n

    def apply(self, turns: Iterable[Turn]) -> list[Turn]:
        if self.n == 0:
            return []
        ts = list(turns)
        _sort_turns(ts)
        return ts[-self.n:] if len(ts) > self.n else ts

    __call__ = apply

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LastN) and other.n == self.n

    def __hash__(self) -> int:
        return hash((LastN, self.n))

    def __repr__(self) -> str:
        return f"LastN({self.n})"


def compact(ops: Iterable[Any], retention: Callable[[list[Turn]], list[Turn]] | None,
            conversation_id: str = DEFAULT_CONVERSATION) -> list[Turn]:
    """The compacted state of a conversation: ``retention(fold(ops,
    conversation_id))`` (no retention: the whole fold)."""
    turns = fold(ops, conversation_id)
    return retention(turns) if retention is not None else turns


class SyncState:
    """An incrementally folded, retained conversation (what a device keeps
    after compaction instead of every op).

    ``merge(ops)`` folds in more ops (any order, duplicates, tombstones) and
    re-applies ``retention``; ``turns()`` is the current transcript. The ids
    of trimmed and deleted turns are remembered, so a resent or re-versioned
    op of a trimmed turn cannot come back and a late tombstone still wins.

    ``retention(turns())`` equals ``retention(fold(all ops))`` for ops without
    deletions. A deletion of a *retained* turn shrinks what is kept (the
    older turn a fresh fold would pull in is gone), so a state with
    retention ``LastN(m)`` answers ``LastN(n)`` exactly for ``n <= m - d``,
    where ``d`` counts tombstones that arrived after their turn was retained.
    Thread-safe.
    """

    def __init__(self, conversation_id: str = DEFAULT_CONVERSATION,
                 retention: LastN | None = None) -> None:
        self.conversation_id = conversation_id or DEFAULT_CONVERSATION
        self.retention = retention
        self._ops: dict[str, OpRecord] = {}
        self._gone: set[str] = set()
        self._lock = threading.Lock()

    def merge(self, ops: Iterable[Any]) -> int:
        """Fold ``ops`` in; returns how many turns of this conversation were
        added or replaced (before retention)."""
        best, deleted = _winners(ops)
        with self._lock:
            return self._merge(best, deleted)

    def _merge(self, best: dict[str, OpRecord], deleted: set[str]) -> int:
        changed = 0
        for op_id in deleted:
            if self._ops.pop(op_id, None) is not None:
                changed += 1
        self._gone |= deleted
        for op_id, op in best.items():
            if op_id in self._gone or _conv_of(op.payload) != self.conversation_id:
                continue
            prev = self._ops.get(op_id)
            if prev is None or _wins(op, prev):
                self._ops[op_id] = op
                changed += 1
        if self.retention is not None and changed:
            kept = self.retention(fold(self._ops.values(), self.conversation_id))
            keep = {t.op_id for t in kept}
            for op_id in [o for o in self._ops if o not in keep]:
                del self._ops[op_id]
                self._gone.add(op_id)
        return changed

    def turns(self) -> list[Turn]:
        """The retained transcript, ordered by ``(hlc, op_id)``."""
        with self._lock:
            ops = list(self._ops.values())
        return fold(ops, self.conversation_id)


def resume_messages(ops: Iterable[Any], conversation_id: str = DEFAULT_CONVERSATION,
                    n: int | None = None) -> list[dict[str, Any]]:
    """``repair(LastN(n)(fold(ops, conversation_id)))`` (no ``LastN`` when
    ``n`` is None): the provider-valid resume list of one conversation."""
    turns = fold(ops, conversation_id)
    if n is not None:
        turns = LastN(n).apply(turns)
    return repair(turns)


# ------------------------------------------------------ repository bridge

# Payload keys that are not fields of a ConversationMessageRecord.
_PAYLOAD_ONLY = ("conversation_id", "tool_use_id", "timestamp")


def _stamp_of(ts: Any, origin: Any) -> Hlc:
    """``Hlc(round(ts*1000), 0, origin)`` for any record a store holds: the
    wall time clamped into the Hlc's range (a ts before 1970, or one given in
    milliseconds by mistake, or an infinite one), 0 for a ts that is no
    number (or NaN), and no device for an origin that is no str."""
    try:
        w = float(ts) * 1000
    except (TypeError, ValueError, OverflowError):
        w = 0.0
    wall = 0 if not w > 0 else _WALL_MAX if w >= _WALL_MAX else round(w)
    return Hlc(wall, 0, origin if isinstance(origin, str) else "")


def _record_hlc(hlc_s: str, ts: Any, origin: Any) -> Hlc:
    """A stored message's op stamp by the letter of section 7: its ``hlc``, or
    ``Hlc(round(ts*1000), 0, origin)`` when it has none. ``TypeError``,
    ``ValueError`` or ``OverflowError`` when the values cannot make one."""
    if hlc_s:
        return Hlc.parse(hlc_s)
    return Hlc(round(ts * 1000), 0, origin or "")


def record_stamp(hlc_s: str, ts: Any, origin: Any) -> Hlc:
    """The stamp :func:`op_from_record_dict` gives a stored message with
    ``lenient=True`` (without its warning): a store's place for the message
    in the fold order."""
    try:
        return _record_hlc(hlc_s, ts, origin)
    except (TypeError, ValueError, OverflowError):
        return _stamp_of(ts, origin)


def op_from_record_dict(d: Any, *, lenient: bool = False) -> OpRecord:
    """The op of a stored message (SPEC section 7): ``op_id = msg_id``,
    ``hlc`` = the record's ``hlc`` or ``Hlc(round(ts*1000), 0, origin)`` when
    it has none, payload = the record dict plus ``conversation_id``
    (= ``channel_id``), ``role``, ``content``, ``tool_calls``,
    ``tool_use_id`` (= ``tool_call_id``) and ``timestamp`` (= ``ts``).

    ``d`` is ``record.to_dict()`` (or a record with ``to_dict()``); a missing
    key raises ``ValueError`` naming it, a malformed ``hlc`` ``ValueError``
    naming the message -- or, with ``lenient`` (a store exporting what it
    holds: a record may carry any string as its ``hlc`` and any float as its
    ``ts``), a warning naming the message, and the op stamped as if the
    record had no ``hlc``, its wall time clamped into the Hlc's range."""
    if not isinstance(d, Mapping):
        to_dict = getattr(d, "to_dict", None)
        if to_dict is None:
            raise TypeError(f"expected a record dict or record, got {type(d).__name__}")
        d = to_dict()
    try:
        msg_id = d["msg_id"]
        channel_id = d["channel_id"]
        ts = d["ts"]
    except KeyError as e:
        raise ValueError(f"record dict lacks {e.args[0]!r}") from None
    try:
        hlc = _record_hlc(d.get("hlc") or "", ts, d.get("origin"))
    except (TypeError, ValueError, OverflowError) as e:
        if not lenient:
            raise ValueError(f"message {msg_id!r}: {e}") from None
        hlc = _stamp_of(ts, d.get("origin"))
        log.warning("message %r: %s; its op is stamped %s instead", msg_id, e, hlc)
    payload = dict(d)
    payload["conversation_id"] = channel_id
    payload["role"] = d.get("role", "")
    payload["content"] = d.get("content", "")
    payload["tool_calls"] = [dict(c) for c in (d.get("tool_calls") or ())]
    payload["tool_use_id"] = d.get("tool_call_id") or ""
    payload["timestamp"] = ts
    return OpRecord(msg_id, hlc, payload)


def record_dict_from_op(op: Any) -> dict[str, Any] | None:
    """The message record dict an op carries, for a store to write on merge;
    ``None`` for a tombstone or an op of another surface.

    An op made by :func:`op_from_record_dict` gives back exactly the record
    dict it was made from. Any other conversation op (a legacy or foreign
    payload) gives a record dict built from its payload: ``msg_id = op_id``,
    ``channel_id = conversation_id``, ``ts = timestamp`` (else the hlc's wall
    time), ``tool_call_id = tool_use_id``, ``hlc = str(op.hlc)``, ``origin``
    its device id."""
    op = as_op(op)
    if op.surface is not Surface.CONVERSATION:
        return None
    p = op.payload
    if p.get("deleted") is True:
        return None
    if "msg_id" in p:
        return {k: v for k, v in p.items() if k not in _PAYLOAD_ONLY}
    t = _turn_from(op.op_id, op.hlc, _conv_of(p), p)
    role = str(t.role) if t is not None else "system"
    ts = t.timestamp if t is not None else p.get("timestamp", p.get("ts"))
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        ts = op.hlc.wall_ms / 1000.0
    content = t.content if t is not None else (p.get("content") or p.get("text") or "")
    return {"msg_id": op.op_id, "ts": float(ts), "role": role, "content": content,
            "channel_id": _conv_of(p),
            "tool_calls": [dict(c) for c in t.tool_calls] if t is not None else [],
            "tool_call_id": t.tool_use_id if t is not None else "",
            "origin": op.hlc.device_id, "hlc": str(op.hlc)}


def turns_from_records(record_dicts: Iterable[Any],
                       conversation_id: str | None = None) -> list[Turn]:
    """The folded transcript of stored messages (records or their dicts).
    ``conversation_id`` defaults to the channel of the first record."""
    ops = [op_from_record_dict(d) for d in record_dicts]
    if conversation_id is None:
        if not ops:
            return []
        conversation_id = _conv_of(ops[0].payload)
    return fold(ops, conversation_id)
