"""Single-row reads from the cool archive's Parquet files, page by page.

Reading one row through pyarrow decodes its whole row group: every column,
every row (about 1-2 ms for 1,024 rows). A random read of cool history on a
store whose cool tier outgrows the row-group cache would pay that on every
miss. :class:`PageReader` instead reads, for each column, only the data page
that holds the row: one ``pread``, the page's CRC-32 checked, zstd
decompressed, the value found (``rune_fast._pages`` parses the page header and
walks PLAIN byte arrays in C).

It reads the layout :class:`~rune_fast.cool.CoolArchive` writes: required
columns, PLAIN-encoded v1 data pages with CRCs, zstd or no compression, no
dictionary pages. A file in any other layout (an archive written before this
layout, a file rewritten by another tool) raises :class:`Unsupported` and the
caller reads through pyarrow. Damage (a CRC mismatch, a header or value that
does not parse, a page that does not decompress to its size) raises
:class:`PageError`; the caller then reads through pyarrow too, which checks
the same page checksums and names the file and row group in the error it
raises. Nothing read here is served without the row digest check that
follows it (``rune_fast.cool``).
"""

from __future__ import annotations

import bisect
import os
import struct
import zlib
from typing import Any

import zstandard

from ._pages import byte_array_at, page_header

__all__ = ["PageError", "PageReader", "Unsupported"]

#: bytes read to parse a page header (a header with statistics may be longer:
#: then it is read again, larger)
_PROBE = 512
#: directory bytes read at once while walking a column chunk's page headers
_WINDOW = 64 << 10
#: row groups whose page directories a reader keeps
_MAX_DIRS = 4096

_FIXED = {"INT64": struct.Struct("<q"), "INT32": struct.Struct("<i"), "DOUBLE": struct.Struct("<d")}
_DATA_PAGE = 0
_PLAIN = 0


class Unsupported(Exception):
    """The file's layout is not one this reader reads (use pyarrow)."""


class PageError(ValueError):
    """A page failed its checksum or did not parse (use pyarrow, which names it)."""


class PageReader:
    """Point reads of rows of one Parquet file (see the module docstring).

    ``PageReader(path, metadata)`` raises :class:`Unsupported` if the schema
    is not readable here; :meth:`rows` raises it if a row group's column
    chunks are not. Not thread-safe: the cool archive calls it under its lock.
    """

    __slots__ = ("path", "_fd", "_md", "_kinds", "_dirs", "_dctx")

    def __init__(self, path: str, metadata: Any) -> None:
        self._fd = -1
        kinds: list[Any] = []
        schema = metadata.schema
        for c in range(metadata.num_columns):
            col = schema.column(c)
            if col.max_definition_level or col.max_repetition_level:
                raise Unsupported(f"column {col.name} is not required")
            if col.physical_type == "BYTE_ARRAY":
                kinds.append(None)
            elif col.physical_type in _FIXED:
                kinds.append(_FIXED[col.physical_type])
            else:
                raise Unsupported(f"column {col.name} has type {col.physical_type}")
        self.path = path
        self._md = metadata
        self._kinds = kinds
        self._dirs: dict[int, list[tuple[list[int], list[tuple]]]] = {}
        self._dctx = zstandard.ZstdDecompressor()
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass

    # ------------------------------------------------------------ directory

    def _pread(self, size: int, offset: int) -> bytes:
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise PageError(f"{self.path}: {size} bytes at offset {offset} run past the end of the file")
        return data

    def _chunk_pages(self, offset: int, total: int, rows: int, zstd: bool) -> tuple[list[int], list[tuple]]:
        """(first row of each page, (first, data offset, compressed size,
        uncompressed size, crc, zstd) of each page) of one column chunk."""
        firsts: list[int] = []
        pages: list[tuple] = []
        end = offset + total
        pos, first = offset, 0
        base, buf = offset, self._pread(min(total, _WINDOW), offset)
        while pos < end:
            rel = pos - base
            try:
                hlen, ptype, usize, csize, crc, nvals, enc = page_header(buf, rel)
            except ValueError:
                # the header may run past the window: read it where it starts
                base, buf = pos, self._pread(min(end - pos, max(_WINDOW, 8 * _PROBE)), pos)
                try:
                    hlen, ptype, usize, csize, crc, nvals, enc = page_header(buf, 0)
                except ValueError as exc:
                    raise PageError(f"{self.path}: page header at offset {pos}: {exc}") from None
            if ptype != _DATA_PAGE or enc != _PLAIN or crc < 0:
                raise Unsupported(f"page at offset {pos} (type {ptype}, encoding {enc}, crc {crc >= 0})")
            if nvals <= 0 or (not zstd and usize != csize):
                raise PageError(f"{self.path}: page header at offset {pos} has {nvals} values")
            firsts.append(first)
            pages.append((first, pos + hlen, csize, usize, crc, zstd))
            first += nvals
            pos += hlen + csize
        if pos != end or first != rows:
            raise PageError(f"{self.path}: column chunk at offset {offset} holds {first} values "
                            f"in {pos - offset} bytes, expected {rows} in {total}")
        return firsts, pages

    def _dir(self, rg: int) -> list[tuple[list[int], list[tuple]]]:
        d = self._dirs.get(rg)
        if d is not None:
            return d
        meta = self._md.row_group(rg)
        rows = meta.num_rows
        d = []
        for c in range(len(self._kinds)):
            cc = meta.column(c)
            if cc.has_dictionary_page or cc.compression not in ("ZSTD", "UNCOMPRESSED"):
                raise Unsupported(f"row group {rg} column {c}: {cc.compression}, "
                                  f"dictionary {cc.has_dictionary_page}")
            d.append(self._chunk_pages(cc.data_page_offset, cc.total_compressed_size, rows,
                                       cc.compression == "ZSTD"))
        if len(self._dirs) >= _MAX_DIRS:
            self._dirs.clear()
        self._dirs[rg] = d
        return d

    # ------------------------------------------------------------ rows

    def rows(self, rg: int, local: list[int]) -> list[list]:
        """Column values (15 Python values, in column order) of the rows
        ``local`` (ascending, within the row group) of row group ``rg``."""
        d = self._dir(rg)
        out: list[list] = [[] for _ in local]
        for c, (firsts, pages) in enumerate(d):
            kind = self._kinds[c]
            k_open, raw = -1, b""
            for n, i in enumerate(local):
                k = bisect.bisect_right(firsts, i) - 1
                if k != k_open:
                    if k < 0:
                        raise PageError(f"{self.path}: row {i} of row group {rg} precedes its pages")
                    raw = self._page(pages[k])
                    k_open = k
                j = i - pages[k][0]
                try:
                    if kind is None:
                        a, b = byte_array_at(raw, j)
                        out[n].append(raw[a:b].decode("utf-8"))
                    else:
                        out[n].append(kind.unpack_from(raw, kind.size * j)[0])
                except (ValueError, struct.error) as exc:   # UnicodeDecodeError is a ValueError
                    raise PageError(f"{self.path}: row {i} of row group {rg}, column {c}: {exc}") from None
        return out

    def _page(self, page: tuple) -> bytes:
        _first, off, csize, usize, crc, zstd = page
        comp = self._pread(csize, off)
        if zlib.crc32(comp) != crc:
            raise PageError(f"{self.path}: page at offset {off} fails its CRC-32")
        if not zstd:
            return comp
        try:
            raw = self._dctx.decompress(comp, max_output_size=usize)
        except zstandard.ZstdError as exc:
            raise PageError(f"{self.path}: page at offset {off} does not decompress: {exc}") from None
        if len(raw) != usize:
            raise PageError(f"{self.path}: page at offset {off} decompresses to {len(raw)} bytes, "
                            f"its header says {usize}")
        return raw
