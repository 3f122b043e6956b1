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


def test_window_cached_is_the_cached_window_or_none():
    ls = [line(f"m{i}", "c" if i % 3 else "dé", content=f"x{i}") for i in range(12)]
    ix, offs, data = _seg(ls)
    cache = _index.LocCache(64)
    verdicts: dict[str, bool] = {}
    owned = []

    def own(recs):
        owned.append(list(recs))
        return recs

    def cached(ch, n, cache=cache):
        return ix.window_cached(ch, n, cache, verdicts, own)

    assert cached("c", 3) is None                 # the channel not found by a window_read yet
    recs, _nd = ix.window_read("c", 8, cache, lambda b: (b"rec:" + bytes(b)[-9:-1], 0), len)
    assert cached("c", 3) is None                 # no verdict: the caller decides the order
    verdicts["c"] = True
    assert cached("c", 3) is None                 # interleaved with the cool tier
    verdicts["c"] = False
    assert owned == []
    for n in (1, 3, 8):
        assert cached("c", n) == recs[-n:] and owned[-1] == recs[-n:]
    assert cached("c", 9) is None                 # more than the hot tier holds
    assert cached("c", 0) is None and cached("c", -1) is None and cached("c", 65) is None
    assert cached("nope", 3) is None
    cache.pop(offs[10])                            # one record no longer kept
    assert cached("c", 2) is None and cached("c", 1) == recs[-1:]
    ix.window_read("dé", 4, cache, lambda b: (b"rec:" + bytes(b)[-9:-1], 0), len)
    verdicts["dé"] = False
    assert cached("dé", 4) == [b"rec:" + ls[i][:-1][-9:-1] for i in (0, 3, 6, 9)]
    for where in (30, len(ls[11]) - 3):            # a flipped byte under the cached window
        bad = bytearray(data)
        bad[offs[11] + where] ^= 0x01
        ix.attach(0, bytes(bad), path="/state/seg-0")
        with pytest.raises(CorruptStateCheckpointError) as ei:
            cached("c", 1)
        assert ei.value.path == "/state/seg-0" and ei.value.offset == offs[11]
    ix.attach(0, bytes(data), path="/state/seg-0")
    assert cached("c", 1) == recs[-1:]
    ix.remove(key("m11"))                          # the window moves with the index:
    assert cached("c", 1) is None                  # to m10, whose record was dropped above
    again, nd = ix.window_read("c", 2, cache, lambda b: (b"rec:" + bytes(b)[-9:-1], 0), len)
    assert nd == 1 and cached("c", 2) == again == [recs[-3], b"rec:" + ls[10][:-1][-9:-1]]


class IdRunsModel(RuleBasedStateMachine):
    """IdRuns with its kept answers against a plain dict of the runs: every
    lookup gives the search's answer whatever was added or dropped since it
    was kept; kept() gives a cached record only for the id it belongs to."""

    def __init__(self) -> None:
        super().__init__()
        self.ids = _index.IdRuns(memo_entries=4)     # two sets: answers evict each other
        self.plain = _index.IdRuns(memo_entries=0)
        self.runs: dict[int, list[tuple[int, int]]] = {}
        self.cache = _index.LocCache(64)
        self.names: dict[int, str] = {}              # hash -> an id that hashes so

    def _hash(self, i):
        name = f"msg_{i:03d}"
        h = _index_hash(name)
        self.names[h] = name
        return h

    @rule(no=st.integers(0, 5), ids=st.lists(st.integers(0, 30), max_size=8), rows=st.integers(1, 3))
    def add(self, no, ids, rows):
        pairs = sorted((self._hash(i), r) for r, i in enumerate(ids))
        for ix in (self.ids, self.plain):
            ix.add(no, [h for h, _r in pairs], [r for _h, r in pairs])
        self.runs[no] = pairs
        for h, r in pairs:
            self.cache.put((no << 32) | r, (ConversationMessageRecord(msg_id=self.names[h], content="",
                                                                     channel_id="c"), 0), 1)

    @rule(no=st.integers(0, 5))
    def discard(self, no):
        assert self.ids.discard(no) == self.plain.discard(no) == (no in self.runs)
        self.runs.pop(no, None)

    @rule()
    def clear(self):
        self.ids.clear()
        self.plain.clear()
        self.runs.clear()

    @rule(i=st.integers(0, 30))
    def lookup(self, i):
        h = self._hash(i)
        want = [(no << 32) | r for no, pairs in self.runs.items() for hh, r in pairs if hh == h]
        for _ in range(2):                           # the second one answered from the memo
            got = self.ids.values(h)
            assert sorted(got) == sorted(want) and got == self.plain.values(h)
        rec = self.ids.kept(self.names[h], self.cache)
        if len(want) == 1 and rec is not None:
            assert rec.msg_id == self.names[h]
            assert self.cache[want[0]][0] is rec
        if len(want) != 1:
            assert rec is None
        assert self.ids.kept("msg_not_there", self.cache) is None


def _index_hash(name: str) -> int:
    from rune_fast.cool.schema import _id_hash
    return _id_hash(name)


def test_id_runs_keep_only_answers_that_hold():
    IdRunsModel.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    IdRunsModel.TestCase().runTest()


def test_id_runs_kept_reads_the_cache_slot_of_the_kept_answer():
    from rune_fast.cool.schema import _id_hash
    ids = _index.IdRuns()
    assert ids.memo_bytes == 16 * _index.MEMO_ENTRIES == reads.ID_MEMO_BYTES
    cache = _index.LocCache(8)
    names = ["msg_a", "msg_é", "msg_c"]
    pairs = sorted((_id_hash(n), r) for r, n in enumerate(names))
    ids.add(3, [h for h, _r in pairs], [r for _h, r in pairs])
    rec = ConversationMessageRecord(msg_id="msg_é", content="x", channel_id="c")
    assert ids.kept("msg_é", cache) is None           # nothing asked yet
    (loc,) = ids.values(_id_hash("msg_é"))
    assert loc == (3 << 32) | 1
    assert ids.kept("msg_é", cache) is None           # asked, but the cache holds nothing there
    cache.put(loc, (rec, 7), 1)
    assert ids.kept("msg_é", cache) is rec
    assert ids.kept("msg_a", cache) is None
    cache.put(loc, (ConversationMessageRecord(msg_id="msg_a", content="x", channel_id="c"), 7), 1)
    assert ids.kept("msg_é", cache) is None           # the slot holds another id's record
    cache.put(loc, "not a tuple", 1)
    assert ids.kept("msg_é", cache) is None
    cache.put(loc, (rec, 7), 1)
    ids.add(4, [], [])                                 # any change of the runs forgets the answers
    assert ids.kept("msg_é", cache) is None
    ids.values(_id_hash("msg_é"))
    assert ids.discard(4) and ids.kept("msg_é", cache) is None
    with pytest.raises(ValueError):
        _index.IdRuns(memo_entries=-1)
    assert _index.IdRuns(memo_entries=0).memo_bytes == 0


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
        self.viewer: ConversationStateRepository | None = None

    def teardown(self) -> None:
        self.repo.close()
        if self.viewer is not None:
            self.viewer.close()
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
        for r in got:                     # a reader cannot edit what others read
            for c in r.tool_calls:
                with pytest.raises(TypeError, match="read-only"):
                    c["name"] = "edited"

    @rule(data=st.data())
    @precondition(lambda self: self.stored or self.deleted)
    def get(self, data):
        mid = data.draw(st.sampled_from(sorted(set(self.stored) | self.deleted) + ["msg_none"]))
        for _ in range(2):                  # (asked again: from what the first read kept)
            r = self.repo.get_message(mid)
            if mid in self.stored:
                assert r.status is ReadStatus.FOUND_VERIFIED and r.record == self.stored[mid]
                assert r.tier in ("tail", "hot", "cool")
                for c in r.record.tool_calls:
                    with pytest.raises(TypeError, match="read-only"):
                        c["arguments"] = "edited"
            else:
                assert r.status is ReadStatus.NOT_FOUND_CONFIRMED and r.record is None

    @rule(data=st.data(), n=st.integers(1, 10))
    def viewer_reads(self, data, n):
        """A viewer's reads, asked twice (the second from what the first
        kept), after a refresh shows it the writer's appends, deletions and
        compactions since its last look."""
        if self.viewer is None:
            self.viewer = ConversationStateRepository(self.dir, read_only=True, **self.OPTS)
        self.viewer.refresh()
        ch = data.draw(st.sampled_from(CHANNELS))
        mids = data.draw(st.lists(st.sampled_from(sorted(set(self.stored) | self.deleted) or ["msg_none"]),
                                  max_size=3))
        for _ in range(2):
            assert self.viewer.window(ch, n) == self._channel(ch)[-n:]
            for mid in mids:
                r = self.viewer.get_message(mid)
                assert r.record == self.stored.get(mid)


@pytest.fixture
def small_rolls(monkeypatch):
    monkeypatch.setattr(tuning, "ROLL_BYTES", 4096)


@pytest.mark.usefixtures("small_rolls")
def test_hot_reads_match_the_model():
    HotReadsModel.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                               suppress_health_check=[HealthCheck.too_slow])
    HotReadsModel.TestCase().runTest()


class ArchivedReadsModel(HotReadsModel):
    """The same with a hot window of 3: most reads are of archived rows
    (asked again: the id index's kept answers), across cooling runs,
    merges and erasures of the cool files."""

    OPTS = dict(compact_every=3, hot_window=3, cache_bytes=64 << 10)


@pytest.mark.usefixtures("small_rolls")
def test_archived_reads_match_the_model():
    ArchivedReadsModel.TestCase.settings = settings(max_examples=30, stateful_step_count=40, deadline=None,
                                                    suppress_health_check=[HealthCheck.too_slow])
    ArchivedReadsModel.TestCase().runTest()


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


def test_own_calls_copies_leak_no_reference():
    """own_calls' copy (a blank instance, the field pointers, a tuple of
    read-only copies of the calls) takes one reference to each field of the
    record and gives it back when the copy goes; a record whose calls are
    read-only already is handed back as it is."""
    import sys

    from rune_fast import codec
    content = "".join(["unique ", "content"])
    calls = ({"id": "i1", "name": "n", "arguments": "{}"}, {"id": "i2", "name": "m", "arguments": {"a": [1]}})
    m = ConversationMessageRecord(msg_id="m", role="assistant", content=content, channel_id="c",
                                  tool_calls=calls)
    before = sys.getrefcount(content), sys.getrefcount(m.tool_calls), sys.getrefcount(m)
    for _ in range(1000):
        got = codec.own_calls([m])[0]
        assert got == m and got is not m and got.content is content
        assert type(got.tool_calls) is tuple and got.tool_calls is not m.tool_calls
        assert all(a == b and a is not b for a, b in zip(got.tool_calls, m.tool_calls))
        assert got.tool_calls[1]["arguments"] is not m.tool_calls[1]["arguments"]
        with pytest.raises(TypeError, match="read-only"):
            got.tool_calls[0]["name"] = "edited"
        m.tool_calls[0]["name"] = "edited"        # the caller's own record stays its to edit
        assert got.tool_calls[0]["name"] == "n"
        m.tool_calls[0]["name"] = "n"
        assert codec.own_calls([got])[0] is got
        del got
    assert (sys.getrefcount(content), sys.getrefcount(m.tool_calls), sys.getrefcount(m)) == before


def test_the_compiled_window_answers_as_the_general_path(tmp_path):
    """window() is compiled (_index.repo_window, bound as the method): its
    common case reads the repository's state as the instance holds it at
    each call (a new decode cache, a close), and everything else -- bad
    arguments, n out of its range, an unknown channel, a closed store --
    is the general path's answer or error."""
    from rune_fast.errors import StoreClosedError
    assert ConversationStateRepository.window is _index.repo_window
    repo = _store_with_cached_lines(str(tmp_path))
    try:
        want = repo._window_general("c", 8)
        assert repo.window("c", 8) == want == repo.window("c")
        assert repo.window("c", n=3) == want[-3:]
        got = repo.window("c", 8)
        assert repo._index.window_cached("c", 8, repo._decoded, repo._interleaved, lambda x: x) is not None
        # callers get their own records' tool calls (none here) and list
        got.append(None)
        assert None not in repo.window("c", 8)
        assert repo.window("c", 0) == [] == repo.window("c", -1) == repo.window("nope", 8)
        assert [r.msg_id for r in repo.window("c", 65)] == [f"m{i:03d}" for i in range(20)]
        with pytest.raises(TypeError, match="n"):
            repo.window("c", True)
        with pytest.raises(TypeError, match="n"):
            repo.window("c", 8.0)
        with pytest.raises((TypeError, ValueError), match="channel_id"):
            repo.window(7, 8)
        repo._reset_read_caches()               # a new decode cache: read from the instance
        assert repo.window("c", 8) == want
    finally:
        repo.close()
    with pytest.raises(StoreClosedError):
        repo.window("c", 8)
