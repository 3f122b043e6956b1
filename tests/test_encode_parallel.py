"""The compiled encoder's two-thread path (csrc/_encode.pyx, encode_messages).

A batch of at least ``_parallel_min`` records is spelled by the caller and a
C thread at once (``_encode._set_parallel`` sets how many and how many
records each claims at a time). Its bodies, hashes and keys must be byte for byte those of
one thread and of the Python path; its errors the ones a record-by-record
encoder raises (the lowest failing index, whichever pass finds it); and a
batch changed by another thread while it is spelled must not crash it.
"""
from __future__ import annotations

import os
import threading

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import _encode, codec
from rune_fast.errors import RecordTooLargeError
from rune_fast.records import ROLES, ConversationMessageRecord

EXAMPLES = int(os.environ.get("RUNE_ENCODE_EXAMPLES", "100"))


class Mine(ConversationMessageRecord):
    __slots__ = ()


def _mine(m: ConversationMessageRecord) -> Mine:
    return Mine(**{k: v for k, v in m.to_dict().items() if k != "schema_version"})


@pytest.fixture
def parallel():
    """Every batch of two records or more takes the two-thread path, the
    threads claiming a record at a time."""
    old = _encode._set_parallel(2, 1)
    yield
    _encode._set_parallel(*old)


def _one_thread(msgs, **kw):
    old = _encode._set_parallel(1 << 60)
    try:
        return codec.encode_batch(msgs, **kw)
    finally:
        _encode._set_parallel(*old)


def _python(m: ConversationMessageRecord) -> tuple[bytes, str, bytes]:
    body, h = codec.message_body_and_hash(m)
    return body, h, codec.key(m.msg_id)


# text of each of CPython's str widths, escapes among them
_CHARS = "\"\\\x00\x08\t\n\x1f\x7f az\x80\xe9\xff\u0100\u20ac\ud7ff\ufeff\U00010000\U0001f600\U0010ffff"
text = st.text(st.sampled_from(_CHARS), max_size=30) | st.text(max_size=30).filter(
    lambda s: all(not 0xD800 <= ord(c) <= 0xDFFF for c in s))
ids = st.text(st.sampled_from(_CHARS), min_size=1, max_size=12)
plain_call = st.fixed_dictionaries({"id": text, "name": text, "arguments": text | st.dictionaries(text, text)})
odd_call = st.fixed_dictionaries({"id": text, "name": text, "arguments": st.floats(allow_nan=False, allow_infinity=False)
                                  | st.integers(2**64, 2**70)})      # (calls_json spells these)
times = st.floats(min_value=0, max_value=4e9) | st.sampled_from([1e16, 5e-5, 0.1 + 0.2, 1e15 + 0.3])
records = st.builds(
    ConversationMessageRecord,
    msg_id=ids, ts=times, role=st.sampled_from(ROLES), content=text, channel_id=ids, task_id=text,
    token_estimate=st.none() | st.integers(0, 10**6) | st.integers(2**63, 2**70),
    tool_calls=st.lists(plain_call | odd_call, max_size=2).map(tuple), tool_call_id=text, origin=text,
    hlc=text)
subclass_records = records.map(_mine)
batches = st.lists(records | subclass_records, min_size=2, max_size=24)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(batches)
def test_two_threads_spell_what_one_does(parallel, msgs):
    want = _one_thread(msgs)
    assert list(zip(*want)) == [_python(m) for m in msgs]
    assert codec.encode_batch(msgs) == want
    bodies, deferred, keys = codec.encode_batch(msgs, defer_hash=True)
    assert (bodies, keys) == (want[0], want[2]) and codec.hash_canonical(deferred) == want[1]
    for threaded in (True, False):
        bodies, job, keys = codec.encode_batch(msgs, hash_job=threaded)
        assert (bodies, job.result(), keys) == want


def test_a_large_batch_of_every_width_is_the_python_encoding():
    # past the default threshold: the path append_many takes
    msgs = []
    for i in range(1500):
        c = _CHARS[i % len(_CHARS)] * (i % 97) + "x" * (i % 13)
        calls = ({"id": f"c{i}", "name": "f", "arguments": {"q": c}},) if i % 6 == 0 else ()
        msgs.append(ConversationMessageRecord(msg_id=f"m{i}{c[:3]}", content=c or "-", channel_id="ch\xe9",
                                              task_id=c[::-1], tool_calls=calls, ts=1.7e9 + i / 7))
    msgs[700] = _mine(msgs[700])
    got = codec.encode_batch(msgs, hash_job=True)
    assert list(zip(got[0], got[1].result(), got[2])) == [_python(m) for m in msgs]


def _raised(msgs):
    try:
        codec.encode_batch(msgs)
    except Exception as exc:        # noqa: BLE001 (compared below)
        return type(exc), str(exc)
    return None


def _record_at_a_time(msgs):
    """The error of the first record that fails alone (the Python path)."""
    for i, m in enumerate(msgs):
        if not isinstance(m, ConversationMessageRecord):
            return TypeError, f"msgs[{i}]: expected ConversationMessageRecord, got {type(m).__name__}"
        try:
            codec._encode_slow(m)
        except Exception as exc:    # noqa: BLE001
            return type(exc), str(exc)
    return None


def _not_a_record(i):
    return {"content": "a"}


def _surrogate(i):
    m = ConversationMessageRecord(msg_id=f"s{i}", content="ok", channel_id="c")
    object.__setattr__(m, "hlc", "a\ud800")         # found by the escape, named by the Python path
    return m


def _too_large(i):
    return ConversationMessageRecord(msg_id=f"big{i}", content="é" * 600, channel_id="c")


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(codec, "MAX_RECORD_BYTES", 1000)
    monkeypatch.setattr(_encode, "max_record_bytes", 1000)


@pytest.mark.parametrize("at", [0, 1, 150, 299, 300, 301, 598, 599])
@pytest.mark.parametrize("bad", [_not_a_record, _surrogate, _too_large])
def test_an_error_is_the_one_a_record_at_a_time_raises(small_limit, at, bad):
    msgs = [ConversationMessageRecord(msg_id=f"m{i}", content="é" * (i % 50), channel_id="c")
            for i in range(600)]
    msgs[at] = bad(at)
    want = _record_at_a_time(msgs)
    assert want is not None and want[0] in (TypeError, ValueError, RecordTooLargeError)
    assert _raised(msgs) == want
    old = _encode._set_parallel(1 << 60)
    try:
        assert _raised(msgs) == want
    finally:
        _encode._set_parallel(*old)


@pytest.mark.parametrize("first, second", [(_surrogate, _not_a_record), (_too_large, _not_a_record),
                                           (_surrogate, _too_large), (_not_a_record, _surrogate)])
@pytest.mark.parametrize("lo, hi", [(3, 500), (290, 310), (450, 451)])
def test_the_lowest_failing_index_raises_whichever_pass_finds_it(small_limit, first, second, lo, hi):
    # a lone surrogate and a record too large are found by the threads'
    # pass, a wrong type by the first: the first failing record still wins
    for a, b in ((lo, hi), (hi, lo)):
        msgs = [ConversationMessageRecord(msg_id=f"m{i}", content="a", channel_id="c") for i in range(600)]
        msgs[a], msgs[b] = first(a), second(b)
        want = _record_at_a_time(msgs)
        first_bad = min(a, b)
        assert _record_at_a_time(msgs[:first_bad]) is None and _record_at_a_time(msgs[:first_bad + 1]) == want
        assert _raised(msgs) == want


def test_an_error_in_a_tool_call_raises_after_the_records_before_it(monkeypatch):
    def calls_json(rec):
        raise ValueError(f"calls of {rec.msg_id}")

    msgs = [ConversationMessageRecord(msg_id=f"m{i}", content="a", channel_id="c") for i in range(400)]
    msgs[350] = ConversationMessageRecord(msg_id="odd", content="a", channel_id="c",
                                          tool_calls=({"id": "1", "name": "f", "arguments": 1.5},))
    msgs[100] = _surrogate(100)
    with pytest.raises(ValueError, match="hlc"):
        _encode.encode_messages(msgs, ConversationMessageRecord, codec._encode_slow, calls_json)
    msgs[100] = msgs[101]
    with pytest.raises(ValueError, match="calls of odd"):
        _encode.encode_messages(msgs, ConversationMessageRecord, codec._encode_slow, calls_json)


def test_a_batch_changed_while_it_is_spelled_does_not_crash():
    # the strs are held while the worker reads them: each record comes out
    # with one of the values it had, whatever another thread does meanwhile
    # (a subclass's records go through Python in the first pass, where the
    # other thread gets its turns while the worker reads the strs)
    msgs = [(Mine if i % 50 == 0 else ConversationMessageRecord)(msg_id=f"m{i}", content="start", channel_id="c")
            for i in range(2000)]
    values = ["start"] + ["é" * 50 + str(i) for i in range(20)]
    stop = threading.Event()

    def mutate():
        k = 0
        while not stop.is_set():
            k += 1
            for m in msgs[::7]:
                object.__setattr__(m, "content", "".join(values[k % len(values)]))   # (a fresh str each time)
                object.__setattr__(m, "task_id", str(k) * 10)
            tail = msgs[-500:]
            del msgs[-500:]             # (the list itself changes too)
            msgs.extend(tail)

    t = threading.Thread(target=mutate)
    t.start()
    try:
        for _ in range(30):
            bodies, job, keys = codec.encode_batch(msgs, hash_job=True)
            hashes = job.result()
            assert len(bodies) == len(hashes) == len(keys) and len(keys) in (1500, 2000)
            assert keys[0] == b"m0" and all(b.startswith(b'{"msg_id":"m') for b in bodies)
    finally:
        stop.set()
        t.join()
    assert len(msgs) == 2000 and codec.encode_batch(msgs) == _one_thread(msgs)


@pytest.mark.parametrize("min_records", [2, 1 << 60])
def test_a_record_changed_by_python_in_the_first_pass_keeps_a_value_it_had(min_records):
    # the first pass reads every record before the strs are escaped; a
    # later record's Python path (a subclass's to_dict) may change an
    # earlier one's field, and the str it replaced is held till the end
    victims = [ConversationMessageRecord(msg_id=f"v{i}", content=f"old {i:04}" + "é" * 60, channel_id="c")
               for i in range(300)]
    old = [v.content for v in victims]

    class Meddler(ConversationMessageRecord):
        __slots__ = ()

        def to_dict(self):
            for i, v in enumerate(victims):
                object.__setattr__(v, "content", f"new {i:04}" + "ü" * 60)
            old.clear()                 # (the replaced strs' last references)
            junk = [f"junk{i:04}" + "é" * 59 for i in range(5000)]      # (their memory, reused)
            assert junk
            return super().to_dict()

    msgs = [*victims, Meddler(msg_id="meddler", content="m", channel_id="c")]
    saved = _encode._set_parallel(min_records, 1)
    try:
        bodies, _hashes, _keys = codec.encode_batch(msgs)
    finally:
        _encode._set_parallel(*saved)
    for i, body in enumerate(bodies[:-1]):
        assert orjson.loads(body)["content"] in (f"old {i:04}" + "é" * 60, f"new {i:04}" + "ü" * 60)


def test_two_callers_at_once_each_get_their_batch(parallel):
    # one worker: a batch spelled while another holds it goes alone
    batches = [[ConversationMessageRecord(msg_id=f"t{t}-{i}", content="é€" * (i % 40), channel_id="c")
                for i in range(800)] for t in range(3)]
    want = [_one_thread(b) for b in batches]
    got: dict[int, list] = {}

    def run(t):
        got[t] = [codec.encode_batch(batches[t]) for _ in range(15)]

    threads = [threading.Thread(target=run, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g == want[t] for t in range(3) for g in got[t])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_worker():
    msgs = [ConversationMessageRecord(msg_id=f"f{i}", content="ü" * (i % 30), channel_id="c") for i in range(600)]
    want = codec.encode_batch(msgs)         # (the parent's worker runs)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                            # pragma: no cover (the child)
        try:
            ok = codec.encode_batch(msgs) == want
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
