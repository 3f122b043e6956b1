"""Cooling: choosing which hot messages move to the cool tier (each channel's
excess over its window), the automatic compaction's schedule, and the
background runs it stages."""
from __future__ import annotations

import functools
import logging
import time
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import codec
from ..cool import table_from_lines
from ..errors import RuneError
from . import tuning
from .common import (_COOL_RANK, _HOT_RANK, CompactionReport, _first, _order_key, _sorts_before, _unkey)
from .staging import _Staged
from .host import Host

log = logging.getLogger("rune_fast")

#: the columns of a cooling run's table that its adoption reads (``_cooled``)
_ADOPT_COLUMNS = ["msg_id", "channel_id", "hlc"]
#: no locations (an empty excess)
_NO_LOCS = np.zeros(0, dtype=np.int64)
_NO_LOCS.flags.writeable = False


class Cooling(Host):
    """Choosing and staging what cools (a mixin of the repository)."""

    def _cooling_due(self) -> bool:
        """Whether the automatic compaction cools: the excess over
        ``hot_window`` of every channel together reaches
        ``tuning.COOL_DUE_ROWS``, or one channel's reaches a whole window
        (any excess for a window under 64 messages, whose runs are small
        anyway). See ``tuning.COOL_DUE_ROWS`` for why not sooner."""
        w = self.hot_window
        if w < 64:
            return self._index.max_channel_len() > w
        return self._index.excess_len(w) >= tuning.COOL_DUE_ROWS

    def _merge_rows(self, groups: list[list[str]]) -> int:
        rows = self._cool.file_rows()
        return sum(rows.get(name, 0) for g in groups for name in g)

    def _excess(self, full: bool) -> np.ndarray:
        """Locations to cool (int64): every channel's messages beyond its newest
        ``hot_window``. The automatic compaction (``full=False``) cools only
        once :meth:`_cooling_due`, and then cools every channel's excess:
        one larger Parquet run now and then instead of a small run (and its
        merges) every few ``compact_every``. (An
        array, not a list of ints: 8 bytes a location, not ~36 -- the
        compact() after a bulk load of 1,000,000 messages cools ~450,000,
        and held them, a set of them and their file order through its peak
        of resident memory.)"""
        if not full and not self._cooling_due():
            return _NO_LOCS
        excess = self._index.excess(self.hot_window)
        cands = list(self._cool_max) if self._behind is None else list(self._behind)
        behind: set[str] = set()
        if cands:
            counted: list[np.ndarray] = []      # (the excess sorted, made when first needed)
            extras = [excess]
            for ch in cands:
                extra, still = self._excess_behind_cool(ch, excess, counted)
                if len(extra):
                    extras.append(np.asarray(extra, dtype=np.int64))
                if still:
                    behind.add(ch)
            if len(extras) > 1:
                excess = np.concatenate(extras)
        self._behind = behind
        return excess

    def _excess_behind_cool(self, channel_id: str, excess: np.ndarray,
                            counted: list[np.ndarray]) -> tuple[list[int], bool]:
        """(hot locations beyond the channel's newest ``hot_window`` once its
        cool rows are counted too, whether a hot message sorts before its
        newest stamped cool row). Such a message arrived late (or unstamped)
        after newer ones were cooled; once a newer hot one is deleted it can
        lie beyond the window although ``HotIndex.excess``, which counts the
        hot ones only, keeps it. ``excess``: what that excess already cools
        (``counted``: empty, or holding it sorted, which this makes once)."""
        last = self._cool_max.get(channel_id)
        locs = self._index.channel_locs(codec.key(channel_id), -1)
        if last is None or not len(locs):
            return [], False
        first = self._read_loc(int(locs[0]))
        if not _sorts_before(first, last):
            return [], False            # every hot message sorts after every cool row
        if not counted:
            counted.append(np.sort(excess))
        done = counted[0]
        at = np.minimum(np.searchsorted(done, locs), max(0, len(done) - 1))
        kept = locs[done[at] != locs].tolist() if len(done) else locs.tolist()
        if not kept:
            return [], True
        oldest = self._read_loc(kept[0])
        n = self.hot_window
        if not _sorts_before(oldest, last) or n == 0:
            return [], True             # only messages cooled anyway sort before a cool row
        rows = self._cool.channel_tail(channel_id, n + len(self._cool_deleted))
        cool = self._cool_rows(rows)[-n:]
        keyed = [(_order_key(r, _COOL_RANK, i), None) for i, r in enumerate(cool)]
        keyed += [(_order_key(self._read_loc(loc), _HOT_RANK, i), loc) for i, loc in enumerate(kept)]
        keyed.sort(key=_first)
        keep = {loc for _k, loc in keyed[len(keyed) - n:]}
        return [loc for loc in kept if loc not in keep], True

    def _auto_compact(self) -> None:
        """The compaction that runs every ``compact_every`` messages (lock
        held). A large cooling run is staged in a background thread (Parquet
        encoding and its syncs run while appenders go on), and a merge of
        cool files in another beside it (a merge of large files outlasts many
        runs: cooling that waited for it fell behind the appends, and the
        final compact() of a bulk load of 1,000,000 messages paid for 40%
        of it). A compaction after a job finishes adopts it. Everything else
        runs here, as ``compact()``."""
        assert self._tail is not None       # a writer always has its tail
        t0 = time.perf_counter()
        job, merge = self._bg, self._bg_merge
        if job is not None and job.wants_part():
            # the next part of the run's lines (nothing else moves), unless
            # its thread has not taken the parts fed before
            self._feed_cooling(job)
        chore = self._chore
        finished = any(j is not None and j.done.is_set() for j in (job, merge))
        if chore is not None and chore.running() and not finished:
            # the last compaction's file work (its unlinks and their folder
            # sync, the snapshot's write) still runs: a compaction would wait
            # for it first (167 ms of one append in a bulk load of 1,000,000
            # messages on a loaded machine); the tail is folded meanwhile.
            # Not when a job waits to be adopted: that delays the next
            # cooling run and merge (a load of 1,000,000 messages left 40
            # cool files after its compact() against 20-24; one run each)
            self._fold(CompactionReport(), t0)
            return
        if self._pending_erase and any(j is not None and not j.done.is_set() for j in (job, merge)):
            # an erasure waits for the jobs (it may rewrite what they read),
            # and no append waits for one: the tail is folded meanwhile
            self._fold(CompactionReport(), t0)
            return
        if finished:
            # adopt the finished job(s) (a cooling run's rows leave the
            # index). The segments they leave sparse (and the tail's roll)
            # are seen to by the next compactions, one rewrite run each, and
            # the excess grown meanwhile is staged by one of them: each
            # append pays for one of these (measured at 200,000 messages:
            # 100-300 ms when one call paid for all)
            self._compact(full=False, cool_excess=False, segments=False, settle=False)
            return
        if job is not None:
            if self._tail.size >= tuning.ROLL_BYTES and not (self._pending_erase or self._dirty_segs):
                # the tail is sealed (its lines stay where the run reads
                # them: a roll moves none), so that the segments the run
                # leaves sparse stay small (see Compaction._compact_now)
                self._compact(full=False, cool_excess=False, settle=False)
                return
            self._fold(CompactionReport(), t0)    # a cooling run's lines stay put meanwhile
            return
        if self._rewrite_due and not self._pending_erase:
            # the segments the last adoption left sparse, one run a call,
            # before the next run is staged (else they pile up: at 1,000,000
            # messages the final compact() had tens of them to rewrite)
            self._compact(full=False, cool_excess=False, settle=False)
            return
        if not self._pending_erase:
            # (also the first compaction of an open: its look at every segment
            # waits for the adoption, which runs it; cooling a large excess
            # inline there stalled an append 0.25 s at 1,000,000 messages).
            # A tail past ROLL_BYTES rolls first (it cannot while a run is
            # staged); the run is staged by the next compaction.
            excess = self._excess(False)
            if len(excess) >= tuning.BG_COOL_MIN_ROWS:
                if self._tail.size < tuning.ROLL_BYTES:
                    # at most BG_COOL_RUN_ROWS a run (each channel's oldest
                    # first, channel by channel, channels in code point
                    # order; in file order: its table is written as it
                    # is, not taken row by row): its first lines are
                    # copied here, the rest by the compactions that follow
                    # (BG_COOL_RUN_ROWS a run, BG_COOL_MAX_ROWS once the
                    # excess holds that many: a file of one merge tier or
                    # of the next, never one between, which its merge
                    # would rewrite for nothing)
                    n = tuning.BG_COOL_MAX_ROWS if len(excess) >= tuning.BG_COOL_MAX_ROWS \
                        else tuning.BG_COOL_RUN_ROWS
                    self._bg = self._stage_cooling(self._in_file_order(excess, n))
                    self._cool_backlog = len(excess) - len(self._bg.locs)
                    self._fold(CompactionReport(), t0)
                else:
                    self._compact(full=False, cool_excess=False, settle=False)
                return
        self._compact(full=False, settle=False)

    def _settle_bg(self, wait_cool: bool = True,
                   wait_merge: bool = True) -> "tuple[_Staged | None, _Staged | None]":
        """(the cooling run, the merge) to adopt: the background jobs that
        finished, after waiting for the cooling run if ``wait_cool`` and for
        the merge if ``wait_merge`` (lock held; a job never takes the
        repository lock; one still running is left in place). A cooling run is adopted if its messages are all still
        indexed where they were read (a deletion since then discards it, and
        the compaction cools inline); a failed job is logged and dropped."""
        out: list[_Staged | None] = []
        for job, wait in ((self._bg, wait_cool), (self._bg_merge, wait_merge)):
            if job is None or not (wait or job.done.is_set()) \
                    or (job.kind == "merge" and not wait and self._cool.pinned(job.sources)):
                # (a merge whose source a check or an export is reading:
                # adopted by a later compaction, as its adoption would wait for it)
                out.append(None)
                continue
            while job.feeding():
                # the rest of its lines, so that it can finish: a part as
                # the thread takes one (fed at once, up to a run's 65,536
                # lines, ~30-60 MB, waited in its queue at the start of the
                # compact() after a bulk load of 1,000,000 messages)
                if job.wait_for_room(0.05):
                    self._feed_cooling(job)
            job.thread.join()
            self._drop_staged(job)
            if job.error is not None:
                if not job.cancel.is_set():
                    log.warning("background %s failed, done inline instead: %s", job.kind, job.error)
                job = None
            elif job.result is None:
                job = None
            elif job.kind == "cool":
                assert job.hashes is not None       # (set when the run was staged)
                found = self._index.find_located(job.locs, job.hashes)
                if self._any_tombstoned(job.table.column("msg_id")) \
                        or not np.array_equal(found, np.asarray(job.locs, dtype=np.int64)):
                    job.discard(self._cool)
                    job = None
            out.append(job)
        return out[0], out[1]

    def _any_tombstoned(self, ids: Any) -> bool:
        """Whether one of ``ids`` (an Arrow string column) has a tombstone."""
        if not self._tombstones:
            return False
        return bool(pc.any(pc.is_in(ids, value_set=pa.array(list(self._tombstones), pa.string()))).as_py())

    def _stage_cooling(self, locs: np.ndarray) -> _Staged:
        """Start the background cooling run of the hot lines at ``locs``
        (lock held). Their copy (each line checked) is made under the lock,
        ``tuning.BG_COOL_PART_ROWS`` lines at a time: the first part here,
        the next by each compaction that follows (:meth:`_feed_cooling`),
        the rest by one that waits for the run; the lines stay where they
        are meanwhile (no segment is rewritten while a run is in flight; a
        roll of the tail keeps each line's location), and a part is copied
        only while the thread holds fewer than BG_COOL_QUEUED_PARTS. The
        thread parses each part as it comes, a few hundred lines a call
        (the parser holds the GIL: an appender waits for a call, not the
        whole), and writes it to the run's file at once
        (``CoolArchive.stage_parts``): what the run holds is a part and
        the columns its adoption reads. A run's copy made whole took 46-86
        ms of CPU (16,384 lines; up to 145 ms of one append_many on the
        shared machine) at 1,000,000 messages."""
        durable = self.durability != "none"

        def work(job: _Staged) -> Any:
            kept: list[pa.Table] = []
            maxima: dict[str, tuple[str, str]] = {}

            def parts() -> Any:
                while (part := job.next_part()) is not None:
                    a, data, starts = part
                    t = self._lines_table(locs[a:a + len(starts)], data, starts, tuning.PARSE_PART)
                    del part, data      # (the lines, once parsed)
                    # what the adoption needs, a part at a time: each
                    # channel's newest stamp and the ids; the content goes
                    # once written (a run waits for the next compaction to
                    # adopt it: its channel and stamp columns and its ids
                    # as Python strings, held meanwhile, were ~90 bytes a
                    # row at the top of a bulk load's resident memory)
                    _stamp_maxima(t, maxima)
                    kept.append(t.select(["msg_id"]))
                    yield t
                    del t

            # (each part written as it is parsed: the run's rows are never
            # held whole, see CoolArchive.stage_parts; its locations are in
            # file order, see _in_file_order)
            result = self._cool.stage_parts(parts(), durable=durable)
            job.table = pa.concat_tables(kept) if len(kept) != 1 else kept[0]
            del kept
            job.maxima = maxima
            return result

        job = _Staged("cool", work, locs, fed=True)
        # (each id's hash, from its line as each part is copied and checked:
        # the adoption finds and unindexes the rows by them and their
        # locations, without reading their lines again or keeping their ids)
        job.hashes = np.zeros(len(locs), dtype=np.uint64)
        self._feed_cooling(job)
        return job

    def _feed_cooling(self, job: _Staged) -> None:
        """Copy the next ``tuning.BG_COOL_PART_ROWS`` lines of the cooling
        run ``job`` (lock held; each checked) and hand them to its thread.
        A line that fails its check gives the run up (the thread ends, the
        next compaction drops the job and cools inline, where the damage is
        raised again) and raises."""
        a = job.fed_to
        assert a is not None
        b = min(len(job.locs), a + max(1, tuning.BG_COOL_PART_ROWS))
        assert job.hashes is not None       # (set when the run was staged)
        try:
            data, starts = self._gather(job.locs[a:b], job.hashes[a:b])
        except BaseException:
            job.stop_feeding()
            raise
        job.feed((a, data, starts), b)

    def _in_file_order(self, excess: np.ndarray, limit: int | None = None) -> np.ndarray:
        """``excess`` (what :meth:`_excess` gave, the index unchanged since)
        in the order of a cool file's rows (int64): grouped by channel, channels in
        code point order, each channel's locations clustered by task in
        their given order (the order ``_channel_order`` gives a table of
        them: :meth:`_by_task`); of each channel's, its oldest up to the
        first ``limit`` in all (None: all). Its first part is
        ``HotIndex.excess``: each channel's oldest messages, the channels
        in the index's order; what follows (late messages that sort before
        a cool row) is placed by reading each one's channel."""
        excess = np.asarray(excess, dtype=np.int64)
        spans: dict[str, list[tuple[int, int]]] = {}
        at = 0
        w = self.hot_window
        for k in self._index.channels():
            n = self._index.channel_len(k) - w
            if n > 0:
                spans.setdefault(_unkey(k), []).append((at, at + n))
                at += n
        if at > len(excess):
            raise RuneError(f"{self.hot_dir}: cooling order: the hot index shows {at} messages beyond "
                            f"the window, the compaction chose {len(excess)} (not read from this index)")
        for i in range(at, len(excess)):
            spans.setdefault(self._read_loc(int(excess[i])).channel_id, []).append((i, i + 1))
        pieces: list[np.ndarray] = []
        chans: list[int] = []       # where each channel's locations end in out
        want = len(excess) if limit is None else limit
        got = 0
        for ch in sorted(spans):
            for a, b in spans[ch]:
                piece = excess[a:min(b, a + want - got)]
                pieces.append(piece)
                got += len(piece)
            chans.append(got)
            if got >= want:
                break
        return self._by_task(np.concatenate(pieces) if pieces else _NO_LOCS, chans)

    def _by_task(self, out: np.ndarray, chans: list[int]) -> np.ndarray:
        """``out`` (locations grouped by channel, channel c's ending at
        ``chans[c]``, each channel's in key order) with each channel's
        locations clustered by task, tasks in code point order, no task
        first, each task's in their order: the row order of a cool file
        (``_channel_order``; docs/FORMAT.md), an int64 array (``out``
        itself, reordered in place, when it is one). Each location's task
        comes from the index's task postings, not from its line. The
        locations cooled are the same (the oldest of each channel): only
        their order in the file changes."""
        arr = np.asarray(out, dtype=np.int64)
        if len(arr) < 2:
            return arr
        names = sorted((_unkey(k), k) for k in self._index.task_keys())
        if not names:
            return arr
        # (each hot task location looked up among the run's, sorted, in
        # the compiled index: the run is a few thousand locations, the hot
        # tier's task postings up to hundreds of thousands during a bulk
        # load; ranks int32, each channel sorted apart: all the postings
        # and their ranks as int64 temporaries of the whole run were 44 MB
        # of the peak of resident memory of the compact() after a bulk
        # load of 1,000,000)
        o = np.argsort(arr, kind="stable")
        ranked = self._index.task_ranks(arr[o], [k for _t, k in names])
        rank = np.empty(len(arr), dtype=np.int32)
        rank[o] = ranked
        del o, ranked
        a = 0
        for b in chans:
            if b - a > 1:
                # (stable: each task's locations keep their order)
                arr[a:b] = arr[a:b][np.argsort(rank[a:b], kind="stable")]
            a = b
        return arr

    def _cool_in_files(self, order: np.ndarray, rep: CompactionReport) -> list[str] | None:
        """Cool the hot messages at ``order`` (lock held; locations in file
        order: :meth:`_in_file_order`): files of at most COOL_FILE_ROWS
        rows, each written a COOL_RUN_MAX_ROWS lines at a time as they are
        read and parsed (what a file holds whole is its index's keys; the
        adoption reads each channel's newest stamp, gathered a part at a
        time, and unindexes the ids from the lines themselves). Returns
        the archive's files after the last (None: nothing cooled)."""
        files = None
        for a in range(0, len(order), tuning.COOL_FILE_ROWS):
            locs = order[a:a + tuning.COOL_FILE_ROWS]
            maxima: dict[str, tuple[str, str]] = {}
            # (each id's hash, read from its checked line: the rows are
            # unindexed by them and their locations, not by reading and
            # checking each line again; 8 bytes a row)
            hashes = np.zeros(len(locs), dtype=np.uint64)

            def parts(locs: np.ndarray = locs, maxima: dict[str, tuple[str, str]] = maxima,
                      hashes: np.ndarray = hashes) -> Any:
                for b in range(0, len(locs), tuning.COOL_RUN_MAX_ROWS):
                    e = b + tuning.COOL_RUN_MAX_ROWS
                    t = self._cool_table_at(locs[b:e], hashes[b:e])
                    # (what the adoption reads, a part at a time: each
                    # channel's newest stamp; the channel and stamp strings
                    # of a file's rows held to its end were ~40 bytes a row
                    # of the peak of a bulk load, its ids ~34)
                    _stamp_maxima(t, maxima)
                    yield t
                    del t

            run = self._cool.cool_parts(parts())
            files = list(run.files)
            self._cooled(locs, hashes, maxima=maxima)
            rep.cooled += len(locs)
            rep.cool_files_written += 1
        return files

    def _cool_table_at(self, locs: np.ndarray, hashes: np.ndarray) -> pa.Table:
        """The cool-schema table of the hot lines at ``locs`` (each checked
        against its checksum), row i from ``locs[i]``; ``hashes`` gets the
        hash of each one's id (:meth:`_gather`)."""
        data, starts = self._gather(locs, hashes)
        return self._lines_table(locs, data, starts, tuning.COOL_PARSE_PART)

    def _gather(self, locs: "Sequence[int] | np.ndarray", hashes: np.ndarray) -> tuple[bytes, np.ndarray]:
        """A copy of the hot lines at ``locs``, each checked (lock held), and
        the hash of each one's id in ``hashes`` (uint64, as long):
        ``HotIndex.gather_lines``."""
        self._maps.read(len(locs))
        return self._index.gather_lines(locs, hashes)

    def _lines_table(self, locs: "Sequence[int] | np.ndarray", data: bytes, starts: np.ndarray,
                     part: int | None = None) -> pa.Table:
        """The cool-schema table of the lines :meth:`_gather` copied from
        ``locs``, row i from line i, parsed ``part`` lines a call (all at
        once: None). A line the compiled reader does not take is decoded
        from the copied bytes; nothing here reads the index or its maps, so
        a background run may call it without the lock."""
        n = len(starts)

        def fallback(i: int, first: int = 0) -> tuple[dict, int | None]:
            # row i of the part that starts at line ``first``
            i += first
            end = int(starts[i + 1]) if i + 1 < n else len(data)
            loc = int(locs[i])
            d = codec.decode_body(memoryview(data)[int(starts[i]):end - 1],
                                  path=self._path_of(loc >> 40), offset=loc & ((1 << 40) - 1))
            return d["r"], d.get("s")

        if part is None or n <= part:
            return table_from_lines(data, starts, fallback)
        parts = []
        for a in range(0, n, part):
            b = min(n, a + part)
            lo, hi = int(starts[a]), int(starts[b]) if b < n else len(data)
            parts.append(table_from_lines(data[lo:hi], starts[a:b] - lo, functools.partial(fallback, first=a)))
        # (chunked: the cool writer takes a row group at a time from the
        # parts, so the rows are never copied whole)
        return pa.concat_tables(parts)

    def _cooled(self, locs: "Sequence[int] | np.ndarray", hashes: np.ndarray | None, *,
                staged: "_Staged | None" = None,
                maxima: "dict[str, tuple[str, str]] | None" = None) -> None:
        """Drop messages now served by the cool tier from the hot index: the
        lines at ``locs``, still where they were read, their ids hashing to
        ``hashes`` (``HotIndex.gather_lines``). ``staged``: the job of a run
        written in the background (its locations and hashes), which
        appends may have overtaken (a late one can sort before its rows; an
        inline run cools the oldest messages and those already behind a
        cool row). ``maxima``: each channel's newest stamp among the rows
        (:func:`_stamp_maxima`; None: the staged run's)."""
        behind = self._behind if staged is not None else None
        if staged is not None:
            locs, hashes, maxima = staged.locs, staged.hashes, staged.maxima
        assert maxima is not None and hashes is not None
        for ch, stamp in maxima.items():
            if self._raise_cool_max(ch, stamp):
                if behind is not None:
                    behind.add(ch)      # a late append may sort before the new maximum
        part = tuning.COOL_RUN_MAX_ROWS
        for a in range(0, len(locs), part):
            self._unindex_located(locs[a:a + part], hashes[a:a + part])
        self._forget_decoded_many(locs)
        self._count_changes(len(locs))
        self._forget_interleaving()     # the verdicts read the cool rows' maxima just moved


def _stamp_maxima(table: pa.Table, maxima: "dict[str, tuple[str, str]]") -> None:
    """Raise ``maxima`` (channel -> newest (hlc, msg_id)) to the stamped rows
    of ``table`` (its ``channel_id``, ``hlc`` and ``msg_id`` columns), a
    part at a time: the Python strings of a file's rows -- up to
    COOL_FILE_ROWS in a compact() -- made at once were ~120 bytes a row of
    its peak of resident memory."""
    stamped = table.select(_ADOPT_COLUMNS).filter(pc.not_equal(table.column("hlc"), ""))    # (order kept)
    part = tuning.COOL_RUN_MAX_ROWS
    get = maxima.get
    for a in range(0, stamped.num_rows, part):
        piece = stamped.slice(a, part)
        for hlc, mid, ch in zip(piece.column("hlc").to_pylist(), piece.column("msg_id").to_pylist(),
                                piece.column("channel_id").to_pylist()):
            stamp = (hlc, mid)
            last = get(ch)
            if last is None or stamp > last:
                maxima[ch] = stamp
