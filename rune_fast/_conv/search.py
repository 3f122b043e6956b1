"""Search over the hot tier (the line check, the kept search filters, the lines
of characters that fold to ASCII) and the cool tier."""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Sequence, cast

import numpy as np

from .._arrays import unique
from .._memory import trim_heap
from .. import codec
from .._casefold import anchor_plan, ascii_probes
from .._index import (SEARCH_FILTER_LAYOUT, WALK_BUDGET, WALK_MORE, WALK_UNORDERED, NewestWalk, contents,
                      live_locs, order_sort)
from .._log import scan_frames
from .._pages import search_hits
from .._search import fold_find_list
from ..cool import relevant_specials
from ..cool.search import EVERY_LOC
from ..errors import CorruptStateCheckpointError
from .._order import order_key
from ..records import ConversationMessageRecord
from ..segments import (TailFile, decode_filters, encode_filters, filters_current, filters_name, read_kept,
                        write_kept)
from . import tuning
from .common import (_MAX_N, _OFF_MASK, SearchHit, _check_line_starts, _first, _xkey, own_calls)

from .host import Host

log = logging.getLogger("rune_fast")


class _Plan:
    """How a search's needle is looked for in the hot lines' bytes: ``needle``
    (escaped key bytes, ASCII-case-blind with ``ci``; None: none) marks a
    line a hit of its own; a line holding one of ``probes`` (escaped key
    bytes of anchors, ASCII-case-blind) or, with ``na``, any non-ASCII byte
    is a candidate that the compiled casefold matcher (_search.fold_find)
    decides on its content bytes. ``check(content)`` is the contract's test
    (``text in content``, or ``folded in content.casefold()``)."""

    __slots__ = ("needle", "ci", "probes", "na", "check", "folded", "fold_all", "case_sensitive", "need",
                 "blind", "specials")

    def __init__(self, text: str, case_sensitive: bool) -> None:
        self.probes: list[bytes] = []
        self.na = False
        self.fold_all = False            # every candidate needs its fold check
        self.case_sensitive = case_sensitive
        # an ASCII needle's candidates that do not hold it ASCII-case-blind
        # (``blind``, its key) must hold one of ``need`` (its relevant
        # specials) to be hits; ``specials``: lines holding one are candidates
        self.need: list[bytes] = []
        self.blind = b""
        self.specials: Sequence[str] = ()
        if case_sensitive:
            self.folded = text
            self.needle: bytes | None = codec.key(text)
            self.ci = False
            self.check: Callable[[str], bool] = (lambda c: text in c)
            return
        folded = self.folded = text.casefold()
        # (an ASCII text's casefold is its lower(), which is cheaper; and an
        # ASCII needle in any text's lower() is in its casefold: a character
        # whose lower() holds ASCII has that lower() as its casefold, checked
        # over every code point by tests/test_search_fold.py)
        if folded.isascii():
            self.check = (lambda c: folded in c.lower() or (not c.isascii() and folded in c.casefold()))
        else:
            self.check = (lambda c: folded in (c.lower() if c.isascii() else c.casefold()))
        self.ci = True
        specials = relevant_specials(folded) if folded.isascii() else ()
        if not folded or (folded.isascii() and not specials):
            # ASCII-case-insensitive matches are exact where no non-ASCII
            # character folds to ASCII letters of the needle ('ß' -> 'ss',
            # Kelvin sign -> 'k', ligatures) in a way that can take part
            self.needle = codec.key(folded)
            return
        if specials:
            self.need = [codec.key(c) for c in specials]
            self.blind = codec.key(folded)
            forms = ascii_probes(folded, specials)
            if len(forms) == 1 and forms[0].isascii():
                # a part of the needle that every spelling of a hit holds
                # ('goethe' of 'goethestrasse'): one scan finds every
                # candidate, each decided by _fold_candidates
                self.needle = None
                self.fold_all = True
                self.probes = [codec.key(forms[0])]
                return
            # the lines holding it ASCII-case-blind are exact; those holding
            # a relevant special (found once per segment and kept:
            # _special_lines) are decided by _fold_candidates
            self.needle = codec.key(folded)
            self.specials = specials
            self.probes = list(self.need)
            return
        # the other needles: lines holding one of the stored forms of an
        # anchor (_casefold.anchor_plan: no match is missed; a few
        # ASCII-case-blind scans), each decided by the compiled matcher; with
        # no anchor every line holding a non-ASCII byte
        self.needle = None
        self.fold_all = True
        anchors = anchor_plan(folded)
        if anchors is None:
            self.na = True
        else:
            self.probes = [codec.key(f) for f in anchors]


@functools.lru_cache(maxsize=256)
def _plan(text: str, case_sensitive: bool) -> _Plan:
    """The _Plan of a needle, kept for the last 256 (a plan is never
    changed once made): ~3 us warm, but 60-90 us right after a pass that
    left the caches cold (a common needle's unlimited search), a fifth of a
    limited search of it."""
    return _Plan(text, case_sensitive)


def _hit_order(hot_keys: list[tuple], recs: list[ConversationMessageRecord], ords: list[int]) -> list[int]:
    """The order of a whole search's hits (:func:`order_key`'s, stable):
    the hot hits (their order keys ``hot_keys``) numbered first, then the
    cool ones (``recs`` with their ``ords``). The unstamped sort by their
    append sequence as one int64 array, ahead of the stamped, which sort
    by ``(hlc, msg_id)``: no key tuple is made for a cool hit without a
    stamp (most, in stores without sync), and none compared."""
    n_hot = len(hot_keys)
    u_at: list[int] = []
    u_seq: list[int] = []
    s_at: list[int] = []
    s_key: list[tuple] = []
    for i, k in enumerate(hot_keys):
        if k[0] == 0:
            u_at.append(i)
            u_seq.append(k[1])
        else:
            s_at.append(i)
            s_key.append(k)
    if any(rec.hlc for rec in recs):
        for j, (rec, o) in enumerate(zip(recs, ords)):
            k = order_key(rec.hlc, rec.msg_id, o)
            if k[0] == 0:
                u_at.append(n_hot + j)
                u_seq.append(o)
            else:
                s_at.append(n_hot + j)
                s_key.append(k)
    else:
        u_at += range(n_hot, n_hot + len(recs))
        u_seq += ords
    at = np.asarray(u_at, dtype=np.int64)[np.argsort(np.asarray(u_seq, dtype=np.int64), kind="stable")]
    return at.tolist() + [s_at[j] for j in sorted(range(len(s_key)), key=s_key.__getitem__)]


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
        """Hits are found as locations and decoded only when returned: with
        a limit the hot tier is walked from the newest message, each line it
        reaches checked (or, for a rare needle, scanned and its hits put in
        order from their lines' bytes) until ``limit`` hits; the cool tier is
        searched only when one of its rows may sort after the oldest of
        those (see _cool_may_follow)."""
        if limit == 0:
            return []
        ch_key = codec.key(channel_id) if channel_id is not None else None
        plan = _plan(text, case_sensitive)
        newest, walked = self._hot_newest(plan, ch_key, limit) if limit is not None else (None, 0)
        if newest is None:
            newest = self._hot_scanned(plan, ch_key, limit)
            walked = -1
        if not self.read_only:
            self._keep_seg_filters()
        keyed = newest[::-1]            # oldest first
        if self._cool_may_hold(channel_id):
            if limit is None:
                # (parallel lists, no tuple a hit: see _cool_hits)
                crecs, cords = self._cool_hits(text, channel_id, case_sensitive, plan.check)
                order = _hit_order([k for k, _r, _t in keyed], crecs, cords)
                n_hot = len(keyed)
                recs = own_calls([r for _k, r, _t in keyed]) + crecs
                del crecs, cords
                self._bound_maps()
                trim_heap()         # (the scans' buffers, freed: see rune_fast._memory)
                return search_hits(SearchHit, [recs[i] for i in order],
                                   [keyed[i][2] if i < n_hot else "cool" for i in order])
            elif len(keyed) < limit or self._cool_may_follow(keyed[0][0], channel_id):
                keyed = self._with_cool_newest(keyed, text, channel_id, case_sensitive, plan.check, limit)
                walked = -1
        recs = own_calls([r for _k, r, _t in keyed])
        if walked < 0 or self._maps.read(walked):
            # a scan mapped every block its filters passed; a walk mapped the
            # pages of the lines it reached, counted as reads (a look at the
            # budget reads /proc/self/statm: ~25 us, a tenth of a limited
            # search of a common needle)
            self._bound_maps()
        if walked < 0:
            trim_heap()
        return [SearchHit(r, t) for r, (_k, _r, t) in zip(recs, keyed)]

    def _hot_newest(self, plan: _Plan, ch_key: bytes | None, limit: int) -> tuple[list[tuple] | None, int]:
        """The newest ``limit`` hot hits, newest first, as (order key,
        record, tier), by a walk of the channels from their newest lines
        (NewestWalk), and the lines the walk reached; None for the hits
        when the walk spent its budget of lines first or met lines out of
        order: the caller scans instead."""
        limit = min(limit, _MAX_N)
        # a first look at a few lines: a needle none of them holds is
        # likely rare, and a scan finds it faster
        walk = NewestWalk(self._index, plan.needle, plan.ci, plan.probes, plan.na, ch_key,
                          min(tuning.SEARCH_WALK_PROBE, tuning.SEARCH_WALK_LINES), True)
        out: list[tuple] = []
        while True:
            need = limit - len(out)
            # a needle's own candidates are hits (the lines of specials are
            # checked, and few): as many as are missing; the other plans'
            # candidates are checked, and many fail: more at once
            locs, exact, state = walk.next(need if plan.needle is not None else max(need, 32))
            if state == WALK_UNORDERED:
                return None, walk.visited
            self._take(locs.tolist(), exact.tolist(), plan, need, out, True)
            if state == WALK_BUDGET and out and walk.budget < tuning.SEARCH_WALK_LINES:
                # the probe's hits foretell the lines the rest would take: go
                # on only when twice that fits the budget (a needle in one
                # line of hundreds is found faster by the scan)
                budget = min(tuning.SEARCH_WALK_LINES + 64 * limit, _MAX_N)
                if 2 * (limit - len(out)) * walk.budget <= len(out) * (budget - walk.budget):
                    walk.budget = budget
                    state = WALK_MORE
            if len(out) >= limit or state != WALK_MORE:
                break
        if len(out) < limit and state == WALK_BUDGET:
            return None, walk.visited
        return out, walk.visited

    def _hot_scanned(self, plan: _Plan, ch_key: bytes | None, limit: int | None) -> list[tuple]:
        """The hot hits (the newest ``limit``, or all), newest first, as
        (order key, record, tier): candidates found by a scan of the hot
        segments (or, where a segment is ragged, of each channel's lines),
        put in order from their lines' bytes (order_sort), then checked
        and decoded from the newest until ``limit``. The first scan of an
        open checks every hot line (see _check_hot_lines) and takes the
        kept search filters."""
        self._check_hot_lines()
        if not self._filters_read:
            self._read_seg_filters()
        # A pass over whole segments finds a hit's line by the newline
        # before it: a segment holding a damaged dead line or zeros (left
        # for verify() to report) is searched line by line from the index
        # instead, channel by channel, so its live lines are all seen.
        ragged = bool(self._ragged & (set(self._seg_order) | {self._tail_seg}))
        chans = [ch_key] if ch_key is not None or not ragged else list(self._index.channels())

        def hot(needle: bytes, ci: bool, na: bool) -> np.ndarray:
            if len(chans) == 1:
                return self._index.search(needle, ci, na, chans[0])
            parts = [self._index.search(needle, ci, na, ch) for ch in chans]
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)
        extra: Any = ()
        if plan.needle is not None and (not plan.specials or ragged):
            # (ragged segments: every line holding a non-ASCII byte joins
            # the candidates of a case-insensitive needle, and is checked)
            locs = hot(plan.needle, plan.ci, plan.ci and ragged)
            checked_all = plan.ci and ragged
        elif plan.needle is not None:
            locs = hot(plan.needle, True, False)
            checked_all = False
            # the lines holding one (found once per segment and kept),
            # those that are live messages of the search's channels
            special = live_locs(self._index, self._special_lines(plan.specials), ch_key)
            extra = special[~np.isin(special, locs)]
            if len(extra):
                locs = np.concatenate([locs, extra])
        else:
            locs = self._anchored(hot, plan)
            checked_all = True
        if not len(locs):
            return []
        ordered = order_sort(self._index, locs)[::-1].tolist()
        exact = [not checked_all] * len(ordered)
        if len(extra):
            ex = set(extra.tolist())
            exact = [loc not in ex for loc in ordered]
        out: list[tuple] = []
        need = len(ordered) if limit is None else limit
        step = max(need, 256)
        for a in range(0, len(ordered), step):
            self._take(ordered[a:a + step], exact[a:a + step], plan, need - len(out), out)
            if len(out) >= need:
                break
        return out

    def _take(self, locs: list[int], exact: list[bool], plan: _Plan, need: int, out: list[tuple],
              walked: bool = False, keep: int | None = None) -> None:
        """Check the candidate lines ``locs`` (newest first) in order until
        ``need`` of them are hits, each appended to ``out`` as (order key,
        record, tier): a candidate that is not ``exact`` is checked on its
        content alone first (no record is built for a line that is not a
        hit; those from the first one reached on, in one call), every hit
        decoded (its checksum checked) and checked again (but a walk's exact
        candidates, hits by their bytes). ``walked``: the
        lines were checked by the NewestWalk that gave them, under the lock
        held since, so a record the decode cache holds for one is taken as
        it is (a line it does not hold is decoded from its checked bytes).
        The records decoded for the first ``keep`` hits of ``out`` join the
        decode cache (see tuning.SEARCH_KEEP_HITS)."""
        if need <= 0 or not locs:
            return
        sure: set[int] | None = None
        check = plan.check
        got = 0
        cached = self._decoded
        if keep is None:
            keep = tuning.SEARCH_KEEP_HITS
        tail_seg, covered = self._tail_seg, self._covered       # (_tier_of's, read once)
        for i, (loc, ex) in enumerate(zip(locs, exact)):
            if not ex:
                if sure is None:
                    sure = self._fold_candidates([c for c, e in zip(locs[i:], exact[i:]) if not e], plan)
                if loc not in sure:
                    continue
            hit = cached.get(loc) if walked else None
            if hit is not None:
                rec, seq = hit
            elif len(out) < keep:
                rec, seq = self._read_loc_seq(loc)
            else:
                # (checked as _read_loc_seq checks it, not kept)
                hit = cached.get(loc)
                if hit is None:
                    rec, seq = self._decode_loc(loc)
                else:
                    self._index.line(loc)
                    rec, seq = hit
            # (a walk's exact candidate holds the needle's escaped bytes,
            # ASCII-case-blind for an ASCII folded needle, within its content
            # from a character's first byte: its content holds the needle,
            # and the needle ASCII-case-blind is in its lower(), which the
            # check asks -- ~2 us a hit of non-ASCII text spared)
            if not (walked and ex) and not check(rec.content):
                continue
            out.append((_xkey(rec, seq), rec, "tail" if loc >> 40 == tail_seg and loc & _OFF_MASK >= covered
                        else "hot"))
            got += 1
            if got >= need:
                return

    def _fold_candidates(self, locs: list[int], plan: _Plan) -> set[int]:
        """The candidate lines ``locs`` that may be hits, by their content
        bytes read in one call: those whose content's casefold holds the
        folded needle (the compiled matcher, on the escaped bytes), and
        those whose bytes it cannot decode, checked here in Python (which
        names a damaged line)."""
        raws = contents(self._index, locs)
        if plan.case_sensitive:
            return {loc for loc, raw in zip(locs, raws) if plan.check(self._content_of(loc, raw))}
        out: set[int] = set()
        if plan.need:
            # an ASCII needle: a line without a relevant special is a hit
            # iff its bytes hold the needle ASCII-case-blind
            nd = plan.blind
            keep = [i for i, raw in enumerate(raws) if any(c in raw for c in plan.need)]
            kept = set(keep)
            out.update(loc for i, (loc, raw) in enumerate(zip(locs, raws)) if i not in kept and nd in raw.lower())
            locs, raws = [locs[i] for i in keep], [raws[i] for i in keep]
        hits, unsure = fold_find_list(raws, plan.folded, True)
        out.update(locs[i] for i in hits.tolist())
        out.update(locs[i] for i in unsure.tolist() if plan.check(self._content_of(locs[i], raws[i])))
        return out

    def _content_of(self, loc: int, raw: bytes) -> str:
        """The content spelled by a line's escaped content bytes."""
        try:
            return cast(str, codec.orjson.loads(b'"' + raw + b'"'))
        except codec.orjson.JSONDecodeError as exc:
            raise CorruptStateCheckpointError(f"message content does not decode: {exc}",
                                              path=self._path_of(loc >> 40), offset=loc & _OFF_MASK) from None

    def _cool_may_hold(self, channel_id: str | None) -> bool:
        """Whether the cool tier holds a row of the channel (of any, None)."""
        if channel_id is None:
            return len(self._cool) > 0
        return self._cool.channel_len(channel_id) > 0

    def _cool_may_follow(self, key: tuple, channel_id: str | None) -> bool:
        """Whether a cool row of the channel (of any, None) may sort after
        the message whose order key (_xkey) is ``key``: its newest stamped
        row (the maxima kept as rows cool, never lowered) sorts after it, or
        ``key`` is unstamped and some row is stamped, or has an append
        sequence (``ord``, by the files' statistics) not below it. Cooling
        takes each channel's oldest messages, so a search's newest hits are
        usually hot; a late stamp (sync) can make it otherwise."""
        stamps = self._cool_stamps(channel_id)
        if key[0] == 1:
            stamp = (key[1], key[2])
            return any(tuple(s) > stamp for s in stamps)
        if stamps:
            return True
        top = self._cool.max_ord(channel_id)
        return top is not None and top >= key[1]

    def _cool_stamps(self, channel_id: str | None) -> list:
        """The newest stamp of the archived rows of the channel (of each
        channel, None); empty where none of them is stamped."""
        maxima = self._cool_max
        return list(maxima.values()) if channel_id is None else \
            [maxima[channel_id]] if channel_id in maxima else []

    def _with_cool_newest(self, keyed: list[tuple], text: str, channel_id: str | None, case_sensitive: bool,
                          check: Callable[[str], bool], limit: int) -> list[tuple]:
        """The newest ``limit`` of the hot hits ``keyed`` (oldest first, as
        (order key, record, tier)) and the cool hits: the cool hits found as
        row locations with their order keys (CoolArchive.search_keys), and
        only the rows kept read (from the cache of verified rows, or read
        and verified now)."""
        deleted = self._cool_deleted
        # with ``limit`` hot hits in hand, the newest unstamped (ordered by
        # append sequence), and no stamped row in the archive: the row
        # groups whose rows are all older than the oldest of them are not
        # searched (a rare needle's limited search reads the newest groups)
        floor = keyed[0][0][1] if (len(keyed) >= limit and keyed[0][0][0] == 0
                                   and not self._cool_stamps(channel_id)) else None
        rows, hits = self._cool.search_known(text, channel_id, case_sensitive=case_sensitive, known=EVERY_LOC,
                                             ord_floor=floor)
        if not rows and len(hits) <= tuning.SEARCH_COOL_FEW * limit:
            # a rare needle's few hits: read whole (the decode cache keeps
            # them, as for an unlimited search) rather than their keys first
            have = dict(zip(hits, self._cool_records(hits)))
            cool = [(_xkey(rec, o), loc) for loc, (rec, o) in have.items() if rec.msg_id not in deleted]
        else:
            have = {}
            cool = [(k, loc) for k, loc, mid in self._cool.keys_of(rows, hits) if mid not in deleted]
        both = [(k, i, False) for i, (k, _r, _t) in enumerate(keyed)] + [(k, loc, True) for k, loc in cool]
        both.sort(key=_first)           # (stable: on a tie, hot before cool, as the full search)
        both = both[-limit:]
        locs = [loc for _k, loc, is_cool in both if is_cool and loc not in have]
        recs = iter(self._cool_records(locs)) if locs else iter(())
        out = []
        for k, at, is_cool in both:
            if not is_cool:
                out.append(keyed[at])
                continue
            rec, _o = have[at] if at in have else next(recs)
            if channel_id is not None and rec.channel_id != channel_id:
                raise CorruptStateCheckpointError(
                    f"cool index says {rec.msg_id!r} is a message of channel {channel_id!r}, "
                    f"its row says {rec.channel_id!r}", path=self._cool.cool_dir)
            if check(rec.content):
                out.append((k, rec, "cool"))
        return out

    def _cool_hits(self, text: str, channel_id: str | None, case_sensitive: bool,
                   check: Callable[[str], bool]) -> tuple[list[ConversationMessageRecord], list[int]]:
        """The records and ords (append sequences) of every cool hit, in the
        files' order (the caller sorts: _hit_order): the archive's scan builds the records of each
        row group's hits where their pages are (CoolArchive.search_records:
        the content the scan matched, the other columns' pages read once,
        every digest checked in compiled code), not row by row; the hits
        the cache of verified records holds are named and taken from it. A
        record is checked against the contract's test only where the
        archive's match was not exact (a needle it can only narrow down).
        Hits are kept in parallel lists, no tuple each: the cyclic garbage
        collector walks every live tuple that holds a record, and a common
        needle's hundreds of thousands made each full collection slow."""
        found = self._cool.search_records(text, channel_id, case_sensitive=case_sensitive,
                                          record_type=ConversationMessageRecord,
                                          known=frozenset(self._cool_decoded.keys()))
        recs, ords, locs = found.records, found.ords, found.locs
        for row in found.rows:      # (read the dict way: checked there, channel too)
            locs.append(self._cool.loc_of(row))
            recs.append(self._cool_record(row))
            ords.append(row.ord)
        # the kept records first: the keep below may drop some of them
        kept = self._cool_records(found.named) if found.named else []
        # the newest reads join the cache of verified records (its size at
        # most); the caller gets records of its own (see own_calls) of those
        # and of the kept ones, the others are its alone already
        first = max(len(locs) - tuning.DECODE_CACHE, 0)
        self._cool_keep(list(zip(locs[first:], zip(recs[first:], ords[first:]))))
        recs[first:] = own_calls(recs[first:])
        for rec, o in zip(own_calls([rec for rec, _o in kept]), [o for _rec, o in kept]):
            if channel_id is not None and rec.channel_id != channel_id:
                raise CorruptStateCheckpointError(
                    f"cool index says {rec.msg_id!r} is a message of channel {channel_id!r}, "
                    f"its row says {rec.channel_id!r}", path=self._cool.cool_dir)
            recs.append(rec)
            ords.append(o)
        deleted = self._cool_deleted
        if deleted or not found.exact:
            keep = [i for i, rec in enumerate(recs)
                    if rec.msg_id not in deleted and (found.exact or check(rec.content))]
            recs = [recs[i] for i in keep]
            ords = [ords[i] for i in keep]
        return recs, ords

    def _anchored(self, hot: Callable[[bytes, bool, bool], np.ndarray], plan: _Plan) -> np.ndarray:
        """Candidate hot lines of a casefolded needle that is not ASCII (or
        whose ASCII letters a non-ASCII character may fold to): those
        holding one of its anchors' stored forms (ASCII-case-blind byte
        searches of the compiled scan, which the segments' trigram filters
        serve; _casefold.anchor_plan: no match is missed), each decided by
        the compiled matcher. Without an anchor, every line holding
        a non-ASCII byte."""
        if plan.na:
            # (0xff is never in UTF-8: the lines holding a non-ASCII byte;
            # a text of ASCII only folds to ASCII only)
            return hot(b"\xff", False, True)
        if len(plan.probes) == 1:
            return hot(plan.probes[0], True, False)
        return unique(np.concatenate([hot(f, True, False) for f in plan.probes]))

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
            got = self._take_kept_filters(seg, s.buf, remove_bad=not self.read_only)
            if got is not None:
                # a file the index copied (an older version's, whose words
                # lie unaligned) is written again after the search, as one
                # that it reads where it is mapped; so is one of an older
                # version bound to the whole map (see segments._FILTERS_VERSION),
                # before a change of the page cache makes it refused
                kept, current = got
                mapped = self._index_seg_filters_mapped(seg)
                self._filters_kept[seg] = kept if (mapped and current) or self.read_only else 0

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
                # the index's copy gives way to the file's map (the same
                # words: file pages, not this process's memory)
                self._take_kept_filters(seg, s.buf, remove_bad=False)

    def _take_kept_filters(self, seg: int, buf: Any, *, remove_bad: bool) -> tuple[int, bool] | None:
        """Hand the index the kept filters file of sealed segment ``seg``
        (over bytes ``buf``), read where its map holds them: (the blocks they
        cover, whether the file is of this build's version), or None if
        there is none or it does not hold (see read_kept)."""
        def take(raw: bytes | memoryview) -> tuple[int, bool]:
            return (self._index_set_filters(seg, decode_filters(raw, SEARCH_FILTER_LAYOUT, buf)),
                    filters_current(raw))

        return read_kept(os.path.join(self.hot_dir, filters_name(seg)), take, remove_bad=remove_bad, mapped=True)

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
