"""The idle watcher of a writer (tuning.IDLE_MERGE_SECONDS): a store closed
right after a bulk load, with full tiers of cool files left to merge, is
merged by a later session that only reads; a store with nothing due is not
touched; close() stays prompt (a merge in flight is given up); and a writer
SIGKILLed while its idle merges run loses nothing."""
from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from rune_fast._conv import tuning
from rune_fast import conversation_state as cs
from rune_fast.cool import CoolArchive
from rune_fast.cool.writer import MergeCancelled

from test_background_compaction import check_reads, cool_files_on_disk, msg, open_repo

pytestmark = pytest.mark.idle_work


def _left_unmerged(path, monkeypatch, files: int) -> dict:
    """A store whose compactions merged nothing: ``files`` cool files of a
    few rows each (full tiers at fanout 2), closed; returns what it stores."""
    with monkeypatch.context() as m:
        m.setattr(tuning, "IDLE_MERGE_SECONDS", None)
        m.setattr(tuning, "BG_COOL_MIN_ROWS", 10**9)       # (every run inline)
        m.setattr(tuning, "MERGE_INLINE_ROWS", 0)          # (no merge at all)
        m.setattr(tuning, "MERGE_INLINE_PER_COOLED", 0)
        stored = {}
        with open_repo(path, compact_every=10**6, hot_window=1) as repo:
            for k in range(files):
                batch = [msg(i) for i in range(k * 12, k * 12 + 12)]
                repo.append_many(batch)
                stored.update((r.msg_id, r) for r in batch)
                assert repo.compact().cool_files_written == 1
            assert len(repo._cool.files()) == files
    return stored


def _wait(cond, what: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"idle watcher: {what} not within {timeout} s"
        time.sleep(0.01)


def _manifest(path) -> tuple[bytes, int]:
    p = os.path.join(str(path), "hot", cs.MANIFEST_NAME)
    with open(p, "rb") as f:
        return f.read(), os.stat(p).st_mtime_ns


@pytest.fixture
def idle_fast(monkeypatch):
    """A watcher that looks every 20 ms; merges of fanout 2, in the thread."""
    monkeypatch.setattr(tuning, "IDLE_MERGE_SECONDS", 0.02)
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 2)
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 8)


def test_a_session_that_only_reads_merges_what_a_load_left(tmp_path, monkeypatch):
    stored = _left_unmerged(tmp_path, monkeypatch, 8)
    monkeypatch.setattr(tuning, "IDLE_MERGE_SECONDS", 0.02)
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 2)
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 8)
    started = []
    real = CoolArchive.stage_merge

    def spy(self, groups, *a, **kw):
        started.append(threading.current_thread().name)
        return real(self, groups, *a, **kw)
    monkeypatch.setattr(CoolArchive, "stage_merge", spy)
    with open_repo(tmp_path) as repo:
        assert repo._cool.plan_merge(fanout=2)
        check_reads(repo, stored)       # (reads beside the merges: exact)
        _wait(lambda: repo._bg_merge is None and not repo._cool.plan_merge(fanout=2), "merged")
        assert started and all(t.startswith("rune-fast-merge") for t in started)
        check_reads(repo, stored)
        live = set(repo._cool.files())
        assert len(live) == 1               # (8 files of 9 rows, fanout 2: one file)
        assert repo.stats()["cool_files"] == 1      # (the manifest's view too)
        assert cool_files_on_disk(tmp_path) == live
    with open_repo(tmp_path) as repo:
        assert set(repo._cool.files()) == live
        check_reads(repo, stored)


def test_a_store_with_nothing_due_is_not_touched(tmp_path, idle_fast):
    stored = {}
    with open_repo(tmp_path, hot_window=100) as repo:
        for i in range(30):
            repo.append(msg(i))
            stored[msg(i).msg_id] = msg(i)
    before = _manifest(tmp_path)
    with open_repo(tmp_path, hot_window=100) as repo:
        time.sleep(0.3)             # (fifteen looks of the watcher)
        assert repo.stats()["compactions"] == 0
        assert _manifest(tmp_path) == before
        check_reads(repo, stored)


def test_an_idle_writer_cools_nothing_and_moves_no_tier(tmp_path, idle_fast):
    """Cooling stays the compactions' work (every compact_every messages and
    compact()): a writer left idle with an excess over hot_window and a
    tail not folded keeps every message where it was."""
    stored = {}
    with open_repo(tmp_path, compact_every=10**6, hot_window=1) as repo:
        for i in range(30):
            repo.append(msg(i))
            stored[msg(i).msg_id] = msg(i)
        before = _manifest(tmp_path)
        time.sleep(0.3)             # (fifteen looks of the watcher)
        assert repo.stats()["compactions"] == 0
        assert _manifest(tmp_path) == before
        assert {repo.get_message(m).tier for m in stored} == {"tail"}
        assert cool_files_on_disk(tmp_path) == set()
        check_reads(repo, stored)


def test_a_change_since_the_last_look_defers_the_work(tmp_path, monkeypatch):
    stored = _left_unmerged(tmp_path, monkeypatch, 4)
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 2)
    monkeypatch.setattr(tuning, "IDLE_MERGE_SECONDS", None)        # (this test looks itself)
    with open_repo(tmp_path) as repo:
        seen = repo._activity()
        repo.append(msg(10_000))
        stored[msg(10_000).msg_id] = msg(10_000)
        assert repo._idle_step(seen) == repo._activity()        # an append came: nothing done
        assert repo._bg_merge is None and repo.stats()["compactions"] == 0
        now = repo._activity()
        assert repo._idle_step(now) is not None                 # idle: the automatic compaction
        assert repo.stats()["compactions"] == 1
        check_reads(repo, stored)
    repo2 = open_repo(tmp_path)
    repo2.close()
    assert repo2._idle_step(repo2._activity()) is None          # closed: the watcher ends


def test_close_gives_up_an_idle_merge_at_once(tmp_path, monkeypatch):
    stored = _left_unmerged(tmp_path, monkeypatch, 4)
    monkeypatch.setattr(tuning, "IDLE_MERGE_SECONDS", 0.02)
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 2)
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 8)
    monkeypatch.setattr(tuning, "MERGE_INLINE_ROWS", 0)      # (close merges nothing inline)
    monkeypatch.setattr(tuning, "MERGE_INLINE_PER_COOLED", 0)
    entered, release = threading.Event(), threading.Event()
    real = CoolArchive.stage_merge

    def gated(self, *a, **kw):
        entered.set()
        assert release.wait(30)
        return real(self, *a, **kw)
    monkeypatch.setattr(CoolArchive, "stage_merge", gated)
    repo = open_repo(tmp_path)
    sources = set(repo._cool.files())
    assert entered.wait(60), "no idle merge started"
    _wait(lambda: repo._bg_merge is not None, "the job kept")   # (its thread starts first)
    merging = repo._bg_merge
    assert merging is not None and not merging.done.is_set()
    threading.Thread(target=lambda: merging.cancel.wait(30) and release.set(), daemon=True).start()
    repo.close()
    assert merging.cancel.is_set() and isinstance(merging.error, MergeCancelled)
    assert cool_files_on_disk(tmp_path) == sources      # nothing merged left behind
    monkeypatch.setattr(tuning, "IDLE_MERGE_SECONDS", None)
    with open_repo(tmp_path) as repo:
        assert set(repo._cool.files()) == sources
        check_reads(repo, stored)


CHILD = r'''
import sys, time
sys.path.insert(0, sys.argv[2])
from rune_fast._conv import tuning
tuning.IDLE_MERGE_SECONDS = 0.005
tuning.MERGE_FANOUT = 2
tuning.BG_COOL_MIN_ROWS = 8
from test_background_compaction import open_repo
repo = open_repo(sys.argv[1])
print("open", flush=True)
time.sleep(60)
'''


def test_sigkill_while_idle_merges_run(tmp_path, monkeypatch):
    # the idle merges are the automatic compaction's (staged files, adopted
    # by a manifest write): a kill at any moment leaves the manifest's files
    # or the merged ones, never a message lost, and strays the open removes
    stored = _left_unmerged(tmp_path, monkeypatch, 32)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, here, os.environ.get("PYTHONPATH", "")]))
    rnd = random.Random(33)
    counts = []
    for _ in range(4):
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), here], env=env,
                             stdout=subprocess.PIPE)
        assert p.stdout is not None
        ready, _w, _x = select.select([p.stdout], [], [], 120)
        assert ready and p.stdout.readline() == b"open\n", "the child did not open the store"
        time.sleep(rnd.uniform(0.0, 0.4))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        with open_repo(tmp_path) as repo:
            check_reads(repo, stored)
            assert repo.verify().ok
            live = set(repo._cool.files())
            counts.append(len(live))
        # (the open removed what the killed merge wrote: only live files stay)
        assert cool_files_on_disk(tmp_path) == live
    assert counts[-1] < 32, counts      # (the children merged some)
