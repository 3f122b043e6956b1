"""IdRuns (the cool id index searched where the sidecars map it) against a
plain-Python model: its lookups aim by interpolation and close in without
branches, which must find every hash whatever the runs hold (uniform ids,
clustered or repeated hashes, the extremes, runs of any length)."""
from __future__ import annotations

import bisect

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rune_fast._index import IdRuns

U64 = st.integers(min_value=0, max_value=2**64 - 1)


@st.composite
def hashes(draw):
    """A list of uint64 hashes: uniform, clustered around a few centres
    (the interpolation aims badly there) or drawn from a tiny set
    (repeats), with the extremes mixed in."""
    kind = draw(st.sampled_from(["uniform", "clustered", "repeats"]))
    n = draw(st.integers(min_value=0, max_value=3000))
    rng = np.random.default_rng(draw(st.integers(min_value=0, max_value=2**32 - 1)))
    if kind == "uniform":
        hs = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False).tolist()
    elif kind == "clustered":
        centres = rng.integers(0, 2**64, size=3, dtype=np.uint64).tolist()
        hs = [min(2**64 - 1, max(0, centres[i % 3] + int(d)))
              for i, d in enumerate(rng.integers(-2**20, 2**20, size=n))]
    else:
        pool = rng.integers(0, 2**64, size=4, dtype=np.uint64).tolist()
        hs = [pool[i] for i in rng.integers(0, 4, size=n)]
    return hs + draw(st.lists(st.sampled_from([0, 1, 2**63, 2**64 - 2, 2**64 - 1]), max_size=3))


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(hashes(), min_size=0, max_size=4), extra=st.lists(U64, max_size=50),
       pick=st.integers(min_value=0, max_value=2**31))
def test_has_many_and_values_match_a_sorted_list_model(runs, extra, pick):
    idx = IdRuns()
    model: list[tuple[int, list[int]]] = []
    for no, hs in enumerate(runs):
        arr = np.array(sorted(hs), dtype=np.uint64)
        idx.add(no, arr, np.arange(len(arr), dtype=np.uint32))
        model.append((no, arr.tolist()))
    rng = np.random.default_rng(pick)
    present = [h for _no, hs in model for h in hs]
    queries = list(extra)
    if present:
        queries += [present[i] for i in rng.integers(0, len(present), size=min(200, len(present)))]
        # neighbours of stored hashes: a search that stops one place off misses them
        queries += [min(2**64 - 1, h + 1) for h in queries[-20:]] + [max(0, h - 1) for h in queries[-20:]]
    want = [any(_holds(hs, q) for _no, hs in model) for q in queries]
    assert idx.has_many(np.array(queries, dtype=np.uint64)).tolist() == want
    for q in queries[:60]:
        exp = [(no << 32) | i for no, hs in model for i, h in enumerate(hs) if h == q]
        assert idx.values(q) == exp


def _holds(sorted_hs: list[int], q: int) -> bool:
    i = bisect.bisect_left(sorted_hs, q)
    return i < len(sorted_hs) and sorted_hs[i] == q


def test_has_many_on_a_million_uniform_hashes_finds_each_and_no_other():
    # (the size where the interpolation is a few hundred places off)
    rng = np.random.default_rng(7)
    hs = np.sort(rng.integers(0, 2**64, size=1_000_000, dtype=np.uint64))
    idx = IdRuns()
    idx.add(3, hs, np.arange(len(hs), dtype=np.uint32))
    stored = hs[rng.integers(0, len(hs), size=20_000)]
    assert idx.has_many(stored).all()
    others = rng.integers(0, 2**64, size=20_000, dtype=np.uint64)
    want = np.isin(others, hs)
    assert (idx.has_many(others) == want).all()
    assert (idx.has_many(others + np.uint64(1)) == np.isin(others + np.uint64(1), hs)).all()


@settings(max_examples=100, deadline=None)
@given(runs=st.lists(hashes(), min_size=1, max_size=5), pick=st.integers(min_value=0, max_value=2**31),
       ops=st.lists(st.tuples(st.sampled_from(["ask", "small", "drop", "add"]), st.integers(0, 7)), max_size=8))
def test_has_many_with_filters_built_call_by_call_matches_the_model(runs, pick, ops):
    """A batch lookup builds the runs' filters as it goes (some runs
    filtered, some not, runs dropped and added between calls): every stored
    hash is still found, no absent one is (the filter only lets a hash
    through to the search), and a dropped run takes its filter along."""
    idx = IdRuns()
    model: dict[int, list[int]] = {}
    for no, hs in enumerate(runs):
        arr = np.array(sorted(hs), dtype=np.uint64)
        idx.add(no, arr, np.arange(len(arr), dtype=np.uint32))
        model[no] = arr.tolist()
    rng = np.random.default_rng(pick)

    def ask(size: int) -> None:
        present = [h for hs in model.values() for h in hs]
        qs = rng.integers(0, 2**64, size=size, dtype=np.uint64).tolist()
        if present:
            qs += [present[i] for i in rng.integers(0, len(present), size=size)]
            qs += [min(2**64 - 1, h + 1) for h in qs[-5:]]
        want = [any(_holds(hs, q) for hs in model.values()) for q in qs]
        assert idx.has_many(np.array(qs, dtype=np.uint64)).tolist() == want

    for op, arg in ops + [("ask", 0)]:
        if op == "ask":
            ask(40)                 # a batch: builds filters
        elif op == "small":
            ask(3)                  # below FILTER_MIN_BATCH: builds none
        elif op == "drop" and model:
            no = sorted(model)[arg % len(model)]
            assert idx.discard(no)
            del model[no]
        elif op == "add":
            no = 100 + arg
            arr = np.sort(rng.integers(0, 2**64, size=int(rng.integers(0, 500)), dtype=np.uint64))
            idx.add(no, arr, np.arange(len(arr), dtype=np.uint32))
            model[no] = arr.tolist()
        assert 0 <= idx.filtered <= idx.files == len(model)
    assert idx.filtered == sum(1 for hs in model.values() if hs)
    assert idx.filter_bytes >= 12 * len(idx) // 8
    idx.clear()
    assert idx.filtered == 0 and idx.filter_bytes == 0


def test_a_small_lookup_builds_no_filter_and_a_batch_builds_within_its_budget():
    rng = np.random.default_rng(3)
    idx = IdRuns()
    sizes = [700_000, 600_000, 10, 0]
    for no, n in enumerate(sizes):
        hs = np.sort(rng.integers(0, 2**64, size=n, dtype=np.uint64))
        idx.add(no, hs, np.arange(n, dtype=np.uint32))
    qs = rng.integers(0, 2**64, size=8, dtype=np.uint64)
    idx.has_many(qs)
    assert idx.filtered == 0
    idx.has_many(rng.integers(0, 2**64, size=100, dtype=np.uint64))
    # (a budget of 1 << 20 hashes a call: the first large run and the small one)
    assert idx.filtered == 2
    idx.has_many(rng.integers(0, 2**64, size=100, dtype=np.uint64))
    assert idx.filtered == 3       # the second large run next (the empty run has none)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.text(max_size=40), max_size=30))
def test_str_hashes_match_the_arrow_path(ids):
    """The append path's id hashes (each str hashed where it lies) are the
    sidecars' (xxh3_64 of the UTF-8, through an Arrow string array)."""
    from rune_fast._index import str_hashes
    from rune_fast._log import utf8_hashes
    from rune_fast.cool.sidecar import _plain_strings
    ids = [i for i in ids if not any(0xD800 <= ord(c) <= 0xDFFF for c in i)]
    arr = _plain_strings(ids)
    _valid, offsets, data = arr.buffers()
    want = utf8_hashes(offsets, data if data is not None else b"", arr.offset, len(arr))
    assert str_hashes(ids).tolist() == want.tolist()


def test_stats_count_the_id_filters_append_many_builds(tmp_path):
    """The repository's ``cool_index_bytes`` holds the archive's id index
    (12 bytes a row) and the filters append_many builds in front of it:
    none before a batch looks new ids up in the archive, some after (ids
    inside the archive's id span: ids past it are answered from its
    bounds)."""
    from rune_fast.conversation_state import ConversationStateRepository
    from test_repository import msg

    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=8) as repo:
        repo.append_many([msg(i, channel=f"c{i % 4}") for i in range(0, 6000, 2)])
        repo.compact()
        st0 = repo.stats()
        assert st0["cool"] > 2000 and st0["cool_index_bytes"] == 12 * st0["cool"]
        repo.append_many([msg(i, channel=f"c{i % 4}") for i in range(1, 2000, 2)])
        assert repo.stats()["cool_index_bytes"] >= 12 * st0["cool"] + 12 * st0["cool"] // 8
