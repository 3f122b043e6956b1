"""The one ordering rule of messages (docs/API.md, "Reads and order"):
"oldest first" within a channel, a task, or a search's hits means the
unstamped messages first, in the order they were appended, then the stamped
ones by ``(hlc, msg_id)``. Every sort of messages in rune_fast keys on
:func:`order_key`; the functions below are its forms for a record (the hot
tier's reads, search and cooling) and an archived row (the cool tier)."""
from __future__ import annotations

from typing import Any

__all__ = ["order_key", "sorts_before", "record_key", "channel_key", "record_sorts_before", "row_key"]


def order_key(hlc: str, msg_id: str, seq: Any) -> tuple:
    """The sort key of a message: its ``hlc`` stamp, its id, and ``seq``,
    its place in append order (any comparable value; used only when the
    message has no stamp)."""
    if hlc:
        return (1, hlc, msg_id)
    return (0, seq, "")


def sorts_before(hlc: str, msg_id: str, stamp: tuple) -> bool:
    """Whether a message sorts before the stamped message whose ``(hlc,
    msg_id)`` is ``stamp`` (an unstamped message sorts before every stamped
    one; no two messages share an id)."""
    return not hlc or (hlc, msg_id) < stamp


def record_key(rec: Any, seq: int | None) -> tuple:
    """The key of a message record across channels and tiers: the unstamped
    by ``seq``, their append sequence (None: before every other)."""
    return order_key(rec.hlc, rec.msg_id, -1 if seq is None else seq)


def channel_key(rec: Any, tier_rank: int, pos: Any) -> tuple:
    """The key of a message record within a channel read: append order of
    the unstamped is the cool tier (rank 0) before the hot (rank 1), then
    ``pos``, the place in its tier."""
    return order_key(rec.hlc, rec.msg_id, (tier_rank, pos))


def record_sorts_before(rec: Any, stamp: tuple) -> bool:
    """Whether the record ``rec`` sorts before the stamped message ``stamp``
    ((hlc, msg_id))."""
    return sorts_before(rec.hlc, rec.msg_id, stamp)


def row_key(row: Any) -> tuple:
    """The key of an archived row (a ``CoolRow``: its record dict and
    ``ord``, its append sequence)."""
    record = row.record
    return order_key(record["hlc"], record["msg_id"], row.ord)
