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


@pytest.fixture(scope="module")
def plain(messages):
    """Every message's content as UTF-8 in one buffer, with int32 offsets
    (an archived content column's layout)."""
    raws = [m.content.encode("utf-8") for m in messages]
    offs = np.cumsum([0] + [len(r) for r in raws]).astype(np.int32)
    return b"".join(raws), offs


@pytest.mark.benchmark(group="cool-filters")
def test_fold_block_grams_build(benchmark, plain):
    """What cooling pays a row for the cool files' search filters
    (rune_fast.cool.grams: blocks of 32 rows, 8,192 bits)."""
    from rune_fast._search import fold_block_grams
    from rune_fast.cool import grams
    data, offs = plain
    g = benchmark(fold_block_grams, data, offs, grams.BLOCK_ROWS, grams.GRAM_BITS)
    benchmark.extra_info.update(rows=len(offs) - 1, filter_bytes=len(g))


@pytest.mark.benchmark(group="cool-filters")
@pytest.mark.parametrize("needle,cls", NEEDLES, ids=[c for _n, c in NEEDLES])
def test_gram_blocks_any(benchmark, plain, needle, cls):
    """One compiled call tests every block of a file's filters."""
    from rune_fast._search import fold_block_grams, gram_blocks_any
    from rune_fast.cool import grams
    data, offs = plain
    g = fold_block_grams(data, offs, grams.BLOCK_ROWS, grams.GRAM_BITS)
    got = benchmark(gram_blocks_any, g, grams.GRAM_BITS, [needle.casefold().encode("utf-8")])
    benchmark.extra_info.update(blocks=len(g) // grams.BLOCK_BYTES, passed=len(got))
