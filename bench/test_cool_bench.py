"""Benchmarks of the cool tier (group "cool"): cooling a run, exact reads and
search over a 100,000-message archive.

Run: ``python -m pytest bench/test_cool_bench.py --benchmark-columns=min,median,mean,ops``
"""
from __future__ import annotations

import itertools
import os
import random
import tempfile

import pytest

from rune_fast.cool import CoolArchive, _table_from_records, record_digest

WORDS = ("the agent called a tool and the result was parsed into a structured answer for "
         "the user who asked about invoices shipping weather code review deployment logs "
         "Straße café naïve résumé 東京 données").split()


def make_rows(n: int, seed: int = 7, channels: int = 50) -> list[dict]:
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        ch = f"chan-{i % channels:03d}"
        text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(10, 90)))
        rows.append({
            "msg_id": f"msg_{i:026d}", "channel_id": ch, "task_id": f"task_{i // 40:06d}" if i % 3 else "",
            "hlc": "", "content": text, "ts": 1_700_000_000.0 + i * 0.25,
            "role": ("user", "assistant", "tool")[i % 3], "token_estimate": len(text) // 4,
            "tool_calls": [{"id": f"call_{i}", "name": "lookup", "arguments": {"q": text[:20], "n": i}}]
            if i % 10 == 0 else [],
            "tool_call_id": f"call_{i - 1}" if i % 3 == 2 else "", "origin": "dev-a", "schema_version": 1,
        })
    return rows


def cool(archive: CoolArchive, rows: list[dict], ords: list[int]) -> None:
    """Cool record dicts as one file, as the repository cools its lines: a
    table of the cool schema through ``cool_table``."""
    archive.cool_table(_table_from_records(rows, ords, [record_digest(r) for r in rows]))


def cooled(rows: list[dict]) -> tuple[list[dict], list[int]]:
    ords = list(range(len(rows)))
    pairs = sorted(zip(rows, ords), key=lambda p: p[0]["channel_id"])
    return [p[0] for p in pairs], [p[1] for p in pairs]


@pytest.fixture(scope="module")
def archive_100k():
    tmp = tempfile.mkdtemp(prefix="cool-bench-")
    rows = make_rows(100_000)
    a = CoolArchive(os.path.join(tmp, "cool"), cache_bytes=256 << 20)
    for k in range(0, len(rows), 25_000):
        cool(a, *cooled(rows[k:k + 25_000]))
    a.merge(max_files=1)
    return a, rows


@pytest.mark.benchmark(group="cool")
def test_cool_10k_rows(benchmark, tmp_path):
    rows, ords = cooled(make_rows(10_000))
    counter = itertools.count()

    def setup():
        return (CoolArchive(str(tmp_path / f"c{next(counter)}")),), {}

    def run(a):
        cool(a, rows, ords)

    benchmark.pedantic(run, setup=setup, rounds=5)


@pytest.mark.benchmark(group="cool")
def test_cool_10k_rows_not_durable(benchmark, tmp_path):
    """The same run with ``durable=False`` (no fsyncs; repository durability="none")."""
    rows, ords = cooled(make_rows(10_000))
    counter = itertools.count()

    def setup():
        return (CoolArchive(str(tmp_path / f"n{next(counter)}"), durable=False),), {}

    def run(a):
        cool(a, rows, ords)

    benchmark.pedantic(run, setup=setup, rounds=5)


@pytest.mark.benchmark(group="cool")
def test_contains_miss_100k(benchmark, archive_100k):
    """The append path's duplicate check for a new id: one hash probe."""
    a, _rows = archive_100k
    ids = [f"msg_new_{i:020d}" for i in range(1000)]
    it = itertools.cycle(ids)
    benchmark(lambda: a.contains(next(it)))


@pytest.mark.benchmark(group="cool")
def test_contains_hit_100k(benchmark, archive_100k):
    """A duplicate append of a cooled id: the stored id is compared, not the row."""
    a, rows = archive_100k
    it = itertools.cycle([r["msg_id"] for r in random.Random(4).sample(rows, 1000)])
    benchmark(lambda: a.contains(next(it)))


@pytest.mark.benchmark(group="cool")
def test_task_rows_100k(benchmark, archive_100k):
    a, _rows = archive_100k
    it = itertools.cycle([f"task_{i:06d}" for i in range(0, 2500, 37)])
    benchmark(lambda: a.rows_at(a.task_locs(next(it))))


@pytest.mark.benchmark(group="cool")
def test_get_from_100k(benchmark, archive_100k):
    a, rows = archive_100k
    ids = [r["msg_id"] for r in random.Random(1).sample(rows, 1000)]
    for m in ids:                       # warm the row-group cache
        a.get(m)
    it = itertools.cycle(ids)
    benchmark(lambda: a.get(next(it)))


@pytest.mark.benchmark(group="cool")
def test_get_cold_from_100k(benchmark, archive_100k):
    """Exact read with an empty cache: one row group decompressed per read."""
    a, rows = archive_100k
    cold = CoolArchive.open(a.cool_dir, a.files(), read_only=True, cache_bytes=1)
    it = itertools.cycle([r["msg_id"] for r in random.Random(2).sample(rows, 1000)])
    benchmark(lambda: cold.get(next(it)))


@pytest.mark.benchmark(group="cool")
def test_search_100k_casefold(benchmark, archive_100k):
    a, _rows = archive_100k
    a.search("warm up")
    hits = benchmark(lambda: a.search("INVOICES SHIPPING WEATHER"))
    assert all("invoices shipping weather" in h.record["content"].casefold() for h in hits)


@pytest.mark.benchmark(group="cool")
def test_search_100k_case_sensitive(benchmark, archive_100k):
    a, _rows = archive_100k
    a.search("warm up", case_sensitive=True)
    benchmark(lambda: a.search("Straße café naïve", case_sensitive=True))


@pytest.mark.benchmark(group="cool")
def test_search_100k_channel(benchmark, archive_100k):
    a, _rows = archive_100k
    benchmark(lambda: a.search("deployment logs", "chan-007"))


@pytest.mark.benchmark(group="cool")
def test_channel_tail_100k(benchmark, archive_100k):
    a, _rows = archive_100k
    benchmark(lambda: a.channel_tail("chan-013", 8))


@pytest.mark.benchmark(group="cool")
def test_open_100k(benchmark, archive_100k):
    a, _rows = archive_100k
    benchmark(lambda: CoolArchive.open(a.cool_dir, a.files(), read_only=True))
