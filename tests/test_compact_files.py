"""compact() cools in a few large files written part by part
(``CoolArchive.cool_parts``), and leaves a large merge to the background
merge thread: what it returns with is a consistent store (every read exact,
verify() clean) that reopens with every message, whether the merge is still
running, finished, or given up by a close. A file's index built from keys
gathered part by part is the one built from its whole columns."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from rune_fast._conv import tuning
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.cool import CoolArchive, _table_from_records, record_digest
from rune_fast.cool.sidecar import _KeyParts, _build_index, _index_of_keys
from rune_fast.records import ConversationMessageRecord

from test_cool import all_rows, rec

CHANNELS = ("zeta", "alpha", "mu", "ß-chan", "Beta")


def msg(i: int, hlc: str = "") -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"m{i:06d}", role="assistant" if i % 2 else "user",
                                     content=f"note {i} about topic{i % 7} zürich" * (1 + i % 3),
                                     channel_id=CHANNELS[i % len(CHANNELS)], task_id=f"t{i % 9}",
                                     ts=1_700_000_000.0 + i, hlc=hlc)


def check_reads(repo, stored: dict) -> None:
    assert len(repo) == len(stored)
    for ch in CHANNELS:
        want = [m for m in stored.values() if m.channel_id == ch]
        assert repo.window(ch, 10_000) == want
        assert repo.window(ch, 5) == want[-5:]
    for t in range(9):
        want = sorted(m.msg_id for m in stored.values() if m.task_id == f"t{t}")
        assert sorted(r.msg_id for r in repo.messages_for_task(f"t{t}")) == want
    for mid, m in stored.items():
        rd = repo.get_message(mid)
        assert rd.status is ReadStatus.FOUND_VERIFIED and rd.record == m
    hits = sorted(h.record.msg_id for h in repo.search("TOPIC3"))
    assert hits == sorted(mid for mid, m in stored.items() if "topic3" in m.content)


def _append(repo, stored: dict, ids: range, hlc=None) -> None:
    """Append msg(i) for i in ``ids`` (stamped ``hlc(i)`` when given), kept in ``stored``."""
    for i in ids:
        m = msg(i) if hlc is None else msg(i, hlc=hlc(i))
        repo.append(m)
        stored[m.msg_id] = m


@pytest.fixture
def small_files(monkeypatch):
    """compact() writes files of 50 rows, 16 lines a part; no automatic cooling runs, no merges."""
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 1000)
    monkeypatch.setattr(tuning, "COOL_FILE_ROWS", 50)
    monkeypatch.setattr(tuning, "COOL_RUN_MAX_ROWS", 16)
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 10**9)


def test_compact_cools_in_files_of_many_parts(tmp_path, small_files):
    stored = {}
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=3) as repo:
        _append(repo, stored, range(260))
        rep = repo.compact()
        # 260 - 5 * 3 = 245 rows cooled: 5 files of at most 50 rows
        assert rep.cooled == 245 and rep.cool_files_written == 5
        rows = repo._cool.file_rows()
        assert sorted(rows.values()) == [45, 50, 50, 50, 50]
        check_reads(repo, stored)
        assert repo.verify().ok
        # each file's rows grouped by channel in code point order, each
        # channel's rows clustered by task (in code point order), each
        # task's rows oldest first
        for name in repo._cool.files():
            t = all_rows_of(repo, name)
            chs = [r.record["channel_id"] for r in t]
            assert chs == sorted(chs)
            for ch in set(chs):
                mine = [(r.record["task_id"], r.record["msg_id"]) for r in t if r.record["channel_id"] == ch]
                assert mine == sorted(mine)
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=3) as repo:
        check_reads(repo, stored)
        assert repo.verify().ok


def all_rows_of(repo, name: str) -> list:
    return sorted((r for r in all_rows(repo._cool) if r.file == name), key=lambda r: r.row)


def test_compact_file_order_with_late_messages(tmp_path, small_files):
    # stamped messages that arrive late sort before cool rows: compact()
    # cools them too (the excess beyond the index's own), each in its
    # channel's place of the file order
    stored = {}
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=2) as repo:
        _append(repo, stored, range(40), lambda i: f"{1000 + i:015d}-0000000000-dev")
        repo.compact()
        # older than some cool rows
        _append(repo, stored, range(40, 70), lambda i: f"{1000 + i - 35:015d}-0000000001-dev")
        repo.compact()
        by_order = {ch: sorted((m for m in stored.values() if m.channel_id == ch), key=lambda m: (m.hlc, m.msg_id))
                    for ch in CHANNELS}
        for ch in CHANNELS:
            assert repo.window(ch, 1000) == by_order[ch]
            assert repo.window(ch, 2) == by_order[ch][-2:]
        assert repo.verify().ok
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=2) as repo:
        for ch in CHANNELS:
            assert repo.window(ch, 1000) == by_order[ch]
        assert repo.verify().ok


def _table(ids: range, channel: str) -> pa.Table:
    rows = [rec(i, channel) for i in ids]
    return _table_from_records(rows, list(ids), [record_digest(r) for r in rows])


def test_cool_parts_refuses_parts_out_of_file_order(tmp_path):
    archive = CoolArchive(str(tmp_path / "cool"), row_group_rows=8)
    with pytest.raises(ValueError, match="not in file order"):
        archive.cool_parts([_table(range(0, 10), "b"), _table(range(10, 20), "a")])
    with pytest.raises(ValueError, match="not in file order"):     # a channel's rows apart
        archive.cool_parts([pa.concat_tables([_table(range(0, 5), "a"), _table(range(5, 9), "b"),
                                              _table(range(9, 12), "a")])])
    with pytest.raises(ValueError, match="no rows"):
        archive.cool_parts([])
    run = archive.cool_parts([_table(range(0, 10), "a"), _table(range(10, 15), "a"), _table(range(15, 30), "b")])
    assert run.rows == 30
    with pytest.raises(ValueError, match="already archived"):
        archive.cool_parts([_table(range(29, 31), "c")])
    # nothing but the one file was left behind by the refusals
    assert archive.files() == [run.file]
    assert sorted(n for n in os.listdir(archive.cool_dir)) == [run.file]
    assert len(all_rows(archive)) == 30
    archive.close()


@pytest.fixture
def merges_left(monkeypatch):
    """Every cooling run and small merge inline; compact() leaves a merge of
    24 rows or more to the merge thread."""
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 24)
    monkeypatch.setattr(tuning, "MERGE_INLINE_GROUP_ROWS", 24)
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 2)


def _load_in_runs(repo, stored: dict, runs: int, per: int) -> None:
    for k in range(runs):
        _append(repo, stored, range(k * per, (k + 1) * per))
        repo.compact()


def test_compact_leaves_a_large_merge_to_the_thread(tmp_path, merges_left):
    stored: dict = {}
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=1) as repo:
        _load_in_runs(repo, stored, 4, 15)      # cooled runs of 10 rows: merged inline (20 < 24)
        job = repo._bg_merge
        assert job is not None, "compact() merged a large group inline"
        # what compact() returned with is consistent while the merge runs
        check_reads(repo, stored)
        assert repo.verify().ok
        job.thread.join()
        assert job.error is None and job.result is not None
        files = set(repo._cool.files())
        rep = repo.compact()        # adopts the merge (and starts the next, if any)
        assert rep.cool_files_removed >= 2 and set(repo._cool.files()) != files
        check_reads(repo, stored)
        assert repo.verify().ok
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=1) as repo:
        check_reads(repo, stored)
        assert repo.verify().ok
        on_disk = {n for n in os.listdir(repo._cool.cool_dir) if n.endswith(".parquet")}
        assert on_disk == set(repo._cool.files())


def test_compacts_merge_thread_starts_after_its_segments_and_snapshot(tmp_path, merges_left, monkeypatch):
    # (the merge's working set beside the compaction's own segment rewrites
    # and snapshot was the top of a bulk load's resident memory)
    from rune_fast._conv import compaction
    seen: list[str] = []
    real_staged, real_snap = compaction._Staged, ConversationStateRepository._write_snapshot
    real_manifest = ConversationStateRepository._write_manifest

    def staged(kind, *a, **k):
        seen.append(kind)
        return real_staged(kind, *a, **k)

    def snap(self, *a, **k):
        seen.append("snapshot")
        return real_snap(self, *a, **k)

    def manifest(self, *a, **k):
        seen.append("manifest")
        return real_manifest(self, *a, **k)
    monkeypatch.setattr(compaction, "_Staged", staged)
    monkeypatch.setattr(ConversationStateRepository, "_write_snapshot", snap)
    monkeypatch.setattr(ConversationStateRepository, "_write_manifest", manifest)
    stored: dict = {}
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=1) as repo:
        for k in range(4):
            _append(repo, stored, range(k * 15, (k + 1) * 15))
            if repo._bg_merge is not None:
                # (an earlier round's merge still running on a loaded
                # machine: compact() leaves it in flight and starts none)
                repo._bg_merge.thread.join()
            seen.clear()
            repo.compact()
        assert repo._bg_merge is not None and "merge" in seen
        assert seen.index("merge") > seen.index("manifest")
        if "snapshot" in seen:
            assert seen.index("merge") > seen.index("snapshot")
        repo._bg_merge.thread.join()
        check_reads(repo, stored)


def test_a_store_closed_right_after_compact_reopens_whole(tmp_path, merges_left, monkeypatch):
    # close() gives up the merge compact() left running: no merged file
    # stays behind, every message is read back, and the next session's
    # compact() merges again
    real = CoolArchive.stage_merge

    def held(self, groups, *, durable=None, cancel=None):
        if cancel is not None:      # the thread's (not an inline merge): still running at close()
            assert cancel.wait(30)
        return real(self, groups, durable=durable, cancel=cancel)
    monkeypatch.setattr(CoolArchive, "stage_merge", held)
    stored: dict = {}
    repo = ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=1)
    _load_in_runs(repo, stored, 4, 15)
    job = repo._bg_merge
    assert job is not None
    files = set(repo._cool.files())
    repo.close()
    assert job.done.is_set() and job.result is None and job.cancel.is_set()
    monkeypatch.setattr(CoolArchive, "stage_merge", real)
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=1) as repo:
        on_disk = {n for n in os.listdir(repo._cool.cool_dir) if n.endswith(".parquet")}
        # (close() did not merge the group inline instead: it was written once, given up)
        assert on_disk == set(repo._cool.files()) == files
        check_reads(repo, stored)
        assert repo.verify().ok
        before = len(repo._cool.files())
        for _ in range(10):
            repo.compact()
            job = repo._bg_merge
            if job is None:
                break
            job.thread.join()
        assert len(repo._cool.files()) < before
        check_reads(repo, stored)
        assert repo.verify().ok


def test_compact_file_order_with_messages_behind_the_cool_rows(tmp_path, small_files, monkeypatch):
    # a late message that sorts before a channel's cool rows, in a channel
    # whose hot messages do not exceed the window (a newer one was
    # deleted): the index's excess misses it, the count over both tiers
    # cools it, and it lands in its channel's place in the file
    from rune_fast._conv import cooling
    extra = []
    real = cooling.Cooling._in_file_order

    def spy(self, excess):
        extra.append(len(excess) - len(self._index.excess(self.hot_window)))
        return real(self, excess)
    monkeypatch.setattr(cooling.Cooling, "_in_file_order", spy)
    stored: dict = {}
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=3) as repo:
        _append(repo, stored, range(40), lambda i: f"{1000 + i:015d}-0000000000-dev")
        repo.compact()
        # one a channel, older than its cool rows
        _append(repo, stored, range(40, 45), lambda i: f"{1000 + i - 40:015d}-0000000001-dev")
        for ch in CHANNELS:          # the newest of each channel goes
            newest = max((m for m in stored.values() if m.channel_id == ch), key=lambda m: (m.hlc, m.msg_id))
            assert repo.delete(newest.msg_id)
            del stored[newest.msg_id]
        repo.compact()
        assert extra[-1] > 0, "no message was cooled beyond the index's excess"
        for ch in CHANNELS:
            want = sorted((m for m in stored.values() if m.channel_id == ch), key=lambda m: (m.hlc, m.msg_id))
            assert repo.window(ch, 1000) == want
            assert [repo.get_message(m.msg_id).tier for m in want[-3:]] != ["cool"] * 3
        assert repo.verify().ok
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=3) as repo:
        for ch in CHANNELS:
            want = sorted((m for m in stored.values() if m.channel_id == ch), key=lambda m: (m.hlc, m.msg_id))
            assert repo.window(ch, 1000) == want
        assert all(repo.get_message(mid).record == m for mid, m in stored.items())
        assert repo.verify().ok


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "ß", "中"]), st.sampled_from(["", "", "t1", "t2", "tß"])),
                min_size=1, max_size=60),
       st.lists(st.integers(1, 20), max_size=8))
def test_an_index_built_part_by_part_is_the_index_built_whole(rows, cuts):
    # a file's index from its keys gathered part by part (as a merge or
    # compact() writes it) is the one _build_index makes of the columns
    rows = sorted(rows, key=lambda r: r[0])         # (channels together)
    ids = [f"m{i:04d}{'é' * (i % 3)}" for i in range(len(rows))]
    chs = [c for c, _t in rows]
    tids = [t for _c, t in rows]
    whole = _build_index(7, 100, "f", ids, chs, tids, [len(rows)], "x")
    keys = _KeyParts()
    at = 0
    for c in cuts + [len(rows)]:
        b = min(len(rows), at + c)
        keys.add(pa.array(ids[at:b]), pa.chunked_array([pa.array(chs[at:b])]), tids[at:b])
        at = b
    parts = _index_of_keys(7, 100, "f", keys, [len(rows)], "x")
    assert np.array_equal(parts.hashes, whole.hashes) and np.array_equal(parts.hrows, whole.hrows)
    assert parts.channels == whole.channels
    assert list(parts._tasks) == list(whole._tasks)
    assert all(np.array_equal(parts._tasks[t], whole._tasks[t]) for t in whole._tasks)
    assert keys.id_range == (min(ids), max(ids))


def _parts() -> list[pa.Table]:
    return [_table(range(0, 10), "a"), _table(range(10, 45), "a"), _table(range(45, 70), "b")]


def test_a_foreground_run_writes_the_file_a_background_run_writes(tmp_path):
    """cool_parts hands its row groups to a thread of their own (compact()'s
    cooling keeps both cores busy); the file is byte for byte the one
    stage_parts writes on its caller's thread, with the same sidecar."""
    fore = CoolArchive(str(tmp_path / "fore"), row_group_rows=8)
    back = CoolArchive(str(tmp_path / "back"), row_group_rows=8)
    run = fore.cool_parts(_parts())
    fi = back.stage_parts(_parts())
    back.adopt(fi)
    for a, b in ((fore.cool_dir, back.cool_dir), (fore._idx_dir, back._idx_dir)):
        names = sorted(os.listdir(a))
        assert names == sorted(os.listdir(b)) and run.file in os.listdir(fore.cool_dir)
        for name in names:
            with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
                assert fa.read() == fb.read(), name
    assert all_rows(fore) == all_rows(back)
    fore.close()
    back.close()


def test_a_failed_row_group_write_fails_the_run_and_leaves_nothing(tmp_path, monkeypatch):
    """An error of the writing thread (a full disk, say) is raised on the
    caller's thread; the thread is gone, no file is left, and the archive
    takes the same rows afterwards."""
    import threading

    from rune_fast.cool import files

    archive = CoolArchive(str(tmp_path / "cool"), row_group_rows=8)
    real = files._FileSet._parquet_writer
    calls = []

    class Failing:
        def __init__(self, w):
            self._w, self.schema = w, w.schema

        def write_table(self, table, row_group_size):
            calls.append(threading.current_thread().name)
            if len(calls) == 3:
                raise OSError(28, "No space left on device")
            self._w.write_table(table, row_group_size=row_group_size)

        def close(self):
            self._w.close()

    monkeypatch.setattr(files._FileSet, "_parquet_writer", staticmethod(lambda f, schema: Failing(real(f, schema))))
    with pytest.raises(OSError, match="No space left"):
        archive.cool_parts(_parts())
    assert calls and set(calls) == {"rune-fast-parquet"}
    assert not [t for t in threading.enumerate() if t.name == "rune-fast-parquet"]
    assert archive.files() == [] and os.listdir(archive.cool_dir) == []
    monkeypatch.setattr(files._FileSet, "_parquet_writer", staticmethod(real))
    run = archive.cool_parts(_parts())
    assert run.rows == 70 and len(all_rows(archive)) == 70
    archive.close()
