"""The tail keeps the pages of its reserved space cached ahead of its end
(segments._WARM_MIN.._WARM_MAX, by _log.warm_ahead's detached thread): an
advice that changes no byte of the file and never reaches past it."""
from __future__ import annotations

import os
import time

from rune_fast import _log, segments
from rune_fast.segments import TailFile


def test_warm_ahead_changes_no_byte(tmp_path):
    p = tmp_path / "f"
    data = os.urandom(10_000) + bytes(200_000)
    p.write_bytes(data)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert _log.warm_ahead(fd, 0, len(data)) is True
        assert _log.warm_ahead(fd, 5_000, 1 << 30) is True      # past the end: no harm
        assert _log.warm_ahead(fd, -1, 10) is False and _log.warm_ahead(fd, 0, 0) is False
    finally:
        os.close(fd)                     # (the thread works on a dup of its own)
    assert _log.warm_ahead(fd, 0, 10) is False                  # a closed descriptor: nothing started
    time.sleep(0.05)
    assert p.read_bytes() == data


def test_tail_keeps_its_reserved_pages_warm_ahead(tmp_path):
    t = TailFile(str(tmp_path / "tail"), 1)
    try:
        assert t.size == 0 and t._warm_end <= t.file_size
        lines = []
        for i in range(300):
            b = (b"x" * (i * 37 % 5000)) + b"\n"
            off, _ = t.append(b)
            lines.append((off, b))
            # at least half the window (or the rest of the reserve) cached ahead
            assert t._warm_end <= t.file_size
            assert t._warm_end - t.size >= min(segments._WARM_MIN // 2, t.file_size - t.size)
        t.sync()
        with open(t.path, "rb") as f:
            got = f.read()
        assert all(got[off:off + len(b)] == b for off, b in lines)
        assert got[t.size:] == bytes(len(got) - t.size)        # the reserve still zeros
    finally:
        t.close()
