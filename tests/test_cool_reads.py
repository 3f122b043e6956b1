"""The compiled cool read path (CoolArchive.records_at, PageReader.take,
_pages.plain_gather / records_from_columns, channel_tail_locs) against the
dict path it stands in for (rows_at + message_from_stored) and a plain
model: the same records, the same order, every row it declines read the
old way, and damage still named."""
from __future__ import annotations

import os
import random

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import _pages
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.cool import CoolArchive, index_dir_for
from rune_fast.cool.schema import _COLS, _COMPRESSION, _PAGE_BATCH_ROWS, _PAGE_BYTES, _row_key, cool_loc
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.pages import PageReader, page_directories
from rune_fast.records import ConversationMessageRecord, message_from_stored
from test_cool import cool_rows, records, rec

R = ConversationMessageRecord


def dict_path(archive, locs):
    """(record, ord) of each location through the dict path."""
    return [(message_from_stored(r.record, fresh_json=r.plain), r.ord) for r in archive.rows_at(locs)]


def every_loc(archive):
    return [cool_loc(no, r) for no in sorted(archive._files) for r in range(archive._files[no].rows)]


# ----------------------------------------------------------------- C kernels

@settings(max_examples=60, deadline=None)
@given(pages=st.lists(st.lists(st.binary(max_size=20), min_size=1, max_size=8), min_size=1, max_size=5),
       data=st.data())
def test_plain_gather_is_the_values_asked(pages, data):
    encoded = [b"".join(len(v).to_bytes(4, "little") + v for v in p) for p in pages]
    flat = [v for p in pages for v in p]
    rows = sorted(data.draw(st.sets(st.integers(0, len(flat) - 1))))
    got, offs = _pages.plain_gather(encoded, np.array([len(p) for p in pages], dtype=np.int64),
                                    np.array(rows, dtype=np.int64))
    assert [got[offs[i]:offs[i + 1]] for i in range(len(rows))] == [flat[r] for r in rows]


def test_plain_gather_refuses_what_does_not_parse():
    page = (3).to_bytes(4, "little") + b"abc"
    for counts, rows in (([2], [1]), ([1], [1]), ([1], [0, 0])):
        with pytest.raises(ValueError):
            _pages.plain_gather([page], np.array(counts, dtype=np.int64), np.array(rows, dtype=np.int64))
    with pytest.raises(ValueError):
        _pages.plain_gather([page[:5]], np.array([1], dtype=np.int64), np.array([0], dtype=np.int64))


# ----------------------------------------------------------------- records_at

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(records, min_size=1, max_size=14, unique_by=lambda d: d["msg_id"]), data=st.data())
def test_records_at_is_the_dict_path(tmp_path_factory, rows, data):
    """Any stored row (control characters, any float, long integers and
    floats in tool calls, extra fields) is either read to the record the
    dict path makes or declined (None) -- never another record; a sound
    row without tool calls or extra fields is always taken."""
    d = str(tmp_path_factory.mktemp("c") / "cool")
    a = CoolArchive(d, row_group_rows=4)
    cool_rows(a, rows, list(range(len(rows))))
    locs = every_loc(a)
    locs = data.draw(st.lists(st.sampled_from(locs), min_size=1, max_size=20))
    got = a.records_at(locs, R)
    for loc, hit, rd in zip(locs, got, a.rows_at(locs)):
        try:
            want = message_from_stored(rd.record, fresh_json=rd.plain)
        except (TypeError, ValueError, KeyError):
            assert hit is None          # the repository names it (archived record does not validate)
            continue
        if hit is None:
            r = rd.record
            assert r["tool_calls"] or len(r) != 12 or not (r["token_estimate"] >= 0) \
                or r["schema_version"] != 1, r
            continue
        assert hit[0] == want and hit[0].tool_calls == want.tool_calls and hit[1] == rd.ord
        assert type(hit[0].ts) is float and type(hit[0].tool_calls) is tuple


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(records, min_size=1, max_size=10, unique_by=lambda d: d["msg_id"]),
       shift=st.integers(0, 7))
def test_records_from_columns_takes_any_buffer(tmp_path_factory, rows, shift):
    """records_from_columns reads its columns through the buffer protocol:
    bytes, ndarrays and views at any offset (copied when not aligned) give
    the same records; columns of other lengths are refused."""
    from rune_fast.cool.reads import _ORD, _SV, _STRING_COLS, _TOK, _TS, _calls_read
    d = str(tmp_path_factory.mktemp("c") / "cool")
    a = CoolArchive(d, row_group_rows=64)
    cool_rows(a, rows, list(range(len(rows))))
    (name,) = a.files()
    reader = a._reader(int(name[5:13]))
    cols = reader.take(0, list(range(len(rows))))

    def run(fixed, offs):
        return _pages.records_from_columns([(cols[c][0], offs(cols[c][1])) for c in _STRING_COLS],
                                           *[fixed(cols[c]) for c in (_TS, _TOK, _SV, _ORD)], R, _calls_read)

    def shifted(buf):
        raw = bytes(memoryview(buf).cast("B"))
        return memoryview(bytearray(b"\0" * shift) + raw)[shift:]

    want = run(bytes, lambda o: o)
    assert run(lambda b: np.frombuffer(b, dtype=np.uint8).copy(), bytes) == want
    assert run(shifted, shifted) == want
    with pytest.raises(ValueError, match="different lengths"):
        run(lambda b: bytes(b)[:-4] if b is cols[_SV] else b, lambda o: o)
    with pytest.raises(ValueError, match="offsets"):
        _pages.records_from_columns([(cols[c][0], bytes(cols[c][1])[4:]) for c in _STRING_COLS],
                                    cols[_TS], cols[_TOK], cols[_SV], cols[_ORD], R, _calls_read)


def test_records_at_order_and_repeats(tmp_path):
    a = CoolArchive(str(tmp_path / "cool"), row_group_rows=16)
    for run in range(3):
        rows = [rec(i, f"c{i % 3}", task=f"t{i % 5}", content=f"m {i} \u00e9\n\"q\"\\",
                    tool_calls=[{"arguments": {"n": i}, "id": "x", "name": "f"}] if i % 7 == 0 else None)
                for i in range(run * 100, run * 100 + 100)]
        rows.sort(key=lambda r: r["channel_id"])
        cool_rows(a, rows, [int(r["msg_id"][4:]) for r in rows])
    locs = every_loc(a)
    fresh = CoolArchive.open(a.cool_dir, a.files())
    assert all(h is not None for h in fresh.records_at(locs, R))
    rnd = random.Random(3)
    for _ in range(20):
        pick = [rnd.choice(locs) for _ in range(rnd.randint(1, 80))]
        got = a.records_at(pick, R)
        # (a group the row-group cache holds whole is left to rows_at: None)
        assert all(g is None or g == w for g, w in zip(got, dict_path(a, pick)))
        assert fresh.records_at(pick, R) == dict_path(fresh, pick) or None in fresh.records_at(pick, R)
    b = CoolArchive.open(a.cool_dir, a.files())
    for _ in range(5):
        pick = sorted({rnd.choice(locs) for _ in range(40)})
        assert b.records_at(pick, R) == dict_path(CoolArchive.open(a.cool_dir, a.files()), pick)


def test_records_at_refuses_a_location_of_no_live_file(tmp_path):
    a = CoolArchive(str(tmp_path / "cool"))
    cool_rows(a, [rec(i) for i in range(5)], range(5))
    with pytest.raises(CorruptStateCheckpointError, match="file number 7"):
        a.records_at([cool_loc(7, 0)], R)
    with pytest.raises(CorruptStateCheckpointError) as ei:
        a.records_at([cool_loc(1, 9)], R)
    assert ei.value.path == os.path.join(a.cool_dir, a.files()[0])


def rewrite_keeping_layout(path: str, row: int, content: str) -> None:
    """One content cell changed, the old digest kept, the file written in
    the archive's own page layout (so the page reader reads it)."""
    t = pq.read_table(path)
    col = t.column("content").to_pylist()
    col[row] = content
    import pyarrow as pa
    t = t.set_column(t.schema.get_field_index("content"), t.schema.field("content"), pa.array(col, pa.string()))
    pq.write_table(t, path, row_group_size=1024, compression=_COMPRESSION, write_page_checksum=True,
                   use_dictionary=False, data_page_version="1.0", data_page_size=_PAGE_BYTES,
                   write_batch_size=_PAGE_BATCH_ROWS)


def test_records_at_declines_a_row_that_fails_its_digest(tmp_path):
    """A changed value under the old digest: the compiled path declines the
    row, and the dict path it falls back to names file and row."""
    d = str(tmp_path / "cool")
    a = CoolArchive(d)
    cool_rows(a, [rec(i, task="t") for i in range(10)], range(10))
    name = a.files()[0]
    path = os.path.join(d, name)
    rewrite_keeping_layout(path, 3, "message number 3!")
    from rune_fast.cool import _FileIndex, _footer_hash
    ipath = os.path.join(index_dir_for(d), "cool-00000001.idx")
    with open(ipath, "rb") as f:
        fi = _FileIndex.decode(f.read(), 1, ipath)
    fi.size, fi.footer = _footer_hash(path)
    fi.pagedir = page_directories(path, pq.read_metadata(path))    # (the rewritten file's pages)
    with open(ipath, "wb") as f:
        f.write(fi.encode())
    b = CoolArchive.open(d, [name])
    assert b._reader(1) is not None        # the page reader takes this layout
    got = b.records_at([cool_loc(1, r) for r in range(10)], R)
    assert [g is None for g in got] == [r == 3 for r in range(10)]
    with pytest.raises(CorruptStateCheckpointError) as ei:
        b.rows_at([cool_loc(1, 3)])
    assert ei.value.path == path and ei.value.offset == 3


def flip_content_page(path: str) -> None:
    """Flip a byte inside the first content data page (its CRC then fails)."""
    md = pq.read_metadata(path)
    cc = md.row_group(0).column(_COLS.index("content"))
    with open(path, "r+b") as f:
        f.seek(cc.data_page_offset + 40)
        b = f.read(1)
        f.seek(cc.data_page_offset + 40)
        f.write(bytes([b[0] ^ 0x20]))


def flip_column_tail(path: str, column: str) -> None:
    """Flip a byte near the end of a column chunk of the first row group
    (inside its last page: that page's CRC then fails)."""
    cc = pq.read_metadata(path).row_group(0).column(_COLS.index(column))
    at = (cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset) \
        + cc.total_compressed_size - 3
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))


def test_damaged_page_is_named_by_task_and_window_reads(tmp_path):
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        for i in range(60):
            repo.append(R(msg_id=f"msg_{i:04d}", role="user", content=f"long enough content {i} " * 4,
                          channel_id="c", task_id="t"))
        repo.compact()
        names = list(repo._manifest["cool_files"])
    path = os.path.join(str(tmp_path), "hot", "conversation_cool", names[0])
    flip_content_page(path)
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        for call in (lambda: repo.messages_for_task("t"), lambda: repo.window("c", 30)):
            with pytest.raises(CorruptStateCheckpointError) as ei:
                call()
            assert ei.value.path == path


# ----------------------------------------------------------------- windows and tasks

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["", "t1", "t2"]),
                                st.booleans()), min_size=1, max_size=60),
       runs=st.integers(1, 4), n=st.integers(1, 70), data=st.data())
def test_tail_and_task_reads_match_a_model(tmp_path_factory, specs, runs, n, data):
    """Rows cooled over several files (stamped ones out of order across
    runs): channel_tail_locs + records_at give the channel's newest n by the
    order key, and task rows read by location are the task's rows."""
    d = str(tmp_path_factory.mktemp("c") / "cool")
    a = CoolArchive(d, row_group_rows=8)
    rows = []
    for i, (ch, task, stamped) in enumerate(specs):
        r = rec(i, ch, task=task, hlc=f"{(i * 7919) % 1000:015d}-0000000000-d" if stamped else "")
        rows.append((r, i))
    cut = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=runs - 1)))
    for lo, hi in zip([0] + cut, cut + [len(rows)]):
        part = sorted(rows[lo:hi], key=lambda p: (p[0]["channel_id"], _row_key_of(*p)))
        if part:
            cool_rows(a, [r for r, _ in part], [o for _, o in part])
    for ch in ("a", "b"):
        want = sorted((p for p in rows if p[0]["channel_id"] == ch), key=lambda p: _row_key_of(*p))[-n:]
        locs = a.channel_tail_locs(ch, n)
        got = a.records_at(locs, R)
        assert [g[0].msg_id for g in got] == [r["msg_id"] for r, _ in want]
        assert a.channel_tail_locs(ch, n) == locs        # (kept)
    for t in ("t1", "t2"):
        got = sorted(a.records_at(a.task_locs(t), R), key=lambda h: _row_key_of(
            {"hlc": h[0].hlc, "msg_id": h[0].msg_id}, h[1]))
        assert [g[0].msg_id for g in got] == [r["msg_id"] for r, o in sorted(
            (p for p in rows if p[0]["task_id"] == t), key=lambda p: _row_key_of(*p))]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(st.tuples(st.sampled_from(["", "t1", "t2", "t3"]), st.integers(0, 3),
                                st.integers(0, 10 ** 6)), min_size=2, max_size=60),
       n=st.integers(1, 70), data=st.data())
def test_tail_reads_order_equal_stamps_by_id(tmp_path_factory, specs, n, data):
    """Stamped rows of one hlc (ids in any order) over several files
    clustered by task: the newest n by the order key break the hlc's ties
    by msg_id, as the keyed sort does."""
    d = str(tmp_path_factory.mktemp("c") / "cool")
    a = CoolArchive(d, row_group_rows=8)
    rows = []
    for i, (task, h, salt) in enumerate(specs):
        r = rec(i, "a", task=task, hlc="" if h == 0 else f"{h:015d}-0000000000-d")
        r["msg_id"] = f"m{salt:07d}-{i}"
        rows.append((r, i))
    cut = data.draw(st.integers(1, len(rows) - 1))
    for part in (rows[:cut], rows[cut:]):
        cool_rows(a, [r for r, _ in sorted(part, key=lambda p: _row_key_of(*p))],
                  [o for _, o in sorted(part, key=lambda p: _row_key_of(*p))])
    want = sorted(rows, key=lambda p: _row_key_of(*p))[-n:]
    got = a.records_at(a.channel_tail_locs("a", n), R)
    assert [g[0].msg_id for g in got] == [r["msg_id"] for r, _ in want]


def _row_key_of(r: dict, o: int) -> tuple:
    from rune_fast._order import order_key
    return order_key(r["hlc"], r["msg_id"], o)


def test_repository_window_into_many_cool_files(tmp_path):
    """window(ch, n) reaching past the hot messages over several cool files,
    with deletions, equals the full merge of the channel."""
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=3) as repo:
        rnd = random.Random(5)
        for run in range(3):
            for i in range(run * 40, run * 40 + 40):
                repo.append(R(msg_id=f"msg_{i:04d}", role="user", content=f"c{i}",
                              channel_id=rnd.choice(["x", "y"]), task_id=rnd.choice(["", "t"])))
            repo.compact()
        assert len(repo._manifest["cool_files"]) >= 2
        for mid in ("msg_0110", "msg_0111", "msg_0060"):
            repo.delete(mid)
        for ch in ("x", "y"):
            full = [r for r, _t in repo._channel_all(ch)]
            for n in (1, 3, 5, 20, 200):
                assert repo.window(ch, n) == full[-n:]
                assert repo.window(ch, n) == full[-n:]          # (from the caches)
        want = [r for ch in ("x", "y") for r, _t in repo._channel_all(ch) if r.task_id == "t"]
        got = repo.messages_for_task("t")
        assert sorted(r.msg_id for r in got) == sorted(r.msg_id for r in want)


def test_id_records_at_reads_no_id_column_and_checks_the_id(tmp_path, monkeypatch):
    """An exact read's rows come from every column but msg_id (the digest
    covers the id asked): the same records as records_at; a row of another
    id (a hash collision) fails its digest and is left to rows_at."""
    a = CoolArchive(str(tmp_path / "cool"), row_group_rows=16)
    rows = [rec(i, f"c{i % 2}", task=f"t{i % 3}", content=f"m {i}") for i in range(60)]
    rows.sort(key=lambda r: r["channel_id"])
    cool_rows(a, rows, [int(r["msg_id"][4:]) for r in rows])
    fresh = CoolArchive.open(a.cool_dir, a.files())
    asked = []
    real_take = PageReader.take

    def take(self, rg, local, cols=None, fetched=None):
        asked.append(cols)
        return real_take(self, rg, local, cols, fetched)

    monkeypatch.setattr(PageReader, "take", take)
    ref = CoolArchive.open(a.cool_dir, a.files())
    for k, r in enumerate(rows):
        locs = fresh.id_locs(r["msg_id"])
        want = dict_path(ref, locs)
        asked.clear()
        other = rows[(k + 1) % len(rows)]["msg_id"]
        assert fresh.id_records_at(other, locs, R) == [None]
        assert fresh.id_records_at(r["msg_id"], locs, R) == want
        assert fresh._cache == {}       # (nothing cached: every read went by pages)
        assert asked and all(c is not None and _COLS.index("msg_id") not in c for c in asked)


def test_get_message_reads_archived_rows_by_id(tmp_path, monkeypatch):
    repo = ConversationStateRepository(str(tmp_path / "s"), durability="none", compact_every=10_000, hot_window=4)
    try:
        msgs = [R(msg_id=f"msg_{i:08d}", channel_id="c", content=f"m {i}", role="user") for i in range(40)]
        for m in msgs:
            repo.append(m)
        repo.compact()
        seen = []
        real = repo._cool.id_records_at
        monkeypatch.setattr(repo._cool, "id_records_at", lambda mid, locs, rt: seen.append(mid) or real(mid, locs, rt))
        got = repo.get_message("msg_00000003")
        assert got.tier == "cool" and got.record == msgs[3]
        assert seen == ["msg_00000003"]
    finally:
        repo.close()


def test_a_damaged_key_page_is_named_by_a_window(tmp_path):
    """A window over a channel's task runs reads their order-key columns
    to choose its rows: a flipped byte in one of those pages is named."""
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        for i in range(80):
            repo.append(R(msg_id=f"msg_{i:04d}", role="user", content=f"turn {i}", channel_id="c",
                          task_id=f"t{i % 5}"))
        repo.compact()
        path = repo._cool.path_of(repo._cool.files()[0])
        (no,) = repo._cool._channels["c"]
        assert len(repo._cool._task_runs(no, "c")[0]) > 1       # (task runs: the keys choose)
    flip_column_tail(path, "msg_id")
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        with pytest.raises(CorruptStateCheckpointError) as ei:
            repo.window("c", 20)
        assert ei.value.path == path


def test_clear_channel_takes_archived_ids_from_their_columns(tmp_path, monkeypatch):
    """clear_channel deletes every message of the channel, archived ones
    found by the msg_id and channel_id columns alone (no record read),
    those deleted before left out of its count."""
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=3) as repo:
        for k in range(3):
            repo.append_many([R(msg_id=f"m{k}_{i:03d}", role="user", content=f"c {i}",
                                channel_id="c" if i % 3 else "d", task_id=f"t{i % 4}") for i in range(60)])
            repo.compact()
        assert len(repo._cool._channels["c"]) == 3
        repo.delete("m0_001")
        monkeypatch.setattr(repo, "_cool_channel", None)      # (the records are not read)
        assert repo.clear_channel("c") == 119
        assert repo.window("c", 200) == [] and len(repo) == 60
        assert [r.channel_id for r in repo.window("d", 100)] == ["d"] * 60


def test_clear_channel_names_a_damaged_id_page_and_deletes_nothing(tmp_path):
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        repo.append_many([R(msg_id=f"msg_{i:04d}", role="user", content=f"turn {i}", channel_id="c")
                          for i in range(80)])
        repo.compact()
        path = repo._cool.path_of(repo._cool.files()[0])
    flip_column_tail(path, "msg_id")
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        with pytest.raises(CorruptStateCheckpointError) as ei:
            repo.clear_channel("c")
        assert ei.value.path == path
        assert len(repo) == 80 and not repo._tombstones
