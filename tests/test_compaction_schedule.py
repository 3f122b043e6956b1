"""The automatic compaction's schedule under a bulk load: each append pays
for one piece of work (adopting a staged cooling run; one rewrite run of
the segments it left sparse; staging the next run), the unlinks and the
index snapshot of an automatic compaction run in a thread, and none of it
changes what a crash keeps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rune_fast._conv import tuning
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.records import ConversationMessageRecord

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"m{i:06d}", content=f"note {i} " + "x" * 200,
                                     channel_id=f"c{i % 4}", task_id=f"t{i % 7}", ts=1_700_000_000.0 + i)


@pytest.fixture
def small(monkeypatch):
    # stage cooling runs of 8 rows or more; roll and rewrite at 64 KiB
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 8)
    monkeypatch.setattr(tuning, "ROLL_BYTES", 64 << 10)
    monkeypatch.setattr(tuning, "SPARSE_MIN_BYTES", 4 << 10)


def check(repo, n: int) -> None:
    assert len(repo) == n
    for i in range(0, n, 7):
        rd = repo.get_message(f"m{i:06d}")
        assert rd.status is ReadStatus.FOUND_VERIFIED and rd.record == msg(i)
    for ch in range(4):
        assert repo.window(f"c{ch}", 5) == [msg(i) for i in range(n) if i % 4 == ch][-5:]


@pytest.mark.parametrize("max_rows", [16384, 12])
def test_adoption_leaves_the_segments_to_the_next_appends(tmp_path, small, monkeypatch, max_rows):
    # (12: each staged run cools a part of the excess, channel by channel)
    monkeypatch.setattr(tuning, "BG_COOL_MAX_ROWS", max_rows)
    seen = {"adopt": 0, "adopt_and_rewrite": 0, "rewrite_runs": []}
    with ConversationStateRepository(tmp_path, compact_every=16, hot_window=8, durability="none") as repo:
        n = 0
        for _ in range(120):
            job = repo._bg
            if job is not None:
                job.done.wait()
            before = repo._last_compaction
            repo.append_many([msg(n + k) for k in range(16)])
            n += 16
            rep = repo._last_compaction
            if job is not None and job.kind == "cool" and rep is not before and rep.cooled:
                seen["adopt"] += 1
                if rep.segments_rewritten:
                    seen["adopt_and_rewrite"] += 1
            if rep is not before and rep.segments_rewritten:
                seen["rewrite_runs"].append(rep.segments_rewritten)
        check(repo, n)
        assert seen["adopt"] > 3 and seen["adopt_and_rewrite"] == 0
        if max_rows > 100:
            assert seen["rewrite_runs"]
        repo.compact()
        assert not repo._segs_unchecked and repo._chore is None
        check(repo, n)
        assert repo.verify().ok
    with ConversationStateRepository(tmp_path, compact_every=16, hot_window=8) as repo:
        check(repo, n)
        assert repo.verify().ok


def test_retired_files_are_gone_after_compact_and_close(tmp_path, small):
    with ConversationStateRepository(tmp_path, compact_every=16, hot_window=8, durability="none") as repo:
        for n in range(0, 1600, 16):
            repo.append_many([msg(n + k) for k in range(16)])
        repo.compact()
        manifest = repo._manifest
        hot = set(os.listdir(repo.hot_dir))
        for seg in manifest["segments"]:
            assert any(name.startswith("conversation_seg-") and str(seg) in name for name in hot)
    with ConversationStateRepository(tmp_path, compact_every=16, hot_window=8) as repo:
        check(repo, 1600)
        assert repo.verify().ok


CHILD = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {root!r})
    from rune_fast._conv import tuning
    tuning.BG_COOL_MIN_ROWS = 8
    tuning.ROLL_BYTES = 64 << 10
    tuning.SPARSE_MIN_BYTES = 4 << 10
    from rune_fast.conversation_state import ConversationStateRepository
    from rune_fast.records import ConversationMessageRecord
    stop = int(sys.argv[2])
    repo = ConversationStateRepository(sys.argv[1], compact_every=16, hot_window=8, durability="fsync")
    n = 0
    adopted = 0
    while True:
        job = repo._bg
        if job is not None:
            job.done.wait()
        before = repo._last_compaction
        repo.append_many([ConversationMessageRecord(msg_id=f"m{{i:06d}}", content=f"note {{i}} " + "x" * 200,
                                                    channel_id=f"c{{i % 4}}", task_id=f"t{{i % 7}}",
                                                    ts=1_700_000_000.0 + i) for i in range(n, n + 16)])
        n += 16
        rep = repo._last_compaction
        if job is not None and rep is not before and rep.cooled:
            adopted += 1
            if adopted == stop:
                print(json.dumps(n), flush=True)
                os._exit(0)       # killed right after an adoption: the segments not rewritten yet
""")


@pytest.mark.parametrize("stop", [1, 3])
def test_a_kill_after_an_adoption_keeps_every_message_once(tmp_path, stop):
    state = str(tmp_path / "s")
    proc = subprocess.run([sys.executable, "-c", CHILD.format(root=ROOT), state, str(stop)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    n = json.loads(proc.stdout)
    with ConversationStateRepository(state, compact_every=16, hot_window=8) as repo:
        check(repo, n)
        ids = [r.msg_id for ch in range(4) for r in repo.window(f"c{ch}", 10_000)]
        assert len(ids) == len(set(ids)) == n
        assert repo.verify().ok
        repo.compact()
        check(repo, n)


def test_automatic_cooling_waits_for_the_due_total_excess(tmp_path, monkeypatch):
    """From a window of 64 messages on, an automatic compaction cools once
    the excess of all channels together reaches tuning.COOL_DUE_ROWS, and
    then every channel's excess: runs of a few hundred rows every few
    batches paid a cooling cycle's fixed costs (start, syncs, manifest,
    segment pass) each time. Until then every read is exact."""
    monkeypatch.setattr(tuning, "COOL_DUE_ROWS", 300)
    monkeypatch.setattr(tuning, "BG_COOL_MIN_ROWS", 10**9)     # (runs inline: adopted at once)
    def m(i: int) -> ConversationMessageRecord:
        return ConversationMessageRecord(msg_id=f"m{i:06d}", content=f"note {i}", channel_id=f"c{i % 4}",
                                         ts=1_700_000_000.0 + i)
    with ConversationStateRepository(tmp_path, compact_every=8, hot_window=64, durability="none") as repo:
        n = 4 * 64 + 296            # 74 beyond each channel's window: a whole window's excess is not due
        repo.append_many([m(i) for i in range(n)])
        for i in range(n, n + 16):
            repo.append(m(i))       # (automatic compactions, excess 296-311: due from 300)
            if i < n + 4:
                assert repo.stats()["cool"] == 0, i
        n += 16
        assert repo.stats()["cool"] >= 300
        assert repo.stats()["cool"] + repo.stats()["hot_and_tail"] == n
        for ch in range(4):
            assert repo.window(f"c{ch}", 10_000) == [m(i) for i in range(n) if i % 4 == ch]
        assert repo.verify().ok


def test_single_appends_stage_the_due_run_in_the_thread(tmp_path, monkeypatch):
    """With the shipped tuning an automatic run is never smaller than what a
    thread writes, and such a run (here due at 128 rows, one channel) is
    written by the thread: a durable append pays for copying its lines, not
    for its Parquet file and syncs (a store taking single appends cooled
    about 250 messages every 250 appends, each run inline)."""
    assert tuning.COOL_DUE_ROWS >= tuning.BG_COOL_MIN_ROWS
    monkeypatch.setattr(tuning, "COOL_DUE_ROWS", tuning.BG_COOL_MIN_ROWS)
    inline: list[int] = []
    real = ConversationStateRepository._cool_in_files

    def cool_in_files(self, excess, rep):
        inline.append(len(excess))
        return real(self, excess, rep)
    monkeypatch.setattr(ConversationStateRepository, "_cool_in_files", cool_in_files)
    def one(i: int) -> ConversationMessageRecord:     # (one channel: its excess is the run)
        return ConversationMessageRecord(msg_id=f"m{i:06d}", content=f"note {i}", channel_id="c",
                                         ts=1_700_000_000.0 + i)
    n = 512 + 128 + 64
    staged = 0
    with ConversationStateRepository(tmp_path, compact_every=64) as repo:
        for i in range(n):
            assert repo.append(one(i))
            staged += repo._bg is not None
        assert staged > 0 and inline == []
    with ConversationStateRepository(tmp_path, compact_every=64) as repo:
        assert repo.stats()["cool"] >= 128
        assert repo.window("c", 10_000) == [one(i) for i in range(n)]
        assert repo.verify().ok


def test_the_batch_sync_ends_where_a_step_first_needs_it(tmp_path, small, monkeypatch):
    # an automatic compaction runs while its append_many's tail sync is in
    # flight: rewriting sealed segments (into new fsynced files) and
    # adopting a cooling run go on beside it; a roll (it closes the tail's
    # file) and the manifest (it vouches for the tail) come after it ended
    from rune_fast._conv.write_thread import WriteThread
    monkeypatch.setattr(tuning, "SYNC_OVERLAP_MIN", 8)
    calls: list[list[str]] = []

    def spy(owner, name, label):
        fn = getattr(owner, name)

        def wrapped(*a, **k):
            if calls:
                calls[-1].append(label)
            return fn(*a, **k)
        monkeypatch.setattr(owner, name, wrapped)

    spy(WriteThread, "sync_now", "sync")
    spy(ConversationStateRepository, "_rewrite_segments", "rewrite")
    spy(ConversationStateRepository, "_cooled", "adopt")
    spy(ConversationStateRepository, "_roll_tail", "roll")
    spy(ConversationStateRepository, "_write_manifest", "manifest")
    with ConversationStateRepository(tmp_path, compact_every=16, hot_window=8, durability="fsync") as repo:
        n = 0
        for _ in range(120):
            job = repo._bg
            if job is not None:
                job.done.wait()
            calls.append([])
            repo.append_many([msg(n + k) for k in range(16)])
            n += 16
        seen = {"rewrite": 0, "adopt": 0}
        for steps in calls:
            first_sync = steps.index("sync") if "sync" in steps else len(steps)
            for step in ("roll", "manifest"):
                assert step not in steps or steps.index(step) > first_sync, steps
            for step in ("rewrite", "adopt"):
                if step in steps[:first_sync]:
                    seen[step] += 1
        assert seen["rewrite"] and seen["adopt"], seen
        check(repo, n)
    with ConversationStateRepository(tmp_path, compact_every=16, hot_window=8) as repo:
        check(repo, n)
        assert repo.verify().ok
