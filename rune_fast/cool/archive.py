"""The cool archive: :class:`CoolArchive`, the facade over its layers
(``files`` -> ``cache`` -> ``reads`` -> ``search`` -> ``writer``), and its
full check (:meth:`CoolArchive.verify`).
"""
from __future__ import annotations

import os
import struct
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterable

import numpy as np

from ..errors import CorruptStateCheckpointError
from ..pages import PageError, page_directories
from .hits import check_table
from .schema import CoolProblem, _COL_TYPES, _PARQUET_ERRORS, _idx_name
from .sidecar import (
    _FileIndex, _KeyParts, _Skip, _by_hash_then_row, _close, _file_digest, _footer_hash, _index_of_keys,
    _open_parquet, _release_arrow, _same_dirs, _same_index,
)
from .writer import _Writer


class CoolArchive(_Writer):
    """The cool tier: a set of Parquet files plus their id/channel/task index.

    ``CoolArchive(cool_dir, files=(), *, read_only=False, cache_bytes=8 MiB, durable=True)``
    opens the live files named in ``files`` (names such as
    ``"cool-00000003.parquet"``, as returned by :meth:`files`). Files in the
    folder that are not named are ignored (see :meth:`gc`). A missing or
    damaged sidecar is rebuilt from its Parquet file (and rewritten unless
    ``read_only``); a Parquet file that cannot be read, or whose rows fail
    their digests while rebuilding, raises
    :class:`~rune_fast.errors.CorruptStateCheckpointError` naming the file.
    ``expect`` (``{name: [size, footer hash]}``, what :meth:`file_meta`
    gave when the files were live) makes a file that is not the one
    archived (rewritten with rows dropped, added or replaced: a valid Parquet
    file whose rows check) raise the same at open. ``index_dir``: the
    folder of the sidecars (default: ``<cool_dir>_index``).

    ``durable=False`` skips every fsync (files are still written to a temp
    name and renamed, so a process crash leaves the old or the new file, never
    a torn one; a power loss may lose the latest changes): for a repository
    opened with ``durability="none"``. ``cool_table``, ``erase`` and
    ``merge`` also take ``durable=`` per call.

    ``cache_bytes`` bounds the decoded row groups kept in memory (Arrow
    buffers plus per-column overhead, counted honestly).

    Reads are safe from many threads. Writes (``cool_table``, ``erase``,
    ``merge``, ``unlink_files``, ``gc``) expect the caller's lock, but take
    the archive's own lock too.
    """

    @classmethod
    def open(cls, cool_dir: str | os.PathLike, files: Iterable[str], **kwargs: Any) -> "CoolArchive":
        """Open the archive whose live files are ``files`` (see the class)."""
        return cls(cool_dir, files, **kwargs)

    def verify(self, checked: dict[str, int] | None = None,
               sound: Callable[[str, bytes], None] | None = None,
               hold: Callable[[], ContextManager[Any]] | None = None) -> list[CoolProblem]:
        """Check every live file: readable, schema, every row's digest, the
        sidecar on disk against the file, ids unique. Raises nothing; adds
        the rows it checked to ``checked["cool_rows"]`` and hands each sound
        row's id and the canonical JSON of its record to ``sound`` (see
        :func:`check_table`).

        ``hold()``: entered to choose each file (a repository's lock, under
        which compactions change the file set); the file is then read
        without it, pinned: an erasure or a merge replacing it waits for
        its check to end (automatic compactions leave pinned files alone:
        :meth:`pinned`). A file that left the
        set meanwhile is not checked; one that came is (a merge's rows in
        their new file), the ids of files gone forgotten first."""
        problems: list[CoolProblem] = []
        # each file's id hashes (sorted) and their rows: the repeated ids
        # are found once the last file is checked (12 bytes a row, where a
        # dict of every id held ~200)
        by_file: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        done: set[int] = set()
        while True:
            with hold() if hold is not None else nullcontext():
                with self._lock:
                    live = {no: fi for no, fi in self._files.items() if no not in done}
                    names = {fi.name for fi in self._files.values()}
                for name in [n for n in by_file if n not in names]:
                    del by_file[name]       # (a file gone: its rows are in the one that replaced it)
                if not live:
                    break
                no = min(live)
                done.add(no)
                with self._lock:
                    self._pin(no)
            try:
                ids = self._verify_file(no, live[no], problems, checked, sound)
                if ids is not None:
                    by_file[live[no].name] = ids
            finally:
                self._unpin(no)
        # (the hashes of every row sorted without ``hold``: ~0.4 s at
        # 1,000,000 rows that a writer's appends waited for)
        return problems + self._repeated_ids(by_file, hold)

    def _repeated_ids(self, by_file: dict[str, tuple[np.ndarray, np.ndarray]],
                      hold: Callable[[], ContextManager[Any]] | None = None) -> list[CoolProblem]:
        """A problem for each row whose msg_id an earlier row holds (files
        in the order checked, then rows), naming that row: rows whose id
        hashes agree are compared by their ids, read again from the files
        under ``hold()`` (a file that cannot be read is left out: its check
        named it)."""
        names = list(by_file)
        if not names:
            return []
        hashes = np.concatenate([by_file[n][0] for n in names])
        rows = np.concatenate([by_file[n][1].astype(np.int64) for n in names])
        owner = np.repeat(np.arange(len(names)), [len(by_file[n][0]) for n in names])
        order = np.lexsort((rows, owner, hashes))
        hashes, rows, owner = hashes[order], rows[order], owner[order]
        same = np.flatnonzero(hashes[1:] == hashes[:-1])
        if not len(same):
            return []
        firsts = np.flatnonzero(np.diff(same, prepend=-2) != 1)
        ends = np.append(firsts[1:], len(same))
        with hold() if hold is not None else nullcontext():
            return self._ids_repeated(names, same, firsts, ends, owner, rows)

    def _ids_repeated(self, names: list[str], same: np.ndarray, firsts: np.ndarray, ends: np.ndarray,
                      owner: np.ndarray, rows: np.ndarray) -> list[CoolProblem]:
        """:meth:`_repeated_ids`' comparison of the ids whose hashes agree."""
        ids: dict[int, list | None] = {}
        out: list[CoolProblem] = []
        for a, b in zip(same[firsts].tolist(), (same[ends - 1] + 2).tolist()):
            first: dict[str, tuple[str, int]] = {}
            for k in range(a, b):
                f, r = int(owner[k]), int(rows[k])
                if f not in ids:
                    ids[f] = self._ids_of(names[f])
                col = ids[f]
                if col is None:
                    continue
                mid = col[r]
                if mid in first:
                    out.append(CoolProblem(names[f], r, f"msg_id {mid!r} also in {first[mid][0]} "
                                                        f"row {first[mid][1]}"))
                else:
                    first[mid] = (names[f], r)
        return out

    def _ids_of(self, name: str) -> list | None:
        """The msg_id column of file ``name``, or None if it cannot be read."""
        try:
            pf = _open_parquet(self._path(name))
        except CorruptStateCheckpointError:
            return None
        try:
            return pf.read(columns=["msg_id"], use_threads=False).column("msg_id").to_pylist()
        except _PARQUET_ERRORS:
            return None
        finally:
            _close(pf)

    def _verify_file(self, no: int, fi: _FileIndex, problems: list[CoolProblem], checked: dict[str, int] | None,
                     sound: Callable[[str, bytes], None] | None) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`verify` of file ``no``: its problems added to ``problems``;
        returns its ids' hashes (sorted) and their rows, None if its rows
        could not all be read."""
        name = fi.name
        path = self._path(name)
        try:
            size, footer = _footer_hash(path)
        except (CorruptStateCheckpointError, OSError) as exc:
            problems.append(CoolProblem(name, None, str(exc)))
            return None
        if (size, footer) != (fi.size, fi.footer):
            problems.append(CoolProblem(name, None, "file changed since it was indexed"))
        want = self._digests.get(no)
        if want is not None:
            try:
                got = _file_digest(path)
            except OSError as exc:
                problems.append(CoolProblem(name, None, f"not readable: {exc}"))
                return None
            if got != want:
                problems.append(CoolProblem(
                    name, None, f"the file's bytes hash to {got}, not to the xxh3_64 {want} recorded "
                                "when it was written: a byte changed (where no page checksum looks, "
                                "if no row below is named)"))
        if (size, footer) != (fi.size, fi.footer):
            return None        # (not parsed: some damaged footers make pyarrow abort the process)
        try:
            pf = _open_parquet(path)
        except CorruptStateCheckpointError as exc:
            problems.append(CoolProblem(name, None, str(exc)))
            return None
        try:
            if [(f.name, f.type) for f in pf.schema_arrow] != _COL_TYPES:
                problems.append(CoolProblem(name, None, f"unexpected columns {pf.schema_arrow}"))
                return None
            rg_counts = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
            try:
                dirs = page_directories(path, pf.metadata)
            except PageError as exc:
                dirs = None
                problems.append(CoolProblem(name, None, f"page headers do not parse: {exc}"))
            keys = _KeyParts()      # (the ids, channels and tasks as the file's index is built)
            base = 0
            for rg in range(pf.metadata.num_row_groups):
                try:
                    t = pf.read_row_group(rg, use_threads=False)
                except _PARQUET_ERRORS as exc:
                    problems.append(CoolProblem(name, base, f"row group {rg} unreadable: {exc}"))
                    raise _Skip() from None
                for row, why in check_table(t, base, sound):
                    problems.append(CoolProblem(name, row, why))
                if checked is not None:
                    checked["cool_rows"] = checked.get("cool_rows", 0) + t.num_rows
                keys.add(t.column("msg_id"), t.column("channel_id"), t.column("task_id"))
                base += t.num_rows
        except _Skip:
            return None
        except _PARQUET_ERRORS as exc:
            problems.append(CoolProblem(name, None, f"not readable Parquet: {exc}"))
            return None
        finally:
            _close(pf)
            _release_arrow()
        try:
            truth = _index_of_keys(no, size, footer, keys, rg_counts, path)
        except CorruptStateCheckpointError as exc:
            problems.append(CoolProblem(name, exc.offset, str(exc)))
            return None
        with self._lock:
            run = self._ids.run(no) if no in self._files else None      # (None: it left the set)
        # (sorted after the lock, which appends ask: ~0.25 s for a file of
        # 262,144 rows; the file is pinned, its index stays)
        mine = None if run is None else _by_hash_then_row(*run)
        if mine is not None and not (_same_index(truth, fi, ids=False) and np.array_equal(mine[0], truth.hashes)
                                     and np.array_equal(mine[1], truth.hrows)):
            problems.append(CoolProblem(name, None, "index in memory disagrees with the file"))
        ipath = self._sidecar_path(no)
        try:
            with open(ipath, "rb") as f:
                disk = _FileIndex.decode(f.read(), no, ipath)
            if not _same_index(truth, disk):
                problems.append(CoolProblem(_idx_name(no), None, "sidecar disagrees with its file"))
            elif disk.dirs_known and not _same_dirs(disk.pagedir, dirs):
                problems.append(CoolProblem(_idx_name(no), None,
                                            "sidecar's page directories disagree with its file's pages"))
        except FileNotFoundError:
            problems.append(CoolProblem(_idx_name(no), None, "sidecar missing"))
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
            problems.append(CoolProblem(_idx_name(no), None, f"sidecar damaged: {exc}"))
        return truth.hashes, truth.hrows

