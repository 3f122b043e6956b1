"""Read-only tool calls: the records the store's caches hold, and hand out as
they are, keep their tool calls as ReadOnlyDict / ReadOnlyList (csrc/_readonly.pxi).
They stay dicts and lists to every reader (==, isinstance, json, orjson, pickle,
copy, to_dict, from_dict), and every change raises TypeError at every level."""
from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import codec
from rune_fast._encode import (ReadOnlyDict, ReadOnlyList, fresh_read_only_calls, is_read_only_calls,
                               read_only_calls)
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord as R

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_scalars = st.none() | st.booleans() | st.integers(-2**63 + 1, 2**63 - 1) | _text \
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f == 0.0 or 1e-4 <= abs(f) < 1e16)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
                     max_leaves=20)
_calls = st.lists(st.fixed_dictionaries({"id": _text, "name": _text, "arguments": _json},
                                        optional={"type": _text}), min_size=1, max_size=3)


def _containers(v):
    """Every dict and list in ``v`` (itself first)."""
    if isinstance(v, (dict, list)):
        yield v
        for x in (v.values() if isinstance(v, dict) else v):
            yield from _containers(x)


def _attempts(c):
    """Every way to change the dict or list ``c`` in place."""
    if isinstance(c, dict):
        k = next(iter(c), "k")
        return [lambda: c.__setitem__("new", 1), lambda: c.__setitem__(k, 2), lambda: c.__delitem__(k),
                lambda: c.pop(k), lambda: c.pop(k, None), lambda: c.popitem(), lambda: c.clear(),
                lambda: c.update(x=1), lambda: c.update({}), lambda: c.setdefault("new", 1),
                lambda: c.__ior__({"x": 1}), lambda: c.__init__({"x": object()})]
    return [lambda: c.append(1), lambda: c.extend([1]), lambda: c.insert(0, 1), lambda: c.pop(),
            lambda: c.remove(c[0] if c else 1), lambda: c.clear(), lambda: c.sort(), lambda: c.reverse(),
            lambda: c.__setitem__(0, 1), lambda: c.__setitem__(slice(0, 0), [1]), lambda: c.__delitem__(0),
            lambda: c.__delitem__(slice(None)), lambda: c.__iadd__([1]), lambda: c.__imul__(2),
            lambda: c.__init__([object()])]


def _check_read_only(got, plain):
    assert got == plain and plain == got
    assert isinstance(got, tuple) and is_read_only_calls(got)
    for c in (c for call in got for c in _containers(call)):
        assert type(c) in (ReadOnlyDict, ReadOnlyList) and isinstance(c, (dict, list))
        before = json.dumps(c)
        for attempt in _attempts(c):
            with pytest.raises(TypeError, match="read-only"):
                attempt()
        assert json.dumps(c) == before
    assert got == plain


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_calls)
def test_read_only_calls_equal_the_plain_ones_and_refuse_every_change(calls):
    plain = tuple(calls)
    raw = orjson.dumps(calls)
    for got in (read_only_calls(calls), read_only_calls(tuple(calls)), fresh_read_only_calls(orjson.loads(raw))):
        _check_read_only(got, plain)
        assert json.dumps(got, sort_keys=True) == json.dumps(plain, sort_keys=True)
        assert orjson.dumps(got) == raw
        assert orjson.dumps(got, option=orjson.OPT_SORT_KEYS) == orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
        for again in (pickle.loads(pickle.dumps(got)), copy.copy(got), copy.deepcopy(got)):
            _check_read_only(again, plain)
        for c in got:
            mine = c.copy()
            assert type(mine) is dict and mine == c
            mine["id"] = "mine"                 # a plain copy is the caller's to edit
            assert dict(c) == c and c["id"] != "mine" or c["id"] == "mine" == calls[got.index(c)]["id"]
    assert read_only_calls(calls)[0] is not calls[0]          # a copy: the caller's dicts stay as they are
    calls[0]["id"] = "edited after"
    assert calls[0]["id"] == "edited after"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_calls)
def test_a_record_with_read_only_calls_is_the_record_of_plain_ones(calls):
    mine = R(msg_id="m", ts=1.5, role="assistant", content="x", channel_id="c", tool_calls=calls)
    stored = dataclasses.replace(mine)
    object.__setattr__(stored, "tool_calls", read_only_calls(calls))
    assert stored == mine and hash(stored) == hash(mine)
    d = stored.to_dict()
    assert d == mine.to_dict()
    assert all(type(c) in (dict, list) for call in d["tool_calls"] for c in _containers(call))
    assert R.from_dict(d) == stored
    assert pickle.loads(pickle.dumps(stored)) == stored and copy.deepcopy(stored) == stored
    # a record the caller builds from read-only calls holds plain ones of its own
    built = dataclasses.replace(stored, content="y")
    assert built.tool_calls == stored.tool_calls and not is_read_only_calls(built.tool_calls)
    assert all(type(c) in (dict, list) for call in built.tool_calls for c in _containers(call))
    # both encode to the same line
    assert codec.encode_batch([stored])[:2] == codec.encode_batch([mine])[:2]


def test_the_constructors_make_every_nested_value_read_only():
    d = ReadOnlyDict({"a": [{"b": (1, {"c": 2})}]}, k={"x": []})
    assert d == {"a": [{"b": [1, {"c": 2}]}], "k": {"x": []}}
    assert [type(c) for c in _containers(d)] == [ReadOnlyDict, ReadOnlyList, ReadOnlyDict, ReadOnlyList,
                                                  ReadOnlyDict, ReadOnlyDict, ReadOnlyList]
    assert ReadOnlyList([{"a": 1}, [2]]) == [{"a": 1}, [2]]
    with pytest.raises(TypeError, match=r"ReadOnlyDict\.__setitem__: tool_calls of a record read from the store"):
        d["a"] = 1
    with pytest.raises(TypeError):
        hash(d)


def _with_calls(i: int) -> R:
    return R(msg_id=f"m{i:03d}", ts=float(i), role="assistant", content=f"hello {i}", channel_id="c", task_id="t",
             tool_calls=[{"id": f"i{i}", "name": "n", "arguments": {"a": [i, {"b": "x"}]}}] if i % 2 else ())


@pytest.mark.parametrize("tier", ["tail", "hot", "cool"])
def test_reads_hand_out_the_cached_records_as_they_are(tmp_path, tier):
    """Every read hands out a record with tool calls as its cache holds it
    (read-only), not a copy made for each read (~160 ns a record): the same
    object twice, for records cached by the append and by a reopened
    store's decode, in every tier."""
    msgs = [_with_calls(i) for i in range(40)]
    opts = dict(compact_every=10**6, hot_window=8 if tier == "cool" else 512, durability="none")
    with ConversationStateRepository(tmp_path, **opts) as repo:
        repo.append_many(msgs)
        msgs[1].tool_calls[0]["arguments"]["a"].append("the caller's own edit")
        if tier != "tail":
            repo.compact()
        appended = repo.window("c", 8)
    for reopened in (False, True):
        with ConversationStateRepository(tmp_path, **opts) as repo:
            if not reopened:
                repo.window("c", 8)
            reads = [lambda: repo.window("c", 8), lambda: [repo.get_message(m.msg_id).record for m in msgs[32:]],
                     lambda: repo.messages_for_task("t")[-8:], lambda: [h.record for h in repo.search("hello")][-8:]]
            for read_ in reads:
                a, b = read_(), read_()
                assert a == b == [_with_calls(i) for i in range(32, 40)]
                for x, y in zip(a, b):
                    if x.tool_calls:
                        assert x is y and is_read_only_calls(x.tool_calls)
    assert appended == [_with_calls(i) for i in range(32, 40)]
    assert all(is_read_only_calls(r.tool_calls) for r in appended if r.tool_calls)


def test_a_fresh_value_is_made_read_only_in_place_and_anything_else_is_copied():
    fresh = orjson.loads(b'[{"id":"a","name":"n","arguments":{"l":[1,{"d":null}]}}]')
    inner = fresh[0]["arguments"]["l"]
    got = fresh_read_only_calls(fresh)
    assert got[0] is fresh[0] and got[0]["arguments"]["l"] is inner and type(inner) is ReadOnlyList
    # a value no decoder gives (a tuple), or nesting past 256 levels: copied
    deep: list = []
    for _ in range(300):
        deep = [deep]
    odd = [{"id": "b", "name": "n", "arguments": {"t": (1, {"a": [2]}), "keep": [3]}},
           {"id": "c", "name": "n", "arguments": deep}]
    got = fresh_read_only_calls(odd)
    assert got == ({"id": "b", "name": "n", "arguments": {"t": [1, {"a": [2]}], "keep": [3]}},
                   {"id": "c", "name": "n", "arguments": deep})
    assert is_read_only_calls(got) and got[0] is not odd[0]
    _check_read_only(got[:1], ({"id": "b", "name": "n", "arguments": {"t": [1, {"a": [2]}], "keep": [3]}},))
    assert all(type(c) in (ReadOnlyDict, ReadOnlyList) for c in _containers(got[1]))
