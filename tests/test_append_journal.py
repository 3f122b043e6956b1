"""append_many of a large batch journals its envelopes in a C thread of its
own (rune_fast._log.BackgroundWrite), begun right after the tail's write and
ended before the call returns, so that the journal's write (a new page-cache
page every 4 KiB) overlaps the indexing and the wait for the tail's sync.
Every other use of the event store waits for it first: the journal keeps
the order of the calls, a checkpoint never records a size inside it, and a
process killed right after the call finds every envelope. A failed write is
a DurabilityError naming the journal, and the store refuses writes."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import orjson
import pytest

from rune_fast import framed_log as framed_log_mod
from rune_fast._conv import tuning
from rune_fast._log import BackgroundWrite
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.errors import DurabilityError
from rune_fast.events import EventStore, FramedLog
from rune_fast.records import ConversationMessageRecord

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIG = tuning.SYNC_OVERLAP_MIN


def msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"msg_{i:08d}", channel_id=f"c{i % 3}", content=f"message {i} é",
                                     ts=1_700_000_000.0 + i)


def journal(path) -> list[tuple[str, str]]:
    """(type, id) of every envelope in the event store's file, in file order."""
    with open(os.path.join(path, "events.jsonl"), "rb") as f:
        return [(e["type"], e["id"]) for e in map(orjson.loads, f.read().splitlines())]


# ---------------------------------------------------------------- BackgroundWrite

def test_background_write_writes_and_names_a_failure(tmp_path):
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        data = b"x" * 300_000 + b"\n"
        job = BackgroundWrite(fd, data)
        assert job.wait() == len(data)
        assert job.wait() == len(data)          # (joined once; the same answer after)
    finally:
        os.close(fd)
    assert path.read_bytes() == data
    fd = os.open(path, os.O_RDONLY)
    try:
        job = BackgroundWrite(fd, b"y\n")
        with pytest.raises(OSError) as info:
            job.wait()
        assert "write of 2 bytes" in str(info.value) and info.value.step == 1
    finally:
        os.close(fd)
    assert path.read_bytes() == data


def test_an_unwaited_background_write_is_joined_when_dropped(tmp_path):
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(20):
            BackgroundWrite(fd, b"z" * 5000 + b"\n")
    finally:
        os.close(fd)
    assert path.read_bytes() == (b"z" * 5000 + b"\n") * 20


# ---------------------------------------------------------------- the event store

def test_every_other_call_of_the_log_waits_for_the_write_in_flight(tmp_path):
    store = EventStore(tmp_path / "events.jsonl")
    try:
        first = b"".join(EventStore.encode("conversation.message", f"m{i}", "0" * 64) for i in range(3000))
        token = store.append_encoded(first, offset=False, background=True)
        # (a checkpoint's look at the size: after the write in flight, never inside it)
        assert store._log.line_end() == len(first)
        second = EventStore.encode("conversation.deleted", "m1", "0" * 64)
        assert store.append_encoded(second) == len(first)
        token.end()
        token.end()
        store.sync()
        assert [e["id"] for e in store.iter_envelopes()] == [f"m{i}" for i in range(3000)] + ["m1"]
    finally:
        store.close()


def test_a_failed_background_write_fails_the_log(tmp_path, monkeypatch):
    class Failing:
        def __init__(self, fd, data):
            pass

        def wait(self):
            exc = OSError(28, "No space left on device (injected)")
            exc.step = 1
            raise exc

    monkeypatch.setattr(framed_log_mod, "BackgroundWrite", Failing)
    store = EventStore(tmp_path / "events.jsonl")
    try:
        token = store.append_encoded(EventStore.encode("conversation.message", "m", "0" * 64),
                                     offset=False, background=True)
        with pytest.raises(DurabilityError) as info:
            token.end()
        assert "events.jsonl" in str(info.value) and "No space" in str(info.value)
        with pytest.raises(DurabilityError):
            store.append("conversation.message", "n", "0" * 64)
    finally:
        store._log._failed = None       # (close syncs nothing then)
        store.close()


# ---------------------------------------------------------------- append_many

def test_a_large_batch_is_journaled_in_a_thread_before_it_returns(tmp_path, monkeypatch):
    begun: list[int] = []
    real = FramedLog.append_bytes_begin

    def spy(self, data):
        begun.append(data.count(b"\n"))
        return real(self, data)

    monkeypatch.setattr(FramedLog, "append_bytes_begin", spy)
    with ConversationStateRepository(tmp_path, compact_every=10**9) as repo:
        assert repo.append_many([msg(i) for i in range(BIG)]) == BIG
        assert begun == [BIG]
        # on return every envelope is in the file, after the ones before it
        assert journal(tmp_path)[-BIG:] == [("conversation.message", msg(i).msg_id) for i in range(BIG)]
        repo.append(msg(10**6))                          # a single append journals inline
        repo.append_many([msg(10**6 + i) for i in range(1, 4)])
        assert begun == [BIG]
        assert journal(tmp_path)[-4:] == [("conversation.message", msg(10**6 + i).msg_id) for i in range(4)]
        assert repo.verify().ok
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == BIG + 4 and repo.verify().ok


class _SlowWrite:
    """A BackgroundWrite whose write starts ``delay`` seconds late (a Python
    thread), so that other calls come while it is in flight."""
    delay = 0.3

    def __init__(self, fd, data):
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(fd, bytes(data)))
        self.thread.start()

    def _run(self, fd, data):
        time.sleep(self.delay)
        self.result = os.write(fd, data)

    def wait(self):
        self.thread.join()
        return self.result


def test_the_journal_keeps_the_order_of_the_calls(tmp_path, monkeypatch):
    """A deletion made by another thread while a batch's journal write is in
    flight journals its envelope after the batch's (a reader of the journal,
    and recovery, see the message appended before it is deleted)."""
    monkeypatch.setattr(framed_log_mod, "BackgroundWrite", _SlowWrite)
    with ConversationStateRepository(tmp_path, compact_every=10**9) as repo:
        batch = [msg(i) for i in range(BIG)]
        t = threading.Thread(target=repo.append_many, args=(batch,))
        t.start()
        while repo.get_message(batch[0].msg_id).status is not ReadStatus.FOUND_VERIFIED:
            time.sleep(0.001)
        assert repo.delete(batch[0].msg_id)      # (while the batch's journal write waits)
        t.join()
        seen = journal(tmp_path)
        assert seen.index(("conversation.deleted", batch[0].msg_id)) > \
            seen.index(("conversation.message", batch[-1].msg_id))
        assert len(repo) == BIG - 1
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == BIG - 1 and repo.verify().ok


def test_a_failed_journal_write_fails_the_call_and_stops_writes(tmp_path, monkeypatch):
    class Failing(_SlowWrite):
        delay = 0.0

        def wait(self):
            self.thread.join()
            exc = OSError(5, "Input/output error (injected)")
            exc.step = 1
            raise exc

    with ConversationStateRepository(tmp_path, compact_every=10**9) as repo:
        monkeypatch.setattr(framed_log_mod, "BackgroundWrite", Failing)
        with pytest.raises(DurabilityError) as info:
            repo.append_many([msg(i) for i in range(BIG)])
        assert "journal" in str(info.value) and "events.jsonl" in str(info.value)
        monkeypatch.undo()
        with pytest.raises(DurabilityError):
            repo.append(msg(10**6))
        repo._events._log._failed = None        # (so that close can sync and close)
    with ConversationStateRepository(tmp_path) as repo:     # the lines are in the tail
        assert len(repo) == BIG and repo.verify().ok


def test_a_kill_right_after_batches_keeps_every_envelope(tmp_path):
    """SIGKILL right after append_many calls that ran automatic compactions:
    every acknowledged message is there with its envelope, and the journal
    holds no envelope twice."""
    code = (
        "import os, sys\n"
        "from rune_fast.conversation_state import ConversationStateRepository\n"
        "from rune_fast.records import ConversationMessageRecord as R\n"
        "r = ConversationStateRepository(sys.argv[1], compact_every=64, hot_window=16)\n"
        "for b in range(12):\n"
        "    r.append_many([R(msg_id='msg_%08d' % (b * 200 + i), channel_id='c%d' % (i % 5),\n"
        "                     content='m %d ü' % i) for i in range(200)])\n"
        "    print(b, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split() == [str(b) for b in range(12)], out.stderr
    ids = [f"msg_{i:08d}" for i in range(2400)]
    with ConversationStateRepository(tmp_path, hot_window=16) as repo:
        assert len(repo) == 2400
        assert all(repo.get_message(m).status is ReadStatus.FOUND_VERIFIED for m in ids[::37])
        assert repo.verify().ok
        assert repo.stats()["lost"] == []
    appended = [i for t, i in journal(tmp_path) if t == "conversation.message"]
    assert sorted(appended) == ids


# ---------------------------------------------------------------- the compaction beside the sync

def test_the_automatic_compaction_runs_while_the_batch_sync_is_in_flight(tmp_path, monkeypatch):
    """A large batch's automatic compaction runs before its sync is ended
    (the fold, a cooling run's part, the start of a run need none); one
    that writes the manifest ends the sync first, so the manifest vouches
    only for durable lines."""
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 8)
    seen = {"auto": 0, "in_flight": 0, "manifests": 0, "manifest_unsynced": 0}
    repo = ConversationStateRepository(tmp_path, compact_every=64, hot_window=8)
    auto, record = type(repo)._auto_compact, type(repo)._record_manifest

    def spy_auto(self):
        seen["auto"] += 1
        seen["in_flight"] += self._writes._begun is not None
        # the background jobs are let keep up, so that compactions adopt
        # them and write manifests however slow the machine (a loaded CI
        # machine's cooling thread fell behind: two manifests in 30 batches)
        for job in (self._bg, self._bg_merge):
            if job is not None:
                assert job.wait_for_room(30) if job.feeding() else job.done.wait(30)
        return auto(self)

    def spy_manifest(self, *a, **k):
        seen["manifests"] += 1
        w = self._writes
        seen["manifest_unsynced"] += w._begun is not None or w._syncing or w._synced < w._wpos
        return record(self, *a, **k)

    monkeypatch.setattr(type(repo), "_auto_compact", spy_auto)
    monkeypatch.setattr(type(repo), "_record_manifest", spy_manifest)
    try:
        for b in range(30):
            assert repo.append_many([msg(b * 100 + i) for i in range(100)]) == 100
        assert seen["auto"] == 30 and seen["in_flight"] == 30
        assert seen["manifests"] > 3 and seen["manifest_unsynced"] == 0
        assert repo.verify().ok
    finally:
        repo.close()
    with ConversationStateRepository(tmp_path, hot_window=8) as repo:
        assert len(repo) == 3000 and repo.verify().ok
        assert repo.get_message(msg(2999).msg_id).record == msg(2999)


@pytest.mark.parametrize("durability", ["fsync", "batch"])
def test_compactions_and_flushes_of_other_threads_beside_large_batches(tmp_path, durability):
    """Another thread's compact() and flush() (each syncs under the
    repository lock) while batches compact beside their syncs: nothing
    waits for ever, nothing is lost."""
    done = threading.Event()
    errors: list[BaseException] = []
    with ConversationStateRepository(tmp_path, compact_every=50, hot_window=20, durability=durability) as repo:
        def other():
            try:
                while not done.is_set():
                    repo.flush()
                    repo.compact()
            except BaseException as exc:     # (reported below)
                errors.append(exc)

        t = threading.Thread(target=other)
        t.start()
        try:
            for b in range(25):
                repo.append_many([msg(b * 100 + i) for i in range(100)])
        finally:
            done.set()
            t.join(60)
        assert not t.is_alive() and not errors
        assert len(repo) == 2500
    with ConversationStateRepository(tmp_path, hot_window=20) as repo:
        assert len(repo) == 2500 and repo.verify().ok
