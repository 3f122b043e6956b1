"""The default decode-cache budget (``cache_bytes=None``) grows with the
store: CACHE_MIN_BYTES for its first CACHE_FLOOR_MESSAGES messages taken,
tuning.CACHE_MESSAGE_BYTES for each one beyond, at most CACHE_BYTES, at
the open (which reads no cool sidecar for it) and as appends grow the
store by an eighth; an explicit
``cache_bytes`` stays as given. The split (cache_budgets) gives the row
groups nothing at the floor and the cool records what they need for a
loop of gets."""
from __future__ import annotations

import pytest

from rune_fast._conv import tuning
from rune_fast._conv.reads import ID_MEMO_BYTES, cache_budgets
from rune_fast._index import LocCache
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord


def _msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"m{i:06d}", ts=1_700_000_000.0 + i, role="user",
                                     content=f"message {i} " + "x" * 1000, channel_id=f"c{i % 7}",
                                     task_id=f"t{i % 11}")


@pytest.fixture
def small_budget(monkeypatch):
    """A scale a test can reach: 16 KiB for the first 50 messages, 1,000
    bytes each beyond, at most 512 KiB."""
    monkeypatch.setattr(tuning, "CACHE_MESSAGE_BYTES", 1000)
    monkeypatch.setattr(tuning, "CACHE_FLOOR_MESSAGES", 50)
    monkeypatch.setattr(tuning, "CACHE_MIN_BYTES", 16 << 10)
    monkeypatch.setattr(tuning, "CACHE_BYTES", 512 << 10)


def _budgets(repo: ConversationStateRepository) -> tuple[int, int, int, int]:
    return (repo._decoded.max_bytes, repo._cool_decoded.max_bytes, repo._cool_dense.max_bytes,
            repo._cool._cache_bytes)


def test_default_budget_grows_with_the_store(tmp_path, small_budget):
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6, hot_window=20) as repo:
        assert repo.cache_bytes is None
        assert _budgets(repo) == cache_budgets(16 << 10)             # empty: the floor
        repo.append_many([_msg(i) for i in range(40)])
        assert _budgets(repo) == cache_budgets(16 << 10)             # not 64 messages yet
        repo.append_many([_msg(i) for i in range(40, 100)])          # past 64 messages: rescaled
        assert _budgets(repo) == cache_budgets((16 << 10) + 50_000)
        repo.append_many([_msg(i) for i in range(100, 105)])         # not an eighth (nor 64) more
        assert _budgets(repo) == cache_budgets((16 << 10) + 50_000)
        repo.append_many([_msg(i) for i in range(105, 200)])
        assert _budgets(repo) == cache_budgets((16 << 10) + 150_000)
        repo.append_many([_msg(i) for i in range(200, 600)])
        assert _budgets(repo) == cache_budgets(512 << 10)            # the ceiling
        assert repo.compact().cooled > 0                             # (cooled: still counted)
        got = [repo.get_message(m.msg_id).record for m in (_msg(3), _msg(599))]
        assert got == [_msg(3), _msg(599)]
        assert repo._decoded.nbytes <= cache_budgets(512 << 10)[0]


def test_the_open_scales_to_the_store_it_finds_reading_no_sidecar(tmp_path, small_budget):
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6, hot_window=5) as repo:
        repo.append_many([_msg(i) for i in range(150)])
        assert repo.compact().cooled > 0
    for kw in ({"durability": "none"}, {"read_only": True}):
        kw.update(compact_every=10**6, hot_window=5)
        with ConversationStateRepository(tmp_path, **kw) as repo:
            assert repo._cool._unloaded or repo.read_only            # a writer reads no sidecar for it
            assert _budgets(repo) == cache_budgets((16 << 10) + 100_000)
            assert repo.get_message(_msg(0).msg_id).record == _msg(0)


def test_the_split_gives_row_groups_only_what_passes_the_floor():
    floor, top = tuning.CACHE_MIN_BYTES, tuning.CACHE_BYTES
    hot, cool, dense, groups = cache_budgets(floor)
    assert groups == 0 and hot == floor // 2 and cool + dense == floor - hot - ID_MEMO_BYTES
    assert dense >= cool
    hot, cool, dense, groups = cache_budgets(top)
    assert groups == (top - floor) // 4 and hot + cool + dense + groups + ID_MEMO_BYTES == top
    for total in (0, 1, 5000, ID_MEMO_BYTES, floor - 1, 10 * floor, 10 * top):
        parts = cache_budgets(total)
        assert min(parts) >= 0 and sum(parts) <= total
        assert parts[3] <= tuning.COOL_CACHE_BYTES


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


def test_a_repeated_loop_of_archived_gets_is_served_by_the_cool_lines(tmp_path, monkeypatch):
    """A loop over archived messages whose records do not fit the decoded
    cool share but whose lines fit the dense one (the bench at 100,000
    messages: 1,083 archived ids, ~2,100 bytes a record, ~900 a line, a
    4 MiB budget): the second pass reads no page, it decodes the lines."""
    from rune_fast._conv import reads
    msgs = [_msg(i) for i in range(300)]
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6, hot_window=2) as repo:
        repo.append_many(msgs)
        assert repo.compact().cooled > 250
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6, hot_window=2) as probe:
        ids = [m.msg_id for m in msgs if probe.get_message(m.msg_id).tier == "cool"]
        recs = [probe.get_message(i).record for i in ids]
        need = sum(reads.record_bytes(r) for r in recs)
        lines = sum(len(line) + tuning.DENSE_LINE_OVERHEAD for line in reads.dense_lines([(r, 1) for r in recs]))
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6, hot_window=2) as repo:
        repo._cool_decoded.max_bytes = need // 4           # (the bench's records at its floor: ~half fit)
        repo._cool_dense.max_bytes = 2 * lines
        for i in ids:
            assert repo.get_message(i).record.msg_id == i
        read, decoded = [], []
        real_read, real_decode = repo._cool.id_records_at, reads.canonical_record
        monkeypatch.setattr(repo._cool, "id_records_at", lambda *a, **k: read.append(a) or real_read(*a, **k))
        monkeypatch.setattr(reads, "canonical_record", lambda line: decoded.append(1) or real_decode(line))
        for m in msgs:
            if m.msg_id in ids:
                assert repo.get_message(m.msg_id).record == m
        assert read == [] and 0 < len(decoded) < len(ids)       # (some still decoded records)
        assert repo.messages_for_task("t3") == [m for m in msgs if m.task_id == "t3"]


def test_a_loop_of_hot_gets_a_little_larger_than_the_cache_keeps_most_of_it(tmp_path, monkeypatch):
    """The record caches drop one of their older half for room, not the
    oldest: a loop over ~10% more hot messages than the hot share holds
    decodes a fraction of them again on each pass (oldest-first decoded
    every one: the bench's gets at 30,000 messages)."""
    from rune_fast._conv import reads
    msgs = [_msg(i) for i in range(400)]
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6, hot_window=1000) as repo:
        repo.append_many(msgs)
    need = sum(reads.record_bytes(m) for m in msgs)
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6, hot_window=1000,
                                     cache_bytes=need * 9 // 10 * 2) as repo:
        assert repo._decoded.max_bytes < need
        decoded = []
        real = reads.canonical_record
        monkeypatch.setattr(reads, "canonical_record", lambda line: decoded.append(1) or real(line))
        for rnd in range(4):
            if rnd == 2:
                decoded.clear()
            for m in msgs:
                assert repo.get_message(m.msg_id).record == m
        assert 0 < len(decoded) < len(msgs)     # of 800 reads (~200; oldest-first decoded all 800)


def test_dense_lines_decode_to_the_record_and_ord():
    """A kept line decodes (canonical_record) to the very record and its ord;
    an ord that is no sequence, or a batch that does not encode, keeps no
    line (the read itself never fails for it)."""
    from rune_fast._conv import reads
    recs = [_msg(i) for i in range(5)] + [ConversationMessageRecord(
        msg_id="t", role="assistant", content="Zürich 量子 🙂", channel_id="c", tool_calls=[
            {"id": "1", "name": "f", "arguments": {"a": [1, 2.5, None]}}])]
    lines = reads.dense_lines([(r, 10 + i) for i, r in enumerate(recs)])
    assert [reads.canonical_record(line) for line in lines] == [(r, 10 + i) for i, r in enumerate(recs)]
    assert reads.dense_lines([(recs[0], -1), (recs[1], None)]) == [None, None]
    assert reads.dense_lines([(object(), 3)]) == [None]
