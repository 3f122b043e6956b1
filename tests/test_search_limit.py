"""A search with a limit finds its hits as locations and decodes only what
it returns: the hot tier is walked from the newest message of every channel
(rune_fast._index.NewestWalk), or, for a rare needle, scanned and its hits
put in order from their lines' bytes (order_sort); the cool tier joins
when one of its rows may sort after those hits. Checked here: the newest k
hits are exactly the last k of the whole answer over random stores (hot,
tail and cool tiers, stamped and unstamped messages, late stamps that sort
before cooled rows, deletions, several channels), and a limited search of
a needle in every message decodes O(limit) records."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import codec
from rune_fast._conv import tuning
from rune_fast._index import WALK_BUDGET, WALK_DONE, WALK_MORE, NewestWalk, order_sort
from rune_fast._order import order_key
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord

WORDS = ("error", "Error", "ERROR", "straße", "STRASSE", "strasse", "Zürich", "zürich", "ZÜRICH",
         "東京", "the", "The", "\u212aelvin", "kelvin", "naïve", "café", "x", "a\"b", "tab\tstop",
         "Zürcher", "東西", "süß", "ﬁle", "ǅ")
NEEDLES = ("error", "strasse", "straße", "zürich", "東京", "the", "kelvin", "K", "ss", "é", "a\"b", "",
           "nothing-here", "\t", "SÜSS", "fi", "dž", "ΐ")


def _hlc(wall: int, counter: int = 0) -> str:
    return "%015d-%010d-%s" % (wall, counter, "dev")


@st.composite
def _ops(draw):
    n = draw(st.integers(5, 60))
    ops = []
    for i in range(n):
        kind = draw(st.sampled_from(["m", "m", "m", "m", "d", "c"]))
        if kind == "m":
            words = draw(st.lists(st.sampled_from(WORDS), min_size=0, max_size=4))
            stamped = draw(st.booleans())
            ops.append(("m", draw(st.integers(0, 2)), " ".join(words),
                        _hlc(draw(st.integers(1, 50)), i) if stamped else ""))
        else:
            ops.append((kind, draw(st.integers(0, 10_000)), "", ""))
    return ops


def _message(i, a, content, hlc):
    return ConversationMessageRecord(msg_id=f"m{i:04d}", channel_id=f"ch{a}", content=content,
                                     ts=1.0 + i, hlc=hlc)


def _run(repo, ops, make=_message):
    """Apply ops (kind, channel, content, hlc, *more: ``make``'s further
    arguments); the model: live message id -> (record, append sequence)."""
    model: dict[str, tuple[ConversationMessageRecord, int]] = {}
    seq = 0
    for i, (kind, a, content, hlc, *more) in enumerate(ops):
        if kind == "m":
            m = make(i, a, content, hlc, *more)
            assert repo.append(m)
            model[m.msg_id] = (m, seq)
            seq += 1
        elif kind == "d" and model:
            victim = sorted(model)[a % len(model)]
            assert repo.delete(victim)
            del model[victim]
        elif kind == "c":
            repo.compact()
    return model


def _model_search(model, needle, channel_id=None, case_sensitive=False):
    if case_sensitive:
        def hit(c): return needle in c
    else:
        folded = needle.casefold()
        def hit(c): return folded in c.casefold()
    got = [(order_key(r.hlc, r.msg_id, s), r.msg_id) for r, s in model.values()
           if hit(r.content) and (channel_id is None or r.channel_id == channel_id)]
    return [mid for _k, mid in sorted(got)]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=_ops(), walk=st.sampled_from([(0, 0), (1, 3), (256, 4096)]), data=st.data())
def test_limited_search_is_the_tail_of_the_full_answer(tmp_path_factory, ops, walk, data):
    root = tmp_path_factory.mktemp("lim")
    saved = tuning.SEARCH_WALK_PROBE, tuning.SEARCH_WALK_LINES
    tuning.SEARCH_WALK_PROBE, tuning.SEARCH_WALK_LINES = walk
    try:
        with ConversationStateRepository(root, hot_window=2, compact_every=10_000, durability="none") as repo:
            model = _run(repo, ops)
            for needle in data.draw(st.lists(st.sampled_from(NEEDLES), min_size=1, max_size=4)):
                cs = data.draw(st.booleans())
                channel = data.draw(st.sampled_from([None, "ch0", "ch1", "ch2", "ch9"]))
                full = repo.search(needle, channel, case_sensitive=cs)
                want = _model_search(model, needle, channel, cs)
                assert [h.record.msg_id for h in full] == want
                for k in sorted({1, 2, 3, 5, len(full), len(full) + 1, data.draw(st.integers(1, 70))}):
                    part = repo.search(needle, channel, limit=k, case_sensitive=cs)
                    assert [(h.record, h.tier) for h in part] == [(h.record, h.tier) for h in full[-k:]], \
                        (needle, channel, cs, k)
    finally:
        tuning.SEARCH_WALK_PROBE, tuning.SEARCH_WALK_LINES = saved


def test_late_stamp_in_the_hot_tier_joins_the_cool_rows(tmp_path):
    """A message stamped before the cool rows of its channel (sync can bring
    one) sorts among them: the cool tier must be read although the hot tier
    alone holds `limit` hits."""
    with ConversationStateRepository(tmp_path, hot_window=2, compact_every=10_000) as repo:
        for i in range(6):
            repo.append(ConversationMessageRecord(msg_id=f"m{i}", channel_id="c", content="hit",
                                                  hlc=_hlc(100 + i)))
        repo.compact()                            # m0..m3 cool
        repo.append(ConversationMessageRecord(msg_id="late", channel_id="c", content="hit", hlc=_hlc(50)))
        full = [h.record.msg_id for h in repo.search("hit")]
        assert full == ["late", "m0", "m1", "m2", "m3", "m4", "m5"]
        assert [h.record.msg_id for h in repo.search("hit", limit=3)] == ["m3", "m4", "m5"]
        assert [h.tier for h in repo.search("hit", limit=3)] == ["cool", "hot", "hot"]
        for k in range(1, 9):
            assert [h.record.msg_id for h in repo.search("hit", limit=k)] == full[-k:]


def _decodes(monkeypatch):
    """Count the records built from hot lines and cool rows."""
    calls = {"hot": 0, "cool": 0}
    hot = codec.record_from_line
    monkeypatch.setattr(codec, "record_from_line", lambda *a, **k: (calls.__setitem__("hot", calls["hot"] + 1),
                                                                      hot(*a, **k))[1])
    from rune_fast._conv import reads

    def compiled(line, _decode=reads.canonical_record):
        got = _decode(line)
        calls["hot"] += got is not None         # (None: the Python path decodes it, counted there)
        return got
    monkeypatch.setattr(reads, "canonical_record", compiled)
    from rune_fast._conv.reads import HotReads
    cool = HotReads._cool_record
    monkeypatch.setattr(HotReads, "_cool_record",
                        staticmethod(lambda row: (calls.__setitem__("cool", calls["cool"] + 1), cool(row))[1]))
    return calls


@pytest.mark.parametrize("needle", ["error", "ERROR", "straße", "zürich", "ss", "", "東"])
def test_limited_search_decodes_only_what_it_returns(tmp_path, monkeypatch, needle):
    rng = random.Random(7)
    msgs = [ConversationMessageRecord(msg_id=f"m{i:05d}", channel_id=f"c{rng.randrange(5)}",
                                      content=f"{rng.random():.6f} Error at Straße in Zürich 東京 #{i}")
            for i in range(3000)]
    with ConversationStateRepository(tmp_path, hot_window=400, compact_every=100_000,
                                     durability="none") as repo:
        repo.append_many(msgs)
        repo.compact()                            # 1,000 cool, 2,000 hot
    with ConversationStateRepository(tmp_path, hot_window=400, compact_every=100_000,
                                     durability="none") as repo:
        calls = _decodes(monkeypatch)
        got = repo.search(needle, limit=20)
        assert [h.record.msg_id for h in got] == [m.msg_id for m in msgs[-20:]]
        assert calls["hot"] <= 20 and calls["cool"] == 0, calls
        calls["hot"] = 0
        got = repo.search(needle, "c3", limit=7)
        assert [h.record.msg_id for h in got] == [m.msg_id for m in msgs if m.channel_id == "c3"][-7:]
        assert calls["hot"] <= 7 and calls["cool"] == 0, calls


def test_rare_needle_decodes_only_its_hits(tmp_path, monkeypatch):
    """A needle the walk does not meet is scanned for: still only its hits decoded."""
    msgs = [ConversationMessageRecord(msg_id=f"m{i:05d}", channel_id=f"c{i % 3}",
                                      content=("Rare Needle" if i in (5, 1500, 2999) else "plain text") + f" {i}")
            for i in range(3000)]
    with ConversationStateRepository(tmp_path, compact_every=100_000, durability="none") as repo:
        repo.append_many(msgs)
    with ConversationStateRepository(tmp_path, compact_every=100_000, durability="none") as repo:
        calls = _decodes(monkeypatch)
        got = repo.search("rare needle", limit=2)
        assert [h.record.msg_id for h in got] == ["m01500", "m02999"]
        assert calls["hot"] == 2, calls


def test_walk_and_order_sort_agree(tmp_path):
    """NewestWalk gives the hits newest first; order_sort sorts a scan's
    hits oldest first: the same order, read from the lines' bytes."""
    rng = random.Random(3)
    with ConversationStateRepository(tmp_path, compact_every=100_000, durability="none") as repo:
        for i in range(400):
            hlc = _hlc(rng.randrange(1000), i) if rng.random() < 0.5 else ""
            repo.append(ConversationMessageRecord(msg_id=f"m{rng.randrange(10**6):06d}-{i}",
                                                  channel_id=f"c{rng.randrange(4)}",
                                                  content=rng.choice(["hit", "miss"]), hlc=hlc))
        ix = repo._index
        walk = NewestWalk(ix, b"hit", False, (), False, None, -1)
        newest = []
        while True:
            locs, exact, state = walk.next(7)
            assert exact.all()
            newest += locs.tolist()
            if state != WALK_MORE:
                break
        assert state == WALK_DONE
        scanned = ix.search(b"hit", False, False)
        assert sorted(newest) == sorted(scanned.tolist())
        assert order_sort(ix, scanned).tolist() == newest[::-1]
        assert [h.record for h in repo.search("hit", case_sensitive=True)] == \
            [repo._read_loc(loc) for loc in newest[::-1]]
        short = NewestWalk(ix, b"hit", False, (), False, None, 3)
        locs, _exact, state = short.next(100)
        assert state == WALK_BUDGET and short.visited == 3


def test_cool_hits_are_read_only_when_returned(tmp_path, monkeypatch):
    """Hits the hot tier lacks come from the cool tier as row locations with
    their order keys: only the rows returned are read and built."""
    msgs = [ConversationMessageRecord(msg_id=f"m{i:05d}", channel_id=f"c{i % 4}",
                                      content=("old hit " if i < 2000 else "new line ") + str(i))
            for i in range(2400)]
    with ConversationStateRepository(tmp_path, hot_window=100, compact_every=100_000,
                                     durability="none") as repo:
        repo.append_many(msgs)
        repo.compact()                            # 2,000 cool: every hit
        repo.delete("m01999")
    with ConversationStateRepository(tmp_path, hot_window=100, compact_every=100_000,
                                     durability="none") as repo:
        full = repo.search("OLD HIT")
        assert len(full) == 1999 and {h.tier for h in full} == {"cool"}
    with ConversationStateRepository(tmp_path, hot_window=100, compact_every=100_000,
                                     durability="none") as repo:
        calls = _decodes(monkeypatch)
        got = repo.search("OLD HIT", limit=15)
        assert [(h.record, h.tier) for h in got] == [(h.record, h.tier) for h in full[-15:]]
        assert calls["cool"] <= 15 and calls["hot"] == 0, calls
        got = repo.search("old hit", "c2", limit=4)
        assert [h.record.msg_id for h in got] == [h.record.msg_id for h in full if h.record.channel_id == "c2"][-4:]
        got = repo.search("hit 19", case_sensitive=True, limit=3)
        assert [h.record.msg_id for h in got] == ["m01996", "m01997", "m01998"]


def test_walk_stops_where_append_sequences_are_out_of_order():
    """Lines written before the append sequence existed have none (-1, the
    oldest): a channel whose unstamped lines then are not in sequence order
    cannot be walked; the walk says so, and order_sort orders them."""
    from _core_support import rest
    from rune_fast import _index, _log

    def seq_line(mid, ch, seq, hlc=""):
        r = rest(mid, ch, hlc=hlc, content="hit")
        return _log.frame(r if seq is None else r[:-1] + b',"s":%d}' % seq)
    data = b"".join([seq_line("a", "c0", 5), seq_line("b", "c1", None), seq_line("c", "c0", None),
                     seq_line("d", "c1", 9), seq_line("e", "c0", None, hlc="h1")])
    ix = _index.HotIndex()
    ix.attach(0, data)
    ix.ingest(0)
    offs = [data.index(b'"msg_id":"' + m.encode() + b'"') for m in "abcde"]
    loc = {m: data.rfind(b"\n", 0, o) + 1 for m, o in zip("abcde", offs)}
    walk = NewestWalk(ix, b"hit", False, (), False, None, -1)
    seen = []
    while True:
        locs, _exact, state = walk.next(1)
        seen += locs.tolist()
        if state != WALK_MORE:
            break
    assert state == _index.WALK_UNORDERED
    assert seen[:2] == [loc["e"], loc["d"]]
    by_loc = {v: k for k, v in loc.items()}
    # (ties of -1: the search's list order, channel by channel)
    assert [by_loc[x] for x in order_sort(ix, ix.search(b"hit", False, False)).tolist()] == \
        ["c", "b", "a", "d", "e"]


@pytest.mark.parametrize("which", ["newest", "oldest"])
def test_walk_checks_every_line_it_reaches(tmp_path, which):
    """A limited search checks each line it reaches: a damaged one among
    them raises, naming the file and offset; one it never reaches (older
    than every hit it returns) is left to the full search and verify()."""
    from rune_fast.errors import CorruptStateCheckpointError
    msgs = [ConversationMessageRecord(msg_id=f"m{i:04d}", channel_id=f"c{i % 2}", content=f"hit {i}")
            for i in range(200)]
    with ConversationStateRepository(tmp_path, compact_every=100_000, durability="none") as repo:
        repo.append_many(msgs)
        repo.compact()
    victim = msgs[-1 if which == "newest" else 0].msg_id.encode()
    for path in (tmp_path / "hot").glob("conversation_*.jsonl"):
        data = bytearray(path.read_bytes())
        at = data.find(b'"msg_id":"' + victim + b'"')
        if at >= 0:
            start = data.rfind(b"\n", 0, at) + 1
            hit = data.index(b"hit ", at)
            data[hit + 1] = ord("o")           # "hot": still parses, fails its checksum
            path.write_bytes(bytes(data))
            break
    else:
        raise AssertionError("victim line not found")
    with ConversationStateRepository(tmp_path, compact_every=100_000, durability="none") as repo:
        if which == "newest":
            with pytest.raises(CorruptStateCheckpointError) as err:
                repo.search("hit", limit=5)
            assert err.value.offset == start and str(path.name) in str(err.value)
        else:
            assert [h.record.msg_id for h in repo.search("hit", limit=5)] == [m.msg_id for m in msgs[-5:]]
            with pytest.raises(CorruptStateCheckpointError):
                repo.search("hit")


def test_limited_search_skips_archived_groups_older_than_its_hits(tmp_path, monkeypatch):
    """With ``limit`` unstamped hot hits in hand and no stamped row in the
    archive, the row groups whose rows are all older than the oldest of them
    (by their ``ord`` statistics) are not searched; the answer is the full
    search's newest ``limit``, also when a quiet channel's archived rows are
    newer than a busy channel's hot hits."""
    from rune_fast.cool.archive import CoolArchive
    msgs = []
    for i in range(5000):
        ch = "quiet" if i % 50 == 0 else "busy"
        hit = i % 97 == 0 or (ch == "quiet" and i > 4000)
        msgs.append(ConversationMessageRecord(msg_id=f"m{i:05d}", channel_id=ch,
                                              content=("a needle " if hit else "hay ") + str(i)))
    with ConversationStateRepository(tmp_path, hot_window=20, compact_every=100_000, durability="none") as repo:
        repo.append_many(msgs)
        repo.compact()
    searched: list[int] = []
    real = CoolArchive._start_scans

    def spy(self, no, rgs, *a, **k):
        searched.extend(rgs)
        return real(self, no, rgs, *a, **k)
    monkeypatch.setattr(CoolArchive, "_start_scans", spy)
    with ConversationStateRepository(tmp_path, hot_window=20, compact_every=100_000, durability="none") as repo:
        full = repo.search("NEEDLE")
        every = len(searched)
        for limit in (1, 3, 10, 60):
            searched.clear()
            got = repo.search("needle", limit=limit)
            assert [h.record.msg_id for h in got] == [h.record.msg_id for h in full[-limit:]], limit
        searched.clear()
        assert [h.record.msg_id for h in repo.search("needle", limit=3)] == [h.record.msg_id for h in full[-3:]]
        assert len(searched) < every, (searched, every)


def test_a_full_search_keeps_only_its_newest_hits_decoded(tmp_path, monkeypatch):
    """An unlimited search of a needle in more messages than the decode
    cache holds keeps the records of its newest SEARCH_KEEP_HITS hits (it
    used to put every hit in, leaving the cache its oldest): the windows'
    records and the next limited search's hits are still there."""
    monkeypatch.setattr(tuning, "DECODE_CACHE", 64)
    monkeypatch.setattr(tuning, "SEARCH_KEEP_HITS", 16)
    msgs = [ConversationMessageRecord(msg_id=f"m{i:04d}", channel_id="c", content=f"an error #{i}")
            for i in range(300)]
    with ConversationStateRepository(tmp_path, hot_window=1000, compact_every=100_000,
                                     durability="none") as repo:
        repo.append_many(msgs)
        repo.compact()
    with ConversationStateRepository(tmp_path, hot_window=1000, compact_every=100_000,
                                     durability="none") as repo:
        assert [r.msg_id for r in repo.window("c", 8)] == [m.msg_id for m in msgs[-8:]]
        assert [h.record.msg_id for h in repo.search("ERROR")] == [m.msg_id for m in msgs]
        calls = _decodes(monkeypatch)
        assert [r.msg_id for r in repo.window("c", 8)] == [m.msg_id for m in msgs[-8:]]
        assert [h.record.msg_id for h in repo.search("error", limit=10)] == [m.msg_id for m in msgs[-10:]]
        assert calls["hot"] == 0
        assert [h.record.msg_id for h in repo.search("ERROR")] == [m.msg_id for m in msgs]   # again, whole


def test_max_ord_answers_for_the_live_file_set(tmp_path):
    """max_ord keeps its answers for the archive's live file set: a cooling
    that adds a file, or a merge that replaces files, is seen at once."""
    with ConversationStateRepository(tmp_path, hot_window=20, compact_every=100_000,
                                     durability="none") as repo:
        cool = repo._cool
        tops = []
        for round_ in range(3):
            repo.append_many([ConversationMessageRecord(msg_id=f"m{round_}-{i:03d}", channel_id=f"c{i % 2}",
                                                        content=f"x {i}") for i in range(100)])
            repo.compact()
            for ch in (None, "c0", "c1", "nope"):
                got = cool.max_ord(ch)
                assert got == cool._max_ord(cool._files, ch)        # computed afresh
                assert cool.max_ord(ch) == got
            tops.append(cool.max_ord())
        assert tops == sorted(tops) and len(set(tops)) == 3
        before = tuple(cool._files)
        cool.merge(fanout=2)
        assert tuple(cool._files) != before
        assert cool.max_ord() == cool._max_ord(cool._files, None) == tops[-1]
        for ch in ("c0", "c1"):
            assert cool.max_ord(ch) == cool._max_ord(cool._files, ch)
