"""Retention: :class:`LastN`, :func:`compact`, :class:`SyncState` and
:func:`resume_messages`.
"""
from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .fold import Turn, _conv_of, _sort_turns, _winners, _wins, fold
from .ops import DEFAULT_CONVERSATION, OpRecord
from .repair import repair


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
