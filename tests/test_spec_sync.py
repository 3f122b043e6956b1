"""SPEC section 7: HLC, fold, repair, renderers, retention, store exchange (black-box)."""
from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping

import pytest
from hypothesis import given, settings, strategies as st

from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.records import ConversationMessageRecord
from rune_fast.sync import (
    DEFAULT_CONVERSATION,
    Hlc,
    HlcClock,
    LastN,
    Turn,
    fold,
    op_from_record_dict,
    repair,
    to_anthropic,
    to_openai,
)

from spec_helpers import msg


# ------------------------------------------------------------------ helpers

def _role(r):
    return getattr(r, "value", r)


def payload(conv, role, content, tool_calls=(), tool_use_id="", ts=0.0):
    return {"conversation_id": conv, "role": role, "content": content, "tool_calls": list(tool_calls),
            "tool_use_id": tool_use_id, "timestamp": ts}


def op(op_id, hlc, pl, form="tuple"):
    if form == "tuple":
        return (op_id, hlc, pl)
    if form == "mapping":
        return {"op_id": op_id, "hlc": hlc, "payload": pl}
    if form == "str":
        return (op_id, str(hlc), pl)
    if form == "oprecord":
        from rune_fast.sync import OpRecord

        return OpRecord(op_id, hlc, pl)
    raise AssertionError(form)


def call(cid, name="lookup", arguments=None):
    return {"id": cid, "name": name, "arguments": arguments if arguments is not None else {"q": cid}}


def turns_of(*specs, conv="c"):
    """Build turns (in the given order) from (role, content[, tool_calls[, tool_use_id]]) specs."""
    ops = []
    for i, s in enumerate(specs):
        role, content = s[0], s[1]
        calls = s[2] if len(s) > 2 else ()
        use = s[3] if len(s) > 3 else ""
        ops.append(op(f"op{i:04d}", Hlc(1000 + i, 0, "dev"), payload(conv, role, content, calls, use, ts=i)))
    ts = fold(ops, conv)
    assert len(ts) == len(specs)
    return ts


def op_parts(o):
    """(op_id, hlc string, payload) of an exported op, whatever its form."""
    if isinstance(o, Mapping):
        return o["op_id"], str(o["hlc"]), o["payload"]
    if hasattr(o, "op_id"):
        return o.op_id, str(o.hlc), o.payload
    op_id, hlc, pl = o
    return op_id, str(hlc), pl


def _plain(x):
    return json.loads(json.dumps(x))


def transcript_bytes(ts):
    return json.dumps([[t.op_id, str(t.hlc), t.to_message()] for t in ts], sort_keys=True).encode()


# ------------------------------------------------------------------ Hlc

def test_hlc_str_format_and_parse():
    h = Hlc(1700000000123, 7, "devA")
    assert str(h) == "001700000000123-0000000007-devA"
    assert str(h) == "%015d-%010d-%s" % (1700000000123, 7, "devA")
    assert Hlc.parse(str(h)) == h
    assert Hlc.parse("000000000000005-0000000003-dev") == Hlc(5, 3, "dev")


def test_hlc_parse_device_with_dashes():
    h = Hlc(42, 1, "laptop-2-main")
    assert Hlc.parse(str(h)) == h


def test_hlc_order():
    assert Hlc(1, 0, "a") < Hlc(1, 1, "a") < Hlc(2, 0, "a")
    assert Hlc(1, 5, "a") < Hlc(1, 5, "b")
    assert Hlc(2, 0, "a") > Hlc(1, 99, "z")
    assert Hlc(3, 3, "x") == Hlc(3, 3, "x")
    assert not (Hlc(3, 3, "x") < Hlc(3, 3, "x"))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**15 - 1), st.integers(0, 10**10 - 1),
                          st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=6)),
                min_size=2, max_size=10))
def test_hlc_str_sorts_like_tuple(items):
    hs = [Hlc(*t) for t in items]
    by_tuple = sorted(hs, key=lambda h: (h.wall_ms, h.counter, h.device_id))
    assert [str(h) for h in sorted(hs)] == [str(h) for h in by_tuple]
    assert sorted(str(h) for h in hs) == [str(h) for h in by_tuple]
    for h in hs:
        assert Hlc.parse(str(h)) == h


def test_hlc_clock_monotonic():
    c = HlcClock("devX")
    prev = c.now()
    assert prev.device_id == "devX"
    assert abs(prev.wall_ms - time.time() * 1000) < 60_000
    for _ in range(2000):
        n = c.now()
        assert n > prev
        prev = n


def test_hlc_clock_after_observed():
    c = HlcClock("devX")
    future = Hlc(int(time.time() * 1000) + 10_000_000, 17, "devY")
    c.observe(future)
    n = c.now()
    assert n > future
    assert n.device_id == "devX"
    # observing something older does not move the clock backwards
    c.observe(Hlc(1, 0, "old"))
    assert c.now() > n
    same_wall = Hlc(n.wall_ms, 10**6, "devZ")
    c.observe(same_wall)
    assert c.now() > same_wall


# ------------------------------------------------------------------ fold

def _ops_sample(form="tuple"):
    return [
        op("b", Hlc(2, 0, "d1"), payload("c", "assistant", "second"), form),
        op("a", Hlc(1, 0, "d1"), payload("c", "user", "first"), form),
        op("z", Hlc(2, 0, "d1"), payload("c", "user", "tie broken by op_id"), form),
        op("x", Hlc(1, 5, "d2"), payload("other", "user", "other conversation"), form),
        op("a", Hlc(1, 0, "d1"), payload("c", "user", "first"), form),  # resent
    ]


@pytest.mark.parametrize("form", ["tuple", "mapping", "str", "oprecord"])
def test_fold_filters_dedupes_orders(form):
    ts = fold(_ops_sample(form), "c")
    assert [t.op_id for t in ts] == ["a", "b", "z"]
    assert all(isinstance(t, Turn) for t in ts)
    assert [t.content for t in ts] == ["first", "second", "tie broken by op_id"]
    assert [_role(t.role) for t in ts] == ["user", "assistant", "user"]
    assert all(t.conversation_id == "c" for t in ts)
    assert str(ts[0].hlc) == str(Hlc(1, 0, "d1"))
    assert [t.op_id for t in fold(_ops_sample(form), "other")] == ["x"]
    assert fold(_ops_sample(form), "nope") == []


def test_fold_identical_payloads_two_turns():
    pl = payload("c", "user", "yes", ts=5.0)
    ts = fold([op("o1", Hlc(1, 0, "d"), dict(pl)), op("o2", Hlc(1, 0, "d"), dict(pl))], "c")
    assert [t.op_id for t in ts] == ["o1", "o2"]
    assert [t.content for t in ts] == ["yes", "yes"]


def test_fold_turn_fields():
    pl = payload("c", "assistant", "calling", tool_calls=[call("k1")], ts=12.5)
    (t,) = fold([op("o1", Hlc(9, 1, "d"), pl)], "c")
    assert t.op_id == "o1"
    assert str(t.hlc) == str(Hlc(9, 1, "d"))
    assert t.conversation_id == "c"
    assert _role(t.role) == "assistant"
    assert t.content == "calling"
    assert [dict(c) for c in t.tool_calls] == [call("k1")]
    assert t.tool_use_id == ""
    assert t.timestamp == 12.5


_op_st = st.tuples(st.sampled_from(["o1", "o2", "o3", "o4", "o5", "o6"]), st.integers(0, 5), st.integers(0, 2),
                   st.sampled_from(["d1", "d2"]), st.sampled_from(["c", "c2"]),
                   st.sampled_from(["user", "assistant"]), st.text(max_size=5))


@settings(max_examples=60, deadline=None)
@given(st.lists(_op_st, max_size=12), st.randoms(use_true_random=False))
def test_fold_delivery_order_independent(raw, rnd):
    # one payload per op_id (a resent op is the same op)
    first = {}
    for o in raw:
        first.setdefault(o[0], o)
    ops = [op(o[0], Hlc(o[1], o[2], o[3]), payload(o[4], o[5], o[6])) for o in first.values()]
    delivered = ops + [ops[i] for i in range(0, len(ops), 2)]  # with duplicates
    shuffled = delivered[:]
    rnd.shuffle(shuffled)
    for conv in ("c", "c2"):
        a, b = fold(delivered, conv), fold(shuffled, conv)
        assert transcript_bytes(a) == transcript_bytes(b)
        ids = [t.op_id for t in a]
        assert len(ids) == len(set(ids))
        keys = [(Hlc.parse(str(t.hlc)), t.op_id) for t in a]
        assert keys == sorted(keys)


def test_legacy_payload_default_conversation():
    ops = [op("l1", Hlc(1, 0, "d"), {"speaker": "user", "text": "old style", "timestamp": 3.0}),
           op("n1", Hlc(2, 0, "d"), payload("c", "user", "new style"))]
    ts = fold(ops, DEFAULT_CONVERSATION)
    assert [t.op_id for t in ts] == ["l1"]
    assert [t.op_id for t in fold(ops, "c")] == ["n1"]


def test_legacy_payload_fields_mapped():
    # ASSUMPTION: a legacy turn's speaker becomes its role and text its content.
    ts = fold([op("l1", Hlc(1, 0, "d"), {"speaker": "assistant", "text": "old style", "timestamp": 3.0})],
              DEFAULT_CONVERSATION)
    assert ts[0].content == "old style"
    assert _role(ts[0].role) == "assistant"


# ------------------------------------------------------------------ to_message

def test_turn_to_message_shapes():
    u, a, t = turns_of(("user", "hi"), ("assistant", "let me look", [call("k1", "f", {"x": 1})]),
                       ("tool", "result!", (), "k1"))
    assert u.to_message() == {"role": "user", "content": "hi"}
    am = a.to_message()
    assert set(am) == {"role", "content", "tool_calls"}
    assert am["role"] == "assistant" and am["content"] == "let me look"
    assert [dict(c) for c in am["tool_calls"]] == [call("k1", "f", {"x": 1})]
    assert t.to_message() == {"role": "tool_result", "tool_use_id": "k1", "content": "result!"}
    (plain,) = turns_of(("assistant", "no tools"))
    pm = plain.to_message()
    assert set(pm) == {"role", "content", "tool_calls"} and list(pm["tool_calls"]) == []


# ------------------------------------------------------------------ repair

def test_repair_coalesces_users_and_assistants():
    out = repair(turns_of(("user", "a"), ("user", "b"), ("assistant", "x"), ("assistant", "y"), ("user", "c")))
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[0]["content"] == "a\nb"
    assert out[1]["content"] == "x\ny"
    assert out[2]["content"] == "c"


def test_repair_valid_exchange_untouched():
    ts = turns_of(("user", "q"), ("assistant", "calling", [call("k1"), call("k2")]),
                  ("tool", "r1", (), "k1"), ("tool", "r2", (), "k2"), ("assistant", "done"))
    out = repair(ts)
    assert _plain(out) == _plain([t.to_message() for t in ts])
    assert [m["role"] for m in out] == ["user", "assistant", "tool_result", "tool_result", "assistant"]


def test_repair_orphan_tool_result_dropped():
    out = repair(turns_of(("user", "q"), ("tool", "orphan", (), "nobody"), ("assistant", "a")))
    assert [(m["role"], m["content"]) for m in out] == [("user", "q"), ("assistant", "a")]
    assert list(out[1]["tool_calls"]) == []


def test_repair_dangling_call_stripped_call_by_call():
    out = repair(turns_of(("user", "q"), ("assistant", "calling", [call("k1"), call("k2"), call("k3")]),
                          ("tool", "r2", (), "k2"), ("user", "next")))
    assert [m["role"] for m in out] == ["user", "assistant", "tool_result", "user"]
    assert [c["id"] for c in out[1]["tool_calls"]] == ["k2"]
    assert out[1]["content"] == "calling"
    assert out[2] == {"role": "tool_result", "tool_use_id": "k2", "content": "r2"}


def test_repair_tool_results_not_merged():
    out = repair(turns_of(("user", "q"), ("assistant", "c", [call("k1"), call("k2")]),
                          ("tool", "r1", (), "k1"), ("tool", "r2", (), "k2")))
    assert out[2:] == [{"role": "tool_result", "tool_use_id": "k1", "content": "r1"},
                       {"role": "tool_result", "tool_use_id": "k2", "content": "r2"}]


def test_repair_result_only_right_after_its_call():
    out = repair(turns_of(("user", "q"), ("assistant", "c", [call("k1")]), ("user", "interrupt"),
                          ("tool", "late", (), "k1"), ("assistant", "end")))
    # the late result is not in the block right after the call: dropped, and the
    # call (with no result there) stripped
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant"]
    assert list(out[1]["tool_calls"]) == []
    assert all(m["role"] != "tool_result" for m in out)


def test_repair_coalesces_again_after_drops():
    out = repair(turns_of(("user", "a"), ("tool", "orphan", (), "zz"), ("user", "b"), ("assistant", "x"),
                          ("tool", "orphan2", (), "yy"), ("assistant", "y")))
    assert [(m["role"], m["content"]) for m in out] == [("user", "a\nb"), ("assistant", "x\ny")]


def test_repair_coalesces_after_all_calls_stripped():
    out = repair(turns_of(("user", "a"), ("assistant", "x", [call("k9")]), ("assistant", "y")))
    # coalescing first gives one assistant with a dangling call, which is stripped
    assert [(m["role"], m["content"]) for m in out] == [("user", "a"), ("assistant", "x\ny")]
    assert list(out[1]["tool_calls"]) == []


def test_repair_drops_system():
    ops = [op("1", Hlc(1, 0, "d"), payload("c", "system", "you are a bot")),
           op("2", Hlc(2, 0, "d"), payload("c", "user", "hi"))]
    out = repair(fold(ops, "c"))
    assert out == [{"role": "user", "content": "hi"}]


_turn_st = st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.sampled_from(["a", "b", ""]),
                     st.lists(st.sampled_from(["k1", "k2", "k3"]), max_size=2, unique=True),
                     st.sampled_from(["k1", "k2", "k3", "zz"]))


def _check_provider_rules(out):
    prev = None
    open_calls = set()
    for m in out:
        r = m["role"]
        assert r in ("user", "assistant", "tool_result")
        if r == "tool_result":
            assert m["tool_use_id"] in open_calls, (m, out)
            open_calls.discard(m["tool_use_id"])
            assert prev in ("assistant", "tool_result")
        else:
            assert not open_calls, ("call without a result", out)
            assert r != prev, ("same role adjacent", out)
            if r == "assistant":
                open_calls = {c["id"] for c in m["tool_calls"]}
        prev = r
    assert not open_calls, ("call without a result", out)


# ASSUMPTION: provider-valid includes "each call answered exactly once" (a second
# result for the same call id is dropped like an orphan).
@settings(max_examples=150, deadline=None)
@given(st.lists(_turn_st, max_size=10))
def test_repair_output_is_provider_valid(specs):
    ts = turns_of(*[(r, c, [call(k) for k in calls] if r == "assistant" else (), use if r == "tool" else "")
                    for r, c, calls, use in specs])
    out = repair(ts)
    _check_provider_rules(out)
    assert repair(ts) == out  # deterministic


# ------------------------------------------------------------------ renderers

def _blocks(content):
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [dict(b) for b in content]


def _sample_repaired():
    return repair(turns_of(("user", "question"), ("assistant", "calling", [call("k1", "f", {"x": 1, "y": [2]})]),
                           ("tool", "result one", (), "k1"), ("user", "thanks"), ("assistant", "bye")))


def test_to_anthropic_shape():
    out = to_anthropic(_sample_repaired())
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant"]
    assert _blocks(out[0]["content"]) == [{"type": "text", "text": "question"}]
    a = _blocks(out[1]["content"])
    assert {"type": "text", "text": "calling"} in a
    uses = [b for b in a if b["type"] == "tool_use"]
    assert uses == [{"type": "tool_use", "id": "k1", "name": "f", "input": {"x": 1, "y": [2]}}]
    u = _blocks(out[2]["content"])
    assert u[0]["type"] == "tool_result" and u[0]["tool_use_id"] == "k1"
    rc = u[0]["content"]
    assert rc == "result one" or _blocks(rc) == [{"type": "text", "text": "result one"}]
    assert u[1:] == [{"type": "text", "text": "thanks"}]  # adjacent user content merged into one message
    assert _blocks(out[3]["content"]) == [{"type": "text", "text": "bye"}]
    json.dumps(out)


def test_to_openai_shape():
    out = to_openai(_sample_repaired())
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "user", "assistant"]
    assert out[0] == {"role": "user", "content": "question"}
    a = out[1]
    assert a["content"] == "calling"
    assert len(a["tool_calls"]) == 1
    tc = a["tool_calls"][0]
    assert tc["id"] == "k1" and tc["type"] == "function"
    assert tc["function"]["name"] == "f"
    assert isinstance(tc["function"]["arguments"], str)
    assert json.loads(tc["function"]["arguments"]) == {"x": 1, "y": [2]}
    assert set(tc) == {"id", "type", "function"}
    assert out[2] == {"role": "tool", "tool_call_id": "k1", "content": "result one"}
    assert out[3] == {"role": "user", "content": "thanks"}
    assert out[4]["role"] == "assistant" and out[4]["content"] == "bye"
    # ASSUMPTION: an assistant message without calls carries no (empty) tool_calls
    # array, which the OpenAI API refuses.
    assert "tool_calls" not in out[4]
    json.dumps(out)


# ------------------------------------------------------------------ LastN

def test_lastn():
    ts = turns_of(*[("user" if i % 2 == 0 else "assistant", f"t{i}") for i in range(6)])
    assert [t.op_id for t in LastN(2).apply(ts)] == [ts[4].op_id, ts[5].op_id]
    assert [t.op_id for t in LastN(2)(ts)] == [ts[4].op_id, ts[5].op_id]
    assert LastN(0).apply(ts) == []
    assert LastN(0)(ts) == []
    assert [t.op_id for t in LastN(100).apply(ts)] == [t.op_id for t in ts]
    shuffled = ts[:]
    random.Random(1).shuffle(shuffled)
    assert {t.op_id for t in LastN(3).apply(shuffled)} == {t.op_id for t in ts[-3:]}
    with pytest.raises(ValueError):
        LastN(-1)


# ------------------------------------------------------------------ repository as oplog

@pytest.fixture
def two(tmp_path):
    a = ConversationStateRepository(tmp_path / "a")
    b = ConversationStateRepository(tmp_path / "b")
    yield a, b
    a.close()
    b.close()


def test_export_ops_shape(tmp_path):
    with ConversationStateRepository(tmp_path / "s") as r:
        m1 = msg("hello", "chan", ts=1700000000.1234, origin="devA", task_id="task_1")
        m2 = msg("stamped", "chan", role="assistant", hlc=str(Hlc(1800000000000, 3, "devB")),
                 tool_calls=(call("k1"),))
        r.append(m1)
        r.append(m2)
        ops = {op_parts(o)[0]: op_parts(o) for o in r.export_ops()}
        assert set(ops) == {m1.msg_id, m2.msg_id}
        for o in r.export_ops():
            op_id, hlc, payload = o             # an op is (op_id, hlc, payload)
            assert (op_id, str(hlc), payload) == ops[op_id]
        _, h1, p1 = ops[m1.msg_id]
        assert Hlc.parse(h1) == Hlc(round(1700000000.1234 * 1000), 0, "devA")
        _, h2, p2 = ops[m2.msg_id]
        assert h2 == m2.hlc
        for m, p in ((m1, p1), (m2, p2)):
            for k, v in m.to_dict().items():
                assert p[k] == v, k
            assert p["conversation_id"] == "chan"
            assert p["role"] == m.role
            assert p["content"] == m.content
            for k in ("tool_calls", "tool_use_id", "timestamp"):
                assert k in p


def test_a_stored_hlc_that_is_no_hlc_does_not_break_export_or_resume(tmp_path, caplog):
    """A record may carry any string as its hlc (section 2 checks only that it
    is a str): export and resume stamp its op as if it had none, say so, and
    two stores that exchange it still hold identical transcripts."""
    odd = msg("odd one", "c", ts=1700000000.5, origin="devA", hlc="not-an-hlc")
    fine = msg("fine", "c", role="assistant", hlc=str(Hlc(1700000001000, 0, "devA")))
    with ConversationStateRepository(tmp_path / "a") as a, ConversationStateRepository(tmp_path / "b") as b:
        a.append_many([odd, fine])
        with caplog.at_level("WARNING", logger="rune_fast.sync"):
            ops = a.export_ops()
        assert odd.msg_id in caplog.text and "not-an-hlc" in caplog.text
        by_id = {op_parts(o)[0]: op_parts(o) for o in ops}
        assert Hlc.parse(by_id[odd.msg_id][1]) == Hlc(1700000000500, 0, "devA")
        assert [(m["role"], m["content"]) for m in a.resume_messages("c")] == [
            ("user", "odd one"), ("assistant", "fine")]
        assert b.merge_ops(ops) == 2
        assert b.get_message(odd.msg_id).record == odd      # stored exactly as exported
        assert b.resume_messages("c") == a.resume_messages("c")
        assert [op_parts(o) for o in b.export_ops()] == [op_parts(o) for o in a.export_ops()]
        with pytest.raises(ValueError, match="not-an-hlc"):
            op_from_record_dict(odd.to_dict())               # the module function stays strict


@pytest.mark.parametrize("ts, wall_ms", [(-1.0, 0), (1e13, 10**15 - 1), (1.7e12, 10**15 - 1),
                                         (1e306, 10**15 - 1)])     # ts*1000 is inf: no OverflowError
def test_a_ts_outside_the_hlc_range_does_not_break_export_or_resume(tmp_path, caplog, ts, wall_ms):
    """Any finite ts is a valid record (section 2); its op's stamp (section 7:
    Hlc(round(ts*1000), 0, origin)) is clamped into the Hlc's range, said in
    the log, the same on every store that holds it."""
    odd = msg("odd ts", "c", ts=ts, origin="devA")
    with ConversationStateRepository(tmp_path / "a") as a, ConversationStateRepository(tmp_path / "b") as b:
        assert a.append(odd) is True
        with caplog.at_level("WARNING", logger="rune_fast.sync"):
            ops = a.export_ops()
        assert odd.msg_id in caplog.text
        assert [Hlc.parse(op_parts(o)[1]) for o in ops] == [Hlc(wall_ms, 0, "devA")]
        assert a.resume_messages("c") == [{"role": "user", "content": "odd ts"}]
        assert b.merge_ops(ops) == 1 and b.get_message(odd.msg_id).record == odd
        assert b.resume_messages("c") == a.resume_messages("c")


def test_export_since_is_exclusive(tmp_path):
    with ConversationStateRepository(tmp_path / "s") as r:
        hs = [Hlc(1000 + i, 0, "d") for i in range(4)]
        ms = [msg(f"m{i}", hlc=str(h)) for i, h in enumerate(hs)]
        r.append_many(ms)
        got = [op_parts(o)[0] for o in r.export_ops(since=hs[1])]
        assert sorted(got) == sorted(m.msg_id for m in ms[2:])
        assert sorted(op_parts(o)[0] for o in r.export_ops()) == sorted(m.msg_id for m in ms)
        assert list(r.export_ops(since=hs[3])) == []


def test_exchange_both_directions(two):
    a, b = two
    a_msgs = [msg("a: hello", "conv", ts=1000.0 + i, origin="A") for i in range(3)]
    b_msgs = [msg("b: reply", "conv", role="assistant", ts=1000.5 + i, origin="B") for i in range(3)]
    stamped = msg("stamped", "conv", hlc=str(a.clock.now()))
    a.append_many(a_msgs)
    a.append(stamped)
    b.append_many(b_msgs)
    assert b.merge_ops(a.export_ops()) == 4
    assert a.merge_ops(b.export_ops()) == 3
    assert a.merge_ops(b.export_ops()) == 0
    assert b.merge_ops(a.export_ops()) == 0
    assert a.resume_messages("conv") == b.resume_messages("conv")
    assert len(a) == len(b) == 7
    for m in a_msgs + b_msgs + [stamped]:
        assert a.get_message(m.msg_id).record == m
        assert b.get_message(m.msg_id).record == m
    assert sorted(m.msg_id for m in a.window("conv", 100)) == sorted(m.msg_id for m in b.window("conv", 100))


def test_exchange_survives_reopen_and_compaction(tmp_path):
    pa, pb = tmp_path / "a", tmp_path / "b"
    ms = [msg(f"x{i}", "conv", ts=2000.0 + i, origin="A") for i in range(6)]
    with ConversationStateRepository(pa, hot_window=2) as a:
        a.append_many(ms)
        a.compact()
        ops = list(a.export_ops())
        want = a.resume_messages("conv")
    with ConversationStateRepository(pb, hot_window=2) as b:
        assert b.merge_ops(ops) == 6
        b.compact()
    with ConversationStateRepository(pb, hot_window=2) as b:
        assert b.resume_messages("conv") == want
        assert b.merge_ops(ops) == 0
        for m in ms:
            assert b.get_message(m.msg_id).record == m


def test_resume_messages_repaired_and_no_system(tmp_path):
    with ConversationStateRepository(tmp_path / "s") as r:
        r.append(msg("be nice", "c", role="system", ts=1.0))
        r.append(msg("hi", "c", ts=2.0))
        r.append(msg("again", "c", ts=3.0))
        r.append(msg("hello", "c", role="assistant", ts=4.0))
        r.append(msg("orphan", "c", role="tool", tool_call_id="nobody", ts=5.0))
        out = r.resume_messages("c")
        assert [(m["role"], m["content"]) for m in out] == [("user", "hi\nagain"), ("assistant", "hello")]
        assert r.resume_messages("unknown") == []


def test_resume_messages_tool_exchange(tmp_path):
    with ConversationStateRepository(tmp_path / "s") as r:
        r.append(msg("q", "c", ts=1.0))
        r.append(msg("calling", "c", role="assistant", tool_calls=(call("k1", "f", {"a": 1}),), ts=2.0))
        r.append(msg("42", "c", role="tool", tool_call_id="k1", ts=3.0))
        r.append(msg("answer", "c", role="assistant", ts=4.0))
        out = r.resume_messages("c")
        assert [m["role"] for m in out] == ["user", "assistant", "tool_result", "assistant"]
        assert [dict(c) for c in out[1]["tool_calls"]] == [call("k1", "f", {"a": 1})]
        assert out[2] == {"role": "tool_result", "tool_use_id": "k1", "content": "42"}


def test_resume_messages_lastn_equals_fresh_fold(tmp_path):
    with ConversationStateRepository(tmp_path / "s", hot_window=3) as r:
        for i in range(12):
            r.append(msg(f"m{i}", "c", role="user" if i % 2 == 0 else "assistant", ts=100.0 + i))
        before = {n: r.resume_messages("c", n) for n in (None, 0, 1, 4, 50)}
        fresh = fold(r.export_ops(), "c")
        for n in (0, 1, 4, 50):
            assert before[n] == repair(LastN(n)(fresh))
        assert before[None] == repair(fresh)
        assert before[0] == []
        r.compact()
        for n, v in before.items():
            assert json.dumps(r.resume_messages("c", n)) == json.dumps(v)
        assert [m["content"] for m in before[4]] == ["m8", "m9", "m10", "m11"]


def test_tombstone_travels_both_orders(two, tmp_path):
    a, b = two
    m = msg("regret this", "conv", ts=5.0)
    keep = msg("keep this", "conv", ts=6.0)
    a.append(m)
    a.append(keep)
    msg_ops = list(a.export_ops())
    b.merge_ops(msg_ops)
    assert a.delete(m.msg_id) is True
    exported = list(a.export_ops())
    tombs = [o for o in exported if op_parts(o)[2].get("deleted") is True]
    assert len(tombs) == 1
    t_id, t_hlc, t_pl = op_parts(tombs[0])
    assert t_id == m.msg_id and t_pl["conversation_id"] == "conv"
    assert m.msg_id not in [op_parts(o)[0] for o in exported if not op_parts(o)[2].get("deleted")]
    # message first, then tombstone
    b.merge_ops(exported)
    assert b.get_message(m.msg_id).status == ReadStatus.NOT_FOUND_CONFIRMED
    assert b.resume_messages("conv") == a.resume_messages("conv")
    assert [x["content"] for x in b.resume_messages("conv")] == ["keep this"]
    assert b.merge_ops(msg_ops) == 0
    assert b.append(m) is False
    # tombstone first, then the message
    with ConversationStateRepository(tmp_path / "c") as c:
        c.merge_ops(tombs)
        assert c.merge_ops(msg_ops) == 1
        assert c.get_message(m.msg_id).status == ReadStatus.NOT_FOUND_CONFIRMED
        assert c.get_message(keep.msg_id).record == keep
        assert c.resume_messages("conv") == a.resume_messages("conv")
    with ConversationStateRepository(tmp_path / "c") as c:
        assert c.get_message(m.msg_id).status == ReadStatus.NOT_FOUND_CONFIRMED
        assert c.append(m) is False


def test_clock_device_persisted(tmp_path):
    with ConversationStateRepository(tmp_path / "s") as r:
        assert isinstance(r.clock, HlcClock)
        dev = r.clock.now().device_id
        assert dev
    with ConversationStateRepository(tmp_path / "s") as r:
        assert r.clock.now().device_id == dev
    with ConversationStateRepository(tmp_path / "other") as r2:
        assert r2.clock.now().device_id != dev


def test_clock_observes_stored_and_merged(two):
    a, b = two
    far = Hlc(int(time.time() * 1000) + 5_000_000, 3, "remote")
    a.append(msg("future", hlc=str(far)))
    assert a.clock.now() > far
    farther = Hlc(far.wall_ms + 1000, 0, "remote2")
    src = ConversationMessageRecord(msg_id="msg_merged", role="user", content="merged", channel_id="ch",
                                    hlc=str(farther))
    a.append(src)
    assert b.merge_ops(a.export_ops()) == 2
    assert b.clock.now() > farther


def test_clock_stamped_messages_order(tmp_path):
    with ConversationStateRepository(tmp_path / "s") as r:
        ms = [msg(f"s{i}", hlc=str(r.clock.now())) for i in range(5)]
        for m in reversed(ms):
            r.append(m)
        assert r.window("ch", 10) == ms


def test_merged_messages_take_their_hlc_place(two):
    a, b = two
    h = [Hlc(5000 + i, 0, "d") for i in range(5)]
    a_msgs = [msg(f"a{i}", "conv", task_id="task_m", hlc=str(h[i])) for i in (0, 2, 4)]
    b_msgs = [msg(f"b{i}", "conv", task_id="task_m", hlc=str(h[i])) for i in (1, 3)]
    a.append_many(a_msgs)
    a.compact()
    b.append_many(b_msgs)
    assert a.merge_ops(b.export_ops()) == 2
    want = sorted(a_msgs + b_msgs, key=lambda m: (m.hlc, m.msg_id))
    assert a.window("conv", 100) == want
    assert a.window("conv", 2) == want[-2:]
    assert a.messages_for_task("task_m") == want
    assert [x.record for x in a.search("", "conv")] == want
    assert [m["content"] for m in a.resume_messages("conv")] == ["\n".join(m.content for m in want)]


@pytest.mark.parametrize("form", ["mapping", "tuple"])
def test_merge_accepts_plain_op_forms(tmp_path, form):
    with ConversationStateRepository(tmp_path / "src") as s:
        ms = [msg(f"p{i}", "conv", ts=10.0 + i, origin="S") for i in range(3)]
        s.append_many(ms)
        exported = [op_parts(o) for o in s.export_ops()]
        want = s.resume_messages("conv")
    if form == "mapping":
        ops = [{"op_id": i, "hlc": h, "payload": dict(p)} for i, h, p in exported]
    else:
        ops = [(i, Hlc.parse(h), dict(p)) for i, h, p in exported]
    with ConversationStateRepository(tmp_path / "dst") as d:
        assert d.merge_ops(ops) == 3
        for m in ms:
            assert d.get_message(m.msg_id).record == m
        assert d.resume_messages("conv") == want


def test_export_ops_fold_equals_resume(tmp_path):
    with ConversationStateRepository(tmp_path / "s") as r:
        r.append(msg("u", "c1", ts=1.0))
        r.append(msg("a", "c1", role="assistant", ts=2.0))
        r.append(msg("other", "c2", ts=1.5))
        assert repair(fold(r.export_ops(), "c1")) == r.resume_messages("c1")
        assert [t.op_id for t in fold(r.export_ops(), "c2")] == [m.msg_id for m in r.window("c2")]


def test_resume_messages_negative_n(tmp_path):
    with ConversationStateRepository(tmp_path / "s") as r:
        r.append(msg("x", "c"))
        with pytest.raises(ValueError):
            r.resume_messages("c", -1)
        assert r.resume_messages("c", 0) == []


def test_incremental_export_carries_later_deletion(two):
    """Two devices syncing incrementally with export_ops(since=last seen): a
    deletion made after a sync point reaches the other device."""
    a, b = two
    m = msg("to be retracted", "conv", hlc=str(a.clock.now()))
    keep = msg("stays", "conv", hlc=str(a.clock.now()))
    a.append_many([m, keep])
    first = list(a.export_ops())
    assert b.merge_ops(first) == 2
    last_seen = max(Hlc.parse(op_parts(o)[1]) for o in first)
    assert a.delete(m.msg_id) is True
    later = list(a.export_ops(since=last_seen))
    tombs = [o for o in later if op_parts(o)[2].get("deleted") is True]
    assert [op_parts(o)[0] for o in tombs] == [m.msg_id]
    Hlc.parse(op_parts(tombs[0])[1])
    b.merge_ops(later)
    assert b.get_message(m.msg_id).status == ReadStatus.NOT_FOUND_CONFIRMED
    assert b.resume_messages("conv") == a.resume_messages("conv")


def test_incremental_export_carries_later_messages(two):
    a, b = two
    m1 = msg("one", "conv", hlc=str(a.clock.now()))
    a.append(m1)
    first = list(a.export_ops())
    b.merge_ops(first)
    last_seen = max(Hlc.parse(op_parts(o)[1]) for o in first)
    m2 = msg("two", "conv", hlc=str(a.clock.now()))
    a.append(m2)
    later = list(a.export_ops(since=last_seen))
    assert [op_parts(o)[0] for o in later] == [m2.msg_id]
    assert b.merge_ops(later) == 1
    assert b.window("conv") == [m1, m2]


def test_merged_late_messages_interleave_with_cool_tier(tmp_path):
    with ConversationStateRepository(tmp_path / "a", hot_window=1) as a, \
            ConversationStateRepository(tmp_path / "b", hot_window=1) as b:
        h = [Hlc(7000 + i, 0, "d") for i in range(6)]
        a_msgs = [msg(f"a{i}", "conv", hlc=str(h[i])) for i in (0, 2, 4)]
        b_msgs = [msg(f"b{i}", "conv", hlc=str(h[i])) for i in (1, 3, 5)]
        a.append_many(a_msgs)
        a.compact()
        assert [a.get_message(m.msg_id).tier for m in a_msgs] == ["cool", "cool", "hot"]
        b.append_many(b_msgs)
        assert a.merge_ops(b.export_ops()) == 3
        want = sorted(a_msgs + b_msgs, key=lambda m: (m.hlc, m.msg_id))
        assert a.window("conv", 100) == want
        assert a.window("conv", 3) == want[-3:]
        a.compact()
        assert a.window("conv", 100) == want
        assert [a.get_message(m.msg_id).tier for m in want] == ["cool"] * 5 + ["hot"]


_action = st.tuples(st.sampled_from(["append_a", "append_b", "stamp_a", "stamp_b", "del_a", "del_b",
                                     "a_to_b", "b_to_a", "compact_a", "compact_b"]), st.integers(0, 50))


@settings(max_examples=12, deadline=None)
@given(st.lists(_action, min_size=1, max_size=25))
def test_two_devices_converge(actions):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        kw = dict(hot_window=2, compact_every=6)
        a = ConversationStateRepository(Path(d) / "a", **kw)
        b = ConversationStateRepository(Path(d) / "b", **kw)
        try:
            stores = {"a": a, "b": b}
            ids = {"a": [], "b": []}
            n = 0
            for act, k in actions:
                n += 1
                side = act[-1]
                r = stores[side]
                if act.startswith("append"):
                    m = msg(f"{side}{n}", "conv", role="user" if n % 2 else "assistant", ts=1000.0 + n,
                            origin=side)
                    r.append(m)
                    ids[side].append(m.msg_id)
                elif act.startswith("stamp"):
                    m = msg(f"{side}{n}", "conv", hlc=str(r.clock.now()))
                    r.append(m)
                    ids[side].append(m.msg_id)
                elif act.startswith("del"):
                    pool = ids["a"] + ids["b"]
                    if pool:
                        r.delete(pool[k % len(pool)])
                elif act == "a_to_b":
                    b.merge_ops(a.export_ops())
                elif act == "b_to_a":
                    a.merge_ops(b.export_ops())
                else:
                    r.compact()
            for _ in range(2):
                b.merge_ops(a.export_ops())
                a.merge_ops(b.export_ops())
            assert a.resume_messages("conv") == b.resume_messages("conv")
            assert len(a) == len(b)
            for mid in ids["a"] + ids["b"]:
                ra, rb = a.get_message(mid), b.get_message(mid)
                assert ra.status == rb.status
                assert ra.record == rb.record
            assert sorted(m.msg_id for m in a.window("conv", 1000)) == sorted(m.msg_id for m in b.window("conv",
                                                                                                          1000))
        finally:
            a.close()
            b.close()


@pytest.mark.parametrize("bad", ["", "garbage", "12-34", "000000000000001-000000000x-dev", "1-2"])
def test_hlc_parse_rejects_malformed(bad):
    # ASSUMPTION: a string that is not the documented form is a ValueError.
    with pytest.raises(ValueError):
        Hlc.parse(bad)


def test_merge_conflicting_id_keeps_stored(two):
    a, b = two
    m = msg("original", "conv", ts=1.0)
    a.append(m)
    other = ConversationMessageRecord(msg_id=m.msg_id, role="assistant", content="conflict", channel_id="conv",
                                      ts=2.0)
    b.append(other)
    assert a.merge_ops(b.export_ops()) == 0
    assert a.get_message(m.msg_id).record == m
    assert len(a) == 1


def test_to_anthropic_alternation_and_openai_tool_then_assistant():
    rep = repair(turns_of(("user", "q"), ("assistant", "c", [call("k1", "f", {})]), ("tool", "r", (), "k1"),
                          ("assistant", "final")))
    an = to_anthropic(rep)
    assert [m["role"] for m in an] == ["user", "assistant", "user", "assistant"]
    assert [b["type"] for b in _blocks(an[2]["content"])] == ["tool_result"]
    assert _blocks(an[3]["content"]) == [{"type": "text", "text": "final"}]
    oa = to_openai(rep)
    assert [m["role"] for m in oa] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(oa[1]["tool_calls"][0]["function"]["arguments"]) == {}


def test_clock_after_stored_stamps_across_reopen(tmp_path):
    # ASSUMPTION: the clock stays after every stored stamp across a reopen too.
    far = Hlc(int(time.time() * 1000) + 9_000_000, 11, "remote")
    with ConversationStateRepository(tmp_path / "s", hot_window=1) as r:
        r.append(msg("future", hlc=str(far)))
        r.append(msg("later plain"))
        r.compact()
    with ConversationStateRepository(tmp_path / "s", hot_window=1) as r:
        assert r.clock.now() > far


def test_read_only_store_exports_and_resumes(tmp_path):
    sd = tmp_path / "s"
    with ConversationStateRepository(sd) as w:
        w.append_many([msg("q", "c", ts=1.0), msg("a", "c", role="assistant", ts=2.0)])
        want_ops = sorted(op_parts(o)[0] for o in w.export_ops())
        want = w.resume_messages("c")
        ro = ConversationStateRepository(sd, read_only=True)
        try:
            assert sorted(op_parts(o)[0] for o in ro.export_ops()) == want_ops
            assert ro.resume_messages("c") == want
        finally:
            ro.close()


def test_merge_hostile_ids_stay_inside(tmp_path):
    import os

    hostile = ["../../escape", "/etc/x", "a/../../b", "..", "😀/.."]
    with ConversationStateRepository(tmp_path / "in" / "src", hot_window=1) as s:
        ms = [ConversationMessageRecord(msg_id=h, role="user", content=f"c{i}", channel_id=h, task_id=h, ts=1.0 + i)
              for i, h in enumerate(hostile)]
        s.append_many(ms)
        ops = list(s.export_ops())
    (tmp_path / "in2").mkdir()
    before = sorted(os.listdir(tmp_path))
    with ConversationStateRepository(tmp_path / "in2" / "dst", hot_window=1) as d:
        assert d.merge_ops(ops) == len(hostile)
        for h in hostile:
            d.append(msg("push", h))
        d.compact()
        for m in ms:
            assert d.get_message(m.msg_id).record == m
    assert sorted(os.listdir(tmp_path)) == before
    assert sorted(os.listdir(tmp_path / "in2")) == ["dst"]
