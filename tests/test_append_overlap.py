"""append_many of a large batch: the tail's fdatasync runs in a C thread of its
own (rune_fast._log.BackgroundSync) while the batch is indexed, cached and
journaled, and nothing is acknowledged before the sync returned; its failure
is a DurabilityError naming the tail, reported to every waiter, after which
the store refuses writes. The decode cache's compiled batch put
(LocCache.put_appended) holds what the Python loop it replaces held."""
from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rune_fast._conv import tuning
from rune_fast._conv.common import _own
from rune_fast._conv.reads import record_bytes
from rune_fast._index import LocCache
from rune_fast._log import BackgroundSync
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.errors import DurabilityError
from rune_fast.events import EventStore
from rune_fast.records import ConversationMessageRecord
from rune_fast.segments import TailFile

BIG = tuning.SYNC_OVERLAP_MIN


def msg(i: int, channel: str = "ch", calls: tuple = ()) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"msg_{i:08d}", channel_id=channel, content=f"message {i} é",
                                     tool_calls=calls, ts=1_700_000_000.0 + i)


# ---------------------------------------------------------------- BackgroundSync
def test_background_sync_syncs_a_file_and_names_a_failure(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x" * 10_000)
        job = BackgroundSync(fd)
        job.wait()
        job.wait()                          # (a second wait reports the same: nothing)
    finally:
        os.close(fd)
    r, w = os.pipe()                        # fdatasync of a pipe: EINVAL
    try:
        job = BackgroundSync(r)
        with pytest.raises(OSError) as info:
            job.wait()
        assert info.value.errno is not None
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(OSError):            # no such descriptor: the dup fails
        BackgroundSync(-1)


def test_an_unwaited_background_sync_is_joined_when_dropped(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"y" * 1000)
    BackgroundSync(fd)                      # dropped at once: joined, its dup closed
    os.close(fd)


# ------------------------------------------------------------ the repository
def _spy(monkeypatch) -> dict[str, int]:
    calls = {"begin": 0, "end": 0, "sync": 0}
    begin, end, sync = TailFile.sync_begin, TailFile.sync_end, TailFile.sync

    def spy_begin(self):
        calls["begin"] += 1
        return begin(self)

    def spy_end(self, job):
        end(self, job)
        calls["end"] += 1

    def spy_sync(self):
        calls["sync"] += 1
        return sync(self)

    monkeypatch.setattr(TailFile, "sync_begin", spy_begin)
    monkeypatch.setattr(TailFile, "sync_end", spy_end)
    monkeypatch.setattr(TailFile, "sync", spy_sync)
    return calls


def test_a_large_batch_is_synced_in_the_background_before_it_returns(tmp_path, monkeypatch):
    calls = _spy(monkeypatch)
    with ConversationStateRepository(tmp_path, compact_every=10**9) as repo:
        at_open = calls["sync"]
        assert repo.append_many([msg(i) for i in range(BIG)]) == BIG
        # one sync, begun after the write and ended before the return
        assert calls == {"begin": 1, "end": 1, "sync": at_open}
        repo.append(msg(10**6))
        repo.append_many([msg(10**6 + i) for i in range(1, 4)])
        assert calls["begin"] == 1 and calls["sync"] == at_open + 2   # small ones sync in their thread
        assert repo.get_message(msg(3).msg_id).status is ReadStatus.FOUND_VERIFIED
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == BIG + 4


def test_mode_none_starts_no_sync(tmp_path, monkeypatch):
    calls = _spy(monkeypatch)
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**9) as repo:
        repo.append_many([msg(i) for i in range(BIG)])
    assert calls["begin"] == 0


class _FailingJob:
    def wait(self) -> None:
        raise OSError(5, "Input/output error (injected)")


def test_a_failed_background_sync_fails_the_call_and_stops_writes(tmp_path, monkeypatch):
    with ConversationStateRepository(tmp_path, compact_every=10**9) as repo:
        repo.append(msg(0))
        monkeypatch.setattr(TailFile, "sync_begin", lambda self: _FailingJob())
        with pytest.raises(DurabilityError) as info:
            repo.append_many([msg(i) for i in range(1, BIG + 1)])
        assert "conversation_tail" in str(info.value) and "injected" in str(info.value)
        monkeypatch.undo()
        with pytest.raises(DurabilityError):
            repo.append(msg(10**6))
        with pytest.raises(DurabilityError):
            repo.append_many([msg(10**6 + i) for i in range(1, BIG + 1)])
        assert repo.get_message(msg(0).msg_id).status is ReadStatus.FOUND_VERIFIED
    with ConversationStateRepository(tmp_path) as repo:     # a reopen writes again
        assert repo.get_message(msg(0).msg_id).status is ReadStatus.FOUND_VERIFIED
        repo.append_many([msg(2 * 10**6 + i) for i in range(BIG)])


def test_a_failed_journal_write_ends_the_started_sync(tmp_path, monkeypatch):
    """The journal fails after the sync began: the call fails naming the
    journal, the sync is ended (no waiter hangs; close returns)."""
    with ConversationStateRepository(tmp_path, compact_every=10**9) as repo:
        def boom(self, *a, **k):
            raise OSError(28, "No space left on device (injected)")

        monkeypatch.setattr(EventStore, "append_encoded", boom)
        with pytest.raises(DurabilityError) as info:
            repo.append_many([msg(i) for i in range(BIG)])
        assert "events" in str(info.value)
        monkeypatch.undo()
        with pytest.raises(DurabilityError):
            repo.append(msg(10**6))
    with ConversationStateRepository(tmp_path) as repo:     # the lines are in the tail
        assert len(repo) == BIG


@pytest.mark.parametrize("durability", ["fsync", "batch"])
def test_threads_mixing_large_and_single_appends_all_land(tmp_path, durability):
    with ConversationStateRepository(tmp_path, durability=durability, compact_every=256) as repo:
        errors: list[BaseException] = []

        def big(t: int) -> None:
            try:
                for b in range(4):
                    base = (t * 100 + b) * 1000
                    assert repo.append_many([msg(base + i, channel=f"c{t}") for i in range(BIG * 2)]) == BIG * 2
            except BaseException as exc:
                errors.append(exc)

        def small(t: int) -> None:
            try:
                for i in range(40):
                    assert repo.append(msg(10**8 + t * 1000 + i, channel="s"))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=big, args=(t,)) for t in range(2)]
        threads += [threading.Thread(target=small, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        assert len(repo) == 2 * 4 * BIG * 2 + 80
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == 2 * 4 * BIG * 2 + 80
        assert repo.verify().ok


# ------------------------------------------------- LocCache.put_appended
_calls = st.lists(st.fixed_dictionaries({"id": st.text(max_size=4), "name": st.sampled_from(["f", "g"]),
                                         "arguments": st.dictionaries(st.text(max_size=3), st.integers(),
                                                                      max_size=2)}),
                  max_size=2).map(tuple)
_recs = st.lists(st.tuples(st.text(max_size=30), _calls), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(recs=_recs, data=st.data())
def test_put_appended_holds_what_the_python_loop_held(recs, data):
    msgs = [ConversationMessageRecord(msg_id=f"m{i}", channel_id="c", content=c, tool_calls=calls,
                                      ts=1.0 + i) for i, (c, calls) in enumerate(recs)]
    order = data.draw(st.permutations(range(len(msgs))))
    order = order[:data.draw(st.integers(1, len(order)))]
    lengths = data.draw(st.lists(st.integers(1, 500), min_size=len(order), max_size=len(order)))
    skip = data.draw(st.integers(0, len(order)))
    cap = data.draw(st.integers(1, 40))
    max_bytes = data.draw(st.none() | st.integers(0, 20_000))
    loc0, seq0 = data.draw(st.integers(0, 1 << 45)), data.draw(st.integers(0, 1 << 40))
    ref, got = LocCache(cap, max_bytes), LocCache(cap, max_bytes)
    ref.put(1, ("old", 0), 10)
    got.put(1, ("old", 0), 10)
    pos = loc0
    for j, i in enumerate(order):           # the loop put_appended replaces
        if j >= skip:
            ref.put(pos, (_own(msgs[i]), seq0 + j), record_bytes(msgs[i]))
        pos += lengths[j]
    got.put_appended(msgs, list(order), lengths, loc0, seq0, skip, tuning.RECORD_OVERHEAD,
                     tuning.TOOL_CALL_BYTES, _own)
    assert got.keys() == ref.keys() and got.nbytes == ref.nbytes
    for (lr, (rr, sr)), (lg, (rg, sg)) in zip(ref.items(), got.items()):
        assert (lr, sr) == (lg, sg)
        assert rr == rg
        if isinstance(rr, ConversationMessageRecord) and rr.tool_calls:
            # each got a copy of its own tool calls (a caller's later edit is not stored)
            assert rg is not msgs[int(rg.msg_id[1:])]


def test_put_appended_refuses_lengths_that_do_not_match(tmp_path):
    with pytest.raises(ValueError, match="lengths"):
        LocCache(4).put_appended([msg(0)], [0], [], 0, 0, 0, 1, 1, _own)


# ---------------------------------------------------------------- start_writeback
def test_start_writeback_is_advisory(tmp_path):
    from rune_fast._log import start_writeback
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"z" * 5000)
        assert start_writeback(fd, 0, 5000) is True
        assert start_writeback(fd, 0, 0) is False           # nothing to write
        assert start_writeback(fd, -1, 10) is False
    finally:
        os.close(fd)
    r, w = os.pipe()                        # not a file: refused, nothing raised
    try:
        assert start_writeback(r, 0, 10) is False
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("durability", ["fsync", "batch", "none"])
def test_a_small_append_starts_its_lines_writeback_before_its_sync(tmp_path, monkeypatch, durability):
    """A single append (and a batch under SYNC_OVERLAP_MIN) starts the write
    of its lines right after the tail write, before the sync that
    acknowledges them (indexing and journaling overlap the disk); a
    "none" store starts nothing (it syncs nothing)."""
    import rune_fast.segments as segments
    calls: list[tuple] = []
    order: list[str] = []
    real_start, real_sync = segments.start_writeback, TailFile.sync

    def start(fd: int, off: int, n: int) -> bool:
        calls.append((off, n))
        order.append("start")
        return real_start(fd, off, n)

    def sync(self: TailFile) -> None:
        order.append("sync")
        real_sync(self)

    monkeypatch.setattr(segments, "start_writeback", start)
    monkeypatch.setattr(TailFile, "sync", sync)
    with ConversationStateRepository(tmp_path / "s", durability=durability) as repo:
        assert repo.append(msg(1)) is True
        assert repo.append_many([msg(i) for i in range(2, 5)]) == 3
        assert repo.append(msg(1)) is False                 # a duplicate writes nothing
        tail_size = repo._tail.size
    if durability == "none":
        assert calls == []
        return
    assert len(calls) == 2 and calls[0][0] == 0
    assert calls[1][0] == calls[0][1] and calls[1][0] + calls[1][1] == tail_size
    assert order[:4] == ["start", "sync", "start", "sync"]
    with ConversationStateRepository(tmp_path / "s") as repo:
        assert len(repo) == 4
        assert repo.get_message(msg(3).msg_id).status is ReadStatus.FOUND_VERIFIED


@pytest.mark.parametrize("durability", ["fsync", "batch"])
def test_group_commit_wakes_every_waiter_behind_a_slow_sync(tmp_path, monkeypatch, durability):
    """Appenders that find a sync in flight wait for it (counted: a sync
    that ends notifies only when some thread waits) and return only once
    their lines are durable; a slow sync lets them pile up behind it."""
    import time as _time

    import rune_fast.segments as segments
    real = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        _time.sleep(0.003)
        real(fd)

    monkeypatch.setattr(segments.os, "fdatasync", slow_fdatasync)
    repo = ConversationStateRepository(tmp_path / "s", durability=durability, compact_every=10_000)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(25):
                assert repo.append(msg(t * 1000 + i, channel=f"c{t}")) is True
        except BaseException as exc:        # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    try:
        assert not errors and not any(th.is_alive() for th in threads)
        assert len(repo) == 100 and repo._writes._waiters == 0
        assert repo._writes._synced == repo._writes._wpos
    finally:
        repo.close()
