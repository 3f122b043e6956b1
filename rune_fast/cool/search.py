"""Search over a cool archive: trigram filters of content pages (kept
beside the sidecars), scans of the row groups that may match, and exact
casefolded matching.
"""
from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any, Callable, Container, Sequence

import numpy as np
import pyarrow as pa

from .._arrays import unique
from .._casefold import anchor_plan, ascii_probes
from .._names import tmp_name
from .._order import order_key
from ..errors import CorruptStateCheckpointError
from .._search import find_spans, fold_find_list
from ..pages import PageError, Unsupported, zstd_direct
from ..segments import write_kept


log = logging.getLogger("rune_fast.cool")

#: the bound max_ord gives where a file has no statistics
_UNKNOWN_ORD = 1 << 62


class _Every:
    """A container that holds every location (search_keys names every hit)."""

    def __contains__(self, loc: object) -> bool:
        return True

    def __bool__(self) -> bool:
        return True


_EVERY = _Every()
#: for search_known's ``known``: every hit named by its location, none read
EVERY_LOC = _EVERY


from .hits import _EXACT_MODES, _OTHER_COLS, CoolHits, _hit_records, _window_records
from .keys import _KEY_COLS
from .reads import _Reads
from .rows import SPECIAL_FOLD, _Group, _SPECIAL_UTF8, _assemble_columns
from .schema import (_PARQUET_ERRORS, CoolRow, _CONTENT_COL, _file_no, _grams_name, _parquet_name, _row_key,
                     cool_loc)
from . import grams as _grams
from .scan import FEW_HELPED_ROWS, Deferred, Fetch, FewGroups, scan_pool
from .sidecar import _GRAMS_BUDGET, _FileIndex


@functools.lru_cache(maxsize=256)
def _relevant_specials(needle: str) -> tuple[str, ...]:
    """The SPECIAL_FOLD characters that can take part in a match of the
    ASCII ``needle`` in a casefolded text: those whose fold F lies inside
    the needle, or overlaps its start (the needle starts with a suffix of F)
    or its end (it ends with a prefix of F), or holds the whole needle.
    Every other character maps ASCII to the same ASCII letter, lowercased,
    and non-ASCII to non-ASCII, so it cannot make a match that an
    ASCII-case-blind byte search misses. (Kept for the last needles:
    about 90 us a call, paid by every search with a limit.)"""
    out = []
    for c in SPECIAL_FOLD:
        f = c.casefold()
        if (f in needle or needle in f
                or any(needle.startswith(f[k:]) for k in range(1, len(f)))
                or any(needle.endswith(f[:k]) for k in range(1, len(f)))):
            out.append(c)
    return tuple(out)


def _ascii_fold_has(raw: bytes, needle: bytes, repl: list[tuple[bytes, bytes]]) -> bool:
    """``needle`` (ASCII, casefolded) in the casefold of the UTF-8 text
    ``raw``, given the SPECIAL_FOLD characters that can take part in a match
    (``repl``: their UTF-8 and their fold's). Others need no folding: ASCII
    letters fold to themselves lowercased (``bytes.lower``), any other
    character to non-ASCII bytes, where an ASCII needle cannot match."""
    for a, b in repl:
        if a in raw:
            raw = raw.replace(a, b)
    return needle in raw.lower()


def ascii_fold_matcher(needle: str) -> "Any | None":
    """For other tiers' searches: a function ``has(raw: bytes) -> bool`` that
    answers ``needle.casefold() in raw.decode("utf-8").casefold()`` without
    decoding or casefolding the text, when the folded needle is ASCII (None
    otherwise). Only the SPECIAL_FOLD characters that can take part in a
    match are folded (``bytes.replace``); ASCII letters are lowered with
    ``bytes.lower``. A row whose bytes match the needle ASCII-case-blind is a
    hit; one that does not can only be a hit if it holds one of
    ``relevant_specials(folded)``. Public API: nothing in rune_fast calls it
    (the repository's hot search uses :func:`relevant_specials`)."""
    folded = needle.casefold()
    if not folded.isascii():
        return None
    nb = folded.encode("ascii")
    repl = [(c.encode("utf-8"), c.casefold().encode("utf-8")) for c in _relevant_specials(folded)]
    return lambda raw: _ascii_fold_has(raw, nb, repl)


relevant_specials = _relevant_specials


def _folded_hits(get: Any, rows: list[int], lo: int, needle: str, need: Sequence[bytes] = ()) -> list[int]:
    """The rows (offset by ``lo``) whose casefolded content holds ``needle``
    (``get(i)``: row i's UTF-8 bytes), decided by the compiled matcher; a
    row whose bytes it cannot decode is checked here, and kept if it does
    not decode at all (reading it whole reports it). ``need``: see
    _fold_hit_indices."""
    raws = [get(i + lo) for i in rows]
    return [rows[i] for i in _fold_hit_indices(raws, needle, need)]


def _fold_hit_indices(raws: list[bytes], needle: str, need: Sequence[bytes] = ()) -> list[int]:
    """The indices of ``raws`` (UTF-8 texts) whose casefold holds the
    casefolded ``needle``, ascending: the compiled matcher's, and of those it
    cannot decode, the ones str decides are hits or that do not decode.
    ``need``: the UTF-8 of characters one of which a hit must hold (an ASCII
    needle's relevant specials, for texts that do not hold the needle
    ASCII-case-blind); the others are passed over unread."""
    if need:
        keep = [i for i, r in enumerate(raws) if any(c in r for c in need)]
        return [keep[i] for i in _fold_hit_indices([raws[i] for i in keep], needle)]
    hits, unsure = fold_find_list(raws, needle, False)
    out = hits.tolist()
    if len(unsure):
        for i in unsure.tolist():
            try:
                if needle not in bytes(raws[i]).decode("utf-8", "surrogatepass").casefold():
                    continue
            except UnicodeDecodeError:
                pass
            out.append(i)
        out.sort()
    return out


class _Search(_Reads):
    """Substring search (the layer above the queries).
    """

    def search(self, text: str, channel_id: str | None = None, *,
               case_sensitive: bool = False) -> list[CoolRow]:
        """Archived messages whose content contains ``text`` (case-insensitive:
        ``text.casefold() in content.casefold()``), oldest first by the order
        key. Every hit is verified against its digest. Public API: the
        repository calls :meth:`search_known`."""
        return self.search_known(text, channel_id, case_sensitive=case_sensitive)[0]

    def max_ord(self, channel_id: str | None = None) -> int | None:
        """An upper bound of the ``ord`` (append sequence) of the archived
        rows of the channel (of every row, None): the largest of the files'
        row-group statistics over the groups holding the channel's rows
        (read once a file: files never change); None if there is no row.
        A group without statistics makes the bound unknown: 2**62. For a
        search with a limit, which reads the cool tier only when one of its
        rows may sort after the hot hits it has."""
        with self._lock:
            files = self._files         # (a property: read once)
            # the answers for the live file set (file numbers are never
            # reused and files never change): a limited search asks at each
            # call, and the loop below cost ~15-40 us at 1,000,000 messages
            key = tuple(files)
            memo = self._max_ord_memo
            if memo[0] != key:
                memo = (key, {})
                self._max_ord_memo = memo
            if channel_id in memo[1]:
                return memo[1][channel_id]
            memo[1][channel_id] = best = self._max_ord(files, channel_id)
            return best

    def _max_ord(self, files: Any, channel_id: str | None) -> int | None:
        """(lock held) max_ord's answer, computed."""
        if channel_id is None:
            targets = [(no, 0, fi.rows) for no, fi in files.items()]
        else:
            targets = [(no, *files[no].channels[channel_id][:2])
                       for no in self._channels.get(channel_id, ())]
        best: int | None = None
        for no, s, e in targets:
            if e <= s:
                continue
            fi = files[no]
            tops, whole = self._kept_ord_tops(no)
            if s == 0 and e >= fi.rows:
                top = whole
            else:
                lo, hi = self._rg_of(fi, s), self._rg_of(fi, e - 1) + 1
                top = int(tops[lo:hi].max()) if hi <= len(tops) else _UNKNOWN_ORD
            best = top if best is None or top > best else best
        return best

    def _kept_ord_tops(self, no: int) -> tuple[np.ndarray, int]:
        """(lock held) :meth:`_ord_tops` of file ``no`` as an int64 array
        and the largest of them, read once a file (files never change;
        those gone are forgotten): a search with a limit asks for the bound
        of every file, and a loop over each file's row groups grew with the
        archive (about 1,000 groups at 1,000,000 messages)."""
        kept = self._ord_max_d
        got = kept.get(no)
        if got is None:
            for stale in [n for n in kept if n not in self._files]:
                del kept[stale]
            tops = np.array(self._ord_tops(no), dtype=np.int64)
            got = kept[no] = (tops, int(tops.max()) if len(tops) else _UNKNOWN_ORD)
        return got

    def _ord_tops(self, no: int) -> list[int]:
        """The largest ``ord`` of each row group of file ``no`` by its footer's
        statistics (_UNKNOWN_ORD where it has none)."""
        meta = self._parquet(no).metadata
        col = meta.schema.names.index("ord")
        tops = []
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(col).statistics
            tops.append(int(st.max) if st is not None and st.has_min_max else _UNKNOWN_ORD)
        return tops

    def search_known(self, text: str, channel_id: str | None = None, *, case_sensitive: bool = False,
                     known: Container[int] = (), ord_floor: int | None = None) -> tuple[list[CoolRow], list[int]]:
        """:meth:`search`, except that a hit whose location (:func:`cool_loc`)
        is in ``known`` (rows the caller holds verified records of; it must not
        change during the call) may be reported by that location instead of
        read: ``(rows, locs)``, the rows as :meth:`search` gives them, the
        locations in no order. A location names a row whose content bytes
        the search matched as it matches before reading a row; the caller
        checks its own record (content, channel) as this method checks the
        rows it reads. Reading a hit's other columns is most of a search of
        the pages (a page of each column per hit): a search asked again
        skips it for the rows its caller kept. ``ord_floor``: the row groups
        whose ``ord`` statistics are all below it are not searched (a
        search with a limit that holds that many hits newer than them, in
        an archive without stamped rows, which would sort after them)."""
        got = self._search_hits(text, channel_id, case_sensitive, known, ord_floor, None)
        return got.rows, got.named

    def search_records(self, text: str, channel_id: str | None = None, *, case_sensitive: bool = False,
                       record_type: type, known: Container[int] = ()) -> "CoolHits":
        """:meth:`search_known` for a caller that wants records: the hits
        the page scan finds are built as ``record_type`` instances where
        their pages are (:class:`CoolHits`: ``records``), each row group's
        hits at once, in the scan's threads: the content values the scan
        matched (CRC-checked page bytes) and the hits' other columns (each
        of their pages read once, ``PageReader.take``) go to
        ``_pages.records_from_columns``, which checks every row's digest
        against its canonical JSON rebuilt from those bytes. A row it
        declines (extra fields, an unusual spelling, a digest that does
        not match) and the hits of groups the row-group cache holds are read
        as :meth:`search` reads rows (``rows``: CoolRow, which names any
        damage); the hits in ``known`` are named (``named``). The hits'
        channel is checked against ``channel_id``. ``exact``: every hit
        reported was matched exactly as the contract says (else the caller
        checks each record's content)."""
        return self._search_hits(text, channel_id, case_sensitive, known, None, record_type)

    def _search_hits(self, text: str, channel_id: str | None, case_sensitive: bool, known: Container[int],
                     ord_floor: int | None, record_type: type | None) -> "CoolHits":
        """The body of :meth:`search_known` and :meth:`search_records`
        (``record_type`` None: no record built)."""
        if not isinstance(text, str):
            raise TypeError(f"search text must be str, got {type(text).__name__}")
        needle = text if case_sensitive else text.casefold()
        nb = needle.encode("utf-8", "surrogatepass")
        # case-insensitive: an ASCII needle matches a row iff its ASCII-case-blind
        # bytes hold it, or the row holds a SPECIAL_FOLD character (checked in
        # Python). A non-ASCII needle: rows whose bytes hold its longest ASCII
        # run (case-blind), or with a SPECIAL_FOLD character, or, with no ASCII
        # run, every non-ASCII row; all checked with str.casefold.
        # A needle with anchors (rune_fast._casefold.anchor_plan): rows whose
        # bytes hold one spelling of its anchor (ASCII-case-blind), each
        # decided by the compiled casefold matcher.
        mode = "all" if needle == "" else "cs" if case_sensitive else "ci"
        probe = nb
        # (an ASCII needle that a non-ASCII character may fold into, such
        # as 'strasse' from sharp s, takes anchors too: anchor_plan)
        # the rows holding the needle ASCII-case-blind are hits of their own
        # (exact); the others that hold an anchor and a relevant special are
        # decided by the matcher
        ascii_specials = _relevant_specials(needle) if mode == "ci" and needle.isascii() else ()
        need = [c.encode("utf-8") for c in ascii_specials]
        forms = ascii_probes(needle, ascii_specials) if ascii_specials else \
            anchor_plan(needle) if mode == "ci" and not needle.isascii() else None
        if forms is not None:
            mode = "ci-anchor"
        elif mode == "ci" and not needle.isascii():
            runs = re.findall(r"[\x00-\x7f]+", needle)
            probe = max(runs, key=len).encode("ascii") if runs else b""
            mode = "ci-run" if probe else "ci-nonascii"
        anchors = [f.encode("utf-8").lower() for f in forms or ()]    # (searched ASCII-case-blind)
        specials = _relevant_specials(probe.decode("ascii")) if mode in ("ci", "ci-run") else ()
        fold_repl = [(c.encode("utf-8"), c.casefold().encode("utf-8")) for c in specials]
        out = CoolHits()
        hits = out.rows
        known_hits = out.named
        # what the files' filters test (rune_fast.cool.grams): the needle's casefold
        probe_grams = _grams.needle_bytes(needle) if mode != "all" else None
        with self._lock:
            if channel_id is None:
                targets = [(no, 0, fi.rows) for no, fi in sorted(self._files.items())]
            else:
                targets = [(no, *self._files[no].channels[channel_id][:2])
                           for no in self._channels.get(channel_id, ())]
            for no, s, e in targets:
                fi = self._files[no]
                rg_a = self._rg_of(fi, s) if e > s else 0
                rg_b = self._rg_of(fi, e - 1) + 1 if e > s else 0
                if ord_floor is not None and rg_b > rg_a:
                    # (vectorized: a Python test a group cost a limited search
                    # ~1 ms a file of 4,000 groups)
                    tops, _top = self._kept_ord_tops(no)
                    cut = min(max(len(tops), rg_a), rg_b)
                    rgs = (np.flatnonzero(tops[rg_a:cut] >= ord_floor) + rg_a).tolist() + list(range(cut, rg_b))
                else:
                    rgs = list(range(rg_a, rg_b))
                # the row spans of each group whose filters may match: the
                # other groups hold no hit and are not read at all
                spans = self._filtered_spans(no, s, e, probe_grams, rgs if ord_floor is not None else None) \
                    if rgs and probe_grams else None
                if spans is not None:
                    rgs = [rg for rg in rgs if rg in spans]
                sel_rows = []
                found: list[CoolRow] = []
                # the groups the cache does not hold are searched in their
                # pages (content pages only, those the filters did not rule
                # out), not poured through the cache: a group decodes whole there
                scans: dict[int, Any] | None = None if mode in ("ci", "cs", "ci-anchor") else {}
                for i, rg in enumerate(rgs):
                    if scans is None and (no, rg) not in self._cache:
                        scans = self._start_scans(no, [r for r in rgs[i:] if (no, r) not in self._cache],
                                                  s, e, mode, nb, fold_repl, known, anchors, need, spans,
                                                  record_type)
                    base = fi.rg_list[rg]
                    n = fi.rg_list[rg + 1] - base
                    lo, hi = max(s - base, 0), min(e - base, n)
                    if mode == "all":
                        sel_rows.append(np.arange(lo + base, hi + base, dtype=np.int64))
                        continue
                    pinned: dict = {}      # this group, even if the cache does not keep it
                    if scans and rg in scans:
                        got = self._scan_result(no, rg, scans.pop(rg), record_type is None)
                        if got is not None:
                            if record_type is None:
                                found.extend(self._verified(fi.name, [base + i for i in got[0]], got[1]))
                            else:
                                slow = self._take_built(no, base, got[0], got[1], channel_id, out)
                                if slow:
                                    found.extend(self._rows(no, 0, 0, slow, pinned))
                            known_hits.extend(cool_loc(no, base + i) for i in got[2])
                            continue
                    g = self._group(no, rg, ("content",), True, pinned)
                    content = g.cols["content"][2]
                    if not content.grams and self._cache.get((no, rg)) is g:
                        # the first search of a cached group builds its trigram filters
                        before = content.nbytes()
                        content.build_grams()
                        g.nbytes += content.nbytes() - before
                        if self._cache.get((no, rg)) is g:
                            self._cached_bytes += content.nbytes() - before
                    if mode == "cs":
                        idx = content.find(nb, False, lo, hi) - lo
                    else:
                        if mode == "ci-anchor":
                            exact = content.find(nb, True, lo, hi) - lo if need else np.zeros(0, np.int64)
                            maybe: Any = unique(np.concatenate(
                                [content.find(a, True, lo, hi) - lo for a in anchors]))
                            if len(exact):
                                maybe = np.setdiff1d(maybe, exact)
                        elif mode == "ci-nonascii":
                            data, offs = g.spans()
                            exact = np.zeros(0, np.int64)
                            maybe = find_spans(data, offs[lo:hi], offs[lo + 1:hi + 1],
                                               b"\xff", False, True)  # 0xff: never in UTF-8
                        else:
                            exact = content.find(probe.lower(), True, lo, hi) - lo
                            maybe = self._special_rows(fi, rg, g, specials)
                            if len(maybe):
                                maybe = np.setdiff1d(maybe[(maybe >= lo) & (maybe < hi)] - lo, exact)
                            if mode == "ci-run":     # the ASCII run is only a filter
                                exact, maybe = np.zeros(0, np.int64), np.union1d(exact, maybe)
                        if len(maybe):
                            # check just the content of the candidates; whole rows only for hits
                            content = g.cols["content"][2]
                            if mode == "ci":
                                maybe = [i for i in maybe.tolist()
                                         if _ascii_fold_has(content.raw(i + lo), nb, fold_repl)]
                            else:
                                maybe = _folded_hits(content.raw, maybe.tolist(), lo, needle, need)
                            maybe = np.asarray(maybe, dtype=np.int64)
                            idx = np.union1d(exact, maybe) if len(exact) else maybe
                        else:
                            idx = exact
                    if len(idx):
                        found.extend(self._rows(no, 0, 0, self._unknown(no, idx + (lo + base), known,
                                                                        known_hits), pinned))
                if sel_rows:
                    every = self._unknown(no, np.concatenate(sel_rows), known, known_hits)
                    if record_type is not None and len(every):
                        every = self._built_rows(no, every, record_type, channel_id, out)
                    found.extend(self._rows(no, 0, 0, every))
                if found:
                    rows = found
                    if mode == "cs":
                        rows = [r for r in rows if needle in r.record["content"]]
                    if channel_id is not None:
                        self._check_field(rows, "channel_id", channel_id)
                    hits.extend(rows)
        hits.sort(key=_row_key)
        out.exact = mode in _EXACT_MODES
        return out

    def _built_rows(self, no: int, rows: np.ndarray, record_type: type, channel_id: str | None,
                    out: CoolHits) -> np.ndarray:
        """(lock held) The records of the rows ``rows`` (ascending) of file
        ``no`` that records_at's compiled path builds join ``out`` (every
        row a hit: an empty needle); the rows it leaves are returned, for
        the dict path."""
        built: dict[int, tuple[Any, int]] = {}
        self._records_of(no, rows.tolist(), record_type, built)
        if not built:
            return rows
        at = cool_loc(no, 0)
        local = [loc - at for loc in built]
        self._take_built(no, 0, local, ([r for r, _o in built.values()], [o for _r, o in built.values()]),
                         channel_id, out)
        return rows[~np.isin(rows, np.asarray(local, dtype=np.int64))]

    def _take_built(self, no: int, base: int, local: list[int], built: Any,
                    channel_id: str | None, out: CoolHits) -> list[int]:
        """(lock held) The records a scan built (``built``: records, ords)
        for the rows ``local`` of the row group starting at row ``base`` of
        file ``no`` join ``out``, their channel checked; the rows it
        declined (None) are returned, for the caller to read."""
        if not local:
            return []
        recs, ords = built
        at = cool_loc(no, base)
        if channel_id is not None:
            for i, rec in zip(local, recs):
                if rec is not None and rec.channel_id != channel_id:
                    raise CorruptStateCheckpointError(
                        f"cool index says row {base + i} is a message of channel {channel_id!r}, "
                        f"the file says {rec.channel_id!r}", path=self._path(self._files[no].name),
                        offset=base + i)
        if all(rec is not None for rec in recs):
            out.locs += [at + i for i in local]
            out.records += recs
            out.ords += ords
            return []
        slow = []
        for i, rec, o in zip(local, recs, ords):
            if rec is None:
                slow.append(base + i)
            else:
                out.locs.append(at + i)
                out.records.append(rec)
                out.ords.append(o)
        return slow

    @staticmethod
    def _unknown(no: int, rows: np.ndarray, known: Container[int], named: list[int]) -> np.ndarray:
        """The ``rows`` (of file ``no``) whose locations are not in ``known``;
        those that are join ``named``."""
        if not known or not len(rows):
            return rows
        locs = [cool_loc(no, r) for r in rows.tolist()]
        hit = np.fromiter((loc in known for loc in locs), dtype=bool, count=len(locs))
        if hit.any():
            named.extend(loc for loc, h in zip(locs, hit.tolist()) if h)
            return rows[~hit]
        return rows

    def search_keys(self, text: str, channel_id: str | None = None, *,
                    case_sensitive: bool = False) -> list[tuple[tuple, int, str]]:
        """``(order key, location, msg_id)`` of every archived hit (as
        :meth:`search` finds them), oldest first, without reading the rows:
        the content pages are searched, then only the ``msg_id``, ``hlc``
        and ``ord`` columns of the groups holding hits are read (each page
        CRC-checked). For a search with a limit, which reads (and verifies
        against its digest) only the rows it returns (:meth:`rows_at`); the
        caller checks their content and channel as :meth:`search_known`
        says of the rows it names."""
        rows, locs = self.search_known(text, channel_id, case_sensitive=case_sensitive, known=_EVERY)
        return self.keys_of(rows, locs)

    def keys_of(self, rows: list[CoolRow], locs: list[int]) -> list[tuple[tuple, int, str]]:
        """:meth:`search_keys` of the hits a :meth:`search_known` named
        (``rows`` read, ``locs`` named), oldest first."""
        out = [(_row_key(r), cool_loc(_file_no(r.file), r.row), r.record["msg_id"]) for r in rows]
        by_group: dict[tuple[int, int], list[int]] = {}
        with self._lock:
            for loc in locs:
                no, row = loc >> 32, loc & 0xFFFFFFFF
                fi = self._files.get(no)
                if fi is None:
                    raise CorruptStateCheckpointError(f"cool file number {no} is not live", path=self._dir)
                by_group.setdefault((no, self._rg_of(fi, row)), []).append(row)
            for (no, rg), rws in sorted(by_group.items()):
                rws.sort()
                got = self._key_take(no, rg, [r - self._files[no].rg_list[rg] for r in rws])
                if got is not None:
                    hlcs, ids, ords = got
                else:
                    table = self._key_columns(no, rg)
                    local = pa.array(np.asarray(rws, dtype=np.int64) - self._files[no].rg_list[rg])
                    ids = table.column("msg_id").take(local).to_pylist()
                    hlcs = table.column("hlc").take(local).to_pylist()
                    ords = table.column("ord").take(local).to_pylist()
                out.extend((order_key(h, m, o), cool_loc(no, r), m) for r, m, h, o in zip(rws, ids, hlcs, ords))
        out.sort(key=lambda e: e[0])
        return out

    def _key_take(self, no: int, rg: int, local: list[int]) -> tuple[list, list, list] | None:
        """(hlc, msg_id, ord) of the rows ``local`` (ascending) of a row
        group, from just the pages of its key columns that hold them
        (PageReader.take: a rare needle's few hits a group do not decode
        the group's key columns whole); None where the reader does not
        take the group, or meets damage (the caller's read names it)."""
        try:
            cols = self._with_reader(no, lambda reader: reader.take(rg, local, _KEY_COLS))
            if cols is None:
                return None
            (hd, ho), (md, mo), ords = cols
            n = len(local)
            return ([hd[ho[i]:ho[i + 1]].decode("utf-8") for i in range(n)],
                    [md[mo[i]:mo[i + 1]].decode("utf-8") for i in range(n)],
                    np.frombuffer(ords, dtype=np.int64).tolist())
        except (PageError, UnicodeDecodeError):
            return None

    def _key_columns(self, no: int, rg: int) -> Any:
        """The ``msg_id``, ``hlc`` and ``ord`` columns of a row group (an
        Arrow table): through the PageReader, else pyarrow (which names damage)."""
        names = ["msg_id", "hlc", "ord"]
        table = self._page_columns(no, rg, names)
        if table is None:
            try:
                table = self._parquet(no).read_row_group(rg, columns=names, use_threads=False)
            except _PARQUET_ERRORS as exc:
                raise CorruptStateCheckpointError(f"cool archive row group {rg} cannot be read: {exc}",
                                                  path=self._path(_parquet_name(no))) from None
        fi = self._files[no]
        if table.num_rows != fi.rg_list[rg + 1] - fi.rg_list[rg]:
            raise CorruptStateCheckpointError(
                f"cool archive row group {rg} holds {table.num_rows} rows, its index says "
                f"{fi.rg_list[rg + 1] - fi.rg_list[rg]}", path=self._path(_parquet_name(no)))
        return table

    def _start_scans(self, no: int, rgs: list[int], s: int, e: int, mode: str, nb: bytes,
                     fold_repl: list[tuple[bytes, bytes]], known: Container[int] = (),
                     anchors: Sequence[bytes] = (), need: Sequence[bytes] = (),
                     spans: dict[int, Any] | None = None, record_type: type | None = None) -> dict[int, Any]:
        """Start the search of row groups ``rgs`` of file ``no`` (groups the
        cache does not hold; rows ``[s, e)`` of the file) in the file's pages
        as they are decompressed, without building or caching the groups:
        rg -> future of (rows within the group, their assembled values; see
        :meth:`_scan_result`; the hits in ``known`` are not read, only
        named). ``mode`` "ci": ``nb`` (ASCII, casefolded)
        matched ASCII-case-blind, the rows holding a SPECIAL_FOLD character
        of ``fold_repl`` checked one by one; "cs": bytes as they are;
        "ci-anchor": the rows holding one of ``anchors`` (ASCII-case-blind),
        each decided by the compiled casefold matcher (``nb`` the casefolded
        needle; with ``need``, an ASCII one: the rows holding it
        ASCII-case-blind are hits, the others must hold one of ``need``). The
        hits' other columns are read by the same task; two run at a time
        (decompression, I/O and the search leave the GIL). Empty if the file
        is not in a layout the PageReader reads. ``spans``: rg -> the row
        spans (within the group) the file's filters did not rule out: only
        the pages holding them are read (None: every page). ``record_type``:
        the hits' records are built instead of their values assembled
        (:func:`_hit_records`; None for a row left to the caller)."""
        reader = self._reader(no) if rgs else None
        if reader is None:
            return {}
        if mode == "ci-anchor":
            probes = ([(nb, True)] if need else []) + [(a, True) for a in anchors]
        else:
            probes = [(nb.lower(), True) if mode == "ci" else (nb, False)] + [(a, False) for a, _b in fold_repl]
        starts = self._files[no].rg_list
        folded = nb.decode("utf-8", "surrogatepass")

        def found(rg: int, fetched: dict | None = None) -> tuple[list[int], list[int], dict[int, bytes]]:
            """The group's hits: (rows read, rows only named, row -> content)."""
            lo, hi, base = s - starts[rg], e - starts[rg], cool_loc(no, starts[rg])
            res = reader.find(rg, _CONTENT_COL, probes, None if spans is None else spans[rg], fetched)
            if mode == "ci-anchor":
                hits = {i: v for i, v in res[0] if lo <= i < hi} if need else {}
                cands = dict(sorted((i, v) for part in res[1 if need else 0:] for i, v in part
                                    if lo <= i < hi and i not in hits))
                rows_c = list(cands)
                hits.update((rows_c[k], cands[rows_c[k]])
                            for k in _fold_hit_indices(list(cands.values()), folded, need))
            else:
                hits = {i: v for i, v in res[0] if lo <= i < hi}
            for part in res[1:] if mode != "ci-anchor" else ():
                for i, v in part:
                    if lo <= i < hi and i not in hits and _ascii_fold_has(v, nb, fold_repl):
                        hits[i] = v
            local: list[int] = []
            named: list[int] = []
            for i in sorted(hits):
                (named if base + i in known else local).append(i)
            return local, named, hits

        def built(rg: int, local: list[int], named: list[int], hits: dict[int, bytes],
                  fetched: dict | None = None) -> tuple[list[int], Any, list[int]]:
            if not local:
                return local, [], named
            if record_type is not None:
                return local, _hit_records(reader, rg, local, [hits[i] for i in local], record_type), named
            vals = reader.rows(rg, local, {_CONTENT_COL: [hits[i] for i in local]}, fetched)
            return local, _assemble_columns(list(zip(*vals))), named

        def built_many(found_: dict[int, Any], read: Any) -> dict[int, Any]:
            """What ``built`` gives for each group of a window (or the
            PageError it raises), from what hit_reads read of their hits
            (None: nothing; each group reads its own): with a record type
            their records built at once, else from their fetched pages."""
            out: dict[int, Any] = {}
            items = [(rg, f) for rg, f in found_.items() if f[0]]
            fetched: dict[int, Any] = {}
            if read is not None and record_type is not None:
                cols, declined = read
                skip = {items[i][0] for i in declined}
                groups = [(rg, f[0], [f[2][i] for i in f[0]]) for rg, f in items if rg not in skip]
                try:
                    got = _window_records(reader, groups, cols, record_type) if groups else []
                except PageError:
                    got = []            # (each group's own read names the damage)
                for (rg, local, _contents), recs in zip(groups, got):
                    out[rg] = (local, recs, found_[rg][1])
            elif read is not None:
                fetched = dict(zip([rg for rg, _f in items], read))
            for rg, (local, named, hits) in found_.items():
                if rg not in out:
                    try:
                        out[rg] = built(rg, local, named, hits, fetched.get(rg))
                    except (PageError, Unsupported) as exc:
                        out[rg] = exc
            return out

        def hit_reads(items: list[tuple[int, list[int]]]) -> Callable[[], Any]:
            """The read of these groups' hits a scan thread runs: their other
            columns' values (one stretch without the GIL), or with no record
            type their pages."""
            rgs_, locs = [rg for rg, _l in items], [loc for _rg, loc in items]
            if record_type is not None:
                return functools.partial(reader.take_many, rgs_, locs, _OTHER_COLS, reader.dirs(rgs_))
            return Fetch(reader, [(rg, reader.rows_pages(rg, loc, _OTHER_COLS)) for rg, loc in items]).run

        def scan(rg: int) -> tuple[list[int], Any, list[int]]:
            return built(rg, *found(rg))

        # a group whose filters pass few of its rows reads a few pages: those
        # groups are read WINDOW at a time on this thread, their pages fetched
        # in two batches side by side (rune_fast.cool.scan; group by group
        # without the system's libzstd: two threads would fight for the GIL);
        # the others decompress most of their pages, two groups at a time
        def few(rg: int) -> bool:
            if spans is None:
                return False
            p = spans[rg]
            return int((p[:, 1] - p[:, 0]).sum()) * 4 < starts[rg + 1] - starts[rg]

        pool = scan_pool()
        few_rgs = [rg for rg in rgs if few(rg)]
        sp = spans if spans is not None else {}     # (a group is few only where there are spans)
        batch = FewGroups(reader, few_rgs, found, built_many, scan,
                          lambda rg: reader.span_pages(rg, _CONTENT_COL, sp[rg]), hit_reads,
                          sum(fi.rows for fi in self._files.values()) >= FEW_HELPED_ROWS) \
            if few_rgs and zstd_direct() else None
        few_set = set(few_rgs)
        return {rg: (batch.handle(rg) if batch is not None else Deferred(scan, rg)) if rg in few_set
                else pool.submit(scan, rg) for rg in rgs}

    def _filtered_spans(self, no: int, s: int, e: int, probe: bytes,
                        rgs: list[int] | None = None) -> dict[int, np.ndarray] | None:
        """(lock held) :meth:`FileGrams.spans <rune_fast.cool.grams.FileGrams.spans>`
        of file ``no``'s filters (None where it has none)."""
        fg = self._file_grams(no)
        return None if fg is None else fg.spans(probe, self._files[no].rg_starts, s, e, rgs)

    def _file_grams(self, no: int) -> "_grams.FileGrams | None":
        """(lock held) File ``no``'s search filters: its ``.grams`` mapped,
        looked for once a file. One that does not hold for the live file
        (damaged, cut, stale, another build's) is named in a log warning and
        removed (a writer); a file without usable ones has them built by
        this search (every content page read once) and kept on disk (a
        writer; a viewer holds them within _GRAMS_BUDGET). None: the file is
        searched without filters (not in a layout the PageReader reads, or
        damaged: the search's reads name it)."""
        if no in self._filters.read:
            return self._filters.get(no)
        fi = self._files[no]
        path = self._ipath(_grams_name(no))
        fg = None
        try:
            fg = _grams.FileGrams.mapped(path, fi.size, fi.footer, fi.rows)
        except FileNotFoundError:
            pass
        except (ValueError, OSError) as exc:
            log.warning("%s: search filters not used: %s; this search builds them again", path, exc)
            if not self._read_only:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        if fg is None:
            fg = self._build_grams(no, path)
        self._filters.read.add(no)
        if fg is None or not self._filters.put(no, fg):
            return None
        return fg

    def _build_grams(self, no: int, path: str) -> "_grams.FileGrams | None":
        """(lock held) The filters of file ``no`` from its content pages
        (each CRC-checked), kept at ``path`` by a writer (not synced: a
        cache, checked whole when read) and mapped from there; held by a
        viewer. None where the file's pages cannot give them."""
        fi = self._files[no]
        if self._read_only and self._filters.nbytes + _grams.blocks_for(fi.rows) * _grams.BLOCK_BYTES > _GRAMS_BUDGET:
            return None         # (a viewer could not hold them: not built for nothing)
        reader = self._reader(no)
        if reader is None:
            return None
        try:
            body = _grams.grams_of_columns(reader.column(rg, _CONTENT_COL) for rg in range(len(fi.rg_list) - 1))
        except (PageError, Unsupported):
            return None
        if len(body) != _grams.blocks_for(fi.rows) * _grams.BLOCK_BYTES:
            return None
        if not self._read_only and write_kept(path, _grams.encode(fi.size, fi.footer, fi.rows, body),
                                              tmp=self._ipath(tmp_name(_grams_name(no))), sync=False):
            try:
                return _grams.FileGrams.mapped(path, fi.size, fi.footer, fi.rows)
            except (ValueError, OSError):
                pass
        return _grams.FileGrams(memoryview(body), True)

    def _scan_result(self, no: int, rg: int, fut: Any, whole: bool = True,
                     ) -> tuple[list[int], list, list[int]] | None:
        """What a scan of :meth:`_start_scans` found (rows read, their values
        or records, rows only named), or None: the caller reads the group
        instead (a layout the PageReader does not read, or damage, which that
        read names; with ``whole``, a row whose values did not assemble)."""
        try:
            local, many, named = fut.result()
        except PageError:
            return None
        except Unsupported:
            self._readers[no] = None    # (closed when the other scans drop it)
            return None
        if whole and any(got is None for got in many):
            return None
        return local, many, named

    def _special_rows(self, fi: "_FileIndex", rg: int, g: "_Group",
                      chars: Sequence[str]) -> np.ndarray:
        """Rows of a group (local, ascending) holding one of ``chars`` (from
        SPECIAL_FOLD). Which rows hold a special character is computed once
        per group and character, when a search first asks, and kept with the
        file's index (small): a needle asks for one or two of the 17."""
        if not chars:
            return np.zeros(0, np.int64)
        per = fi.special.setdefault(rg, {})
        missing = [c for c in chars if c not in per]
        if missing:
            data, offs = g.spans()
            na = per.get("")
            if na is None:      # the rows holding any non-ASCII byte
                na = per[""] = find_spans(data, offs[:-1], offs[1:], b"\xff", False, True)
            for c in missing:
                per[c] = na[find_spans(data, offs[na], offs[na + 1], _SPECIAL_UTF8[SPECIAL_FOLD.index(c)])]
        found = [per[c] for c in chars if len(per[c])]
        if not found:
            return np.zeros(0, np.int64)
        return found[0] if len(found) == 1 else unique(np.concatenate(found))
