"""Search over the hot tier (the line check, the kept search filters, the lines
of characters that fold to ASCII) and the cool tier."""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Sequence, cast

import numpy as np

from .. import codec
from .._casefold import anchor_forms
from .._index import SEARCH_FILTER_LAYOUT
from .._log import scan_frames
from ..cool import relevant_specials
from ..errors import CorruptStateCheckpointError
from ..segments import (TailFile, decode_filters, encode_filters, filters_name, read_kept, write_kept)
from . import tuning
from .common import (_OFF_MASK, SearchHit, _check_line_starts, _xkey, own_calls)

from .host import Host

log = logging.getLogger("rune_fast")


class Search(Host):
    """Full-text search (a mixin of the repository)."""

    # ---- the state this room owns: written here only (tests/test_ownership.py)

    def _init_search_state(self) -> None:
        self._special_cache = {}

    def _reset_search_state(self) -> None:
        # what search has checked line by line: sealed segments, and the
        # tail (its number, up to which offset); see _check_hot_lines
        self._lines_checked = set()
        self._tail_checked = (-1, 0)
        # sealed segments' search filters: read from their kept files at the
        # first search; seg -> blocks kept on disk (see _keep_seg_filters)
        self._filters_read = False
        self._filters_kept = {}
        # segments whose line check met a damaged dead line or zeros: their
        # bytes do not parse as one line after another, which the search
        # pass over whole segments needs (see search)
        self._ragged = set()

    def _forget_filters(self, seg: int) -> None:
        """Segment ``seg`` is gone, and its kept filters with it."""
        self._filters_kept.pop(seg, None)

    def _search(self, text: str, channel_id: str | None = None, *, limit: int | None = None,
                case_sensitive: bool = False) -> list[SearchHit]:
        if limit == 0:
            return []
        ch_key = codec.key(channel_id) if channel_id is not None else None
        self._check_hot_lines()
        if not self._filters_read:
            self._read_seg_filters()
        # A pass over whole segments finds a hit's line by the newline
        # before it: a segment holding a damaged dead line or zeros (left
        # for verify() to report) is searched line by line from the index
        # instead, channel by channel, so its live lines are all seen.
        ragged = bool(self._ragged & (set(self._seg_order) | {self._tail_seg}))
        chans = [ch_key] if ch_key is not None or not ragged else list(self._index.channels())

        def hot(needle: bytes, ci: bool, na: bool) -> list[int]:
            if len(chans) == 1:
                return self._index.search(needle, ci, na, chans[0]).tolist()
            return [loc for ch in chans for loc in self._index.search(needle, ci, na, ch).tolist()]
        if case_sensitive:
            check = (lambda c: text in c)
            locs = hot(codec.key(text), False, False)
        else:
            folded = text.casefold()
            check = (lambda c: folded in c.casefold())
            specials = relevant_specials(folded) if folded.isascii() else ()
            if folded.isascii() and not (specials and ragged):
                # ASCII-case-insensitive candidates are exact, except where a
                # non-ASCII character folds to ASCII letters of the needle
                # ('ß' -> 'ss', Kelvin sign -> 'k'): the lines holding one
                # that can take part in a match join too (kept per segment).
                locs = hot(codec.key(folded), True, False)
                if specials:
                    seen = set(locs)
                    extra = [loc for loc in self._special_lines(specials) if loc not in seen]
                    locs.extend(self._live_in(extra, channel_id))
            elif folded.isascii():
                # ragged segments: every line holding a non-ASCII byte joins
                locs = hot(codec.key(folded), True, True)
            else:
                locs = self._anchored(hot, folded)
        if not self.read_only:
            self._keep_seg_filters()
        keyed = []
        for loc in locs:
            rec, seq = self._read_loc_seq(loc)
            if check(rec.content):
                keyed.append((_xkey(rec, seq), rec, self._tier_of(loc)))
        # cool hits whose verified records the cache holds are not read
        # again (a search asked twice); the rows read join the cache
        cached = self._cool_decoded
        rows, known = self._cool.search_known(text, channel_id, case_sensitive=case_sensitive, known=cached)
        deleted = self._cool_deleted
        for rec, o in (cached[loc] for loc in known):
            if channel_id is not None and rec.channel_id != channel_id:
                raise CorruptStateCheckpointError(
                    f"cool index says {rec.msg_id!r} is a message of channel {channel_id!r}, "
                    f"its row says {rec.channel_id!r}", path=self._cool.cool_dir)
            if rec.msg_id not in deleted and check(rec.content):
                keyed.append((_xkey(rec, o), rec, "cool"))
        read = [(self._cool_record(row), row) for row in rows]
        keyed += [(_xkey(rec, row.ord), rec, "cool") for rec, row in read if rec.msg_id not in deleted]
        self._cool_keep([(self._cool.loc_of(row), (rec, row.ord)) for rec, row in read[-tuning.DECODE_CACHE:]])
        keyed.sort(key=lambda e: e[0])
        if limit is not None:
            keyed = keyed[-limit:]
        recs = own_calls([r for _k, r, _t in keyed])
        self._bound_maps()          # the pass mapped every block its filters passed
        return [SearchHit(r, t) for r, (_k, _r, t) in zip(recs, keyed)]

    @staticmethod
    def _anchored(hot: Callable[[bytes, bool, bool], list[int]], folded: str) -> list[int]:
        """Candidate hot lines of a casefolded needle that is not ASCII: those
        holding one of its anchors' stored forms (byte searches of the
        compiled scan; _casefold.anchor_forms: no match is missed), each
        checked by the caller's fold. Without an anchor, every line holding
        a non-ASCII byte."""
        forms = anchor_forms(folded)
        if forms is None:
            return hot(b"", True, True)
        if len(forms) == 1:
            return hot(codec.key(forms[0]), False, False)
        return sorted(set().union(*(hot(codec.key(f), False, False) for f in forms)))

    def _check_hot_lines(self) -> None:
        """Check the checksum of every hot line once (lock held): a search
        reads only the lines its needle can match, so a flipped byte that
        unmade a match would otherwise drop a message from its hits without a
        word. Sealed segments never change and are checked once; the tail
        from where the last check stopped. A damaged line of a live message
        raises CorruptStateCheckpointError; one of a message that is gone
        (cooled or deleted, its bytes kept until a compaction rewrites the
        segment) is left to verify()."""
        live_arr: list[np.ndarray] = []

        def live(lo: int, hi: int) -> np.ndarray:
            """The indexed locations in [lo, hi), ascending (all of them
            sorted once, at the first call that needs them)."""
            if not live_arr:
                live_arr.append(np.sort(self._index.excess(0)))
            a = live_arr[0]
            return a[np.searchsorted(a, lo):np.searchsorted(a, hi)]
        for seg in self._seg_order:
            if seg not in self._lines_checked:
                s = self._segs[seg]
                self._check_lines(seg, s.buf, 0, s.size, s.path, live, self._unvouch(seg))
                self._lines_checked.add(seg)
        if self._tail is not None:
            seg, start = self._tail_checked
            if seg != self._tail_seg:
                start = 0
            if self._tail.size > start:
                self._check_lines(self._tail_seg, self._tail.buf, start, self._tail.size, self._tail.path, live,
                                  self._unvouch(self._tail_seg))
            self._tail_checked = (self._tail_seg, self._tail.size)

    def _read_seg_filters(self) -> None:
        """Hand the index the search filters kept for the sealed segments
        (lock held; once an open, at its first search, after the line check):
        a whole-store search skips their blocks that cannot hold its needle
        from the first search on. A file that does not hold for its segment
        (damaged, cut, another build's layout, other bytes) is named in a log
        warning and removed by a writer (a viewer leaves it); the index
        builds the filters again at its second search."""
        self._filters_read = True
        for seg in self._seg_order:
            s = self._segs.get(seg)
            if s is None or s.buf is None:
                continue
            buf = s.buf
            kept = read_kept(os.path.join(self.hot_dir, filters_name(seg)),
                             lambda raw: self._index_set_filters(
                                 seg, decode_filters(raw, SEARCH_FILTER_LAYOUT, buf)),
                             remove_bad=not self.read_only)
            if kept is not None:
                self._filters_kept[seg] = kept

    def _keep_seg_filters(self) -> None:
        """Write the filters the index built over sealed segments since they
        were last kept (lock held; a writer's, after a search): a cache, so
        the next open's first search skips blocks too (building them costs
        about five plain scans: ~1.5 s over the 600 MB of hot segments of
        the 1,000,000-message bench store). Temp file, fsync (not in "none"
        mode), rename; the folder is not synced (a power loss may cost the
        next open a build, or a warning for a file it left cut).
        A failed write is logged and skipped: the search has its answer."""
        for seg in self._seg_order:
            n = self._index.seg_filter_blocks(seg)
            s = self._segs.get(seg)
            if n <= self._filters_kept.get(seg, 0) or s is None or s.buf is None:
                continue
            path = os.path.join(self.hot_dir, filters_name(seg))
            if write_kept(path, encode_filters(SEARCH_FILTER_LAYOUT, s.buf, self._index.seg_filters(seg)),
                          tmp=path + ".tmp", sync=self.durability != "none"):
                self._filters_kept[seg] = n

    def _check_lines(self, seg: int, buf: Any, start: int, end: int, path: str,
                     live: Callable[[int, int], np.ndarray], vouched_end: int = 0) -> None:
        """Check the lines of ``seg`` in [start, end) (see _check_hot_lines),
        and that every indexed message before ``vouched_end`` (the bytes that
        were there at the open: see _vouched) starts a line: sound lines moved
        in the region an index snapshot vouches for would otherwise hide the
        messages from a search (its hits are found in the bytes, then looked
        up by offset). A segment where the scan meets a damaged line, a cut
        one, or zeros with live lines after them is noted as ragged (see
        search)."""
        base = seg << 40
        while start < end:
            scan = scan_frames(buf if buf is not None else b"", start, end)
            sound_end = min(vouched_end, scan.good_end if scan.damaged_offset < 0 else scan.damaged_offset)
            if sound_end > start:
                _check_line_starts(scan.offsets, live(base | start, base | sound_end) & _OFF_MASK, path)
            if scan.damaged_offset < 0:
                if scan.good_end < end:
                    # zeros (a segment's trailing preallocation, or zeroed
                    # lines) or a cut line: any live line from there on is
                    # checked by itself (a damaged one raises)
                    rest = live(base | scan.good_end, base | end)
                    if len(rest) or scan.torn_offset >= 0:
                        self._ragged.add(seg)
                    if len(rest):
                        self._index.check_lines(rest.tolist())
                return
            self._ragged.add(seg)
            off = scan.damaged_offset
            if len(live(base | off, base | off + 1)):
                raise CorruptStateCheckpointError(f"damaged line: {scan.damage}", path=path, offset=off)
            nl = memoryview(buf)[off:end].tobytes().find(b"\n")
            if nl < 0:
                return
            start = off + nl + 1

    def _special_lines(self, chars: Sequence[str]) -> list[int]:
        """Locations of the hot and tail lines (live or not) whose content
        holds one of ``chars``, found once per segment and kept: a sealed
        segment never changes, and the tail is scanned on from where the last
        search stopped. A rewritten segment has a new number."""
        segs = list(self._seg_order)
        if self._tail is not None and self._tail.size > 0:     # (an empty tail is not attached)
            segs.append(self._tail_seg)
        cache = self._special_cache
        for stale in [seg for seg in cache if seg not in segs]:
            del cache[stale]
        out: list[int] = []
        for seg in segs:
            per = cache.setdefault(seg, {})
            # not the tail's zero padding (segs holds the tail's number only when there is a tail)
            stop = cast("TailFile", self._tail).size if seg == self._tail_seg else -1
            for c in chars:
                end, locs = per.get(c, (0, []))
                new, end = self._index.scan_segment(seg, end, codec.key(c), stop)
                if len(new):
                    locs = locs + new.tolist()
                per[c] = (end, locs)
                out.extend(locs)
        return out

    def _live_in(self, locs: list[int], channel_id: str | None) -> list[int]:
        """The ``locs`` that are indexed messages (of ``channel_id``, if given)."""
        out = []
        find = self._index.find
        for loc in dict.fromkeys(locs):
            rec = self._read_loc(loc)
            if find(codec.key(rec.msg_id)) == loc and (channel_id is None or rec.channel_id == channel_id):
                out.append(loc)
        return out
