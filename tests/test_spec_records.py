"""SPEC section 2: records, ids, statuses, transitions (black-box)."""
from __future__ import annotations

import json
import math
import re
import time

import pytest
from hypothesis import given, settings, strategies as st

from rune_fast.records import (
    TASK_TRANSITIONS,
    ConversationMessageRecord,
    OrchestrationRecord,
    TaskStateRecord,
    new_id,
)

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ID_RE = re.compile(r"^([a-z]+)_([0-9A-HJKMNP-TV-Z]{26})$")

STATUSES = ["created", "running", "awaiting_approval", "completed", "failed", "cancelled", "superseded"]
ROLES = ["user", "assistant", "system", "tool"]


# ------------------------------------------------------------------ new_id

def test_new_id_format():
    for prefix in ("task", "msg"):
        i = new_id(prefix)
        m = ID_RE.match(i)
        assert m, i
        assert m.group(1) == prefix
        assert len(i) == len(prefix) + 1 + 26


def test_new_id_encodes_current_milliseconds():
    before = int(time.time() * 1000)
    body = new_id("msg").split("_", 1)[1]
    after = int(time.time() * 1000)
    value = 0
    for c in body:
        value = value * 32 + CROCKFORD.index(c)
    # 26 chars * 5 bits = 130 bits holding a 128-bit value: top 48 bits are ms.
    assert value < (1 << 128)
    ms = value >> 80
    assert before - 1 <= ms <= after + 1


def test_new_id_unique_and_sorted_in_tight_loop():
    ids = [new_id("msg") for _ in range(20000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)


def test_new_id_sorted_across_prefixes():
    ids = []
    for i in range(5000):
        ids.append(new_id("task" if i % 2 else "msg"))
    bodies = [i.split("_", 1)[1] for i in ids]
    assert bodies == sorted(bodies)
    assert len(set(bodies)) == len(bodies)


def test_record_default_ids_are_fresh():
    a = ConversationMessageRecord(role="user", content="x", channel_id="c")
    b = ConversationMessageRecord(role="user", content="x", channel_id="c")
    assert a.msg_id != b.msg_id
    assert a.msg_id.startswith("msg_") and ID_RE.match(a.msg_id)
    t1 = TaskStateRecord(title="t", channel_id="c")
    t2 = TaskStateRecord(title="t", channel_id="c")
    assert t1.task_id != t2.task_id
    assert t1.task_id.startswith("task_") and ID_RE.match(t1.task_id)


# ------------------------------------------------------------------ defaults

def test_task_record_defaults():
    before = time.time()
    t = TaskStateRecord(title="plan", channel_id="c1")
    after = time.time()
    assert t.title == "plan"
    assert t.channel_id == "c1"
    assert t.status == "created"
    assert t.parent_task_id == ""
    assert t.assigned_model == ""
    assert t.outcome_ref == ""
    assert isinstance(t.created_at, float) and isinstance(t.updated_at, float)
    assert before - 1 <= t.created_at <= after + 1
    assert before - 1 <= t.updated_at <= after + 1
    assert isinstance(TaskStateRecord.SCHEMA_VERSION, int)
    assert isinstance(t, OrchestrationRecord)


def test_message_record_defaults():
    before = time.time()
    m = ConversationMessageRecord(role="user", content="hello world", channel_id="c1")
    after = time.time()
    assert m.role == "user"
    assert m.content == "hello world"
    assert m.channel_id == "c1"
    assert isinstance(m.ts, float)
    assert before - 1 <= m.ts <= after + 1
    assert m.task_id == ""
    assert m.token_estimate == math.ceil(len("hello world") / 4) == 3
    assert isinstance(m.token_estimate, int)
    assert tuple(m.tool_calls) == ()
    assert m.tool_call_id == ""
    assert m.origin == ""
    assert m.hlc == ""
    assert isinstance(ConversationMessageRecord.SCHEMA_VERSION, int)
    assert isinstance(m, OrchestrationRecord)


@pytest.mark.parametrize("content,expected", [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 401, 101),
                                              ("ßßßßß", 2)])
def test_token_estimate_default_is_ceil_len_over_4(content, expected):
    m = ConversationMessageRecord(role="assistant", content=content, channel_id="c")
    assert m.token_estimate == expected


def test_token_estimate_explicit_kept():
    m = ConversationMessageRecord(role="assistant", content="abcdefgh", channel_id="c", token_estimate=99)
    assert m.token_estimate == 99


def test_all_roles_and_statuses_accepted():
    for r in ROLES:
        assert ConversationMessageRecord(role=r, content="x", channel_id="c").role == r
    for s in STATUSES:
        assert TaskStateRecord(title="x", channel_id="c", status=s).status == s


# ------------------------------------------------------------------ dict form

def _full_message():
    return ConversationMessageRecord(
        msg_id="msg_custom", ts=1700000000.25, role="assistant", content="calling ✓ tool",
        channel_id="chan", task_id="task_1", token_estimate=7,
        tool_calls=({"id": "call_1", "name": "lookup", "arguments": {"q": "x", "n": [1, 2]}},),
        tool_call_id="", origin="dev-a", hlc="000001700000000-0000000000-dev-a",
    )


def _full_task():
    return TaskStateRecord(task_id="task_x", title="Plan ✓", status="running", channel_id="chan",
                           parent_task_id="task_parent", assigned_model="model-1",
                           created_at=1700000000.5, updated_at=1700000001.5, outcome_ref="ref://1")


def _no_tuples(obj):
    if isinstance(obj, tuple):
        return False
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _no_tuples(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(_no_tuples(v) for v in obj)
    return obj is None or isinstance(obj, (str, int, float, bool))


@pytest.mark.parametrize("make", [_full_message, _full_task,
                                  lambda: ConversationMessageRecord(role="user", content="x", channel_id="c"),
                                  lambda: TaskStateRecord(title="x", channel_id="c")])
def test_to_dict_json_safe_and_round_trip(make):
    r = make()
    d = r.to_dict()
    assert type(d) is dict
    assert _no_tuples(d), d
    assert d["schema_version"] == type(r).SCHEMA_VERSION
    # plain JSON round trip gives the same dict
    assert json.loads(json.dumps(d)) == d
    assert type(r).from_dict(d) == r
    assert type(r).from_dict(json.loads(json.dumps(d))) == r


def test_message_to_dict_fields():
    m = _full_message()
    d = m.to_dict()
    for f in ("msg_id", "ts", "role", "content", "channel_id", "task_id", "token_estimate",
              "tool_calls", "tool_call_id", "origin", "hlc", "schema_version"):
        assert f in d, f
    assert d["msg_id"] == "msg_custom"
    assert d["content"] == "calling ✓ tool"
    assert isinstance(d["tool_calls"], list)
    assert d["tool_calls"][0]["id"] == "call_1"
    assert d["tool_calls"][0]["name"] == "lookup"
    assert d["tool_calls"][0]["arguments"] == {"q": "x", "n": [1, 2]}
    assert isinstance(d["tool_calls"][0]["arguments"]["n"], list)


def test_task_to_dict_fields():
    d = _full_task().to_dict()
    for f in ("task_id", "title", "status", "channel_id", "parent_task_id", "assigned_model",
              "created_at", "updated_at", "outcome_ref", "schema_version"):
        assert f in d, f
    assert d["status"] == "running"
    assert d["assigned_model"] == "model-1"


def test_records_compare_by_value():
    assert _full_message() == _full_message()
    assert _full_task() == _full_task()
    a = _full_message()
    b = ConversationMessageRecord.from_dict({**a.to_dict(), "content": "other"})
    assert a != b


def test_from_dict_fills_missing_optional_message_fields():
    d = {"msg_id": "msg_old", "ts": 1.5, "role": "user", "content": "hello there", "channel_id": "c"}
    m = ConversationMessageRecord.from_dict(d)
    assert m.msg_id == "msg_old" and m.ts == 1.5 and m.content == "hello there"
    assert m.task_id == ""
    assert m.token_estimate == math.ceil(len("hello there") / 4)
    assert tuple(m.tool_calls) == ()
    assert m.tool_call_id == "" and m.origin == "" and m.hlc == ""


def test_from_dict_fills_missing_optional_task_fields():
    d = {"task_id": "task_old", "title": "x", "channel_id": "c", "status": "running",
         "created_at": 2.0, "updated_at": 3.0}
    t = TaskStateRecord.from_dict(d)
    assert t.task_id == "task_old" and t.status == "running"
    assert t.parent_task_id == "" and t.assigned_model == "" and t.outcome_ref == ""


def test_from_dict_without_schema_version_and_older_version():
    d = _full_message().to_dict()
    d.pop("schema_version")
    assert ConversationMessageRecord.from_dict(d) == _full_message()


@pytest.mark.parametrize("cls,make", [(ConversationMessageRecord, _full_message), (TaskStateRecord, _full_task)])
def test_from_dict_newer_schema_version_is_value_error(cls, make):
    d = make().to_dict()
    d["schema_version"] = cls.SCHEMA_VERSION + 1
    with pytest.raises(ValueError):
        cls.from_dict(d)


def test_from_dict_does_not_keep_reference_to_input():
    d = _full_message().to_dict()
    m = ConversationMessageRecord.from_dict(d)
    d["tool_calls"][0]["arguments"]["q"] = "mutated"
    d["content"] = "mutated"
    assert m == _full_message()


# ------------------------------------------------------------------ validation

def _raises_naming(exc_types, field, fn):
    with pytest.raises(exc_types) as ei:
        fn()
    assert field in str(ei.value), f"error {ei.value!r} does not name {field!r}"


def test_unknown_role_rejected():
    _raises_naming(ValueError, "role", lambda: ConversationMessageRecord(role="robot", content="x", channel_id="c"))


def test_unknown_status_rejected():
    _raises_naming(ValueError, "status", lambda: TaskStateRecord(title="x", channel_id="c", status="done"))


def test_empty_channel_on_message_rejected():
    _raises_naming((ValueError, TypeError), "channel_id",
                   lambda: ConversationMessageRecord(role="user", content="x", channel_id=""))


def test_empty_channel_on_task_rejected():
    _raises_naming((ValueError, TypeError), "channel_id", lambda: TaskStateRecord(title="x", channel_id=""))


@pytest.mark.parametrize("bad", [None, 5, b"bytes", ["x"]])
def test_non_str_content_rejected(bad):
    _raises_naming((TypeError, ValueError), "content",
                   lambda: ConversationMessageRecord(role="user", content=bad, channel_id="c"))


# ASSUMPTION: lone surrogates are refused at construction (the bullet says "bad
# construction raises at once"), not only later at append.
@pytest.mark.parametrize("field", ["content", "channel_id", "task_id", "msg_id", "origin"])
def test_lone_surrogate_in_message_rejected(field):
    kw = {"role": "user", "content": "x", "channel_id": "c"}
    kw[field] = "bad\ud800str"
    _raises_naming(ValueError, field, lambda: ConversationMessageRecord(**kw))


@pytest.mark.parametrize("field", ["title", "channel_id", "task_id"])
def test_lone_surrogate_in_task_rejected(field):
    kw = {"title": "x", "channel_id": "c"}
    kw[field] = "bad\udfffstr"
    _raises_naming(ValueError, field, lambda: TaskStateRecord(**kw))


def test_from_dict_validates_too():
    d = _full_message().to_dict()
    d["role"] = "wizard"
    with pytest.raises(ValueError):
        ConversationMessageRecord.from_dict(d)
    d = _full_task().to_dict()
    d["status"] = "nope"
    with pytest.raises(ValueError):
        TaskStateRecord.from_dict(d)


# ------------------------------------------------------------------ transitions

def test_task_transitions_exact():
    expected = {
        "created": {"running", "cancelled", "superseded"},
        "running": {"awaiting_approval", "completed", "failed", "cancelled", "superseded"},
        "awaiting_approval": {"running", "completed", "failed", "cancelled", "superseded"},
        "completed": set(),
        "failed": set(),
        "cancelled": set(),
        "superseded": set(),
    }
    assert set(TASK_TRANSITIONS) == set(expected)
    for k, v in expected.items():
        assert set(TASK_TRANSITIONS[k]) == v, k


# ------------------------------------------------------------------ property

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(content=_text, channel=_text.filter(bool), task_id=_text, ts=st.floats(0, 4e9),
       role=st.sampled_from(ROLES), hlc=_text, origin=_text,
       args=st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-10**6, 10**6), _text, st.booleans(),
                                                           st.none()), max_size=3))
def test_message_round_trip_property(content, channel, task_id, ts, role, hlc, origin, args):
    calls = ({"id": "c1", "name": "fn", "arguments": args},) if role == "assistant" else ()
    m = ConversationMessageRecord(role=role, content=content, channel_id=channel, task_id=task_id, ts=ts,
                                  hlc=hlc, origin=origin, tool_calls=calls)
    d = m.to_dict()
    assert _no_tuples(d)
    assert ConversationMessageRecord.from_dict(json.loads(json.dumps(d, ensure_ascii=False))) == m


def test_tool_calls_list_input_equals_tuple_input():
    # ASSUMPTION: tool_calls given as a list is kept as the same value as the tuple.
    c = {"id": "k", "name": "n", "arguments": {"a": 1}}
    a = ConversationMessageRecord(role="assistant", content="x", channel_id="c", msg_id="m", ts=1.0,
                                  tool_calls=[c])
    b = ConversationMessageRecord(role="assistant", content="x", channel_id="c", msg_id="m", ts=1.0,
                                  tool_calls=(c,))
    assert a == b
    assert a.to_dict() == b.to_dict()


# ASSUMPTION: "to_dict() is JSON-safe" means values JSON cannot hold (NaN, inf,
# sets, objects) are refused when the record is built, naming the field.
@pytest.mark.parametrize("kw,field", [
    ({"ts": float("nan")}, "ts"),
    ({"ts": float("inf")}, "ts"),
    ({"tool_calls": ({"id": "k", "name": "n", "arguments": {"s": {1, 2}}},)}, "tool_calls"),
    ({"tool_calls": ({"id": "k", "name": "n", "arguments": {"o": object()}},)}, "tool_calls"),
])
def test_non_json_values_refused(kw, field):
    _raises_naming((TypeError, ValueError), field,
                   lambda: ConversationMessageRecord(role="assistant", content="x", channel_id="c", **kw))


def test_task_non_finite_time_refused():
    _raises_naming((TypeError, ValueError), "created_at",
                   lambda: TaskStateRecord(title="x", channel_id="c", created_at=float("nan")))
