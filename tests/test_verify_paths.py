"""verify()'s fast paths give the answers of the plain ones.

The cool tier's check builds each row's record and canonical JSON in
compiled code (``cool.hits.check_table``) and takes the envelope hash from
those bytes; the event store is checked and its envelopes compared in one
pass (``EventStore.verify(sound)``). These tests hold them to the plain
definitions: sha256 of ``canonical_json(record dict)``, every row's digest,
every damaged line named, envelopes after a damaged line still compared.
"""
from __future__ import annotations

import glob
import hashlib
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _unlocked import archived_store, in_thread
from rune_fast import ConversationMessageRecord, ConversationStateRepository, StoreClosedError
from rune_fast.cool.hits import check_table
from rune_fast.cool.schema import COOL_SCHEMA, record_digest
from rune_fast.events import EventStore, frame
from rune_fast.records import canonical_json, payload_hash

_TEXT = st.text(alphabet=st.sampled_from("aZ é ß ΣςİıǅＡ量子😀\n\t\"\\/\u2028\x01"), max_size=40)
_CALL = st.fixed_dictionaries({"id": st.text("abc123", min_size=1, max_size=6),
                               "name": st.text("fnx_", min_size=1, max_size=6),
                               "arguments": st.dictionaries(st.text("kq", min_size=1, max_size=3),
                                                            st.one_of(st.integers(-10**6, 10**6), _TEXT,
                                                                      st.booleans(), st.none()),
                                                            max_size=3)})


def _cool_tables(state: str) -> list[pa.Table]:
    paths = sorted(glob.glob(os.path.join(state, "hot", "conversation_cool", "cool-*.parquet")))
    assert paths
    return [pq.read_table(p) for p in paths]


def _checked(table: pa.Table) -> tuple[list, dict[str, bytes]]:
    got: dict[str, bytes] = {}
    bad = list(check_table(table, 0, got.__setitem__))
    return bad, got


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=st.lists(st.tuples(_TEXT, st.sampled_from(["user", "assistant", "tool"]),
                               st.lists(_CALL, max_size=2), st.floats(0, 4e9, allow_nan=False)),
                     min_size=3, max_size=12))
def test_the_cool_check_hands_each_row_the_bytes_of_its_payload_hash(tmp_path_factory, msgs):
    state = str(tmp_path_factory.mktemp("s"))
    recs = [ConversationMessageRecord(msg_id=f"m{i}", role=role, content=text, channel_id="c",
                                      tool_calls=calls if role == "assistant" else [],
                                      tool_call_id="t1" if role == "tool" else "", ts=ts)
            for i, (text, role, calls, ts) in enumerate(msgs)]
    with ConversationStateRepository(state, hot_window=1) as repo:
        repo.append_many(recs)
        repo.compact()
        assert repo.verify().ok
    seen: dict[str, bytes] = {}
    for table in _cool_tables(state):
        bad, got = _checked(table)
        assert bad == []
        seen.update(got)
    assert len(seen) == len(recs) - 1
    for rec in recs:
        if rec.msg_id in seen:
            assert seen[rec.msg_id] == canonical_json(rec.to_dict())
            assert hashlib.sha256(seen[rec.msg_id]).hexdigest() == payload_hash(rec)


def _rows(state: str) -> list[dict]:
    (table,) = _cool_tables(state)
    return table.to_pylist()


def _store(state: str, n: int = 4) -> None:
    with ConversationStateRepository(state, hot_window=1) as repo:
        repo.append_many([ConversationMessageRecord(msg_id=f"m{i}", role="user", content=f"ünï {i}",
                                                    channel_id="c") for i in range(n)])
        repo.compact()


def test_the_cool_check_names_a_changed_row_and_hands_on_only_the_sound_ones(tmp_path):
    _store(str(tmp_path))
    rows = _rows(str(tmp_path))
    rows[1]["content"] = rows[1]["content"] + "!"
    bad, got = _checked(pa.Table.from_pylist(rows, schema=COOL_SCHEMA))
    assert bad == [(1, "digest mismatch")]
    assert sorted(got) == sorted(r["msg_id"] for k, r in enumerate(rows) if k != 1)


def test_a_row_with_extra_fields_is_checked_by_the_plain_path(tmp_path):
    """A row the compiled build declines (fields beyond the record's) is
    checked by its Python path, and its bytes are those of the whole dict."""
    _store(str(tmp_path))
    rows = _rows(str(tmp_path))
    rec = {k: rows[0][k] for k in ("msg_id", "channel_id", "task_id", "hlc", "content", "ts", "role",
                                   "token_estimate", "tool_call_id", "origin", "schema_version")}
    rec["tool_calls"] = []
    rec["later_field"] = {"x": [1, "é"]}
    rows[0]["extra"] = orjson.dumps({"later_field": rec["later_field"]}).decode()
    rows[0]["digest"] = record_digest(rec)
    bad, got = _checked(pa.Table.from_pylist(rows, schema=COOL_SCHEMA))
    assert bad == []
    assert got[rows[0]["msg_id"]] == canonical_json(rec)
    assert len(got) == len(rows)


def _reframed(line: bytes, **change: str) -> bytes:
    env = orjson.loads(line)
    env.update(change)
    rest = orjson.dumps({k: v for k, v in env.items() if k != "x"})
    return frame(b"," + rest[1:])


def test_envelopes_after_a_damaged_line_are_still_compared(tmp_path):
    _store(str(tmp_path), n=6)
    path = tmp_path / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    at = {orjson.loads(line)["id"]: k for k, line in enumerate(lines)}
    hurt = bytearray(lines[at["m1"]])
    hurt[40] ^= 0x04
    lines[at["m1"]] = bytes(hurt)
    lines[at["m4"]] = _reframed(lines[at["m4"]], payload_hash="0" * 64)
    path.write_bytes(b"".join(lines))
    damaged_at = sum(len(x) for x in lines[:at["m1"]])
    with ConversationStateRepository(tmp_path, hot_window=1) as repo:
        rep = repo.verify()
    assert not rep.ok
    assert [p.offset for p in rep.problems if p.file == str(path) and "m4" in p.message] == \
        [sum(len(x) for x in lines[:at["m4"]])]
    assert [p for p in rep.problems if p.offset == damaged_at and p.file == str(path)]
    assert rep.checked["envelopes"] == 5        # every sound one


def test_the_event_stores_check_hands_on_each_sound_envelope_once(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventStore(path) as store:
        for i in range(4):
            store.append("conversation.message", f"m{i}", "a" * 64)
        want = list(store.iter_envelopes(0))
        got: list[dict] = []
        assert store.verify(got.append) == []
    assert got == want and [e["id"] for e in got] == ["m0", "m1", "m2", "m3"]
    assert all("x" not in e for e in got)


class _Between:
    """Stands in for a writer's ``_held_open`` during verify(): before the
    lock is taken for the second archive file, it says so and waits until
    the test has done its calls (which would wait forever for a lock the
    check still held)."""

    def __init__(self, repo: ConversationStateRepository) -> None:
        self.real = repo._held_open
        self.entries = 0
        self.between = threading.Event()
        self.go = threading.Event()

    @contextmanager
    def __call__(self) -> Iterator[None]:
        self.entries += 1
        if self.entries == 2:
            self.between.set()
            assert self.go.wait(60)
        with self.real():
            yield


def test_a_writers_verify_lets_appends_and_compactions_in_between_archive_files(tmp_path):
    """Appends, deletions and compactions (which erase, cool and so change
    the archive's files) run between two files of a writer's check, and the
    check reports no problem for the files that changed under it."""
    repo = archived_store(str(tmp_path))
    gate = _Between(repo)
    repo._held_open = gate          # type: ignore[method-assign]
    t, out = in_thread(repo.verify)
    assert gate.between.wait(60)
    assert t.is_alive()             # (the check waits in the gate: not done)
    repo.append(ConversationMessageRecord(msg_id="new-0", role="user", content="während", channel_id="c0"))
    assert repo.delete("b0-1")      # archived rows: the next compaction rewrites their files,
    assert repo.delete("b2-1")      # one checked already, one not yet
    repo.compact()
    repo.append_many([ConversationMessageRecord(msg_id=f"new-{i}", role="user", content="x", channel_id="c1")
                      for i in range(1, 5)])
    repo.compact()
    gate.go.set()
    t.join(60)
    assert not t.is_alive() and "error" not in out, out
    rep = out["value"]
    assert rep.ok, rep.problems
    assert rep.checked["records"] >= 17
    del repo._held_open
    again = repo.verify()
    assert again.ok and again.checked["records"] == 18 + 5 - 2
    repo.close()


def test_a_repository_closed_during_verify_raises_store_closed(tmp_path):
    repo = archived_store(str(tmp_path))
    gate = _Between(repo)
    repo._held_open = gate          # type: ignore[method-assign]
    t, out = in_thread(repo.verify)
    assert gate.between.wait(60)
    repo.close()
    gate.go.set()
    t.join(60)
    assert isinstance(out.get("error"), StoreClosedError), out


def test_a_file_damaged_while_the_check_waits_is_named(tmp_path):
    """The files are read when their turn comes: damage done between two
    files is found (the check is not of a copy taken at its start)."""
    repo = archived_store(str(tmp_path))
    last = os.path.join(str(tmp_path), "hot", "conversation_cool", repo._cool.files()[-1])
    gate = _Between(repo)
    repo._held_open = gate          # type: ignore[method-assign]
    t, out = in_thread(repo.verify)
    assert gate.between.wait(60)
    with open(last, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x01]))
    gate.go.set()
    t.join(60)
    rep = out["value"]
    assert not rep.ok and any(p.file == last for p in rep.problems), rep.problems
    repo.close()


class _InFile:
    """Stands in for the archive check's row check: the first call says so
    and waits until the test has done its calls (the file is then being
    read, the repository's lock not held)."""

    def __init__(self, monkeypatch) -> None:
        import rune_fast.cool.archive as archive
        self.real = archive.check_table
        self.calls = 0
        self.entered = threading.Event()
        self.go = threading.Event()
        monkeypatch.setattr(archive, "check_table", self)

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.go.wait(60)
        return self.real(*a, **k)


def test_appends_and_reads_go_on_while_an_archive_file_is_read(tmp_path, monkeypatch):
    repo = archived_store(str(tmp_path))
    gate = _InFile(monkeypatch)
    t, out = in_thread(repo.verify)
    assert gate.entered.wait(60)
    a, got = in_thread(lambda: (repo.append(ConversationMessageRecord(msg_id="during", role="user",
                                                                        content="x", channel_id="c0")),
                                 repo.get_message("b0-2").record))
    a.join(60)
    assert not a.is_alive() and got["value"][1].msg_id == "b0-2", got
    gate.go.set()
    t.join(60)
    assert out["value"].ok, out
    repo.close()


def test_an_erasure_of_the_file_being_read_waits_for_its_check(tmp_path, monkeypatch):
    """compact() erasing a deleted message from the archive file the check
    is reading waits for that check: the file's bytes are gone when
    compact() returns, and the check reads the file it started on."""
    repo = archived_store(str(tmp_path))
    cool = os.path.join(str(tmp_path), "hot", "conversation_cool")
    first = os.path.join(cool, repo._cool.files()[0])
    assert repo.get_message("b0-1").tier == "cool"
    gate = _InFile(monkeypatch)
    t, out = in_thread(repo.verify)
    assert gate.entered.wait(60)
    assert repo.delete("b0-1")
    c, done = in_thread(repo.compact)
    c.join(0.5)
    assert c.is_alive() and os.path.exists(first)      # waiting for the check of that file
    gate.go.set()
    c.join(60)
    t.join(60)
    assert not c.is_alive() and "error" not in done, done
    assert out["value"].ok, out["value"].problems
    assert not os.path.exists(first)
    assert repo.get_message("b0-1").record is None
    assert repo.verify().ok
    repo.close()


def test_a_close_while_an_archive_file_is_read_raises_store_closed(tmp_path, monkeypatch):
    repo = archived_store(str(tmp_path))
    gate = _InFile(monkeypatch)
    t, out = in_thread(repo.verify)
    assert gate.entered.wait(60)
    repo.close()
    gate.go.set()
    t.join(60)
    assert isinstance(out.get("error"), StoreClosedError), out


def test_an_automatic_compaction_leaves_a_merge_of_a_file_being_read(tmp_path, monkeypatch):
    """An automatic compaction does not merge (nor adopt a merge of) a file
    the check is reading: it would wait for the check to unlink it, and the
    appender with it. The merge happens at a compaction after the check."""
    from rune_fast._conv import tuning
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 64)        # four files of one tier, not merged yet
    repo = archived_store(str(tmp_path))
    repo.append_many([ConversationMessageRecord(msg_id=f"b3-{i}", role="user", content="x",
                                                channel_id=f"c{i % 2}") for i in range(6)])
    repo.compact()
    files = repo._cool.files()
    assert len(files) == 4
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 4)
    gate = _InFile(monkeypatch)
    t, out = in_thread(repo.verify)
    assert gate.entered.wait(60)
    c, done = in_thread(lambda: repo._compact(full=False, settle=False))
    c.join(60)
    assert not c.is_alive() and "error" not in done, done
    assert repo._cool.files() == files                     # the group holds the file being read
    gate.go.set()
    t.join(60)
    assert out["value"].ok, out["value"].problems
    repo._compact(full=False, settle=False)
    assert len(repo._cool.files()) < 4                     # merged once the check is done
    assert repo.verify().ok
    repo.close()


def test_verify_in_a_loop_beside_a_busy_writer_finds_nothing_wrong(tmp_path):
    """A thread checks the store again and again while the writer appends,
    deletes and compacts (cooling, merging and erasing archive files under
    the checks): every report is clean, and the store after is whole."""
    repo = ConversationStateRepository(str(tmp_path), hot_window=3, compact_every=16)
    reports: list = []
    done = threading.Event()

    def checks() -> None:
        while not done.is_set():
            reports.append(repo.verify())

    t = threading.Thread(target=checks)
    t.start()
    try:
        kept = []
        for r in range(90):
            batch = [ConversationMessageRecord(msg_id=f"r{r}-{i}", role="user", content=f"ünï {r} {i}",
                                               channel_id=f"c{i % 4}", task_id=f"t{r % 5}") for i in range(24)]
            repo.append_many(batch)
            kept += [m.msg_id for m in batch]
            if r % 3 == 1:
                assert repo.delete(kept.pop(0)) and repo.delete(kept.pop(len(kept) // 2))
            if r % 5 == 4:
                repo.compact()          # erases the deleted, merges the archive's files
            time.sleep(0.002)           # (the lock is not fair: let the checks in between calls)
    finally:
        done.set()
        t.join(120)
    assert not t.is_alive() and len(reports) >= 1
    assert [r.problems for r in reports if not r.ok] == []
    final = repo.verify()
    assert final.ok and final.checked["records"] == len(kept) == len(repo)
    assert sorted(m.msg_id for m in repo.messages_for_task("t0")) == sorted(m for m in kept if int(m[1:].split("-")[0]) % 5 == 0)
    repo.close()


def test_a_viewers_verify_compares_the_envelopes_with_the_records(tmp_path):
    """A viewer has no event store of its own; its verify() reads the
    writer's and compares each message's envelope with the record it sees
    (names the one that differs). A record with no envelope is not a
    problem to a viewer (the writer's append may be in flight), and an
    envelope of a message it does not see is not either."""
    _store(str(tmp_path), n=6)
    path = tmp_path / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    at = {orjson.loads(line)["id"]: k for k, line in enumerate(lines)}
    lines[at["m2"]] = _reframed(lines[at["m2"]], payload_hash="1" * 64)
    del lines[at["m4"]]                                  # m4 unjournaled
    lines.append(_reframed(lines[0], id="elsewhere"))    # a message this store does not hold
    path.write_bytes(b"".join(lines))
    with ConversationStateRepository(tmp_path, read_only=True) as viewer:
        rep = viewer.verify()
    assert not rep.ok and rep.checked["envelopes"] == 6
    assert [(p.file, p.offset) for p in rep.problems] == [(str(path), sum(len(x) for x in lines[:at["m2"]]))]
    assert "m2" in rep.problems[0].message
    with ConversationStateRepository(tmp_path, hot_window=1) as writer:
        mine = writer.verify()
    assert {p.offset for p in mine.problems} >= {rep.problems[0].offset}
    assert any("no envelope" in p.message and "m4" in p.message for p in mine.problems)


def test_a_viewers_verify_without_an_event_store_reports_nothing_of_it(tmp_path):
    _store(str(tmp_path))
    os.unlink(tmp_path / "events.jsonl")
    with ConversationStateRepository(tmp_path, read_only=True) as viewer:
        rep = viewer.verify()
    assert rep.ok and rep.checked["envelopes"] == 0 and rep.checked["records"] == 4


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=40),
       asks=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6)), max_size=20))
def test_the_envelope_checks_key_lookup_is_a_dicts(keys, asks):
    """verify's id-key lookup (sorted arrays searched by the key's first
    half, a run of keys sharing it walked for the second) answers as a dict
    of the first place of each key would, first halves shared included."""
    from rune_fast._conv.verify import _ENV, _by_key, _firsts, _lookup
    import numpy as np
    arr = np.zeros(len(keys), dtype=_ENV)
    arr["a"] = [a for a, _b in keys]
    arr["b"] = [b for _a, b in keys]
    arr["o"] = np.arange(len(keys))
    arr = arr[_by_key(arr)]
    first: dict = {}
    for i, (a, b) in enumerate(zip(arr["a"].tolist(), arr["b"].tolist())):
        first.setdefault((a, b), i)
    assert _firsts(arr).tolist() == sorted(first.values())
    at, found = _lookup(arr, np.array([a for a, _b in asks], dtype=np.uint64),
                        np.array([b for _a, b in asks], dtype=np.uint64))
    for (a, b), p, f in zip(asks, at.tolist(), found.tolist()):
        assert f == ((a, b) in first) and (not f or p == first[(a, b)])


def test_verify_of_a_store_whose_every_message_was_deleted_is_clean(tmp_path):
    """Envelopes and no record to compare them with (every message
    deleted, erased or not): nothing to report."""
    _store(str(tmp_path), n=3)
    with ConversationStateRepository(tmp_path, hot_window=1) as repo:
        for i in range(3):
            assert repo.delete(f"m{i}")
        rep = repo.verify()
        assert rep.ok and rep.checked["records"] == 0 and rep.checked["envelopes"] >= 3, rep
        repo.compact()
        assert repo.verify().ok
    with ConversationStateRepository(tmp_path, read_only=True) as viewer:
        assert viewer.verify().ok


def test_verify_names_every_damaged_hot_line_the_index_holds(tmp_path):
    """The indexed hot lines are checked and copied in one compiled pass;
    one damaged line makes each be checked alone, so that every damaged
    line is named with its file and offset, and the sound ones still have
    their records compared with their envelopes."""
    with ConversationStateRepository(tmp_path, compact_every=10**6, durability="none") as repo:
        repo.append_many([ConversationMessageRecord(msg_id=f"m{i}", channel_id="c", content=f"body {i} here")
                          for i in range(8)])
        repo.flush()
        assert repo.verify().ok
        tail = os.path.join(tmp_path, "hot", "conversation_tail.jsonl")
        with open(tail, "r+b") as f:
            data = f.read()
            bad = [data.rindex(b"\n", 0, data.index(f"body {i} ".encode())) + 1 for i in (2, 5)]
            for i in (2, 5):
                f.seek(data.index(f"body {i} ".encode()))
                f.write(b"B")
        rep = repo.verify()
        named = [(p.file, p.offset) for p in rep.problems if "checksum" in p.message]
        assert sorted(set(named)) == [(tail, off) for off in bad], rep.problems


def _append_beside_a_stopped_sort(repo, monkeypatch, callers: tuple[str, ...], msg_id: str):
    """verify run on a thread and stopped in its first np.lexsort called
    from one of ``callers``; an append of ``msg_id`` tried meanwhile:
    ``(whether the append waited 10 s for the verify, its report)``."""
    from rune_fast.cool import archive
    entered, go = threading.Event(), threading.Event()
    real = archive.np.lexsort

    def stopped(keys):
        if sys._getframe(1).f_code.co_name in callers:
            entered.set()
            assert go.wait(60)
        return real(keys)

    monkeypatch.setattr(archive.np, "lexsort", stopped)
    t, out = in_thread(repo.verify)
    assert entered.wait(60)
    a, _got = in_thread(lambda: repo.append(ConversationMessageRecord(msg_id=msg_id, content="x",
                                                                      channel_id="c0")))
    a.join(10)
    waited = a.is_alive()
    go.set()
    t.join(60)
    a.join(60)
    monkeypatch.undo()
    return waited, out


def test_the_ids_of_every_file_are_compared_without_the_writers_lock(tmp_path, monkeypatch):
    """The repeated-id check sorts the hashes of every archived row after
    the last file (~0.4 s at 1,000,000 rows): an append goes on meanwhile
    (the ids whose hashes agree are compared under the lock: test_cool's
    repeated-id tests)."""
    repo = archived_store(str(tmp_path))
    waited, out = _append_beside_a_stopped_sort(repo, monkeypatch, ("_repeated_ids",), "during")
    assert not waited and out["value"].ok, out
    repo.close()


def test_a_files_index_entries_are_sorted_without_the_archives_lock(tmp_path, monkeypatch):
    """verify compares each file's index in memory with the file's, sorted
    by hash then row (~0.25 s for a file of 262,144 rows): after the
    archive's lock is let go, which an append asks whether its id is
    archived."""
    repo = archived_store(str(tmp_path))
    # (an id within the archived ids' span: the append asks the archive under its lock)
    waited, out = _append_beside_a_stopped_sort(repo, monkeypatch, ("_by_hash_then_row", "_file_entries"),
                                                "b1-9")
    assert not waited and out["value"].ok, out
    repo.close()
