"""The row-group cache of a cool archive: decoded row groups kept within
``cache_bytes``, page-by-page reads of the groups it does not keep, and
the rows assembled and checked against their digests.
"""
from __future__ import annotations

import bisect
import os
from typing import Any, Sequence, cast

import numpy as np
import pyarrow as pa

from ..errors import CorruptStateCheckpointError
from ..pages import PageError, PageReader, Unsupported
from .files import _FileSet
from .rows import _Group, _assemble_at, _assemble_columns, _assemble_many, _row_digest
from .schema import COOL_SCHEMA, CoolRow, _COLS, _MAX_MISSED, _PARQUET_ERRORS, _parquet_name
from .sidecar import _FileIndex, _release_arrow


class _RowCache(_FileSet):
    """Row access over the live files (the layer above the file set).
    """

    def set_cache_bytes(self, cache_bytes: int) -> None:
        """Bound the decoded row groups kept to ``cache_bytes`` from here on
        (the repository's default budget grows with the store); a lower
        bound evicts at once."""
        with self._lock:
            self._cache_bytes = int(cache_bytes)
            self._evict()

    def _group(self, no: int, rg: int, cols: Sequence[str] = _COLS, scan: bool = False,
               pinned: dict | None = None) -> _Group:
        """Row group ``rg`` of file ``no`` with at least ``cols`` decoded.

        ``scan`` (bulk reads over many groups): a group that is not cached is
        only cached if it fits without evicting, so a scan larger than the
        cache keeps what is cached instead of cycling through it."""
        key = (no, rg)
        g = self._cache.get(key)
        if g is not None:
            self._cache.move_to_end(key)
        elif pinned is not None:
            g = pinned.get(key)   # read by this scan but not cached: reuse its columns
        if g is not None:
            if g.acc is not None or all(c in g.cols for c in cols):
                return g
        fi = self._files.get(no)
        first = fi.rg_list[rg] if fi is not None and rg < len(fi.rg_list) else None
        path = self._path(_parquet_name(no))
        if g is None:
            n = fi.rg_list[rg + 1] - first if fi is not None and rg + 1 < len(fi.rg_list) else None
            g = _Group(-1 if n is None else n)
        missing = [c for c in cols if c not in g.cols]
        table = self._page_columns(no, rg, missing)
        if table is None:
            pf = self._parquet(no)
            try:
                table = pf.read_row_group(rg, columns=missing, use_threads=False)
            except _PARQUET_ERRORS as exc:
                raise CorruptStateCheckpointError(
                    f"cool archive row group {rg} (from row {first}) cannot be read: {exc}",
                    path=path, offset=first) from None
        if g.n < 0:
            g.n = table.num_rows
        cached = key in self._cache
        before = g.nbytes if cached else 0
        g.add(table, path, first or 0)
        del table
        _release_arrow()
        self._cache[key] = g
        self._cache.move_to_end(key)
        self._cached_bytes += g.nbytes - before
        self._evict(key if scan and not cached else None)
        if pinned is not None:
            pinned[key] = g
        return g

    def _direct(self, no: int, rg: int, n: int, local: list[int]) -> list | None:
        """Rows ``local`` of row group ``rg`` (of ``n`` rows) of file ``no``,
        as :func:`_assemble_many` gives them, read straight from the file
        without caching the group -- or None: the group is cached with every
        column, or the cache has room for it (then caching it pays off for the
        next reads), or the rows need the cached path to name their problem.

        A group's first miss is read this way (one page per column for a
        single row, see rune_fast.pages; nothing decoded for rows nobody asked
        for); its second miss caches it, unless the cache is full: a group
        that did not fit (even with every cached content column compressed)
        was dropped again, and from then on misses are read page by page. So
        random reads over a cool tier larger than the cache do not cycle
        through it, and the groups read again and again end up cached."""
        key = (no, rg)
        g = self._cache.get(key)
        if g is not None and g.acc is not None:
            return None
        if key in self._missed and not self._full:
            return None
        if len(self._missed) >= _MAX_MISSED:
            self._missed.clear()
        self._missed.add(key)
        if not local or local[0] < 0 or local[-1] >= n:
            return None
        try:
            rows = self._with_reader(no, lambda reader: reader.rows(rg, local))
        except PageError:
            return None   # damage: the cached path reads it through pyarrow and names it
        if rows is not None:
            return _assemble_columns(list(zip(*rows)))
        try:
            table = self._parquet(no).read_row_group(rg, use_threads=False)
            if table.num_rows != n:
                return None
            sub = table.take(local)
            del table
            cols = [sub.column(name).to_pylist() for name in _COLS]
        except (*_PARQUET_ERRORS, UnicodeDecodeError):
            return None   # the cached path reads it again and names the problem
        finally:
            _release_arrow()
        got = _assemble_columns(cols)
        return None if any(x is None for x in got) else got

    def _reader(self, no: int) -> PageReader | None:
        """File ``no``'s PageReader, or None if it is not in a layout it reads."""
        if no in self._readers:
            return self._readers[no]
        path = self._path(_parquet_name(no))
        fi = self._files.get(no)
        if fi is not None and fi.pagedir is not None:
            # the sidecar holds every group's page directory: no footer to
            # parse (pyarrow's open of a file of 500,000 rows: ~12 ms)
            reader = self._direct_reader(no, fi, path)
            if reader is not None:
                self._readers[no] = reader
                return reader
        pf = self._parquet(no)
        try:
            # the descriptor pyarrow reads: the same file, even if the path was replaced since
            fd = os.dup(pf._rune_src.fileno())   # type: ignore[attr-defined]
        except (AttributeError, OSError) as exc:
            raise CorruptStateCheckpointError(f"cool archive cannot be opened: {exc}", path=path) from None
        try:
            reader = PageReader(path, pf.metadata, fd=fd)
        except Unsupported:
            reader = None
        self._readers[no] = reader
        return reader

    def _direct_reader(self, no: int, fi: _FileIndex, path: str) -> PageReader | None:
        """File ``no``'s PageReader over the page directories its sidecar
        holds, on a descriptor of its own; None if the file at ``path`` is
        not the one the sidecar was checked against at open (its size), for
        the caller to go through pyarrow, which names what it finds."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size != fi.size:
                os.close(fd)
                return None
            return PageReader(path, None, fd=fd, dirs=fi.page_dir, schema=COOL_SCHEMA)
        except Unsupported:
            return None     # (closed by the reader)

    def _with_reader(self, no: int, read: Any) -> Any:
        """``read(reader)`` with file ``no``'s PageReader, or None if the file
        is not in a layout it reads (then it is not asked again). PageError
        (damage) passes to the caller; a read the disk failed (EIO) is
        CorruptStateCheckpointError naming the file."""
        reader = self._reader(no)
        if reader is None:
            return None
        try:
            return read(reader)
        except Unsupported:
            self._readers[no] = None
            reader.close()
            return None
        except OSError as exc:
            fi = self._files.get(no)
            path = os.path.join(self.cool_dir, fi.name) if fi is not None else self.cool_dir
            raise CorruptStateCheckpointError(f"cool archive cannot be read: {exc.strerror or exc}",
                                              path=path) from exc

    def _page_columns(self, no: int, rg: int, names: list[str]) -> pa.Table | None:
        """Columns ``names`` of row group ``rg`` through the file's
        PageReader, or None: not a layout it reads, or damage (which the
        caller's pyarrow read then names)."""
        try:
            return self._with_reader(
                no, lambda reader: pa.table({c: reader.column(rg, _COLS.index(c)) for c in names}))
        except PageError:
            return None

    def _evict(self, scanned: tuple[int, int] | None = None) -> None:
        """Bring the cache within budget: first compress the content of the
        least recently used groups, then drop groups (least recently used
        first; for a scan, the group it just read, so that a scan larger than
        the cache does not cycle through it)."""
        if self._cached_bytes <= self._cache_bytes:
            return
        for key, g in list(self._cache.items()):
            if key != scanned:
                self._cached_bytes -= g.compress()
                if self._cached_bytes <= self._cache_bytes:
                    return
        if scanned is not None and scanned in self._cache and len(self._cache) > 1:
            # dropped as read: compressing it first would be work for nothing
            self._cached_bytes -= self._cache.pop(scanned).nbytes
            self._full = True
        while self._cached_bytes > self._cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= old.nbytes

    def _rg_of(self, fi: _FileIndex, row: int) -> int:
        return bisect.bisect_right(fi.rg_list, row) - 1

    def _rows(self, no: int, start: int, stop: int, rows: Any = None,
              pinned: dict | None = None) -> list[CoolRow]:
        """Verified rows [start, stop) of file ``no`` (or just ``rows``, ascending).

        A group not cached is read page by page at its first miss and cached
        at its second if it fits (see :meth:`_direct`); caching never pushes
        out what the cache holds. ``pinned``: groups a search read (see
        :meth:`_group`)."""
        fi = self._files[no]
        name = fi.name
        rows = list(range(start, stop)) if rows is None else \
            (rows.tolist() if isinstance(rows, np.ndarray) else list(rows))
        out: list[CoolRow] = []
        if not rows:
            return out
        starts = fi.rg_list
        k, n = 0, len(rows)
        while k < n:
            rg = bisect.bisect_right(starts, rows[k]) - 1
            base = starts[rg]
            end = starts[rg + 1] if rg + 1 < len(starts) else fi.rows
            j = bisect.bisect_left(rows, end, k)
            if rg < 0 or j == k:
                raise CorruptStateCheckpointError(f"cool index points past the file at row {rows[k]}",
                                                  path=self._path(name), offset=rows[k])
            sel = rows[k:j]
            local = [r - base for r in sel]
            many = self._direct(no, rg, end - base, local)
            if many is None:
                g = self._group(no, rg, _COLS, True, pinned)
                acc = cast("list", g.acc)     # (every column read: the getters are set)
                if local[0] < 0 or local[-1] >= g.n:
                    raise CorruptStateCheckpointError(
                        f"cool index points past row group {rg}", path=self._path(name),
                        offset=sel[0] if local[0] < 0 else sel[-1])
                many = _assemble_many(cast("list", g.takes), local) if len(local) > 1 else [None]
            if any(got is None for got in many):
                many = [got if got is not None else _assemble_at(acc, i) for i, got in zip(local, many)]
            out.extend(self._verified(name, sel, many))
            k = j
        return out

    def _verified(self, name: str, rows: list[int], many: list) -> list[CoolRow]:
        """CoolRows of file ``name``'s ``rows`` from their assembled values
        (:func:`_assemble_many`), each checked against its digest."""
        out = []
        for r, (rec, o, dig, plain) in zip(rows, many):
            if rec is None:
                raise CorruptStateCheckpointError(f"cool row {r} is malformed ({dig})",
                                                  path=self._path(name), offset=r)
            if _row_digest(rec, plain) != dig:
                raise CorruptStateCheckpointError(f"cool row {r} fails its digest",
                                                  path=self._path(name), offset=r)
            out.append(CoolRow(rec, o, name, r, plain))
        return out

    def _row(self, no: int, row: int) -> CoolRow:
        return self._rows(no, row, row + 1)[0]

    def _id_at(self, no: int, row: int) -> str:
        """The stored msg_id of a row (only that column is decoded; Parquet
        page checksums cover its bytes)."""
        fi = self._files[no]
        rg = self._rg_of(fi, row)
        g = self._group(no, rg, ("msg_id",))
        i = row - fi.rg_list[rg]
        if not 0 <= i < g.n:
            raise CorruptStateCheckpointError(f"cool index points past row group {rg}",
                                              path=self._path(fi.name), offset=row)
        try:
            return g.cols["msg_id"][0](i)
        except UnicodeDecodeError:
            raise CorruptStateCheckpointError(f"cool row {row} has a malformed msg_id",
                                              path=self._path(fi.name), offset=row) from None
