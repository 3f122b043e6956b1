"""The index keys of a cooled part's ids, made from its Arrow column
(``_conv.cooling._id_keys``), are codec.key of each id."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rune_fast import codec
from rune_fast._conv.cooling import _id_keys

ids = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) \
    | st.sampled_from(['a"b', "back\\slash", "nl\n", "\x00\x1f\x7f", "é€😀", "\u2028", ""])


@settings(max_examples=200)
@given(st.lists(ids, max_size=30), st.integers(0, 5), st.integers(0, 5))
def test_id_keys_are_codec_keys(values, start, cut):
    arr = pa.array(values, type=pa.string())
    assert _id_keys(arr) == [codec.key(v) for v in values]
    part = arr.slice(start, max(0, len(values) - start - cut))       # (an offset into the buffers)
    assert _id_keys(part) == [codec.key(v) for v in part.to_pylist()]
    chunked = pa.chunked_array([arr.slice(0, start), arr.slice(start)], type=pa.string())
    assert _id_keys(chunked) == [codec.key(v) for v in values]
