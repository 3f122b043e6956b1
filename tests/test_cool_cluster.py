"""Cool files keep each channel's rows clustered by task (docs/FORMAT.md,
"Order within a channel"): a task's rows of one file lie together and share
their pages. Files of the older layout (a channel's rows in key order, its
tasks interleaved) are read as before. Every read that depends on the order
inside a file — a channel's rows, its tail (rows and locations), its newest
task, a merge — gives the order-key answer over any mix of the two layouts
(hypothesis, against a model)."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings, strategies as st

from rune_fast._order import order_key
from rune_fast.cool import writer
from rune_fast.cool import CoolArchive, _table_from_records, record_digest
from rune_fast.cool.schema import _row_key

from test_cool import rec

CHANNELS = ("b", "a", "ß")
TASKS = ("", "t1", "t0", "tz", "é")


def _key(r: dict) -> tuple:
    return order_key(r["hlc"], r["msg_id"], r["ord"])


def _table(rows: list[dict]) -> pa.Table:
    return _table_from_records([{k: v for k, v in r.items() if k != "ord"} for r in rows],
                               [r["ord"] for r in rows],
                               [record_digest({k: v for k, v in r.items() if k != "ord"}) for r in rows])


def _write(a: CoolArchive, rows: list[dict], layout: str) -> None:
    """One file of ``rows``: clustered by ``cool_table`` ("table"), as parts
    clustered ("parts") or as parts in key order (the older layout: "old")."""
    by_key = sorted(rows, key=lambda r: (r["channel_id"], _key(r)))
    if layout == "table":
        a.cool_table(_table(by_key))
        return
    if layout == "parts":
        by_key = sorted(by_key, key=lambda r: (r["channel_id"], r["task_id"]))     # (stable)
    t = _table(by_key)
    a.cool_parts([t.slice(i, 7) for i in range(0, t.num_rows, 7)])


records = st.lists(st.tuples(st.sampled_from(CHANNELS), st.sampled_from(TASKS), st.booleans()),
                   min_size=1, max_size=120)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=records, layouts=st.lists(st.sampled_from(["table", "parts", "old"]), min_size=1, max_size=4),
       merge=st.booleans(), ns=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       chunk=st.sampled_from([3, 8192]))
def test_reads_in_key_order_over_any_layout(tmp_path_factory, monkeypatch, spec, layouts, merge, ns, chunk):
    # (chunk: a merge takes a channel of more rows than this in chunks of
    # it, over sources of either layout)
    monkeypatch.setattr(writer, "MERGE_CHUNK_ROWS", chunk)
    cdir = str(tmp_path_factory.mktemp("cl") / "hot" / "conversation_cool")
    rows = []
    for i, (ch, task, stamped) in enumerate(spec):
        r = rec(i, ch, task=task, hlc=f"{(i * 7919) % 1000:04d}-0001" if stamped else "")
        r["ord"] = i
        rows.append(r)
    a = CoolArchive(cdir)
    per = -(-len(rows) // len(layouts))
    for k, layout in enumerate(layouts):
        part = rows[k * per:(k + 1) * per]
        if part:
            _write(a, part, layout)
    if merge and len(a.files()) > 1:
        a.merge([a.files()])
    for ch in CHANNELS:
        want = sorted((r for r in rows if r["channel_id"] == ch), key=_key)
        plain = [{k: v for k, v in r.items() if k != "ord"} for r in want]
        assert [g.record for g in a.channel_rows(ch)] == plain
        for n in ns:
            assert [g.record for g in a.channel_tail(ch, n)] == plain[-n:]
            got = a.rows_at(a.channel_tail_locs(ch, n))
            assert [g.record for g in got] == plain[-n:]
        tasks = [r["task_id"] for r in want if r["task_id"]]
        assert a.latest_task(ch) == (tasks[-1] if tasks else None)
    for t in TASKS[1:]:
        got = sorted(a.rows_at(a.task_locs(t)), key=_row_key)
        assert [g.record["msg_id"] for g in got] == \
            [r["msg_id"] for r in sorted((r for r in rows if r["task_id"] == t), key=_key)]
    a.close()


def test_a_file_keeps_each_task_of_a_channel_together(tmp_path):
    """cool_table and a merge write a channel's rows task by task (no task
    first, tasks in code point order), each task's rows in key order; a
    merge reorders a file of the older layout so."""
    cdir = str(tmp_path / "hot" / "conversation_cool")
    rows = [rec(i, CHANNELS[i % 3], task=TASKS[(i // 2) % 5]) for i in range(90)]
    for i, r in enumerate(rows):
        r["ord"] = i
    a = CoolArchive(cdir)
    _write(a, rows[:45], "table")
    _write(a, rows[45:], "old")

    def layout(name: str) -> list[tuple]:
        t = a._read_table(int(name[5:13]))
        return list(zip(t.column("channel_id").to_pylist(), t.column("task_id").to_pylist(),
                        t.column("ord").to_pylist()))

    first, old = a.files()
    assert layout(first) == sorted(layout(first))
    assert layout(old) != sorted(layout(old))       # (tasks interleaved in each channel)
    a.merge([a.files()])
    (merged,) = a.files()
    assert layout(merged) == sorted(layout(merged)) and len(layout(merged)) == 90
    a.close()


def test_the_manifest_format_keeps_older_builds_out(tmp_path):
    """Cool files may cluster a channel's rows by task, which a build that
    reads only manifest format 1 would misorder: a writer writes format 2,
    reads a format-1 store (and moves it to 2), and refuses a format it does
    not know, naming the manifest."""
    import pytest
    from rune_fast import ConversationStateRepository, CorruptStateCheckpointError
    from rune_fast.atomic import AtomicStore
    from rune_fast._names import MANIFEST_NAME
    from test_background_compaction import msg

    store = AtomicStore(tmp_path / "hot" / MANIFEST_NAME)
    with ConversationStateRepository(tmp_path, hot_window=1) as repo:
        for i in range(6):
            repo.append(msg(i))
        repo.compact()
    assert store.read()["format"] == 2

    def with_format(fmt: object) -> None:
        m = store.read()
        m["format"] = fmt
        store.write(m)

    with_format(1)
    with ConversationStateRepository(tmp_path, hot_window=1, read_only=True) as viewer:
        assert viewer.get_message(msg(0).msg_id).record == msg(0)
    with ConversationStateRepository(tmp_path, hot_window=1) as repo:
        repo.append(msg(6))
        repo.compact()
        ch = msg(0).channel_id
        assert [r.msg_id for r in repo.window(ch, 7)] == [msg(i).msg_id for i in range(7) if msg(i).channel_id == ch]
    assert store.read()["format"] == 2
    with_format(3)
    with pytest.raises(CorruptStateCheckpointError, match="manifest format 3 is not one this build reads") as e:
        ConversationStateRepository(tmp_path, hot_window=1)
    assert e.value.path == store.path


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=records, layouts=st.lists(st.sampled_from(["table", "parts", "old"]), min_size=1, max_size=4),
       rg_rows=st.sampled_from([4, 16, 1024]))
def test_max_ord_bounds_each_channel_and_is_exact_for_all(tmp_path_factory, spec, layouts, rg_rows):
    """max_ord (a search with a limit asks it whether the archive may hold
    newer hits): at least the largest ``ord`` of a channel's rows, and the
    largest ``ord`` of all rows exactly, whatever the files' row groups."""
    cdir = str(tmp_path_factory.mktemp("mo") / "hot" / "conversation_cool")
    rows = []
    for i, (ch, task, _stamped) in enumerate(spec):
        r = rec(i, ch, task=task)
        r["ord"] = (i * 7919) % 1009
        rows.append(r)
    a = CoolArchive(cdir, row_group_rows=rg_rows)
    per = -(-len(rows) // len(layouts))
    for k, layout in enumerate(layouts):
        part = rows[k * per:(k + 1) * per]
        if part:
            _write(a, part, layout)
    assert a.max_ord() == max(r["ord"] for r in rows)
    for ch in CHANNELS:
        mine = [r["ord"] for r in rows if r["channel_id"] == ch]
        top = a.max_ord(ch)
        assert (top is None) if not mine else top >= max(mine)
    a.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["c1", "c2", "ç3"]), st.sampled_from(["", "t-b", "t-a", "tä", "t1"])),
                min_size=1, max_size=40),
       st.data())
def test_a_cooling_runs_order_clusters_each_channels_rows_by_task(tmp_path_factory, msgs, data):
    """_by_task (the row order of a cooling run): each channel's locations
    (channels as given) with no task first, then by task in code point
    order, each task's in their given order -- read here from the records."""
    from rune_fast import codec
    from rune_fast.conversation_state import ConversationStateRepository
    from rune_fast.records import ConversationMessageRecord
    d = tmp_path_factory.mktemp("bytask")
    with ConversationStateRepository(d, compact_every=10_000, hot_window=10_000) as repo:
        repo.append_many([ConversationMessageRecord(msg_id=f"m{i:03d}", channel_id=ch, task_id=t, content="x",
                                                    ts=1.0 + i) for i, (ch, t) in enumerate(msgs)])
        out: list[int] = []
        chans: list[int] = []
        for ch in sorted({ch for ch, _t in msgs}):
            locs = repo._index.channel_locs(codec.key(ch), -1).tolist()
            take = data.draw(st.integers(0, len(locs)))
            out += locs[:take]
            chans.append(len(out))
        got = repo._by_task(list(out), chans).tolist()
        tasks = {loc: repo._read_loc(loc).task_id for loc in out}
        names = sorted({t for t in tasks.values() if t})
        ch_of = {loc: c for c, (a, b) in enumerate(zip([0] + chans, chans)) for loc in out[a:b]}
        want = sorted(out, key=lambda loc: (ch_of[loc], names.index(tasks[loc]) if tasks[loc] else -1))
        assert got == want
