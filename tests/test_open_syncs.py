"""Which syncs an open, a read and a close make.

Each fdatasync/fsync is a cache flush of the device (0.1-10 ms on a shared
disk), so a store opened to be read and closed again syncs nothing; what it
must sync is synced before the first write it acknowledges: the tail's
folder entry when the tail was found empty (it may have been made by a
writer killed before it synced the folder), the tail's lines when the last
writer did not publish them durable.
"""
from __future__ import annotations

import os

import pytest

from rune_fast._conv import tuning
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord


def msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"m{i:04d}", channel_id=f"c{i % 3}", task_id="",
                                     content=f"message {i}", ts=float(i), role="user")


@pytest.fixture
def syncs(monkeypatch):
    """Records the file (basename) of every fsync/fdatasync, in order."""
    seen: list[str] = []
    real_fd, real_f = os.fdatasync, os.fsync

    def rec(fn):
        def w(fd):
            seen.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
            return fn(fd)
        return w
    monkeypatch.setattr(os, "fdatasync", rec(real_fd))
    monkeypatch.setattr(os, "fsync", rec(real_f))
    return seen


def _store(tmp_path, n: int, *, compact: bool) -> str:
    """A closed store of ``n`` messages; ``compact``: rolled, its tail empty."""
    state = str(tmp_path / "s")
    rolls, tuning.ROLL_BYTES = tuning.ROLL_BYTES, 1000
    try:
        with ConversationStateRepository(state, durability="fsync") as repo:
            repo.append_many([msg(i) for i in range(n)])
            if compact:
                repo.compact()
    finally:
        tuning.ROLL_BYTES = rolls
    return state


@pytest.mark.parametrize("compact", [True, False], ids=["empty-tail", "tail-with-lines"])
def test_open_read_close_syncs_nothing(tmp_path, syncs, compact):
    state = _store(tmp_path, 50, compact=compact)
    syncs.clear()
    with ConversationStateRepository(state, durability="fsync") as repo:
        assert [m.msg_id for m in repo.window("c1", 2)] == ["m0046", "m0049"]
        assert repo.get_message("m0007").record == msg(7)
    assert syncs == []


def test_first_append_after_an_empty_tail_syncs_its_folder_first(tmp_path, syncs):
    state = _store(tmp_path, 50, compact=True)
    assert os.path.getsize(os.path.join(state, "hot", "conversation_tail.jsonl")) == 0
    with ConversationStateRepository(state, durability="fsync") as repo:
        syncs.clear()
        assert repo.append(msg(50))
        # the line, then the folder that names the tail, before append returns
        assert syncs[:2] == ["conversation_tail.jsonl", "hot"]
        syncs.clear()
        assert repo.append(msg(51))
        assert syncs == ["conversation_tail.jsonl"]
    with ConversationStateRepository(state, durability="fsync") as repo:
        assert len(repo) == 52


def test_open_syncs_tail_lines_not_published_durable(tmp_path, syncs):
    """Without the durable mark (a writer killed between its write and its
    sync leaves it behind the tail's end), the open syncs the lines it found
    before anything else is acknowledged after them."""
    state = _store(tmp_path, 50, compact=False)
    os.remove(os.path.join(state, "hot", "conversation_tail.durable"))
    syncs.clear()
    with ConversationStateRepository(state, durability="fsync") as repo:
        assert syncs == ["conversation_tail.jsonl"]
        assert len(repo) == 50
