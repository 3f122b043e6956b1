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


@pytest.fixture(scope="module")
def cool_runs() -> Any:
    """Eight cool files' id runs of 120,000 uniform hashes (the archive of
    1,000,000 messages), as IdRuns serves them."""
    import numpy as np

    from rune_fast._index import IdRuns
    rng = np.random.default_rng(3)
    runs = IdRuns()
    for no in range(8):
        hs = np.sort(rng.integers(0, 2**64, size=120_000, dtype=np.uint64))
        runs.add(no, hs, np.arange(len(hs), dtype=np.uint32))
    return runs


@pytest.mark.benchmark(group="append_many parts, 1,000")
def test_new_ids_against_cool_runs(benchmark: Any, cool_runs: Any) -> None:
    """The append path's check of a batch's ids against every cool file's
    run (IdRuns.has_many: each run's filter, built by the first batch,
    then a search of what it lets through); fresh hashes each round, as a
    batch of new ids."""
    import numpy as np
    rng = np.random.default_rng(4)
    qs = iter([rng.integers(0, 2**64, size=BATCH, dtype=np.uint64) for _ in range(2_000)])
    benchmark.pedantic(lambda: cool_runs.has_many(next(qs)), rounds=1_000, warmup_rounds=5)


@pytest.mark.benchmark(group="append_many parts, 1,000")
@pytest.mark.parametrize("how", ["str_hashes", "arrow"])
def test_new_id_hashes(benchmark: Any, work: wl.Workload, how: str) -> None:
    """The archive's hashes of a batch's new ids: each str hashed where it
    lies (what the append path does) or through an Arrow string array."""
    import pyarrow as pa

    from rune_fast._index import str_hashes
    from rune_fast._log import utf8_hashes
    ids = [m["msg_id"] for m in work.messages[:BATCH]]

    def arrow() -> Any:
        arr = pa.array(ids, type=pa.string())
        _v, offsets, data = arr.buffers()
        return utf8_hashes(offsets, data, arr.offset, len(arr))
    benchmark(lambda: str_hashes(ids)) if how == "str_hashes" else benchmark(arrow)


def _job_and_keys(work: wl.Workload) -> tuple[Any, list[bytes]]:
    batch = [wl.default_message_factory(m) for m in work.messages[:BATCH]]
    _b, job, keys = codec.encode_batch(batch, hash_job=True)
    return job, keys


@pytest.mark.benchmark(group="append_many envelopes, 1,000")
def test_envelopes_from_the_hash_job(benchmark: Any, work: wl.Workload) -> None:
    """message_envelopes writing each hash's hex from the job's digests (the append path)."""
    from rune_fast._encode import message_envelopes
    job, keys = _job_and_keys(work)
    order = list(range(BATCH))
    benchmark(message_envelopes, keys, job, order, codec.dumps(1.7e9))


@pytest.mark.benchmark(group="append_many envelopes, 1,000")
def test_envelopes_from_hash_strs(benchmark: Any, work: wl.Workload) -> None:
    """The path before, from the job's list of 1,000 hex str (made once
    here: HashJob.result's str a message come on top)."""
    from rune_fast._encode import message_envelopes
    order = list(range(BATCH))
    ts = codec.dumps(1.7e9)

    job, keys = _job_and_keys(work)
    hashes = job.result()
    benchmark(message_envelopes, keys, hashes, order, ts)


@pytest.mark.benchmark(group="time repr, 1,000")
def test_ts_repr_fast_path(benchmark: Any) -> None:
    """rf_float_repr on times of the epoch (through the test hook: a call each)."""
    from rune_fast._encode import _float_repr
    import random
    rng = random.Random(5)
    xs = [rng.uniform(1.7e9, 1.8e9) for _ in range(BATCH)]
    benchmark(lambda: [_float_repr(x) for x in xs])


@pytest.mark.benchmark(group="time repr, 1,000")
def test_ts_repr_dtoa(benchmark: Any) -> None:
    """repr() (dtoa) on the same times."""
    import random
    rng = random.Random(5)
    xs = [rng.uniform(1.7e9, 1.8e9) for _ in range(BATCH)]
    benchmark(lambda: [repr(x) for x in xs])
