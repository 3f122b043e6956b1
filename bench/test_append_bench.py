"""pytest-benchmark microbenchmarks of append_many's parts (issue 33, bulk):
a durable append_many of 1,000 with its sync overlapped (the default) and
in line, against the plain loop (one write + fdatasync of the batch's JSON
lines); the encoder; the decode cache's batch put against the Python loop
it replaced.

Run only on demand (bench/ is outside the default test run)::

    python -m pytest bench/test_append_bench.py --benchmark-columns=min,median,ops --benchmark-sort=name

``RUNE_BENCH_N`` sets the store size (default 20,000 messages).
"""
from __future__ import annotations

import os
from typing import Any, Iterator

import pytest

from rune_fast import codec
from rune_fast._conv import tuning
from rune_fast._conv.common import _own
from rune_fast._conv.reads import record_bytes
from rune_fast._index import LocCache
from rune_fast.bench import workload as wl
from rune_fast.conversation_state import ConversationStateRepository

N = int(os.environ.get("RUNE_BENCH_N", "20000"))
BATCH = 1_000
ROUNDS = 9


@pytest.fixture(scope="module")
def work() -> wl.Workload:
    return wl.generate(N, seed=0)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, work: wl.Workload) -> Iterator[Any]:
    s = ConversationStateRepository(str(tmp_path_factory.mktemp("append-bench")))
    msgs = work.messages
    for i in range(0, len(msgs), BATCH):
        s.append_many([wl.default_message_factory(m) for m in msgs[i:i + BATCH]])
    s.compact()
    yield s
    s.close()


def _batches(work: wl.Workload, seed: int, n: int) -> Iterator[list]:
    return iter([[wl.default_message_factory(m) for m in work.fresh(BATCH, seed=seed + i)] for i in range(n)])


@pytest.mark.benchmark(group="append_many 1,000, durable")
def test_append_many_sync_overlapped(benchmark: Any, repo: Any, work: wl.Workload) -> None:
    batches = _batches(work, 1_100, ROUNDS + 1)
    benchmark.pedantic(lambda: repo.append_many(next(batches)), rounds=ROUNDS, warmup_rounds=1)


@pytest.mark.benchmark(group="append_many 1,000, durable")
def test_append_many_sync_in_line(benchmark: Any, repo: Any, work: wl.Workload,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "SYNC_OVERLAP_MIN", 1 << 40)
    batches = _batches(work, 1_200, ROUNDS + 1)
    benchmark.pedantic(lambda: repo.append_many(next(batches)), rounds=ROUNDS, warmup_rounds=1)


@pytest.mark.benchmark(group="append_many 1,000, durable")
def test_append_many_plain_loop(benchmark: Any, work: wl.Workload, tmp_path: Any) -> None:
    """The floor: one os.write of the batch's JSON lines + os.fdatasync."""
    datas = iter([b"".join(wl.json_line(m) for m in work.fresh(BATCH, seed=1_300 + i))
                  for i in range(ROUNDS + 1)])
    fd = os.open(tmp_path / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write_sync() -> None:
        os.write(fd, next(datas))
        os.fdatasync(fd)

    try:
        benchmark.pedantic(write_sync, rounds=ROUNDS, warmup_rounds=1)
    finally:
        os.close(fd)


@pytest.mark.benchmark(group="append_many parts, 1,000")
def test_encode_batch(benchmark: Any, work: wl.Workload) -> None:
    batch = [wl.default_message_factory(m) for m in work.messages[:BATCH]]
    benchmark(codec.encode_batch, batch)


@pytest.mark.benchmark(group="append_many parts, 1,000")
def test_cache_put_appended(benchmark: Any, work: wl.Workload) -> None:
    batch = [wl.default_message_factory(m) for m in work.messages[:BATCH]]
    order, lengths = list(range(BATCH)), [600] * BATCH

    def put() -> None:
        LocCache(8192).put_appended(batch, order, lengths, 1 << 40, 0, 0, tuning.RECORD_OVERHEAD,
                                    tuning.TOOL_CALL_BYTES, _own)

    benchmark(put)


@pytest.mark.benchmark(group="append_many parts, 1,000")
def test_cache_python_loop(benchmark: Any, work: wl.Workload) -> None:
    """The loop put_appended replaced."""
    batch = [wl.default_message_factory(m) for m in work.messages[:BATCH]]

    def put() -> None:
        cache = LocCache(8192)
        pos = 1 << 40
        for j, m in enumerate(batch):
            cache.put(pos, (_own(m), j), record_bytes(m))
            pos += 600

    benchmark(put)
