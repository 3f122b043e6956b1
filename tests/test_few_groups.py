"""A rare needle's scan (rune_fast.cool.scan.FewGroups): the groups whose
filters pass few rows are read a window at a time, their pages fetched on
the scan threads ahead of the search. Checked here: the hits (records built
from the fetched pages, or values) are those of a plain casefold model over
many groups and windows, any window size; a flipped byte in a content page
or in a page of a hit's other columns is named, never served; a window
whose pages cannot be fetched is scanned group by group."""
from __future__ import annotations

import os
import shutil

import pyarrow.parquet as pq
import pytest

from rune_fast.cool import CoolArchive, index_dir_for, scan as cool_scan, search as cool_search
from rune_fast.cool.schema import _COLS
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.pages import PageReader, zstd_direct
from rune_fast.records import ConversationMessageRecord
from test_cool import cool_rows, rec

RARE = ("zebracorn", "Zürich", "量子計算機", "GOETHESTRASSE")


def _rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        words = ["plain text of row", str(i), "with some filler words to fill a page"]
        if i % 499 == 5:
            words.append("a ZebraCorn here")
        if i % 487 == 7:
            words.append("nach zürich")
        if i % 491 == 11:
            words.append("量子計算機")
        if i % 467 == 13:
            words.append("Goethestraße 5")
        out.append(rec(i, f"ch{i % 5}", content=" ".join(words), task=f"t{i % 7}" if i % 2 else "",
                       tool_calls=[{"id": f"c{i}", "name": "f", "arguments": {"n": i}}] if i % 31 == 0 else None))
    return out


@pytest.fixture(autouse=True)
def helped(monkeypatch):
    """The helper thread takes part, as in a large archive (these have 8,000
    rows, under FEW_HELPED_ROWS); a test may say otherwise."""
    monkeypatch.setattr(cool_search, "FEW_HELPED_ROWS", 0)


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("few") / "cool")
    a = CoolArchive(d, row_group_rows=256, cache_bytes=1)
    rows = _rows(8000)
    cool_rows(a, rows, list(range(len(rows))))
    return d, a.files(), rows


def _open(d, files) -> CoolArchive:
    return CoolArchive(d, files, row_group_rows=256, cache_bytes=1, read_only=True)


def _want(rows, needle):
    return sorted(r["msg_id"] for r in rows if needle.casefold() in r["content"].casefold())


@pytest.mark.parametrize("with_helper", [True, False])
@pytest.mark.parametrize("window", [1, 3, 32])
def test_rare_needles_answer_like_the_model(many, monkeypatch, window, with_helper):
    """With the helper thread (an archive of FEW_HELPED_ROWS rows or more)
    and without it (the asking thread does every job): the same hits."""
    d, files, rows = many
    monkeypatch.setattr(cool_scan, "WINDOW", window)
    monkeypatch.setattr(cool_search, "FEW_HELPED_ROWS", 0 if with_helper else 10**9)
    jobs = []
    real_pool = cool_scan.few_pool

    class Counting:
        def submit(self, fn, *args, **kwargs):
            jobs.append(fn)
            return real_pool().submit(fn, *args, **kwargs)
    monkeypatch.setattr(cool_scan, "few_pool", lambda: Counting())
    runs = []
    real = cool_scan.FewGroups._stage

    def staged(self, at):
        runs.append(at)
        return real(self, at)
    monkeypatch.setattr(cool_scan.FewGroups, "_stage", staged)
    a = _open(d, files)
    by_id = {r["msg_id"]: r for r in rows}
    for needle in RARE:
        got = a.search(needle)
        assert sorted(h.record["msg_id"] for h in got) == _want(rows, needle)
        assert all(h.record == by_id[h.record["msg_id"]] for h in got)
        built = a.search_records(needle, record_type=ConversationMessageRecord)
        ids = [r.msg_id for r in built.records] + [row.record["msg_id"] for row in built.rows]
        assert sorted(ids) == _want(rows, needle)
        for r in built.records:
            assert r.content == by_id[r.msg_id]["content"] and r.task_id == by_id[r.msg_id]["task_id"]
    if zstd_direct():
        assert len(runs) >= 8 // window     # windows staged one after another
        assert bool(jobs) == with_helper
    else:
        assert runs == [] and jobs == []    # (group by group without the system's libzstd)


def _hit_page(path: str, c: int, row: int) -> int:
    """The data offset of the page of column ``c`` holding file row ``row``."""
    md = pq.ParquetFile(path).metadata
    reader = PageReader(path, md)
    try:
        rg, local = row // 256, row % 256
        firsts, pages = reader._dir(rg)[c]
        k = max(i for i, f in enumerate(firsts) if f <= local)
        return pages[k][1]
    finally:
        reader.close()


@pytest.mark.parametrize("column", ["content", "msg_id", "digest", "tool_calls"])
def test_a_flipped_byte_in_a_hit_page_is_named(many, tmp_path, column):
    d0, files, rows = many
    d = str(tmp_path / "cool")
    shutil.copytree(d0, d)
    if os.path.isdir(index_dir_for(d0)):
        shutil.copytree(index_dir_for(d0), index_dir_for(d))
    (name,) = files
    path = os.path.join(d, name)
    hit = next(h.row for h in _open(d, files).search("zebracorn") if h.row > 1000)   # (its row in the file)
    off = _hit_page(path, _COLS.index(column), hit)
    with open(path, "r+b") as f:
        f.seek(off + 3)
        b = f.read(1)
        f.seek(off + 3)
        f.write(bytes([b[0] ^ 0x04]))
    a = _open(d, files)
    for _round in range(2):
        with pytest.raises(CorruptStateCheckpointError) as e:
            a.search("zebracorn")
        assert name in str(e.value)
        with pytest.raises(CorruptStateCheckpointError):
            a.search_records("ZEBRACORN", record_type=ConversationMessageRecord)


@pytest.mark.skipif(not zstd_direct(), reason="take_many needs the system's libzstd")
def test_hits_are_read_by_take_many_and_a_group_it_declines_alone(many, monkeypatch):
    """With a record type, a window's hits are read in one take_many (their
    other columns, without the GIL), not a take a group; a group it
    declines (its directory or pages do not hold together) reads its own."""
    d, files, rows = many
    calls = {"many": 0, "take": 0}
    real_many, real_take = PageReader.take_many, PageReader.take

    def many_(self, rgs, locals_, cols, dirs=None):
        # every other group declined (as if its pages did not hold together)
        calls["many"] += 1
        keep = [i for i in range(len(rgs)) if i % 2 == 0]
        got, _declined = real_many(self, [rgs[i] for i in keep], [locals_[i] for i in keep], cols,
                                   None if dirs is None else [dirs[i] for i in keep])
        return got, [i for i in range(len(rgs)) if i % 2]

    def take(self, rg, local, cols=None, fetched=None):
        calls["take"] += 1
        return real_take(self, rg, local, cols, fetched)
    monkeypatch.setattr(PageReader, "take_many", many_)
    monkeypatch.setattr(PageReader, "take", take)
    a = _open(d, files)
    by_id = {r["msg_id"]: r for r in rows}
    for needle in RARE:
        built = a.search_records(needle, record_type=ConversationMessageRecord)
        assert not built.rows
        assert sorted(r.msg_id for r in built.records) == _want(rows, needle)
        for r in built.records:
            assert r.content == by_id[r.msg_id]["content"] and r.ts == by_id[r.msg_id]["ts"]
    assert calls["many"] >= len(RARE)
    assert 0 < calls["take"] < calls["many"] * cool_scan.WINDOW
