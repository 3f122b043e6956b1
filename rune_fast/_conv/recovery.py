"""Open and recovery: the manifest read, the live file set loaded (sealed segments,
the tail, the cool archive), an interrupted roll finished or undone, stray files
removed, torn lines quarantined, lost envelopes written again."""
from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Iterator, Sequence, cast


from .. import codec
from .._names import SEG_PREFIX
from ..atomic import AtomicStore
from .. import sync as _sync
from .._index import HotIndex
from .._encode import frame_messages
from .._log import scan_frames
from ..cool import CoolArchive
from ..errors import CorruptStateCheckpointError
from ..events import ensure_private_dir
from ..records import ConversationMessageRecord, payload_hash
from ..segments import (MARK_NAME, TAIL_NAME, Segment, TailFile, filters_name, fsync_dir, quarantine_bytes, seg_name)
from . import tuning
from .reads import cache_budgets
from .write_thread import WriteThread
from .common import (MANIFEST_NAME, COOL_DIR, DEVICE_NAME, LEGACY_NAME, QUARANTINE_DIR, _FORMAT, _OFF_MASK,
                     _READ_FORMATS, _REPEATED, _holds_bytes, _line_seq_ending, _message_lines, _unlink, _write_small_file)

from .host import Host

log = logging.getLogger("rune_fast")


class Recovery(Host):
    """The open of a repository and what it recovers (a mixin of the repository)."""

    # ---- the state this room owns: written here only (tests/test_ownership.py)

    def _init_recovery_state(self) -> None:
        self._quarantined = []
        self._lost = []         # vouched final lines found gone (see _report_lost)
        # (covered, tail size, msg_ids) of the tail's message lines after the
        # last compaction, as the open read them (_observe_stored_stamps)
        self._uncovered = None
        self._rejournaled = 0   # envelopes written again (see _rederive_lost_envelopes)

    def _set_covered(self, covered: int, covered_events: int) -> None:
        """The tail is folded up to ``covered``, its envelopes up to ``covered_events``."""
        self._covered = covered
        self._covered_events = covered_events

    def _set_segment_order(self, order: list[int]) -> None:
        self._seg_order = order

    def _new_seg_no(self) -> int:
        """A segment number never used before (the manifest keeps the next)."""
        seg = self._next_seg
        self._next_seg += 1
        return seg

    def _add_segment(self, seg: int, path: str, end: int, *, ordered: bool = False) -> Segment:
        """Map the sealed segment file ``path`` as ``seg`` (its data ends at
        ``end``); ``ordered``: it goes last in the segment order (a sealed
        tail), else the caller's new order places it."""
        self._seg_ends[seg] = end
        s = self._segs[seg] = Segment(path, seg)
        if ordered:
            self._seg_order.append(seg)
        return s

    def _pop_segment(self, seg: int) -> Segment | None:
        """Forget sealed segment ``seg`` (the caller closes and unlinks it)."""
        return self._segs.pop(seg, None)

    def _open_next_tail(self) -> None:
        """An empty tail under a new segment number (after a roll)."""
        self._tail_seg = self._new_seg_no()
        self._tail = TailFile(os.path.join(self.hot_dir, TAIL_NAME), self._tail_seg)

    def _set_tail_size(self, end: int) -> None:
        """The tail's lines end at ``end`` (what an ingest found sound)."""
        assert self._tail is not None
        self._tail.size = end

    def _take_seqs(self, n: int) -> int:
        """The first of ``n`` append sequences handed to new lines."""
        seq0 = self._next_seq
        self._next_seq += n
        return seq0

    def _unvouch(self, seg: int) -> int:
        """Where the bytes the open found in ``seg`` end (0: none vouched),
        handed out once: the first search checks their line starts."""
        return self._vouched.pop(seg, 0)

    def _raise_cool_max(self, channel_id: str, stamp: tuple) -> bool:
        """Whether ``stamp`` ((hlc, msg_id) of a row just cooled) is the
        newest of its channel's cool rows (it is kept as such then)."""
        if stamp > self._cool_max.get(channel_id, ("", "")):
            self._cool_max[channel_id] = stamp
            return True
        return False

    def _record_manifest(self, m: dict, *, durable: bool) -> None:
        """Write the manifest ``m``: the live file set from now on."""
        self._manifest_store.write(m, durable=durable)
        self._manifest = m

    # What a read-only viewer does otherwise in the open is in the methods
    # below that ReadOnlyViewer (_conv/viewer.py) overrides: _make_dirs,
    # _settle_open, _keep_device_id, _load_attempts, _open_tail, _write_first_manifest,
    # _remove_stray_segments, _gc_cool, _undo_roll, _finish_roll_on_disk,
    # _visible_end, _tail_durable_end, _quarantine_torn.

    def _open(self, events: Any) -> None:
        self._make_dirs()
        self._acquire(events)
        self._manifest_store = AtomicStore(os.path.join(self.hot_dir, MANIFEST_NAME))
        self._clock = _sync.HlcClock(self._device_id())
        self._writes = WriteThread(os.path.join(self.hot_dir, MARK_NAME), writer=not self.read_only,
                                   durability=self.durability, tail=lambda: self._tail)
        self._load_state()
        self._settle_open()

    def _make_dirs(self) -> None:
        for d in (self.state_dir, self.hot_dir):
            if not os.path.isdir(d):
                # each new folder's entry synced in its parent: a power
                # loss must not take a new store with its acknowledged lines
                ensure_private_dir(d)
                os.chmod(d, 0o700)

    def _settle_open(self) -> None:
        """A writer's last steps of the open, once the state is loaded."""
        # the lines this writer found (a killed writer's unsynced ones
        # too) are durable from here on: viewers may show them
        assert self._tail is not None       # a writer always has its tail
        end = (self._tail_seg << 40) | self._tail.size
        # (not when the last writer published them all durable: a clean
        # close, or a kill after its last sync -- each fdatasync is a device
        # cache flush, 0.1-10 ms of an open on a shared disk)
        if self.durability != "none" and self._tail.size and self._writes.stored() != end:
            self._tail.sync()
        self._writes.opened(end)
        if not self._rederive_lost_envelopes():
            self._rederive_envelopes()
        self._import_legacy()

    def _device_id(self) -> str:
        path = os.path.join(self.hot_dir, DEVICE_NAME)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raw = b""
        try:
            dev = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise CorruptStateCheckpointError(f"device id is not UTF-8 text: {exc}", path=path,
                                              offset=exc.start) from None
        if any(c < " " or c == "\x7f" for c in dev):
            raise CorruptStateCheckpointError("device id holds a control character", path=path)
        if dev:
            return dev
        from ..records import new_id
        dev = new_id("dev")
        self._keep_device_id(path, dev)
        return dev

    def _keep_device_id(self, path: str, dev: str) -> None:
        _write_small_file(path, dev.encode())

    def _load_state(self) -> None:
        """Read the manifest, map every segment, load or rebuild the index.

        A read-only viewer races the writer's compactions (a file the manifest
        it read named may be gone by the time it opens it): it reads again
        while the manifest keeps changing under it."""
        self._reloads = getattr(self, "_reloads", -1) + 1
        self._load_attempts()

    def _load_attempts(self) -> None:
        self._load_state_once()

    def _state_files(self) -> list[Any]:
        """The open tail, segments and cool archive of the loaded state."""
        out: list[Any] = list(getattr(self, "_segs", {}).values())
        for name in ("_tail", "_cool"):
            f = getattr(self, name, None)
            if f is not None:
                out.append(f)
        return out

    def _stale_view(self) -> bool:
        """Whether the writer moved the manifest since this viewer read it."""
        try:
            return self._manifest_store.read() != self._manifest
        except CorruptStateCheckpointError:
            return True

    def _load_state_once(self) -> None:
        m = self._manifest_store.read()
        fresh = m is None
        if m is None:
            m = {"format": _FORMAT, "segments": [], "tail_seg": 1, "covered": 0,
                 "cool_files": [], "events_offset": 0, "next_seg": 2, "next_seq": 0}
            self._check_new_store()
            self._write_first_manifest(m)
        if m.get("format") not in _READ_FORMATS:
            raise CorruptStateCheckpointError(
                f"manifest format {m.get('format')!r} is not one this build reads "
                f"({', '.join(map(str, _READ_FORMATS))})",
                path=self._manifest_store.path)
        self._manifest = m
        self._covered = int(m["covered"])
        # the size events.jsonl had when the tail was folded up to _covered:
        # the envelopes of the lines after _covered lie after it (see
        # _rederive_envelopes); the manifest records the two together
        self._covered_events = int(m.get("events_offset", 0))
        self._tail_seg = int(m["tail_seg"])
        self._next_seg = int(m["next_seg"])
        self._next_seq = int(m.get("next_seq", 0))
        # Sealed segments, in logical (append) order.
        self._segs: dict[int, Segment] = {}
        self._seg_order: list[int] = list(m["segments"])
        # where each sealed segment's lines end (its bytes were synced when it
        # was sealed): a rebuild must find complete lines exactly that far
        self._seg_ends: dict[int, int] = {int(k): int(v) for k, v in (m.get("segment_ends") or {}).items()}
        for seg in self._seg_order:
            path = os.path.join(self.hot_dir, seg_name(seg))
            try:
                self._segs[seg] = Segment(path, seg)
            except FileNotFoundError:
                raise CorruptStateCheckpointError(f"segment {seg} named by the manifest is missing",
                                                  path=path) from None
        self._recover_roll()
        self._remove_stray_segments()
        self._tail = self._open_tail(fresh)
        self._cool = CoolArchive.open(os.path.join(self.hot_dir, COOL_DIR), list(m["cool_files"]),
                                      read_only=self.read_only, durable=self.durability != "none",
                                      cache_bytes=cache_budgets(self._cache_now)[3], expect=m.get("cool_meta"))
        self._gc_cool(list(m["cool_files"]))
        # channel -> (hlc, msg_id) of its newest stamped cool row (kept in the
        # manifest; an erasure may leave it higher than needed, never lower)
        self._cool_max: dict[str, tuple] = {ch: tuple(v) for ch, v in m.get("cool_max", {}).items()}
        # each room's state as of this load, set by the room that owns it
        self._reset_tombstone_state(self._load_tombstones())
        self._reset_read_caches()
        self._reset_fold_order()
        self._reset_archive_views()
        self._reset_schedule()
        self._reset_search_state()
        self._reload_index()
        # seg -> where the bytes that were there at this load end: the region
        # an index snapshot may vouch for, whose line starts the first search
        # checks once (lines this process appends, ingests or rewrites are
        # placed by the index itself); see _check_lines
        self._vouched: dict[int, int] = {seg: s.size for seg, s in self._segs.items()}
        if self._tail is not None:
            self._vouched[self._tail_seg] = self._tail.size
        # (the last line's sequence: the tail's, else the last sealed segment's)
        self._next_seq = max(self._next_seq,
                             self._seq_floor(self._tail.size if self._tail is not None else 0) + 1)
        self._scale_caches()        # (the default budget grows with the store it has taken)
        self._observe_stored_stamps()
        self._writes.reset()
        self._note_unerased()

    def _observe_stored_stamps(self) -> None:
        """Move the clock past every stamp stored: the manifest keeps the
        clock as of the last checkpoint; tail lines after it are read here
        (their ids kept for _rederive_envelopes); tombstones carry their own
        stamps. Those lines count towards the next automatic compaction
        (SPEC: one every ``compact_every`` stored messages, however many
        sessions stored them), which keeps them bounded by ``compact_every``."""
        if self._manifest.get("clock"):
            self._observe(self._manifest["clock"])
        self._uncovered = None
        if self._tail is not None and self._tail.size > self._covered:
            found = list(self._uncovered_records())
            self._observe_stamps([rec for _off, rec in found])
            ids = [rec.msg_id for _off, rec in found]
            self._count_uncompacted(len(ids))
            self._uncovered = (self._covered, self._tail.size, ids)
        for hlc in self._tombfile.hlcs:
            self._observe(hlc)

    def _uncovered_records(self) -> Iterator[tuple[int, ConversationMessageRecord]]:
        """(offset, record) of each message line of the tail after the last
        compaction (``_covered``)."""
        assert self._tail is not None       # only called with a tail
        yield from _message_lines(self._tail.buf, self._tail.path,
                                  self._tail_lines(self._covered, self._tail.size))

    def _seq_floor(self, start: int) -> int:
        """The append sequence of the line before tail offset ``start`` (at
        0: the last line of the last sealed segment, where the manifest
        records its end): the tail's lines from ``start`` rise above it; -1
        when that cannot say."""
        if start > 0:
            return _line_seq_ending(self._tail.buf if self._tail is not None else None, start)
        for seg in reversed(self._seg_order):
            end = self._seg_ends.get(seg)
            s = self._segs.get(seg)
            if end is None or s is None:
                return -1
            if end > 0:
                return _line_seq_ending(s.buf, end)
        return -1

    def _check_new_store(self) -> None:
        """A state directory without a manifest must hold no messages: a
        writer writes the manifest before anything else (stores made before
        it did, killed before their first compaction, hold a tail and maybe
        a snapshot or tombstones). Anything more means the manifest was lost,
        and reading on would drop the segments and archives it names."""
        if not os.path.isdir(self.hot_dir):
            return      # (a viewer of a store not made yet)
        found = sorted(n for n in os.listdir(self.hot_dir)
                       if n.startswith(SEG_PREFIX) and n.endswith(".jsonl"))
        cool_dir = os.path.join(self.hot_dir, COOL_DIR)
        if os.path.isdir(cool_dir):
            found += [os.path.join(COOL_DIR, n) for n in sorted(os.listdir(cool_dir)) if n.endswith(".parquet")]
        if found:
            raise CorruptStateCheckpointError(
                f"the manifest is missing, but the store holds {', '.join(found[:3])}"
                f"{' and more' if len(found) > 3 else ''}: its messages would be lost",
                path=self._manifest_store.path)

    def _open_tail(self, fresh: bool) -> TailFile | None:
        """The tail a writer appends to (made if there is none); ``fresh``:
        the store has no manifest yet."""
        tail = TailFile(os.path.join(self.hot_dir, TAIL_NAME), self._tail_seg)
        # an empty tail may be new (made just now, or by a writer killed
        # before it synced the folder): its folder entry is synced before
        # the first line in it is acknowledged, not here -- an open that
        # writes nothing syncs nothing (one folder fsync, 0.1-3 ms)
        tail.entry_unsynced = tail.file_size == 0
        return tail

    def _write_first_manifest(self, m: dict) -> None:
        # a store's first file: from now on a missing manifest is damage
        self._manifest_store.write(m)

    def _gc_cool(self, cool_files: list[str]) -> None:
        # files a crash left unreferenced (written before the manifest moved,
        # or replaced by it before they were unlinked)
        self._cool.gc(cool_files)

    def _remove_stray_segments(self) -> None:
        """Unlink segment files the manifest does not name: a rewrite whose
        manifest never moved, or an old segment a crash kept from being
        unlinked after it did (it may hold erased content)."""
        keep = {seg_name(s) for s in self._seg_order} | {seg_name(self._tail_seg)}
        keep |= {filters_name(s) for s in self._seg_order}
        removed = False
        for name in os.listdir(self.hot_dir):
            if name.startswith(SEG_PREFIX) and name.endswith((".jsonl", ".grams", ".grams.tmp")) \
                    and name not in keep:
                _unlink(os.path.join(self.hot_dir, name))
                removed = True
        if removed:
            fsync_dir(self.hot_dir)

    def _recover_roll(self) -> None:
        """Finish or undo a tail roll the manifest does not show: the tail
        was renamed to sealed segment ``tail_seg`` (synced, then the folder
        synced) and a new tail made, and then a crash, or a compaction that
        failed (a full disk), kept the manifest from moving.

        A new tail holding nothing but zeros (or missing) is undone: the
        sealed file becomes the tail again. One holding bytes took appends
        after the roll: the roll is finished as the compaction would have
        (segment ``tail_seg`` sealed, the tail is segment ``next_seg``), the
        envelopes of the sealed lines after the last compaction are derived
        again where missing, and the manifest is written (a viewer does the
        same in memory and writes nothing)."""
        sealed = os.path.join(self.hot_dir, seg_name(self._tail_seg))
        if self._tail_seg in self._segs or not os.path.exists(sealed):
            return
        tail_path = os.path.join(self.hot_dir, TAIL_NAME)
        if _holds_bytes(tail_path):
            self._finish_roll(sealed)
            return
        self._undo_roll(sealed, tail_path)

    def _undo_roll(self, sealed: str, tail_path: str) -> None:
        """The new tail holds nothing: the sealed file is the tail again."""
        os.replace(sealed, tail_path)
        fsync_dir(self.hot_dir)

    def _finish_roll(self, sealed: str) -> None:
        """The second half of an interrupted roll (see _recover_roll)."""
        seg = self._tail_seg
        s = self._segs[seg] = Segment(sealed, seg)
        scan = scan_frames(s.buf if s.buf is not None else b"")
        if scan.damaged_offset >= 0 or scan.torn_offset >= 0:
            at = scan.damaged_offset if scan.damaged_offset >= 0 else scan.torn_offset
            raise CorruptStateCheckpointError(
                f"sealed segment {seg} of an interrupted tail roll holds a damaged line: "
                f"{scan.damage or 'cut short'}", path=sealed, offset=at)
        covered, self._covered = self._covered, 0
        self._seg_order.append(seg)
        self._seg_ends[seg] = scan.good_end
        self._tail_seg = self._next_seg
        self._next_seg += 1
        log.warning("%s: a tail roll was interrupted (a crash or a failed compaction) after "
                    "appends to the new tail: finished as segment %d", sealed, seg)
        self._finish_roll_on_disk(s, scan, covered)

    def _finish_roll_on_disk(self, s: Segment, scan: Any, covered: int) -> None:
        """A writer's part of _finish_roll: the envelopes and the manifest."""
        sealed = s.path
        assert self._events is not None     # a writer always has its event store
        # envelopes of the sealed lines after the last compaction: written
        # after their lines, maybe lost with the compaction that failed
        start = self._events.next_line_start(self._covered_events)
        journaled = {env["id"] for env in self._events.iter_envelopes(start)
                     if env.get("type") == "conversation.message" and type(env.get("id")) is str}
        lines = [(off, ln) for off, ln in zip(scan.offsets.tolist(), scan.lengths.tolist()) if off >= covered]
        missing = [rec for _off, rec in _message_lines(s.buf, sealed, lines) if rec.msg_id not in journaled]
        for rec in missing:
            self._events.append("conversation.message", rec.msg_id, payload_hash(rec))
        if missing:
            self._events.sync()
            self._rejournaled += len(missing)
        m = dict(self._manifest)
        m.update(segments=list(self._seg_order), tail_seg=self._tail_seg, next_seg=self._next_seg,
                 covered=0, segment_ends={str(g): e for g, e in self._seg_ends.items()
                                          if g in self._segs})
        self._manifest_store.write(m)
        self._manifest = m

    def _attach_all(self, index: HotIndex) -> None:
        for seg in self._seg_order:
            index.attach(seg, self._segs[seg].buf, self._segs[seg].path)
        if self._tail is not None:
            # (a viewer's tail is written by another process: no search
            # filters over it; a writer's get them over its lines, whose
            # end it sets: see HotIndex.set_lines_end)
            index.attach(self._tail_seg, self._tail.buf, self._tail.path, growing=self.read_only)

    def _reattach_tail(self) -> None:
        """The tail's map again, grown (a writer's appends past it, a
        viewer's refresh); a writer's keeps its lines end and the search
        filters built over the lines before it, which its appends leave as
        they are."""
        tail = cast("TailFile", self._tail)    # only called with a tail (a writer's, or refresh's)
        self._index_attach(self._tail_seg, tail.buf, tail.path, growing=self.read_only,
                           keep_lines=not self.read_only)

    def _visible_end(self) -> int:
        """Where the tail lines to read end: the whole file for a writer; for
        a viewer, where the writer's durable lines end (its DurableMark), as
        SPEC's refresh() shows "what the writer has made durable" (a line in
        the file may still await its sync). Lines of a tail the writer has
        sealed since are all durable; a store without a mark (its writer
        predates it) shows every complete line."""
        assert self._tail is not None
        return self._tail.file_size

    def _report_lost(self, path: str, offset: int, what: str, *, where: str = "it ended at offset") -> None:
        """Note a final line a checkpoint vouched for that is gone whole (cut
        at its start, or zeroed: SPEC reads zeros past the last complete line
        as no damage, and a crash may cut the final line): read as a crash
        leaves it, and noted -- a log record and ``stats()["lost"]``."""
        log.warning(f"rune_fast: {path}: {what} ({where} {offset})")
        self._lost.append({"path": path, "offset": offset, "what": what})

    def _tail_durable_end(self, start: int) -> int | None:
        """Where the tail's bytes the store knows to be durable end, for a
        writer's open (None for a viewer): the most of the snapshot's start
        (``start``: its tail lines were synced before it), the manifest's
        ``covered`` and the durable mark (published after each sync)."""
        end = max(start, self._covered)
        loc = self._writes.stored()
        if loc is not None and loc >> 40 == self._tail_seg:
            end = max(end, loc & _OFF_MASK)
        return end

    def _check_ingest(self, rep, path: str, *, sealed: bool, durable_end: int | None = None) -> None:
        torn_at = rep.torn_offset
        if rep.damaged_offset >= 0:
            if durable_end is None or rep.damaged_offset < durable_end:
                raise CorruptStateCheckpointError(f"damaged line: {rep.damage}", path=path,
                                                  offset=rep.damaged_offset)
            # SPEC: bytes after the last point the store knows to be durable
            # may come back torn anywhere after a power loss (a page lost
            # before a later page kept): no later line was synced either
            # (a sync covers every earlier byte), so none was acknowledged;
            # all of them are quarantined as a torn final line is
            torn_at = rep.damaged_offset
        if len(rep.dup_locs):
            # no writer stores an id twice: a line repeated (each copy sound)
            raise CorruptStateCheckpointError(f"damaged line: {_REPEATED}", path=path,
                                              offset=int(rep.dup_locs[0]) & _OFF_MASK)
        if torn_at >= 0:
            if sealed:
                raise CorruptStateCheckpointError("sealed segment ends in a cut-short line",
                                                  path=path, offset=torn_at)
            self._quarantine_torn(path, torn_at)
        # zero padding (preallocation) needs nothing: appends overwrite it

    def _quarantine_torn(self, path: str, torn_at: int) -> None:
        """Move the tail's torn final line (from ``torn_at``) to the quarantine folder."""
        assert self._tail is not None      # a writer always has its tail
        data = bytes(self._tail.buf[torn_at:self._tail.file_size])
        qpath = quarantine_bytes(os.path.join(self.hot_dir, QUARANTINE_DIR), path,
                                 torn_at, data.strip(b"\0"))
        self._quarantined.append({"path": path, "offset": torn_at,
                                  "length": len(data.strip(b"\0")), "quarantine": qpath})
        self._tail.discard_from(torn_at)

    def _rederive_lost_envelopes(self) -> bool:
        """An event store shorter than the manifest's ``events_offset`` lost
        envelopes a checkpoint relied on (cut, emptied or replaced after they
        were synced): write again the ``conversation.message`` envelope of
        every stored message that has none (the records hold the bodies), and
        say so -- a log record and ``stats()["rejournaled"]`` (a torn final
        envelope is also quarantined and warned about by the event store).
        True if it did (every stored message has its envelope then)."""
        assert self._events is not None     # a writer always has its event store
        vouched = int(self._manifest.get("events_offset", 0))
        size = self._events.size
        if size >= vouched:
            return False
        have = {env.get("id") for env in self._events.iter_envelopes(0)
                if env.get("type") == "conversation.message"}
        missing = [rec for rec in self._all_records() if rec.msg_id not in have]
        for rec in missing:
            self._events.append("conversation.message", rec.msg_id, payload_hash(rec))
        self._events.sync()
        self._rejournaled += len(missing)
        # the recorded offset lies past the end (or mid-line) now: every open
        # reads the envelopes from the start until a compaction records anew
        self._covered_events = 0
        self._write_manifest(list(self._manifest["cool_files"]))
        msg = (f"rune_fast: {self._events.path} ends at offset {size}, before the {vouched} bytes the "
               f"manifest vouches for (cut or replaced after they were synced): the envelopes of "
               f"{len(missing)} stored message(s) were written again from their records")
        log.warning(msg)
        return True

    def _rederive_envelopes(self) -> None:
        """Write the ``conversation.message`` envelope of every tail message a
        crash kept out of the event store (the tail holds the body), and note
        messages journaled since the index snapshot that no tier holds."""
        assert self._events is not None     # a writer always has its event store
        # (a checkpoint of an earlier build may have recorded a size read
        # while a task envelope was half written: its lines start after it)
        start = self._events.next_line_start(int(self._manifest.get("events_offset", 0)))
        unheld_from = self._events.next_line_start(max(start, self._snap_events))
        lines_after = self._tail is not None and self._tail.size > self._covered
        if not lines_after and self._events.size <= unheld_from:
            return
        journaled: dict[str, int] = {}      # msg_id -> offset of its envelope
        for env in self._events.iter_envelopes(start if lines_after else unheld_from):
            if env.get("type") == "conversation.message" and type(env.get("id")) is str:
                journaled.setdefault(env["id"], env["offset"])
        if self._events_private:
            self._note_unheld([m for m, at in journaled.items() if at >= unheld_from], journaled)
        if not lines_after:
            return
        assert self._tail is not None       # (lines_after)
        # the ids the open read (_observe_stored_stamps), if the tail is as it was
        known, self._uncovered = self._uncovered, None
        if (known is not None and known[:2] == (self._covered, self._tail.size)
                and all(mid in journaled for mid in known[2])):
            missing = []        # (the common case: no line decoded again)
        else:
            missing = [rec for _off, rec in self._uncovered_records() if rec.msg_id not in journaled]
        if missing:
            for rec in missing:
                self._events.append("conversation.message", rec.msg_id, payload_hash(rec))
            self._events.sync()

    def _note_unheld(self, ids: list[str], journaled: dict[str, int]) -> None:
        """A ``conversation.message`` envelope is written after its tail line,
        so after a crash every message journaled since the index snapshot
        (``ids``; ``journaled`` gives each envelope's offset) is in some tier,
        deleted, or a torn final line that was quarantined. One that is none
        of these was acknowledged and then lost (its complete lines cut or
        zeroed: SPEC reads zeros past the last complete line as no damage, so
        the open goes on): noted as :meth:`_report_lost` notes a vouched line
        gone (a log record and ``stats()["lost"]``). A power loss between the
        two writes of an append that was never acknowledged would also leave
        such an envelope."""
        ids = [m for m in ids if m not in self._tombstones]
        if not ids:
            return
        found = self._index.find_many([codec.key(m) for m in ids]).tolist()
        ids = [m for m, f in zip(ids, found) if f < 0]
        if ids and self._cool.has_files():
            ids = [m for m, hit in zip(ids, self._cool.contains_many(ids).tolist()) if not hit]
        if not ids:
            return
        torn = b"\n".join(data for _path, data in self._torn_lines())
        assert self._events is not None     # a writer always has its event store
        for mid in ids:
            if codec.key(mid) in torn:
                continue        # its line was a torn final one: never acknowledged
            self._report_lost(self._events.path, journaled[mid],
                              f"message {mid!r} was journaled (an acknowledged append) but no tier "
                              f"holds it: its tail line is gone", where="its envelope is at offset")

    def _torn_lines(self) -> list[tuple[str, bytes]]:
        """(path, bytes) of each torn line kept in the quarantine folder (this
        open's and earlier ones)."""
        qdir = os.path.join(self.hot_dir, QUARANTINE_DIR)
        try:
            names = sorted(os.listdir(qdir))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            path = os.path.join(qdir, name)
            with open(path, "rb") as f:
                out.append((path, f.read()))
        return out

    def _tail_lines(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        assert self._tail is not None       # only called with a tail
        scan = scan_frames(self._tail.buf, start, end)
        yield from zip(scan.offsets.tolist(), scan.lengths.tolist())

    def _import_legacy(self) -> None:
        path = os.path.join(self.hot_dir, LEGACY_NAME)
        if not os.path.exists(path):
            return
        records = _legacy_records(path)
        self.append_many(records)
        os.unlink(path)
        fsync_dir(self.hot_dir)
        log.info("imported %d messages from legacy checkpoint %s", len(records), path)

    def _legacy_tail(self, path: str) -> TailFile:
        """A viewer's tail for a store that holds only a legacy checkpoint:
        its messages (the first of each id, in order) framed as the tail
        lines an import would write, in an unlinked temporary file mapped
        read-only. Nothing in the state directory is written or imported;
        a writer's open imports the checkpoint (SPEC section 5)."""
        records = _legacy_records(path)
        first: dict[str, int] = {}
        for i, r in enumerate(records):
            first.setdefault(r.msg_id, i)
        order = sorted(first.values())
        bodies, _hashes, _keys = codec.encode_batch(records)
        data, _lengths = frame_messages(bodies, order, 0)
        with tempfile.NamedTemporaryFile(prefix="rune-legacy-", suffix=".jsonl") as f:
            f.write(data)
            f.flush()
            tail = TailFile(f.name, self._tail_seg, read_only=True)
        tail.path = path            # (what errors and reports name)
        return tail

    def _cool_ids_in(self, files: Sequence[str]) -> list[str]:
        import pyarrow.parquet as pq
        out: list[str] = []
        for name in files:
            path = os.path.join(self._cool.cool_dir, name)
            try:
                # (page CRCs checked, and the rows counted against the footer,
                # which the manifest vouches for: a damaged page header made
                # pyarrow read fewer ids, and their hot lines stayed indexed
                # beside the archived rows, counted twice)
                with pq.ParquetFile(path, page_checksum_verification=True) as pf:
                    ids = pf.read(columns=["msg_id"]).column(0)
                if len(ids) != pf.metadata.num_rows:
                    raise ValueError(f"{len(ids)} ids read of the {pf.metadata.num_rows} rows its footer holds")
                out.extend(ids.to_pylist())
            except (OSError, ValueError) as exc:
                raise CorruptStateCheckpointError(f"cool archive is not readable: {exc}",
                                                  path=path) from None
        return out


def _legacy_records(path: str) -> list[ConversationMessageRecord]:
    """The messages of the legacy checkpoint at ``path`` (a JSON list of
    message dicts, or ``{"messages": [...]}``), each validated;
    CorruptStateCheckpointError naming the file (and the item) otherwise."""
    try:
        with open(path, "rb") as f:
            data = codec.loads_exact(f.read())
    except (ValueError, OSError) as exc:
        raise CorruptStateCheckpointError(f"legacy checkpoint is not readable JSON: {exc}",
                                          path=path) from None
    items = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise CorruptStateCheckpointError(
            "legacy checkpoint holds neither a list of messages nor {\"messages\": [...]}", path=path)
    records = []
    for i, d in enumerate(items):
        try:
            records.append(ConversationMessageRecord.from_dict(d))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise CorruptStateCheckpointError(f"legacy message {i} does not validate: {exc}",
                                              path=path, offset=i) from None
    return records
