"""Compaction: the fold of the tail, the roll and rewrite of segments, the
erasure of deleted messages, the manifest checkpoint."""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from typing import Callable

import numpy as np

from .. import codec
from .._index import HotIndex
from ..errors import DurabilityError
from ..segments import (filters_name, fsync_dir, seg_name, write_file)
from . import tuning
from .common import (_FORMAT, CompactionReport, _line_seq_of, _unlink)
from .staging import _Chore, _Staged
from .host import Host

log = logging.getLogger("rune_fast")


class Compaction(Host):
    """Running a compaction (a mixin of the repository); choosing what to cool is Cooling's."""

    # ---- the state this room owns: written here only (tests/test_ownership.py)

    def _init_schedule(self) -> None:
        # (see _clock_held) stamps clock.now() returned when the manifest was
        # written, and whether merge_ops observed one since
        self._clock_nows = 0
        self._clock_unheld = False
        # channels where a hot message may sort before a cool row (None: not
        # known yet, every channel with stamped cool rows is checked once)
        self._behind = None
        self._compactions = 0
        self._last_compaction = None
        self._bg = None                 # a cooling run in a thread (see Cooling._auto_compact)
        self._bg_merge = None           # a merge of cool files in another, beside it
        self._cool_backlog = 0          # (see Cooling._auto_compact: merges wait while cooling is behind)
        self._chore = None              # file work a compaction left to a thread (see _Chore)
        self._rewrite_due = False       # (see Cooling._auto_compact)
        self._sync_owed = False         # (see _sync_first)
        self._idle_stop = threading.Event()     # set: the idle watcher ends (see _watch_idle)

    def _reset_schedule(self) -> None:
        self._since_compact = 0
        self._segs_unchecked = True     # the first full compaction (or adoption) looks at every segment
        self._manifest_dirty = False    # an in-memory fold the manifest does not show yet

    def _count_uncompacted(self, n: int) -> None:
        """``n`` more messages stored since the last compaction."""
        self._since_compact += n

    def _mark_manifest_dirty(self) -> None:
        """The manifest on disk lags what memory holds (the close writes it)."""
        self._manifest_dirty = True

    def _note_unheld_stamp(self) -> None:
        """merge_ops observed a stamp that no file stores."""
        self._clock_unheld = True

    def _note_behind(self, channel_id: str) -> None:
        """A message of ``channel_id`` sorts before a cool row."""
        assert self._behind is not None
        self._behind.add(channel_id)

    def _drop_staged(self, job: _Staged) -> None:
        """``job`` is given up (the caller discards its files)."""
        if self._bg is job:
            self._bg = None
        if self._bg_merge is job:
            self._bg_merge = None

    # ---- an idle writer's background work

    def _watch_idle(self) -> None:
        """Start the writer's idle watcher (the open's last step; see
        ``tuning.IDLE_MERGE_SECONDS``): a thread that wakes once a period
        and, when no change was made since its last look, adopts a
        finished merge and starts the next (:meth:`_idle_step`). It holds the
        repository weakly (a store dropped without close() is not kept
        alive by it) and ends at close()."""
        delay = tuning.IDLE_MERGE_SECONDS
        if delay is None or self.read_only:
            return
        threading.Thread(target=Compaction._idle_loop, args=(weakref.ref(self), self._idle_stop, float(delay)),
                         name="rune-fast-idle", daemon=True).start()

    def _stop_idle(self) -> None:
        """End the idle watcher (close(); it may be waiting for the lock:
        it finds the store closed then)."""
        self._idle_stop.set()

    def _activity(self) -> tuple[int, int, int, int]:
        """What a change of the store moves: compactions, appends since the
        last one, the tail's size, pending erasures (read without the lock:
        a torn look only delays the idle work by a period)."""
        tail = self._tail
        return (self._compactions, self._since_compact, tail.size if tail is not None else 0,
                len(self._pending_erase))

    @staticmethod
    def _idle_loop(ref: "weakref.ref[Compaction]", stop: threading.Event, delay: float) -> None:
        """The idle watcher's thread (see :meth:`_watch_idle`)."""
        seen: tuple[int, int, int, int] | None = None
        while not stop.wait(delay):
            repo = ref()
            if repo is None:
                return
            now: tuple[int, int, int, int] | None = repo._activity()
            if seen is not None and now == seen:
                try:
                    now = repo._idle_step(seen)
                except Exception as exc:    # (a failed write makes the store refuse writes, as an append's would)
                    log.warning("%s: background work of an idle writer failed: %s", repo.state_dir, exc)
                    return
                if now is None:
                    return
            seen = now
            del repo

    def _idle_step(self, seen: tuple[int, int, int, int]) -> tuple[int, int, int, int] | None:
        """One look of the idle watcher: unless a change came since ``seen``,
        adopt a finished merge and start the merge of a full tier (a store
        with neither is not touched: no manifest write). Returns the
        activity after it (None: the store is closed or refuses writes)."""
        merge = self._bg_merge
        if merge is None or merge.done.is_set():
            self._cool.file_rows()      # (the sidecars, read before the lock if not yet)
        with self._lock:
            if self._closed or self._writes.error is not None:
                return None
            if self._activity() == seen and self._idle_work_due():
                # the compaction an adopted job gets (the "finished" case of
                # _auto_compact): no cooling, no segment work; it starts the
                # next merge of a full tier as any compaction does
                self._compact(full=False, cool_excess=False, segments=False, settle=False)
            return self._activity()

    def _idle_work_due(self) -> bool:
        """Whether an idle writer has merge work (lock held): a finished
        merge to adopt, or a full tier with no merge or cooling run in
        flight. Only merges: they move no message between the tiers, so a
        store changes no record's ``tier`` and cools nothing while idle
        (cooling stays the work of the compactions SPEC names: every
        ``compact_every`` messages and ``compact()``). Never while an
        erasure is pending (its compaction waits for the jobs)."""
        if self._pending_erase or self._dirty_segs:
            return False
        job, merge = self._bg, self._bg_merge
        if merge is not None:
            return merge.done.is_set() and job is None
        return job is None and bool(self._plan_merge())

    def _compact_segments(self, rep: CompactionReport, cool_erase: list[str],
                          old_segs: list[int], max_runs: int | None = None) -> tuple[list[int], bool]:
        """Steps 3-4 of a compaction (lock held); returns the new segment
        order and whether segments to rewrite were left for the next one
        (``max_runs``: rewrite at most that many runs, each of at most
        ``tuning.REWRITE_RUN_BYTES`` live bytes unless one segment holds
        more; an automatic compaction rewrites one, so no append waits for
        more)."""
        assert self._tail is not None       # a writer always has its tail
        # 3. segments: roll the tail if it holds deleted lines or grew large
        stats = self._index.seg_stats()
        if cool_erase or self._unlocated:
            self._find_cooled_lines(cool_erase + sorted(self._unlocated), stats)
        tail_live = stats.get(self._tail_seg, (0, 0))
        roll = (self._tail_seg in self._dirty_segs or self._tail.size >= tuning.ROLL_BYTES
                or (self._tail.size > 0 and tail_live[0] == 0)
                or self._sparse(self._tail.size, tail_live[1]))
        if roll:
            self._sync_first()
            self._roll_tail()
            stats = self._index.seg_stats()
        # 4. rewrite sealed segments holding deleted lines or mostly dead (a run
        # of them in the segment order into one new segment, up to ROLL_BYTES
        # of live lines); drop empty ones
        new_order: list[int] = []
        run: list[tuple[int, np.ndarray]] = []
        run_bytes = 0
        run_seq: int | None = None     # the append sequence of the run's last line

        runs = 0
        more = False
        run_cap = tuning.ROLL_BYTES if max_runs is None else min(tuning.ROLL_BYTES, tuning.REWRITE_RUN_BYTES)

        def end_run() -> None:
            nonlocal run, run_bytes, runs
            if run:
                runs += 1
                new_seg = self._rewrite_segments(run)
                rep.bytes_written += self._segs[new_seg].size
                rep.segments_rewritten += len(run)
                old_segs.extend(seg for seg, _locs in run)
                new_order.append(new_seg)
                run, run_bytes = [], 0

        for seg in self._seg_order:
            lines, live_bytes = stats.get(seg, (0, 0))
            size = self._segs[seg].size
            if lines == 0:
                old_segs.append(seg)
                rep.segments_reclaimed += 1
                continue
            if seg in self._dirty_segs or self._sparse(size, live_bytes):
                if max_runs is not None and runs >= max_runs and not run:
                    more = True             # (left for the next compaction)
                    new_order.append(seg)
                    continue
                locs = self._index.seg_locs(seg)
                first = self._line_seq(int(locs[0]))
                if run and (run_bytes + live_bytes > run_cap or run_seq is None
                            or first is None or first <= run_seq):
                    end_run()
                    if max_runs is not None and runs >= max_runs:
                        # left for the next compaction, after the run's new
                        # segment: the order stays the lines' sequence, which
                        # a rebuild of the index checks
                        more = True
                        new_order.append(seg)
                        continue
                run.append((seg, locs))
                run_bytes += live_bytes
                run_seq = self._line_seq(int(locs[-1]))
            else:
                end_run()
                new_order.append(seg)
        end_run()
        if rep.segments_rewritten:
            fsync_dir(self.hot_dir)
        return new_order, more

    def _sync_first(self) -> None:
        """End the tail's sync if this compaction has not yet (lock held):
        before a step that needs every written line durable (a roll closes
        the tail's file and seals what it holds, an erasure and the
        manifest vouch for the tail). What runs before it (adopting a
        cooling run, merges, rewriting sealed segments into new fsynced
        files) needs none of the tail's lines durable and overlaps its
        sync: a rewrite's copy and fsync, or an adoption's unindexing,
        waited for it first (2-4 ms of such an append_many at 1,000,000)."""
        if self._sync_owed:
            self._sync_owed = False
            self._writes.sync_now()

    def _line_seq(self, loc: int) -> int | None:
        """The append sequence of the (checked) message line at ``loc``; None
        if it has none."""
        seq = _line_seq_of(self._index.line(loc))
        return seq if seq >= 0 else None

    def _fold_only(self) -> bool:
        """Whether an automatic compaction has nothing to move but the fold."""
        assert self._tail is not None       # a writer always has its tail
        return (not self._pending_erase and not self._segs_unchecked
                and self._tail.size < tuning.ROLL_BYTES and not self._cooling_due()
                and not self._merge_due())

    def _merge_due(self) -> bool:
        """Whether an automatic compaction has files to merge: a group to
        start in the thread, or (while it writes one) a small group to merge
        inline."""
        if self._bg_merge is None and not self._merges_wait():
            return bool(self._plan_merge())
        return bool(self._within(self._mergeable(), tuning.BG_COOL_MIN_ROWS - 1))

    def _merges_wait(self) -> bool:
        """Whether background merges wait for cooling: the last cooling run
        left excess for the next (``tuning.MERGE_BACKLOG_ROWS``) and the
        archive holds at most ``tuning.MERGE_WAIT_FILES`` files (a long
        bulk load does not pile up files every search and open visits)."""
        return (self._cool_backlog > tuning.MERGE_BACKLOG_ROWS
                and len(self._cool.file_rows()) <= tuning.MERGE_WAIT_FILES)

    def _plan_merge(self) -> list[list[str]]:
        """The groups of cool files to merge: ``tuning.MERGE_FANOUT`` files of
        a size tier each, the oldest first (the rest of a tier waits until it
        fills another group). A tier that filled while a merge was written
        is merged a group at a time, not whole: during a bulk load of
        1,000,000 messages one merge of 50 files (654,000 rows) beside a
        cooling run raised the peak of resident memory by 60 bytes a
        message (a merge holds its rows' ids, channels and tasks for the
        new file's index)."""
        f = tuning.MERGE_FANOUT
        return [g[a:a + f] for g in self._cool.plan_merge(fanout=f) for a in range(0, len(g) - f + 1, f)]

    def _mergeable(self) -> list[list[str]]:
        """The groups of :meth:`_plan_merge` that share no file with the
        merge a thread is writing."""
        groups = self._plan_merge()
        job = self._bg_merge
        if job is not None:
            groups = [g for g in groups if job.sources.isdisjoint(g)]
        return groups

    def _within(self, groups: list[list[str]], budget: int) -> list[list[str]]:
        """The smallest of ``groups`` whose rows add up to at most ``budget``."""
        rows = self._cool.file_rows()
        out = []
        for g in sorted(groups, key=lambda g: sum(rows.get(n, 0) for n in g)):
            n = sum(rows.get(name, 0) for name in g)
            if n > budget:
                break
            out.append(g)
            budget -= n
        return out

    def _compact(self, *, full: bool, start_bg: bool = True, settle: bool = True,
                 cool_excess: bool = True, segments: bool = True) -> CompactionReport:
        """A compaction (lock held; see _compact_now). A write, sync or
        rename that fails in it (a full disk, an I/O error) makes the store
        refuse writes until reopened, as a failed append does: its files may
        be half moved (a rolled tail, a cooled run) where only the manifest,
        which did not move, says what is stored, and the next open finishes
        or undoes them. DurabilityError names the file."""
        with self._lock:
            try:
                return self._compact_now(full=full, start_bg=start_bg, settle=settle,
                                         cool_excess=cool_excess, segments=segments)
            except DurabilityError as exc:
                self._writes.fail(exc)
                raise
            except OSError as exc:
                self._writes.fail(exc)
                raise DurabilityError(
                    f"compaction of {self.state_dir} failed writing {exc.filename or self.hot_dir}: "
                    f"{exc.strerror or exc}; every acknowledged message is on disk, and the store "
                    f"refuses writes until reopened") from exc

    def _compact_now(self, *, full: bool, start_bg: bool = True, settle: bool = True,
                     cool_excess: bool = True, segments: bool = True) -> CompactionReport:
        """A compaction (lock held). ``settle=False`` (nothing to erase):
        adopt the background jobs that finished and leave those still
        running: while a cooling run is written nothing is cooled and no
        segment is rewritten (its lines stay where it read them; a tail past
        ROLL_BYTES is sealed, which moves no line); while a merge is
        written no other merge starts. ``cool_excess=False``: adopt what the
        background staged, but leave the excess to the caller.
        ``segments=False`` (nothing to erase): leave the segments (the
        roll, the rewrite of those the cooled lines left sparse) to the next
        compaction. That is safe at any point: a cooled message's hot line
        may stay in a segment that is not sparse enough to rewrite anyway."""
        with self._lock:
            self._check_writable()
            assert self._tail is not None and self._events is not None     # (a writer's)
            t0 = time.perf_counter()
            self._join_chore()
            rep = CompactionReport()
            # (an erasure waits for both jobs: it may rewrite what they read;
            # compact() waits for a cooling run, which holds the oldest
            # excess, and leaves a merge in flight to finish by itself)
            erasing = bool(self._pending_erase or self._dirty_segs)
            staged, merged_bg = self._settle_bg(wait_cool=settle or erasing,
                                                wait_merge=(settle and not full) or erasing)
            if staged is None and merged_bg is None and not full and self._fold_only():
                return self._fold(rep, t0)
            durable = self.durability != "none"
            # the tail's sync (the batch's, begun by append_many) is ended
            # where a step first needs it, not here: the adoption of a
            # cooling run, merges and segment rewrites (their own files
            # fsynced) overlap it (_sync_first)
            self._sync_owed = durable
            rep.folded = self._since_compact
            old_segs: list[int] = []
            old_cool: list[str] = []
            manifest_cool = list(self._manifest["cool_files"])
            # 1. cooling: first a run staged in the background, then the rest
            if staged is not None:
                manifest_cool = self._cool.adopt(staged.result)
                self._cooled(staged.locs, staged.hashes, staged=staged)
                rep.cooled += staged.table.num_rows
                rep.cool_files_written += 1
            if merged_bg is not None:
                # a merge, adopted before any erasure rewrites its sources
                change = self._cool.adopt_merge(merged_bg.result)
                manifest_cool = list(change.files)
                old_cool.extend(change.removed)
                rep.cool_files_written += len(change.added)
            # (nothing inline while a cooling run is written: it holds the
            # oldest excess, and its lines must stay where it read them)
            cooling = self._bg is not None
            # (int64 locations: see _excess)
            excess = self._excess(full) if cool_excess and not cooling else np.zeros(0, dtype=np.int64)
            cooled_inline = len(excess) > 0
            # (files of up to COOL_FILE_ROWS, each written COOL_RUN_MAX_ROWS
            # lines at a time: the final compact() of a bulk load, which
            # cools what the background runs left, holds a part's lines at
            # a time, not every line it cools, and leaves a few large files,
            # not tens of small ones to merge)
            if cool_excess and not cooling:
                self._cool_backlog = 0      # (every channel's excess cooled, or none due)
            if cooled_inline:
                # (the excess let go once in file order: 8 bytes a location)
                order = self._in_file_order(excess)
                del excess
                cooled_files = self._cool_in_files(order, rep)
                del order
                if cooled_files is not None:
                    manifest_cool = cooled_files
            # 2. erasure in the cool tier
            cool_erase = [m for m in self._pending_erase if m in self._cool_deleted]
            if cool_erase:
                change = self._cool.erase(cool_erase)
                manifest_cool = list(change.files)
                old_cool.extend(change.removed)
                rep.cool_files_written += len(change.added)
            groups = self._mergeable()
            if groups and not full and start_bg and self._bg_merge is None and not self._merges_wait() \
                    and self._merge_rows(groups[:1]) >= tuning.BG_COOL_MIN_ROWS:
                groups = groups[:1]         # (one group a job: adopted sooner, planned again then)
                # merged in the background; a compaction after it finishes
                # adopts it (meanwhile cooling runs go on beside it: a merge
                # of large files takes longer than the appends that fill
                # the next runs; a small merge runs here, so a small
                # store's tiers never depend on a thread's timing)
                # (the groups bound now: the name is emptied below, and the
                # thread may call this after that)
                self._bg_merge = _Staged("merge", functools.partial(self._merge_work, groups, durable))
                self._bg_merge.sources = {n for g in groups for n in g}
                groups = []
            # merged here: an automatic compaction merges small groups only
            # (a larger one waits for the thread); compact() and close() at
            # most MERGE_INLINE_ROWS plus MERGE_INLINE_PER_COOLED a row they
            # cooled, so their work is proportional to what moved (a larger
            # group is left to the automatic compactions' thread)
            budget = (tuning.BG_COOL_MIN_ROWS - 1 if not full and start_bg
                      else tuning.MERGE_INLINE_ROWS + tuning.MERGE_INLINE_PER_COOLED * rep.cooled)
            # a group of MERGE_INLINE_GROUP_ROWS or more is never merged
            # inline: compact() starts it in the thread (below), close()
            # leaves it to the next session (it cancels the thread's merge
            # too: merged here, a group cost close() 1-3 s after the bulk
            # load of 1,000,000 and was written twice when compact() had
            # started it in the thread)
            small = max(tuning.MERGE_INLINE_GROUP_ROWS, tuning.BG_COOL_MIN_ROWS)
            merged = False
            while groups:
                # (an automatic one leaves files a check or an export is
                # reading: replacing them would wait for it, and the appender with it)
                groups = [g for g in groups if self._merge_rows([g]) < small and (full or not self._cool.pinned(g))]
                groups = self._within(groups, budget)
                if not groups:
                    break
                budget -= self._merge_rows(groups)
                merged = True
                change = self._cool.merge(groups)
                manifest_cool = list(change.files)
                old_cool.extend(change.removed)
                rep.cool_files_written += len(change.added)
                # a merge can fill the next tier: an explicit compact() goes
                # on while its budget lasts; an automatic one, one round
                groups = self._mergeable() if full else []
            if staged is not None or merged_bg is not None or cooled_inline or cool_erase or merged:
                self._forget_interleaving()
            # 3-4. segments (only when live lines moved: cooling, deletion, a
            # fresh open, or a tail past ROLL_BYTES): roll the tail if it holds
            # deleted lines, grew large or is mostly dead; rewrite sealed
            # segments holding deleted lines or mostly dead; drop empty ones
            new_order: list[int] = list(self._seg_order)
            if cooling:
                # (the running cooling run reads its lines where they are: no
                # segment is rewritten.) A tail past ROLL_BYTES is sealed
                # under the same number, each line at its location: else it
                # grew for as long as a run took (up to 52 MB during a bulk
                # load of 1,000,000 messages, runs of 65,536 rows), and once
                # the run was adopted that segment, left sparse, was
                # rewritten whole on one append's time (10-20 MB of live
                # lines, 0.2-0.9 s of one append_many: bench/cooling_profile.py)
                if self._tail.size >= tuning.ROLL_BYTES and not (self._pending_erase or self._dirty_segs):
                    self._sync_first()
                    self._roll_tail()
                    new_order = list(self._seg_order)
            elif not (segments or self._pending_erase or self._dirty_segs):
                if staged is not None or cooled_inline:
                    self._segs_unchecked = self._rewrite_due = True
            elif (staged is not None or cooled_inline or self._pending_erase or self._segs_unchecked
                    or self._tail.size >= tuning.ROLL_BYTES):
                bounded = not (full or self._pending_erase or self._dirty_segs)
                new_order, more = self._compact_segments(
                    rep, cool_erase, old_segs, max_runs=1 if bounded else None)
                self._segs_unchecked = self._rewrite_due = more
            # (the erasure, the journal's sync and the manifest vouch for
            # every line written)
            self._sync_first()
            if self._pending_erase:
                self._erase_quarantined(self._pending_erase)
            rep.erased = len(self._pending_erase)
            # 5. envelopes before the checkpoint that depends on them (the
            # size taken first: another writer of a shared event store may
            # append between the sync and a later look, unsynced)
            events_size = self._events.line_end()
            if durable:
                self._events.sync()
            self._set_segment_order(new_order)
            self._set_covered(self._tail.size, events_size)
            self._tombfile.erased_all()     # every pending erasure is done by now
            self._write_manifest(manifest_cool, durable=durable)
            # 6. now the old files are unreferenced: remove them (an
            # automatic compaction that erased nothing leaves the unlinks to
            # a thread: tens of ms for a few large files, see _Chore)
            paths: list[str] = []
            for seg in old_segs:
                s = self._pop_segment(seg)
                self._index_detach(seg)
                if s is not None:
                    s.close()
                    paths.append(s.path)
                paths.append(os.path.join(self.hot_dir, filters_name(seg)))
                self._forget_filters(seg)
            rep.cool_files_removed += len(old_cool)
            # an explicit compaction, and one that erased, do it all here
            # (erased bytes are gone when it returns)
            inline = full or bool(rep.erased or cool_erase)
            later: list[Callable[[], object]] = []
            if paths or old_cool:
                later.append(functools.partial(self._remove_files, paths, old_cool, durable))
            self._erasures_done()
            self._forget_interleaving()
            self._since_compact = 0
            if self._snapshot_due():
                self._write_snapshot(None if inline else later)
                rep.snapshot_written = True
            if later:
                if inline:
                    for work in later:
                        work()
                else:
                    self._chore = _Chore("file work", lambda: [work() for work in later])
            self._bound_maps()          # the lines cooled or rewritten were read through the maps
            if full and start_bg and self._bg_merge is None:
                # the larger groups: merged by the thread after compact()
                # returns (what compact() must do is cool; merges are policy,
                # and inline they were most of the time of the compact()
                # after a bulk load: 6.8 of 12.5 s at 1,000,000 messages).
                # The automatic compactions, or the next compact(), adopt it;
                # a close() before it finishes gives it up (the next session
                # merges again). Started last: its working set (~35 MB for
                # four files of a bulk load of 1,000,000) beside this
                # compaction's segment rewrites and snapshot was the top of
                # that load's resident memory
                rest = self._mergeable()[:1]
                if rest and self._merge_rows(rest) >= tuning.BG_COOL_MIN_ROWS:
                    self._bg_merge = _Staged("merge", functools.partial(self._merge_work, rest, durable))
                    self._bg_merge.sources = {n for g in rest for n in g}
            rep.seconds = time.perf_counter() - t0
            self._compactions += 1
            self._last_compaction = rep
            return rep

    def _merge_work(self, groups: list[list[str]], durable: bool, job: _Staged) -> object:
        """The work of a background merge of ``groups`` (cancelled through ``job``)."""
        return self._cool.stage_merge(groups, durable=durable, cancel=job.cancel)

    def _remove_files(self, paths: list[str], cool_names: list[str], durable: bool) -> None:
        """Unlink retired hot files and cool files (no manifest names them)."""
        for path in paths:
            _unlink(path)
        if cool_names:
            self._cool.unlink_files(cool_names)
        if durable:
            fsync_dir(self.hot_dir)

    def _join_chore(self) -> None:
        """Wait for the file work a compaction left to a thread (lock held)."""
        chore = self._chore
        if chore is not None:
            self._chore = None
            chore.join()

    def _fold(self, rep: CompactionReport, t0: float) -> CompactionReport:
        """Fold the tail into the hot tier in memory (lock held). The manifest
        records it at the next checkpoint that moves files (or at close); a
        crash meanwhile only relabels those lines "tail"."""
        assert self._tail is not None and self._events is not None     # (a writer's)
        rep.folded = self._since_compact
        self._set_covered(self._tail.size, self._events.line_end())
        self._since_compact = 0
        self._manifest_dirty = True
        self._compactions += 1
        rep.seconds = time.perf_counter() - t0
        self._last_compaction = rep
        return rep

    @staticmethod
    def _sparse(size: int, live_bytes: int) -> bool:
        return size > tuning.SPARSE_MIN_BYTES and live_bytes < tuning.SPARSE_FRACTION * size

    def _roll_tail(self) -> None:
        """Seal the tail as segment ``tail_seg`` and open an empty tail (lock held)."""
        assert self._tail is not None       # a writer always has its tail
        self._tail.sync()
        old = self._tail
        seg = self._tail_seg
        end = old.size
        old.release_reserved()
        old.close()
        sealed = os.path.join(self.hot_dir, seg_name(seg))
        os.replace(old.path, sealed)
        fsync_dir(self.hot_dir)
        s = self._add_segment(seg, sealed, end, ordered=True)
        # (the same file, renamed: the search filters built over its lines
        # as a tail serve it sealed, and are kept like any segment's)
        self._index_attach(seg, s.buf, sealed, keep_lines=True)
        self._open_next_tail()
        fsync_dir(self.hot_dir)
        self._writes.rolled(self._tail_seg)     # (the sealed lines were synced above)
        # the decode cache is keyed by location; locations in the sealed file are unchanged

    def _rewrite_segments(self, run: list[tuple[int, np.ndarray]]) -> int:
        """Copy the live lines of a run of sealed segments (each with its
        sorted live locations; neighbours in the segment order, each one's
        append sequences after the one before's) into one new segment, in
        that order: the append sequence still rises line by line (lock held;
        the caller fsyncs the folder)."""
        locs = np.concatenate([seg_locs for _seg, seg_locs in run])
        data, starts = self._index.gather_lines(locs)
        new_seg = self._new_seg_no()
        path = os.path.join(self.hot_dir, seg_name(new_seg))
        write_file(path, data)
        s = self._add_segment(new_seg, path, len(data))
        self._index_attach(new_seg, s.buf, path)
        new_locs = starts | (new_seg << 40)
        self._index_relocate(locs, new_locs)
        self._move_decoded(locs, new_locs)
        return new_seg

    def _find_cooled_lines(self, ids: list[str], stats: dict) -> None:
        """Mark the segments that still hold the (dead) hot line of a message
        that was cooled and then deleted, so erasure rewrites them too. Only
        segments with dead bytes are scanned, each by a throwaway index."""
        assert self._tail is not None       # a writer always has its tail
        keys = [codec.key(m) for m in ids]
        files = [(seg, self._segs[seg].buf, self._segs[seg].path, self._segs[seg].size)
                 for seg in self._seg_order]
        files.append((self._tail_seg, self._tail.buf, self._tail.path, self._tail.size))
        for seg, buf, path, size in files:
            if seg in self._dirty_segs or size == 0 or stats.get(seg, (0, 0))[1] >= size:
                continue
            probe = HotIndex()
            probe.attach(seg, buf, path)
            probe.ingest(seg, 0, size)
            if (probe.find_many(keys) >= 0).any():
                self._mark_dirty(seg)
            probe.detach(seg)

    def _write_manifest(self, cool_files: list[str], *, durable: bool = True) -> None:
        self._sync_tombstones()      # the manifest vouches for them
        meta = self._cool.file_meta()
        m = {"format": _FORMAT, "segments": list(self._seg_order), "tail_seg": self._tail_seg,
             "segment_ends": {str(g): self._seg_ends[g] for g in self._seg_order if g in self._seg_ends},
             "covered": self._covered, "cool_files": list(cool_files),
             "cool_meta": {n: meta[n] for n in cool_files if n in meta},
             "events_offset": self._covered_events, "next_seg": self._next_seg,
             "next_seq": self._next_seq,
             "clock": self._clock_text(),
             **self._tombfile.manifest_fields(),
             "cool_max": {ch: list(k) for ch, k in self._cool_max.items()}}
        self._record_manifest(m, durable=durable)
        self._manifest_dirty = False
        self._clock_unheld = False
        self._clock_nows = self._clock.nows

    def _clock_held(self) -> bool:
        """Whether the manifest's clock, with the stamps the next open reads
        (the tail's lines after the last compaction, the tombstones), puts
        that session's clock past every stamp this one returned or observed:
        true unless ``clock.now()`` returned a stamp or ``merge_ops`` observed
        one since the manifest was written (a stamp a caller may hold, or one
        no file keeps)."""
        return not self._clock_unheld and self._clock.nows == self._clock_nows

    def _clock_text(self) -> str:
        """The clock's last stamp as the manifest records it ("" before any)."""
        return str(self._clock.last) if self._clock.last is not None else ""
