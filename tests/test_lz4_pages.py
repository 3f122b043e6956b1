"""LZ4_RAW pages (the cool files' content column since session 49): the
page reader decompresses them with the system's liblz4 on every path
(exact reads, task reads, the search's scan, verify), refuses a block that
does not decode or decodes to another size than its header says (naming
the page), reads archives that mix them with zstd files, and declines
them where no liblz4 is loaded (RUNE_FAST_NO_LIBLZ4: the reads then go
through pyarrow, with the same answers)."""
from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rune_fast import ConversationStateRepository, _pages
from rune_fast.cool import CoolArchive, cool_loc
from rune_fast.cool import files as cool_files
from rune_fast.cool.schema import _COLS
from rune_fast.pages import PageReader
from rune_fast.records import ConversationMessageRecord as R
from test_cool import cool_rows, rec

_LZ4 = pa.Codec("lz4_raw")
needs_lz4 = pytest.mark.skipif(not _pages.lz4_direct(), reason="no liblz4 loaded")


def _rows(lo: int, hi: int) -> list[dict]:
    return [rec(i, ch=f"c{i % 3}", task=f"t{i % 7}",
                content=("Grüße aus Zürich, 量子計算機 " * (i % 11)) + f"message number {i}")
            for i in range(lo, hi)]


@needs_lz4
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 40))
def test_lz4_page_round_trips_and_refuses_other_sizes(data, cut):
    comp = _LZ4.compress(data, asbytes=True)
    assert _pages.lz4_page(comp, len(data)) == data
    with pytest.raises(ValueError, match="decompress"):
        _pages.lz4_page(comp, max(0, len(data) - 1 - cut)) if data else _pages.lz4_page(comp + b"\x00", 0)
    if len(comp) > 1 + cut:
        try:        # a block cut short: refused, or (rarely) another valid block of another size
            got = _pages.lz4_page(comp[:len(comp) - 1 - cut], len(data))
            assert got != data
        except ValueError:
            pass


@needs_lz4
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(0, 5000))
def test_lz4_page_never_reads_or_writes_past_its_bounds(junk, usize):
    """Any bytes as a block (a crafted page whose CRC holds): a ValueError
    or exactly ``usize`` bytes, never a crash."""
    try:
        got = _pages.lz4_page(junk, usize)
    except ValueError:
        return
    assert len(got) == usize


def _one_page(tmp_path, comp: bytes, usize: int, flags: int):
    path = str(tmp_path / "page.bin")
    with open(path, "wb") as f:
        f.write(comp)
    fd = os.open(path, os.O_RDONLY)
    try:
        flat = np.array([0, 0, len(comp), usize, zlib.crc32(comp), flags, usize // 8], dtype=np.int64)
        return _pages.take_rows(fd, np.array([1], np.int64), np.array([0], np.int64), flat,
                                np.array([0], np.int64), None, np.array([3], np.int64),
                                np.array([8], np.int64), None)
    finally:
        os.close(fd)


@needs_lz4
def test_take_rows_reads_an_lz4_page_and_names_a_bad_one(tmp_path):
    vals = np.arange(100, 164, dtype=np.int64)
    comp = _LZ4.compress(vals.tobytes(), asbytes=True)
    (got,) = _one_page(tmp_path, comp, vals.nbytes, 128)
    assert np.frombuffer(got, np.int64).tolist() == [103]
    with pytest.raises(ValueError, match="page at offset 0 decompresses to 512 bytes"):
        _one_page(tmp_path, comp, vals.nbytes + 64, 128)
    # a block whose CRC holds but which does not decode (a literal run past its end)
    with pytest.raises(ValueError, match="page at offset 0 does not decompress"):
        _one_page(tmp_path, b"\xf0\xff\xff\xff" + comp, vals.nbytes, 128)
    # both codec bits: not a directory the reader takes
    counts, starts, firsts = np.array([1], np.int64), np.array([0], np.int64), np.array([0], np.int64)
    flat = np.array([0, 0, len(comp), vals.nbytes, zlib.crc32(comp), 129, 64], dtype=np.int64)
    assert "has fields" in _pages.check_dir(counts, starts, flat, firsts, 64)
    flat[5] = 128
    assert _pages.check_dir(counts, starts, flat, firsts, 64) == ""


@pytest.fixture
def mixed(tmp_path, monkeypatch):
    """An archive of a file with zstd content (as before session 49) and
    one of today's (LZ4_RAW content)."""
    a = CoolArchive(str(tmp_path / "cool"), row_group_rows=128, durable=False)
    monkeypatch.setattr(cool_files, "_COMPRESSION",
                        {c: ("zstd" if v == "lz4" else v) for c, v in cool_files._COMPRESSION.items()})
    cool_rows(a, _rows(0, 500), range(500))
    monkeypatch.undo()
    cool_rows(a, _rows(500, 1000), range(500, 1000))
    return a


def _codec(a: CoolArchive, name: str) -> str:
    md = pq.read_metadata(os.path.join(a.cool_dir, name))
    return md.row_group(0).column(_COLS.index("content")).compression


@needs_lz4
def test_an_archive_of_zstd_and_lz4_files_reads_searches_and_verifies(mixed):
    a = mixed
    assert [_codec(a, f) for f in a.files()] == ["ZSTD", "LZ4"]
    want = {r["msg_id"]: r for r in _rows(0, 1000)}
    locs = [cool_loc(no, r) for no in (1, 2) for r in range(500)]
    fast = a.records_at(locs, R)
    assert all(h is not None for h in fast)
    assert sorted(rec_.msg_id for rec_, _o in fast) == sorted(want)
    for rec_, _o in fast:
        assert rec_.content == want[rec_.msg_id]["content"]
    for no in (1, 2):
        assert a._reader(no) is not None        # both read page by page
    hits = sorted(h.record["msg_id"] for h in a.search("GRÜSSE AUS"))
    assert hits == sorted(m for m, r in want.items() if "grüsse aus" in r["content"].casefold())
    assert len(hits) > 400
    assert a.verify() == []
    # a flipped byte in an LZ4 content page: named by its CRC
    name = a.files()[1]
    path = os.path.join(a.cool_dir, name)
    md = pq.read_metadata(path)
    (counts, flat, _f, starts), _span = PageReader(path, md)._packed(0)
    c = _COLS.index("content")
    j = starts[c]
    assert flat[7 * j + 5] == 128
    off = flat[7 * j + 1] + 3
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x20]))
    problems = a.verify()
    assert problems and any(name in str(p) for p in problems), problems


def test_a_store_reads_without_liblz4(tmp_path):
    """A process without liblz4 (RUNE_FAST_NO_LIBLZ4) declines the LZ4_RAW
    chunks to pyarrow: every read gives what the process with it gives."""
    d = str(tmp_path / "s")
    repo = ConversationStateRepository(d, hot_window=8)
    repo.append_many([R(**{k: v for k, v in r.items() if k != "schema_version"}) for r in _rows(0, 400)])
    repo.compact()
    repo.close()
    code = (
        "import json, sys\n"
        "from rune_fast import ConversationStateRepository, _pages\n"
        "r = ConversationStateRepository(sys.argv[1], read_only=True)\n"
        "out = {'lz4': _pages.lz4_direct(),\n"
        "       'get': [r.get_message(f'msg_{i:08d}').record.content for i in (0, 7, 150, 399)],\n"
        "       'tiers': [r.get_message(f'msg_{i:08d}').tier for i in (0, 399)],\n"
        "       'task': [m.msg_id for m in r.messages_for_task('t3')],\n"
        "       'win': [m.msg_id for m in r.window('c1', 20)],\n"
        "       'search': [h.record.msg_id for h in r.search('zürich')],\n"
        "       'verify': [r.verify().ok, r.verify().checked]}\n"
        "print(json.dumps(out))\n")
    runs = {}
    for name, extra in (("with", {}), ("without", {"RUNE_FAST_NO_LIBLZ4": "1"})):
        env = dict(os.environ, **extra)
        got = subprocess.run([sys.executable, "-c", code, d], env=env, capture_output=True, text=True)
        assert got.returncode == 0, got.stderr[-3000:]
        runs[name] = got.stdout
    import json
    w, wo = json.loads(runs["with"]), json.loads(runs["without"])
    assert wo["lz4"] is False and w["lz4"] is _pages.lz4_direct()
    assert w["tiers"] == ["cool", "hot"]
    w.pop("lz4"), wo.pop("lz4")
    assert w == wo
    assert len(w["task"]) == len([i for i in range(400) if i % 7 == 3]) and w["search"]
    assert w["verify"][0] is True
