"""The cool file's schema and names: the record fields and their Parquet
columns, the public value types, row digests and order keys, the
validation of incoming record dicts, and the file and location names.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from .._names import (COOL_OURS_RE, COOL_PARQUET_RE, cool_grams_name, cool_idx_name,
                       cool_index_dir, cool_parquet_name)
from .._order import row_key as _row_key  # noqa: F401  (the ordering rule)
from ..records import fast_canonical_json


#: Rows per Parquet row group: the unit of the row-group cache and of bulk reads.
ROW_GROUP_ROWS = 1024
#: data pages of about this many bytes, checked every _PAGE_BATCH_ROWS rows:
#: a point read decompresses one page per column (see rune_fast.pages), so
#: pages stay small (content: 32 rows or fewer) at about 30% more file size
#: than pyarrow's default 1 MiB pages. (1 KiB pages were measured in
#: session 28: a cold point read ~30% cheaper for ~7% more file bytes, but
#: ~25% more CPU for every file written: pyarrow compresses each page with a
#: fresh zstd context, ~9 us a page, and a 1,024-row group would hold ~220
#: compressed pages instead of ~85. Readers take any page size.)
#: Session 29 measured where a cold point read's ~100 us in take_rows go
#: (1,000,000-message bench store): ~60 us zstd (content's ~14 KB page ~15,
#: every other column's page 1-7, the table setup of each block counting),
#: ~10 us reads, ~5 us CRCs. The same 204,800 rows rewritten by pyarrow, per
#: row on disk (this layout 273 B): RLE_DICTIONARY stored raw for channel_id,
#: task_id, hlc, role, origin, schema_version and extra -2.4 B (their zstd,
#: ~15 us, gone; tool_call_id too: +3.6 B), token_estimate and ord
#: DELTA_BINARY_PACKED raw -0.3 B (~10 us) -- but the page reader, the
#: sidecar's directories (dictionary pages) and check_dir would have to
#: take those encodings first; ts raw +2.6 B (~5 us: taken, below); content pages of 16
#: rows +41 B (~5 us); zstd level 3 / 6 -4.5 / -11 B, decompression 7% /
#: 30% slower; libzstd called directly no faster than zstandard's.
_PAGE_BYTES = 4 << 10
_PAGE_BATCH_ROWS = 32
#: row groups remembered as missed once (see CoolArchive._direct)
_MAX_MISSED = 1 << 16

#: The record dict fields, in the column order of the file.
RECORD_FIELDS = (
    "msg_id", "channel_id", "task_id", "hlc", "content", "ts", "role",
    "token_estimate", "tool_calls", "tool_call_id", "origin", "schema_version",
)
_STR_FIELDS = ("msg_id", "channel_id", "task_id", "hlc", "content", "role",
               "tool_call_id", "origin")
_FIELD_SET = frozenset(RECORD_FIELDS)

#: The Parquet schema of every cool file: plain types only, so DuckDB, Polars
#: or Spark read the files as they are.
COOL_SCHEMA = pa.schema([
    pa.field("msg_id", pa.string(), nullable=False),
    pa.field("channel_id", pa.string(), nullable=False),
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("hlc", pa.string(), nullable=False),
    pa.field("content", pa.string(), nullable=False),
    pa.field("ts", pa.float64(), nullable=False),
    pa.field("role", pa.string(), nullable=False),
    pa.field("token_estimate", pa.int64(), nullable=False),
    pa.field("tool_calls", pa.string(), nullable=False),      # JSON text
    pa.field("tool_call_id", pa.string(), nullable=False),
    pa.field("origin", pa.string(), nullable=False),
    pa.field("schema_version", pa.int32(), nullable=False),
    pa.field("extra", pa.string(), nullable=False),           # JSON object of fields beyond these
    pa.field("ord", pa.int64(), nullable=False),
    pa.field("digest", pa.string(), nullable=False),
], metadata={b"rune_fast.format": b"cool/1"})

#: Each column's compression (pyarrow's ``compression`` per column): zstd
#: for every column but those named here, stored as they are. Readers take
#: either, chunk by chunk. ``ts`` (8-byte doubles that zstd shrinks only to
#: ~5.3 B) is stored raw: a cold point read ~5% cheaper (its page was ~5 us
#: of zstd) for ~2.8 B a row more (+1% of a cool file; write amplification
#: +~0.003, the cool files being ~0.3-0.5 of its ~2.9 B/B). Session 28
#: measured ``token_estimate`` and ``ord`` raw too: ~7% more of a read for
#: ~13 B a row more (zstd shrinks them to ~1.4 B): not taken.
#:
#: Since session 31 the columns of few distinct values within a row group
#: (the file is sorted by channel, then task) are dictionary-encoded and the
#: integer columns DELTA_BINARY_PACKED, all of them stored uncompressed:
#: their data pages hold a few bytes (a bit width and RLE runs, or deltas)
#: that take_rows decodes in C, where a point read decompressed a zstd page
#: of ~4 KB each (1-9 us apiece); per row on disk -2.5 B (the 1,000,000-
#: message bench store's largest file rewritten; a 1M store built with it:
#: cool files 225.0 -> 223.2 MB, each id once in a fresh process ~13% less
#: wall, ~16% less CPU, with the msg_id page an exact read skips). ``hlc`` stays PLAIN and
#: compressed: stamped messages each have their own (a dictionary stored
#: raw would cost their full length), and ``""`` compresses to nothing.
#: Files written before (PLAIN, zstd but ``ts``) are read as they are.
#:
#: Since session 49 ``content`` is LZ4_RAW (Parquet's LZ4 block codec, read
#: by DuckDB, Polars and Spark 3.3 on; the page reader decompresses it with
#: the system's liblz4): on the 1,000,000-message bench store a file's write
#: took 3.0-3.3 -> 2.2-2.3 us of CPU a row (pyarrow's zstd made a context
#: for each ~14 KB page), a content page decompresses ~4x faster (a cold
#: point read's page take 51 -> 42 us), for +57 B a row on disk (235 ->
#: 292; content pages 5.6 -> 7.4 KB). Files with zstd content are read as
#: they are.
_DICT_COLUMNS: tuple[str, ...] = ("channel_id", "task_id", "role", "origin", "schema_version", "extra")
_DELTA_COLUMNS: tuple[str, ...] = ("token_estimate", "ord")
_ENCODING: dict[str, str] = {c: "DELTA_BINARY_PACKED" for c in _DELTA_COLUMNS}
_RAW_COLUMNS: frozenset[str] = frozenset({"ts", *_DICT_COLUMNS, *_DELTA_COLUMNS})
_LZ4_COLUMNS: frozenset[str] = frozenset({"content"})
_COMPRESSION = {f.name: ("none" if f.name in _RAW_COLUMNS else "lz4" if f.name in _LZ4_COLUMNS else "zstd")
                for f in COOL_SCHEMA}

_COLS = COOL_SCHEMA.names
_CONTENT_COL = _COLS.index("content")
_COL_TYPES = [(f.name, f.type) for f in COOL_SCHEMA]
_PARQUET_RE = COOL_PARQUET_RE
_OURS_RE = COOL_OURS_RE
_IDX_MAGIC = b"RFCIDX01"
_IDX_VERSION = 3          # 1: task names in the header; 2: no page directories (both still read)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_PARQUET_ERRORS = (OSError, pa.ArrowException, ValueError, KeyError, IndexError)


# --------------------------------------------------------------------------- #
# Public value types
# --------------------------------------------------------------------------- #

class CoolRow(NamedTuple):
    """One archived message: its record dict, the caller's append ordinal,
    and where it lives (file name and row)."""

    record: dict
    ord: int
    file: str
    row: int
    #: the row's digest was checked over orjson's spelling of the record
    #: (no extra fields; tool calls that orjson writes as stored): its values
    #: are plain JSON values, so a record can be built without walking them
    plain: bool = False


@dataclass(frozen=True)
class CoolRun:
    """Result of :meth:`CoolArchive.cool_table`: the new file (add it to the
    manifest), its row count and size, and the archive's new file list."""

    file: str | None
    rows: int
    bytes: int
    files: list[str]


@dataclass(frozen=True)
class CoolChange:
    """Result of :meth:`CoolArchive.erase` and :meth:`CoolArchive.merge`.

    ``replaced`` maps each old file name to its replacement (``None`` when it
    became empty; for a merge several old names map to one new one).
    ``files`` is the new live list: record it in the manifest, then call
    :meth:`CoolArchive.unlink_files` with ``removed``.
    """

    replaced: dict[str, str | None]
    added: list[str]
    removed: list[str]
    files: list[str]
    rows_removed: int = 0
    rows_rewritten: int = 0
    not_found: list[str] = field(default_factory=list)


class StagedMerge(NamedTuple):
    """Merged files written by :meth:`CoolArchive.stage_merge`, not yet served."""

    jobs: list          # source file numbers, one list per new file
    new: list           # the new files' indexes
    replaced: dict      # source name -> new name


@dataclass(frozen=True)
class CoolProblem:
    """One problem found by :meth:`CoolArchive.verify`."""

    file: str
    row: int | None
    problem: str

    def __str__(self) -> str:
        where = self.file if self.row is None else f"{self.file} row {self.row}"
        return f"{where}: {self.problem}"


# --------------------------------------------------------------------------- #
# Digests and keys
# --------------------------------------------------------------------------- #

_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _canonical(d: dict) -> bytes:
    """``json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
    as UTF-8.

    orjson (4x faster) gives the same bytes for plain JSON values: it escapes
    every character exactly as json does and sorts keys the same way (UTF-8
    byte order is code point order); the differences are float exponents
    (``1e16`` vs ``1e+16``), non-finite floats, int keys and ints beyond 64
    bits, so anything but :func:`_json_safe` values takes json."""
    ts = d.get("ts")
    if (type(ts) is float and (ts == 0.0 or 1e-4 <= abs(ts) < 1e16)
            and len(d) == 12 and "tool_calls" in d and not d["tool_calls"]):
        # a plain record: no need to walk its values first
        try:
            return orjson.dumps(d, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass  # lone surrogates or big ints: the general path
    return fast_canonical_json(d)


def record_digest(d: dict) -> str:
    """xxh3_128 hex digest of the canonical JSON of a record dict (the value of
    the ``digest`` column). Public API, for readers of the files that check
    rows themselves."""
    return xxhash.xxh3_128_hexdigest(_canonical(d))


def string_buffers(arr: pa.Array) -> tuple[Any, np.ndarray]:
    """``(UTF-8 bytes, int32 offsets of its rows)`` of an Arrow string array,
    where Arrow holds them (nothing copied): what the compiled readers take."""
    _valid, offsets, data = arr.buffers()
    offs = (np.zeros(len(arr) + 1, dtype=np.int32) if offsets is None else
            np.frombuffer(offsets, dtype=np.int32, count=len(arr) + 1, offset=4 * arr.offset))
    return (data if data is not None else b""), offs


def _id_range(ids: Any) -> tuple[str, str] | None:
    """(smallest, largest) of a msg_id column, in code point order (Arrow
    compares UTF-8 bytes, which orders as str does); None if it is empty."""
    if len(ids) == 0:
        return None
    mm = pc.min_max(ids)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return None if lo is None or hi is None else (lo, hi)


def _id_hash(msg_id: str) -> int:
    return xxhash.xxh3_64_intdigest(msg_id.encode("utf-8"))


# --------------------------------------------------------------------------- #
# Validation of incoming rows
# --------------------------------------------------------------------------- #

def _check_json(value: Any, where: str) -> None:
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str):
            _check_utf8(value, where)
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: JSON object key {k!r} is not a str")
            _check_utf8(k, where)
            _check_json(v, f"{where}.{k}")
        return
    raise TypeError(f"{where}: {type(value).__name__} is not a JSON value")


def _check_utf8(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where} is not valid UTF-8 (lone surrogate at {exc.start})") from None


def _digest_checked(d: dict, i: int) -> str:
    """The digest of a validated dict; a lone surrogate anywhere is named."""
    try:
        return xxhash.xxh3_128_hexdigest(_canonical(d))
    except UnicodeEncodeError:
        for k in _STR_FIELDS:
            _check_utf8(d[k], f"row {i}: field {k}")
        _check_json(d, f"row {i}")
        raise


def _dumps(value: Any) -> str:
    return _COMPACT.encode(value)


# --------------------------------------------------------------------------- #
# Files: atomic writes, Parquet footers
# --------------------------------------------------------------------------- #

def cool_loc(no: int, row: int) -> int:
    """A cool row's location: ``(file number << 32) | row``, as the id index
    keeps it (file numbers are never reused, so a location names one row for
    good)."""
    return (no << 32) | row


def _file_no(name: str) -> int:
    m = _PARQUET_RE.match(name)
    if m is None:
        raise ValueError(f"not a cool archive file name: {name!r}")
    return int(m.group(1))


# (the file names are spelled in rune_fast._names)
_parquet_name = cool_parquet_name
_idx_name = cool_idx_name
_grams_name = cool_grams_name
index_dir_for = cool_index_dir
