"""Archived records built in compiled code from columns already gathered:
a search's hits, where the scan found them (see ``_Search.search_records``:
what the scan threads run for each row group, and what the search hands
back), and the rows of a table a check reads whole (:func:`check_table`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, cast

import numpy as np
import pyarrow as pa

from .._pages import records_from_columns
from ..errors import CorruptStateCheckpointError
from ..pages import PageError
from ..records import ConversationMessageRecord, fast_canonical_json
from .rows import _ORD, _STRING_COLS, _SV, _TOK, _TS, _assemble_at, _calls_read, _row_digest, _table_group
from .schema import CoolRow, _COLS, _CONTENT_COL, string_buffers


#: the search modes (see _Search._search_hits) whose hits are all exact
#: matches ("ci-run" and "ci-nonascii" name candidates, which the caller checks)
_EXACT_MODES = frozenset({"all", "cs", "ci", "ci-anchor"})
#: every column but content, in schema order (what a scan reads of its hits)
_OTHER_COLS = [c for c in range(len(_COLS)) if c != _CONTENT_COL]


class CoolHits:
    """What :meth:`_Search.search_records` found: the hits built from their
    pages (digests checked), in the order of the files' rows, as three
    lists, ``locs`` (:func:`cool_loc`), ``records`` and ``ords`` (no tuple
    a hit); ``rows``, the hits read as CoolRows (sorted by the order key);
    ``named``, the locations of the hits the caller said it holds;
    ``exact``: whether every hit is a match (else each is a candidate the
    caller checks)."""

    __slots__ = ("locs", "records", "ords", "rows", "named", "exact")

    def __init__(self) -> None:
        self.locs: list[int] = []
        self.records: list[Any] = []
        self.ords: list[int] = []
        self.rows: list[CoolRow] = []
        self.named: list[int] = []
        self.exact = False


def _hit_records(reader: Any, rg: int, local: list[int], contents: list[bytes],
                 record_type: type) -> tuple[list, list[int]]:
    """The records (None: a row left to the caller) and ords of the rows
    ``local`` (ascending) of row group ``rg``, whose content values a scan
    matched in their pages (``contents``, CRC-checked bytes): the other
    columns of just those rows read from their pages (each page once), the
    records built and their digests checked in compiled code
    (``records_from_columns``). PageError where the pages or values do not
    hold together (the caller's read names the damage). Runs on a scan
    thread or on the search's own (a group FewGroups reads alone): touches
    nothing of the archive but the file's reader."""
    return _records(reader.path, f"row group {rg}", reader.take(rg, local, _OTHER_COLS), contents, record_type)


def _window_records(reader: Any, groups: list[tuple[int, list[int], list[bytes]]], taken: list[Any],
                    record_type: type) -> list[tuple[list, list[int]]]:
    """:func:`_hit_records` of several groups at once (``(rg, local,
    contents)`` each) whose other columns ``PageReader.take_many`` read
    together (``taken``: their rows one group after another): one compiled
    build for all of them (~12 us a call saved a group), split back by
    group. PageError if they do not hold together (each group's own read
    then names where)."""
    got = _records(reader.path, f"row groups {groups[0][0]}-{groups[-1][0]}", taken,
                   [c for _rg, _local, contents in groups for c in contents], record_type)
    recs, ords = got
    out, at = [], 0
    for _rg, local, _contents in groups:
        out.append((recs[at:at + len(local)], ords[at:at + len(local)]))
        at += len(local)
    return out


def _records(path: str, where: str, taken: list[Any], contents: list[bytes],
             record_type: type) -> tuple[list, list[int]]:
    cols = dict(zip(_OTHER_COLS, taken))
    lens = np.fromiter(map(len, contents), dtype=np.int64, count=len(contents))
    offs = np.zeros(len(contents) + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    if offs[-1] >= 1 << 31:
        raise PageError(f"{path}: {where}: the hits' content holds 2 GiB or more")
    cols[_CONTENT_COL] = (b"".join(contents), offs.astype(np.int32))
    try:
        return records_from_columns([cols[c] for c in _STRING_COLS], cols[_TS], cols[_TOK], cols[_SV],
                                    cols[_ORD], record_type, _calls_read, False)
    except ValueError as exc:
        raise PageError(f"{path}: {where}: {exc}") from None


#: the numpy type of each fixed-width column (the others are strings)
_FIXED = {"ts": np.float64, "token_estimate": np.int64, "schema_version": np.int32, "ord": np.int64}


def _table_records(table: pa.Table, canon: list[bytes | None]) -> list | None:
    """``(record, ord)`` of each row of ``table`` (every column of the cool
    schema, as pyarrow read it), built and digest-checked in compiled code
    from the Arrow buffers, its canonical JSON in ``canon`` (a slot a row);
    None for a row that path declines (extra fields, an unusual spelling,
    damage). None for the whole table when a column is not as the schema
    says (nulls, a type) or the values do not hold together: the caller's
    Python path names why."""
    n = table.num_rows
    cols: list[Any] = []
    for name in _COLS:
        arr = table.column(name).combine_chunks()
        if arr.null_count or len(arr) != n:
            return None
        fixed = _FIXED.get(name)
        if fixed is not None:
            cols.append(np.frombuffer(arr.buffers()[1], dtype=fixed, count=n,
                                      offset=arr.offset * np.dtype(fixed).itemsize))
        elif not pa.types.is_string(arr.type):
            return None
        else:
            cols.append(string_buffers(arr))
    try:
        return records_from_columns([cols[c] for c in _STRING_COLS], cols[_TS], cols[_TOK], cols[_SV],
                                    cols[_ORD], ConversationMessageRecord, _calls_read, canon=canon)
    except ValueError:
        return None


def check_table(table: pa.Table, base: int = 0,
                sound: Callable[[str, bytes], None] | None = None) -> Iterator[tuple[int, str]]:
    """Yield (row, reason) for every row of ``table`` (a cool file's rows
    from ``base`` on, every column) whose digest does not match;
    ``sound(msg_id, canonical JSON of its record dict)`` is called for
    every row whose digest does (built in compiled code, or for a row that
    path declines by its Python path, which names damage)."""
    canon: list[bytes | None] = [None] * table.num_rows
    fast = _table_records(table, canon) if table.num_rows else []
    acc = None
    for i in range(table.num_rows):
        hit = fast[i] if fast is not None else None
        if hit is not None:
            if sound is not None:
                sound(hit[0].msg_id, cast("bytes", canon[i]))
            continue
        if acc is None:
            try:
                acc = _table_group(table).acc
            except CorruptStateCheckpointError as exc:
                yield base, str(exc)
                return
            assert acc is not None      # _table_group adds every column
        rec, _o, dig, plain = _assemble_at(acc, i)
        if rec is None:
            yield base + i, str(dig)
        elif _row_digest(rec, plain) != dig:
            yield base + i, "digest mismatch"
        elif sound is not None:
            sound(rec["msg_id"], fast_canonical_json(rec))
