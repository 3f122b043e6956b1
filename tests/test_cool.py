"""The cool tier (rune_fast.cool): round trips, queries, digests, damage,
erasure and merging of the Parquet archive."""
from __future__ import annotations

import os
import stat
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast.cool import COOL_SCHEMA, CoolArchive, _table_from_records, cool_loc, index_dir_for, record_digest
from rune_fast.cool.schema import _row_key
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast._pages import page_header
from rune_fast.pages import page_directories


def rec(i: int, ch: str = "ch", *, content: str | None = None, task: str = "", hlc: str = "",
        tool_calls: list | None = None) -> dict:
    return {
        "msg_id": f"msg_{i:08d}", "channel_id": ch, "task_id": task, "hlc": hlc,
        "content": f"message number {i}" if content is None else content,
        "ts": 1700000000.0 + i, "role": "user" if i % 2 else "assistant",
        "token_estimate": i % 50, "tool_calls": tool_calls or [], "tool_call_id": "",
        "origin": "", "schema_version": 1,
    }


def cool_rows(archive, rows, ords, *, durable=None):
    """Cool record dicts as one file the way the repository cools its hot
    lines: a table of the cool schema (the dict path of table_from_lines)
    through ``cool_table``."""
    rows = list(rows)
    table = _table_from_records(rows, [int(o) for o in ords], [record_digest(r) for r in rows])
    return archive.cool_table(table, durable=durable)


def task_records(archive, task_id):
    """The task's rows as the repository reads them (task_locs, then
    rows_at), oldest first by the order key."""
    return sorted(archive.rows_at(archive.task_locs(task_id)), key=_row_key)


def all_rows(archive):
    """Every archived row, channel by channel."""
    return [r for ch in archive.channels() for r in archive.channel_rows(ch)]


@pytest.fixture
def cdir(tmp_path):
    return str(tmp_path / "hot" / "conversation_cool")


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def all_bytes(folder: str) -> list[tuple[str, bytes]]:
    out = []
    for root, _dirs, names in os.walk(folder):
        for n in names:
            with open(os.path.join(root, n), "rb") as f:
                out.append((n, f.read()))
    return out


# ----------------------------------------------------------------- round trips

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(), kids, max_size=3),
    max_leaves=8,
)
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
records = st.fixed_dictionaries({
    "msg_id": texts.filter(bool), "channel_id": texts.filter(bool), "task_id": texts, "hlc": texts,
    "content": texts, "ts": st.floats(allow_nan=False), "role": st.sampled_from(
        ["user", "assistant", "system", "tool"]),
    "token_estimate": st.integers(-(1 << 63), (1 << 63) - 1),
    "tool_calls": st.lists(st.fixed_dictionaries(
        {"id": texts, "name": texts, "arguments": json_values}), max_size=3),
    "tool_call_id": texts, "origin": texts, "schema_version": st.integers(-(1 << 31), (1 << 31) - 1),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(records, max_size=12, unique_by=lambda d: d["msg_id"]))
def test_round_trip_every_field(tmp_path_factory, rows):
    d = str(tmp_path_factory.mktemp("c") / "cool")
    a = CoolArchive(d)
    cool_rows(a, rows, list(range(len(rows))))
    for src in (a, CoolArchive.open(d, a.files())):
        assert len(src) == len(rows)
        for i, r in enumerate(rows):
            got = src.get_row(r["msg_id"])
            assert got.record == r
            assert got.ord == i
        for ch in {r["channel_id"] for r in rows}:
            want = [r for r in rows if r["channel_id"] == ch]
            assert sorted(x.record["msg_id"] for x in src.channel_rows(ch)) == sorted(
                r["msg_id"] for r in want)
        assert src.verify() == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(records, min_size=1, max_size=10, unique_by=lambda d: d["msg_id"]),
       probes=st.lists(texts.filter(bool), max_size=8), split=st.integers(0, 10))
def test_id_ranges_answer_new_ids_without_the_sidecars(tmp_path_factory, rows, probes, split):
    """Each file keeps its (smallest, largest) msg_id in file_meta (the
    manifest's cool_meta); an archive opened with them answers contains and
    contains_many for an id outside every range without reading a sidecar,
    and every answer is the truth (unicode ids: Arrow's byte order of UTF-8
    is str's code point order)."""
    d = str(tmp_path_factory.mktemp("c") / "cool")
    a = CoolArchive(d)
    for part in (rows[:split], rows[split:]):
        if part:
            cool_rows(a, part, list(range(len(part))))
    ids = {r["msg_id"] for r in rows}
    meta = a.file_meta()
    assert sorted(m[2] for m in meta.values()) == sorted(
        min(r["msg_id"] for r in part) for part in (rows[:split], rows[split:]) if part)
    assert max(m[3] for m in meta.values()) == max(ids) and min(m[2] for m in meta.values()) == min(ids)
    b = CoolArchive.open(d, a.files(), expect=meta)
    outside = [p for p in probes if not min(ids) <= p <= max(ids)]
    assert b.contains_many(outside).tolist() == [False] * len(outside)
    assert [b.contains(p) for p in outside] == [False] * len(outside)
    assert len(b._unloaded) == len(a.files())       # no sidecar read yet
    asked = probes + sorted(ids)
    assert b.contains_many(asked).tolist() == [p in ids for p in asked]
    assert [b.contains(p) for p in asked] == [p in ids for p in asked]
    # without the ranges (a manifest written before they were kept): the same answers
    c = CoolArchive.open(d, a.files(), expect={n: m[:2] for n, m in meta.items()})
    assert c.contains_many(asked).tolist() == [p in ids for p in asked]


def test_id_span_is_kept_as_files_come_and_go(cdir):
    """The span of the live files' id ranges is worked out once (under the
    lock) and then kept: a file added widens it, a file dropped (a merge)
    leaves it as it is, so an append's duplicate check of an id outside it
    never waits for the lock, which a background run may hold for a while
    (found at 1,000,000 messages: the first append after a cooling run was
    adopted waited 70 ms). Every answer stays the truth."""
    a = CoolArchive(cdir)
    cool_rows(a, [rec(i) for i in range(10, 20)], list(range(10)))
    assert a.contains("msg_99999999") is False
    assert a._span == ("msg_00000010", "msg_00000019")
    cool_rows(a, [rec(i, "other") for i in range(30, 40)], list(range(10)))
    assert a._span == ("msg_00000010", "msg_00000039")        # widened, not forgotten
    change = a.merge([a.files()])
    a.unlink_files(change.removed)
    assert len(a.files()) == 1 and a._span == ("msg_00000010", "msg_00000039")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with a._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        # answered without the lock the other thread holds
        assert a.contains("msg_00000040") is False and a.contains("msg_00000009") is False
        assert a.contains_many(["msg_00000050", "msg_00000001"]).tolist() == [False, False]
    finally:
        release.set()
        t.join()
    asked = [f"msg_{i:08d}" for i in range(5, 45)]
    assert [a.contains(m) for m in asked] == [10 <= i < 20 or 30 <= i < 40 for i in range(5, 45)]


def test_verify_finds_a_byte_changed_where_no_page_checksum_looks(cdir):
    """Each file's whole-file xxh3_64 is kept with its meta (the manifest's
    cool_meta, after the id range): verify() names a file whose leading
    magic or a page header changed, which pyarrow reads on as if sound and
    no page CRC covers; reads stay exact, a reopened archive keeps the
    digest, and a meta without it (older manifests) checks as before."""
    a = CoolArchive(cdir)
    cool_rows(a, [rec(i) for i in range(40)], list(range(40)))
    (name,) = a.files()
    meta = a.file_meta()[name]
    assert len(meta) == 5 and isinstance(meta[4], str)
    assert a.verify() == []
    path = os.path.join(cdir, name)
    data = bytearray(read_bytes(path))
    data[0] ^= 0x01                                         # 'PAR1' -> 'QAR1'
    with open(path, "r+b") as f:
        f.write(bytes(data))
    again = CoolArchive(cdir, [name], expect={name: meta})
    assert again.get("msg_00000007")["content"] == rec(7)["content"]
    problems = again.verify()
    assert [p.file for p in problems] == [name] and "hash" in problems[0].problem
    assert CoolArchive(cdir, [name], expect={name: meta[:4]}).verify() == []


@settings(max_examples=150, deadline=None)
@given(r=records, plain=st.booleans(), ts=st.floats() | st.sampled_from([1e16, 1e-7, 1.5e300, -0.0]))
def test_digest_is_xxh3_of_json_dumps(r, plain, ts):
    """The digest equals the spec's definition, whichever encoder computed it."""
    import json
    import xxhash
    r = dict(r, ts=ts)
    if plain:
        r["tool_calls"] = []
    want = xxhash.xxh3_128_hexdigest(json.dumps(r, sort_keys=True, separators=(",", ":"),
                                                ensure_ascii=False).encode("utf-8"))
    assert record_digest(r) == want


def test_control_chars_and_unicode(cdir):
    rows = [rec(1, "c\x00h\n", content="a\x00b\x1f\"\\\u2028é😀"), rec(2, "ch/../x", task="t\x7f")]
    a = CoolArchive(cdir)
    cool_rows(a, rows, [1, 2])
    assert a.get("msg_00000001") == rows[0]
    assert task_records(a, "t\x7f")[0].record == rows[1]
    assert a.get("missing") is None


def test_extra_fields_round_trip(cdir):
    r = rec(1)
    r["future_field"] = {"a": [1, 2]}
    a = CoolArchive(cdir)
    cool_rows(a, [r], [0])
    assert CoolArchive.open(cdir, a.files()).get(r["msg_id"]) == r


def test_duplicates_refused(cdir):
    a = CoolArchive(cdir)
    with pytest.raises(ValueError, match="twice"):
        cool_rows(a, [rec(1), rec(1)], [0, 1])
    cool_rows(a, [rec(1)], [0])
    with pytest.raises(ValueError, match="already archived"):
        cool_rows(a, [rec(1)], [1])


def _sidecars(cdir: str) -> list[str]:
    """The ``.idx`` sidecars in the archive's index folder (each live file
    also has its search filters there, ``.grams``)."""
    return sorted(n for n in os.listdir(index_dir_for(cdir)) if not n.endswith(".grams"))


def test_permissions_and_names(cdir):
    a = CoolArchive(cdir)
    run = cool_rows(a, [rec(1)], [0])
    assert run.file == "cool-00000001.parquet"
    assert stat.S_IMODE(os.stat(cdir).st_mode) == 0o700
    for n in os.listdir(cdir):
        assert stat.S_IMODE(os.stat(os.path.join(cdir, n)).st_mode) == 0o600
    assert sorted(os.listdir(cdir)) == ["cool-00000001.parquet"]       # Parquet files only
    idir = index_dir_for(cdir)
    assert stat.S_IMODE(os.stat(idir).st_mode) == 0o700
    # the sidecar and the search filters written with the file
    assert sorted(os.listdir(idir)) == ["cool-00000001.grams", "cool-00000001.idx"]
    for n in os.listdir(idir):
        assert stat.S_IMODE(os.stat(os.path.join(idir, n)).st_mode) == 0o600
    with pytest.raises(ValueError):
        CoolArchive(cdir, ["../../etc/passwd"])


# ----------------------------------------------------------------- queries

def make_archive(cdir, n=300, runs=3):
    a = CoolArchive(cdir)
    rows = [rec(i, f"ch{i % 4}", task=f"t{i % 5}" if i % 3 else "") for i in range(n)]
    per = n // runs
    for k in range(runs):
        part = rows[k * per:(k + 1) * per]
        part = sorted(part, key=lambda r: r["channel_id"])  # channel, then given (append) order
        cool_rows(a, part, [int(r["msg_id"][4:]) for r in part])
    return a, rows


def test_channel_task_queries(cdir):
    a, rows = make_archive(cdir)
    assert a.channels() == ["ch0", "ch1", "ch2", "ch3"]
    assert len(a) == 300 and len(a.files()) == 3
    for ch in a.channels():
        want = [r for r in rows if r["channel_id"] == ch]
        got = a.channel_rows(ch)
        assert [g.record for g in got] == want
        assert [g.ord for g in got] == [int(r["msg_id"][4:]) for r in want]
        assert [g.record for g in a.channel_tail(ch, 7)] == want[-7:]
        assert a.channel_len(ch) == len(want)
        tasks = [r["task_id"] for r in want if r["task_id"]]
        assert a.latest_task(ch) == tasks[-1]
    assert a.channel_tail("ch0", 0) == [] and a.channel_rows("nope") == []
    for t in ("t1", "t2"):
        assert [g.record for g in task_records(a, t)] == [r for r in rows if r["task_id"] == t]
        assert a.task_len(t) == len([r for r in rows if r["task_id"] == t])
    assert task_records(a, "nope") == [] and a.latest_task("nope") is None
    # locations: (file number << 32) | row, across the three files; rows_at reads them in their order
    for t in ("t1", "t2"):
        locs = a.task_locs(t)
        assert all(type(loc) is int for loc in locs) and len({loc >> 32 for loc in locs}) == 3
        got = a.rows_at(locs[::-1])
        assert [a.loc_of(g) for g in got] == locs[::-1]
        assert sorted((g.record for g in got), key=lambda r: r["msg_id"]) == \
            [r for r in rows if r["task_id"] == t]
        assert all(g.record["task_id"] == t and cool_loc(int(g.file[-16:-8]), g.row) == a.loc_of(g)
                   for g in got)
    assert a.task_locs("nope") == [] and a.rows_at([]) == []
    assert [a.loc_of(g) for g in a.rows_at(a.id_locs("msg_00000005"))] == a.id_locs("msg_00000005")
    with pytest.raises(CorruptStateCheckpointError, match="file number 99"):
        a.rows_at([cool_loc(99, 0)])
    assert a.contains("msg_00000005") and not a.contains("msg_x")
    assert a.contains_many(["msg_00000005", "zz"]).tolist() == [True, False]


def test_kept_task_locations_follow_the_files(cdir):
    """task_locs keeps its answers until files come or go: a new run, an
    erasure and a merge each give the task's rows where they are now, and a
    caller's change to a returned list changes nothing kept."""
    a, rows = make_archive(cdir)
    want = {r["msg_id"] for r in rows if r["task_id"] == "t1"}

    def got():
        return {g.record["msg_id"] for g in a.rows_at(a.task_locs("t1"))}
    a.task_locs("t1").clear()
    assert got() == want != set()
    cool_rows(a, [rec(i, "ch9", task="t1") for i in range(300, 310)], list(range(300, 310)))
    want |= {f"msg_{i:08d}" for i in range(300, 310)}
    assert got() == want
    gone = ["msg_00000305", sorted(want)[0]]
    change = a.erase(gone)
    a.unlink_files(change.removed)
    want -= set(gone)
    assert got() == want
    change = a.merge([a.files()])
    a.unlink_files(change.removed)
    assert len(a.files()) == 1 and got() == want
    assert len({loc >> 32 for loc in a.task_locs("t1")}) == 1


def test_order_key_stamped_after_unstamped(cdir):
    a = CoolArchive(cdir)
    cool_rows(a, [rec(1, hlc="000000000000002-0000000000-d"), rec(2, hlc="000000000000009-0000000000-d")],
           [10, 11])
    cool_rows(a, [rec(3), rec(4, hlc="000000000000005-0000000000-d")], [12, 13])
    assert [r.record["msg_id"][-1] for r in a.channel_rows("ch")] == ["3", "1", "4", "2"]
    assert [r.record["msg_id"][-1] for r in a.channel_tail("ch", 2)] == ["4", "2"]
    a.merge([a.files()])
    assert [r.record["msg_id"][-1] for r in a.channel_rows("ch")] == ["3", "1", "4", "2"]


def test_search_case_rules(cdir):
    contents = ["Die Straße ist lang", "STRASSE", "strasse", "\u212a is Kelvin", "plain k", "nothing",
                "MiXeD Case", "ﬁne ligature"]
    a = CoolArchive(cdir)
    rows = [rec(i, "a" if i % 2 else "b", content=c) for i, c in enumerate(contents)]
    cool_rows(a, sorted(rows, key=lambda r: r["channel_id"]), [0] * 0 + [i for i in range(len(rows))])

    def ids(hits):
        return sorted(int(h.record["msg_id"][4:]) for h in hits)

    def model(text, cs, ch=None):
        return sorted(i for i, c in enumerate(contents)
                      if (ch is None or rows[i]["channel_id"] == ch)
                      and ((text in c) if cs else (text.casefold() in c.casefold())))

    for text in ["ß", "SS", "ss", "strasse", "Straße", "k", "K", "\u212a", "mixed", "MiXeD", "fine",
                 "", "zz", "e "]:
        for cs in (False, True):
            assert ids(a.search(text, case_sensitive=cs)) == model(text, cs), (text, cs)
            assert ids(a.search(text, "a", case_sensitive=cs)) == model(text, cs, "a"), (text, cs)
    assert ids(a.search("ss")) == [0, 1, 2]           # 'ß' casefolds to 'ss'
    assert ids(a.search("k")) == [3, 4]               # Kelvin sign casefolds to 'k'
    assert a.search("x", "nope") == []


# ----------------------------------------------------------------- damage

def tamper(path: str, row: int, content: str) -> None:
    """Rewrite the file with one content cell changed but the old digest."""
    t = pq.read_table(path)
    col = t.column("content").to_pylist()
    col[row] = content
    t = t.set_column(t.schema.get_field_index("content"), COOL_SCHEMA.field("content"),
                     pa.array(col, pa.string()))
    pq.write_table(t, path, compression="zstd", write_page_checksum=True)


def test_digest_mismatch_is_loud(cdir):
    a = CoolArchive(cdir)
    cool_rows(a, [rec(i) for i in range(10)], list(range(10)))
    path = os.path.join(cdir, a.files()[0])
    tamper(path, 3, "message number 3!")
    # the sidecar no longer matches the file: rebuild verifies every digest
    with pytest.raises(CorruptStateCheckpointError) as ei:
        CoolArchive.open(cdir, a.files())
    assert ei.value.path == path and ei.value.offset == 3


def test_digest_mismatch_on_reads(cdir):
    a = CoolArchive(cdir)
    cool_rows(a, [rec(i) for i in range(10)], list(range(10)))
    name = a.files()[0]
    path = os.path.join(cdir, name)
    tamper(path, 3, "message number 3!")
    # open trusting a sidecar that vouches for the tampered file (attacker or bug)
    from rune_fast.cool import _FileIndex, _footer_hash
    ipath = os.path.join(index_dir_for(cdir), "cool-00000001.idx")
    with open(ipath, "rb") as f:
        fi = _FileIndex.decode(f.read(), 1, ipath)
    fi.size, fi.footer = _footer_hash(path)
    fi.pagedir = page_directories(path, pq.read_metadata(path))    # (vouching for its pages too)
    with open(ipath, "wb") as f:
        f.write(fi.encode())
    b = CoolArchive.open(cdir, [name])
    assert b.get("msg_00000002")["content"] == "message number 2"
    for call in (lambda: b.get("msg_00000003"), lambda: b.channel_rows("ch"),
                 lambda: b.search("number 3"), lambda: b.channel_tail("ch", 8),
                 lambda: b.contains("msg_00000003", verify=True)):
        with pytest.raises(CorruptStateCheckpointError) as ei:
            call()
        assert ei.value.path == path and ei.value.offset == 3
    # the append path's duplicate check reads the stored id only: it is intact
    assert b.contains("msg_00000003") and not b.contains("msg_00000099")
    problems = b.verify()
    assert [(p.file, p.row) for p in problems] == [(name, 3)]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip", "empty"])
def test_unreadable_parquet_is_loud(cdir, damage):
    a = CoolArchive(cdir)
    cool_rows(a, [rec(i, content="x" * 50 + str(i)) for i in range(200)], list(range(200)))
    name = a.files()[0]
    path = os.path.join(cdir, name)
    data = bytearray(read_bytes(path))
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = bytearray(b"not parquet at all" * 10)
    elif damage == "empty":
        data = bytearray()
    else:                                # inside the content column's data page
        cc = pq.ParquetFile(path).metadata.row_group(0).column(4)
        assert cc.path_in_schema == "content"
        data[cc.data_page_offset + cc.total_compressed_size * 2 // 3] ^= 0x40
    with open(path, "wb") as f:
        f.write(data)
    if damage == "flip":
        b = CoolArchive.open(cdir, [name])   # footer intact: sidecar still vouches
        with pytest.raises(CorruptStateCheckpointError) as ei:
            for r in range(200):
                b.get(f"msg_{r:08d}")
        assert ei.value.path == path
        assert b.verify() and all(p.file == name for p in b.verify())
    else:
        with pytest.raises(CorruptStateCheckpointError) as ei:
            CoolArchive.open(cdir, [name])
        assert ei.value.path == path
        assert name in str(ei.value)


def test_missing_file_is_loud(cdir):
    with pytest.raises(CorruptStateCheckpointError, match="missing"):
        CoolArchive(cdir, ["cool-00000007.parquet"])


def _opened_sidecars(monkeypatch):
    """Count the sidecars a CoolArchive reads (through _FileIndex.decode)."""
    from rune_fast import cool
    seen = []
    real = cool._FileIndex.decode.__func__

    def decode(cls, data, no, path):
        seen.append(no)
        return real(cls, data, no, path)
    monkeypatch.setattr(cool._FileIndex, "decode", classmethod(decode))
    return seen


def test_writer_open_reads_sidecars_at_first_need(cdir, monkeypatch):
    """A writable open checks every file's footer and that its sidecar names
    it, and reads the sidecars (digest, arrays) at the first call that needs
    the index: then all of them, and every query sees every file."""
    a, rows = make_archive(cdir)
    seen = _opened_sidecars(monkeypatch)
    b = CoolArchive.open(cdir, a.files())
    assert seen == [] and b.files() == a.files() and b.has_files()
    assert b.channels() == ["ch0", "ch1", "ch2", "ch3"]
    assert sorted(seen) == [1, 2, 3]
    assert len(b) == 300 and b.get("msg_00000007") == rows[7]
    assert [r.record for r in task_records(b, "t1")] == [r for r in rows if r["task_id"] == "t1"]
    for first in ("contains", "get", "task_len", "stats", "search", "channel_len"):
        c = CoolArchive.open(cdir, a.files())
        out = {"contains": lambda: c.contains("msg_00000299"), "get": lambda: c.get("msg_00000299"),
               "task_len": lambda: c.task_len("t4"), "stats": lambda: c.stats()["rows"],
               "search": lambda: len(c.search("number 29")), "channel_len": lambda: c.channel_len("ch3")}[first]()
        want = {"contains": True, "get": rows[299], "task_len": sum(r["task_id"] == "t4" for r in rows),
                "stats": 300, "search": 11, "channel_len": 75}[first]
        assert out == want, first
    # a read-only archive reads them all at open (a writer may merge files away under it)
    seen.clear()
    CoolArchive.open(cdir, a.files(), read_only=True)
    assert sorted(seen) == [1, 2, 3]


def test_first_reads_from_many_threads_see_every_file(cdir):
    import threading
    a, rows = make_archive(cdir, 400, 4)
    b = CoolArchive.open(cdir, a.files())
    got, errors = [], []

    def read(i):
        try:
            got.append((i, b.get(f"msg_{i:08d}"), b.channel_len(f"ch{i % 4}")))
        except BaseException as exc:    # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=read, args=(i * 37 % 400,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(got, key=lambda g: g[0]) == sorted(((i, rows[i], 100) for i, _r, _n in got),
                                                     key=lambda g: g[0])


def test_damage_found_by_a_lazy_sidecar_read_is_loud(cdir):
    """A sidecar that names its file but fails its digest is rebuilt at the
    first need, from the file, verified: a file damaged too raises then."""
    a, rows = make_archive(cdir, 90, 1)
    ipath = os.path.join(index_dir_for(cdir), "cool-00000001.idx")
    data = bytearray(read_bytes(ipath))
    data[len(data) - 3] ^= 1        # in the arrays: the header still names the file
    with open(ipath, "wb") as f:
        f.write(data)
    b = CoolArchive.open(cdir, a.files())
    assert b.rebuilt_sidecars == ["cool-00000001.idx"]
    assert [r.record for r in b.channel_rows("ch1")] == [r for r in rows if r["channel_id"] == "ch1"]
    with open(ipath, "wb") as f:
        f.write(data)
    path = os.path.join(cdir, a.files()[0])
    raw = bytearray(read_bytes(path))
    # a data page of the file: the middle of the first content page's data
    # (a fixed fraction of the file may land in a page header's stop byte,
    # which no reader needs: 1/3 did once ts, token_estimate and ord were
    # stored uncompressed)
    start = pq.read_metadata(path).row_group(0).column(COOL_SCHEMA.names.index("content")).data_page_offset
    hlen, _t, _u, csize = page_header(bytes(raw), start)[:4]
    raw[start + hlen + csize // 2] ^= 0x40
    with open(path, "wb") as f:
        f.write(raw)
    c = CoolArchive.open(cdir, a.files())
    with pytest.raises(CorruptStateCheckpointError) as ei:
        c.channels()
    assert ei.value.path == path


@pytest.mark.parametrize("damage", ["delete", "flip", "truncate", "garbage"])
def test_sidecar_damage_rebuilt(cdir, damage, caplog):
    a, rows = make_archive(cdir, 90, 1)
    ipath = os.path.join(index_dir_for(cdir), "cool-00000001.idx")
    good = read_bytes(ipath)
    if damage == "delete":
        os.unlink(ipath)
    else:
        data = bytearray(good)
        if damage == "flip":
            data[len(data) // 2] ^= 1
        elif damage == "truncate":
            data = data[:40]
        else:
            data = bytearray(b"\x00" * 64)
        with open(ipath, "wb") as f:
            f.write(data)
    with caplog.at_level("WARNING", logger="rune_fast.cool"):
        b = CoolArchive.open(cdir, a.files())
        assert b.rebuilt_sidecars == ["cool-00000001.idx"]
    why = "missing" if damage == "delete" else "damaged"
    said = [r.getMessage() for r in caplog.records if "rebuilt from" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"cool index {ipath} is {why}")   # (not silent)
    assert read_bytes(ipath) == good
    assert [r.record for r in b.channel_rows("ch1")] == [r for r in rows if r["channel_id"] == "ch1"]
    assert b.verify() == []
    # read-only opens rebuild in memory and leave files alone
    os.unlink(ipath)
    c = CoolArchive.open(cdir, a.files(), read_only=True)
    assert c.rebuilt_sidecars and not os.path.exists(ipath)
    assert [p.problem for p in c.verify()] == ["sidecar missing"]


def test_sidecar_tasks_are_parsed_at_the_first_task_query(cdir):
    """An open reads each sidecar's header and maps its arrays; the task
    section waits for a task query (also across erasure before it)."""
    a, rows = make_archive(cdir, 300, 3)
    b = CoolArchive.open(cdir, a.files())
    assert b._tasks is None and all(fi._tasks is None for fi in b._files.values())
    assert [r.record for r in b.channel_rows("ch1")] == [r for r in rows if r["channel_id"] == "ch1"]
    assert b._tasks is None
    victim = next(r for r in rows if r["task_id"])
    b.erase([victim["msg_id"]])                      # drops and adds files, tasks still unparsed
    assert b._tasks is None
    want = [r["msg_id"] for r in rows if r["task_id"] == victim["task_id"] and r is not victim]
    assert sorted(x.record["msg_id"] for x in task_records(b, victim["task_id"])) == sorted(want)
    assert b.task_len(victim["task_id"]) == len(want)
    assert b._tasks is not None


def test_sidecar_of_the_previous_version_still_reads(cdir):
    """Version 1 sidecars (task names inside the JSON header) are read as they are."""
    import json
    import struct

    import numpy as np
    import xxhash

    from rune_fast.cool import _IDX_MAGIC

    a, rows = make_archive(cdir, 120, 1)
    ipath = os.path.join(index_dir_for(cdir), "cool-00000001.idx")
    fi = a._files[1]
    names = list(fi.tasks)
    offs = np.cumsum([0] + [len(fi.tasks[t]) for t in names]).tolist()
    header = {"format": "rune_fast.cool.idx", "version": 1, "file": fi.name, "file_size": fi.size,
              "footer_xxh3_64": fi.footer, "rows": fi.rows, "row_group_starts": [int(x) for x in fi.rg_starts],
              "channels": [[c, s, e, lt] for c, (s, e, lt) in fi.channels.items()],
              "tasks": [[t, offs[i], offs[i + 1]] for i, t in enumerate(names)]}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-(len(hb) + 4) % 8)
    hs, hr = a._file_entries(1)
    task_rows = np.concatenate([fi.tasks[t] for t in names]).astype("<u4") if names else np.zeros(0, "<u4")
    body = b"".join([struct.pack("<I", len(hb)), hb, hs.astype("<u8").tobytes(), hr.astype("<u4").tobytes(),
                     b"\0" * (4 if fi.rows % 2 else 0), task_rows.tobytes()])
    with open(ipath, "wb") as f:
        f.write(_IDX_MAGIC + xxhash.xxh3_128_digest(body) + body)
    b = CoolArchive.open(cdir, a.files())
    assert b.rebuilt_sidecars == []
    for t in {r["task_id"] for r in rows if r["task_id"]}:
        assert sorted(x.record["msg_id"] for x in task_records(b, t)) == \
            sorted(r["msg_id"] for r in rows if r["task_id"] == t)
    assert all(b.get(r["msg_id"]) == r for r in rows)


def test_sidecar_task_section_that_does_not_parse_is_loud(cdir):
    """A sidecar whose digest checks but whose task section is inconsistent
    (only a bug could write one) is named at the first task query."""
    a, _rows = make_archive(cdir, 60, 1)
    fi = a._files[1]
    b = CoolArchive.open(cdir, a.files())
    b._files[1]._tasks, b._files[1]._task_src, b._tasks = None, (b'[["t",0,99999]]', fi.hrows[:0]), None
    with pytest.raises(CorruptStateCheckpointError) as e:
        task_records(b, "t")
    assert "cool-00000001.idx" in str(e.value)


# ----------------------------------------------------------------- erasure

def test_erase_leaves_no_bytes(cdir):
    a = CoolArchive(cdir)
    secret = "SECRET-ÄÖÜ-payload-" + "q" * 40
    rows = [rec(i, f"c{i % 3}", content=(secret + str(i)) if i in (4, 17) else f"keep {i} " * 8)
            for i in range(60)]
    cool_rows(a, sorted(rows[:30], key=lambda r: r["channel_id"]), list(range(30)))
    cool_rows(a, sorted(rows[30:], key=lambda r: r["channel_id"]), list(range(30, 60)))
    untouched = a.files()[1]
    ch = a.erase(["msg_00000004", "msg_00000017", "nope"])
    assert ch.rows_removed == 2 and ch.not_found == ["nope"]
    assert ch.replaced == {"cool-00000001.parquet": "cool-00000003.parquet"}
    assert untouched in ch.files and ch.removed == ["cool-00000001.parquet"]
    # before unlink the old file still exists (the manifest may still point at it)
    assert os.path.exists(os.path.join(cdir, "cool-00000001.parquet"))
    a.unlink_files(ch.removed)
    needle = secret.encode("utf-8")
    for name, data in all_bytes(cdir):
        assert needle not in data, name
        assert b"msg_00000004" not in data, name
    assert a.get("msg_00000004") is None and len(a) == 58
    assert a.search("SECRET") == []
    assert {r.record["msg_id"] for r in all_rows(a)} == {r["msg_id"] for r in rows} - {
        "msg_00000004", "msg_00000017"}
    b = CoolArchive.open(cdir, ch.files)
    assert len(b) == 58 and b.verify() == []
    with pytest.raises(ValueError, match="live"):
        b.unlink_files(ch.files[:1])


def test_erase_whole_file_and_crash_sets(cdir):
    a = CoolArchive(cdir)
    cool_rows(a, [rec(1), rec(2)], [1, 2])
    old = a.files()
    ch = a.erase(["msg_00000001", "msg_00000002"])
    assert ch.replaced == {old[0]: None} and ch.files == [] and len(a) == 0
    # crash before the manifest moved: the old set is still whole and readable
    b = CoolArchive.open(cdir, old)
    assert len(b) == 2 and b.verify() == []
    # crash after it moved: the new set opens, gc removes the old remnants
    c = CoolArchive.open(cdir, ch.files)
    assert c.gc() == ["cool-00000001.grams", "cool-00000001.idx", "cool-00000001.parquet"]
    assert os.listdir(cdir) == [] and os.listdir(index_dir_for(cdir)) == []


def test_gc_removes_strays_and_temps(cdir):
    a = CoolArchive(cdir)
    cool_rows(a, [rec(1)], [1])
    run = cool_rows(a, [rec(2)], [2])                       # never reached the manifest
    for n in (".cool-00000009.parquet.tmp", "unrelated.txt"):
        open(os.path.join(cdir, n), "wb").close()
    b = CoolArchive.open(cdir, ["cool-00000001.parquet"])
    assert cool_rows(b, [rec(3)], [3]).file == "cool-00000010.parquet"  # never reuses a stray's name
    assert run.file not in b.files()
    assert set(b.gc()) == {".cool-00000009.parquet.tmp", "cool-00000002.grams", "cool-00000002.idx",
                          "cool-00000002.parquet"}
    assert sorted(os.listdir(cdir)) == ["cool-00000001.parquet", "cool-00000010.parquet", "unrelated.txt"]
    assert _sidecars(cdir) == ["cool-00000001.idx", "cool-00000010.idx"]


# ----------------------------------------------------------------- merge

def test_merge_keeps_every_row(cdir):
    a = CoolArchive(cdir, row_group_rows=64)
    rows = []
    for k in range(9):
        part = [rec(k * 40 + j, f"c{j % 3}", task=f"t{j % 4}",
                    hlc="" if j % 2 else f"{k * 40 + j:015d}-0000000000-dev") for j in range(40)]
        part.sort(key=lambda r: (r["channel_id"], r["hlc"] != "", r["hlc"]))
        cool_rows(a, part, [int(r["msg_id"][4:]) for r in part])
        rows += part
    before = {ch: [r.record for r in a.channel_rows(ch)] for ch in a.channels()}
    plan = a.plan_merge(fanout=4)
    assert plan == [a.files()]                   # 9 small files: one tier
    ch = a.merge(plan)
    assert len(ch.files) == 1 and len(ch.removed) == 9 and ch.rows_rewritten == 360
    a.unlink_files(ch.removed)
    assert {ch_: [r.record for r in a.channel_rows(ch_)] for ch_ in a.channels()} == before
    assert len(a) == 360 and a.verify() == []
    for r in rows[::17]:
        assert a.get(r["msg_id"]) == r
    b = CoolArchive.open(cdir, ch.files)
    assert {ch_: [r.record for r in b.channel_rows(ch_)] for ch_ in b.channels()} == before
    assert sorted(os.listdir(cdir)) == sorted(ch.files)
    assert _sidecars(cdir) == sorted(f[:-8] + ".idx" for f in ch.files)


def test_plan_merge_tiers_and_max_files(cdir):
    a = CoolArchive(cdir)
    for k in range(3):
        cool_rows(a, [rec(k * 10 + j) for j in range(10)], list(range(10)))
    assert a.plan_merge(fanout=4) == []
    assert a.plan_merge(fanout=4, max_files=2) in ([a.files()[:2]], [a.files()])
    assert len(a.merge(max_files=1).files) == 1
    assert a.merge().replaced == {}


@pytest.mark.parametrize("per", [1, 7, 64, 1000])
def test_merge_is_logarithmic(per):
    """Simulated: size-tiered merging rewrites each row O(log n) times and
    keeps O(log n) files."""
    import math
    from rune_fast.cool import plan_merge
    sizes: dict[str, int] = {}
    written, n_runs = 0, 3000
    for k in range(n_runs):
        sizes[f"f{k}"] = per
        while True:
            plan = plan_merge(sizes, fanout=4)
            if not plan:
                break
            for g in plan:
                merged = sum(sizes.pop(n) for n in g)
                written += merged
                sizes["m" + g[0] + str(k)] = merged
    total = n_runs * per
    assert sum(sizes.values()) == total
    assert written <= total * (math.log(n_runs, 4) + 1)
    assert len(sizes) <= 3 * (math.log(n_runs, 4) + 1)


# ----------------------------------------------------------------- other readers

def test_readable_by_pyarrow_as_is(cdir):
    a, rows = make_archive(cdir, 30, 1)
    path = os.path.join(cdir, a.files()[0])
    t = pq.read_table(path)
    assert t.schema.field("content").type == pa.string()
    assert t.schema.field("ts").type == pa.float64()
    assert t.schema.field("ord").type == pa.int64()
    assert t.schema.field("schema_version").type == pa.int32()
    md = pq.ParquetFile(path).metadata
    assert md.row_group(0).column(0).compression == "ZSTD"
    by_id = {r["msg_id"]: r for r in rows}
    for d in t.to_pylist():
        r = by_id[d["msg_id"]]
        assert d["content"] == r["content"] and d["digest"] == record_digest(r)
    assert t.column("channel_id").to_pylist() == sorted(t.column("channel_id").to_pylist())


def test_readable_by_duckdb(cdir):
    duckdb = pytest.importorskip("duckdb")
    a, rows = make_archive(cdir, 30, 1)
    path = os.path.join(cdir, a.files()[0])
    con = duckdb.connect()
    n = con.execute(f"select count(*) from read_parquet('{path}') where content like 'message%'").fetchall()
    assert n[0][0] == 30
    cols = {r[0]: r[1] for r in con.execute(f"describe select * from read_parquet('{path}')").fetchall()}
    assert cols["content"] == "VARCHAR" and cols["digest"] == "VARCHAR"
    con.close()


def test_readable_by_polars(cdir):
    pl = pytest.importorskip("polars")
    a, rows = make_archive(cdir, 30, 1)
    df = pl.read_parquet(os.path.join(cdir, a.files()[0]))
    assert df.height == 30 and df.schema["content"] == pl.String


def test_concurrent_reads(cdir):
    import threading
    a, rows = make_archive(cdir, 300, 3)
    errors = []

    def worker(k):
        try:
            for r in rows[k::7]:
                assert a.get(r["msg_id"]) == r
            assert len(a.search("number 1")) == len([r for r in rows if "number 1" in r["content"]])
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(7)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


# ----------------------------------------------------------------- golden fixture

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "cool_v1")


def test_golden_fixture_still_reads(tmp_path):
    """A committed archive (Parquet + sidecar, format cool/1) reads unchanged,
    its sidecar is trusted as is, and today's writer indexes it identically."""
    import json
    import shutil
    d = str(tmp_path / "cool")
    shutil.copytree(FIXTURE, d)
    with open(os.path.join(d, "rows.json"), encoding="utf-8") as f:
        want = json.load(f)
    os.unlink(os.path.join(d, "rows.json"))
    a = CoolArchive.open(d, ["cool-00000001.parquet"], read_only=True)
    assert a.rebuilt_sidecars == [] and a.verify() == []
    for r, o in zip(want["rows"], want["ords"]):
        row = a.get_row(r["msg_id"])
        assert row.record == r and row.ord == o
    schema = pq.read_schema(os.path.join(d, "cool-00000001.parquet"))
    assert schema.remove_metadata() == COOL_SCHEMA.remove_metadata()
    assert schema.metadata[b"rune_fast.format"] == b"cool/1"
    assert a.latest_task("general") == "task_01HZY00000000000000000T1"
    assert [h.record["msg_id"][-2:] for h in a.search("kelvin")] == ["B1"]
    # the sidecar format: rebuilding from the Parquet file gives the same index
    from rune_fast.cool import _FileIndex, _footer_hash
    ipath = os.path.join(d, "cool-00000001.idx")
    disk = _FileIndex.decode(read_bytes(ipath), 1, ipath)
    b = CoolArchive(str(tmp_path / "fresh"))
    cool_rows(b, want["rows"], want["ords"])
    fresh_path = os.path.join(index_dir_for(str(tmp_path / "fresh")), "cool-00000001.idx")
    fresh = _FileIndex.decode(read_bytes(fresh_path), 1, fresh_path)
    assert (disk.channels, disk.rows, disk.hashes.tolist(), disk.hrows.tolist()) == (
        fresh.channels, fresh.rows, fresh.hashes.tolist(), fresh.hrows.tolist())
    assert {t: v.tolist() for t, v in disk.tasks.items()} == {t: v.tolist() for t, v in fresh.tasks.items()}
    assert (disk.size, disk.footer) == _footer_hash(os.path.join(d, "cool-00000001.parquet"))


# ----------------------------------------------------------------- failures half-way

@pytest.mark.parametrize("op,fail_at", [("erase", k) for k in range(6)] + [("merge", k) for k in range(2)])
def test_failure_half_way_keeps_old_set(cdir, monkeypatch, op, fail_at):
    """A change that dies at any write leaves the old set serving, readable
    after reopen, and gc leaves exactly the old files."""
    a = CoolArchive(cdir)
    for k in range(3):
        cool_rows(a, [rec(k * 10 + j, f"c{j % 2}") for j in range(10)], list(range(10)))
    old = a.files()
    before = sorted(r.record["msg_id"] for r in all_rows(a))
    real = os.replace
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) > fail_at:
            raise OSError(28, "No space left on device (injected)")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError, match="injected"):
        if op == "erase":
            a.erase(["msg_00000001", "msg_00000011", "msg_00000021"])
        else:
            a.merge([old])
    monkeypatch.setattr(os, "replace", real)
    assert a.files() == old
    assert sorted(r.record["msg_id"] for r in all_rows(a)) == before
    b = CoolArchive.open(cdir, old)
    b.gc()
    assert sorted(os.listdir(cdir)) == sorted(old)
    assert _sidecars(cdir) == sorted(n[:-8] + ".idx" for n in old)
    assert b.verify() == [] and len(b) == 30


def test_erase_of_unreadable_file_changes_nothing(cdir):
    a = CoolArchive(cdir)
    cool_rows(a, [rec(1, "a")], [1])
    cool_rows(a, [rec(2, "b")], [2])
    old = a.files()
    with open(os.path.join(cdir, old[1]), "r+b") as f:
        f.truncate(20)
    with pytest.raises(CorruptStateCheckpointError) as ei:
        a.erase(["msg_00000001", "msg_00000002"])
    assert ei.value.path == os.path.join(cdir, old[1])
    assert a.files() == old and a.get("msg_00000001") == rec(1, "a")
    assert sorted(os.listdir(cdir)) == sorted(old)
    assert _sidecars(cdir) == sorted(n[:-8] + ".idx" for n in old)


def test_foreign_parquet_is_loud(cdir):
    """A Parquet file with the right name but another schema is refused."""
    os.makedirs(cdir)
    path = os.path.join(cdir, "cool-00000001.parquet")
    pq.write_table(pa.table({"msg_id": ["a"], "content": [1]}), path)
    with pytest.raises(CorruptStateCheckpointError, match="columns") as ei:
        CoolArchive(cdir, ["cool-00000001.parquet"])
    assert ei.value.path == path


# ------------------------------------------------- vectorized index building

def _reference_index(msg_ids, channel_ids, task_ids):
    """The per-row loop _build_index replaced (the plain-Python model)."""
    import numpy as np
    from rune_fast.cool import _id_hash
    n = len(msg_ids)
    hashes = np.array([_id_hash(m) for m in msg_ids], dtype=np.uint64)
    channels, tasks, start = {}, {}, 0
    for i in range(n + 1):
        if i == n or (i > start and channel_ids[i] != channel_ids[start]):
            if i > start:
                ch = channel_ids[start]
                if ch in channels:
                    return ("not contiguous", start)
                latest = next((j for j in range(i - 1, start - 1, -1) if task_ids[j] != ""), -1)
                channels[ch] = (start, i, latest)
            start = i
        if i < n and task_ids[i] != "":
            tasks.setdefault(task_ids[i], []).append(i)
    return hashes, channels, tasks


names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(names, st.sampled_from(["", "t1", "t2", "é", "t1\x00"]) | names), max_size=40),
       st.booleans())
def test_build_index_is_the_per_row_loop(rows, grouped):
    import numpy as np
    from rune_fast.cool import _build_index
    if grouped:
        rows = sorted(rows, key=lambda r: r[0])
    chs = [c or "c" for c, _t in rows]
    tids = [t for _c, t in rows]
    mids = [f"m{i}-{c}" for i, c in enumerate(chs)]
    want = _reference_index(mids, chs, tids)
    for form in (list, lambda xs: pa.chunked_array([pa.array(xs[:3], pa.string()), pa.array(xs[3:], pa.string())])):
        if isinstance(want[0], str):
            with pytest.raises(CorruptStateCheckpointError, match="not contiguous") as exc:
                _build_index(1, 0, "", form(mids), form(chs), form(tids), [len(rows)], "p")
            assert exc.value.offset == want[1]
            continue
        fi = _build_index(1, 0, "", form(mids), form(chs), form(tids), [len(rows)], "p")
        hashes, channels, tasks = want
        order = np.argsort(hashes, kind="stable")
        assert np.array_equal(fi.hashes, hashes[order]) and np.array_equal(fi.hrows, order)
        assert fi.channels == channels and list(fi.channels) == list(channels)
        assert {t: r.tolist() for t, r in fi.tasks.items()} == tasks and list(fi.tasks) == list(tasks)


def test_id_hashes_and_has_many():
    import numpy as np
    from rune_fast._index import HashIndex
    from rune_fast.cool import _id_hash, _id_hashes
    ids = ["", "a", "msg_01ABC", "é€😀", "x" * 1000]
    want = [_id_hash(m) for m in ids]
    assert _id_hashes(ids).tolist() == want
    assert _id_hashes(pa.array(ids).slice(1, 3)).tolist() == want[1:4]
    assert _id_hashes([]).tolist() == []
    hi = HashIndex()
    assert hi.has_many(np.array(want, dtype=np.uint64)).tolist() == [False] * 5
    hi.insert(want[1], 7)
    hi.insert(want[3], 9)
    assert hi.has_many(np.array(want, dtype=np.uint64)).tolist() == [False, True, False, True, False]


def test_contains_many_matches_contains(tmp_path):
    arch = CoolArchive(str(tmp_path / "c"))
    rows = [rec(i, ch=f"c{i % 3}") for i in range(50)]
    cool_rows(arch, rows[:30], list(range(30)))
    cool_rows(arch, rows[30:], list(range(30, 50)))
    probe = [r["msg_id"] for r in rows[::3]] + ["nope", "msg-x", rows[4]["msg_id"] + "!"]
    assert arch.contains_many(probe).tolist() == [arch.contains(m) for m in probe]
    assert arch.contains_many(probe).tolist() == [True] * 17 + [False] * 3
    again = CoolArchive.open(str(tmp_path / "c"), arch.files())   # the sidecars' runs, mapped
    assert again.contains_many(probe).tolist() == [True] * 17 + [False] * 3
    # an Arrow column (a cooling run's part) answers as its strs do, inside
    # and outside the archive's span of ids, chunked or sliced
    for ids in (probe, ["\x00", "~~~"], ["\xe9", rows[7]["msg_id"], "zz\U0001f600"], [rows[49]["msg_id"]]):
        want = arch.contains_many(ids).tolist()
        assert arch.contains_many(pa.array(ids)).tolist() == want
        assert arch.contains_many(pa.chunked_array([ids[:1], ids[1:]], pa.string())).tolist() == want
        assert arch.contains_many(pa.array(["x"] + ids).slice(1)).tolist() == want
    assert arch.contains_many(pa.array([], pa.string())).tolist() == []


def test_files_cooled_after_an_open_join_the_id_index_at_once(tmp_path):
    arch = CoolArchive(str(tmp_path / "c"))
    rows = [rec(i, ch=f"c{i % 3}") for i in range(60)]
    cool_rows(arch, rows[:20], list(range(20)))
    again = CoolArchive.open(str(tmp_path / "c"), arch.files())
    assert again.contains_many([rows[0]["msg_id"]]).tolist() == [True]
    assert again._ids.files == 1 and len(again._ids) == 20
    cool_rows(again, rows[20:40], list(range(20, 40)))
    assert again._ids.files == 2 and len(again._ids) == 40     # joined the index when it became live
    assert all(again.contains(r["msg_id"]) for r in rows[:40])
    assert not any(again.contains(r["msg_id"]) for r in rows[40:])
    # a merge's new file joins it too, and the merged-away files leave it
    cool_rows(again, rows[40:], list(range(40, 60)))
    change = again.merge([again.files()])
    again.unlink_files(change.removed)
    assert again._ids.files == 1 and len(again._ids) == 60 and len(again.files()) == 1
    assert all(again.contains(r["msg_id"]) for r in rows)
    assert again.contains_many([r["msg_id"] for r in rows] + ["nope"]).tolist() == [True] * 60 + [False]


def test_the_archive_folder_reads_whole_as_a_parquet_dataset(tmp_path):
    """The sidecars live beside the folder: a reader given the folder (a
    dataset) or ``*`` in it finds Parquet files only."""
    from rune_fast.conversation_state import ConversationStateRepository
    from rune_fast.records import ConversationMessageRecord
    state = tmp_path / "s"
    msgs = [ConversationMessageRecord(msg_id=f"m{i:03d}", role="user", content=f"text {i}",
                                      channel_id=f"c{i % 2}", ts=1_700_000_000.0 + i) for i in range(40)]
    with ConversationStateRepository(state, hot_window=3) as repo:
        repo.append_many(msgs[:20])
        repo.compact()
        repo.append_many(msgs[20:])
        repo.compact()
        cool = repo.stats()["cool"]
    cool_dir = state / "hot" / "conversation_cool"
    assert cool >= 30 and all(n.endswith(".parquet") for n in os.listdir(cool_dir))
    table = pq.read_table(str(cool_dir))
    assert table.num_rows == cool
    assert table.schema.field("content").type == pa.string() and "digest" in table.schema.names
    ids = table.column("msg_id").to_pylist()
    assert len(set(ids)) == cool and set(ids) <= {m.msg_id for m in msgs}


def test_a_store_with_sidecars_in_the_archive_folder_moves_them_out(cdir):
    """Stores written before the index folder kept each sidecar beside its
    Parquet file: a viewer reads them there, changing nothing; a writer's
    open moves them out (trusted as they are, nothing rebuilt) and removes
    a stray one."""
    import shutil
    a, rows = make_archive(cdir, 90, 2)
    idir = index_dir_for(cdir)
    names = _sidecars(cdir)
    for n in os.listdir(idir):
        if n.endswith(".grams"):        # (written beside the sidecars since; a cache)
            os.remove(os.path.join(idir, n))
    for n in names:
        shutil.move(os.path.join(idir, n), os.path.join(cdir, n))
    open(os.path.join(cdir, "cool-00000077.idx"), "wb").close()      # a stray of a crash
    before = sorted(os.listdir(cdir))
    v = CoolArchive.open(cdir, a.files(), read_only=True)
    assert v.rebuilt_sidecars == [] and v.verify() == []
    assert [r.record for r in v.channel_rows("ch1")] == [r for r in rows if r["channel_id"] == "ch1"]
    assert sorted(os.listdir(cdir)) == before and os.listdir(idir) == []
    assert [n for _d, n in v._stray_files()] == ["cool-00000077.idx"]   # a live file's sidecar: no stray
    b = CoolArchive.open(cdir, a.files())
    assert b.rebuilt_sidecars == [] and _sidecars(cdir) == names
    b.gc()
    assert sorted(os.listdir(cdir)) == sorted(a.files())
    assert b.verify() == [] and all(b.get(r["msg_id"]) == r for r in rows)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=8), min_size=1, max_size=4))
def test_verify_names_every_repeated_id_and_where_it_first_was(tmp_path_factory, files):
    """An id held by more than one row (of one file or of several) is a
    problem at each row after the first (files in the order checked, then
    rows), naming that first row; the plain model: a dict of the ids seen."""
    d = str(tmp_path_factory.mktemp("c") / "cool")
    a = CoolArchive(d, durable=False)
    for k, ids in enumerate(files):
        rows = [rec(i, ch=f"ch{k}") for i in ids]
        # (written and served past cool_table's refusal of a repeated or archived id)
        a.adopt(a._write_file(_table_from_records(rows, list(range(len(rows))), [record_digest(r) for r in rows]),
                              durable=False))
    seen: dict[str, tuple[str, int]] = {}
    want = []
    for name in a.files():
        for row, mid in enumerate(pq.read_table(os.path.join(d, name), columns=["msg_id"])
                                  .column("msg_id").to_pylist()):
            if mid in seen:
                want.append((name, row, f"msg_id {mid!r} also in {seen[mid][0]} row {seen[mid][1]}"))
            else:
                seen[mid] = (name, row)
    got = [(p.file, p.row, p.problem) for p in a.verify()]
    assert sorted(got) == sorted(want)
