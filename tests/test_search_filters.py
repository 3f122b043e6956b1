"""The trigram search filters against unfiltered models: a fresh index's
first whole-store search (which never uses filters), the per-channel pass,
and a plain-Python casefold model for the cool tier and the repository.
(Written by the review of the twelfth session's change; it found no bug.)"""
from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _core_support import by_channels, key, line, word_lines
from rune_fast._conv import tuning
from rune_fast import _index
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.cool import SPECIAL_FOLD, CoolArchive
from test_cool import cool_rows as cool_dicts, rec
from test_repository import msg

_ALPH = ["alpha", "Beta", "gamma", "DELTA", "stra\u00dfe", "\u6771\u4eac", "x", "q", "\n", "\"", "\\",
         "\t", "\u00e9", "\U0001f600", "zz", "Zz", "abc", "ABC", "\x01"]


def _lines(rng, n, chans=("c0", "c1", "c2"), pre="m"):
    return word_lines(rng, n, _ALPH, chans, pre, (1, 200))


def _unfiltered(segs, needle, ci, na=False):
    """A fresh index's first whole-store search never uses filters."""
    ix = _index.HotIndex()
    for s, (data, kw) in segs.items():
        ix.attach(s, data, **kw)
        ix.ingest(s)
    return ix.search(needle, ci, na, None).tolist()


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32), st.lists(st.tuples(st.integers(0, 10**7), st.sampled_from([1, 2, 3, 4, 17, 257, 258, 259, 300]),
                                                 st.booleans(), st.booleans()), min_size=1, max_size=10),
       st.lists(st.integers(0, 700), min_size=1, max_size=4))
def test_filtered_whole_store_search_matches_unfiltered(seed, picks, sizes):
    """Segments of any size (empty, under a block, several blocks), needles
    cut anywhere (mid-escape, mid-character), of every length around the
    filters' 258-byte limit, either case."""
    rng = random.Random(seed)
    segs = {}
    for s, n in enumerate(sizes):
        data = b"".join(_lines(rng, n, (f"c{s}", "cx")))
        segs[s] = (data, {})
    ix = _index.HotIndex()
    for s, (data, kw) in segs.items():
        ix.attach(s, data, **kw)
        ix.ingest(s)
    ix.search(b"warm", False, False, None)
    ix.search(b"warm", False, False, None)
    everything = b"".join(d for d, _ in segs.values())
    if not everything:
        return
    for start, length, ci, swap in picks:
        a = start % len(everything)
        raw = everything[a:a + length]
        if swap:
            raw = raw.swapcase()
        nd = raw.lower() if ci else raw
        got = ix.search(nd, ci, False, None).tolist()
        assert got == _unfiltered(segs, nd, ci), (nd, ci)
        assert got == by_channels(ix, nd, ci)


# ---- cool tier: page filters ----------------------------------------------

_CWORDS = ["alpha", "Stra\u00dfe", "STRASSE", "\u65e5\u672c\u8a9e", "\U0001f680", "", "x" * 40, "line\nbreak",
           "quote\"d", "\x00nul", "\u212aelvin", "\u017fs", "e\u0301", "\ufb00", "\u0130i", "\u00e9t\u00e9", "ab"] + list(
    "\u00df\u0130\u0149\u017f\u01f0\u1e96\u1e97\u1e98\u1e99\u1e9a\u1e9e\u212a\ufb00\ufb01\ufb02\ufb03\ufb04\ufb05\ufb06")


@pytest.fixture(scope="module", params=[1, 64 << 20])
def cool_rows(tmp_path_factory, request):
    d = str(tmp_path_factory.mktemp("cool") / "cool")
    rng = random.Random(5)
    rows = []
    for i in range(1200):
        content = " ".join(rng.choice(_CWORDS) for _ in range(rng.randrange(0, 30)))
        rows.append(rec(i, f"ch{i % 5}", content=content))
    a = CoolArchive(d, row_group_rows=256, cache_bytes=request.param)
    cool_dicts(a, rows, list(range(len(rows))))
    return a, rows


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_cool_search_with_page_filters_matches_model(cool_rows, data):
    """Searches through a one-byte cache (page scans and their kept filters)
    and a large one (cached groups, special-fold rows), repeated."""
    a, rows = cool_rows
    src = data.draw(st.sampled_from(rows))["content"]
    i = data.draw(st.integers(0, len(src)))
    needle = data.draw(st.one_of(st.just(src[i:i + data.draw(st.integers(1, 12))]),
                                 st.sampled_from(list(SPECIAL_FOLD) + ["ss", "SS", "k", "K", "ff", "i\u0307", "s", "st", "ffi", "h", "t", "w", "y", "a", "j", "n",
                                                                       "\u00df", "\u00e9", "\U0001f680", "\u65e5"])))
    if data.draw(st.booleans()):
        needle = needle.swapcase()
    cs = data.draw(st.booleans())
    ch = data.draw(st.sampled_from([None, "ch2"]))
    for _ in range(2):
        got = sorted(h.record["msg_id"] for h in a.search(needle, ch, case_sensitive=cs))
        want = sorted(r["msg_id"] for r in rows if (ch is None or r["channel_id"] == ch)
                      and ((needle in r["content"]) if cs else (needle.casefold() in r["content"].casefold())))
        assert got == want, (needle, cs, ch)


def _place(token: bytes, want: int, n_after: int = 40):
    """Lines where `token` (in the content of line "t") starts at byte `want`."""
    prefix = b"".join(line(f"p{i}", "c0", content="filler " * 30) for i in range(120))
    probe = line("t", "c1", content="Q" + " and more")
    at = probe.index(b"Q")
    head = prefix[:max(0, want - 4096)]
    head = head[:head.rfind(b"\n") + 1]
    pad = want - len(head) - at
    body = line("t", "c1", content="p" * pad + token.decode() + " and more")
    data = head + body + b"".join(line(f"s{i}", "c2", content="suffix " * 40) for i in range(n_after))
    assert data.index(token) == want
    return data


@pytest.mark.parametrize("m", [3, 4, 200, 257, 258, 259])
@pytest.mark.parametrize("shift", [-259, -258, -257, -3, -2, -1, 0, 1, 2, 254, 255, 256, 257])
def test_long_needles_at_block_edges(m, shift):
    """A unique needle of 3 to 259 bytes planted around two block boundaries
    is found exactly once, in either case, search after search."""
    rng = random.Random(m * 1000 + shift)
    token = bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(m))
    for boundary in (16384, 32768):
        data = _place(token, boundary + shift)
        ix = _index.HotIndex()
        ix.attach(0, data)
        ix.ingest(0)
        for _ in range(3):
            for nd, ci in ((token, False), (token.lower(), True)):
                assert ix.search(nd, ci, False, None).tolist() == _unfiltered({0: (data, {})}, nd, ci), (m, shift)
                assert len(ix.search(nd, ci, False, None)) == 1


def test_reattach_and_appended_copy():
    """Lines appended after the mapped buffer (a copy) are searched; an
    attach of a grown buffer, then of other bytes, under one segment number
    leaves no filter of the old bytes."""
    rng = random.Random(3)
    a = b"".join(_lines(rng, 200, ("c0", "c1")))
    b = b"".join(_lines(rng, 200, ("c0", "c2"), "b"))
    ix = _index.HotIndex()
    ix.attach(0, a)
    ix.ingest(0)
    for _ in range(3):
        ix.search(b"abc", False, False, None)
    # append lines after the mapped buffer (a copy): searched too
    extra = b"".join(line(f"e{i}", "c1", content=f"zzyzx appended {i} abc") for i in range(5))
    ix.append_bytes(0, len(a), extra)
    segs = {0: (a + extra, {})}
    for nd in (b"zzyzx", b"abc", b"appended 3", b"ABC"):
        for ci in (False, True):
            n = nd.lower() if ci else nd
            assert ix.search(n, ci, False, None).tolist() == _unfiltered(segs, n, ci)
    # re-attach of the same segment number: a grown buffer, then other bytes
    ix2 = _index.HotIndex()
    ix2.attach(0, a)
    ix2.ingest(0)
    for _ in range(3):
        ix2.search(b"gamma", True, False, None)
    grown = a + b
    ix2.attach(0, grown)
    ix2.ingest(0, len(a))
    for nd in (b"gamma", b"stra", b"b19", b"\xe6\x9d\xb1\xe4\xba\xac"):
        for _ in range(2):
            assert ix2.search(nd, True, False, None).tolist() == _unfiltered({0: (grown, {})}, nd, True)
    ix2.remove_many([key(f"m{i}") for i in range(200)] + [key(f"b{i}") for i in range(200)])
    other = b"".join(_lines(rng, 300, ("c0", "c5"), "o"))
    ix2.attach(0, other)
    ix2.ingest(0)
    for nd in (b"gamma", b"stra", b"o19", b"\xe6\x9d\xb1\xe4\xba\xac"):
        for _ in range(2):
            assert ix2.search(nd, True, False, None).tolist() == _unfiltered({0: (other, {})}, nd, True)


def test_filters_handed_to_another_index_serve_its_first_search():
    """seg_filters of a sealed segment, handed to a fresh index over the same
    bytes (set_seg_filters), serve that index's first search: the same hits
    as no filters. Filters that cannot belong to the bytes are refused."""
    rng = random.Random(9)
    data = b"".join(_lines(rng, 900, ("c0", "c1", "c2")))
    ix = _index.HotIndex()
    ix.attach(0, data)
    ix.ingest(0)
    assert ix.seg_filter_blocks(0) == 0 and ix.seg_filters(0) == b""
    for _ in range(2):
        ix.search(b"gamma", True, False, None)
    blocks = ix.seg_filter_blocks(0)
    words = ix.seg_filters(0)
    block, _over, _lg, nwords = _index.SEARCH_FILTER_LAYOUT
    assert blocks >= 3 and len(words) == blocks * nwords * 8 and blocks * block < len(data)
    fresh = _index.HotIndex()
    fresh.attach(0, data)
    fresh.ingest(0)
    assert fresh.set_seg_filters(0, words) == blocks == fresh.seg_filter_blocks(0)
    assert fresh.seg_filters(0) == words
    for nd in (b"gamma", b"stra", b"m77", b"zz", b"\xe6\x9d\xb1\xe4\xba\xac", b"absent needle"):
        for ci in (False, True):
            n = nd.lower() if ci else nd
            assert fresh.search(n, ci, False, None).tolist() == _unfiltered({0: (data, {})}, n, ci), (n, ci)
    # filters already as long are kept (never replaced by other words)
    assert fresh.set_seg_filters(0, bytes(len(words))) == blocks and fresh.seg_filters(0) == words
    for bad in (words[:-8], words + bytes(nwords * 8 * 1000)):
        other = _index.HotIndex()
        other.attach(0, data)
        with pytest.raises(ValueError, match="not whole filters"):
            other.set_seg_filters(0, bad)
    growing = _index.HotIndex()
    growing.attach(0, data, growing=True)
    with pytest.raises(ValueError, match="not an attached sealed segment"):
        growing.set_seg_filters(0, words)
    with pytest.raises(ValueError, match="not an attached sealed segment"):
        _index.HotIndex().set_seg_filters(3, words)


def test_borrowed_filters_are_read_in_place_copied_to_grow_and_released():
    """set_seg_filters(borrow=True): aligned words are read where they lie
    (the buffer held until the filters go: the segment reattached, or the
    index gone), unaligned ones copied; filters covering only the first
    blocks are copied when a search builds the rest. Hits as no filters."""
    rng = random.Random(11)
    data = b"".join(_lines(rng, 900, ("c0", "c1", "c2")))
    ix = _index.HotIndex()
    ix.attach(0, data)
    ix.ingest(0)
    for _ in range(2):
        ix.search(b"gamma", True, False, None)
    words = ix.seg_filters(0)
    nwords = _index.SEARCH_FILTER_LAYOUT[3]
    blocks = len(words) // (nwords * 8)
    assert blocks >= 3

    def fresh():
        f = _index.HotIndex()
        f.attach(0, data)
        f.ingest(0)
        return f

    def same(f):
        for nd in (b"gamma", b"stra", b"m77", b"absent needle"):
            assert f.search(nd, True, False, None).tolist() == _unfiltered({0: (data, {})}, nd, True), nd

    held = memoryview(bytearray(words))         # bytearray: 8-aligned by the allocator
    f = fresh()
    assert f.set_seg_filters(0, held, True) == blocks and f.seg_filters_mapped(0)
    with pytest.raises(BufferError):
        held.release()                          # the index holds the view's export
    same(f)
    assert f.seg_filters(0) == words
    f.attach(0, data)                           # a reattach drops the filters and the export
    assert f.seg_filter_blocks(0) == 0
    held.release()
    unaligned = memoryview(bytearray(b"\0" + words))[1:]
    f = fresh()
    assert f.set_seg_filters(0, unaligned, True) == blocks and not f.seg_filters_mapped(0)
    unaligned.release()                         # copied: nothing held
    same(f)
    f = fresh()
    assert f.set_seg_filters(0, words) == blocks and not f.seg_filters_mapped(0)     # a copy
    other = memoryview(bytearray(len(words)))
    assert f.set_seg_filters(0, other, True) == blocks and not f.seg_filters_mapped(0)
    other.release()                             # other words: the copy stays, nothing held
    same_words = memoryview(bytearray(words))
    assert f.set_seg_filters(0, same_words, True) == blocks and f.seg_filters_mapped(0)
    same(f)                                     # the same words: borrowed in place of the copy
    del f
    same_words.release()
    part = memoryview(bytearray(words[:nwords * 8]))
    f = fresh()
    assert f.set_seg_filters(0, part, True) == 1 and f.seg_filters_mapped(0)
    for _ in range(2):                          # the second whole-segment search builds the rest
        same(f)
    assert f.seg_filter_blocks(0) == blocks and not f.seg_filters_mapped(0)
    assert f.seg_filters(0) == words
    del f
    part.release()                              # released with the index


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32), st.lists(st.tuples(st.integers(0, 10**7), st.sampled_from([3, 5, 30, 258, 259]),
                                                 st.booleans(), st.booleans()), min_size=1, max_size=6))
def test_long_lines_spanning_blocks(seed, picks):
    """Lines of up to ~50 KiB: a hit in a late block of a line that started
    in a skipped block; several hits of one line in different runs."""
    rng = random.Random(seed)
    ls = []
    for i in range(rng.randrange(5, 40)):
        n = rng.choice([3, 50, 2000, 6000, 12000])
        words = [rng.choice(_ALPH) for _ in range(n)]
        ls.append(line(f"m{i}", f"c{i % 3}", content=" ".join(words)))
    data = b"".join(ls)
    if rng.random() < 0.5:
        data += line("torn", "c0", content="abc gamma")[:-1]    # a final line without newline
    segs = {0: (data, {})}
    ix = _index.HotIndex()
    ix.attach(0, data)
    ix.ingest(0)
    ix.search(b"warm", False, False, None)
    for start, length, ci, na in picks:
        a = start % len(data)
        nd = data[a:a + length]
        nd = nd.lower() if ci else nd
        for _ in range(2):
            got = ix.search(nd, ci, na, None).tolist()
            assert got == _unfiltered(segs, nd, ci, na), (nd, ci, na)


# ---- through the repository: sealed segments, tail, cool tier, a viewer ----


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_repository_search_matches_model_across_tiers(tmp_path, monkeypatch, seed):
    """Sealed segments, the tail, the cool tier and a read-only viewer
    (refreshed): every search, repeated, equals the casefold model."""
    monkeypatch.setattr(tuning, "ROLL_BYTES", 48 << 10)
    rng = random.Random(seed)
    words = _CWORDS + ["Quarterly", "report", "gamma", "DELTA"]
    stored = {}
    needles = ["quarterly report", "stra\u00dfe", "STRASSE", "ss", "k", "\u00df", "\u212a", "gamma delta",
               "elvin", "ab", "t\u00e9", "\U0001f680", "x" * 10, "e\u0301", "fi", "report q"]
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=64) as repo:
        viewer = None
        n = 0
        for rnd in range(4):
            for _ in range(300):
                text = " ".join(rng.choice(words) for _ in range(rng.randrange(0, 60)))
                m = msg(n, channel=f"c{n % 3}", content=text)
                repo.append(m)
                stored[m.msg_id] = m
                n += 1
            if rnd % 2 == 0:
                repo.compact()
            repo.flush()
            if viewer is None:
                viewer = ConversationStateRepository(tmp_path, read_only=True)
            else:
                viewer.refresh()
            for _ in range(3):
                for needle in needles + [rng.choice(list(stored.values())).content[5:14]]:
                    for csens in (False, True):
                        want = sorted(i for i, m in stored.items()
                                      if ((needle in m.content) if csens
                                          else (needle.casefold() in m.content.casefold())))
                        for r in (repo, viewer):
                            got = sorted(h.record.msg_id for h in r.search(needle, case_sensitive=csens))
                            assert got == want, (needle, csens, r is viewer, rnd)
        viewer.close()
    # a later open's first searches use the filters the searches above kept
    assert list((tmp_path / "hot").glob("conversation_seg-*.grams"))
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=64) as repo, \
            ConversationStateRepository(tmp_path, read_only=True) as viewer:
        for r in (viewer, repo):
            for needle in needles:
                for csens in (False, True):
                    want = sorted(i for i, m in stored.items()
                                  if ((needle in m.content) if csens
                                      else (needle.casefold() in m.content.casefold())))
                    got = sorted(h.record.msg_id for h in r.search(needle, case_sensitive=csens))
                    assert got == want, (needle, csens, r is viewer, "reopened")


@pytest.mark.parametrize("extra", [-2, -1, 0, 1, 2, 16384])
@pytest.mark.parametrize("newline", [True, False])
def test_segment_sizes_around_one_block(extra, newline):
    """Segments just shorter/longer than a block plus its overlap, the
    needle in the last line (with or without its newline)."""
    target = 16384 + 258 + extra
    head = b"".join(line(f"p{i}", "c0", content="filler " * 30) for i in range(60))
    head = head[:target - 2000]
    head = head[:head.rfind(b"\n") + 1]
    probe = line("t", "c1", content="Q")
    pad = target - len(head) - len(probe)
    last = line("t", "c1", content="p" * pad + "Zyxwvu")     # the needle ends its content
    data = head + last
    assert len(data) == target + 5
    if not newline:
        data = data[:-1]
    ix = _index.HotIndex()
    ix.attach(0, data)
    ix.ingest(0)
    for _ in range(3):
        for nd, ci in ((b"Zyxwvu", False), (b"zyxwvu", True), (b"wvu", False), (b"pZy", False)):
            assert ix.search(nd, ci, False, None).tolist() == _unfiltered({0: (data, {})}, nd, ci)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32), st.lists(st.tuples(st.integers(0, 10**7), st.sampled_from([3, 4, 7, 30, 258, 259])),
                                       min_size=1, max_size=6))
def test_scan_segment_with_filters_matches_a_plain_scan(seed, picks):
    """scan_segment over a sealed segment whose filters exist reads only the
    blocks that may hold the needle: the same lines as a scan without them
    (the special-fold characters search() looks for among them)."""
    rng = random.Random(seed)
    data = b"".join(_lines(rng, 700, ("c0", "c1")))
    plain = _index.HotIndex()
    plain.attach(0, data)
    plain.ingest(0)
    ix = _index.HotIndex()
    ix.attach(0, data)
    ix.ingest(0)
    for _ in range(2):
        ix.search(b"gamma", True, False, None)          # builds the filters
    assert ix.seg_filter_blocks(0) > 0
    needles = [c.encode("utf-8") for c in SPECIAL_FOLD if len(c.encode("utf-8")) >= 3]
    needles += [data[a % len(data):a % len(data) + n] for a, n in picks]
    for nd in needles + [b"gamma", b"stra\xc3\x9fe", b"\xe6\x9d\xb1\xe4\xba\xac"]:
        got, end = ix.scan_segment(0, 0, nd)
        want, want_end = plain.scan_segment(0, 0, nd)
        assert got.tolist() == want.tolist() and end == want_end == len(data), nd


def test_scan_segment_reads_only_the_blocks_its_filters_pass():
    """Filters that rule every block out (zeros, handed in) leave only the
    bytes past the last filtered block to read: scan_segment uses them."""
    rng = random.Random(4)
    data = b"".join(_lines(rng, 700, ("c0", "c1")))
    ix = _index.HotIndex()
    ix.attach(0, data)
    ix.ingest(0)
    want, _end = ix.scan_segment(0, 0, b"gamma")
    block, _over, _lg, nwords = _index.SEARCH_FILTER_LAYOUT
    blocks = (len(data) - 258) // block
    ix.set_seg_filters(0, bytes(blocks * nwords * 8))
    got, end = ix.scan_segment(0, 0, b"gamma")
    # (a line that starts before the last filtered block's end but holds the
    # needle after it is still found: its match starts in the bytes read)
    assert set(got.tolist()) < set(want.tolist()) and end == len(data)
    assert all(loc >= blocks * block - 70_000 for loc in got.tolist())


@given(st.lists(st.text(alphabet="abcäßZ xyzΣς量子🙂", max_size=60), min_size=1, max_size=300),
       st.integers(1, 90))
@settings(max_examples=60, deadline=None)
def test_a_files_filters_are_the_encoded_filters(texts, piece):
    """GramFile (the writer's: the filters to their temp file as they are
    made) keeps the very bytes of grams.encode over finish()."""
    import tempfile

    import pyarrow as pa
    from rune_fast.cool import grams
    col = pa.array(texts)
    with tempfile.TemporaryDirectory() as d:
        tmp, path = os.path.join(d, ".f.grams.tmp"), os.path.join(d, "f.grams")
        b, c = grams.GramSink(), grams.GramFile(tmp)
        for x in range(0, len(texts), piece):
            b.add(col.slice(x, piece))
            c.add(col.slice(x, piece))
        assert c.keep(path, 4096, "0123456789abcdef", len(texts))
        with open(path, "rb") as f:
            got = f.read()
        assert got == grams.encode(4096, "0123456789abcdef", len(texts), b.finish())
        assert len(grams.check(got, 4096, "0123456789abcdef", len(texts))) == \
            grams.blocks_for(len(texts)) * grams.BLOCK_BYTES
        with pytest.raises(ValueError, match="bytes of filters"):
            grams.GramFile(tmp).keep(path + "2", 1, "0123456789abcdef", 1)
        assert sorted(os.listdir(d)) == ["f.grams"]


@given(st.lists(st.sampled_from(["plain words", "nach Zürich", "量子計算機 heute", "STRASSE", "x"]),
                min_size=1, max_size=1500),
       st.data())
@settings(max_examples=60, deadline=None)
def test_a_limited_search_spans_hide_no_hit_of_its_groups(texts, data):
    """FileGrams.spans over some row groups only (a limited search's
    newest): names only those groups, and covers every row of theirs that
    holds the needle, as the spans over the whole file do."""
    import numpy as np
    import pyarrow as pa
    from rune_fast.cool import grams
    b = grams.GramSink()
    b.add(pa.array(texts))
    fg = grams.FileGrams(memoryview(b.finish()), True)
    n = len(texts)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=40)) if n > 1 else []))
    starts = np.array([0] + cuts + [n], np.int64)
    ngroups = len(starts) - 1
    rgs = sorted(set(data.draw(st.lists(st.integers(0, ngroups - 1), max_size=ngroups))))
    needle = data.draw(st.sampled_from(["zürich", "量子計算機", "strasse", "words"]))
    probe = grams.needle_bytes(needle)
    got = fg.spans(probe, starts, 0, n, rgs)
    whole = fg.spans(probe, starts, 0, n)
    if got is None:
        assert whole is None
        return
    assert set(got) <= set(rgs)
    for rg in rgs:
        base = int(starts[rg])
        covered = {base + r for lo, hi in got.get(rg, np.zeros((0, 2), np.int64)).tolist() for r in range(lo, hi)}
        hits = {i for i in range(base, int(starts[rg + 1])) if needle in texts[i].casefold()}
        assert hits <= covered
        if whole is not None and rg in whole:
            assert {base + r for lo, hi in whole[rg].tolist() for r in range(lo, hi)} <= covered
