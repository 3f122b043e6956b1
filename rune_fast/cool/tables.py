"""Conversions between record dicts, hot lines and Arrow tables of the cool
schema, and the orders rows are kept in.
"""
from __future__ import annotations

import heapq
import queue
import threading
from typing import Any, Callable, cast

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from .._arrays import unique
from .. import _encode
from ..records import json_safe as _json_safe
from .schema import (
    COOL_SCHEMA, CoolRow, RECORD_FIELDS, _COLS, _COL_TYPES, _FIELD_SET, _INT64, _digest_checked,
    _dumps, _row_key,
)


# --------------------------------------------------------------------------- #
# Conversions between record dicts and Arrow
# --------------------------------------------------------------------------- #

def _table_from_records(rows: list[dict], ords: list[int], digests: list[str]) -> pa.Table:
    """The cool-schema table of record dicts. A ``token_estimate`` past int64
    (a record may hold any non-negative int) is kept in ``extra``, which
    readers lay over the columns; its column holds -1 then."""
    cols: dict[str, list] = {}
    for k in ("msg_id", "channel_id", "task_id", "hlc", "content", "ts", "role",
              "tool_call_id", "origin", "schema_version"):
        cols[k] = [d[k] for d in rows]
    cols["token_estimate"] = [d["token_estimate"] if d["token_estimate"] <= _INT64[1] else -1 for d in rows]
    cols["tool_calls"] = [_dumps(list(d["tool_calls"])) if d["tool_calls"] else "[]" for d in rows]
    n_fields = len(RECORD_FIELDS)
    cols["extra"] = ["{}" if len(d) == n_fields and d["token_estimate"] <= _INT64[1] else
                     _dumps({k: v for k, v in d.items()
                             if k not in _FIELD_SET or (k == "token_estimate" and v > _INT64[1])})
                     for d in rows]
    cols["ord"] = list(ords)
    cols["digest"] = list(digests)
    return pa.Table.from_pydict({name: cols[name] for name in _COLS}, schema=COOL_SCHEMA)


def _widened(span: tuple[str, str] | None | bool,
             id_range: tuple[str, str] | None) -> tuple[str, str] | None | bool:
    """CoolArchive._id_span's cached answer once a file with ``id_range``
    is added: the known span widened by it, else not known (False: worked
    out again at the next call)."""
    if span is None or span is False or id_range is None:
        return False
    lo, hi = cast("tuple[str, str]", span)
    return (min(lo, id_range[0]), max(hi, id_range[1]))


def _channel_order(table: pa.Table) -> pa.Array:
    """The row order of a cool file (docs/FORMAT.md): grouped by channel,
    each channel's rows clustered by task (no task first), each task's
    rows in their given order (a stable sort: names compare as UTF-8
    bytes, i.e. by code point, as Python compares them). Clustered, a
    task's rows of one file lie together and share their pages: a task
    read decompresses about a quarter of the pages it did with a
    channel's tasks interleaved (measured on the 1,000,000-message bench
    store)."""
    # (each name as its rank among the table's distinct names: a stable
    # sort of two integer columns, not of strings row by row)
    return pa.array(np.lexsort((_ranks(table.column("task_id")), _ranks(table.column("channel_id")))))


def _ranks(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each value's rank among the column's distinct values (code point order)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    enc = pc.dictionary_encode(col)
    d = enc.dictionary
    rank = np.empty(len(d), dtype=np.int64)
    rank[np.asarray(pc.sort_indices(d))] = np.arange(len(d), dtype=np.int64)
    return rank[np.asarray(enc.indices)]


class _RowTaker:
    """Rows of a table taken by index, a few at a time, without the copy of
    the whole table that Arrow's ``take`` makes of a chunked string column
    (it concatenates the chunks first): the rows are taken from each chunk
    they lie in, then put in the asked order (copies of the rows asked for
    only)."""

    def __init__(self, table: pa.Table) -> None:
        self._batches = [b for b in table.to_batches() if b.num_rows]
        self._schema = table.schema
        self._starts = np.cumsum([0] + [b.num_rows for b in self._batches], dtype=np.int64)

    def take(self, idx: np.ndarray) -> pa.Table:
        """The rows at ``idx`` (int64 indices into the table), in that order."""
        idx = np.asarray(idx, dtype=np.int64)
        which = np.searchsorted(self._starts, idx, side="right") - 1
        if len(idx) and which[0] == which[-1] and (which == which[0]).all():
            b = int(which[0])
            return pa.Table.from_batches([self._batches[b].take(pa.array(idx - self._starts[b]))],
                                         schema=self._schema)
        by_chunk = np.argsort(which, kind="stable")
        pieces = []
        for b in unique(which).tolist():
            sel = idx[by_chunk[which[by_chunk] == b]]
            pieces.append(self._batches[b].take(pa.array(sel - self._starts[b])))
        got = pa.Table.from_batches(pieces, schema=self._schema).combine_chunks()
        # piece order is idx sorted by chunk (stably): put it back
        back = np.empty(len(idx), dtype=np.int64)
        back[by_chunk] = np.arange(len(idx), dtype=np.int64)
        return got.take(pa.array(back))




def _calls_texts(raw: bytes) -> tuple[bytes, bytes] | None:
    """The ``tool_calls`` column text and canonical JSON of a line's raw
    tool-call list, for the compiled reader: what the dict path makes of it
    when orjson reads and writes the value exactly as json does (no float
    with an exponent); else None. The reader hands over no value holding a
    run of 19 digits (a number that may pass 64 bits, which orjson reads as
    a float)."""
    try:
        v = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(v) is not list or not _json_safe(v):
        return None
    try:
        return orjson.dumps(v), orjson.dumps(v, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:      # nested deeper than orjson writes: the dict path
        return None


def table_from_lines(data: bytes, starts: np.ndarray,
                     fallback: Callable[[int], tuple[dict, int | None]]) -> pa.Table:
    """The cool-schema table of verified hot message lines, row i from line
    i: ``data`` holds the lines one after the other, each followed by its
    newline, line i starting at ``starts[i]`` (``HotIndex.gather_lines``).

    The compiled reader (``csrc/_encode.pyx``: ``cool_columns``) takes every
    line spelled as the encoder spells records, straight into Arrow buffers
    with its digest (tool calls through :func:`_calls_texts`); ``fallback(i)`` gives the record dict
    and append ordinal of every other line, which take the dict path
    (:func:`_table_from_records`). The values' UTF-8 is checked by Arrow's
    validation; a batch that fails it goes the dict path whole (which names
    the line)."""
    n_lines = len(starts)
    taken, cols = _encode.cool_columns(data, starts, _calls_texts)
    table = None
    if taken:
        n = len(taken)
        arrays = []
        for name, typ in _COL_TYPES:
            v = cols[name]
            bufs = [None, pa.py_buffer(v[0]), pa.py_buffer(v[1])] if type(v) is tuple \
                else [None, pa.py_buffer(v)]
            arrays.append(pa.Array.from_buffers(typ, n, bufs))
        table = pa.Table.from_arrays(arrays, schema=COOL_SCHEMA)
        try:
            table.validate(full=True)
        except pa.ArrowInvalid:
            table, taken = None, []
    if len(taken) == n_lines:
        return table
    got = set(taken)
    rest = [i for i in range(n_lines) if i not in got]
    rows, ords = [], []
    for i in rest:
        d, seq = fallback(i)
        rows.append(d)
        ords.append(seq if seq is not None else -1)
    digests = [_digest_checked(d, i) for i, d in zip(rest, rows)]
    slow = _table_from_records(rows, ords, digests)
    if table is None:
        return slow
    # back into line order
    where = np.argsort(np.array(taken + rest, dtype=np.int64), kind="stable")
    return pa.concat_tables([table, slow]).take(pa.array(where))


def _merge(parts: list[list[CoolRow]]) -> list[CoolRow]:
    parts = [p for p in parts if p]
    if not parts:
        return []
    if len(parts) == 1:
        return parts[0]
    return list(heapq.merge(*parts, key=_row_key))


def _is_identity(order: pa.Array) -> bool:
    """Whether ``order`` (sort indices) leaves every row where it is."""
    return bool(np.array_equal(np.asarray(order), np.arange(len(order))))


def _merge_order(table: pa.Table, by_task: bool = True) -> pa.Array:
    """Row order of a merged file: channel, then task (no task first), then
    the order key (:func:`_channel_order`'s clustering; Arrow sorts strings
    by their UTF-8 bytes: code point order, Python's str order).
    ``by_task=False``: channel, then the order key (the older layout)."""
    stamped = pc.not_equal(table.column("hlc"), "")
    ord_key = pc.if_else(stamped, 0, table.column("ord"))
    cols = {"c": table.column("channel_id")}
    if by_task:
        cols["t"] = table.column("task_id")
    cols.update({"s": stamped, "o": ord_key, "h": table.column("hlc"), "m": table.column("msg_id")})
    return pc.sort_indices(pa.table(cols), sort_keys=[(k, "ascending") for k in cols])


class _GroupWriter:
    """A ``pq.ParquetWriter`` whose ``write_table`` calls run on a thread of
    their own, in order, while the caller makes the next row groups:
    pyarrow encodes and compresses a row group without the GIL, so a
    foreground cooling run (parsing lines) keeps both cores busy. At most
    ``depth`` calls' rows (a part's whole row groups each) wait for the
    thread. ``each(table)``, if given, is
    called with the rows of each call, in order, on a third thread (the file's
    search filters: ``GramSink.add`` folds the content without the GIL
    too; on the writer's thread it made that thread the longer of the two,
    while the caller waited for it). The first error of either thread is
    raised by the next ``write_table`` or by ``close``, which always stops
    the threads and closes the writer."""

    def __init__(self, writer: Any, depth: int = 2,
                 each: Callable[[pa.Table], None] | None = None) -> None:
        self._w = writer
        self._each = each
        self.schema = writer.schema
        self._error: BaseException | None = None
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, args=(self._q, self._write),
                                        name="rune-fast-parquet", daemon=True)
        self._each_q: queue.Queue | None = None
        self._each_thread: threading.Thread | None = None
        if each is not None:
            self._each_q = queue.Queue(maxsize=depth)
            self._each_thread = threading.Thread(target=self._run, args=(self._each_q, each),
                                                 name="rune-fast-filters", daemon=True)
            self._each_thread.start()
        self._thread.start()

    def _write(self, job: tuple[pa.Table, int]) -> None:
        self._w.write_table(job[0], row_group_size=job[1])

    def _run(self, q: queue.Queue, work: Callable[[Any], None]) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            if self._error is None:
                try:
                    work(job)
                except BaseException as exc:    # raised on the caller's thread
                    if self._error is None:
                        self._error = exc

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def write_table(self, table: pa.Table, row_group_size: int) -> None:
        self._raise()
        if self._each_q is not None:
            self._each_q.put(table)
        self._q.put((table, row_group_size))

    def close(self) -> None:
        self._q.put(None)
        if self._each_q is not None:
            self._each_q.put(None)
        self._thread.join()
        if self._each_thread is not None:
            self._each_thread.join()
        try:
            self._raise()
        finally:
            self._w.close()
