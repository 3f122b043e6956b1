"""Benchmarks of reads reaching into the cool tier (group "cool-reads"): a
long task whose messages were cooled over many archive files, read with
its records decoded afresh (the record cache emptied each round) and from
the record cache; a window reaching past the hot messages; and the
archive's compiled row path against the dict path it stands in for.

Run: ``python -m pytest bench/test_cool_reads_bench.py --benchmark-columns=min,median,mean,ops``
"""
from __future__ import annotations

import os
import random
import tempfile

import pytest

from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord, message_from_stored

N = 40_000
CHANNELS = 40
TASKS = 60          # ~670 messages a task, spread over the whole load
WORDS = ("the agent called a tool and the result was parsed into a structured answer for "
         "the user who asked about invoices shipping weather Straße café naïve résumé 東京").split()


@pytest.fixture(scope="module")
def spread_store():
    """A store whose cool tier holds almost everything, cooled in many runs
    (hot_window 16), with tasks interleaved over the whole load."""
    tmp = tempfile.mkdtemp(prefix="cool-reads-bench-")
    rnd = random.Random(11)
    repo = ConversationStateRepository(tmp, durability="none", hot_window=16)
    batch = []
    for i in range(N):
        ch = rnd.randrange(CHANNELS)
        text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(20, 80)))
        batch.append(ConversationMessageRecord(
            msg_id=f"msg_{i:010d}", role=("user", "assistant")[i % 2], content=text,
            channel_id=f"chan-{ch:03d}", task_id=f"task-{(ch * 7 + i * TASKS // N) % TASKS:03d}"))
        if len(batch) == 1000:
            repo.append_many(batch)
            batch = []
    repo.compact()
    repo.close()
    repo = ConversationStateRepository(tmp, durability="none", hot_window=16)
    yield repo
    repo.close()


def _task(repo) -> str:
    return max((f"task-{t:03d}" for t in range(TASKS)), key=lambda t: repo._cool.task_len(t))


@pytest.mark.benchmark(group="cool-reads")
def test_long_spread_task_decoded(benchmark, spread_store):
    """messages_for_task of the longest task, its records decoded from the
    archive's pages every round."""
    repo = spread_store
    task = _task(repo)
    n = len(repo.messages_for_task(task))
    assert n > 300 and len({loc >> 32 for loc in repo._cool.task_locs(task)}) > 1

    def setup():
        repo._cool_decoded.clear()
        return (), {}

    benchmark.pedantic(lambda: repo.messages_for_task(task), setup=setup, rounds=30)


@pytest.mark.benchmark(group="cool-reads")
def test_long_spread_task_cached(benchmark, spread_store):
    repo = spread_store
    task = _task(repo)
    repo.messages_for_task(task)
    benchmark(repo.messages_for_task, task)


@pytest.mark.benchmark(group="cool-reads")
def test_window_100_into_cool(benchmark, spread_store):
    repo = spread_store
    chans = [f"chan-{c:03d}" for c in range(CHANNELS)]
    for c in chans:
        repo.window(c, 100)
    it = iter(range(1 << 62))
    benchmark(lambda: repo.window(chans[next(it) % CHANNELS], 100))


@pytest.mark.benchmark(group="cool-reads")
def test_records_at_task_rows(benchmark, spread_store):
    """The archive's compiled row path for a long task's locations."""
    a = spread_store._cool
    locs = a.task_locs(_task(spread_store))
    benchmark(a.records_at, locs, ConversationMessageRecord)


@pytest.mark.benchmark(group="cool-reads")
def test_dict_path_task_rows(benchmark, spread_store):
    """The dict path (rows_at, digest through orjson, message_from_stored) for the same rows."""
    a = spread_store._cool
    locs = a.task_locs(_task(spread_store))
    benchmark(lambda: [message_from_stored(r.record, fresh_json=r.plain) for r in a.rows_at(locs)])


def _cool_ids(repo, k: int) -> list[str]:
    """``k`` ids of cooled messages spread over the archive (a fixed sample)."""
    ids = [f"msg_{i:010d}" for i in random.Random(5).sample(range(N), 4 * k)]
    return [m for m in ids if repo._cool.id_locs(m)][:k]


def _drop_groups(a) -> None:
    """Empty the archive's row-group cache (an earlier benchmark's dict path
    filled it), so that a read takes the page path."""
    with a._lock:
        a._cache.clear()
        a._cached_bytes = 0


@pytest.mark.benchmark(group="cool-reads")
def test_get_cooled_message_from_pages(benchmark, spread_store):
    """get_message of a cooled id whose record is not kept: the row read
    from its 15 pages (PageReader.take: _pages.take_rows), digest checked."""
    repo = spread_store
    ids = _cool_ids(repo, 200)
    _drop_groups(repo._cool)
    it = iter(range(1 << 62))

    def one():
        repo._cool_decoded.clear()
        return repo.get_message(ids[next(it) % len(ids)])

    assert one().record is not None
    benchmark(one)


@pytest.mark.benchmark(group="cool-reads")
def test_take_one_row(benchmark, spread_store):
    """PageReader.take of one row, every column: its pages read, checked,
    decompressed and its values gathered in one compiled pass."""
    a = spread_store._cool
    locs = [a.id_locs(m)[0] for m in _cool_ids(spread_store, 200)]
    picks = []
    for loc in locs:
        no, row = loc >> 32, loc & 0xFFFFFFFF
        ((rg, _sel, local),) = list(a._by_group(no, [row]))
        picks.append((a._reader(no), rg, local))
    for r, rg, local in picks:
        r.take(rg, local)          # the directories parsed once
    it = iter(range(1 << 62))

    def one():
        r, rg, local = picks[next(it) % len(picks)]
        return r.take(rg, local)

    benchmark(one)


if __name__ == "__main__":      # pragma: no cover
    raise SystemExit(pytest.main([os.path.abspath(__file__), "-q"]))
