"""Cool files are read whatever their pages: files with every column zstd
(today's), files with some columns stored uncompressed (``_COMPRESSION``
takes a choice per column; session 28 measured ``ts``, ``token_estimate``
and ``ord`` uncompressed), and files of other page sizes (1 KiB pages were measured) mix in one archive,
which reads, searches, merges and verifies as one: the reader takes each
column chunk's compression and any page size, and the sidecar's page
directories say where each page lies. Damage in any page is caught as
before.

Also: the compiled take decompresses a page without ``max_output_size``
only when its zstd frame declares the page's size (``zstd_frame_size``), and
the page directory of a row group is checked once, not at every read.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from rune_fast import _pages
from rune_fast.cool import CoolArchive, cool_loc
from rune_fast.cool import files as cool_files
from rune_fast.cool.schema import _COLS, _COMPRESSION, _PAGE_BYTES
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.pages import PageReader, page_directories
from rune_fast.records import ConversationMessageRecord as R
from test_cool import cool_rows, rec

N = 600
GROUP = 256
#: the columns the second file of ``mixed`` stores uncompressed
RAW = ("ts", "token_estimate", "ord")


def _rows(lo: int, hi: int) -> list[dict]:
    return [rec(i, ch=f"c{i % 3}", task=f"t{i % 7}" if i % 5 else "",
                content=("Straße über " * (i % 9)) + f"message number {i}") for i in range(lo, hi)]


def _pages_per_column(path: str) -> list[int]:
    md = pq.read_metadata(path)
    index, words = page_directories(path, md)
    n = len(_COLS)
    out = [0] * n
    for g in range(md.num_row_groups):
        counts = words[index[g]:index[g] + n]
        for c in range(n):
            out[c] += int(counts[c])
    return out


@pytest.fixture
def mixed(tmp_path, monkeypatch):
    """An archive of three files: the first with every column zstd, the
    second and third with ``RAW`` uncompressed, the third with 1 KiB pages;
    (archive, rows by msg_id)."""
    d = str(tmp_path / "cool")
    a = CoolArchive(d, row_group_rows=GROUP, durable=False)
    parts = [_rows(0, N), _rows(N, 2 * N), _rows(2 * N, 3 * N)]
    monkeypatch.setattr(cool_files, "_DICT_COLUMNS", ())      # (PLAIN, as before session 31)
    monkeypatch.setattr(cool_files, "_ENCODING", {})
    monkeypatch.setattr(cool_files, "_COMPRESSION", "zstd")
    cool_rows(a, parts[0], range(N))
    monkeypatch.setattr(cool_files, "_COMPRESSION", {c: "none" if c in RAW else "zstd" for c in _COLS})
    cool_rows(a, parts[1], range(N, 2 * N))
    monkeypatch.setattr(cool_files, "_PAGE_BYTES", 1 << 10)
    cool_rows(a, parts[2], range(2 * N, 3 * N))
    monkeypatch.undo()
    return a, {r["msg_id"]: r for part in parts for r in part}


def _compression(path: str, col: str) -> str:
    return pq.read_metadata(path).row_group(0).column(_COLS.index(col)).compression


def _want(r: dict) -> dict:
    return {k: r[k] for k in ("msg_id", "channel_id", "task_id", "content", "ts", "role", "token_estimate")}


def _got(rec_: R) -> dict:
    return {k: getattr(rec_, k) for k in ("msg_id", "channel_id", "task_id", "content", "ts", "role",
                                          "token_estimate")}


def test_old_and_new_layouts_read_alike(mixed):
    a, by_id = mixed
    f_old, f_new, f_1k = (os.path.join(a.cool_dir, f) for f in a.files())
    assert [_compression(f_old, c) for c in _COLS] == ["ZSTD"] * len(_COLS)
    for f in (f_new, f_1k):
        assert [_compression(f, c) for c in _COLS] == ["UNCOMPRESSED" if c in RAW else "ZSTD" for c in _COLS]
    ords = _COLS.index("ord")
    assert _pages_per_column(f_1k)[ords] > _pages_per_column(f_new)[ords]     # smaller pages
    for no in (1, 2, 3):
        assert a._reader(no) is not None            # all read page by page
    locs = [cool_loc(no, r) for no in (1, 2, 3) for r in range(N)]
    fast = a.records_at(locs, R)
    assert all(hit is not None for hit in fast)
    for (rec_, _o), row in zip(fast, a.rows_at(locs)):
        assert _got(rec_) == _want(row.record) == _want(by_id[rec_.msg_id])
    for i in (0, 7, N - 1, N, N + 13, 2 * N - 1, 2 * N, 3 * N - 1):
        mid = f"msg_{i:08d}"
        (row,) = a.rows_at(a.id_locs(mid))
        assert _want(row.record) == _want(by_id[mid])
    want = sorted(m for m, r in by_id.items() if "strasse" in r["content"].casefold())
    assert sorted(h.record["msg_id"] for h in a.search("STRASSE")) == want
    assert a.verify() == []


def test_a_merge_of_every_layout_writes_todays(mixed):
    a, by_id = mixed
    ch = a.merge([a.files()], durable=False)
    a.unlink_files(ch.removed)
    (name,) = a.files()
    path = os.path.join(a.cool_dir, name)
    assert [_compression(path, c) for c in _COLS] == \
        [{"none": "UNCOMPRESSED", "zstd": "ZSTD", "lz4": "LZ4"}[_COMPRESSION[c]] for c in _COLS]
    assert _compression(path, "content") == "LZ4"       # (LZ4_RAW: pyarrow's name for it)
    rows = a.rows_at([cool_loc(int(name[5:13]), r) for r in range(3 * N)])
    assert sorted(r.record["msg_id"] for r in rows) == sorted(by_id)
    for r in rows:
        assert _want(r.record) == _want(by_id[r.record["msg_id"]])
    fast = a.records_at([cool_loc(int(name[5:13]), r) for r in range(3 * N)], R)
    assert all(hit is not None for hit in fast)
    assert a.verify() == []


def _page_of(path: str, rg: int, c: int, local: int) -> tuple[int, int]:
    """(data offset, compressed size) of the page of column ``c`` holding
    row ``local`` of row group ``rg``."""
    reader = PageReader(path, pq.read_metadata(path))
    try:
        firsts, pages = reader._dir(rg)[c]
        k = max(i for i, f in enumerate(firsts) if f <= local)
        return pages[k][1], pages[k][2]
    finally:
        reader.close()


@pytest.mark.parametrize("col", list(range(len(_COLS))))
def test_a_flipped_byte_in_any_small_page_is_never_served(tmp_path, col):
    """A byte flipped in the page of any column holding a row: the page
    read declines it (CRC-32), and the read that would return the row
    names the file and the row."""
    d = str(tmp_path / "cool")
    a = CoolArchive(d, row_group_rows=GROUP, durable=False)
    rows = _rows(0, N)
    cool_rows(a, rows, range(N))
    a.close()
    path = os.path.join(d, a.files()[0])
    row = GROUP + 77
    off, csize = _page_of(path, 1, col, 77)
    with open(path, "r+b") as f:
        f.seek(off + csize // 2)
        b = f.read(1)
        f.seek(off + csize // 2)
        f.write(bytes([b[0] ^ 0x04]))
    b_ = CoolArchive.open(d, a.files(), durable=False)
    assert b_.records_at([cool_loc(1, row)], R) == [None]
    with pytest.raises(CorruptStateCheckpointError) as ei:
        b_.rows_at([cool_loc(1, row)])
    assert ei.value.path == path
    assert b_.verify() != []


# ------------------------------------------------------------------ zstd frames


@settings(max_examples=80, deadline=None)
@given(data=st.binary(max_size=3000), size=st.booleans(), level=st.integers(1, 5))
def test_zstd_frame_size_is_the_declared_size(data, size, level):
    frame = zstandard.ZstdCompressor(level=level, write_content_size=size).compress(data)
    want = zstandard.get_frame_parameters(frame).content_size
    got = _pages.zstd_frame_size(frame)
    assert got == (want if size and want != zstandard.CONTENTSIZE_UNKNOWN else -1)
    for cut in range(0, min(len(frame), 14)):
        assert _pages.zstd_frame_size(frame[:cut]) in (-1, got)   # a header cut short: -1
    assert _pages.zstd_frame_size(b"\x00" + frame[1:]) == -1


def _one_page_file(tmp_path, frame: bytes) -> str:
    path = str(tmp_path / "page.bin")
    with open(path, "wb") as f:
        f.write(frame)
    return path


def _take(path: str, frame: bytes, usize: int, calls: list) -> list:
    real = zstandard.ZstdDecompressor().decompress

    def decompress(comp, *args, **kwargs):
        calls.append(bool(args or kwargs))
        return real(comp, *args, **kwargs)

    fd = os.open(path, os.O_RDONLY)
    try:
        flat = np.array([0, 0, len(frame), usize, zlib.crc32(frame), 1, usize // 8], dtype=np.int64)
        return _pages.take_rows(fd, np.array([1], np.int64), np.array([0], np.int64), flat,
                                np.array([0], np.int64), None, np.array([3], np.int64),
                                np.array([8], np.int64), decompress)
    finally:
        os.close(fd)


@pytest.mark.parametrize("with_size", [True, False])
def test_take_decompresses_with_or_without_a_declared_size(tmp_path, with_size):
    """With the system's libzstd the page is decompressed into a buffer of
    its size without the callable. Without it (RUNE_FAST_NO_LIBZSTD: the
    run of test_pages_without_libzstd), a frame that declares the page's size
    takes zstandard's one-shot call; one that declares none (another
    writer) is bounded by the page's size."""
    vals = np.arange(100, 164, dtype=np.int64)
    frame = zstandard.ZstdCompressor(write_content_size=with_size).compress(vals.tobytes())
    calls: list = []
    (got,) = _take(_one_page_file(tmp_path, frame), frame, vals.nbytes, calls)
    assert np.frombuffer(got, np.int64).tolist() == [103]
    assert calls == ([] if _pages.zstd_direct() else [not with_size])


def test_pages_without_libzstd():
    """The page reader's tests again in a process that does not load the
    system's libzstd: every page through zstandard's callable, holding the
    GIL (what a machine without libzstd.so.1 runs)."""
    env = dict(os.environ, RUNE_FAST_NO_LIBZSTD="1")
    code = "import rune_fast._pages as p, sys; sys.exit(0 if not p.zstd_direct() else 3)"
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
    here = os.path.dirname(__file__)
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          os.path.join(here, "test_pages.py"), os.path.join(here, "test_cool_pagesize.py"),
                          os.path.join(here, "test_kept_filters.py"),
                          os.path.join(here, "test_find_pages.py"),
                          os.path.join(here, "test_few_groups.py"), "-k", "not without_libzstd"],
                         env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]


def test_take_refuses_a_frame_of_another_size(tmp_path):
    """A frame that declares another size than its page header's: bounded by
    the page's size, and refused by the size check (ValueError)."""
    vals = np.arange(64, dtype=np.int64)
    frame = zstandard.ZstdCompressor().compress(vals.tobytes())
    with pytest.raises((ValueError, zstandard.ZstdError)):
        _take(_one_page_file(tmp_path, frame), frame, vals.nbytes - 64, [])


# ------------------------------------------------------------------ the directory, checked once


def test_a_group_directory_is_checked_once_and_again_when_replaced(mixed, monkeypatch):
    a, _by_id = mixed
    fi = a._files[3]
    seen = []
    real = _pages.check_dir
    import rune_fast.cool.sidecar as sidecar

    def counting(*args):
        seen.append(args[4])
        return real(*args)

    monkeypatch.setattr(sidecar, "check_dir", counting)
    fi._dirs_ok = None
    for _ in range(3):
        fi.page_dir(1)
    fi.page_dir(0)
    assert len(seen) == 2
    index, words = fi.pagedir
    bad = words.copy()
    bad[index[1] + 2 * len(_COLS) + 6] += 1    # the first page of group 1 claims a value more
    fi.pagedir = (index, bad)
    for _ in range(2):
        with pytest.raises(ValueError, match="page directory of row group 1"):
            fi.page_dir(1)
    assert len(seen) == 4                   # refused each time, never taken as checked
    fi.pagedir = (index, words)
    fi.page_dir(1)
    assert len(seen) == 5


# ------------------------------------------------------------------ one row's pages in runs


def test_one_rows_pages_read_in_runs_give_every_value(mixed, monkeypatch):
    """A single row's pages are read in runs across columns (``_row_runs``):
    every row of every group of each layout reads what a take of all the
    group's rows (each column's pages read alone) gives for it, and what a
    read that names any column order gives."""
    a, _by_id = mixed
    for no in (1, 2, 3):
        reader = a._reader(no)
        fi = a._files[no]
        for rg in range(len(fi.rg_list) - 1):
            n = fi.rg_list[rg + 1] - fi.rg_list[rg]
            whole = reader.take(rg, list(range(n)))
            for i in range(0, n, 7):
                one = reader.take(rg, [i])
                for c, (col_all, col_one) in enumerate(zip(whole, one)):
                    w = int(reader._widths[c])
                    if w:
                        assert col_one == col_all[i * w:(i + 1) * w]
                    else:
                        data, offs = col_all
                        assert col_one[0] == data[offs[i]:offs[i + 1]]
            cols = [14, 0, 4, 13, 5]
            got = reader.take(rg, [n - 1], cols)
            assert [g if int(reader._widths[c]) else g[0] for c, g in zip(cols, got)] == \
                [reader.take(rg, [n - 1])[c] if int(reader._widths[c]) else reader.take(rg, [n - 1])[c][0]
                 for c in cols]


def test_a_flipped_byte_in_a_run_names_its_page(tmp_path):
    """A page of a run that fails its CRC is named by its own offset; bytes
    between the pages of a run (other pages' headers) are read, not used."""
    d = str(tmp_path / "cool")
    a = CoolArchive(d, row_group_rows=GROUP, durable=False)
    cool_rows(a, _rows(0, N), range(N))
    a.close()
    path = os.path.join(d, a.files()[0])
    off, csize = _page_of(path, 0, _COLS.index("task_id"), 5)
    with open(path, "r+b") as f:
        f.seek(off + csize - 1)
        b = f.read(1)
        f.seek(off + csize - 1)
        f.write(bytes([b[0] ^ 0x01]))
    reader = PageReader(path, pq.read_metadata(path))
    try:
        with pytest.raises(Exception, match=f"offset {off} fails its CRC"):
            reader.take(0, [5])
        assert reader.take(0, [5], [_COLS.index("content")])[0][0]
    finally:
        reader.close()
