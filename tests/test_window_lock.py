"""The compiled window (_index.repo_window) takes the repository's RLock
without a method call when no other thread holds it, and reads the
instance's state once per version of its dict: it must still wait for a
thread that holds the lock, nest inside the lock the caller holds, give
it back as the lock's own release() would, and never answer from another
repository's state or from a state replaced since."""
from __future__ import annotations

import threading
import time

import pytest

from rune_fast import _index
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.errors import StoreClosedError
from rune_fast.records import ConversationMessageRecord


def _repo(path, ch: str, k: int = 12) -> ConversationStateRepository:
    repo = ConversationStateRepository(path, compact_every=1000, hot_window=1000, durability="none")
    repo.append_many([ConversationMessageRecord(msg_id=f"{ch}-{i:03d}", content=f"hello {i}", channel_id=ch,
                                                ts=1.0 + i) for i in range(k)])
    repo.compact()
    return repo


def _ids(recs) -> list[str]:
    return [r.msg_id for r in recs]


def test_the_rlock_layout_probe_holds_here():
    # (where it does not, every window takes the lock by its acquire())
    assert _index._rlock_probe() is True


def test_a_window_waits_for_the_thread_that_holds_the_lock(tmp_path):
    repo = _repo(tmp_path, "c")
    try:
        want = repo.window("c", 8)
        got: list = []
        with repo._lock:
            t = threading.Thread(target=lambda: got.append(repo.window("c", 8)))
            t.start()
            time.sleep(0.2)
            assert got == [] and t.is_alive()           # waiting for the lock
        t.join(5)
        assert got == [want]
        assert not repo._lock._is_owned()
        assert repo._lock.acquire(blocking=False)       # given back: free for anyone
        repo._lock.release()
    finally:
        repo.close()


def test_a_window_nests_in_the_lock_its_caller_holds(tmp_path):
    repo = _repo(tmp_path, "c")
    try:
        with repo._lock:
            with repo._lock:
                assert _ids(repo.window("c", 3)) == ["c-009", "c-010", "c-011"]
                assert repo._lock._is_owned()
            assert repo._lock._is_owned()
            # another thread cannot take it while this one holds it
            took: list = []
            t = threading.Thread(target=lambda: took.append(repo._lock.acquire(timeout=0.05)))
            t.start()
            t.join()
            assert took == [False]
        assert not repo._lock._is_owned()
        t = threading.Thread(target=lambda: took.append(repo._lock.acquire(timeout=1) and repo._lock.release()
                                                        is None))
        t.start()
        t.join()
        assert took == [False, True]
    finally:
        repo.close()


def test_windows_of_two_repositories_never_mix_and_a_close_is_seen(tmp_path):
    a, b = _repo(tmp_path / "a", "ca", 10), _repo(tmp_path / "b", "cb", 20)
    try:
        for _ in range(3):
            assert _ids(a.window("ca", 2)) == ["ca-008", "ca-009"]
            assert _ids(b.window("cb", 2)) == ["cb-018", "cb-019"]
            assert a.window("cb", 2) == [] and b.window("ca", 2) == []
        a.append(ConversationMessageRecord(msg_id="ca-new", content="x", channel_id="ca", ts=99.0))
        assert _ids(a.window("ca", 2)) == ["ca-009", "ca-new"]
        a._reset_read_caches()                           # a new decode cache: read from the instance
        assert _ids(a.window("ca", 2)) == ["ca-009", "ca-new"]
        a.close()
        with pytest.raises(StoreClosedError):
            a.window("ca", 2)
        assert _ids(b.window("cb", 2)) == ["cb-018", "cb-019"]
    finally:
        b.close()


def test_windows_in_threads_beside_appends_answer_as_the_store_holds(tmp_path):
    repo = _repo(tmp_path, "c", 8)
    stop = threading.Event()
    bad: list = []

    def reader():
        while not stop.is_set():
            got = _ids(repo.window("c", 8))
            if len(got) != 8 or got != sorted(got):
                bad.append(got)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(8, 300):
            repo.append(ConversationMessageRecord(msg_id=f"c-{i:03d}", content=f"hello {i}", channel_id="c",
                                                  ts=1.0 + i))
            if i % 50 == 0:
                repo.compact()
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert bad == []
    assert _ids(repo.window("c", 3)) == ["c-297", "c-298", "c-299"]
    repo.close()
