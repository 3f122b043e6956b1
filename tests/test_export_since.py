"""An export since a stamp reads only the archive files that may hold a
newer message: the first one in a process too, which learns each file's
newest stamp from its ``hlc``, ``ts`` and ``origin`` columns
(sync.bridge.newest_stamp) instead of reading every record."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rune_fast import ConversationMessageRecord, ConversationStateRepository
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.sync import Hlc, as_op
from rune_fast.sync.bridge import newest_stamp, record_stamp, stamp_key
from test_cool_reads import flip_column_tail

_devices = st.sampled_from(["", "laptop", "phone", "z", "ü", "設備"])
_hlcs = st.one_of(
    st.just(""),
    st.builds(lambda w, c, d: str(Hlc(w, c, d)), st.integers(0, 10**15 - 1), st.integers(0, 12), _devices),
    st.sampled_from([
        "not an hlc", "000000000000001-0000000000-", "000000000000001-0000000000",      # (too short)
        "00000000000000١-0000000000-x",         # a digit Hlc.parse refuses (not ASCII)
        "000000000000002_0000000000-x", "99999999999999-0000000000-x", "999999999999999-9999999999-",
    ]),
)
_ts = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-10.0, 1e13),
    st.sampled_from([0.0, -0.0, 0.0004, 0.0005, 0.0015, 0.0025, 1.0005, 1e12 + 0.0005, 1e12 - 0.0005,
                     999999999999.9995, 1e15, math.inf, -math.inf, math.nan]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_hlcs, _ts, _devices), max_size=30))
def test_the_newest_stamp_of_columns_is_that_of_the_rows(rows):
    """newest_stamp over columns equals the largest record_stamp of the
    rows, whatever their stamps, wall times (rounding ties, NaN, infinite,
    out of the Hlc's range) and devices."""
    hlc = pa.array([h for h, _t, _o in rows], pa.string())
    ts = np.array([t for _h, t, _o in rows], dtype=np.float64)
    origin = pa.array([o for _h, _t, o in rows], pa.string())
    want = max((tuple(record_stamp(h, t, o)) for h, t, o in rows), default=())
    assert newest_stamp(hlc, ts, origin) == want


def _msg(i, **kw):
    return ConversationMessageRecord(msg_id=f"m{i:03d}", channel_id=f"c{i % 3}", content=f"message {i} ü",
                                     ts=1000.0 + i, **kw)


def _store(path, deleted=()):
    """Three archive files (their messages a file apart in time), a few
    hot messages, ``deleted`` deleted; the store's every op."""
    with ConversationStateRepository(path, compact_every=10**6, hot_window=2, durability="none") as repo:
        for b in range(3):
            repo.append_many([_msg(k, hlc="" if k % 2 else str(Hlc(1_000_000 + 1000 * k, 1, "d")))
                              for k in range(b * 30, b * 30 + 30)])
            repo.compact()
        assert len(repo._cool.files()) >= 3
        for mid in deleted:
            repo.delete(mid)
        return repo.export_ops()


def _reads(repo, monkeypatch):
    """The archive files whose records ``repo`` reads from now on."""
    read: set[int] = set()
    real = repo._cool_read
    monkeypatch.setattr(repo, "_cool_read", lambda locs: read.update(loc >> 32 for loc in locs) or real(locs))
    return read


@pytest.mark.parametrize("read_only", [False, True])
def test_the_first_export_since_a_stamp_reads_only_newer_files(tmp_path, monkeypatch, read_only):
    ops = _store(tmp_path)
    newest, mid = ops[-1].hlc, ops[len(ops) // 2].hlc
    with ConversationStateRepository(tmp_path, read_only=read_only) as repo:
        read = _reads(repo, monkeypatch)
        assert repo.export_ops(since=newest) == []
        assert read == set()                                    # no file's records read
        assert repo.export_ops(since=mid) == [op for op in ops if op.hlc > mid]
        assert 0 < len(read) < len(repo._cool.files())          # the older files not read
    with ConversationStateRepository(tmp_path, read_only=read_only) as repo:
        assert repo.export_ops(since=mid) == [op for op in ops if op.hlc > mid]     # (first, straight away)
        assert repo.export_ops(since=Hlc(0, 0, "")) == ops


def test_a_deleted_newest_message_is_left_out_of_the_export_since(tmp_path, monkeypatch):
    """The columns count a deleted row too (its file is read, which leaves
    the row out): nothing deleted is exported, nothing newer is missed."""
    everything = _store(tmp_path)
    cooled = [as_op(op) for op in everything if not op.payload.get("deleted")]
    with ConversationStateRepository(tmp_path) as repo:
        tier = {op.op_id: repo.get_message(op.op_id).tier for op in cooled}
    gone = max((op for op in cooled if tier[op.op_id] == "cool"), key=lambda op: op.hlc)
    ops = _store(tmp_path / "again", deleted=[gone.op_id])
    since = max(op.hlc for op in ops if op.op_id != gone.op_id and tier[op.op_id] == "cool")
    with ConversationStateRepository(tmp_path / "again") as repo:
        got = repo.export_ops(since=Hlc(0, 0, ""))
        assert [op.op_id for op in got if op.payload.get("deleted")] == [gone.op_id]
        assert repo.export_ops(since=since) == [op for op in got if op.hlc > since]


def test_a_damaged_stamp_page_is_named_not_skipped(tmp_path):
    """A flipped byte in an archive file's ``hlc`` pages: the first export
    since a stamp after everything in it does not take the file as old (its
    columns cannot be read), reads its records and names the file."""
    newest = _store(tmp_path)[-1].hlc
    with ConversationStateRepository(tmp_path, read_only=True) as repo:
        path = repo._cool.path_of(repo._cool.files()[0])
    flip_column_tail(path, "hlc")
    with ConversationStateRepository(tmp_path, read_only=True) as repo:
        with pytest.raises(CorruptStateCheckpointError) as ei:
            repo.export_ops(since=newest)
        assert ei.value.path is not None and ei.value.path.endswith(path.rsplit("/", 1)[1])


@settings(max_examples=400, deadline=None)
@given(_hlcs, st.one_of(_ts, st.integers(-5, 10**13)), st.one_of(_devices, st.none()))
def test_a_stamp_key_is_the_record_stamp_as_a_tuple(hlc, ts, origin):
    got = stamp_key(hlc, ts, origin)
    assert type(got) is tuple and got == tuple(record_stamp(hlc, ts, origin))


def test_a_newest_stamp_rounded_up_is_found():
    """Two wall times 0.8 ms apart that round to one millisecond: the
    stamp orders them by origin, so the lower of the two is the newest."""
    t = 1_700_000_000.0
    rows = [("", t + 0.0004, ""), ("", t - 0.0004, "dev-b"), ("", t - 0.5, "")]
    hlc = pa.array([h for h, _t, _o in rows], pa.string())
    ts = np.array([t_ for _h, t_, _o in rows], dtype=np.float64)
    origin = pa.array([o for _h, _t, o in rows], pa.string())
    assert newest_stamp(hlc, ts, origin) == max(tuple(record_stamp(*r)) for r in rows) == \
        (round((t - 0.0004) * 1000), 0, "dev-b")
