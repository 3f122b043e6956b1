"""The casefold paths of search: the compiled matcher (fold_find) over the
content bytes of a workload's messages, the anchor plan of each needle
class, and search() of each class of rare needle on a store of the bench
workload (hot and cool tiers), with and without ``limit=20``.

Run with ``python -m pytest bench/test_fold_bench.py``;
``RUNE_BENCH_FOLD_N`` sets the store's size (default 20000).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from rune_fast import codec
from rune_fast._casefold import anchor_plan
from rune_fast._search import fold_find
from rune_fast.bench import workload
from rune_fast.conversation_state import ConversationStateRepository

N = int(os.environ.get("RUNE_BENCH_FOLD_N", "20000"))
NEEDLES = [(nd.query, nd.cls) for nd in workload.NEEDLES]


@pytest.fixture(scope="module")
def messages():
    return [workload.default_message_factory(m) for m in workload.generate(N, seed=0).messages]


@pytest.fixture(scope="module")
def escaped(messages):
    """Every message's escaped content bytes in one buffer, with its spans."""
    raws = [codec.key(m.content) for m in messages]
    lens = np.fromiter((len(r) for r in raws), dtype=np.int64, count=len(raws))
    ends = np.cumsum(lens)
    return b"".join(raws), ends - lens, ends


@pytest.fixture(scope="module")
def store(messages, tmp_path_factory):
    path = tmp_path_factory.mktemp("fold")
    with ConversationStateRepository(path, durability="none", compact_every=1 << 30) as repo:
        for i in range(0, len(messages), 5000):
            repo.append_many(messages[i:i + 5000])
        repo.compact()
    repo = ConversationStateRepository(path, read_only=True)
    repo.search("warm the maps")
    yield repo
    repo.close()


@pytest.mark.benchmark(group="fold-find")
@pytest.mark.parametrize("needle,cls", NEEDLES, ids=[c for _n, c in NEEDLES])
def test_fold_find_every_line(benchmark, escaped, needle, cls):
    """The matcher over every line: the cost of deciding a candidate, per byte."""
    data, starts, ends = escaped
    hits, _unsure = benchmark(fold_find, data, starts, ends, needle.casefold(), True)
    benchmark.extra_info.update(lines=len(starts), bytes=len(data), hits=len(hits))


@pytest.mark.benchmark(group="anchor-plan")
@pytest.mark.parametrize("needle,cls", NEEDLES, ids=[c for _n, c in NEEDLES])
def test_anchor_plan(benchmark, needle, cls):
    forms = benchmark(anchor_plan, needle.casefold())
    benchmark.extra_info.update(forms=forms)


@pytest.mark.benchmark(group="search-fold")
@pytest.mark.parametrize("limit", [None, 20], ids=["all", "limit20"])
@pytest.mark.parametrize("needle,cls", NEEDLES[:4], ids=[c for _n, c in NEEDLES[:4]])
def test_search_rare(benchmark, store, needle, cls, limit):
    hits = benchmark(lambda: store.search(needle, limit=limit))
    benchmark.extra_info.update(messages=len(store), hits=len(hits))
