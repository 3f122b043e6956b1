"""TailWriter + HotIndex driven by hypothesis against a dict-and-lists model.

The model is what the repository promises: every live message is found by id,
each channel and task lists its live messages in order (unstamped ones first in
append order, then by (hlc, msg_id)), and a reopen (by rescanning the files or
from a snapshot plus the bytes after it) rebuilds exactly that. Torn final lines
and flipped bytes are reported at their offsets.
"""
from __future__ import annotations

import mmap
import os
import shutil
import tempfile

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant,
                                 precondition, rule)

from _core_support import key, line, tombstone
from rune_fast import _index, _log
from rune_fast.errors import CorruptStateCheckpointError

IDS = [f"msg_{i}" for i in range(12)] + ['m"q', "m\\b", "m\u00e9"]
CHANNELS = ["c1", "c2", "ch\u00ebn"]
TASKS = ["", "", "t1", "t2"]
HLCS = ["", "", "", "000000000000005-0000000000-a", "000000000000002-0000000000-b",
        "000000000000009-0000000001-a", "000000000000002-0000000000-a"]
TEXT = st.text(alphabet=st.sampled_from(list("abcXY \n\"\\\u00e9\u00df")), max_size=12)


def seg_path(d: str, seg: int) -> str:
    return os.path.join(d, f"seg-{seg:08d}.jsonl")


class CoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="rf-core-sm-")
        self.seg = 0
        self.writer = _log.TailWriter(seg_path(self.dir, 0))
        self.index = _index.HotIndex()
        self.maps: dict[int, mmap.mmap | None] = {}
        self.live: dict[str, tuple[int, str, str, str]] = {}   # id -> (ordinal, ch, task, hlc)
        self.content: dict[str, str] = {}
        self.ordinal = 0
        self.snapshot = None                                    # (path, covered)
        self.remap(0)

    def teardown(self):
        self.writer.close()
        for s in list(self.maps):
            self.index.detach(s)
        self.index = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- helpers --------------------------------------------------------

    def remap(self, seg: int) -> None:
        path = seg_path(self.dir, seg)
        size = os.path.getsize(path)
        if size == 0:
            m = None
        else:
            with open(path, "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.index.attach(seg, m, path=path)
        self.maps[seg] = m

    def write(self, data: bytes) -> int:
        off = self.writer.append(data)
        self.remap(self.seg)
        return (self.seg << 40) | off

    def expected_order(self, pick) -> list[str]:
        items = [(o, h, i) for i, (o, ch, t, h) in self.live.items() if pick(ch, t)]
        unstamped = sorted((o, i) for o, h, i in items if h == "")
        stamped = sorted((key(h), key(i)) for o, h, i in items if h != "")
        byk = {key(i): i for i in self.live}
        return [i for _, i in unstamped] + [byk[k] for _, k in stamped]

    def ids_of(self, locs) -> list[str]:
        return [orjson.loads(bytes(self.index.line(int(l))))["r"]["msg_id"] for l in locs]

    def reopen_from_files(self, segs_from=None) -> None:
        for s in list(self.maps):
            self.index.detach(s)
        self.index = _index.HotIndex() if segs_from is None else segs_from[0]
        covered = {} if segs_from is None else segs_from[1]
        self.maps = {}
        for s in range(self.seg + 1):
            self.remap(s)
            r = self.index.ingest(s, covered.get(s, 0))
            assert r.damaged_offset == -1 and r.torn_offset == -1, r

    # ---- rules ----------------------------------------------------------

    @rule(i=st.sampled_from(IDS), ch=st.sampled_from(CHANNELS), t=st.sampled_from(TASKS),
          h=st.sampled_from(HLCS), text=TEXT)
    def append(self, i, ch, t, h, text):
        if i in self.live:                  # the repository never writes a duplicate
            assert self.index.find(key(i)) >= 0
            return
        loc = self.write(line(i, ch, t, h, text, role="user"))
        assert self.index.add(loc) is True
        assert self.index.add(loc) is False
        self.live[i] = (self.ordinal, ch, t, h)
        self.content[i] = text
        self.ordinal += 1

    @rule(batch=st.lists(st.tuples(st.sampled_from(IDS), st.sampled_from(CHANNELS),
                                   st.sampled_from(TASKS), st.sampled_from(HLCS)), max_size=6))
    def append_many_then_ingest(self, batch):
        start = self.writer.size
        data = b"".join(line(i, ch, t, h, "batch") for i, ch, t, h in batch)
        if not data:
            return
        self.write(data)
        r = self.index.ingest(self.seg, start)
        assert r.damaged_offset == -1 and r.torn_offset == -1
        assert r.good_end == self.writer.size and r.n_lines == len(batch)
        new = 0
        for i, ch, t, h in batch:
            if i not in self.live:
                self.live[i] = (self.ordinal, ch, t, h)
                self.content[i] = "batch"
                self.ordinal += 1
                new += 1
        assert len(r.added) == new and len(r.dup_locs) == len(batch) - new

    @rule(batch=st.lists(st.tuples(st.sampled_from(IDS), st.sampled_from(CHANNELS),
                                   st.sampled_from(TASKS), st.sampled_from(HLCS), TEXT), max_size=4))
    def append_bytes_without_remap(self, batch):
        data = b"".join(line(i, ch, t, h, text) for i, ch, t, h, text in batch)
        off = self.writer.append(data)
        r = self.index.append_bytes(self.seg, off, data)
        assert r.damaged_offset == -1 and r.torn_offset == -1
        assert r.good_end == self.writer.size and r.n_lines == len(batch)
        new = 0
        for i, ch, t, h, text in batch:
            if i not in self.live:
                self.live[i] = (self.ordinal, ch, t, h)
                self.content[i] = text
                self.ordinal += 1
                new += 1
        assert len(r.added) == new

    @rule(i=st.sampled_from(IDS))
    def delete(self, i):
        self.content.pop(i, None)
        self.write(tombstone(i, self.live[i][1] if i in self.live else "c1"))
        loc = self.index.remove(key(i))
        assert (loc >= 0) == (i in self.live)
        self.live.pop(i, None)

    @rule()
    def sync(self):
        self.writer.sync()

    @rule()
    def roll_segment(self):
        self.writer.sync()
        self.writer.close()
        self.seg += 1
        self.writer = _log.TailWriter(seg_path(self.dir, self.seg))
        self.remap(self.seg)

    @rule()
    def reopen_by_rescan(self):
        self.reopen_from_files()

    @rule()
    def save_snapshot(self):
        path = os.path.join(self.dir, "index.snap")
        covered = {s: os.path.getsize(seg_path(self.dir, s)) for s in range(self.seg + 1)}
        self.index.save_snapshot(path, covered)
        self.snapshot = (path, covered)

    @precondition(lambda self: self.snapshot is not None)
    @rule()
    def reopen_from_snapshot(self):
        path, covered = self.snapshot
        idx, cov = _index.HotIndex.load_snapshot(path)
        assert cov == covered
        self.reopen_from_files((idx, cov))

    @rule(data=st.data())
    def torn_final_line(self, data):
        full = line("torn", "c1", "", "", "never acknowledged")
        cut = data.draw(st.integers(1, len(full) - 1))
        off = self.writer.append(full[:cut])
        self.remap(self.seg)
        r = _index.HotIndex()
        r.attach(0, self.maps[self.seg])
        rep = r.ingest(0)
        assert rep.torn_offset == off and rep.good_end == off and rep.damaged_offset == -1
        scan = _log.scan_frames(self.maps[self.seg])
        assert scan.torn_offset == off and scan.good_end == off
        # recovery: drop the torn bytes (never under a live map: that would SIGBUS)
        self.index.detach(self.seg)
        r.detach(0)
        self.maps[self.seg] = None
        self.writer.truncate(off)
        self.remap(self.seg)

    @precondition(lambda self: self.writer.size > 0)
    @rule(data=st.data())
    def flipped_byte(self, data):
        path = seg_path(self.dir, self.seg)
        self.remap(self.seg)          # bytes indexed from append_bytes copies are now mapped
        scan = _log.scan_frames(self.maps[self.seg])
        k = data.draw(st.integers(0, len(scan.offsets) - 1))
        off, ln = int(scan.offsets[k]), int(scan.lengths[k])
        pos = off + data.draw(st.integers(0, ln - 1))
        x = data.draw(st.integers(1, 255))
        with open(path, "r+b") as f:
            f.seek(pos)
            orig = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([orig ^ x]))
        try:
            scan2 = _log.scan_frames(self.maps[self.seg])
            assert scan2.damaged_offset == off, (scan2, off, pos)
            assert scan2.damage
            probe = _index.HotIndex()
            probe.attach(self.seg, self.maps[self.seg])
            rep = probe.ingest(self.seg)
            assert rep.damaged_offset == off and rep.good_end == off
            assert _log.check_line(self.maps[self.seg], off) == -1
            if (self.seg << 40 | off) in set(self.index.channel_locs(key("c1")).tolist()
                                            + self.index.channel_locs(key("c2")).tolist()):
                with pytest.raises(CorruptStateCheckpointError) as ei:
                    self.index.line(self.seg << 40 | off)
                assert ei.value.offset == off and ei.value.path == path
            probe.detach(self.seg)
        finally:
            with open(path, "r+b") as f:
                f.seek(pos)
                f.write(bytes([orig]))

    # ---- invariants -----------------------------------------------------

    @invariant()
    def matches_model(self):
        ix = self.index
        assert len(ix) == len(self.live)
        for i in IDS:
            assert (ix.find(key(i)) >= 0) == (i in self.live), i
        want_channels = {key(ch) for _, ch, _, _ in self.live.values()}
        assert set(ix.channels()) == want_channels
        for ch in CHANNELS:
            want = self.expected_order(lambda c, t: c == ch)
            assert self.ids_of(ix.channel_locs(key(ch))) == want
            assert self.ids_of(ix.channel_locs(key(ch), 2)) == want[-2:]
            assert ix.channel_len(key(ch)) == len(want)
            tasks = [self.live[i][2] for i in want if self.live[i][2]]
            assert ix.latest_task(key(ch)) == (key(tasks[-1]) if tasks else None)
        for t in ("t1", "t2"):
            assert self.ids_of(ix.task_locs(key(t))) == self.expected_order(lambda c, tt: tt == t)


CoreMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RF_SM_EXAMPLES", "60")), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCoreMachine = CoreMachine.TestCase


def ascii_fold(s: str) -> str:
    return "".join(c.lower() if c.isascii() else c for c in s)


class SearchingMachine(CoreMachine):
    @invariant()
    def search_matches_model(self):
        for needle in ("a", "X", "\n", '"', "\\", "\u00e9", "ba", "n", "u00e9", ""):
            names = {key(c): c for c in CHANNELS}
            order = [i for k in self.index.channels()
                     for i in self.expected_order(lambda c, t: c == names[k])]
            exact = [i for i in order if needle in self.content[i]]
            assert self.ids_of(self.index.search(key(needle))) == exact, needle
            folded = [i for i in order if ascii_fold(needle) in ascii_fold(self.content[i])]
            assert self.ids_of(self.index.search(key(needle), True)) == folded, needle
            cand = self.ids_of(self.index.search(key(needle), True, True))
            true_cf = [i for i in order if needle.casefold() in self.content[i].casefold()]
            assert set(true_cf) <= set(cand)
            assert all(i in folded or not self.content[i].isascii() for i in cand)
            for ch in CHANNELS:
                got = self.ids_of(self.index.search(key(needle), False, False, key(ch)))
                assert got == [i for i in exact if self.live[i][1] == ch]


SearchingMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RF_SM_EXAMPLES", "30")), stateful_step_count=20,
    deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestSearchingMachine = SearchingMachine.TestCase
