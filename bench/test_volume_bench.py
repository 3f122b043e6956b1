"""pytest-benchmark microbenchmarks of the hot paths issue 33 names, on the
volume workload (100 channels, 1,000 tasks, ~450 content bytes a message,
most with non-ASCII text, planted needles of every class).

Run only on demand (bench/ is outside the default test run)::

    python -m pytest bench/test_volume_bench.py --benchmark-columns=min,median,ops --benchmark-sort=name

``RUNE_BENCH_N`` sets the store size (default 20,000 messages). Groups:
record construction (against a tuple of the same values), 100,000 records
built and a full collection with them held, ``append_many`` of
1,000, ``window``, ``get_message``, ``messages_for_task`` (a random task and
one of the biggest), and ``search`` of each needle class with and without
``limit=20`` (against a memmem scan of the same content bytes). The
side-by-side ratios with SQLite are printed by ``python -m rune_fast.bench``.
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Iterator

import pytest

from rune_fast.bench import workload as wl
from rune_fast.bench.floors import ContentBuffer

N = int(os.environ.get("RUNE_BENCH_N", "20000"))
BATCH = 1_000


def _repo_class() -> Any:
    mod = pytest.importorskip("rune_fast.conversation_state")
    return mod.ConversationStateRepository


@pytest.fixture(scope="session")
def work() -> wl.Workload:
    return wl.generate(N, seed=0)


@pytest.fixture(scope="session")
def loaded(tmp_path_factory: pytest.TempPathFactory, work: wl.Workload) -> str:
    d = str(tmp_path_factory.mktemp("volume-bench"))
    s = _repo_class()(d)
    msgs = work.messages
    for i in range(0, len(msgs), BATCH):
        s.append_many([wl.default_message_factory(m) for m in msgs[i:i + BATCH]])
    s.compact()
    s.close()
    return d


@pytest.fixture(scope="session")
def repo(loaded: str) -> Iterator[Any]:
    s = _repo_class()(loaded)
    yield s
    s.close()


@pytest.fixture(scope="session")
def buf(work: wl.Workload) -> ContentBuffer:
    return ContentBuffer(work.messages)


# -- records ---------------------------------------------------------------


@pytest.mark.benchmark(group="record construction")
def test_record_new(benchmark: Any, work: wl.Workload) -> None:
    dicts = itertools.cycle(work.messages[:1_000])
    benchmark(lambda: wl.default_message_factory(next(dicts)))


@pytest.mark.benchmark(group="record construction")
def test_record_tuple_baseline(benchmark: Any, work: wl.Workload) -> None:
    rows = itertools.cycle([list(m.values()) for m in work.messages[:1_000]])
    benchmark(lambda: tuple(next(rows)))


@pytest.mark.benchmark(group="records held")
def test_build_100k_records(benchmark: Any, work: wl.Workload) -> None:
    """100,000 records built and held (the collections their allocations
    set off walk the tracked ones among them)."""
    dicts = [work.messages[i % len(work.messages)] for i in range(100_000)]
    benchmark.pedantic(lambda: [wl.default_message_factory(d) for d in dicts], rounds=5, warmup_rounds=1)


@pytest.mark.benchmark(group="records held")
def test_full_collection_with_100k_records(benchmark: Any, work: wl.Workload) -> None:
    """gc.collect() with 100,000 records alive (those of plain fields are
    not walked: untracked by the constructor)."""
    import gc

    held = [wl.default_message_factory(work.messages[i % len(work.messages)]) for i in range(100_000)]
    benchmark.pedantic(gc.collect, rounds=7, warmup_rounds=1)
    assert len(held) == 100_000


# -- writes ------------------------------------------------------------------


@pytest.mark.benchmark(group="append_many 1,000")
def test_append_many(benchmark: Any, repo: Any, work: wl.Workload) -> None:
    batches = iter([[wl.default_message_factory(m) for m in work.fresh(BATCH, seed=900 + i)] for i in range(8)])
    benchmark.pedantic(lambda: repo.append_many(next(batches)), rounds=7, warmup_rounds=1)


@pytest.mark.benchmark(group="append_many 1,000")
def test_append_many_with_records(benchmark: Any, repo: Any, work: wl.Workload) -> None:
    """The same, records built inside the timing (what a caller pays from dicts)."""
    batches = iter([work.fresh(BATCH, seed=950 + i) for i in range(8)])
    benchmark.pedantic(lambda: repo.append_many([wl.default_message_factory(m) for m in next(batches)]),
                       rounds=7, warmup_rounds=1)


# -- reads -------------------------------------------------------------------


@pytest.mark.benchmark(group="window(ch, 8)")
def test_window(benchmark: Any, repo: Any, work: wl.Workload) -> None:
    chans = itertools.cycle(work.sample_channels(1_000, seed=31))
    benchmark(lambda: repo.window(next(chans), 8))


@pytest.mark.benchmark(group="window(ch, 8)")
def test_window_plain_loop(benchmark: Any, buf: ContentBuffer, work: wl.Workload) -> None:
    chans = itertools.cycle(work.sample_channels(1_000, seed=31))
    benchmark(lambda: buf.window(next(chans), 8))


@pytest.mark.benchmark(group="get_message")
def test_get_message(benchmark: Any, repo: Any, work: wl.Workload) -> None:
    ids = itertools.cycle(work.sample_ids(5_000, seed=32))
    benchmark(lambda: repo.get_message(next(ids)))


@pytest.mark.benchmark(group="messages_for_task")
def test_messages_for_task(benchmark: Any, repo: Any, work: wl.Workload) -> None:
    tasks = itertools.cycle(work.sample_tasks(300, seed=33))
    benchmark(lambda: repo.messages_for_task(next(tasks)))


@pytest.mark.benchmark(group="messages_for_task")
def test_messages_for_task_biggest(benchmark: Any, repo: Any, work: wl.Workload) -> None:
    sizes = work.task_sizes()
    big = sorted(sizes, key=lambda t: -sizes[t])[: max(1, len(sizes) // 10)]
    tasks = itertools.cycle(big)
    benchmark.extra_info["mean messages"] = sum(sizes[t] for t in big) / len(big)
    benchmark(lambda: repo.messages_for_task(next(tasks)))


@pytest.mark.benchmark(group="messages_for_task")
def test_messages_for_task_plain_loop(benchmark: Any, buf: ContentBuffer, work: wl.Workload) -> None:
    tasks = itertools.cycle(work.sample_tasks(300, seed=33))
    benchmark(lambda: buf.task(next(tasks)))


# -- search ------------------------------------------------------------------

_CLASSES = [nd.cls for nd in wl.NEEDLES]
_QUERY = {nd.cls: nd.query for nd in wl.NEEDLES}


@pytest.mark.benchmark(group="search")
@pytest.mark.parametrize("cls", _CLASSES)
def test_search(benchmark: Any, repo: Any, cls: str) -> None:
    hits = benchmark.pedantic(repo.search, args=(_QUERY[cls],), rounds=5, warmup_rounds=1)
    benchmark.extra_info["hits"] = len(hits)


@pytest.mark.benchmark(group="search limit=20")
@pytest.mark.parametrize("cls", _CLASSES)
def test_search_limit(benchmark: Any, repo: Any, cls: str) -> None:
    benchmark.pedantic(lambda: repo.search(_QUERY[cls], limit=20), rounds=10, warmup_rounds=1)


@pytest.mark.benchmark(group="search scan (plain loop)")
@pytest.mark.parametrize("cls", _CLASSES)
def test_search_scan_plain_loop(benchmark: Any, buf: ContentBuffer, cls: str) -> None:
    """glibc memmem over one buffer of every content byte (bytes.count where there is no glibc)."""
    scan = buf.memmem_count if buf.memmem_count(_QUERY[cls]) >= 0 else buf.scan
    benchmark.pedantic(scan, args=(_QUERY[cls],), rounds=10, warmup_rounds=1)
    if benchmark.stats:  # None under --benchmark-disable
        benchmark.extra_info["GB/s"] = len(buf.buf) / benchmark.stats.stats.median / 1e9
