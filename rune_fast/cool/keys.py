"""What a cool archive reads of its rows' order keys and stamps, from
those columns' pages alone (no content page read, the values not
checked against the rows' digests: the rows then chosen are read whole
and checked): a window's newest rows, a transcript's stamps and
fold-order verdict, an export's newest stamp of each file, a channel's
newest task.
"""
from __future__ import annotations

import bisect
import operator
from typing import Any, Container, Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._arrays import unique
from .._order import order_key
from ..errors import CorruptStateCheckpointError
from ..pages import PageError
from .cache import _RowCache
from .rows import _TASK_LOCS_KEPT
from .schema import CoolRow, _COLS, _row_key

_first = operator.itemgetter(0)

#: the columns of the order key (rune_fast._order): hlc, msg_id, ord
_KEY_COLS = [_COLS.index(c) for c in ("hlc", "msg_id", "ord")]
#: the columns of a transcript's stamps (:meth:`_Keys.channel_stamps`)
_STAMP_COLS = [_COLS.index(c) for c in ("msg_id", "hlc", "origin", "role", "ts", "ord")]
#: the columns of :meth:`_Keys.channel_ids`
_ID_COLS = [_COLS.index(c) for c in ("msg_id", "channel_id")]
#: row groups a :meth:`_Keys.stamp_columns` reads under one hold of the lock
_STAMP_GROUPS = 64


class StampArrays(NamedTuple):
    """The columns of :meth:`_Keys.channel_stamps` as arrays: each row's
    location (int64), ``msg_id``, ``hlc``, ``origin`` and ``role`` (Arrow
    strings), ``ts`` (float64) and ``ord`` (int64)."""
    locs: np.ndarray
    mid: pa.Array
    hlc: pa.Array
    origin: pa.Array
    role: pa.Array
    ts: np.ndarray
    ord: np.ndarray


class _Keys(_RowCache):
    """Order keys and stamps of archived rows (the layer above the row
    cache, below the queries)."""

    def _task_runs(self, no: int, channel_id: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(lock held) The layout of the channel's rows in file ``no``
        (docs/FORMAT.md, "Order within a channel"): when each task of the
        channel (no task counting as one) lies in one run of rows, ``(end
        of each run, whether the run's rows have a task)``, the runs in
        file order, each in key order; else None: the rows are in key order
        (a file of the older layout, whose tasks interleave). A range that
        is both (one task after another) is treated as runs: right either
        way. Worked out from the sidecar's task rows once a file (a numpy
        pass over its rows; files never change) and kept per channel:
        a few runs a task, or None."""
        kept = self._task_runs_d
        per = kept.get(no)
        if per is None:
            for stale in [n for n in kept if n not in self._files]:
                del kept[stale]
            per = kept[no] = self._runs_of(no)
        return per.get(channel_id)

    def _runs_of(self, no: int) -> dict[str, tuple[np.ndarray, np.ndarray] | None]:
        """:meth:`_task_runs` of every channel of file ``no``."""
        fi = self._files[no]
        codes = np.full(fi.rows, -1, dtype=np.int32)
        for k, rows in enumerate(fi.tasks.values()):
            codes[rows] = k
        out: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
        for ch, (s, e, _lt) in fi.channels.items():
            seg = codes[s:e]
            if not len(seg):
                out[ch] = None
                continue
            cuts = np.flatnonzero(seg[1:] != seg[:-1]) + 1
            run_codes = seg[np.concatenate([[0], cuts])]
            if len(unique(run_codes)) != len(run_codes):
                out[ch] = None      # a task's rows apart: key order
                continue
            out[ch] = (np.append(cuts + s, e).astype(np.int64), run_codes >= 0)
        return out

    def _tail_rows(self, channel_id: str, n: int) -> list[tuple[int, list[int]]]:
        """(lock held) ``(file, rows ascending)`` among which the channel's
        newest ``n`` archived messages are. Each file's range is one run in
        key order, or (clustered by task) one run a task, each in key order
        (:meth:`_task_runs`): the newest ``n`` lie in the last ``n`` rows of
        the ``n`` runs whose last rows are newest (a run whose last row has
        ``n`` newer last rows ahead of it holds none of them). With more
        than ``n`` runs, the key of each run's last row is read to choose
        them (one key a run, not ``n``)."""
        runs: list[tuple[int, int, int]] = []       # (file, start, end)
        for no in self._channels.get(channel_id, ()):
            s, e, _ = self._files[no].channels[channel_id]
            parts = self._task_runs(no, channel_id)
            ends = [e] if parts is None else parts[0].tolist()
            runs += zip([no] * len(ends), [s] + ends[:-1], ends)
        if len(runs) > n:
            by_file: dict[int, list[int]] = {}
            for no, _a, b in runs:
                by_file.setdefault(no, []).append(b - 1)
            newest = {loc: k for no, lasts in by_file.items() for k, loc in self._keys_of(no, lasts)}
            runs = sorted(runs, key=lambda r: newest[(r[0] << 32) | (r[2] - 1)])[-n:]
        out: dict[int, list[int]] = {}
        for no, a, b in runs:
            out.setdefault(no, []).extend(range(max(a, b - n), b))
        return [(no, sorted(rows)) for no, rows in out.items()]

    def _by_group(self, no: int, rows: list[int]) -> Iterator[tuple[int, list[int], list[int]]]:
        """The rows (ascending) of file ``no`` split by row group: (group,
        the rows, their places in the group); a row past the file is
        CorruptStateCheckpointError naming it."""
        fi = self._files[no]
        starts = fi.rg_list
        k, n = 0, len(rows)
        while k < n:
            rg = bisect.bisect_right(starts, rows[k]) - 1
            end = starts[rg + 1] if rg + 1 < len(starts) else fi.rows
            j = bisect.bisect_left(rows, end, k)
            if rg < 0 or j == k:
                raise CorruptStateCheckpointError(f"cool index points past the file at row {rows[k]}",
                                                  path=self._path(fi.name), offset=rows[k])
            sel = rows[k:j]
            yield rg, sel, [r - starts[rg] for r in sel]
            k = j

    def channel_tail_locs(self, channel_id: str, n: int) -> list[int]:
        """The locations (:func:`cool_loc`) of the channel's newest ``n``
        archived messages, oldest first. With the channel in several files,
        or clustered by task in one, only the order-key columns (hlc,
        msg_id, ord) of the candidates :meth:`_tail_rows` names are read to
        choose them: the caller reads the
        records of just these (and checks their channel; the digest covers
        hlc and msg_id, the page checksums ord)."""
        if n <= 0:
            return []
        with self._lock:
            nos = self._channels.get(channel_id, ())
            if len(nos) == 1:
                runs = self._task_runs(nos[0], channel_id)
                if runs is None or len(runs[0]) == 1:       # (one run in key order)
                    s, e, _ = self._files[nos[0]].channels[channel_id]
                    return [(nos[0] << 32) | r for r in range(max(s, e - n), e)]
            kept = self._tail_locs_d.get((channel_id, n)) if not self._unloaded else None
            if kept is not None:
                return list(kept)
            cands = self._tail_rows(channel_id, n)
            out = self._newest_of(cands, n)
            if out is None:
                keyed: list[tuple[tuple, int]] = []
                for no, rows in cands:
                    keyed += self._keys_of(no, rows)
                keyed.sort(key=_first)
                out = [loc for _k, loc in keyed[-n:]]
            if len(self._tail_locs_d) >= _TASK_LOCS_KEPT:
                self._tail_locs_d.clear()
            self._tail_locs_d[(channel_id, n)] = out
            return list(out)

    def _newest_of(self, parts: list[tuple[int, list[int]]], n: int) -> list[int] | None:
        """(lock held) The locations of the newest ``n`` of the rows
        ``parts`` by order key, oldest first, as a stable sort of their
        (order key, location) in that order would give them, from their
        key columns as arrays: the unstamped by ``ord``, then the stamped
        by ``(hlc, msg_id)`` (UTF-8 bytes compare as str's code points).
        A window reaching back through many task runs keys thousands of
        candidate rows (a window of 1,000 of the 1,000,000-message bench
        store's busiest channel: ~60,000): ~90 ms as tuples. None if the
        columns cannot be read so (:meth:`_keys_of` then names the damage)."""
        got = self._column_arrays(parts, _KEY_COLS, 2)
        if got is None:
            return None
        locs, (hlc, mid), (raw,) = got
        ords = np.frombuffer(raw, dtype=np.int64)
        stamped = pc.greater(pc.binary_length(hlc), 0).to_numpy(zero_copy_only=False)
        plain = np.flatnonzero(~stamped)
        order = [plain[np.argsort(ords[plain], kind="stable")]]
        if stamped.any():
            at = np.flatnonzero(stamped)
            keys = pa.table({"h": hlc.take(at), "m": mid.take(at)})
            order.append(at[pc.sort_indices(keys, sort_keys=[("h", "ascending"), ("m", "ascending")])
                            .to_numpy()])
        return locs[np.concatenate(order)[-n:]].tolist()

    def _keys_of(self, no: int, rows: list[int]) -> list[tuple[tuple, int]]:
        """(order key, location) of the rows (ascending) of file ``no``,
        from their key columns' pages; the rows of a group the page reader
        does not take are read whole (which names any damage)."""
        out: list[tuple[tuple, int]] = []
        for rg, sel, local in self._by_group(no, rows):
            try:
                cols = self._with_reader(no, lambda reader: reader.take(rg, local, _KEY_COLS))
                if cols is not None:
                    (hd, ho), (md, mo), ords = cols
                    hlcs = [hd[ho[i]:ho[i + 1]].decode("utf-8") for i in range(len(sel))]
                    mids = [md[mo[i]:mo[i + 1]].decode("utf-8") for i in range(len(sel))]
                    out += [(order_key(h, m, o), (no << 32) | r) for h, m, o, r in
                            zip(hlcs, mids, np.frombuffer(ords, dtype=np.int64).tolist(), sel)]
            except (PageError, UnicodeDecodeError):
                cols = None     # damage: read below, which names it
            if cols is None:
                out += [(_row_key(row), (no << 32) | row.row) for row in self._rows(no, 0, 0, sel)]
        return out

    def channel_stamps(self, channel_id: str, files: Container[int] | None = None,
                       ) -> list[tuple[int, str, str, str, str, float, int]]:
        """``(location, msg_id, hlc, origin, role, ts, ord)`` of every archived
        message of the channel (in the live files ``files`` only, if
        given), from those columns' pages alone (the
        content's pages, most of a row, are not read): what picks a
        transcript's newest turns by their stamps, whose records are then
        read verified. Like :meth:`channel_tail_locs`' order keys, the
        values are not checked against the row's digest here; a row of a
        group the page reader does not take is read whole (which names
        any damage)."""
        out: list[tuple[int, str, str, str, str, float, int]] = []
        with self._lock:
            for no in self._channels.get(channel_id, ()):
                if files is not None and no not in files:
                    continue
                s, e, _ = self._files[no].channels[channel_id]
                for rg, sel, local in self._by_group(no, list(range(s, e))):
                    try:
                        cols = self._with_reader(no, lambda reader: reader.take(rg, local, _STAMP_COLS))
                        if cols is not None:
                            texts = [[d[o[i]:o[i + 1]].decode("utf-8") for i in range(len(sel))]
                                     for d, o in cols[:4]]
                            tss = np.frombuffer(cols[4], dtype=np.float64).tolist()
                            ords = np.frombuffer(cols[5], dtype=np.int64).tolist()
                            out += [((no << 32) | r, m, h, g, ro, t, o)
                                    for r, m, h, g, ro, t, o in zip(sel, *texts, tss, ords)]
                    except (PageError, UnicodeDecodeError):
                        cols = None     # damage: read below, which names it
                    if cols is None:
                        for row in self._rows(no, 0, 0, sel):
                            d = row.record
                            out.append(((no << 32) | row.row, d["msg_id"], d["hlc"], d["origin"], d["role"],
                                        d["ts"], row.ord))
        return out

    def channel_stamp_arrays(self, channel_id: str, files: Container[int] | None = None,
                             ) -> StampArrays | None:
        """What :meth:`channel_stamps` gives, as arrays (the same rows in
        the same order, no Python object a row): what a channel's
        fold-order verdict and newest stamps are worked out from in
        compiled steps. None if a group cannot be read so (damage, another
        layout, a value that is no UTF-8): the caller then takes
        :meth:`channel_stamps`, whose reads name any damage."""
        with self._lock:
            parts = [(no, list(range(*self._files[no].channels[channel_id][:2])))
                     for no in self._channels.get(channel_id, ()) if files is None or no in files]
            got = self._column_arrays(parts, _STAMP_COLS, 4)
        if got is None:
            return None
        locs, (mid, hlc, origin, role), (ts, ords) = got
        return StampArrays(locs, mid, hlc, origin, role, np.frombuffer(ts, dtype=np.float64),
                           np.frombuffer(ords, dtype=np.int64))

    def channel_ids(self, channel_id: str) -> list[str] | None:
        """The msg_id of every archived row of the channel (deleted ones
        too), from the msg_id and channel_id columns' pages alone (each
        CRC checked; the rows' other columns are neither read nor checked
        against their digests): what ``clear_channel`` deletes. None if a
        group cannot be read so, or a row is not of the channel: the
        caller then reads the records, which names the damage."""
        with self._lock:
            parts = [(no, list(range(*self._files[no].channels[channel_id][:2])))
                     for no in self._channels.get(channel_id, ())]
            got = self._column_arrays(parts, _ID_COLS, 2)
        if got is None:
            return None
        _locs, (mid, channel), _ = got
        if len(channel) and not pc.all(pc.equal(channel, pa.scalar(channel_id, pa.string()))).as_py():
            return None
        return mid.to_pylist()

    def _column_arrays(self, parts: list[tuple[int, list[int]]], cols: list[int], strings: int,
                       ) -> tuple[np.ndarray, list[pa.Array], list[bytes]] | None:
        """(lock held) The columns ``cols`` of the rows ``parts`` (``(file,
        rows ascending)``), in that order, from their pages (each CRC
        checked): their locations, the first ``strings`` columns as Arrow
        strings (checked to be UTF-8), the others' little-endian bytes.
        None if a group cannot be read so (the caller's other path names
        the damage)."""
        locs: list[np.ndarray] = []
        strs: list[list[pa.Array]] = [[] for _ in range(strings)]
        nums: list[list[bytes]] = [[] for _ in range(len(cols) - strings)]
        for no, rows in parts:
            for rg, sel, local in self._by_group(no, rows):
                try:
                    got = self._with_reader(no, lambda reader: reader.take(rg, local, cols))
                    if got is None:
                        return None
                    for out, (data, offs) in zip(strs, got[:strings]):
                        a = pa.Array.from_buffers(pa.string(), len(sel),
                                                  [None, pa.py_buffer(offs), pa.py_buffer(data)])
                        a.validate(full=True)       # (offsets and UTF-8)
                        out.append(a)
                except (PageError, pa.ArrowInvalid):
                    return None
                for out_b, raw in zip(nums, got[strings:]):
                    out_b.append(raw)
                locs.append(np.array(sel, dtype=np.int64) | (no << 32))
        if not locs:
            return np.zeros(0, np.int64), [pa.array([], pa.string())] * strings, [b""] * len(nums)
        return (np.concatenate(locs), [pa.concat_arrays(a) for a in strs],
                [b"".join(b) for b in nums])

    def stamp_columns(self, no: int) -> tuple[pa.Array, np.ndarray, pa.Array] | None:
        """The ``hlc``, ``ts`` and ``origin`` columns of every row of live
        file ``no`` (deleted ones too), through its PageReader (each page's
        CRC checked), ``_STAMP_GROUPS`` row groups at a time under the
        archive's lock: whether the file holds a stamp newer than an export's
        ``since``, without its records. None if a group cannot be read so
        (damage, a layout the reader does not take, the file gone): the
        caller reads the records, which names any damage."""
        names = ["hlc", "ts", "origin"]
        got: list[list[Any]] = [[], [], []]
        with self._lock:
            fi = self._files.get(no)
            if fi is None:
                return None
            starts = fi.rg_list
        for a in range(0, len(starts) - 1, _STAMP_GROUPS):
            with self._lock:
                if no not in self._files:
                    return None
                for rg in range(a, min(len(starts) - 1, a + _STAMP_GROUPS)):
                    t = self._page_columns(no, rg, names)
                    if t is None or t.num_rows != starts[rg + 1] - starts[rg]:
                        return None
                    for out, col in zip(got, t.columns):
                        out += col.chunks
        if not got[0]:
            return None         # (no rows: nothing to say)
        hlc, ts, origin = (pa.concat_arrays(a) for a in got)
        return hlc, np.asarray(ts, dtype=np.float64), origin

    def latest_task_row(self, channel_id: str) -> CoolRow | None:
        """The newest archived message of the channel that has a task, or
        None. Public API: the repository does not call it.

        The candidates are each file's newest row with a task (key order)
        or each task run's last row (clustered by task): their order-key
        columns alone choose the newest (as :meth:`channel_tail_locs`
        does: the digest covers hlc and msg_id, the page checksums ord),
        and that row alone is read whole and checked."""
        with self._lock:
            keyed: list[tuple[tuple, int]] = []
            for no in self._channels.get(channel_id, ()):
                s, e, lt = self._files[no].channels[channel_id]
                runs = self._task_runs(no, channel_id)
                # key order: the sidecar's newest row with a task; clustered
                # by task: the newest of each task's last row
                last = [lt] if runs is None else (runs[0][runs[1]] - 1).tolist()
                rows = sorted(x for x in last if x >= 0)
                if rows:
                    keyed += self._keys_of(no, rows)
            if not keyed:
                return None
            key, loc = max(keyed, key=_first)
            no, row = loc >> 32, loc & 0xFFFFFFFF
            r = self._row(no, row)
            if r.record["channel_id"] != channel_id or r.record["task_id"] == "" or _row_key(r) != key:
                raise CorruptStateCheckpointError(
                    f"cool index says row {row} is a task message of channel {channel_id!r}",
                    path=self._path(r.file), offset=row)
            return r

    def latest_task(self, channel_id: str) -> str | None:
        """task_id of the newest archived message of the channel that has
        one. Public API: the repository does not call it."""
        r = self.latest_task_row(channel_id)
        return None if r is None else r.record["task_id"]
