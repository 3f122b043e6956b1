"""A writer's own tail gets search filters over its complete lines (the
end it sets with HotIndex.set_lines_end), keeps them across a remap of the
grown file and a roll, and a search never scans the zeros reserved after
its lines; a viewer's tail (written by another process) gets none. Every
search is checked against an unfiltered one or a casefold model."""
from __future__ import annotations

import mmap
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _core_support import line, word_lines
from rune_fast import _index
from rune_fast._conv import tuning
from rune_fast.conversation_state import ConversationStateRepository
from test_repository import msg
from test_search_filters import _unfiltered as _unfiltered_segs

_WORDS = ["alpha", "Beta", "gamma", "stra\u00dfe", "\u6771\u4eac", "x", "\n", "\"", "\\", "\u00e9",
          "\U0001f600", "abc", "ABC", "report", "quarterly"]
_RESERVE = 3 << 16      # zeros after the lines, as a writer's tail reserves them


def _unfiltered(data: bytes, needle: bytes, ci: bool) -> list[int]:
    """An unfiltered search of one segment of bytes ``data``."""
    return _unfiltered_segs({0: (data, {})}, needle, ci)


def _searched(ix, needle: bytes, ci: bool) -> list[int]:
    return ix.search(needle, ci, False, None).tolist()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32), st.lists(st.integers(0, 400), min_size=1, max_size=5))
def test_tail_filters_grow_with_its_lines(seed, batches):
    """Batches of lines written into reserved zeros, the lines end set after
    each: every search (filters built from the second on, extended as lines
    come) finds what an unfiltered search of the lines finds."""
    rng = random.Random(seed)
    buf = bytearray(sum(b for b in batches) * 2000 + _RESERVE)
    ix = _index.HotIndex()
    ix.attach(0, buf)
    ix.set_lines_end(0, 0)
    end, n = 0, 0
    for b in batches:
        data = b"".join(word_lines(rng, b, _WORDS, ("c0", "c1"), f"b{n}_"))
        n += 1
        buf[end:end + len(data)] = data
        ix.ingest(0, end, end + len(data))
        end += len(data)
        ix.set_lines_end(0, end)
        lines = bytes(buf[:end])
        picks = [lines[a:a + rng.choice([3, 5, 9, 20])] for a in rng.sample(range(max(1, end)), min(4, end))]
        for nd in picks + [b"quarterly", b"zzyzx"]:
            for ci in (False, True):
                q = nd.lower() if ci else nd
                for _ in range(2):
                    assert _searched(ix, q, ci) == _unfiltered(lines, q, ci), (q, ci)
        # filters cover only blocks whose bytes lie before the lines' end
        assert ix.seg_filter_blocks(0) * 16384 + 256 + 2 <= max(end, 256 + 2)


def test_a_needle_in_the_newest_lines_is_found_after_filters_were_built():
    """Filters built over the first lines, then lines holding a new needle:
    the blocks after the filtered ones are scanned, never taken as filtered."""
    rng = random.Random(7)
    first = b"".join(word_lines(rng, 600, _WORDS, ("c0", "c1"), "a"))
    more = b"".join(line(f"n{i}", "c1", content=f"zzyzx {i} quarterly") for i in range(50))
    buf = bytearray(len(first) + len(more) + _RESERVE)
    buf[:len(first)] = first
    ix = _index.HotIndex()
    ix.attach(0, buf)
    ix.ingest(0, 0, len(first))
    ix.set_lines_end(0, len(first))
    for _ in range(3):
        assert _searched(ix, b"zzyzx", False) == []
    built = ix.seg_filter_blocks(0)
    assert built > 0
    buf[len(first):len(first) + len(more)] = more
    ix.ingest(0, len(first), len(first) + len(more))
    ix.set_lines_end(0, len(first) + len(more))
    got = _searched(ix, b"zzyzx", False)
    assert len(got) == 50
    assert got == _unfiltered(bytes(buf[:len(first) + len(more)]), b"zzyzx", False)
    assert ix.seg_filter_blocks(0) >= built


def test_keep_lines_keeps_the_filters_across_a_remap(tmp_path):
    """A writer's tail remapped after it grew keeps its lines end and the
    filters built over them (attach's keep_lines); a plain attach drops
    both, as before."""
    rng = random.Random(11)
    first = b"".join(word_lines(rng, 500, _WORDS, ("c0", "c1"), "a"))
    path = tmp_path / "tail"
    path.write_bytes(first + bytes(_RESERVE))
    with open(path, "r+b") as f:
        m1 = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        ix = _index.HotIndex()
        ix.attach(0, m1)
        ix.ingest(0, 0, len(first))
        ix.set_lines_end(0, len(first))
        for _ in range(2):
            _searched(ix, b"gamma", True)
        built = ix.seg_filter_blocks(0)
        assert built > 0
        more = b"".join(line(f"n{i}", "c1", content=f"zzyzx {i}") for i in range(40))
        os.pwrite(f.fileno(), more + bytes(2 * _RESERVE), len(first))
        m2 = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        ix.attach(0, m2, keep_lines=True)
        assert ix.seg_filter_blocks(0) == built
        ix.ingest(0, len(first), len(first) + len(more))
        ix.set_lines_end(0, len(first) + len(more))
        lines = first + more
        for nd in (b"zzyzx", b"gamma", b"stra", b"abc"):
            assert _searched(ix, nd, True) == _unfiltered(lines, nd, True)
        m3 = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        ix.attach(0, m3)
        assert ix.seg_filter_blocks(0) == 0
        ix.detach(0)
        for m in (m1, m2, m3):
            m.close()


def test_set_lines_end_refuses_what_it_cannot_vouch_for():
    rng = random.Random(2)
    data = b"".join(word_lines(rng, 300, _WORDS, ("c0",), "a"))
    ix = _index.HotIndex()
    with pytest.raises(ValueError, match="not an attached segment"):
        ix.set_lines_end(0, 0)
    ix.attach(0, data, growing=True)
    with pytest.raises(ValueError, match="not an attached segment"):
        ix.set_lines_end(0, len(data))
    ix.attach(0, data)
    ix.ingest(0)
    with pytest.raises(ValueError, match="outside"):
        ix.set_lines_end(0, len(data) + 1)
    with pytest.raises(ValueError, match="outside"):
        ix.set_lines_end(0, -1)
    ix.set_lines_end(0, len(data))
    for _ in range(2):
        _searched(ix, b"gamma", True)
    assert ix.seg_filter_blocks(0) > 0
    ix.set_lines_end(0, len(data) // 2)          # (an end moved back: the filters go)
    assert ix.seg_filter_blocks(0) == 0
    assert _searched(ix, b"gamma", True) == _unfiltered(data[:len(data) // 2], b"gamma", True)


def _model(stored: dict, needle: str) -> list[str]:
    return sorted(i for i, m in stored.items() if needle.casefold() in m.content.casefold())


def test_repository_tail_filters_through_remaps_and_a_roll(tmp_path, monkeypatch):
    """The writer's tail gets filters (its lines end set by every append),
    keeps them while appends remap it, hands them to the segment a roll
    seals; a viewer's tail gets none; every search equals the model."""
    monkeypatch.setattr(tuning, "ROLL_BYTES", 1 << 20)
    rng = random.Random(5)
    words = _WORDS + ["Quarterly", "report", "delta"]
    stored: dict = {}
    needles = ["quarterly report", "stra\u00dfe", "STRASSE", "\u6771\u4eac", "gamma delta", "zzyzx"]
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=10**6) as repo:
        n = 0
        tail_filtered = False
        for rnd in range(6):
            for _ in range(400):
                text = " ".join(rng.choice(words) for _ in range(rng.randrange(0, 60)))
                if rng.random() < 0.01:
                    text += " zzyzx"
                m = msg(n, channel=f"c{n % 3}", content=text)
                repo.append(m)
                stored[m.msg_id] = m
                n += 1
            for _ in range(2):
                for needle in needles:
                    got = sorted(h.record.msg_id for h in repo.search(needle))
                    assert got == _model(stored, needle), (needle, rnd)
            ix, tail = repo._index, repo._tail_seg
            tail_filtered = tail_filtered or ix.seg_filter_blocks(tail) > 0
            assert ix.seg_filter_blocks(tail) * 16384 <= repo._tail.size
        assert tail_filtered
        # a roll seals the tail: the filters built over it serve the segment
        before = repo._index.seg_filter_blocks(repo._tail_seg)
        sealed = repo._tail_seg
        repo._roll_tail()
        assert repo._index.seg_filter_blocks(sealed) == before
        for needle in needles:
            got = sorted(h.record.msg_id for h in repo.search(needle))
            assert got == _model(stored, needle), (needle, "rolled")
        # a viewer's tail is written by another process: no filters over it
        for i in range(200):
            m = msg(n + i, channel="c1", content=f"late {i} quarterly report")
            repo.append(m)
            stored[m.msg_id] = m
        repo.flush()
        with ConversationStateRepository(tmp_path, read_only=True) as viewer:
            for _ in range(3):
                for needle in needles:
                    got = sorted(h.record.msg_id for h in viewer.search(needle))
                    assert got == _model(stored, needle), (needle, "viewer")
            assert viewer._index.seg_filter_blocks(viewer._tail_seg) == 0
