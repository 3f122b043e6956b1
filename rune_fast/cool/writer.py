"""The writer of a cool archive: cooling a table into a new file, staging
and adopting it, erasing rows, and merging files, with the merge policy
(:func:`plan_merge`).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._names import tmp_name
from ..errors import CorruptStateCheckpointError
from ..events import fsync_dir
from . import grams as _grams
from .files import _dirs_of
from .search import _Search
from .schema import (_PARQUET_ERRORS, COOL_SCHEMA, CoolChange, CoolRun, StagedMerge, _file_no, _grams_name,
                     _idx_name, _parquet_name)
from .sidecar import (_FileIndex, _KeyParts, _close, _file_digest, _footer_hash, _index_of_keys, _open_checked,
                      _release_arrow, _unlink_quiet)
from .tables import _channel_order, _is_identity, _merge_order, _RowTaker

log = logging.getLogger("rune_fast.cool")


class MergeCancelled(Exception):
    """A :meth:`_Writer.stage_merge` given up through its ``cancel`` event
    (its files are removed; the archive still serves the sources)."""


#: rows of a cooled table whose content the search filters take at a time
_GRAM_PIECE = 1 << 15
#: the same for a table written in another order (each piece a copy)
_GRAM_TAKE = 1 << 12
#: the columns a file's index is built from (``_KeyParts``)
_KEY_COLUMNS = ("msg_id", "channel_id", "task_id")
#: the columns a merge orders a channel's rows by (``_merge_order``)
_ORDER_COLUMNS = ["channel_id", "task_id", "hlc", "ord", "msg_id"]
#: a merge takes a channel of more rows than this from its sources this
#: many rows at a time, in merged order (its order computed from the key
#: columns alone): a merge of eight files of a bulk load of 1,000,000
#: messages held one busy channel's rows twice (about 90,000 rows, 130 MB),
#: beside the cooling run written meanwhile
MERGE_CHUNK_ROWS = 8192


def _placed(order: np.ndarray, of: np.ndarray, firsts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the source of each merged row, its row within that source's range)
    for ``order`` over the sources' rows one after the other (source of
    each: ``of``; where each source's rows begin: ``firsts``)."""
    src = of[order]
    return src, order - firsts[src]


def _in_order(src: np.ndarray, row: np.ndarray, n: int) -> bool:
    """Whether each source's rows come in their own order (a merge's chunk
    then reads one range of each, forward)."""
    return all(bool((np.diff(row[src == k]) > 0).all()) for k in range(n))


class _GroupCursor:
    """A cool file read forward a row group at a time (a merge's source):
    :meth:`rows` gives rows ``[start, end)``, reading the row groups they
    lie in and keeping only the last (the next range starts there or later)."""

    def __init__(self, path: str, fi: _FileIndex) -> None:
        self.path = path
        self.fi = fi
        self._pf = _open_checked(path)
        self._groups: dict[int, pa.Table] = {}

    def rows(self, start: int, end: int) -> pa.Table:
        starts = self.fi.rg_starts
        lo = int(np.searchsorted(starts, start, side="right")) - 1
        hi = int(np.searchsorted(starts, end - 1, side="right")) - 1
        for rg in list(self._groups):
            if rg < lo:
                del self._groups[rg]
        parts = []
        for rg in range(lo, hi + 1):
            t = self._groups.get(rg)
            if t is None:
                try:
                    t = self._pf.read_row_group(rg, use_threads=False)
                except _PARQUET_ERRORS as exc:
                    raise CorruptStateCheckpointError(f"cool archive cannot be read: {exc}",
                                                      path=self.path) from None
                if t.num_rows != int(starts[rg + 1] - starts[rg]):
                    raise CorruptStateCheckpointError(
                        f"cool archive row group {rg} holds {t.num_rows} rows, its index "
                        f"{int(starts[rg + 1] - starts[rg])}", path=self.path)
                self._groups[rg] = t
            a = max(start, int(starts[rg])) - int(starts[rg])
            b = min(end, int(starts[rg + 1])) - int(starts[rg])
            parts.append(t.slice(a, b - a))
        for rg in list(self._groups):
            if rg < hi:
                del self._groups[rg]
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def keys(self, start: int, end: int) -> pa.Table:
        """The order-key columns of rows ``[start, end)`` (their row groups
        read for those columns only; nothing kept)."""
        starts = self.fi.rg_starts
        lo = int(np.searchsorted(starts, start, side="right")) - 1
        hi = int(np.searchsorted(starts, end - 1, side="right")) - 1
        try:
            t = self._pf.read_row_groups(list(range(lo, hi + 1)), columns=_ORDER_COLUMNS, use_threads=False)
        except _PARQUET_ERRORS as exc:
            raise CorruptStateCheckpointError(f"cool archive cannot be read: {exc}", path=self.path) from None
        if t.num_rows != int(starts[hi + 1] - starts[lo]):
            raise CorruptStateCheckpointError(
                f"cool archive row groups {lo}-{hi} hold {t.num_rows} rows, its index "
                f"{int(starts[hi + 1] - starts[lo])}", path=self.path)
        return t.slice(start - int(starts[lo]), end - start)

    def close(self) -> None:
        self._groups.clear()
        _close(self._pf)


class _Writer(_Search):
    """Every change to the file set: cool, erase, merge (the layer above
    search). Each writes new files under new names; the caller's manifest
    decides when the old ones go.
    """

    def plan_merge(self, *, fanout: int = 4, max_files: int | None = None) -> list[list[str]]:
        """Groups of live files to merge (size-tiered, so every row is rewritten
        O(log n) times over the archive's life).

        A file's tier is ``floor(log_fanout(rows))``; any tier holding
        ``fanout`` or more files is merged into one (which lands in a higher
        tier). With ``max_files``, the smallest files are then also merged
        until at most that many remain."""
        with self._lock:
            sizes = {fi.name: fi.rows for fi in self._files.values()}
        return plan_merge(sizes, fanout=fanout, max_files=max_files)

    def _take_no(self) -> int:
        with self._lock:
            no = self._next_no
            self._next_no += 1
            return no

    def _write_file(self, table: pa.Table | None, *, durable: bool, order: pa.Array | None = None,
                    parts: Iterable[pa.Table] | None = None, overlap: bool = False) -> _FileIndex:
        """Write ``table`` (its rows in ``order``), or the rows of ``parts``
        (see ``_write_tmp``), as the next numbered file plus its sidecar:
        both temp files written and fsynced, both renamed, one folder fsync
        (three fsyncs in all; none unless ``durable``), and its search
        filters (``.grams``, a cache: not synced; see rune_fast.cool.grams),
        built from the content as it is written. ``overlap``: a foreground
        write, whose row groups a thread of their own compresses and folds
        into the filters (``_FileSet._write_parts``)."""
        no = self._take_no()
        name, iname = _parquet_name(no), _idx_name(no)
        keys = _KeyParts()          # (the index's keys, part by part: 12 bytes a row)
        gname = _grams_name(no)
        # (the search filters go to their temp file as they are made)
        sink = _grams.GramFile(self._ipath(tmp_name(gname)))

        def keep_keys(tables: Iterable[pa.Table]) -> Iterable[pa.Table]:
            for t in tables:
                keys.add(*(t.column(c) for c in _KEY_COLUMNS))
                yield t

        def feed(rows: pa.Table) -> None:
            # (the rows of each write as they are written: with ``overlap``
            # on a thread of its own, which folds the content without the GIL)
            sink.add(rows.column("content"))

        try:
            tmp = self._write_tmp(name, table=table, durable=durable, order=order,
                                  parts=None if parts is None else keep_keys(parts), overlap=overlap,
                                  feed=None if parts is None else feed)
        except BaseException:
            sink.discard()
            raise
        itmp = None
        try:
            size, footer = _footer_hash(tmp)
            md = pq.read_metadata(tmp)
            rg_counts = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
            if parts is None:
                assert table is not None
                # (only the three small columns are put in file order)
                keys.add(*(table.column(c) if order is None else table.column(c).take(order)
                           for c in _KEY_COLUMNS))
                content = table.column("content")
                if order is None:
                    for a in range(0, table.num_rows, _GRAM_PIECE):
                        sink.add(content.slice(a, _GRAM_PIECE))
                else:
                    # (a piece at a time, taken from the chunks it lies in:
                    # Arrow's take of a chunked string column copies the
                    # whole column first, 11 MB for a background cooling
                    # run of 16,384 rows of the bench's workload)
                    taker = _RowTaker(table.select(["content"]))
                    where = np.asarray(order, dtype=np.int64)
                    for a in range(0, table.num_rows, _GRAM_TAKE):
                        sink.add(taker.take(where[a:a + _GRAM_TAKE]).column("content"))
            fi = _index_of_keys(no, size, footer, keys, rg_counts, self._path(name))
            fi.id_range = keys.id_range
            fi.digest = _file_digest(tmp)
            fi.pagedir = _dirs_of(tmp, md)      # (kept in the sidecar: no reader parses them again)
            itmp = self._write_tmp(iname, fi.pieces(), durable=durable, folder=self._idx_dir)
            os.replace(itmp, self._ipath(iname))
            os.replace(tmp, self._path(name))
        except BaseException:
            sink.discard()
            _unlink_quiet(tmp)
            if itmp is not None:
                _unlink_quiet(itmp)
                _unlink_quiet(self._ipath(iname))
            raise
        if durable:
            # (the sidecar's folder is not synced: a sidecar a power loss
            # takes is rebuilt from its file, which this sync keeps)
            fsync_dir(self._dir)
        # the search filters: a cache (one missing is built by the file's first search)
        try:
            sink.keep(self._ipath(gname), size, footer, fi.rows)
        except ValueError as exc:
            log.warning("%s: search filters not written: %s", self._ipath(gname), exc)
        return self._remapped(fi)     # (its arrays from the mapped sidecar: off the heap)

    def cool_table(self, table: pa.Table, *, durable: bool | None = None) -> CoolRun:
        """Archive the rows of ``table`` (see :meth:`stage_table`) as ONE new
        Parquet file and serve it; durable when this returns (``durable=False``
        skips the fsyncs; default: the archive's ``durable``). Rows are grouped
        by channel, each channel's by task (stable: within a task the given
        order, which must be the order key, is kept: ``_channel_order``). Returns the new file's name (None for no
        rows): the caller records it in its manifest."""
        with self._lock:
            return self._serve(self.stage_table(table, durable=durable))

    def cool_parts(self, parts: Iterable[pa.Table], *, durable: bool | None = None) -> CoolRun:
        """Archive the rows of ``parts`` as ONE new file, as :meth:`cool_table`
        does, each part written as it comes: the rows are never held whole
        (the file's id, channel and task columns are, for its index), so a
        file may hold many more rows than a table would be made of. The
        parts (tables of the cool schema, with their ``ord`` and ``digest``)
        come in file order: grouped by channel, channels in code point
        order, each channel's rows clustered by task (no task first, tasks
        in code point order) each task's in their order key, as
        ``_channel_order`` lays them out; a channel's rows all in their
        order key (the older layout) read right too (docs/FORMAT.md, "Order
        within a channel"). ValueError for parts
        out of that order, a msg_id already archived or no rows at all; the
        file is not written then."""
        self._writable()
        with self._lock:
            fi = self._write_file(None, durable=self._dur(durable), parts=self._checked_parts(parts),
                                  overlap=True)
            _release_arrow()
            return self._serve(fi)

    def stage_parts(self, parts: Iterable[pa.Table], *, durable: bool | None = None) -> "_FileIndex":
        """Write the rows of ``parts`` as :meth:`cool_parts` does (each part
        as it comes, checked the same way), but do not serve the file yet:
        :meth:`adopt` serves it, :meth:`discard` removes it (a stray until
        then, as :meth:`stage_table`'s). Meant for a background cooling run
        whose lines arrive a part at a time: the run's rows are never held
        whole (a table of 16,384 rows of the bench's workload is ~16 MB),
        so a run may be as large as the excess it cools. Only the file
        number and the duplicate checks take the lock."""
        self._writable()
        fi = self._write_file(None, durable=self._dur(durable), parts=self._checked_parts(parts))
        _release_arrow()
        return fi

    def _checked_parts(self, parts: Iterable[pa.Table]) -> Iterator[pa.Table]:
        """``parts`` as :meth:`cool_parts` takes them, each checked as it
        comes (the schema, the channels' order, no id archived already)."""
        last: str | None = None
        at = 0
        for t in parts:
            if t.schema != COOL_SCHEMA:
                raise ValueError(f"cool_parts: a part's schema is not the cool schema: {t.schema}")
            if t.num_rows == 0:
                continue
            runs = pc.run_end_encode(t.column("channel_id").combine_chunks()).values.to_pylist()
            for ch in runs:       # (a channel's rows apart: one after a larger one)
                if last is not None and ch < last:
                    raise ValueError(f"cool_parts: row {at}: channel {ch!r} after {last!r} (not in file order)")
                last = ch
            ids = t.column("msg_id")
            already = self.contains_many(ids)       # (the Arrow column: no str a row)
            if already.any():
                i = int(np.flatnonzero(already)[0])
                raise ValueError(f"cool_parts: row {at + i}: msg_id {ids[i].as_py()!r} is already archived")
            at += t.num_rows
            yield t
        if at == 0:
            raise ValueError("cool_parts: no rows")

    def _serve(self, fi: "_FileIndex | None") -> CoolRun:
        """Adopt a file just staged (lock held); the run :meth:`cool_table` returns."""
        if fi is None:
            return CoolRun(None, 0, 0, self.files())
        self.adopt(fi)
        return CoolRun(fi.name, fi.rows, fi.size, self.files())

    def stage_table(self, table: pa.Table, *, durable: bool | None = None) -> "_FileIndex | None":
        """Write the rows of ``table`` (of the cool schema, with their ``ord``
        and ``digest``: what :func:`table_from_lines` makes of the repository's
        hot lines, which are checksummed, so the values are not checked again)
        as :meth:`cool_table` does, but do not serve the file yet: :meth:`adopt`
        serves it, :meth:`discard` removes it. Until then it is a stray
        (removed by :meth:`gc`, or by the repository's open after a crash).
        Meant to run in a background thread while the archive serves reads:
        only the file number and the duplicate check take the lock.
        ValueError for a msg_id given twice or already archived; nothing is
        written then."""
        self._writable()
        if table.schema != COOL_SCHEMA:
            raise ValueError(f"stage_table: the table's schema is not the cool schema: {table.schema}")
        if table.num_rows == 0:
            return None
        ids = table.column("msg_id").to_pylist()
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            for i, mid in enumerate(ids):
                if mid in seen:
                    raise ValueError(f"row {i}: msg_id {mid!r} given twice")
                seen.add(mid)
        return self._stage(table, ids, durable)

    def _stage(self, table: pa.Table, ids: list[str], durable: bool | None) -> "_FileIndex":
        already = self.contains_many(ids)
        if already.any():
            i = int(np.flatnonzero(already)[0])
            raise ValueError(f"row {i}: msg_id {ids[i]!r} is already archived")
        order: pa.Array | None = _channel_order(table)
        if _is_identity(order):
            order = None        # (already in file order: written as it is, no row taken)
        fi = self._write_file(table, durable=self._dur(durable), order=order)
        _release_arrow()
        return fi

    def adopt(self, fi: "_FileIndex") -> list[str]:
        """Serve a file written by :meth:`stage_table`; returns the live files."""
        self._writable()
        with self._lock:
            if fi.no in self._files:
                raise ValueError(f"adopt: {fi.name} is already live")
            self._add_file(fi)
            return self.files()

    def discard(self, fi: "_FileIndex") -> None:
        """Remove a file written by :meth:`stage_table` that will not be adopted."""
        with self._lock:
            if fi.no in self._files:
                raise ValueError(f"discard: {fi.name} is live")
            self._abandon([fi])

    def erase(self, msg_ids: Iterable[str], *, durable: bool | None = None) -> CoolChange:
        """Rewrite every file holding one of ``msg_ids`` without those rows.

        Each affected file is copied, minus the rows, to a NEW file (next
        number; an emptied file gets none), durable before this returns; the
        archive then serves the new set. The caller records ``files`` in its
        manifest and then calls ``unlink_files(change.removed)``: only then is
        no byte of the erased content left under the folder. Ids not archived
        are listed in ``not_found``."""
        self._writable()
        with self._lock:
            by_file: dict[int, set[int]] = {}
            not_found = []
            for mid in dict.fromkeys(msg_ids):
                found = False
                for loc in self._locate(mid):
                    if self._id_at(loc.no, loc.row) == mid:
                        by_file.setdefault(loc.no, set()).add(loc.row)
                        found = True
                if not found:
                    not_found.append(mid)
            replaced: dict[str, str | None] = {}
            new: list[_FileIndex] = []
            n_removed = n_rewritten = 0
            try:
                for no in sorted(by_file):
                    table = self._read_table(no)
                    keep = np.ones(table.num_rows, dtype=bool)
                    keep[sorted(by_file[no])] = False
                    n_removed += int((~keep).sum())
                    new_name = None
                    if keep.any():
                        kept = table.filter(pa.array(keep))
                        del table
                        n_rewritten += kept.num_rows
                        fi = self._write_file(kept, durable=self._dur(durable))
                        new.append(fi)
                        new_name = fi.name
                    replaced[self._files[no].name] = new_name
            except BaseException:
                self._abandon(new)
                raise
            _release_arrow()
            self._switch(sorted(by_file), new)
            return CoolChange(replaced, [fi.name for fi in new], list(replaced), self.files(),
                              n_removed, n_rewritten, not_found)

    def _abandon(self, new: list[_FileIndex]) -> None:
        """Remove files written by a change that failed half-way (the archive
        still serves the old set, so they are strays)."""
        for fi in new:
            self._forget_cache(fi.no)
            for path in (self._path(fi.name), self._ipath(_idx_name(fi.no)), self._ipath(_grams_name(fi.no))):
                _unlink_quiet(path)

    def _switch(self, old_nos: list[int], new: list[_FileIndex]) -> None:
        """Serve ``new`` instead of ``old_nos`` (all new files are durable),
        once no reader holds one of ``old_nos`` pinned (an export or a check
        reading it without the repository's lock: it stays live until then)."""
        while any(no in self._pins for no in old_nos):
            self._unpinned.wait()
        self._drop_files(list(old_nos))
        for fi in new:
            self._add_file(fi)

    def merge(self, groups: Sequence[Sequence[str]] | None = None, *, fanout: int = 4,
              max_files: int | None = None, durable: bool | None = None) -> CoolChange:
        """Merge each group of live files (default: :meth:`plan_merge`) into
        one new file, rows sorted by channel, task, then order key. Same protocol as
        :meth:`erase`: record ``files``, then ``unlink_files(removed)``."""
        self._writable()
        with self._lock:
            if groups is None:
                groups = self.plan_merge(fanout=fanout, max_files=max_files)
            return self.adopt_merge(self.stage_merge(groups, durable=durable))

    def stage_merge(self, groups: Sequence[Sequence[str]], *, durable: bool | None = None,
                    cancel: threading.Event | None = None) -> "StagedMerge":
        """Write the merged files of :meth:`merge` without serving them:
        :meth:`adopt_merge` switches to them, :meth:`discard_merge` removes
        them. Meant for a background thread while the archive serves reads:
        the sources are read through handles of its own, and nothing else may
        change the archive until the merge is adopted or discarded (new
        files may be added: a cooling run beside it). ``cancel`` set: it
        stops at the next channel, removes what it wrote and raises
        MergeCancelled (a close does not wait for a long merge)."""
        self._writable()
        with self._lock:
            seen: set[int] = set()
            jobs = []
            for group in groups:
                nos = [_file_no(name) for name in group]
                for name, no in zip(group, nos):
                    if no not in self._files:
                        raise ValueError(f"merge: {name} is not a live cool file")
                    if no in seen:
                        raise ValueError(f"merge: {name} is in two groups")
                    seen.add(no)
                if len(nos) >= 2:
                    jobs.append(nos)
            indexes = {tuple(nos): [self._files[no] for no in nos] for nos in jobs}
        replaced: dict[str, str | None] = {}
        new: list[_FileIndex] = []
        try:
            for nos in jobs:
                fi = self._write_file(None, durable=self._dur(durable),
                                      parts=self._merged_channels(nos, indexes[tuple(nos)], cancel))
                _release_arrow()
                new.append(fi)
                for no in nos:
                    replaced[_parquet_name(no)] = fi.name
        except BaseException:
            with self._lock:
                self._abandon(new)
            raise
        _release_arrow()
        return StagedMerge(jobs, new, replaced)

    def adopt_merge(self, staged: "StagedMerge") -> CoolChange:
        """Serve the files of :meth:`stage_merge` instead of their sources."""
        self._writable()
        with self._lock:
            for nos in staged.jobs:
                for no in nos:
                    if no not in self._files:
                        raise ValueError(f"adopt_merge: {_parquet_name(no)} is no longer live")
            self._switch([no for nos in staged.jobs for no in nos], staged.new)
            return CoolChange(staged.replaced, [fi.name for fi in staged.new], list(staged.replaced),
                              self.files(), 0, sum(fi.rows for fi in staged.new), [])

    def discard_merge(self, staged: "StagedMerge") -> None:
        """Remove the files of a :meth:`stage_merge` that will not be adopted."""
        with self._lock:
            self._abandon(staged.new)

    def _merged_channels(self, nos: Sequence[int], fis: Sequence[_FileIndex],
                         cancel: threading.Event | None = None) -> Iterator[pa.Table]:
        """The rows of files ``nos`` (their indexes ``fis``) in merged order,
        one channel at a time: each file holds a channel's rows together
        (its index gives their range), so a channel's merged rows are its
        rows of every file sorted by task, then the order key (:func:`_merge_order`,
        over that channel only). Each file is read a row group at a time
        through a handle of its own, every row group once (a group that
        holds the end of one channel and the start of the next is kept
        for the next): what a merge holds is one channel's rows and a row
        group of each file, whatever the files' size."""
        readers = [_GroupCursor(self._path(_parquet_name(no)), fi) for no, fi in zip(nos, fis)]
        try:
            names = sorted({ch for fi in fis for ch in fi.channels})   # code point order: Arrow's
            for ch in names:
                if cancel is not None and cancel.is_set():
                    raise MergeCancelled(f"merge of {[_parquet_name(no) for no in nos]} cancelled")
                srcs = [(r, *r.fi.channels[ch][:2]) for r in readers if ch in r.fi.channels]
                if len(srcs) > 1 and sum(e - s for _r, s, e in srcs) > MERGE_CHUNK_ROWS:
                    yield from self._merged_chunks(srcs)
                    continue
                got = [r.rows(s, e) for r, s, e in srcs]
                t = pa.concat_tables(got) if len(got) > 1 else got[0]
                del got
                # (one source too: a file of the older layout, a channel in
                # key order, comes out clustered by task)
                order = _merge_order(t)
                yield t if _is_identity(order) else t.take(order)
                del t
        finally:
            for r in readers:
                r.close()

    @staticmethod
    def _merged_chunks(srcs: Sequence[tuple[_GroupCursor, int, int]]) -> Iterator[pa.Table]:
        """One channel's rows of several sources (each ``(cursor, start,
        end)``, a range in merged order unless the source has the older
        layout) in merged order, MERGE_CHUNK_ROWS rows
        at a time: the merged order comes from the key columns alone, and
        as each source's rows keep their order in it, a chunk takes one
        range of each source (read forward by its cursor)."""
        keys = pa.concat_tables([r.keys(s, e) for r, s, e in srcs])
        lens = np.array([e - s for _r, s, e in srcs], dtype=np.int64)
        firsts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        of = np.repeat(np.arange(len(srcs)), lens)
        src, row = _placed(np.asarray(_merge_order(keys), dtype=np.int64), of, firsts)
        if not _in_order(src, row, len(srcs)):
            # a source of the older layout (the channel in key order, its
            # tasks interleaved): merged in that order, this channel keeps
            # it, rather than read each source's whole range for every
            # chunk (readers take either layout: docs/FORMAT.md)
            alt = _placed(np.asarray(_merge_order(keys, by_task=False), dtype=np.int64), of, firsts)
            if _in_order(*alt, len(srcs)):
                src, row = alt
        del keys
        for a in range(0, len(src), MERGE_CHUNK_ROWS):
            cs, cr = src[a:a + MERGE_CHUNK_ROWS], row[a:a + MERGE_CHUNK_ROWS]
            parts, base = [], np.zeros(len(srcs), dtype=np.int64)
            at = 0
            for k, (r, s, _e) in enumerate(srcs):
                mine = cr[cs == k]
                if len(mine):
                    # (one range: a source's rows keep their order; were
                    # they not, the span that holds them is read)
                    lo, hi = int(mine.min()), int(mine.max()) + 1
                    parts.append(r.rows(s + lo, s + hi))
                    base[k] = at - lo
                    at += hi - lo
            t = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
            del parts
            yield t.take(pa.array(base[cs] + cr))
            del t


def plan_merge(sizes: dict[str, int], *, fanout: int = 4,
               max_files: int | None = None) -> list[list[str]]:
    """The merge policy of :meth:`CoolArchive.plan_merge` over ``{name: rows}``."""
    if fanout < 2:
        raise ValueError("fanout must be at least 2")
    tiers: dict[int, list[str]] = {}
    for name, rows in sizes.items():
        t, r = 0, max(rows, 1)
        while r >= fanout:
            r //= fanout
            t += 1
        tiers.setdefault(t, []).append(name)
    groups = [sorted(v) for _t, v in sorted(tiers.items()) if len(v) >= fanout]
    if max_files is not None:
        if max_files < 1:
            raise ValueError("max_files must be at least 1")
        count = len(sizes) - sum(len(g) - 1 for g in groups)
        if count > max_files:
            # fold the smallest remaining units (files or planned groups) into one group
            grouped = {n for g in groups for n in g}
            units = [[n] for n in sizes if n not in grouped] + groups
            units.sort(key=lambda u: sum(sizes[n] for n in u))
            take = units[:count - max_files + 1]
            groups = [g for g in groups if g not in take] + [sorted(n for u in take for n in u)]
    return [g for g in groups if len(g) > 1]
