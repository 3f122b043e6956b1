"""Microbenchmarks of the compiled core (pytest-benchmark; not part of the test run).

    python3 -m pytest bench/test_core_bench.py --benchmark-columns=min,median,ops

A 200,000-message tail (~80 MB) is built once per session; bench/core_numbers.py
prints the 1,000,000-message table with the targets.
"""
from __future__ import annotations

import mmap
import os
import random

import orjson
import pytest

try:
    from core_numbers import make_rests
except ImportError:  # bench/ imported as a package
    from bench.core_numbers import make_rests

from rune_fast import _index, _log, _search

N = int(os.environ.get("RF_BENCH_N", "200000"))


def key(s: str) -> bytes:
    return orjson.dumps(s)[1:-1]


@pytest.fixture(scope="session")
def tail(tmp_path_factory):
    d = tmp_path_factory.mktemp("core-bench")
    path = d / "seg-00000000.jsonl"
    data = _log.frame_many(make_rests(N))
    w = _log.TailWriter(path)
    w.append(data)
    w.close()
    f = open(path, "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    yield d, m
    m.close()
    f.close()


@pytest.fixture(scope="session")
def index(tail):
    _, m = tail
    ix = _index.HotIndex()
    ix.attach(0, m)
    ix.ingest(0)
    yield ix
    ix.detach(0)


@pytest.mark.benchmark(group="scan")
def test_scan_frames_verify(benchmark, tail):
    _, m = tail
    s = benchmark(_log.scan_frames, m)
    assert len(s.offsets) == N
    benchmark.extra_info["GB/s"] = len(m) / benchmark.stats.stats.median / 1e9


@pytest.mark.benchmark(group="scan")
def test_rescan_into_index(benchmark, tail):
    _, m = tail

    def rescan():
        ix = _index.HotIndex()
        ix.attach(0, m)
        ix.ingest(0)
        return ix
    ix = benchmark.pedantic(rescan, rounds=5, iterations=1)
    assert len(ix) == N
    benchmark.extra_info["ns/message"] = benchmark.stats.stats.median / N * 1e9


@pytest.mark.benchmark(group="lookup")
def test_find_many_hits(benchmark, index):
    rnd = random.Random(3)
    keys = [key(f"msg_{rnd.randrange(N):026d}") for _ in range(50_000)]
    out = benchmark(index.find_many, keys)
    assert (out >= 0).all()
    benchmark.extra_info["ns/lookup"] = benchmark.stats.stats.median / len(keys) * 1e9


@pytest.mark.benchmark(group="lookup")
def test_find_one_from_python(benchmark, index):
    k = key(f"msg_{N // 2:026d}")
    assert benchmark(index.find, k) >= 0


@pytest.mark.benchmark(group="lookup")
def test_channel_window(benchmark, index):
    assert len(benchmark(index.channel_locs, b"ch_0007", 8)) == 8


@pytest.mark.benchmark(group="append")
def test_append_and_add(benchmark, tmp_path):
    path = tmp_path / "seg.jsonl"
    w = _log.TailWriter(path)
    ix = _index.HotIndex()
    f = open(path, "a+b")
    lines = [_log.frame(r) for r in make_rests(2000, seed=9)]
    it = iter(range(10**9))

    def one():
        i = next(it) % len(lines)
        off = w.append(lines[i])
        ix.attach(0, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        ix.add(off)
    benchmark.pedantic(one, rounds=2000, iterations=1)
    w.close()
    ix.detach(0)
    f.close()


@pytest.mark.benchmark(group="append")
def test_append_and_append_bytes(benchmark, tmp_path):
    """The write path without a remap per append: the index keeps a copy."""
    path = tmp_path / "seg.jsonl"
    w = _log.TailWriter(path)
    ix = _index.HotIndex()
    ix.attach(0, None)
    lines = [_log.frame(r) for r in make_rests(2000, seed=9)]
    it = iter(range(10**9))

    def one():
        i = next(it) % len(lines)
        off = w.append(lines[i])
        ix.append_bytes(0, off, lines[i])
    benchmark.pedantic(one, rounds=2000, iterations=1)
    w.close()
    ix.detach(0)


@pytest.mark.benchmark(group="snapshot")
def test_snapshot_save(benchmark, index, tmp_path):
    p = tmp_path / "idx.snap"
    benchmark.pedantic(index.save_snapshot, args=(p, {0: 1}), rounds=3, iterations=1)


@pytest.mark.benchmark(group="snapshot")
def test_snapshot_load(benchmark, index, tmp_path):
    p = tmp_path / "idx.snap"
    index.save_snapshot(p, {0: 1})
    j, cov = benchmark(_index.HotIndex.load_snapshot, p)
    assert len(j) == len(index)


@pytest.mark.benchmark(group="search")
@pytest.mark.parametrize("ci", [False, True], ids=["exact", "ascii-ci"])
def test_index_search(benchmark, index, tail, ci):
    _, m = tail
    benchmark(index.search, b"zebra", ci, False)
    benchmark.extra_info["GB/s"] = len(m) / benchmark.stats.stats.median / 1e9


@pytest.mark.benchmark(group="search")
@pytest.mark.parametrize("ci", [False, True], ids=["exact", "ascii-ci"])
def test_find_spans(benchmark, tail, ci):
    _, m = tail
    s = _log.scan_frames(m)
    ends = s.offsets + s.lengths
    benchmark(_search.find_spans, m, s.offsets, ends, b"zebra", ci, False)
    benchmark.extra_info["GB/s"] = len(m) / benchmark.stats.stats.median / 1e9
