"""A cool file's sidecars and footer: the ``.idx`` index of one Parquet file
(``_FileIndex``, built by ``_build_index``), the ``.grams`` search filters
kept beside it, the footer hash that binds both to their file, and the
helpers that open, map and read a Parquet file.
"""
from __future__ import annotations

import json
import logging
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Sequence, cast

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from .._index import str_hashes
from .._log import MAX_LINE, utf8_hashes
from .._pages import check_dir
from ..errors import CorruptStateCheckpointError
from ..segments import seal, unseal
from .schema import (
    _COL_TYPES, _IDX_MAGIC, _IDX_VERSION,
    _PARQUET_ERRORS, _parquet_name,
)


log = logging.getLogger("rune_fast.cool")


#: memory for the search filters of files that could not be kept on disk
#: (a viewer's, built by its searches; 512 B a block of 32 rows: about 16 MiB
#: a million cooled messages). Those kept on disk are mapped, not held.
_GRAMS_BUDGET = 64 << 20
#: the most bytes one value of a cool column can take (it came from a line)
_MAX_VALUE = MAX_LINE
#: row groups whose checked page directory views a file index keeps
#: (_FileIndex.page_dir; ~0.5 KB each: 2 MiB at most a file)
_MAX_DIR_VIEWS = 4096


class _PageFilters:
    """The search filters of the live files (rune_fast.cool.grams):
    ``file -> FileGrams``, mapped from their ``.grams`` files or, where
    they could not be kept there, held within _GRAMS_BUDGET bytes; ``read``
    names the files whose filters were looked for (a file there without an
    entry has none usable: its search reads every content page). The
    archive's lock guards it (a scan thread only reads an entry's view);
    the file set forgets a file that goes."""

    def __init__(self) -> None:
        self.by_file: dict[int, Any] = {}
        self.nbytes = 0
        self.read: set[int] = set()

    def get(self, no: int) -> Any:
        return self.by_file.get(no)

    def put(self, no: int, grams: Any) -> bool:
        """Take ``grams`` for file ``no`` (False: past the budget)."""
        self.forget(no)
        self.read.add(no)
        if self.nbytes + grams.nbytes > _GRAMS_BUDGET:
            return False
        self.by_file[no] = grams
        self.nbytes += grams.nbytes
        return True

    def forget(self, no: int) -> None:
        g = self.by_file.pop(no, None)
        if g is not None:
            self.nbytes -= g.nbytes
            g.close()
        self.read.discard(no)

    def clear(self) -> None:
        for no in list(self.by_file):
            self.forget(no)
        self.read.clear()


def _encode_grams(size: int, footer: str, rows: int, body: bytes) -> bytes:
    """The bytes of a filters file (rune_fast.cool.grams) for the file of
    ``size`` bytes, footer hash ``footer`` and ``rows`` rows."""
    from . import grams
    return grams.encode(size, footer, rows, body)


def _decode_grams(data: Any, size: int, footer: str, rows: int) -> memoryview:
    """The block filters of a filters file made for the file of ``size``
    bytes, footer hash ``footer`` and ``rows`` rows; ValueError saying what
    does not hold (damage, another file, another layout)."""
    from . import grams
    return grams.check(data, size, footer, rows)


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
        h = _hash_range(fd, size - 8 - flen, flen)
    finally:
        os.close(fd)
    h.update(tail)
    return size, h.hexdigest()


#: Ranges of at least this many bytes are hashed where the page cache maps
#: them (:func:`_hash_range`), smaller ones read.
_MAP_HASH_BYTES = 64 << 10


def _hash_range(fd: int, start: int, n: int) -> "xxhash.xxh3_64":
    """xxh3_64 of the ``n`` bytes of ``fd`` at ``start``. A large range
    (a footer is ~0.5 MB a million rows) is hashed in a map of the file:
    read, it was a fresh buffer of that size at each open, and with the
    fixed mmap threshold (:func:`rune_fast._memory.fix_malloc_thresholds`) malloc maps, faults
    in, zeroes and unmaps it each time -- at 10,000,000 messages (9.5 MB of
    footers) most of an open."""
    if n < _MAP_HASH_BYTES:
        return xxhash.xxh3_64(os.pread(fd, n, start))
    base = start - start % mmap.ALLOCATIONGRANULARITY
    m = mmap.mmap(fd, start + n - base, prot=mmap.PROT_READ, offset=base)
    try:
        with memoryview(m) as mv, mv[start - base:] as view:
            return xxhash.xxh3_64(view)
    finally:
        m.close()


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
    # the row groups' page directories (see page_dir): (int64 start of each
    # group's words + [end], int64 words); None: not known (a sidecar written
    # before version 3, or a file not in the page layout, see dirs_known)
    pagedir: tuple[np.ndarray, np.ndarray] | None = None
    # whether the sidecar says what pagedir is: False for one read from a
    # version 1 or 2 sidecar (a writer adds them: _FileSet._upgrade)
    dirs_known: bool = True
    # (the pagedir, {row group: its checked directory's four views}):
    # check_dir walks every page of a group (~15 ns a page, 250 pages of
    # 1 KiB), once per group, not at every read of it; the views are kept
    # too, as slicing them out of the words again cost ~2.5 us a point read
    # (~0.5 KB a group touched, views of the words, no copy; at most
    # _MAX_DIR_VIEWS groups, then they are checked and sliced again)
    _dirs_ok: tuple | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.rg_list = [int(x) for x in self.rg_starts]

    def page_dir(self, rg: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """Row group ``rg``'s page directory as ``rune_fast.pages._pack_dir``
        makes it, ``(counts, flat, firsts, starts)``: views of the sidecar's
        words (no copy), or None if the sidecar has none. ValueError if the
        words do not hold together (``_pages.check_dir``, ~1 us: they are
        covered by the sidecar's digest, so that is a writer's bug, not
        damage; the reader then goes through pyarrow)."""
        ok = self._dirs_ok
        if ok is not None and ok[0] is self.pagedir:
            got = ok[1].get(rg)
            if got is not None:
                return got
        if self.pagedir is None:
            return None
        index, words = self.pagedir
        if not 0 <= rg < len(index) - 1:
            return None
        a, b = int(index[rg]), int(index[rg + 1])
        ncols = len(_COL_TYPES)
        if not 0 <= a <= b - 2 * ncols <= len(words) - 2 * ncols or (b - a - 2 * ncols) % 8:
            raise ValueError(f"page directory of row group {rg}: words [{a}, {b}) do not hold together")
        w = words[a:b]
        npages = (b - a - 2 * ncols) // 8
        out = w[:ncols], w[2 * ncols:2 * ncols + 7 * npages], w[2 * ncols + 7 * npages:], w[ncols:2 * ncols]
        # (also: every page within the file, and no page said to unpack to
        # more than its values can hold: a wrong size must not become a read
        # or an allocation of gigabytes; in the compiled loop, as numpy's
        # steps over each group's few hundred words cost ~10 us a read;
        # once per group and pagedir: the words are not changed in place)
        bad = check_dir(out[0], out[3], out[1], out[2], self.rg_list[rg + 1] - self.rg_list[rg],
                        self.size, _MAX_VALUE)
        if bad:
            raise ValueError(f"page directory of row group {rg}: {bad}")
        if ok is None or ok[0] is not self.pagedir or len(ok[1]) >= _MAX_DIR_VIEWS:
            ok = self._dirs_ok = (self.pagedir, {})
        ok[1][rg] = out
        return out

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

    def pieces(self) -> list[Any]:
        """The sidecar's bytes as pieces to write one after the other: the
        magic and the digest, then the header and the arrays' bytes (views
        of the arrays, not copies)."""
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
            "page_dir_words": 0 if self.pagedir is None else len(self.pagedir[1]),
        }
        hb = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        hb += b" " * (-(len(hb) + 4) % 8)
        tb += b" " * (-len(tb) % 8)
        # (the arrays' bytes as they are, no join: the join of the arrays'
        # bytes and the digest's concatenation each made a copy of the
        # whole -- 16 bytes a row, its arrays' copies another 16: the index
        # of the last file of a compact() was the top of a bulk load's
        # resident memory; one buffer of the whole, 4 MB for a file of
        # 262,144 rows, was still at the top after that)
        pieces: list[Any] = [struct.pack("<I", len(hb)), hb, tb,
                             np.ascontiguousarray(self.hashes, dtype="<u8"),
                             np.ascontiguousarray(self.hrows, dtype="<u4"),
                             b"\0" * (4 if self.rows % 2 else 0)]
        total = 0
        for rows in task_rows:
            pieces.append(np.ascontiguousarray(rows, dtype="<u4"))
            total += len(rows)
        pieces.append(b"\0" * (4 if total % 2 else 0))
        if self.pagedir is not None:
            pieces += [np.ascontiguousarray(self.pagedir[0], dtype="<i8"),
                       np.ascontiguousarray(self.pagedir[1], dtype="<i8")]
        views = [memoryview(p).cast("B") for p in pieces if len(p)]
        h = xxhash.xxh3_128()
        for v in views:
            h.update(v)
        return [_IDX_MAGIC + h.digest(), *views]

    def encode(self) -> bytearray:
        """The sidecar's bytes (:meth:`pieces` joined)."""
        pieces = self.pieces()
        out = bytearray(sum(len(p) for p in pieces))
        at = 0
        for p in pieces:
            out[at:at + len(p)] = p
            at += len(p)
        return out

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
        if version not in (1, 2, _IDX_VERSION) or header.get("file") != _parquet_name(no):
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
        pos += 4 * total
        rg_starts = np.asarray(header["row_group_starts"], dtype=np.int64)
        pagedir = None
        if version >= 3:
            pos += 4 if total % 2 else 0
            words = int(header["page_dir_words"])
            if words:
                groups = len(rg_starts) - 1
                index = np.frombuffer(body, dtype=np.int64, count=groups + 1, offset=pos)
                pos += 8 * (groups + 1)
                dirs = np.frombuffer(body, dtype=np.int64, count=words, offset=pos)
                pos += 8 * words
                if groups < 0 or index[0] != 0 or index[-1] != words or (np.diff(index) < 0).any():
                    raise ValueError("page directory index does not fit its words")
                pagedir = (index, dirs)
        if pos != len(body):
            raise ValueError("length mismatch")
        return cls(
            no=no, name=_parquet_name(no), rows=n, size=int(header["file_size"]),
            footer=str(header["footer_xxh3_64"]),
            rg_starts=rg_starts, hashes=hashes, hrows=hrows,
            channels={c: (int(s), int(e), int(lt)) for c, s, e, lt in header["channels"]},
            _tasks=None, _task_src=(text, all_rows), pagedir=pagedir, dirs_known=version >= 3,
        )


def _id_hashes(msg_ids: Any) -> np.ndarray:
    """uint64 xxh3_64 of the UTF-8 of each id (:func:`_id_hash` of each), for
    a list of str or Arrow strings; computed in C."""
    if type(msg_ids) is list:
        try:
            return str_hashes(msg_ids)      # (no Arrow array made: the append path's)
        except (TypeError, UnicodeEncodeError):
            pass                            # (the Arrow path says what is wrong)
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


class _KeyParts:
    """What a file's index is built from, gathered part by part as the file
    is written (its rows in file order): each id's hash (and the smallest
    and largest id), the channels' runs, each row's task as a number (-1:
    none). 12 bytes a row, not the id, channel and task strings (about
    100): a merge of files of hundreds of thousands of rows held those for
    the new file's index beside a cooling run."""

    def __init__(self) -> None:
        self.n = 0
        self._hashes: list[np.ndarray] = []
        self._codes: list[np.ndarray] = []
        self.runs: list[list] = []              # [channel, rows], in file order
        self.task_names: dict[str, int] = {}    # task -> its number, first seen first
        self.id_range: tuple[str, str] | None = None

    def add(self, msg_ids: Any, channel_ids: Any, task_ids: Any) -> None:
        ids, chs, tids = _plain_strings(msg_ids), _plain_strings(channel_ids), _plain_strings(task_ids)
        n = len(ids)
        if len(chs) != n or len(tids) != n:
            raise ValueError(f"_build_index: {n} ids, {len(chs)} channels, {len(tids)} tasks")
        if n == 0:
            return
        self._hashes.append(_id_hashes(ids))
        mm = pc.min_max(ids)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if lo is not None and hi is not None:
            self.id_range = (lo, hi) if self.id_range is None else \
                (min(lo, self.id_range[0]), max(hi, self.id_range[1]))
        runs = pc.run_end_encode(chs)
        prev = 0
        for ch, end in zip(runs.values.to_pylist(), runs.run_ends.to_numpy().tolist()):
            if self.runs and self.runs[-1][0] == ch:
                self.runs[-1][1] += end - prev
            else:
                self.runs.append([ch, end - prev])
            prev = end
        enc = pc.dictionary_encode(tids)
        names = self.task_names
        remap = np.array([-1 if t == "" else names.setdefault(t, len(names))
                          for t in enc.dictionary.to_pylist()], dtype=np.int32)
        self._codes.append(remap[enc.indices.to_numpy(zero_copy_only=False)] if len(remap)
                           else np.full(n, -1, dtype=np.int32))
        self.n += n

    def hashes(self) -> np.ndarray:
        return np.concatenate(self._hashes) if self._hashes else np.zeros(0, dtype=np.uint64)

    def codes(self) -> np.ndarray:
        return np.concatenate(self._codes) if self._codes else np.zeros(0, dtype=np.int32)

    def take_hashes(self) -> np.ndarray:
        """:meth:`hashes`, its parts let go (they are not kept twice)."""
        out = self.hashes()
        self._hashes = []
        return out

    def take_codes(self) -> np.ndarray:
        """:meth:`codes`, its parts let go."""
        out = self.codes()
        self._codes = []
        return out


def _build_index(no: int, size: int, footer: str, msg_ids: Any, channel_ids: Any,
                 task_ids: Any, rg_counts: Sequence[int], path: str) -> _FileIndex:
    """The in-memory index of a file from its id, channel and task columns
    (lists of str or Arrow strings): see :func:`_index_of_keys`."""
    keys = _KeyParts()
    keys.add(msg_ids, channel_ids, task_ids)
    return _index_of_keys(no, size, footer, keys, rg_counts, path)


def _index_of_keys(no: int, size: int, footer: str, keys: _KeyParts,
                   rg_counts: Sequence[int], path: str) -> _FileIndex:
    """The in-memory index of a file from its rows' keys: id hashes sorted,
    each channel's row range (its rows must be contiguous) and newest row
    with a task, each task's rows. Vectorized: no Python work per row."""
    n = keys.n
    # the row groups' counts place every row: a damaged footer may still
    # read, with counts that do not add up (a negative one, say)
    for i, c in enumerate(rg_counts):
        if c < 0:
            raise CorruptStateCheckpointError(f"cool archive row group {i} claims {c} rows", path=path)
    if sum(rg_counts) != n:
        raise CorruptStateCheckpointError(f"cool archive row groups hold {sum(rg_counts)} rows, "
                                          f"its columns {n}", path=path)
    # (the parts let go as they are joined, and each temporary as soon as
    # it is used: the index of the last file of a compact() was the top of
    # a bulk load's resident memory, ~50 bytes a row of temporaries)
    hashes = keys.take_hashes()
    order = np.argsort(hashes, kind="stable").astype(np.uint32)
    hashes = hashes[order]
    codes = keys.take_codes()
    has_task = codes >= 0
    # newest row with a task at or before each row (-1: none yet)
    if n:
        last_task = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        last_task[~has_task] = -1
        np.maximum.accumulate(last_task, out=last_task)
    else:
        last_task = np.zeros(0, dtype=np.int32)
    channels: dict[str, tuple[int, int, int]] = {}
    start = 0
    for ch, rows in keys.runs:
        end = start + rows
        if ch in channels:
            raise CorruptStateCheckpointError(
                f"channel {ch!r} is not contiguous in the cool archive", path=path, offset=start)
        latest = int(last_task[end - 1])
        channels[ch] = (start, end, latest if latest >= start else -1)
        start = end
    del last_task
    tasks: dict[str, np.ndarray] = {}
    rows = np.flatnonzero(has_task).astype(np.uint32)
    del has_task
    if len(rows):
        tcodes = codes[rows]
        del codes
        by_task = rows[np.argsort(tcodes, kind="stable")]
        bounds = np.cumsum(np.bincount(tcodes, minlength=len(keys.task_names)))[:-1]
        del rows, tcodes
        tasks = {t: part.copy() for t, part in zip(keys.task_names, np.split(by_task, bounds))}
        del by_task
    rg_starts = np.concatenate([[0], np.cumsum(np.asarray(rg_counts, dtype=np.int64))]).astype(np.int64)
    return _FileIndex(
        no=no, name=_parquet_name(no), rows=n, size=size, footer=footer, rg_starts=rg_starts,
        hashes=hashes, hrows=order, channels=channels, _tasks=tasks,
    )


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


def _same_dirs(a: tuple[np.ndarray, np.ndarray] | None, b: tuple[np.ndarray, np.ndarray] | None) -> bool:
    """Whether two files' page directories (:attr:`_FileIndex.pagedir`) are the same."""
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def _by_hash_then_row(h: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A file's id index entries (hashes, rows) sorted by hash, then row."""
    order = np.lexsort((r, h))
    return h[order], r[order]
