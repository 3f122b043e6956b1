"""Single-row reads from the cool archive's Parquet files, page by page.

Reading one row through pyarrow decodes its whole row group: every column,
every row (about 1-2 ms for 1,024 rows). A random read of cool history on a
store whose cool tier outgrows the row-group cache would pay that on every
miss. :class:`PageReader` instead reads, for each column, only the data page
that holds the row: one ``pread``, the page's CRC-32 checked, zstd
decompressed, the value found (``rune_fast._pages`` parses the page header and
walks PLAIN byte arrays in C).

It reads the layout :class:`~rune_fast.cool.CoolArchive` writes: required
columns, v1 data pages with CRCs, zstd or no compression, PLAIN-encoded
(and, since session 31, uncompressed columns dictionary-encoded or
DELTA_BINARY_PACKED: their values are decoded in C, ``_pages.take_rows``).
A file in any other layout (an archive written before this
layout, a file rewritten by another tool) raises :class:`Unsupported` and the
caller reads through pyarrow. Damage (a CRC mismatch, a header or value that
does not parse, a page that does not decompress to its size) raises
:class:`PageError`; the caller then reads through pyarrow too, which checks
the same page checksums and names the file and row group in the error it
raises. Nothing read here is served without the row digest check that
follows it (``rune_fast.cool``).
"""

from __future__ import annotations

import os
from array import array
import struct
import threading
import zlib
from typing import Any, Callable, cast

import zstandard

import numpy as np
import pyarrow as pa

from ._pages import (Unsupported, chunk_pages, chunk_pages_mem, fetch_pages, find_pages, lz4_direct, lz4_page,
                     page_codecs, page_fields, page_kinds, plain_strings, rows_pages, span_pages, take_many,
                     take_rows, zstd_direct)

__all__ = ["PageError", "PageReader", "Unsupported", "page_directories", "zstd_direct"]

#: row groups whose page directories a reader keeps
_MAX_DIRS = 4096
#: a row group's directory is parsed from its whole byte span read in one
#: ``pread`` when the span is at most this large (else header by header):
#: 15 column chunks of ~30 pages each cost ~180 small reads, 0.5 ms of a
#: first read of a row at 1,000,000 messages; the span (~330 KB) then also
#: serves that read's pages
_SPAN_BYTES = 4 << 20

_FIXED = {"INT64": struct.Struct("<q"), "INT32": struct.Struct("<i"), "DOUBLE": struct.Struct("<d")}
_DTYPE: dict[str, np.dtype] = {"q": np.dtype("<i8"), "i": np.dtype("<i4"), "d": np.dtype("<f8")}
_ARROW = {"INT64": pa.int64(), "INT32": pa.int32(), "DOUBLE": pa.float64()}
_PHYSICAL = {pa.string(): "BYTE_ARRAY", pa.int64(): "INT64", pa.int32(): "INT32", pa.float64(): "DOUBLE"}
_DATA_PAGE = 0
_PLAIN = 0
#: a dictionary page's kind (:func:`_kind` of a directory's sixth field)
_K_DICT = page_kinds()["dictionary"]
#: a column chunk's codec as ``chunk_pages`` takes it, by the name pyarrow
#: gives it ("LZ4" is LZ4_RAW: pyarrow names the older, framed LZ4 codec
#: otherwise, and the reader declines it)
_CODECS = {"UNCOMPRESSED": page_codecs()["none"], "ZSTD": page_codecs()["zstd"], "LZ4": page_codecs()["lz4_raw"]}
#: a directory's sixth field: its codec bits, the page's kind between them
_F_ZSTD, _F_LZ4 = 1, 128
#: LZ4_RAW pages are read here only with the system's liblz4 (else a group
#: that holds any is :class:`Unsupported`: the caller reads it through pyarrow)
_LZ4_DIRECT = lz4_direct()


def _kind(flags: int) -> int:
    """A directory entry's page kind (:func:`page_kinds`)."""
    return (flags >> 1) & 63


class PageError(ValueError):
    """A page failed its checksum or did not parse (use pyarrow, which names it)."""


def _pack_dir(d: list[tuple[list[int], list[tuple]]]) -> tuple[array, array, array, array]:
    """A row group's page directory (``PageReader._dir``'s form) as four
    int64 arrays: the pages of each column, their 7 fields one after
    another, the first row of each page (bisected by ``take``) and where
    each column's pages start among them.
    Kept this way, a directory costs 8 bytes a field where its tuples of
    Python ints cost about 40: the directories of every row group a read
    touched stay resident, so they add up with the size of the archive
    (about 15 bytes per stored message at 1,000,000 messages as tuples)."""
    flat = array("q", [x for _firsts, pages in d for p in pages for x in p])
    counts = array("q", [len(pages) for _f, pages in d])
    starts = array("q", [0] * len(counts))
    for c in range(1, len(counts)):
        starts[c] = starts[c - 1] + counts[c - 1]
    return counts, flat, array("q", flat[0::7]), starts


def _unpack_dir(packed: tuple[array, array, array, array]) -> list[tuple[list[int], list[tuple]]]:
    """:func:`_pack_dir`'s arrays as the directory again (a page's first
    field is its first row; its sixth, its flags: 1 if zstd-compressed,
    128 if LZ4_RAW, plus its kind times 2, see ``_pages.page_kinds``)."""
    counts, flat = packed[0], packed[1]
    out, at = [], 0
    for n in counts:
        f = flat[at:at + 7 * n].tolist()
        pages = [(f[j], f[j + 1], f[j + 2], f[j + 3], f[j + 4], f[j + 5], f[j + 6])
                 for j in range(0, 7 * n, 7)]
        out.append(([p[0] for p in pages], pages))
        at += 7 * n
    return out


def page_directories(path: str, metadata: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Every row group's page directory of the Parquet file at ``path``
    (its footer ``metadata``), in the form a cool file's sidecar keeps
    them: ``(index, words)``, int64 both, row group g's directory being
    ``words[index[g]:index[g + 1]]``: the pages of each column (``counts``),
    where each column's pages start among the group's (``starts``), the 7
    fields of each page (``flat``) and the first row of each (``firsts``),
    one after another (:func:`_pack_dir`'s four arrays). None if the file is
    not in a layout :class:`PageReader` reads (:class:`Unsupported`).
    PageError if a page header does not parse or run past its chunk.

    This is what a first read of a row would otherwise parse from the
    group's page headers (~0.2 ms a group: ~0.2 s for a file of a million
    rows, paid again by every process)."""
    try:
        reader = PageReader(path, metadata)
    except Unsupported:
        return None
    try:
        index = [0]
        parts = []
        for rg in range(metadata.num_row_groups):
            reader._dir_span(rg)        # (parsed, not read: no codec needed)
            counts, flat, firsts, starts = reader._dirs[rg]
            reader._dirs.clear()
            part = np.concatenate([np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64)
                                   for a in (counts, starts, flat, firsts)])
            parts.append(part)
            index.append(index[-1] + len(part))
        words = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return np.asarray(index, dtype=np.int64), words
    except Unsupported:
        return None
    finally:
        reader.close()


class PageReader:
    """Point reads of rows of one Parquet file (see the module docstring).

    ``PageReader(path, metadata, fd=None)`` raises :class:`Unsupported` if
    the schema is not readable here; :meth:`rows` and :meth:`column` raise it
    if a row group's column chunks are not. ``fd``: a descriptor of the file
    the metadata was read from, which the reader then owns (so it reads the
    same file even if ``path`` has since been replaced); else it opens
    ``path``. Reads may run on several threads at once (a search's scans do:
    each thread has its own zstd context); ``close`` must not race them.

    ``dirs``: a function of a row group giving its directory as
    :func:`_pack_dir` makes it (or None: then it is parsed from the pages
    as usual), such as the ones a cool file's sidecar keeps
    (:func:`page_directories`); with it ``metadata`` may be None and
    ``schema`` (an Arrow schema of required columns) say the columns: the
    file's footer is then never parsed (~12 ms for a file of 500,000 rows).
    """

    __slots__ = ("path", "_fd", "_md", "_kinds", "_types", "_widths", "_dirs", "_local", "_given")

    def __init__(self, path: str, metadata: Any, fd: int | None = None, *,
                 dirs: Callable[[int], Any] | None = None, schema: pa.Schema | None = None) -> None:
        self._fd = -1
        if fd is not None:
            self._fd = fd       # owned from here on, closed even if the schema is refused
        kinds: list[Any] = []
        types: list[Any] = []
        if metadata is None:
            if schema is None or dirs is None:
                raise ValueError("PageReader: no metadata, and no schema and directories instead")
            for f in schema:
                phys = _PHYSICAL.get(f.type)
                if phys is None or f.nullable:
                    raise Unsupported(f"column {f.name} has type {f.type}{' (nullable)' if f.nullable else ''}")
                kinds.append(_FIXED.get(phys))
                types.append(f.type)
        else:
            md_schema = metadata.schema
            for c in range(metadata.num_columns):
                col = md_schema.column(c)
                if col.max_definition_level or col.max_repetition_level:
                    raise Unsupported(f"column {col.name} is not required")
                if col.physical_type == "BYTE_ARRAY":
                    kinds.append(None)
                    types.append(pa.string())
                elif col.physical_type in _FIXED:
                    kinds.append(_FIXED[col.physical_type])
                    types.append(_ARROW[col.physical_type])
                else:
                    raise Unsupported(f"column {col.name} has type {col.physical_type}")
        self.path = path
        self._md = metadata
        self._kinds = kinds
        self._types = types
        # bytes a value of each column (0: a string column), as take_rows takes them
        self._widths = np.array([0 if k is None else k.size for k in kinds], dtype=np.int64)
        self._dirs: dict[int, tuple[array, array, array, array]] = {}     # row group -> _pack_dir's form
        self._given = dirs
        self._local = threading.local()     # a zstd context per thread (one must not be shared)
        if fd is None:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, AttributeError, TypeError):
            pass    # (an __init__ that failed early; interpreter shutdown)

    # ------------------------------------------------------------ directory

    def _pread(self, size: int, offset: int) -> bytes:
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise PageError(f"{self.path}: {size} bytes at offset {offset} run past the end of the file")
        return data

    def _chunk_pages(self, offset: int, total: int, rows: int, codec: int) -> tuple[list[int], list[tuple]]:
        """(first row of each page, (first, data offset, compressed size,
        uncompressed size, crc, flags, values) of each page) of one column
        chunk (its headers walked in C: ``_pages.chunk_pages``)."""
        try:
            return chunk_pages(self._fd, offset, total, rows, codec)
        except ValueError as exc:
            raise PageError(f"{self.path}: {exc}") from None

    def _dir(self, rg: int) -> list[tuple[list[int], list[tuple]]]:
        return self._dir_span(rg)[0]

    def _packed(self, rg: int) -> tuple[Any, tuple[int, bytes] | None]:
        """(row group ``rg``'s directory as :func:`_pack_dir` keeps it, the
        group's span if it was just read to parse it, else None): what
        every read of the group's pages starts from, :class:`Unsupported`
        for a group of LZ4_RAW pages where no liblz4 is loaded."""
        packed = self._dirs.get(rg)
        if packed is None:
            packed = self._given_dir(rg)
        span = None
        if packed is None:
            _d, span = self._dir_span(rg)
            packed = self._dirs[rg]
        if not _LZ4_DIRECT and (np.frombuffer(packed[1], dtype=np.int64)[5::7] & _F_LZ4).any():
            raise Unsupported(f"{self.path}: row group {rg} holds LZ4_RAW pages (no liblz4 here)")
        return packed, span

    def _given_dir(self, rg: int) -> Any:
        """Row group ``rg``'s directory from ``dirs`` (None if none given).
        Its shape is checked here; each page it names is still checked by
        its CRC-32 and its size when read."""
        if self._given is None:
            return None
        try:
            packed = self._given(rg)
        except ValueError as exc:
            raise PageError(f"{self.path}: {exc}") from None
        if packed is not None and len(packed[0]) != len(self._kinds):
            raise PageError(f"{self.path}: the page directory of row group {rg} has {len(packed[0])} "
                            f"columns, the file {len(self._kinds)}")
        return packed

    def _dir_span(self, rg: int) -> tuple[list[tuple[list[int], list[tuple]]], tuple[int, bytes] | None]:
        """(the page directory of row group ``rg``, (file offset, bytes) of
        the group's span if it was just read to parse it, else None)."""
        packed = self._dirs.get(rg)
        if packed is None:
            packed = self._given_dir(rg)
        if packed is not None:
            return _unpack_dir(packed), None
        if self._md is None:
            raise Unsupported(f"row group {rg}: no page directory and no footer to parse one from")
        meta = self._md.row_group(rg)
        rows = meta.num_rows
        d = []
        ccs = [meta.column(c) for c in range(len(self._kinds))]
        codecs = []
        for c, cc in enumerate(ccs):
            codec = _CODECS.get(cc.compression)
            if codec is None:
                raise Unsupported(f"row group {rg} column {c}: {cc.compression}")
            codecs.append(codec)
        # where each chunk starts: its dictionary page, if it has one
        at = [cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset for cc in ccs]
        lo = min(at) if ccs else 0
        hi = max(a + cc.total_compressed_size for a, cc in zip(at, ccs)) if ccs else 0
        span = None
        if 0 <= lo < hi and hi - lo <= _SPAN_BYTES:
            span = self._pread(hi - lo, lo)
        for a, cc, codec in zip(at, ccs, codecs):
            if span is None:
                d.append(self._chunk_pages(a, cc.total_compressed_size, rows, codec))
                continue
            try:
                d.append(chunk_pages_mem(span, lo, a, cc.total_compressed_size, rows, codec))
            except ValueError as exc:
                raise PageError(f"{self.path}: {exc}") from None
        kept = None if span is None else (lo, span)
        if len(self._dirs) >= _MAX_DIRS:
            self._dirs.clear()
        self._dirs[rg] = _pack_dir(d)
        return d, kept

    # ------------------------------------------------------------ rows

    def rows(self, rg: int, local: list[int], given: dict[int, list[bytes]] | None = None,
             fetched: dict[int, bytes] | None = None) -> list[list]:
        """Column values (15 Python values, in column order) of the rows
        ``local`` (ascending, within the row group) of row group ``rg``.
        ``given``: column -> the UTF-8 values of a string column for those
        rows, already read (a search's scan), decoded instead of read again.
        The pages are read, checked and decoded by :meth:`take`
        (``fetched``: see there)."""
        if not local:
            return []
        ncols = len(self._kinds)
        cols = [c for c in range(ncols) if given is None or c not in given]
        got = dict(zip(cols, self.take(rg, local, cols, fetched)))
        out: list[list] = [[] for _ in local]
        for c in range(ncols):
            kind = self._kinds[c]
            try:
                if c not in got:
                    vals = [v.decode("utf-8") for v in cast("dict", given)[c]]
                elif kind is None:
                    data, offs = got[c]
                    o = offs.tolist()
                    vals = [data[o[n]:o[n + 1]].decode("utf-8") for n in range(len(local))]
                else:
                    vals = np.frombuffer(got[c], dtype=_DTYPE[kind.format[-1]]).tolist()
            except UnicodeDecodeError as exc:
                raise PageError(f"{self.path}: row group {rg}, column {c}: {exc}") from None
            if len(vals) != len(local):
                raise PageError(f"{self.path}: row group {rg}, column {c}: {len(vals)} values "
                                f"for {len(local)} rows")
            for n, v in enumerate(vals):
                out[n].append(v)
        return out

    def take(self, rg: int, local: list[int], cols: list[int] | None = None,
             fetched: dict[int, bytes] | None = None) -> list[Any]:
        """The values of the rows ``local`` (ascending, within the row
        group) of row group ``rg``, column by column: ``(data, int32
        offsets)`` of just those values for a string column (the layout of
        an Arrow string array), their little-endian bytes for a fixed-width
        one. The pages holding them are read once each (a column's run of
        pages in one ``pread``), CRC-32 checked and decompressed; values of
        other rows are not decoded. A task or a window reads its rows of a
        group this way, whatever their number. ``cols``: just these columns
        (in this order; default all).

        The loop is compiled (``_pages.take_rows``) and reads the kept
        directory as it is packed (:func:`_pack_dir`): an exact read of one
        row touches 15 of a group's few hundred pages, and its cost is their
        reads and decompression, not Python steps around them. ``fetched``:
        the group's pages :meth:`fetch` read for them (:meth:`rows_pages`),
        taken instead of reading them."""
        if not local:
            return []
        (counts, flat, firsts, starts), span = self._packed(rg)
        lo, buf = span if span is not None else (0, None)
        try:
            return take_rows(self._fd, counts, starts, flat, firsts, cols, np.array(local, dtype=np.int64),
                             self._widths, self._dctx().decompress, buf, lo, fetched)
        except (ValueError, zstandard.ZstdError) as exc:
            raise PageError(f"{self.path}: row group {rg}: {exc}") from None

    def column(self, rg: int, c: int) -> pa.Array:
        """Column ``c`` of row group ``rg`` as an Arrow array (every page read,
        checked and decompressed here; no pyarrow decoding)."""
        _firsts, pages = self._dir(rg)[c]
        kind = self._kinds[c]
        if any(_kind(p[5]) for p in pages):
            # encoded pages (a dictionary, DELTA_BINARY_PACKED): decoded in C
            n = sum(p[6] for p in pages if _kind(p[5]) != _K_DICT)
            got = self.take(rg, list(range(n)), [c])[0]
            if kind is not None:
                return pa.Array.from_buffers(self._types[c], n, [None, pa.py_buffer(got)])
            data, offs = got
            return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offs), pa.py_buffer(data)])
        n = sum(p[6] for p in pages)
        if kind is not None:
            raw = b"".join(self._values(p, kind, rg, c) for p in pages)
            return pa.Array.from_buffers(self._types[c], n, [None, pa.py_buffer(raw)])
        datas, offsets, base = [], [np.zeros(1, np.int32)], 0
        for p in pages:
            data, offs = self._values(p, kind, rg, c)
            datas.append(data)
            offsets.append(offs[1:] + np.int32(base))
            base += len(data)
            if base >= 1 << 31:
                raise Unsupported(f"row group {rg} column {c} holds 2 GiB or more")
        offs = np.concatenate(offsets)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offs), pa.py_buffer(b"".join(datas))])

    def _values(self, page: tuple, kind: Any, rg: int, c: int) -> Any:
        """A page's values: ``(data, int32 offsets)`` for strings, the raw
        little-endian bytes for fixed-width values."""
        raw = self._page(page)
        nvals = page[6]
        try:
            if kind is None:
                return plain_strings(raw, nvals)
        except ValueError as exc:
            raise PageError(f"{self.path}: page at offset {page[1]} (row group {rg}, column {c}): {exc}") from None
        if len(raw) != kind.size * nvals:
            raise PageError(f"{self.path}: page at offset {page[1]} holds {len(raw)} bytes "
                            f"for {nvals} values of {kind.size}")
        return raw

    def find(self, rg: int, c: int, probes: list[tuple[bytes, bool]],
             spans: Any = None, fetched: dict[int, bytes] | None = None) -> list[list[tuple[int, bytes]]]:
        """For each probe ``(needle, ignore_ascii_case)`` (the needle ASCII-
        lowercased for the latter), the values of string column ``c`` of row
        group ``rg`` that hold it: ``(row within the group, the value's
        UTF-8 bytes)``, ascending; nothing is kept (the scan of a search,
        which must not churn a cache).

        ``spans``: int64 pairs ``[lo, hi)`` of rows within the group
        (ascending, not overlapping): only the pages holding one of their
        rows are read (the search's filters ruled out the others; values of
        other rows in those pages may be returned too). None: every page
        (the chunk's run of pages in one ``pread``). Each page read is
        CRC-checked and decompressed (compiled: ``_pages.find_pages``).
        ``fetched``: the pages :meth:`fetch` read for them
        (:meth:`span_pages`), taken instead of reading them."""
        if self._kinds[c] is not None:
            raise Unsupported(f"column {c} is not a string column")
        (counts, flat, firsts, starts), _span = self._packed(rg)
        try:
            return find_pages(self._fd, flat, firsts, starts[c], counts[c], spans, probes, self._dctx().decompress,
                              fetched=fetched)
        except Unsupported as exc:
            raise Unsupported(f"{self.path}: {exc}") from None
        except (ValueError, zstandard.ZstdError) as exc:
            raise PageError(f"{self.path}: row group {rg}, column {c}: {exc}") from None

    # ------------------------------------------------------------ fetched ahead
    #
    # A search's scan of many groups with few rows each reads them in
    # batches (rune_fast.cool.scan): which content pages (span_pages), their
    # fields (fields), then fetch (without the GIL) and each group's pages
    # to find; the hits' other columns by take_many (pages and values
    # without the GIL), or with no record type by fetch (rows_pages) and take.

    def span_pages(self, rg: int, c: int, spans: Any) -> list[int]:
        """The directory indices of the pages :meth:`find` reads for ``spans``."""
        (counts, _flat, firsts, starts), _span = self._packed(rg)
        return span_pages(firsts, int(starts[c]), int(counts[c]), spans)

    def rows_pages(self, rg: int, local: list[int], cols: list[int]) -> list[int]:
        """The directory indices of the pages :meth:`take` reads for ``local``."""
        (counts, flat, firsts, starts), _span = self._packed(rg)
        return rows_pages(counts, starts, flat, firsts, cols, np.array(local, dtype=np.int64))

    def fields(self, rg: int, pages: list[int]) -> np.ndarray:
        """``[offset, stored size, size, crc, flags]`` of the ``pages`` of
        group ``rg`` (directory indices), a row each: what :meth:`fetch` reads."""
        (_counts, flat, _firsts, _starts), _span = self._packed(rg)
        return page_fields(flat, pages)

    def fetch(self, fields: np.ndarray) -> list[bytes]:
        """The pages ``fields`` names (:meth:`fields`), read, CRC-32 checked
        and decompressed without the GIL (only where :func:`zstd_direct`)."""
        try:
            return fetch_pages(self._fd, fields)
        except ValueError as exc:
            raise PageError(f"{self.path}: {exc}") from None

    def dirs(self, rgs: list[int]) -> list[Any]:
        """The page directories of groups ``rgs`` (as kept), for :meth:`take_many`."""
        return [self._packed(rg)[0] for rg in rgs]

    def take_many(self, rgs: list[int], locals_: list[list[int]], cols: list[int],
                  dirs: list[Any] | None = None) -> tuple[list[Any], list[int]]:
        """:meth:`take` of the rows ``locals_[g]`` of each group ``rgs[g]``
        (``cols`` of each), every page they need fetched in one stretch and
        their values found, both without the GIL (``_pages.take_many``;
        only where :func:`zstd_direct`). ``dirs``: their directories
        (:meth:`dirs`), found beforehand on the asking thread.
        ``(columns, declined)``: the columns as :meth:`take` gives them, of
        the rows of each group in turn but those of the groups ``declined``
        (indices into ``rgs``: a directory, pages or values that do not
        hold together; their own :meth:`take` names what is wrong).
        PageError for a page that fails its CRC or does not decompress."""
        if dirs is None:
            dirs = self.dirs(rgs)
        try:
            return take_many(self._fd, dirs, [np.array(loc, dtype=np.int64) for loc in locals_], cols,
                             self._widths)
        except ValueError as exc:
            raise PageError(f"{self.path}: {exc}") from None

    def _dctx(self) -> Any:
        d = getattr(self._local, "dctx", None)
        if d is None:
            d = self._local.dctx = zstandard.ZstdDecompressor()
        return d

    def _page(self, page: tuple) -> bytes:
        return self._unpack(self._pread(page[2], page[1]), page)

    def _unpack(self, comp: Any, page: tuple, dctx: Any = None) -> bytes:
        """A page's values from its stored bytes: CRC-32 checked, decompressed."""
        _first, off, csize, usize, crc, flags, _n = page
        if flags & ~(_F_ZSTD | _F_LZ4):
            raise Unsupported(f"{self.path}: page at offset {off} is not a PLAIN data page")
        if zlib.crc32(comp) != crc:
            raise PageError(f"{self.path}: page at offset {off} fails its CRC-32")
        if flags & _F_LZ4:
            if not _LZ4_DIRECT:
                raise Unsupported(f"{self.path}: page at offset {off} is LZ4_RAW (no liblz4 here)")
            try:
                raw = lz4_page(comp, usize)
            except ValueError as exc:
                raise PageError(f"{self.path}: page at offset {off} {exc}") from None
            return raw
        if not flags & _F_ZSTD:
            return bytes(comp)
        try:
            raw = (dctx or self._dctx()).decompress(comp, max_output_size=usize)
        except zstandard.ZstdError as exc:
            raise PageError(f"{self.path}: page at offset {off} does not decompress: {exc}") from None
        if len(raw) != usize:
            raise PageError(f"{self.path}: page at offset {off} decompresses to {len(raw)} bytes, "
                            f"its header says {usize}")
        return raw
