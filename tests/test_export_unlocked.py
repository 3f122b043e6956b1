"""export_ops() reads the archive without the repository's lock.

A writer's export takes its lock for the hot records, the tombstones and
the choice of archive files (pinned), and reads those files after without
it: appends, deletions and compactions go on meanwhile, and the export is
the store as it was when it took the lock. These tests stop an export
between two archive files (or inside one), change the store under it, and
hold the answer to the export taken just before; an erasure or a merge of
a file the export has yet to read waits for it; a close raises
StoreClosedError; a failure leaves no file pinned.
"""
from __future__ import annotations

import gc
import os
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _unlocked import archived_store, in_thread
from rune_fast import ConversationMessageRecord, ConversationStateRepository, StoreClosedError
from rune_fast._conv.reads import HotCopy
from rune_fast.errors import CorruptStateCheckpointError


class _Paused:
    """Stands in for the archive's ``file_locs`` of an export: the
    ``at``-th call (the ``at``-th file the export reads) says so and waits
    until the test has done its calls; the repository's lock is not held
    then (an append would wait forever for it otherwise)."""

    def __init__(self, repo: ConversationStateRepository, at: int = 1) -> None:
        self.real = repo._cool.file_locs
        self.at, self.calls = at, 0
        self.entered = threading.Event()
        self.go = threading.Event()
        repo._cool.file_locs = self        # type: ignore[method-assign]

    def __call__(self, no: int, part: int):
        self.calls += 1
        if self.calls == self.at:
            self.entered.set()
            assert self.go.wait(60)
        return self.real(no, part)


def _stopped_export(repo: ConversationStateRepository, at: int):
    """The export's answer taken now, and an export started on a thread and
    stopped at its ``at``-th archive file: ``(want, gate, thread, out)``."""
    want = _ops(repo.export_ops())
    gate = _Paused(repo, at=at)
    t, out = in_thread(repo.export_ops)
    assert gate.entered.wait(60)
    return want, gate, t, out


def _ops(ops) -> list[tuple]:
    return [(op.op_id, str(op.hlc), sorted(op.payload.items(), key=lambda kv: kv[0])) for op in ops]


def _msg(i: int, ch: str = "c0", text: str = "new") -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"n{i}", role="user", content=f"{text} {i}", channel_id=ch,
                                     ts=100.0 + i)


def test_appends_deletions_and_cooling_go_on_while_an_export_reads_the_archive(tmp_path):
    repo = archived_store(str(tmp_path))
    want, gate, t, out = _stopped_export(repo, 2)
    w, done = in_thread(lambda: (repo.append_many([_msg(i) for i in range(4)]),
                                 repo.delete("b0-1"), repo.delete("b2-1"),
                                 repo.append(_msg(9, "c1")), repo.get_message("b1-2").record))
    w.join(60)
    assert not w.is_alive() and "error" not in done, done       # no wait for the export's lock
    assert done["value"][0] == 4 and done["value"][4].msg_id == "b1-2"
    gate.go.set()
    t.join(60)
    assert _ops(out["value"]) == want                           # the store as the export found it
    got = {op.op_id: op for op in repo.export_ops()}
    assert {"n0", "n3", "n9"} <= set(got) and got["b0-1"].payload.get("deleted") is True
    assert repo._cool._pins == {}
    repo.close()


def test_an_erasure_of_a_file_the_export_has_yet_to_read_waits_for_it(tmp_path):
    """compact() erasing a message deleted after the export began waits
    until the export has read the file holding it (the file stays live
    until then): the export has the message, and its bytes are gone from
    every file when compact() returns."""
    repo = archived_store(str(tmp_path))
    cool = os.path.join(str(tmp_path), "hot", "conversation_cool")
    last = os.path.join(cool, repo._cool.files()[-1])
    assert repo.get_message("b2-1").tier == "cool"
    want, gate, t, out = _stopped_export(repo, 1)
    assert repo.delete("b2-1")
    c, done = in_thread(repo.compact)
    c.join(0.5)
    assert c.is_alive() and os.path.exists(last)         # waiting for the export to read that file
    gate.go.set()
    t.join(60)
    c.join(60)
    assert not c.is_alive() and "error" not in done, done
    assert _ops(out["value"]) == want and "b2-1" in {op.op_id for op in out["value"]}
    assert not os.path.exists(last)
    for root, _dirs, names in os.walk(str(tmp_path)):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                assert b"secret21x" not in f.read(), name
    assert repo.get_message("b2-1").record is None and repo.verify().ok
    repo.close()


def test_a_merge_during_an_export_neither_loses_nor_repeats_a_message(tmp_path, monkeypatch):
    """compact() merging files the export has yet to read waits for it to
    read them; the export holds each message once."""
    from rune_fast._conv import tuning
    repo = archived_store(str(tmp_path))
    monkeypatch.setattr(tuning, "MERGE_FANOUT", 2)
    want, gate, t, out = _stopped_export(repo, 1)
    m, done = in_thread(repo.compact)
    m.join(0.3)
    assert m.is_alive()                                  # the merge waits for the export's files
    gate.go.set()
    t.join(60)
    m.join(60)
    assert "error" not in done, done
    assert _ops(out["value"]) == want
    assert len(repo._cool.files()) < 3 and _ops(repo.export_ops()) == want
    repo.close()


def test_a_close_during_an_export_raises_store_closed_and_pins_nothing(tmp_path):
    repo = archived_store(str(tmp_path))
    want, gate, t, out = _stopped_export(repo, 2)
    repo.close()
    gate.go.set()
    t.join(60)
    assert isinstance(out.get("error"), StoreClosedError), out
    assert repo._cool._pins == {}
    with ConversationStateRepository(str(tmp_path), hot_window=1) as again:
        assert _ops(again.export_ops()) == want


def test_a_damaged_archive_file_fails_the_export_and_unpins_every_file(tmp_path):
    repo = archived_store(str(tmp_path))
    path = repo._cool.path_of(repo._cool.files()[1])
    with open(path, "r+b") as f:
        data = f.read()
        at = data.index(b"secret1")
        f.seek(at)
        f.write(b"SECRET1")
    with pytest.raises(CorruptStateCheckpointError):
        repo.export_ops()
    assert repo._cool._pins == {}
    repo.close()


def test_a_viewers_export_reads_under_its_lock(tmp_path):
    repo = archived_store(str(tmp_path))
    want = _ops(repo.export_ops())
    with ConversationStateRepository(str(tmp_path), read_only=True) as viewer:
        assert _ops(viewer.export_ops()) == want
        assert viewer._cool._pins == {}
    repo.close()


_OP = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 40), st.sampled_from(["c0", "c1", "c2"])),
    st.tuples(st.just("delete"), st.sampled_from([f"b{b}-{i}" for b in range(3) for i in range(6)]
                                                 + [f"n{i}" for i in range(0, 40, 3)]), st.none()),
    st.tuples(st.just("compact"), st.none(), st.none()),
)


class _Counted:
    """Counts the archive files an export reads (its ``file_locs`` calls)."""

    def __init__(self, repo: ConversationStateRepository) -> None:
        self.real, self.calls = repo._cool.file_locs, 0
        repo._cool.file_locs = self        # type: ignore[method-assign]

    def __call__(self, no: int, part: int):
        self.calls += 1
        return self.real(no, part)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(_OP, max_size=8), during=st.lists(_OP, max_size=8), at=st.integers(1, 4),
       since=st.one_of(st.none(), st.floats(0, 1)))
def test_an_export_is_the_store_as_it_was_when_it_began(tmp_path_factory, before, during, at, since):
    """Random appends, deletions and compactions (automatic ones too)
    before the export and while it is stopped at its ``at``-th archive
    file: the export equals the one taken just before it began. ``since``:
    an export since the stamp of the op at that fraction of the whole
    export (after one since the same stamp, which makes the files' newest
    stamps known: the files it skips are not read)."""
    state = str(tmp_path_factory.mktemp("s"))
    repo = archived_store(state, compact_every=4)

    def run(ops) -> None:
        for kind, a, b in ops:
            if kind == "append":
                repo.append(_msg(a, b))
            elif kind == "delete":
                repo.delete(a)
            else:
                repo.compact()

    run(before)
    stamp = None
    if since is not None:
        every = repo.export_ops()
        stamp = every[min(len(every) - 1, int(since * len(every)))].hlc
        repo.export_ops(stamp)
    count = _Counted(repo)
    want = _ops(repo.export_ops(stamp))
    reads = count.calls
    repo._cool.file_locs = count.real       # type: ignore[method-assign]
    gate = _Paused(repo, at=min(at, reads))
    t, out = in_thread(lambda: repo.export_ops(stamp))
    if reads:
        assert gate.entered.wait(60)
    else:
        t.join(60)                          # (no archive file to stop at)
    runner, done = in_thread(lambda: run(during))
    runner.join(0.2)
    gate.go.set()
    t.join(60)
    runner.join(60)
    assert "error" not in done and "error" not in out, (done, out)
    assert _ops(out["value"]) == want
    assert repo._cool._pins == {}
    assert repo.verify().ok
    repo.close()


def test_the_hot_lines_copy_is_let_go_before_the_archive_is_read(tmp_path):
    """The export's hot lines are copied under the lock into one buffer
    (HotCopy: ~45 MB at 1,000,000 messages) and decoded first: the copy is
    gone while the archive files are read."""
    repo = archived_store(str(tmp_path))
    repo.append_many([_msg(i) for i in range(6)])
    repo._decoded.clear()       # (every hot line decoded from its copy)
    want, gate, t, out = _stopped_export(repo, 1)
    alive = [o for o in gc.get_objects() if type(o) is HotCopy]
    gate.go.set()
    t.join(60)
    assert alive == [] and _ops(out["value"]) == want
    repo.close()
