"""The bridge between stored messages (ConversationMessageRecord dicts) and ops."""
from __future__ import annotations

import pytest

from rune_fast.sync import (
    Hlc, HlcClock, OpRecord, Role, as_op, fold, op_from_record_dict, record_dict_from_op,
    repair, resume_messages, tombstone_op, turns_from_records,
)


def rec(msg_id, role, content, *, ts=1700000000.25, channel="ch", hlc="", origin="",
        tool_calls=(), tool_call_id=""):
    """A record dict shaped like ConversationMessageRecord.to_dict() (SPEC section 2)."""
    return {"msg_id": msg_id, "ts": ts, "role": role, "content": content, "channel_id": channel,
            "task_id": "", "token_estimate": (len(content) + 3) // 4,
            "tool_calls": [dict(c) for c in tool_calls], "tool_call_id": tool_call_id,
            "origin": origin, "hlc": hlc, "schema_version": 1}


def test_op_of_a_stamped_record():
    h = Hlc(1700000000250, 3, "laptop")
    d = rec("msg_1", "user", "hi", hlc=str(h), origin="laptop")
    op = op_from_record_dict(d)
    assert isinstance(op, OpRecord)
    assert op.op_id == "msg_1" and op.hlc == h
    p = op.payload
    for k, v in d.items():
        assert p[k] == v
    assert (p["conversation_id"], p["role"], p["content"], p["tool_calls"], p["tool_use_id"],
            p["timestamp"]) == ("ch", "user", "hi", [], "", 1700000000.25)


def test_op_of_an_unstamped_record_derives_hlc_from_ts_and_origin():
    op = op_from_record_dict(rec("msg_2", "assistant", "yo", ts=12.3456, origin="phone"))
    assert op.hlc == Hlc(round(12.3456 * 1000), 0, "phone")
    assert op_from_record_dict(rec("m", "user", "x", ts=5.0)).hlc == Hlc(5000, 0, "")


def test_record_objects_with_to_dict_are_accepted():
    class FakeRecord:
        def to_dict(self):
            return rec("msg_3", "user", "obj")
    assert op_from_record_dict(FakeRecord()).op_id == "msg_3"


def test_bad_record_dicts_name_the_problem():
    with pytest.raises(ValueError, match="msg_id"):
        op_from_record_dict({"channel_id": "c", "ts": 1.0})
    with pytest.raises(ValueError, match="msg_9"):
        op_from_record_dict(rec("msg_9", "user", "x", hlc="not an hlc"))
    with pytest.raises(TypeError):
        op_from_record_dict(42)


def test_tool_messages_and_system_messages():
    call = {"id": "call_1", "name": "lookup", "arguments": {"q": "x"}}
    recs = [rec("m1", "system", "be brief", ts=1.0),
            rec("m2", "user", "find x", ts=2.0),
            rec("m3", "assistant", "", ts=3.0, tool_calls=[call]),
            rec("m4", "tool", "found", ts=4.0, tool_call_id="call_1"),
            rec("m5", "assistant", "here it is", ts=5.0)]
    ts = turns_from_records(recs)
    assert [t.role for t in ts] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert ts[2].tool_use_id == "call_1" and ts[1].tool_calls == (call,)
    assert repair(ts) == [
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool_result", "tool_use_id": "call_1", "content": "found"},
        {"role": "assistant", "content": "here it is", "tool_calls": []}]
    assert turns_from_records([]) == []


def test_record_round_trips_through_its_op():
    recs = [rec("m1", "user", "a", hlc=str(Hlc(5, 0, "x")), origin="x"),
            rec("m2", "tool", "r", tool_call_id="k"),
            rec("m3", "system", "s")]
    for d in recs:
        op = op_from_record_dict(d)
        assert record_dict_from_op(op) == d
        assert record_dict_from_op(as_op(op.to_dict())) == d  # over the wire too


def test_record_dict_from_foreign_ops():
    assert record_dict_from_op(tombstone_op("m1", Hlc(1, 0, "a"), "ch")) is None
    legacy = ("l1", Hlc(2500, 1, "dev"), {"speaker": "user", "text": "old", "timestamp": 2.5})
    d = record_dict_from_op(legacy)
    assert d == {"msg_id": "l1", "ts": 2.5, "role": "user", "content": "old",
                 "channel_id": "default", "tool_calls": [], "tool_call_id": "",
                 "origin": "dev", "hlc": str(Hlc(2500, 1, "dev"))}
    d = record_dict_from_op(("t1", Hlc(7000, 0, "d"), {"conversation_id": "c", "role": "tool",
                                                       "content": "r", "tool_use_id": "k"}))
    assert (d["ts"], d["tool_call_id"], d["role"]) == (7.0, "k", "tool")


def test_two_devices_exchange_ops_and_agree():
    """Two stores as plain op dicts: each stamps its own messages, exchanges ops
    both ways (with resends and a deletion) and resumes the same transcript."""
    wall = {"t": 1000}
    laptop, phone = HlcClock("laptop", wall=lambda: wall["t"]), HlcClock("phone", wall=lambda: 900)
    store_a: dict[str, dict] = {}
    store_b: dict[str, dict] = {}

    def put(store, clock, msg_id, role, content, **kw):
        d = rec(msg_id, role, content, hlc=str(clock.now()), origin=clock.device_id, **kw)
        store[msg_id] = op_from_record_dict(d).to_dict()

    def exchange(src, dst, clock):
        for k, op in src.items():
            clock.observe(op["hlc"])
            dst.setdefault(k, op)

    put(store_a, laptop, "a1", "user", "hello")
    exchange(store_a, store_b, phone)
    put(store_b, phone, "b1", "assistant", "hi from phone")
    put(store_a, laptop, "a2", "assistant", "hi from laptop")  # concurrent with b1
    wall["t"] = 2000
    exchange(store_b, store_a, laptop)
    exchange(store_a, store_b, phone)
    put(store_b, phone, "b2", "user", "delete my first line please")
    store_b["a1#del"] = tombstone_op("a1", phone.now(), "ch").to_dict()
    exchange(store_b, store_a, laptop)
    exchange(store_a, store_b, phone)
    ra = resume_messages(store_a.values(), "ch")
    rb = resume_messages(list(reversed(list(store_b.values()))), "ch")
    assert ra == rb
    assert ra[0]["role"] == "assistant" and "hello" not in str(ra)
    assert fold(store_a.values(), "ch") == fold(store_b.values(), "ch")
