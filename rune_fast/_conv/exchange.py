"""Transcripts and op exchange: resume_messages' fold, export_ops and merge_ops."""
from __future__ import annotations

import logging
from typing import Any, Iterable


from .. import sync as _sync
from ..records import ConversationMessageRecord
from .common import _fold_key

from .host import Host

log = logging.getLogger("rune_fast")


class Exchange(Host):
    """Transcripts and sync ops (a mixin of the repository)."""

    # ---- the state this room owns: written here only (tests/test_ownership.py)

    def _reset_fold_order(self) -> None:
        # channel -> [store order agrees with fold order, last fold key] (lazily)
        self._fold_order = {}

    def _resume_candidates(self, channel_id: str, n: int | None) -> list[ConversationMessageRecord]:
        """The channel's messages that ``LastN(n)`` can keep (lock held).

        When the channel's store order agrees with the fold order (checked once
        per channel, then kept up to date on append), that is a suffix of the
        channel: the cost follows ``n``, not the size of the channel or store."""
        if n is not None and self._fold_consistent(channel_id):
            k = n + 16
            while True:
                recs = [r for r, _t in self._window(channel_id, k)] if k else []
                if len(recs) < k or sum(1 for r in recs if r.role != "system") >= n:
                    return recs
                k *= 4
        return [r for r, _t in self._channel_all(channel_id)]

    def _fold_consistent(self, channel_id: str) -> bool:
        """Whether the channel's messages (system ones aside) stand in the
        fold order in the store order. Kept per channel as ``[verdict, fold
        key of the last message, (hlc, msg_id) of the last stamped one]``."""
        state = self._fold_order.get(channel_id)
        if state is None:
            state = [True, None, None]
            for r, _t in self._channel_all(channel_id):
                if r.hlc:
                    state[2] = (r.hlc, r.msg_id)    # stamped messages come last, in this order
                if r.role == "system":
                    continue
                k = _fold_key(r)
                if state[1] is not None and k < state[1]:
                    state[0] = False
                    break
                state[1] = k
            self._fold_order[channel_id] = state
        return state[0]

    def _note_fold_order(self, m: ConversationMessageRecord) -> None:
        """Keep the fold-order verdict of the channel true after an append:
        the new message must land last in the store order (an unstamped one
        lands before every stamped one, a stamped one by its (hlc, msg_id))
        and last in the fold order."""
        state = self._fold_order.get(m.channel_id)
        if state is None or not state[0]:
            return
        if m.hlc:
            at = (m.hlc, m.msg_id)
            if state[2] is not None and at < state[2]:
                if m.role != "system":     # a system message's place does not matter
                    state[0] = False
                return
            state[2] = at
        elif state[2] is not None and m.role != "system":
            state[0] = False
            return
        if m.role == "system":
            return
        k = _fold_key(m)
        if state[1] is not None and k < state[1]:
            state[0] = False
        else:
            state[1] = k

    def _merge_ops(self, ops: Iterable[Any]) -> int:
        with self._lock:
            self._check_writable()
            records: list[ConversationMessageRecord] = []
            tomb_ids: list[str] = []
            tomb_hlc: dict[str, str] = {}
            tomb_ch: dict[str, str] = {}
            for raw in ops:
                op = _sync.as_op(raw)
                payload = op.payload
                self._observe(op.hlc)
                self._note_unheld_stamp()       # (an op refused or a duplicate: its stamp is stored nowhere)
                if payload.get("deleted") is True:     # (sync.is_tombstone: fold's rule, one test)
                    tomb_ids.append(op.op_id)
                    tomb_hlc[op.op_id] = str(op.hlc)
                    tomb_ch[op.op_id] = payload.get("conversation_id", "")
                    continue
                d = _sync.record_dict_from_op(op)
                if d is None:
                    continue
                try:
                    records.append(ConversationMessageRecord.from_dict(d))
                except (TypeError, ValueError, KeyError) as exc:
                    raise ValueError(f"op {op.op_id!r}: payload is not a storable message: {exc}") from None
            if tomb_ids:
                self._delete_ids(tomb_ids, record_unknown=True, hlcs=tomb_hlc, channels=tomb_ch)
        return self.append_many(records) if records else 0
