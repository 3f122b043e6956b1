"""The compiled canonical JSON of a line's tool calls (``_encode.canonical_calls``,
what ``cool_columns`` makes without calling ``calls_texts``): byte for byte
what ``rune_fast.cool.tables._calls_texts`` makes with orjson (the column
text, and the text with sorted keys) wherever it does not leave the value to
it, and it leaves only what it must."""
from __future__ import annotations

import json

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _cool_lines import dict_table, framed_lines, lines_blob
from rune_fast import _encode, cool
from rune_fast.cool.tables import _calls_texts
from rune_fast.records import ConversationMessageRecord

EXAMPLES = 400

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
key = st.text(st.characters(blacklist_categories=("Cs",)), max_size=4) | st.sampled_from(
    ["", "a", "aa", "ab", "b", "\xe9", "e\u0301", "\U0001f600", "\uffff", "A", "_", "id", "name"])
plain_leaf = (st.none() | st.booleans() | st.integers(-10**18 + 1, 10**18 - 1) | text)
# (a key json escapes is left to orjson: its order is not its bytes')
plain_key = key.filter(lambda k: not any(c in k for c in '"\\') and all(c >= " " for c in k))
plain = st.recursive(plain_leaf, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(plain_key, inner, max_size=5), max_leaves=20)
leaf = plain_leaf | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-2**70, 2**70)
value = st.recursive(leaf, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(key, inner, max_size=5), max_leaves=20)
call = st.fixed_dictionaries({"id": text, "name": text, "arguments": plain | text})


def _orjson_pair(raw: bytes):
    v = orjson.loads(raw)
    return orjson.dumps(v), orjson.dumps(v, option=orjson.OPT_SORT_KEYS)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(plain, max_size=4) | st.lists(call, min_size=1, max_size=3))
def test_plain_lists_are_written_as_orjson_writes_them(v):
    raw = orjson.dumps(v)
    got = _encode.canonical_calls(raw)
    assert got is not None          # (not left to orjson: nothing in it needs it)
    assert got == _calls_texts(raw) == _orjson_pair(raw)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(value, max_size=4), st.sampled_from(["orjson", "json", "spaced"]))
def test_any_list_is_written_as_orjson_writes_it_or_left_to_it(v, how):
    if how == "orjson":
        try:
            raw = orjson.dumps(v)
        except orjson.JSONEncodeError:      # (an int past 64 bits)
            return
    else:
        raw = json.dumps(v, ensure_ascii=False, separators=(",", ":") if how == "json" else None).encode()
    got = _encode.canonical_calls(raw)
    if got is not None:
        assert got == _calls_texts(raw)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(plain, min_size=1, max_size=3), st.data())
def test_a_changed_byte_is_written_as_orjson_reads_it_or_left_to_it(v, data):
    raw = bytearray(orjson.dumps(v))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] = data.draw(st.sampled_from(b' "\\,:[]{}-0.e1tnu\x01\x7f\xc3\xa9'))
    raw = bytes(raw)
    got = _encode.canonical_calls(raw)
    if got is not None:
        assert got == _calls_texts(raw)


def test_what_orjson_would_read_differently_is_left_to_it():
    for raw in (b'[{"b":1,"b":2}]',            # a key twice: orjson keeps the last value
                b'[{"a\\n":1,"a":2}]',          # an escaped key
                b'[1.5]', b'[1e5]', b'[-0]',    # floats, -0
                b'[01]', b'[ 1]', b'[1 ]', b'[{"a" :1}]',
                b'["\\u0041"]', b'["\\/"]',    # escapes json does not write
                b'{"a":1}', b'1', b'', b'[', b'[1,]', b'[1]x',
                b'[1234567890123456789]',      # past what it vouches for in int64
                b'[' * 70 + b']' * 70):        # deeper than it goes
        assert _encode.canonical_calls(raw) is None, raw
    for raw in (b'["\xed\xa0\x80"]', b'["\xc0\xaf"]', b'["\xf4\x90\x80\x80"]', b'["\xe9"]',
                b'["\xe2\x82"]', b'[{"\xff":1}]'):     # not UTF-8: orjson refuses it
        assert _encode.canonical_calls(raw) is None, raw
    for raw in (b'["\xf4\x8f\xbf\xbf\xc3\xa9"]', b'[{"\xf0\x9f\x98\x80":1,"\xef\xbf\xbf":2}]'):
        assert _encode.canonical_calls(raw) == _calls_texts(raw), raw
    deep = b'[' * 60 + b'{"b":1,"a":2}' + b']' * 60
    assert _encode.canonical_calls(deep) == (deep, b'[' * 60 + b'{"a":2,"b":1}' + b']' * 60)


def test_cool_columns_asks_the_caller_only_for_what_it_leaves():
    calls = ({"id": "c1", "name": "f", "arguments": {"z": [1, None, True], "a": "x\"y\n\xe9"}},
             {"name": "g", "id": "c2", "arguments": "raw text"})
    msgs = [ConversationMessageRecord(content="called", channel_id="c", tool_calls=calls),
            ConversationMessageRecord(content="float", channel_id="c",
                                      tool_calls=({"id": "c3", "name": "h", "arguments": {"x": 2.5}},)),
            ConversationMessageRecord(content="plain", channel_id="c")]
    lines = framed_lines(msgs, 3)
    asked = []

    def texts(raw):
        asked.append(raw)
        return _calls_texts(raw)
    taken, _cols = _encode.cool_columns(*lines_blob(lines), texts)
    assert taken == [0, 1, 2]
    assert asked == [b'[{"id":"c3","name":"h","arguments":{"x":2.5}}]']

    def fallback(i):
        from rune_fast import codec
        d = codec.decode_body(lines[i], path="t", offset=0)
        return d["r"], d.get("s")
    got = cool.table_from_lines(*lines_blob(lines), fallback)
    assert got.to_pylist() == dict_table(lines).to_pylist()
    assert got.column("digest").to_pylist() == [cool.record_digest(m.to_dict()) for m in msgs]
