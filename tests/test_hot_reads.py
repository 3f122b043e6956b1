"""The hot read path in one compiled call (HotIndex.window_read, read_record,
find_id) and the repository's window / get_message over it: equal to a
plain-Python model across tails, rolls, compactions, deletions and cache
evictions; a flipped byte under a cached record is reported, never served.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from _core_support import key, line
from rune_fast import _index
from rune_fast._conv import reads, tuning
from rune_fast._conv.common import MessageRead, ReadStatus
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.records import ConversationMessageRecord


# ---------------------------------------------------------------- the index


def _seg(lines):
    offs = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    data = bytearray(b"".join(lines))
    ix = _index.HotIndex()
    ix.attach(0, bytes(data), path="/state/seg-0")
    ix.ingest(0)
    return ix, offs, data


def test_window_read_is_window_hits_with_the_misses_decoded_and_kept():
    ls = [line(f"m{i}", "c" if i % 3 else "dé", content=f"x{i}") for i in range(12)]
    ix, offs, data = _seg(ls)
    cache = _index.LocCache(64)
    for i in (2, 5, 11):
        cache.put(offs[i], (f"rec{i}", i), 7)
    decoded = []

    def decode(b):
        decoded.append(bytes(b))
        return (b"dec:" + bytes(b)[-8:], 0)

    for n in (1, 5, 8, 100):
        locs, _hits, _m = ix.window_hits(b"c", n, cache)
        recs, nd = ix.window_read("c", n, cache, decode, lambda rec: 3)
        assert len(recs) == len(locs) == min(n, 8) and nd == len(decoded)
        for loc, rec in zip(locs, recs):
            i = offs.index(loc)
            assert rec == (f"rec{i}" if i in (2, 5, 11) else b"dec:" + ls[i][-9:-1])
            assert cache[loc][0] == rec            # a miss is kept
        decoded.clear()
    assert ix.window_read("c", 8, cache, decode, lambda rec: 3)[1] == 0      # all kept now
    assert ix.window_read("dé", 2, cache, decode, lambda rec: 3)[0] == [
        b"dec:" + ls[i][-9:-1] for i in (6, 9)]
    assert cache.nbytes == 3 * 7 + 3 * (len(cache) - 3)
    assert ix.window_read("nope", 8, cache, decode, len) == ([], 0)
    assert ix.window_read("c", 0, cache, decode, len) == ([], 0)
    assert ix.window_read("c", -3, cache, decode, len) == ([], 0)
    # an id whose key needs escapes, and a line the decoder declines: the caller's path
    assert ix.window_read('c"', 8, cache, decode, len) is None
    assert ix.window_read("dé", 8, _index.LocCache(8), lambda b: None, len) is None
    with pytest.raises(TypeError):
        ix.window_read(b"c", 8, cache, decode, len)


def test_read_record_and_find_id():
    ls = [line(f"m{i}", "c", content=f"x{i}") for i in range(4)] + [line('q"\\x', "c")]
    ix, offs, _data = _seg(ls)
    cache = _index.LocCache(8)
    assert ix.read_record(offs[1], cache, lambda b: ("one", 1), len) == ("one", 1)
    assert ix.read_record(offs[1], cache, lambda b: ("two", 2), len) == ("one", 0)   # kept
    assert ix.read_record(offs[2], cache, lambda b: None, len) is None
    for i in range(4):
        assert ix.find_id(f"m{i}") == ix.find(key(f"m{i}")) == offs[i]
    assert ix.find_id("m9") == -1 and ix.find_id("") == -1
    assert ix.find_id('q"\\x') == -2 and ix.find(key('q"\\x')) == offs[4]
    assert ix.find_id("é\n") == -2


def test_a_flipped_byte_under_a_cached_record_is_reported_with_file_and_offset():
    ls = [line(f"m{i}", "c", content=f"x{i}") for i in range(6)]
    ix, offs, data = _seg(ls)
    cache = _index.LocCache(64)
    assert ix.window_read("c", 6, cache, lambda b: (bytes(b), 0), len)[1] == 6
    assert len(cache) == 6
    for where in (30, len(ls[4]) - 3):                  # in the record, past the checksum
        bad = bytearray(data)
        bad[offs[4] + where] ^= 0x01
        ix.attach(0, bytes(bad), path="/state/seg-0")
        for read in (lambda: ix.window_read("c", 3, cache, lambda b: (b, 0), len),
                     lambda: ix.read_record(offs[4], cache, lambda b: (b, 0), len)):
            with pytest.raises(CorruptStateCheckpointError) as ei:
                read()
            assert ei.value.path == "/state/seg-0" and ei.value.offset == offs[4]
    ix.attach(0, bytes(data), path="/state/seg-0")
    assert ix.window_read("c", 3, cache, lambda b: 1 / 0, len)[1] == 0        # sound again


def test_found_equals_the_constructors_message_read():
    rec = ConversationMessageRecord(msg_id="m", content="x", channel_id="c")
    got = reads._found(rec, "hot")
    want = MessageRead(ReadStatus.FOUND_VERIFIED, rec, "hot")
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want) and got.found
    with pytest.raises(AttributeError):
        got.tier = "cool"                       # frozen as the constructor's


# ---------------------------------------------------------------- the repository

CHANNELS = ["general", "ops/éé", 'c"3', "ch-\u212a"]
CALLS = [(), ({"id": "call_1", "name": "lookup", "arguments": "{\"q\": \"€\"}"},),
         ({"id": "a", "name": "x", "arguments": "{}"}, {"id": "b", "name": "y", "arguments": "[1]"})]


class HotReadsModel(RuleBasedStateMachine):
    """window and get_message against a dict of what was appended, with a
    decode cache of a few records (hits and misses mixed in one window),
    rolls of the tail and compactions; every record a read returns may be
    edited by its reader without changing the next read."""

    OPTS = dict(compact_every=5, hot_window=40, cache_bytes=9000)

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="rune-hot-")
        self.repo = ConversationStateRepository(self.dir, **self.OPTS)
        self.stored: dict[str, ConversationMessageRecord] = {}
        self.order: list[str] = []
        self.deleted: set[str] = set()
        self.n = 0

    def teardown(self) -> None:
        self.repo.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _new(self, channel, calls, words):
        self.n += 1
        return ConversationMessageRecord(msg_id=f"msg_{self.n:05d}", role="assistant",
                                         content=f"{words} #{self.n}", channel_id=channel,
                                         tool_calls=calls, ts=1_700_000_000.0 + self.n)

    def _channel(self, ch):
        return [self.stored[m] for m in self.order if self.stored[m].channel_id == ch]

    @rule(channel=st.sampled_from(CHANNELS), calls=st.sampled_from(CALLS),
          words=st.sampled_from(["plain", "straße ✓", "x" * 300, "tab\there"]), k=st.integers(1, 4))
    def append(self, channel, calls, words, k):
        recs = [self._new(channel, calls, words) for _ in range(k)]
        if k == 1:
            assert self.repo.append(recs[0]) is True
        else:
            assert self.repo.append_many(recs) == k
        for r in recs:
            self.stored[r.msg_id] = r
            self.order.append(r.msg_id)

    @rule(data=st.data())
    @precondition(lambda self: self.stored)
    def delete(self, data):
        mid = data.draw(st.sampled_from(sorted(self.stored)))
        assert self.repo.delete(mid) is True
        del self.stored[mid]
        self.order.remove(mid)
        self.deleted.add(mid)

    @rule()
    def compact(self):
        self.repo.compact()

    @rule()
    def reopen(self):
        self.repo.close()
        self.repo = ConversationStateRepository(self.dir, **self.OPTS)

    @rule(channel=st.sampled_from(CHANNELS + ["nope"]), n=st.integers(-1, 10))
    def window(self, channel, n):
        got = self.repo.window(channel, n)
        assert got == (self._channel(channel)[-n:] if n > 0 else [])
        for r in got:                     # a reader's edit stays in its copy
            for c in r.tool_calls:
                c["name"] = "edited"

    @rule(data=st.data())
    @precondition(lambda self: self.stored or self.deleted)
    def get(self, data):
        mid = data.draw(st.sampled_from(sorted(set(self.stored) | self.deleted) + ["msg_none"]))
        r = self.repo.get_message(mid)
        if mid in self.stored:
            assert r.status is ReadStatus.FOUND_VERIFIED and r.record == self.stored[mid]
            assert r.tier in ("tail", "hot", "cool")
            for c in r.record.tool_calls:
                c["arguments"] = "edited"
        else:
            assert r.status is ReadStatus.NOT_FOUND_CONFIRMED and r.record is None


@pytest.fixture
def small_rolls(monkeypatch):
    monkeypatch.setattr(tuning, "ROLL_BYTES", 4096)


@pytest.mark.usefixtures("small_rolls")
def test_hot_reads_match_the_model():
    HotReadsModel.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                               suppress_health_check=[HealthCheck.too_slow])
    HotReadsModel.TestCase().runTest()


def _store_with_cached_lines(path):
    """A store whose channel "c" has its lines in a sealed segment and its
    newest 8 records in the decode cache."""
    repo = ConversationStateRepository(path, compact_every=1000, hot_window=1000)
    repo.append_many([ConversationMessageRecord(msg_id=f"m{i:03d}", content=f"hello {i} ✓",
                                                channel_id="c", ts=1.0 + i) for i in range(20)])
    repo.compact()
    repo.close()
    repo = ConversationStateRepository(path, compact_every=1000, hot_window=1000)
    assert [r.msg_id for r in repo.window("c", 8)] == [f"m{i:03d}" for i in range(12, 20)]
    return repo


@pytest.mark.parametrize("where", ["content", "checksum", "seq"])
def test_a_byte_flipped_on_disk_under_a_cached_window_is_reported(tmp_path, where):
    repo = _store_with_cached_lines(str(tmp_path))
    try:
        loc = repo._index.find(key("m017"))
        assert loc >= 0 and repo._decoded.get(loc) is not None        # cached
        path, off = repo._path_of(loc >> 40), loc & ((1 << 40) - 1)
        with open(path, "rb") as f:
            f.seek(off)
            ln = f.readline()
        at = {"content": ln.index(b"hello"), "checksum": 8, "seq": len(ln) - 3}[where]
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, bytes([ln[at] ^ 0x04]), off + at)     # the map sees the page cache
        finally:
            os.close(fd)
        with pytest.raises(CorruptStateCheckpointError) as ei:
            repo.window("c", 8)
        assert ei.value.path == path and ei.value.offset == off
        with pytest.raises(CorruptStateCheckpointError):
            repo.window("c", 3)
        r = repo.get_message("m017")
        assert r.status is ReadStatus.SOURCE_CORRUPT and r.record is None
        assert repo.get_message("m016").status is ReadStatus.FOUND_VERIFIED
    finally:
        repo.close()
