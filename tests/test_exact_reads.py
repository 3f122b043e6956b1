"""get_message is compiled for its common case at volume (_index.
repo_get_message, bound as the method): an archived row whose verified
record an exact read kept is answered in one call under the repository's
and the archive's locks. Everything else -- a hot id, a deleted one, an
unknown one, one with escapes or non-ASCII, a record not kept, a closed
store, either lock held by another thread -- is the general path's answer,
and the compiled answer equals it (tool calls read-only, the tier named)."""
from __future__ import annotations

import threading
import time

import pytest

from rune_fast import _index
from rune_fast._conv.common import MessageRead, ReadStatus
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.errors import StoreClosedError
from rune_fast.records import ConversationMessageRecord as R


def _store(path: str) -> ConversationStateRepository:
    repo = ConversationStateRepository(path, hot_window=4)
    msgs = []
    for i in range(120):
        calls = ({"id": f"t{i}", "name": "lookup", "arguments": {"q": [i]}},) if i % 5 == 0 else ()
        msgs.append(R(msg_id=f"m{i:04d}", channel_id=f"c{i % 3}", role="assistant" if calls else "user",
                      content=f"message {i} über", tool_calls=calls, task_id=f"t{i % 4}"))
    msgs.append(R(msg_id="ümlaut-id", channel_id="c0", role="user", content="non-ASCII id"))
    msgs.append(R(msg_id='quote"id', channel_id="c0", role="user", content="an id with an escape"))
    repo.append_many(msgs)
    repo.compact()
    return repo


def _general(repo, msg_id):
    return repo._get_message_general(msg_id)


def test_the_compiled_exact_read_answers_as_the_general_path(tmp_path):
    assert ConversationStateRepository.get_message is _index.repo_get_message
    repo = _store(str(tmp_path / "s"))
    try:
        ids = [f"m{i:04d}" for i in range(120)] + ["ümlaut-id", 'quote"id', "nope", ""]
        tiers = {i: repo.get_message(i).tier for i in ids}
        assert {"cool", "hot"} <= set(tiers.values())
        for msg_id in ids * 2:          # (the second round: the archived records kept)
            got, want = repo.get_message(msg_id), _general(repo, msg_id)
            assert type(got) is MessageRead and got == want, msg_id
        # a kept record's tool calls are read-only and not the cache's to edit
        got = repo.get_message("m0000")
        assert got.tier == "cool" and got.record.tool_calls
        with pytest.raises(TypeError, match="read-only"):
            got.record.tool_calls[0]["name"] = "edited"
        assert repo.get_message("m0000").record.tool_calls[0]["name"] == "lookup"
        # a deleted archived id: not found, though its record was kept
        assert repo.delete("m0003")
        assert repo.get_message("m0003") == MessageRead(ReadStatus.NOT_FOUND_CONFIRMED) == _general(repo, "m0003")
        with pytest.raises((TypeError, ValueError), match="msg_id"):
            repo.get_message(7)
    finally:
        repo.close()
    with pytest.raises(StoreClosedError):
        repo.get_message("m0001")


def test_a_kept_archived_record_takes_the_compiled_path(tmp_path, monkeypatch):
    repo = _store(str(tmp_path / "s"))
    try:
        cool = [f"m{i:04d}" for i in range(120) if repo.get_message(f"m{i:04d}").tier == "cool"]
        assert len(cool) > 50
        calls: list[str] = []
        real = ConversationStateRepository._get_message_general

        def general(self, msg_id):
            calls.append(msg_id)
            return real(self, msg_id)

        monkeypatch.setattr(ConversationStateRepository, "_get_message_general", general)
        got = [repo.get_message(m) for m in cool]
        assert calls == [] and all(r.status is ReadStatus.FOUND_VERIFIED and r.tier == "cool" for r in got)
        repo.get_message("m0119")       # a hot one: the general path
        assert calls == ["m0119"]
        # a record no longer kept (a new cache): read by the general path, then kept again
        repo._reset_read_caches()
        repo.get_message(cool[0])
        assert calls[-1] == cool[0]
        calls.clear()
        repo.get_message(cool[0])
        assert calls == []
    finally:
        repo.close()


@pytest.mark.parametrize("which", ["repository", "archive"])
def test_a_lock_held_elsewhere_sends_the_read_to_the_general_path(tmp_path, which):
    """Another thread holding the repository's lock or the archive's (a
    background run holds the latter while it checks its rows): the read
    waits for it on the general path and gives the same answer."""
    repo = _store(str(tmp_path / "s"))
    try:
        msg_id = next(f"m{i:04d}" for i in range(120) if repo.get_message(f"m{i:04d}").tier == "cool")
        want = repo.get_message(msg_id)
        lock = repo._lock if which == "repository" else repo._cool._lock
        held, done = threading.Event(), threading.Event()

        def hold():
            with lock:
                held.set()
                time.sleep(0.3)
            done.set()

        t = threading.Thread(target=hold)
        t.start()
        held.wait()
        t0 = time.monotonic()
        got = repo.get_message(msg_id)
        assert done.is_set() and time.monotonic() - t0 > 0.1       # (it waited for the lock)
        assert got == want
        t.join()
    finally:
        repo.close()
