"""LastN retention, compaction and the incremental SyncState: retention over a
compacted state equals retention over a fresh fold, byte for byte."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast.sync import (
    Hlc, LastN, OpRecord, SyncState, canonical_json, compact, fold, repair,
    resume_messages, tombstone_op, transcript_hash,
)


def P(role, content, conv="c"):
    return {"conversation_id": conv, "role": role, "content": content, "tool_calls": [],
            "tool_use_id": "", "timestamp": 0}


def ops_n(n, conv="c"):
    return [OpRecord(f"m{i:04d}", Hlc(i // 2, i % 2, "ab"[i % 2]),
                     P("user" if i % 2 == 0 else "assistant", f"t{i}", conv)) for i in range(n)]


def test_lastn_keeps_newest_n_oldest_first():
    ts = fold(ops_n(10), "c")
    assert LastN(3).apply(ts) == ts[-3:]
    assert LastN(3)(ts) == ts[-3:]
    assert LastN(3)(list(reversed(ts))) == ts[-3:]
    assert LastN(100)(ts) == ts
    assert LastN(0)(ts) == []
    assert LastN(0)([]) == [] and LastN(2)([]) == []


def test_lastn_rejects_bad_n():
    with pytest.raises(ValueError):
        LastN(-1)
    with pytest.raises(TypeError):
        LastN(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        LastN(True)  # type: ignore[arg-type]


def test_lastn_value_semantics():
    assert LastN(3) == LastN(3) != LastN(4)
    assert hash(LastN(3)) == hash(LastN(3))
    assert repr(LastN(3)) == "LastN(3)"


def test_lastn_ties_broken_by_op_id():
    ts = fold([("b", Hlc(1, 0, "a"), P("user", "x")), ("a", Hlc(1, 0, "a"), P("user", "y"))], "c")
    assert [t.op_id for t in LastN(1)(ts)] == ["b"]


def test_compact_is_retention_of_the_fold():
    ops = ops_n(20)
    assert compact(ops, LastN(5), "c") == fold(ops, "c")[-5:]
    assert compact(ops, None, "c") == fold(ops, "c")


def test_window_cutting_a_tool_exchange_still_resumes_validly():
    call = {"id": "k1", "name": "f", "arguments": {}}
    ops = [("m1", Hlc(1, 0, "a"), P("user", "q")),
           ("m2", Hlc(2, 0, "a"), {**P("assistant", ""), "tool_calls": [call]}),
           ("m3", Hlc(3, 0, "a"), {**P("tool", "r"), "tool_use_id": "k1"}),
           ("m4", Hlc(4, 0, "a"), P("assistant", "done"))]
    assert resume_messages(ops, "c", 2) == [{"role": "assistant", "content": "done",
                                              "tool_calls": []}]
    assert resume_messages(ops, "c", 3)[0]["role"] == "assistant"
    assert resume_messages(ops, "c") == repair(fold(ops, "c"))
    assert resume_messages(ops, "c", 0) == []


@st.composite
def op_lists(draw):
    n = draw(st.integers(0, 40))
    ops = []
    for i in range(n):
        ops.append(OpRecord(f"m{i:03d}", Hlc(draw(st.integers(0, 15)), draw(st.integers(0, 2)),
                                             draw(st.sampled_from("ab"))),
                            P(draw(st.sampled_from(["user", "assistant", "system"])),
                              draw(st.sampled_from(["a", "b", "a"])),
                              draw(st.sampled_from(["c", "c", "d"])))))
    return ops


def _same(x, y):
    assert canonical_json(x) == canonical_json(y)
    assert transcript_hash(x) == transcript_hash(y)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op_lists(), st.integers(0, 12), st.integers(0, 12), st.randoms(use_true_random=False))
def test_lastn_over_compacted_state_equals_lastn_over_fresh_fold(ops, n, extra, rng):
    m = n + extra
    fresh = LastN(n)(fold(ops, "c"))
    # one-shot compaction
    _same(LastN(n)(compact(ops, LastN(m), "c")), fresh)
    # compaction in rounds: each round folds the compacted turns (as ops) with new ops
    shuffled = list(ops)
    rng.shuffle(shuffled)
    state = []
    cut = sorted(rng.randint(0, len(shuffled)) for _ in range(3))
    bounds = [0, *cut, len(shuffled)]
    for a, b in zip(bounds, bounds[1:]):
        state = compact([t.to_op() for t in state] + shuffled[a:b], LastN(m), "c")
    _same(LastN(n)(state), fresh)
    # the incremental state, fed in the same rounds, with resends
    s = SyncState("c", LastN(m))
    for a, b in zip(bounds, bounds[1:]):
        s.merge(shuffled[a:b] + shuffled[:a][:2])
    _same(LastN(n)(s.turns()), fresh)
    _same(repair(LastN(n)(s.turns())), repair(fresh))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op_lists(), st.integers(0, 10), st.randoms(use_true_random=False))
def test_sync_state_with_deletes_keeps_the_documented_margin(ops, n, rng):
    targets = [o.op_id for o in ops if rng.random() < 0.3]
    tombs = [tombstone_op(t, Hlc(99, 0, "z"), "c") for t in targets]
    allops = ops + tombs
    rng.shuffle(allops)
    m = n + len(tombs)
    s = SyncState("c", LastN(m))
    for i in range(0, len(allops), 5):
        s.merge(allops[i:i + 5])
    _same(LastN(n)(s.turns()), LastN(n)(fold(allops, "c")))
    assert not {t.op_id for t in s.turns()} & set(targets)


def test_sync_state_trimmed_turn_cannot_come_back():
    ops = ops_n(10)
    s = SyncState("c", LastN(3))
    assert s.merge(ops) == 10
    assert [t.op_id for t in s.turns()] == ["m0007", "m0008", "m0009"]
    # a resent op, and a re-versioned one with a newer stamp, of a trimmed turn
    assert s.merge([ops[0], OpRecord("m0001", Hlc(50, 0, "a"), P("user", "again"))]) == 0
    assert [t.op_id for t in s.turns()] == ["m0007", "m0008", "m0009"]
    assert s.turns() == LastN(3)(fold(ops + [OpRecord("m0001", Hlc(50, 0, "a"),
                                                      P("user", "again"))], "c"))


def test_sync_state_without_retention_is_the_fold():
    ops = ops_n(12)
    s = SyncState("c")
    s.merge(ops[6:])
    s.merge(ops[:6] + [tombstone_op("m0003", Hlc(1, 0, "z"), "c")])
    assert s.turns() == fold(ops + [tombstone_op("m0003", Hlc(1, 0, "z"), "c")], "c")


def test_sync_state_is_thread_safe():
    import threading
    ops = ops_n(400)
    s = SyncState("c", LastN(50))
    chunks = [ops[k::4] for k in range(4)]
    threads = [threading.Thread(target=lambda c=c: [s.merge(c[i:i + 7]) for i in range(0, 100, 7)])
               for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.turns() == LastN(50)(fold(ops, "c"))
