"""Cooling's one pass over the lines it archives: ``HotIndex.gather_lines``
hashes each checked line's id, and ``find_located`` / ``remove_located``
find and unindex the messages by those hashes and their locations, without
reading (and checking) each line again -- the same index, row for row, as
``find_many`` / ``remove_lines`` leave."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _core_support import key, line, tombstone
from rune_fast import _index
from rune_fast.errors import CorruptStateCheckpointError, FramingError


def _build(lines, seg=0):
    data = b"".join(lines)
    ix = _index.HotIndex()
    ix.attach(seg, data, path=f"/state/seg-{seg}")
    ix.ingest(seg)
    return ix, data


def _locs(lines, which, seg=0):
    off = np.cumsum([0] + [len(ln) for ln in lines], dtype=np.int64)
    return np.array([int(off[i]) | (seg << 40) for i in which], dtype=np.int64)


def _state(ix, chans, tasks):
    return ([ix.channel_locs(k).tolist() for k in chans], [ix.task_locs(k).tolist() for k in tasks], len(ix))


_ids = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_ids, st.sampled_from(["c", "d", "\xe9"]), st.sampled_from(["", "t", "u"]),
                          st.sampled_from(["", "0001", "0002"])),
                min_size=1, max_size=40, unique_by=lambda t: t[0]), st.data())
def test_remove_located_is_remove_lines(rows, data):
    lines = [line(*r) for r in rows]
    ix, _ = _build(lines)
    ref, _ = _build(lines)
    which = data.draw(st.lists(st.integers(0, len(rows) - 1), unique=True))
    locs = _locs(lines, which)
    hashes = np.zeros(len(locs), dtype=np.uint64)
    got, starts = ix.gather_lines(locs, hashes)
    want, want_starts = ref.gather_lines(locs)
    assert got == want and starts.tolist() == want_starts.tolist()
    assert ix.find_located(locs, hashes).tolist() == locs.tolist()
    assert ref.find_many([key(rows[i][0]) for i in which]).tolist() == locs.tolist()
    assert ix.remove_located(locs, hashes).tolist() == ref.remove_lines(locs).tolist() == locs.tolist()
    assert _state(ix, [b"c", b"d", "\xe9".encode()], [b"t", b"u"]) == \
        _state(ref, [b"c", b"d", "\xe9".encode()], [b"t", b"u"])
    # gone now: neither finds nor removes them again
    assert ix.find_located(locs, hashes).tolist() == [-1] * len(locs)
    assert ix.remove_located(locs, hashes).tolist() == [-1] * len(locs)


def test_a_line_moved_or_another_id_is_not_found_there():
    lines = [line(f"m{i}", "c", "t" if i % 2 else "") for i in range(10)]
    ix, data = _build(lines)
    locs = _locs(lines, [2, 3, 4])
    hashes = np.zeros(3, dtype=np.uint64)
    ix.gather_lines(locs, hashes)
    # another id's hash at a location, or a location that holds another line
    assert ix.find_located(locs, hashes[::-1].copy()).tolist() == [-1, locs[1], -1]
    assert ix.find_located(locs[::-1].copy(), hashes).tolist() == [-1, locs[1], -1]
    # the lines rewritten to another segment: the old locations are gone
    ix.attach(1, data[int(locs[0]):int(locs[-1]) + len(lines[4])], path="/state/seg-1")
    moved = (locs - locs[0]) | (1 << 40)
    assert ix.relocate(locs, moved) == 3
    assert ix.find_located(locs, hashes).tolist() == [-1, -1, -1]
    assert ix.remove_located(locs, hashes).tolist() == [-1, -1, -1]
    assert ix.find_located(moved, hashes).tolist() == moved.tolist()
    assert ix.remove_located(moved, hashes).tolist() == moved.tolist()
    assert len(ix) == 7 and ix.task_locs(b"t").tolist() == _locs(lines, [1, 5, 7, 9]).tolist()
    with pytest.raises(ValueError, match="2 id hashes"):
        ix.remove_located(locs, hashes[:2])
    with pytest.raises(ValueError, match="2 id hashes"):
        ix.gather_lines(locs, np.zeros(2, dtype=np.uint64))
    assert ix.remove_located(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64)).tolist() == []


def test_gather_with_hashes_checks_each_line_first():
    lines = [line(f"m{i}", "c") for i in range(6)] + [tombstone("m9", "c")]
    ix, data = _build(lines)
    hashes = np.zeros(1, dtype=np.uint64)
    with pytest.raises(FramingError, match="not a message line"):
        ix.gather_lines(_locs(lines, [6]), hashes)
    bad = bytearray(data)
    at = int(_locs(lines, [3])[0])
    bad[at + 60] ^= 1
    ix.attach(0, bytes(bad), path="/state/seg-0")
    with pytest.raises(CorruptStateCheckpointError) as ei:
        ix.gather_lines(_locs(lines, [1, 3]), np.zeros(2, dtype=np.uint64))
    assert ei.value.path == "/state/seg-0" and ei.value.offset == at
