"""Helpers of the cooling parser's tests: message lines framed as the tail
holds them, laid out as ``HotIndex.gather_lines`` gives them, and the cool
table the dict path makes of them (the reference)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from rune_fast import _encode, codec, cool


def framed_lines(msgs, seq0=0) -> list:
    """The tail lines of ``msgs`` (without their newlines, as the index gives them)."""
    bodies, _h, _k = codec.encode_batch(msgs)
    data, lengths = _encode.frame_messages(bodies, list(range(len(msgs))), seq0)
    out, pos = [], 0
    for n in lengths:
        out.append(data[pos:pos + n - 1])
        pos += n
    return out


def lines_blob(lines) -> tuple[bytes, np.ndarray]:
    """(data, starts) of lines (without their newlines), as
    HotIndex.gather_lines gives them."""
    starts, pos = [], 0
    for ln in lines:
        starts.append(pos)
        pos += len(ln) + 1
    return b"".join(bytes(ln) + b"\n" for ln in lines), np.array(starts, dtype=np.int64)


def dict_table(lines) -> pa.Table:
    """The cool table of ``lines`` by the dict path only (the reference)."""
    rows, ords = [], []
    for ln in lines:
        d = codec.decode_body(ln, path="t", offset=0)
        rows.append(d["r"])
        ords.append(d.get("s", -1))
    return cool._table_from_records(rows, ords, [cool.record_digest(r) for r in rows])
