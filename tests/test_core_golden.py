"""Golden files of the core format (tests/fixtures/core): every later build must
read them exactly as the build that wrote them did. Regenerate only with a
format version bump (tests/fixtures/core/make_fixtures.py)."""
from __future__ import annotations

import json
import os

import orjson
import pytest

from rune_fast import _index, _log
from rune_fast.errors import CorruptStateCheckpointError

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "core")


def read(name: str) -> bytes:
    with open(os.path.join(HERE, name), "rb") as f:
        return f.read()


EXPECTED = json.loads(read("expected.json"))


def test_tail_frames():
    tail = read("seg-00000000.jsonl")
    assert len(tail) == EXPECTED["tail_size"]
    s = _log.scan_frames(tail)
    assert s.offsets.tolist() == EXPECTED["offsets"]
    assert s.lengths.tolist() == EXPECTED["lengths"]
    assert (s.good_end, s.torn_offset, s.damaged_offset) == (len(tail), -1, -1)
    assert _log.hash64(tail) == EXPECTED["hash64_tail"]
    assert _log.digest128(tail) == EXPECTED["digest128_tail"]
    for off, ln in zip(EXPECTED["offsets"], EXPECTED["lengths"]):
        raw = tail[off:off + ln + 1]
        assert _log.frame(raw[_log.PREFIX_LEN:-1]) == raw      # the frame is stable
        assert orjson.loads(raw)["x"] == raw[6:22].decode()     # and each line is JSON


def test_torn_tail():
    s = _log.scan_frames(read("torn.jsonl"))
    assert s.torn_offset == EXPECTED["torn_offset"] and s.good_end == EXPECTED["torn_offset"]


def check_index(ix):
    assert [c.decode() for c in ix.channels()] == EXPECTED["channels"]
    for c, locs in EXPECTED["channel_locs"].items():
        assert ix.channel_locs(c.encode()).tolist() == locs
        assert (ix.latest_task(c.encode()) or b"").decode() == EXPECTED["latest_task"][c]
    for t, locs in EXPECTED["task_locs"].items():
        assert ix.task_locs(t.encode()).tolist() == locs
    for i, loc in EXPECTED["find"].items():
        assert ix.find(i.encode()) == loc
    assert ix.search(b"CAF", True, False).tolist() == EXPECTED["search_cafe_ci"]


def test_ingest_of_the_tail():
    tail = read("seg-00000000.jsonl")
    ix = _index.HotIndex()
    ix.attach(0, tail)
    r = ix.ingest(0)
    assert r.added.tolist() == EXPECTED["added"]
    assert r.dup_locs.tolist() == EXPECTED["dup_locs"]
    assert [[a.decode(), b.decode()] for a, b in r.tombstones] == EXPECTED["tombstones"]
    check_index(ix)


def test_snapshot_reads_and_rewrites_identically(tmp_path):
    tail = read("seg-00000000.jsonl")
    for name in ("index.snap", "index_v2.snap"):       # version 1 (the first build's), version 2
        ix, covered = _index.HotIndex.load_snapshot(os.path.join(HERE, name))
        assert covered == {0: len(tail)}
        ix.attach(0, tail)
        check_index(ix)
        assert ix.seg_stats() == {0: (5, sum(EXPECTED["lengths"][i] + 1 for i in (0, 1, 2, 3, 4)))}
    fresh = _index.HotIndex()
    fresh.attach(0, tail)
    fresh.ingest(0)
    fresh.save_snapshot(tmp_path / "again.snap", {0: len(tail)})
    assert (tmp_path / "again.snap").read_bytes() == read("index_v2.snap")


def test_snapshot_v2_keeps_line_lengths():
    # version 2 holds each entry's line length: stats need not read the lines
    # (a version-1 load measures them, reading every line once)
    tail = read("seg-00000000.jsonl")
    blank = bytes(len(tail))                # same size, no line in it
    v2, _ = _index.HotIndex.load_snapshot(os.path.join(HERE, "index_v2.snap"))
    v2.attach(0, blank)
    assert v2.seg_stats() == {0: (5, sum(EXPECTED["lengths"][i] + 1 for i in (0, 1, 2, 3, 4)))}
    v1, _ = _index.HotIndex.load_snapshot(os.path.join(HERE, "index.snap"))
    v1.attach(0, blank)
    with pytest.raises(CorruptStateCheckpointError):
        v1.seg_stats()
