"""The hot index and its snapshot: loaded when it matches the manifest (then only
the tail after it is read), rebuilt from the segments otherwise, written when
enough changed."""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, cast


from .. import _index, codec
from .._index import HotIndex
from ..errors import CorruptStateCheckpointError
from . import tuning
from .common import (SNAPSHOT_NAME, _EVENTS_MARK, _SYNCED_MARK, _TAIL_MARK, _cool_no, _first_line_seq)

from .host import Host

log = logging.getLogger("rune_fast")


class IndexSnapshot(Host):
    """The index snapshot: load, check against the files, write (a mixin)."""

    # ---- the state this room owns: written here only (tests/test_ownership.py)

    def _init_snapshot_state(self) -> None:
        self._snap_events = 0           # event store size the index snapshot in use recorded
        self._snap_files = None         # the files the snapshot on disk matches (_snap_layout)
        self._tail_read = 0             # tail lines the open's index read after its snapshot (or all)

    def _reload_index(self) -> None:
        """The hot index of the files as loaded (see _load_index)."""
        self._index = self._load_index()

    def _count_changes(self, n: int) -> None:
        """``n`` more changes the snapshot on disk does not hold."""
        self._snap_changes += n

    def _index_attach(self, seg: int, buf: Any, path: str, *, growing: bool = False,
                      keep_lines: bool = False) -> None:
        """Map segment ``seg`` (``buf``, the file ``path``) into the hot index
        (``growing``, ``keep_lines``: see HotIndex.attach)."""
        self._index.attach(seg, buf, path, growing=growing, keep_lines=keep_lines)

    def _index_detach(self, seg: int) -> None:
        self._index.detach(seg)

    def _index_ingest(self, seg: int, start: int, end: int, min_seq: int = -1) -> Any:
        """Index the lines of ``seg`` from ``start`` to ``end`` (an IngestReport)."""
        return self._index.ingest(seg, start, end, min_seq)

    def _index_relocate(self, old_locs: Any, new_locs: Any) -> int:
        """The lines at ``old_locs`` moved to ``new_locs`` (a segment rewrite)."""
        return self._index.relocate(old_locs, new_locs)

    def _index_set_filters(self, seg: int, data: Any) -> int:
        """Install the kept search filters of sealed segment ``seg`` (a view
        of the kept file's map: the index reads them there)."""
        return self._index.set_seg_filters(seg, data, True)

    def _index_seg_filters_mapped(self, seg: int) -> bool:
        return self._index.seg_filters_mapped(seg)

    def _unindex_located(self, locs: Any, hashes: Any) -> Any:
        """Drop the messages of the hot lines at ``locs`` from the hot index,
        their ids hashing to ``hashes`` (read from the checked lines by
        ``HotIndex.gather_lines``): ``HotIndex.remove_located``; where each
        was indexed (-1: not at that location)."""
        return self._index.remove_located(locs, hashes)

    def _index_one(self, loc: int) -> bool:
        """Index the message line at ``loc``; False if its id is indexed already."""
        return self._index.add(loc)

    def _unindex(self, msg_id: str) -> int:
        """Drop ``msg_id`` from the hot index; its location, or -1."""
        return self._index.remove(codec.key(msg_id))

    def _load_index(self) -> HotIndex:
        """The hot index: the snapshot if it matches the manifest (then only
        the tail bytes after it are scanned), else a rebuild from every segment."""
        snap_path = os.path.join(self.hot_dir, SNAPSHOT_NAME)
        index = None
        self._snap_files = None         # (set below when the snapshot serves as it is)
        if os.path.exists(snap_path):
            try:
                index, covered = HotIndex.load_snapshot(snap_path)
            except CorruptStateCheckpointError as exc:
                log.warning("index snapshot %s not used, rebuilding from the tail: %s", snap_path, exc)
                index = covered = None
            if covered is not None:     # (its tail lines' envelopes come after this size)
                self._snap_events = covered.get(_EVENTS_MARK, 0)
            # a tail that lost lines the snapshot vouches for raises here
            meta = None if covered is None else self._snapshot_meta(covered)
            if meta is not None:
                start, snap_cool = meta
                # cool files written after the snapshot: their rows left the hot tier
                known = set(snap_cool)
                cooled_since = [f for f in self._manifest["cool_files"] if f not in known]
                index = self._finish_index(cast("HotIndex", index), start, cooled_since)
                # the tail lines after the snapshot count as changes since it
                self._snap_changes = self._tail_read
                segs = set(self._seg_order) | {self._tail_seg}
                if not any(s >= 0 and s not in segs for s in cast("dict", covered)):
                    if not cooled_since:
                        self._snap_files = self._snap_layout()
                    return index
                live = index.seg_stats()
                if not any(seg not in segs and lines > 0 for seg, (lines, _b) in live.items()):
                    return index        # (it names a segment gone empty: close writes a new one)
                log.warning("index snapshot %s names a segment that is gone; rebuilding", snap_path)
        index = HotIndex()
        self._seg_order_by_sequence()
        seq = -1        # the append sequence rises across the segments too
        for seg in self._seg_order:
            index.attach(seg, self._segs[seg].buf, self._segs[seg].path)
            rep = index.ingest(seg, 0, self._segs[seg].size, seq)
            self._check_ingest(rep, self._segs[seg].path, sealed=True)
            seq = rep.last_seq
            end = self._seg_ends.get(seg)
            if end is not None and rep.good_end != end:
                raise CorruptStateCheckpointError(
                    f"sealed segment {seg} holds complete lines up to offset {rep.good_end}, but the "
                    f"manifest records its lines ending at {end} (cut off or zeroed after it was sealed)",
                    path=self._segs[seg].path, offset=min(rep.good_end, end))
        index = self._finish_index(index, 0, list(self._manifest["cool_files"]), seq)
        self._bound_maps()          # the rebuild read every line through the maps
        return index

    def _seg_order_by_sequence(self) -> None:
        """Put the sealed segments in the order of their lines' append
        sequence, which a rebuild checks, if the manifest lists them
        otherwise: a bounded rewrite of earlier versions placed a run's new
        segment after a segment it left for later (each segment's own
        lines, and the ranges they cover, are checked as they are read).
        The next manifest lists the order found."""
        firsts = [_first_line_seq(self._segs[seg].buf, self._segs[seg].size) for seg in self._seg_order]
        if min(firsts, default=0) < 0 or firsts == sorted(firsts):
            return      # (a segment without a sequence: the manifest's order stands)
        order = [seg for _f, seg in sorted(zip(firsts, self._seg_order))]
        log.warning("%s: the manifest lists %d of %d sealed segments out of their lines' order; "
                    "read in that order", self.hot_dir, sum(a != b for a, b in zip(order, self._seg_order)),
                    len(order))
        self._set_segment_order(order)
        self._mark_manifest_dirty()

    def _finish_index(self, index: HotIndex, start: int, cooled_files: list[str],
                      min_seq: int | None = None) -> HotIndex:
        """Scan the tail from ``start`` (its lines' sequence rising from
        ``min_seq``, default: the line's before ``start``), then drop what
        was cooled or deleted."""
        self._attach_all(index)
        self._tail_read = 0
        if self._tail is not None:
            rep = index.ingest(self._tail_seg, start, max(start, self._visible_end()),
                               self._seq_floor(start) if min_seq is None else min_seq)
            self._check_ingest(rep, self._tail.path, sealed=False, durable_end=self._tail_durable_end(start))
            self._set_tail_size(rep.good_end)
            if not self.read_only:
                index.set_lines_end(self._tail_seg, rep.good_end)
            self._tail_read = len(rep.added)
        cooled = self._cool_ids_in(cooled_files)
        if cooled:
            index.remove_many([codec.key(m) for m in cooled])
        for mid in self._tombstones:
            loc = index.remove(codec.key(mid))
            if loc >= 0:
                self._mark_erasable(mid, loc >> 40)
        self._snap_changes = 0
        return index

    def _snapshot_meta(self, covered: dict) -> tuple[int, list[str]] | None:
        """Whether a loaded snapshot matches the manifest; (tail start, cool files) if so.

        ``covered`` (see ``_write_snapshot``): ``seg -> size`` for each sealed
        segment and ``tail_seg -> offset``; ``_TAIL_MARK -> tail_seg``;
        ``-(n + 1) -> 0`` for each cool file number n the index had left; and
        ``_SYNCED_MARK -> last + 1`` when the tail bytes it covers were synced
        before it was written (every snapshot since the sixth session), ``last``
        being where the last line it covers starts.

        Such a snapshot vouches for the complete lines of the tail before
        ``last``, and for the size of each sealed segment (they never change
        once sealed): a tail that lost any of those lines (cut off or zeroed
        past its final line), or a sealed segment of another size, raises
        CorruptStateCheckpointError naming the file and offset. Only the final line may be found cut short (a torn append, as
        a crash leaves it): the snapshot is then not used and the rebuild
        quarantines it, as without a snapshot.
        """
        if covered.get(_TAIL_MARK) != self._tail_seg:
            return None
        sealed = {s: o for s, o in covered.items() if s >= 0 and s != self._tail_seg}
        now = {seg: self._segs[seg].file_size for seg in self._seg_order}
        if sealed != now:
            if covered.get(_SYNCED_MARK) and sealed.keys() == now.keys():
                # the same segments, one of another size: a sealed segment
                # never changes (a rewrite makes a new one), so it was damaged
                seg = next(s for s in self._seg_order if sealed[s] != now[s])
                raise CorruptStateCheckpointError(
                    f"sealed segment {seg} holds {now[seg]} bytes, but the index snapshot "
                    f"{SNAPSHOT_NAME} vouches for {sealed[seg]} (cut off or grown after it was "
                    f"sealed)", path=self._segs[seg].path, offset=min(now[seg], sealed[seg]))
            return None
        start = int(covered.get(self._tail_seg, -1))
        if self._tail is None or start < 0:
            return None
        tail = self._tail

        def cut(end: int) -> bool:      # no complete line ends at ``end``
            return end > tail.file_size or (end > 0 and (tail.buf is None or tail.buf[end - 1] != 0x0A))
        if cut(start) and self.read_only:
            # a viewer may have mapped the tail before the writer appended the
            # lines this newer snapshot covers: look again before judging
            tail.refresh_map()
        if cut(start):
            last = covered.get(_SYNCED_MARK, 0) - 1
            if last > 0 and cut(last):
                if last > tail.file_size:
                    what, at = f"the file ends at {tail.file_size}", tail.file_size
                else:
                    what, at = f"byte {last - 1} is not the newline", last - 1
                raise CorruptStateCheckpointError(
                    f"the tail lost complete lines that the index snapshot {SNAPSHOT_NAME} vouches "
                    f"for: they end at offset {last}, but {what} (damaged or cut off after they "
                    f"were synced)", path=tail.path, offset=at)
            end = min(start, tail.file_size)
            nl = tail.buf.rfind(b"\n", 0, end) + 1 if tail.buf is not None else 0
            if tail.buf is not None and bytes(tail.buf[nl:end]).strip(b"\0"):
                # what is left of it is quarantined and reported by the rescan
                log.warning("%s: the final line that the index snapshot vouches for (ending at "
                            "offset %d) is cut short; reading the tail again", tail.path, start)
            else:
                self._report_lost(tail.path, start, "the final tail line the index snapshot "
                                  "vouches for (an acknowledged append) is gone")
            return None
        cool_nums = {-(s + 1) for s in covered if s < 0 and s not in (_TAIL_MARK, _SYNCED_MARK, _EVENTS_MARK)}
        snap_cool = [f for f in self._manifest["cool_files"] if _cool_no(f) in cool_nums]
        return start, snap_cool

    def _snapshot_due(self) -> bool:
        """Whether a compaction writes the index snapshot (tuning.SNAPSHOT_EVERY)."""
        return self._snap_changes >= max(4096, int(len(self._index) * tuning.SNAPSHOT_EVERY))

    def _write_snapshot(self, later: list[Callable[[], object]] | None = None) -> None:
        """Save the index snapshot (lock held). The tail bytes it covers are
        synced first, so that it can vouch for them (see ``_snapshot_meta``).
        ``later``: the snapshot's bytes are made now and their write (temp
        file, fsync, rename: 70-100 ms at 1,000,000 messages) is appended
        to it, for a thread (see compaction's _Chore)."""
        # always: tail bytes a killed "none" session left unsynced are not
        # counted in _wpos (an fdatasync with nothing to write is cheap)
        self._writes.sync_now()
        assert self._tail is not None       # a writer always has its tail
        covered = {seg: self._segs[seg].file_size for seg in self._seg_order}
        covered[self._tail_seg] = self._tail.size
        covered[_TAIL_MARK] = self._tail_seg
        if self._events is not None:
            covered[_EVENTS_MARK] = self._events.line_end()
        size = self._tail.size
        buf = self._tail.buf
        covered[_SYNCED_MARK] = (buf.rfind(b"\n", 0, size - 1) + 1 if size > 1 and buf is not None else 0) + 1
        for f in self._manifest["cool_files"]:
            covered[-(_cool_no(f) + 1)] = 0
        write = None
        if later is not None:
            def write(path: str, data: bytearray) -> None:
                later.append(functools.partial(_index._write_atomic, path, data))
        self._index.save_snapshot(os.path.join(self.hot_dir, SNAPSHOT_NAME), covered, write=write)
        self._snap_changes = 0
        self._snap_files = self._snap_layout()

    def _snap_layout(self) -> tuple:
        """The files an index snapshot is written against: the sealed
        segments with their sizes, the tail's number and the cool files."""
        return (tuple((seg, self._segs[seg].file_size) for seg in self._seg_order), self._tail_seg,
                tuple(self._manifest["cool_files"]))

    def _snapshot_serves(self) -> bool:
        """Whether close() may leave the snapshot on disk as it is: it was
        written (or read at open) against the files as they are now, and at
        most SNAPSHOT_SLACK changes came after it (the next open reads those
        tail lines, as after a crash, and applies the tombstones as always)."""
        return (self._snap_changes <= tuning.SNAPSHOT_SLACK and self._snap_files is not None
                and self._snap_files == self._snap_layout())
