"""pytest-benchmark microbenchmarks of the hot read path (window and
get_message in one compiled call each), side by side with SQLite's indexed
queries on the same records.

Run only on demand (bench/ is outside the default test run)::

    python -m pytest bench/test_hot_reads_bench.py --benchmark-columns=min,median,ops \\
        --benchmark-group-by=group --benchmark-sort=name

``RUNE_BENCH_STORE`` names a COPY of a store built by ``bench/build_10m.py
--sqlite`` (its ``rune/`` and ``sqlite/`` and ``queries.json``; never the
shared original: a repository opened on it is a writer); without it a
store of ``RUNE_BENCH_N`` (default 20,000) messages of the volume workload
is built once. The access pattern is the bench's (rune_fast/bench/phases.py
read_rows): random channels, random ids of a working set of 2,000. Groups:
``window(ch, 8)`` with the records cached, ``window(ch, 8)`` whose records
are not cached (the decode cache emptied first; SQLite has no such cache),
``get_message(id)``, and ``get_message(id)`` of archived messages.
"""
from __future__ import annotations

import itertools
import json
import os
import random
from typing import Any, Iterator

import pytest

from rune_fast.bench import workload as wl
from rune_fast.bench.sqlite_store import SQLiteStore
from rune_fast.records import ConversationMessageRecord

N = int(os.environ.get("RUNE_BENCH_N", "20000"))
STORE = os.environ.get("RUNE_BENCH_STORE")
QUERIES = 2_000
OPTS = dict(compact_every=64, hot_window=512)       # the bench's (rune_fast/bench/report.py)


def _repo_class() -> Any:
    mod = pytest.importorskip("rune_fast.conversation_state")
    return mod.ConversationStateRepository


@pytest.fixture(scope="session")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, list[str], list[str]]]:
    if STORE:
        with open(os.path.join(STORE, "queries.json")) as f:
            q = json.load(f)
        chans, ids, rdir, sdir = q["channels"], q["ids"], os.path.join(STORE, "rune"), os.path.join(STORE, "sqlite")
    else:
        w = wl.generate(N, seed=0)
        d = str(tmp_path_factory.mktemp("hot-reads-bench"))
        rdir, sdir = os.path.join(d, "rune"), os.path.join(d, "sqlite")
        r = _repo_class()(rdir, **OPTS)
        s = SQLiteStore(sdir, durability="off", record_type=ConversationMessageRecord)
        for i in range(0, len(w.messages), 1_000):
            batch = [wl.default_message_factory(m) for m in w.messages[i:i + 1_000]]
            r.append_many(batch)
            s.append_many(batch)
        r.compact()
        r.close()
        s.close()
        chans, ids = list(w.channel_ids), [m["msg_id"] for m in w.messages]
    rune = _repo_class()(rdir, **OPTS)
    sql = SQLiteStore(sdir, durability="fsync", record_type=ConversationMessageRecord)
    rng = random.Random(31)
    yield rune, sql, [rng.choice(chans) for _ in range(QUERIES)], random.Random(32).sample(ids, QUERIES)
    rune.close()
    sql.close()


def _cycled(fn: Any, items: list[str]) -> Any:
    it = itertools.cycle(items)
    for x in items:             # the working set read once (the bench's loops cycle it)
        fn(x)
    return lambda: fn(next(it))


@pytest.mark.benchmark(group="window(ch, 8)")
def test_window_rune(benchmark: Any, stores: Any) -> None:
    rune, _sql, chans, _ids = stores
    benchmark(_cycled(lambda c: rune.window(c, 8), chans))


@pytest.mark.benchmark(group="window(ch, 8)")
def test_window_sqlite(benchmark: Any, stores: Any) -> None:
    _rune, sql, chans, _ids = stores
    benchmark(_cycled(lambda c: sql.window(c, 8), chans))


@pytest.mark.benchmark(group="window(ch, 8), records not cached")
def test_window_uncached_rune(benchmark: Any, stores: Any) -> None:
    rune, _sql, chans, _ids = stores
    it = itertools.cycle(chans)
    cache = rune._decoded

    def read() -> None:
        cache.clear()
        rune.window(next(it), 8)
    benchmark(read)


@pytest.mark.benchmark(group="window(ch, 8), records not cached")
def test_window_uncached_sqlite(benchmark: Any, stores: Any) -> None:
    _rune, sql, chans, _ids = stores
    it = itertools.cycle(chans)
    benchmark(lambda: sql.window(next(it), 8))


@pytest.mark.benchmark(group="get_message(id)")
def test_get_message_rune(benchmark: Any, stores: Any) -> None:
    rune, _sql, _chans, ids = stores
    benchmark(_cycled(rune.get_message, ids))


@pytest.mark.benchmark(group="get_message(id)")
def test_get_message_sqlite(benchmark: Any, stores: Any) -> None:
    _rune, sql, _chans, ids = stores
    benchmark(_cycled(sql.get_message, ids))


@pytest.fixture(scope="session")
def archived(stores: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[str]]]:
    """A repository and 2,000 ids of archived messages: the store's own
    (RUNE_BENCH_STORE: at 1,000,000 most ids are archived) or, when it has
    too few, a store of N messages built with a hot window of 16 and read
    with the budget the default gives a store of 1,000,000 (48 MiB: the
    working set's records fit, as they do there)."""
    rune, _sql, _chans, ids = stores
    cool = [i for i in ids if rune.get_message(i).tier == "cool"]
    if len(cool) >= QUERIES // 2:
        yield rune, cool
        return
    w = wl.generate(N, seed=0)
    d = str(tmp_path_factory.mktemp("archived-reads-bench"))
    r = _repo_class()(d, compact_every=64, hot_window=16)
    for i in range(0, len(w.messages), 1_000):
        r.append_many([wl.default_message_factory(m) for m in w.messages[i:i + 1_000]])
    r.compact()
    r.close()
    r = _repo_class()(d, compact_every=64, hot_window=16, cache_bytes=48 << 20)
    ids = random.Random(32).sample([m["msg_id"] for m in w.messages], QUERIES)
    cool = [i for i in ids if r.get_message(i).tier == "cool"]
    yield r, cool
    r.close()


@pytest.mark.benchmark(group="get_message(id), archived")
def test_get_message_archived_rune(benchmark: Any, archived: Any) -> None:
    """An archived message read again: the id index's kept answer and the
    cool records' cache (IdRuns.kept), no run searched."""
    rune, ids = archived
    benchmark(_cycled(rune.get_message, ids))
