"""A cool file's sidecar keeps its row groups' page directories (version 3)
and its id run is the archive's id index as it is mapped: what makes the
first read of an archived message cost what a later one does.

Every byte of it still decides nothing unchecked: a flipped or torn sidecar
is rebuilt from its file (loudly: a warning and ``rebuilt_sidecars``), a
missing one too, an old one (versions 1 and 2, without directories) is read
as it is and upgraded by a writer's open, and a directory that does not hold
together (a writer's bug under a sound digest) is refused at its first read,
which then goes through pyarrow: no read ever returns another row's value.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import tempfile

import numpy as np
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import _pages, pages
from rune_fast._index import IdRuns, check_run
from rune_fast.cool import CoolArchive, _FileIndex, cool_loc, index_dir_for
from rune_fast.cool.schema import _IDX_MAGIC
from rune_fast.cool.sidecar import _same_dirs
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.pages import page_directories
from rune_fast.records import ConversationMessageRecord
from test_cool import cool_rows, rec

N = 300
GROUP = 64          # rows a row group: several groups, several pages a column
IDX = "cool-00000001.idx"
NAME = "cool-00000001.parquet"


def _rows() -> list[dict]:
    return [rec(i, ch=f"c{i % 3}", task=f"t{i % 7}" if i % 5 else "",
                content=("über " * (i % 40)) + f"message number {i}") for i in range(N)]


def _build(folder: str) -> str:
    """A cool folder holding one file of N rows; returns it."""
    d = os.path.join(folder, "hot", "conversation_cool")
    a = CoolArchive(d, row_group_rows=GROUP, durable=False)
    cool_rows(a, _rows(), range(N))
    a.close()
    return d


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return _build(str(tmp_path_factory.mktemp("pagedirs")))


def _copy(built: str, to: str) -> str:
    """A copy of the built store (both folders) under ``to``; its cool folder."""
    root = os.path.dirname(os.path.dirname(built))
    dst = os.path.join(to, "store")
    shutil.copytree(root, dst)
    return os.path.join(dst, "hot", "conversation_cool")


def _ipath(d: str) -> str:
    return os.path.join(index_dir_for(d), IDX)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _check_every_read(a: CoolArchive, want: list[dict]) -> None:
    """Every row read back exactly, by id (get) and by place (records_at)."""
    by_id = {r["msg_id"]: r for r in want}
    for r in want:
        got = a.get(r["msg_id"])
        assert got is not None and {k: got[k] for k in r} == r
    locs = [cool_loc(1, i) for i in range(N)]
    got = a.records_at(locs, ConversationMessageRecord)
    for hit in got:
        if hit is None:
            continue        # (declined: the caller reads it with rows_at, below)
        record, o = hit
        assert record.content == by_id[record.msg_id]["content"] and o == int(record.msg_id[4:])
    for row in a.rows_at(locs):
        assert {k: row.record[k] for k in by_id[row.record["msg_id"]]} == by_id[row.record["msg_id"]]
        assert row.ord == int(row.record["msg_id"][4:])


def _encode_v2(fi: _FileIndex) -> bytes:
    """``fi`` as a version 2 sidecar (no page directories): what stores
    written before version 3 hold."""
    names = list(fi.tasks)
    parts = [fi.tasks[t] for t in names]
    offs = np.cumsum([0] + [len(p) for p in parts]).tolist()
    tb = json.dumps([[t, offs[i], offs[i + 1]] for i, t in enumerate(names)],
                    separators=(",", ":")).encode()
    header = {"format": "rune_fast.cool.idx", "version": 2, "file": fi.name, "file_size": fi.size,
              "footer_xxh3_64": fi.footer, "rows": fi.rows, "row_group_starts": [int(x) for x in fi.rg_starts],
              "channels": [[c, s, e, lt] for c, (s, e, lt) in fi.channels.items()],
              "task_rows": int(offs[-1]), "tasks_json_bytes": len(tb)}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-(len(hb) + 4) % 8)
    tb += b" " * (-len(tb) % 8)
    body = b"".join([struct.pack("<I", len(hb)), hb, tb, fi.hashes.astype("<u8").tobytes(),
                     fi.hrows.astype("<u4").tobytes(), b"\0" * (4 if fi.rows % 2 else 0),
                     (np.concatenate(parts) if parts else np.zeros(0, np.uint32)).astype("<u4").tobytes()])
    return _IDX_MAGIC + xxhash.xxh3_128_digest(body) + body


# ------------------------------------------------------------------ the kept directories


def test_the_sidecar_keeps_every_groups_page_directory(built):
    path = os.path.join(built, NAME)
    fi = _FileIndex.decode(_read(_ipath(built)), 1, _ipath(built))
    assert fi.dirs_known and fi.pagedir is not None
    md = pq.read_metadata(path)
    assert md.num_row_groups == -(-N // GROUP) and len(fi.pagedir[0]) == md.num_row_groups + 1
    assert _same_dirs(fi.pagedir, page_directories(path, md))
    # each group's directory is what the reader parses from the page headers
    reader = pages.PageReader(path, md)
    try:
        for rg in range(md.num_row_groups):
            mine = fi.page_dir(rg)
            theirs = reader._packed(rg)[0]
            assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(mine, theirs))
    finally:
        reader.close()


def test_reads_use_the_kept_directories_not_the_footer(built, tmp_path, monkeypatch):
    """A fresh archive's exact reads parse no page header and no footer."""
    d = _copy(built, str(tmp_path))

    def refuse(*_a, **_k):
        raise AssertionError("parsed what the sidecar keeps")
    monkeypatch.setattr(pages, "chunk_pages", refuse)
    monkeypatch.setattr(pages, "chunk_pages_mem", refuse)
    monkeypatch.setattr(CoolArchive, "_parquet", refuse)
    a = CoolArchive.open(d, [NAME], durable=False)
    got = a.records_at([cool_loc(1, i) for i in range(N)], ConversationMessageRecord)
    assert all(g is not None for g in got)
    for r in _rows()[::17]:
        assert a.get(r["msg_id"])["content"] == r["content"]
    assert a.rebuilt_sidecars == []


def test_the_id_index_is_the_mapped_run(built, tmp_path):
    d = _copy(built, str(tmp_path))
    a = CoolArchive.open(d, [NAME], durable=False)
    assert a.contains(_rows()[5]["msg_id"])
    hashes, rows = a._ids.run(1)
    assert not hashes.flags.writeable and not rows.flags.writeable     # views of the mapped sidecar
    assert len(a._ids) == N and a.stats()["index_bytes"] == 12 * N


# ------------------------------------------------------------------ damage


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_flipped_byte_is_rebuilt_loudly(built, data, caplog):
    with tempfile.TemporaryDirectory() as tmp:
        d = _copy(built, tmp)
        ipath = _ipath(d)
        good = _read(ipath)
        at = data.draw(st.integers(0, len(good) - 1), label="offset")
        bit = data.draw(st.integers(0, 7), label="bit")
        bad = bytearray(good)
        bad[at] ^= 1 << bit
        _write(ipath, bytes(bad))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rune_fast.cool"):
            a = CoolArchive.open(d, [NAME], durable=False)
            _check_every_read(a, _rows())
            assert a.rebuilt_sidecars == [IDX]
        assert any("rebuilt" in r.getMessage() for r in caplog.records)
        assert _read(ipath) == good          # rewritten as the writer wrote it
        assert a.verify() == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_torn_sidecar_is_rebuilt(built, data):
    with tempfile.TemporaryDirectory() as tmp:
        d = _copy(built, tmp)
        ipath = _ipath(d)
        good = _read(ipath)
        keep = data.draw(st.integers(0, len(good) - 1), label="kept bytes")
        _write(ipath, good[:keep])
        a = CoolArchive.open(d, [NAME], durable=False)
        _check_every_read(a, _rows())
        assert a.rebuilt_sidecars == [IDX] and _read(ipath) == good


def test_a_missing_sidecar_is_rebuilt_with_its_directories(built, tmp_path):
    d = _copy(built, str(tmp_path))
    good = _read(_ipath(d))
    os.unlink(_ipath(d))
    a = CoolArchive.open(d, [NAME], durable=False)
    _check_every_read(a, _rows())
    assert a.rebuilt_sidecars == [IDX] and _read(_ipath(d)) == good


def test_a_viewer_rebuilds_in_memory_and_writes_nothing(built, tmp_path):
    d = _copy(built, str(tmp_path))
    good = _read(_ipath(d))
    bad = bytearray(good)
    bad[-3] ^= 0x10                         # (in the last group's directory)
    _write(_ipath(d), bytes(bad))
    v = CoolArchive.open(d, [NAME], read_only=True)
    _check_every_read(v, _rows())
    assert v.rebuilt_sidecars == [IDX] and _read(_ipath(d)) == bytes(bad)


# ------------------------------------------------------------------ old sidecars


def test_a_version_2_sidecar_is_read_and_upgraded_by_a_writer(built, tmp_path, caplog):
    d = _copy(built, str(tmp_path))
    ipath = _ipath(d)
    v3 = _read(ipath)
    v2 = _encode_v2(_FileIndex.decode(v3, 1, ipath))
    _write(ipath, v2)
    # a viewer reads it as it is (the directories parsed from the pages)
    v = CoolArchive.open(d, [NAME], read_only=True)
    _check_every_read(v, _rows())
    assert v.rebuilt_sidecars == [] and _read(ipath) == v2 and v._files[1].pagedir is None
    # a writer's open adds the directories: not a rebuild, nothing reported damaged
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rune_fast.cool"):
        a = CoolArchive.open(d, [NAME], durable=False)
        _check_every_read(a, _rows())
        assert a.rebuilt_sidecars == []
    assert not caplog.records
    assert _read(ipath) == v3 and a._files[1].pagedir is not None and a.verify() == []


def test_a_version_1_sidecar_is_upgraded_too(tmp_path):
    """The committed archive of format cool/1 with its version 1 sidecar
    (task names in the header): a writer's open keeps every answer and
    writes the current version, directories included."""
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "cool_v1")
    d = str(tmp_path / "cool")
    shutil.copytree(fixture, d)
    with open(os.path.join(d, "rows.json"), encoding="utf-8") as f:
        want = json.load(f)
    os.unlink(os.path.join(d, "rows.json"))
    a = CoolArchive.open(d, [NAME], durable=False)
    for r, o in zip(want["rows"], want["ords"]):
        row = a.get_row(r["msg_id"])
        assert row.record == r and row.ord == o
    assert a.rebuilt_sidecars == [] and a.verify() == []
    fi = _FileIndex.decode(_read(os.path.join(index_dir_for(d), IDX)), 1, IDX)
    assert fi.dirs_known and _same_dirs(fi.pagedir, page_directories(os.path.join(d, NAME),
                                                                     pq.read_metadata(os.path.join(d, NAME))))


# ------------------------------------------------------------------ a directory under a sound digest


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_wrong_directory_never_serves_another_rows_value(built, data):
    """One word of a directory changed and the sidecar sealed again (a
    writer's bug, not damage): every read still returns the true row (the
    directory is refused, or its page fails its CRC-32 or size, and the row
    is read through pyarrow), and verify() names the sidecar."""
    with tempfile.TemporaryDirectory() as tmp:
        d = _copy(built, tmp)
        ipath = _ipath(d)
        fi = _FileIndex.decode(_read(ipath), 1, ipath)
        index, words = fi.pagedir
        words = words.copy()
        w = data.draw(st.integers(0, len(words) - 1), label="word")
        new = data.draw(st.one_of(st.integers(-2, 2).map(lambda x: int(words[w]) + x),
                                  st.integers(-(1 << 40), 1 << 40)), label="value")
        if new == words[w]:
            new += 1
        words[w] = new
        fi.pagedir = (index.copy(), words)
        fi.tasks        # (parsed, for encode)
        _write(ipath, fi.encode())
        a = CoolArchive.open(d, [NAME], durable=False)
        assert a.rebuilt_sidecars == []      # (its digest is sound)
        _check_every_read(a, _rows())
        problems = a.verify()
        assert [p.file for p in problems] == [IDX]


def test_check_dir_refuses_what_does_not_chain(built):
    fi = _FileIndex.decode(_read(_ipath(built)), 1, _ipath(built))
    counts, flat, firsts, starts = (np.array(x) for x in fi.page_dir(0))
    assert _pages.check_dir(counts, starts, flat, firsts, GROUP) == ""
    assert "rows" in _pages.check_dir(counts, starts, flat, firsts, GROUP + 1)
    f2 = flat.copy()
    f2[6] += 1                               # the first page claims a value more
    assert _pages.check_dir(counts, starts, f2, firsts, GROUP) != ""
    f3 = flat.copy()
    f3[5] = 0                                # "not compressed" with another stored size
    if f3[2] != f3[3]:
        assert _pages.check_dir(counts, starts, f3, firsts, GROUP) != ""


# ------------------------------------------------------------------ IdRuns against a model


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(st.lists(st.integers(0, (1 << 64) - 1) | st.integers(0, 40), max_size=60),
                     max_size=5),
       probes=st.lists(st.integers(0, (1 << 64) - 1) | st.integers(0, 40), max_size=30),
       drop=st.integers(0, 6))
def test_id_runs_answer_as_a_dict(runs, probes, drop):
    ir = IdRuns()
    model: dict[int, list[int]] = {}
    for no, hs in enumerate(runs, start=1):
        h = np.array(hs, dtype=np.uint64)
        order = np.argsort(h, kind="stable")
        rows = order.astype(np.uint32)
        assert check_run(h[order], rows, len(hs)) == ""
        ir.add(no, h[order], rows)
    if 1 <= drop <= len(runs):
        assert ir.discard(drop) and not ir.discard(drop)
    for no, hs in enumerate(runs, start=1):
        if no == drop:
            continue
        for r, h in enumerate(hs):
            model.setdefault(h, []).append((no << 32) | r)
    assert len(ir) == sum(len(v) for v in model.values())
    keys = list(model) + probes
    for h in keys:
        assert sorted(ir.values(h)) == sorted(model.get(h, [])), h
    assert ir.has_many(np.array(keys, dtype=np.uint64)).tolist() == [h in model for h in keys]


def test_check_run_names_what_is_wrong():
    h = np.array([1, 5, 9], dtype=np.uint64)
    r = np.array([0, 1, 2], dtype=np.uint32)
    assert check_run(h, r, 3) == ""
    assert "ascending" in check_run(h[::-1].copy(), r, 3)
    assert "row 7" in check_run(h, np.array([0, 7, 2], dtype=np.uint32), 3)
    assert "for 4 rows" in check_run(h, r, 4)


def test_an_unsorted_run_under_a_sound_digest_is_rebuilt(built, tmp_path):
    d = _copy(built, str(tmp_path))
    ipath = _ipath(d)
    fi = _FileIndex.decode(_read(ipath), 1, ipath)
    fi.hashes = fi.hashes[::-1].copy()
    fi.tasks
    _write(ipath, fi.encode())
    a = CoolArchive.open(d, [NAME], durable=False)
    _check_every_read(a, _rows())
    assert a.rebuilt_sidecars == [IDX]


def test_damaged_file_still_loud_with_directories(built, tmp_path):
    """A page changed in the Parquet file (the sidecar's directories still
    name it): the read fails its CRC-32 and is named, file and row group."""
    d = _copy(built, str(tmp_path))
    path = os.path.join(d, NAME)
    fi = _FileIndex.decode(_read(_ipath(d)), 1, _ipath(d))
    counts, flat, firsts, starts = fi.page_dir(1)
    content = 4                              # (the content column's first page of group 1)
    off = int(flat[7 * int(starts[content]) + 1])
    with open(path, "r+b") as f:
        f.seek(off + 5)
        b = f.read(1)
        f.seek(off + 5)
        f.write(bytes([b[0] ^ 0xFF]))
    a = CoolArchive.open(d, [NAME], durable=False)
    hit = 0
    for r in _rows():
        try:
            got = a.get(r["msg_id"])
        except CorruptStateCheckpointError as exc:
            assert exc.path == path
            hit += 1
            continue
        assert got["content"] == r["content"]
    assert hit > 0
