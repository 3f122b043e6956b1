"""rune_fast._index: HashIndex and HotIndex, function by function."""
from __future__ import annotations

import mmap
import os
import weakref

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from _core_support import by_channels, key, line, tombstone, word_lines
from rune_fast import _index, _log
from rune_fast.errors import CorruptStateCheckpointError, FramingError, RuneError

S = _index.SEG_SHIFT


# ---- HashIndex ---------------------------------------------------------------

@given(st.lists(st.tuples(st.sampled_from(["ins", "rm"]), st.integers(0, 40),
                          st.integers(-3, 3)), max_size=300))
def test_hash_index_matches_multimap_model(ops):
    h = _index.HashIndex()
    model: dict[int, list[int]] = {}
    for op, k, v in ops:
        k = (k * 0x9E3779B97F4A7C15) & (2**64 - 1) if k % 3 else k   # clustered and spread keys
        if op == "ins":
            h.insert(k, v)
            model.setdefault(k, []).append(v)
        else:
            had = v in model.get(k, [])
            assert h.remove(k, v) is had
            if had:
                model[k].remove(v)
    assert len(h) == sum(len(v) for v in model.values())
    for k, vs in model.items():
        assert sorted(h.lookup(k).tolist()) == sorted(vs)
    hs, vs = h.to_arrays()
    h2 = _index.HashIndex.from_arrays(hs, vs)
    for k, vals in model.items():
        assert sorted(h2.lookup(k).tolist()) == sorted(vals)


def test_hash_index_bulk_and_clear():
    h = _index.HashIndex()
    hs = np.arange(10000, dtype=np.uint64) * np.uint64(2654435761)
    h.insert_many(hs, np.arange(10000))
    assert len(h) == 10000 and h.lookup(int(hs[1234])).tolist() == [1234]
    assert h.nbytes >= 10000 * 17
    with pytest.raises(FramingError):
        h.insert_many([1, 2], [1])
    h.clear()
    assert len(h) == 0 and h.lookup(int(hs[5])).tolist() == []


# ---- LocCache ----------------------------------------------------------------

class _Val:
    """A cached value whose release a weak reference sees."""

    def __init__(self, tag):
        self.tag = tag

    def __eq__(self, other):
        return isinstance(other, _Val) and other.tag == self.tag

    __hash__ = None


class _OldestFirstRules:
    """The rules every LocCache machine shares: its model is a dict kept in
    insertion order; make_room and clear drop the oldest first."""

    @rule(room=st.integers(0, 50))
    def make_room(self, room):
        for k in list(self.model)[:max(self.cap // 4, len(self.model) + room - self.cap)]:
            del self.model[k]
        self.cache.make_room(room)

    @rule()
    def clear(self):
        self.model.clear()
        self.cache.clear()


class LocCacheMachine(_OldestFirstRules, RuleBasedStateMachine):
    """LocCache against a dict kept in insertion order, as the repository
    used one: an update keeps its place, a pop then an insertion puts a key
    last, an insertion at capacity drops the oldest key, ``make_room(k)``
    drops the oldest quarter of the capacity or more. Few keys and much
    churn, so the ring of insertions fills with the places of popped and
    updated keys and is renumbered."""

    def __init__(self):
        super().__init__()
        self.cap = 7
        self.cache = _index.LocCache(self.cap)
        self.model: dict[int, _Val] = {}
        self.refs: list[weakref.ref] = []
        self.n = 0

    def _drop(self, k: int) -> None:
        for key_ in list(self.model)[:k]:
            del self.model[key_]

    @rule(loc=st.integers(0, 12) | st.sampled_from([2**62, 2**63 - 1, 1 << 40]))
    def put(self, loc):
        self.n += 1
        v = _Val(self.n)
        self.refs.append(weakref.ref(v))
        if loc not in self.model and len(self.model) >= self.cap:
            self._drop(1)
        self.model[loc] = v
        self.cache[loc] = v

    @rule(loc=st.integers(0, 12))
    def pop(self, loc):
        assert self.cache.pop(loc, "no") == self.model.pop(loc, "no")

    @rule(loc=st.integers(-2, 14))
    def get(self, loc):
        assert self.cache.get(loc) == self.model.get(loc)
        assert (loc in self.cache) == (loc in self.model)
        if loc in self.model:
            assert self.cache[loc] is self.model[loc]
        else:
            with pytest.raises(KeyError):
                self.cache[loc]

    @rule(loc=st.integers(0, 12), times=st.integers(1, 20))
    def churn(self, loc, times):
        # insert and pop a key again and again: the ring fills with the
        # places of popped keys behind the ones held
        for _ in range(times):
            self.put(loc)
            self.pop(loc)

    @rule(locs=st.lists(st.integers(-1, 14), max_size=12))
    def get_many(self, locs):
        got, misses = self.cache.get_many(locs)
        assert got == [self.model.get(loc) for loc in locs] and misses == got.count(None)
        assert all(g is self.model[loc] for loc, g in zip(locs, got) if g is not None)

    @rule(moves=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=6))
    def move_many(self, moves):
        # a segment rewrite's moves: each a pop of the old location and, if
        # the cache held it, an insertion at the new one
        for old, new in moves:
            if old in self.model:
                v = self.model.pop(old)
                if new not in self.model and len(self.model) >= self.cap:
                    self._drop(1)
                self.model[new] = v
        self.cache.move_many([o for o, _n in moves], [n for _o, n in moves])

    @invariant()
    def same(self):
        assert len(self.cache) == len(self.model) <= self.cap
        assert self.cache.keys() == list(self.model) == list(self.cache)
        assert self.cache.values() == list(self.model.values())
        assert self.cache.items() == list(self.model.items())

    @invariant()
    def released(self):
        held = {id(v) for v in self.model.values()}
        for r in self.refs:
            v = r()
            assert v is None or id(v) in held, "a value dropped from the cache is still referenced"


TestLocCache = LocCacheMachine.TestCase
TestLocCache.settings = settings(max_examples=150, stateful_step_count=80, deadline=None)


class _ByteBoundRules(_OldestFirstRules):
    """What both byte-bounded machines share besides: their model's values
    are (value, size); the cache holds what the model holds, in its order."""

    @rule(loc=st.integers(0, 60))
    def pop(self, loc):
        got = self.model.pop(loc, None)
        assert self.cache.pop(loc, "no") == ("no" if got is None else got[0])

    @invariant()
    def same(self):
        assert self.cache.items() == [(k, v) for k, (v, _s) in self.model.items()]
        assert len(self.cache) <= self.cap
        assert self.cache.nbytes == sum(s for _v, s in self.model.values()) <= self.max
        got, misses = self.cache.get_many(list(range(62)))
        assert got == [self.model[k][0] if k in self.model else None for k in range(62)]


class ByteBoundLocCacheMachine(_ByteBoundRules, RuleBasedStateMachine):
    """LocCache bounded in bytes as well as in entries, against a plain
    model: a dict kept in insertion order, each key with the size it was put
    with. ``put(loc, v, size)`` of a value larger than the bound drops what
    ``loc`` held and keeps nothing; otherwise as ``cache[loc] = v`` (an
    update keeps its place), then the oldest keys go while the sizes sum to
    more than the bound. Many more insertions than the initial table and
    ring hold, so both grow while entries come and go."""

    def __init__(self):
        super().__init__()
        self.cap = 40
        self.max = 100
        self.cache = _index.LocCache(self.cap, max_bytes=self.max)
        self.model: dict[int, tuple[_Val, int]] = {}
        self.n = 0

    def _shed(self):
        while sum(sz for _v, sz in self.model.values()) > self.max:
            del self.model[next(iter(self.model))]

    def _put(self, loc, v, size):
        if size > self.max:
            self.model.pop(loc, None)
            return
        if loc not in self.model and len(self.model) >= self.cap:
            del self.model[next(iter(self.model))]
        self.model[loc] = (v, size)
        self._shed()

    @rule(loc=st.integers(0, 60), size=st.integers(0, 8) | st.integers(0, 120))
    def put(self, loc, size):
        self.n += 1
        v = _Val(self.n)
        self._put(loc, v, size)
        assert self.cache.put(loc, v, size) == (loc in self.model)

    @rule(first=st.integers(0, 1000), count=st.integers(1, 80), size=st.integers(0, 5))
    def fill(self, first, count, size):
        for loc in range(first, first + count):
            self.put(loc, size)

    @rule(loc=st.integers(0, 60))
    def setitem(self, loc):
        self.n += 1
        v = _Val(self.n)
        self._put(loc, v, 0)
        self.cache[loc] = v

    @rule(moves=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=6))
    def move_many(self, moves):
        for old, new in moves:
            if old in self.model:
                self._put(new, *self.model.pop(old))
        self.cache.move_many([o for o, _n in moves], [n for _o, n in moves])


TestByteBoundLocCache = ByteBoundLocCacheMachine.TestCase
TestByteBoundLocCache.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


class AgedLocCacheMachine(_ByteBoundRules, RuleBasedStateMachine):
    """LocCache(aged=True): an insertion that needs room drops entries the
    caller cannot name in advance (one of the older half, at random), so
    the model learns which went from the cache and checks what it can: the
    key just put is held (unless larger than the bound), what went was held
    before, a full cache gave up at least one, the bound in bytes holds; the
    rest as a dict kept in insertion order (updates keep their place,
    make_room and clear drop the oldest)."""

    def __init__(self):
        super().__init__()
        self.cap = 12
        self.max = 60
        self.cache = _index.LocCache(self.cap, max_bytes=self.max, aged=True)
        self.model: dict[int, tuple[_Val, int]] = {}
        self.refs: list[weakref.ref] = []
        self.n = 0

    def _sync(self, kept: int | None) -> None:
        held = set(self.cache.keys())
        gone = [k for k in self.model if k not in held]
        assert held <= set(self.model) | ({kept} if kept is not None else set())
        for k in gone:
            del self.model[k]
        if kept is not None:
            assert kept in held

    @rule(loc=st.integers(0, 30), size=st.integers(0, 9) | st.integers(0, 70))
    def put(self, loc, size):
        self.n += 1
        v = _Val(self.n)
        self.refs.append(weakref.ref(v))
        full = loc not in self.model and len(self.model) >= self.cap
        before = len(self.model)
        update = loc in self.model
        held = self.cache.put(loc, v, size)
        # (an update keeps its place, so the room it needs may take it too)
        assert held == (size <= self.max) or (update and not held)
        if not held:
            self.model.pop(loc, None)
            self._sync(None)
            return
        self.model[loc] = (v, size)
        self._sync(loc)
        if full:
            assert len(self.model) <= before     # a full cache gave one up
        assert sum(s for _v, s in self.model.values()) <= self.max

    @rule(first=st.integers(0, 200), count=st.integers(1, 40), size=st.integers(0, 6))
    def loop(self, first, count, size):
        for loc in range(first, first + count):
            self.put(loc, size)

    @rule(moves=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=6))
    def move_many(self, moves):
        for old, new in moves:
            if old in self.model:
                self.model[new] = self.model.pop(old)       # (popped, then put last)
        self.cache.move_many([o for o, _n in moves], [n for _o, n in moves])
        self._sync(None)

    @invariant()
    def released(self):
        held = {id(v) for v, _s in self.model.values()}
        for r in self.refs:
            v = r()
            assert v is None or id(v) in held, "a value dropped from the cache is still referenced"


TestAgedLocCache = AgedLocCacheMachine.TestCase
TestAgedLocCache.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


def test_an_aged_cache_keeps_most_of_a_loop_a_little_larger_than_it():
    """Oldest-first drops each entry just before the loop asks for it again;
    the aged cache drops one of its older half at random, the same ones for
    the same calls."""
    def hit_rate(aged: bool) -> float:
        c, hits = _index.LocCache(1000, aged=aged), 0
        for rnd in range(6):
            for loc in range(1100):
                if c.get(loc) is not None:
                    hits += rnd >= 2
                else:
                    c.put(loc, loc, 1)
        return hits / (4 * 1100)
    assert hit_rate(False) == 0.0
    assert hit_rate(True) > 0.6 and hit_rate(True) == hit_rate(True)
    c = _index.LocCache(1000, max_bytes=500, aged=True)       # the bound in bytes too
    for loc in range(600):
        c.put(loc, loc, 1)
    assert len(c) == 500 and c.nbytes == 500 and 599 in c and min(c.keys()) < 100


def test_loc_cache_bounds_bytes_and_grows_with_what_it_holds():
    c = _index.LocCache(1 << 20, max_bytes=1000)
    assert c.max_bytes == 1000 and c.nbytes == 0 and _index.LocCache(3).max_bytes is None
    for i in range(100_000):
        assert c.put(i, i, 1) or i < 1000
    assert len(c) == 1000 and c.nbytes == 1000 and c.keys() == list(range(99_000, 100_000))
    assert not c.put(5, "big", 1001) and 5 not in c
    c.put(99_999, "x", 1000)                  # an update larger than the rest: only it stays
    assert c.items() == [(99_999, "x")] and c.nbytes == 1000
    with pytest.raises(ValueError, match="max_bytes"):
        _index.LocCache(4, max_bytes=-1)
    with pytest.raises(ValueError, match="size"):
        c.put(1, 1, -1)


def test_loc_cache_refuses_bad_arguments_and_releases_its_values():
    with pytest.raises(ValueError, match="capacity"):
        _index.LocCache(0)
    c = _index.LocCache(4)
    with pytest.raises(ValueError, match="-1"):
        c[-1] = 1
    with pytest.raises(TypeError):
        c["x"] = 1
    with pytest.raises(TypeError):
        c.get_many([0, "x"])
    with pytest.raises(TypeError):
        c.get_many((0, 1))
    assert c.get_many([]) == ([], 0)
    assert c.capacity == 4 and c.get(-1) is None and -1 not in c and c.pop(-1, 0) == 0
    vals = [_Val(i) for i in range(3)]
    refs = [weakref.ref(v) for v in vals]
    for i, v in enumerate(vals):
        c[i] = v
    c[0] = _Val("new")
    del vals, v
    assert refs[0]() is None and refs[1]() is not None        # the replaced value is released
    del c
    assert all(r() is None for r in refs)                      # and the rest with the cache


# ---- HotIndex ----------------------------------------------------------------

def build(lines, seg=0):
    data = b"".join(lines)
    ix = _index.HotIndex()
    ix.attach(seg, data, path=f"/state/seg-{seg}")
    rep = ix.ingest(seg)
    return ix, data, rep


def ids(ix, locs):
    return [orjson.loads(bytes(ix.line(int(l))))["r"]["msg_id"] for l in locs]


def offsets(lines):
    out, pos = [], 0
    for ln in lines:
        out.append(pos)
        pos += len(ln)
    return out


def test_ingest_find_and_report():
    ls = [line("m1", "c1", "t1", content="hi"), line("m2", "c2"), line("m1", "c1"),
          tombstone("m2", "c2", "h"), tombstone("zz", "c9")]
    ix, data, r = build(ls)
    off = offsets(ls)
    assert (r.good_end, r.torn_offset, r.damaged_offset, r.damage, r.n_lines) == (len(data), -1, -1, "", 5)
    assert r.added.tolist() == [off[0], off[1]]
    assert r.dup_locs.tolist() == [off[2]]
    assert r.tombstones == [(b"m2", b"c2"), (b"zz", b"c9")]
    assert ix.find(b"m1") == off[0] and ix.find(b"m2") == -1 and ix.find(b"nope") == -1
    assert b"m1" in ix and len(ix) == 1
    assert ix.channels() == [b"c1"]
    assert "IngestReport" in repr(r) and "HotIndex" in repr(ix)


def test_id_table_shrinks_when_most_messages_leave(tmp_path):
    # a hot tier that cooled most of a bulk load keeps a table for what it
    # holds, not for its peak: memory and the snapshot every open reads
    ls = [line(f"m{i}", f"c{i % 7}") for i in range(20000)]
    ix, data, _ = build(ls)
    big = ix.nbytes
    gone = ix.remove_many([f"m{i}".encode() for i in range(19500)])
    assert (gone >= 0).all()
    assert big - ix.nbytes > 8 * 20000        # the id table: 28,000+ slots -> ~1,000
    for i in range(19500, 20000):
        assert ix.find(f"m{i}".encode()) >= 0
    assert ix.find(b"m5") == -1
    assert ix.remove(b"m19999") >= 0 and ix.find(b"m19998") >= 0
    snap = str(tmp_path / "ix.snap")
    ix.save_snapshot(snap, {0: len(data)})
    assert os.path.getsize(snap) < 8 * 20000 // 4
    ix2, _ = _index.HotIndex.load_snapshot(snap)
    ix2.attach(0, data)
    assert len(ix2) == 499 and ix2.find(b"m19998") == ix.find(b"m19998")


def test_ingest_in_steps_and_segments():
    a = [line(f"a{i}", "c") for i in range(5)]
    b = [line(f"b{i}", "c") for i in range(3)]
    ix = _index.HotIndex()
    data = b"".join(a)
    ix.attach(3, data[:len(a[0]) + len(a[1])])
    r1 = ix.ingest(3)
    ix.attach(3, data)
    r2 = ix.ingest(3, r1.good_end)
    ix.attach(4, b"".join(b))
    ix.ingest(4)
    assert r1.n_lines == 2 and r2.n_lines == 3
    assert ids(ix, ix.channel_locs(b"c")) == [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(3)]
    assert ix.find(b"b0") == 4 << S
    assert ix.attached() == [3, 4]


def test_order_unstamped_first_then_hlc_then_id():
    ls = [line("z", "c", hlc="0005"), line("u1", "c"), line("a", "c", hlc="0005"),
          line("y", "c", hlc="0001"), line("u2", "c"), line("x", "c", hlc="0009"),
          line("b", "c", hlc="0003")]
    ix, _, _ = build(ls)
    want = ["u1", "u2", "y", "b", "a", "z", "x"]
    assert ids(ix, ix.channel_locs(b"c")) == want
    assert ids(ix, ix.channel_locs(b"c", 3)) == want[-3:]
    assert ids(ix, ix.channel_locs(b"c", 100)) == want
    assert ix.channel_locs(b"c", 0).tolist() == []
    assert ix.channel_locs(b"nope").tolist() == []
    assert ix.channel_len(b"c") == 7 and ix.channel_len(b"nope") == 0


def _spelled(s: str, ascii_only: bool) -> bytes:
    """The body of s as a JSON string: orjson's spelling, or json's
    ensure_ascii one (\\u escapes, surrogate pairs for astral characters)."""
    import json
    return json.dumps(s).encode()[1:-1] if ascii_only else key(s)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.text(st.sampled_from('"\\\n\x01\x1f !#0A[]a~\x7féĀ\u2028\ufffd😀𝄞'),
                                  min_size=1, max_size=5),
                          st.text(st.sampled_from('"\\\x02 0:az~é😀'), min_size=1, max_size=4),
                          st.booleans()),
                min_size=1, max_size=12, unique_by=lambda t: t[0]))
def test_stamped_order_is_python_string_order_whatever_the_escapes(entries):
    """The order of stamped messages compares the strings their escaped bytes
    spell (SPEC's (hlc, msg_id) order, as Python compares them), whichever
    way a line escapes them."""
    lines = []
    for mid, hlc, ascii_only in entries:
        body = (b',"k":"m","r":{"msg_id":"' + _spelled(mid, ascii_only) + b'","channel_id":"c","task_id":"",'
                b'"hlc":"' + _spelled(hlc, ascii_only) + b'","content":""}}')
        lines.append(_log.frame(body))
    ix, _, rep = build(lines)
    assert rep.damage == "" and len(rep.added) == len(entries)
    want = [mid for mid, _h, _a in sorted(entries, key=lambda e: (e[1], e[0]))]
    assert ids(ix, ix.channel_locs(b"c")) == want


def test_add_appended_lines():
    ix = _index.HotIndex()
    data = b""
    locs = []
    for i, (h, t) in enumerate([("3", "t"), ("1", ""), ("", "t"), ("2", "u")]):
        off = len(data)
        data += line(f"m{i}", "c", t, h)
        ix.attach(0, data)
        assert ix.add(off) is True
        assert ix.add(off) is False
        locs.append(off)
    assert ids(ix, ix.channel_locs(b"c")) == ["m2", "m1", "m3", "m0"]
    assert ids(ix, ix.task_locs(b"t")) == ["m2", "m0"]
    assert ids(ix, ix.task_locs(b"u")) == ["m3"]
    assert ix.task_locs(b"") .tolist() == []
    assert ix.latest_task(b"c") == b"t"      # newest in order is m0 (hlc 3), task t
    assert ix.latest_task(b"nope") is None


def test_add_errors():
    ix = _index.HotIndex()
    good = line("m", "c")
    ix.attach(0, good + tombstone("m", "c") + good[:-1] + b"X\n" + good[:20])
    with pytest.raises(FramingError, match="tombstone"):
        ix.add(len(good))
    with pytest.raises(CorruptStateCheckpointError) as ei:
        ix.add(2 * len(good) + len(tombstone("m", "c")))
    assert ei.value.offset == 2 * len(good) + len(tombstone("m", "c"))
    with pytest.raises(CorruptStateCheckpointError, match="no complete line"):
        ix.add(2 * len(good) + 1 + len(tombstone("m", "c")))
    with pytest.raises(RuneError, match="not inside"):
        ix.add(10**6)
    with pytest.raises(RuneError):
        ix.add(5 << S)
    with pytest.raises(FramingError):
        ix.add(-1)


def test_not_a_message_line_is_damage():
    from rune_fast import _log
    ls = [line("m", "c"), _log.frame(b',"k":"h","v":1}'), line("n", "c")]
    ix, _, r = build(ls)
    assert r.damaged_offset == len(ls[0]) and r.damage == "not a message line"
    assert r.good_end == len(ls[0]) and len(ix) == 1
    bad_fields = _log.frame(b',"k":"m","r":{"msg_id":"x","channel":"c"}}')
    ix, _, r = build([bad_fields])
    assert r.damaged_offset == 0 and r.damage == "message fields do not parse"


def test_torn_and_damaged_ingest_and_zero_tail():
    ls = [line(f"m{i}", "c") for i in range(3)]
    data = b"".join(ls)
    ix = _index.HotIndex()
    ix.attach(0, data + ls[0][:7])
    r = ix.ingest(0)
    assert r.torn_offset == len(data) and r.good_end == len(data) and len(ix) == 3
    ix = _index.HotIndex()
    ix.attach(0, data + b"\0" * 100)
    r = ix.ingest(0)
    assert r.torn_offset == -1 and r.good_end == len(data)
    flipped = bytearray(data)
    flipped[len(ls[0]) + 60] ^= 0x20
    ix = _index.HotIndex()
    ix.attach(0, bytes(flipped))
    r = ix.ingest(0)
    assert r.damaged_offset == len(ls[0]) and r.damage == "checksum mismatch" and len(ix) == 1


def test_line_verifies_checksum():
    ls = [line("m0", "c"), line("m1", "c")]
    data = bytearray(b"".join(ls))
    ix = _index.HotIndex()
    ix.attach(0, bytes(data), path="/state/seg-0")
    ix.ingest(0)
    assert bytes(ix.line(len(ls[0]))) == ls[1][:-1]
    data[len(ls[0]) + 50] ^= 1
    ix.attach(0, bytes(data), path="/state/seg-0")
    with pytest.raises(CorruptStateCheckpointError) as ei:
        ix.line(len(ls[0]))
    assert ei.value.path == "/state/seg-0" and ei.value.offset == len(ls[0])
    ix.attach(0, bytes(data[:len(ls[0]) + 10]))
    with pytest.raises(CorruptStateCheckpointError, match="no newline"):
        ix.line(len(ls[0]))
    ix.attach(0, bytes(data[:len(ls[0])]))
    with pytest.raises(CorruptStateCheckpointError, match="shorter"):
        ix.line(len(ls[0]))
    ix.detach(0)
    with pytest.raises(RuneError, match="not attached"):
        ix.line(0)
    with pytest.raises(RuneError, match="detached"):
        ix.find(b"m0")
    with pytest.raises(FramingError):
        ix.line(-5)


def test_check_lines_is_line_without_views():
    ls = [line(f"m{i}", "c") for i in range(4)]
    offs = [sum(len(x) for x in ls[:i]) for i in range(4)]
    data = bytearray(b"".join(ls))
    ix = _index.HotIndex()
    ix.attach(0, bytes(data), path="/state/seg-0")
    ix.ingest(0)
    assert ix.check_lines(offs) is None and ix.check_lines([]) is None
    data[offs[2] + 40] ^= 1
    ix.attach(0, bytes(data), path="/state/seg-0")
    ix.check_lines(offs[:2])
    with pytest.raises(CorruptStateCheckpointError) as ei:
        ix.check_lines(offs)
    assert ei.value.path == "/state/seg-0" and ei.value.offset == offs[2]
    with pytest.raises(FramingError):
        ix.check_lines([-5])
    with pytest.raises(TypeError):
        ix.check_lines((0,))


def test_window_hits_are_channel_locs_checked_with_cached_records():
    ls = [line(f"m{i}", "c" if i % 3 else "d", "t" if i % 2 else "") for i in range(12)]
    offs = [sum(len(x) for x in ls[:i]) for i in range(12)]
    data = bytearray(b"".join(ls))
    ix = _index.HotIndex()
    ix.attach(0, bytes(data), path="/state/seg-0")
    ix.ingest(0)
    cache = _index.LocCache(64)
    for i in (2, 5, 11):
        cache[offs[i]] = (f"rec{i}", i)
    for n in (0, 1, 5, 8, 100):
        locs, recs, misses = ix.window_hits(b"c", n, cache)
        assert locs == (ix.channel_locs(b"c", n).tolist() if n else [])
        assert recs == [f"rec{offs.index(loc)}" if offs.index(loc) in (2, 5, 11) else None for loc in locs]
        assert misses == recs.count(None)
    assert ix.window_hits(b"nope", 8, cache) == ([], [], 0) and ix.window_hits(b"c", -1, cache) == ([], [], 0)
    locs, hits, misses = ix.task_hits(b"t", cache)
    assert locs == ix.task_locs(b"t").tolist() and misses == 4
    assert hits == [(f"rec{offs.index(loc)}", offs.index(loc)) if offs.index(loc) in (5, 11) else None
                    for loc in locs]
    assert ix.task_hits(b"nope", cache) == ([], [], 0)
    with pytest.raises(TypeError):
        ix.window_hits(b"c", 8, {})
    data[offs[11] + 40] ^= 1                           # the newest line of "c" (its record is cached)
    ix.attach(0, bytes(data), path="/state/seg-0")
    assert ix.window_hits(b"d", 8, cache)[0] == ix.channel_locs(b"d", 8).tolist()
    for read in (lambda: ix.window_hits(b"c", 2, cache), lambda: ix.task_hits(b"t", cache)):
        with pytest.raises(CorruptStateCheckpointError) as ei:
            read()
        assert ei.value.path == "/state/seg-0" and ei.value.offset == offs[11]


def test_remove_and_remove_many_keep_arrays_consistent():
    ls = [line(f"m{i}", "c" if i % 2 else "d", "t" if i % 3 == 0 else "", "" if i % 4 else f"{i:04d}")
          for i in range(40)]
    ix, _, _ = build(ls)
    before = ids(ix, ix.channel_locs(b"c"))
    assert ix.remove(b"m1") == offsets(ls)[1]
    assert ix.remove(b"m1") == -1
    assert ids(ix, ix.channel_locs(b"c")) == [i for i in before if i != "m1"]
    gone = [f"m{i}".encode() for i in range(0, 40, 3)] + [b"unknown"]
    locs = ix.remove_many(gone)
    assert locs[-1] == -1 and (locs[:-1] >= 0).all()
    assert ix.task_locs(b"t").tolist() == []
    assert len(ix) == 40 - 1 - 14
    live = set(ids(ix, ix.channel_locs(b"c"))) | set(ids(ix, ix.channel_locs(b"d")))
    assert live == {f"m{i}" for i in range(40) if i != 1 and i % 3}
    # freed entries are reused, order still right
    data2 = b"".join(ls) + line("m0", "d", "t", "")
    ix.attach(0, data2)
    assert ix.add(len(data2) - len(line("m0", "d", "t", ""))) is True
    assert ids(ix, ix.task_locs(b"t")) == ["m0"]
    d = ids(ix, ix.channel_locs(b"d"))
    assert d[0] in ("m2", "m10") or d.index("m0") < len(d)


def test_remove_lines_unindexes_the_ids_read_from_the_lines():
    # (what remove_many does with the ids, read from the lines at the
    # locations: a compact() need not hold a file's ids to its adoption)
    ls = [line(f"m{i}", "c" if i % 2 else "d", "t" if i % 3 == 0 else "", "" if i % 4 else f"{i:04d}")
          for i in range(40)]
    ix, data, _ = build(ls)
    off = offsets(ls)
    ref, _, _ = build(ls)
    gone = list(range(0, 40, 3))
    assert ix.remove_lines(np.array([off[i] for i in gone], dtype=np.int64)).tolist() == [off[i] for i in gone]
    assert ref.remove_many([f"m{i}".encode() for i in gone]).tolist() == [off[i] for i in gone]
    for k in (b"c", b"d", b"t"):
        assert ix.channel_locs(k).tolist() == ref.channel_locs(k).tolist()
        assert ix.task_locs(k).tolist() == ref.task_locs(k).tolist()
    assert len(ix) == len(ref) == 40 - len(gone)
    # an id no longer indexed: -1; the others still go
    assert ix.remove_lines(np.array([off[0], off[1]], dtype=np.int64)).tolist() == [-1, off[1]]
    assert ix.remove_lines(np.zeros(0, dtype=np.int64)).tolist() == []
    # a line that fails its check is named, by file and offset
    bad = bytearray(data)
    bad[off[5] + 60] ^= 1
    ix2, _, _ = build(ls)
    ix2.attach(0, bytes(bad), path="/state/seg-0")
    with pytest.raises(CorruptStateCheckpointError) as ei:
        ix2.remove_lines(np.array([off[2], off[5]], dtype=np.int64))
    assert ei.value.path == "/state/seg-0" and ei.value.offset == off[5]
    assert ix2.find(b"m2") == -1 and ix2.find(b"m5") == off[5]


def test_channels_exclude_emptied_and_excess():
    ls = [line(f"a{i}", "A") for i in range(5)] + [line(f"b{i}", "B") for i in range(2)] + [line("c0", "C")]
    ix, _, _ = build(ls)
    off = offsets(ls)
    assert ix.channels() == [b"A", b"B", b"C"]
    ix.remove(b"c0")
    assert ix.channels() == [b"A", b"B"]
    assert ix.excess(2).tolist() == off[0:3]
    assert ix.excess(1).tolist() == off[0:4] + off[5:6]
    assert ix.excess(10).tolist() == []
    with pytest.raises(FramingError):
        ix.excess(-1)


def test_seg_stats_seg_locs_relocate():
    a = [line(f"a{i}", "c") for i in range(3)]
    ix = _index.HotIndex()
    ix.attach(0, b"".join(a))
    ix.ingest(0)
    ix.attach(1, b"".join(a[:1]) + line("b", "c"))
    ix.ingest(1)
    assert ix.seg_stats() == {0: (3, sum(map(len, a))), 1: (1, len(line("b", "c")))}  # a0 in seg 1: dup
    ix.remove(b"a1")
    assert ix.seg_stats() == {0: (2, len(a[0]) + len(a[2])), 1: (1, len(line("b", "c")))}
    assert ix.seg_locs(0).tolist() == [0, len(a[0]) + len(a[1])]
    # rewrite of segment 0 into segment 2 without a1
    new = a[0] + a[2]
    ix.attach(2, new)
    moved = ix.relocate(ix.seg_locs(0), [2 << S, (2 << S) + len(a[0])])
    ix.detach(0)
    assert moved == 2
    assert ids(ix, ix.channel_locs(b"c")) == ["a0", "a2", "b"]
    assert ix.find(b"a2") == (2 << S) + len(a[0])
    with pytest.raises(FramingError):
        ix.relocate([1, 2], [3])


def test_loc_cache_move_many_refuses_unequal_lengths():
    cache = _index.LocCache(4)
    cache[1] = "one"
    with pytest.raises(ValueError, match="2 old locations but 1 new"):
        cache.move_many([1, 2], [3])
    assert cache.items() == [(1, "one")]


def test_gather_lines():
    a = [line(f"a{i}", "c", content="x" * (i * 7)) for i in range(4)]
    ix = _index.HotIndex()
    ix.attach(0, b"".join(a))
    ix.ingest(0)
    locs = ix.seg_locs(0)
    data, starts = ix.gather_lines(locs[[2, 0, 3]])
    assert data == a[2] + a[0] + a[3]
    assert starts.tolist() == [0, len(a[2]), len(a[2]) + len(a[0])]
    data, starts = ix.gather_lines([])
    assert data == b"" and starts.tolist() == []
    # each line is checked as line() checks it, naming the file and offset
    bad = bytearray(b"".join(a))
    bad[int(locs[1]) + 30] ^= 1
    ix.attach(0, bytes(bad), path="/state/seg-0")
    with pytest.raises(CorruptStateCheckpointError, match="fails its check") as ei:
        ix.gather_lines([int(locs[0]), int(locs[1])])
    assert ei.value.path == "/state/seg-0" and ei.value.offset == int(locs[1])
    # the lines are checked without the GIL, and what is wrong raised after:
    # a location past the file, a segment not attached, a negative one, and
    # with hashes asked, a line that is not a message's; the index serves
    # the next call
    with pytest.raises(CorruptStateCheckpointError, match="no line at this offset") as ei:
        ix.gather_lines([int(locs[0]), len(bad) + 5])
    assert ei.value.path == "/state/seg-0" and ei.value.offset == len(bad) + 5
    with pytest.raises(RuneError, match="segment 7 is not attached"):
        ix.gather_lines([int(locs[0]), 7 << 40])
    with pytest.raises(FramingError, match="negative loc"):
        ix.gather_lines([-1])
    dead = tombstone("gone", "c")
    ix.attach(1, dead, path="/state/seg-1")
    assert ix.gather_lines([1 << 40])[0] == dead
    with pytest.raises(FramingError, match="offset 0 of /state/seg-1 is not a message line"):
        ix.gather_lines([int(locs[0]), 1 << 40], np.zeros(2, dtype=np.uint64))
    assert ix.gather_lines([int(locs[0])])[0] == a[0]


_WORDS = ["alpha", "Beta", "gamma", "DELTA", "stra\u00dfe", "\u6771\u4eac", "x", "quarterly", "report",
          "\"q\"", "tab\tbed", "line\nbreak", "zeta", "Omega"]


def _filler_lines(rng, n):
    return word_lines(rng, n, _WORDS)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 300), st.booleans()),
                                      min_size=1, max_size=12))
def test_search_block_filters_skip_only_blocks_without_a_match(seed, picks):
    """A whole-store search skips the 16 KiB blocks whose trigram filter rules
    the needle out: it finds exactly what the per-channel pass finds, for
    needles cut anywhere from the lines (across block boundaries, longer than
    a filter serves, in either case), and for needles found nowhere."""
    import random as _random
    rng = _random.Random(seed)
    ls = _filler_lines(rng, rng.randrange(150, 400))
    ix, data, _ = build(ls)
    assert len(data) > 3 * 16384
    before = ix.nbytes
    ix.search(b"warm", False, False, None)     # (the second search builds the filters)
    for start, length, ci in picks:
        a = start % len(data)
        raw = data[a:a + length]
        for needle in (raw, raw.swapcase(), b"no such text here", b"zq" + raw[:5]):
            nd = needle.lower() if ci else needle
            assert ix.search(nd, ci, False, None).tolist() == by_channels(ix, nd, ci), (needle, ci)
    assert ix.nbytes > before          # the filters were built (and are counted)


@pytest.mark.parametrize("shift", [-40, -17, -16, -3, -1, 0, 1, 250, 255, 256, 257])
def test_search_block_filters_find_a_match_across_a_block_boundary(shift):
    """A needle found once, starting near the end of a block and running into
    the next (whose filter lacks its first trigrams), or starting in the
    bytes a block's filter shares with the next."""
    token = "Zyxwvut-Unique-9876543210"
    prefix = b"".join(line(f"p{i}", "c0", content="filler " * 30) for i in range(80))
    probe = line("t", "c1", content=token + " and more")
    at = probe.index(token.encode())
    for boundary in (16384, 32768):
        want = boundary + shift                  # where the token starts
        head = prefix[:boundary - 2048]
        head = head[:head.rfind(b"\n") + 1]
        pad = want - len(head) - at
        body = line("t", "c1", content="p" * pad + token + " and more")
        data = head + body + b"".join(line(f"s{i}", "c2", content="suffix " * 40) for i in range(40))
        assert data.index(token.encode()) == want
        ix = _index.HotIndex()
        ix.attach(0, data)
        ix.ingest(0)
        ix.search(b"warm", False, False, None)   # (the second search builds the filters)
        for needle, ci in ((token.encode(), False), (token.lower().encode(), True), (token[3:].encode(), False)):
            assert ids(ix, ix.search(needle, ci, False, None)) == ["t"], (boundary, shift, needle)


def test_search_block_filters_follow_a_growing_mapped_tail():
    """The mapped tail of a writer runs on past its lines (zeros its appends
    overwrite): filters cover only complete lines, so lines written into the
    buffer later are found, and a buffer attached again drops them."""
    import random as _random
    rng = _random.Random(7)
    first = _filler_lines(rng, 120)
    later = [line(f"n{i}", "c9", content=f"needle-{i} written later " + "pad " * 60) for i in range(60)]
    buf = bytearray(sum(map(len, first + later)) + 65536)
    head = b"".join(first)
    buf[:len(head)] = head
    ix = _index.HotIndex()
    ix.attach(0, buf)
    ix.ingest(0, 0, len(head))
    before = ix.nbytes
    for _ in range(2):                # the second whole-store search builds the filters
        assert ids(ix, ix.search(b"needle-1", False, False, None)) == []
    assert ix.nbytes > before
    pos = len(head)
    for ln in later:                      # written in place, as the writer's appends land in the map
        buf[pos:pos + len(ln)] = ln
        ix.ingest(0, pos, pos + len(ln))
        pos += len(ln)
    assert ids(ix, ix.search(b"needle-1", False, False, None)) == [f"n{i}" for i in range(60) if str(i).startswith("1")]
    assert ids(ix, ix.search(b"NEEDLE-59 ", True, False, None)) == ["n59"]
    assert ix.search(b"alpha", True, False, None).tolist() == by_channels(ix, b"alpha", True)
    grown = _index.HotIndex()             # a tail attached as growing never gets filters
    grown.attach(0, buf, growing=True)
    grown.ingest(0, 0, pos)
    before = grown.nbytes
    for _ in range(3):
        assert ids(grown, grown.search(b"needle-59 ", False, False, None)) == ["n59"]
    assert grown.nbytes == before
    other = b"".join(line(f"o{i}", "c0", content="other words " * 40 + str(i)) for i in range(80))
    ix.detach(0)
    ix.attach(0, other)               # the old buffer's filters are gone with it
    assert ix.search(b"alpha", False, False, None).tolist() == []
    fresh = _index.HotIndex()
    fresh.attach(0, other)
    fresh.ingest(0)
    assert ids(fresh, fresh.search(b"words 79", False, False, None)) == ["o79"]


def test_search_in_escaped_content():
    ls = [line("m0", "c", content="line one\nline two"), line("m1", "c", content="say \"hi\""),
          line("m2", "d", content="back\\slash n"), line("m3", "c", content="\u00c9t\u00e9 and \x0b"),
          line("m4", "d", content="plain", role="nomatch"), line("m5", "e", content="\n\t\n")]
    ix, _, _ = build(ls)
    s = lambda t, ci=False, na=False, ch=None: ids(ix, ix.search(key(t), ci, na, ch))
    assert s("\n") == ["m0", "m5"]
    assert s("n") == ["m0", "m3", "m2", "m4"]   # never the n of an escaped newline (m5)
    assert s("t") == ["m0", "m3"]
    assert s("\\n") == []                   # backslash-n text appears nowhere
    assert s("\\") == ["m2"]
    assert s('"hi"') == ["m1"]
    assert s('"') == ["m1"]
    assert s("u000b") == []                  # inside the \u000b escape
    assert s("\x0b") == ["m3"]
    assert s("LINE", ci=True) == ["m0"]
    assert s("LINE") == []
    assert s("\u00e9t\u00e9") == []           # exact, not casefolded
    assert s("t\u00e9", ci=True, na=True) == ["m3"]
    assert s("zzz", na=True) == ["m3"]        # non-ASCII candidate
    assert s("nomatch") == []                # fields after the content do not match
    assert s("") == ["m0", "m1", "m3", "m2", "m4", "m5"]
    assert s("\t\n") == ["m5"]
    assert s("n", ch=key("d")) == ["m2", "m4"]
    assert s("n", ch=key("zz")) == []


def test_attach_variants_and_errors(tmp_path):
    ix = _index.HotIndex()
    ix.attach(0, None)
    assert ix.ingest(0).good_end == 0
    ix.attach(1, b"")
    assert ix.ingest(1).n_lines == 0
    with pytest.raises(FramingError):
        ix.attach(2, "text")
    with pytest.raises(FramingError):
        ix.attach(-1, b"")
    with pytest.raises(FramingError):
        ix.attach(1 << 23, b"")
    with pytest.raises(RuneError, match="not attached"):
        ix.ingest(7)
    ix.attach(3, line("m", "c"))
    with pytest.raises(FramingError):
        ix.ingest(3, 5, 2)
    with pytest.raises(FramingError):
        ix.find(42)
    # an mmap stays valid while attached and cannot be closed under the index
    p = tmp_path / "seg"
    p.write_bytes(line("m", "c"))
    with open(p, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    ix.attach(5, m)
    ix.ingest(5)
    with pytest.raises(BufferError):
        m.close()
    ix.detach(5)
    m.close()


# ---- snapshots -------------------------------------------------------------

def sample_index(n=300):
    ls = [line(f"m{i}", f"c{i % 7}", f"t{i % 5}" if i % 2 else "",
               "" if i % 3 else f"{(i * 7919) % 1000:04d}", f"content {i}") for i in range(n)]
    ix, data, _ = build(ls)
    ix.remove_many([f"m{i}".encode() for i in range(0, n, 11)])
    return ix, data


def test_snapshot_roundtrip(tmp_path):
    ix, data = sample_index()
    p = tmp_path / "idx.snap"
    ix.save_snapshot(p, {0: len(data), 3: 17})
    assert oct(os.stat(p).st_mode & 0o777) == "0o600"
    j, cov = _index.HotIndex.load_snapshot(p)
    assert cov == {0: len(data), 3: 17}
    j.attach(0, data)
    assert len(j) == len(ix)
    for c in ix.channels():
        assert j.channel_locs(c).tolist() == ix.channel_locs(c).tolist()
        assert j.latest_task(c) == ix.latest_task(c)
    for t in (b"t1", b"t3"):
        assert j.task_locs(t).tolist() == ix.task_locs(t).tolist()
    for i in range(300):
        assert j.find(f"m{i}".encode()) == ix.find(f"m{i}".encode())
    assert j.channels() == ix.channels()
    # the loaded index keeps working: add, remove, save again
    extra = line("new", "c1", "", "0001")
    j.attach(0, data + extra)
    assert j.add(len(data)) is True and j.remove(b"m1") >= 0
    j.save_snapshot(p, {0: len(data) + len(extra)})
    k, _ = _index.HotIndex.load_snapshot(p)
    k.attach(0, data + extra)
    assert k.channel_locs(b"c1").tolist() == j.channel_locs(b"c1").tolist()


def test_snapshot_empty_index(tmp_path):
    p = tmp_path / "e.snap"
    _index.HotIndex().save_snapshot(p, {})
    j, cov = _index.HotIndex.load_snapshot(p)
    assert len(j) == 0 and cov == {} and j.channels() == []


@pytest.mark.parametrize("first", ["remove", "add_known_task", "add_new_task", "query", "save"])
def test_snapshot_task_arrays_made_at_first_need(tmp_path, first):
    """A loaded snapshot makes its task arrays at the first call that needs
    them; whatever comes first (a removal, an append to a known or a new task,
    a query, a save), the arrays come out as if loaded eagerly."""
    ix, data = sample_index()
    p = tmp_path / "idx.snap"
    ix.save_snapshot(p, {0: len(data)})
    j, _ = _index.HotIndex.load_snapshot(p)
    j.attach(0, data)
    assert j.channel_locs(b"c1").tolist() == ix.channel_locs(b"c1").tolist()
    extra = line("new", "c1", "t3", "", "late") + line("newer", "c2", "t-new", "", "later")
    both = data + extra
    for x in (ix, j):
        x.attach(0, both)
    if first == "remove":
        for x in (ix, j):
            assert x.remove(b"m3") >= 0           # m3 is in task t3
    elif first == "add_known_task":
        for x in (ix, j):
            assert x.add(len(data)) is True
    elif first == "add_new_task":
        for x in (ix, j):
            assert len(x.ingest(0, len(data), len(both)).added) == 2
    elif first == "save":
        j.save_snapshot(tmp_path / "again.snap", {0: len(data)})
        j, _ = _index.HotIndex.load_snapshot(tmp_path / "again.snap", lazy_tasks=False)
        j.attach(0, both)
    for t in (b"t0", b"t1", b"t3", b"t-new", b"nope"):
        assert j.task_locs(t).tolist() == ix.task_locs(t).tolist()
    assert len(j) == len(ix) and j.channels() == ix.channels()
    for c in ix.channels():
        assert j.channel_locs(c).tolist() == ix.channel_locs(c).tolist()


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(st.sampled_from(["t0", "t1", "t3", "t-new", "t-newer", ""]),
                                           st.sampled_from(["", "0005", "0500", "9999"])),
                                 min_size=1, max_size=6), min_size=1, max_size=4),
       then=st.sampled_from(["query", "remove", "save", "tombstone"]))
def test_lines_indexed_while_task_arrays_wait_come_out_as_if_eager(tmp_path_factory, batches, then):
    """Lines ingested (or added) after a lazy load leave their task insertions
    for the moment the arrays are made (an open after a killed writer then
    never makes 25,000 task arrays): whatever comes next, every task array is
    the one an index that never waited has, in the same order."""
    ix, data = sample_index()
    p = tmp_path_factory.mktemp("lazy") / "idx.snap"
    ix.save_snapshot(p, {0: len(data)})
    j, _ = _index.HotIndex.load_snapshot(p)
    buf = data
    k = 0
    for bi, batch in enumerate(batches):
        extra = b"".join(line(f"late{k + i}", f"c{(k + i) % 3}", t, h, "x") for i, (t, h) in enumerate(batch))
        k += len(batch)
        start, buf = len(buf), buf + extra
        for x in (ix, j):
            x.attach(0, buf)
            if bi % 2:
                x.ingest(0, start, len(buf))
            else:
                pos = start
                for ln in extra.splitlines(keepends=True):
                    assert x.add(pos) is True
                    pos += len(ln)
    if then == "remove":
        for x in (ix, j):
            assert x.remove(b"late0") >= 0
    elif then == "tombstone":
        buf += tombstone("late0", "c0")
        for x in (ix, j):
            x.attach(0, buf)
            x.ingest(0, len(buf) - len(tombstone("late0", "c0")), len(buf))
    elif then == "save":
        j.save_snapshot(p.parent / "again.snap", {0: len(buf)})
        j, _ = _index.HotIndex.load_snapshot(p.parent / "again.snap")
        j.attach(0, buf)
    tasks = [b"t0", b"t1", b"t2", b"t3", b"t4", b"t-new", b"t-newer"]
    for t in tasks:
        assert j.task_locs(t).tolist() == ix.task_locs(t).tolist(), t
    assert len(j) == len(ix) and j.channels() == ix.channels()
    for c in ix.channels():
        assert j.channel_locs(c).tolist() == ix.channel_locs(c).tolist()


def test_a_waiting_line_damaged_before_the_task_arrays_are_made_is_loud(tmp_path):
    ix, data = sample_index()
    p = tmp_path / "idx.snap"
    ix.save_snapshot(p, {0: len(data)})
    j, _ = _index.HotIndex.load_snapshot(p)
    extra = line("late0", "c1", "t-new", "", "late") + line("late1", "c1", "t1", "", "later")
    buf = bytearray(data + extra)
    j.attach(0, buf)
    assert len(j.ingest(0, len(data), len(buf)).added) == 2
    j.detach(0)
    buf[len(data) + 30] ^= 0x01            # inside late0's line, after it was indexed
    j.attach(0, bytes(buf))
    for _ in range(2):                      # now and at every later task call
        with pytest.raises(CorruptStateCheckpointError):
            j.task_locs(b"t1")
    with pytest.raises(CorruptStateCheckpointError):
        j.save_snapshot(tmp_path / "again.snap", {0: len(buf)})


def test_snapshot_arrays_used_in_place_never_write_the_file(tmp_path):
    """The entry array and id table of a loaded snapshot live in a private
    map of the file: changing the index (removals, appends, a rehash, growth
    out of the map) never writes the file, and replacing the file under a
    loaded index changes nothing for it."""
    ix, data = sample_index(300)
    p = tmp_path / "idx.snap"
    ix.save_snapshot(p, {0: len(data)})
    before = p.read_bytes()
    j, _ = _index.HotIndex.load_snapshot(p)
    j.attach(0, data)
    assert j.remove(b"m1") >= 0 and j.remove(b"m2") >= 0 and j.find(b"m1") < 0
    assert p.read_bytes() == before
    ix.save_snapshot(p, {0: 1})                      # the file replaced under j
    extra = b"".join(line(f"n{i}", f"c{i % 3}", "t1" if i % 2 else "", "", f"new {i}") for i in range(2000))
    j.attach(0, data + extra)
    assert len(j.ingest(0, len(data), len(data) + len(extra)).added) == 2000   # grows out of the map
    assert j.find(b"n1999") >= 0 and j.find(b"m3") == ix.find(b"m3")
    assert j.find(b"m1") < 0 and j.find(b"m2") < 0
    assert len(j) == len(ix) - 2 + 2000
    j.save_snapshot(tmp_path / "j.snap", {0: len(data) + len(extra)})
    k, _ = _index.HotIndex.load_snapshot(tmp_path / "j.snap")
    k.attach(0, data + extra)
    assert len(k) == len(j) and k.task_locs(b"t1").tolist() == j.task_locs(b"t1").tolist()
    del j, k


def test_snapshot_task_arrays_that_do_not_check_fail_loudly_every_time(tmp_path):
    """A snapshot whose digest checks but whose task arrays name a free entry
    (only a bug could write one): lazily, the first task call raises and so
    does every later one; eagerly (verify), the load raises."""
    import struct

    import xxhash

    ix, data = sample_index()
    p = tmp_path / "idx.snap"
    ix.save_snapshot(p, {0: len(data)})
    raw = bytearray(p.read_bytes())
    # find the first task array (docs/FORMAT.md) and point its first entry past the entries
    n_cov, n_entries, n_chan, n_task = struct.unpack_from("<4I", raw, 32)
    (n_slots,) = struct.unpack_from("<Q", raw, 48)
    pos = 64 + 16 * n_cov + ((8 * n_entries + 7) & ~7) + 8 * n_slots
    metas = [struct.unpack_from("<4I", raw, pos + 16 * i) for i in range(n_chan + n_task)]
    pos += 16 * (n_chan + n_task)
    pos += (sum(m[2] for m in metas) + 7) & ~7
    pos += 4 * sum(m[0] for m in metas[:n_chan])
    pos = (pos + 7) & ~7
    assert n_task and metas[n_chan][0] > 0
    struct.pack_into("<I", raw, pos, n_entries + 5)
    struct.pack_into("<Q", raw, 16, xxhash.xxh3_64_intdigest(bytes(raw[24:])))
    p.write_bytes(bytes(raw))
    j, _ = _index.HotIndex.load_snapshot(p)
    j.attach(0, data)
    assert j.channel_locs(b"c1").tolist() == ix.channel_locs(b"c1").tolist()
    for _ in range(2):
        with pytest.raises(CorruptStateCheckpointError) as ei:
            j.task_locs(b"t1")
        assert ei.value.path == str(p)
    with pytest.raises(CorruptStateCheckpointError):
        _index.HotIndex.load_snapshot(p, lazy_tasks=False)


def _sections(raw):
    """(counts, offsets) of a version-2 snapshot's sections (docs/FORMAT.md)."""
    import struct
    n_cov, n_entries, n_chan, n_task = struct.unpack_from("<4I", raw, 32)
    (n_slots,) = struct.unpack_from("<Q", raw, 48)
    locs = 64 + 16 * n_cov
    slots = locs + ((8 * n_entries + 7) & ~7)
    metas = slots + 8 * n_slots
    arrays = metas + 16 * (n_chan + n_task)
    arrays += (sum(struct.unpack_from("<4I", raw, metas + 16 * i)[2] for i in range(n_chan + n_task)) + 7) & ~7
    return (n_entries, n_slots), (locs, slots, arrays)


@pytest.mark.parametrize("fault", ["freed entry", "bad location", "slot past the entries",
                                   "slot of entry 0", "slot dropped", "channel entry past the end"])
def test_snapshot_whose_digest_checks_but_whose_arrays_do_not_is_refused(tmp_path, fault):
    """Only a bug could write one (the digest covers disk damage), but a load
    that trusted it would index out of bounds or loop on a full id table: the
    checks of the entries, the id table and the channel arrays refuse it."""
    import struct

    import xxhash

    ix, data = sample_index()
    p = tmp_path / "idx.snap"
    ix.save_snapshot(p, {0: len(data)})
    raw = bytearray(p.read_bytes())
    (n_entries, n_slots), (locs, slots, arrays) = _sections(raw)
    occupied = [i for i in range(n_slots) if struct.unpack_from("<Q", raw, slots + 8 * i)[0]]
    first = slots + 8 * occupied[0]
    (slot,) = struct.unpack_from("<Q", raw, first)
    if fault == "freed entry":
        struct.pack_into("<q", raw, locs + 8 * 3, -1)
    elif fault == "bad location":
        struct.pack_into("<q", raw, locs + 8 * 3, -5)
    elif fault == "slot past the entries":
        struct.pack_into("<Q", raw, first, (slot & ~0xFFFFFFFF) | (n_entries + 1))
    elif fault == "slot of entry 0":
        struct.pack_into("<Q", raw, first, slot & ~0xFFFFFFFF)
    elif fault == "slot dropped":
        struct.pack_into("<Q", raw, first, 0)
    else:
        struct.pack_into("<I", raw, arrays, n_entries + 2)
    struct.pack_into("<Q", raw, 16, xxhash.xxh3_64_intdigest(bytes(raw[24:])))
    p.write_bytes(bytes(raw))
    with pytest.raises(CorruptStateCheckpointError) as ei:
        _index.HotIndex.load_snapshot(p)
    assert ei.value.path == str(p)


def test_snapshot_damage_is_refused(tmp_path):
    ix, data = sample_index(100)
    p = tmp_path / "idx.snap"
    ix.save_snapshot(p, {0: len(data)})
    raw = p.read_bytes()
    with pytest.raises(CorruptStateCheckpointError, match="unreadable") as ei:
        _index.HotIndex.load_snapshot(tmp_path / "missing.snap")
    assert ei.value.path.endswith("missing.snap")
    for pos in (0, 9, 17, 30, 40, 64, len(raw) // 2, len(raw) - 1):
        bad = bytearray(raw)
        bad[pos] ^= 0x10
        p.write_bytes(bytes(bad))
        with pytest.raises(CorruptStateCheckpointError) as ei:
            _index.HotIndex.load_snapshot(p)
        assert ei.value.path == str(p)
    for cut in (0, 10, 64, len(raw) - 8):
        p.write_bytes(raw[:cut])
        with pytest.raises(CorruptStateCheckpointError):
            _index.HotIndex.load_snapshot(p)
    p.write_bytes(raw + b"\0" * 8)
    with pytest.raises(CorruptStateCheckpointError):
        _index.HotIndex.load_snapshot(p)


def test_nbytes_per_message_is_small():
    n = 20000
    ls = [line(f"msg_{i:026d}", f"c{i % 50}", f"t{i % 300}", "", "x") for i in range(n)]
    ix, _, _ = build(ls)
    assert len(ix) == n
    assert ix.nbytes / n <= 40


def test_search_reports_a_live_line_that_no_longer_parses():
    ls = [line("m0", "c", content="alpha"), line("m1", "c", content="beta"),
          line("m2", "c", content="alpha beta")]
    data = bytearray(b"".join(ls))
    ix = _index.HotIndex()
    ix.attach(0, bytes(data), path="/state/seg-0")
    ix.ingest(0)
    assert ids(ix, ix.search(b"alpha")) == ["m0", "m2"]
    # break the field layout of the live line m1 (its checksum fails too)
    pos = len(ls[0]) + data[len(ls[0]):].index(b'"hlc"')
    data[pos + 1] = ord("X")
    ix.attach(0, bytes(data), path="/state/seg-0")
    with pytest.raises(CorruptStateCheckpointError) as ei:
        ix.search(b"beta")
    assert ei.value.offset == len(ls[0]) and ei.value.path == "/state/seg-0"
    # a damaged hit whose fields still parse is returned, and reading it is loud
    data2 = bytearray(b"".join(ls))
    data2[len(ls[0]) + len(ls[1]) + data2[len(ls[0]) + len(ls[1]):].index(b"alpha")] = ord("A")
    ix.attach(0, bytes(data2))
    hits = ix.search(b"beta")
    assert len(hits) == 2
    with pytest.raises(CorruptStateCheckpointError):
        ix.line(int(hits[1]))
    # a dead line that does not parse is not the index's business
    ix.attach(0, bytes(data))
    ix.remove(b"m1")
    assert ids(ix, ix.search(b"beta")) == ["m2"]


def test_find_many():
    ls = [line(f"m{i}", "c") for i in range(10)]
    ix, _, _ = build(ls)
    off = offsets(ls)
    assert ix.find_many([b"m3", b"zz", bytearray(b"m0")]).tolist() == [off[3], -1, off[0]]
    assert ix.find_many([]).tolist() == []
    with pytest.raises(FramingError):
        ix.find_many([3])


def test_find_many_matches_find_on_a_larger_index():
    ls = [line(f"m{i}", f"c{i % 9}", "", "" if i % 2 else f"{i:05d}") for i in range(3000)]
    ix, _, _ = build(ls)
    ix.remove_many([f"m{i}".encode() for i in range(0, 3000, 7)])
    keys = [f"m{i}".encode() for i in range(0, 3100, 3)]
    assert ix.find_many(keys).tolist() == [ix.find(k) for k in keys]


def test_append_bytes_indexes_without_a_remap():
    a = [line("m0", "c", content="mapped")]
    b = [line("m1", "c", hlc="0002", content="copied one"), line("m2", "c", "t", content="copied two")]
    c = [line("m3", "c", content="later"), tombstone("m0", "c")]
    ix = _index.HotIndex()
    ix.attach(0, b"".join(a), path="/state/seg-0")
    ix.ingest(0)
    base = len(a[0])
    with pytest.raises(FramingError, match="not its end"):
        ix.append_bytes(0, base + 1, b"".join(b))
    r = ix.append_bytes(0, base, b"".join(b))
    assert r.added.tolist() == [base, base + len(b[0])] and r.good_end == base + len(b[0]) + len(b[1])
    assert ids(ix, ix.channel_locs(b"c")) == ["m0", "m2", "m1"]
    assert isinstance(ix.line(base), bytes) and ix.line(base) == b[0][:-1]
    assert ids(ix, ix.search(b"copied")) == ["m2", "m1"]
    assert ids(ix, ix.search(b"copied", ch_key=b"c")) == ["m2", "m1"]
    assert ix.task_locs(b"t").tolist() == [base + len(b[0])]
    end = r.good_end
    r2 = ix.append_bytes(0, end, b"".join(c))
    assert r2.tombstones == [(b"m0", b"c")] and ix.find(b"m0") == -1
    # a remap that covers part of the copied bytes: the rest stays readable
    full = b"".join(a + b + c)
    ix.attach(0, full[:base + len(b[0])])
    assert ids(ix, ix.channel_locs(b"c")) == ["m2", "m3", "m1"]
    assert ix.seg_stats() == {0: (3, len(b[0]) + len(b[1]) + len(c[0]))}
    ix.attach(0, full)
    assert ids(ix, ix.channel_locs(b"c")) == ["m2", "m3", "m1"]
    assert isinstance(ix.line(base), memoryview)
    # a torn append is reported and not kept
    end = len(full)
    r3 = ix.append_bytes(0, end, c[0][:10])
    assert r3.torn_offset == end and r3.good_end == end
    r4 = ix.append_bytes(0, end, line("m4", "d"))
    assert r4.added.tolist() == [end]
    ix.detach(0)
    with pytest.raises(RuneError):
        ix.append_bytes(0, 0, b"")
    ix.attach(1, None)
    assert ix.append_bytes(1, 0, line("m5", "e")).added.tolist() == [1 << S]
    assert ix.find(b"m5") == 1 << S


def test_max_channel_len():
    assert _index.HotIndex().max_channel_len() == 0
    ix, _data, _rep = build([line(f"m{i}", "a" if i % 3 else "b") for i in range(10)])
    assert ix.max_channel_len() == ix.channel_len(b"a") == 6 and ix.channel_len(b"b") == 4
    for m in (b"m1", b"m2", b"m4"):
        ix.remove(m)
    assert ix.max_channel_len() == 4 == ix.channel_len(b"b")


def test_excess_len_counts_what_excess_gives():
    assert _index.HotIndex().excess_len(0) == 0
    ix, _data, _rep = build([line(f"m{i}", "abc"[i % 3] if i < 9 else "a") for i in range(20)])
    for w in range(0, 15):
        assert ix.excess_len(w) == len(ix.excess(w)), w
    assert ix.excess_len(2) == (14 - 2) + (3 - 2) + (3 - 2)
    with pytest.raises(FramingError, match="hot_window"):
        ix.excess_len(-1)


def assert_same_index(got, want, n_ids):
    """``got`` answers as ``want`` for channels a-c, tasks t0-t3 and ids m0..m{n_ids - 1}."""
    for ch in (b"a", b"b", b"c"):
        assert got.channel_locs(ch).tolist() == want.channel_locs(ch).tolist()
    for t in range(4):
        assert got.task_locs(f"t{t}".encode()).tolist() == want.task_locs(f"t{t}".encode()).tolist()
    for i in range(n_ids):
        assert got.find(key(f"m{i}")) == want.find(key(f"m{i}"))
    assert got.seg_stats() == want.seg_stats()


def test_snapshot_writes_live_entries_only(tmp_path):
    # the entries freed by removals are not written: the loaded index numbers
    # its live entries densely and answers every query as the saved one did
    import struct
    lines = [line(f"m{i}", "abc"[i % 3], f"t{i % 4}" if i % 2 else "",
                  f"{i:020d}" if i % 5 == 0 else "") for i in range(200)]
    ix, data, _rep = build(lines)
    for i in range(0, 200, 3):
        ix.remove(key(f"m{i}"))
    path = tmp_path / "s.snap"
    ix.save_snapshot(path, {0: len(data)})
    raw = path.read_bytes()
    n_entries, = struct.unpack_from("<I", raw, 36)
    n_live, = struct.unpack_from("<Q", raw, 56)
    # (and a sixteenth more spare entries after them: see the next test)
    assert n_live == len(ix) == 133 and n_entries == 133 + 133 // 16
    back, covered = _index.HotIndex.load_snapshot(path)
    back.attach(0, data)
    assert covered == {0: len(data)} and len(back) == len(ix)
    assert_same_index(back, ix, 200)
    # and it keeps working: removals and appends on the loaded index
    assert back.remove(key("m1")) >= 0 and back.find(key("m1")) == -1


def test_snapshot_spare_entries_keep_appends_in_the_map(tmp_path):
    # a snapshot holds a sixteenth more entries than are live, free: the
    # entries added after a load (a killed writer's tail lines, at the open)
    # use them where they lie instead of copying the arrays out of the map
    import struct
    lines = [line(f"m{i}", "abc"[i % 3], f"t{i % 4}" if i % 2 else "") for i in range(320)]
    ix, data, _rep = build(lines[:300])
    path = tmp_path / "s.snap"
    ix.save_snapshot(path, {0: len(data)})
    raw = path.read_bytes()
    n_entries, = struct.unpack_from("<I", raw, 36)
    assert n_entries == 300 + 18
    locs = struct.unpack_from(f"<{n_entries}q", raw, 64 + 16)
    assert all(x >= 0 for x in locs[:300]) and set(locs[300:]) == {-1}
    back, _ = _index.HotIndex.load_snapshot(path)
    assert back.in_map == {"entries", "lengths", "slots", "tasks"} and len(back) == 300
    back.attach(0, b"".join(lines))
    ends = offsets(lines) + [len(b"".join(lines))]
    back.ingest(0, ends[300], ends[318])            # 18 more: the spare ones
    assert {"entries", "lengths"} <= back.in_map and len(back) == 318
    back.ingest(0, ends[318], ends[320])            # then the arrays grow on the heap
    assert not {"entries", "lengths"} & back.in_map and len(back) == 320
    assert_same_index(back, build(lines)[0], 320)
    # saved again, the spare entries are not counted as messages
    back.save_snapshot(tmp_path / "again.snap", {0: ends[320]})
    again, _ = _index.HotIndex.load_snapshot(tmp_path / "again.snap")
    assert len(again) == 320 and struct.unpack_from("<I", (tmp_path / "again.snap").read_bytes(), 36) == (340,)


def _seq_line(msg_id: str, seq: int, channel: str = "c") -> bytes:
    """A message line with its append sequence, as the store writes it."""
    from _core_support import rest
    return _log.frame(rest(msg_id, channel)[:-1] + b',"s":%d}' % seq)


@pytest.mark.parametrize("order", [[0, 2, 1, 3], [0, 1, 1, 2], [0, 1, 2, 0]])
def test_ingest_stops_at_a_line_whose_sequence_does_not_rise(order):
    """Each line is sound, but a line moved or repeated breaks the append
    order the sequence records (and unstamped reads follow): damage, at the
    offset of the first line not above the one before; earlier lines indexed."""
    lines = [_seq_line(f"m{k}" if order.count(k) == 1 or order.index(k) == i else f"x{i}", k)
             for i, k in enumerate(order)]
    bad = next(i for i in range(1, len(order)) if order[i] <= max(order[:i]))
    ix, data, rep = build(lines)
    offs = offsets(lines)
    assert rep.damaged_offset == offs[bad] and rep.good_end == offs[bad] and rep.torn_offset == -1
    assert rep.damage.startswith("append sequence not above")
    assert len(rep.added) == bad and len(ix) == bad


def test_ingest_takes_rising_sequences_and_lines_without_one():
    lines = [_seq_line("a", 3), _seq_line("b", 7), line("c", "c"), _seq_line("d", 8),
             _seq_line("e", 12, channel="other")]
    ix, data, rep = build(lines)
    assert rep.damaged_offset == -1 and rep.good_end == len(data) and len(ix) == 5
    # the sequence is checked per ingest: a later region continues from any value
    ix2 = _index.HotIndex()
    more = [_seq_line("f", 1), _seq_line("g", 2)]
    ix2.attach(0, data + b"".join(more), path="/state/seg-0")
    assert ix2.ingest(0, 0, len(data)).good_end == len(data)
    assert ix2.ingest(0, len(data)).good_end == len(data) + len(b"".join(more))
