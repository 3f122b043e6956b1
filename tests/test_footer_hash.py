"""The open's footer hash (sidecar._footer_hash) hashes a large footer where
the page cache maps it instead of reading it into a fresh buffer: the
same xxh3_64 as of the bytes read, for any range, aligned or not."""
from __future__ import annotations

import os

import xxhash
from hypothesis import given, settings, strategies as st

from rune_fast.cool import sidecar


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 300_000), data=st.data())
def test_a_mapped_range_hashes_as_the_bytes_read(tmp_path_factory, size, data):
    start = data.draw(st.integers(0, size - 1), label="start")
    n = data.draw(st.integers(0, size - start), label="n")
    blob = os.urandom(size)
    path = tmp_path_factory.mktemp("h") / "f"
    path.write_bytes(blob)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = sidecar._hash_range(fd, start, n).hexdigest()
    finally:
        os.close(fd)
    assert got == xxhash.xxh3_64(blob[start:start + n]).hexdigest()


def test_a_large_footer_hashes_as_before(tmp_path):
    """A Parquet-shaped file whose footer is past the map threshold: the
    (size, hash) pair the manifest records is the one of the bytes."""
    body = os.urandom(5000)
    footer = os.urandom(sidecar._MAP_HASH_BYTES * 3 + 17)
    tail = len(footer).to_bytes(4, "little") + b"PAR1"
    p = tmp_path / "cool-00000001.parquet"
    p.write_bytes(b"PAR1" + body + footer + tail)
    h = xxhash.xxh3_64(footer)
    h.update(tail)
    assert sidecar._footer_hash(str(p)) == (p.stat().st_size, h.hexdigest())
