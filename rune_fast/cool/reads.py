"""The queries of a cool archive: by id, channel and task, and its counts.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, ContextManager, Iterator, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._arrays import unique
from .._pages import records_from_columns
from ..errors import CorruptStateCheckpointError
from ..pages import PageError
from .keys import _Keys
from .rows import (_ORD, _STRING_COLS, _SV, _TASK_LOCS_KEPT, _TOK, _TS, _assemble_at,  # noqa: F401
                   _calls_read, _row_digest)
from .schema import CoolRow, _COLS, _file_no, _row_key, cool_loc
from .sidecar import _id_hashes
from .tables import _merge


#: every column but msg_id (:meth:`_Reads.id_records_at`), in file order
_NOT_ID = list(range(1, len(_COLS)))


def parts_locs(parts: list[tuple[int, np.ndarray]]) -> list[int]:
    """The locations (:func:`cool_loc`) of the rows of ``parts``
    (:meth:`_Reads.task_parts`), in their order."""
    out: list[int] = []
    for no, rows in parts:
        out += (rows.astype(np.int64) | (no << 32)).tolist()
    return out


class _Reads(_Keys):
    """Queries by id, channel and task (the layer above the row cache).
    """

    def __len__(self) -> int:
        with self._lock:
            return sum(fi.rows for fi in self._files.values())

    def channels(self) -> list[str]:
        """Every channel with at least one cooled message, sorted."""
        with self._lock:
            return sorted(self._channels)

    def channel_len(self, channel_id: str) -> int:
        with self._lock:
            return sum(self._files[no].channels[channel_id][1] - self._files[no].channels[channel_id][0]
                       for no in self._channels.get(channel_id, ()))

    def channel_files(self, channel_id: str) -> tuple[int, ...]:
        """The numbers of the live files that hold archived messages of the channel."""
        with self._lock:
            return tuple(sorted(self._channels.get(channel_id, ())))

    def task_len(self, task_id: str) -> int:
        """Archived messages of the task. Public API: the repository does not call it."""
        with self._lock:
            return sum(len(self._files[no].tasks[task_id]) for no in self._task_map().get(task_id, ()))

    def _task_map(self) -> dict[str, list[int]]:
        """task -> numbers of the live files holding it, built at the first
        task query (an open does not parse 25,000 task names it may never use)."""
        if self._tasks is None:
            tasks: dict[str, list[int]] = {}
            for no in sorted(self._files):
                try:
                    names = self._files[no].tasks
                except (ValueError, TypeError) as exc:   # orjson.JSONDecodeError is a ValueError
                    raise CorruptStateCheckpointError(
                        f"cool sidecar task section unreadable: {exc}", path=self._sidecar_path(no)) from None
                for t in names:
                    tasks.setdefault(t, []).append(no)
            self._tasks = tasks
        return self._tasks

    def file_rows(self) -> dict[str, int]:
        """Rows per live file."""
        with self._lock:
            return {self._files[no].name: self._files[no].rows for no in sorted(self._files)}

    def stats(self) -> dict:
        with self._lock:
            return {
                "files": len(self._files),
                "rows": len(self),
                "bytes": sum(fi.size for fi in self._files.values()),
                "index_bytes": int(self._ids.nbytes),
                "filter_bytes": int(self._ids.filter_bytes),
                "cached_bytes": self._cached_bytes,
                "rebuilt_sidecars": list(self.rebuilt_sidecars),
            }

    def get_row(self, msg_id: str) -> CoolRow | None:
        """The archived message ``msg_id`` with its ordinal and place, or None.

        Raises CorruptStateCheckpointError (file and row) when the stored row
        fails its digest or its id does not match. Public API (the repository
        reads by :meth:`get` and :meth:`contains`, which use it)."""
        with self._lock:
            for loc in self._id_locs(msg_id):
                no, row = loc >> 32, loc & 0xFFFFFFFF
                fi = self._files[no]
                starts = fi.rg_list
                rg = bisect.bisect_right(starts, row) - 1
                if not 0 <= rg < len(starts) - 1:
                    raise CorruptStateCheckpointError(f"cool index points past the file at row {row}",
                                                      path=self._path(fi.name), offset=row)
                i = row - starts[rg]
                got = self._direct(no, rg, starts[rg + 1] - starts[rg], [i])
                if got is not None:
                    rec, o, dig, plain = got[0]
                    if rec is not None and rec["msg_id"] != msg_id:
                        continue  # another id with the same 64-bit hash (a malformed row: below)
                else:
                    g = self._group(no, rg, _COLS, True)
                    if not 0 <= i < g.n:
                        raise CorruptStateCheckpointError(f"cool index points past row group {rg}",
                                                          path=self._path(fi.name), offset=row)
                    acc = cast("list", g.acc)     # (every column read: the getters are set)
                    try:
                        mid = acc[0](i)
                    except UnicodeDecodeError:
                        mid = None
                    if mid != msg_id:
                        if mid is None:
                            raise CorruptStateCheckpointError(f"cool row {row} has a malformed msg_id",
                                                              path=self._path(fi.name), offset=row)
                        continue  # another id with the same 64-bit hash
                    rec, o, dig, plain = _assemble_at(acc, i)
                if rec is None:
                    raise CorruptStateCheckpointError(f"cool row {row} is malformed ({dig})",
                                                      path=self._path(fi.name), offset=row)
                if _row_digest(rec, plain) != dig:
                    raise CorruptStateCheckpointError(f"cool row {row} fails its digest",
                                                      path=self._path(fi.name), offset=row)
                return CoolRow(rec, o, fi.name, row, plain)
            return None

    def get(self, msg_id: str) -> dict | None:
        """The record dict of ``msg_id`` (verified against its digest), or None."""
        r = self.get_row(msg_id)
        return None if r is None else r.record

    def contains(self, msg_id: str, *, verify: bool = False) -> bool:
        """True if ``msg_id`` is archived.

        A hit checks the stored id (its column only, covered by the Parquet
        page checksums), not the whole row: that is the append path's
        duplicate check. ``verify=True`` also checks the row's digest (raising
        CorruptStateCheckpointError like :meth:`get_row`)."""
        span = self._id_span()
        if span is not None and not span[0] <= msg_id <= span[1]:
            return False        # (a new id after every archived one: no sidecar read)
        if verify:
            return self.get_row(msg_id) is not None
        with self._lock:
            for loc in self._id_locs(msg_id):
                if self._id_at(loc >> 32, loc & 0xFFFFFFFF) == msg_id:
                    return True
            return False

    def contains_many(self, msg_ids: "Sequence[str] | pa.Array | pa.ChunkedArray") -> np.ndarray:
        """Boolean array: which of ``msg_ids`` (strs, or an Arrow string
        column: a cooling run's part, whose ids then never become strs)
        are archived. The ids' hashes are looked up at once; only an id
        whose hash is archived has its stored id read (as :meth:`contains`
        does)."""
        arrow = isinstance(msg_ids, (pa.Array, pa.ChunkedArray))
        if not arrow:
            msg_ids = list(msg_ids)
        out = np.zeros(len(msg_ids), dtype=bool)
        if not len(msg_ids):
            return out
        span = self._id_span()
        # (ids of new_id() sort after every archived one: min and max, two
        # loops in C, answer them where a generator compared each id in
        # Python; ids on both sides of the span are compared one by one.
        # Arrow compares strings by their UTF-8 bytes: code point order,
        # as Python compares them)
        if span is not None:
            if arrow:
                if not pc.any(pc.and_(pc.greater_equal(msg_ids, span[0]),
                                      pc.less_equal(msg_ids, span[1]))).as_py():
                    return out
            elif (max(msg_ids) < span[0] or min(msg_ids) > span[1]
                  or not any(span[0] <= m <= span[1] for m in msg_ids)):
                return out
        with self._lock:
            if not self._files:
                return out
            cand = self._ids.has_many(_id_hashes(msg_ids))
            for i in np.flatnonzero(cand).tolist():
                out[i] = self.contains(cast(Any, msg_ids[i]).as_py() if arrow else msg_ids[i])
        return out

    def _channel_parts(self, channel_id: str) -> list[list[CoolRow]]:
        """Each file's rows of the channel, in key order (lock held)."""
        parts = []
        for no in self._channels.get(channel_id, ()):
            s, e, _ = self._files[no].channels[channel_id]
            rows = self._rows(no, s, e)
            self._check_field(rows, "channel_id", channel_id)
            runs = self._task_runs(no, channel_id)
            if runs is not None and len(runs[0]) > 1:
                rows.sort(key=_row_key)     # (clustered by task: each run in key order)
            parts.append(rows)
        return parts

    def _check_field(self, rows: list[CoolRow], fld: str, want: str) -> None:
        for r in rows:
            if r.record[fld] != want:
                raise CorruptStateCheckpointError(
                    f"cool index says row {r.row} has {fld} {want!r}, the file says {r.record[fld]!r}",
                    path=self._path(r.file), offset=r.row)

    def channel_rows(self, channel_id: str) -> list[CoolRow]:
        """Every archived message of the channel, oldest first by the order key
        (unstamped by ``ord``, then stamped by ``(hlc, msg_id)``). Each row is
        verified; damage raises CorruptStateCheckpointError (file and row)."""
        with self._lock:
            parts = self._channel_parts(channel_id)
        return _merge(parts)

    def channel_locs(self, channel_id: str) -> list[int]:
        """The locations (:func:`cool_loc`) of every archived message of the
        channel, as the sidecars say, file by file (:meth:`records_at`
        reads them, in any order; the caller checks each row's channel)."""
        with self._lock:
            out: list[int] = []
            for no in self._channels.get(channel_id, ()):
                s, e, _ = self._files[no].channels[channel_id]
                out += range(cool_loc(no, s), cool_loc(no, e))
            return out

    def channel_tail(self, channel_id: str, n: int) -> list[CoolRow]:
        """The newest ``n`` archived messages of the channel, oldest first."""
        if n <= 0:
            return []
        with self._lock:
            parts = []
            for no, cand in self._tail_rows(channel_id, n):
                rows = self._rows(no, 0, 0, cand)
                self._check_field(rows, "channel_id", channel_id)
                rows.sort(key=_row_key)
                parts.append(rows)
        merged = _merge(parts)
        return merged[-n:]

    @staticmethod
    def loc_of(row: CoolRow) -> int:
        """The location (:func:`cool_loc`) of a row, as :meth:`task_locs` names it."""
        return cool_loc(_file_no(row.file), row.row)

    def task_locs(self, task_id: str) -> list[int]:
        """The locations (:func:`cool_loc`) of every archived message of the
        task (as the sidecars say; :meth:`rows_at` reads and verifies them)."""
        return parts_locs(self.task_parts(task_id))

    def task_parts(self, task_id: str) -> list[tuple[int, np.ndarray]]:
        """The rows of every archived message of the task by file: ``(file
        number, its rows ascending)`` (what :meth:`task_records` reads;
        :func:`parts_locs` makes their locations). Kept per task (at most
        _TASK_LOCS_KEPT; forgotten when files come or go): the sidecar's own
        arrays, no copy (a task read over every task keeps no list of
        Python ints a message)."""
        with self._lock:
            kept = self._task_locs_d.get(task_id) if not self._unloaded else None
            if kept is not None:
                return kept
            parts: list[tuple[int, np.ndarray]] = []
            for no in self._task_map().get(task_id, ()):
                rows = self._files[no].tasks[task_id]
                if len(rows) > 1 and not bool((rows[1:] > rows[:-1]).all()):
                    rows = unique(rows)      # (a sidecar writes them ascending; reads take them so)
                parts.append((no, rows))
            if len(self._task_locs_d) >= _TASK_LOCS_KEPT:
                self._task_locs_d.clear()
            self._task_locs_d[task_id] = parts
            return parts

    def task_records(self, parts: list[tuple[int, np.ndarray]], record_type: type,
                     task_id: str) -> tuple[list[tuple[tuple, Any]], list[int]]:
        """``(keyed, declined)`` of the rows ``parts`` (:meth:`task_parts`)
        of the task ``task_id``: ``(order key, record)`` of each row read
        straight from the pages holding it (as :meth:`records_at` reads,
        each file's rows of a group in one ``PageReader.take`` and one
        compiled pass that checks every row's digest and that the row is of
        the task; the key as :func:`rune_fast._order.order_key` makes it),
        and the locations of the rows that path declines (damage, another
        task's row, an unusual spelling, a group the row-group cache holds
        whole), for the caller's :meth:`rows_at`, which names any damage.
        Nothing is cached: each record is new, the caller's to hand out."""
        keyed: list[tuple[tuple, Any]] = []
        declined: list[int] = []
        with self._lock:
            for no, arr in parts:
                if no not in self._files:
                    raise CorruptStateCheckpointError(f"cool file number {no} is not live", path=self._dir)
                rows = arr.tolist()
                base = no << 32
                for rg, sel, local in self._by_group(no, rows):
                    g = self._cache.get((no, rg))
                    cols = None
                    if g is None or g.acc is None:
                        try:
                            cols = self._with_reader(no, lambda reader: reader.take(rg, local))
                        except PageError:
                            cols = None     # damage: rows_at reads the group through pyarrow and names it
                    if cols is None:
                        declined += [base | r for r in sel]
                        continue
                    got, _ords = records_from_columns(
                        [cols[c] for c in _STRING_COLS], cols[_TS], cols[_TOK], cols[_SV], cols[_ORD],
                        record_type, _calls_read, False, task_id, True)
                    if None in got:
                        for r, hit in zip(sel, got):
                            if hit is None:
                                declined.append(base | r)
                            else:
                                keyed.append(hit)
                    else:
                        keyed += cast("list[tuple[tuple, Any]]", got)
        return keyed, declined

    def id_locs(self, msg_id: str) -> list[int]:
        """The locations (:func:`cool_loc`) of the archived rows whose id
        hashes like ``msg_id`` (usually none or one; :meth:`rows_at` reads them)."""
        with self._lock:
            return list(self._id_locs(msg_id))

    def kept_record(self, msg_id: str, cache: Any, lines: Any = None) -> Any:
        """The record of ``msg_id``'s archived row that ``cache`` (the
        repository's verified cool records: cool_loc -> (record, ord))
        holds, when an earlier :meth:`id_locs` of it found the row
        (``IdRuns.kept``: one compiled call, no run searched); the row's
        line as it is from a cache of lines (bytes: the caller decodes and
        checks it), or from ``lines`` where ``cache`` holds nothing for it;
        else None."""
        with self._lock:
            return self._ids.kept(msg_id, cache, lines)

    def _by_file(self, locs: Sequence[int]) -> dict[int, list[int]]:
        """The rows of ``locs`` (:func:`cool_loc`) by live file number, each
        file's ascending without repeats (lock held; a task's hundreds of
        locations in a few numpy steps, not a Python step each); a file
        that is not live is CorruptStateCheckpointError."""
        files = self._files
        if len(locs) == 1:      # an exact read: nothing to group
            by_file = {locs[0] >> 32: [locs[0] & 0xFFFFFFFF]}
        elif len(locs) < 16:
            small: dict[int, set[int]] = {}
            for loc in locs:
                small.setdefault(loc >> 32, set()).add(loc & 0xFFFFFFFF)
            by_file = {no: sorted(rows) for no, rows in small.items()}
        else:
            arr = unique(np.asarray(locs, dtype=np.int64))      # (sorted: by file, then row)
            nos = arr >> 32
            cuts = np.flatnonzero(nos[1:] != nos[:-1]) + 1
            by_file = {int(part[0] >> 32): (part & 0xFFFFFFFF).tolist() for part in np.split(arr, cuts)}
        for no in by_file:
            if no not in files:
                raise CorruptStateCheckpointError(f"cool file number {no} is not live", path=self._dir)
        return by_file

    def rows_at(self, locs: Sequence[int]) -> list[CoolRow]:
        """The verified rows at ``locs`` (from :meth:`task_locs` or
        :meth:`id_locs`), in their order. Damage raises
        CorruptStateCheckpointError (file and row)."""
        with self._lock:
            by_file = self._by_file(locs)
            got: dict[int, CoolRow] = {}
            for no, rows in by_file.items():
                for r, row in zip(rows, self._rows(no, 0, 0, rows)):
                    got[cool_loc(no, r)] = row
            return [got[loc] for loc in locs]

    def pin_live(self, skip: Callable[[int], bool] | None = None) -> list[int]:
        """Pin every live file (but those ``skip(no)``) and return their
        numbers, oldest first. A pinned file stays live and readable until
        :meth:`unpin`: an erasure or a merge that would replace it waits
        (``_switch``), automatic compactions leave it (:meth:`pinned`). An
        export chooses its files under the repository's lock and reads them
        after without it: the archive as it was at that moment."""
        with self._lock:
            nos = [no for no in sorted(self._files) if skip is None or not skip(no)]
            for no in nos:
                self._pin(no)
            return nos

    def unpin(self, no: int) -> None:
        """End a :meth:`pin_live` pin of file ``no``."""
        self._unpin(no)

    def file_locs(self, no: int, part: int) -> Iterator[list[int]]:
        """The locations (:func:`cool_loc`) of every row of live file
        ``no``, at most ``part`` at a time (an export's read of its rows:
        :meth:`records_at` of each part)."""
        with self._lock:
            rows = self._files[no].rows
        base = no << 32
        for a in range(0, rows, part):
            yield list(range(base | a, base | min(rows, a + part)))

    def locked(self) -> ContextManager[Any]:
        """The archive's lock: while it is held no file leaves the set and
        :meth:`close` does not release the readers."""
        return self._lock

    def records_at(self, locs: Sequence[int], record_type: type) -> list[tuple[Any, int] | None]:
        """``(record, ord)`` of the rows at ``locs`` (:func:`cool_loc`), in
        their order, read straight from the pages holding them: for each row
        group they touch, each page once (``PageReader.take``), only their
        values decoded; each row's digest checked against its canonical JSON
        rebuilt from the stored bytes, its record (``record_type``) built in
        compiled code (``_pages.records_from_columns``). None for a row that
        path declines (extra fields, an unusual spelling, damage, a file in
        another layout): the caller reads those with :meth:`rows_at`, which
        names any damage, and the rows of a group the row-group cache holds
        whole (a search read it), which it reads from there. The cache is not
        filled here: a task of hundreds of rows costs one pass over the
        pages of each file holding them, not a group decoded per row."""
        with self._lock:
            got: dict[int, tuple[Any, int]] = {}
            by_file = self._by_file(locs)
            for no, rows in by_file.items():
                self._records_of(no, rows, record_type, got)
            return [got.get(loc) for loc in locs]

    def id_records_at(self, msg_id: str, locs: Sequence[int], record_type: type) -> list[tuple[Any, int] | None]:
        """:meth:`records_at` of the rows at ``locs`` (:meth:`id_locs` of
        ``msg_id``), their ``msg_id`` column not read: each row's digest is
        checked over its record holding ``msg_id``, and it covers the id,
        so a row that passes is ``msg_id``'s (one page of ~4 KB less to read,
        check and decompress: ~10% of an exact read). A row of another id
        whose hash is the same fails its digest here: None, and the caller's
        :meth:`rows_at` reads it whole (and names damage)."""
        mid = msg_id.encode("utf-8")
        ids = (mid, np.array([0, len(mid)], dtype=np.int32))
        with self._lock:
            got: dict[int, tuple[Any, int]] = {}
            for no, rows in self._by_file(locs).items():
                self._records_of(no, rows, record_type, got, ids)
            return [got.get(loc) for loc in locs]

    def _records_of(self, no: int, rows: list[int], record_type: type, got: dict, ids: Any = None) -> None:
        """:meth:`records_at` of the rows (ascending) of file ``no`` into
        ``got``; ``ids``: the msg_id column's values of each row, given
        (:meth:`id_records_at`: one row's, repeated), not read."""
        for rg, sel, local in self._by_group(no, rows):
            g = self._cache.get((no, rg))
            if g is not None and g.acc is not None:
                continue        # a group cached whole (a search read it): rows_at reads it from there
            try:
                if ids is None:
                    cols = self._with_reader(no, lambda reader: reader.take(rg, local))
                elif len(local) == 1:
                    cols = self._with_reader(no, lambda reader: reader.take(rg, local, _NOT_ID))
                    if cols is not None:
                        cols.insert(0, ids)
                else:
                    continue    # (several rows of one group under one id's hash: rows_at)
            except PageError:
                cols = None     # damage: rows_at reads the group through pyarrow and names it
            if cols is not None:
                recs = records_from_columns([cols[c] for c in _STRING_COLS], cols[_TS], cols[_TOK],
                                            cols[_SV], cols[_ORD], record_type, _calls_read)
                for r, hit in zip(sel, recs):
                    if hit is not None:
                        got[cool_loc(no, r)] = hit

    def loc_path(self, loc: int) -> str:
        """The path of the file holding location ``loc`` (for errors)."""
        with self._lock:
            fi = self._files.get(loc >> 32)
            return self._path(fi.name) if fi is not None else self._dir
