"""Automatic compaction with its cooling runs and merges staged by a background
thread: every read stays exact while a job runs, a deletion racing a staged run
wins, a failed job is reported and redone inline, close adopts what is staged,
and no file is left behind."""
from __future__ import annotations

import logging
import os
import math
import threading

import numpy as np
import pytest

from rune_fast._conv import cooling, staging, tuning
from rune_fast import codec
from rune_fast import conversation_state as cs
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.cool import CoolArchive, table_from_lines
from rune_fast.cool.writer import MergeCancelled
from rune_fast.records import ConversationMessageRecord

CHANNELS = ("a", "b", "c")


def msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"m{i:06d}", role="user", content=f"note {i} about topic{i % 7}",
                                     channel_id=CHANNELS[i % 3], task_id=f"t{i % 5}",
                                     ts=1_700_000_000.0 + i)


@pytest.fixture
def small_bg(monkeypatch):
    """Stage every automatic cooling run of 8 or more messages in the background."""
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 8)


def open_repo(path, **kw):
    return ConversationStateRepository(path, compact_every=kw.pop("compact_every", 8),
                                       hot_window=kw.pop("hot_window", 4), **kw)


def check_reads(repo, stored: dict[str, ConversationMessageRecord]) -> None:
    assert len(repo) == len(stored)
    for ch in CHANNELS:
        want = [m for m in stored.values() if m.channel_id == ch]
        assert repo.window(ch, 10_000) == want
        assert repo.window(ch, 3) == want[-3:]
    for t in range(5):
        want = [m for m in stored.values() if m.task_id == f"t{t}"]
        assert [r.msg_id for r in repo.messages_for_task(f"t{t}")] == sorted(m.msg_id for m in want)
    for mid, m in stored.items():
        rd = repo.get_message(mid)
        assert rd.status is ReadStatus.FOUND_VERIFIED and rd.record == m
    hits = [h.record.msg_id for h in repo.search("TOPIC3")]
    assert sorted(hits) == sorted(mid for mid, m in stored.items() if "topic3" in m.content)


def assert_erased(root, msg_id: str) -> None:
    """No file under ``root`` holds the content ``msg`` gave ``msg_id``."""
    needle = f"note {int(msg_id[1:])} about".encode()
    for d, _dirs, names in os.walk(root):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                assert needle not in f.read(), f"deleted content left in {n}"


def cool_files_on_disk(state) -> set[str]:
    d = os.path.join(state, "hot", cs.COOL_DIR)
    return {n for n in os.listdir(d)} if os.path.isdir(d) else set()


def test_background_runs_keep_every_read_exact(tmp_path, small_bg):
    stored = {}
    with open_repo(tmp_path) as repo:
        staged = 0
        for i in range(600):
            m = msg(i)
            assert repo.append(m)
            stored[m.msg_id] = m
            staged += repo._bg is not None
            if i % 97 == 0:
                check_reads(repo, stored)
        assert staged > 0, "no cooling run went to the background"
        check_reads(repo, stored)
        assert repo.stats()["cool"] > 0
    # close adopted whatever was staged: the files on disk are exactly the manifest's
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        live = set(repo._cool.files())
        sidecars = {n[:-len(".parquet")] + ".idx" for n in live}
        assert cool_files_on_disk(tmp_path) == live
        kept = set(os.listdir(repo._cool.index_dir))
        assert {n for n in kept if n.endswith(".idx")} == sidecars
        # (and the search filters searches kept, of live files only: a cache)
        assert {n[:-len(".grams")] + ".idx" for n in kept if n.endswith(".grams")} <= sidecars
        assert all(n.endswith((".idx", ".grams")) for n in kept)
        repo.compact()
        check_reads(repo, stored)
        assert [repo.get_message(f"m{i:06d}").tier for i in range(3)] == ["cool"] * 3


def test_background_merges_reduce_the_file_count(tmp_path, small_bg, monkeypatch):
    threads = []
    for name in ("stage_parts", "stage_merge"):
        real = getattr(CoolArchive, name)

        def spy(self, *a, _real=real, _name=name, **kw):
            threads.append((_name, threading.current_thread().name))
            return _real(self, *a, **kw)
        monkeypatch.setattr(CoolArchive, name, spy)
    with open_repo(tmp_path, compact_every=8, hot_window=2) as repo:
        for i in range(1500):
            repo.append(msg(i))
        kinds = {name for name, thread in threads if thread.startswith("rune-fast-")}
        assert kinds == {"stage_parts", "stage_merge"}, threads[-20:]
        repo.compact()
        # an explicit compact() does not wait for a merge the thread is
        # writing (its files stay in their tier until it is adopted): on a
        # loaded machine one may still run here, so let each finish and be
        # adopted by the next compact()
        for _ in range(50):
            if repo._bg_merge is None:
                break
            repo._bg_merge.thread.join()
            repo.compact()
        assert repo._bg_merge is None
        # size-tiered merging keeps the file count logarithmic: fewer than
        # fanout (tuning.MERGE_FANOUT) files in each tier floor(log_fanout(rows)),
        # nothing left to merge
        f = tuning.MERGE_FANOUT
        assert not repo._cool.plan_merge(fanout=f)
        tiers = 1 + int(math.log(1500, f))
        assert len(repo._cool.files()) <= (f - 1) * tiers
        assert len(repo) == 1500


def _gate_stage(monkeypatch, name: str = "stage_parts"):
    """Make CoolArchive.<name> wait until released; returns (entered, release)."""
    entered, release = threading.Event(), threading.Event()
    real = getattr(CoolArchive, name)

    def gated(self, *a, **kw):
        if threading.current_thread().name.startswith("rune-fast-"):   # the background job only
            entered.set()
            assert release.wait(30)
        return real(self, *a, **kw)
    monkeypatch.setattr(CoolArchive, name, gated)
    return entered, release

def _append_until_merging(repo, entered: threading.Event, stored: dict, *, limit: int = 3000,
                          what: str = "no merge went to the background") -> int:
    """Append msg(0), msg(1), ... (kept in ``stored``) until a merge went to
    the background and reached its gate (``entered``; or whatever thread
    work sets it: ``what`` says it did not, after ``limit`` appends); the
    next index."""
    i = 0
    while not entered.is_set():
        m = msg(i)
        repo.append(m)
        stored[m.msg_id] = m
        i += 1
        assert i < limit, what
    return i



def _run_ids(repo) -> list[str]:
    """The msg_ids of the cooling run in flight (its lines stay where it read them)."""
    return [repo._read_loc(loc).msg_id for loc in repo._bg.locs]


def _append_until_staged(repo, start: int, stored: dict) -> int:
    i = start
    while repo._bg is None:
        m = msg(i)
        repo.append(m)
        stored[m.msg_id] = m
        i += 1
        assert i < start + 1000, "no background job started"
    return i


def test_deleting_a_staged_message_discards_the_run(tmp_path, small_bg, monkeypatch):
    stored: dict = {}
    entered, release = _gate_stage(monkeypatch)
    with open_repo(tmp_path) as repo:
        i = _append_until_staged(repo, 0, stored)
        assert entered.wait(30)
        victim = _run_ids(repo)[0]
        assert repo.delete(victim)
        del stored[victim]
        # appends and reads go on while the job waits
        for j in range(i, i + 20):
            m = msg(j)
            repo.append(m)
            stored[m.msg_id] = m
        check_reads(repo, stored)
        release.set()
        rep = repo.compact()
        assert rep.cooled > 0
        assert repo.get_message(victim).status is ReadStatus.NOT_FOUND_CONFIRMED
        check_reads(repo, stored)
    assert_erased(tmp_path, victim)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)


def test_a_failed_background_run_is_reported_and_done_inline(tmp_path, small_bg, monkeypatch, caplog):
    calls = []
    real = CoolArchive.stage_parts

    def flaky(self, *a, **kw):
        if threading.current_thread().name.startswith("rune-fast-"):
            calls.append(1)
            if len(calls) == 1:
                raise OSError(28, "No space left on device (injected)")
        return real(self, *a, **kw)
    monkeypatch.setattr(CoolArchive, "stage_parts", flaky)
    stored: dict = {}
    with caplog.at_level(logging.WARNING, logger="rune_fast"):
        with open_repo(tmp_path) as repo:
            for i in range(200):
                m = msg(i)
                repo.append(m)
                stored[m.msg_id] = m
            check_reads(repo, stored)
    assert any("background cool failed" in r.getMessage() and "injected" in r.getMessage()
               for r in caplog.records)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert repo.stats()["cool"] > 0


def test_close_adopts_a_run_in_flight(tmp_path, small_bg, monkeypatch):
    stored: dict = {}
    entered, release = _gate_stage(monkeypatch)
    repo = open_repo(tmp_path)
    _append_until_staged(repo, 0, stored)
    assert entered.wait(30)
    staged_ids = _run_ids(repo)
    threading.Timer(0.2, release.set).start()
    repo.close()
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert {repo.get_message(m).tier for m in staged_ids} == {"cool"}
        live = set(repo._cool.files())
        assert {n for n in cool_files_on_disk(tmp_path) if n.endswith(".parquet")} == live


def test_readers_beside_a_background_job(tmp_path, small_bg):
    """Reads from other threads while the writer thread stages runs."""
    stored: dict = {}
    errors: list = []
    done = threading.Event()
    with open_repo(tmp_path) as repo:
        for i in range(50):
            m = msg(i)
            repo.append(m)
            stored[m.msg_id] = m
        first = dict(stored)

        def reader():
            try:
                while not done.is_set():
                    for mid, m in first.items():
                        rd = repo.get_message(mid)
                        assert rd.record == m, mid
                    assert repo.window("a", 2)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(50, 700):
                m = msg(i)
                repo.append(m)
                stored[m.msg_id] = m
        finally:
            done.set()
            t.join()
        assert not errors, errors
        check_reads(repo, stored)


def test_the_tail_rolls_while_a_merge_is_written(tmp_path, small_bg, monkeypatch):
    # a long merge must not hold back the tail's roll: segments stay bounded
    # (before, every compaction only folded while a merge ran, and a bulk load
    # could leave a tail of hundreds of MiB)
    monkeypatch.setattr(tuning, "ROLL_BYTES", 4096)
    entered, release = _gate_stage(monkeypatch, "stage_merge")
    stored: dict = {}
    with open_repo(tmp_path) as repo:
        i = _append_until_merging(repo, entered, stored)
        assert repo._bg_merge is not None and repo._bg_merge.kind == "merge"
        tail_before = repo._tail_seg
        for j in range(i, i + 300):
            m = msg(j)
            repo.append(m)
            stored[m.msg_id] = m
        assert repo._bg_merge is not None and not repo._bg_merge.done.is_set()   # still merging
        # the tail rolled meanwhile (a cooling run written beside the merge
        # holds it for the run's time: its size then depends on the thread)
        assert repo._tail_seg != tail_before
        check_reads(repo, stored)
        release.set()
        repo._bg_merge.thread.join()
        repo.compact()          # (adopts the finished merge)
        assert repo._bg is None and repo._bg_merge is None
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)


def test_cooling_runs_go_on_beside_a_merge(tmp_path, small_bg, monkeypatch):
    # a merge of large files outlasts many cooling runs: they are staged and
    # adopted while it is written (before, cooling waited for every merge and
    # a bulk load of 1,000,000 messages left 40% of its cooling to the final
    # compact()); the merge is adopted after them, every read exact meanwhile
    entered, release = _gate_stage(monkeypatch, "stage_merge")
    gated, staged_groups = CoolArchive.stage_merge, []

    def spy(self, groups, *a, **kw):
        if threading.current_thread().name.startswith("rune-fast-"):
            staged_groups.append([list(g) for g in groups])
        return gated(self, groups, *a, **kw)
    monkeypatch.setattr(CoolArchive, "stage_merge", spy)
    stored: dict = {}
    with open_repo(tmp_path) as repo:
        i = _append_until_merging(repo, entered, stored)
        merging = repo._bg_merge
        assert merging is not None and not merging.done.is_set()
        sources = {n for g in staged_groups[-1] for n in g}
        cool_before = repo.stats()["cool"]
        adopted = 0
        while adopted < 2:
            if repo._bg is not None:
                repo._bg.thread.join()          # (a cooling run: finished, adopted next)
                before = repo.stats()["cool"]
                while repo._bg is not None:
                    m = msg(i)
                    repo.append(m)
                    stored[m.msg_id] = m
                    i += 1
                assert repo.stats()["cool"] > before
                adopted += 1
            m = msg(i)
            repo.append(m)
            stored[m.msg_id] = m
            i += 1
            assert i < 6000, "no cooling run beside the merge"
        assert repo._bg_merge is merging and not merging.done.is_set()
        assert repo.stats()["cool"] > cool_before
        assert sources <= set(repo._cool.files())        # the merge's sources still served
        check_reads(repo, stored)
        # compact() cools what is left without waiting for the merge
        repo.compact()
        assert repo._bg is None and repo._bg_merge is merging and not merging.done.is_set()
        assert all(len(repo._index.channel_locs(codec.key(ch), -1)) <= 4 for ch in CHANNELS)
        check_reads(repo, stored)
        release.set()
        merging.thread.join()
        while repo._bg_merge is not None:       # adopted by an automatic compaction
            m = msg(i)
            repo.append(m)
            stored[m.msg_id] = m
            i += 1
        assert not sources & set(repo._cool.files())
        check_reads(repo, stored)
        repo.compact()
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)


def test_compact_after_adopting_a_staged_run_cools_a_late_message_behind_it(tmp_path, monkeypatch):
    # compact() adopts a staged cooling run and then cools each channel's
    # messages beyond its newest hot_window, cool ones counted. A read before
    # the adoption had cached "hot and cool do not interleave" for the
    # channel; the cached verdict hid a late message that now sorts before a
    # cool one, and it stayed hot (found by a tier fuzzer)
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 2)

    def m(mid, ch, ms):
        return ConversationMessageRecord(msg_id=mid, content=mid, channel_id=ch, hlc=f"{ms:015d}-0000000000-dev")

    with ConversationStateRepository(tmp_path, hot_window=2, compact_every=4, durability="none") as repo:
        repo.append_many([m(f"o{i}", "other", 1 + i) for i in range(4)])
        repo.compact()                   # o0, o1 cooled now, not by a thread of its own
        a = [m(f"a{i}", "ch", 1000 + i) for i in range(4)]
        repo.append_many(a)              # the automatic compaction stages the cooling of a0, a1
        assert repo._bg is not None and repo._bg.kind == "cool"
        assert [r.msg_id for r in repo.window("ch", 10)] == ["a0", "a1", "a2", "a3"]
        repo.delete("a3")
        repo.append(m("late", "ch", 500))
        repo.compact()
        order = [r.msg_id for r in repo.window("ch", 10)]
        assert order == ["late", "a0", "a1", "a2"]
        assert [repo.get_message(x).tier for x in order] == ["cool", "cool", "cool", "hot"]


def test_first_compaction_after_an_open_stages_a_large_cooling_run(tmp_path, small_bg):
    # The first automatic compaction of an open looks at every segment; it
    # used to cool a large excess inline too (0.25 s on an append at
    # 1,000,000 messages). Now the run is staged like any other and the look
    # at the segments waits for the adoption, which runs it.
    stored = {}
    with open_repo(tmp_path, compact_every=1_000, durability="none") as repo:   # no automatic compaction
        for i in range(40):
            repo.append(msg(i))
            stored[f"m{i:06d}"] = msg(i)
    with open_repo(tmp_path) as repo:
        assert repo._segs_unchecked
        repo.append(msg(40))        # the 41 stored before count: the automatic compaction runs
        stored["m000040"] = msg(40)
        assert repo._bg is not None and repo._bg.kind == "cool"
        assert repo._segs_unchecked
        check_reads(repo, stored)
        repo.compact()              # adopts the run, then looks at every segment
        assert repo._bg is None and not repo._segs_unchecked
        assert repo.get_message("m000000").tier == "cool"
        check_reads(repo, stored)
        assert repo.verify().ok
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)


def test_background_run_parses_its_lines_in_parts(tmp_path, small_bg, monkeypatch):
    # The background run makes its table from the lines copied at staging,
    # a few at a time (here 3), lines the compiled reader does not take
    # (a float with an exponent, an integer past 64 bits in the tool calls)
    # read from the copied bytes: the archive holds exactly what was appended.
    monkeypatch.setattr(tuning, "PARSE_PART", 3)
    parts: list[int] = []
    fallbacks: list[int] = []

    def counted(data, starts, fallback):
        parts.append(len(starts))
        return table_from_lines(data, starts, lambda i: fallbacks.append(i) or fallback(i))

    monkeypatch.setattr(cooling, "table_from_lines", counted)
    stored = {}
    with open_repo(tmp_path, durability="none") as repo:
        for i in range(60):
            m = msg(i)
            if i % 4 == 1:
                m = ConversationMessageRecord(
                    msg_id=m.msg_id, role="assistant", content=m.content, channel_id=m.channel_id,
                    task_id=m.task_id, ts=m.ts,
                    tool_calls=[{"id": f"c{i}", "name": "f", "arguments": {"x": 1e300, "n": 2 ** 70 + i}}])
            repo.append(m)
            stored[m.msg_id] = m
            if repo._bg is not None and repo._bg.kind == "cool":
                repo._bg.thread.join()
        staged = list(parts)
        repo.compact()
        assert staged.count(3) >= 3 and fallbacks      # background runs, in parts of 3 (inline: whole)
        cooled = [mid for mid in stored if repo.get_message(mid).tier == "cool"]
        assert len(cooled) >= 40 and any(int(mid[1:]) % 4 == 1 for mid in cooled)
        check_reads(repo, stored)
        assert repo.verify().ok
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        for mid in cooled:
            assert repo.get_message(mid).record.tool_calls == stored[mid].tool_calls


def test_compact_merges_inline_within_its_budget(tmp_path, small_bg, monkeypatch):
    # compact() merges at most MERGE_INLINE_ROWS plus MERGE_INLINE_PER_COOLED
    # a row it cooled (its work proportional to what moved); a larger group
    # is left to the automatic compactions, which merge it in their thread
    monkeypatch.setattr(tuning, "MERGE_INLINE_ROWS", 0)
    monkeypatch.setattr(tuning, "MERGE_INLINE_PER_COOLED", 0)
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 2)
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 10**9)     # every run and merge inline
    stored: dict = {}
    with open_repo(tmp_path, compact_every=10**6, hot_window=1) as repo:
        for k in range(4):
            for i in range(k * 12, k * 12 + 12):
                m = msg(i)
                repo.append(m)
                stored[m.msg_id] = m
            rep = repo.compact()
            assert rep.cool_files_written == 1 and rep.cool_files_removed == 0     # no budget: no merge
        assert repo._cool.plan_merge(fanout=2)
        check_reads(repo, stored)
        monkeypatch.setattr(tuning, "MERGE_INLINE_ROWS", 10**6)
        rep = repo.compact()
        assert rep.cooled == 0 and rep.cool_files_removed >= 2
        assert not repo._cool.plan_merge(fanout=2)
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)


def test_close_gives_up_a_merge_in_flight(tmp_path, small_bg, monkeypatch):
    # close() does not wait for a merge being written (tens of seconds for a
    # large one): it cancels it, its files go, the sources stay served, and
    # the next session finds every message and merges them again
    monkeypatch.setattr(tuning, "MERGE_INLINE_ROWS", 0)      # (close merges nothing inline)
    monkeypatch.setattr(tuning, "MERGE_INLINE_PER_COOLED", 0)
    entered, release = _gate_stage(monkeypatch, "stage_merge")
    stored: dict = {}
    repo = open_repo(tmp_path)
    _append_until_merging(repo, entered, stored)
    merging = repo._bg_merge
    threading.Thread(target=lambda: merging.cancel.wait(30) and release.set(), daemon=True).start()
    files = set(repo._cool.files())
    repo.close()
    assert merging.done.is_set() and merging.cancel.is_set() and merging.result is None
    assert isinstance(merging.error, MergeCancelled)
    listed = {n for n in os.listdir(repo._cool.cool_dir) if n.endswith(".parquet")}
    assert files <= listed                              # the sources stay
    with open_repo(tmp_path) as repo:
        assert set(repo._cool.files()) == listed        # no merged file left behind
        check_reads(repo, stored)


def test_a_full_tier_is_merged_a_group_at_a_time(tmp_path, monkeypatch):
    # a tier that filled while a merge ran (19 files) is merged MERGE_FANOUT
    # files at a time, oldest first; the rest waits for another group
    with open_repo(tmp_path) as repo:
        names = [f"cool-{i:08d}.parquet" for i in range(1, 20)]
        monkeypatch.setattr(repo._cool, "plan_merge", lambda fanout: [names])
        f = tuning.MERGE_FANOUT
        assert repo._plan_merge() == [names[a:a + f] for a in range(0, 19 - f + 1, f)]


def test_a_background_merge_gets_its_groups_whenever_its_thread_starts(tmp_path, small_bg, monkeypatch):
    # the job's work used to read the compaction's ``groups`` when the thread
    # ran, after the compaction had emptied it: a late thread merged nothing
    real = staging._Staged._run
    go = threading.Event()

    def late(self, work):
        if self.kind == "merge":
            go.wait(30)
        real(self, work)
    monkeypatch.setattr(staging._Staged, "_run", late)
    with open_repo(tmp_path) as repo:
        i = 0
        while repo._bg_merge is None:
            repo.append(msg(i))
            i += 1
            assert i < 3000, "no merge went to the background"
        merging = repo._bg_merge
        go.set()
        merging.thread.join()
        assert merging.error is None and merging.result.jobs
        files = set(merging.sources)
        while repo._bg_merge is not None:
            repo.append(msg(i))
            i += 1
        assert not files & set(repo._cool.files())      # the sources were merged away


def test_close_that_adopts_a_merge_leaves_a_snapshot_that_serves(tmp_path, small_bg, monkeypatch):
    # compact() wrote the index snapshot; the merge in flight then finished
    # and close() adopted it (its rows in a new file): the snapshot must be
    # written again, or the next open reads every id of the merged file
    # (0.6-1.2 s after a bulk load of 1,000,000 messages)
    entered, release = _gate_stage(monkeypatch, "stage_merge")
    stored: dict = {}
    repo = open_repo(tmp_path)
    _append_until_merging(repo, entered, stored)
    repo._snapshot_due = lambda: True       # (this compaction writes the snapshot)
    repo.compact()
    del repo._snapshot_due
    assert repo._snap_changes == 0 and repo._bg_merge is not None
    release.set()
    repo._bg_merge.thread.join()
    files = set(repo._cool.files())
    repo.close()
    assert set(repo._cool.files()) != files          # the merge was adopted at close
    scanned: list = []
    real = cs.ConversationStateRepository._cool_ids_in

    def spy(self, names):
        scanned.extend(names)
        return real(self, names)
    monkeypatch.setattr(cs.ConversationStateRepository, "_cool_ids_in", spy)
    with open_repo(tmp_path) as repo:
        assert scanned == []
        check_reads(repo, stored)


def test_a_finished_run_holds_its_ids_and_each_channels_newest_stamp_only(tmp_path, small_bg, monkeypatch):
    # (a run waits for the next compaction to adopt it: its channel and
    # stamp columns and its ids as Python strings, held meanwhile, were
    # ~90 bytes a row at the top of a bulk load's resident memory)
    seen = []
    real = cooling.Cooling._cooled

    def cooled(self, locs, hashes, *, staged=None, maxima=None):
        if staged is not None:
            # (its ids as their hashes, 8 bytes a row, read from the lines as they were fed)
            seen.append((staged.table.column_names, dict(staged.maxima), len(staged.hashes),
                         staged.hashes.dtype == np.uint64, hasattr(staged, "ids") or hasattr(staged, "keys")))
        return real(self, locs, hashes, staged=staged, maxima=maxima)
    monkeypatch.setattr(cooling.Cooling, "_cooled", cooled)
    stored: dict = {}
    with open_repo(tmp_path) as repo:
        i = 0
        while repo._bg is None:
            m = ConversationMessageRecord(msg_id=f"m{i:06d}", role="user", content=f"note {i}",
                                          channel_id=CHANNELS[i % 3], ts=1_700_000_000.0 + i,
                                          hlc="" if i % 5 == 4 else f"{1000 + (i * 37) % 101:015d}-0000000000-dev")
            repo.append(m)
            stored[m.msg_id] = m
            i += 1
            assert i < 1000, "no background job started"
        run = [repo._read_loc(int(loc)) for loc in repo._bg.locs]
        want: dict = {}
        for r in run:
            if r.hlc:
                want[r.channel_id] = max((r.hlc, r.msg_id), want.get(r.channel_id, ("", "")))
        repo.compact()
        assert seen[0] == (["msg_id"], want, len(run), True, False)
        assert all(repo._cool_max[ch] >= stamp for ch, stamp in want.items())
        assert len(repo) == len(stored)
        for mid, m in stored.items():
            assert repo.get_message(mid).record == m
