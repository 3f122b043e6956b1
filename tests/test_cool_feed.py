"""A background cooling run's lines copied a part at a time: the compaction
that starts the run copies the first part, each automatic compaction after it
the next, one that waits for the run (compact(), close(), an erasure) the
rest. Reads stay exact meanwhile, a deletion of a message whose part is not
copied yet still discards the run, a failed copy gives the run up, and
nothing is left behind."""
from __future__ import annotations

import logging

import pytest

from rune_fast._conv import compaction, cooling, tuning
from rune_fast.conversation_state import ReadStatus
from rune_fast.errors import CorruptStateCheckpointError

from test_background_compaction import assert_erased, check_reads, cool_files_on_disk, msg, open_repo


@pytest.fixture
def fed(monkeypatch):
    """Runs of 8 or more messages in the background, copied 3 lines a part."""
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 8)
    monkeypatch.setattr(tuning, "BG_COOL_PART_ROWS", 3)


def _append_until_feeding(repo, start: int, stored: dict) -> int:
    """Append msg(start), ... until a cooling run waits for more of its lines."""
    i = start
    while repo._bg is None or not repo._bg.feeding():
        m = msg(i)
        repo.append(m)
        stored[m.msg_id] = m
        i += 1
        assert i < start + 1000, "no cooling run fed in parts"
    return i


def test_a_run_is_copied_a_part_per_compaction(tmp_path, fed):
    stored: dict = {}
    fed_at: list[int] = []
    with open_repo(tmp_path) as repo:
        for i in range(600):
            m = msg(i)
            assert repo.append(m)
            stored[m.msg_id] = m
            job = repo._bg
            if job is not None and job.feeding():
                fed_at.append(job.fed_to)
            if i % 89 == 0:
                check_reads(repo, stored)
        check_reads(repo, stored)
        assert repo.stats()["cool"] > 0
    # each part of 3 lines came with a compaction of its own (every 8 appends)
    assert len(fed_at) >= 8 and any(b - a == 3 for a, b in zip(fed_at, fed_at[1:]))
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert {n for n in cool_files_on_disk(tmp_path) if n.endswith(".parquet")} == set(repo._cool.files())
        assert repo.verify().ok


def test_compact_copies_the_rest_and_adopts_the_run(tmp_path, fed):
    stored: dict = {}
    with open_repo(tmp_path) as repo:
        _append_until_feeding(repo, 0, stored)
        job = repo._bg
        locs = list(job.locs)
        ids = [repo._read_loc(loc).msg_id for loc in locs]
        check_reads(repo, stored)
        assert {repo.get_message(m).tier for m in ids} != {"cool"}     # nothing moved yet
        rep = repo.compact()
        assert rep.cooled >= len(ids) and repo._bg is None
        assert {repo.get_message(m).tier for m in ids} == {"cool"}
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)


def test_close_while_a_run_is_fed(tmp_path, fed):
    stored: dict = {}
    repo = open_repo(tmp_path)
    _append_until_feeding(repo, 0, stored)
    ids = [repo._read_loc(loc).msg_id for loc in repo._bg.locs]
    repo.close()
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert {repo.get_message(m).tier for m in ids} == {"cool"}
        assert {n for n in cool_files_on_disk(tmp_path) if n.endswith(".parquet")} == set(repo._cool.files())


def test_deleting_a_message_not_yet_copied_discards_the_run(tmp_path, fed):
    stored: dict = {}
    with open_repo(tmp_path) as repo:
        i = _append_until_feeding(repo, 0, stored)
        job = repo._bg
        victim = repo._read_loc(job.locs[-1]).msg_id      # (its part is copied last)
        assert repo.delete(victim)
        del stored[victim]
        for j in range(i, i + 40):
            m = msg(j)
            repo.append(m)
            stored[m.msg_id] = m
        check_reads(repo, stored)
        repo.compact()
        assert repo.get_message(victim).status is ReadStatus.NOT_FOUND_CONFIRMED
        check_reads(repo, stored)
    assert_erased(tmp_path, victim)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)


def test_a_failed_copy_gives_the_run_up(tmp_path, fed, monkeypatch, caplog):
    real = cooling.Cooling._gather
    failed: list[int] = []

    def flaky(self, locs, hashes):
        job = self._bg
        if not failed and job is not None and job.feeding() and job.fed_to > 0:
            failed.append(job.fed_to)
            raise CorruptStateCheckpointError("line check failed (injected)", path="seg", offset=0)
        return real(self, locs, hashes)
    monkeypatch.setattr(cooling.Cooling, "_gather", flaky)
    stored: dict = {}
    with caplog.at_level(logging.WARNING, logger="rune_fast"):
        with open_repo(tmp_path) as repo:
            i = 0
            raised = False
            while not failed:
                m = msg(i)
                stored[m.msg_id] = m
                i += 1
                try:
                    repo.append(m)
                except CorruptStateCheckpointError:
                    raised = True       # (stored, then the compaction after it met the damage)
                assert i < 1000
            assert raised
            job = repo._bg
            job.thread.join(30)
            assert not job.thread.is_alive() and job.cancel.is_set()
            for j in range(i, i + 200):
                m = msg(j)
                repo.append(m)
                stored[m.msg_id] = m
            assert repo._bg is not job
            check_reads(repo, stored)
            assert repo.stats()["cool"] > 0
    assert not any("background cool failed" in r.getMessage() for r in caplog.records)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert repo.verify().ok


def test_a_run_fed_over_batches_of_append_many(tmp_path, fed):
    stored: dict = {}
    with open_repo(tmp_path, compact_every=16, hot_window=8) as repo:
        for b in range(40):
            batch = [msg(b * 25 + k) for k in range(25)]
            assert repo.append_many(batch) == 25
            stored.update((m.msg_id, m) for m in batch)
            if b % 9 == 0:
                check_reads(repo, stored)
        check_reads(repo, stored)
    with open_repo(tmp_path, compact_every=16, hot_window=8) as repo:
        check_reads(repo, stored)
        assert repo.verify().ok


def _spy_merges(monkeypatch) -> tuple[list[tuple[int, int]], dict]:
    """Small cooling runs (a bulk load outruns them), and a record of
    (backlog, live files) when each background merge starts; the test puts
    its repository in the returned holder's "repo"."""
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 8)
    monkeypatch.setattr(tuning, "BG_COOL_MAX_ROWS", 12)
    monkeypatch.setattr(tuning, "BG_COOL_PART_ROWS", 4)
    started: list[tuple[int, int]] = []
    holder: dict = {}

    class Spy(compaction._Staged):
        def __init__(self, kind, *a, **kw):
            if kind == "merge":
                repo = holder["repo"]
                started.append((repo._cool_backlog, len(repo._cool.file_rows())))
            super().__init__(kind, *a, **kw)
    monkeypatch.setattr(compaction, "_Staged", Spy)
    monkeypatch.setattr(cooling, "_Staged", Spy)
    return started, holder


def _load_batches(repo, stored: dict, batches: int) -> list[int]:
    """``batches`` append_many calls of 40 messages; the backlog after each."""
    backlogs = []
    for b in range(batches):
        batch = [msg(i) for i in range(b * 40, b * 40 + 40)]
        repo.append_many(batch)
        stored.update((m.msg_id, m) for m in batch)
        backlogs.append(repo._cool_backlog)
    return backlogs


def test_no_merge_starts_while_cooling_is_behind(tmp_path, monkeypatch):
    """A cooling run that could not take the whole excess (a bulk load
    outran it) holds back the merges of cool files: the core they would
    take is the cooling runs'. Once the excess is cooled (here: compact())
    merges start again, and reads stay exact throughout."""
    started, holder = _spy_merges(monkeypatch)
    stored: dict = {}
    with open_repo(tmp_path, hot_window=2) as repo:
        holder["repo"] = repo
        backlogs = _load_batches(repo, stored, 40)
        assert max(backlogs) > tuning.MERGE_BACKLOG_ROWS      # (cooling fell behind)
        assert all(b <= tuning.MERGE_BACKLOG_ROWS for b, _f in started), started
        check_reads(repo, stored)
        before = len(started)
        repo.compact()
        assert repo._cool_backlog == 0
        # (runs that take the whole excess: cooling keeps up from here)
        monkeypatch.setattr(tuning, "BG_COOL_MAX_ROWS", 10_000)
        monkeypatch.setattr(tuning, "BG_COOL_PART_ROWS", 10_000)
        for i in range(1600, 1900):
            m = msg(i)
            repo.append(m)
            stored[m.msg_id] = m
            job = repo._bg
            if job is not None and not job.feeding():
                assert job.done.wait(30)    # (each run adopted by the next compaction, however loaded the machine)
        assert len(started) > before       # caught up: merges go on
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert repo.verify().ok


def test_merges_go_on_while_behind_past_the_file_cap(tmp_path, monkeypatch):
    """Merges wait for cooling only while the archive holds at most
    MERGE_WAIT_FILES files: past it they start even with excess left (a
    long bulk load does not pile up files), and reads stay exact."""
    started, holder = _spy_merges(monkeypatch)
    monkeypatch.setattr(tuning, "MERGE_WAIT_FILES", 1)
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 2)       # (files of a tier pair up soon)
    stored: dict = {}
    with open_repo(tmp_path, hot_window=2) as repo:
        holder["repo"] = repo
        _load_batches(repo, stored, 60)
        behind = [f for b, f in started if b > tuning.MERGE_BACKLOG_ROWS]
        assert behind, started          # (merges started while cooling was behind...)
        assert all(f > tuning.MERGE_WAIT_FILES for f in behind), started    # (...only past the cap)
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert repo.verify().ok


@pytest.fixture
def held_parts(monkeypatch):
    """A cooling run's thread takes no part until the test sets the event
    it returns (set at the test's end whatever happened)."""
    import threading
    gate = threading.Event()
    real = compaction._Staged.next_part

    def slow_next_part(self):
        gate.wait(120)
        return real(self)

    monkeypatch.setattr(compaction._Staged, "next_part", slow_next_part)
    yield gate
    gate.set()


def test_parts_wait_for_the_thread_to_take_them(tmp_path, fed, held_parts):
    """A compaction copies the next part of a run only while its thread
    holds fewer than BG_COOL_QUEUED_PARTS parts it has not taken: the
    parts do not pile up behind a slow thread (here: one that takes none
    until let go). One that waits for the run copies the rest."""
    stored: dict = {}
    with open_repo(tmp_path) as repo:
        try:
            i = _append_until_feeding(repo, 0, stored)
            job = repo._bg
            for j in range(i, i + 80):
                m = msg(j)
                repo.append(m)
                stored[m.msg_id] = m
                assert job._parts.qsize() <= tuning.BG_COOL_QUEUED_PARTS
            assert job.feeding() and job._parts.qsize() == tuning.BG_COOL_QUEUED_PARTS
        finally:
            held_parts.set()
        rep = repo.compact()
        assert rep.cooled >= len(job.locs) and repo._bg is None
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert repo.verify().ok


def test_the_tail_rolls_while_a_run_is_written(tmp_path, fed, held_parts, monkeypatch):
    """A tail past ROLL_BYTES is sealed while a cooling run is in flight
    (its lines keep their locations: the run reads them where they are),
    so the segment the run leaves sparse is no larger than a roll; the
    run is adopted and every read stays exact, also after a reopen."""
    monkeypatch.setattr(tuning, "ROLL_BYTES", 2048)
    stored: dict = {}
    with open_repo(tmp_path) as repo:
        try:
            i = _append_until_feeding(repo, 0, stored)
            job = repo._bg
            tails = {repo._tail_seg}
            for j in range(i, i + 120):
                m = msg(j)
                repo.append(m)
                stored[m.msg_id] = m
                assert repo._bg is job and not job.done.is_set()
                tails.add(repo._tail_seg)
                assert repo._tail.size < 4 * tuning.ROLL_BYTES
            assert len(tails) > 2       # (rolled while the run was in flight)
            check_reads(repo, stored)
        finally:
            held_parts.set()
        repo.compact()
        assert repo._bg is None and repo.stats()["cool"] >= len(job.locs)
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert repo.verify().ok


def test_a_compaction_that_waits_for_a_run_feeds_it_as_it_takes_parts(tmp_path, fed, monkeypatch):
    """compact() waits for a cooling run, which still needs most of its
    lines: it copies them a part as the thread takes one (its queue never
    holds more than BG_COOL_QUEUED_PARTS, and the end), not all at once
    (a run's 65,536 lines, 30-60 MB, waited there after a bulk load)."""
    import time
    real_next, real_feed = compaction._Staged.next_part, compaction._Staged.feed
    queued: list[int] = []
    settling = [False]

    def slow_next_part(self):
        if settling[0]:
            time.sleep(0.002)      # (a thread slower than the copies)
        return real_next(self)

    def feed(self, part, upto):
        real_feed(self, part, upto)
        if settling[0]:
            queued.append(self._parts.qsize())
    monkeypatch.setattr(compaction._Staged, "next_part", slow_next_part)
    monkeypatch.setattr(compaction._Staged, "feed", feed)
    monkeypatch.setattr(tuning, "BG_COOL_PART_ROWS", 1)      # (a run of 8 parts or more)
    stored: dict = {}
    with open_repo(tmp_path) as repo:
        _append_until_feeding(repo, 0, stored)
        job = repo._bg
        assert len(job.locs) - job.fed_to >= 6       # (parts left to feed)
        settling[0] = True
        rep = repo.compact()
        settling[0] = False
        assert len(queued) >= 6 and max(queued) <= tuning.BG_COOL_QUEUED_PARTS + 1     # (+ the end)
        assert rep.cooled >= len(job.locs) and repo._bg is None
        check_reads(repo, stored)
    with open_repo(tmp_path) as repo:
        check_reads(repo, stored)
        assert repo.verify().ok
