"""Bulk reads of an archived task (CoolArchive.task_records and the
repository's messages_for_task above it): the compiled pass builds each row's
record and order key, checks its digest and its task, and declines what it
cannot take to the dict path; the records it hands out are the caller's; the
cache of verified cool records keeps a task's rows only when the task is
read again within its reach."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import _pages, codec
from rune_fast._conv import tuning
from rune_fast._order import order_key
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.cool import CoolArchive
from rune_fast.cool.reads import _ORD, _STRING_COLS, _SV, _TOK, _TS, _calls_read, parts_locs
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.records import ConversationMessageRecord, message_from_stored
from test_cool import cool_rows, rec, records

R = ConversationMessageRecord


def dict_path(archive, locs):
    """(key, record) of each location through the dict path (rows_at); the
    key and the msg_id alone for a row that makes no record there (the
    repository names it: archived record does not validate)."""
    out = []
    for r in archive.rows_at(locs):
        d = r.record
        try:
            m = message_from_stored(d, fresh_json=r.plain)
        except (TypeError, ValueError, KeyError):
            m = d["msg_id"]
        out.append((order_key(d["hlc"], d["msg_id"], r.ord), m))
    return out


def fields(m):
    return (m.msg_id, m.ts, m.role, m.content, m.channel_id, m.task_id, m.token_estimate, m.tool_calls,
            m.tool_call_id, m.origin, m.hlc)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(records, min_size=1, max_size=16, unique_by=lambda d: d["msg_id"]),
       tasks=st.lists(st.sampled_from(["", "t1", "t2", "t\u00e9"]), min_size=16, max_size=16),
       data=st.data())
def test_task_records_is_the_dict_path(tmp_path_factory, rows, tasks, data):
    """Every row of a task is either read to the record (and order key) the
    dict path makes, or declined: never another record, never a row of
    another task; what is declined the caller reads through rows_at."""
    rows = [dict(r, task_id=t) for r, t in zip(rows, tasks)]
    rows.sort(key=lambda r: (r["channel_id"], r["task_id"]))
    d = str(tmp_path_factory.mktemp("c") / "cool")
    a = CoolArchive(d, row_group_rows=data.draw(st.sampled_from([2, 4, 64])))
    cool_rows(a, rows, list(range(len(rows))))
    for t in {r["task_id"] for r in rows} - {""}:
        parts = a.task_parts(t)
        locs = parts_locs(parts)
        keyed, declined = a.task_records(parts, R, t)
        assert len(keyed) + len(declined) == len(locs)
        by_id = {getattr(m, "msg_id", m): (k, m) for k, m in dict_path(a, locs)}
        for k, m in keyed:
            wk, wm = by_id.pop(m.msg_id)
            assert k == wk and m == wm and fields(m) == fields(wm) and m.task_id == t
            assert type(m) is R and type(m.ts) is float and type(m.tool_calls) is tuple
        # (the rest were declined: the dict path reads them, or names them)
        assert sorted(by_id) == sorted(getattr(m, "msg_id", m) for _k, m in dict_path(a, declined))


def test_records_from_columns_checks_the_task_and_keys_each_row(tmp_path):
    """task=: a row of another task is declined (None) and the rows of the
    task share the str given; keyed=True: (order key, record) pairs; a
    record type of another layout (with a __dict__) is filled by name."""
    a = CoolArchive(str(tmp_path / "cool"), row_group_rows=64)
    rows = [rec(i, "c1", task="t1", hlc=f"{i:05d}-h" if i % 2 else "",
                tool_calls=[{"id": "x", "name": "f", "arguments": {"n": i}}] if i % 3 == 0 else None)
            for i in range(12)]
    cool_rows(a, rows, [100 + i for i in range(12)])
    (name,) = a.files()
    cols = a._reader(int(name[5:13])).take(0, list(range(12)))

    def run(record_type, **kw):
        return _pages.records_from_columns([cols[c] for c in _STRING_COLS], cols[_TS], cols[_TOK], cols[_SV],
                                           cols[_ORD], record_type, _calls_read, **kw)

    plain = run(R)
    assert all(h is not None for h in plain)
    assert run(R, pairs=False, task="t2") == ([None] * 12, [0] * 12)
    task = "".join(["t", "1"])          # (a str object of its own)
    keyed, ords = run(R, pairs=False, task=task, keyed=True)
    assert ords == [100 + i for i in range(12)]
    for (k, m), (pm, o) in zip(keyed, plain):
        assert m == pm and k == order_key(m.hlc, m.msg_id, o) and m.task_id is task
    assert all(m.channel_id is keyed[0][1].channel_id for _k, m in keyed)
    with pytest.raises(ValueError, match="keyed"):
        run(R, keyed=True)

    class Loose(R):     # (no __slots__: instances have a __dict__, another layout)
        pass

    loose = run(Loose)
    assert [type(h[0]) for h in loose] == [Loose] * 12
    assert [fields(h[0]) for h in loose] == [fields(h[0]) for h in plain]
    assert run(R) == plain              # (the layout found again for the type)


def msg(i, task, calls=False):
    return R(msg_id=f"msg_{i:08d}", role="assistant" if calls else "user", content=f"message {i} \u00fc\n",
             channel_id=f"c{i % 2}", task_id=task, ts=1_700_000_000.0 + i,
             tool_calls=[{"id": f"call{i}", "name": "f", "arguments": {"n": [i]}}] if calls else ())


def test_a_task_read_once_is_not_kept_and_one_read_again_is(tmp_path, monkeypatch):
    """A task of more than a few rows is read from its pages and not kept
    at its first read; asked again within the cache's reach its rows are
    kept, and from then on served from the cache. Every read returns the
    same records, and a caller cannot edit what it read (tool calls
    read-only, whether kept or not)."""
    monkeypatch.setattr(tuning, "TASK_ASKS_KEPT", 3)
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2, cache_bytes=8 << 20) as repo:
        want = [msg(i, "big" if i % 4 else "small", calls=i % 5 == 0) for i in range(400)]
        repo.append_many(want)
        repo.compact()
        big = [m for m in want if m.task_id == "big"]
        cool = len(repo._cool.task_locs("big"))        # (the rest are hot)
        assert len(repo._cool_decoded) == 0 and cool > 250
        reach = min(repo._cool_dense.capacity, repo._cool_dense.max_bytes // tuning.TASK_ROW_BYTES)
        assert 2 * len(big) <= reach < len(big) * tuning.TASK_FEW_ROWS
        got = repo.messages_for_task("big")
        assert got == big and len(repo._cool_decoded) == 0          # (read, not kept)
        assert sum(1 for m in got if m.tool_calls) > 20
        for m in got:
            for c in m.tool_calls:
                with pytest.raises(TypeError, match="read-only"):
                    c["arguments"]["n"].append("edited")
        kept = repo.messages_for_task("big")
        assert kept == big and len(repo._cool_decoded) == cool        # (read again soon: kept)
        for m in kept:
            for c in m.tool_calls:
                with pytest.raises(TypeError, match="read-only"):
                    c["name"] = "edited"
        calls = []
        real = repo._cool.task_records
        monkeypatch.setattr(repo._cool, "task_records", lambda *a: calls.append(1) or real(*a))
        assert repo.messages_for_task("big") == big and calls == []   # (from the cache)
        # other tasks read in between, more rows than the cache's reach: the
        # next read of "big" is a first one again
        repo._task_clock += reach
        repo._cool_decoded.clear()
        repo._cool_dense.clear()
        assert repo.messages_for_task("big") == big and calls == [1] and len(repo._cool_decoded) == 0
        # a task of a few rows is kept at once; the memory of asks is bounded
        for t in ("x", "y", "z", "w"):
            repo.messages_for_task(t)
        assert len(repo._task_asks) <= 3


def test_a_task_read_once_keeps_none_of_its_hot_lines(tmp_path):
    """The hot lines a task's first read decodes are not kept: a loop over
    more tasks than the cache holds would push out the records windows and
    exact reads come back to, for lines it does not come round to. Read
    again within the cache's reach they are kept, and the next read
    decodes none."""
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=1000, cache_bytes=8 << 20) as repo:
        want = [msg(i, "big" if i % 4 else "small") for i in range(400)]
        repo.append_many(want)
        big = [m for m in want if m.task_id == "big"]
        reach = min(repo._cool_dense.capacity, repo._cool_dense.max_bytes // tuning.TASK_ROW_BYTES)
        assert 2 * len(big) <= reach < len(big) * tuning.TASK_FEW_ROWS
        repo._decoded.clear()                   # (appends keep the records they were given)
        assert repo.messages_for_task("big") == big and len(repo._decoded) == 0
        assert repo.messages_for_task("big") == big and len(repo._decoded) == len(big)
        assert repo._index.task_hits(codec.key("big"), repo._decoded)[2] == 0
        assert repo.messages_for_task("big") == big


def test_only_a_task_of_a_few_rows_is_kept_at_its_first_read(tmp_path, monkeypatch):
    """A task of at most 1/TASK_FEW_ROWS of the cache's reach is kept at
    its first read; one just past that bound is read from its pages and
    not kept (a loop over more tasks than the cache holds would pay the
    keeping of every such task and come round to none of them)."""
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2, cache_bytes=8 << 20) as repo:
        reach = min(repo._cool_dense.capacity, repo._cool_dense.max_bytes // tuning.TASK_ROW_BYTES)
        monkeypatch.setattr(tuning, "TASK_FEW_ROWS", max(1, reach // 20))
        few = reach // tuning.TASK_FEW_ROWS          # (~20 rows)
        want = [msg(i, "few" if i < few else "more") for i in range(2 * few + 1)]
        repo.append_many(want)
        repo.append_many([msg(10_000 + i, "") for i in range(8)])     # (the tasks' rows all cooled)
        repo.compact()
        assert len(repo._cool.task_locs("few")) == few and len(repo._cool.task_locs("more")) == few + 1
        assert repo.messages_for_task("more") == [m for m in want if m.task_id == "more"]
        assert len(repo._cool_decoded) == 0           # (read from its pages, not kept)
        assert repo.messages_for_task("few") == [m for m in want if m.task_id == "few"]
        assert len(repo._cool_decoded) == few         # (kept at once)


def test_a_task_row_of_another_task_or_damaged_is_named(tmp_path):
    """The compiled pass declines a row whose task is not the one the cool
    index lists it under, and one whose bytes changed: the dict path then
    raises, naming the file and the row."""
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2, cache_bytes=8 << 20) as repo:
        repo.append_many([msg(i, "t1" if i % 3 else "t2") for i in range(300)])
        repo.compact()
        assert len(repo.messages_for_task("t1")) == 200
        rows = {no: fi.tasks for no, fi in repo._cool._files.items()}
        no = next(no for no, tasks in rows.items() if "t2" in tasks and "t1" in tasks)
        rows[no]["t1"] = rows[no]["t1"].copy()
        rows[no]["t1"][3] = rows[no]["t2"][0]         # a t2 row listed as t1's
        rows[no]["t1"].sort()
        repo._cool._task_locs_d.clear()
        with pytest.raises(CorruptStateCheckpointError, match="is a message of task 't1'.*says 't2'") as ei:
            repo.messages_for_task("t1")
        assert ei.value.path.endswith(repo._cool._files[no].name)
        assert ei.value.offset == int(rows[no]["t2"][0])


def test_task_reads_over_many_files_merge_their_runs(tmp_path):
    """A task spread over several files (and the hot tier), stamped and
    unstamped messages mixed, reads back in the order key, whatever the
    cache holds."""
    rnd = random.Random(5)
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=4, cache_bytes=8 << 20) as repo:
        want = []
        for part in range(4):
            batch = [R(msg_id=f"msg_{part}_{i:05d}", content=f"m {part} {i}", channel_id=f"c{i % 3}",
                       task_id=rnd.choice(["a", "b"]), ts=1_700_000_000.0 + i,
                       hlc=f"{rnd.randrange(10**6):015d}-0000000000-d" if rnd.random() < 0.5 else "")
                     for i in range(150)]
            repo.append_many(batch)
            repo.compact()
            want += batch
        for t in ("a", "b"):
            expect = sorted((m for m in want if m.task_id == t),
                            key=lambda m: order_key(m.hlc, m.msg_id, want.index(m)))
            for _ in range(3):
                assert repo.messages_for_task(t) == expect


def test_a_task_named_by_a_str_subclass_reads_plain_str_ids(tmp_path):
    class Name(str):
        pass

    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2, cache_bytes=4 << 20) as repo:
        want = [msg(i, "t") for i in range(300)]
        repo.append_many(want)
        repo.compact()
        got = repo.messages_for_task(Name("t"))
        assert got == want and {type(m.task_id) for m in got} == {str}


def test_records_of_two_layouts_built_in_two_threads_stay_apart(tmp_path):
    """Each records_from_columns call fills its records by the layout of
    its own record type, also while a call in another thread (switching at
    the tool-call reader, Python code) builds records of a type whose slots
    lie in another order."""
    import threading
    import time

    a = CoolArchive(str(tmp_path / "cool"), row_group_rows=64)
    # (a non-ASCII call id: the compiled reader leaves the calls to calls_read)
    rows = [rec(i, "c1", task="t1", tool_calls=[{"id": "\u00e9x", "name": "f", "arguments": [i]}])
            for i in range(40)]
    cool_rows(a, rows, list(range(40)))
    (name,) = a.files()
    cols = a._reader(int(name[5:13])).take(0, list(range(40)))

    class Base:
        __slots__ = ("ts",)

    class Reversed(Base):       # (its ts slot first: CPython lays a class's own slots out sorted)
        SCHEMA_VERSION = 1
        __slots__ = ("tool_calls", "token_estimate", "role", "origin", "tool_call_id", "content", "hlc",
                     "task_id", "channel_id", "msg_id")

    def slow_calls(raw):
        time.sleep(0)                   # (a thread switch here, mid-call)
        return _calls_read(raw)

    def build(record_type):
        return _pages.records_from_columns([(bytes(cols[c][0]) + b"", cols[c][1]) for c in _STRING_COLS],
                                           cols[_TS], cols[_TOK], cols[_SV], cols[_ORD], record_type, slow_calls)

    want = {R: [fields(h[0]) for h in build(R)], Reversed: [fields(h[0]) for h in build(Reversed)]}
    assert want[R] == want[Reversed]
    bad = []
    both = threading.Barrier(2)

    def loop(record_type):
        both.wait()
        for _ in range(150):
            got = [fields(h[0]) for h in build(record_type)]
            if got != want[record_type]:
                bad.append(record_type)

    threads = [threading.Thread(target=loop, args=(t,)) for t in (R, Reversed)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
