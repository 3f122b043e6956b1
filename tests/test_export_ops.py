"""export_ops at scale: the ops it makes (sync.bridge.export_ops_of) are
exactly those of SPEC section 7's formula, op_from_record_dict of each
record's dict, filtered by ``since`` and ordered by ``(hlc, op_id)``; and
the records it reads (every tier, straight from the bytes) are the stored
ones, deleted ones left out, damage named."""
from __future__ import annotations

import os
import weakref

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rune_fast import ConversationMessageRecord, ConversationStateRepository
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.sync import Hlc, as_op, op_from_record_dict, tombstone_op
from rune_fast.sync import bridge
from rune_fast.sync.bridge import export_ops_of


def _reference(records, tombstones, since):
    """export_ops as section 7 states it (the formula the store used to run)."""
    ops = [op_from_record_dict(r.to_dict(), lenient=True) for r in records] + list(tombstones)
    if since is not None:
        ops = [op for op in ops if as_op(op).hlc > since]
    ops.sort(key=lambda op: (as_op(op).hlc, as_op(op).op_id))
    return ops


def _same(got, want):
    assert got == want
    for a, b in zip(got, want):
        assert type(a) is type(b)
        assert list(a.payload.items()) == list(b.payload.items())     # the same keys in the same order
        assert type(a.hlc) is Hlc


_devices = st.sampled_from(["", "laptop", "phone", "z"])
_hlcs = st.one_of(
    st.just(""),
    st.builds(lambda w, c, d: str(Hlc(w, c, d)), st.integers(0, 10**13), st.integers(0, 3), _devices),
    st.sampled_from(["not an hlc", "000000000000001-0000000000-"]),     # kept, stamped from ts instead
)
_calls = st.lists(st.fixed_dictionaries({"id": st.text(min_size=1, max_size=3), "name": st.just("f"),
                                         "arguments": st.dictionaries(st.text(max_size=2), st.integers())}),
                  max_size=2)


@st.composite
def _records(draw):
    n = draw(st.integers(0, 12))
    out = []
    for i in range(n):
        out.append(ConversationMessageRecord(
            msg_id=f"m{draw(st.integers(0, 30))}-{i}", channel_id=draw(st.sampled_from(["a", "b"])),
            content=draw(st.text(max_size=5)), ts=draw(st.floats(-1e3, 1e13, allow_nan=False)),
            origin=draw(_devices), hlc=draw(_hlcs), tool_calls=draw(_calls),
            role=draw(st.sampled_from(["user", "assistant"]))))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records(), st.lists(st.tuples(st.sampled_from(["t1", "t2", "m3-0"]), _hlcs.filter(bool)), max_size=3),
       st.one_of(st.none(), st.builds(Hlc, st.integers(0, 10**13), st.integers(0, 3), _devices)))
def test_export_ops_of_is_the_formula_of_section_7(records, tombs, since):
    tombstones = []
    for mid, h in tombs:
        try:
            tombstones.append(tombstone_op(mid, h, "a"))
        except ValueError:
            pass        # (a malformed stamp makes no tombstone)
    want = _reference(records, tombstones, since)
    _same(export_ops_of(records, tombstones, since), want)
    given_up = list(records)
    _same(export_ops_of(given_up, tombstones, since, consume=True), want)
    assert given_up == []


class _Counted(ConversationMessageRecord):
    """A record a weak set can count (a subclass: it has a __weakref__)."""


def test_an_export_lets_each_record_go_as_its_op_is_made(monkeypatch):
    """With consume, the records of a whole store are freed a part at a time
    while the ops are built (no one C call freeing them all when the call
    returns, holding the GIL: an append beside a 1,000,000-message export
    waited 0.3 s for it); by the last op none of the others is alive."""
    recs = [_Counted(msg_id=f"m{i:05}", channel_id="c", content="x", ts=float(i)) for i in range(20_000)]
    alive = weakref.WeakSet(recs)
    seen = []
    make = bridge._record_op

    def noting(rec, hlc):
        seen.append(len(alive))
        return make(rec, hlc)

    monkeypatch.setattr(bridge, "_record_op", noting)
    ops = export_ops_of(recs, [], consume=True)
    assert recs == [] and len(ops) == 20_000 and [op.op_id for op in ops[:2]] == ["m00000", "m00001"]
    assert seen[0] == 20_000 and seen[-1] == 1      # (the one being made)
    del ops
    assert len(alive) == 0


def test_a_malformed_stamp_is_warned_about_as_before(caplog):
    bad = ConversationMessageRecord(msg_id="bad", channel_id="c", content="x", ts=2.0, hlc="not an hlc")
    with caplog.at_level("WARNING", logger="rune_fast.sync"):
        (op,) = export_ops_of([bad], [])
    assert op.hlc == Hlc(2000, 0, "") and "'bad'" in caplog.text


def _msg(i, **kw):
    return ConversationMessageRecord(msg_id=f"m{i:03d}", channel_id=f"c{i % 3}", content=f"message {i} ü",
                                     ts=1000.0 + i, **kw)


def test_a_store_exports_every_tier_and_leaves_deleted_messages_out(tmp_path):
    calls = [{"id": "call_1", "name": "f", "arguments": {"q": [1, 2]}}]
    mine = _msg(7, role="assistant", tool_calls=[{"id": "call_1", "name": "f", "arguments": {"q": [1, 2]}}])
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=4, durability="none") as repo:
        repo.append_many([_msg(i) for i in range(7)] + [mine] + [_msg(i) for i in range(8, 40)])
        repo.compact()                          # cooled: all but each channel's newest 4
        repo.append_many([_msg(i) for i in range(40, 50)])      # hot (the tail)
        mine.tool_calls[0]["arguments"]["q"] = "edited by the caller"   # the appended record's dicts
        repo.delete("m001")                     # archived, deleted, not erased yet
        repo.delete("m045")                     # in the tail
        tiers = {repo.get_message(f"m{i:03d}").tier for i in range(50) if i not in (1, 45)}
        assert tiers == {"cool", "hot", "tail"}
        live = [repo.get_message(f"m{i:03d}").record for i in range(50) if i not in (1, 45)]
        tombs = [tombstone_op(as_op(op).op_id, as_op(op).hlc, op.payload["conversation_id"])
                 for op in repo.export_ops() if op.payload.get("deleted")]
        assert sorted(t.op_id for t in tombs) == ["m001", "m045"]
        ops = repo.export_ops()
        _same(ops, _reference(live, tombs, None))
        assert next(op for op in ops if op.op_id == "m007").payload["tool_calls"] == calls
        since = ops[20].hlc
        _same(repo.export_ops(since=since), _reference(live, tombs, since))
        _same(repo.export_ops(since=str(since)), _reference(live, tombs, since))
        assert repo.export_ops(since=ops[-1].hlc) == []
        repo.compact()                          # erased; hot rows cooled
        _same(repo.export_ops(), _reference(live, tombs, None))


def test_an_export_names_a_damaged_hot_line(tmp_path):
    with ConversationStateRepository(tmp_path, compact_every=10**6, durability="none") as repo:
        repo.append_many([_msg(i) for i in range(5)])
        repo.flush()
        tail = os.path.join(tmp_path, "hot", "conversation_tail.jsonl")
        with open(tail, "r+b") as f:
            data = f.read()
            at = data.index(b"message 3")
            f.seek(at)
            f.write(b"M")
        with pytest.raises(CorruptStateCheckpointError, match="conversation_tail.jsonl"):
            repo.export_ops()


def _changes_reference(repo, ids):
    """The ops export_ops gives for ``ids`` (messages and tombstones)."""
    return [op for op in repo.export_ops() if op.op_id in ids]


def test_the_changes_since_a_cursor_are_the_ops_of_what_changed(tmp_path, monkeypatch):
    with ConversationStateRepository(tmp_path / "a", compact_every=10**6, hot_window=3,
                                     durability="none") as repo, \
            ConversationStateRepository(tmp_path / "b", durability="none") as other:
        repo.append_many([_msg(i) for i in range(30)])
        repo.compact()
        ops, cursor = repo._export_changes(None)            # the first time: every op
        _same(ops, repo.export_ops())
        again, same = repo._export_changes(cursor)
        assert again == [] and same == cursor
        # then: a cooled message deleted, new ones (one deleted again), a merge from another store
        repo.delete("m002")
        repo.append_many([_msg(i) for i in range(30, 36)])
        repo.delete("m033")
        other.append(ConversationMessageRecord(msg_id="from-b", channel_id="c0", content="merged", ts=5.0))
        repo.merge_ops(other.export_ops())
        repo.append(_msg(2))                                # a deleted id: refused, no envelope
        calls_rec = _msg(40, role="assistant", tool_calls=[{"id": "k", "name": "f", "arguments": {"a": 1}}])
        repo.append(calls_rec)
        calls_rec.tool_calls[0]["arguments"]["a"] = 2       # the caller's dicts, edited after the append
        monkeypatch.setattr(repo, "_live_snapshot", lambda *a: pytest.fail("a full read for a few changes"))
        ops, cursor2 = repo._export_changes(cursor)
        monkeypatch.undo()
        changed = {"m002", "m030", "m031", "m032", "m033", "m034", "m035", "from-b", "m040"}
        _same(ops, _changes_reference(repo, changed))
        assert {op.op_id for op in ops if op.payload.get("deleted")} == {"m002", "m033"}
        assert next(op for op in ops if op.op_id == "m040").payload["tool_calls"][0]["arguments"] == {"a": 1}
        repo.compact()                                      # cooled, erased: the cursor still holds
        assert repo._export_changes(cursor2)[0] == []
        repo.append(_msg(50))
        ops, cursor3 = repo._export_changes(cursor2)
        _same(ops, _changes_reference(repo, {"m050"}))
        # a cursor this event store cannot have made: every op again
        for bad in (("0:0", cursor3[1]), (cursor3[0], cursor3[1] + 1), (cursor3[0], cursor3[1] - 1)):
            ops, back = repo._export_changes(bad)
            _same(ops, repo.export_ops())
            assert back == cursor3
    with ConversationStateRepository(tmp_path / "a", durability="none") as repo:     # across a reopen
        assert repo._export_changes(cursor3) == ([], cursor3)


def test_deletes_of_archived_messages_read_no_row_group(tmp_path, monkeypatch):
    """delete() and clear_channel() find an archived message's channel
    through its verified record (or, for clear_channel, the channel it
    just read), not by decoding its whole row group into the cache (~2.7
    ms a message); the tombstones name the right channel."""
    from rune_fast.cool import CoolArchive
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=2, durability="none") as repo:
        repo.append_many([_msg(i) for i in range(60)])
        repo.compact()
        monkeypatch.setattr(CoolArchive, "get", lambda *a: pytest.fail("a row group decoded for a delete"))
        assert repo.get_message("m003").tier == "cool" and repo.get_message("m004").tier == "cool"
        assert repo.delete("m003") and not repo.delete("m003")
        assert repo.clear_channel("c1") == 20
        assert repo.window("c1", 50) == [] and [r.msg_id for r in repo.window("c0", 3)] == ["m051", "m054", "m057"]
        tombs = {op.op_id: op.payload["conversation_id"] for op in repo.export_ops() if op.payload.get("deleted")}
        assert tombs == {"m003": "c0", **{f"m{i:03d}": "c1" for i in range(1, 60, 3)}}
        repo.compact()
        assert repo.verify().ok


def test_channels_counts_archived_deletions_without_reading_rows(tmp_path, monkeypatch):
    """channels() with deletions of archived messages not erased yet: an
    archived-only channel stays listed while one of its messages is left,
    found from the tombstones' channels (it read every row of every such
    channel), and goes once all are deleted."""
    from rune_fast.cool import CoolArchive
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=0, durability="none") as repo:
        repo.append_many([_msg(i) for i in range(30)])
        repo.compact()                                      # every message archived
        assert repo.channels() == ["c0", "c1", "c2"]
        monkeypatch.setattr(CoolArchive, "channel_rows", lambda *a: pytest.fail("rows read for channels()"))
        repo.delete("m000")
        assert repo.channels() == ["c0", "c1", "c2"]
        assert repo.clear_channel("c1") == 10
        assert repo.channels() == ["c0", "c2"]
        for i in range(3, 30, 3):
            repo.delete(f"m{i:03d}")
        assert repo.channels() == ["c2"]
    with ConversationStateRepository(tmp_path, hot_window=0, compact_every=10**6) as repo:
        assert repo.channels() == ["c2"]                    # the deletions read again at open
        monkeypatch.undo()
        repo.compact()
        assert repo.channels() == ["c2"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(0, 5000), st.sampled_from(["user", "assistant", "system"]),
                          st.one_of(st.just(""), st.integers(0, 9000))), min_size=1, max_size=60),
       st.integers(1, 30), st.integers(0, 8), st.lists(st.integers(0, 59), max_size=4))
def test_resume_of_a_channel_out_of_fold_order_is_the_fold_of_its_ops(tmp_path_factory, msgs, n, hot, gone):
    """resume_messages(ch, n) of a channel whose store order disagrees with
    the fold order (timestamps out of order, stamped messages, system ones,
    archived and hot, deletions) is section 7's pipeline over its exported
    ops: the n newest turns chosen by the archived rows' stamps alone."""
    from rune_fast import sync
    d = tmp_path_factory.mktemp("resume")
    with ConversationStateRepository(d, compact_every=10**6, hot_window=hot, durability="none") as repo:
        for i, (ts, role, wall) in enumerate(msgs):
            repo.append(ConversationMessageRecord(
                msg_id=f"m{i:03d}", channel_id="c", role=role, content=f"turn {i}", ts=ts,
                hlc="" if wall == "" else str(Hlc(wall, 0, "dev"))))
            if i == len(msgs) // 2:
                repo.compact()
        repo.compact()
        for g in gone:
            repo.delete(f"m{g:03d}")
        for k in (n, 1):
            assert repo.resume_messages("c", k) == sync.resume_messages(repo.export_ops(), "c", k)


_since = st.one_of(st.builds(Hlc, st.integers(0, 10**13), st.integers(0, 3), _devices),
                   st.sampled_from([Hlc(1_000_000 + k, 0, "") for k in (0, 5, 9, 10, 29, 30)]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_records(), min_size=2, max_size=4), sinces=st.lists(_since, min_size=2, max_size=6),
       gone=st.sets(st.integers(0, 12), max_size=3))
def test_exports_since_a_stamp_skip_no_file_they_need(tmp_path_factory, batches, sinces, gone):
    """Later exports since a stamp skip the archive files an earlier one
    found stamped at or before it; each still gives every op stamped after
    its ``since`` (the filter of the whole export)."""
    state = tmp_path_factory.mktemp("s")
    with ConversationStateRepository(state, compact_every=10**6, hot_window=1, durability="none") as repo:
        k = 0
        for batch in batches:
            fresh = []
            for r in batch:
                d = r.to_dict()
                del d["schema_version"]
                d["msg_id"], d["ts"] = f"x{k}", 1000.0 + k if k % 3 else d["ts"]
                fresh.append(ConversationMessageRecord(**d))
                k += 1
            repo.append_many(fresh)
            repo.compact()                          # a file a batch (all but each channel's newest)
        for i in sorted(gone):
            repo.delete(f"x{i}")
        everything = repo.export_ops()
        for since in sinces:
            _same(repo.export_ops(since=since), [op for op in everything if as_op(op).hlc > since])


def test_an_export_since_the_newest_stamp_reads_no_archive_file(tmp_path, monkeypatch):
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=2, durability="none") as repo:
        for b in range(3):
            repo.append_many([_msg(b * 30 + i) for i in range(30)])
            repo.compact()
        assert len(repo._cool.files()) >= 3
        ops = repo.export_ops()
        newest = ops[-1].hlc
        mid = ops[len(ops) // 2].hlc
        _same(repo.export_ops(since=mid), [op for op in ops if op.hlc > mid])    # learns each file's newest
        read: list[int] = []
        real = repo._cool_read
        monkeypatch.setattr(repo, "_cool_read", lambda locs: read.extend({loc >> 32 for loc in locs}) or real(locs))
        assert repo.export_ops(since=newest) == []
        assert read == []
        _same(repo.export_ops(since=mid), [op for op in ops if op.hlc > mid])
        assert 0 < len(set(read)) < len(repo._cool.files())       # the older files not read
        repo.append_many([_msg(200 + i) for i in range(10)])
        repo.compact()                                            # a new file: read, it is not known
        got = repo.export_ops(since=newest)
        assert sorted(op.op_id for op in got) == sorted(f"m{200 + i:03d}" for i in range(10))


@settings(max_examples=200, deadline=None)
@given(keys=st.sets(st.tuples(st.sampled_from([0, 1, 7, 10**15 - 1]), st.sampled_from([0, 2, 10**10 - 1]),
                              st.sampled_from(["", "a", "b", "dev-é"]), st.text("mx0", max_size=3)),
                    max_size=120),
       floor=st.integers(0, 130))
def test_the_export_order_is_the_order_of_the_stamp_tuples(keys, floor):
    """export_ops_of's order (numpy on the two ints from _NUMPY_SORT_MIN
    ops on, then each run of equal ints by the whole tuples) is the
    tuples' order, ties of every length included."""
    from rune_fast.sync import bridge
    keys = list(keys)
    was = bridge._NUMPY_SORT_MIN
    bridge._NUMPY_SORT_MIN = floor
    try:
        got = bridge._key_order(keys)
    finally:
        bridge._NUMPY_SORT_MIN = was
    assert [keys[i] for i in got] == sorted(keys)


def test_merge_ops_appends_a_part_at_a_time_outside_the_lock(tmp_path, monkeypatch):
    """merge_ops reads and checks every op first (a bad one refuses the
    whole merge, nothing written), applies the tombstones, then appends the
    messages tuning.MERGE_PART at a time, the lock let go between parts: the
    count is of the messages new, whatever part a repeated one falls in."""
    from rune_fast._conv import tuning
    monkeypatch.setattr(tuning, "MERGE_PART", 3)
    with ConversationStateRepository(tmp_path / "a", hot_window=2) as a:
        a.append_many([_msg(i) for i in range(10)])
        a.delete("m004")
        ops = a.export_ops()
    with ConversationStateRepository(tmp_path / "b", hot_window=2) as b:
        b.append(_msg(7))
        bad = ops[:5] + [as_op({"op_id": "x", "hlc": str(ops[0].hlc), "payload": {"deleted": False,
                                                                                  "conversation_id": 5}})]
        with pytest.raises(ValueError, match="'x'"):
            b.merge_ops(bad)
        assert len(b) == 1 and b.export_ops()[0].op_id == "m007"
        parts = []
        real = b.append_many

        def part(msgs):
            assert not b._lock._is_owned()              # the lock let go between parts
            parts.append(len(msgs))
            return real(msgs)
        monkeypatch.setattr(b, "append_many", part)
        assert b.merge_ops(ops + ops[:4]) == 8          # 9 stored in a, m007 already here
        n = sum(1 for op in ops + ops[:4] if not op.payload.get("deleted"))
        assert parts == [3] * (n // 3) + ([n % 3] if n % 3 else []) and n > 9
        assert len(b) == 9 and b.get_message("m004").record is None
        assert [op.op_id for op in b.export_ops()] == [op.op_id for op in ops]
