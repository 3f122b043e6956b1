"""Ops: the unit every device exchanges (``(op_id, hlc, payload)``), the
surfaces they belong to, and tombstones.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, NamedTuple

from .clock import Hlc, _as_hlc


#: The conversation a turn belongs to when its payload names none (legacy
#: ``{speaker, text, timestamp}`` turns, or an empty/``None`` id).
DEFAULT_CONVERSATION = "default"


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
