"""The read of many row groups' rows at once (``PageReader.take_many``,
``_pages.take_many``: what a rare needle's search reads its hits' other
columns with, on a scan thread, without the GIL): for any groups, rows and
columns its values are ``PageReader.take``'s of each group's rows in turn, on
files with PLAIN, dictionary and DELTA_BINARY_PACKED pages, compressed or
not; a group whose directory or pages do not hold together is declined
(its own take names the damage); a page that fails its CRC is a PageError
naming the file.
"""
from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import _pages
from rune_fast.pages import PageError, PageReader

pytestmark = pytest.mark.skipif(not _pages.zstd_direct(), reason="take_many needs the system's libzstd")

_ROWS = 700
_GROUP = 300


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A file of 3 row groups: a PLAIN string column (zstd), dictionary
    string and int32 columns (raw), DELTA int64 (raw), PLAIN doubles (raw),
    empty strings (zstd), several pages a chunk."""
    rnd = np.random.default_rng(7)
    n = _ROWS
    cols = {
        "text": pa.array([("x" * int(rnd.integers(0, 40))) + f"row {i} \u00fc" for i in range(n)]),
        "chan": pa.array([f"channel-{i // 90}" for i in range(n)]),
        "ver": pa.array([int(i // 250) for i in range(n)], pa.int32()),
        "ord": pa.array(np.cumsum(rnd.integers(-5, 1 << 40, n)).astype(np.int64)),
        "ts": pa.array(rnd.random(n)),
        "empty": pa.array([""] * n),
    }
    schema = pa.schema([pa.field(k, v.type, nullable=False) for k, v in cols.items()])
    table = pa.table(cols, schema=schema)
    path = str(tmp_path_factory.mktemp("many") / "m.parquet")
    pq.write_table(table, path, row_group_size=_GROUP, write_page_checksum=True, data_page_version="1.0",
                   data_page_size=512, write_batch_size=16,
                   compression={"text": "zstd", "chan": "none", "ver": "none", "ord": "none", "ts": "none",
                                "empty": "zstd"},
                   use_dictionary=["chan", "ver"], column_encoding={"ord": "DELTA_BINARY_PACKED"})
    return path


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(y, tuple):
            assert x[0] == y[0] and x[1].tolist() == y[1].tolist()
        else:
            assert x == y


def _joined(reader, rgs, locals_, cols):
    """The model: each group's take, the groups' rows one after another."""
    out = []
    for c in range(len(cols)):
        parts = [reader.take(rg, loc, cols)[c] for rg, loc in zip(rgs, locals_) if loc]
        if not parts:
            out.append(None)
        elif isinstance(parts[0], tuple):
            offs, data = [0], b""
            for d, o in parts:
                offs += [x + len(data) for x in o.tolist()[1:]]
                data += d
            out.append((data, np.array(offs, np.int32)))
        else:
            out.append(b"".join(parts))
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_take_many_is_take_of_each_group(mixed, data):
    md = pq.read_metadata(mixed)
    reader = PageReader(mixed, md)
    try:
        rgs = data.draw(st.lists(st.integers(0, md.num_row_groups - 1), min_size=1, max_size=5))
        locals_ = []
        for rg in rgs:
            n = md.row_group(rg).num_rows
            locals_.append(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=12))))
        cols = data.draw(st.permutations(range(md.num_columns)).map(list))
        cols = cols[:data.draw(st.integers(1, len(cols)))]
        got, declined = reader.take_many(rgs, locals_, cols)
        assert declined == []
        _same(got, _joined(reader, rgs, locals_, cols))
    finally:
        reader.close()


def test_a_group_that_does_not_hold_together_is_none(mixed):
    """Rows past the group, rows not ascending, a directory cut short: that
    group is None, the others are read."""
    md = pq.read_metadata(mixed)
    reader = PageReader(mixed, md)
    try:
        cols = list(range(md.num_columns))
        got, declined = reader.take_many([0, 1, 2, 1], [[_GROUP + 5], [3, 200], [9, 4], [3, 200]], cols)
        assert declined == [0, 2]
        _same(got, _joined(reader, [1, 1], [[3, 200], [3, 200]], cols))
        assert reader.take_many([1, 1], [[3], [3]], [0, -1])[1] == [0, 1]       # no such column
        got, declined = reader.take_many([1, 2], [[], [5]], cols)                # no rows: nothing to decline
        assert declined == []
        _same(got, reader.take(2, [5], cols))
        counts, flat, firsts, starts = reader.dirs([1])[0]
        short = (counts, flat[:-7], firsts[:-1], starts)
        got, declined = reader.take_many([1, 1], [[3], [4]], cols, [short, reader.dirs([1])[0]])
        assert declined == [0]
        _same(got, reader.take(1, [4], cols))
        # a page said to unpack to 1 GiB is not fetched; a page of doubles
        # said to hold one value more than its bytes do is not read
        for field, more in ((3, 1 << 30), (7 * int(starts[4]) + 6, 1)):
            bad = array("q", flat)
            bad[field] += more
            assert reader.take_many([1], [[3]], cols, [(counts, bad, firsts, starts)])[1] == [0]
    finally:
        reader.close()


def test_a_damaged_page_is_named(mixed, tmp_path):
    """A flipped byte in a page a read needs: PageError naming the file and
    the page's offset (the search then reads each group alone, which names
    its damage)."""
    md = pq.read_metadata(mixed)
    reader = PageReader(mixed, md)
    counts, flat, firsts, starts = reader.dirs([2])[0]
    c = 0                                   # the text column's first page in group 2
    off = int(flat[7 * int(starts[c]) + 1])
    reader.close()
    copy = str(tmp_path / "bad.parquet")
    with open(mixed, "rb") as f:
        data = bytearray(f.read())
    data[off + 3] ^= 0x10
    with open(copy, "wb") as f:
        f.write(bytes(data))
    reader = PageReader(copy, pq.read_metadata(copy))
    try:
        with pytest.raises(PageError, match=rf"bad\.parquet.*{off}"):
            reader.take_many([0, 2], [[1], [0]], [0, 1])
        assert reader.take_many([0], [[1]], [0, 1])[1] == []
        with pytest.raises(PageError, match="bad.parquet"):
            reader.take(2, [0], [0])
    finally:
        reader.close()


def test_take_many_of_nothing(mixed):
    reader = PageReader(mixed, pq.read_metadata(mixed))
    try:
        (data, offs), ts = reader.take_many([], [], [0, 4])[0]
        assert data == b"" and offs.tolist() == [0] and ts == b""
        assert reader.take_many([], [], [0, 4])[1] == []
    finally:
        reader.close()
