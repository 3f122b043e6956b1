"""The compiled append-path encoder (csrc/_encode.pyx) against the Python one.

Every byte the encoder writes must be what the Python path writes: the record
JSON of a tail line, its payload_hash, its id key, the framed lines and the
framed envelopes. Hypothesis drives it with any text (controls, quotes,
backslashes, astral characters), times inside and outside the range where
repr and orjson print floats alike, huge token estimates and tool calls with
arbitrary JSON arguments (ints past 64 bits, exponent floats).
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import _encode, codec
from rune_fast._log import check_line, frame
from rune_fast.errors import FramingError, RecordTooLargeError
from rune_fast.events import frame_object
from rune_fast.records import ROLES, ConversationMessageRecord, new_id

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
ascii_text = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=40)
json_leaf = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
             | st.floats(allow_nan=False, allow_infinity=False) | text)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(text, inner, max_size=3), max_leaves=8)
times = (st.floats(min_value=0, max_value=4e9, allow_nan=False)
         | st.floats(allow_nan=False, allow_infinity=False)
         | st.sampled_from([0.0, -0.0, 1e-4, 9.99e-5, 1e16, 9.999999999999998e15, 1.5e-7, 123.0]))
tool_call = st.fixed_dictionaries({"id": text, "name": text, "arguments": json_value | text})

messages = st.builds(
    ConversationMessageRecord,
    msg_id=st.one_of(st.just(None), text.filter(bool), ascii_text.filter(bool)).map(lambda v: v or new_id("msg")),
    ts=times,
    role=st.sampled_from(ROLES),
    content=text | ascii_text | st.text(max_size=600).filter(lambda s: all(not 0xD800 <= ord(c) <= 0xDFFF for c in s)),
    channel_id=text.filter(bool),
    task_id=text,
    token_estimate=st.none() | st.integers(0, 10**6) | st.integers(2**62, 2**70),
    tool_calls=st.lists(tool_call, max_size=3).map(tuple),
    tool_call_id=text,
    origin=text,
    hlc=text,
)


def _python(m: ConversationMessageRecord) -> tuple[bytes, str, bytes]:
    body, h = codec.message_body_and_hash(m)
    return body, h, codec.key(m.msg_id)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=6))
def test_encode_batch_is_the_python_encoding(msgs):
    bodies, hashes, keys = codec.encode_batch(msgs)
    assert [(b, h, k) for b, h, k in zip(bodies, hashes, keys)] == [_python(m) for m in msgs]


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=5, unique_by=lambda m: m.msg_id),
       st.integers(0, 2**40), st.floats(min_value=1e9, max_value=4e9))
def test_frames_and_envelopes_are_the_python_ones(msgs, seq0, now):
    bodies, hashes, keys = codec.encode_batch(msgs)
    order = list(range(len(msgs)))[::-1]
    data, lengths = _encode.frame_messages(bodies, order, seq0)
    want = [frame(codec.rest_from_body(bodies[i], seq0 + j)) for j, i in enumerate(order)]
    assert data == b"".join(want)
    assert lengths == [len(x) for x in want]
    pos = 0
    for x in want:
        assert check_line(data, pos) == len(x) - 1     # verified, newline excluded
        pos += len(x)
    env = _encode.message_envelopes(keys, hashes, order, codec.dumps(now))
    assert env == b"".join(frame_object({"type": "conversation.message", "id": msgs[i].msg_id,
                                         "payload_hash": hashes[i], "ts": now}) for i in order)


def test_every_escape_and_character_class():
    content = "".join(chr(c) for c in range(0x80)) + "é€😀\u2028\u2029\ufeff" + '"\\' * 20 + "x" * 37
    for text_ in (content, content[::-1], content * 3, ""):
        m = ConversationMessageRecord(content=text_, channel_id='ch"\\\n', task_id="t\x00",
                                      hlc="h\x1f", tool_call_id="ü", origin="\t")
        b, h, k = codec.encode_batch([m])
        assert (b[0], h[0], k[0]) == _python(m)


def test_records_it_does_not_spell_go_through_python():
    # times whose repr differs from orjson's, estimates past 64 bits, ints
    # past 64 bits in tool-call arguments: the Python path, same bytes
    odd = [ConversationMessageRecord(ts=1e16, content="a", channel_id="c"),
           ConversationMessageRecord(ts=5e-5, content="a", channel_id="c"),
           ConversationMessageRecord(token_estimate=2**64, content="a", channel_id="c"),
           ConversationMessageRecord(content="a", channel_id="c",
                                     tool_calls=({"id": "1", "name": "f", "arguments": {"n": 2**80, "x": 1e20}},))]
    bodies, hashes, keys = codec.encode_batch(odd)
    assert list(zip(bodies, hashes, keys)) == [_python(m) for m in odd]


def test_type_errors_name_the_index():
    ok = ConversationMessageRecord(content="a", channel_id="c")
    with pytest.raises(TypeError, match=r"msgs\[1\]: expected ConversationMessageRecord, got dict"):
        codec.encode_batch([ok, {"content": "a"}])


def test_too_large_names_the_message(monkeypatch):
    monkeypatch.setattr(codec, "MAX_RECORD_BYTES", 1000)
    monkeypatch.setattr(_encode, "max_record_bytes", 1000)
    small = ConversationMessageRecord(content="a", channel_id="c")
    big = ConversationMessageRecord(msg_id="big-one", content="é" * 600, channel_id="c")
    with pytest.raises(RecordTooLargeError, match="big-one"):
        codec.encode_batch([small, big])


def test_frame_messages_refuses_bad_input():
    with pytest.raises(FramingError, match="negative sequence"):
        _encode.frame_messages([b"{}"], [0], -1)
    data, lengths = _encode.frame_messages([b'{"a":1}', b'{"b":2}'], [], 5)
    assert (data, lengths) == (b"", [])
