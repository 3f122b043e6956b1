"""pytest-benchmark versions of the main comparison lines, one group per operation.

Run only on demand (bench/ is outside the default test run)::

    python -m pytest bench/ --benchmark-columns=min,median,mean,ops --benchmark-sort=name

``RUNE_BENCH_N`` sets the store size (default 20,000 messages of the seeded
workload). Each group holds the same operation on ``rune_fast`` (skipped until
``rune_fast.conversation_state`` is importable) and on ``sqlite`` at the same
durability; the append groups also hold the raw ``write`` + ``fdatasync`` loop.
pytest-benchmark reports times only: the ratios, and the memory and
bytes-written lines, are printed by ``python -m rune_fast.bench``.
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Iterator

import pytest

from rune_fast.bench import workload as wl
from rune_fast.bench.sqlite_store import SQLiteStore

N = int(os.environ.get("RUNE_BENCH_N", "20000"))
BATCH = 1_000
STORES = ("rune_fast", "sqlite")


def _rune_class() -> Any:
    mod = pytest.importorskip("rune_fast.conversation_state")
    return mod.ConversationStateRepository


_RECORD_TYPE: list[Any] = []


def _open(kind: str, state_dir: str, durability: str = "fsync") -> Any:
    if kind == "rune_fast":
        return _rune_class()(state_dir, durability=durability)
    if not _RECORD_TYPE:  # SQLite decodes into the same record type rune_fast returns
        rt = type(wl.default_message_factory(wl.generate(1, seed=9).messages[0]))
        _RECORD_TYPE.append(rt if hasattr(rt, "from_dict") else None)
    return SQLiteStore(state_dir, durability=durability, record_type=_RECORD_TYPE[0])


@pytest.fixture(scope="session")
def work() -> wl.Workload:
    return wl.generate(N, seed=0)


@pytest.fixture(scope="session")
def messages(work: wl.Workload) -> list[Any]:
    return [wl.default_message_factory(m) for m in work.messages]


_FRESH_SEED = itertools.count(1)


def _fresh(work: wl.Workload, count: int = 400) -> Iterator[Any]:
    """``count`` new messages (ids never stored before), built before any timing."""
    return iter([wl.default_message_factory(m) for m in work.fresh(count, seed=next(_FRESH_SEED))])


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory, messages: list[Any]) -> dict[str, str]:
    """State directories holding the workload, loaded in batches of 1,000, per store kind."""
    dirs: dict[str, str] = {}
    for kind in STORES:
        if kind == "rune_fast":
            try:
                _rune_class()
            except pytest.skip.Exception:
                continue
        d = str(tmp_path_factory.mktemp(f"bench-{kind}"))
        s = _open(kind, d)
        for i in range(0, len(messages), BATCH):
            s.append_many(messages[i:i + BATCH])
        s.compact()
        s.close()
        dirs[kind] = d
    return dirs


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, built: dict[str, str]) -> Iterator[tuple[str, Any]]:
    kind = request.param
    if kind not in built:
        _rune_class()  # skips
    s = _open(kind, built[kind])
    yield kind, s
    s.close()


def _search(kind: str, s: Any, text: str) -> list[Any]:
    return s.search(text) if kind == "rune_fast" else s.search_ci(text)


@pytest.mark.benchmark(group="window(ch, 8)")
def test_window(benchmark: Any, store: tuple[str, Any], work: wl.Workload) -> None:
    _kind, s = store
    chans = itertools.cycle(work.sample_channels(1_000, seed=31))
    benchmark(lambda: s.window(next(chans), 8))


@pytest.mark.benchmark(group="get_message")
def test_get_message(benchmark: Any, store: tuple[str, Any], work: wl.Workload) -> None:
    _kind, s = store
    ids = itertools.cycle(work.sample_ids(1_000, seed=32))
    benchmark(lambda: s.get_message(next(ids)))


@pytest.mark.benchmark(group="messages_for_task")
def test_messages_for_task(benchmark: Any, store: tuple[str, Any], work: wl.Workload) -> None:
    _kind, s = store
    tasks = itertools.cycle(work.sample_tasks(200, seed=33))
    benchmark(lambda: s.messages_for_task(next(tasks)))


@pytest.mark.benchmark(group="search case-insensitive")
def test_search_ci(benchmark: Any, store: tuple[str, Any]) -> None:
    kind, s = store
    benchmark.pedantic(_search, args=(kind, s, wl.NEEDLE_ASCII), rounds=5, warmup_rounds=1)


@pytest.mark.benchmark(group="append durable (fsync)")
def test_append_fsync(benchmark: Any, store: tuple[str, Any], work: wl.Workload) -> None:
    _kind, s = store
    fresh = _fresh(work)
    benchmark.pedantic(lambda: s.append(next(fresh)), rounds=300, warmup_rounds=10)


@pytest.mark.benchmark(group="append durable (fsync)")
def test_append_raw_fdatasync(benchmark: Any, tmp_path: Any, work: wl.Workload) -> None:
    """Baseline: ``os.write`` + ``os.fdatasync`` of each message's JSON line."""
    lines = iter([wl.json_line(m) for m in _fresh(work)])
    fd = os.open(tmp_path / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        def one() -> None:
            os.write(fd, next(lines))
            os.fdatasync(fd)
        benchmark.pedantic(one, rounds=300, warmup_rounds=10)
    finally:
        os.close(fd)


@pytest.mark.benchmark(group="append_many 1,000")
def test_append_many(benchmark: Any, store: tuple[str, Any], work: wl.Workload) -> None:
    _kind, s = store
    batches = iter([list(itertools.islice(_fresh(work, BATCH), BATCH)) for _ in range(6)])
    benchmark.pedantic(lambda: s.append_many(next(batches)), rounds=5, warmup_rounds=1)


@pytest.mark.benchmark(group="open + first window")
@pytest.mark.parametrize("kind", STORES)
def test_open_first_window(benchmark: Any, kind: str, built: dict[str, str], work: wl.Workload) -> None:
    if kind not in built:
        _rune_class()
    ch = work.channel_ids[0]

    def once() -> None:
        s = _open(kind, built[kind])
        s.window(ch, 8)
        s.close()
    benchmark.pedantic(once, rounds=7, warmup_rounds=1)
