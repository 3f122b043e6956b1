"""Power loss, simulated below the process (docs/POWERLOSS.md).

The crash tests kill the writer, which leaves every byte it wrote in the page
cache. Here the writer (tests/powerloss/powerloss_workload.py) runs under an
LD_PRELOAD shim (tests/powerloss/shim.c, compiled by these tests) that
records every file-system call it makes; the model
(tests/powerloss/powerloss_model.py) builds from the recording the on-disk
states a power loss may leave at any point -- unsynced writes kept, dropped
or torn per 512-byte or 4 KiB page, unsynced folder changes kept as a prefix
or as any subset -- and each state is opened and held to what the workload
was told (SPEC section 5): it opens, holds every acknowledged message and
task change exactly once, and invents nothing.

``RUNE_POWERLOSS_STATES`` (default 1200) sets how many states the run checks
in all; the longer runs draw more recordings (one per 2,000 states of a mode).
"""
from __future__ import annotations

import logging
import os
import random
import re
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "powerloss"))

import powerloss_model as model  # noqa: E402
import powerloss_replay as replay  # noqa: E402

STATES = int(os.environ.get("RUNE_POWERLOSS_STATES", "1200"))
#: the share of the states each durability mode gets
SHARES = {"fsync": 0.6, "batch": 0.25, "none": 0.15}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shim")
    path = replay.build_shim(str(folder))
    if path is None:
        pytest.skip("no C compiler (cc, gcc or clang): the power-loss recorder is built from C")
    return path


@pytest.fixture
def quiet_recovery():
    """Recovery reports every quarantine in a log record; a few thousand
    states would flood the captured log."""
    logger = logging.getLogger("rune_fast")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _run_mode(shim: str, tmp_path, durability: str, states: int, seed0: int) -> replay.Tally:
    tally = replay.Tally()
    recordings = max(1, -(-states // 2000))
    scratch = replay.scratch_dir(str(tmp_path))
    try:
        for r in range(recordings):
            work = tmp_path / f"rec-{durability}-{r}"
            work.mkdir()
            rec = replay.record(shim, str(work), durability, seed0 + r, ROOT)
            assert rec.acks and rec.n > 1000, f"the {durability} recording holds {rec.n} calls only"
            n = states // recordings + (1 if r < states % recordings else 0)
            replay.run_states(rec, n, seed0 * 1000 + r, durability != "none", scratch, tally)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return tally


def _summary(durability: str, t: replay.Tally) -> str:
    head = f"power loss, durability={durability!r}: {t.states} crash states checked, {t.held} held"
    return head + "".join("\n  " + f for f in t.failures[:10])


@pytest.mark.parametrize("durability", ["fsync", "batch"])
def test_power_loss_keeps_every_acknowledged_change(shim, tmp_path, quiet_recovery, durability, summary_line):
    """fsync and batch: every state opens and holds every acknowledged
    message (exactly once, as appended) and task change; a deletion
    acknowledged stays deleted; no message is invented."""
    states = max(1, round(STATES * SHARES[durability]))
    t = _run_mode(shim, tmp_path, durability, states, 11 if durability == "fsync" else 23)
    summary = _summary(durability, t)
    print(summary)
    summary_line(summary.splitlines()[0])
    assert t.states == states
    assert t.held == t.states, summary


@pytest.mark.parametrize("durability", ["fsync", "batch"])
def test_power_loss_with_the_batch_sync_in_its_own_thread(shim, tmp_path, quiet_recovery, durability,
                                                          summary_line, monkeypatch):
    """The same, with every append_many of 2 or more messages syncing the
    tail in a thread of its own while the batch is indexed and journaled
    (tuning.SYNC_OVERLAP_MIN = 2; the default is 64): nothing is
    acknowledged before that sync returned."""
    monkeypatch.setenv("RUNE_POWERLOSS_SYNC_OVERLAP_MIN", "2")
    states = max(1, round(STATES * SHARES[durability] / 3))
    t = _run_mode(shim, tmp_path, durability, states, 31 if durability == "fsync" else 37)
    summary = _summary(durability, t).replace("power loss,", "power loss (batch sync in its own thread),", 1)
    print(summary)
    summary_line(summary.splitlines()[0])
    assert t.states == states
    assert t.held == t.states, summary


def test_power_loss_without_syncs_invents_nothing(shim, tmp_path, quiet_recovery, summary_line):
    """none ("survives a process crash, not a power loss"): nothing is
    synced, not even a checkpoint's rename, so a store may be refused after
    a power loss (at open, or at the first read that meets a torn archive);
    every refusal names a file, and a store that opens holds only messages
    the workload appended, each once and as appended."""
    states = max(1, round(STATES * SHARES["none"]))
    t = _run_mode(shim, tmp_path, "none", states, 37)
    refused = [f for f in t.failures if re.search(r"\): (open|task open|read): ", f)]
    other = [f for f in t.failures if f not in refused]
    print(_summary("none", t) + f"\n  ({len(refused)} refused: at open, or at a read that met damage)")
    summary_line(_summary("none", t).splitlines()[0] + f" ({len(refused)} refused, each naming its file)")
    assert t.states == states
    assert not other, "\n".join(other[:10])
    for f in refused:
        assert "CorruptStateCheckpointError: " in f and "(file /" in f, f


def _faulty_copy(dest) -> str:
    """A copy of rune_fast whose tail is never synced (the fault the tool
    must find); returns the folder to put on PYTHONPATH."""
    pkg = dest / "rune_fast"
    shutil.copytree(os.path.join(ROOT, "rune_fast"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    seg = pkg / "segments.py"
    text = seg.read_text()
    # TailFile.sync: "os.fdatasync(self._fd)" inside its try block
    pattern = re.compile(r"(\n    def sync\(self\) -> None:\n(?:        .*\n|\n)*?\s+)os\.fdatasync\(self\._fd\)")
    patched, n = pattern.subn(r"\1pass  # fault injected by test_power_loss", text, count=1)
    assert n == 1, f"{seg}: TailFile.sync's fdatasync not found: the fault cannot be injected"
    seg.write_text(patched)
    return str(dest)


def test_the_replayer_finds_a_missing_tail_sync(shim, tmp_path, quiet_recovery, summary_line):
    """The tool catches faults: the same workload, run against a copy of
    rune_fast whose tail is never synced, yields a crash state that loses
    an acknowledged message."""
    copy = _faulty_copy(tmp_path / "faulty")
    work = tmp_path / "rec"
    work.mkdir()
    rec = replay.record(shim, str(work), "fsync", 11, copy)
    scratch = replay.scratch_dir(str(tmp_path))
    tally = replay.Tally()
    try:
        for chunk in range(10):        # until a state loses an acknowledged message
            replay.run_states(rec, 20, 500 + chunk, True, scratch, tally)
            if any("acknowledged" in f and " lost" in f for f in tally.failures):
                break
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lost = [f for f in tally.failures if "acknowledged" in f and " lost" in f]
    print(f"fault injected (no tail sync): {tally.states} states, {len(lost)} lost an acknowledged message")
    summary_line(f"power loss, a copy without the tail's fdatasync: {tally.states} states, "
                 f"{len(lost)} lost an acknowledged message (caught)")
    assert lost, f"no state of {tally.states} lost an acknowledged message without the tail's sync"


def test_the_model_keeps_synced_bytes_and_tears_the_rest(tmp_path):
    """The model on a hand-made recording: a synced write survives every
    state; an unsynced one is kept, dropped or torn by page; a file created
    in a folder never synced may vanish; a rename made durable by a folder
    sync stays."""
    root = str(tmp_path / "root")
    log = tmp_path / "fs.log"
    data_a = b"a" * 1000
    data_b = bytes(range(256)) * 20
    recs = [
        f"M\t{root}/d\n",
        f"O\t6\t{os.O_RDONLY | os.O_DIRECTORY}\t1\t{root}\n",
        f"SB\t6\t1\t{root}\n", f"SE\t6\t1\t0\t{root}\n",
        f"O\t3\t{os.O_WRONLY | os.O_CREAT}\t0\t{root}/d/f\n",
        f"W\t3\t0\t{len(data_a)}\t{root}/d/f\n".encode() + data_a,
        f"SB\t3\t2\t{root}/d/f\n", f"SE\t3\t2\t0\t{root}/d/f\n",
        f"O\t4\t{os.O_RDONLY | os.O_DIRECTORY}\t1\t{root}/d\n",
        f"SB\t4\t3\t{root}/d\n", f"SE\t4\t3\t0\t{root}/d\n",
        f"W\t3\t{len(data_a)}\t{len(data_b)}\t{root}/d/f\n".encode() + data_b,
        f"O\t5\t{os.O_WRONLY | os.O_CREAT}\t0\t{root}/d/g\n",
        f"R\t{root}/d/g\t{root}/d/h\n",
    ]
    log.write_bytes(b"".join(r if isinstance(r, bytes) else r.encode() for r in recs))
    rec = model.parse(str(log), root, f"{root}/acks")
    assert rec.n == len(recs)
    rng = random.Random(5)
    seen_sizes = set()
    seen_h = set()
    for _ in range(300):
        st = model.crash_state(rec, rec.n, rng, rng.choice(("prefix", "subset")))
        f = st.files[f"{root}/d/f"]
        assert f[:1000] == data_a                    # synced: always there
        start = 1000
        while start < len(f):                        # each 512 B page: the write's bytes or zeros
            stop = min(len(f), (start // 512 + 1) * 512)
            piece = f[start:stop]
            assert piece in (data_b[start - 1000:stop - 1000], bytes(len(piece)))
            start = stop
        seen_sizes.add(len(f))
        seen_h.add((f"{root}/d/h" in st.files, f"{root}/d/g" in st.files))
    assert {1000, 1000 + len(data_b)} <= seen_sizes   # dropped whole, and kept (or grown with zeros)
    assert (False, False) in seen_h and (True, False) in seen_h   # never synced: may vanish
    # a crash before the folder sync may lose the file's entry; after it, never
    early = [model.crash_state(rec, 10, rng) for _ in range(50)]
    assert any(f"{root}/d/f" not in s.files for s in early)
    late = [model.crash_state(rec, 11, rng) for _ in range(50)]
    assert all(s.files[f"{root}/d/f"] == data_a for s in late)


# ------------------------------------------------------------------------
# the recovery rules the suite led to, each on a hand-made store


def _msg(i: int, ch: str = "c"):
    from rune_fast.records import ConversationMessageRecord
    return ConversationMessageRecord(msg_id=f"pl-{i:03d}", ts=1.0 + i, role="user",
                                     content=f"message {i} " + "x" * 300, channel_id=ch)


def _store(path, n: int = 5, *, crashed: bool = False):
    """A store with ``n`` acknowledged tail lines (no compaction): closed, or
    with ``crashed`` as a killed writer leaves it (its files copied while it
    is open: no index snapshot covers the lines)."""
    from rune_fast.conversation_state import ConversationStateRepository
    live = path.parent / (path.name + "-live") if crashed else path
    with ConversationStateRepository(live, compact_every=1000) as repo:
        for i in range(n):
            assert repo.append(_msg(i))
        if crashed:
            shutil.copytree(live, path)
    return ConversationStateRepository


def _tail(path):
    raw = (path / "hot" / "conversation_tail.jsonl").read_bytes()
    end = raw.rstrip(b"\0")
    return raw, len(end)


def _line_of(path, i: int) -> bytes:
    """The framed tail line of message ``i`` of a second, scratch store."""
    from rune_fast.conversation_state import ConversationStateRepository
    with ConversationStateRepository(path, compact_every=1000) as repo:
        repo.append(_msg(i))
    raw, end = _tail(path)
    return raw[:end]


def _write_at(file, offset: int, data: bytes) -> None:
    with open(file, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_torn_write_past_the_durable_tail_is_quarantined(tmp_path):
    """A power loss kept the second page of an append in flight and lost its
    first (zeros), and kept a later append whole: neither was acknowledged
    (a sync covers every earlier byte), so the open quarantines both, as a
    cut-short final line, and serves every acknowledged message."""
    from rune_fast.conversation_state import ReadStatus
    from rune_fast.errors import RecoveryWarning
    cls = _store(tmp_path / "s")
    _raw, end = _tail(tmp_path / "s")
    torn = _line_of(tmp_path / "x", 50)
    later = _line_of(tmp_path / "y", 51)
    tail = tmp_path / "s" / "hot" / "conversation_tail.jsonl"
    _write_at(tail, end, bytes(200) + torn[200:] + later)
    with pytest.warns(RecoveryWarning, match=f"offset {end}"):
        repo = cls(tmp_path / "s", compact_every=1000)
    with repo:
        assert len(repo) == 5
        assert all(repo.get_message(f"pl-{i:03d}").status is ReadStatus.FOUND_VERIFIED for i in range(5))
        assert repo.get_message("pl-051").status is ReadStatus.NOT_FOUND_CONFIRMED
        assert [q["offset"] for q in repo.stats()["quarantined"]] == [end]
        assert repo.append(_msg(6))
    with cls(tmp_path / "s", compact_every=1000) as again:
        assert len(again) == 6


def test_damage_before_the_durable_mark_is_still_refused(tmp_path):
    """Bytes the store knows were durable (before the durable mark the
    writer published after its sync) that come back with a zeroed page are
    damage: the open refuses the store, naming the tail and the offset."""
    from rune_fast.errors import CorruptStateCheckpointError
    cls = _store(tmp_path / "s", crashed=True)
    assert not (tmp_path / "s" / "hot" / "conversation_index.snap").exists()
    raw, end = _tail(tmp_path / "s")
    third = raw.index(b"\n", raw.index(b"\n") + 1) + 1      # the third line's start
    tail = tmp_path / "s" / "hot" / "conversation_tail.jsonl"
    _write_at(tail, third, bytes(100))
    with pytest.raises(CorruptStateCheckpointError, match=f"conversation_tail.jsonl, offset {third}"):
        cls(tmp_path / "s", compact_every=1000)


def test_a_torn_envelope_is_skipped_and_written_again(tmp_path, caplog):
    """events.jsonl is synced only at checkpoints: a power loss may lose the
    first page of an acknowledged message's envelope and keep the rest (and
    later envelopes). The line holds zeros: skipped with a log record, and
    the envelope derived again from the tail; a torn final envelope is
    quarantined. A damaged envelope without zeros is still refused."""
    from rune_fast.errors import CorruptStateCheckpointError, RecoveryWarning
    cls = _store(tmp_path / "s")
    events = tmp_path / "s" / "events.jsonl"
    data = events.read_bytes()
    starts = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A][:-1]
    assert len(starts) == 5 and b'"pl-002"' in data[starts[2]:starts[3]]
    _write_at(events, starts[2], bytes(40))
    with cls(tmp_path / "s", compact_every=1000) as repo:
        assert len(repo) == 5
        ids = [e["id"] for e in repo._events.iter_envelopes()]
    assert sorted(ids) == [f"pl-{i:03d}" for i in range(5)]     # pl-002 written again
    assert any("a write a power loss tore" in r.getMessage() for r in caplog.records)
    size = events.stat().st_size
    last = data[starts[4]:]
    with open(events, "ab") as f:                 # a final envelope with a lost page
        f.write(bytes(30) + last[30:])
    with pytest.warns(RecoveryWarning, match=f"offset {size}"):
        cls(tmp_path / "s", compact_every=1000).close()
    assert events.stat().st_size > size - 1       # cut there, then nothing lost for good
    with open(events, "ab") as f:                 # a flipped byte, no zeros: damage
        f.write(last[:30] + b"#" + last[31:])
    with pytest.raises(CorruptStateCheckpointError, match="events.jsonl"):
        cls(tmp_path / "s", compact_every=1000)


def test_a_torn_tombstone_past_the_vouched_size_is_quarantined(tmp_path):
    """A deletion in flight whose tombstone line lost a page (zeros) past
    what the manifest vouches for was never acknowledged: quarantined, and
    the message reads as before; a tombstone damaged without zeros is still
    refused."""
    from rune_fast.conversation_state import ReadStatus
    from rune_fast.errors import CorruptStateCheckpointError, RecoveryWarning
    cls = _store(tmp_path / "live")
    with cls(tmp_path / "live", compact_every=1000) as repo:
        assert repo.delete("pl-001") and repo.delete("pl-002")
        shutil.copytree(tmp_path / "live", tmp_path / "s")     # as a killed writer leaves it
    tomb = tmp_path / "s" / "hot" / "conversation_tombstones.jsonl"
    data = tomb.read_bytes()
    second = data.index(b"\n") + 1
    tomb.write_bytes(data[:second] + bytes(40) + data[second + 40:])
    with pytest.warns(RecoveryWarning, match=f"offset {second}"):
        repo = cls(tmp_path / "s", compact_every=1000)
    with repo:
        assert repo.get_message("pl-001").status is ReadStatus.NOT_FOUND_CONFIRMED
        assert repo.get_message("pl-002").status is ReadStatus.FOUND_VERIFIED
    data = tomb.read_bytes()
    tomb.write_bytes(data[:10] + b"#" + data[11:])
    with pytest.raises(CorruptStateCheckpointError, match="tombstone"):
        cls(tmp_path / "s", compact_every=1000)


def test_a_new_store_syncs_its_folder_entries(tmp_path, monkeypatch):
    """A new state folder (and hot/) is made durable in its parent before
    the first acknowledged append: a power loss must not take the store
    whole (the suite's first finding)."""
    import rune_fast.fsutil as fsutil
    from rune_fast.conversation_state import ConversationStateRepository
    synced: list[str] = []
    real = fsutil.fsync_dir

    def spy(path):
        synced.append(os.path.normpath(path))
        real(path)
    monkeypatch.setattr(fsutil, "fsync_dir", spy)
    state = tmp_path / "new" / "state"
    with ConversationStateRepository(state) as repo:
        repo.append(_msg(1))
    assert str(tmp_path) in synced and str(tmp_path / "new") in synced and str(state) in synced
