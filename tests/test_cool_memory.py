"""The Arrow memory a cool write holds is bounded by a row group (and, for a
merge, one channel's rows), not by the rows written: a cooling run and a
merge of files many times that size stay under a fixed bound. Measured as
the Arrow pool's allocated bytes at every row group the Parquet writer is
given (deterministic: no background thread runs here)."""
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
    """The Arrow pool's allocated bytes each time a row group is written."""
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
    # and the merged copy, 64 MB)
    assert len(sampled) >= 8000 // 64
    assert max(sampled) - base < 6 * MiB
    assert [(r.record, r.ord) for r in all_rows(archive)] == before
    archive.close()
