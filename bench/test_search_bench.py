"""search(q, limit=20) at two store sizes: flat in the size for a needle in
most messages (the hot tier walked from the newest message), at scan speed
for a rare one.

Run with ``python -m pytest bench/test_search_bench.py``. The stores are
built once a session from the bench workload (``rune_fast.bench.workload``,
a third of its messages holding non-ASCII text); ``RUNE_BENCH_SEARCH_SIZES``
sets the two sizes (default ``10000,100000``).
"""
from __future__ import annotations

import os

import pytest

from rune_fast.bench import workload
from rune_fast.conversation_state import ConversationStateRepository

SIZES = [int(x) for x in os.environ.get("RUNE_BENCH_SEARCH_SIZES", "10000,100000").split(",")]
#: (needle, class): common and rare, ASCII and not
NEEDLES = [("error", "common-ascii"), ("Straße", "common-nonascii"),
           ("qwertyzzz", "rare-ascii"), ("zürich-xq", "rare-nonascii")]


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"{n // 1000}k")
def store(request, tmp_path_factory):
    n = request.param
    path = tmp_path_factory.mktemp(f"search{n}")
    msgs = [workload.default_message_factory(m) for m in workload.generate(n, seed=0).messages]
    with ConversationStateRepository(path, durability="none", compact_every=1 << 30) as repo:
        for i in range(0, n, 5000):
            repo.append_many(msgs[i:i + 5000])
        repo.compact()
    repo = ConversationStateRepository(path, read_only=True)
    repo.search("warm the maps", limit=20)
    yield repo
    repo.close()


@pytest.mark.benchmark(group="search-limit")
@pytest.mark.parametrize("needle,kind", NEEDLES, ids=[k for _n, k in NEEDLES])
def test_search_limit_20(benchmark, store, needle, kind):
    hits = benchmark(lambda: store.search(needle, limit=20))
    benchmark.extra_info.update(messages=len(store), hits=len(hits), kind=kind)
