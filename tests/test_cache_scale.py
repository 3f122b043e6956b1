"""The default decode-cache budget (``cache_bytes=None``) grows with the
store: tuning.CACHE_BYTES_PER_MESSAGE a stored message, between
CACHE_MIN_BYTES and CACHE_BYTES, at the open and as appends grow the store;
an explicit ``cache_bytes`` stays as given."""
from __future__ import annotations

import pytest

from rune_fast._conv import tuning
from rune_fast._conv.reads import cache_budgets
from rune_fast._index import LocCache
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord


def _msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"m{i:06d}", ts=1_700_000_000.0 + i, role="user",
                                     content=f"message {i} " + "x" * (i % 50), channel_id=f"c{i % 7}",
                                     task_id=f"t{i % 11}")


@pytest.fixture
def small_budget(monkeypatch):
    """A scale a test can reach: 1,000 bytes a message, 64 KiB to 256 KiB."""
    monkeypatch.setattr(tuning, "CACHE_BYTES_PER_MESSAGE", 1000)
    monkeypatch.setattr(tuning, "CACHE_MIN_BYTES", 64 << 10)
    monkeypatch.setattr(tuning, "CACHE_BYTES", 256 << 10)


def _budgets(repo: ConversationStateRepository) -> tuple[int, int, int]:
    return repo._decoded.max_bytes, repo._cool_decoded.max_bytes, repo._cool._cache_bytes


def test_default_budget_grows_with_the_store(tmp_path, small_budget):
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6, hot_window=20) as repo:
        assert repo.cache_bytes is None
        assert _budgets(repo) == cache_budgets(64 << 10)             # empty: the floor
        repo.append_many([_msg(i) for i in range(100)])
        assert _budgets(repo) == cache_budgets(100_000)              # 100 messages
        repo.append_many([_msg(i) for i in range(100, 110)])         # (not an eighth yet)
        assert _budgets(repo) == cache_budgets(100_000)
        repo.append_many([_msg(i) for i in range(110, 200)])
        assert _budgets(repo) == cache_budgets(200_000)
        repo.append_many([_msg(i) for i in range(150, 400)])
        assert _budgets(repo) == cache_budgets(256 << 10)            # the ceiling
        repo.compact()                                               # (cooled: still counted)
        assert len(repo._cool) > 0
        got = [repo.get_message(m.msg_id).record for m in (_msg(3), _msg(399))]
        assert got == [_msg(3), _msg(399)]
        assert repo._decoded.nbytes <= cache_budgets(256 << 10)[0]
    with ConversationStateRepository(tmp_path, read_only=True) as view:     # the open counts the store
        assert _budgets(view) == cache_budgets(256 << 10)


def test_the_open_scales_to_the_store_it_finds(tmp_path, small_budget):
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6, hot_window=20) as repo:
        repo.append_many([_msg(i) for i in range(120)])
        repo.compact()
    with ConversationStateRepository(tmp_path, durability="none") as repo:
        assert _budgets(repo) == cache_budgets(120_000)


def test_an_explicit_budget_stays(tmp_path, small_budget):
    with ConversationStateRepository(tmp_path, durability="none", cache_bytes=5000,
                                     compact_every=10**6, hot_window=20) as repo:
        repo.append_many([_msg(i) for i in range(300)])
        assert repo.cache_bytes == 5000 and _budgets(repo) == cache_budgets(5000)


def test_loc_cache_bound_can_be_lowered_and_raised():
    c = LocCache(100, 1000)
    for loc in range(10):
        c.put(loc, loc, 100)
    assert len(c) == 10 and c.nbytes == 1000
    c.max_bytes = 450                   # the oldest go at once
    assert list(c.keys()) == [6, 7, 8, 9] and c.nbytes == 400
    c.max_bytes = None
    for loc in range(10, 20):
        c.put(loc, loc, 100)
    assert len(c) == 14 and c.max_bytes is None
    with pytest.raises(ValueError, match="max_bytes"):
        c.max_bytes = -1
