"""The Arrow memory a cool write holds is bounded by a row group (and, for a
merge, one channel's rows), not by the rows written: a cooling run and a
merge of files many times that size stay under a fixed bound. Measured as
the Arrow pool's allocated bytes each time the Parquet writer is given
rows (every whole row group of a part at once; deterministic: no
background thread runs here)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rune_fast.cool import CoolArchive, _table_from_records, record_digest

from test_cool import all_rows, rec

MiB = 1 << 20
CONTENT = "x" * 4000


@pytest.fixture
def sampled(monkeypatch):
    """The Arrow pool's allocated bytes each time the writer is given rows."""
    seen: list[int] = []
    orig = pq.ParquetWriter.write_table

    def write_table(self, table, *a, **k):
        seen.append(pa.total_allocated_bytes())
        return orig(self, table, *a, **k)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    return seen


def _table(lo: int, hi: int, channels: int) -> pa.Table:
    rows = [rec(i, f"ch{i % channels:02d}", content=CONTENT + str(i)) for i in range(lo, hi)]
    return _table_from_records(rows, list(range(lo, hi)), [record_digest(r) for r in rows])


def test_a_cooling_run_holds_a_row_group_not_the_run(tmp_path, sampled):
    archive = CoolArchive(str(tmp_path / "cool"), row_group_rows=64)
    table = _table(0, 6000, 7)      # channels interleaved: the file's order is not the table's
    assert table.nbytes > 20 * MiB
    base = pa.total_allocated_bytes()
    sampled.clear()
    archive.cool_table(table)
    assert len(sampled) >= 6000 // 64
    # (before: the table sorted by channel, a copy of the whole run)
    assert max(sampled) - base < 2 * MiB
    del table
    assert len(all_rows(archive)) == 6000
    archive.close()


def test_a_merge_holds_a_channel_and_a_row_group_a_file(tmp_path, sampled):
    archive = CoolArchive(str(tmp_path / "cool"), row_group_rows=64)
    for k in range(4):
        archive.cool_table(_table(k * 2000, (k + 1) * 2000, 32))
    before = [(r.record, r.ord) for r in all_rows(archive)]
    assert len(archive.files()) == 4
    base = pa.total_allocated_bytes()
    sampled.clear()
    change = archive.merge([archive.files()])
    assert len(change.files) == 1
    # 32 MB of content merged; a channel's rows are 1 MB (and its sorted
    # copy), a row group of each source 256 KB (before: every source whole
    # and the merged copy, 64 MB); the writer is given each channel's rows
    assert len(sampled) >= 32
    assert max(sampled) - base < 6 * MiB
    assert [(r.record, r.ord) for r in all_rows(archive)] == before
    archive.close()


def _merged_file_ids(tmp_path, name, tables, chunk, monkeypatch):
    from rune_fast.cool import writer
    monkeypatch.setattr(writer, "MERGE_CHUNK_ROWS", chunk)
    archive = CoolArchive(str(tmp_path / name), row_group_rows=16)
    for t in tables:
        archive.cool_table(t)
    change = archive.merge([archive.files()])
    path = archive.path_of(change.files[0])
    ids = pq.read_table(path, columns=["msg_id"]).column("msg_id").to_pylist()
    rows = [(r.record, r.ord) for r in all_rows(archive)]
    archive.close()
    return ids, rows


def test_a_large_channel_is_merged_in_chunks_in_the_same_order(tmp_path, monkeypatch):
    # a channel of more than MERGE_CHUNK_ROWS rows is taken from its sources a
    # chunk at a time in merged order (stamped and unstamped rows interleaved
    # across the files): the file is the same as the whole channel's merge
    import random
    rnd = random.Random(5)
    tables = []
    for k in range(3):
        rows, ords = [], []
        for j in range(300):
            i = k * 1000 + j
            stamped = rnd.random() < 0.5
            hlc = f"{rnd.randrange(10**6):015d}-0000000000-dev" if stamped else ""
            rows.append(rec(i, "big" if j % 5 else f"ch{j % 3}", hlc=hlc))
            ords.append(rnd.randrange(10**6))
        # (each run in the channel's order key, as cooling gives it)
        key = sorted(range(len(rows)), key=lambda x: (rows[x]["hlc"] != "", 0 if rows[x]["hlc"] else ords[x],
                                                      rows[x]["hlc"], rows[x]["msg_id"]))
        rows, ords = [rows[x] for x in key], [ords[x] for x in key]
        tables.append(_table_from_records(rows, ords, [record_digest(r) for r in rows]))
    whole = _merged_file_ids(tmp_path, "whole", tables, 10**9, monkeypatch)
    chunked = _merged_file_ids(tmp_path, "chunked", tables, 37, monkeypatch)
    assert chunked == whole
    assert len(whole[0]) == 900


def test_a_merge_of_one_large_channel_holds_a_chunk(tmp_path, sampled, monkeypatch):
    from rune_fast.cool import writer
    monkeypatch.setattr(writer, "MERGE_CHUNK_ROWS", 256)
    archive = CoolArchive(str(tmp_path / "cool"), row_group_rows=64)
    for k in range(4):
        archive.cool_table(_table(k * 2000, (k + 1) * 2000, 1))
    base = pa.total_allocated_bytes()
    sampled.clear()
    archive.merge([archive.files()])
    # 32 MB of content in one channel; a chunk of 256 rows is 1 MB (before:
    # the channel whole and its sorted copy, 64 MB); the writer is given
    # each chunk's rows
    assert len(sampled) >= 8000 // 256
    assert max(sampled) - base < 6 * MiB
    assert [r.record["msg_id"] for r in all_rows(archive)] == [f"msg_{i:08d}" for i in range(8000)]
    archive.close()


def test_parts_of_any_size_make_the_layout_of_one_write(tmp_path):
    """A file written from parts of any sizes (the writer is given each
    part's whole row groups in one call, the rest carried) holds the bytes
    that one write_table of all its rows (chunked as the parts are) with
    the same row group size makes, and the bytes of one call a row group
    (the writer before): the same row groups, pages and footer."""
    from rune_fast.cool.files import _FileSet
    table = _table(0, 700, 3)
    sizes = [5, 64, 200, 1, 130, 300]       # row groups of 64 cut across them
    parts, at = [], 0
    for n in sizes:
        parts.append(table.slice(at, n))
        at += n
    fs = _FileSet.__new__(_FileSet)
    fs._rg_rows = 64
    fed: list[int] = []
    with pa.OSFile(str(tmp_path / "parts.parquet"), "w") as sink:
        fs._write_parts(sink, iter(parts), feed=lambda t: fed.append(t.num_rows))
    chunked = pa.concat_tables(parts)
    with pa.OSFile(str(tmp_path / "whole.parquet"), "w") as sink:
        w = _FileSet._parquet_writer(sink, table.schema)
        w.write_table(chunked, row_group_size=64)
        w.close()
    with pa.OSFile(str(tmp_path / "groups.parquet"), "w") as sink:
        w = _FileSet._parquet_writer(sink, table.schema)
        for a in range(0, 700, 64):
            w.write_table(chunked.slice(a, 64), row_group_size=64)
        w.close()
    got = (tmp_path / "parts.parquet").read_bytes()
    assert got == (tmp_path / "whole.parquet").read_bytes() == (tmp_path / "groups.parquet").read_bytes()
    md = pq.read_metadata(str(tmp_path / "parts.parquet"))
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [64] * 10 + [60]
    # (each part's whole row groups in one call, the last rows at the end)
    assert fed == [64, 192, 128, 256, 60]
