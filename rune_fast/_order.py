"""The one ordering rule of messages (docs/API.md, "Reads and order"):
"oldest first" within a channel, a task, or a search's hits means the
unstamped messages first, in the order they were appended, then the stamped
ones by ``(hlc, msg_id)``. Every sort of messages in rune_fast keys on
:func:`order_key`."""
from __future__ import annotations

from typing import Any

__all__ = ["order_key", "sorts_before"]


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
