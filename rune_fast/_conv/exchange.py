"""Transcripts and op exchange: resume_messages' fold, export_ops and merge_ops."""
from __future__ import annotations

import heapq
import logging
import os
from contextlib import nullcontext
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

from .. import codec
from .._memory import collector_paused
from .. import sync as _sync
from ..errors import CorruptStateCheckpointError
from ..records import ConversationMessageRecord
from ..sync.bridge import export_ops_of, newest_stamp, stamp_key
from .._order import order_key
from . import tuning
from .common import _COOL_RANK, _HOT_RANK, _first, _fold_key
from .fold_order import fold_state, newest_candidates

from .host import Host
from .reads import HotCopy

log = logging.getLogger("rune_fast")

_TUPLE_GT = tuple.__gt__
#: archived rows a channel's transcript keeps as candidates (at least 2n)
#: while its archive files stay the same, and channels kept so (~13 KB each)
_STAMP_TOPS = 64
_STAMP_TOPS_CHANNELS = 256
#: lines a viewer's refresh notes in the fold-order verdicts (more: forgotten)
_NOTE_LINES = 4096


class _Since:
    """The archive files an export since a stamp reads: those that may hold
    a message stamped after it. ``tops`` (the repository's
    ``_export_tops``: file no -> the newest stamp of its rows, a plain
    tuple, ``()`` for none; files never change) is learned as files are
    looked at: from a file's ``hlc``, ``ts`` and ``origin`` columns before
    its records are read (:meth:`wanted`: the first export since a stamp in
    a process read every record of a store of 1,000,000 messages, ~7 s and
    ~1.5 GB), and from the live records of a file read (:meth:`read`)."""

    def __init__(self, cool: Any, tops: dict[int, tuple], since: _sync.Hlc) -> None:
        self._cool, self._tops, self._after = cool, tops, tuple(since)

    def known_old(self, no: int) -> bool:
        """Whether file ``no`` is known to hold nothing stamped after ``since``."""
        top = self._tops.get(no)
        return top is not None and not top > self._after

    def wanted(self, no: int) -> bool:
        """Whether pinned file ``no`` may hold a message stamped after
        ``since`` (its stamp columns read if its newest is not known; a
        file they cannot be read from is wanted: its read names the damage)."""
        if no not in self._tops:
            cols = self._cool.stamp_columns(no)
            if cols is None:
                return True
            self._tops[no] = newest_stamp(*cols)
        return not self.known_old(no)

    def read(self, no: int, recs: list[ConversationMessageRecord]) -> None:
        """Learn file ``no``'s newest stamp from its live records, just read."""
        self._tops[no] = max((stamp_key(r.hlc, r.ts, r.origin) for r in recs), default=())


class Exchange(Host):
    """Transcripts and sync ops (a mixin of the repository)."""

    # ---- the state this room owns: written here only (tests/test_ownership.py)

    def _init_exchange_state(self) -> None:
        self._reset_archive_views()

    def _reset_archive_views(self) -> None:
        """Forget what was learned of the archive's files (an open, a
        viewer's reload: a file number that a writer reopened since uses
        again names another file)."""
        # archive file no -> the newest stamp (a plain tuple; () for none) of
        # its rows, worked out by an export since a stamp (files never
        # change): a later export since a stamp at or past it does not read
        # the file
        self._export_tops: dict[int, tuple] = {}
        # channel -> (its archive files, all of them?, (fold key, location)
        # of its newest archived rows that are not system messages nor
        # deleted): see _archived_by_stamp
        self._stamp_tops: dict[str, tuple[tuple[int, ...], bool, list[tuple[tuple, int]]]] = {}
        # channel -> (the locations of its hot lines then, all of them?,
        # (fold key, (location,)) of its newest hot messages that are not
        # system messages): see _hot_by_stamp
        self._hot_tops: dict[str, tuple[Any, bool, list[tuple[tuple, tuple[int]]]]] = {}

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
        if n is not None and self._cool_has_channel(channel_id):
            return self._newest_by_stamp(channel_id, n)
        return [r for r, _t in self._channel_all(channel_id)]

    def _newest_by_stamp(self, channel_id: str, n: int) -> list[ConversationMessageRecord]:
        """The channel's ``n`` newest messages in the fold order that are
        not system messages (what ``LastN(n)`` keeps of the fold; the fold
        leaves system messages out), for a channel whose store order
        disagrees with it (lock held): the candidates of each tier by their
        stamps (:meth:`_hot_by_stamp`, :meth:`_archived_by_stamp`: of the
        archived rows the stamp columns alone, no content read); then only
        the chosen rows' records, verified."""
        keyed: list[tuple[tuple, Any]] = list(self._hot_by_stamp(channel_id, n))
        keyed += self._archived_by_stamp(channel_id, n)
        top = heapq.nlargest(n, keyed, key=_first)
        locs = [x for _k, x in top if type(x) is int]
        recs = {rec.msg_id: rec for rec, _o in self._cool_records(locs)} if locs else {}
        out = []
        for (*_stamp, mid), x in top:
            if type(x) is tuple:        # a hot line's (location,)
                rec = self._read_loc(x[0])
                if rec.msg_id != mid:   # (the line is the message it named when keyed: never else)
                    self._hot_tops.pop(channel_id, None)
                    return self._newest_by_stamp(channel_id, n)
                out.append(rec)
                continue
            rec = recs.get(mid)
            if rec is None or rec.channel_id != channel_id:
                # the columns said one thing and the verified row another: damage of what they read
                raise CorruptStateCheckpointError(
                    f"archived row of {mid!r} on channel {channel_id!r} is not the message its columns name",
                    path=self._cool.loc_path(x), offset=x & 0xFFFFFFFF)
            out.append(rec)
        return out

    def _hot_by_stamp(self, channel_id: str, n: int) -> list[tuple[tuple, tuple[int]]]:
        """``(fold key, (location,))`` of hot messages of the channel among
        which its ``n`` newest (not system messages) are (lock held): the
        newest ``max(2n, _STAMP_TOPS)`` by their stamps, kept per channel
        with the locations of its hot lines; while none of those is gone
        (deleted, cooled, moved by a compaction) only the lines added since
        are read and keyed (a chat turn on a channel out of fold order
        keyed every hot record of it: ~2 us each, 8.9 ms with ~4,000 hot).
        What is kept always holds every hot message newer than its oldest."""
        locs = self._index.channel_locs(codec.key(channel_id), -1)
        k = max(2 * n, _STAMP_TOPS)
        kept = self._hot_tops.get(channel_id)
        base: list[tuple[tuple, tuple[int]]] = []
        whole, new = True, locs
        if kept is not None and len(kept[0]) <= len(locs):
            added = np.setdiff1d(locs, kept[0], assume_unique=True)
            if len(added) == len(locs) - len(kept[0]) and (kept[1] or len(kept[2]) >= n):
                if not len(added):
                    return kept[2]
                base, whole, new = kept[2], kept[1], added
        stamp = stamp_key
        every = []
        for loc in new.tolist():
            r = self._read_loc(loc)
            if r.role != "system":
                every.append(((*stamp(r.hlc, r.ts, r.origin), r.msg_id), (loc,)))
        # (kept whole, or the newest k: no line of them is gone, so the
        # newest k of them and the new ones are the channel's newest k)
        every += base
        tops = heapq.nlargest(k, every, key=_first) if len(every) > k else every
        if len(self._hot_tops) >= _STAMP_TOPS_CHANNELS and channel_id not in self._hot_tops:
            self._hot_tops.clear()
        self._hot_tops[channel_id] = (locs.copy(), whole and len(every) <= k, tops)
        return tops

    def _archived_by_stamp(self, channel_id: str, n: int) -> list[tuple[tuple, int]]:
        """``(fold key, location)`` of archived rows of the channel among
        which its ``n`` newest (not system messages, not deleted) are (lock
        held): the newest ``max(2n, _STAMP_TOPS)`` of them by their stamps
        (CoolArchive.channel_stamps), kept per channel while its archive
        files stay the same and enough of them are not deleted since; when
        files were only added (a cooling run), those alone are read (a
        transcript of a channel out of fold order read every archived row's
        stamps a call: 0.29 s at 1,000,000 messages, the busiest channel).
        What is kept always holds every live row newer than its oldest."""
        files = self._cool.channel_files(channel_id)
        deleted = self._cool_deleted
        kept = self._stamp_tops.get(channel_id)
        only: set[int] | None = None        # the files to read (None: all)
        base: list[tuple[tuple, int]] = []
        whole = True
        if kept is not None and set(kept[0]) <= set(files):
            live = [x for x in kept[2] if x[0][-1] not in deleted]
            if kept[1] or len(live) >= n:
                only = set(files) - set(kept[0])
                if not only:
                    return live
                base, whole = live, kept[1]
        k = max(2 * n, _STAMP_TOPS)
        cols = self._cool.channel_stamp_arrays(channel_id, only)
        if cols is None:
            rows, cut = self._cool.channel_stamps(channel_id, only), False
        else:
            rows, cut = newest_candidates(cols, k, deleted)     # (the rest cannot be among them)
        stamp = stamp_key
        every = [((*stamp(hlc, ts, origin), mid), loc)
                 for loc, mid, hlc, origin, role, ts, _o in rows if role != "system" and mid not in deleted]
        if not whole:
            # (the kept rows are every old row from the oldest of them on:
            # of the new rows, only those from there on may join them)
            oldest = min(base, key=_first)[0]
            every = [x for x in every if x[0] > oldest]
        every += base
        tops = heapq.nlargest(k, every, key=_first) if len(every) > k else every
        if len(self._stamp_tops) >= _STAMP_TOPS_CHANNELS and channel_id not in self._stamp_tops:
            self._stamp_tops.clear()
        self._stamp_tops[channel_id] = (files, whole and not cut and len(every) <= k, tops)
        return tops

    def _fold_consistent(self, channel_id: str) -> bool:
        """Whether the channel's messages (system ones aside) stand in the
        fold order in the store order. Kept per channel as ``[verdict, fold
        key of the last message, (hlc, msg_id) of the last stamped one]``."""
        state = self._fold_order.get(channel_id)
        if state is None:
            state = self._fold_state_of_columns(channel_id) or self._fold_state_of_loop(channel_id)
            self._fold_order[channel_id] = state
        return state[0]

    def _fold_state_of_loop(self, channel_id: str) -> list:
        """The fold-order state of :meth:`_fold_consistent`, each message
        keyed and walked in the store order."""
        state: list = [True, None, None]
        for hlc, mid, role, k in self._store_order_stamps(channel_id):
            if hlc:
                state[2] = (hlc, mid)           # stamped messages come last, in this order
            if role == "system":
                continue
            if state[1] is not None and k < state[1]:
                state[0] = False
                break
            state[1] = k
        return state

    def _fold_state_of_columns(self, channel_id: str) -> list | None:
        """The channel's fold-order state worked out from its archived rows'
        stamp columns in array steps (fold_order.fold_state: ~80 against
        ~950 ms for a channel of 122,500 messages); None when they cannot
        say it (no archived rows, damage, stamps only the loop reads)."""
        if not self._cool_has_channel(channel_id):
            return None
        cool = self._cool.channel_stamp_arrays(channel_id)
        if cool is None:
            return None
        hot = [(r.hlc, r.msg_id, r.role, _fold_key(r)) for r, _t in self._hot_channel(channel_id)]
        return fold_state(hot, cool, self._cool_deleted)

    def _store_order_stamps(self, channel_id: str) -> list[tuple[str, str, str, tuple]]:
        """``(hlc, msg_id, role, fold key)`` of the channel's messages in
        the store order (lock held), as ``_channel_all`` orders them: the
        hot records, and of the archived rows the stamp columns alone
        (CoolArchive.channel_stamps; their records are not read)."""
        hot = [(r.hlc, r.msg_id, r.role, _fold_key(r)) for r, _t in self._hot_channel(channel_id)]
        if not self._cool_has_channel(channel_id):
            return hot
        stamp = _sync.record_stamp
        deleted = self._cool_deleted
        keyed = [(order_key(h[0], h[1], (_HOT_RANK, i)), h) for i, h in enumerate(hot)]
        keyed += [(order_key(hlc, mid, (_COOL_RANK, o)), (hlc, mid, role, (stamp(hlc, ts, origin), mid)))
                  for _loc, mid, hlc, origin, role, ts, o in self._cool.channel_stamps(channel_id)
                  if mid not in deleted]
        keyed.sort(key=_first)
        return [h for _k, h in keyed]

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

    def _note_ingested(self, locs: Any) -> None:
        """Keep the fold-order verdicts true after a viewer took the writer's
        lines at ``locs`` (its appends since the last look, in store
        order), as the writer keeps its own on append
        (:meth:`_note_fold_order`), where a viewer's refresh forgot them:
        the next transcript of a channel then read every message's stamp
        again (5.2 s for a channel of 753,000 messages). Past
        ``_NOTE_LINES`` lines, or a line that cannot be read, the verdicts
        are forgotten instead (worked out again when asked)."""
        if not self._fold_order or not len(locs):
            return
        if len(locs) > _NOTE_LINES:
            self._reset_fold_order()
            return
        try:
            for loc in locs.tolist():
                rec = self._read_loc(loc)
                if rec.channel_id in self._fold_order:
                    self._note_fold_order(rec)
        except CorruptStateCheckpointError:
            self._reset_fold_order()        # (the read that asks names the damage)

    def _export_all(self, since: _sync.Hlc | None = None,
                    ) -> tuple[list[ConversationMessageRecord], list[_sync.OpRecord]]:
        """What export_ops makes its ops of: every live record read from its
        bytes, and every tombstone's op, as of one moment. A writer takes
        its lock for the hot records, the tombstones and the choice of
        archive files (:meth:`_export_snapshot`) and reads those files
        after without it (~9 s at 1,000,000 messages), so appends and
        compactions go on; a viewer holds its lock throughout (its reads
        reload state under it)."""
        with self._lock if self.read_only else nullcontext():
            with self._lock:
                self._check_open()
                snap, tomb_ops, newer = self._export_snapshot(since)
            return self._snapshot_records(snap, newer), tomb_ops

    def _export_snapshot(self, since: _sync.Hlc | None = None) -> tuple[Any, list[_sync.OpRecord], _Since | None]:
        """``(snapshot, tombstone ops, files)`` of an export (lock held):
        :meth:`_live_snapshot`, and with ``since`` the :class:`_Since` its
        read asks which files to read: the archive files whose rows are all
        stamped at or before it (``_export_tops``) are left out; a sync
        loop's export then reads the hot tier and the files cooled since."""
        tomb_hlc = self._tombfile.hlcs_by_id()
        tomb_ops = [_sync.tombstone_op(mid, tomb_hlc.get(mid) or str(self._clock.now()), ch)
                    for mid, ch in self._tombstones.items()]
        if since is None:
            return self._live_snapshot(), tomb_ops, None
        newer = _Since(self._cool, self._export_tops, since)
        return self._live_snapshot(newer.known_old), tomb_ops, newer      # (last: its files are pinned)

    def _all_records(self) -> list[ConversationMessageRecord]:
        """Every live record (lock held): :meth:`_snapshot_records` of a
        :meth:`_live_snapshot` taken and read under the lock."""
        return self._snapshot_records(self._live_snapshot())

    def _live_snapshot(self, skip: Callable[[int], bool] | None = None) -> LiveSnapshot:
        """The live records of this moment, for an export (lock held): the
        hot ones read now (bounded by the hot window), the archive files
        pinned (``skip(no)``: file ``no`` left out: none of its records is
        wanted) for :meth:`_snapshot_records` to read, with or without the
        lock. A record cooled meanwhile is in a file not pinned; a pinned
        file stays live until it is read (an erasure or a merge replacing
        it waits); a message deleted meanwhile is still in the snapshot."""
        ks = list(self._index.channels())
        locs = np.concatenate([self._index.channel_locs(k, -1) for k in ks]) if ks else np.zeros(0, np.int64)
        # (a cached record serves unless it has tool calls: a reader may have
        # edited its dicts in place, and another store must get what was
        # appended; every line is checked, the others copied to decode after)
        hits, _misses = self._decoded.get_many(locs.tolist())
        hot: list[ConversationMessageRecord | None] = [
            None if hit is None or hit[0].tool_calls else hit[0] for hit in hits]
        del hits
        todo = np.fromiter((rec is None for rec in hot), dtype=bool, count=len(hot))
        self._index.check_lines(locs[~todo].tolist())
        lines = [(np.flatnonzero(todo), self._copy_lines(locs[todo]))]
        self._bound_maps()
        return LiveSnapshot(hot, lines, self._cool.pin_live(skip), frozenset(self._cool_deleted))

    def _snapshot_records(self, snap: LiveSnapshot, newer: _Since | None = None,
                          ) -> list[ConversationMessageRecord]:
        """The records of ``snap``: its hot ones and every row of its
        pinned files but the deleted ones, each file unpinned once read
        (all of them if the read fails); ``newer``: an export since a stamp,
        which reads only the files it wants and learns the newest stamp of
        those it reads. Those with tool calls are decoded from their
        bytes (a reader may have edited a cached record's dicts in place;
        another store must get what was appended), none kept in a cache (an
        export reads each message once). The archive is read a part at a
        time under the archive's lock only (appends ask it whether an id is
        archived): StoreClosedError if the repository closed meanwhile."""
        out, nos, deleted = snap.hot, snap.files, snap.deleted
        try:
            _place_copies(out, snap.lines)      # (the copies go before the archive is read)
            while nos:
                if newer is not None and not newer.wanted(nos[0]):
                    self._cool.unpin(nos.pop(0))
                    continue
                got: list[ConversationMessageRecord] = []
                for locs in self._cool.file_locs(nos[0], tuning.EXPORT_PART_ROWS):
                    with self._cool.locked():
                        # (close() marks the store closed, then releases the
                        # archive's readers under this lock)
                        self._check_open()
                        part = self._cool_read(locs)
                    got += [rec for rec, _o in part if not deleted or rec.msg_id not in deleted]
                if newer is not None:
                    newer.read(nos[0], got)
                out += got
                self._cool.unpin(nos.pop(0))
        finally:
            for no in nos:
                self._cool.unpin(no)
            nos.clear()
        return out

    def _export_changes(self, cursor: tuple[str, int] | None) -> tuple[list[_sync.OpRecord], tuple[str, int]]:
        """``(ops, cursor)``: the ops of the messages stored and deleted
        since ``cursor`` (what an earlier call returned), found from the
        envelopes the event store took since (a message stored, merged or
        journaled again; a deletion), and the cursor after them: the work
        follows what changed, not the size of the store. A message deleted
        since has its tombstone's op only. With no cursor, or one of another
        event store file (its device and inode) or past its end, every op
        (:meth:`export_ops`: the archive read without the lock). Ordered by
        ``(hlc, op_id)``."""
        with collector_paused():      # (see export_ops)
            snap = None
            with self._lock:
                self._check_writable()
                events = self._events
                assert events is not None       # (a writer always has its event store)
                st = os.stat(events.path)
                ident, end = f"{st.st_dev}:{st.st_ino}", events.line_end()
                start = cursor[1] if cursor is not None and cursor[0] == ident else -1
                if not 0 <= start <= end or events.next_line_start(start) != start:
                    snap, tomb_ops, _read = self._export_snapshot()
                else:
                    records, tomb_ops = self._changed(events, start, end)
            if snap is not None:
                records = self._snapshot_records(snap)
            # (consume: the list emptied, the records freed as their ops are made)
            return export_ops_of(records, tomb_ops, consume=True), (ident, end)

    def _changed(self, events: Any, start: int, end: int,
                 ) -> tuple[list[ConversationMessageRecord], list[_sync.OpRecord]]:
        """The records stored and the tombstones' ops of the ids deleted
        that the envelopes from ``start`` to ``end`` name (lock held)."""
        stored: dict[str, None] = {}
        deleted: dict[str, None] = {}
        for env in events.iter_envelopes(start):
            if env["offset"] >= end:
                break
            kind = env.get("type")
            if kind == "conversation.message":
                stored[env.get("id")] = None
            elif kind == "conversation.deleted":
                deleted[env.get("id")] = None
        records = [rec for rec in map(self._export_record, stored) if rec is not None]
        tomb_hlc = self._tombfile.hlcs_by_id() if deleted else {}
        tomb_ops = [_sync.tombstone_op(mid, tomb_hlc.get(mid) or str(self._clock.now()), self._tombstones[mid])
                    for mid in deleted if mid in self._tombstones]
        return records, tomb_ops

    def _export_record(self, msg_id: Any) -> ConversationMessageRecord | None:
        """The stored record of ``msg_id`` as it was appended (lock held),
        or None if it is not stored (deleted since)."""
        if type(msg_id) is not str or msg_id in self._tombstones:
            return None
        loc = self._index.find_id(msg_id)
        if loc == -2:
            loc = self._index.find(codec.key(msg_id))
        if loc >= 0:
            return self._export_hot(loc)
        return self._cool_exact(msg_id)

    def _merge_ops(self, ops: Iterable[Any]) -> int:
        """merge_ops: every op read and its record checked first, without
        the lock (a bad one raises ValueError naming it before anything is
        written); then the clock and the tombstones under the lock; then
        the messages appended tuning.MERGE_PART at a time (the first sync
        of a device from a store of 1,000,000 messages held the lock for
        its whole read and write, tens of seconds; appends and reads now
        go on between the parts, each durable on its own)."""
        with self._lock:
            self._check_writable()      # (a viewer or a closed store refuses before reading the ops)
        records: list[ConversationMessageRecord] = []
        tomb_ids: list[str] = []
        tomb_hlc: dict[str, str] = {}
        tomb_ch: dict[str, str] = {}
        newest = None
        for raw in ops:
            op = _sync.as_op(raw)
            payload = op.payload
            if newest is None or _TUPLE_GT(op.hlc, newest):
                newest = op.hlc
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
        with self._lock:
            self._check_writable()
            if newest is not None:
                # the clock passes every stamp merged: the newest's observed
                # passes the others' (one call, not one an op)
                self._observe(newest)
                self._note_unheld_stamp()       # (an op refused or a duplicate: its stamp is stored nowhere)
            if tomb_ids:
                self._delete_ids(tomb_ids, record_unknown=True, hlcs=tomb_hlc, channels=tomb_ch)
        part = tuning.MERGE_PART
        return sum(self.append_many(records[a:a + part]) for a in range(0, len(records), part))


def _place_copies(out: list[Any], lines: list[tuple[np.ndarray, HotCopy]]) -> None:
    """Decode the hot lines of ``lines`` (their places in ``out``, their
    copy) into ``out``, then let the copies go."""
    for places, copy in lines:
        for i, at in enumerate(places.tolist()):
            out[at] = copy.record(i)
    lines.clear()


class LiveSnapshot(NamedTuple):
    """What :meth:`Exchange._live_snapshot` took: the hot records (None where
    a line is to be decoded), the copies of those lines (their places in
    ``hot``, and the copy; emptied once decoded), the archive files pinned
    (numbers, oldest first; emptied as they are read and unpinned) and the
    ids deleted whose rows they still hold."""
    hot: list[Any]
    lines: list[tuple[np.ndarray, HotCopy]]
    files: list[int]
    deleted: frozenset[str]
