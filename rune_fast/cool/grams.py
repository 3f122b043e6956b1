"""The search filters of a cool file (``.grams`` beside its ``.idx``): for
each block of :data:`BLOCK_ROWS` rows of the file, the trigram filter of the
casefolded content of its rows (``rune_fast._search.fold_block_grams``).

casefold folds each code point alone, so a row whose casefold holds the
casefolded needle holds every trigram of that needle's UTF-8: a block whose
filter lacks one holds no hit of a case-insensitive search, whatever the
needle's script or case ('ß' found by 'SS' included), nor of a
case-sensitive one (a substring's fold is a substring of the text's fold).
One compiled call (``gram_blocks_any``) tests a whole file's blocks; the
search then reads only the content pages that overlap the blocks that pass,
and no page of a row group none of whose blocks pass.

The filters are written with their file (cooling, merge, erase: the
writer's :class:`GramSink` builds them from the content it writes) and
built by the first search of a file that has none (one written before
them): a cache, bound to its file by the file's size and footer hash and
checked whole by its xxh3_64 when first mapped. One that does not hold is
named in a log warning, removed (a writer) and built again; a filter never
hides a hit, since a file without valid filters is searched page by page.
Mapped read-only from disk: the page cache holds them, not the process.
"""
from __future__ import annotations

import logging
import mmap
import os
import struct
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import xxhash

from .._search import fold_block_grams, gram_blocks_any
from ..segments import seal, unseal
from .schema import string_buffers

log = logging.getLogger("rune_fast.cool")

#: rows a filter covers (a content page holds 32 rows or fewer)
BLOCK_ROWS = 32
#: bits a filter: about 2,700 distinct trigrams in 32 rows of ~450 bytes
#: set about a quarter of them. (With 4,096, half: a needle of few
#: trigrams, 'zürich' in German text, passed twice as many blocks as hold
#: it; with 8,192 about none. 32 bytes a row on disk, mapped, not held.)
GRAM_BITS = 8192
BLOCK_BYTES = GRAM_BITS // 8

MAGIC = b"RFGRAMS2"
VERSION = 2
#: magic, version, rows a block, bits a filter, file size, footer xxh3_64
#: (hex), the file's rows; then the blocks' filters, then the xxh3_64 seal
HEAD = struct.Struct("<8sIIIQ16sQ")


def blocks_for(rows: int) -> int:
    return (rows + BLOCK_ROWS - 1) // BLOCK_ROWS


def encode(size: int, footer: str, rows: int, body: bytes) -> bytes:
    """The bytes of the filters file of the cool file of ``size`` bytes,
    footer hash ``footer`` and ``rows`` rows (``body``: its blocks' filters)."""
    if len(body) != blocks_for(rows) * BLOCK_BYTES:
        raise ValueError(f"{len(body)} bytes of filters for {rows} rows")
    return seal(HEAD.pack(MAGIC, VERSION, BLOCK_ROWS, GRAM_BITS, size, footer.encode("ascii"), rows) + body)


def check(data: Any, size: int, footer: str, rows: int) -> memoryview:
    """The filters (a view of ``data``) of a filters file made for the file
    of ``size`` bytes, footer hash ``footer`` and ``rows`` rows; ValueError
    saying what does not hold (damage, another file, another build's layout)."""
    end = unseal(data, HEAD.size)
    magic, version, brows, bits, fsize, fhash, frows = HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION or brows != BLOCK_ROWS or bits != GRAM_BITS:
        raise ValueError(f"format {bytes(magic)!r} version {version}, {brows} rows and {bits} bits a "
                         f"block: not this build's")
    if (fsize, bytes(fhash), frows) != (size, footer.encode("ascii"), rows):
        raise ValueError("made for another file of that name")
    if end - HEAD.size != blocks_for(rows) * BLOCK_BYTES:
        raise ValueError(f"{end - HEAD.size} bytes of filters for {rows} rows")
    return memoryview(data)[HEAD.size:end]


class FileGrams:
    """The filters of one cool file, mapped from disk (or held, where they
    could not be kept there): :meth:`candidates` tests them."""

    __slots__ = ("body", "nbytes", "_map")

    def __init__(self, body: memoryview, held: bool, m: Any = None) -> None:
        self.body = body
        self.nbytes = len(body) if held else 0      # (bytes held in the process)
        self._map = m

    @classmethod
    def mapped(cls, path: str, size: int, footer: str, rows: int) -> "FileGrams":
        """The filters file at ``path`` mapped and checked (see :func:`check`);
        FileNotFoundError if there is none, ValueError/OSError if it does not hold."""
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < HEAD.size:
                raise ValueError("too short")
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return cls(check(m, size, footer, rows), False, m)
        except BaseException:
            m.close()
            raise

    def candidates(self, needles: list[bytes], start_row: int, end_row: int) -> np.ndarray | None:
        """The blocks (file-wide indices, ascending) among those holding rows
        ``[start_row, end_row)`` whose filter may hold one of ``needles``
        (casefolded UTF-8); None where the needles cannot be tested (one is
        shorter than a trigram: every block passes)."""
        if not needles or any(len(x) < 3 for x in needles):
            return None
        if end_row <= start_row:
            return np.zeros(0, np.int64)
        return gram_blocks_any(self.body, GRAM_BITS, needles, start_row // BLOCK_ROWS,
                               (end_row - 1) // BLOCK_ROWS + 1)

    def spans(self, probe: bytes, starts: np.ndarray, s: int, e: int,
              rgs: list[int] | None = None) -> dict[int, np.ndarray] | None:
        """rg -> int64 ``[lo, hi)`` pairs of the rows (within the group, of
        rows ``[s, e)`` of the file; ``starts``: each row group's first row,
        and the file's row count) in the blocks whose filters may hold
        ``probe`` (a casefolded needle's UTF-8); a group absent holds no
        hit. None where the filters rule out nothing (or cannot test the
        probe). ``rgs`` (ascending): only these groups are asked about (a
        limited search's newest: the filters are tested over their rows
        alone, so that its cost does not grow with the file's)."""
        if rgs is not None and len(rgs) * 2 < int(np.searchsorted(starts, e - 1, side="right")
                                                  - np.searchsorted(starts, s, side="right")):
            out: dict[int, np.ndarray] = {}
            at = 0
            while at < len(rgs):
                end = at + 1
                while end < len(rgs) and rgs[end] == rgs[end - 1] + 1:
                    end += 1
                a, b = max(s, int(starts[rgs[at]])), min(e, int(starts[rgs[end - 1] + 1]))
                got = self.spans(probe, starts, a, b) if b > a else {}
                if got is None:
                    if self.candidates([probe], a, b) is None:
                        return None         # (the probe cannot be tested)
                    got = {rg: np.array([[max(a, int(starts[rg])) - int(starts[rg]),
                                          min(b, int(starts[rg + 1])) - int(starts[rg])]], np.int64)
                           for rg in rgs[at:end]}
                out.update(got)
                at = end
            return out
        blocks = self.candidates([probe], s, e)
        if blocks is None or len(blocks) == (e - 1) // BLOCK_ROWS - s // BLOCK_ROWS + 1:
            return None
        lo = np.maximum(blocks * BLOCK_ROWS, s)
        hi = np.minimum(blocks * BLOCK_ROWS + BLOCK_ROWS, e)
        rg_lo = np.searchsorted(starts, lo, side="right") - 1
        rg_hi = np.searchsorted(starts, hi - 1, side="right") - 1
        cross = np.flatnonzero(rg_lo != rg_hi)
        if len(cross):      # (a block across groups: a piece in each)
            los, his, in_rg = [lo[rg_lo == rg_hi]], [hi[rg_lo == rg_hi]], [rg_lo[rg_lo == rg_hi]]
            for i in cross.tolist():
                for rg in range(int(rg_lo[i]), int(rg_hi[i]) + 1):
                    los.append(np.array([max(int(lo[i]), int(starts[rg]))]))
                    his.append(np.array([min(int(hi[i]), int(starts[rg + 1]))]))
                    in_rg.append(np.array([rg]))
            lo, hi, rg_lo = np.concatenate(los), np.concatenate(his), np.concatenate(in_rg)
            order = np.lexsort((lo, rg_lo))
            lo, hi, rg_lo = lo[order], hi[order], rg_lo[order]
        pairs = np.stack([lo - starts[rg_lo], hi - starts[rg_lo]], axis=1)
        groups, first = np.unique(rg_lo, return_index=True)
        # (slices: np.split costs ~3 us a piece, 11 ms for a 4,000-group file)
        cuts = first.tolist() + [len(pairs)]
        return {rg: pairs[a:b] for rg, a, b in zip(groups.tolist(), cuts, cuts[1:])}

    def close(self) -> None:
        # (a scan may still hold the view: the map goes with the last reference)
        self.body = memoryview(b"")
        self._map = None


class GramSink:
    """The filters of a file's content, fed in file order in pieces of any
    size (Arrow string arrays or chunked arrays): blocks are cut every
    BLOCK_ROWS rows of the file, a piece's last partial block carried to
    the next. Holds at most a block of rows and the filters."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._carry: pa.Array | None = None
        self.rows = 0

    def add(self, content: Any) -> None:
        chunks = content.chunks if isinstance(content, pa.ChunkedArray) else [content]
        for arr in chunks:
            if not len(arr):
                continue
            self.rows += len(arr)
            if self._carry is not None:
                arr = pa.concat_arrays([self._carry, arr])
                self._carry = None
            full = len(arr) // BLOCK_ROWS * BLOCK_ROWS
            if full:
                self._parts.append(_grams_of(arr.slice(0, full)))
            if full < len(arr):
                self._carry = arr.slice(full)

    def _taken(self) -> list[bytes]:
        """The blocks' filters made so far (the carried rows' too), handed over."""
        if self._carry is not None:
            self._parts.append(_grams_of(self._carry))
            self._carry = None
        parts, self._parts = self._parts, []
        return parts

    def finish(self) -> bytes:
        return b"".join(self._taken())


class GramFile(GramSink):
    """A :class:`GramSink` whose filters go to the temp file ``tmp`` as
    they are made, not held: 32 bytes a row, 8 MB for a file of 262,144
    rows, held to the end of each large file of the compact() after a
    bulk load, were the top of its resident memory. :meth:`keep` puts the
    header in front, appends the seal and renames it over the filters
    file; the bytes are :func:`encode` over :meth:`GramSink.finish`. A cache, written as
    ``segments.write_kept`` writes one: not synced, and a failed write is
    a log warning (the file it serves is written all the same)."""

    def __init__(self, tmp: str) -> None:
        super().__init__()
        self.tmp = tmp
        self._fd = -1
        self._n = 0                                 # bytes of filters written
        self._failed: OSError | None = None

    def add(self, content: Any) -> None:
        super().add(content)
        self._spill()

    def _spill(self) -> None:
        parts, self._parts = self._parts, []
        if self._failed is not None:
            return
        try:
            if self._fd < 0:
                self._fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                self._write(bytes(HEAD.size))       # (the header's place)
            for p in parts:
                self._write(p)
                self._n += len(p)
        except OSError as exc:
            self._failed = exc if exc.filename else OSError(exc.errno, exc.strerror, self.tmp)
            self.discard()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def keep(self, path: str, size: int, footer: str, rows: int) -> bool:
        """Complete the filters of the file of ``size`` bytes, footer hash
        ``footer`` and ``rows`` rows and rename them to ``path``; False
        (logged) if a write failed. ValueError (nothing kept) if the
        filters made do not cover ``rows``."""
        if self._carry is not None or self._fd < 0:
            self._parts = self._taken()     # (the carried rows' block too)
            self._spill()
        try:
            if self._failed is not None:
                raise self._failed
            if self._n != blocks_for(rows) * BLOCK_BYTES:
                self.discard()
                raise ValueError(f"{self._n} bytes of filters for {rows} rows")
            head = HEAD.pack(MAGIC, VERSION, BLOCK_ROWS, GRAM_BITS, size, footer.encode("ascii"), rows)
            os.pwrite(self._fd, head, 0)
            # (the seal covers the header first: the filters read back,
            # from the page cache, a MB at a time)
            h = xxhash.xxh3_64(head)
            at, end = HEAD.size, HEAD.size + self._n
            while at < end:
                chunk = os.pread(self._fd, min(1 << 20, end - at), at)
                if not chunk:
                    raise OSError(f"{self.tmp}: {end - at} bytes short when read back")
                h.update(chunk)
                at += len(chunk)
            os.lseek(self._fd, end, os.SEEK_SET)
            self._write(_SEAL.pack(h.intdigest()))
            os.close(self._fd)
            self._fd = -1
            os.replace(self.tmp, path)
        except OSError as exc:
            log.warning("%s: search filters not kept: %s", path, exc)
            self.discard()
            return False
        return True

    def discard(self) -> None:
        """Close and remove the temp file (a file not written, or failed)."""
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


#: the seal's checksum (``segments.seal``: the xxh3_64 of the body after it)
_SEAL = struct.Struct("<Q")


def _grams_of(arr: pa.Array) -> bytes:
    """fold_block_grams of a string array (blocks from its first row)."""
    if arr.type == pa.large_string():
        arr = arr.cast(pa.string())
    data, offs = string_buffers(arr)
    return fold_block_grams(data, offs, BLOCK_ROWS, GRAM_BITS)


def grams_of_columns(columns: Iterable[Any]) -> bytes:
    """The filters of a file whose content column comes in ``columns``
    (its row groups' content, in order)."""
    sink = GramSink()
    for c in columns:
        sink.add(c)
    return sink.finish()


def needle_bytes(needle: str) -> bytes | None:
    """What the filters test for ``needle`` (case-sensitive or not): the
    UTF-8 of its casefold; None if it has no UTF-8 (a lone surrogate: every
    block passes)."""
    try:
        return needle.casefold().encode("utf-8")
    except UnicodeEncodeError:
        return None
