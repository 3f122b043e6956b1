"""rune_fast._search.find_spans against a plain-Python reference."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rune_fast import _search
from rune_fast.errors import FramingError


def ascii_lower(b: bytes) -> bytes:
    return bytes(c | 0x20 if 65 <= c <= 90 else c for c in b)


def reference(data, starts, ends, needle, ci, na):
    out = []
    for i, (s, e) in enumerate(zip(starts, ends)):
        span = data[max(s, 0):min(e, len(data))]
        hit = (ascii_lower(needle) in ascii_lower(span)) if ci else (needle in span)
        if hit or (na and any(c >= 0x80 for c in span)):
            out.append(i)
    return out


ALPHA = st.sampled_from([b"a", b"A", b"b", b"B", b"z", b"\xc3", b"\xa9", b" ", b"\\", b'"'])


@given(chunks=st.lists(st.lists(ALPHA, max_size=70).map(b"".join), max_size=8),
       needle=st.lists(ALPHA, max_size=4).map(b"".join),
       ci=st.booleans(), na=st.booleans())
def test_matches_reference(chunks, needle, ci, na):
    data = b"".join(chunks)
    starts, ends, pos = [], [], 0
    for c in chunks:
        starts.append(pos)
        pos += len(c)
        ends.append(pos)
    got = _search.find_spans(data, np.array(starts, dtype=np.int64), ends, needle, ci, na)
    assert got.dtype == np.int64
    assert got.tolist() == reference(data, starts, ends, needle, ci, na)


def test_long_spans_use_the_vector_path():
    body = b"x" * 1000 + b"NeedleInHay" + b"y" * 1000
    data = body * 3 + b"z" * 3000
    starts = [0, 2011, 4022, 6033]
    ends = [2011, 4022, 6033, 9033]
    assert _search.find_spans(data, starts, ends, b"NeedleInHay").tolist() == [0, 1, 2]
    assert _search.find_spans(data, starts, ends, b"needleinhay").tolist() == []
    assert _search.find_spans(data, starts, ends, b"needleinhay", True).tolist() == [0, 1, 2]
    assert _search.find_spans(data, starts, ends, b"NEEDLE", True).tolist() == [0, 1, 2]
    # a match must lie inside its span
    assert _search.find_spans(data, [0], [1005], b"Needle").tolist() == []
    assert _search.find_spans(data, [0], [1006], b"Needle").tolist() == [0]


def test_empty_needle_and_no_spans():
    assert _search.find_spans(b"abc", [0, 1], [1, 3], b"").tolist() == [0, 1]
    assert _search.find_spans(b"abc", [], [], b"a").tolist() == []


def test_nonascii_candidates():
    data = "stra\u00dfe".encode() + b"plain"
    starts, ends = [0, 7], [7, 12]
    assert _search.find_spans(data, starts, ends, b"ss", True, False).tolist() == []
    assert _search.find_spans(data, starts, ends, b"ss", True, True).tolist() == [0]


def test_bad_arguments():
    with pytest.raises(FramingError):
        _search.find_spans("str", [0], [1], b"a")
    with pytest.raises(FramingError):
        _search.find_spans(b"abc", [0, 1], [1], b"a")
    with pytest.raises(FramingError):
        _search.find_spans(b"abc", [0], [1], 5)
    with pytest.raises(FramingError):
        _search.find_spans(b"abc", ["x"], [1], b"a")


@given(rows=st.lists(st.lists(ALPHA, max_size=40).map(b"".join), max_size=40),
       needle=st.lists(ALPHA, min_size=1, max_size=6).map(b"".join),
       block=st.integers(1, 9), bits=st.sampled_from([64, 256, 4096]))
def test_trigram_filters_never_drop_a_block_with_a_match(rows, needle, block, bits):
    """gram_blocks passes every block that holds a row containing the needle
    (ASCII letters either case): the filter only ever removes blocks without one."""
    data = b"".join(rows)
    offs = np.cumsum([0] + [len(r) for r in rows]).astype(np.int32)
    grams = _search.block_grams(data, offs, block, bits)
    nblocks = (len(rows) + block - 1) // block
    assert len(grams) == nblocks * bits // 8
    passed = set(_search.gram_blocks(grams, bits, needle).tolist())
    for i, r in enumerate(rows):
        if ascii_lower(needle) in ascii_lower(r):
            assert i // block in passed
    if len(needle) < 3:
        assert passed == set(range(nblocks))


def _model_filter(values: list[bytes], nbits: int) -> bytes:
    """The filter bits of ``values`` in plain Python: each trigram within a
    value, ASCII letters lowercased, hashed as rf_gram does."""
    lg = nbits.bit_length() - 1
    bits = 0
    for v in values:
        v = ascii_lower(v)
        for j in range(len(v) - 2):
            x = (v[j] << 16) | (v[j + 1] << 8) | v[j + 2]
            bits |= 1 << (((x * 2654435761) & 0xFFFFFFFF) >> (32 - lg))
    return bits.to_bytes(nbits // 8, "little")


@given(rows=st.lists(st.binary(max_size=60) | st.lists(ALPHA, max_size=30).map(b"".join), max_size=30),
       block=st.integers(1, 7), bits=st.sampled_from([64, 512, 4096, 8192]))
def test_trigram_filters_are_the_model_bits(rows, block, bits):
    """block_grams (through its byte map up to 4,096 bits, bit by bit above)
    and the pages' plain_grams set exactly the bits of the plain-Python hash."""
    from rune_fast._pages import plain_grams
    data = b"".join(rows)
    offs = np.cumsum([0] + [len(r) for r in rows]).astype(np.int32)
    grams = _search.block_grams(data, offs, block, bits)
    want = [_model_filter(rows[i:i + block], bits) for i in range(0, len(rows), block)]
    assert [grams[k * bits // 8:(k + 1) * bits // 8] for k in range(len(want))] == want
    if bits >= 256:
        page = b"".join(len(r).to_bytes(4, "little") + r for r in rows)
        assert plain_grams(page, len(rows), bits)[:bits // 8] == _model_filter(rows, bits)


def test_trigram_filters_skip_blocks():
    rows = [b"alpha beta", b"gamma delta", b"Quarterly Report", b"nothing here"] * 8
    offs = np.cumsum([0] + [len(r) for r in rows]).astype(np.int32)
    grams = _search.block_grams(b"".join(rows), offs, 2, 4096)
    assert _search.gram_blocks(grams, 4096, b"quarterly report").tolist() == list(range(1, 16, 2))
    assert _search.gram_blocks(grams, 4096, b"zzz").tolist() == []
    with pytest.raises(FramingError):
        _search.block_grams(b"", offs, 2, 1000)
    with pytest.raises(FramingError):
        _search.block_grams(b"", offs, 0, 4096)
