"""The message record's compiled constructor (``_encode.message_init``)
against its Python reference: every argument it takes on its fast path must
come out as ``_checked_message`` normalises it, and everything else must be
refused with the reference's exception and message."""
from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rune_fast import records
from rune_fast.records import ConversationMessageRecord as R

FIELDS = ("msg_id", "ts", "role", "content", "channel_id", "task_id", "token_estimate",
          "tool_calls", "tool_call_id", "origin", "hlc")
DEFAULTS = {"role": "user", "content": "", "channel_id": "", "task_id": "", "token_estimate": None,
            "tool_calls": (), "tool_call_id": "", "origin": "", "hlc": ""}


class StrSub(str):
    pass


class IntSub(int):
    pass


def reference(kw: dict):
    """What the Python path makes of the arguments: the normalised field
    tuple, or the (type, message) of the exception it raises."""
    args = dict(DEFAULTS)
    args.update(kw)
    try:
        return records._checked_message(*(args[f] for f in FIELDS))
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)


def built(kw: dict):
    try:
        r = R(**kw)
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    return tuple(getattr(r, f) for f in FIELDS)


texts = st.one_of(st.text(max_size=12), st.sampled_from(["", "a", "é", "€", "😀", "\ud800", "a\udfff", "x\x00\"\\"]),
                  st.builds(StrSub, st.text(max_size=4)))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
              texts, st.builds(IntSub, st.integers(-5, 5))),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                            st.dictionaries(st.one_of(texts, st.integers(0, 3)), inner, max_size=3)),
    max_leaves=8)
calls = st.one_of(
    st.lists(st.fixed_dictionaries({"id": texts, "name": texts, "arguments": json_values},
                                   optional={"extra": json_values}), max_size=3),
    st.lists(st.dictionaries(st.sampled_from(["id", "name", "arguments"]), texts), max_size=2),
    st.tuples(st.fixed_dictionaries({"id": st.just("c1"), "name": st.just("n"), "arguments": json_values})),
    st.sampled_from([(), [], "x", {"id": "a"}, None, ({"id": 1, "name": "n", "arguments": 1},)]),
)
fields = st.fixed_dictionaries({}, optional={
    "msg_id": st.one_of(texts, st.integers()),
    "ts": st.one_of(st.floats(allow_nan=True), st.integers(-2**70, 2**1100), st.booleans(), st.just("1")),
    "role": st.one_of(st.sampled_from(["user", "assistant", "system", "tool", "bot", ""]), st.builds(StrSub, st.just("user"))),
    "content": st.one_of(texts, st.binary(max_size=3)),
    "channel_id": st.one_of(texts, st.none()),
    "task_id": texts,
    "token_estimate": st.one_of(st.none(), st.integers(-3, 2**70), st.booleans(), st.floats(0, 3), st.builds(IntSub, st.integers(0, 3))),
    "tool_calls": calls,
    "tool_call_id": texts, "origin": texts, "hlc": texts,
})


@settings(max_examples=600, deadline=None)
@given(fields)
def test_compiled_constructor_matches_the_python_path(kw):
    kw.setdefault("msg_id", "msg_1")
    kw.setdefault("ts", 1.5e9)
    got, want = built(kw), reference(kw)
    if isinstance(want, tuple) and len(want) == len(FIELDS):
        assert got == want
        assert [type(v) for v in got] == [type(v) for v in want]
    else:
        assert got == want


def test_tool_calls_are_detached_copies():
    args = {"k": [1, {"x": (2, 3)}]}
    call = {"id": "c", "name": "n", "arguments": args}
    r = R(msg_id="m", ts=1.0, channel_id="c", tool_calls=[call])
    assert r.tool_calls == ({"id": "c", "name": "n", "arguments": {"k": [1, {"x": [2, 3]}]}},)
    assert r.tool_calls[0] is not call and r.tool_calls[0]["arguments"] is not args
    args["k"].append(9)
    assert r.tool_calls[0]["arguments"]["k"] == [1, {"x": [2, 3]}]


def test_defaults_and_dataclass_behaviour():
    r = R(channel_id="c", content="hello")
    assert r.msg_id.startswith("msg_") and type(r.ts) is float and r.token_estimate == 2
    assert dataclasses.is_dataclass(r)
    assert [f.name for f in dataclasses.fields(R)] == list(FIELDS)
    r2 = dataclasses.replace(r, content="other")
    assert r2.content == "other" and r2.msg_id == r.msg_id and r2.token_estimate == r.token_estimate
    assert pickle.loads(pickle.dumps(r)) == r and copy.deepcopy(r) == r
    assert hash(r) == hash(R(msg_id=r.msg_id, ts=r.ts, channel_id="c", content="hello"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.content = "x"    # type: ignore[misc]
    assert repr(r).startswith("ConversationMessageRecord(msg_id=")


def test_subclass_and_positional_arguments():
    class Sub(R):
        __slots__ = ("extra",)

    s = Sub("m1", 2.0, "assistant", "hi", "c")
    assert (s.msg_id, s.ts, s.role, s.content, s.channel_id, s.token_estimate) == ("m1", 2.0, "assistant", "hi", "c", 1)
    with pytest.raises(TypeError):
        R("m1", 2.0, "user", "", "c", "", None, (), "", "", "", "one too many")   # type: ignore[call-arg]


# ``R(...)`` runs the compiled tp_init (_encode._mi_tp_init), which matches
# the arguments itself; ``R.__init__`` (message_init) takes them through
# Cython's own parsing. Both must agree with each other and with the Python
# reference for every way of passing the fields.
class Key(str):
    pass


def _outcome(make):
    try:
        r = make()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    return tuple(getattr(r, f) for f in FIELDS)


def _through_init(args, kw):
    r = R.__new__(R)
    r.__init__(*args, **kw)
    return r


arg_lists = st.lists(st.sampled_from(FIELDS), unique=True).flatmap(
    lambda names: st.tuples(st.just(names), st.permutations(names), st.integers(0, len(names))))


@settings(max_examples=400, deadline=None)
@given(arg_lists, st.data())
def test_compiled_tp_init_matches_message_init(spec, data):
    names, order, npos = spec
    values = {"msg_id": "m1", "ts": 2.5, "role": "tool", "content": "héllo 😀", "channel_id": "c",
              "task_id": "t", "token_estimate": 7, "tool_calls": [{"id": "i", "name": "n", "arguments": [1]}],
              "tool_call_id": "x", "origin": "o", "hlc": "h"}
    given_ = {f: values[f] for f in names}
    positional = [given_.get(f) for f in FIELDS[:npos]]
    # keywords in a drawn order; some keys equal to the names but not the
    # interned objects, sometimes a str subclass, a duplicate or an unknown one
    kw = {}
    for f in order:
        if FIELDS.index(f) < npos and not data.draw(st.booleans(), label="dup"):
            continue
        how = data.draw(st.sampled_from(["same", "copy", "sub"]), label="key")
        key = f if how == "same" else "".join(list(f)) if how == "copy" else Key(f)
        kw[key] = values[f]
    if data.draw(st.booleans(), label="unknown"):
        kw[data.draw(st.sampled_from(["bogus", "self", "msg_id "]), label="name")] = 1
    got = _outcome(lambda: R(*positional, **kw))
    other = _outcome(lambda: _through_init(positional, kw))
    if isinstance(got, tuple) and len(got) == len(FIELDS) and isinstance(other, tuple) and len(other) == len(FIELDS):
        # a left-out msg_id or ts is drawn fresh each time: its type must agree
        assert [type(v) for v in got] == [type(v) for v in other] and got[2:] == other[2:]
        for k, f in enumerate(FIELDS[:2]):
            assert got[k] == other[k] or f not in given_
    else:
        assert got == other
    if isinstance(got, tuple) and len(got) == len(FIELDS) and "msg_id" in names and "ts" in names:
        want = dict(DEFAULTS)
        want.update(given_)
        assert got == records._checked_message(*(want[f] for f in FIELDS))


def test_compiled_tp_init_refuses_as_message_init():
    for args, kw in [((), {"bogus": 1}), (("m",), {"msg_id": "m2"}), (tuple(range(12)), {}),
                     ((), {Key("msg_id"): "m", "ts": 1.0, "channel_id": "c"}), ((), {"ts": float("nan"), "channel_id": "c"}),
                     ((), {"content": "\ud800", "channel_id": "c"}), ((), {"channel_id": ""})]:
        assert _outcome(lambda: R(*args, **kw)) == _outcome(lambda: _through_init(args, kw))
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        R(bogus=1)
    with pytest.raises(TypeError, match="multiple values for keyword argument 'msg_id'"):
        R("m", msg_id="m2")


def test_compiled_tp_init_holds_its_arguments():
    # a kwargs dict that is not a fresh copy (functools.partial hands its
    # own over) and the defaults filled in for what was left out
    import functools
    make = functools.partial(R, msg_id="m", ts=1.0, channel_id="c", content="abcde")
    r = make()
    assert (r.msg_id, r.ts, r.role, r.content, r.token_estimate, r.tool_calls) == ("m", 1.0, "user", "abcde", 2, ())
    assert make() == r and make.keywords == {"msg_id": "m", "ts": 1.0, "channel_id": "c", "content": "abcde"}


def test_setting_init_puts_the_generic_slot_back():
    class Own(R):
        __slots__ = ()

    seen = []

    def init(self, *a, **k):
        seen.append(k)
        R.__init__(self, *a, **k)

    Own.__init__ = init
    o = Own(msg_id="m", ts=1.0, channel_id="c")
    assert seen == [{"msg_id": "m", "ts": 1.0, "channel_id": "c"}] and o.channel_id == "c"


@pytest.mark.parametrize("wide", ["€", "😀"])
def test_lone_surrogate_found_anywhere_in_a_long_content(wide):
    # the compiled scan ORs blocks of 512 code points (32 a step with AVX2):
    # a surrogate at any place of a block, its edges, or the tail is found
    for n in (1, 15, 16, 17, 511, 512, 513, 1030):
        base = (wide + "ab" * n)[:n] if n > 1 else wide
        kw = {"msg_id": "m", "ts": 1.0, "channel_id": "c", "content": base}
        assert built(kw) == reference(kw) and built(kw)[3] == base
        for at in sorted({0, n // 2, n - 1, min(n - 1, 511), min(n - 1, 512)}):
            for bad in ("\ud800", "\udfff"):
                kw["content"] = base[:at] + bad + base[at + 1:]
                assert built(kw) == reference(kw)
                assert built(kw)[0] is ValueError


def test_a_record_of_plain_fields_is_left_out_of_the_cyclic_collector():
    """A record of str, float and int fields and no tool calls cannot be in
    a reference cycle: the constructor untracks it (as CPython untracks
    tuples of such values), so the records a bulk load holds are never
    promoted and walked by full collections. Tool calls (dicts: mutable
    containers), a subclass, or a field the Python path normalised keep it
    tracked; building it again with calls tracks it again."""
    import gc

    plain = R(msg_id="m1", channel_id="c", content="hällo", ts=1.0)
    assert not gc.is_tracked(plain)
    assert not gc.is_tracked(dataclasses.replace(plain, content="x"))
    calls = R(msg_id="m2", channel_id="c", tool_calls=[{"id": "t", "name": "f", "arguments": {}}])
    assert gc.is_tracked(calls)
    assert gc.is_tracked(R(msg_id="m3", channel_id=StrSub("c")))         # (the Python path)

    class Sub(R):
        pass

    assert gc.is_tracked(Sub(msg_id="m4", channel_id="c"))
    again = R(msg_id="m5", channel_id="c")
    assert not gc.is_tracked(again)
    R.__init__(again, msg_id="m5", channel_id="c", tool_calls=[{"id": "t", "name": "f", "arguments": [1]}])
    assert gc.is_tracked(again)
    # a cycle through a tracked record's tool calls is still collected
    calls.tool_calls[0]["arguments"]["me"] = calls
    del calls
    assert gc.collect() >= 1
    assert copy.deepcopy(plain) == plain and pickle.loads(pickle.dumps(plain)) == plain


def test_a_hot_record_read_back_is_left_out_of_the_cyclic_collector(tmp_path):
    """The hot decoder's records follow the constructor's rule."""
    import gc

    from rune_fast import ConversationStateRepository

    with ConversationStateRepository(tmp_path / "s") as repo:
        repo.append_many([R(msg_id="a", channel_id="c", content="plain"),
                          R(msg_id="b", channel_id="c", tool_calls=[{"id": "t", "name": "f", "arguments": {}}])])
    with ConversationStateRepository(tmp_path / "s") as repo:
        a, b = repo.get_message("a").record, repo.get_message("b").record
        assert a.content == "plain" and not gc.is_tracked(a)
        assert b.tool_calls and gc.is_tracked(b)


def test_a_task_reads_keyed_rows_are_left_out_of_the_cyclic_collector(tmp_path):
    """A task read of archived rows keys each record for its sort: the key
    (str and int) and its pair with a record of plain fields hold no
    container, and stay out of the collector's walks as the record does;
    a record with tool calls keeps its pair tracked."""
    import gc

    from rune_fast import ConversationStateRepository

    calls = [{"id": "t", "name": "f", "arguments": {}}]
    msgs = [R(msg_id=f"m{i}", channel_id="c", task_id="task", content=f"row {i}",
              hlc=f"h{i:04d}" if i % 2 else "", tool_calls=calls if i % 3 == 0 else [])
            for i in range(12)]
    with ConversationStateRepository(tmp_path / "s", hot_window=0) as repo:
        repo.append_many(msgs)
        repo.compact()
        gc.disable()        # (a collection would untrack the tuples of atomics itself)
        try:
            keyed, declined = repo._cool.task_records(repo._cool.task_parts("task"), R, "task")
        finally:
            gc.enable()
        assert not declined and len(keyed) == len(msgs)
        for pair in keyed:
            key, rec = pair
            assert not gc.is_tracked(key)
            assert gc.is_tracked(pair) == gc.is_tracked(rec) == bool(rec.tool_calls)
        got = repo.messages_for_task("task")
        assert [m.msg_id for m in got] == [m.msg_id for m in sorted(msgs, key=lambda m: (m.hlc != "", m.hlc))]
