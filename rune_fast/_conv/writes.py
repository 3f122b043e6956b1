"""The write path: which messages of a batch are new, their lines written to the
tail and indexed, their envelopes journaled, the clock moved past their stamps."""
from __future__ import annotations

import logging
import math
import time
from typing import Any, cast


from .. import codec
from .._encode import FrameBuffer, HashJob, frame_messages, message_envelopes
from ..errors import DurabilityError, RuneError
from ..events import EventStore
from ..records import ConversationMessageRecord
from ..segments import TailFile
from . import tuning
from .common import (_own, _sorts_before)

from .host import Host

log = logging.getLogger("rune_fast")


class WritePath(Host):
    """Appends (a mixin of the repository); group commit is WriteThread's."""

    #: the room a batch's lines are framed in, reused by the next batch
    #: (lock held; made at the first batch: see _encode.FrameBuffer)
    _frame_buf = None

    def _fresh(self, msgs: list[ConversationMessageRecord], keys: list[bytes]) -> list[int]:
        """Indexes of the messages of a batch to write: the first of each id
        that no tier holds and no tombstone names (lock held)."""
        tombs = self._tombstones
        if len(msgs) == 1:
            fresh = [] if msgs[0].msg_id in tombs or self._index.find(keys[0]) >= 0 else [0]
        else:
            found = self._index.find_many(keys)
            if not tombs and not (found >= 0).any() and len(set(keys)) == len(keys):
                fresh = list(range(len(msgs)))      # the common batch: every id new, none twice
            else:
                seen: set[str] = set()
                fresh = []
                for i, (m, f) in enumerate(zip(msgs, found.tolist())):
                    mid = m.msg_id
                    if f >= 0 or mid in seen or mid in tombs:
                        continue
                    seen.add(mid)
                    fresh.append(i)
        if fresh and self._cool.has_files():
            if len(fresh) == 1:
                fresh = [] if self._cool.contains(msgs[fresh[0]].msg_id) else fresh
            else:
                ids = [m.msg_id for m in msgs] if len(fresh) == len(msgs) else [msgs[i].msg_id for i in fresh]
                archived = self._cool.contains_many(ids)
                if archived.any():      # (the common batch: none archived, fresh stays)
                    fresh = [i for i, hit in zip(fresh, archived.tolist()) if not hit]
        return fresh

    def _write_messages(self, msgs: list[ConversationMessageRecord], bodies: list[bytes],
                        hashes: HashJob, keys: list[bytes]) -> tuple[int, int, tuple | None, Any]:
        """Write the new ones among ``msgs`` to the tail and index them (lock
        held); ``hashes`` gives their payload hashes (the HashJob of
        ``codec.encode_batch(..., hash_job=...)``). Returns (the count to
        wait durable for, how many were new, the token of a sync started in
        the background or None). For a batch of
        at least ``tuning.SYNC_OVERLAP_MIN`` new messages the tail's sync
        starts right after the write (WriteThread.sync_begin), so the
        indexing, caching and journaling here overlap it; the caller passes
        the token to ``self._writes.sync_end`` (outside the lock), then waits
        as usual: nothing is acknowledged before it is durable. Such a
        batch's envelopes are written to the journal by a thread of their
        own from right after the tail's write (EventStore.append_encoded,
        ``background``): the fourth value, which the caller ends
        (:meth:`_journal_end`, outside the lock; every other use of the
        event store waits for it first, so the journal keeps the order of
        the calls), else None."""
        fresh = self._fresh(msgs, keys)
        if not fresh:
            return 0, 0, None, None
        seq0 = self._take_seqs(len(fresh))
        if len(fresh) == 1:
            data, lengths = frame_messages(bodies, fresh, seq0)
        else:
            room = self._frame_buf
            if room is None:
                room = self._frame_buf = FrameBuffer()
            data, lengths = frame_messages(bodies, fresh, seq0, room)
        # a writer always has its tail and event store (None only in a viewer)
        tail = cast("TailFile", self._tail)
        try:
            off, remapped = tail.append(data)
        except DurabilityError as exc:
            self._writes.fail(exc)
            raise
        seg = self._tail_seg
        target = self._writes.wrote((seg << 40) | (off + len(data)), len(data))
        journal = None
        if len(fresh) >= tuning.SYNC_OVERLAP_MIN:
            token = self._writes.sync_begin()
            # (after the tail's write: recovery reads an envelope whose line
            # no tier holds as a lost acknowledged append)
            journal = self._journal(keys, hashes, fresh, background=True)
        else:
            token = None
            if self.durability != "none":
                # the lines' pages go to the disk now; the indexing, caching
                # and journaling below overlap the write, and the sync that
                # acknowledges them waits for less (TailFile.start_writeback)
                tail.start_writeback(off, len(data))
        try:
            self._index_written(msgs, fresh, keys, hashes, seq0, lengths, seg, off, len(data), remapped,
                                journal=journal is None)
            if isinstance(journal, BaseException):
                raise journal           # (the batch is indexed: "maybe stored", as below)
        except BaseException:
            if token is not None:
                try:
                    self._writes.sync_end(token)
                except (OSError, DurabilityError):
                    pass                # (recorded for every waiter; the first error is raised)
            if not isinstance(journal, BaseException):
                self._journal_given_up(journal, len(fresh))
            raise
        return target, len(fresh), token, journal

    def _index_written(self, msgs: list[ConversationMessageRecord], fresh: list[int], keys: list[bytes],
                       hashes: HashJob, seq0: int, lengths: list[int], seg: int, off: int, n: int,
                       remapped: bool, journal: bool = True) -> None:
        """The rest of _write_messages once the lines ``fresh`` of ``msgs``
        are written at ``off`` of the tail (``n`` bytes): index and cache
        them, move the clock past their stamps, journal their envelopes
        (unless ``journal`` is false: begun by the caller)."""
        tail = cast("TailFile", self._tail)
        data_end = off + n
        if remapped:
            self._reattach_tail()
        if len(fresh) == 1:
            if not self._index_one((seg << 40) | off):   # cannot happen: checked above under the lock
                raise RuneError(f"index refused new message {msgs[fresh[0]].msg_id!r} at "
                                f"{tail.path}:{off}")
        else:
            rep = self._index_ingest(seg, off, data_end)
            if rep.good_end != data_end or len(rep.added) != len(fresh):
                raise RuneError(f"index took {len(rep.added)} of the {len(fresh)} new messages "
                                f"written at {tail.path}:{off}")
        # (a search scans the tail, and builds its filters, up to its lines'
        # end, not over the zeros reserved after them)
        self._index.set_lines_end(seg, data_end)
        # the decode cache keeps the batch's newest records (at most
        # APPEND_CACHE_MAX: see there)
        skip = max(0, len(fresh) - min(tuning.APPEND_CACHE_MAX, tuning.DECODE_CACHE))
        if len(self._decoded) + len(fresh) - skip > tuning.DECODE_CACHE:
            self._trim_cache(len(fresh) - skip)
        # (a caller's later edit of its record's tool calls is not the stored
        # value: _own; each counted as record_bytes does; compiled)
        self._decoded.put_appended(msgs, fresh, lengths, (seg << 40) | off, seq0, skip,
                                   tuning.RECORD_OVERHEAD, tuning.TOOL_CALL_BYTES, _own)
        interleaved, fold = self._interleaved, self._fold_order
        behind, cool_max = self._behind, self._cool_max
        for i in fresh:
            m = msgs[i]
            ch = m.channel_id
            if ch in interleaved:
                self._note_order(m)
            if behind is not None and ch in cool_max and ch not in behind \
                    and _sorts_before(m, cool_max[ch]):
                self._note_behind(ch)   # it sorts before a cool row (see _excess_behind_cool)
            if ch in fold:
                self._note_fold_order(m)
        self._observe_stamps(msgs if len(fresh) == len(msgs) else [msgs[i] for i in fresh])
        self._count_uncompacted(len(fresh))
        self._count_changes(len(fresh))
        self._count_stored(len(fresh))
        if journal:
            exc = self._journal(keys, hashes, fresh, background=False)
            if exc is not None:
                raise exc

    def _journal(self, keys: list[bytes], hashes: HashJob, fresh: list[int], *, background: bool) -> Any:
        """Journal the envelopes of the new messages ``fresh`` with one
        write (durable by the next checkpoint, re-derived from the tail by
        recovery if a crash loses it first). ``background``: in a thread of
        its own, returns what :meth:`_journal_end` ends. A failure makes the
        store refuse writes and is returned as a DurabilityError naming the
        journal (the lines are in the tail: "maybe stored", as after a
        failed sync)."""
        events = cast("EventStore", self._events)
        try:
            # (the payload hashes: a large batch's were computed by a C thread
            # since its encoding, overlapping the write and the indexing)
            envelopes = message_envelopes(keys, hashes, fresh, codec.dumps(time.time()))
            if background:
                return events.append_encoded(envelopes, offset=False, background=True)
            events.append_encoded(envelopes, offset=False)
            return None
        except (OSError, DurabilityError) as exc:
            return self._journal_failed(exc, len(fresh))

    def _journal_failed(self, exc: BaseException, n: int) -> DurabilityError:
        self._writes.fail(exc)
        events = cast("EventStore", self._events)
        err = DurabilityError(f"journal of {n} message(s) in {events.path} failed: {exc}; "
                              "the store refuses writes until reopened")
        err.__cause__ = exc
        return err

    def _journal_given_up(self, journal: Any, n: int) -> None:
        """End the journal write :meth:`_write_messages` began when the call
        fails anyway (its sync or its compaction raised, which is what the
        caller raises)."""
        if journal is not None:
            try:
                self._journal_end(journal, n)
            except DurabilityError:
                pass

    def _journal_end(self, journal: Any, n: int) -> None:
        """End the journal write :meth:`_write_messages` began (outside the
        lock); DurabilityError as :meth:`_journal` gives."""
        try:
            journal.end()
        except DurabilityError as exc:
            raise self._journal_failed(exc, n) from exc

    def _observe_stamps(self, recs: list[ConversationMessageRecord]) -> None:
        """Let the clock observe the stamps of stored records: each ``hlc``,
        and for the unstamped ones the latest ``ts`` once (its section 7
        stamp passes the others')."""
        newest = -math.inf
        for m in recs:
            if m.hlc:
                self._observe(m.hlc)
            elif m.ts > newest:
                newest = m.ts
        if newest * 1000 > self._clock.last_wall:
            self._observe_derived(newest)

    def _observe(self, hlc: Any) -> None:
        """Let the clock observe a stored stamp. A stamp that is not in the
        section 7 form, or one at the clock's very end, is stored as given but
        cannot move the clock."""
        try:
            self._clock.observe(hlc)
        except ValueError as exc:
            log.debug("clock does not observe %r: %s", hlc, exc)

    def _observe_derived(self, ts: float) -> None:
        """Let the clock pass the stamp section 7 gives an unstamped message
        of time ``ts``, ``Hlc(round(ts*1000), 0, origin)``: a later stamp of
        this store (a deletion's tombstone, a caller's ``clock.now()``) then
        sorts after it, as one from a store that merged it would. Appends call
        it once a batch, for the latest such ts, when it is past the clock's
        wall time; a ts outside the Hlc's range makes no stamp and moves
        nothing."""
        try:
            self._clock.pass_wall(round(ts * 1000))
        except (ValueError, OverflowError):
            pass
