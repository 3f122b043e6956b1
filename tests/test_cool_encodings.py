"""Cool files since session 31: the columns of few distinct values in a row
group dictionary-encoded and the integer columns DELTA_BINARY_PACKED, all
stored uncompressed (``schema._DICT_COLUMNS``, ``_DELTA_COLUMNS``). The
page reader decodes those pages in C (``_pages.take_rows``): the values it
gives are pyarrow's for any rows, malformed pages are ValueError (never a
crash), files of the layout before (PLAIN, zstd) are read beside today's,
merges write today's, other engines read the files, and damage in a
dictionary, index or delta page is named as before."""
from __future__ import annotations

import os
import random
import zlib

import duckdb
import numpy as np
import polars
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import _pages
from rune_fast.cool import CoolArchive, cool_loc
from rune_fast.cool import files as cool_files
from rune_fast.cool.schema import _COLS, _DELTA_COLUMNS, _DICT_COLUMNS
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.pages import PageReader
from rune_fast.records import ConversationMessageRecord as R
from test_cool import cool_rows, rec

KINDS = _pages.page_kinds()


def _write(path: str, table: pa.Table, **kw) -> None:
    pq.write_table(table, path, row_group_size=kw.pop("row_group_size", 1024), write_page_checksum=True,
                   data_page_version="1.0", data_page_size=kw.pop("data_page_size", 4096),
                   write_batch_size=32, **kw)


def _take_all(path: str, cols: list[int] | None = None) -> list[list]:
    """Every row group's values through PageReader.take, for random subsets
    of rows (and all of them), against pyarrow's."""
    md = pq.read_metadata(path)
    reader = PageReader(path, md)
    rnd = random.Random(5)
    try:
        for g in range(md.num_row_groups):
            want = pq.ParquetFile(path).read_row_group(g)
            n = want.num_rows
            for local in (list(range(n)), sorted(rnd.sample(range(n), min(n, 3))), [n - 1], [0]):
                got = reader.take(g, local, cols)
                for c, v in zip(cols if cols is not None else range(md.num_columns), got):
                    col = want.column(c).take(local)
                    if pa.types.is_string(col.type):
                        data, offs = v
                        o = offs.tolist()
                        assert [data[o[i]:o[i + 1]].decode() for i in range(len(local))] == col.to_pylist()
                    else:
                        dt = {pa.int64(): "<i8", pa.int32(): "<i4", pa.float64(): "<f8"}[col.type]
                        assert np.frombuffer(v, dtype=dt).tolist() == col.to_pylist()
    finally:
        reader.close()
    return []


# ---------------------------------------------------------------- the decoders against pyarrow

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(vals=st.lists(st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-300, 300), min_size=1, max_size=2500),
       small=st.lists(st.integers(-(1 << 31), (1 << 31) - 1), min_size=1, max_size=300))
def test_delta_pages_read_as_pyarrow_reads_them(tmp_path, vals, small):
    """DELTA_BINARY_PACKED int64 and int32 columns (wrapping deltas, every
    bit width) give pyarrow's values for any rows."""
    path = str(tmp_path / "d.parquet")
    t = pa.table({"a": pa.array(vals, pa.int64()),
                  "b": pa.array((small * (len(vals) // len(small) + 1))[:len(vals)], pa.int32())},
                 schema=pa.schema([pa.field("a", pa.int64(), nullable=False),
                                   pa.field("b", pa.int32(), nullable=False)]))
    _write(path, t, compression="none", use_dictionary=False,
           column_encoding={"a": "DELTA_BINARY_PACKED", "b": "DELTA_BINARY_PACKED"}, row_group_size=700)
    md = pq.read_metadata(path)
    assert "DELTA_BINARY_PACKED" in md.row_group(0).column(0).encodings
    _take_all(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.text(max_size=12), min_size=1, max_size=300), n=st.integers(1, 2500),
       seed=st.integers(0, 1000), zstd=st.booleans())
def test_dictionary_pages_read_as_pyarrow_reads_them(tmp_path, words, n, seed, zstd):
    """Dictionary-encoded string and int32 columns (any number of distinct
    values, so any bit width and both RLE and bit-packed runs; the
    dictionary stored raw or zstd) give pyarrow's values for any rows."""
    rnd = random.Random(seed)
    runs: list[str] = []
    while len(runs) < n:        # runs of one value and stretches of mixed ones
        w = rnd.choice(words)
        runs += [w] * rnd.choice((1, 1, 2, 9, 40))
    runs = runs[:n]
    ints = [hash(w) % 1000 - 500 for w in runs]
    path = str(tmp_path / "k.parquet")
    t = pa.table({"s": runs, "i": pa.array(ints, pa.int32())},
                 schema=pa.schema([pa.field("s", pa.string(), nullable=False),
                                   pa.field("i", pa.int32(), nullable=False)]))
    _write(path, t, compression="zstd" if zstd else "none", use_dictionary=["s", "i"], row_group_size=900)
    assert pq.read_metadata(path).row_group(0).column(0).has_dictionary_page
    _take_all(path)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), count=st.integers(0, 300), nvals=st.integers(0, 300))
def test_malformed_encoded_pages_are_value_errors(data, count, nvals):
    """Any bytes as a page of indices or deltas: values or ValueError,
    never a read past them."""
    try:
        got = _pages.decode_rle_indices(data, count)
        assert len(got) == count
    except ValueError:
        pass
    for w in (4, 8):
        try:
            got = _pages.decode_delta(data, min(count, nvals), nvals, w)
            assert len(got) == min(count, nvals) * w
        except ValueError:
            pass


def test_decoders_known_pages():
    # bit width 2; a bit-packed run of one group (0,1,2,3,0,1,2,3); an RLE run of 5 threes
    page = bytes([2, 0x03, 0b11100100, 0b11100100, 10, 3])
    assert _pages.decode_rle_indices(page, 13) == [0, 1, 2, 3] * 2 + [3] * 5
    with pytest.raises(ValueError):
        _pages.decode_rle_indices(page, 14)         # past its runs
    with pytest.raises(ValueError):
        _pages.decode_rle_indices(bytes([33, 2, 0]), 1)     # bit width > 32


# ---------------------------------------------------------------- the archive's files

def _rows(lo: int, hi: int) -> list[dict]:
    return [rec(i, f"c{i % 3}", task=f"t{i % 7}" if i % 5 else "", content=f"row {i} Straße " * (i % 4 + 1),
                tool_calls=[{"arguments": {"n": i}, "id": f"call{i}", "name": "f"}] if i % 11 == 0 else None)
            for i in range(lo, hi)]


@pytest.fixture
def two_layouts(tmp_path, monkeypatch):
    """An archive of two files: the layout before session 31 (PLAIN, zstd
    but ts) and today's; (archive, rows by msg_id)."""
    a = CoolArchive(str(tmp_path / "cool"), row_group_rows=128, durable=False)
    old, new = _rows(0, 500), _rows(500, 1000)
    monkeypatch.setattr(cool_files, "_DICT_COLUMNS", ())
    monkeypatch.setattr(cool_files, "_ENCODING", {})
    monkeypatch.setattr(cool_files, "_COMPRESSION", {c: "none" if c == "ts" else "zstd" for c in _COLS})
    cool_rows(a, sorted(old, key=lambda r: r["channel_id"]), range(500))
    monkeypatch.undo()
    cool_rows(a, sorted(new, key=lambda r: r["channel_id"]), range(500, 1000))
    return a, {r["msg_id"]: r for r in old + new}


def _encodings(path: str) -> dict[str, tuple]:
    rg = pq.read_metadata(path).row_group(0)
    return {c: (rg.column(k).encodings, rg.column(k).compression, rg.column(k).has_dictionary_page)
            for k, c in enumerate(_COLS)}


def test_todays_files_are_dictionary_and_delta_encoded_and_others_read_them(two_layouts):
    a, by_id = two_layouts
    f_old, f_new = (os.path.join(a.cool_dir, f) for f in a.files())
    old, new = _encodings(f_old), _encodings(f_new)
    for c in _COLS:
        assert not old[c][2] and old[c][1] == ("UNCOMPRESSED" if c == "ts" else "ZSTD")
        if c in _DICT_COLUMNS:
            assert new[c][2] and "RLE_DICTIONARY" in new[c][0] and new[c][1] == "UNCOMPRESSED"
        elif c in _DELTA_COLUMNS:
            assert "DELTA_BINARY_PACKED" in new[c][0] and new[c][1] == "UNCOMPRESSED"
        else:
            assert not new[c][2] and "PLAIN" in new[c][0]
    want = pq.read_table(f_new)
    assert duckdb.sql(f"select * from '{f_new}'").arrow().read_all().to_pylist() == want.to_pylist()
    assert polars.read_parquet(f_new).to_arrow().to_pylist() == want.to_pylist()
    assert sorted(want.column("msg_id").to_pylist()) == sorted(m for m in by_id if int(m[4:]) >= 500)
    _take_all(f_new)
    # the page directories name each page's kind
    md = pq.read_metadata(f_new)
    counts, flat, _firsts, starts = PageReader(f_new, md)._packed(0)[0]
    kinds = {_COLS[c]: {(flat[7 * j + 5] >> 1) & 63 for j in range(starts[c], starts[c] + counts[c])}
             for c in range(len(_COLS))}
    assert kinds["channel_id"] == {KINDS["dictionary"], KINDS["rle_dictionary"]}
    assert kinds["ord"] == {KINDS["delta"]} and kinds["content"] == {KINDS["plain"]}


def test_both_layouts_read_search_merge_and_verify_alike(two_layouts):
    a, by_id = two_layouts
    locs = [cool_loc(no, r) for no in (1, 2) for r in range(500)]
    fresh = CoolArchive.open(a.cool_dir, a.files())
    fast = fresh.records_at(locs, R)
    assert all(h is not None for h in fast)
    for (rec_, _o), row in zip(fast, fresh.rows_at(locs)):
        assert rec_.msg_id == row.record["msg_id"] and row.record == by_id[rec_.msg_id]
        assert rec_.tool_calls == tuple(by_id[rec_.msg_id]["tool_calls"])
    for mid in ("msg_00000000", "msg_00000499", "msg_00000500", "msg_00000777", "msg_00000999"):
        g = CoolArchive.open(a.cool_dir, a.files())
        assert g.get_row(mid).record == by_id[mid]
        assert g.id_records_at(mid, g.id_locs(mid), R)[0][0].msg_id == mid
    want = sorted(m for m, r in by_id.items() if "strasse" in r["content"].casefold())
    assert sorted(h.record["msg_id"] for h in fresh.search("STRASSE")) == want
    assert fresh.verify() == []
    ch = fresh.merge([fresh.files()], durable=False)
    fresh.unlink_files(ch.removed)
    (name,) = fresh.files()
    enc = _encodings(os.path.join(fresh.cool_dir, name))
    assert all(enc[c][2] for c in _DICT_COLUMNS)
    rows = fresh.rows_at([cool_loc(int(name[5:13]), r) for r in range(1000)])
    assert sorted(r.record["msg_id"] for r in rows) == sorted(by_id)
    assert all(r.record == by_id[r.record["msg_id"]] for r in rows)
    assert fresh.verify() == []


def _page_of(path: str, column: str, kind: int, rg: int = 0) -> tuple[int, int]:
    """(data offset, compressed size) of the first page of ``kind`` of
    ``column`` in row group ``rg``."""
    reader = PageReader(path, pq.read_metadata(path))
    try:
        counts, flat, _f, starts = reader._packed(rg)[0]
        c = _COLS.index(column)
        for j in range(starts[c], starts[c] + counts[c]):
            if flat[7 * j + 5] >> 1 == kind:
                return flat[7 * j + 1], flat[7 * j + 2]
    finally:
        reader.close()
    raise AssertionError(f"no page of kind {kind} in {column}")


@pytest.mark.parametrize("column,kind", [("channel_id", "dictionary"), ("role", "rle_dictionary"),
                                         ("task_id", "rle_dictionary"), ("ord", "delta"),
                                         ("token_estimate", "delta"), ("schema_version", "dictionary")])
def test_damage_in_an_encoded_page_is_named(tmp_path, column, kind):
    """A flipped bit in a dictionary, index or delta page: an exact read
    of a row of its group raises CorruptStateCheckpointError naming the
    file (its CRC-32 fails in the page reader, then pyarrow's read names
    it); the compiled path never serves the row."""
    a = CoolArchive(str(tmp_path / "cool"), row_group_rows=64, durable=False)
    rows = sorted(_rows(0, 200), key=lambda r: r["channel_id"])
    cool_rows(a, rows, range(200))
    path = os.path.join(a.cool_dir, a.files()[0])
    off, size = _page_of(path, column, KINDS[kind])
    with open(path, "r+b") as f:
        f.seek(off + size // 2)
        b = f.read(1)
        f.seek(off + size // 2)
        f.write(bytes([b[0] ^ 0x04]))
    b2 = CoolArchive.open(a.cool_dir, a.files())
    first = pq.ParquetFile(path).read_row_group(0, columns=["msg_id"]).column(0).to_pylist()
    assert b2.records_at([cool_loc(1, 0)], R) == [None]
    with pytest.raises(CorruptStateCheckpointError) as ei:
        b2.get_row(first[len(first) // 2])
    assert path in str(ei.value)
    assert any(p.file == a.files()[0] for p in CoolArchive.open(a.cool_dir, a.files()).verify())


def test_check_dir_takes_kinds_in_their_places():
    """A directory's dictionary page only as a column's first (holding no
    rows), indices only after one, no unknown kind."""
    def one(pages: list[tuple]) -> str:
        flat = np.array([x for p in pages for x in p], dtype=np.int64)
        firsts = np.array([p[0] for p in pages], dtype=np.int64)
        return _pages.check_dir(np.array([len(pages)], dtype=np.int64), np.array([0], dtype=np.int64),
                                flat, firsts, 10)
    crc = zlib.crc32(b"")
    d, i, p, dl = (k << 1 for k in (KINDS["dictionary"], KINDS["rle_dictionary"], KINDS["plain"], KINDS["delta"]))
    assert one([(0, 4, 8, 8, crc, d, 3), (0, 12, 4, 4, crc, i, 10)]) == ""
    assert one([(0, 4, 8, 8, crc, d, 3), (0, 12, 4, 4, crc, i, 6), (6, 16, 9, 9, crc, p, 4)]) == ""
    assert one([(0, 4, 8, 8, crc, dl, 10)]) == ""
    assert one([(0, 12, 4, 4, crc, i, 10)]) != ""                                   # indices, no dictionary
    assert one([(0, 12, 4, 4, crc, p, 6), (6, 4, 8, 8, crc, d, 3)]) != ""           # dictionary not first
    assert one([(0, 4, 8, 8, crc, d, 3)]) != ""                                     # a dictionary, no rows
    assert one([(0, 4, 8, 8, crc, 8 << 1, 10)]) != ""                               # unknown kind
    assert one([(0, 4, 8, 9, crc, d, 3), (0, 12, 4, 4, crc, i, 10)]) != ""          # raw, two sizes


def test_spark_reads_todays_cool_file(tmp_path):
    """The third engine FORMAT.md names: Spark reads a cool file of today's
    layout (dictionary and DELTA_BINARY_PACKED pages) as pyarrow does."""
    pyspark = pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession
    a = CoolArchive(str(tmp_path / "cool"), row_group_rows=64, durable=False)
    cool_rows(a, sorted(_rows(0, 300), key=lambda r: r["channel_id"]), range(300))
    path = os.path.join(a.cool_dir, a.files()[0])
    spark = (SparkSession.builder.master("local[1]").appName("rune-cool-encodings-test")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    try:
        got = sorted(tuple(r) for r in spark.read.parquet(path).collect())
    finally:
        spark.stop()
    assert pyspark.__version__
    assert got == sorted(tuple(r.values()) for r in pq.read_table(path).to_pylist())


def test_rows_of_a_group_through_take(two_layouts):
    """PageReader.rows (the dict path's direct read) gives pyarrow's values
    for both layouts, a given column decoded from what it is given, and
    nothing for no rows."""
    a, _by_id = two_layouts
    for name in a.files():
        path = os.path.join(a.cool_dir, name)
        reader = PageReader(path, pq.read_metadata(path))
        try:
            want = pq.read_table(path).slice(0, 128).to_pylist()
            local = [0, 5, 77, 127]
            assert reader.rows(0, local) == [list(want[i].values()) for i in local]
            c = _COLS.index("content")
            got = reader.rows(0, local, {c: [b"x%d" % i for i in local]})
            assert [r[c] for r in got] == [f"x{i}" for i in local]
            assert reader.rows(0, []) == []
        finally:
            reader.close()
