"""The cool tier: Parquet archives of cooled conversation messages.

A :class:`CoolArchive` owns the folder ``state_dir/hot/conversation_cool/``.
Each cooling run writes one immutable Parquet file ``cool-<n:08d>.parquet``
(zstd, page checksums on) holding plain record dicts (the output of
``ConversationMessageRecord.to_dict()``) sorted by channel, plus a sidecar
``cool-<n:08d>.idx`` that lets the archive answer id, channel and task queries
without reading every file. The Parquet file is the truth: a missing or
damaged sidecar is rebuilt from it.

Which files are live is the caller's business (the repository's manifest):
the archive opens from a list of names, and every change (``cool``, ``erase``,
``merge``) writes new files under new names and returns the new list. The
caller moves its manifest, then calls :meth:`CoolArchive.unlink_files` on the
files it no longer references. A crash at any point leaves the old set or the
new set referenced and intact; files nobody references are strays that
:meth:`CoolArchive.gc` removes.

Every row carries ``digest`` = xxh3_128 of the canonical JSON of its record
dict; every read that returns a row checks it, and a mismatch raises
:class:`~rune_fast.errors.CorruptStateCheckpointError` naming the file and row.
See ``docs/FORMAT.md`` (Cool archive) for the bytes.

In memory: every live file's ids sit in one ``HashIndex`` (xxh3_64 -> file
and row), so ``contains`` (the append path's duplicate check) is one probe
on a miss and a look at the stored id on a hit. Row groups are decoded
column by column, on demand, into compact Python-side views (one ``bytes``
or ``str`` plus int32 offsets per string column) that rows are assembled from
without Arrow scalars; the cache (``cache_bytes``, 8 MiB by default, counted
honestly) compresses the content of its least recently used groups (LZ4
blocks of 16 rows) before it evicts any. Search runs
:func:`rune_fast._search.find_spans` over a group's content bytes;
case-insensitive search is exact Unicode casefolding (see ``search``).
"""
from __future__ import annotations

import bisect
import heapq
import json
import logging
import mmap
import os
import re
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Container, Iterable, Iterator, Literal, Mapping, NamedTuple, Sequence, cast

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from . import _encode
from ._index import HashIndex
from ._log import utf8_hashes
from ._search import block_grams, find_spans, gram_blocks
from .pages import GRAM_BYTES, PageError, PageReader, Unsupported

if TYPE_CHECKING:
    from typing_extensions import Buffer
from .errors import CorruptStateCheckpointError
from .events import fsync_dir
from .segments import read_kept, seal, unseal, write_kept
from .records import fast_canonical_json, json_safe as _json_safe


log = logging.getLogger("rune_fast.cool")

__all__ = [
    "CoolArchive",
    "CoolRow",
    "CoolRun",
    "cool_loc",
    "CoolChange",
    "CoolProblem",
    "StagedMerge",
    "record_digest",
    "COOL_SCHEMA",
    "ROW_GROUP_ROWS",
    "SPECIAL_FOLD",
    "ascii_fold_matcher",
    "relevant_specials",
]

#: Rows per Parquet row group: the unit of the row-group cache and of bulk reads.
ROW_GROUP_ROWS = 1024
#: data pages of about this many bytes, checked every _PAGE_BATCH_ROWS rows:
#: a point read decompresses one page per column (see rune_fast.pages), so
#: pages stay small (content: 32 rows or fewer) at about 30% more file size
#: than pyarrow's default 1 MiB pages
_PAGE_BYTES = 4 << 10
_PAGE_BATCH_ROWS = 32
#: memory for the search filters of content pages (640 B a page of 32 rows
#: or fewer: about 20 MiB a million cooled messages)
_GRAMS_BUDGET = 64 << 20
#: A file's content-page filters, kept beside its sidecar once a search built
#: them (``cool-NNNNNNNN.grams``): a cache bound to the file's size and footer
#: hash and checked whole (xxh3_64) when read, so the first search of a later
#: process reads the pages that may match instead of every page. Layout:
#: magic, version, filter bytes a page, file size, footer hash (16 hex
#: digits), entry count; per entry its row group, byte count and filters;
#: then the xxh3_64 of everything before it.
_GRAMS_MAGIC = b"RFGRAMS1"
_GRAMS_VERSION = 1
_GRAMS_HEAD = struct.Struct("<8sIIQ16sI")
_GRAMS_ENTRY = struct.Struct("<II")
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

_COLS = COOL_SCHEMA.names
_CONTENT_COL = _COLS.index("content")
_COL_TYPES = [(f.name, f.type) for f in COOL_SCHEMA]
_PARQUET_RE = re.compile(r"^cool-(\d{8,})\.parquet$")
_OURS_RE = re.compile(r"^\.?cool-(\d{8,})\.(parquet|idx|grams)(\.tmp)?$")
_IDX_MAGIC = b"RFCIDX01"
_IDX_VERSION = 2          # 1: task names in the header (still read)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)
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
    """Result of :meth:`CoolArchive.cool`: the new file (add it to the
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
    the ``digest`` column)."""
    return xxhash.xxh3_128_hexdigest(_canonical(d))


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


def _order_key(record: dict, ord_: int) -> tuple:
    """Order within a channel or task (DESIGN.md): unstamped messages first in
    append order, then stamped ones by (hlc, msg_id)."""
    hlc = record["hlc"]
    if hlc == "":
        return (0, ord_, "", "")
    return (1, 0, hlc, record["msg_id"])


def _row_key(row: CoolRow) -> tuple:
    return _order_key(row.record, row.ord)


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


def _validate(d: Any, i: int) -> None:
    if not isinstance(d, dict):
        raise TypeError(f"row {i}: expected a record dict, got {type(d).__name__}")
    if not d.keys() >= _FIELD_SET:
        missing = [k for k in RECORD_FIELDS if k not in d]
        raise ValueError(f"row {i}: record dict lacks field(s) {', '.join(missing)}")
    for k in _STR_FIELDS:
        v = d[k]
        if type(v) is not str and not isinstance(v, str):
            raise TypeError(f"row {i}: field {k} must be str, got {type(v).__name__}")
    if d["msg_id"] == "":
        raise ValueError(f"row {i}: field msg_id is empty")
    if d["channel_id"] == "":
        raise ValueError(f"row {i}: field channel_id is empty")
    if type(d["ts"]) is not float:
        raise TypeError(f"row {i}: field ts must be float, got {type(d['ts']).__name__}")
    for k, (lo, hi) in (("token_estimate", _INT64), ("schema_version", _INT32)):
        v = d[k]
        if type(v) is not int:
            raise TypeError(f"row {i}: field {k} must be int, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise ValueError(f"row {i}: field {k} = {v} is out of range")
    tc = d["tool_calls"]
    if not isinstance(tc, (list, tuple)):
        raise TypeError(f"row {i}: field tool_calls must be a list, got {type(tc).__name__}")
    if tc:
        _check_json(tc, f"row {i}: field tool_calls")
    if len(d) != len(RECORD_FIELDS):
        for k in d:
            if k not in _FIELD_SET:
                if not isinstance(k, str):
                    raise TypeError(f"row {i}: record key {k!r} is not a str")
                _check_json(d[k], f"row {i}: field {k}")


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


def _parquet_name(no: int) -> str:
    return f"cool-{no:08d}.parquet"


def _idx_name(no: int) -> str:
    return f"cool-{no:08d}.idx"


def _grams_name(no: int) -> str:
    return f"cool-{no:08d}.grams"


def _encode_grams(size: int, footer: str, entries: list[tuple[int, bytes]]) -> bytes:
    """The bytes of a filters file (see _GRAMS_MAGIC) for the file of ``size``
    bytes and footer hash ``footer``: ``entries`` are (row group, filters)."""
    parts = [_GRAMS_HEAD.pack(_GRAMS_MAGIC, _GRAMS_VERSION, GRAM_BYTES, size, footer.encode("ascii"),
                              len(entries))]
    for rg, grams in entries:
        parts.append(_GRAMS_ENTRY.pack(rg, len(grams)))
        parts.append(grams)
    return seal(b"".join(parts))


def _decode_grams(data: bytes, size: int, footer: str, groups: int) -> dict[int, bytes]:
    """Row group -> filters of a filters file made for the file of ``size``
    bytes, footer hash ``footer`` and ``groups`` row groups; ValueError
    saying what does not hold (damage, another file, another layout)."""
    end = unseal(data, _GRAMS_HEAD.size)
    magic, version, gram_bytes, fsize, fhash, count = _GRAMS_HEAD.unpack_from(data, 0)
    if magic != _GRAMS_MAGIC or version != _GRAMS_VERSION or gram_bytes != GRAM_BYTES:
        raise ValueError(f"format {magic!r} version {version}, {gram_bytes} bytes a page: not this build's")
    if (fsize, fhash) != (size, footer.encode("ascii")):
        raise ValueError("made for another file of that name")
    out: dict[int, bytes] = {}
    at = _GRAMS_HEAD.size
    for _ in range(count):
        if at + _GRAMS_ENTRY.size > end:
            raise ValueError(f"entry at offset {at} runs past the end")
        rg, n = _GRAMS_ENTRY.unpack_from(data, at)
        at += _GRAMS_ENTRY.size
        if rg >= groups or rg in out or n % GRAM_BYTES or at + n > end:
            raise ValueError(f"entry at offset {at - _GRAMS_ENTRY.size} (row group {rg}, {n} bytes) "
                             f"does not fit the file's {groups} row groups")
        out[rg] = data[at:at + n]
        at += n
    if at != end:
        raise ValueError(f"{end - at} bytes after the last entry")
    return out


def index_dir_for(cool_dir: str) -> str:
    """The folder of the sidecars of the archive in ``cool_dir``: its
    sibling ``<cool_dir>_index``."""
    return os.path.normpath(cool_dir) + "_index"


def _footer_start(path: str) -> int | None:
    """Offset of the Parquet footer of the file at ``path`` by its length
    word (None if that cannot say)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < 12:
                return None
            f.seek(size - 8)
            n = int.from_bytes(f.read(4), "little")
    except OSError:
        return None
    return size - 8 - n if 0 < n <= size - 12 else None


def _footer_hash(path: str) -> tuple[int, str]:
    """(size, xxh3_64 hex of the Parquet footer): ties a sidecar to the exact
    file it indexes without reading the whole file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < 12:
            raise CorruptStateCheckpointError("cool archive too short to be Parquet", path=path, offset=0)
        tail = os.pread(fd, 8, size - 8)
        if tail[4:] != b"PAR1":
            raise CorruptStateCheckpointError("cool archive lacks the Parquet footer magic", path=path,
                                              offset=size - 4)
        flen = struct.unpack("<I", tail[:4])[0]
        if flen + 12 > size:
            raise CorruptStateCheckpointError("cool archive footer length is out of range", path=path,
                                              offset=size - 8)
        h = xxhash.xxh3_64(os.pread(fd, flen, size - 8 - flen))
    finally:
        os.close(fd)
    h.update(tail)
    return size, h.hexdigest()


def _file_digest(path: str) -> str:
    """xxh3_64 hex of the whole file at ``path`` (read in 1 MiB pieces)."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()


def _sidecar_names(ipath: str, no: int, size: int, footer: str) -> bool:
    """Whether the sidecar at ``ipath`` starts as the one :meth:`_FileIndex.encode`
    writes for file ``no`` of ``size`` bytes and footer hash ``footer``
    (its digest is checked when it is read)."""
    head = (b'{"format":"rune_fast.cool.idx","version":%d,"file":"%s","file_size":%d,'
            b'"footer_xxh3_64":"%s",' % (_IDX_VERSION, _parquet_name(no).encode(), size, footer.encode()))
    try:
        fd = os.open(ipath, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        got = os.pread(fd, 28 + len(head), 0)
    finally:
        os.close(fd)
    return got[:8] == _IDX_MAGIC and got[28:] == head


# --------------------------------------------------------------------------- #
# The sidecar index of one file
# --------------------------------------------------------------------------- #

@dataclass
class _FileIndex:
    """What the archive keeps in memory about one live file."""

    no: int
    name: str
    rows: int
    size: int
    footer: str
    rg_starts: np.ndarray                     # int64, first row of each row group, + [rows]
    hashes: np.ndarray                        # uint64 sorted xxh3_64 of msg_id
    hrows: np.ndarray                         # uint32 row of each hash
    channels: dict[str, tuple[int, int, int]]  # ch -> (start, end, latest task row or -1)
    _tasks: dict[str, np.ndarray] | None       # task -> uint32 rows (ascending); None: not parsed yet
    rg_list: list[int] = field(default_factory=list)
    special: dict = field(default_factory=dict)   # rg -> {char: rows holding it, "": non-ASCII rows} (search)
    _task_src: tuple | None = None             # (task JSON bytes, all task rows) until parsed
    id_range: tuple[str, str] | None = None    # (smallest, largest) msg_id, when known (see _id_span)
    digest: str | None = None                  # xxh3_64 of the whole file, as written (see verify)

    def __post_init__(self) -> None:
        self.rg_list = [int(x) for x in self.rg_starts]

    @property
    def tasks(self) -> dict[str, np.ndarray]:
        """task -> its rows in this file (ascending). A sidecar's task section
        is parsed at the first task query, not at open."""
        if self._tasks is None:
            text, all_rows = cast("tuple", self._task_src)     # set whenever _tasks is None
            tasks: dict[str, np.ndarray] = {}
            for t, a, b in orjson.loads(text):
                if not 0 <= a <= b <= len(all_rows):
                    raise ValueError(f"task {t!r} rows [{a}, {b}) outside the sidecar's {len(all_rows)}")
                tasks[t] = all_rows[a:b]
            self._tasks, self._task_src = tasks, None
        return self._tasks

    def encode(self) -> bytes:
        task_names = list(self.tasks)
        task_rows = [self.tasks[t] for t in task_names]
        offs = np.cumsum([0] + [len(r) for r in task_rows]).tolist()
        tb = json.dumps([[t, offs[i], offs[i + 1]] for i, t in enumerate(task_names)],
                        ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        header = {
            "format": "rune_fast.cool.idx", "version": _IDX_VERSION,
            "file": self.name, "file_size": self.size, "footer_xxh3_64": self.footer,
            "rows": self.rows, "row_group_starts": [int(x) for x in self.rg_starts],
            "channels": [[c, s, e, lt] for c, (s, e, lt) in self.channels.items()],
            "task_rows": int(offs[-1]), "tasks_json_bytes": len(tb),
        }
        hb = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        hb += b" " * (-(len(hb) + 4) % 8)
        tb += b" " * (-len(tb) % 8)
        all_task_rows = (np.concatenate(task_rows) if task_rows else np.zeros(0, np.uint32)).astype("<u4")
        body = b"".join([
            struct.pack("<I", len(hb)), hb, tb,
            self.hashes.astype("<u8").tobytes(),
            self.hrows.astype("<u4").tobytes(),
            b"\0" * (4 if self.rows % 2 else 0),
            all_task_rows.tobytes(),
        ])
        return _IDX_MAGIC + xxhash.xxh3_128_digest(body) + body

    @classmethod
    def decode(cls, data: Any, no: int, path: str) -> "_FileIndex":
        """Parse a sidecar (bytes or a read-only map of the file); ValueError
        says why it is unusable. The arrays are views of ``data``, not copies,
        and the task section is parsed at the first task query."""
        if len(data) < 28 or data[:8] != _IDX_MAGIC:
            raise ValueError("bad magic")
        body = memoryview(data)[24:]
        if xxhash.xxh3_128_digest(body) != data[8:24]:
            raise ValueError("digest mismatch")
        (hlen,) = struct.unpack_from("<I", body, 0)
        header = orjson.loads(body[4:4 + hlen])
        version = header.get("version")
        if version not in (1, _IDX_VERSION) or header.get("file") != _parquet_name(no):
            raise ValueError("wrong version or file name")
        n = int(header["rows"])
        pos = 4 + hlen
        if version == 1:
            tasks_h = header["tasks"]
            text = orjson.dumps(tasks_h)
            total = tasks_h[-1][2] if tasks_h else 0
        else:
            tlen = int(header["tasks_json_bytes"])
            text = bytes(body[pos:pos + tlen])
            pos += tlen + (-tlen % 8)
            total = int(header["task_rows"])
        hashes = np.frombuffer(body, dtype=np.uint64, count=n, offset=pos)
        pos += 8 * n
        hrows = np.frombuffer(body, dtype=np.uint32, count=n, offset=pos)
        pos += 4 * n + (4 if n % 2 else 0)
        all_rows = np.frombuffer(body, dtype=np.uint32, count=total, offset=pos)
        if pos + 4 * total != len(body):
            raise ValueError("length mismatch")
        return cls(
            no=no, name=_parquet_name(no), rows=n, size=int(header["file_size"]),
            footer=str(header["footer_xxh3_64"]),
            rg_starts=np.asarray(header["row_group_starts"], dtype=np.int64),
            hashes=hashes, hrows=hrows,
            channels={c: (int(s), int(e), int(lt)) for c, s, e, lt in header["channels"]},
            _tasks=None, _task_src=(text, all_rows),
        )


def _id_hashes(msg_ids: Any) -> np.ndarray:
    """uint64 xxh3_64 of the UTF-8 of each id (:func:`_id_hash` of each), for
    a list of str or Arrow strings; computed in C."""
    arr = _plain_strings(msg_ids)
    _valid, offsets, data = arr.buffers()
    return utf8_hashes(offsets, data if data is not None else b"", arr.offset, len(arr))


def _plain_strings(values: Any) -> pa.Array:
    """``values`` (a list of str, an Arrow string array or chunked array) as
    one Arrow string array."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if not isinstance(values, pa.Array):
        values = pa.array(values, type=pa.string())
    if values.type != pa.string():
        values = values.cast(pa.string())
    return values


def _build_index(no: int, size: int, footer: str, msg_ids: Any, channel_ids: Any,
                 task_ids: Any, rg_counts: Sequence[int], path: str) -> _FileIndex:
    """The in-memory index of a file from its id, channel and task columns
    (lists of str or Arrow strings): id hashes sorted, each channel's row
    range (its rows must be contiguous) and newest row with a task, each
    task's rows. Vectorized: no Python work per row."""
    chs = _plain_strings(channel_ids)
    tids = _plain_strings(task_ids)
    n = len(chs)
    hashes = _id_hashes(msg_ids)
    if len(hashes) != n or len(tids) != n:
        raise ValueError(f"_build_index: {len(hashes)} ids, {n} channels, {len(tids)} tasks")
    # the row groups' counts place every row: a damaged footer may still
    # read, with counts that do not add up (a negative one, say)
    for i, c in enumerate(rg_counts):
        if c < 0:
            raise CorruptStateCheckpointError(f"cool archive row group {i} claims {c} rows", path=path)
    if sum(rg_counts) != n:
        raise CorruptStateCheckpointError(f"cool archive row groups hold {sum(rg_counts)} rows, "
                                          f"its columns {n}", path=path)
    order = np.argsort(hashes, kind="stable")
    has_task = np.asarray(pc.not_equal(tids, "").to_numpy(zero_copy_only=False), dtype=bool)
    # newest row with a task at or before each row (-1: none yet)
    last_task = np.maximum.accumulate(np.where(has_task, np.arange(n), -1)) if n else has_task
    channels: dict[str, tuple[int, int, int]] = {}
    if n:
        runs = pc.run_end_encode(chs)
        start = 0
        for ch, end in zip(runs.values.to_pylist(), runs.run_ends.to_numpy().tolist()):
            if ch in channels:
                raise CorruptStateCheckpointError(
                    f"channel {ch!r} is not contiguous in the cool archive", path=path, offset=start)
            latest = int(last_task[end - 1])
            channels[ch] = (start, end, latest if latest >= start else -1)
            start = end
    tasks: dict[str, np.ndarray] = {}
    rows = np.flatnonzero(has_task)
    if len(rows):
        enc = pc.dictionary_encode(tids.take(pa.array(rows)))
        codes = enc.indices.to_numpy()
        by_task = rows[np.argsort(codes, kind="stable")]
        bounds = np.cumsum(np.bincount(codes, minlength=len(enc.dictionary)))[:-1]
        tasks = {t: part.astype(np.uint32)
                 for t, part in zip(enc.dictionary.to_pylist(), np.split(by_task, bounds))}
    rg_starts = np.concatenate([[0], np.cumsum(np.asarray(rg_counts, dtype=np.int64))]).astype(np.int64)
    return _FileIndex(
        no=no, name=_parquet_name(no), rows=n, size=size, footer=footer, rg_starts=rg_starts,
        hashes=hashes[order], hrows=order.astype(np.uint32), channels=channels, _tasks=tasks,
    )


# --------------------------------------------------------------------------- #
# Row groups in memory
# --------------------------------------------------------------------------- #

_NUM_FMT: dict[str, Literal["d", "q", "i"]] = {
    "ts": "d", "token_estimate": "q", "schema_version": "i", "ord": "q"}
_NUM_SIZE = {"d": 8, "q": 8, "i": 4}
#: per cached column: overhead beyond its bytes (Python objects, memoryviews,
#: Arrow buffer padding), counted against the cache budget (measured: the
#: accounted total is within a few percent of tracemalloc + Arrow's pool)
_COL_OVERHEAD = 4096
#: characters whose casefold holds an ASCII character (U+00DF sharp s -> "ss",
#: U+212A Kelvin -> "k", the "fi" ligatures, ...): the only way a non-ASCII
#: character can take part in a match of an ASCII needle. Checked against
#: unicodedata by tests/test_cool.py.
SPECIAL_FOLD = "\u00df\u0130\u0149\u017f\u01f0\u1e96\u1e97\u1e98\u1e99\u1e9a\u1e9e\u212a" \
               "\ufb00\ufb01\ufb02\ufb03\ufb04\ufb05\ufb06"
_SPECIAL_UTF8 = [c.encode("utf-8") for c in SPECIAL_FOLD]
#: rows per in-memory compressed block of a cached content column: LZ4 (half
#: the text; a 12 KB block opens in ~3 us, where zstd takes ~19 us for a third),
#: with a trigram filter of _GRAM_BITS bits per block that lets a search skip
#: the blocks that cannot hold its needle (32 bytes per cached row)
_BLOCK_ROWS = 16
_GRAM_BITS = 4096
#: id lookups answered from the files' sorted hashes before the global id
#: index is built (an open that reads only hot messages never builds it)
_LAZY_LOOKUPS = 64
#: tasks whose cool locations task_locs keeps (emptied when files come or go,
#: and when full): a warm task read at 1,000,000 messages walked 9 files' task
#: maps every time (~4 us of ~30)
_TASK_LOCS_KEPT = 8192
_LZ4 = pa.Codec("lz4_raw")


def _relevant_specials(needle: str) -> tuple[str, ...]:
    """The SPECIAL_FOLD characters that can take part in a match of the
    ASCII ``needle`` in a casefolded text: those whose fold F lies inside
    the needle, or overlaps its start (the needle starts with a suffix of F)
    or its end (it ends with a prefix of F), or holds the whole needle.
    Every other character maps ASCII to the same ASCII letter, lowercased,
    and non-ASCII to non-ASCII, so it cannot make a match that an
    ASCII-case-blind byte search misses."""
    out = []
    for c in SPECIAL_FOLD:
        f = c.casefold()
        if (f in needle or needle in f
                or any(needle.startswith(f[k:]) for k in range(1, len(f)))
                or any(needle.endswith(f[:k]) for k in range(1, len(f)))):
            out.append(c)
    return tuple(out)


def _col_view(name: str, arr: pa.Array, path: str, first: int) -> tuple:
    """(getter, nbytes, data, offsets) of one column, for fast per-row access
    without Arrow scalars: ``getter(i)`` is row i's Python value. A string
    column keeps its UTF-8 bytes once (as one ``str`` when all ASCII, so a
    value is a slice) plus the int32 offsets; the Arrow array is not kept."""
    if arr.null_count:
        raise CorruptStateCheckpointError(f"cool column {name} holds nulls", path=path, offset=first)
    n, off = len(arr), arr.offset
    bufs = arr.buffers()
    fmt = _NUM_FMT.get(name)
    if fmt is not None:
        k = _NUM_SIZE[fmt]
        mv = memoryview(bufs[1]).cast("B")[k * off:k * (off + n)].cast(fmt)
        return mv.__getitem__, k * n + _COL_OVERHEAD, None, None, \
            (lambda rows, mv=mv: [mv[i] for i in rows])
    if bufs[1] is None:
        offs = memoryview(bytes(4 * (n + 1))).cast("i")
    else:
        offs = memoryview(bufs[1]).cast("B")[4 * off:4 * (off + n + 1)].cast("i")
    lo, hi = (offs[0], offs[n]) if n else (0, 0)
    data: bytes | None      # (None in the view of an ASCII column: its text is kept instead)
    data = bytes(memoryview(bufs[2]).cast("B")[lo:hi]) if bufs[2] is not None and hi > lo else b""
    if lo:
        # (numpy's stubs give ndarray its __buffer__ for Python >= 3.12 only)
        shifted = cast("Buffer", np.frombuffer(offs, dtype=np.int32) - np.int32(lo))
        offs = memoryview(shifted).cast("B").cast("i")
    nbytes = len(data) + 4 * (n + 1) + _COL_OVERHEAD
    if name == "content":
        return _content_view(data, offs, n)
    getter: Callable[[int], str]
    take: Callable[[list[int]], list[str]]
    if data.isascii():
        text = data.decode("ascii")
        if name != "content":
            data = None
        else:
            nbytes += len(text)

        def getter(i: int, s: str = text, o: memoryview = offs) -> str:
            return s[o[i]:o[i + 1]]

        def take(rows: list[int], s: str = text, o: memoryview = offs) -> list[str]:
            return [s[o[i]:o[i + 1]] for i in rows]
    else:
        def getter(i: int, b: bytes = data, o: memoryview = offs) -> str:
            return b[o[i]:o[i + 1]].decode("utf-8")

        def take(rows: list[int], b: bytes = data, o: memoryview = offs) -> list[str]:
            return [b[o[i]:o[i + 1]].decode("utf-8") for i in rows]
    return getter, nbytes, data, offs, take


class _Content:
    """A cached content column: its UTF-8 bytes and offsets, or, once the
    cache needs the room, LZ4 blocks of ``_BLOCK_ROWS`` rows (about half the
    size, ~3 us to open one block; the last block opened is kept, for
    sequential reads) with their trigram filters."""

    __slots__ = ("data", "blocks", "grams", "offs", "n", "last_k", "last")

    def __init__(self, data: bytes, offs: memoryview, n: int) -> None:
        self.data: bytes | None = data
        self.blocks: list[bytes] | None = None
        self.grams = b""      # with blocks: each block's trigram filter (_GRAM_BITS bits)
        self.offs, self.n = offs, n
        self.last_k, self.last = -1, b""

    def nbytes(self) -> int:
        if self.data is not None:
            return len(self.data) + len(self.grams) + 4 * (self.n + 1) + _COL_OVERHEAD
        return (sum(len(b) + 41 for b in cast("list[bytes]", self.blocks)) + len(self.grams) + 4 * (self.n + 1)
                + _COL_OVERHEAD)

    def compress(self) -> int:
        """Switch to compressed blocks (and their trigram filters, so that a
        search opens only the blocks that can hold its needle); returns the
        bytes saved."""
        if self.data is None:
            return 0
        before = self.nbytes()
        self.build_grams()
        data, o, n, comp = self.data, self.offs, self.n, _LZ4.compress
        self.blocks = [comp(data[o[k]:o[min(k + _BLOCK_ROWS, n)]], asbytes=True)
                       for k in range(0, n, _BLOCK_ROWS)]
        self.data = None
        return before - self.nbytes()

    def build_grams(self) -> None:
        """Compute the blocks' trigram filters (kept; a no-op once done)."""
        if not self.grams and self.data is not None:
            self.grams = block_grams(self.data, self.offs, _BLOCK_ROWS, _GRAM_BITS)

    def find(self, needle: bytes, ci: bool, lo: int, hi: int) -> np.ndarray:
        """Rows in [lo, hi) (ascending) whose bytes hold ``needle`` (ASCII
        letters either case with ``ci``; the needle already lowercased).

        The trigram filters are used once built (cached columns build them at
        their first search); a column read for one scan is searched whole."""
        if hi <= lo:
            return np.zeros(0, np.int64)
        o = np.frombuffer(self.offs, dtype=np.int32).astype(np.int64)
        data = self.data
        if not self.grams and data is not None:
            return find_spans(data, o[lo:hi], o[lo + 1:hi + 1], needle, ci) + lo
        self.build_grams()
        B = _BLOCK_ROWS
        ks = gram_blocks(self.grams, _GRAM_BITS, needle)
        ks = ks[(ks >= lo // B) & (ks <= (hi - 1) // B)]
        out = []
        for k in ks.tolist():
            a, b = max(lo, k * B), min(hi, (k + 1) * B, self.n)
            if data is not None:
                idx = find_spans(data, o[a:b], o[a + 1:b + 1], needle, ci)
            else:
                base = o[k * B]
                idx = find_spans(self._block(k), o[a:b] - base, o[a + 1:b + 1] - base, needle, ci)
            if len(idx):
                out.append(idx + a)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _block(self, k: int) -> bytes:
        if k != self.last_k:
            o, a = self.offs, k * _BLOCK_ROWS
            size = o[min(a + _BLOCK_ROWS, self.n)] - o[a]
            blk = cast("list[bytes]", self.blocks)[k]       # (blocks is set whenever data is None)
            self.last = _LZ4.decompress(blk, size, asbytes=True) if size else b""
            self.last_k = k
        return self.last

    def get(self, i: int) -> str:
        o = self.offs
        if self.data is not None:
            return self.data[o[i]:o[i + 1]].decode("utf-8")
        k = i // _BLOCK_ROWS
        b = self._block(k)
        base = o[k * _BLOCK_ROWS]
        return b[o[i] - base:o[i + 1] - base].decode("utf-8")

    def raw(self, i: int) -> bytes:
        """Row ``i``'s UTF-8 bytes."""
        o = self.offs
        if self.data is not None:
            return self.data[o[i]:o[i + 1]]
        k = i // _BLOCK_ROWS
        b = self._block(k)
        base = o[k * _BLOCK_ROWS]
        return b[o[i] - base:o[i + 1] - base]

    def take(self, rows: list[int]) -> list[str]:
        o = self.offs
        data = self.data
        if data is not None:
            return [data[o[i]:o[i + 1]].decode("utf-8") for i in rows]
        out = []
        for i in rows:
            k = i // _BLOCK_ROWS
            b = self._block(k)
            base = o[k * _BLOCK_ROWS]
            out.append(b[o[i] - base:o[i + 1] - base].decode("utf-8"))
        return out

    def all_bytes(self) -> bytes:
        """The whole column's UTF-8 bytes (for search)."""
        if self.data is not None:
            return self.data
        o, n, dec = self.offs, self.n, _LZ4.decompress
        out = []
        for k, blk in enumerate(cast("list[bytes]", self.blocks)):
            a = k * _BLOCK_ROWS
            size = o[min(a + _BLOCK_ROWS, n)] - o[a]
            out.append(dec(blk, size, asbytes=True) if size else b"")
        return b"".join(out)


def _content_view(data: bytes, offs: memoryview, n: int) -> tuple:
    c = _Content(data, offs, n)
    return c.get, c.nbytes(), c, offs, c.take


class _Group:
    """The decoded columns of one row group, loaded column by column on
    demand (compact: UTF-8 bytes + offsets per string column)."""

    __slots__ = ("n", "cols", "nbytes", "acc", "takes")

    def __init__(self, n: int) -> None:
        self.n = n
        self.cols: dict[str, tuple] = {}
        self.nbytes = 200
        self.acc: list | None = None          # the 15 getters in column order, once all loaded
        self.takes: list | None = None        # the 15 bulk getters (rows -> values)

    def add(self, table: pa.Table, path: str, first: int) -> None:
        for name in table.column_names:
            if name in self.cols:
                continue
            arr = table.column(name).combine_chunks()
            if len(arr) != self.n:
                raise CorruptStateCheckpointError(
                    f"cool column {name} has {len(arr)} rows in a group of {self.n}", path=path, offset=first)
            v = _col_view(name, arr, path, first)
            self.cols[name] = v
            self.nbytes += v[1]
        if self.acc is None and len(self.cols) == len(_COLS):
            self.acc = [self.cols[name][0] for name in _COLS]
            self.takes = [self.cols[name][4] for name in _COLS]

    def spans(self) -> tuple[bytes, np.ndarray]:
        """(content bytes, int64 offsets) for find_spans."""
        _g, _nb, content, offs, _t = self.cols["content"]
        return content.all_bytes(), np.frombuffer(offs, dtype=np.int32).astype(np.int64)

    def compress(self) -> int:
        """Compress the cached content column (if loaded and not yet); returns
        the bytes saved."""
        c = self.cols.get("content")
        if c is None or c[2].data is None:
            return 0
        saved = c[2].compress()
        self.nbytes -= saved
        return saved


def _assemble_at(acc: list, i: int) -> tuple[dict | None, int, str, bool]:
    """(record dict, ord, digest, plain) of row ``i`` of a fully loaded group;
    a malformed row gives (None, ord, reason, False). ``plain``: see
    :func:`_row_digest`."""
    (mid, ch, task, hlc, content, ts, role, tok, tc, tcid, origin, sv, extra, o, dig) = acc
    try:
        tcs = tc(i)
        ex = extra(i)
        calls = [] if tcs == "[]" else _loads(tcs)
        rec = {"msg_id": mid(i), "channel_id": ch(i), "task_id": task(i), "hlc": hlc(i),
               "content": content(i), "ts": ts(i), "role": role(i), "token_estimate": tok(i),
               "tool_calls": calls,
               "tool_call_id": tcid(i), "origin": origin(i), "schema_version": sv(i)}
        ordv = o(i)
        digest = dig(i)
        plain = ex == "{}" and (not calls or _same_spelling(calls, tcs))
        if ex != "{}":
            more = _loads(ex)
            if not isinstance(more, dict):
                return None, ordv, "extra is not a JSON object", False
            rec.update(more)
    except UnicodeDecodeError as exc:
        return None, o(i), f"invalid UTF-8: {exc}", False
    except ValueError as exc:
        return None, o(i), f"bad JSON in tool_calls or extra: {exc}", False
    except IndexError as exc:
        return None, 0, f"offsets out of range: {exc}", False
    return rec, ordv, digest, plain


_LONG_NUMBER = re.compile(r"\d{19}")


def _loads(text: str) -> Any:
    """A stored JSON text (json.dumps wrote it), parsed as json.loads parses
    it: with orjson, unless a run of 19 or more digits may be an integer
    beyond 64 bits (orjson would give a float) or orjson refuses the text."""
    if _LONG_NUMBER.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def _same_spelling(value: Any, text: str) -> bool:
    """True if orjson writes ``value`` (parsed from the stored JSON ``text``,
    which json.dumps wrote) as exactly ``text``: then it spells every number
    as json does, and orjson may make the record's canonical JSON."""
    try:
        return orjson.dumps(value) == text.encode("utf-8")
    except (orjson.JSONEncodeError, UnicodeEncodeError):
        return False


def _row_digest(rec: dict, plain: bool) -> str:
    """The digest of a record read from a file. ``plain`` (no extra fields,
    tool calls that orjson spells as stored) lets orjson make the canonical
    JSON without walking the values: if its bytes hash to the stored digest
    they are the bytes the writer hashed, so the record is the one written."""
    if plain:
        ts = rec["ts"]
        if ts == 0.0 or 1e-4 <= abs(ts) < 1e16:
            try:
                return xxhash.xxh3_128_hexdigest(orjson.dumps(rec, option=orjson.OPT_SORT_KEYS))
            except orjson.JSONEncodeError:
                pass
    return record_digest(rec)


def _assemble_columns(cols: Sequence[Sequence[Any]]) -> list[tuple[dict | None, int, str, bool] | None]:
    """:func:`_assemble_many` of rows already taken: ``cols`` holds the 15
    columns' values of just those rows."""
    return _assemble_many([lambda rs, v=v: v for v in cols], [0] * (len(cols[0]) if cols else 0))


def _assemble_many(takes: list, local: list[int]) -> list[tuple[dict | None, int, str, bool] | None]:
    """_assemble_at for many rows at once, column by column; a row that
    fails to decode is redone alone (to name its problem)."""
    try:
        cols = [t(local) for t in takes]
    except (UnicodeDecodeError, IndexError):
        return [None] * len(local)  # the caller redoes each row with _assemble_at
    out: list[tuple[dict | None, int, str, bool] | None] = []
    loads = _loads
    for (mid, ch, task, hlc, content, ts, role, tok, tc, tcid, origin, sv, extra, o, dig) in zip(*cols):
        try:
            calls = [] if tc == "[]" else loads(tc)
            rec = {"msg_id": mid, "channel_id": ch, "task_id": task, "hlc": hlc,
                   "content": content, "ts": ts, "role": role, "token_estimate": tok,
                   "tool_calls": calls,
                   "tool_call_id": tcid, "origin": origin, "schema_version": sv}
            if extra != "{}":
                more = loads(extra)
                if not isinstance(more, dict):
                    out.append((None, o, "extra is not a JSON object", False))
                    continue
                rec.update(more)
                plain = False
            else:
                plain = not calls or _same_spelling(calls, tc)
        except ValueError as exc:
            out.append((None, o, f"bad JSON in tool_calls or extra: {exc}", False))
            continue
        out.append((rec, o, dig, plain))
    return out


_SCAN_POOL: Any = None
_SCAN_POOL_LOCK = threading.Lock()


class _Deferred:
    """A call made when its result is asked for (a future's ``result()``)."""

    __slots__ = ("_fn", "_arg")

    def __init__(self, fn: Callable[[Any], Any], arg: Any) -> None:
        self._fn = fn
        self._arg = arg

    def result(self) -> Any:
        return self._fn(self._arg)


def _scan_pool() -> Any:
    """The threads that decompress and search cool pages for searches (two;
    made at the first search that scans the files)."""
    global _SCAN_POOL
    with _SCAN_POOL_LOCK:
        if _SCAN_POOL is None:
            from concurrent.futures import ThreadPoolExecutor
            _SCAN_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rune-fast-scan")
        return _SCAN_POOL


def _forget_scan_pool() -> None:
    # A forked child has none of the parent's threads: a pool inherited from
    # it would queue work that nothing runs. The child makes its own.
    global _SCAN_POOL, _SCAN_POOL_LOCK
    _SCAN_POOL = None
    _SCAN_POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_scan_pool)


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
    ``relevant_specials(folded)``."""
    folded = needle.casefold()
    if not folded.isascii():
        return None
    nb = folded.encode("ascii")
    repl = [(c.encode("utf-8"), c.casefold().encode("utf-8")) for c in _relevant_specials(folded)]
    return lambda raw: _ascii_fold_has(raw, nb, repl)


relevant_specials = _relevant_specials


def _folded_hits(get: Any, rows: list[int], lo: int, needle: str) -> list[int]:
    """The rows (offset by ``lo``) whose casefolded content holds ``needle``;
    a row that does not decode is kept (reading it whole reports it)."""
    out = []
    for i in rows:
        try:
            if needle not in get(i + lo).casefold():
                continue
        except UnicodeDecodeError:
            pass
        out.append(i)
    return out


def _table_group(table: pa.Table, path: str = "", first: int = 0) -> _Group:
    g = _Group(table.num_rows)
    g.add(table.select(_COLS), path, first)
    return g


class _Located(NamedTuple):
    no: int
    row: int


# --------------------------------------------------------------------------- #
# The archive
# --------------------------------------------------------------------------- #

def _index_field(name: str, *, settable: bool = False, doc: str | None = None) -> property:
    """A field of a CoolArchive's index, read after the sidecars still unread
    are read (see ``CoolArchive.__init__``): every path to the index sees
    every live file."""
    def get(self: "CoolArchive") -> Any:
        if self._unloaded:
            self._load_sidecars()
        return getattr(self, name)

    def put(self: "CoolArchive", value: Any) -> None:
        setattr(self, name, value)
    return property(get, put if settable else None, doc=doc)


class CoolArchive:
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
    opened with ``durability="none"``. ``cool``, ``erase`` and ``merge`` also
    take ``durable=`` per call.

    ``cache_bytes`` bounds the decoded row groups kept in memory (Arrow
    buffers plus per-column overhead, counted honestly).

    Reads are safe from many threads. Writes (``cool``, ``erase``, ``merge``,
    ``unlink_files``, ``gc``) expect the caller's lock, but take the archive's
    own lock too.
    """

    def __init__(self, cool_dir: str | os.PathLike, files: Iterable[str] = (), *,
                 read_only: bool = False, cache_bytes: int = 8 << 20,
                 row_group_rows: int = ROW_GROUP_ROWS, durable: bool = True,
                 index_dir: str | os.PathLike | None = None,
                 expect: Mapping[str, Sequence[Any]] | None = None) -> None:
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
        self._grams: dict[tuple[int, int], bytes] = {}
        self._grams_bytes = 0
        self._grams_read: set[int] = set()     # files whose filters file was looked for
        self._grams_new: set[int] = set()      # files with filters built here, not yet kept on disk
        self._channels_d: dict[str, list[int]] = {}
        self._tasks_d: dict[str, list[int]] | None = None   # built at the first task query
        self._task_locs_d: dict[str, list[int]] = {}         # task_locs' answers (see _TASK_LOCS_KEPT)
        # id index: xxh3_64(msg_id) -> (file no << 32) | row, every live file
        self._ids_d = HashIndex()
        self._pending_d: list[int] = []     # live files whose ids are not in _ids yet
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
        self._lookups = 0
        self._ids_built = False     # the id index was built once: later files join it at once
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

    rebuilt_sidecars = _index_field("_rebuilt", doc="Sidecars found damaged or stale and rebuilt from their files.")
    _files = _index_field("_files_d")               # no -> _FileIndex
    _channels = _index_field("_channels_d")         # channel -> file numbers
    _tasks = _index_field("_tasks_d", settable=True)  # task -> file numbers (None: not built yet)
    _ids = _index_field("_ids_d", settable=True)    # HashIndex of the files not pending
    _pending = _index_field("_pending_d")           # files whose ids are not in _ids yet

    @classmethod
    def open(cls, cool_dir: str | os.PathLike, files: Iterable[str], **kwargs: Any) -> "CoolArchive":
        """Open the archive whose live files are ``files`` (see the class)."""
        return cls(cool_dir, files, **kwargs)

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
            self._grams.clear()
            self._grams_bytes = 0
            self._grams_read.clear()
            self._grams_new.clear()

    # ------------------------------------------------------------------ info

    @property
    def cool_dir(self) -> str:
        return self._dir

    def files(self) -> list[str]:
        """Names of the live files, oldest first: what the manifest records."""
        with self._lock:
            return [_parquet_name(no) for no in sorted(self._live_nos())]

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

    def channel_counts(self) -> dict[str, int]:
        with self._lock:
            return {ch: self.channel_len(ch) for ch in sorted(self._channels)}

    def task_len(self, task_id: str) -> int:
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
                "index_bytes": int(self._ids.nbytes) + sum(
                    self._files[no].hashes.nbytes + self._files[no].hrows.nbytes for no in self._pending),
                "cached_bytes": self._cached_bytes,
                "rebuilt_sidecars": list(self.rebuilt_sidecars),
            }

    # ------------------------------------------------------------------ loading

    def _path(self, name: str) -> str:
        return os.path.join(self._dir, name)

    def _ipath(self, name: str) -> str:
        return os.path.join(self._idx_dir, name)

    @property
    def index_dir(self) -> str:
        """The folder of the sidecars."""
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
                    return fi
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
        return fi

    def _parquet(self, no: int) -> pq.ParquetFile:
        pf = self._handles.get(no)
        if pf is not None:
            self._handles.move_to_end(no)
            return pf
        pf = _open_checked(self._path(_parquet_name(no)))
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
        table = self._read_table(no)
        if table.num_rows != pf.metadata.num_rows:
            raise CorruptStateCheckpointError(
                f"cool archive holds {pf.metadata.num_rows} rows by its footer, {table.num_rows} read", path=path)
        if verify:
            for row, bad in self._check_table(table):
                raise CorruptStateCheckpointError(f"cool row {row} fails its digest ({bad})",
                                                  path=path, offset=row)
        return _build_index(no, size, footer, table.column("msg_id"), table.column("channel_id"),
                            table.column("task_id"), rg_counts, path)

    @staticmethod
    def _check_table(table: pa.Table, base: int = 0,
                     sound: Callable[[dict], None] | None = None) -> Iterator[tuple[int, str]]:
        """Yield (row, reason) for every row whose digest does not match;
        ``sound(record dict)`` is called for every row whose digest does."""
        try:
            acc = _table_group(table).acc
        except CorruptStateCheckpointError as exc:
            yield base, str(exc)
            return
        assert acc is not None      # _table_group adds every column
        for i in range(table.num_rows):
            rec, _o, dig, plain = _assemble_at(acc, i)
            if rec is None:
                yield base + i, str(dig)
            elif _row_digest(rec, plain) != dig:
                yield base + i, "digest mismatch"
            elif sound is not None:
                sound(rec)

    # ------------------------------------------------------------------ index upkeep

    def _add_file(self, fi: _FileIndex) -> None:
        # (the fields themselves: this runs while the sidecars are being read)
        self._files_d[fi.no] = fi
        self._task_locs_d.clear()
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
        # The global id index takes the file's ids at the first lookups that
        # need it: an open followed by hot-tier reads never builds it, and a
        # few lookups before then search the files' sorted hashes instead.
        # Once built, a new file (a cooling run, a merge) joins it at once:
        # the append path's duplicate check then asks one hash table.
        if self._ids_built:
            self._index_ids(fi)
        else:
            self._pending_d.append(no)

    def _index_ids(self, fi: "_FileIndex") -> None:
        """Put a file's ids into the global index (its arrays then go)."""
        self._ids_d.insert_many(fi.hashes, (np.int64(fi.no) << np.int64(32)) | fi.hrows.astype(np.int64))
        fi.hashes = fi.hrows = None  # type: ignore[assignment]

    def _build_ids(self) -> None:
        """Move the pending files' ids into the global index (~17-35 bytes per
        cooled message)."""
        for no in self._pending:
            self._index_ids(self._files[no])
        self._pending.clear()
        self._lookups = 0
        self._ids_built = True

    def _id_locs(self, msg_id: str) -> list[int]:
        """``(file no << 32) | row`` of every archived row whose id hashes
        like ``msg_id`` (lock held)."""
        h = _id_hash(msg_id)
        if self._pending:
            self._lookups += 1
            if self._lookups > _LAZY_LOOKUPS:
                self._build_ids()
            else:
                out = self._ids.values(h)
                key = np.uint64(h)
                for no in self._pending:
                    fi = self._files[no]
                    i = int(np.searchsorted(fi.hashes, key))
                    while i < len(fi.hashes) and fi.hashes[i] == key:
                        out.append((no << 32) | int(fi.hrows[i]))
                        i += 1
                return out
        return self._ids.values(h)

    def _drop_files(self, nos: list[int]) -> None:
        self._build_ids()
        self._task_locs_d.clear()
        drop = set(nos)
        n_drop = 0
        for no in nos:
            fi = self._files.pop(no)
            self._ranges.pop(no, None)
            self._digests.pop(no, None)
            if self._span is None:
                self._span = False      # the file without a range may be the one going
            n_drop += fi.rows
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
        if not n_drop:
            return
        if n_drop * 8 < len(self._ids):
            # few entries: remove them one by one, found through each file's sidecar
            # (still on disk: the caller unlinks replaced files afterwards)
            try:
                pairs = [(no, self._sidecar_entries(no)) for no in nos]
            except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
                pairs = None
            if pairs is not None:
                remove = self._ids.remove
                for no, (hs, rows) in pairs:
                    base = no << 32
                    for h, r in zip(hs.tolist(), rows.tolist()):
                        remove(h, base | r)
                return
        hs, locs = self._ids.to_arrays()
        keep = ~np.isin(locs >> np.int64(32), np.asarray(sorted(drop), dtype=np.int64))
        self._ids = HashIndex.from_arrays(hs[keep], locs[keep])

    def _sidecar_entries(self, no: int) -> tuple[np.ndarray, np.ndarray]:
        ipath = self._sidecar_path(no)
        with open(ipath, "rb") as f:
            fi = _FileIndex.decode(f.read(), no, ipath)
        return fi.hashes, fi.hrows

    def _file_entries(self, no: int) -> tuple[np.ndarray, np.ndarray]:
        """(hashes, rows) of file ``no`` in the id index, by hash then row."""
        self._build_ids()
        h, loc = self._ids.to_arrays()
        m = (loc >> np.int64(32)) == no
        h = h[m]
        r = (loc[m] & np.int64(0xFFFFFFFF)).astype(np.uint32)
        order = np.lexsort((r, h))
        return h[order], r[order]

    def _forget_cache(self, no: int) -> None:
        self._full = False
        for key in [k for k in self._cache if k[0] == no]:
            self._cached_bytes -= self._cache.pop(key).nbytes
        for key in [k for k in self._grams if k[0] == no]:
            self._grams_bytes -= len(self._grams.pop(key))
        self._grams_read.discard(no)
        self._grams_new.discard(no)
        pf = self._handles.pop(no, None)
        if pf is not None:
            _close(pf)
        reader = self._readers.pop(no, None)
        if reader is not None:
            reader.close()

    def _locate(self, msg_id: str) -> list[_Located]:
        return [_Located(loc >> 32, loc & 0xFFFFFFFF)
                for loc in self._id_locs(msg_id)]

    # ------------------------------------------------------------------ row access

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
        pf = self._parquet(no)
        path = self._path(_parquet_name(no))
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

    def _with_reader(self, no: int, read: Any) -> Any:
        """``read(reader)`` with file ``no``'s PageReader, or None if the file
        is not in a layout it reads (then it is not asked again). PageError
        (damage) passes to the caller."""
        reader = self._reader(no)
        if reader is None:
            return None
        try:
            return read(reader)
        except Unsupported:
            self._readers[no] = None
            reader.close()
            return None

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

    # ------------------------------------------------------------------ reads

    def get_row(self, msg_id: str) -> CoolRow | None:
        """The archived message ``msg_id`` with its ordinal and place, or None.

        Raises CorruptStateCheckpointError (file and row) when the stored row
        fails its digest or its id does not match."""
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

    def contains_many(self, msg_ids: Sequence[str]) -> np.ndarray:
        """Boolean array: which of ``msg_ids`` are archived. The ids' hashes
        are looked up at once; only an id whose hash is archived has its
        stored id read (as :meth:`contains` does)."""
        msg_ids = list(msg_ids)
        out = np.zeros(len(msg_ids), dtype=bool)
        if not msg_ids:
            return out
        span = self._id_span()
        if span is not None and not any(span[0] <= m <= span[1] for m in msg_ids):
            return out
        with self._lock:
            if not self._files:
                return out
            hs = _id_hashes(msg_ids)
            if self._pending:
                # each id counts as a lookup (see _id_locs): a store fed by
                # batches builds the id index as one fed one by one does,
                # instead of searching every pending file's hashes per batch
                self._lookups += len(msg_ids)
                if self._lookups > _LAZY_LOOKUPS:
                    self._build_ids()
            cand = self._ids.has_many(hs)
            for no in self._pending:
                fh = self._files[no].hashes
                if len(fh):
                    at = np.minimum(np.searchsorted(fh, hs), len(fh) - 1)
                    cand |= fh[at] == hs
            for i in np.flatnonzero(cand):
                out[i] = self.contains(msg_ids[i])
        return out

    def has_files(self) -> bool:
        """True if the archive serves at least one file (cheaper than len();
        no lock: a background write holds it for a while)."""
        return bool(self._files_d) or bool(self._unloaded)

    def _channel_parts(self, channel_id: str) -> list[list[CoolRow]]:
        parts = []
        for no in self._channels.get(channel_id, ()):
            s, e, _ = self._files[no].channels[channel_id]
            rows = self._rows(no, s, e)
            self._check_field(rows, "channel_id", channel_id)
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

    def channel_tail(self, channel_id: str, n: int) -> list[CoolRow]:
        """The newest ``n`` archived messages of the channel, oldest first."""
        if n <= 0:
            return []
        with self._lock:
            parts = []
            for no in self._channels.get(channel_id, ()):
                s, e, _ = self._files[no].channels[channel_id]
                # each file's range is in key order: only its last n can qualify
                rows = self._rows(no, max(s, e - n), e)
                self._check_field(rows, "channel_id", channel_id)
                parts.append(rows)
        merged = _merge(parts)
        return merged[-n:]

    def task_rows(self, task_id: str) -> list[CoolRow]:
        """Every archived message of the task, oldest first by the order key."""
        with self._lock:
            out = []
            for no in self._task_map().get(task_id, ()):
                rows = self._rows(no, 0, 0, self._files[no].tasks[task_id])
                self._check_field(rows, "task_id", task_id)
                out.extend(rows)
        out.sort(key=_row_key)
        return out

    @staticmethod
    def loc_of(row: CoolRow) -> int:
        """The location (:func:`cool_loc`) of a row, as :meth:`task_locs` names it."""
        return cool_loc(_file_no(row.file), row.row)

    def task_locs(self, task_id: str) -> list[int]:
        """The locations (:func:`cool_loc`) of every archived message of the
        task (as the sidecars say; :meth:`rows_at` reads and verifies them)."""
        with self._lock:
            kept = self._task_locs_d.get(task_id) if not self._unloaded else None
            if kept is not None:
                return list(kept)
            out: list[int] = []
            for no in self._task_map().get(task_id, ()):
                base = no << 32     # (a task's rows are few: Python ints beat numpy's calls)
                out += [base | r for r in self._files[no].tasks[task_id].tolist()]
            if len(self._task_locs_d) >= _TASK_LOCS_KEPT:
                self._task_locs_d.clear()
            self._task_locs_d[task_id] = out
            return list(out)

    def id_locs(self, msg_id: str) -> list[int]:
        """The locations (:func:`cool_loc`) of the archived rows whose id
        hashes like ``msg_id`` (usually none or one; :meth:`rows_at` reads them)."""
        with self._lock:
            return list(self._id_locs(msg_id))

    def rows_at(self, locs: Sequence[int]) -> list[CoolRow]:
        """The verified rows at ``locs`` (from :meth:`task_locs` or
        :meth:`id_locs`), in their order. Damage raises
        CorruptStateCheckpointError (file and row)."""
        with self._lock:
            by_file: dict[int, list[int]] = {}
            for loc in locs:
                no = loc >> 32
                if no not in self._files:
                    raise CorruptStateCheckpointError(f"cool file number {no} is not live", path=self._dir)
                by_file.setdefault(no, []).append(loc & 0xFFFFFFFF)
            got: dict[int, CoolRow] = {}
            for no, rows in by_file.items():
                rows = sorted(set(rows))
                for r, row in zip(rows, self._rows(no, 0, 0, rows)):
                    got[cool_loc(no, r)] = row
            return [got[loc] for loc in locs]

    def latest_task_row(self, channel_id: str) -> CoolRow | None:
        """The newest archived message of the channel that has a task, or None."""
        with self._lock:
            best: CoolRow | None = None
            for no in self._channels.get(channel_id, ()):
                s, e, lt = self._files[no].channels[channel_id]
                if lt < 0:
                    continue
                r = self._row(no, lt)
                if r.record["channel_id"] != channel_id or r.record["task_id"] == "":
                    raise CorruptStateCheckpointError(
                        f"cool index says row {lt} is a task message of channel {channel_id!r}",
                        path=self._path(r.file), offset=lt)
                if best is None or _row_key(r) > _row_key(best):
                    best = r
            return best

    def latest_task(self, channel_id: str) -> str | None:
        """task_id of the newest archived message of the channel that has one."""
        r = self.latest_task_row(channel_id)
        return None if r is None else r.record["task_id"]

    def search(self, text: str, channel_id: str | None = None, *,
               case_sensitive: bool = False) -> list[CoolRow]:
        """Archived messages whose content contains ``text`` (case-insensitive:
        ``text.casefold() in content.casefold()``), oldest first by the order
        key. Every hit is verified against its digest."""
        return self.search_known(text, channel_id, case_sensitive=case_sensitive)[0]

    def search_known(self, text: str, channel_id: str | None = None, *, case_sensitive: bool = False,
                     known: Container[int] = ()) -> tuple[list[CoolRow], list[int]]:
        """:meth:`search`, except that a hit whose location (:func:`cool_loc`)
        is in ``known`` (rows the caller holds verified records of; it must not
        change during the call) may be reported by that location instead of
        read: ``(rows, locs)``, the rows as :meth:`search` gives them, the
        locations in no order. A location names a row whose content bytes
        the search matched as it matches before reading a row; the caller
        checks its own record (content, channel) as this method checks the
        rows it reads. Reading a hit's other columns is most of a search of
        the pages (a page of each column per hit): a search asked again
        skips it for the rows its caller kept."""
        if not isinstance(text, str):
            raise TypeError(f"search text must be str, got {type(text).__name__}")
        needle = text if case_sensitive else text.casefold()
        nb = needle.encode("utf-8", "surrogatepass")
        # case-insensitive: an ASCII needle matches a row iff its ASCII-case-blind
        # bytes hold it, or the row holds a SPECIAL_FOLD character (checked in
        # Python). A non-ASCII needle: rows whose bytes hold its longest ASCII
        # run (case-blind), or with a SPECIAL_FOLD character, or, with no ASCII
        # run, every non-ASCII row; all checked with str.casefold.
        mode = "all" if needle == "" else "cs" if case_sensitive else "ci"
        probe = nb
        if mode == "ci" and not needle.isascii():
            runs = re.findall(r"[\x00-\x7f]+", needle)
            probe = max(runs, key=len).encode("ascii") if runs else b""
            mode = "ci-run" if probe else "ci-nonascii"
        specials = _relevant_specials(probe.decode("ascii")) if mode in ("ci", "ci-run") else ()
        fold_repl = [(c.encode("utf-8"), c.casefold().encode("utf-8")) for c in specials]
        hits: list[CoolRow] = []
        known_hits: list[int] = []
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
                sel_rows = []
                found: list[CoolRow] = []
                # the groups the cache does not hold are searched in their
                # pages (content pages only, those whose filters may match
                # once a scan built them or an earlier process kept them),
                # not poured through the cache: a group decodes whole there
                scans: dict[int, Any] | None = None if mode in ("ci", "cs") else {}
                for rg in range(rg_a, rg_b):
                    if scans is None and (no, rg) not in self._cache:
                        scans = self._start_scans(no, [r for r in range(rg, rg_b) if (no, r) not in self._cache],
                                                  s, e, mode, nb, fold_repl, known)
                    base = fi.rg_list[rg]
                    n = fi.rg_list[rg + 1] - base
                    lo, hi = max(s - base, 0), min(e - base, n)
                    if mode == "all":
                        sel_rows.append(np.arange(lo + base, hi + base, dtype=np.int64))
                        continue
                    pinned: dict = {}      # this group, even if the cache does not keep it
                    if scans and rg in scans:
                        got = self._scan_result(no, rg, scans.pop(rg))
                        if got is not None:
                            found.extend(self._verified(fi.name, [base + i for i in got[0]], got[1]))
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
                        if mode == "ci-nonascii":
                            data, offs = g.spans()
                            exact = np.zeros(0, np.int64)
                            maybe: Any = find_spans(data, offs[lo:hi], offs[lo + 1:hi + 1],
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
                                maybe = _folded_hits(content.get, maybe.tolist(), lo, needle)
                            maybe = np.asarray(maybe, dtype=np.int64)
                            idx = np.union1d(exact, maybe) if len(exact) else maybe
                        else:
                            idx = exact
                    if len(idx):
                        found.extend(self._rows(no, 0, 0, idx + (lo + base), pinned))
                if sel_rows:
                    found.extend(self._rows(no, 0, 0, np.concatenate(sel_rows)))
                if found:
                    rows = found
                    if mode == "cs":
                        rows = [r for r in rows if needle in r.record["content"]]
                    if channel_id is not None:
                        self._check_field(rows, "channel_id", channel_id)
                    hits.extend(rows)
            if self._grams_new and not self._read_only:
                self._keep_grams()
        hits.sort(key=_row_key)
        return hits, known_hits

    def _start_scans(self, no: int, rgs: list[int], s: int, e: int, mode: str, nb: bytes,
                     fold_repl: list[tuple[bytes, bytes]], known: Container[int] = ()
                     ) -> dict[int, Any]:
        """Start the search of row groups ``rgs`` of file ``no`` (groups the
        cache does not hold; rows ``[s, e)`` of the file) in the file's pages
        as they are decompressed, without building or caching the groups:
        rg -> future of (rows within the group, their assembled values; see
        :meth:`_scan_result`; the hits in ``known`` are not read, only
        named). ``mode`` "ci": ``nb`` (ASCII, casefolded)
        matched ASCII-case-blind, the rows holding a SPECIAL_FOLD character
        of ``fold_repl`` checked one by one; "cs": bytes as they are. The
        hits' other columns are read by the same task; two run at a time
        (decompression, I/O and the search leave the GIL). Empty if the file
        is not in a layout the PageReader reads."""
        reader = self._reader(no) if rgs else None
        if reader is None:
            return {}
        if no not in self._grams_read:
            self._read_grams(no)
        probes = [(nb.lower(), True) if mode == "ci" else (nb, False)] + [(a, False) for a, _b in fold_repl]
        starts = self._files[no].rg_list

        def scan(rg: int) -> tuple[list[int], list, bytes | None, list[int]]:
            lo, hi, base = s - starts[rg], e - starts[rg], cool_loc(no, starts[rg])
            res, built = reader.find(rg, _CONTENT_COL, probes, self._grams.get((no, rg)))
            hits = {i: v for i, v in res[0] if lo <= i < hi}
            for part in res[1:]:
                for i, v in part:
                    if lo <= i < hi and i not in hits and _ascii_fold_has(v, nb, fold_repl):
                        hits[i] = v
            local: list[int] = []
            named: list[int] = []
            for i in sorted(hits):
                (named if base + i in known else local).append(i)
            if not local:
                return local, [], built, named
            vals = reader.rows(rg, local, {_CONTENT_COL: [hits[i] for i in local]})
            return local, _assemble_columns(list(zip(*vals))), built, named

        # a group whose page filters are known reads a few pages: scanned when
        # its turn comes, on this thread (two threads would fight for the GIL)
        pool = _scan_pool()
        return {rg: _Deferred(scan, rg) if (no, rg) in self._grams else pool.submit(scan, rg)
                for rg in rgs}

    def _read_grams(self, no: int) -> None:
        """Take file ``no``'s content-page filters from its filters file, if
        a search of an earlier process kept one (lock held; within
        _GRAMS_BUDGET). One that does not hold for the live file (damaged,
        stale, another build's) is named in a log warning and removed: the
        next scan of each group builds its filters again. Only the scans use
        them, and a filter that names fewer pages than the group holds makes
        PageReader.find refuse it (the group is read instead)."""
        self._grams_read.add(no)
        fi = self._files[no]
        got = read_kept(self._ipath(_grams_name(no)),
                        lambda raw: _decode_grams(raw, fi.size, fi.footer, len(fi.rg_list) - 1),
                        remove_bad=not self._read_only)
        for rg, grams in (got or {}).items():
            if (no, rg) not in self._grams and self._grams_bytes + len(grams) <= _GRAMS_BUDGET:
                self._grams[(no, rg)] = grams
                self._grams_bytes += len(grams)

    def _keep_grams(self) -> None:
        """Write the filters files of the files whose filters a search built
        (lock held; a writer's): temp file (fsynced when durable), rename.
        A cache: a crash that loses one costs the next process a full scan;
        one the rename did not make whole fails its checksum when read. A
        failed write is logged and skipped (the search that built them has
        its answer)."""
        for no in sorted(self._grams_new):
            fi = self._files.get(no)
            if fi is None:
                continue
            entries = sorted((rg, g) for (n, rg), g in self._grams.items() if n == no)
            name = _grams_name(no)
            write_kept(self._ipath(name), _encode_grams(fi.size, fi.footer, entries),
                       tmp=self._ipath("." + name + ".tmp"), sync=self._durable)
        self._grams_new.clear()

    def _scan_result(self, no: int, rg: int, fut: Any) -> tuple[list[int], list, list[int]] | None:
        """What a scan of :meth:`_start_scans` found (rows read, their values,
        rows only named), or None: the caller reads the group instead (a
        layout the PageReader does not read, or damage, which that read
        names)."""
        try:
            local, many, built, named = fut.result()
        except PageError:
            return None
        except Unsupported:
            self._readers[no] = None    # (closed when the other scans drop it)
            return None
        if built is not None and no in self._files and self._grams_bytes + len(built) <= _GRAMS_BUDGET:
            # the pages' trigram filters: later scans of the group read only pages that may match
            self._grams[(no, rg)] = built
            self._grams_bytes += len(built)
            self._grams_new.add(no)
        if any(got is None for got in many):
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
        return found[0] if len(found) == 1 else np.unique(np.concatenate(found))

    def iter_rows(self) -> Iterator[CoolRow]:
        """Every archived row, file by file in stored order (verified)."""
        for name in self.files():
            no = _file_no(name)
            with self._lock:
                if no not in self._files:
                    continue
                fi = self._files[no]
                for rg in range(len(fi.rg_starts) - 1):
                    rows = self._rows(no, int(fi.rg_starts[rg]), int(fi.rg_starts[rg + 1]))
                    yield from rows

    # ------------------------------------------------------------------ writing

    def _dur(self, durable: bool | None) -> bool:
        return self._durable if durable is None else bool(durable)

    def _write_tmp(self, name: str, data: bytes | None = None, table: pa.Table | None = None,
                   *, durable: bool, folder: str | None = None) -> str:
        """Write ``name``'s temp file (0600) in ``folder`` (default: the
        archive folder), fsynced when ``durable``; returns its path."""
        tmp = os.path.join(folder or self._dir, "." + name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=True) as f:
                if data is not None:
                    f.write(data)
                else:
                    pq.write_table(
                        table, f, row_group_size=self._rg_rows, compression="zstd",
                        write_page_checksum=True, use_dictionary=False, data_page_version="1.0",
                        data_page_size=_PAGE_BYTES, write_batch_size=_PAGE_BATCH_ROWS,
                        write_statistics=["channel_id", "ts", "ord"],
                    )
                f.flush()
                if durable:
                    os.fsync(f.fileno())
        except BaseException:
            _unlink_quiet(tmp)
            raise
        return tmp

    def _write_atomic(self, name: str, data: bytes, *, durable: bool | None = None,
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

    def _take_no(self) -> int:
        with self._lock:
            no = self._next_no
            self._next_no += 1
            return no

    def _write_file(self, table: pa.Table, *, durable: bool) -> _FileIndex:
        """Write ``table`` as the next numbered file plus its sidecar: both
        temp files written and fsynced, both renamed, one folder fsync (three
        fsyncs in all; none unless ``durable``)."""
        no = self._take_no()
        name, iname = _parquet_name(no), _idx_name(no)
        tmp = self._write_tmp(name, table=table, durable=durable)
        itmp = None
        try:
            size, footer = _footer_hash(tmp)
            md = pq.read_metadata(tmp)
            rg_counts = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
            fi = _build_index(no, size, footer, table.column("msg_id"), table.column("channel_id"),
                              table.column("task_id"), rg_counts, self._path(name))
            fi.id_range = _id_range(table.column("msg_id"))
            fi.digest = _file_digest(tmp)
            itmp = self._write_tmp(iname, fi.encode(), durable=durable, folder=self._idx_dir)
            os.replace(itmp, self._ipath(iname))
            os.replace(tmp, self._path(name))
        except BaseException:
            _unlink_quiet(tmp)
            if itmp is not None:
                _unlink_quiet(itmp)
                _unlink_quiet(self._ipath(iname))
            raise
        if durable:
            # (the sidecar's folder is not synced: a sidecar a power loss
            # takes is rebuilt from its file, which this sync keeps)
            fsync_dir(self._dir)
        return fi

    def _writable(self) -> None:
        if self._read_only:
            from .errors import ReadOnlyStoreError
            raise ReadOnlyStoreError(f"cool archive {self._dir} is open read-only")

    def cool(self, rows: Sequence[dict], ords: Sequence[int], *, durable: bool | None = None,
             trusted: bool = False) -> CoolRun:
        """Archive ``rows`` (record dicts) with their append ordinals ``ords``
        as ONE new Parquet file; durable when this returns.

        Rows are grouped by channel (stable: within a channel the given order,
        which must be the order key, is kept). ``durable=False`` skips the
        fsyncs (default: the archive's ``durable``). Raises TypeError/ValueError
        naming the row and field for a malformed dict, a msg_id given twice or
        already archived; nothing is written then. ``trusted``: the rows were
        decoded from the caller's own checksummed records (the repository's
        hot lines), so the field-by-field check of each dict is skipped (a
        malformed one still fails the Arrow conversion, before anything is
        written). Returns the new file's name (None for no rows): the caller
        records it in its manifest."""
        with self._lock:
            return self._serve(self.stage(rows, ords, durable=durable, trusted=trusted))

    def cool_table(self, table: pa.Table, *, durable: bool | None = None) -> CoolRun:
        """:meth:`cool` of rows already in a table (see :meth:`stage_table`)."""
        with self._lock:
            return self._serve(self.stage_table(table, durable=durable))

    def _serve(self, fi: "_FileIndex | None") -> CoolRun:
        """Adopt a file just staged (lock held); the run :meth:`cool` returns."""
        if fi is None:
            return CoolRun(None, 0, 0, self.files())
        self.adopt(fi)
        return CoolRun(fi.name, fi.rows, fi.size, self.files())

    def stage(self, rows: Sequence[dict], ords: Sequence[int], *,
              durable: bool | None = None, trusted: bool = False) -> "_FileIndex | None":
        """Write ``rows`` as :meth:`cool` does, but do not serve the file yet:
        :meth:`adopt` serves it, :meth:`discard` removes it. Until then it is
        a stray (removed by :meth:`gc`, or by the repository's open after a
        crash). Meant to run in a background thread while the archive serves
        reads: only the file number and the duplicate check take the lock."""
        self._writable()
        rows = list(rows)
        ords = [int(o) for o in ords]
        if len(ords) != len(rows):
            raise ValueError(f"cool: {len(rows)} rows but {len(ords)} ordinals")
        if not rows:
            return None
        seen = set()
        digests = []
        for i, d in enumerate(rows):
            if not trusted:
                _validate(d, i)
            digests.append(_digest_checked(d, i))
            if d["msg_id"] in seen:
                raise ValueError(f"row {i}: msg_id {d['msg_id']!r} given twice")
            seen.add(d["msg_id"])
            if not _INT64[0] <= ords[i] <= _INT64[1]:
                raise ValueError(f"row {i}: ord {ords[i]} is out of range")
        return self._stage(_table_from_records(rows, ords, digests), [d["msg_id"] for d in rows],
                           durable)

    def stage_table(self, table: pa.Table, *, durable: bool | None = None) -> "_FileIndex | None":
        """:meth:`stage` of rows already in a table of the cool schema, with
        their ``ord`` and ``digest`` (what :func:`table_from_lines` makes of
        the repository's hot lines, which are checksummed: the values are not
        checked again). ValueError for a msg_id given twice or already
        archived; nothing is written then."""
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
        table = _by_channel(table)
        fi = self._write_file(table, durable=self._dur(durable))
        del table
        _release_arrow()
        return fi

    def adopt(self, fi: "_FileIndex") -> list[str]:
        """Serve a file written by :meth:`stage`; returns the live files."""
        self._writable()
        with self._lock:
            if fi.no in self._files:
                raise ValueError(f"adopt: {fi.name} is already live")
            self._add_file(fi)
            return self.files()

    def discard(self, fi: "_FileIndex") -> None:
        """Remove a file written by :meth:`stage` that will not be adopted."""
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
            for path in (self._path(fi.name), self._ipath(_idx_name(fi.no))):
                _unlink_quiet(path)

    def _switch(self, old_nos: list[int], new: list[_FileIndex]) -> None:
        """Serve ``new`` instead of ``old_nos`` (all new files are durable)."""
        self._drop_files(list(old_nos))
        for fi in new:
            self._add_file(fi)

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

    def merge(self, groups: Sequence[Sequence[str]] | None = None, *, fanout: int = 4,
              max_files: int | None = None, durable: bool | None = None) -> CoolChange:
        """Merge each group of live files (default: :meth:`plan_merge`) into
        one new file, rows sorted by channel then order key. Same protocol as
        :meth:`erase`: record ``files``, then ``unlink_files(removed)``."""
        self._writable()
        with self._lock:
            if groups is None:
                groups = self.plan_merge(fanout=fanout, max_files=max_files)
            return self.adopt_merge(self.stage_merge(groups, durable=durable))

    def stage_merge(self, groups: Sequence[Sequence[str]], *, durable: bool | None = None) -> "StagedMerge":
        """Write the merged files of :meth:`merge` without serving them:
        :meth:`adopt_merge` switches to them, :meth:`discard_merge` removes
        them. Meant for a background thread while the archive serves reads:
        the sources are read through handles of its own, and nothing else may
        change the archive until the merge is adopted or discarded."""
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
        replaced: dict[str, str | None] = {}
        new: list[_FileIndex] = []
        try:
            for nos in jobs:
                table = pa.concat_tables([self._read_table_fresh(no) for no in nos])
                table = table.take(_merge_order(table))
                fi = self._write_file(table, durable=self._dur(durable))
                del table
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

    def _read_table_fresh(self, no: int) -> pa.Table:
        """File ``no`` read through a handle of its own (not the shared ones)."""
        path = self._path(_parquet_name(no))
        pf = _open_checked(path)
        try:
            return _read_all(pf, path)
        finally:
            _close(pf)

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
                for path in (self._path(name), self._ipath(iname), self._path("." + name + ".tmp"),
                             self._ipath("." + iname + ".tmp"), self._path(iname),
                             self._ipath(gname), self._ipath("." + gname + ".tmp")):
                    try:
                        os.unlink(path)
                        done.append(os.path.basename(path))
                    except FileNotFoundError:
                        pass
            if done and self._durable:
                fsync_dir(self._dir)
                fsync_dir(self._idx_dir)    # (an erased file's sidecar names its channels and tasks)
            return done

    def strays(self, keep: Iterable[str] | None = None) -> list[str]:
        """Archive-owned files in the folder that ``keep`` (default: the live
        files) does not reference: leftovers of a crash."""
        return sorted(n for _d, n in self._stray_files(keep))

    def _stray_files(self, keep: Iterable[str] | None = None) -> list[tuple[str, str]]:
        """(folder, name) of each file :meth:`strays` names; a sidecar left
        in the archive folder (a store written before the index folder) is
        one too."""
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

    def gc(self, keep: Iterable[str] | None = None) -> list[str]:
        """Remove stray archive files (see :meth:`strays`); returns their names.
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

    # ------------------------------------------------------------------ verify

    def verify(self, checked: dict[str, int] | None = None,
               sound: Callable[[dict], None] | None = None) -> list[CoolProblem]:
        """Check every live file: readable, schema, every row's digest, the
        sidecar on disk against the file, ids unique. Raises nothing; adds
        the rows it checked to ``checked["cool_rows"]`` and hands each sound
        row's record dict to ``sound``."""
        problems: list[CoolProblem] = []
        with self._lock:
            files = sorted(self._files.items())
        seen: dict[str, tuple[str, int]] = {}
        for no, fi in files:
            name = fi.name
            path = self._path(name)
            try:
                size, footer = _footer_hash(path)
            except (CorruptStateCheckpointError, OSError) as exc:
                problems.append(CoolProblem(name, None, str(exc)))
                continue
            if (size, footer) != (fi.size, fi.footer):
                problems.append(CoolProblem(name, None, "file changed since it was indexed"))
            want = self._digests.get(no)
            if want is not None:
                try:
                    got = _file_digest(path)
                except OSError as exc:
                    problems.append(CoolProblem(name, None, f"not readable: {exc}"))
                    continue
                if got != want:
                    problems.append(CoolProblem(
                        name, None, f"the file's bytes hash to {got}, not to the xxh3_64 {want} recorded "
                                    "when it was written: a byte changed (where no page checksum looks, "
                                    "if no row below is named)"))
            try:
                pf = _open_parquet(path)
            except CorruptStateCheckpointError as exc:
                problems.append(CoolProblem(name, None, str(exc)))
                continue
            try:
                if [(f.name, f.type) for f in pf.schema_arrow] != _COL_TYPES:
                    problems.append(CoolProblem(name, None, f"unexpected columns {pf.schema_arrow}"))
                    continue
                rg_counts = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
                mids, chs, tids = [], [], []
                base = 0
                for rg in range(pf.metadata.num_row_groups):
                    try:
                        t = pf.read_row_group(rg, use_threads=False)
                    except _PARQUET_ERRORS as exc:
                        problems.append(CoolProblem(name, base, f"row group {rg} unreadable: {exc}"))
                        raise _Skip() from None
                    for row, why in self._check_table(t, base, sound):
                        problems.append(CoolProblem(name, row, why))
                    if checked is not None:
                        checked["cool_rows"] = checked.get("cool_rows", 0) + t.num_rows
                    mids += t.column("msg_id").to_pylist()
                    chs += t.column("channel_id").to_pylist()
                    tids += t.column("task_id").to_pylist()
                    base += t.num_rows
            except _Skip:
                continue
            except _PARQUET_ERRORS as exc:
                problems.append(CoolProblem(name, None, f"not readable Parquet: {exc}"))
                continue
            finally:
                _close(pf)
                _release_arrow()
            try:
                truth = _build_index(no, size, footer, mids, chs, tids, rg_counts, path)
            except CorruptStateCheckpointError as exc:
                problems.append(CoolProblem(name, exc.offset, str(exc)))
                continue
            with self._lock:
                mine = self._file_entries(no)
            if not (_same_index(truth, fi, ids=False) and np.array_equal(mine[0], truth.hashes)
                    and np.array_equal(mine[1], truth.hrows)):
                problems.append(CoolProblem(name, None, "index in memory disagrees with the file"))
            ipath = self._sidecar_path(no)
            try:
                with open(ipath, "rb") as f:
                    disk = _FileIndex.decode(f.read(), no, ipath)
                if not _same_index(truth, disk):
                    problems.append(CoolProblem(_idx_name(no), None, "sidecar disagrees with its file"))
            except FileNotFoundError:
                problems.append(CoolProblem(_idx_name(no), None, "sidecar missing"))
            except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
                problems.append(CoolProblem(_idx_name(no), None, f"sidecar damaged: {exc}"))
            for row, mid in enumerate(mids):
                if mid in seen:
                    problems.append(CoolProblem(name, row, f"msg_id {mid!r} also in {seen[mid][0]} "
                                                           f"row {seen[mid][1]}"))
                else:
                    seen[mid] = (name, row)
        return problems


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


class _Skip(Exception):
    pass


def _release_arrow() -> None:
    """Hand the memory Arrow freed (decoded pages, tables we copied from)
    back to the OS: mimalloc and jemalloc keep it otherwise, and it would
    count against the store's resident memory (~0.1 ms)."""
    pa.default_memory_pool().release_unused()


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _map_file(path: str) -> Any:
    """A read-only map of a whole file (bytes if it is empty)."""
    with open(path, "rb") as f:
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:      # an empty file cannot be mapped
            return f.read()


def _open_parquet(path: str) -> pq.ParquetFile:
    """A ParquetFile that verifies page checksums on every read, over a file
    handle we own (closed again if the footer cannot be parsed)."""
    try:
        src = pa.OSFile(path, "rb")
    except _PARQUET_ERRORS as exc:
        raise CorruptStateCheckpointError(f"cool archive cannot be opened: {exc}", path=path) from None
    try:
        pf = pq.ParquetFile(src, page_checksum_verification=True)
    except _PARQUET_ERRORS as exc:
        src.close()
        raise CorruptStateCheckpointError(f"cool archive is not readable Parquet: {exc}",
                                          path=path, offset=_footer_offset(path)) from None
    pf._rune_src = src  # type: ignore[attr-defined]  # closed with the ParquetFile by _close
    return pf


def _footer_offset(path: str) -> int:
    """Where a Parquet file's footer starts, as its last 8 bytes say (the
    footer length and ``PAR1``); the offset of those 8 bytes if they do not
    say; 0 for a file too short to hold them."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < 12:
                return 0
            f.seek(size - 8)
            tail = f.read(8)
    except OSError:
        return 0
    n = int.from_bytes(tail[:4], "little")
    if tail[4:] == b"PAR1" and 0 < n <= size - 12:
        return size - 8 - n
    return size - 8


def _open_checked(path: str) -> pq.ParquetFile:
    """:func:`_open_parquet`, then the columns checked against the schema."""
    pf = _open_parquet(path)
    got = [(f.name, f.type) for f in pf.schema_arrow]
    if got != _COL_TYPES:
        _close(pf)
        raise CorruptStateCheckpointError(
            f"cool archive has columns {got}, expected {_COL_TYPES}", path=path)
    return pf


def _read_all(pf: pq.ParquetFile, path: str) -> pa.Table:
    try:
        return pf.read(use_threads=False)
    except _PARQUET_ERRORS as exc:
        raise CorruptStateCheckpointError(f"cool archive cannot be read: {exc}", path=path) from None


def _close(pf: pq.ParquetFile) -> None:
    pf.close()
    src = getattr(pf, "_rune_src", None)
    if src is not None:
        src.close()


def _same_index(a: _FileIndex, b: _FileIndex, ids: bool = True) -> bool:
    return (a.rows == b.rows and a.size == b.size and a.footer == b.footer
            and np.array_equal(a.rg_starts, b.rg_starts)
            and (not ids or (np.array_equal(a.hashes, b.hashes) and np.array_equal(a.hrows, b.hrows)))
            and a.channels == b.channels
            and a.tasks.keys() == b.tasks.keys()
            and all(np.array_equal(a.tasks[t], b.tasks[t]) for t in a.tasks))


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


def _by_channel(table: pa.Table) -> pa.Table:
    """The rows grouped by channel, each channel's rows in their given order
    (a stable sort: channel names compare as UTF-8 bytes, i.e. by code point,
    as Python compares them)."""
    n = table.num_rows
    keys = pa.table({"c": table.column("channel_id"), "i": pa.array(np.arange(n, dtype=np.int64))})
    order = pc.sort_indices(keys, sort_keys=[("c", "ascending"), ("i", "ascending")])
    return table.take(order)


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


def _merge_order(table: pa.Table) -> pa.Array:
    """Row order of a merged file: channel, then the order key (Arrow sorts
    strings by their UTF-8 bytes: code point order, Python's str order)."""
    stamped = pc.not_equal(table.column("hlc"), "")
    ord_key = pc.if_else(stamped, 0, table.column("ord"))
    t = pa.table({"c": table.column("channel_id"), "s": stamped, "o": ord_key,
                  "h": table.column("hlc"), "m": table.column("msg_id")})
    return pc.sort_indices(t, sort_keys=[("c", "ascending"), ("s", "ascending"), ("o", "ascending"),
                                         ("h", "ascending"), ("m", "ascending")])
