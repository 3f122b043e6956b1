"""The compiled append-path encoder (csrc/_encode.pyx) against the Python one.

Every byte the encoder writes must be what the Python path writes: the record
JSON of a tail line, its payload_hash, its id key, the framed lines and the
framed envelopes. Hypothesis drives it with any text (controls, quotes,
backslashes, astral characters), times inside and outside the range where
repr and orjson print floats alike, huge token estimates and tool calls with
arbitrary JSON arguments (ints past 64 bits, exponent floats).
"""
from __future__ import annotations

import hashlib

import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from _cool_lines import dict_table, framed_lines, lines_blob
from rune_fast import _encode, codec
from rune_fast._log import check_line, frame
from rune_fast.errors import FramingError, RecordTooLargeError
from rune_fast.events import frame_object
from rune_fast.records import ROLES, ConversationMessageRecord, check_message_fields, new_id

#: Examples of each compiled-vs-Python comparison in the default run; the
#: longer run (as before: 400, 200, 300, 300) takes RUNE_ENCODE_EXAMPLES=400.
EXAMPLES = int(os.environ.get("RUNE_ENCODE_EXAMPLES", "100"))

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


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=6))
def test_encode_batch_is_the_python_encoding(msgs):
    bodies, hashes, keys = codec.encode_batch(msgs)
    assert [(b, h, k) for b, h, k in zip(bodies, hashes, keys)] == [_python(m) for m in msgs]
    # the append path's form: the canonical JSON now, its hash later
    b2, deferred, k2 = codec.encode_batch(msgs, defer_hash=True)
    assert (b2, k2) == (bodies, keys)
    assert all(type(h) is bytes and hashlib.sha256(h).hexdigest() == want or h == want
               for h, want in zip(deferred, hashes))
    assert codec.hash_canonical(deferred) is deferred and deferred == hashes
    # the append path's job: the canonical JSONs in the job's buffer, hashed
    # in a C thread (threaded) or at result()
    for threaded in (True, False):
        b3, job, k3 = codec.encode_batch(msgs, hash_job=threaded)
        assert (b3, k3) == (bodies, keys)
        got = job.result()
        assert got == hashes and job.result() is got


def test_hash_job_of_a_list_puts_each_hash_in_its_place():
    data = [b"", b"abc", "a hash already", b"x" * 100_000, bytes(range(256))]
    want = [hashlib.sha256(d).hexdigest() if type(d) is bytes else d for d in data]
    for threaded in (True, False):
        hashes = list(data)
        job = _encode.HashJob(hashes, threaded)
        hashes[1] = None                # the job hashes its own copy of what it was given
        assert job.result() is hashes
        assert hashes[0] == want[0] and hashes[2:] == want[2:] and hashes[1] == want[1]
        assert all(type(h) is str for h in hashes)
    assert _encode.HashJob([]).result() == [] and _encode.HashJob().result() is None
    for _ in range(50):                 # a job dropped unread joins its thread
        _encode.HashJob([b"y" * 10_000] * 20)
    assert _encode.compiled_sha256 in (True, False)


@settings(max_examples=EXAMPLES)
@given(st.lists(st.binary(max_size=300) | st.integers(0, 5000).map(lambda n: bytes(i % 251 for i in range(n))),
                min_size=1, max_size=12), st.booleans(), st.booleans())
@example([bytes(range(n)) for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 255)], False, True)
@example([bytes(range(n)) for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 255)], True, False)
def test_hash_job_hashes_are_hashlibs(data, threaded, steps):
    # every length around sha256's 64-byte blocks and its 55/56-byte
    # padding edge, by OpenSSL's Init/Update/Final steps and by its one-shot
    was = _encode._use_compiled_sha256(True)
    try:
        _encode._use_compiled_sha256(True, steps)
        hashes: list = list(data)
        assert _encode.HashJob(hashes, threaded).result() == [hashlib.sha256(d).hexdigest() for d in data]
    finally:
        _encode._use_compiled_sha256(was)


def test_hash_job_without_compiled_sha256_uses_hashlib():
    msgs = [ConversationMessageRecord(content=f"m{i}", channel_id="c") for i in range(70)]
    want = codec.encode_batch(msgs)[1]
    assert not _encode._use_compiled_sha256(False)
    try:
        for threaded in (True, False):
            assert codec.encode_batch(msgs, hash_job=threaded)[1].result() == want
            assert _encode.HashJob([b"abc"], threaded).result() == [hashlib.sha256(b"abc").hexdigest()]
    finally:
        _encode._use_compiled_sha256(True)
    assert codec.encode_batch(msgs, hash_job=True)[1].result() == want


def test_a_record_with_an_unset_field_raises_attribute_error():
    # the encoder reads the fields straight from the slots: an unset one
    # raises as getattr does, and a field set past the constructor to a
    # value the compiled path does not spell goes through Python
    blank = object.__new__(ConversationMessageRecord)
    with pytest.raises(AttributeError):
        codec.encode_batch([blank])
    m = ConversationMessageRecord(content="a", channel_id="c")
    object.__setattr__(m, "content", 12)
    with pytest.raises((TypeError, ValueError), match="content"):
        codec.encode_batch([m])


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
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


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=6, unique_by=lambda m: m.msg_id),
       st.booleans(), st.booleans(), st.booleans(), st.floats(min_value=1e9, max_value=4e9))
def test_envelopes_from_a_hash_job_are_those_from_its_list(msgs, threaded, compiled, odd, now):
    # the append path hands message_envelopes the HashJob itself: each hash
    # is written from its digest; a record the Python path encodes (its
    # hash a str in the job's list) and hashlib's fallback give the same bytes
    if odd:
        msgs = msgs + [ConversationMessageRecord(ts=1e16, content="odd", channel_id="c")]
    was = _encode._use_compiled_sha256(True)
    try:
        _encode._use_compiled_sha256(compiled)
        _b, want_hashes, keys = codec.encode_batch(msgs)
        order = list(range(len(msgs)))[::-1][: max(1, len(msgs) - 1)]
        want = _encode.message_envelopes(keys, want_hashes, order, codec.dumps(now))
        _b, job, keys2 = codec.encode_batch(msgs, hash_job=threaded)
        assert keys2 == keys
        assert _encode.message_envelopes(keys, job, order, codec.dumps(now)) == want
        assert job.result() == want_hashes          # (the list still comes whole afterwards)
        assert _encode.message_envelopes(keys, job, order, codec.dumps(now)) == want
    finally:
        _encode._use_compiled_sha256(was)


@settings(max_examples=4 * EXAMPLES)
@given(st.floats(min_value=-1e16, max_value=1e16, allow_nan=False, exclude_max=True, exclude_min=True)
       | st.floats(min_value=3e7, max_value=4e9))
def test_the_fast_float_repr_is_repr_where_it_decides(x):
    # (rf_float_repr: the shortest decimal within half an ulp, nearest of
    # two; None where it leaves the value to dtoa)
    assert _encode._float_repr(x) in (None, repr(x))


def test_the_fast_float_repr_decides_the_times_of_the_epoch():
    import random
    import struct
    rng = random.Random(33)
    xs = [rng.uniform(1.0e9, 4.0e9) for _ in range(100_000)]
    xs += [round(x, rng.randint(0, 9)) for x in xs[:20_000]]
    # neighbours one ulp apart, and random bit patterns of the whole range
    xs += [struct.unpack("<d", struct.pack("<Q", struct.unpack("<Q", struct.pack("<d", x))[0] + 1))[0]
           for x in xs[:20_000]]
    xs += [x for x in (struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(100_000))
           if x == x and 1e-4 <= abs(x) < 1e16]
    got = [_encode._float_repr(x) for x in xs]
    assert [g for g, x in zip(got, xs) if g is not None and g != repr(x)] == []
    assert sum(g is not None for g in got[:100_000]) > 99_000     # (the path is taken)


#: strings of each of CPython's three widths (the encoder escapes a str's
#: code points where they lie): escapes and ASCII mixed with Latin-1, with
#: the rest of the BMP, and with astral code points
_ESCAPES = "\"\\\x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f az"
_WIDTHS = {1: _ESCAPES + "\x80\xa0\xe9\xff", 2: _ESCAPES + "\xe9\u0100\u07ff\u0800\u20ac\ud7ff\ue000\ufeff\uffff",
           4: _ESCAPES + "\xe9\u20ac\U00010000\U0001f600\U0010ffff"}
wide_text = st.sampled_from(sorted(_WIDTHS)).flatmap(
    lambda k: st.text(st.sampled_from(_WIDTHS[k]), min_size=1, max_size=300))


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(content=wide_text, channel=wide_text, other=wide_text)
def test_each_str_width_is_escaped_as_the_python_path_does(content, channel, other):
    m = ConversationMessageRecord(content=content, channel_id=channel, task_id=other, hlc=other[::-1],
                                  tool_call_id=other, origin=content[:7], msg_id=other)
    b, h, k = codec.encode_batch([m])
    assert (b[0], h[0], k[0]) == _python(m)


#: plain ASCII runs of every length around the encoder's blocks (8 and 16
#: code points), broken by one character of each kind at any place
_BREAKS = ['"', "\\", "\x00", "\x1f", "\n", "\x7f", "\x80", "\xe9", "\u20ac", "\ud7ff", "\U0001f600", " "]
blocky_text = st.lists(st.tuples(st.integers(0, 40), st.sampled_from(_BREAKS)), max_size=12).flatmap(
    lambda parts: st.sampled_from(["", "\xe9", "\u20ac", "\U0001f600"]).map(
        lambda width: width + "".join("abcdefghijklmnopqrstuvwxyz0123456789 ,.!?"[:n] + b for n, b in parts)))


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(content=blocky_text, channel=blocky_text)
def test_plain_runs_of_any_length_in_each_str_width_are_escaped_as_python_does(content, channel):
    # (a str that is not ASCII: its plain runs go a block at a time, the
    # rest a code point at a time)
    m = ConversationMessageRecord(content=content, channel_id=channel or "c", task_id=content[::-1],
                                  msg_id=channel[:30] or "m")
    b, h, k = codec.encode_batch([m])
    assert (b[0], h[0], k[0]) == _python(m)


@pytest.mark.parametrize("field", ["content", "channel_id", "task_id", "hlc", "tool_call_id", "origin"])
@pytest.mark.parametrize("value", ["a\ud800b", "\udfff", "\xe9\ud83d", "\U0001f600\udc00x"])
def test_a_lone_surrogate_set_past_the_constructor_is_refused_naming_the_field(field, value):
    # (each width: the compiled escape finds it, the Python path names it)
    m = ConversationMessageRecord(content="ok", channel_id="c")
    object.__setattr__(m, field, value)
    with pytest.raises(ValueError, match=field) as got:
        codec.encode_batch([m])
    with pytest.raises(ValueError) as want:
        check_message_fields(m)         # (the Python path's check, which names it)
    assert str(got.value) == str(want.value)


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
           ConversationMessageRecord(content="a", channel_id="c",
                                     tool_calls=({"id": "1", "name": "f", "arguments": {"n": 2**80, "x": 1e20}},))]
    bodies, hashes, keys = codec.encode_batch(odd)
    assert list(zip(bodies, hashes, keys)) == [_python(m) for m in odd]
    assert codec.hash_canonical(codec.encode_batch(odd, defer_hash=True)[1]) == hashes


def test_token_estimate_past_int64_takes_the_python_path():
    # a record may hold any non-negative int: past 2**63 - 1 the Python path
    # writes it (json spells it exactly), and reads and cooling keep it
    for tok in (2**63 - 1, 2**63, 2**64, 2**70):
        m = ConversationMessageRecord(msg_id=f"t{tok}", token_estimate=tok, content="a", channel_id="c")
        b, h, k = codec.encode_batch([m])
        assert (b[0], h[0], k[0]) == _python(m)
        line = framed_lines([m])[0]
        assert codec.record_from_line(line, path="t", offset=0)[0] == m
        assert _from_lines([line]).to_pylist() == dict_table([line]).to_pylist()


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


# ------------------------------------------------------------ cooling's reader

import json  # noqa: E402

import numpy as np  # noqa: E402

from rune_fast import cool  # noqa: E402


def _columns(lines):
    return _encode.cool_columns(*lines_blob(lines), cool._calls_texts)


def _from_lines(lines):
    def fallback(i):
        d = codec.decode_body(lines[i], path="t", offset=0)
        return d["r"], d.get("s")
    return cool.table_from_lines(*lines_blob(lines), fallback)


def test_cool_columns_refuses_lines_not_where_the_starts_say():
    lines = framed_lines([ConversationMessageRecord(content=c, channel_id="c") for c in ("a", "b")])
    data, starts = lines_blob(lines)
    assert _encode.cool_columns(data, starts, cool._calls_texts)[0] == [0, 1]
    assert _encode.cool_columns(b"", np.array([], dtype=np.int64), cool._calls_texts)[0] == []
    for bad in ([0, starts[1] + 1], [0, starts[1] - 2], [0, len(data) + 5], [-1, starts[1]]):
        with pytest.raises(ValueError, match="not followed by a newline"):
            _encode.cool_columns(data, np.array(bad, dtype=np.int64), cool._calls_texts)
    with pytest.raises(ValueError, match="not followed by a newline"):
        _encode.cool_columns(data[:-1], starts, cool._calls_texts)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=8, unique_by=lambda m: m.msg_id), st.integers(0, 2**50))
def test_table_from_lines_is_the_dict_path(msgs, seq0):
    lines = framed_lines(msgs, seq0)
    got = _from_lines(lines)
    want = dict_table(lines)
    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist()
    assert got.column("digest").to_pylist() == [cool.record_digest(m.to_dict()) for m in msgs]


def test_table_from_lines_takes_the_compiled_path_for_plain_lines():
    calls = ({"id": "c1", "name": "f", "arguments": {"z": [1, 2.5, None, True], "a": "x\"y"}},
             {"name": "g", "id": "c2", "arguments": "raw text"})
    msgs = [ConversationMessageRecord(content=c, channel_id="c", task_id="t")
            for c in ("plain", 'quo"te \\ \n\t\x01', "é€😀", "")]
    msgs.append(ConversationMessageRecord(content="called", channel_id="c", tool_calls=calls))
    lines = framed_lines(msgs, 7)
    taken, _cols = _columns(lines)
    assert taken == [0, 1, 2, 3, 4]
    assert _from_lines(lines).to_pylist() == dict_table(lines).to_pylist()


def test_lines_spelled_otherwise_take_the_dict_path():
    # the same records written with ASCII escapes, a \/ escape, a float with
    # an exponent, extra keys, a tool call, no sequence: the dict path, same table
    m = ConversationMessageRecord(content="é / x", channel_id="c")
    base = m.to_dict()
    variants = [
        json.dumps(base, separators=(",", ":")).encode(),                       # \u00e9
        codec.dumps(base).replace(b" / ", b" \\/ "),                            # \/
        codec.dumps({**base, "ts": 1e16}),                                      # 1e16
        codec.dumps({**base, "later_field": 1}),                                # extra key
        codec.dumps({**base, "tool_calls": [{"id": "1", "name": "f", "arguments": {"n": 2**70}}]}),
        codec.dumps({**base, "tool_calls": [{"id": "1", "name": "f", "arguments": [1e300]}]}),
        codec.dumps({**base, "tool_calls": [{"id": "1234567890123456789", "name": "f", "arguments": 0}]}),
    ]
    lines = [frame(codec.rest_from_body(b, 3))[:-1] for b in variants]
    lines.append(frame(codec.MESSAGE_PREFIX + codec.dumps({**base, "msg_id": "no-seq"}) + b"}")[:-1])
    taken, _cols = _columns(lines)
    assert taken == []
    lines += framed_lines([ConversationMessageRecord(content="fast", channel_id="c")])
    got = _from_lines(lines)
    want = dict_table(lines)
    assert got.to_pylist() == want.to_pylist()


def _ts_texts():
    """Time texts: repr's own (epoch times of 0-9 places, their neighbours
    an ulp away, random doubles in the fixed range, small and negative
    ones), and spellings repr does not write (a trailing zero, a leading
    zero, a digit more or less, an exponent, past 2**53 and 22 places)."""
    import random
    import struct
    rng = random.Random(32)
    xs = [round(rng.uniform(1.0e9, 4.0e9), rng.randint(0, 9)) for _ in range(3000)]
    xs += [struct.unpack("<d", struct.pack("<Q", struct.unpack("<Q", struct.pack("<d", x))[0] + 1))[0]
           for x in xs[:1000]]
    xs += [x for x in (struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(3000))
           if x == x and 1e-4 <= abs(x) < 1e16]
    xs += [0.0, -0.0, 1e-4, 0.0001234, -2.5, 9007199254740992.0, 9007199254740993.0, 0.1, 0.3]
    texts = [repr(x) for x in xs]
    texts += [t + "0" for t in texts[:500]] + ["0" + t for t in texts[:200]]
    texts += [t[:-1] for t in texts[:500] if len(t.split(".")[1]) > 1]
    texts += [t + "1" for t in texts[:500]]
    texts += ["1764000004.3220570", "00.5", "1.5e3", "0.0000000000000000000001", "12345678901234567.0",
              "1764000004.32205700000000000001", "-0.0000", "5."]
    return texts


def test_cool_columns_takes_a_time_exactly_where_repr_writes_it():
    # (the reader's value and exactness check -- Clinger's exact quotient,
    # then rf_float_repr, then dtoa -- against float() and repr())
    base = ConversationMessageRecord(content="t", channel_id="c").to_dict()
    texts = _ts_texts()
    bodies = [codec.dumps({**base, "ts": 1.5}).replace(b'"ts":1.5', b'"ts":' + t.encode()) for t in texts]
    lines = [frame(codec.rest_from_body(b, 1))[:-1] for b in bodies]
    taken, cols = _columns(lines)

    def exact(t):
        try:
            x = float(t)
        except ValueError:
            return False
        return repr(x) == t and (x == 0.0 or 1e-4 <= abs(x) < 1e16)
    assert [texts[i] for i in taken] == [t for t in texts if exact(t)]
    assert len(taken) > 4500
    got = np.frombuffer(cols["ts"], dtype=np.float64)
    assert [struct_bits(x) for x in got] == [struct_bits(float(texts[i])) for i in taken]


def struct_bits(x):
    import struct
    return struct.pack("<d", x)


def test_invalid_utf8_goes_the_dict_path_which_names_it():
    m = ConversationMessageRecord(content="abc", channel_id="c")
    body = codec.dumps(m.to_dict()).replace(b"abc", b"a\xffc")
    line = frame(codec.rest_from_body(body, 1))[:-1]
    assert _columns([line])[0] == [0]        # the reader leaves UTF-8 to Arrow
    with pytest.raises(Exception) as exc:
        _from_lines([line])
    assert "JSON" in str(exc.value) or "utf" in str(exc.value).lower()


# ------------------------------------------------------------ reads

def _python_record(line):
    d = codec.decode_body(line, path="t", offset=0)
    from rune_fast.records import message_from_stored
    return message_from_stored(d["r"], fresh_json=True), d.get("s")


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=6, unique_by=lambda m: m.msg_id), st.integers(0, 2**50))
def test_record_from_line_is_the_python_decode(msgs, seq0):
    for m, line in zip(msgs, framed_lines(msgs, seq0)):
        got = codec.record_from_line(line, path="t", offset=0)
        want = _python_record(line)
        assert got == want and got[0] == m
        assert type(got[0].ts) is float and type(got[0].token_estimate) is int
        assert type(got[0].tool_calls) is tuple
        fast = _encode.record_from_line(line, ConversationMessageRecord, codec._calls_from_json)
        assert fast is None or fast == want


def test_record_from_line_takes_plain_lines_and_leaves_the_rest():
    calls = ({"id": "c1", "name": "f", "arguments": {"z": [1, 2.5]}},)
    plain = [ConversationMessageRecord(content=c, channel_id="c", role=r, tool_calls=t)
             for c, r, t in (("x", "user", ()), ('q"\\\n\x01é😀', "assistant", ()), ("", "tool", calls))]
    for m, line in zip(plain, framed_lines(plain, 5)):
        fast = _encode.record_from_line(line, ConversationMessageRecord, codec._calls_from_json)
        assert fast is not None and fast[0] == m and fast[1] >= 5
    m = ConversationMessageRecord(content="é / x", channel_id="c")
    base = m.to_dict()
    others = [json.dumps(base, separators=(",", ":")).encode(),             # \u00e9
              codec.dumps({**base, "ts": 1e16}),
              codec.dumps({**base, "later_field": 1}),
              codec.dumps({**base, "role": "robot"}),                     # refused by the checks
              codec.dumps({**base, "schema_version": 2})]
    for body in others:
        line = frame(codec.rest_from_body(body, 3))[:-1]
        assert _encode.record_from_line(line, ConversationMessageRecord, codec._calls_from_json) is None
    bad_utf8 = frame(codec.rest_from_body(codec.dumps(base).replace(b"x", b"\xff"), 3))[:-1]
    assert _encode.record_from_line(bad_utf8, ConversationMessageRecord, codec._calls_from_json) is None


def test_a_subclass_of_the_record_takes_the_python_path(tmp_path):
    from rune_fast.conversation_state import ConversationStateRepository

    class Mine(ConversationMessageRecord):
        __slots__ = ()

    m = Mine(msg_id="sub-1", content="from a subclass", channel_id="c")
    assert codec.encode_batch([m]) == ([codec.message_body_and_hash(m)[0]],
                                       [codec.message_body_and_hash(m)[1]], [codec.key("sub-1")])
    with ConversationStateRepository(tmp_path) as repo:
        assert repo.append(m)
        assert repo.get_message("sub-1").record == m
    with ConversationStateRepository(tmp_path) as repo:      # read back from the line
        assert repo.get_message("sub-1").record == ConversationMessageRecord(
            msg_id="sub-1", content="from a subclass", channel_id="c", ts=m.ts)


_any_leaf = st.one_of(json_leaf, st.tuples(st.integers()), st.sets(st.integers(), max_size=2),
                      st.floats(allow_nan=True, allow_infinity=True), st.binary(max_size=3))
_any_value = st.recursive(_any_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.one_of(st.text(max_size=3), st.integers()), inner, max_size=3),
                          max_leaves=12)


@given(_any_value)
def test_json_safe_is_the_python_rule(v):
    from rune_fast.records import json_safe, json_safe_py
    assert json_safe(v) == json_safe_py(v)


def test_json_safe_refuses_deep_nesting_and_json_then_judges():
    from rune_fast.records import fast_canonical_json, json_safe, json_safe_py
    v: list = []
    for _ in range(300):
        v = [v]
    assert json_safe_py(v) and not json_safe(v)
    assert fast_canonical_json(v) == b"[" * 300 + b"[]" + b"]" * 300


#: tool calls of the shape the encoder spells itself (ASCII keys at every
#: level, str/int/bool/None values, lists and dicts): many keys to sort,
#: ints at the edges of int64, escapes in keys and values
_ascii_key = st.text(st.sampled_from('ab_Z09"\\\n\x00~'), max_size=6)
_plain_leaf = (st.none() | st.booleans() | st.sampled_from([0, -1, 2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64])
               | st.integers(-2**64, 2**64) | text | wide_text)
_plain_value = st.recursive(_plain_leaf, lambda inner: st.lists(inner, max_size=4)
                            | st.dictionaries(_ascii_key, inner, max_size=6), max_leaves=12)
_plain_call = st.fixed_dictionaries({"id": text, "name": ascii_text, "arguments": _plain_value},
                                    optional={"type": ascii_text, "zeta": _plain_value, "Alpha": _plain_value,
                                              "a b": st.booleans()})


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_plain_call, min_size=1, max_size=4).map(tuple), st.data())
def test_tool_calls_spelled_in_c_are_the_python_encoding(calls, data):
    m = ConversationMessageRecord(content="x", channel_id="c", tool_calls=calls)
    bodies, hashes, keys = codec.encode_batch([m])
    assert (bodies[0], hashes[0], keys[0]) == _python(m)
    # the dicts edited past the constructor (they are the record's own):
    # a value or key the C path does not spell, or one the check refuses
    edit = data.draw(st.sampled_from(["float", "tuple", "surrogate", "key", "nested_float", "none_id", "drop_args"]))
    call = m.tool_calls[data.draw(st.integers(0, len(m.tool_calls) - 1))]
    if edit == "float":
        call["arguments"] = 1.5
    elif edit == "tuple":
        call["arguments"] = (1, 2)
    elif edit == "surrogate":
        call["name"] = "a\ud800"
    elif edit == "key":
        call["\xe9t\xe9"] = {"b": 1, "a": 2}
    elif edit == "nested_float":
        call["arguments"] = {"z": [1, {"y": 2.25, "x": True}]}
    elif edit == "none_id":
        call["id"] = None
    else:
        del call["arguments"]
    try:
        want = _python(m)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)) as got:
            codec.encode_batch([m])
        assert str(got.value) == str(exc)
    else:
        bodies, hashes, keys = codec.encode_batch([m])
        assert (bodies[0], hashes[0], keys[0]) == want


def test_the_common_tool_calls_take_no_python_call(monkeypatch):
    m = ConversationMessageRecord(content="x", channel_id="c", tool_calls=(
        {"id": "call_1", "name": "read_file", "arguments": '{"path": "a \\"b\\"", "n": 3}'},
        {"name": "f", "id": "2", "arguments": {"z": [1, None, True], "a": {"y": "\xe9", "b": -7}}}))
    want = _python(m)

    def no(_record):
        raise AssertionError("calls_json called")
    monkeypatch.setattr(codec, "_calls_json", no)
    bodies, hashes, keys = codec.encode_batch([m])
    assert (bodies[0], hashes[0], keys[0]) == want


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(messages, min_size=1, max_size=5, unique_by=lambda m: m.msg_id), min_size=1, max_size=4),
       st.integers(0, 2**50))
def test_frames_into_a_reused_frame_buffer_are_the_bytes_ones(batches, seq0):
    room = _encode.FrameBuffer()
    held = None
    for i, msgs in enumerate(batches):
        bodies, _hashes, _keys = codec.encode_batch(msgs)
        order = list(range(len(msgs)))[::-1]
        want, want_lengths = _encode.frame_messages(bodies, order, seq0 + i)
        data, lengths = _encode.frame_messages(bodies, order, seq0 + i, room)
        assert lengths == want_lengths and len(data) == len(want) and bytes(data) == want
        if held is not None:
            # a view of the last batch's lines is still held: this batch's
            # lines went into bytes of their own, the view's bytes are intact
            assert type(data) is bytes
            assert held[1].tobytes() == held[0]
            held[1].release()
            held = None
        elif i % 2 == 0:
            assert data is room
            held = (want, memoryview(data))


def test_a_frame_buffer_is_read_only_and_keeps_no_large_batch():
    room = _encode.FrameBuffer()
    data, _ = _encode.frame_messages([b'{"a":1}'], [0], 7, room)
    assert data is room and bytes(data) == _encode.frame_messages([b'{"a":1}'], [0], 7)[0]
    with pytest.raises(TypeError, match="read-only"):
        memoryview(data)[0:1] = b"y"
    big = [b'{"c":"' + b"x" * (1 << 20) + b'"}'] * 17     # past the 16 MiB it keeps
    data, _ = _encode.frame_messages(big, list(range(17)), 0, room)
    assert type(data) is bytes and len(data) > 16 << 20


def test_record_from_line_fills_a_subclass_by_name_and_the_record_by_slot():
    """The record type message_init set up gets each field stored in its
    slot; any other type (a subclass here) by name: the same values."""
    class Sub(ConversationMessageRecord):
        __slots__ = ()

    calls = ({"id": "c1", "name": "f", "arguments": {"a": 1}},)
    msgs = [ConversationMessageRecord(content="é x", channel_id="c", task_id="t", role="assistant",
                                      hlc="h1", origin="o", tool_call_id="k", token_estimate=7),
            ConversationMessageRecord(content="", channel_id="c2", role="tool", tool_calls=calls)]
    for m, line in zip(msgs, framed_lines(msgs, 9)):
        fast = _encode.record_from_line(line, ConversationMessageRecord, codec._calls_from_json)
        sub = _encode.record_from_line(line, Sub, codec._calls_from_json)
        assert fast is not None and sub is not None and type(sub[0]) is Sub
        assert fast[0] == m and sub[0].to_dict() == m.to_dict() and fast[1] == sub[1] >= 9
        assert all(getattr(fast[0], f) == getattr(m, f) for f in m.__slots__)
