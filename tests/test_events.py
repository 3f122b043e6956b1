"""EventStore and FramedLog: framing, recovery of torn lines, loud damage."""
from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
import threading

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast.errors import (
    CorruptStateCheckpointError,
    FramingError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from rune_fast.events import (
    EVENT_TYPES,
    MAX_LINE,
    EventStore,
    FramedLog,
    RecoveryWarning,
    check_line,
    frame,
    parse_line,
)
from rune_fast.records import TaskStateRecord, canonical_json, payload_hash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H = "ab" * 32


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _write(path, data, mode="wb"):
    with open(path, mode) as f:
        f.write(data)


# ----------------------------------------------------------------- frame

def test_frame_format():
    rest = b',"type":"a"}'
    line = frame(rest)
    assert line == b'{"x":"' + xxhash.xxh3_64_hexdigest(rest).encode() + b'"' + rest + b"\n"
    assert len(line) == 23 + len(rest) + 1
    assert json.loads(line) == {"x": xxhash.xxh3_64_hexdigest(rest), "type": "a"}
    assert check_line(line[:-1]) == ""
    assert parse_line(line[:-1]) == {"type": "a"}


@pytest.mark.parametrize("rest", [b'"type":"a"}', b',"type":"a"', b',"a":"\n"}', b""])
def test_frame_refuses_bad_rest(rest):
    with pytest.raises(FramingError):
        frame(rest)


def test_frame_refuses_oversized_line():
    with pytest.raises(FramingError, match="MAX_LINE"):
        frame(b',"a":"' + b"x" * MAX_LINE + b'"}')


def test_check_line_reasons():
    line = frame(b',"a":1}')[:-1]
    assert check_line(line[:10]) == "bad prefix"
    assert check_line(b"[" + line[1:]) == "bad prefix"
    assert check_line(line[:6] + b"Z" + line[7:]) == "bad hex"
    assert check_line(line[:-2] + b"2}") == "checksum mismatch"


# ----------------------------------------------------------------- envelopes

def test_append_iterate_and_payload_hash(tmp_path):
    path = tmp_path / "run" / "events.jsonl"
    record = TaskStateRecord(title="t", channel_id="c")
    with EventStore(path) as store:
        o1 = store.append("task_state.created", record.task_id, payload_hash(record), channel_id="c")
        o2 = store.append_durable("conversation.deleted", "msg_1", payload_hash({"msg_id": "msg_1"}))
        assert o1 == 0 and o2 > 0
        assert store.size == len(_read(path))
        envs = list(store.iter_envelopes())
        assert [e["offset"] for e in envs] == [o1, o2]
        assert envs[0]["type"] == "task_state.created" and envs[0]["id"] == record.task_id
        assert envs[0]["payload_hash"] == hashlib.sha256(canonical_json(record.to_dict())).hexdigest()
        assert envs[0]["channel_id"] == "c"
        assert isinstance(envs[0]["ts"], float)
        assert envs[1]["payload_hash"] == hashlib.sha256(b'{"msg_id":"msg_1"}').hexdigest()
        assert [e["id"] for e in store.iter_envelopes(start=o2)] == ["msg_1"]
        assert store.verify() == []
    for raw in _read(path).splitlines():
        obj = json.loads(raw)
        assert obj["x"] == xxhash.xxh3_64_hexdigest(raw[23:])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_close_syncs_what_was_appended_and_sync_after_close_is_a_no_op(tmp_path, monkeypatch):
    """A store shared by repositories may be closed before them: its close
    syncs the appends not yet synced, and their later sync has nothing to do.
    Appending after the close still raises."""
    path = tmp_path / "events.jsonl"
    store = EventStore(path)
    syncs = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])
    store.append("conversation.deleted", "msg_1", payload_hash({"msg_id": "msg_1"}))
    store.close()
    assert len(syncs) == 1
    store.sync()
    store.close()
    assert len(syncs) == 1
    with pytest.raises(StoreClosedError):
        store.append("conversation.deleted", "msg_2", payload_hash({"msg_id": "msg_2"}))
    synced = EventStore(tmp_path / "other.jsonl")
    synced.append("conversation.deleted", "msg_1", payload_hash({"msg_id": "msg_1"}))
    synced.sync()
    synced.close()                       # nothing appended since the sync: no second one
    assert len(syncs) == 2
    assert [e["id"] for e in EventStore(path).iter_envelopes()] == ["msg_1"]


def test_append_many_one_write(tmp_path):
    store = EventStore(tmp_path / "events.jsonl")
    store.append("conversation.message", "msg_0", H)
    offsets = store.append_many([
        ("conversation.message", "msg_1", H),
        ("conversation.message", "msg_2", H, {"channel_id": "c"}),
    ])
    store.sync()
    envs = list(store.iter_envelopes())
    assert [e["offset"] for e in envs[1:]] == offsets
    assert [e["id"] for e in envs] == ["msg_0", "msg_1", "msg_2"]
    assert store.append_many([]) == []
    store.close()


@pytest.mark.parametrize("args, field", [
    (("task_state.bogus", "t", H), "type"),
    (("task_state.created", "", H), "id"),
    (("task_state.created", "t", "xyz"), "payload_hash"),
    (("task_state.created", "t", H.upper()), "payload_hash"),
])
def test_envelope_validation(tmp_path, args, field):
    with EventStore(tmp_path / "events.jsonl") as store:
        with pytest.raises(ValueError, match=field):
            store.append(*args)
        with pytest.raises(ValueError, match="reserved"):
            store.append("task_state.created", "t", H, ts=1)
        with pytest.raises(ValueError):
            store.append("task_state.created", "t", H, blob=object())
        assert store.size == 0


def test_event_types():
    assert EVENT_TYPES == {"task_state.created", "task_state.amended", "task_state.transition",
                           "task_state.imported", "conversation.message", "conversation.deleted"}


def test_closed_and_read_only(tmp_path):
    path = tmp_path / "events.jsonl"
    store = EventStore(path)
    store.append_durable("conversation.message", "m", H)
    store.close()
    store.close()
    with pytest.raises(StoreClosedError):
        store.append("conversation.message", "m2", H)
    with pytest.raises(StoreClosedError):
        list(store.iter_envelopes())
    reader = EventStore(path, read_only=True)
    assert [e["id"] for e in reader.iter_envelopes()] == ["m"]
    with pytest.raises(ReadOnlyStoreError):
        reader.append("conversation.message", "m3", H)
    with pytest.raises(FileNotFoundError):
        EventStore(tmp_path / "nope.jsonl", read_only=True)


def test_threads_append_concurrently(tmp_path):
    store = EventStore(tmp_path / "events.jsonl")

    def work(k):
        for i in range(200):
            store.append("conversation.message", f"msg_{k}_{i}", H)
        store.sync()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [e["id"] for e in store.iter_envelopes()]
    assert sorted(ids) == sorted(f"msg_{k}_{i}" for k in range(4) for i in range(200))
    store.close()


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from rune_fast.events import EventStore
    store = EventStore(sys.argv[2])
    for i in range(300):
        store.append("conversation.message", f"{sys.argv[3]}_{i}", "ab" * 32, pad="p" * (i % 50))
    store.sync()
""")


def test_processes_append_to_one_file(tmp_path):
    path = tmp_path / "events.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, ROOT, str(path), f"p{k}"]) for k in range(3)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    with EventStore(path) as store:
        ids = [e["id"] for e in store.iter_envelopes()]
        assert store.verify() == []
    assert len(ids) == 900 and len(set(ids)) == 900


# ----------------------------------------------------------------- recovery

def _three_lines(path):
    with EventStore(path) as store:
        for i in range(3):
            store.append("conversation.message", f"msg_{i}", H)
        store.sync()
    return _read(path)


def test_torn_final_line_is_quarantined(tmp_path, caplog):
    path = tmp_path / "events.jsonl"
    good = _three_lines(path)
    torn = frame(b',"type":"conversation.message","id":"msg_3"}')[:-9]
    _write(path, good + torn)
    with pytest.warns(RecoveryWarning, match="torn"):
        store = EventStore(path)
    assert store.size == len(good)
    assert [e["id"] for e in store.iter_envelopes()] == ["msg_0", "msg_1", "msg_2"]
    (q,) = store.quarantined
    assert q["offset"] == len(good) and q["length"] == len(torn)
    assert _read(q["quarantine"]) == torn
    assert stat.S_IMODE(os.stat(q["quarantine"]).st_mode) == 0o600
    assert any("torn" in r.getMessage() for r in caplog.records)
    # appends continue on a clean boundary
    store.append_durable("conversation.message", "msg_4", H)
    assert [e["id"] for e in store.iter_envelopes()][-1] == "msg_4"
    store.close()
    # a second tear goes to a new quarantine file
    _write(path, b'{"x":"01', mode="ab")
    with pytest.warns(RecoveryWarning):
        again = EventStore(path)
    assert again.quarantined[0]["quarantine"] != q["quarantine"]
    again.close()


def test_torn_only_line(tmp_path):
    path = tmp_path / "events.jsonl"
    _write(path, b'{"x":"0123')
    with pytest.warns(RecoveryWarning):
        store = EventStore(path)
    assert store.size == 0 and list(store.iter_envelopes()) == []
    store.close()


def test_zero_padding_is_not_damage(tmp_path):
    path = tmp_path / "events.jsonl"
    good = _three_lines(path)
    _write(path, good + b"\0" * 4096)
    store = EventStore(path)  # no warning (filterwarnings=error would fail)
    assert store.quarantined == []
    assert store.size == len(good)
    store.append_durable("conversation.message", "msg_3", H)
    assert len(list(store.iter_envelopes())) == 4
    store.close()


def test_damaged_final_complete_line_is_loud(tmp_path):
    path = tmp_path / "events.jsonl"
    good = _three_lines(path)
    last_start = good.rstrip(b"\n").rfind(b"\n") + 1
    damaged = bytearray(good)
    damaged[last_start + 40] ^= 0x01
    _write(path, bytes(damaged))
    with pytest.raises(CorruptStateCheckpointError) as info:
        EventStore(path)
    assert info.value.offset == last_start and info.value.path == str(path)
    assert _read(path) == bytes(damaged)  # nothing was changed


def test_damaged_middle_line_found_by_iteration_and_verify(tmp_path):
    path = tmp_path / "events.jsonl"
    good = _three_lines(path)
    second = good.find(b"\n") + 1
    damaged = bytearray(good)
    damaged[second + 50] ^= 0x04
    _write(path, bytes(damaged))
    store = EventStore(path)
    with pytest.raises(CorruptStateCheckpointError) as info:
        list(store.iter_envelopes())
    assert info.value.offset == second and str(path) in str(info.value)
    problems = store.verify()
    assert [(p["path"], p["offset"]) for p in problems] == [(str(path), second)]
    store.close()


def test_verify_reports_bad_envelopes(tmp_path):
    path = tmp_path / "events.jsonl"
    log = FramedLog(path)
    log.append_bytes(frame(b',"type":"nope","id":"a","payload_hash":"' + H.encode() + b'"}'))
    log.append_bytes(frame(b',"type":"conversation.message","id":"","payload_hash":"' + H.encode() + b'"}'))
    log.append_bytes(frame(b',"type":"conversation.message","id":"m","payload_hash":"12"}'))
    log.sync()
    log.close()
    with EventStore(path) as store:
        problems = store.verify()
    assert len(problems) == 3
    assert [p["offset"] for p in problems] == sorted(p["offset"] for p in problems)


def test_every_flipped_byte_of_a_line_is_detected(tmp_path):
    path = tmp_path / "events.jsonl"
    good = _three_lines(path)
    first_len = good.find(b"\n")
    for i in range(first_len):
        damaged = bytearray(good)
        damaged[i] ^= 0x02
        _write(path, bytes(damaged))
        with EventStore(path) as store:
            problems = store.verify()
            assert problems and problems[0]["offset"] == 0, i
            with pytest.raises(CorruptStateCheckpointError):
                list(store.iter_envelopes())


def test_read_only_skips_incomplete_final_line(tmp_path):
    path = tmp_path / "events.jsonl"
    good = _three_lines(path)
    _write(path, good + b'{"x":"00')
    reader = EventStore(path, read_only=True)
    assert len(list(reader.iter_envelopes())) == 3
    assert reader.quarantined == []
    assert _read(path) == good + b'{"x":"00'  # unchanged


def test_torn_line_followed_by_zero_padding(tmp_path):
    path = tmp_path / "events.jsonl"
    good = _three_lines(path)
    _write(path, good + b'{"x":"0011' + b"\0" * 10000)
    with pytest.warns(RecoveryWarning):
        store = EventStore(path)
    assert _read(store.quarantined[0]["quarantine"]) == b'{"x":"0011'
    assert store.size == len(good)
    store.close()


def test_long_garbage_without_newline_is_damage(tmp_path, monkeypatch):
    import rune_fast.framed_log as framed_log
    monkeypatch.setattr(framed_log, "MAX_LINE", 1000)
    monkeypatch.setattr(framed_log, "_READ_CHUNK", 256)
    path = tmp_path / "events.jsonl"
    good = _three_lines(path)
    _write(path, good + b"y" * 3000)
    with pytest.raises(CorruptStateCheckpointError):
        EventStore(path)


def test_large_zero_padding_read_only(tmp_path, monkeypatch):
    import rune_fast.framed_log as framed_log
    monkeypatch.setattr(framed_log, "MAX_LINE", 1000)
    monkeypatch.setattr(framed_log, "_READ_CHUNK", 256)
    path = tmp_path / "events.jsonl"
    good = _three_lines(path)
    _write(path, good + b"\0" * 5000)
    reader = EventStore(path, read_only=True)
    assert len(list(reader.iter_envelopes())) == 3
    assert reader.verify() == []
    store = EventStore(path)
    assert store.size == len(good) and store.quarantined == []
    store.close()


def test_append_encoded(tmp_path):
    with EventStore(tmp_path / "events.jsonl") as store:
        lines = store.encode("conversation.message", "m1", H) + store.encode("conversation.deleted", "m1", H)
        assert store.append_encoded(lines) == 0
        store.sync()
        assert [e["type"] for e in store.iter_envelopes()] == ["conversation.message", "conversation.deleted"]
        with pytest.raises(ValueError):
            store.append_encoded(b'{"x":"00"')


def _half_written(path: str, line: bytes):
    """Another appender in the middle of its write: a descriptor of its own
    holding the shared lock, half the line written. Returns (fd, rest)."""
    import fcntl
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.write(fd, line[:len(line) // 2])
    return fd, line[len(line) // 2:]


def _finish(fd: int, rest: bytes, delay: float) -> threading.Thread:
    import fcntl
    import time

    def run():
        time.sleep(delay)
        os.write(fd, rest)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_line_end_waits_for_an_append_in_flight(tmp_path):
    """line_end() is never inside another appender's line: it waits for the
    shared lock the appender holds while writing (found by a thread stress
    test: a conversation checkpoint recorded the size of events.jsonl while
    a task envelope several pages long was half written, and the store then
    refused to reopen)."""
    path = str(tmp_path / "events.jsonl")
    store = EventStore(path)
    store.append("task_state.created", "task_1", H)
    fd, rest = _half_written(path, store.encode("task_state.created", "task_2", H, pad="p" * 20000))
    t = _finish(fd, rest, 0.2)
    end = store.line_end()
    t.join()
    assert end == os.path.getsize(path)
    assert [e["id"] for e in store.iter_envelopes(0)] == ["task_1", "task_2"]
    # the same through a read-only view of the file
    fd, rest = _half_written(path, store.encode("task_state.created", "task_3", H))
    t = _finish(fd, rest, 0.2)
    assert EventStore(path, read_only=True).line_end() == os.path.getsize(path)
    t.join()
    store.close()


def test_verify_does_not_report_an_append_in_flight(tmp_path):
    """verify() checks the lines complete when it starts: another
    appender's envelope being written is not an incomplete line."""
    path = str(tmp_path / "events.jsonl")
    store = EventStore(path)
    store.append("task_state.created", "task_1", H)
    fd, rest = _half_written(path, store.encode("task_state.created", "task_2", H, pad="p" * 20000))
    t = _finish(fd, rest, 0.2)
    assert store.verify() == []
    t.join()
    assert store.verify() == []
    # a line cut short with no appender at it is still reported
    with open(path, "ab") as f:
        f.write(b'{"x":"0')
    assert [p["problem"] for p in store.verify()] == ["incomplete final line (torn, or an append in flight)"]
    store.close()


def test_next_line_start(tmp_path):
    path = str(tmp_path / "events.jsonl")
    store = EventStore(path)
    a = store.append("task_state.created", "task_1", H)
    b = store.append("task_state.created", "task_2", H)
    size = store.size
    assert [store.next_line_start(o) for o in (0, a, b, size)] == [0, a, b, size]
    assert store.next_line_start(b - 5) == b and store.next_line_start(a + 1) == b
    assert store.next_line_start(b + 1) == size and store.next_line_start(size + 7) == size + 7
    store.close()


_PIECE = st.one_of(
    st.tuples(st.just("line"), st.text("abé\"\\\n量", max_size=12)),
    st.tuples(st.just("flip"), st.integers(0, 40)),
    st.tuples(st.just("raw"), st.sampled_from([b"\n", b"\x00" * 7, b"{}\n", b'{"x":"00000000000000zz","a":1}\n',
                                               b'{"x":"0123456789ABCDEF","a":1}\n', b"\x00\x00\n", b"torn"])),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(_PIECE, max_size=12), chunk=st.sampled_from([64, 1 << 20]))
def test_the_compiled_line_check_of_verify_answers_as_the_python_loop(tmp_path_factory, pieces, chunk):
    """FramedLog.verify checks lines from the start in compiled code and
    hands the rest, from the first line it did not take, to the Python
    loop: its problems and the lines handed to ``sound`` are the plain
    loop's, whatever the file holds (damaged lines, zero bytes, a torn
    end, lines across the compiled pass's reads)."""
    import rune_fast.framed_log as fl
    path = str(tmp_path_factory.mktemp("l") / "log.jsonl")
    data = bytearray()
    for kind, v in pieces:
        if kind == "line":
            data += fl.frame_object({"t": v}) + b"\n"
        elif kind == "flip" and data:
            data[v % len(data)] ^= 0x10
        elif kind == "raw":
            data += v
    with open(path, "wb") as f:
        f.write(bytes(data))
    log = FramedLog(path, read_only=True)
    results = []
    for fast in (True, False):
        seen: list = []

        def sound(offset: int, line: bytes) -> str:
            seen.append((offset, bytes(line)))
            return "odd" if b'"t":"a"' in line else ""
        was = fl._READ_CHUNK
        fl._READ_CHUNK = chunk // 16 or 1
        try:
            if not fast:
                log._verify_sound = lambda end, sound, problems, taken=None: 0      # (the plain loop alone)
            results.append((log.verify(len(data), sound), seen))
        finally:
            fl._READ_CHUNK = was
    assert results[0] == results[1]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.text(max_size=8)), max_size=6))
def test_encode_deleted_is_encode_of_each(pairs):
    """encode_deleted: the lines encode() makes of each deletion's
    envelope (their times aside), each a sound frame."""
    lines = EventStore.encode_deleted(pairs).splitlines(keepends=True)
    assert len(lines) == len(pairs)
    for line, (mid, ch) in zip(lines, pairs):
        assert check_line(line[:-1]) == ""
        got = parse_line(line[:-1])
        want = parse_line(EventStore.encode("conversation.deleted", mid, payload_hash({"msg_id": mid}),
                                            channel_id=ch)[:-1])
        assert abs(got.pop("ts") - want.pop("ts")) < 60
        assert got == want and list(got) == list(want)
    with pytest.raises(ValueError):
        EventStore.encode_deleted([("", "c")])
