"""The live file set of a cool archive: opening the files a manifest names,
their sidecars and the id/channel/task index over them, the atomic writes
of new files, and the removal of files nobody references (``gc``).
"""
from __future__ import annotations

import bisect
import logging
import os
import re
import struct
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._index import IdRuns, check_run
from .._memory import use_system_arrow_pool
from .._names import tmp_name
from ..errors import CorruptStateCheckpointError
from ..events import fsync_dir
from ..pages import PageError, PageReader, page_directories
from .hits import check_table
from .rows import _Group, _Located
from .schema import (
    COOL_SCHEMA, ROW_GROUP_ROWS, _COMPRESSION, _DICT_COLUMNS, _ENCODING, _OURS_RE, _PAGE_BATCH_ROWS, _PAGE_BYTES,
    _file_no, _grams_name, _id_hash, _idx_name, _parquet_name, index_dir_for,
)
from .sidecar import (
    _FileIndex, _PageFilters, _build_index, _by_hash_then_row, _close, _footer_hash, _footer_start, _map_file,
    _open_checked, _read_all, _release_arrow, _sidecar_names, _unlink_quiet,
)
from .tables import _GroupWriter, _RowTaker, _widened


log = logging.getLogger("rune_fast.cool")


def _dirs_of(path: str, metadata: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The page directories of the Parquet file at ``path`` for its sidecar
    (:func:`rune_fast.pages.page_directories`); None if it is not in the
    page layout, or if a page header does not parse: its reads then parse
    them, meet the damage and go through pyarrow, which names it."""
    try:
        return page_directories(path, metadata)
    except PageError as exc:
        log.warning("cool file %s: its page directories do not parse (%s): its sidecar keeps none", path, exc)
        return None


def _index_field(name: str, *, settable: bool = False, doc: str | None = None) -> property:
    """A field of a CoolArchive's index, read after the sidecars still unread
    are read (see ``CoolArchive.__init__``): every path to the index sees
    every live file."""
    def get(self: "_FileSet") -> Any:
        if self._unloaded:
            self._load_sidecars()
        return getattr(self, name)

    def put(self: "_FileSet", value: Any) -> None:
        setattr(self, name, value)
    return property(get, put if settable else None, doc=doc)


class _FileSet:
    """The archive's state and its live file set (the lowest layer of
    :class:`~rune_fast.cool.CoolArchive`): ``__init__`` makes every field
    the layers above read; only this layer adds or drops files.
    """

    rebuilt_sidecars = _index_field("_rebuilt", doc="Sidecars found damaged or stale and rebuilt from their files.")
    _files = _index_field("_files_d")               # no -> _FileIndex
    _channels = _index_field("_channels_d")         # channel -> file numbers
    _tasks = _index_field("_tasks_d", settable=True)  # task -> file numbers (None: not built yet)
    _ids = _index_field("_ids_d")                   # IdRuns: every live file's sorted id hashes

    def __init__(self, cool_dir: str | os.PathLike, files: Iterable[str] = (), *,
                 read_only: bool = False, cache_bytes: int = 8 << 20,
                 row_group_rows: int = ROW_GROUP_ROWS, durable: bool = True,
                 index_dir: str | os.PathLike | None = None,
                 expect: Mapping[str, Sequence[Any]] | None = None) -> None:
        use_system_arrow_pool()
        self._dir = os.fspath(cool_dir)
        # the sidecars live beside the archive folder, not in it: the folder
        # holds Parquet files only, so any reader takes it whole as a dataset
        self._idx_dir = os.fspath(index_dir) if index_dir is not None else index_dir_for(self._dir)
        self._read_only = read_only
        self._durable = bool(durable)
        self._cache_bytes = int(cache_bytes)
        self._rg_rows = int(row_group_rows)
        self._lock = threading.RLock()
        self._files_d: dict[int, _FileIndex] = {}
        self._cache: OrderedDict[tuple[int, int], _Group] = OrderedDict()
        self._cached_bytes = 0
        self._handles: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        self._readers: dict[int, PageReader | None] = {}   # None: not a layout PageReader reads
        self._missed: set[tuple[int, int]] = set()        # groups read once without caching them
        self._full = False   # a group was just dropped for want of room: read misses page by page
        # (file, row group) -> trigram filters of its content pages, made by a
        # search's scan (PageReader.find): 640 B a page, at most _GRAMS_BUDGET
        self._filters = _PageFilters()
        self._channels_d: dict[str, list[int]] = {}
        self._tasks_d: dict[str, list[int]] | None = None   # built at the first task query
        # task_parts' answers (each task's rows by file; see _TASK_LOCS_KEPT)
        self._task_locs_d: dict[str, list[tuple[int, np.ndarray]]] = {}
        # per live file, read once (files never change; those gone are
        # forgotten): each channel's task runs (_Reads._task_runs) and
        # the order tops of its rows (_Search._kept_ord_tops)
        self._task_runs_d: dict[int, dict] = {}
        self._ord_max_d: dict[int, tuple[np.ndarray, int]] = {}
        # max_ord's answers by channel (None: all) for the live file set
        # named by the tuple of its numbers (_Search.max_ord)
        self._max_ord_memo: tuple[tuple[int, ...], dict[str | None, int | None]] = ((), {})
        # channel_tail_locs' answers by (channel, n): emptied with _task_locs_d
        self._tail_locs_d: dict[tuple[str, int], list[int]] = {}
        # id index: xxh3_64(msg_id) -> (file no << 32) | row, every live file:
        # its sidecar's sorted hashes, searched where they are mapped
        self._ids_d = IdRuns()
        # (no, size, footer hash) of live files whose sidecars are not read yet
        self._unloaded: list[tuple[int, int, str]] = []
        # no -> (smallest, largest) msg_id of a live file: written with it,
        # kept in the manifest's cool_meta, so that the append path's
        # duplicate check of a new id reads no sidecar (see _id_span)
        self._ranges: dict[int, tuple[str, str]] = {}
        self._span: tuple[str, str] | None | bool = False    # _id_span's answer (False: not known yet)
        # no -> xxh3_64 of the whole file as written (kept in cool_meta after
        # the range): verify() finds a byte changed where no page checksum
        # looks (the leading magic, page headers)
        self._digests: dict[int, str] = {}
        # no -> readers of it without the repository's lock (verify, export):
        # it stays live (the writer's _switch waits), so it is never unlinked under them
        self._pins: dict[int, int] = {}
        self._unpinned = threading.Condition(self._lock)
        self._rebuilt: list[str] = []
        self._moved_legacy = False
        made = False
        if not read_only:
            for d in (self._dir, self._idx_dir):
                if not os.path.isdir(d):
                    os.makedirs(d, mode=0o700, exist_ok=True)
                    os.chmod(d, 0o700)
                    made = True
        self._next_no = 1 + max([0] + self._numbers_on_disk())
        # Each file's footer is checked now, and that its sidecar names it;
        # the sidecar itself (digest, arrays) is read at the first call that
        # needs the archive's index (an open followed by hot-tier reads never
        # pays for it). A sidecar that is missing or names another file (the
        # file was replaced) is not used: the file is verified and its
        # sidecar rebuilt now, as before any read. A read-only archive reads
        # every sidecar now: the writer beside it may merge the files away,
        # and a viewer's reload on a moved manifest only covers its open.
        listed: set[int] = set()
        for name in files:
            no = _file_no(name)
            if no in listed:
                raise ValueError(f"cool archive file listed twice: {name}")
            listed.add(no)
            path = self._path(name)
            try:
                size, footer = _footer_hash(path)
            except FileNotFoundError:
                raise CorruptStateCheckpointError("cool archive named by the manifest is missing",
                                                  path=path) from None
            except OSError as exc:      # (a folder in its place, say)
                raise CorruptStateCheckpointError(f"cool archive named by the manifest is not readable: "
                                                  f"{exc.strerror or exc}", path=path) from None
            want = (expect or {}).get(name)
            if want is not None and (size, footer) != (want[0], want[1]):
                # the file was rewritten after it was archived (rows dropped,
                # added or replaced by a valid Parquet file), or its footer
                # is damaged: not the archive
                raise CorruptStateCheckpointError(
                    f"cool archive is not the file the manifest names: {size} bytes, footer hash "
                    f"{footer} (the manifest: {want[0]} bytes, {want[1]})", path=path,
                    offset=_footer_start(path) if size == want[0] else None)
            self._unloaded.append((no, size, footer))
            self._span = False
            if want is not None and len(want) >= 4 and type(want[2]) is str and type(want[3]) is str:
                self._ranges[no] = (want[2], want[3])
                if len(want) >= 5 and type(want[4]) is str:
                    self._digests[no] = want[4]
            if not read_only:
                self._move_legacy_sidecar(no)
            if read_only or not _sidecar_names(self._sidecar_path(no), no, size, footer):
                self._load_sidecars()
        if (made or self._moved_legacy) and self._durable:
            # new folders, or sidecars moved into the index folder: synced
            # once, so that a power loss does not cost every sidecar a
            # rebuild from its file (a rename is atomic either way)
            fsync_dir(self._idx_dir)
            fsync_dir(self._dir)
            fsync_dir(os.path.dirname(os.path.normpath(self._dir)) or ".")

    def _load_sidecars(self) -> None:
        with self._lock:
            if not self._unloaded:
                return
            loaded = [self._load_index(no, size, footer) for no, size, footer in self._unloaded]
            for fi in loaded:
                self._add_file(fi)
            self._unloaded = []      # last: until then, other threads wait on the lock

    def close(self) -> None:
        """Release open Parquet handles and cached row groups (reads reopen them)."""
        with self._lock:
            while self._handles:
                _, pf = self._handles.popitem(last=False)
                _close(pf)
            while self._readers:
                _, reader = self._readers.popitem()
                if reader is not None:
                    reader.close()
            self._cache.clear()
            self._cached_bytes = 0
            self._full = False
            self._filters.clear()

    @property
    def cool_dir(self) -> str:
        return self._dir

    def files(self) -> list[str]:
        """Names of the live files, oldest first: what the manifest records."""
        with self._lock:
            return [_parquet_name(no) for no in sorted(self._live_nos())]

    def file_bytes(self) -> int:
        """The bytes of the live files (read no sidecar)."""
        with self._lock:
            return sum(fi.size for fi in self._files_d.values()) + sum(u[1] for u in self._unloaded)

    def file_meta(self) -> dict[str, list]:
        """``{name: [size, footer hash]}`` of every live file: what the
        manifest records of each, so that a file rewritten after it was
        archived is found at the next open (see ``expect``)."""
        with self._lock:
            out = {fi.name: [fi.size, fi.footer] for fi in self._files_d.values()}
            out.update({_parquet_name(no): [size, footer] for no, size, footer in self._unloaded})
            for name, meta in out.items():
                no = _file_no(name)
                if no in self._ranges:
                    meta.extend(self._ranges[no])
                    if no in self._digests:
                        meta.append(self._digests[no])
            return out

    def _id_span(self) -> tuple[str, str] | None:
        """(smallest, largest) msg_id over every live file, from the ranges
        each was written with (no sidecar is read): an id outside it is
        archived in no file. None when some file's range is not known (a
        manifest written before they were kept) or no file is live. Read
        without the lock once known: a background cooling run may hold the
        lock for a while (it checks its rows, and may build the id index),
        and the live files change only under the writer's lock, so an
        appender reads the span of the files as they are. A file added
        widens it (_add_file); a file dropped leaves it as it is (a span
        wider than the live files' still holds every archived id), so the
        first append after a cooling run is adopted does not wait for the
        lock to work it out again."""
        span = self._span
        if span is not False:
            return cast("tuple[str, str] | None", span)
        with self._lock:
            lo = hi = None
            self._span = None
            for no in self._live_nos():
                r = self._ranges.get(no)
                if r is None:
                    return None
                if lo is None or r[0] < lo:
                    lo = r[0]
                if hi is None or r[1] > hi:
                    hi = r[1]
            self._span = None if lo is None or hi is None else (lo, hi)
            return self._span

    def _live_nos(self) -> set[int]:
        """Numbers of the live files, without reading unread sidecars."""
        return set(self._files_d) | {u[0] for u in self._unloaded}

    def has_files(self) -> bool:
        """True if the archive serves at least one file (cheaper than len();
        no lock: a background write holds it for a while)."""
        return bool(self._files_d) or bool(self._unloaded)

    def _path(self, name: str) -> str:
        return os.path.join(self._dir, name)

    def _ipath(self, name: str) -> str:
        return os.path.join(self._idx_dir, name)

    @property
    def index_dir(self) -> str:
        """The folder of the sidecars. Public API: the repository does not call it."""
        return self._idx_dir

    def path_of(self, name: str) -> str:
        """The path of an archive file (``cool-<n>.parquet``) or of a
        sidecar (``cool-<n>.idx``) named by :meth:`verify`."""
        m = _OURS_RE.match(name)
        if m and m.group(2) == "idx":
            return self._sidecar_path(int(m.group(1)))
        return self._path(name)

    def _sidecar_path(self, no: int) -> str:
        """Where file ``no``'s sidecar is: the index folder, or (a store
        written before the sidecars moved, read by a viewer) the archive
        folder."""
        ipath = self._ipath(_idx_name(no))
        if self._read_only and not os.path.exists(ipath):
            legacy = self._path(_idx_name(no))
            if os.path.exists(legacy):
                return legacy
        return ipath

    def _move_legacy_sidecar(self, no: int) -> None:
        """Move file ``no``'s sidecar out of the archive folder, where
        stores written before the index folder kept it (a rename; the
        folders are synced once the open has moved them all)."""
        legacy = self._path(_idx_name(no))
        if os.path.exists(legacy):
            if os.path.exists(self._ipath(_idx_name(no))):
                os.unlink(legacy)
            else:
                os.replace(legacy, self._ipath(_idx_name(no)))
            self._moved_legacy = True

    def _listing(self) -> list[tuple[str, str]]:
        """(folder, name) of every archive-owned file of both folders."""
        out = []
        for d in (self._dir, self._idx_dir):
            try:
                names = os.listdir(d)
            except FileNotFoundError:
                continue
            out += [(d, n) for n in names if _OURS_RE.match(n)]
        return out

    def _legacy_sidecar(self, folder: str, m: "re.Match[str]") -> bool:
        """Whether the archive-owned name ``m`` in ``folder`` is a sidecar
        left in the archive folder (a store written before the index folder)."""
        return folder == self._dir and m.group(2) == "idx"

    def _numbers_on_disk(self) -> list[int]:
        out = []
        for _d, n in self._listing():
            m = _OURS_RE.match(n)
            assert m is not None        # (_listing matched it)
            out.append(int(m.group(1)))
        return out

    def _load_index(self, no: int, size: int, footer: str) -> _FileIndex:
        """The index of file ``no`` (checked at open: ``size`` bytes, footer
        hash ``footer``) from its sidecar, or rebuilt from the file."""
        ipath = self._sidecar_path(no)
        why = "missing"
        for _attempt in range(2):
            try:
                fi = _FileIndex.decode(_map_file(ipath), no, ipath)
                if fi.size == size and fi.footer == footer:
                    bad = check_run(fi.hashes, fi.hrows, fi.rows)
                    if bad:
                        raise ValueError(f"its id run: {bad}")
                    return fi if fi.dirs_known or self._read_only else self._upgrade(fi, ipath)
                why = "made for another version of the file"
                break
            except FileNotFoundError:
                # (a viewer: a writer's open may just have moved it out of the archive folder)
                if ipath == self._ipath(_idx_name(no)):
                    break
                ipath = self._ipath(_idx_name(no))
            except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
                why = f"damaged ({exc})"
                break  # damaged sidecar: the Parquet file is the truth, rebuild below
        fi = self._index_from_parquet(no, size, footer, verify=True)
        _release_arrow()
        # (not silent: the file's rows were all checked against their digests)
        log.warning("cool index %s is %s: rebuilt from %s, every row checked", ipath, why,
                    self._path(_parquet_name(no)))
        self._rebuilt.append(_idx_name(no))
        if not self._read_only:
            self._write_atomic(_idx_name(no), fi.encode(), folder=self._idx_dir)
            fi = self._remapped(fi)
        return fi

    def _upgrade(self, fi: _FileIndex, ipath: str) -> _FileIndex:
        """File ``fi.no``'s sound sidecar of version 1 or 2 (no page
        directories) rewritten as the current version, its directories
        parsed from the file's page headers once (~0.2 ms a row group)
        instead of by every later process at its first read of each group."""
        path = self._path(_parquet_name(fi.no))
        fi.pagedir = _dirs_of(path, self._parquet(fi.no).metadata)
        fi.dirs_known = True
        fi.tasks        # (parsed: encode writes them)
        self._write_atomic(_idx_name(fi.no), fi.encode(), folder=self._idx_dir)
        log.info("cool index %s: written with its file's page directories", ipath)
        return self._remapped(fi)

    def _remapped(self, fi: _FileIndex) -> _FileIndex:
        """``fi`` as read back from the sidecar just written for it: its
        arrays then live in the mapped file (the page cache's, not this
        process's heap). ``fi`` itself if it cannot be read back."""
        ipath = self._ipath(_idx_name(fi.no))
        try:
            got = _FileIndex.decode(_map_file(ipath), fi.no, ipath)
        except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
            return fi
        if got.size != fi.size or got.footer != fi.footer or got.rows != fi.rows:
            return fi
        got.id_range, got.digest = fi.id_range, fi.digest
        return got

    def _parquet(self, no: int) -> pq.ParquetFile:
        pf = self._handles.get(no)
        if pf is not None:
            self._handles.move_to_end(no)
            return pf
        path = self._path(_parquet_name(no))
        fi = self._files_d.get(no)
        if fi is not None:
            # the footer again, as at open, before pyarrow parses it: some
            # damaged footers make pyarrow's metadata accessors abort the
            # process (an uncaught C++ exception), and the file may have
            # changed since open (52 us for the largest file at 1,000,000
            # messages, 84 MiB: the footer is hashed where it is mapped)
            try:
                size, footer = _footer_hash(path)
            except OSError as exc:
                raise CorruptStateCheckpointError(f"cool archive is not readable: {exc.strerror or exc}",
                                                  path=path) from None
            if (size, footer) != (fi.size, fi.footer):
                raise CorruptStateCheckpointError(
                    f"cool archive changed since it was opened: {size} bytes, footer hash {footer} "
                    f"(at open: {fi.size} bytes, {fi.footer})", path=path,
                    offset=_footer_start(path) if size == fi.size else None)
        pf = _open_checked(path)
        self._handles[no] = pf
        while len(self._handles) > 16:
            _, old = self._handles.popitem(last=False)
            _close(old)
        return pf

    def _read_table(self, no: int) -> pa.Table:
        return _read_all(self._parquet(no), self._path(_parquet_name(no)))

    def _index_from_parquet(self, no: int, size: int, footer: str, *, verify: bool) -> _FileIndex:
        path = self._path(_parquet_name(no))
        pf = self._parquet(no)
        rg_counts = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
        dirs = _dirs_of(path, pf.metadata)
        table = self._read_table(no)
        if table.num_rows != pf.metadata.num_rows:
            raise CorruptStateCheckpointError(
                f"cool archive holds {pf.metadata.num_rows} rows by its footer, {table.num_rows} read", path=path)
        if verify:
            for row, bad in check_table(table):
                raise CorruptStateCheckpointError(f"cool row {row} fails its digest ({bad})",
                                                  path=path, offset=row)
        fi = _build_index(no, size, footer, table.column("msg_id"), table.column("channel_id"),
                          table.column("task_id"), rg_counts, path)
        fi.pagedir = dirs
        return fi

    def _add_file(self, fi: _FileIndex) -> None:
        # (the fields themselves: this runs while the sidecars are being read)
        self._files_d[fi.no] = fi
        self._task_locs_d.clear()
        self._tail_locs_d.clear()
        no = fi.no
        if fi.id_range is not None:
            self._ranges[no] = fi.id_range
        if fi.digest is not None:
            self._digests[no] = fi.digest
        # (a file whose sidecar is read late was counted by its manifest range)
        self._span = _widened(self._span, self._ranges.get(no))
        pairs: list[tuple[dict[str, list[int]], Iterable[str]]] = [(self._channels_d, fi.channels)]
        if self._tasks_d is not None:
            pairs.append((self._tasks_d, fi.tasks))
        for index, names in pairs:
            for name in names:
                nos = index.get(name)
                if nos is None:
                    index[name] = [no]
                elif nos[-1] < no:
                    nos.append(no)
                else:
                    bisect.insort(nos, no)
        # The id index is the file's sorted hashes as its sidecar holds
        # them (mapped, searched in place: IdRuns): nothing is built, at
        # open or at a first lookup, and nothing per message is copied.
        self._ids_d.add(no, fi.hashes, fi.hrows)

    def _id_locs(self, msg_id: str) -> list[int]:
        """``(file no << 32) | row`` of every archived row whose id hashes
        like ``msg_id`` (lock held)."""
        return self._ids.values(_id_hash(msg_id))

    def _drop_files(self, nos: list[int]) -> None:
        self._task_locs_d.clear()
        self._tail_locs_d.clear()
        for no in nos:
            fi = self._files.pop(no)
            self._ranges.pop(no, None)
            self._digests.pop(no, None)
            if self._span is None:
                self._span = False      # the file without a range may be the one going
            for ch in fi.channels:
                lst = self._channels[ch]
                lst.remove(no)
                if not lst:
                    del self._channels[ch]
            for t in (fi.tasks if self._tasks is not None else ()):
                lst = self._tasks[t]
                lst.remove(no)
                if not lst:
                    del self._tasks[t]
            self._forget_cache(no)
            self._ids.discard(no)

    def _file_entries(self, no: int) -> tuple[np.ndarray, np.ndarray]:
        """(hashes, rows) of file ``no`` in the id index, by hash then row."""
        return _by_hash_then_row(*self._ids.run(no))

    def _forget_cache(self, no: int) -> None:
        self._full = False
        for key in [k for k in self._cache if k[0] == no]:
            self._cached_bytes -= self._cache.pop(key).nbytes
        self._filters.forget(no)
        pf = self._handles.pop(no, None)
        if pf is not None:
            _close(pf)
        reader = self._readers.pop(no, None)
        if reader is not None:
            reader.close()

    def _locate(self, msg_id: str) -> list[_Located]:
        return [_Located(loc >> 32, loc & 0xFFFFFFFF)
                for loc in self._id_locs(msg_id)]

    def _dur(self, durable: bool | None) -> bool:
        return self._durable if durable is None else bool(durable)

    def _write_tmp(self, name: str, data: "bytes | bytearray | list[Any] | None" = None,
                   table: pa.Table | None = None,
                   *, durable: bool, folder: str | None = None, order: pa.Array | None = None,
                   parts: Iterable[pa.Table] | None = None, overlap: bool = False,
                   feed: Callable[[pa.Table], None] | None = None) -> str:
        """Write ``name``'s temp file (0600) in ``folder`` (default: the
        archive folder), fsynced when ``durable``; returns its path. ``data``:
        its bytes, or their pieces one after the other. A
        ``table`` is written one row group at a time, row i of the file
        from ``table`` row ``order[i]`` (default: the table's order), so
        that the rows in their file order are never copied whole: Arrow
        holds the source table and one row group. ``parts`` instead: the
        file's rows as tables, one after the other, each written as it
        comes. Either way the file's layout is what one ``write_table``
        with ``row_group_size`` makes of all its rows. ``overlap``, ``feed``:
        see :meth:`_write_parts`."""
        tmp = os.path.join(folder or self._dir, tmp_name(name))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=True) as f:
                if data is not None:
                    for piece in data if isinstance(data, list) else (data,):
                        f.write(piece)
                else:
                    # (Parquet goes through Arrow's own file, not the Python
                    # one: each write of a Python file takes the GIL, about
                    # 40 a row group, and a cooling thread waited for it
                    # while the caller parsed the next lines holding it)
                    with pa.OSFile(tmp, "w") as sink:
                        if parts is not None:
                            self._write_parts(sink, parts, overlap=overlap, feed=feed)
                        else:
                            assert table is not None
                            self._write_parts(sink, self._row_groups(table, order), table.schema, overlap, feed)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
        except BaseException:
            _unlink_quiet(tmp)
            raise
        return tmp

    def _row_groups(self, table: pa.Table, order: pa.Array | None) -> Iterator[pa.Table]:
        """``table``'s rows in ``order`` (default: its own), a row group at a time."""
        rg = self._rg_rows
        if order is None:
            for a in range(0, table.num_rows, rg):
                yield table.slice(a, rg)
            return
        taker = _RowTaker(table)
        where = np.asarray(order, dtype=np.int64)
        for a in range(0, table.num_rows, rg):
            yield taker.take(where[a:a + rg])

    def _write_parts(self, f: Any, parts: Iterable[pa.Table], schema: pa.Schema | None = None,
                     overlap: bool = False, feed: Callable[[pa.Table], None] | None = None) -> None:
        """The Parquet file of the rows of ``parts`` (in order) into ``f``:
        row groups of ``_rg_rows`` rows, the whole ones a part completes
        written in one call as it comes (the layout of one write of all the
        rows), so that at most the last part and less than a row group
        carried before it are held. ``overlap``:
        the row groups are encoded and compressed by a thread of their own
        (pyarrow does it without the GIL) while this one makes the next
        parts (see :class:`_GroupWriter`). ``feed(rows)`` is called with
        the rows of each write, in file order (with ``overlap`` on a thread
        of its own, beside the write; else before it)."""
        rg = self._rg_rows
        w: Any = None
        pending: list[pa.Table] = []
        held = 0
        try:
            for t in parts:
                if w is None:
                    schema = t.schema if schema is None else schema
                    w = self._parquet_writer(f, schema)
                    if overlap:
                        w = _GroupWriter(w, each=feed)
                        feed = None     # (the thread feeds)
                pending.append(t)
                held += t.num_rows
                if held >= rg:
                    # every whole row group held, in one call: pyarrow
                    # encodes them without the GIL and takes it back once
                    # (taken back after each row group, a background
                    # run's thread waited for an appending thread's
                    # switch interval each time: half its wall time)
                    whole = held // rg * rg
                    buf = pa.concat_tables(pending)
                    if feed is not None:
                        feed(buf.slice(0, whole))
                    w.write_table(buf.slice(0, whole), row_group_size=rg)
                    rest = buf.slice(whole)
                    pending, held = [rest], rest.num_rows
                    del buf
            if w is None:
                w = self._parquet_writer(f, COOL_SCHEMA if schema is None else schema)
            if held or not pending:
                last = pa.concat_tables(pending) if pending else w.schema.empty_table()
                if feed is not None:
                    feed(last)
                w.write_table(last, row_group_size=rg)
        finally:
            pending.clear()
            if w is not None:
                w.close()

    @staticmethod
    def _parquet_writer(f: Any, schema: pa.Schema) -> pq.ParquetWriter:
        return pq.ParquetWriter(
            f, schema, compression=_COMPRESSION, write_page_checksum=True,
            use_dictionary=list(_DICT_COLUMNS) or False, column_encoding=dict(_ENCODING) or None,
            data_page_version="1.0", data_page_size=_PAGE_BYTES, write_batch_size=_PAGE_BATCH_ROWS,
            write_statistics=["channel_id", "ts", "ord"])

    def _write_atomic(self, name: str, data: bytes | bytearray, *, durable: bool | None = None,
                      folder: str | None = None) -> None:
        """Write ``name`` in ``folder`` (default: the archive folder)
        atomically: temp file (0600), fsync, rename, fsync of the folder (no
        fsyncs unless durable)."""
        durable = self._dur(durable)
        folder = folder or self._dir
        tmp = self._write_tmp(name, data, durable=durable, folder=folder)
        try:
            os.replace(tmp, os.path.join(folder, name))
        except BaseException:
            _unlink_quiet(tmp)
            raise
        if durable:
            fsync_dir(folder)

    def _writable(self) -> None:
        if self._read_only:
            from ..errors import ReadOnlyStoreError
            raise ReadOnlyStoreError(f"cool archive {self._dir} is open read-only")

    def unlink_files(self, names: Iterable[str]) -> list[str]:
        """Delete files (and their sidecars) the manifest no longer references.
        Live files are refused (ValueError). Returns the names removed."""
        self._writable()
        with self._lock:
            done = []
            names = list(names)
            for name in names:
                no = _file_no(name)
                if no in self._files:
                    raise ValueError(f"unlink_files: {name} is still live")
            for name in names:
                no = _file_no(name)
                self._forget_cache(no)
                iname, gname = _idx_name(no), _grams_name(no)
                for path in (self._path(name), self._ipath(iname), self._path(tmp_name(name)),
                             self._ipath(tmp_name(iname)), self._path(iname),
                             self._ipath(gname), self._ipath(tmp_name(gname))):
                    try:
                        os.unlink(path)
                        done.append(os.path.basename(path))
                    except FileNotFoundError:
                        pass
            if done and self._durable:
                fsync_dir(self._dir)
                fsync_dir(self._idx_dir)    # (an erased file's sidecar names its channels and tasks)
            return done

    def _stray_files(self, keep: Iterable[str] | None = None) -> list[tuple[str, str]]:
        """(folder, name) of each archive-owned file in the folders that
        ``keep`` (default: the live files) does not reference: leftovers of a
        crash. A sidecar left in the archive folder (a store written before
        the index folder) is one too."""
        with self._lock:
            keep_nos = {_file_no(n) for n in (self.files() if keep is None else keep)}
            out = []
            for d, n in self._listing():
                m = _OURS_RE.match(n)
                assert m is not None        # (_listing matched it)
                legacy = self._legacy_sidecar(d, m) and not self._read_only
                if int(m.group(1)) not in keep_nos or n.startswith(".") or legacy:
                    out.append((d, n))
            return out

    def _pin(self, no: int) -> None:
        """Keep file ``no`` and its sidecar until :meth:`_unpin` (lock held)."""
        self._pins[no] = self._pins.get(no, 0) + 1

    def pinned(self, names: Iterable[str]) -> bool:
        """Whether a reader holds one of ``names`` pinned (replacing it would wait)."""
        with self._lock:
            return any(_file_no(name) in self._pins for name in names)

    def _unpin(self, no: int) -> None:
        with self._lock:
            left = self._pins.pop(no) - 1
            if left:
                self._pins[no] = left
            self._unpinned.notify_all()

    def gc(self, keep: Iterable[str] | None = None) -> list[str]:
        """Remove stray archive files (see :meth:`_stray_files`); returns their names.
        Call after open, with the manifest's list, to finish any interrupted
        cool, erase or merge. Files the archive does not own are left alone."""
        self._writable()
        with self._lock:
            keep = list(self.files() if keep is None else keep)
            live = set(self.files())
            if not set(keep) <= live:
                raise ValueError(f"gc: keep names files that are not live: {sorted(set(keep) - live)}")
            gone = set()
            for d, n in self._stray_files(keep):
                m = _OURS_RE.match(n)
                if m and int(m.group(1)) in self._live_nos() and not n.startswith(".") \
                        and not self._legacy_sidecar(d, m):
                    continue
                try:
                    os.unlink(os.path.join(d, n))
                    gone.add(n)
                except FileNotFoundError:
                    pass
            if gone and self._durable:
                fsync_dir(self._dir)
            return sorted(gone)
