"""ConversationStateRepository: tiers, compaction, cooling, erasure, recovery, threads."""
from __future__ import annotations

import logging
import os
import stat
import threading

import orjson
import pytest

from rune_fast._conv import tuning
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.errors import (
    CorruptStateCheckpointError,
    DurabilityError,
    ReadOnlyStoreError,
    RuneError,
    StateLockedError,
    RecoveryWarning,
)
from rune_fast.records import ConversationMessageRecord


def msg(i: int, channel: str = "ch", task: str = "", content: str | None = None, hlc: str = "",
        role: str = "user") -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"msg_{i:08d}", role=role,
                                     content=content if content is not None else f"message number {i}",
                                     channel_id=channel, task_id=task, hlc=hlc, ts=1_700_000_000.0 + i)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def files_under(root):
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            yield os.path.join(dirpath, n)


def test_tiers_move_tail_hot_cool(tmp_path):
    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
        for i in range(5):
            assert repo.append(msg(i))
        assert repo.get_message("msg_00000004").tier == "tail"
        rep = repo.compact()
        assert rep.cooled == 3
        assert [repo.get_message(f"msg_{i:08d}").tier for i in range(5)] == ["cool"] * 3 + ["hot"] * 2
        assert repo.window("ch", 10) == [msg(i) for i in range(5)]
        assert repo.append(msg(0)) is False          # duplicate of a cool message
        assert len(repo) == 5
    # and after reopen
    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
        assert [repo.get_message(f"msg_{i:08d}").tier for i in range(5)] == ["cool"] * 3 + ["hot"] * 2
        assert repo.window("ch", 3) == [msg(i) for i in range(2, 5)]
        assert [h.record.msg_id for h in repo.search("number")] == [f"msg_{i:08d}" for i in range(5)]


@pytest.mark.parametrize("stamped", [False, True])
def test_reopen_reads_the_cool_index_only_when_a_read_needs_it(tmp_path, stamped):
    """A reopened writer leaves the cool files' sidecars unread until a read
    needs the cool tier: a window served by newer hot messages does not, a
    window reaching back into the cool rows, a duplicate append, a read by
    id and a channel list do, and each sees every cooled message."""
    hlc = (lambda i: f"{1_700_000_000_000 + i:013d}-0000-dev") if stamped else (lambda i: "")
    ms = [msg(i, f"c{i % 2}", hlc=hlc(i)) for i in range(12)]
    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
        assert repo.append_many(ms) == 12
        assert repo.compact().cooled == 8
    reads = {
        "window": lambda r: r.window("c0", 2) == [ms[8], ms[10]],
        "deep window": lambda r: r.window("c1", 6) == [ms[i] for i in range(1, 12, 2)],
        "duplicate": lambda r: r.append(ms[0]) is False and len(r) == 12,
        "get": lambda r: r.get_message("msg_00000003").record == ms[3],
        "channels": lambda r: r.channels() == ["c0", "c1"],
    }
    for name, check in reads.items():
        with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
            assert repo._cool._unloaded, name
            assert check(repo), name
            assert bool(repo._cool._unloaded) == (name == "window"), name


@pytest.mark.parametrize("victim, live", [(5, True), (3, False)])
def test_search_never_misses_a_damaged_line_silently(tmp_path, victim, live):
    """A flipped byte that unmakes a match ('alpha' -> 'alpia') in a hot line
    the index snapshot vouches for: search checks every hot line once, so it
    raises instead of leaving the message out of its hits. The same damage in
    the dead line of a message since cooled (its bytes stay until the tail
    is rewritten) is not a live message's: search reads it from the cool
    tier and goes on; verify() reports the line."""
    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
        for i in range(6):
            assert repo.append(msg(i, content=f"note {i} about {'alpha' if i % 2 else 'beta'}"))
        assert repo.compact().cooled == 4            # msg 0-3 cooled, 4-5 hot; the snapshot covers all
    tail = next(p for p in files_under(tmp_path) if p.endswith("conversation_tail.jsonl"))
    with open(tail, "r+b") as f:
        data = f.read()
        pos = data.find(f"note {victim} about alpha".encode()) + len(f"note {victim} about alp")
        f.seek(pos)
        f.write(bytes([data[pos] ^ 0x01]))         # 'h' -> 'i'
    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
        if live:
            for _ in range(2):
                with pytest.raises(CorruptStateCheckpointError) as ei:
                    repo.search("alpha")
                assert ei.value.path == tail
        else:
            assert [h.record.msg_id for h in repo.search("alpha")] == ["msg_00000001", "msg_00000003",
                                                                       "msg_00000005"]
        assert any(p.file == tail for p in repo.verify().problems)


def test_a_cool_index_naming_another_tasks_row_is_refused(tmp_path):
    """The cool index in memory says which rows hold a task; a row it names
    that belongs to another task (read from the file, or from the cache of
    rows read before) raises, naming both tasks, instead of being returned."""
    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
        for i in range(12):
            assert repo.append(msg(i, task="t1" if i % 2 else "t2"))
        repo.compact()
        assert [m.msg_id for m in repo.messages_for_task("t2")] == [f"msg_{i:08d}" for i in range(0, 12, 2)]
        rows = {no: fi.tasks for no, fi in repo._cool._files.items()}
        no = next(no for no, tasks in rows.items() if "t1" in tasks)
        rows[no]["t2"] = rows[no]["t1"][:1].copy()          # a t1 row listed as t2's
        repo._cool._task_locs_d.clear()                     # (as if the index said so from the start)
        for attempt in ("cached", "read"):
            if attempt == "read":
                repo._cool_decoded.clear()
                repo._cool_dense.clear()
            with pytest.raises(CorruptStateCheckpointError, match="is a message of task 't2'.*says 't1'"):
                repo.messages_for_task("t2")


def test_a_search_asked_again_takes_its_cool_hits_from_the_record_cache(tmp_path, monkeypatch):
    """A cool tier past the archive's cache is searched in its pages, each
    hit's other columns read page by page: the records of those hits join
    the cache of verified cool records, and the same search asked again (or
    one that finds some of them) reads none of them again and returns the
    same hits. A message deleted since is left out; a kept record whose
    channel is not the one the cool index says raises."""
    import dataclasses

    from rune_fast.pages import PageReader
    monkeypatch.setattr(tuning, "COOL_CACHE_BYTES", 1)
    ms = [msg(i, channel=f"c{i % 3}", content=f"note {i} about {'alpha' if i % 4 == 0 else 'beta'}")
          for i in range(3000)]
    # (a budget whose cool records' share holds every hit: those it cannot hold are read again)
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2, cache_bytes=32 << 20) as repo:
        assert repo.append_many(ms) == 3000
        repo.compact()
        first = repo.search("ALPHA")
        assert [h.record for h in first] == ms[::4] and sum(h.tier == "cool" for h in first) == 749
        read, named = [], []
        real_rows, real_take, real_search = PageReader.rows, PageReader.take, repo._cool.search_records

        def counted(self, rg, local, have=None, fetched=None):
            read.extend(local)
            return real_rows(self, rg, local, have, fetched)

        def taken(self, rg, local, cols=None, fetched=None):
            read.extend(local)
            return real_take(self, rg, local, cols, fetched)

        def search_records(*args, **kw):
            out = real_search(*args, **kw)
            named.append(len(out.named))
            return out
        monkeypatch.setattr(PageReader, "rows", counted)
        monkeypatch.setattr(PageReader, "take", taken)
        monkeypatch.setattr(repo._cool, "search_records", search_records)
        assert repo.search("ALPHA") == first
        assert repo.search("alpha", "c1") == [h for h in first if h.record.channel_id == "c1"]
        assert repo.search("alpha", case_sensitive=True) == first
        assert repo.search("Alpha", case_sensitive=True) == [] and read == []
        assert named[0] > 500 and named[1] > 150 and named[2] > 500   # (the groups the scan reads)
        victim = first[5].record.msg_id
        assert first[5].tier == "cool" and repo.delete(victim)
        read.clear()                                     # (the delete read the row for its channel)
        assert repo.search("alpha") == [h for h in first if h.record.msg_id != victim] and read == []
        for loc, (rec, o) in list(repo._cool_decoded.items()):
            if rec.channel_id == "c1":
                repo._cool_decoded[loc] = (dataclasses.replace(rec, channel_id="c2"), o)
        with pytest.raises(CorruptStateCheckpointError, match="channel 'c1'"):
            repo.search("alpha", "c1")


def test_cool_records_read_again_come_from_the_cache(tmp_path, monkeypatch):
    """A cool row verified once is kept as a record (a task's rows once the
    task is read again within the cache's reach): the same task or exact
    read asked again does not go back to the archive; deletion and erasure
    still win, and the cache never serves another id's record."""
    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
        for i in range(40):
            assert repo.append(msg(i, channel=f"c{i % 2}", task="t1" if i % 3 == 0 else "t2"))
        repo.compact()
        want = [m for m in (msg(i, channel=f"c{i % 2}", task="t1" if i % 3 == 0 else "t2")
                            for i in range(40)) if m.task_id == "t1"]
        assert repo.messages_for_task("t1") == want
        assert repo.messages_for_task("t1") == want     # (read again soon: kept)
        calls = []
        real = repo._cool.records_at
        monkeypatch.setattr(repo._cool, "records_at",
                            lambda locs, rt: calls.append(len(locs)) or real(locs, rt))
        assert repo.messages_for_task("t1") == want
        assert calls == []
        assert repo.get_message("msg_00000003").record == want[1] and repo.get_message("msg_00000003").tier == "cool"
        assert repo.get_message("msg_00000006").record == want[2]
        assert repo.get_message("msg_99999999").status == ReadStatus.NOT_FOUND_CONFIRMED
        assert repo.delete("msg_00000003")
        assert repo.get_message("msg_00000003").status == ReadStatus.NOT_FOUND_CONFIRMED
        assert repo.messages_for_task("t1") == [m for m in want if m.msg_id != "msg_00000003"]
        repo.compact()                                   # erases it: files rewritten, new numbers
        assert repo.messages_for_task("t1") == [m for m in want if m.msg_id != "msg_00000003"]
        assert calls, "the rewritten file's rows were read afresh"
        assert repo.get_message("msg_00000006").record == want[2]


def test_auto_compaction_counts_stored_messages_only(tmp_path):
    with ConversationStateRepository(tmp_path, compact_every=4, hot_window=100) as repo:
        for i in range(3):
            repo.append(msg(i))
        for _ in range(5):
            repo.append(msg(0))    # duplicates do not count
        assert repo.stats()["compactions"] == 0
        repo.append(msg(3))
        assert repo.stats()["compactions"] == 1
        assert repo.get_message("msg_00000003").tier == "hot"


def test_cooled_segments_are_reclaimed(tmp_path):
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=1) as repo:
        repo.append_many(msg(i, channel=f"c{i % 2}") for i in range(200))
        repo.compact()
        repo.append_many(msg(i, channel=f"c{i % 2}") for i in range(200, 400))
        repo.compact()
        st_ = repo.stats()
        assert st_["hot_and_tail"] == 2
        assert st_["cool"] == 398
        assert st_["hot_bytes"] < 4096     # cooled lines do not linger on disk
        assert len(repo) == 400


def test_snapshot_is_used_and_tail_after_it_is_checked(tmp_path):
    with ConversationStateRepository(tmp_path, compact_every=10_000) as repo:
        repo.append_many(msg(i) for i in range(100))
    assert os.path.exists(tmp_path / "hot" / "conversation_index.snap")
    with ConversationStateRepository(tmp_path) as repo:
        repo.append(msg(100))
    # damage a line written after the snapshot: open must see it
    tail = tmp_path / "hot" / "conversation_tail.jsonl"
    data = bytearray(tail.read_bytes())
    last = data.rindex(b"message number 100")
    data[last] ^= 0x01
    tail.write_bytes(bytes(data))
    os.unlink(tmp_path / "hot" / "conversation_index.snap")
    with pytest.raises(CorruptStateCheckpointError) as e:
        ConversationStateRepository(tmp_path)
    assert "conversation_tail.jsonl" in str(e.value)
    assert e.value.offset is not None


def test_close_leaves_a_snapshot_that_still_serves(tmp_path, monkeypatch):
    """A close after a few appends keeps the index snapshot on disk (the next
    open reads the lines after it, checked); past SNAPSHOT_SLACK changes, or
    once the files it was written against changed, close writes a new one."""
    monkeypatch.setattr("rune_fast._conv.tuning.SNAPSHOT_SLACK", 5)
    snap = tmp_path / "hot" / "conversation_index.snap"
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=50) as repo:
        repo.append_many(msg(i) for i in range(40))
    first = read(snap)
    for session in range(2):        # 3 + 2 changes: within the slack, counted across sessions
        with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=50) as repo:
            repo.append_many(msg(i) for i in range(40 + 3 * session, 43 + 2 * session))
        assert read(snap) == first
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=50) as repo:
        assert len(repo) == 45
        assert repo.window("ch", 100) == [msg(i) for i in range(45)]
        assert repo.get_message("msg_00000044").tier == "tail"
        assert repo.verify().ok
        repo.append(msg(45))        # the sixth change since the snapshot
    second = read(snap)
    assert second != first
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=50) as repo:
        assert repo.append(msg(46))
    assert read(snap) == second
    # a line after the snapshot damaged: the open that reads it says so
    tail = tmp_path / "hot" / "conversation_tail.jsonl"
    data = bytearray(tail.read_bytes())
    data[data.rindex(b"message number 46")] ^= 0x01
    tail.write_bytes(bytes(data))
    with pytest.raises(CorruptStateCheckpointError) as e:
        ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=50)
    assert "conversation_tail.jsonl" in str(e.value) and e.value.offset is not None


def test_close_writes_the_snapshot_when_the_files_changed(tmp_path):
    """One cooling run (new cool file, the tail rolled into a segment) since
    the snapshot: close writes a new one, however few the changes."""
    snap = tmp_path / "hot" / "conversation_index.snap"
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=50) as repo:
        repo.append_many(msg(i) for i in range(60))
    first = read(snap)
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=50) as repo:
        assert repo.compact().cooled == 10
    assert read(snap) != first
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=50) as repo:
        assert [repo.get_message(f"msg_{i:08d}").tier for i in (0, 9, 10, 59)] == ["cool", "cool", "hot", "hot"]
        assert repo.window("ch", 100) == [msg(i) for i in range(60)]


def test_automatic_compaction_counts_messages_of_earlier_sessions(tmp_path):
    """SPEC: compaction runs by itself every compact_every stored messages,
    however many sessions stored them (a store fed a few messages a session
    still folds its tail and cools past hot_window)."""
    for session in range(3):
        with ConversationStateRepository(tmp_path, compact_every=8, hot_window=2) as repo:
            repo.append_many(msg(i) for i in range(3 * session, 3 * session + 3))
            tiers = [repo.get_message(f"msg_{i:08d}").tier for i in range(3 * session + 3)]
            assert repo.stats()["compactions"] == (1 if session == 2 else 0)
    # the ninth message's append compacted all nine: seven cooled, two hot
    assert tiers == ["cool"] * 7 + ["hot"] * 2


def test_a_new_id_after_every_archived_one_reads_no_sidecar(tmp_path):
    """The append path's duplicate check asks the cool tier only when the id
    lies within the archived ids' range (kept in the manifest): a first
    append after an open reads no sidecar (2-5 ms at 100,000 to 1,000,000
    messages); an id within it is looked up, and a cool duplicate refused."""
    from rune_fast.atomic import AtomicStore
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        repo.append_many(msg(i) for i in range(10, 30))
        assert repo.compact().cooled == 18
    m = AtomicStore(str(tmp_path / "hot" / "conversation_manifest.json")).read()
    assert [v[2:4] for v in m["cool_meta"].values()] == [["msg_00000010", "msg_00000027"]]
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        assert repo._cool._unloaded
        assert repo.append(msg(40)) and repo.append(msg(5))
        assert repo.append_many([msg(50), msg(51)]) == 2
        assert repo._cool._unloaded             # no sidecar read
        assert repo.append(msg(12)) is False    # within the range: looked up, a cool duplicate
        assert not repo._cool._unloaded
        assert repo.append_many([msg(52), msg(13)]) == 1
        assert repo.append(msg(20)) is False
        assert len(repo) == 25
        assert repo.get_message("msg_00000012").tier == "cool"


def test_flipped_byte_is_source_corrupt_on_exact_read(tmp_path):
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many(msg(i) for i in range(10))
    tail = tmp_path / "hot" / "conversation_tail.jsonl"
    data = bytearray(tail.read_bytes())
    data[data.index(b"message number 3")] ^= 0x20
    tail.write_bytes(bytes(data))
    try:
        repo = ConversationStateRepository(tmp_path)
    except CorruptStateCheckpointError:
        return     # detected at open: allowed
    with repo:
        assert repo.get_message("msg_00000003").status is ReadStatus.SOURCE_CORRUPT
        assert repo.get_message("msg_00000004").status is ReadStatus.FOUND_VERIFIED
        with pytest.raises(CorruptStateCheckpointError):
            repo.window("ch", 10)


def test_torn_final_line_is_quarantined(tmp_path):
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many(msg(i) for i in range(3))
    tail = tmp_path / "hot" / "conversation_tail.jsonl"
    with open(tail, "ab") as f:
        f.write(b'{"x":"0123456789abcdef","k":"m","r":{"msg_id":"msg_9')
    with pytest.warns(RecoveryWarning):
        repo = ConversationStateRepository(tmp_path)
    with repo:
        q = repo.stats()["quarantined"]
        # one shape for every quarantined line (tail, tombstones, events.jsonl, task log)
        assert len(q) == 1 and set(q[0]) == {"path", "offset", "length", "quarantine"}
        assert q[0]["path"].endswith("conversation_tail.jsonl") and q[0]["offset"] > 0 and q[0]["length"] == 52
        with open(q[0]["quarantine"], "rb") as f:
            assert f.read().startswith(b'{"x":"0123456789abcdef"')
        assert len(repo) == 3
        assert repo.append(msg(3))
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == 4


def test_zero_padding_is_not_damage(tmp_path):
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many(msg(i) for i in range(3))
    tail = tmp_path / "hot" / "conversation_tail.jsonl"
    with open(tail, "ab") as f:
        f.write(b"\0" * 5000)
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == 3
        repo.append(msg(3))
    with ConversationStateRepository(tmp_path) as repo:
        assert repo.window("ch", 10) == [msg(i) for i in range(4)]


def test_erasure_removes_bytes_from_every_tier(tmp_path):
    secret = "the-secret-payload-%d"
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        repo.append_many(msg(i, content=secret % i) for i in range(6))
        repo.compact()                         # 0..3 cool, 4..5 hot
        repo.append(msg(6, content=secret % 6))  # tail
        for i in (1, 4, 6):
            assert repo.delete(f"msg_{i:08d}") is True
        for i in (1, 4, 6):
            assert repo.get_message(f"msg_{i:08d}").status is ReadStatus.NOT_FOUND_CONFIRMED
            assert repo.append(msg(i)) is False
        assert len(repo) == 4
        assert [r.msg_id for r in repo.window("ch", 10)] == [f"msg_{i:08d}" for i in (0, 2, 3, 5)]
        repo.compact()
        assert repo.verify().ok
    for path in files_under(tmp_path):
        with open(path, "rb") as f:
            data = f.read()
        for i in (1, 4, 6):
            assert (secret % i).encode() not in data, path
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == 4
        assert repo.get_message("msg_00000001").status is ReadStatus.NOT_FOUND_CONFIRMED


def test_clear_channel(tmp_path):
    with ConversationStateRepository(tmp_path, hot_window=2, compact_every=5) as repo:
        repo.append_many(msg(i, channel="a" if i % 2 else "b") for i in range(20))
        assert repo.clear_channel("a") == 10
        assert repo.window("a", 5) == []
        assert repo.channels() == ["b"]
        assert len(repo) == 10
        assert repo.clear_channel("a") == 0


def test_second_writer_is_refused_and_reader_is_not(tmp_path):
    with ConversationStateRepository(tmp_path) as repo:
        repo.append(msg(1))
        with pytest.raises(StateLockedError):
            ConversationStateRepository(tmp_path)
        before = {p: read(p) for p in files_under(tmp_path)}
        with ConversationStateRepository(tmp_path, read_only=True) as viewer:
            assert viewer.window("ch") == [msg(1)]
            repo.append(msg(2))
            assert viewer.refresh() == 1
            assert viewer.window("ch") == [msg(1), msg(2)]
            with pytest.raises(ReadOnlyStoreError):
                viewer.append(msg(3))
            with pytest.raises(RuneError):
                viewer.compact()
        after = {p: read(p) for p in files_under(tmp_path)}
        assert set(before) <= set(after)


def test_refresh_counts_the_change_in_len(tmp_path):
    """refresh() returns len after minus len before: what the writer
    appended, less what it deleted; 0 on a writer."""
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many([msg(i) for i in range(4)])
        assert repo.refresh() == 0
        with ConversationStateRepository(tmp_path, read_only=True) as viewer:
            assert viewer.refresh() == 0
            repo.append(msg(4))
            repo.delete(msg(0).msg_id)
            assert viewer.refresh() == 0 and len(viewer) == 4
            repo.delete(msg(1).msg_id)
            repo.delete(msg(2).msg_id)
            repo.append(msg(5))
            assert viewer.refresh() == -1 and len(viewer) == 3
            repo.compact()
            assert viewer.refresh() == 0 and viewer.window("ch") == [msg(3), msg(4), msg(5)]


def test_reader_follows_compaction(tmp_path):
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        repo.append_many(msg(i) for i in range(5))
        with ConversationStateRepository(tmp_path, read_only=True) as viewer:
            repo.compact()
            repo.append(msg(5))
            viewer.refresh()
            assert viewer.window("ch", 10) == [msg(i) for i in range(6)]
            assert viewer.get_message("msg_00000000").tier == "cool"


def test_threads_append_concurrently(tmp_path):
    for mode in ("fsync", "batch"):
        d = tmp_path / mode
        with ConversationStateRepository(d, durability=mode, compact_every=50, hot_window=20) as repo:
            def work(t):
                for i in range(60):
                    assert repo.append(msg(t * 1000 + i, channel=f"c{t}"))
                    repo.window(f"c{t}", 3)
            threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert len(repo) == 240
            for t in range(4):
                assert repo.window(f"c{t}", 100) == [msg(t * 1000 + i, channel=f"c{t}") for i in range(60)]
        with ConversationStateRepository(d) as repo:
            assert len(repo) == 240


def test_failed_sync_is_reported_and_store_refuses_writes(tmp_path, monkeypatch):
    repo = ConversationStateRepository(tmp_path)
    repo.append(msg(1))

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(DurabilityError):
        repo.append(msg(2))
    monkeypatch.undo()
    with pytest.raises(DurabilityError):
        repo.append(msg(3))
    repo.close()
    with ConversationStateRepository(tmp_path) as repo:
        assert repo.get_message("msg_00000001").status is ReadStatus.FOUND_VERIFIED
        assert repo.append(msg(3))


def test_a_failed_journal_or_tombstone_write_makes_the_store_refuse_writes(tmp_path, monkeypatch):
    """A write of events.jsonl or of the tombstones that fails is reported
    (DurabilityError) and the store then refuses every write until reopened,
    as after a failed sync: appends after a failed journal write were stored
    while each raised, and a failed tombstone sync was forgotten. A deletion
    whose journal write failed takes no effect, for every read alike (its
    tombstone is cut again: the next open does not apply it either)."""
    import errno

    import rune_fast.framed_log as log_mod
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many([msg(i) for i in range(3)])
    real = log_mod.locked_write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    repo = ConversationStateRepository(tmp_path)
    monkeypatch.setattr(log_mod, "locked_write", full)
    with pytest.raises(DurabilityError, match="journal of 1 message"):
        repo.append(msg(10))
    monkeypatch.setattr(log_mod, "locked_write", real)
    for write in (lambda: repo.append(msg(11)), lambda: repo.delete("msg_00000000")):
        with pytest.raises(DurabilityError, match="refuses writes"):
            write()
    assert repo.get_message("msg_00000011").status is ReadStatus.NOT_FOUND_CONFIRMED
    repo.close()
    repo = ConversationStateRepository(tmp_path)
    monkeypatch.setattr(log_mod, "locked_write", full)
    with pytest.raises(DurabilityError, match="journal of 1 deletion"):
        repo.delete("msg_00000001")
    monkeypatch.setattr(log_mod, "locked_write", real)
    assert repo.get_message("msg_00000001").status is ReadStatus.FOUND_VERIFIED
    assert "msg_00000001" in [m.msg_id for m in repo.window("ch", 10)] and len(repo) == 4
    with pytest.raises(DurabilityError):
        repo.append(msg(12))
    repo.close()
    repo = ConversationStateRepository(tmp_path)
    real_sync = os.fdatasync

    def broken(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("conversation_tombstones.jsonl"):
            raise OSError(errno.EIO, "Input/output error")
        real_sync(fd)
    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(DurabilityError, match="tombstones"):
        repo.delete("msg_00000002")
    monkeypatch.setattr(os, "fdatasync", real_sync)
    with pytest.raises(DurabilityError):
        repo.append(msg(13))
    repo.close()
    with ConversationStateRepository(tmp_path) as repo:
        assert repo.get_message("msg_00000010").status is ReadStatus.FOUND_VERIFIED   # (maybe stored)
        assert repo.get_message("msg_00000001").status is ReadStatus.FOUND_VERIFIED   # (not deleted)
        assert [repo.get_message(f"msg_{i:08d}").status for i in (11, 12, 13)] == [
            ReadStatus.NOT_FOUND_CONFIRMED] * 3
        assert repo.append(msg(14)) and repo.verify().ok


def test_late_stamped_message_takes_its_place_across_tiers(tmp_path):
    hlc = lambda w: f"{w:015d}-{0:010d}-dev"   # noqa: E731
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=2) as repo:
        repo.append_many(msg(i, hlc=hlc(10 * i)) for i in range(1, 6))
        repo.compact()      # 1..3 cool
        late = msg(99, hlc=hlc(15))   # belongs between 1 and 2, which are cool
        assert repo.append(late)
        assert [r.msg_id for r in repo.window("ch", 3)] == ["msg_00000003", "msg_00000004", "msg_00000005"]
        assert [r.msg_id for r in repo.window("ch", 10)][:3] == ["msg_00000001", "msg_00000099", "msg_00000002"]
        repo.compact()
        assert [r.msg_id for r in repo.window("ch", 10)][:3] == ["msg_00000001", "msg_00000099", "msg_00000002"]


def test_legacy_fat_checkpoint_is_imported_once(tmp_path):
    hot = tmp_path / "hot"
    hot.mkdir()
    legacy = [msg(i).to_dict() for i in range(3)] + [msg(1).to_dict()]
    (hot / "conversation_messages.json").write_bytes(orjson.dumps({"messages": legacy}))
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == 3
    assert not (hot / "conversation_messages.json").exists()
    with ConversationStateRepository(tmp_path) as repo:
        assert repo.window("ch") == [msg(i) for i in range(3)]


def test_legacy_checkpoint_integers_beyond_64_bits_import_exactly(tmp_path):
    # a legacy file is json.dump output: its big integers are read with json
    # (orjson reads them as floats; a token_estimate then failed the open)
    import json
    hot = tmp_path / "hot"
    hot.mkdir()
    big = [ConversationMessageRecord(msg_id="b1", content="x", channel_id="ch", ts=1.0, token_estimate=2**70),
           ConversationMessageRecord(msg_id="b2", content="y", channel_id="ch", ts=2.0,
                                     tool_calls=[{"id": "c", "name": "f", "arguments": {"n": 2**70, "m": -2**64}}])]
    (hot / "conversation_messages.json").write_text(json.dumps([m.to_dict() for m in big]))
    with ConversationStateRepository(tmp_path) as repo:
        got = repo.window("ch")
        assert got == big
        assert type(got[0].token_estimate) is int and type(got[1].tool_calls[0]["arguments"]["n"]) is int


def test_files_are_owner_only(tmp_path):
    d = tmp_path / "state"
    with ConversationStateRepository(d, hot_window=1, compact_every=2) as repo:
        repo.append_many(msg(i) for i in range(5))
        repo.compact()
    for dirpath, dirs, names in os.walk(d):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for n in names:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, n)).st_mode) == 0o600, n


def test_hostile_ids_never_become_paths(tmp_path):
    d = tmp_path / "state"
    with ConversationStateRepository(d, hot_window=1, compact_every=2) as repo:
        for i, name in enumerate(["../../escape", "/etc/passwd", "a/b", "..", "con\\x"]):
            repo.append(msg(i, channel=name, task=name))
        repo.compact()
        assert repo.window("../../escape") == [msg(0, channel="../../escape", task="../../escape")]
    assert sorted(os.listdir(tmp_path)) == ["state"]


def test_bad_input_writes_nothing(tmp_path):
    with ConversationStateRepository(tmp_path) as repo:
        with pytest.raises(TypeError):
            repo.append({"msg_id": "x"})
        with pytest.raises(TypeError):
            repo.append_many([msg(1), "nope"])
        assert len(repo) == 0
        assert repo.window("nope") == []
        with pytest.raises(ValueError):
            ConversationStateRepository(tmp_path / "x", durability="sometimes")


def test_token_estimate_past_int64_is_stored_and_cooled(tmp_path):
    # the archive's token_estimate column is int64: a larger estimate (a record
    # may hold any non-negative int) is kept in the row's extra fields. It used
    # to fail every compaction that cooled it, with OverflowError.
    big = [ConversationMessageRecord(msg_id=f"big{i}", content="a", channel_id="ch", token_estimate=t,
                                     ts=1_700_000_000.0 + i)
           for i, t in enumerate((2**63 - 1, 2**63, 2**64 + 5, 10**30))]
    with ConversationStateRepository(tmp_path, hot_window=1) as repo:
        repo.append_many(big + [msg(1)])
        repo.compact()
        assert repo.stats()["cool"] == 4
        for m in big:
            got = repo.get_message(m.msg_id)
            assert got.tier == "cool" and got.record == m
    with ConversationStateRepository(tmp_path, hot_window=1) as repo:
        assert [repo.get_message(m.msg_id).record for m in big] == big
        assert repo.window("ch", 8) == big + [msg(1)]
        rep = repo.verify()           # every tier checks, the cool rows against their digests
        assert rep.ok and rep.checked["cool_rows"] == 4 and rep.checked["records"] == 5, rep


def test_folds_to_ascii_table_matches_unicodedata():
    from rune_fast.conversation_state import FOLDS_TO_ASCII
    computed = "".join(c for c in map(chr, range(0x80, 0x110000))
                       if any(ord(x) < 0x80 for x in c.casefold()))
    assert FOLDS_TO_ASCII == computed


def test_search_casefold_through_non_ascii(tmp_path):
    texts = ["STRASSE", "straße", "Kelvin \u212a unit", "ﬂight", "plain flight", "İstanbul", "nothing"]
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many(msg(i, content=t) for i, t in enumerate(texts))
        for needle in ["strasse", "Straße", "k unit", "flight", "i̇stanbul", "ß", "FL"]:
            got = [h.record.content for h in repo.search(needle)]
            assert got == [t for t in texts if needle.casefold() in t.casefold()], needle
        assert [h.record.content for h in repo.search("ss", case_sensitive=True)] == []
        assert [h.record.content for h in repo.search("SS", case_sensitive=True)] == ["STRASSE"]


def test_resume_messages_suffix_matches_full_fold(tmp_path):
    from rune_fast import sync
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=6) as repo:
        for i in range(40):
            role = ["user", "assistant", "system"][i % 3]
            repo.append(msg(i, role=role))
        full = [sync.op_from_record_dict(r.to_dict()) for r in repo.window("ch", 1000) if r.role != "system"]
        for n in (0, 1, 5, 13, 100, None):
            turns = sync.fold(full, "ch")
            expect = sync.repair(sync.LastN(n).apply(turns) if n is not None else turns)
            assert repo.resume_messages("ch", n) == expect, n
        # a late message (older ts) breaks the suffix shortcut; the answer stays exact
        late = ConversationMessageRecord(msg_id="msg_late", role="user", content="late", channel_id="ch",
                                         ts=1_600_000_000.0)
        repo.append(late)
        full.append(sync.op_from_record_dict(late.to_dict()))
        for n in (1, 3, None):
            turns = sync.fold(full, "ch")
            expect = sync.repair(sync.LastN(n).apply(turns) if n is not None else turns)
            assert repo.resume_messages("ch", n) == expect, n


def _resume_by_ops(repo, channel, n):
    from rune_fast import sync
    return sync.resume_messages(repo.export_ops(), channel, n)


def test_resume_suffix_after_an_unstamped_message_lands_before_stamped_ones(tmp_path):
    """An unstamped message sorts before every stamped one in the store, so
    after stamped messages it is not the channel's last: the suffix shortcut
    must not read the store's last messages as the fold's newest. It used to
    give the second newest turn."""
    with ConversationStateRepository(tmp_path) as repo:
        for i in range(17):
            repo.append(msg(i, hlc=str(repo.clock.now())))
        assert repo.resume_messages("ch", 1) == _resume_by_ops(repo, "ch", 1)     # the verdict is kept
        newest = ConversationMessageRecord(role="assistant", content="newest", channel_id="ch",
                                           ts=repo.clock.now().wall_ms / 1000 + 5)
        repo.append(newest)
        assert repo.resume_messages("ch", 1) == _resume_by_ops(repo, "ch", 1) == [
            {"role": "assistant", "content": "newest", "tool_calls": []}]


@pytest.mark.parametrize("ts, hlc", [(-1.0, ""), (2e12, ""), (1e306, ""), (1_700_000_000.0, "h00")])
def test_resume_suffix_with_stamps_the_fold_clamps_or_replaces(tmp_path, caplog, ts, hlc):
    # a ts outside the Hlc's range, or an hlc that is no Hlc: the fold stamps
    # the op otherwise (clamped, or from ts); the shortcut orders them likewise
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many([ConversationMessageRecord(msg_id=f"m{99 - i}", ts=ts - i if ts != 1e306 else ts,
                                                    hlc=hlc and f"{hlc}{i:02d}", role="user",
                                                    content=f"t{i}", channel_id="c") for i in range(18)])
        for n in (1, 2, 5, None):
            assert repo.resume_messages("c", n) == _resume_by_ops(repo, "c", n), n


def test_the_clock_never_issues_a_stamp_again_after_a_reopen(tmp_path):
    """repo.clock is the store's HlcClock, its device id persisted: a stamp
    it handed out (and a caller put on a message sent elsewhere) must stay
    behind every stamp of the next session, also when the clock ran ahead of
    the wall clock after observing a future stamp (then the wall clock does
    not carry it past them). close() used to keep the clock only when the
    manifest had other news (found by the sync fuzzing helper)."""
    import time

    from rune_fast.sync import Hlc
    future = Hlc(int(time.time() * 1000) + 600_000, 0, "devF")
    with ConversationStateRepository(tmp_path, durability="none") as repo:
        repo.append(ConversationMessageRecord(content="hi", channel_id="c", hlc=str(future)))
        repo.close()
    with ConversationStateRepository(tmp_path, durability="none") as repo:
        issued = [repo.clock.now() for _ in range(5)]      # nothing stored: only the clock moved
    with ConversationStateRepository(tmp_path, durability="none") as repo:
        assert repo.clock.now() > issued[-1]

def test_close_after_appends_only_leaves_the_manifest_and_the_clock_still_passes_them(tmp_path):
    """A session that only appended needs no new manifest at close (the next
    open reads the stamps of the tail's lines after the last compaction);
    one whose clock handed out a stamp (clock.now(), a deletion) or observed
    a merged op that nothing stores writes it, so the next session's stamps
    come after those too."""
    import time

    from rune_fast.sync import Hlc, op_from_record_dict
    manifest = tmp_path / "hot" / "conversation_manifest.json"
    ahead = Hlc(int(time.time() * 1000) + 600_000, 7, "devF")
    with ConversationStateRepository(tmp_path, compact_every=1000) as repo:
        repo.append(msg(0))
    before = read(manifest)
    with ConversationStateRepository(tmp_path, compact_every=1000) as repo:
        repo.append(msg(1, hlc=str(ahead)))
        repo.append(ConversationMessageRecord(msg_id="late", content="x", channel_id="ch",
                                              ts=time.time() + 3600))
    assert read(manifest) == before
    with ConversationStateRepository(tmp_path, compact_every=1000) as repo:
        assert repo.clock.now() > Hlc(round(repo.get_message("late").record.ts * 1000), 0, "")
    assert read(manifest) != before                  # now() handed out a stamp
    # a merged op refused (its id deleted) is observed, stored nowhere
    with ConversationStateRepository(tmp_path, compact_every=1000) as repo:
        assert repo.delete("msg_00000000")
    further = Hlc(int(time.time() * 1000) + 7_200_000, 0, "devG")
    with ConversationStateRepository(tmp_path, compact_every=1000) as repo:
        before = read(manifest)
        assert repo.merge_ops([op_from_record_dict(msg(0, hlc=str(further)))]) == 0
    assert read(manifest) != before
    with ConversationStateRepository(tmp_path, compact_every=1000) as repo:
        assert repo.clock.now() > further


def test_a_future_unstamped_message_moves_the_clock_so_a_later_deletion_syncs(tmp_path):
    """Section 7: the store observes every hlc it stores; an unstamped
    message's is Hlc(round(ts*1000), 0, origin). A deletion after a message
    dated an hour ahead must still sort after it, or an incremental export
    (since the newest stamp the other store saw) leaves the deletion out."""
    import time
    with ConversationStateRepository(tmp_path / "a") as a, ConversationStateRepository(tmp_path / "b") as b:
        old = ConversationMessageRecord(content="old", channel_id="c")
        ahead = ConversationMessageRecord(content="ahead", channel_id="c", ts=time.time() + 3600)
        a.append_many([old, ahead])
        ops = a.export_ops()
        b.merge_ops(ops)
        since = max(o.hlc for o in ops)
        assert a.clock.now() > since
        a.delete(old.msg_id)
        b.merge_ops(a.export_ops(since=since))
        assert b.get_message(old.msg_id).status is ReadStatus.NOT_FOUND_CONFIRMED
    with ConversationStateRepository(tmp_path / "a") as a:          # also after a reopen
        assert a.clock.now() > since


def test_after_a_killed_writer_the_clock_passes_the_stamps_of_its_tail(tmp_path):
    """The manifest keeps the clock as of the last checkpoint; a writer killed
    after appending leaves lines after it, which the next open reads: the
    clock passes their stamps (an unstamped message's ts as section 7 stamps
    it, the latest of them) and their envelopes are all there."""
    import signal
    import subprocess
    import sys
    import time

    from rune_fast.events import EventStore
    from rune_fast.sync import Hlc
    now_ms = int(time.time() * 1000)
    stamped = Hlc(now_ms + 600_000, 3, "devS")
    writer = (
        "import sys, time\n"
        "from rune_fast import ConversationStateRepository as R, ConversationMessageRecord as M\n"
        "r = R(sys.argv[1], compact_every=1000)\n"
        "r.append_many([M(msg_id=f'm{i}', content='x', channel_id='c', ts=time.time() + 3600 * i)"
        " for i in range(1, 4)])\n"
        "r.append(M(msg_id='s', content='y', channel_id='c', hlc=sys.argv[2]))\n"
        "r.append(M(msg_id='m0', content='z', channel_id='c'))\n"
        "print('DONE', flush=True)\n"
        "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", writer, str(tmp_path), str(stamped)],
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "DONE"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    with ConversationStateRepository(tmp_path, compact_every=1000) as repo:
        assert len(repo) == 5
        assert repo.stats()["compactions"] == 0
        newest = repo.get_message("m3").record.ts
        after = repo.clock.now()
        assert after > stamped
        assert after > Hlc(round(newest * 1000), 0, "")
    ids = [e.get("id") for e in EventStore(tmp_path / "events.jsonl").iter_envelopes()
           if e.get("type") == "conversation.message"]
    assert sorted(ids) == ["m0", "m1", "m2", "m3", "s"]


def test_resume_shortcut_matches_the_fold_property(tmp_path_factory):
    """Random appends (clock-stamped, hand-stamped with odd or out-of-order
    stamps, unstamped with any ts, system messages) between resume calls: the
    store's answer is always the fold of its own exported ops."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    stamps = st.one_of(st.just("clock"), st.just(""), st.sampled_from(["h1", "zz", "000000000000005-0000000000-x"]),
                       st.integers(0, 2 * 10**12).map(lambda w: f"{w:015d}-0000000000-d"))
    times = st.one_of(st.floats(1.6e9, 1.8e9), st.floats(-1e3, 1e16), st.just(1e306))
    step = st.tuples(stamps, times, st.sampled_from(["user", "assistant", "system"]), st.booleans())

    @settings(max_examples=60)
    @given(st.lists(step, min_size=1, max_size=40), st.integers(0, 6))
    def run(steps, n):
        d = tmp_path_factory.mktemp("resume")
        with ConversationStateRepository(d, compact_every=7, hot_window=3) as repo:
            for i, (stamp, ts, role, ask) in enumerate(steps):
                hlc = str(repo.clock.now()) if stamp == "clock" else stamp
                repo.append(ConversationMessageRecord(msg_id=f"m{(i * 7919) % 1000:04d}", ts=ts, hlc=hlc,
                                                      role=role, content=f"c{i}", channel_id="c"))
                if ask:
                    assert repo.resume_messages("c", n) == _resume_by_ops(repo, "c", n)
            assert repo.resume_messages("c", n) == _resume_by_ops(repo, "c", n)

    import logging
    logging.disable(logging.WARNING)        # the odd stamps are logged once per export
    try:
        run()
    finally:
        logging.disable(logging.NOTSET)


def test_reader_sees_deletions_after_refresh(tmp_path):
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many(msg(i) for i in range(4))
        with ConversationStateRepository(tmp_path, read_only=True) as viewer:
            repo.delete("msg_00000001")
            repo.append(msg(9))
            viewer.refresh()
            assert [r.msg_id for r in viewer.window("ch", 10)] == [
                "msg_00000000", "msg_00000002", "msg_00000003", "msg_00000009"]
            assert viewer.get_message("msg_00000001").status is ReadStatus.NOT_FOUND_CONFIRMED


def test_search_special_lines_follow_the_tail_and_compaction(tmp_path):
    """Lines holding a character that folds to ASCII ('ß' -> 'ss') are found
    once per segment and kept; the tail is scanned on as it grows, and a
    compaction that rewrites or drops segments leaves no stale candidate."""
    texts = ["Stra\u00dfe", "STRASSE", "strasse", "Masse", "gro\u00df", "plain"]

    def want(repo_msgs, needle):
        return sorted(m.msg_id for m in repo_msgs if needle.casefold() in m.content.casefold())

    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=3) as repo:
        stored = []
        for i in range(12):
            m = msg(i, channel=f"c{i % 2}", content=texts[i % len(texts)] + f" {i}")
            repo.append(m)
            stored.append(m)
            for needle in ("strasse", "SS", "gross"):
                assert sorted(h.record.msg_id for h in repo.search(needle)) == want(stored, needle)
        assert sorted(h.record.msg_id for h in repo.search("ss", "c0")) == \
            want([m for m in stored if m.channel_id == "c0"], "ss")
        repo.delete(stored[0].msg_id)
        stored = stored[1:]
        assert sorted(h.record.msg_id for h in repo.search("strasse")) == want(stored, "strasse")
        repo.compact()              # cools, erases, rewrites segments
        for i in range(12, 20):
            m = msg(i, content=texts[i % len(texts)])
            repo.append(m)
            stored.append(m)
        for needle in ("strasse", "ss", "gross"):
            assert sorted(h.record.msg_id for h in repo.search(needle)) == want(stored, needle)
        repo.compact()
        assert sorted(h.record.msg_id for h in repo.search("ss")) == want(stored, "ss")


def test_integers_beyond_64_bits_come_back_exactly_from_every_tier(tmp_path):
    """Tool-call arguments may hold any JSON integer; orjson reads one beyond
    64 bits as a float, so such lines and rows are read with json."""
    args = {"big": 2 ** 70, "neg": -(2 ** 63) - 1, "edge": 2 ** 64 - 1, "digits": "1234567890123456789012"}
    big = [ConversationMessageRecord(msg_id=f"big_{i}", role="assistant", content=f"call {i}",
                                     channel_id="ch", tool_calls=[{"id": f"c{i}", "name": "f", "arguments": args}],
                                     token_estimate=5, ts=1_700_000_000.0 + i) for i in range(4)]
    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
        for m in big:
            repo.append(m)
        repo._decoded.clear()
        assert [repo.get_message(m.msg_id).record for m in big] == big        # tail
        repo.compact()                                                        # 2 cool, 2 hot
    with ConversationStateRepository(tmp_path, compact_every=1000, hot_window=2) as repo:
        assert [repo.get_message(m.msg_id).tier for m in big] == ["cool", "cool", "hot", "hot"]
        assert [repo.get_message(m.msg_id).record for m in big] == big
        assert repo.window("ch", 10) == big
        assert [h.record for h in repo.search("call")] == big


def test_big_token_estimate_beside_an_argument_named_token_estimate(tmp_path):
    """A tool call's arguments may hold a key ``token_estimate`` of their own;
    the record's estimate beyond 64 bits, before it, still reads exactly. The
    reader used to look for long numbers only after the last such key, read
    the estimate as a float and refuse to open the store as damaged."""
    calls = ({"id": "", "name": "", "arguments": None},
             {"id": "c", "name": "f", "arguments": {"token_estimate": None}})
    big = [ConversationMessageRecord(msg_id=f"te_{i}", content="x", channel_id="ch", token_estimate=t,
                                     tool_calls=calls, ts=1_700_000_000.0 + i)
           for i, t in enumerate((2**63, 2**64 - 1, 2**64, 2**70))]
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=0) as repo:
        repo.append_many(big)
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=0) as repo:
        repo._decoded.clear()
        assert [repo.get_message(m.msg_id).record for m in big] == big        # tail
        repo._decoded.clear()
        assert repo.compact().cooled == 4                                     # copied from the lines
        assert [repo.get_message(m.msg_id).record for m in big] == big        # cool
        assert repo.verify().ok


@pytest.mark.parametrize("depth", [250, 253, 254, 255, 300])
def test_deeply_nested_arguments_in_every_tier(tmp_path, depth):
    """Arguments nested about as deep as orjson writes (it stops at 255
    levels) are stored, cooled and read exactly. At 253-254 levels the cool
    writer used to raise inside compaction, and so every later append that
    ran an automatic one."""
    args = 1
    for _ in range(depth):
        args = [args]
    deep = ConversationMessageRecord(msg_id="deep", content="x", channel_id="c", ts=1.0,
                                     tool_calls=[{"id": "i", "name": "n", "arguments": args}])
    with ConversationStateRepository(tmp_path, hot_window=0, compact_every=8) as repo:
        repo.append(deep)
        repo.append_many(msg(i, channel="c") for i in range(20))     # automatic compactions
        repo.compact()
        assert repo.get_message("deep").tier == "cool"
        repo._cool_decoded.clear()
        assert repo.get_message("deep").record == deep          # (its line, decoded again)
        repo._cool_dense.clear()
        assert repo.get_message("deep").record == deep          # (its row's pages)
    with ConversationStateRepository(tmp_path, hot_window=0) as repo:
        assert repo.get_message("deep").record == deep
        assert repo.window("c", 30)[0] == deep
        assert repo.verify().ok


def test_a_readers_edit_of_a_cached_record_never_reaches_disk_verify_or_export(tmp_path):
    """Records come from a read cache: a reader that tries to edit one's
    tool calls in place (they are read-only: TypeError) must not change what
    cooling writes, what verify() compares with the envelopes or what
    export_ops() sends. Cooling used to copy the edited record into the
    archive (with a digest of the edit), and verify() then reported a
    damaged envelope."""
    calls = [{"id": "i", "name": "n", "arguments": {"a": 1, "big": 2**70}}]
    m = ConversationMessageRecord(msg_id="m", content="x", channel_id="c", ts=1.0, tool_calls=calls)
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=0) as repo:
        repo.append(m)
        with pytest.raises(TypeError, match="read-only"):
            repo.get_message("m").record.tool_calls[0]["arguments"]["a"] = 2
        assert repo.verify().ok
        assert [op.payload["tool_calls"] for op in repo.export_ops()] == [calls]
        repo.compact()
        with pytest.raises(TypeError, match="read-only"):
            repo.get_message("m").record.tool_calls[0]["arguments"]["a"] = 3
        assert [op.payload["tool_calls"] for op in repo.export_ops()] == [calls]
    with ConversationStateRepository(tmp_path) as repo:
        assert repo.get_message("m").record == ConversationMessageRecord.from_dict({**m.to_dict(), "tool_calls": calls})
        assert repo.verify().ok



def _call_msg(mid: str, ts: float, args: dict) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=mid, role="assistant", content=f"calls {mid}", channel_id="c",
                                     task_id="t", ts=ts, tool_calls=[{"id": f"call_{mid}", "name": "f",
                                                                      "arguments": args}])


@pytest.mark.parametrize("tier", ["tail", "hot", "cool"])
def test_each_read_hands_out_tool_calls_of_its_own(tmp_path, tier):
    """The reads serve records from caches, and the dicts inside tool_calls
    would be the mutable part of a record: a caller that tries to edit what
    window(), get_message(), messages_for_task() or search() returned gets
    TypeError at every level (they are read-only), and an edit of the
    record it appended changes nothing that a later read returns, in either
    tier. They used to hand out the cached record itself, so an edit showed
    in every later read and in resume_messages(), which then disagreed with
    the fold of export_ops()."""
    from rune_fast.sync import fold, repair
    orig = [_call_msg("a", 1.0, {"q": "one", "deep": [{"k": 1}]}), _call_msg("b", 2.0, {"q": "two"})]
    tool = ConversationMessageRecord(msg_id="r", role="tool", content="result", channel_id="c", task_id="t",
                                     ts=3.0, tool_call_id="call_b")
    mine = [ConversationMessageRecord.from_dict(m.to_dict()) for m in orig]
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=1 if tier == "cool" else 512,
                                     durability="none") as repo:
        repo.append(mine[0])
        repo.append_many([mine[1], tool])
        mine[0].tool_calls[0]["arguments"]["q"] = "appended, then edited"    # the caller's own record
        if tier != "tail":
            repo.compact()
        assert [repo.get_message(m.msg_id).tier for m in orig] == [tier, tier]
        resumed = repo.resume_messages("c")
        assert resumed == repair(fold(repo.export_ops(), "c"))

        def edit(rec):
            assert rec.tool_calls
            for call in rec.tool_calls:
                attempts = [lambda: call.__setitem__("name", "edited"), lambda: call.pop("id"),
                            lambda: call["arguments"].__setitem__("q", "edited"),
                            lambda: call["arguments"].update(q="edited")]
                for item in call["arguments"].get("deep", []):
                    attempts += [lambda: call["arguments"]["deep"].append({}),
                                 lambda: item.__setitem__("k", "edited")]
                for attempt in attempts:
                    with pytest.raises(TypeError, match="read-only"):
                        attempt()
        reads = [lambda: repo.window("c", 3)[:2], lambda: [repo.get_message(m.msg_id).record for m in orig],
                 lambda: repo.messages_for_task("t")[:2], lambda: [h.record for h in repo.search("calls")],
                 lambda: [h.record for h in repo.search("calls", limit=2)]]
        for read_ in reads:
            for rec in read_():
                edit(rec)
            for again in reads:
                assert again() == orig
            assert repo.resume_messages("c") == resumed
        assert repo.verify().ok
    with ConversationStateRepository(tmp_path) as repo:
        assert [repo.get_message(m.msg_id).record for m in orig] == orig


@pytest.mark.parametrize("kind", ["tuple", "mapping"])
def test_a_tool_call_value_edited_into_a_tuple_or_mapping_is_cached_as_stored(tmp_path, kind):
    """A caller may edit its record's call dicts after building it: a tuple or
    a Mapping that is no dict is accepted (stored as a JSON list / object),
    and the cache and every read must hold that stored value, detached from
    the caller's object and from each other read (found by the review: the
    copy kept such values shared)."""
    import collections
    import types
    m = ConversationMessageRecord(msg_id="a", role="assistant", content="x", channel_id="c",
                                  tool_calls=[{"id": "i", "name": "n", "arguments": {}}])
    inner = {"k": 1}
    m.tool_calls[0]["arguments"]["t"] = ((inner,) if kind == "tuple"
                                         else types.MappingProxyType(collections.OrderedDict(k=inner)))
    stored = {"t": [{"k": 1}]} if kind == "tuple" else {"t": {"k": {"k": 1}}}
    with ConversationStateRepository(tmp_path, durability="none") as repo:
        assert repo.append(m)
        inner["k"] = "edited by the caller after append"
        got = repo.window("c", 1)[0]
        assert got.tool_calls[0]["arguments"] == stored
        with pytest.raises(TypeError, match="read-only"):
            (got.tool_calls[0]["arguments"]["t"][0] if kind == "tuple"
             else got.tool_calls[0]["arguments"]["t"]["k"])["k"] = "edited by a reader"
        assert repo.get_message("a").record.tool_calls[0]["arguments"] == stored
    with ConversationStateRepository(tmp_path, durability="none") as repo:
        assert repo.get_message("a").record.tool_calls[0]["arguments"] == stored


def test_own_calls_keeps_a_subclass_records_own_attributes():
    from rune_fast import codec

    class Tagged(ConversationMessageRecord):
        __slots__ = ("tag",)
    m = Tagged(msg_id="m", channel_id="c", tool_calls=[{"id": "i", "name": "n", "arguments": {"a": 1}}])
    object.__setattr__(m, "tag", "mine")
    got = codec.own_calls([m])[0]
    assert type(got) is Tagged and got.tag == "mine" and got == m
    assert got.tool_calls[0] is not m.tool_calls[0]

def test_own_calls_copies_every_field_and_every_nested_value():
    """codec.own_calls (compiled) lists the record's fields itself: a field
    it missed would be lost (this record sets every field to a non-default
    value), and a dict or list it shared would alias the cache."""
    import dataclasses

    from rune_fast import codec
    fields = {f.name: getattr(ConversationMessageRecord(channel_id="x"), f.name)
              for f in dataclasses.fields(ConversationMessageRecord)}
    m = ConversationMessageRecord(msg_id="m", ts=5.5, role="assistant", content="c", channel_id="ch",
                                  task_id="t", token_estimate=9, tool_call_id="tc", origin="o",
                                  hlc="000000000000001-0000000000-o",
                                  tool_calls=[{"id": "i", "name": "n", "arguments": {"l": [{"d": [1]}]}}])
    assert set(fields) == set(m.to_dict()) - {"schema_version"}
    plain = ConversationMessageRecord(msg_id="p", channel_id="ch")

    class Sub(ConversationMessageRecord):
        __slots__ = ()
    sub = Sub(msg_id="s", channel_id="ch", tool_calls=[{"id": "i", "name": "n", "arguments": {"a": [1]}}])
    got = codec.own_calls([m, plain, sub])
    assert got[0] == m and got[0] is not m and got[1] is plain
    assert all(getattr(got[0], f) == getattr(m, f) for f in fields)
    assert type(got[2]) is Sub and got[2] == sub and got[2] is not sub

    def containers(v):
        if isinstance(v, (dict, list)):
            yield v
            for x in (v.values() if isinstance(v, dict) else v):
                yield from containers(x)
    for a, b in ((got[0], m), (got[2], sub)):
        ids = {id(x) for c in b.tool_calls for x in containers(c)}
        assert not ids & {id(x) for c in a.tool_calls for x in containers(c)}


def test_own_calls_copies_field_by_field_when_a_record_is_more_than_its_slots():
    """The compiled copy takes a record's field pointers as they lie only
    when the type is its slots and nothing else; any other type is copied
    field by field."""
    from rune_fast import _encode, codec

    class WithDict(ConversationMessageRecord):     # no __slots__: a __dict__ too
        pass
    m = WithDict(msg_id="m", ts=2.0, role="assistant", content="c", channel_id="ch", task_id="t",
                 tool_call_id="tc", origin="o", tool_calls=[{"id": "i", "name": "n", "arguments": {"a": [1]}}])
    try:
        _encode.own_calls_setup(WithDict, None, codec._stored_value)
        got = codec.own_calls([m])[0]
    finally:
        _encode.own_calls_setup(ConversationMessageRecord, codec._copy_record, codec._stored_value)
    assert type(got) is WithDict and got == m and got is not m
    assert got.tool_calls[0] is not m.tool_calls[0]
    assert got.tool_calls[0]["arguments"]["a"] is not m.tool_calls[0]["arguments"]["a"]

def _tiers(repo, msgs):
    return [repo.get_message(m.msg_id).tier for m in msgs]


def test_automatic_compaction_cools_what_compact_would(tmp_path):
    """SPEC: compaction runs by itself every compact_every messages and cools
    each channel's messages beyond its newest hot_window. A small window
    cools any excess (from 64 messages on it waits for tuning.COOL_DUE_ROWS),
    and a small merge of archive files runs inline: it used to run in a
    thread during which automatic compactions cooled nothing, so the tiers
    of a small store depended on the thread's timing."""
    ms = [msg(i) for i in range(12)]
    with ConversationStateRepository(tmp_path / "a", compact_every=1, hot_window=8) as repo:
        for m in ms[:9]:
            repo.append(m)
        assert _tiers(repo, ms[:9]) == ["cool"] + ["hot"] * 8
    with ConversationStateRepository(tmp_path / "b", compact_every=1, hot_window=1) as auto, \
            ConversationStateRepository(tmp_path / "c", compact_every=10**9, hot_window=1) as manual:
        for m in ms:
            auto.append(m)
            manual.append(m)
            manual.compact()
        assert _tiers(auto, ms) == _tiers(manual, ms) == ["cool"] * 11 + ["hot"]


def test_decode_cache_stays_bounded_by_a_large_batch(tmp_path):
    with ConversationStateRepository(tmp_path, durability="none", compact_every=10**6,
                                     hot_window=10**6) as repo:
        repo.append_many([msg(i) for i in range(100)])
        repo.append_many([msg(i) for i in range(100, 100 + tuning.DECODE_CACHE + 500)])
        assert len(repo._decoded) <= tuning.DECODE_CACHE
        newest = f"msg_{100 + tuning.DECODE_CACHE + 499:08d}"
        assert any(rec.msg_id == newest for rec, _seq in repo._decoded.values())
        assert repo.get_message("msg_00000000").record == msg(0)


@pytest.mark.parametrize("tier", ["hot", "cool"])
def test_verify_checks_envelopes_against_records_of_every_tier(tmp_path, tier):
    """An envelope whose payload_hash no longer matches its stored record is
    reported by verify(), whichever tier holds the record."""
    from rune_fast.events import frame
    with ConversationStateRepository(tmp_path, hot_window=2) as repo:
        repo.append_many([msg(i) for i in range(6)])
        repo.compact()                               # msg 0-3 cool, 4-5 hot
        assert repo.verify().ok
        assert repo.get_message(msg(0).msg_id).tier == "cool"
    target = msg(0 if tier == "cool" else 5).msg_id
    path = tmp_path / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    for k, line in enumerate(lines):
        env = orjson.loads(line)
        if env.get("id") == target and env["type"] == "conversation.message":
            env["payload_hash"] = "0" * 64
            rest = orjson.dumps({key: v for key, v in env.items() if key != "x"})
            lines[k] = frame(b"," + rest[1:])
            break
    else:
        raise AssertionError(f"no envelope of {target}")
    path.write_bytes(b"".join(lines))
    with ConversationStateRepository(tmp_path, hot_window=2) as repo:
        rep = repo.verify()
        assert not rep.ok and rep.checked["records"] == 6
        assert [p for p in rep.problems if target in p.message and p.file == str(path)], rep.problems


def test_deletion_after_a_fold_only_compaction_survives_close(tmp_path):
    """A close that records an automatic compaction's in-memory fold in the
    manifest must not mark later deletions as erased: a deleted cool message
    came back in window() and len() after the reopen, and its bytes were never
    erased."""
    A = [ConversationMessageRecord(msg_id=f"a{i}", role="user", content=f"alpha {i}", channel_id="A",
                                   ts=1.0 + i) for i in range(12)]
    B = [ConversationMessageRecord(msg_id=f"b{i}", role="user", content=f"bravo {i}", channel_id="B",
                                   ts=100.0 + i) for i in range(4)]
    with ConversationStateRepository(tmp_path, hot_window=8, compact_every=4) as repo:
        repo.append_many(A)
        repo.compact()                           # a0-a3 cool
        for m in B:
            repo.append(m)                       # an automatic compaction that only folds
        assert repo.get_message("a0").tier == "cool"
        assert repo.delete("a0")
    with ConversationStateRepository(tmp_path, hot_window=8, compact_every=4) as repo:
        assert len(repo) == 15
        assert [m.msg_id for m in repo.window("A", 20)] == [m.msg_id for m in A[1:]]
        assert repo.get_message("a0").status is ReadStatus.NOT_FOUND_CONFIRMED
        assert repo.search("alpha 0") == []
        repo.compact()
    for root, _dirs, files in os.walk(tmp_path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                assert b"alpha 0" not in fh.read(), f"deleted content left in {f}"


def test_one_envelope_per_append_across_a_fold_and_a_reopen(tmp_path):
    """An automatic compaction that only folds the tail, more appends, a
    delete, a close that records the fold: the reopen must find every
    envelope where the manifest says (it re-derived the envelopes of the
    appends after the fold a second time: 8 of 200 with the defaults)."""
    import collections
    ms = [msg(i, channel=f"c{i % 3}") for i in range(200)]
    with ConversationStateRepository(tmp_path) as repo:
        for m in ms:
            assert repo.append(m)
        assert repo.delete(ms[150].msg_id)
    for _ in range(2):
        with ConversationStateRepository(tmp_path) as repo:
            assert len(repo) == 199
    envs = [orjson.loads(line) for line in (tmp_path / "events.jsonl").read_bytes().splitlines()]
    per_id = collections.Counter(e["id"] for e in envs if e["type"] == "conversation.message")
    assert sorted(per_id) == sorted(m.msg_id for m in ms) and set(per_id.values()) == {1}
    assert [e["id"] for e in envs if e["type"] == "conversation.deleted"] == [ms[150].msg_id]


def test_flush_makes_deletions_durable_in_every_mode(tmp_path, monkeypatch):
    """durability='none' leaves deletions to the OS, but flush() makes
    everything written so far durable, the tombstones file included."""
    synced: list[str] = []
    real = os.fdatasync

    def fdatasync(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real(fd)
    with ConversationStateRepository(tmp_path, durability="none") as repo:
        repo.append_many([msg(i) for i in range(3)])
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        assert repo.delete(msg(1).msg_id)
        assert not any("tombstones" in f for f in synced)
        repo.flush()
        assert any("tombstones" in f for f in synced), synced
        synced.clear()
        repo.flush()                      # nothing new to sync there
        assert not any("tombstones" in f for f in synced), synced


def test_search_keeps_its_whole_segment_pass_on_a_sound_store(tmp_path, monkeypatch):
    """Only a segment holding a damaged dead line, a cut line or zeroed live
    lines is searched line by line; a rolled tail's trailing zeros
    (preallocation) are not damage, so a sound store keeps the fast pass."""
    import rune_fast.segments as segments
    monkeypatch.setattr(tuning, "ROLL_BYTES", 1500)
    monkeypatch.setattr(segments, "_MIN_CHUNK", 4096)   # small rolled tails keep their zeros
    with ConversationStateRepository(tmp_path, hot_window=50) as repo:
        for k in range(6):
            repo.append_many([msg(10 * k + i, content=f"needle {k} {i}") for i in range(10)])
            repo.compact()
        assert repo.stats()["segments"] >= 3
        padded = [p for p in (tmp_path / "hot").iterdir() if p.name.startswith("conversation_seg-")
                  and p.read_bytes().endswith(b"\0")]
        assert padded, "no sealed segment with trailing zeros"
        assert len(repo.search("NEEDLE")) == 60
        assert not repo._ragged
    seg = sorted(p for p in (tmp_path / "hot").iterdir() if p.name.startswith("conversation_seg-"))[0]
    data = bytearray(seg.read_bytes())
    first = data.index(b"\n") + 1
    data[first + 5:first + 9] = b"\0\0\0\0"           # the second line's checksum digits zeroed
    seg.write_bytes(bytes(data))
    with ConversationStateRepository(tmp_path, hot_window=50) as repo:
        with pytest.raises(CorruptStateCheckpointError):
            repo.search("needle")                        # a live line: loud


def test_a_viewer_that_reloads_again_and_again_keeps_its_descriptors_bounded(tmp_path):
    """Each refresh() after the writer moved the manifest reloads the viewer's
    state; the replaced tail, segments and archive are closed (300 reloads
    leaked about 300 descriptors: an agent's viewer would run out of them)."""
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=10**6, durability="none") as w:
        w.append_many([msg(i) for i in range(20)])
        w.compact()
        with ConversationStateRepository(tmp_path, read_only=True) as v:
            for i in range(10):
                w.append(msg(100 + i))
                w.compact()
                v.refresh()
            before = fds()
            for i in range(50):
                w.append(msg(200 + i))
                w.compact()                       # the manifest moves: the viewer reloads
                v.refresh()
            assert fds() <= before + 3, (before, fds())
            assert len(v) == len(w) == 80


def test_a_viewer_refresh_that_meets_a_replaced_file_reads_the_new_state(tmp_path, monkeypatch):
    """refresh() with an unchanged manifest reads on from where it was; if the
    writer moves the manifest meanwhile and a file it read is gone, the
    refresh reads the new state instead of raising (damage still raises)."""
    from rune_fast.conversation_state import CorruptStateCheckpointError as Corrupt
    with ConversationStateRepository(tmp_path, hot_window=2, compact_every=10**6) as w:
        w.append_many([msg(i) for i in range(6)])
        w.compact()
        with ConversationStateRepository(tmp_path, read_only=True) as v:
            w.append(msg(6))
            real = ConversationStateRepository._refresh_tombstones
            calls = []

            def racing(self):
                calls.append(1)
                if len(calls) == 1:
                    w.delete(msg(0).msg_id)
                    w.compact()                  # the manifest moves, files are replaced
                    raise Corrupt("cool archive cannot be opened: gone", path=str(tmp_path))
                return real(self)
            monkeypatch.setattr(ConversationStateRepository, "_refresh_tombstones", racing)
            v.refresh()
            assert len(v) == 6 and v.get_message(msg(0).msg_id).status is ReadStatus.NOT_FOUND_CONFIRMED
            monkeypatch.setattr(ConversationStateRepository, "_refresh_tombstones",
                                lambda self: (_ for _ in ()).throw(Corrupt("damaged", path="x")))
            w.append(msg(7))
            with pytest.raises(Corrupt):
                v.refresh()                       # the manifest did not move: damage is loud


def test_a_viewers_verify_after_its_writer_compacted_checks_the_new_state(tmp_path):
    """SPEC: verify() reports every problem, and a viewer opens beside a
    running writer. A viewer's verify() after the writer compacted (cool
    files merged or erased, segments sealed: the files the viewer had read
    are gone) reported them missing although the store is sound; it now
    reads the new state, as the viewer's other reads do. Damage stays loud."""
    with ConversationStateRepository(tmp_path, hot_window=2, compact_every=10**6, durability="none") as w:
        w.append_many([msg(i, channel=f"c{i % 3}") for i in range(30)])
        w.compact()
        with ConversationStateRepository(tmp_path, read_only=True) as v:
            assert v.verify().ok
            w.delete(msg(0).msg_id)                 # erased by the next compaction: a cool file rewritten
            w.append_many([msg(i, channel=f"c{i % 3}") for i in range(30, 60)])
            w.compact()
            w.flush()
            report = v.verify()                     # no refresh() first
            assert report.ok, report.problems
            assert report.checked["records"] == 59
            w.close()
            seg = sorted(f for f in os.listdir(tmp_path / "hot") if f.startswith("conversation_seg-"))[0]
            with open(tmp_path / "hot" / seg, "r+b") as f:
                f.seek(40)
                byte = f.read(1)
                f.seek(40)
                f.write(bytes([byte[0] ^ 0x01]))
            v.refresh()
            report = v.verify()
            assert not report.ok and any(p.file.endswith(seg) for p in report.problems)


@pytest.mark.parametrize("durability", ["fsync", "batch"])
def test_a_viewer_shows_a_line_only_once_the_writer_has_synced_it(tmp_path, durability):
    """SPEC: refresh() "picks up what the writer has made durable since". A
    viewer read the tail's bytes as the writer wrote them, so a message was
    visible before its sync (and before append() acknowledged it): a power
    loss then could take back what a viewer had shown. The writer now
    publishes where its durable lines end (hot/conversation_tail.durable)."""
    with ConversationStateRepository(tmp_path, durability=durability) as w:
        w.append(msg(0))
        with ConversationStateRepository(tmp_path, read_only=True) as v:
            assert len(v) == 1
            tail = w._tail
            real_sync = tail.sync
            seen_before_sync = []

            def sync():
                v.refresh()
                seen_before_sync.append((len(v), v.get_message(msg(1).msg_id).status))
                real_sync()
            tail.sync = sync
            w.append(msg(1))
            assert seen_before_sync == [(1, ReadStatus.NOT_FOUND_CONFIRMED)]
            assert v.refresh() == 1
            assert v.get_message(msg(1).msg_id).record == msg(1)
            del tail.sync
            # a viewer opened now reads as far as the mark too
            w._writes._mark.publish(w._writes._published - 1)      # (as if the last sync had not returned yet)
            with ConversationStateRepository(tmp_path, read_only=True) as v2:
                assert len(v2) == 1
            w._writes._mark.publish(w._writes._published)


@pytest.mark.parametrize("durability", ["fsync", "batch"])
def test_every_acknowledged_append_is_within_the_published_mark(tmp_path, durability):
    """Group commit: the syncing thread reads how far the tail was written
    and where the written lines end without the repository lock. The
    location used to be set after the count (with a tail remap in between),
    so a syncer could count an append's bytes, publish the location before
    them, and tell that appender "durable" while viewers could not see its
    line until some later sync (found by the review). The patches only
    stretch the windows: a sync held back, and a remap."""
    import time
    with ConversationStateRepository(tmp_path, durability=durability, compact_every=10**9) as w, \
            ConversationStateRepository(tmp_path, read_only=True) as v:
        tail = w._tail
        real_append, real_sync, real_reattach = tail.append, tail.sync, w._reattach_tail
        c_may_finish = threading.Event()

        def sync():
            if threading.current_thread().name == "C":
                c_may_finish.wait(10)
            real_sync()

        def append(data):
            off, remapped = real_append(data)
            return off, remapped or threading.current_thread().name == "A"    # as if the map grew

        def reattach():
            c_may_finish.set()          # C's sync returns; B becomes the syncer
            time.sleep(0.3)             # B reads what was written meanwhile
            real_reattach()
        tail.sync, tail.append, w._reattach_tail = sync, append, reattach
        threads = [threading.Thread(name=n, target=w.append, args=(msg(i),)) for i, n in enumerate("CBA")]
        for t in threads:
            t.start()
            time.sleep(0.15)            # C syncing (held back), B waiting for it, then A
        for t in threads:
            t.join()
        time.sleep(0.1)
        v.refresh()
        assert len(v) == 3, (w._writes._published & ((1 << 40) - 1), w._writes._wmark & ((1 << 40) - 1))


def test_a_new_mark_hides_nothing_before_the_writers_first_publication(tmp_path):
    """The writer creates the mark at open and publishes at the end of its
    open: a viewer reading the mark in between (or after an open that
    failed) must see every complete line, as without a mark; a mark created
    holding location 0 hid the whole tail (found by the review)."""
    from rune_fast.segments import DurableMark
    with ConversationStateRepository(tmp_path, durability="none") as w:
        w.append_many([msg(i) for i in range(5)])
    mark = tmp_path / "hot" / "conversation_tail.durable"
    os.unlink(mark)
    fresh = DurableMark(str(mark), writer=True)     # created, not yet published
    try:
        assert DurableMark(str(mark), writer=False).read() is None
        with ConversationStateRepository(tmp_path, read_only=True) as v:
            assert len(v) == 5
    finally:
        fresh.close()


def test_a_viewers_verify_reports_a_damaged_new_state_instead_of_raising(tmp_path):
    """verify() raises nothing: a viewer whose writer moved the manifest to a
    state that is damaged reports it (found by the review)."""
    with ConversationStateRepository(tmp_path, hot_window=2, compact_every=10**6, durability="none") as w:
        w.append_many([msg(i, channel=f"c{i % 3}") for i in range(30)])
        w.compact()
        with ConversationStateRepository(tmp_path, read_only=True) as v:
            w.delete(msg(0).msg_id)                 # erased by the next compaction: a cool file rewritten
            w.append_many([msg(i, channel=f"c{i % 3}") for i in range(30, 60)])
            w.compact()
            w.close()
            for name in os.listdir(tmp_path / "hot"):
                if name.startswith("conversation_seg-"):
                    os.unlink(tmp_path / "hot" / name)
            report = v.verify()
            assert not report.ok
            assert any("missing" in p.message for p in report.problems)

def test_a_viewer_beside_a_none_writer_sees_each_write_and_every_sealed_line(tmp_path, caplog):
    """durability="none" leaves durability to the OS: a viewer sees each line
    once it is written. Lines of a tail the writer sealed (a compaction's
    roll) are durable, whatever the mark of the new tail says; a store
    without a mark (written by an earlier build) shows every complete line."""
    with ConversationStateRepository(tmp_path, durability="none", hot_window=2,
                                     compact_every=10**6) as w:
        with ConversationStateRepository(tmp_path, read_only=True) as v:
            for i in range(5):
                w.append(msg(i))
                assert v.refresh() == 1
            w.compact()
            w.append_many([msg(i) for i in range(5, 9)])
            v.refresh()
            assert [m.msg_id for m in v.window("ch", 20)] == [msg(i).msg_id for i in range(9)]
    mark = tmp_path / "hot" / "conversation_tail.durable"
    raw = mark.read_bytes()
    for flip in (8, 23):                # a bit of the location, a bit of its check
        mark.write_bytes(raw[:flip] + bytes([raw[flip] ^ 0x04]) + raw[flip + 1:])
        with caplog.at_level(logging.WARNING, logger="rune_fast"):
            with ConversationStateRepository(tmp_path, read_only=True) as v:
                assert len(v) == 9      # damage never hides a line
        assert "fails its check" in caplog.text
        caplog.clear()
    os.unlink(mark)
    with ConversationStateRepository(tmp_path, read_only=True) as v:
        assert len(v) == 9
    with ConversationStateRepository(tmp_path) as w:        # the writer writes it again
        assert (tmp_path / "hot" / "conversation_tail.durable").stat().st_mode & 0o777 == 0o600
        with ConversationStateRepository(tmp_path, read_only=True) as v:
            w.append(msg(9))
            assert v.refresh() == 1 and len(v) == 10


def _hlc(ms: int) -> str:
    return f"{ms:015d}-0000000000-dev"


@pytest.mark.parametrize("late_hlc", [_hlc(500), ""], ids=["older-stamp", "unstamped"])
@pytest.mark.parametrize("hot_window", [1, 2])
def test_compact_counts_cool_messages_in_the_hot_window(tmp_path, late_hlc, hot_window):
    # SPEC: compact() cools each channel's messages beyond its newest
    # hot_window. After the newest hot message is deleted, a late message that
    # sorts before a cool one (an older stamp, or no stamp) lies beyond the
    # window although the channel has fewer hot messages than hot_window:
    # it is cooled (the hot count alone used to keep it hot).
    olds = [msg(i, hlc=_hlc(1000 + i)) for i in range(hot_window)]
    newest = msg(50, hlc=_hlc(2000))
    late = msg(60, hlc=late_hlc)
    with ConversationStateRepository(tmp_path, hot_window=hot_window, compact_every=10**9) as repo:
        repo.append_many([*olds, newest])
        repo.compact()
        assert [repo.get_message(m.msg_id).tier for m in olds] == ["cool"] + ["hot"] * (hot_window - 1)
        assert repo.get_message(newest.msg_id).tier == "hot"
        repo.delete(newest.msg_id)
        repo.append(late)
        repo.compact()
        assert repo.window("ch", 10) == [late, *olds]
        assert repo.get_message(late.msg_id).tier == "cool"
        assert [repo.get_message(m.msg_id).tier for m in olds] == ["cool"] + ["hot"] * (hot_window - 1)
    with ConversationStateRepository(tmp_path, hot_window=hot_window) as repo:
        assert repo.window("ch", 10) == [late, *olds]
        assert repo.get_message(late.msg_id).tier == "cool"
        assert repo.verify().ok


@pytest.mark.parametrize("edit", ["id-int", "no-arguments", "nan", "surrogate", "object"])
def test_a_tool_call_edited_after_construction_is_checked_again_and_nothing_is_written(tmp_path, edit):
    # the dicts inside tool_calls are plain dicts: an edit made after the
    # constructor checked them used to be written as it was, and every later
    # open then refused the store as damaged
    m = ConversationMessageRecord(msg_id="tc", role="assistant", content="x", channel_id="c",
                                  tool_calls=[{"id": "a", "name": "f", "arguments": {}}])
    call = m.tool_calls[0]
    if edit == "id-int":
        call["id"] = 5
    elif edit == "no-arguments":
        del call["arguments"]
    elif edit == "nan":
        call["arguments"]["k"] = float("nan")
    elif edit == "surrogate":
        call["name"] = "\ud800"
    else:
        call["arguments"]["o"] = object()
    with ConversationStateRepository(tmp_path) as repo:
        repo.append(msg(1))
        before = {p: read(p) for p in files_under(tmp_path)}
        for write in (lambda: repo.append(m), lambda: repo.append_many([msg(2), m])):
            with pytest.raises((TypeError, ValueError), match=r"message 'tc': .*tool_calls\[0\]"):
                write()
        assert {p: read(p) for p in files_under(tmp_path)} == before
        assert len(repo) == 1 and repo.verify().ok
    with ConversationStateRepository(tmp_path) as repo:
        assert [r.msg_id for r in repo.window("ch")] == [msg(1).msg_id]


@pytest.mark.parametrize("field,value", [
    ("role", "bogus"), ("channel_id", ""), ("msg_id", ""), ("token_estimate", -3),
    ("token_estimate", None), ("content", 123), ("hlc", 5), ("task_id", None),
    ("content", "a\ud800b"), ("ts", 5)])
def test_a_field_set_past_the_constructor_is_checked_again_and_nothing_is_written(tmp_path, field, value):
    """A frozen record's field set with object.__setattr__ to what the
    constructor refuses: the write refuses it too, naming the field, and
    writes nothing (such a line was written, and every later open refused
    the store as damaged)."""
    m = ConversationMessageRecord(msg_id="fx", role="user", content="x", channel_id="c")
    object.__setattr__(m, field, value)
    with ConversationStateRepository(tmp_path) as repo:
        repo.append(msg(1))
        before = {p: read(p) for p in files_under(tmp_path)}
        for write in (lambda: repo.append(m), lambda: repo.append_many([msg(2), m])):
            with pytest.raises((TypeError, ValueError), match=field):
                write()
        assert {p: read(p) for p in files_under(tmp_path)} == before
        assert len(repo) == 1 and repo.verify().ok
    with ConversationStateRepository(tmp_path) as repo:
        assert [r.msg_id for r in repo.window("ch")] == [msg(1).msg_id]


@pytest.mark.parametrize("harm", ["events-gone", "events-folder", "sidecar-folder", "snapshot-cut"])
def test_verify_reports_files_gone_or_replaced_under_an_open_store(tmp_path, harm):
    """SPEC: verify() raises nothing. A file removed, cut or replaced by a
    folder while the store is open is a problem in the report, named."""
    def open_():
        return ConversationStateRepository(tmp_path, durability="none", compact_every=1000, hot_window=4)
    with open_() as repo:
        repo.append_many([msg(i) for i in range(20)])
        repo.compact()
    with open_() as repo:
        hot = tmp_path / "hot"
        if harm.startswith("events"):
            target = tmp_path / "events.jsonl"
            target.unlink()
            if harm == "events-folder":
                target.mkdir()
        elif harm == "sidecar-folder":
            target = next((hot / "conversation_cool_index").glob("*.idx"))
            target.unlink()
            target.mkdir()
        else:
            target = hot / "conversation_index.snap"
            os.truncate(target, 10)
        report = repo.verify()
        assert not report.ok
        assert any(str(target) in str(p) for p in report.problems), report.problems


def test_loose_constructor_arguments_are_refused_and_create_nothing(tmp_path, monkeypatch):
    """read_only takes a bool ("false" was a viewer), counts are not bools,
    and an empty state_dir is not the current folder."""
    from rune_fast.tasks import TaskStateRepository
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "never"
    for value in ("false", 1, None):
        with pytest.raises(TypeError, match="^read_only: expected bool"):
            ConversationStateRepository(target, read_only=value)
    for kw in ({"compact_every": True}, {"hot_window": True}, {"compact_every": None}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            ConversationStateRepository(target, **kw)
    for make in (lambda: ConversationStateRepository(""), lambda: TaskStateRepository(""),
                 lambda: ConversationStateRepository(target, events="")):
        with pytest.raises(ValueError, match="path is empty"):
            make()
    assert os.listdir(tmp_path) == []


def test_a_window_larger_than_any_store_is_every_message(tmp_path):
    with ConversationStateRepository(tmp_path, durability="none") as repo:
        repo.append_many([msg(i) for i in range(3)])
        assert repo.window("ch", 2 ** 63) == repo.window("ch", 10 ** 30) == [msg(i) for i in range(3)]


def test_verify_names_a_cool_file_whose_magic_changed(tmp_path):
    """The manifest keeps each cool file's whole-file hash: verify() after a
    reopen names the file whose leading magic was flipped (no page checksum
    covers it, pyarrow reads on), and every read stays exact."""
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=1000) as repo:
        repo.append_many([msg(i) for i in range(30)])
        repo.compact()
    cool = tmp_path / "hot" / "conversation_cool"
    (path,) = cool.glob("*.parquet")
    data = bytearray(path.read_bytes())
    data[1] ^= 0x20
    path.write_bytes(bytes(data))
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=1000) as repo:
        assert repo.window("ch", 30) == [msg(i) for i in range(30)]
        report = repo.verify()
        assert not report.ok and [p.file for p in report.problems] == [str(path)]


def test_merge_takes_a_tombstone_by_fold_s_rule_only(tmp_path):
    """A tombstone is a payload whose "deleted" is true (JSON true), as fold
    reads it: {"deleted": 1} deleted here while fold refused it as a turn
    without a role, so two readers of one op set disagreed. Now both refuse
    it, and nothing is deleted."""
    from rune_fast.sync import fold
    with ConversationStateRepository(tmp_path, durability="none") as repo:
        repo.append(msg(1))
        bad = ("msg_00000001", "000000000000009-0000000000-d", {"deleted": 1, "conversation_id": "ch"})
        with pytest.raises(ValueError):
            fold([bad], "ch")
        with pytest.raises(ValueError, match="msg_00000001"):
            repo.merge_ops([bad])
        assert repo.get_message("msg_00000001").status is ReadStatus.FOUND_VERIFIED
        good = ("msg_00000001", "000000000000009-0000000000-d", {"deleted": True, "conversation_id": "ch"})
        assert repo.merge_ops([good]) == 0
        assert repo.get_message("msg_00000001").status is ReadStatus.NOT_FOUND_CONFIRMED


def test_latest_task_checks_the_lines_it_reads(tmp_path):
    """A flipped byte in the task id of a channel's newest line, in the
    region the index snapshot vouches for: latest_task raises naming the
    file and the line's offset (it returned the flipped id as sound)."""
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many(msg(i, task=f"task{i}") for i in range(5))
    p = tmp_path / "hot" / "conversation_tail.jsonl"
    raw = bytearray(p.read_bytes())
    at = raw.rindex(b'"task4"') + 5
    raw[at] = ord("9")
    p.write_bytes(bytes(raw))
    with ConversationStateRepository(tmp_path) as repo:
        with pytest.raises(CorruptStateCheckpointError) as e:
            repo.latest_task("ch")
        assert e.value.path == str(p) and e.value.offset == raw.rindex(b"\n", 0, at) + 1


def test_bad_arguments_name_themselves_and_create_nothing(tmp_path):
    from rune_fast.tasks import TaskStateRepository
    target = tmp_path / "never"
    for make in (lambda: ConversationStateRepository(target, events=5),
                 lambda: TaskStateRepository(target, events=5)):
        with pytest.raises(TypeError, match="^events: expected a path"):
            make()
    for make in (lambda: ConversationStateRepository(None), lambda: TaskStateRepository(123),
                 lambda: ConversationStateRepository(os.fsencode(target)),
                 lambda: TaskStateRepository(os.fsencode(target))):
        with pytest.raises(TypeError, match="^state_dir: expected a path"):
            make()
    assert not target.exists()
    with ConversationStateRepository(tmp_path / "s") as repo:
        repo.append(msg(1))
        before = {p: read(p) for p in files_under(tmp_path / "s")}
        for call in (lambda: repo.window("\ud800"), lambda: repo.delete("\ud800"),
                     lambda: repo.clear_channel("\ud800"), lambda: repo.messages_for_task("\ud800"),
                     lambda: repo.latest_task("\ud800")):
            with pytest.raises(ValueError, match=r"^(channel_id|msg_id|task_id): .* not valid UTF-8"):
                call()
        with pytest.raises(TypeError, match="^since: "):
            repo.export_ops(since=5)
        with pytest.raises(TypeError, match="^ops: "):
            repo.merge_ops(None)
        assert {p: read(p) for p in files_under(tmp_path / "s")} == before


def test_checkpoint_never_records_the_middle_of_another_appenders_envelope(tmp_path):
    """A task repository (or another process) appending to the same
    events.jsonl through an event store of its own: a compaction that runs
    while its envelope is half written records where complete lines end,
    and the store reopens (found by a thread stress test: the manifest's
    events_offset fell inside a long task envelope and the reopen raised
    'damaged line')."""
    import fcntl
    import time

    from rune_fast.tasks import TaskStateRepository
    state = str(tmp_path)
    with TaskStateRepository(state) as tasks:
        tasks.create("t", "ch")
        conv = ConversationStateRepository(state, compact_every=1_000_000)
        conv.append(msg(1))
        conv.append(msg(2))
        path = os.path.join(state, "events.jsonl")
        line = conv._events.encode("task_state.created", "task_x", "ab" * 32, pad="p" * 20000)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.write(fd, line[:9000])

        def finish():
            time.sleep(0.2)
            os.write(fd, line[9000:])
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        # (a real appender writes its line with one write(2), which other
        # appends wait for; the half is what a reader of the size sees meanwhile)
        t = threading.Thread(target=finish)
        t.start()
        conv.compact()
        t.join()
        assert conv._manifest["events_offset"] == os.path.getsize(path)
        conv.append(msg(3))
        conv.close()
        with ConversationStateRepository(state) as again:
            assert again.window("ch") == [msg(1), msg(2), msg(3)]
            assert again.verify().ok


def test_a_mid_line_events_offset_of_an_earlier_build_still_opens(tmp_path, monkeypatch):
    """A manifest an earlier build wrote with events_offset inside another
    appender's envelope: the open reads envelopes from the next line on,
    re-derives what a crash lost after it, and says nothing is damaged."""
    from rune_fast.events import EventStore
    from rune_fast.tasks import TaskStateRepository
    state = str(tmp_path)
    with TaskStateRepository(state) as tasks:
        conv = ConversationStateRepository(state, compact_every=1_000_000)
        conv.append(msg(1))
        tasks.create("t" * 3000, "ch")
        # the earlier build: a size read inside the task envelope just written
        monkeypatch.setattr(EventStore, "line_end", lambda self: self.size - 1000)
        conv.compact()
        monkeypatch.undo()
        off = conv._manifest["events_offset"]
        with open(os.path.join(state, "events.jsonl"), "rb") as f:
            assert f.read()[off - 1:off] != b"\n"       # (mid-line, as the earlier build wrote it)
        conv.append(msg(2))
        conv.close()
    with ConversationStateRepository(state) as again:
        assert again.window("ch") == [msg(1), msg(2)]
        report = again.verify()
        assert report.ok, report.problems


def test_search_filters_cover_sealed_segments_and_follow_appends(tmp_path, monkeypatch):
    """From the second whole-store search on, the sealed segments' blocks are
    skipped by their trigram filters (kept in a file, read where it is
    mapped: not counted in index_bytes); the tail,
    still written, is always scanned: hits appended after the filters were
    built, and hits across tiers, come back exactly."""
    monkeypatch.setattr(tuning, "ROLL_BYTES", 64 << 10)     # compact() seals the tail
    words = ["alpha", "Beta", "gamma", "delta", "omega", "kappa", "zeta"]
    stored = []
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=10**6) as repo:
        for i in range(400):
            text = " ".join(words[(i * 7 + k) % len(words)] for k in range(60)) + f" #{i}"
            if i % 37 == 0:
                text += " Quarterly Report"
            m = msg(i, channel=f"c{i % 3}", content=text)
            repo.append(m)
            stored.append(m)
        repo.compact()                    # the tail becomes a sealed segment

        def want(needle):
            return sorted(m.msg_id for m in stored if needle.casefold() in m.content.casefold())

        before = repo.stats()["index_bytes"]
        for _ in range(3):
            assert sorted(h.record.msg_id for h in repo.search("quarterly report")) == want("quarterly report")
        segs = [s for s in repo._seg_order if repo._index.seg_filter_blocks(s) > 0]
        assert segs and all(repo._index.seg_filters_mapped(s) for s in segs)
        assert repo.stats()["index_bytes"] == before
        for i in range(400, 420):
            m = msg(i, channel="c1", content=f"late QUARTERLY REPORT {i}")
            repo.append(m)
            stored.append(m)
        for needle in ("quarterly report", "#39", "gamma delta", "late q"):
            assert sorted(h.record.msg_id for h in repo.search(needle)) == want(needle), needle



def _segment_files(root) -> list[str]:
    return sorted(p.name for p in (root / "hot").iterdir() if p.name.startswith("conversation_seg-")
                  and p.name.endswith(".jsonl"))


def _compact_counting(repo) -> tuple[int, int]:
    """compact(); (segments it rewrote, new segments they went to)."""
    before, tail = set(repo._seg_order), repo._tail_seg
    rep = repo.compact()
    return rep.segments_rewritten, len(set(repo._seg_order) - before - {tail})


def _fill(root, rounds: int, monkeypatch, roll: int) -> tuple[int, tuple[int, int]]:
    """Rounds of 12 messages (10 in channel "a"), each compacted into a
    sealed segment of its own (ROLL_BYTES 1500) under a window that cools
    nothing; then, with ROLL_BYTES ``roll``, a compaction under a window of
    4 cools most of every segment at once. (messages, what it rewrote)."""
    monkeypatch.setattr(tuning, "ROLL_BYTES", 1500)
    monkeypatch.setattr(tuning, "SPARSE_MIN_BYTES", 0)
    with ConversationStateRepository(root, hot_window=1000, compact_every=10**6) as repo:
        for r in range(rounds):
            repo.append_many([msg(12 * r + k, channel="abc"[k] if k < 3 else "a") for k in range(12)])
            repo.compact()
    monkeypatch.setattr(tuning, "ROLL_BYTES", roll)
    with ConversationStateRepository(root, hot_window=4, compact_every=10**6) as repo:
        return 12 * rounds, _compact_counting(repo)


@pytest.mark.parametrize("snapshot", [True, False])
def test_a_run_of_sparse_segments_is_rewritten_into_one(tmp_path, monkeypatch, snapshot):
    """Cooling leaves sealed segments mostly dead; a compaction copies the
    live lines of each run of them (neighbours in the segment order) into
    one new segment, in order: the append sequence still rises line by
    line, so a reopen that rescans the segments (no snapshot) holds every
    message where it was, and verify() finds nothing."""
    import rune_fast.conversation_state as cs
    n, (rewritten, new) = _fill(tmp_path, 10, monkeypatch, 8 << 20)
    assert rewritten >= 3 and new == 1, (rewritten, new)
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=10**6) as repo:
        assert len(repo._seg_order) == len(_segment_files(tmp_path))
        expect = {ch: [m.msg_id for m in repo.window(ch, 100)] for ch in "abc"}
        assert [len(expect[ch]) for ch in "abc"] == [100, 10, 10]
    if not snapshot:
        (tmp_path / "hot" / cs.SNAPSHOT_NAME).unlink()
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=10**6) as repo:
        assert {ch: [m.msg_id for m in repo.window(ch, 100)] for ch in "abc"} == expect
        assert len(repo) == n
        assert all(repo.get_message(f"msg_{k:08d}").status is ReadStatus.FOUND_VERIFIED for k in range(n))
        assert repo.verify().ok


def test_a_run_of_sparse_segments_stops_at_roll_bytes_of_live_lines(tmp_path, monkeypatch):
    """A new segment takes at most ROLL_BYTES of live lines (here three
    segments of 510 live bytes each under 1500: two new segments; the last
    segment, 1,542 live bytes of its 3,084, goes to one of its own when its
    size, where its data ends, makes it sparse: block-rounded here)."""
    n, (rewritten, new) = _fill(tmp_path, 10, monkeypatch, 1500)
    assert rewritten - new == 1 and new in (2, 3), (rewritten, new)
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=10**6) as repo:
        assert len(repo) == n and repo.verify().ok
        assert [len(repo.window(ch, 100)) for ch in "abc"] == [100, 10, 10]


def test_a_run_of_sparse_segments_breaks_where_the_sequence_does_not_rise(tmp_path, monkeypatch):
    """Segments are merged only while each one's first live line comes after
    the run's last (append sequences); a line whose sequence cannot be read
    ends the run: here every rewritten segment takes a new one of its own."""
    import rune_fast.conversation_state as cs
    monkeypatch.setattr(cs.ConversationStateRepository, "_line_seq", lambda self, loc: None)
    n, (rewritten, new) = _fill(tmp_path, 10, monkeypatch, 8 << 20)
    assert rewritten >= 3 and new == rewritten, (rewritten, new)
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=10**6) as repo:
        expect = {ch: [m.msg_id for m in repo.window(ch, 100)] for ch in "abc"}
    (tmp_path / "hot" / cs.SNAPSHOT_NAME).unlink()
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=10**6) as repo:
        assert {ch: [m.msg_id for m in repo.window(ch, 100)] for ch in "abc"} == expect
        assert len(repo) == n and repo.verify().ok


def test_cache_bytes_bounds_the_decode_caches(tmp_path):
    """The record caches hold at most their share of ``cache_bytes``
    (counted with ``record_bytes``), whatever was appended or read, and
    reads through a tiny budget return the same records."""
    from rune_fast._conv.reads import cache_budgets, record_bytes
    with pytest.raises(ValueError, match="cache_bytes"):
        ConversationStateRepository(tmp_path / "x", cache_bytes=-1)
    with pytest.raises(ValueError, match="cache_bytes"):
        ConversationStateRepository(tmp_path / "x", cache_bytes=True)
    ms = [msg(i, channel=f"c{i % 5}", content="é" * (i % 700)) for i in range(3000)]
    budget = 64 << 10
    hot, cool, dense, _groups = cache_budgets(budget)
    with ConversationStateRepository(tmp_path / "a", durability="none", compact_every=10**6,
                                     hot_window=100, cache_bytes=budget) as repo:
        repo.append_many(ms)
        assert repo._decoded.max_bytes == hot and repo._decoded.nbytes <= hot
        repo.compact()
        assert [m.msg_id for m in repo.window("c3", 500)] == [m.msg_id for m in ms if m.channel_id == "c3"][-500:]
        for m in ms[::7]:
            assert repo.get_message(m.msg_id).record == m
        for cache, bound in ((repo._decoded, hot), (repo._cool_decoded, cool)):
            assert 0 < cache.nbytes <= bound
            assert cache.nbytes == sum(record_bytes(v[0]) for v in cache.values())
        assert 0 < repo._cool_dense.nbytes <= dense         # the lines: their length and an overhead
        assert repo._cool_dense.nbytes == sum(len(v) + tuning.DENSE_LINE_OVERHEAD for v in repo._cool_dense.values())
    with ConversationStateRepository(tmp_path / "a", read_only=True, cache_bytes=0) as view:
        assert view.get_message(ms[5].msg_id).record == ms[5] and len(view._decoded) == 0
