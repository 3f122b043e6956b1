"""rune_fast._log: hashes, the frame, the frame scan and the tail writer."""
from __future__ import annotations

import os
import stat
import threading

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from _core_support import line
from rune_fast import _log
from rune_fast.errors import (DurabilityError, FramingError, RuneError,
                              StoreClosedError)


@given(st.binary(max_size=300))
def test_hashes_match_reference_xxhash(data):
    assert _log.hash64(data) == xxhash.xxh3_64_intdigest(data)
    assert _log.digest128(data) == xxhash.xxh3_128_hexdigest(data)
    assert _log.hash64(memoryview(data)) == _log.hash64(bytearray(data))


def test_long_inputs_hash_as_the_reference_whatever_kernel_the_cpu_gets():
    """Inputs over 240 bytes take XXH3's long-input kernel, which the
    portable build picks at run time (csrc/rf_xxhash.h: AVX2 where the
    CPU has it): every length and alignment hashes as xxhash does, and a
    line framed and checked with it verifies."""
    import random
    rng = random.Random(7)
    buf = rng.randbytes(20_000)
    for n in list(range(230, 1100)) + list(range(1100, 20_000, 331)):
        for start in (0, 1, 7):
            data = buf[start:start + n]
            assert _log.hash64(data) == xxhash.xxh3_64_intdigest(data), (n, start)
    rest = b',"k":"m","r":{"content":"' + b"x" * 5000 + b'"}}'
    ln = _log.frame(rest)
    assert _log.check_line(ln, 0) == len(ln) - 1


def test_hash_rejects_non_buffers():
    with pytest.raises(FramingError, match="bytes-like"):
        _log.hash64("text")
    with pytest.raises(RuneError):
        _log.digest128(12)


def test_frame_layout():
    r = b',"a":1}'
    ln = _log.frame(r)
    assert ln == b'{"x":"%016x"' % xxhash.xxh3_64_intdigest(r) + r + b"\n"
    assert len(ln) == _log.PREFIX_LEN + len(r) + 1
    assert _log.frame_many([r, b',"b":2}']) == ln + _log.frame(b',"b":2}')
    assert _log.frame_many([]) == b""


@pytest.mark.parametrize("bad, what", [
    (b'"a":1}', "start with"), (b',"a":1', "end with"), (b"", "start with"),
    (b',"a":"\n"}', "newline"), (b",}", "start with"),
])
def test_frame_rejects_bad_rest(bad, what):
    with pytest.raises(FramingError, match=what):
        _log.frame(bad)
    with pytest.raises(FramingError):
        _log.frame_many([b',"ok":1}', bad])


def test_frame_rejects_too_long_and_non_bytes():
    big = b',"a":"' + b"x" * (_log.MAX_LINE - _log.PREFIX_LEN - 8) + b'"}'
    with pytest.raises(FramingError, match="MAX_LINE"):
        _log.frame(big)
    ok = b',"a":"' + b"x" * (_log.MAX_LINE - _log.PREFIX_LEN - 9) + b'"}'
    assert len(_log.frame(ok)) == _log.MAX_LINE
    with pytest.raises(FramingError):
        _log.frame("not bytes")
    with pytest.raises(FramingError):
        _log.frame_many([None])


def lines3():
    return [line("a", "c"), line("b", "c", content="x" * 50), line("c", "d")]


def test_scan_good_lines():
    ls = lines3()
    data = b"".join(ls)
    s = _log.scan_frames(data)
    assert s.offsets.dtype == np.int64
    assert s.offsets.tolist() == [0, len(ls[0]), len(ls[0]) + len(ls[1])]
    assert s.lengths.tolist() == [len(x) - 1 for x in ls]
    assert (s.good_end, s.torn_offset, s.damaged_offset, s.damage) == (len(data), -1, -1, "")
    # a sub-region that starts at a line
    s2 = _log.scan_frames(data, len(ls[0]), len(ls[0]) + len(ls[1]))
    assert s2.offsets.tolist() == [len(ls[0])] and s2.good_end == len(ls[0]) + len(ls[1])
    assert "FrameScan" in repr(s)


def test_scan_empty_and_bad_region():
    s = _log.scan_frames(b"")
    assert len(s.offsets) == 0 and s.good_end == 0 and s.torn_offset == -1
    with pytest.raises(FramingError):
        _log.scan_frames(b"abc", 2, 1)
    with pytest.raises(FramingError):
        _log.scan_frames(b"abc", 0, 10)
    with pytest.raises(FramingError):
        _log.scan_frames(None)


def test_scan_torn_and_preallocated_tail():
    ls = lines3()
    data = b"".join(ls)
    torn = data + ls[0][:10]
    s = _log.scan_frames(torn)
    assert s.torn_offset == len(data) and s.good_end == len(data) and s.damaged_offset == -1
    zeros = data + b"\0" * 4096
    s = _log.scan_frames(zeros)
    assert s.torn_offset == -1 and s.good_end == len(data) and len(s.offsets) == 3
    # a torn line followed by preallocated zeros is still torn
    s = _log.scan_frames(data + b'{"x":' + b"\0" * 100)
    assert s.torn_offset == len(data)


@pytest.mark.parametrize("mutate, reason", [
    (lambda l: l[:30] + bytes([l[30] ^ 1]) + l[31:], "checksum mismatch"),
    (lambda l: b"[" + l[1:], "bad prefix"),
    (lambda l: l[:6] + b"G" + l[7:], "bad checksum hex"),
    (lambda l: l[:6] + b"A" + l[7:], "bad checksum hex"),
    (lambda l: l[:-2] + b" \n", "bad rest"),
    (lambda l: b"\n", "bad prefix"),
])
def test_scan_reports_damage_at_its_offset(mutate, reason):
    ls = lines3()
    bad = mutate(ls[1])
    data = ls[0] + bad + ls[2]
    s = _log.scan_frames(data)
    assert s.damaged_offset == len(ls[0]) and s.damage == reason
    assert s.good_end == len(ls[0]) and s.offsets.tolist() == [0]
    assert _log.check_line(data, len(ls[0])) == -1
    assert _log.line_verdict(data, len(ls[0])) == reason


def test_complete_final_line_that_fails_is_damage_not_tear():
    ls = lines3()
    bad = ls[2][:40] + bytes([ls[2][40] ^ 4]) + ls[2][41:]
    s = _log.scan_frames(ls[0] + ls[1] + bad)
    assert s.damaged_offset == len(ls[0]) + len(ls[1]) and s.torn_offset == -1


def test_check_line():
    ls = lines3()
    data = b"".join(ls)
    assert _log.check_line(data, 0) == len(ls[0]) - 1
    assert _log.check_line(data, len(ls[0])) == len(ls[1]) - 1
    assert _log.check_line(data, 1) == -1
    assert _log.check_line(data, -1) == -1
    assert _log.check_line(data, len(data)) == -1
    assert _log.check_line(data[:-1], len(ls[0]) + len(ls[1])) == -1   # no newline
    assert _log.line_verdict(data[:-1], len(ls[0]) + len(ls[1])) == "torn"
    assert _log.line_verdict(data, 0) == ""


# ---- TailWriter -----------------------------------------------------------

def test_writer_appends_at_offsets(tmp_path):
    p = tmp_path / "seg.jsonl"
    with _log.TailWriter(p) as w:
        assert w.size == 0 and not w.closed
        a, b = line("a", "c"), line("b", "c")
        assert w.append(a) == 0
        assert w.append(memoryview(b)) == len(a)
        assert w.append(b"") == len(a) + len(b)
        w.sync()
        assert w.size == len(a) + len(b)
        assert isinstance(w.fileno(), int)
        assert "TailWriter" in repr(w)
    assert w.closed
    assert p.read_bytes() == a + b
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    w2 = _log.TailWriter(str(p), create=False)
    assert w2.size == len(a) + len(b)
    assert w2.append(a) == len(a) + len(b)
    w2.close()
    w2.close()


def test_writer_errors(tmp_path):
    with pytest.raises(FileNotFoundError) as ei:
        _log.TailWriter(tmp_path / "missing", create=False)
    assert "missing" in str(ei.value)
    w = _log.TailWriter(tmp_path / "x")
    with pytest.raises(FramingError):
        w.append("text")
    w.close()
    for call in (lambda: w.append(b"x"), w.sync, lambda: w.truncate(0), w.fileno):
        with pytest.raises(StoreClosedError, match="closed"):
            call()


def test_writer_truncate(tmp_path):
    w = _log.TailWriter(tmp_path / "t")
    w.append(b"0123456789")
    w.truncate(4)
    assert w.size == 4 and w.append(b"ab") == 4
    with pytest.raises(FramingError):
        w.truncate(100)
    w.close()
    assert (tmp_path / "t").read_bytes() == b"0123ab"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_write_failure_is_loud_and_sticky():
    w = _log.TailWriter("/dev/full", create=False)
    with pytest.raises(DurabilityError, match="/dev/full") as ei:
        w.append(b"x" * 100)
    assert isinstance(ei.value.__cause__, OSError)
    with pytest.raises(DurabilityError, match="refuses"):
        w.append(b"y")
    w.close()


def test_concurrent_appends_do_not_interleave(tmp_path):
    p = tmp_path / "c"
    w = _log.TailWriter(p)
    offs = {}

    def run(k):
        mine = []
        for j in range(200):
            ln = line(f"{k}-{j}", "c", content="z" * (j % 37))
            mine.append((w.append(ln), ln))
            if j % 50 == 0:
                w.sync()
        offs[k] = mine

    ts = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    w.close()
    data = p.read_bytes()
    s = _log.scan_frames(data)
    assert len(s.offsets) == 800 and s.good_end == len(data)
    for mine in offs.values():
        for off, ln in mine:
            assert data[off:off + len(ln)] == ln


def test_pwrite_all_writes_every_byte_at_its_offset(tmp_path):
    p = tmp_path / "t"
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _log.pwrite_all(fd, b"abc", 5)
        _log.pwrite_all(fd, memoryview(b"xyz" * 5000), 8)     # larger than one page
        _log.pwrite_all(fd, b"", 0)
        assert p.read_bytes() == b"\0" * 5 + b"abc" + b"xyz" * 5000
        with pytest.raises(ValueError, match="negative offset"):
            _log.pwrite_all(fd, b"a", -1)
        with pytest.raises(FramingError):
            _log.pwrite_all(fd, "text", 0)
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="pwrite of 1 bytes at offset 0") as ei:
        _log.pwrite_all(fd, b"a", 0)                          # closed descriptor
    assert ei.value.errno == 9


def test_locked_write_appends_under_a_shared_lock(tmp_path):
    import fcntl
    p = tmp_path / "ev"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    other = os.open(p, os.O_RDONLY)
    try:
        assert _log.locked_write(fd, b"one\n") == 4
        # an exclusive holder (another store's recovery) makes it wait
        fcntl.flock(other, fcntl.LOCK_EX)
        done = threading.Event()
        t = threading.Thread(target=lambda: (_log.locked_write(fd, b"two\n"), done.set()))
        t.start()
        assert not done.wait(0.2)
        assert p.read_bytes() == b"one\n"
        fcntl.flock(other, fcntl.LOCK_UN)
        t.join(5)
        assert done.is_set() and p.read_bytes() == b"one\ntwo\n"
        # and it released its own lock: an exclusive lock is free again
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(other, fcntl.LOCK_UN)
    finally:
        os.close(fd)
        os.close(other)
    with pytest.raises(OSError, match="flock") as ei:
        _log.locked_write(fd, b"x")                            # closed descriptor
    assert ei.value.errno == 9


def test_locked_write_waiting_for_the_lock_runs_signal_handlers(tmp_path):
    """A signal while it waits for the lock runs Python's handlers: an
    exception a handler raises comes out at once, nothing written."""
    import fcntl
    import signal
    import time

    class Alarm(Exception):
        pass

    def on_alarm(signum, frame):
        raise Alarm()

    p = tmp_path / "ev"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    holder = os.open(p, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    safety = threading.Timer(5.0, lambda: fcntl.flock(holder, fcntl.LOCK_UN))
    safety.start()
    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        with pytest.raises(Alarm):
            _log.locked_write(fd, b"x\n")
        assert time.monotonic() - t0 < 3.0
        assert p.read_bytes() == b""
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        safety.cancel()
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)
        os.close(fd)


def test_a_lock_that_cannot_be_taken_leaves_the_event_store_writable(tmp_path, monkeypatch):
    from rune_fast import framed_log
    from rune_fast.errors import DurabilityError as DE
    from rune_fast.events import EventStore
    store = EventStore(tmp_path / "events.jsonl")
    real = framed_log.locked_write

    def no_lock(fd, data):
        exc = OSError(37, "No locks available (flock(LOCK_SH))")
        exc.step = 0
        raise exc
    monkeypatch.setattr(framed_log, "locked_write", no_lock)
    with pytest.raises(DE, match="No locks available"):
        store.append("conversation.message", "id1", "0" * 64)
    monkeypatch.setattr(framed_log, "locked_write", real)
    store.append("conversation.message", "id2", "0" * 64)      # nothing was written: it goes on
    store.sync()
    store.close()
