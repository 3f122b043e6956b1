"""The compiled scan of a column chunk's pages (``_pages.find_pages``, what
``PageReader.find`` runs for a search): the values it returns are those a
plain-Python model finds in the pages the spans touch, and every page it
reads is checked (CRC-32, size, PLAIN layout) before anything is returned.
"""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast._pages import Unsupported, find_pages


def _plain(values: list[bytes]) -> bytes:
    return b"".join(len(v).to_bytes(4, "little") + v for v in values)


def _chunk(path: str, pages: list[list[bytes]], zstd: list[bool], gap: int = 3):
    """A file of PLAIN pages (``gap`` bytes between them, standing for page
    headers) and its packed directory: ``(flat, firsts)``."""
    flat, firsts, out, first = [], [], bytearray(), 0
    for vals, z in zip(pages, zstd):
        raw = _plain(vals)
        stored = zstandard.ZstdCompressor().compress(raw) if z else raw
        out += b"\x00" * gap
        flat += [first, len(out), len(stored), len(raw), zlib.crc32(stored), int(z), len(vals)]
        firsts.append(first)
        out += stored
        first += len(vals)
    with open(path, "wb") as f:
        f.write(bytes(out))
    return np.array(flat, np.int64), np.array(firsts, np.int64)


def _find(path, flat, firsts, spans, probes, seen=None):
    fd = os.open(path, os.O_RDONLY)
    try:
        return find_pages(fd, flat, firsts, 0, len(firsts), spans, probes,
                          zstandard.ZstdDecompressor().decompress, seen)
    finally:
        os.close(fd)


def _model(pages, probes):
    """Every page searched value by value: per probe, (row, value)."""
    starts = np.cumsum([0] + [len(p) for p in pages])
    out = []
    for needle, ci in probes:
        out.append([(int(starts[k]) + i, v) for k in range(len(pages)) for i, v in enumerate(pages[k])
                    if needle in (v.lower() if ci else v)])
    return out


_VALUES = st.lists(st.binary(max_size=12) | st.sampled_from([b"Zurich report", b"z\xc3\xbcrich", b"REPORT"]),
                   min_size=1, max_size=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=st.lists(_VALUES, min_size=1, max_size=6), data=st.data())
def test_find_pages_finds_what_the_model_finds(tmp_path, pages, data):
    zstd = data.draw(st.lists(st.booleans(), min_size=len(pages), max_size=len(pages)))
    rows = sum(len(p) for p in pages)
    probes = data.draw(st.lists(st.tuples(st.sampled_from([b"report", b"z\xc3\xbc", b"r", b"", b"\x00"]),
                                          st.booleans()), min_size=1, max_size=3))
    cuts = sorted(set(data.draw(st.lists(st.integers(0, rows), max_size=6))))
    spans = None
    if data.draw(st.booleans()):
        spans = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2) if cuts[i] < cuts[i + 1]]
    path = str(tmp_path / "chunk.bin")
    flat, firsts = _chunk(path, pages, zstd)
    arr = None if spans is None else np.array(spans, np.int64).reshape(-1, 2)
    seen: list[int] = []
    got = _find(path, flat, firsts, arr, [(n, ci) for n, ci in probes], seen)
    starts = np.cumsum([0] + [len(p) for p in pages])
    want_pages = [k for k in range(len(pages))
                  if spans is None or any(lo < starts[k + 1] and hi > starts[k] for lo, hi in spans)]
    assert seen == [int(flat[7 * k + 1]) for k in want_pages]
    model = [[(r, v) for r, v in part if any(starts[k] <= r < starts[k + 1] for k in want_pages)]
             for part in _model(pages, probes)]
    assert got == model


def test_find_pages_checks_every_page_it_reads(tmp_path):
    pages = [[b"alpha report", b"beta"], [b"gamma", b"REPORT delta"], [b"epsilon report"]]
    path = str(tmp_path / "chunk.bin")
    flat, firsts = _chunk(path, pages, [True, False, True])
    everything = _find(path, flat, firsts, None, [(b"report", True)])
    assert [r for r, _v in everything[0]] == [0, 3, 4]
    # a flipped byte in page 1: named when page 1 is read, not when only page 2 is
    off1 = int(flat[7 * 1 + 1])
    with open(path, "r+b") as f:
        f.seek(off1 + 6)
        b = f.read(1)
        f.seek(off1 + 6)
        f.write(bytes([b[0] ^ 0x20]))
    with pytest.raises(ValueError, match=f"offset {off1} fails its CRC-32"):
        _find(path, flat, firsts, None, [(b"report", True)])
    assert _find(path, flat, firsts, np.array([[4, 5]], np.int64), [(b"report", True)]) == [[(4, b"epsilon report")]]
    # a page whose header says another size than its frame holds
    flat2 = flat.copy()
    flat2[7 * 2 + 3] += 1
    with pytest.raises(ValueError, match=f"offset {int(flat[7 * 2 + 1])} (decompresses to|does not decompress)"):
        _find(path, flat2, firsts, np.array([[4, 5]], np.int64), [(b"x", False)])
    # values that run past their page
    flat3 = flat.copy()
    flat3[7 * 2 + 6] += 1
    with pytest.raises(ValueError, match="PLAIN page ends before value 1"):
        _find(path, flat3, firsts, np.array([[4, 5]], np.int64), [(b"x", False)])
    # a page that is not PLAIN
    flat4 = flat.copy()
    flat4[7 * 0 + 5] |= 2 << 1
    with pytest.raises(Unsupported, match="not a PLAIN data page"):
        _find(path, flat4, firsts, np.array([[0, 1]], np.int64), [(b"x", False)])

