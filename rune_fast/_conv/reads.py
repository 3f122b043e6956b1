"""Reads: a location to verified record (the decode caches, the mapped pages'
budget), channel windows and tasks across the hot and cool tiers, exact reads."""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, NamedTuple, cast

import numpy as np


from .. import _encode, _index, codec
from ..errors import CorruptStateCheckpointError, RuneError
from ..records import ConversationMessageRecord, message_from_stored
from .._index import LocCache
from .._order import order_key
from ..cool.reads import parts_locs
from ..segments import seg_name
from . import tuning
from .common import (_COOL_RANK, _HOT_RANK, _MAX_N, _OFF_MASK, MessageRead, ReadStatus,
                     _first, _order_key, _own, _sorts_before, _tag_matches, _unkey, _xkey, own_calls)

from .host import Host
from .maps import MapBudget

log = logging.getLogger("rune_fast")


#: What the cool id index's kept answers cost (``IdRuns.memo_bytes``: a
#: fixed table, allocated at the first exact read of an archived message).
ID_MEMO_BYTES = _index.IdRuns().memo_bytes


def cache_budgets(total: int) -> tuple[int, int, int, int]:
    """``cache_bytes`` split as ``(hot, cool, dense, groups)``: the decoded
    hot records, the decoded cool records, the cool records kept as their
    lines' bytes, and the cool tier's row groups (see tuning.CACHE_BYTES).
    The row groups get a quarter of what passes CACHE_MIN_BYTES (at most
    COOL_CACHE_BYTES: a budget near the floor would hold two or three, of
    no use to anyone); of the rest, half the hot records (window reads and
    the newest appends, the most asked: the bench's 100 channels' windows
    need ~1.4 MiB), and of the other half, less what the cool id index
    keeps of exact reads' answers (ID_MEMO_BYTES) once the budget is that
    large, three quarters the cool rows' lines (at most what DECODE_CACHE
    lines use, TASK_ROW_BYTES each) and the rest their decoded records
    (the same rows again: a line costs ~870 bytes where a record costs
    ~1,800. The bench's loop of 2,000 gets at 100,000 messages, 1,083
    archived, is served within the 3.25 MiB floor by the lines of all of
    them and the records of a fifth, ~1.5 us a decode, where a miss reads
    its row's pages, ~100 us)."""
    groups = max(0, min((total - tuning.CACHE_MIN_BYTES) // 4, tuning.COOL_CACHE_BYTES))
    hot = (total - groups) // 2
    cool = total - groups - hot
    if cool >= 4 * ID_MEMO_BYTES:
        cool -= ID_MEMO_BYTES
    dense = min(cool * 3 // 4, tuning.DECODE_CACHE * tuning.TASK_ROW_BYTES)
    return hot, cool - dense, dense, groups


def canonical_record(line: bytes | memoryview) -> tuple[ConversationMessageRecord, int] | None:
    """(record, append sequence) of a checked line spelled as the encoder
    spells it, by the compiled decoder; None for any other line (the
    compiled reads then leave it to :func:`codec.record_from_line`, whose
    Python path names what is wrong)."""
    return _encode.record_from_line(line, ConversationMessageRecord, codec._calls_from_json)


def line_record(line: bytes | memoryview, path: str, offset: int) -> ConversationMessageRecord:
    """The record of a checked hot line (a copy of its bytes, read without
    the lock: an export's or a check's), by the compiled decoder, else the
    Python path, which names what is wrong (CorruptStateCheckpointError
    naming ``path`` and ``offset``)."""
    return (canonical_record(line) or codec.record_from_line(bytes(line), path=path, offset=offset))[0]


class HotCopy(NamedTuple):
    """Hot lines checked and copied in one compiled pass under the lock
    (:meth:`Reads._copy_lines`): their bytes one after the other, where
    each starts, their locations and the path of each of their segments;
    :meth:`record` decodes one after the lock."""
    data: bytes
    starts: np.ndarray
    locs: np.ndarray
    paths: dict[int, str]

    def record(self, i: int) -> ConversationMessageRecord:
        """The record of line ``i`` (CorruptStateCheckpointError naming its
        file and offset if it does not decode)."""
        a, loc = int(self.starts[i]), int(self.locs[i])
        b = int(self.starts[i + 1]) if i + 1 < len(self.starts) else len(self.data)
        return line_record(memoryview(self.data)[a:b - 1], self.paths[loc >> 40], loc & _OFF_MASK)


#: What stands for a dense line's frame checksum (its bytes are the
#: record's, encoded by this process; nothing reads the checksum).
_DENSE_HEAD = b'{"x":"' + b"0" * 16 + b'"'


def dense_lines(hits: list[tuple[ConversationMessageRecord, int]]) -> list[bytes | None]:
    """The line of each verified ``(record, ord)`` as the encoder spells a
    hot line (ord as its append sequence): what the cache of cool lines
    keeps, decoded again by :func:`canonical_record` (None for an ord that
    is not a sequence; all None if the batch does not encode: a read never
    fails for what its cache could not keep)."""
    try:
        bodies, _canon, _keys = codec.encode_batch([rec for rec, _o in hits], defer_hash=True)
    except (ValueError, TypeError, RuneError):
        return [None] * len(hits)
    return [None if type(o) is not int or o < 0 else
            b"".join((_DENSE_HEAD, codec.MESSAGE_PREFIX, body, b',"s":', str(o).encode(), b"}"))
            for body, (_rec, o) in zip(bodies, hits)]


def record_bytes(rec: ConversationMessageRecord) -> int:
    """About what ``rec`` held in a decode cache costs (what the caches count
    against their bytes): its content as Python holds it (1, 2 or 4 bytes a
    character, see sys.getsizeof) and a fixed overhead per record and per
    tool call (tuning.RECORD_OVERHEAD)."""
    return (tuning.RECORD_OVERHEAD + sys.getsizeof(rec.content)
            + tuning.TOOL_CALL_BYTES * len(rec.tool_calls))


def _found(rec: ConversationMessageRecord, tier: str, _new: Any = object.__new__,
           _set: Any = object.__setattr__, _status: ReadStatus = ReadStatus.FOUND_VERIFIED) -> MessageRead:
    """``MessageRead(FOUND_VERIFIED, rec, tier)``, made without the frozen
    dataclass's __init__ (three object.__setattr__ calls: half an exact
    read's cost once the record is cached). tests/test_hot_reads.py checks
    it equals the constructor's."""
    r = _new(MessageRead)
    _set(r, "__dict__", {"status": _status, "record": rec, "tier": tier})
    return r


class HotReads(Host):
    """Hot and cool reads with their decode caches (a mixin of the repository)."""

    # ---- the state this room owns: written here only (tests/test_ownership.py)

    def _init_reads_state(self) -> None:
        self._maps = MapBudget(self.hot_dir)
        # the caches' budget in bytes now: cache_bytes, or by default one
        # that grows with the store (_scale_caches)
        self._cache_now = tuning.CACHE_MIN_BYTES if self.cache_bytes is None else self.cache_bytes
        self._cache_rescale_left = 0

    def _scale_caches(self) -> None:
        """The default budget (``cache_bytes=None``) for the store's size:
        CACHE_MIN_BYTES for its first CACHE_FLOOR_MESSAGES messages taken
        (the append sequence) and CACHE_MESSAGE_BYTES for each one beyond,
        at most CACHE_BYTES; each cache
        given its share at once (a smaller one drops its oldest entries).
        Called by the open (no cool sidecar read) and by appends once they
        grew the store by an eighth: a store loaded in bulk from empty gets
        the budget of its size."""
        if self.cache_bytes is not None:
            return
        taken = self._next_seq
        self._cache_rescale_left = max(taken // 8, 64)
        total = min(tuning.CACHE_MIN_BYTES + tuning.CACHE_MESSAGE_BYTES * max(0, taken - tuning.CACHE_FLOOR_MESSAGES),
                    tuning.CACHE_BYTES)
        if total == self._cache_now:
            return
        self._cache_now = total
        hot, cool, dense, groups = cache_budgets(total)
        self._decoded.max_bytes = hot
        self._cool_decoded.max_bytes = cool
        self._cool_dense.max_bytes = dense
        self._cool.set_cache_bytes(groups)

    def _count_stored(self, n: int) -> None:
        """``n`` more messages appended: the default cache budget follows
        the store's growth (see _scale_caches)."""
        self._cache_rescale_left -= n
        if self._cache_rescale_left <= 0:
            self._scale_caches()

    def _reset_read_caches(self) -> None:
        # location -> (record, append sequence) of lines decoded, at most
        # _DECODE_CACHE, one of the older half dropped for room (a
        # dict-like table the compiled window and task reads look up)
        self._decoded = LocCache(tuning.DECODE_CACHE, cache_budgets(self._cache_now)[0], aged=True)
        # cool_loc (file number << 32 | row) -> (record, ord): cool rows read
        # and verified once, so a task, an exact read or a search asked again
        # skips their assembly and digest (file numbers are never reused: a
        # merged or erased file's rows are simply never looked up again)
        self._cool_decoded = LocCache(tuning.DECODE_CACHE, cache_budgets(self._cache_now)[1], aged=True)
        # cool_loc -> the line (bytes: dense_lines) of a verified cool row:
        # the same rows and more in less memory, decoded again when the
        # cache of records has let them go
        self._cool_dense = LocCache(tuning.DECODE_CACHE, cache_budgets(self._cache_now)[2], aged=True)
        # channel -> whether a hot message sorts before a cool one (computed lazily)
        self._interleaved = {}
        # task -> _task_clock after its last bulk read of archived rows, and
        # the archived rows such reads returned so far (_admit_task)
        self._task_asks = {}
        self._task_clock = 0

    def _forget_interleaving(self) -> None:
        """The order verdicts no longer hold (rows moved between tiers)."""
        self._interleaved.clear()

    def _forget_decoded(self, loc: int) -> None:
        self._decoded.pop(loc, None)

    def _forget_decoded_many(self, locs: Any) -> None:
        pop = self._decoded.pop
        if isinstance(locs, np.ndarray):
            # (a piece at a time as ints: a list of them whole is ~36 bytes
            # a location, numpy scalars one by one are slower)
            for a in range(0, len(locs), 4096):
                for loc in locs[a:a + 4096].tolist():
                    pop(loc, None)
            return
        for loc in locs:
            pop(loc, None)

    def _cache_decoded(self, loc: int, hit: tuple, nbytes: int = 0) -> None:
        """Keep ``hit`` ((record, append sequence)) of the line at ``loc``,
        counted as ``nbytes`` against the cache's byte bound."""
        self._decoded.put(loc, hit, nbytes)

    def _move_decoded(self, old_locs: Any, new_locs: Any) -> None:
        """The lines at ``old_locs`` moved to ``new_locs`` (a segment rewrite)."""
        self._decoded.move_many(old_locs, new_locs)

    def _path_of(self, seg: int) -> str:
        if seg == self._tail_seg and self._tail is not None:
            return self._tail.path
        s = self._segs.get(seg)
        return s.path if s is not None else os.path.join(self.hot_dir, seg_name(seg))

    def _where(self, loc: int) -> tuple[str, int]:
        """The file and offset of the hot line at ``loc`` (to name it)."""
        return self._path_of(loc >> 40), loc & _OFF_MASK

    def _copy_lines(self, locs: np.ndarray) -> HotCopy:
        """The hot lines at ``locs``, each checked, copied by one compiled
        call (lock held; CorruptStateCheckpointError for the first damaged
        one): what an export or a check decodes after the lock
        (:meth:`HotCopy.record`). At 1,000,000 messages an export's 66,000
        hot lines held the lock 115-160 ms checked and copied one call each."""
        locs = np.asarray(locs, dtype=np.int64)
        data, starts = self._index.gather_lines(locs)
        self._maps.read(len(locs))
        return HotCopy(data, starts, locs, {seg: self._path_of(seg) for seg in np.unique(locs >> 40).tolist()})

    def _tier_of(self, loc: int) -> str:
        seg, off = loc >> 40, loc & ((1 << 40) - 1)
        return "tail" if seg == self._tail_seg and off >= self._covered else "hot"

    def _read_loc(self, loc: int) -> ConversationMessageRecord:
        """The verified record at ``loc``; CorruptStateCheckpointError if damaged."""
        return self._read_loc_seq(loc)[0]

    def _read_loc_seq(self, loc: int) -> tuple[ConversationMessageRecord, int | None]:
        """The verified record at ``loc`` and its append sequence."""
        hit = self._decoded.get(loc)
        if hit is None:
            hit = self._decode_loc(loc)
            self._cache(loc, hit)
        else:
            self._index.line(loc)        # verifies the checksum, names seg and offset
        return hit

    def _fill_misses(self, locs: list[int], hits: list[Any], misses: int, keep: bool,
                     ) -> list[tuple[ConversationMessageRecord, int | None]]:
        """``hits`` (what the decode cache held for the hot lines at
        ``locs``, None where it held nothing: ``misses`` of them) with each
        None replaced by the record and sequence of its line, decoded now
        (the line checked again), and kept in the cache when ``keep``:
        :meth:`_read_loc_seq` without its calls a line. A loop over more
        tasks than the cache holds kept every line it decoded, and came
        round to none of them, and their churn pushed out the records
        windows and exact reads come back to (interleaved loops of the
        three at 1,000,000 messages: window 6.7 -> 1.9 us; at 100,000,
        where a task's ~90 messages are half hot, messages_for_task 0.45
        -> 0.36 ms and get_message 15.0 -> 5.6 us)."""
        if self._maps.read(misses):
            self._bound_maps()
        line, put = self._index.line, self._decoded.put
        out = []
        for loc, hit in zip(locs, hits):
            if hit is None:
                raw = line(loc)
                hit = canonical_record(raw)
                if hit is None:
                    hit = codec.record_from_line(raw, path=self._path_of(loc >> 40), offset=loc & _OFF_MASK)
                if keep:
                    put(loc, hit, record_bytes(hit[0]))
            out.append(hit)
        return out

    def _exact_hit(self, loc: int) -> tuple[ConversationMessageRecord, int | None] | None:
        """The decode cache's entry for ``loc`` if it is what was appended:
        not one with tool calls, whose dicts a reader may have edited in
        place. For the reads whose result leaves the store (export: _all_records)."""
        hit = self._decoded.get(loc)
        return hit if hit is not None and not hit[0].tool_calls else None

    def _decode_loc(self, loc: int) -> tuple[ConversationMessageRecord, int | None]:
        """The record at ``loc`` and its append sequence, decoded from its
        checked bytes (never from the decode cache): by the compiled
        decoder, else the Python path (which names what is wrong)."""
        if self._maps.read():
            self._bound_maps()
        line = self._index.line(loc)
        return canonical_record(line) or codec.record_from_line(line, path=self._path_of(loc >> 40),
                                                                offset=loc & ((1 << 40) - 1))

    def _bound_maps(self) -> None:
        """Release the mapped pages (lock held) if the resident file pages
        grew past MAP_BUDGET_BYTES since the last release (see
        :class:`MapBudget`). Called every MAP_RELEASE_READS decoded lines and
        after the passes that read lines by the thousand: a search (the first
        after an open checks every hot line), a compaction, verify(), a
        rebuild."""
        if self._maps.over():
            self._release_maps()

    def _release_maps(self) -> None:
        """Drop the pages reads mapped in the segment and tail maps from this
        process's page tables (lock held): they stay in the page cache, and a
        read of one maps it again. Called when reads mapped more than
        MAP_BUDGET_BYTES (:meth:`_bound_maps`) and at close, so resident
        memory follows the lines read lately, not every line read since the
        open. Record-cache hits check their lines through the maps too: the
        pages of a working set under the budget stay mapped."""
        bufs = [seg.buf for seg in self._segs.values()]
        if self._tail is not None:
            bufs.append(self._tail.buf)
        self._maps.release(bufs)

    def _cache(self, loc: int, hit: tuple[ConversationMessageRecord, int | None]) -> None:
        """Keep ``hit``; the cache drops its oldest entries past its bounds
        (DECODE_CACHE entries, its share of ``cache_bytes``)."""
        self._decoded.put(loc, hit, record_bytes(hit[0]))

    def _trim_cache(self, room: int) -> None:
        self._decoded.make_room(room)

    @staticmethod
    def _cool_record(row) -> ConversationMessageRecord:
        d = row.record if hasattr(row, "record") else row
        try:
            return message_from_stored(d, fresh_json=getattr(row, "plain", False))
        except (TypeError, ValueError, KeyError) as exc:
            raise CorruptStateCheckpointError(f"archived record does not validate: {exc}",
                                              path=getattr(row, "file", None),
                                              offset=getattr(row, "row", None)) from None

    def _cool_has_channel(self, channel_id: str) -> bool:
        return self._cool.channel_len(channel_id) > 0

    def _cool_max_order(self, channel_id: str) -> tuple | None:
        """(hlc, msg_id) of the channel's newest stamped cool row, or None."""
        return self._cool_max.get(channel_id)

    def _note_order(self, m: ConversationMessageRecord) -> None:
        """Keep the interleave verdict of the channel true after an append."""
        if self._interleaved.get(m.channel_id) is False:
            last = self._cool_max_order(m.channel_id)
            if last is not None and _sorts_before(m, last):
                self._interleaved[m.channel_id] = True

    def _is_interleaved(self, channel_id: str) -> bool:
        """Whether some hot message of the channel sorts before one of its cool
        rows (a late merge or an unstamped message after stamped ones were
        cooled): reads then merge the tiers in full. The hot array is sorted,
        so its first message decides."""
        verdict = self._interleaved.get(channel_id)
        if verdict is None:
            verdict = False
            last = self._cool_max_order(channel_id)
            if last is not None:
                locs = self._index.channel_locs(codec.key(channel_id), -1)
                if len(locs):
                    first = self._read_loc(int(locs[0]))
                    # (the cool tier asked last: a first read of a channel
                    # whose hot messages are newer never opens its index)
                    verdict = (_sorts_before(first, last)
                               and self._cool_has_channel(channel_id))
            self._interleaved[channel_id] = verdict
        return verdict

    def _get_message(self, msg_id: str) -> MessageRead:
        if msg_id in self._tombstones:
            return MessageRead(ReadStatus.NOT_FOUND_CONFIRMED)
        k = None
        loc = self._index.find_id(msg_id)
        if loc == -2:           # (an id whose key holds JSON escapes)
            k = codec.key(msg_id)
            loc = self._index.find(k)
        rec: ConversationMessageRecord | None
        if loc >= 0:
            tier = "tail" if loc >> 40 == self._tail_seg and loc & _OFF_MASK >= self._covered else "hot"
            try:
                # one compiled call: the line checked, its record cached or decoded and kept
                got = self._index.read_record(loc, self._decoded, canonical_record, record_bytes)
                if got is None:
                    rec = self._read_loc(loc)
                else:
                    rec, decoded = got
                    if decoded and self._maps.read():
                        self._bound_maps()
            except CorruptStateCheckpointError as exc:
                self._read_damage("exact read of %s: %s", msg_id, exc)
                return MessageRead(ReadStatus.SOURCE_CORRUPT, None, tier)
            if rec.msg_id != msg_id:
                return MessageRead(ReadStatus.SOURCE_CORRUPT, None, tier)
            return _found(_own(rec) if rec.tool_calls else rec, tier)
        # an archived row read before: its record from the cache, found in
        # one compiled call (the id index's kept answer, the cache's slot)
        # (or its line, found the same way and decoded, ~1.5 us; not put in
        # the cache of records: a loop of gets larger than that cache would
        # only churn it)
        rec = self._cool.kept_record(msg_id, self._cool_decoded, self._cool_dense)
        if type(rec) is bytes:
            hit = canonical_record(rec)
            rec = hit[0] if hit is not None else None
            if rec is not None and rec.msg_id == msg_id:
                return _found(rec, "cool")
        elif rec is not None:
            return _found(_own(rec) if rec.tool_calls else rec, "cool")
        try:
            # the rows whose id hashes like msg_id (usually one): kept records, or read now
            locs = self._cool.id_locs(msg_id)
            kept, misses = self._cool_decoded.get_many(locs)
            rec = None
            for r, _o in (self._cool_records(locs, msg_id) if misses else kept):
                if r.msg_id == msg_id:
                    rec = r
                    break
        except CorruptStateCheckpointError as exc:
            self._read_damage("exact read of %s: %s", msg_id, exc)
            return MessageRead(ReadStatus.SOURCE_CORRUPT, None, "cool")
        if rec is None:
            # A hot line indexed under this id's hash whose bytes fail their
            # checksum may be this message with a damaged id: not "not found".
            if k is None:
                k = codec.key(msg_id)
            for cand in self._index.candidates(k).tolist():
                try:
                    line = self._index.line(cand)
                    moved = not _tag_matches(line, k, self._path_of(cand >> 40), cand & _OFF_MASK)
                except CorruptStateCheckpointError as exc:
                    self._read_damage("exact read of %s: %s", msg_id, exc)
                    return MessageRead(ReadStatus.SOURCE_CORRUPT, None, self._tier_of(cand))
                if moved:
                    # a sound line, but not of the id whose hash put it in
                    # this slot: a line moved there (another id sharing the
                    # tag would match it)
                    self._read_damage("exact read of %s: the line at %s:%d is another message's",
                              msg_id, self._path_of(cand >> 40), cand & _OFF_MASK)
                    return MessageRead(ReadStatus.SOURCE_CORRUPT, None, self._tier_of(cand))
            return MessageRead(ReadStatus.NOT_FOUND_CONFIRMED)
        return _found(_own(rec), "cool")

    def _read_damage(self, fmt: str, *args: Any) -> None:
        """Log what made an exact read SOURCE_CORRUPT (a viewer logs it otherwise)."""
        log.error(fmt, *args)

    def _hot_channel(self, channel_id: str, n: int = -1) -> list[tuple[ConversationMessageRecord, str]]:
        locs = self._index.channel_locs(codec.key(channel_id), n)
        return [(self._read_loc(loc), self._tier_of(loc)) for loc in locs.tolist()]

    def _cool_rows(self, rows) -> list[ConversationMessageRecord]:
        if self._cool_deleted:
            rows = [r for r in rows if r.record["msg_id"] not in self._cool_deleted]
        return [self._cool_record(r) for r in rows]

    def _channel_all(self, channel_id: str) -> list[tuple[ConversationMessageRecord, str]]:
        """Every live message of a channel, all tiers, oldest first."""
        hot = self._hot_channel(channel_id)
        if not self._cool_has_channel(channel_id):
            return hot
        return self._merge(self._cool_channel(channel_id), hot)

    def _cool_channel_ids(self, channel_id: str) -> list[str]:
        """The msg_id of every live archived message of the channel, in no
        order, from the msg_id and channel_id columns (CoolArchive.channel_ids:
        no record read), else from the records (which name any damage)."""
        ids = self._cool.channel_ids(channel_id)
        if ids is None:
            return [r.msg_id for r in self._cool_channel(channel_id, ordered=False)]
        deleted = self._cool_deleted
        return [m for m in ids if m not in deleted] if deleted else ids

    def _cool_channel(self, channel_id: str, ordered: bool = True) -> list[ConversationMessageRecord]:
        """Every live archived message of the channel, oldest first (in
        no order unless ``ordered``): read straight from the pages holding
        them (compiled, digests checked: CoolArchive.records_at), the rows
        that path declines through their dicts (which name damage); a row
        of another channel is damage of the index, named."""
        locs = self._cool.channel_locs(channel_id)
        deleted = self._cool_deleted
        keyed = []
        for loc, hit in zip(locs, self._cool_read(locs)):
            rec = hit[0]
            if rec.channel_id != channel_id:
                raise CorruptStateCheckpointError(
                    f"cool index says row {loc & 0xFFFFFFFF} has channel_id {channel_id!r}, "
                    f"the file says {rec.channel_id!r}", path=self._cool.loc_path(loc), offset=loc & 0xFFFFFFFF)
            if not deleted or rec.msg_id not in deleted:
                keyed.append((order_key(rec.hlc, rec.msg_id, hit[1]) if ordered else None, rec))
        if ordered:
            keyed.sort(key=_first)
        return [r for _k, r in keyed]

    def _cool_read(self, locs: list[int]) -> list[tuple[ConversationMessageRecord, int]]:
        """``(record, ord)`` of the archived rows at ``locs``, in their order,
        straight from their pages (compiled, digests checked, nothing
        cached: CoolArchive.records_at), the rows that path declines through
        their dicts (which name damage)."""
        fast = self._cool.records_at(locs, ConversationMessageRecord)
        slow = [loc for loc, hit in zip(locs, fast) if hit is None]
        if not slow:
            return cast("list[tuple[ConversationMessageRecord, int]]", fast)
        rows = dict(zip(slow, self._cool.rows_at(slow)))
        return [hit if hit is not None else (self._cool_record(rows[loc]), rows[loc].ord)
                for loc, hit in zip(locs, fast)]

    @staticmethod
    def _merge(cool: list[ConversationMessageRecord], hot: list[tuple[ConversationMessageRecord, str]],
               ) -> list[tuple[ConversationMessageRecord, str]]:
        keyed = [(_order_key(r, _COOL_RANK, i), r, "cool") for i, r in enumerate(cool)]
        keyed += [(_order_key(r, _HOT_RANK, i), r, t) for i, (r, t) in enumerate(hot)]
        keyed.sort(key=lambda e: e[0])
        return [(r, t) for _k, r, t in keyed]

    def _last_n(self, channel_id: str, n: int) -> list[ConversationMessageRecord]:
        """The window of the facade's ``window``, which asked the common
        one (hot, every record cached, the order not interleaved with the
        cool tier: ``HotIndex.window_cached``) first."""
        if n <= 0:
            return []
        if n > _MAX_N:
            n = _MAX_N          # (a larger n asks for every message the channel can hold)
        verdict = self._interleaved.get(channel_id)
        if verdict is False or (verdict is None and not self._is_interleaved(channel_id)):
            # the hot window in one compiled call: every line checked, the
            # records from the cache or decoded and kept
            got = self._index.window_read(channel_id, n, self._decoded, canonical_record, record_bytes)
            if got is not None:
                recs, decoded = got
                if decoded and self._maps.read(decoded):
                    self._bound_maps()
                if len(recs) >= n or not self._cool_has_channel(channel_id):
                    return own_calls(recs)
                return own_calls([r for r, _t in self._window(channel_id, n)])
            # the last n messages, every line's checksum checked, every read
            locs, recs, misses = self._index.window_hits(codec.key(channel_id), n, self._decoded)
            if len(locs) >= n or not self._cool_has_channel(channel_id):
                if misses:
                    recs = [r if r is not None else self._read_loc(loc) for loc, r in zip(locs, recs)]
                return own_calls(recs)
        return own_calls([r for r, _t in self._window(channel_id, n)])

    def _window(self, channel_id: str, n: int) -> list[tuple[ConversationMessageRecord, str]]:
        if self._is_interleaved(channel_id):
            # (each tier's newest n hold the channel's: not the whole channel, ~1 s at 100,000)
            return self._merge(self._cool_tail(channel_id, n), self._hot_channel(channel_id, n))[-n:]
        hot = self._hot_channel(channel_id, n)
        if len(hot) >= n or not self._cool_has_channel(channel_id):
            return hot
        need = n - len(hot)
        cool = self._cool_tail(channel_id, need)
        return self._merge(cool, hot)[-n:]

    def _cool_tail(self, channel_id: str, n: int) -> list[ConversationMessageRecord]:
        """The channel's newest ``n`` live cool messages, oldest first: the
        rows that can be among them (each file's last ones) read by location
        (:meth:`_cool_records`: kept records, or straight from their pages),
        each checked to be of the channel, ordered by the order key."""
        deleted = self._cool_deleted
        locs = self._cool.channel_tail_locs(channel_id, n + len(deleted))
        keyed = []
        for loc, (rec, o) in zip(locs, self._cool_records(locs)):
            if rec.channel_id != channel_id:
                raise CorruptStateCheckpointError(
                    f"cool index says {rec.msg_id!r} is a message of channel {channel_id!r}, "
                    f"the file says {rec.channel_id!r}", path=self._cool.loc_path(loc),
                    offset=loc & 0xFFFFFFFF)
            if rec.msg_id not in deleted:
                keyed.append((order_key(rec.hlc, rec.msg_id, o), rec))
        keyed.sort(key=_first)
        return [r for _k, r in keyed[len(keyed) - n:]] if n < len(keyed) else [r for _k, r in keyed]

    def _messages_for_task(self, task_id: str) -> list[ConversationMessageRecord]:
        if task_id == "":
            return []
        if type(task_id) is not str:
            task_id = str(task_id)      # (a str subclass: the records share the task's str)
        locs, hot, misses = self._index.task_hits(codec.key(task_id), self._decoded)
        parts = self._cool.task_parts(task_id)
        # what the read decodes is kept only for a task read again soon (or
        # a small one): see _admit_task
        keep = bool(misses or parts) and self._admit_task(
            task_id, misses + sum(len(rows) for _no, rows in parts))
        if misses:
            hot = self._fill_misses(locs, hot, misses, keep)
        if not parts:
            return own_calls([r for r, _seq in hot])       # the index keeps them in order
        keyed = self._cool_task(task_id, parts, keep)
        if hot:
            recs = own_calls([r for r, _seq in hot])
            keyed += [(_xkey(r, seq), r) for r, (_r, seq) in zip(recs, hot)]
        # (each file's rows of the task come in key order: the sort merges a few runs)
        keyed.sort(key=_first)
        return [r for _k, r in keyed]

    def _cool_task(self, task_id: str, parts: list[tuple[int, np.ndarray]],
                   keep: bool) -> list[tuple[tuple, ConversationMessageRecord]]:
        """``(order key, record)`` of the task's live archived messages
        (their rows by file: CoolArchive.task_parts), each record the
        caller's to hand out. With ``keep`` (a task read again soon:
        :meth:`_admit_task`) they are read through the cache of verified
        cool records and kept there; else straight from their pages,
        every row's digest and task checked in one compiled pass a row
        group, and not kept: a read of hundreds of rows would push out what
        the cache holds, for rows nobody may ask again."""
        deleted = self._cool_deleted
        if keep:
            locs = parts_locs(parts)
            cool = self._cool_records(locs)
            self._check_task(task_id, locs, [rec for rec, _o in cool])
            recs = own_calls([rec for rec, _o in cool])
            keyed = [(_xkey(r, o), r) for r, (_r, o) in zip(recs, cool)]
        else:
            keyed, declined = self._cool.task_records(parts, ConversationMessageRecord, task_id)
            if declined:
                # rows the compiled pass left: read whole, which names any damage
                slow = [(self._cool_record(row), row.ord) for row in self._cool.rows_at(declined)]
                self._check_task(task_id, declined, [rec for rec, _o in slow])
                keyed += [(_xkey(r, o), r) for r, o in slow]
        if deleted:
            keyed = [kr for kr in keyed if kr[1].msg_id not in deleted]
        return keyed

    def _check_task(self, task_id: str, locs: list[int], recs: list[ConversationMessageRecord]) -> None:
        """Raise if a record the cool index listed under ``task_id`` (at
        ``locs``) is another task's: the index is damaged."""
        for loc, rec in zip(locs, recs):
            if rec.task_id != task_id:
                raise CorruptStateCheckpointError(
                    f"cool index says {rec.msg_id!r} is a message of task {task_id!r}, "
                    f"the file says {rec.task_id!r}", path=self._cool.loc_path(loc), offset=loc & 0xFFFFFFFF)

    def _admit_task(self, task_id: str, rows: int) -> bool:
        """Whether a bulk read of the task's ``rows`` archived messages goes
        through the cache of verified cool records (and keeps them): when
        the same task was read lately enough that its rows would still be
        there, had they been kept -- fewer rows read by task reads since
        its last one than the cache holds (its entries, and its bytes at
        tuning.TASK_ROW_BYTES a record). A read that is not asked again
        within that reach is not kept (it would only push out what is
        there): a loop over more tasks than the cache holds costs each task
        its pages, not its pages and a cache's churn, and a task asked
        again and again is served from the cache from its third read on.
        A task of at most 1/TASK_FEW_ROWS of that reach is kept at once."""
        self._task_clock += rows
        last = self._task_asks.get(task_id)
        if last is None and len(self._task_asks) >= tuning.TASK_ASKS_KEPT:
            self._task_asks.clear()
        self._task_asks[task_id] = self._task_clock
        cache = self._cool_dense
        reach = cache.capacity if cache.max_bytes is None else \
            min(cache.capacity, cache.max_bytes // tuning.TASK_ROW_BYTES)
        if rows * tuning.TASK_FEW_ROWS <= reach:
            return True         # (a small task is kept at once: it costs the cache little)
        return last is not None and self._task_clock - last <= reach

    def _cool_records(self, locs: list[int], msg_id: str | None = None) -> list[tuple[ConversationMessageRecord, int]]:
        """(record, ord) of the cool rows at ``locs`` (cool_loc): from the
        cache of rows verified before, the others read (and verified) now
        and kept. ``msg_id``: the id all of them are under (an exact read),
        not read from the file (the digest checks it)."""
        got, misses = self._cool_decoded.get_many(locs)
        if not misses:
            return got
        miss = [loc for loc, hit in zip(locs, got) if hit is None]
        lines = self._dense_hits(miss)
        if len(lines) == len(miss):
            return [hit if hit is not None else lines[loc] for loc, hit in zip(locs, got)]
        if lines:
            miss = [loc for loc in miss if loc not in lines]
        # straight from the pages holding them (compiled; digests checked);
        # the rows that path declines, through the rows' dicts (which name damage)
        fast = (self._cool.records_at(miss, ConversationMessageRecord) if msg_id is None
                else self._cool.id_records_at(msg_id, miss, ConversationMessageRecord))
        read = {loc: hit for loc, hit in zip(miss, fast) if hit is not None}
        slow = [loc for loc, hit in zip(miss, fast) if hit is None]
        if slow:
            read.update({loc: (self._cool_record(row), row.ord) for loc, row in zip(slow, self._cool.rows_at(slow))})
        self._cool_keep(list(read.items()))
        read.update(lines)
        return [hit if hit is not None else read[loc] for loc, hit in zip(locs, got)]

    def _cool_exact(self, msg_id: str) -> ConversationMessageRecord | None:
        """The archived record of ``msg_id`` (its rows under the id's hash,
        verified: damage raises naming the file and row, through the cache
        of verified records), or None if the archive holds none."""
        locs = self._cool.id_locs(msg_id)
        for rec, _o in self._cool_records(locs, msg_id) if locs else ():
            if rec.msg_id == msg_id:
                return rec
        return None

    def _dense_hits(self, locs: list[int]) -> dict[int, tuple[ConversationMessageRecord, int]]:
        """(record, ord) of the rows at ``locs`` whose lines the dense cache
        holds, decoded (~1.5 us a row, where its pages cost ~100) and put in
        the cache of records; a line the decoder does not take (a record
        spelled otherwise) is dropped, and its row read from its pages."""
        dense = self._cool_dense
        vals, misses = dense.get_many(locs)
        if misses == len(locs):
            return {}
        out = {}
        put = self._cool_decoded.put
        for loc, line in zip(locs, vals):
            if line is not None:
                hit = canonical_record(line)
                if hit is None:
                    dense.pop(loc, None)
                    continue
                out[loc] = hit
                put(loc, hit, record_bytes(hit[0]))
        return out

    def _cool_keep(self, items: list[tuple[int, tuple[ConversationMessageRecord, int]]]) -> None:
        """Keep verified cool records, and their lines in the dense cache
        (each at most DECODE_CACHE and its share of ``cache_bytes``; the
        oldest quarter goes first when a batch needs room, then one of the
        older half at a time)."""
        items = items[-tuning.DECODE_CACHE:]
        cache = self._cool_decoded
        if len(cache) + len(items) > tuning.DECODE_CACHE:
            cache.make_room(len(items))
        put = cache.put
        for loc, hit in items:
            put(loc, hit, record_bytes(hit[0]))
        dense = self._cool_dense
        if dense.max_bytes == 0 or not items:
            return
        if len(dense) + len(items) > tuning.DECODE_CACHE:
            dense.make_room(len(items))
        put = dense.put
        for (loc, _hit), line in zip(items, dense_lines([hit for _loc, hit in items])):
            if line is not None:
                put(loc, line, len(line) + tuning.DENSE_LINE_OVERHEAD)

    def _latest_task(self, channel_id: str) -> str | None:
        if not self._is_interleaved(channel_id):
            k = self._index.latest_task(codec.key(channel_id))
            if k is not None:
                return _unkey(k)
            if not self._cool_has_channel(channel_id):
                return None
        size = 64
        while True:         # (newest first, a window 8 times longer each round)
            recs = self._window(channel_id, size)
            for rec, _t in reversed(recs):
                if rec.task_id:
                    return rec.task_id
            if len(recs) < size:
                return None
            size *= 8

    def _channels(self) -> list[str]:
        out = {_unkey(k) for k in self._index.channels() if self._index.channel_len(k) > 0}
        # an archived channel counts while it holds a row not deleted (the
        # tombstones name each deleted message's channel: no row is read)
        gone: dict[str, int] = {}
        for mid in self._cool_deleted:
            ch = self._tombstones.get(mid) or ""
            gone[ch] = gone.get(ch, 0) + 1
        for ch in self._cool.channels():
            if ch in out:
                continue
            if "" in gone:      # (a tombstone naming no channel: the channel's rows read)
                if self._cool_channel(ch):
                    out.add(ch)
            elif self._cool.channel_len(ch) > gone.get(ch, 0):
                out.add(ch)
        return sorted(out)

    def _export_hot(self, loc: int) -> ConversationMessageRecord:
        """The record of the hot line at ``loc`` as it was appended, for an
        export: its line checked, the decode cache's record if it has no
        tool calls (see _exact_hit), else decoded (compiled; the Python
        path names what is wrong), not kept."""
        hit = self._exact_hit(loc)
        if hit is None:
            return self._decode_loc(loc)[0]
        self._index.line(loc)           # checked
        return hit[0]
