"""The segment order of the manifest is the order of the lines' append
sequence: a full rebuild of the hot index (no snapshot, or one older than
the manifest after a crash) reads the sealed segments in that order and
refuses a sequence that does not rise. A bounded rewrite (an automatic
compaction rewrites one run of sparse segments) once placed a run's new
segment after a sparse segment it left for later: a store bulk-loaded to
1,000,000 messages could then not be opened without its snapshot."""
from __future__ import annotations

import json
import os
import re

import pytest

from rune_fast._conv import tuning
from rune_fast._conv.common import CompactionReport
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord

_SEQ = re.compile(rb'"s":(\d+)\}')


def msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"m{i:06d}", role="user", content=f"line {i} " + "x" * (i % 40),
                                     channel_id=f"c{i % 5}", ts=1.0 + i)


def first_seqs(state: str, order: list[int]) -> list[int]:
    out = []
    for seg in order:
        with open(os.path.join(state, "hot", f"conversation_seg-{seg:08d}.jsonl"), "rb") as f:
            out.append(int(_SEQ.search(f.readline()).group(1)))
    return out


@pytest.fixture
def sealed(tmp_path, monkeypatch):
    """A store of 1,200 messages in ten or more sealed segments, every line hot."""
    monkeypatch.setattr(tuning, "ROLL_BYTES", 4 << 10)
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 10**9)
    state = str(tmp_path / "s")
    repo = ConversationStateRepository(state, compact_every=50, hot_window=10**6)
    msgs = [msg(i) for i in range(1200)]
    for i in range(0, len(msgs), 50):
        repo.append_many(msgs[i:i + 50])
    repo.compact()
    assert len(repo._seg_order) >= 10
    return state, repo, msgs


@pytest.mark.parametrize("max_runs", [1, 2, 3, None])
def test_a_bounded_rewrite_keeps_the_segments_in_sequence_order(sealed, monkeypatch, max_runs):
    state, repo, msgs = sealed
    # every sealed segment sparse, each more live bytes than a run holds: a run a segment
    monkeypatch.setattr(ConversationStateRepository, "_sparse", staticmethod(lambda size, live: True))
    monkeypatch.setattr(tuning, "REWRITE_RUN_BYTES", 1)
    with repo._lock:
        old: list[int] = []
        order, more = repo._compact_segments(CompactionReport(), [], old, max_runs=max_runs)
        repo._set_segment_order(order)
        repo._write_manifest(repo._cool.files(), durable=True)
    assert more is (max_runs is not None)
    seqs = first_seqs(state, order)
    assert seqs == sorted(seqs), (order, seqs)
    repo.close()
    os.unlink(os.path.join(state, "hot", "conversation_index.snap"))
    with ConversationStateRepository(state) as again:        # a full rebuild
        assert len(again) == len(msgs)
        for c in range(5):
            assert again.window(f"c{c}", 10**6) == [m for m in msgs if m.channel_id == f"c{c}"]


def test_a_store_whose_manifest_lists_segments_out_of_order_opens_without_its_snapshot(sealed):
    """Stores written before the fix: the rebuild reads the sealed segments
    in the order of their lines' sequence, whatever order the manifest
    lists them in, and the next manifest lists them so."""
    state, repo, msgs = sealed
    segs = list(repo._seg_order)
    zigzag = segs[::2] + segs[1::2][::-1]      # what the bounded rewrite left
    assert zigzag != segs
    with repo._lock:
        repo._set_segment_order(zigzag)
        repo._write_manifest(repo._cool.files(), durable=True)
    repo.close()
    path = os.path.join(state, "hot", "conversation_manifest.json")
    os.unlink(os.path.join(state, "hot", "conversation_index.snap"))
    with ConversationStateRepository(state) as again:
        assert len(again) == len(msgs)
        for c in range(5):
            assert again.window(f"c{c}", 10**6) == [m for m in msgs if m.channel_id == f"c{c}"]
        again.append(msg(5000))
        again.compact()
    with open(path) as f:
        order = json.load(f)["body"]["segments"]
    seqs = first_seqs(state, order)
    assert seqs == sorted(seqs)
