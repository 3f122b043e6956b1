"""TaskStateRepository: the task ledger of SPEC section 3."""
from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import signal
import stat
import subprocess
import sys
import textwrap
import threading

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from rune_fast.errors import (
    CorruptStateCheckpointError,
    IllegalTaskTransitionError,
    StateLockedError,
    StoreClosedError,
    UnknownTaskError,
)
from rune_fast.events import EventStore, RecoveryWarning
from rune_fast.records import TASK_STATUSES, TASK_TRANSITIONS, TERMINAL_STATUSES, TaskStateRecord, payload_hash
from rune_fast.tasks import TaskStateRepository

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A shortest path of legal moves from "created" to each status.
PATH_TO = {
    "created": [],
    "running": ["running"],
    "awaiting_approval": ["running", "awaiting_approval"],
    "completed": ["running", "completed"],
    "failed": ["running", "failed"],
    "cancelled": ["cancelled"],
    "superseded": ["superseded"],
}


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _write(path, data, mode="wb"):
    with open(path, mode) as f:
        f.write(data)


def _drive(repo, task_id, status):
    for step in PATH_TO[status]:
        repo.transition(task_id, step)
    assert repo.get(task_id).status == status


@pytest.fixture
def repo(tmp_path):
    r = TaskStateRepository(tmp_path / "state")
    yield r
    r.close()


# ----------------------------------------------------------------- basics

def test_create_get_latest(repo):
    t = repo.create("write tests", "chan", model="gpt", parent_task_id="task_parent")
    assert isinstance(t, TaskStateRecord)
    assert t.task_id.startswith("task_") and t.status == "created"
    assert t.title == "write tests" and t.channel_id == "chan"
    assert t.assigned_model == "gpt" and t.parent_task_id == "task_parent"
    assert repo.get(t.task_id) == t
    assert repo.get("task_nope") is None
    assert repo.latest("chan") == t
    assert repo.latest("other") is None
    assert repo.get_active("chan") == t
    assert repo.get_active("other") is None
    assert repo.list_open("chan") == [t]
    assert repo.list_open("other") == []


def test_create_defaults_and_bad_args(repo):
    t = repo.create("x", "c")
    assert t.assigned_model == "" and t.parent_task_id == ""
    size = repo.events.size
    with pytest.raises(ValueError, match="channel_id"):
        repo.create("x", "")
    with pytest.raises(TypeError, match="title"):
        repo.create(5, "c")
    with pytest.raises(ValueError, match="title"):
        repo.create("bad \ud800", "c")
    assert repo.events.size == size
    assert len(repo) == 1


@pytest.mark.parametrize("src, dst", list(itertools.product(TASK_STATUSES, TASK_STATUSES)))
def test_every_transition(tmp_path, src, dst):
    with TaskStateRepository(tmp_path) as repo:
        t = repo.create("t", "c")
        _drive(repo, t.task_id, src)
        before = repo.get(t.task_id)
        events_before = repo.events.size
        if dst in TASK_TRANSITIONS[src]:
            after = repo.transition(t.task_id, dst, outcome_ref="ref-1")
            assert after.status == dst and after.task_id == t.task_id
            assert after.updated_at > before.updated_at
            assert after.created_at == before.created_at and after.title == before.title
            assert after.outcome_ref == "ref-1"
            assert repo.get(t.task_id) == after
            env = list(repo.events.iter_envelopes(events_before))
            assert [e["type"] for e in env] == ["task_state.transition"]
            assert env[0]["payload_hash"] == payload_hash(after)
        else:
            with pytest.raises(IllegalTaskTransitionError, match=t.task_id):
                repo.transition(t.task_id, dst)
            assert repo.get(t.task_id) == before
            assert repo.events.size == events_before
    with TaskStateRepository(tmp_path) as repo:
        expected = dst if dst in TASK_TRANSITIONS[src] else src
        assert repo.get(t.task_id).status == expected


def test_unknown_status_and_task(repo):
    t = repo.create("t", "c")
    with pytest.raises(IllegalTaskTransitionError, match="done"):
        repo.transition(t.task_id, "done")
    with pytest.raises(ValueError):  # IllegalTaskTransitionError is a ValueError too
        repo.transition(t.task_id, "created")
    with pytest.raises(KeyError):
        repo.transition("task_missing", "running")
    with pytest.raises(UnknownTaskError, match="task_missing"):
        repo.amend("task_missing", "x")
    for odd in (["running"], None, 3):      # "anything else": not a TypeError from a set lookup
        with pytest.raises(IllegalTaskTransitionError, match="unknown status"):
            repo.transition(t.task_id, odd)
    assert repo.get(t.task_id) == t


def test_a_task_updated_at_the_largest_float_still_moves(repo):
    # nothing is after the largest float: updated_at stays, the move is made
    import sys
    t = TaskStateRecord(title="x", channel_id="c", status="running", updated_at=sys.float_info.max)
    assert repo.import_task(t)
    assert repo.amend(t.task_id, "y").updated_at == sys.float_info.max
    done = repo.transition(t.task_id, "completed")
    assert (done.status, done.updated_at) == ("completed", sys.float_info.max)


def test_outcome_ref_kept_when_not_given(repo):
    t = repo.create("t", "c")
    repo.transition(t.task_id, "running", outcome_ref="draft")
    done = repo.transition(t.task_id, "completed")
    assert done.outcome_ref == "draft"


def test_amend(repo):
    t = repo.create("first", "c")
    a = repo.amend(t.task_id, "second")
    assert a.task_id == t.task_id and a.title == "second" and a.status == "created"
    assert a.updated_at > t.updated_at and a.created_at == t.created_at
    repo.transition(t.task_id, "running")
    b = repo.amend(t.task_id, "third")
    assert b.status == "running" and repo.get(t.task_id) == b
    envs = [e["type"] for e in repo.events.iter_envelopes()]
    assert envs == ["task_state.created", "task_state.amended", "task_state.transition", "task_state.amended"]


@pytest.mark.parametrize("status", sorted(TERMINAL_STATUSES))
def test_amend_terminal_is_illegal(repo, status):
    t = repo.create("t", "c")
    _drive(repo, t.task_id, status)
    before = repo.get(t.task_id)
    size = repo.events.size
    with pytest.raises(IllegalTaskTransitionError, match=status):
        repo.amend(t.task_id, "again")
    assert repo.get(t.task_id) == before and repo.events.size == size


def test_get_active_semantics(repo):
    a = repo.create("a", "c")
    b = repo.create("b", "c")
    assert repo.get_active("c").task_id == b.task_id
    repo.amend(a.task_id, "a2")                      # amend makes a most recent
    assert repo.get_active("c").task_id == a.task_id
    repo.transition(b.task_id, "running")            # a plain transition does not
    assert repo.get_active("c").task_id == a.task_id
    repo.transition(a.task_id, "cancelled")          # terminal: the next most recent open
    assert repo.get_active("c").task_id == b.task_id
    c = repo.create("c", "c")
    repo.transition(c.task_id, "superseded")
    assert repo.get_active("c").task_id == b.task_id
    repo.transition(b.task_id, "completed")
    assert repo.get_active("c") is None
    assert repo.latest("c").task_id == c.task_id
    assert repo.list_open("c") == []


def test_list_open_oldest_first(repo):
    ts = [repo.create(f"t{i}", "c") for i in range(5)]
    repo.create("elsewhere", "d")
    repo.amend(ts[0].task_id, "t0 again")
    repo.transition(ts[2].task_id, "cancelled")
    assert [t.task_id for t in repo.list_open("c")] == [ts[i].task_id for i in (0, 1, 3, 4)]
    assert repo.latest("c").task_id == ts[4].task_id


def test_envelopes_match_records(repo):
    t = repo.create("t", "c")
    r = repo.transition(t.task_id, "running")
    a = repo.amend(t.task_id, "t2")
    envs = list(repo.events.iter_envelopes())
    assert [(e["type"], e["id"], e["payload_hash"]) for e in envs] == [
        ("task_state.created", t.task_id, payload_hash(t)),
        ("task_state.transition", t.task_id, payload_hash(r)),
        ("task_state.amended", t.task_id, payload_hash(a)),
    ]
    assert envs[1]["from"] == "created" and envs[1]["to"] == "running"


def test_import_task(tmp_path):
    legacy = TaskStateRecord(task_id="legacy_7", title="old", status="completed", channel_id="c",
                             created_at=100.0, updated_at=200.0, outcome_ref="out")
    with TaskStateRepository(tmp_path) as repo:
        assert repo.import_task(legacy) is True
        assert repo.import_task(legacy) is False
        assert repo.get("legacy_7") == legacy
        with pytest.raises(TypeError):
            repo.import_task({"task_id": "x"})  # type: ignore[arg-type]
        assert [e["type"] for e in repo.events.iter_envelopes()] == ["task_state.imported"]
    with TaskStateRepository(tmp_path) as repo:
        assert repo.get("legacy_7") == legacy
        assert repo.import_task(legacy) is False


# ----------------------------------------------------------------- lifecycle

def test_reopen_after_close(tmp_path):
    with TaskStateRepository(tmp_path, checkpoint_every=4) as repo:
        made = [repo.create(f"t{i}", f"c{i % 2}") for i in range(6)]
        repo.amend(made[0].task_id, "t0b")
        repo.transition(made[1].task_id, "running")
        repo.transition(made[3].task_id, "cancelled")
        snapshot = {t.task_id: repo.get(t.task_id) for t in made}
        active = {c: repo.get_active(c) for c in ("c0", "c1")}
        opened = {c: repo.list_open(c) for c in ("c0", "c1")}
    for _ in range(2):
        with TaskStateRepository(tmp_path, checkpoint_every=4) as repo:
            assert {t.task_id: repo.get(t.task_id) for t in made} == snapshot
            assert {c: repo.get_active(c) for c in ("c0", "c1")} == active
            assert {c: repo.list_open(c) for c in ("c0", "c1")} == opened
            assert repo.latest("c1") == snapshot[made[5].task_id]
    names = os.listdir(tmp_path / "hot")
    assert "task_state.json" in names
    assert len([n for n in names if n.startswith("task_log-")]) == 1  # older generations deleted


def test_reopen_without_close_replays_log(tmp_path):
    repo = TaskStateRepository(tmp_path, checkpoint_every=1000)
    t = repo.create("t", "c")
    repo.transition(t.task_id, "running")
    repo._dirlock.release()  # simulate a crash: the process is gone, nothing was checkpointed
    repo._log.close()
    with TaskStateRepository(tmp_path) as again:
        assert again.get(t.task_id).status == "running"


def test_calls_after_close(tmp_path):
    repo = TaskStateRepository(tmp_path)
    t = repo.create("t", "c")
    repo.close()
    repo.close()
    assert repo.closed
    for call in (lambda: repo.create("x", "c"), lambda: repo.get(t.task_id),
                 lambda: repo.amend(t.task_id, "y"), lambda: repo.transition(t.task_id, "running"),
                 lambda: repo.get_active("c"), lambda: repo.list_open("c"), lambda: repo.latest("c")):
        with pytest.raises(StoreClosedError):
            call()


def test_files_are_private(tmp_path):
    state = tmp_path / "state"
    with TaskStateRepository(state, checkpoint_every=1) as repo:
        repo.create("t", "c")
    for dirpath, dirnames, filenames in os.walk(state):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for name in filenames:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) == 0o600, name


def test_shared_event_store_is_not_closed(tmp_path):
    store = EventStore(tmp_path / "elsewhere" / "events.jsonl")
    with TaskStateRepository(tmp_path / "state", events=store) as repo:
        repo.create("t", "c")
    assert not store.closed
    assert [e["type"] for e in store.iter_envelopes()] == ["task_state.created"]
    assert not (tmp_path / "state" / "events.jsonl").exists()
    store.close()


def test_events_path_option(tmp_path):
    path = tmp_path / "ev" / "events.jsonl"
    with TaskStateRepository(tmp_path / "state", events=path) as repo:
        repo.create("t", "c")
        assert repo.events.path == str(path)
    with EventStore(path) as store:
        assert len(list(store.iter_envelopes())) == 1


# ----------------------------------------------------------------- damage

def _make(tmp_path, n=5, every=3):
    with TaskStateRepository(tmp_path, checkpoint_every=every) as repo:
        for i in range(n):
            repo.create(f"t{i}", "c")
    return tmp_path / "hot" / "task_state.json"


@pytest.mark.parametrize("cut", [0, 5, 30, -3, -1])
def test_truncated_checkpoint(tmp_path, cut):
    cp = _make(tmp_path)
    data = _read(cp)
    _write(cp, data[:cut] if cut >= 0 else data[:len(data) + cut])
    with pytest.raises(CorruptStateCheckpointError) as info:
        TaskStateRepository(tmp_path)
    assert info.value.path == str(cp)
    # the failed open released its lock
    with pytest.raises(CorruptStateCheckpointError):
        TaskStateRepository(tmp_path)


def test_corrupted_checkpoint(tmp_path):
    cp = _make(tmp_path)
    data = bytearray(_read(cp))
    i = data.find(b'"title":"t1"') + 10
    data[i] = ord("9")  # still valid JSON
    _write(cp, bytes(data))
    with pytest.raises(CorruptStateCheckpointError, match="checksum") as info:
        TaskStateRepository(tmp_path)
    assert str(cp) in str(info.value)


def test_missing_log_generation_is_loud(tmp_path):
    _make(tmp_path)
    (log,) = [p for p in (tmp_path / "hot").iterdir() if p.name.startswith("task_log-")]
    log.unlink()
    with pytest.raises(CorruptStateCheckpointError, match="missing"):
        TaskStateRepository(tmp_path)


def test_damaged_log_line(tmp_path):
    with TaskStateRepository(tmp_path, checkpoint_every=100) as repo:
        repo.create("a", "c")
        repo.create("b", "c")
        log_path = repo._log.path
        repo._since_checkpoint = 0  # keep the changes in the log only
    data = bytearray(_read(log_path))
    data[40] ^= 0x01
    _write(log_path, bytes(data))
    with pytest.raises(CorruptStateCheckpointError) as info:
        TaskStateRepository(tmp_path)
    assert info.value.path == log_path and info.value.offset == 0


def test_missing_log_line_is_a_gap(tmp_path):
    with TaskStateRepository(tmp_path, checkpoint_every=100) as repo:
        for i in range(3):
            repo.create(f"t{i}", "c")
        log_path = repo._log.path
        repo._since_checkpoint = 0
    lines = _read(log_path).splitlines(keepends=True)
    _write(log_path, lines[0] + lines[2])
    with pytest.raises(CorruptStateCheckpointError, match="sequence gap"):
        TaskStateRepository(tmp_path)


def test_torn_log_line_is_quarantined(tmp_path):
    with TaskStateRepository(tmp_path, checkpoint_every=100) as repo:
        a = repo.create("a", "c")
        log_path = repo._log.path
        repo._since_checkpoint = 0
    _write(log_path, b'{"x":"0011223344556677","n":2,"op":"crea', mode="ab")
    with pytest.warns(RecoveryWarning):
        repo = TaskStateRepository(tmp_path)
    with repo:
        assert repo.get(a.task_id) == a and len(repo) == 1
        assert repo.stats()["quarantined"]
        b = repo.create("b", "c")
    with TaskStateRepository(tmp_path) as repo:
        assert repo.get(b.task_id) == b


def test_leftovers_of_interrupted_checkpoint(tmp_path):
    with TaskStateRepository(tmp_path, checkpoint_every=2) as repo:
        a = repo.create("a", "c")
        b = repo.create("b", "c")   # checkpoint -> gen 1
        c = repo.create("c", "c")
        gen = repo._gen
    hot = tmp_path / "hot"
    # crash before the checkpoint write: an empty next-generation log exists
    _write(hot / ("task_log-%08d.jsonl" % (gen + 5)), b"")
    # crash after it: the previous generation's log was not yet deleted
    _write(hot / ("task_log-%08d.jsonl" % (gen - 1)), b"")
    with TaskStateRepository(tmp_path) as repo:
        assert [repo.get(t.task_id) for t in (a, b, c)] == [a, b, c]
    assert len([n for n in os.listdir(hot) if n.startswith("task_log-")]) == 1


def test_nonempty_future_log_is_loud(tmp_path):
    with TaskStateRepository(tmp_path, checkpoint_every=2) as repo:
        repo.create("a", "c")
        repo.create("b", "c")
        gen = repo._gen
    _write(tmp_path / "hot" / ("task_log-%08d.jsonl" % (gen + 1)), b"x\n")
    with pytest.raises(CorruptStateCheckpointError, match="newer"):
        TaskStateRepository(tmp_path)


# ----------------------------------------------------------------- writers

LOCKER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from rune_fast.tasks import TaskStateRepository
    repo = TaskStateRepository(sys.argv[2])
    repo.create("held", "c")
    print("open", flush=True)
    sys.stdin.readline()
    repo.close()
""")


def test_second_writer_process(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", LOCKER, ROOT, str(tmp_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "open"
        with pytest.raises(StateLockedError) as info:
            TaskStateRepository(tmp_path)
        assert str(tmp_path) in str(info.value)
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    with TaskStateRepository(tmp_path) as repo:
        assert repo.latest("c").title == "held"


def test_second_writer_same_process(tmp_path):
    with TaskStateRepository(tmp_path):
        with pytest.raises(StateLockedError):
            TaskStateRepository(tmp_path)
    TaskStateRepository(tmp_path).close()


def test_many_threads(tmp_path):
    repo = TaskStateRepository(tmp_path, checkpoint_every=16)
    errors: list[BaseException] = []
    results: dict[int, list[str]] = {}

    def work(k):
        try:
            mine = []
            for i in range(15):
                t = repo.create(f"t{k}-{i}", f"c{k % 3}")
                repo.transition(t.task_id, "running")
                repo.amend(t.task_id, f"t{k}-{i}b")
                if i % 2:
                    repo.transition(t.task_id, "completed")
                mine.append(t.task_id)
            results[k] = mine
        except BaseException as exc:  # surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    expected = {tid: repo.get(tid) for ids in results.values() for tid in ids}
    assert len(expected) == 90
    repo.close()
    with TaskStateRepository(tmp_path) as again:
        assert {tid: again.get(tid) for tid in expected} == expected
        assert len(again) == 90
        assert len(list(again.events.iter_envelopes())) == 90 * 3 + 6 * 7


# ----------------------------------------------------------------- crash

CRASHER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from rune_fast.tasks import TaskStateRepository
    repo = TaskStateRepository(sys.argv[2], checkpoint_every=7)
    i = 0
    while True:
        t = repo.create(f"t{i}", f"c{i % 3}")
        print("C", t.task_id, flush=True)
        r = repo.transition(t.task_id, "running")
        print("T", t.task_id, "running", flush=True)
        if i % 2:
            repo.amend(t.task_id, f"t{i}b")
            print("A", t.task_id, f"t{i}b", flush=True)
        if i % 3 == 0:
            repo.transition(t.task_id, "completed")
            print("T", t.task_id, "completed", flush=True)
        i += 1
""")


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3])
def test_sigkill_keeps_every_acknowledged_change(tmp_path, delay):
    import time
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, ROOT, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    first = [proc.stdout.readline() for _ in range(5)]  # the writer is under way
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    # read the rest through the same buffered file: communicate() reads the raw
    # pipe and would skip what readline() buffered past the fifth line
    rest = proc.stdout.read()
    proc.stdout.close()
    proc.wait(timeout=30)
    out = "".join(first) + rest
    assert proc.returncode == -signal.SIGKILL
    status: dict[str, str] = {}
    titles: dict[str, str] = {}
    # only lines ended by a newline were printed whole: the kill can cut the
    # last one anywhere ("T <id> runn", "T <id> ", "A <id> t5")
    for line in out.split("\n")[:-1]:
        parts = line.split(" ")
        if parts[0] == "C":
            status[parts[1]] = "created"
        elif parts[0] == "T" and len(parts) == 3:
            status[parts[1]] = parts[2]
        elif parts[0] == "A" and len(parts) == 3:
            titles[parts[1]] = parts[2]
    assert status, "the writer acknowledged nothing before the kill"
    # A torn final line (a change in flight) is quarantined with a warning.
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        repo = TaskStateRepository(tmp_path)
    with repo:
        for tid, st in status.items():
            got = repo.get(tid)
            assert got is not None, tid
            # the change in flight may or may not have landed: at least as far as acknowledged
            order = ["created", "running", "completed"]
            assert order.index(got.status) >= order.index(st), (tid, got.status, st)
        for tid, title in titles.items():
            assert repo.get(tid).title == title
        assert len(repo) in (len(status), len(status) + 1)
        assert repo.stats()["rejournaled"] == 0  # every envelope was written before its log line
        for env in repo.events.iter_envelopes():
            assert env["type"].startswith("task_state.")


# ----------------------------------------------------------------- model
# A hypothesis state machine drives the repository against a plain-Python
# model of SPEC section 3, with close-and-reopen (and reopen without the final
# checkpoint) among its steps.

CHANNELS = ("alpha", "beta", "gamma")


class Model:
    """The ledger as plain lists and dicts."""

    def __init__(self) -> None:
        self.order: list[str] = []             # creation order
        self.status: dict[str, str] = {}
        self.title: dict[str, str] = {}
        self.channel: dict[str, str] = {}
        self.touched: dict[str, int] = {}      # clock of last create/amend
        self.clock = 0

    def touch(self, tid: str) -> None:
        self.clock += 1
        self.touched[tid] = self.clock

    def active(self, channel: str) -> str | None:
        open_ids = [t for t in self.order if self.channel[t] == channel and self.status[t] not in TERMINAL_STATUSES]
        return max(open_ids, key=lambda t: self.touched[t]) if open_ids else None

    def open_ids(self, channel: str) -> list[str]:
        return [t for t in self.order if self.channel[t] == channel and self.status[t] not in TERMINAL_STATUSES]

    def latest(self, channel: str) -> str | None:
        ids = [t for t in self.order if self.channel[t] == channel]
        return ids[-1] if ids else None


class TaskLedgerMachine(RuleBasedStateMachine):
    tasks = Bundle("tasks")

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="rune-tasks-model-")
        self.every = 3
        self.repo = TaskStateRepository(self.dir, checkpoint_every=self.every)
        self.model = Model()

    @rule(target=tasks, title=st.text(max_size=8), channel=st.sampled_from(CHANNELS))
    def create(self, title, channel):
        t = self.repo.create(title, channel)
        m = self.model
        m.order.append(t.task_id)
        m.status[t.task_id] = "created"
        m.title[t.task_id] = title
        m.channel[t.task_id] = channel
        m.touch(t.task_id)
        return t.task_id

    @rule(tid=tasks, status=st.sampled_from(TASK_STATUSES))
    def transition(self, tid, status):
        m = self.model
        before = self.repo.get(tid)
        if status in TASK_TRANSITIONS[m.status[tid]]:
            after = self.repo.transition(tid, status)
            assert after.status == status and after.updated_at > before.updated_at
            m.status[tid] = status
        else:
            try:
                self.repo.transition(tid, status)
            except IllegalTaskTransitionError:
                pass
            else:
                raise AssertionError(f"{m.status[tid]} -> {status} was accepted")
            assert self.repo.get(tid) == before

    @rule(tid=tasks, title=st.text(max_size=8))
    def amend(self, tid, title):
        m = self.model
        if m.status[tid] in TERMINAL_STATUSES:
            try:
                self.repo.amend(tid, title)
            except IllegalTaskTransitionError:
                return
            raise AssertionError("amend of a terminal task was accepted")
        after = self.repo.amend(tid, title)
        assert after.task_id == tid and after.title == title
        m.title[tid] = title
        m.touch(tid)

    @rule(every=st.integers(1, 5))
    def reopen(self, every):
        self.repo.close()
        self.every = every
        self.repo = TaskStateRepository(self.dir, checkpoint_every=every)

    @precondition(lambda self: self.model.order)
    @rule()
    def crash_reopen(self):
        # Drop the repository without close(): no final checkpoint.
        self.repo._since_checkpoint = 0
        self.repo.close()
        self.repo = TaskStateRepository(self.dir, checkpoint_every=self.every)

    @invariant()
    def matches_model(self):
        m, repo = self.model, self.repo
        assert len(repo) == len(m.order)
        for tid in m.order:
            r = repo.get(tid)
            assert (r.status, r.title, r.channel_id) == (m.status[tid], m.title[tid], m.channel[tid])
        for ch in CHANNELS:
            active = repo.get_active(ch)
            assert (active.task_id if active else None) == m.active(ch)
            assert [t.task_id for t in repo.list_open(ch)] == m.open_ids(ch)
            latest = repo.latest(ch)
            assert (latest.task_id if latest else None) == m.latest(ch)

    def teardown(self):
        self.repo.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TaskLedgerMachine.TestCase.settings = settings(
    max_examples=20, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_task_ledger_against_model = TaskLedgerMachine.TestCase


def test_leftover_checkpoint_temp_is_removed(tmp_path):
    with TaskStateRepository(tmp_path) as repo:
        t = repo.create("t", "c")
    leftover = tmp_path / "hot" / ".task_state.json.abc123.tmp"
    _write(leftover, b'{"x":"half')
    with TaskStateRepository(tmp_path) as repo:
        assert repo.get(t.task_id) == t
    assert not leftover.exists()


def test_checkpoint_with_duplicate_task_is_loud(tmp_path):
    from rune_fast.atomic import AtomicStore
    with TaskStateRepository(tmp_path) as repo:
        repo.create("t", "c")
    store = AtomicStore(tmp_path / "hot" / "task_state.json")
    body = store.read()
    body["tasks"].append(body["tasks"][0])
    store.write(body)
    with pytest.raises(CorruptStateCheckpointError, match="twice"):
        TaskStateRepository(tmp_path)


def _crash(repo):
    """Drop a repository as a dead process would: no checkpoint, no close."""
    repo._dirlock.release()
    repo._log.close()
    if repo._own_events:
        repo._events.close()


def test_envelopes_lost_in_power_loss_are_rejournaled(tmp_path, caplog):
    repo = TaskStateRepository(tmp_path, checkpoint_every=1000)
    t = repo.create("t", "c")
    r = repo.transition(t.task_id, "running")
    _crash(repo)
    _write(tmp_path / "events.jsonl", b"")  # the unsynced envelopes never reached the disk
    with TaskStateRepository(tmp_path) as again:
        assert again.get(t.task_id) == r
        assert again.stats()["rejournaled"] == 2
        envs = list(again.events.iter_envelopes())
    assert [(e["type"], e["id"], e["payload_hash"], e["status"]) for e in envs] == [
        ("task_state.created", t.task_id, payload_hash(t), "created"),
        ("task_state.transition", t.task_id, payload_hash(r), "running"),
    ]
    assert envs[1]["from"] == "created" and envs[1]["to"] == "running"
    assert any("re-journaled" in rec.getMessage() for rec in caplog.records)
    with TaskStateRepository(tmp_path) as third:  # nothing more to repair
        assert third.stats()["rejournaled"] == 0


def test_rejournal_when_other_envelopes_took_the_offsets(tmp_path):
    repo = TaskStateRepository(tmp_path, checkpoint_every=1000)
    t = repo.create("t", "c")
    _crash(repo)
    _write(tmp_path / "events.jsonl", b"")
    with EventStore(tmp_path / "events.jsonl") as other:  # another writer after the restart
        other.append_durable("conversation.message", "msg_x" * 10, "cd" * 32)
    with TaskStateRepository(tmp_path) as again:
        assert again.stats()["rejournaled"] == 1
        assert [e["id"] for e in again.events.iter_envelopes()] == ["msg_x" * 10, t.task_id]


def test_a_damaged_envelope_of_a_logged_change_is_loud(tmp_path):
    """An envelope that is there but fails its check is damage (SPEC: damage
    is loud), not one a power loss took: open names events.jsonl and the
    offset, and re-journals nothing; a zero-filled line is what a power loss
    leaves, and is re-journaled."""
    repo = TaskStateRepository(tmp_path, checkpoint_every=1000)
    a = repo.create("a", "c")
    repo.create("b", "c")
    repo.create("c", "c")
    _crash(repo)
    path = tmp_path / "events.jsonl"
    data = path.read_bytes()
    second = data.index(b"\n") + 1
    third = data.index(b"\n", second) + 1
    _write(path, data[:second + 30] + b"X" + data[second + 31:])
    with pytest.raises(CorruptStateCheckpointError) as err:
        TaskStateRepository(tmp_path)
    assert "events.jsonl" in str(err.value) and f"offset {second}" in str(err.value)
    assert path.read_bytes().count(b"\n") == 3          # nothing was appended
    _write(path, data[:second] + bytes(third - second - 1) + data[third - 1:])
    with TaskStateRepository(tmp_path) as again:
        assert again.stats()["rejournaled"] == 1 and again.get(a.task_id) == a
    # a page lost between two kept ones: the line there starts with the
    # envelope's bytes, then zeros, then the end of the next line
    repo = TaskStateRepository(tmp_path, checkpoint_every=1000)
    more = [repo.create(f"m{i}", "c") for i in range(3)]
    _crash(repo)
    data = path.read_bytes()
    start = data.index(b'"' + more[0].task_id.encode()) - 30
    start = data.rindex(b"\n", 0, start) + 1
    nxt = data.index(b"\n", start) + 1
    _write(path, data[:start + 40] + bytes(nxt + 40 - start - 40) + data[nxt + 40:])
    with TaskStateRepository(tmp_path) as again:
        assert again.stats()["rejournaled"] == 2 and [again.get(t.task_id) for t in more] == more


def test_a_task_record_over_the_size_limit_writes_nothing(tmp_path):
    """create/amend of a record whose JSON exceeds MAX_RECORD_BYTES raise
    RecordTooLargeError naming the task before anything is written: no
    envelope for a change that did not happen."""
    from rune_fast.codec import MAX_RECORD_BYTES
    from rune_fast.errors import RecordTooLargeError
    with TaskStateRepository(tmp_path) as repo:
        with pytest.raises(RecordTooLargeError, match="task_"):
            repo.create("x" * MAX_RECORD_BYTES, "c")
        t = repo.create("ok", "c")
        with pytest.raises(RecordTooLargeError, match=t.task_id):
            repo.amend(t.task_id, "y" * MAX_RECORD_BYTES)
        assert len(repo) == 1 and repo.get(t.task_id) == t
        envs = [(e["type"], e["id"]) for e in repo.events.iter_envelopes()]
    assert envs == [("task_state.created", t.task_id)]
    with TaskStateRepository(tmp_path) as again:
        assert again.get(t.task_id) == t and again.get(t.task_id).title == "ok"


def test_no_rejournal_after_clean_reopen_with_shared_store(tmp_path):
    store = EventStore(tmp_path / "ev" / "events.jsonl")
    repo = TaskStateRepository(tmp_path / "state", events=store, checkpoint_every=1000)
    repo.create("t", "c")
    _crash(repo)
    # reopened with the default events path: the envelope is checked where it was written
    with TaskStateRepository(tmp_path / "state") as again:
        assert again.stats()["rejournaled"] == 0
    store.close()


def test_crash_before_the_first_checkpoint_is_written(tmp_path):
    """The first checkpoint creates the next (empty) log, then writes the
    checkpoint; a crash between the two leaves an empty later log beside no
    checkpoint. Reopening keeps every change and drops the empty log."""
    live = tmp_path / "live"
    tasks = TaskStateRepository(live)
    made = [tasks.create(f"t{i}", "ch") for i in range(3)]
    crashed = tmp_path / "crashed"          # the files as a crash right now leaves them
    shutil.copytree(live, crashed)
    tasks.close()
    hot = crashed / "hot"
    assert json.loads((hot / "task_state.json").read_bytes())["body"]["gen"] == 0   # the new ledger's
    # a ledger of an earlier build has no checkpoint before its first one
    older = tmp_path / "older"
    shutil.copytree(crashed, older, ignore=shutil.ignore_patterns("task_state.json"))
    (older / "hot" / "task_log-00000001.jsonl").write_bytes(b"")
    (hot / "task_log-00000001.jsonl").write_bytes(b"")
    with TaskStateRepository(crashed) as again:
        assert [again.get(t.task_id) for t in made] == made
    with TaskStateRepository(older) as again:
        assert [again.get(t.task_id) for t in made] == made
    with TaskStateRepository(older) as again:
        assert [again.get(t.task_id) for t in made] == made
    # a later log that holds changes without any checkpoint is damage, loudly
    damaged = tmp_path / "damaged"
    shutil.copytree(live, damaged, ignore=shutil.ignore_patterns("task_state.json"))
    (damaged / "hot" / "task_log-00000007.jsonl").write_bytes(
        b'{"x":"0000000000000000","a":1}\n')
    with pytest.raises(CorruptStateCheckpointError):
        TaskStateRepository(damaged)


def test_a_lost_log_of_a_new_ledger_is_refused(tmp_path):
    """A new ledger writes its generation-0 checkpoint at once: its log lost
    before the first real checkpoint is refused, naming the log, instead of
    opening as an empty ledger (the tasks silently gone)."""
    with TaskStateRepository(tmp_path / "live") as tasks:
        tasks.create("kept", "ch")
        shutil.copytree(tmp_path / "live", tmp_path / "lost")   # as a crash leaves it
    log_path = tmp_path / "lost" / "hot" / "task_log-00000000.jsonl"
    log_path.unlink()
    with pytest.raises(CorruptStateCheckpointError) as err:
        TaskStateRepository(tmp_path / "lost")
    assert str(log_path) in str(err.value)


def test_checkpoint_rewrites_stay_a_constant_share_of_the_changes(tmp_path, monkeypatch):
    """A checkpoint rewrites every task, so the log grows to a quarter of
    the ledger before one: the tasks written by all checkpoints stay a few
    times the ledger's size (every checkpoint_every changes, 400 creates
    with checkpoint_every=4 wrote 100 checkpoints, 20,200 tasks; the cost
    of a create grew with the ledger, 2.6 ms at 30,000 tasks), and a
    reopen after a crash replays the longer log to the same ledger."""
    from rune_fast.atomic import AtomicStore
    written = []
    real = AtomicStore.write

    def counting(self, obj):
        if isinstance(obj, dict) and "tasks" in obj:
            written.append(len(obj["tasks"]))
        return real(self, obj)
    monkeypatch.setattr(AtomicStore, "write", counting)
    repo = TaskStateRepository(tmp_path, checkpoint_every=4)
    ids = [repo.create(f"t{i}", f"c{i % 3}").task_id for i in range(400)]
    assert sum(written) <= 6 * 400, written
    assert 0 < repo.stats()["since_checkpoint"] <= 400 // 4
    repo.transition(ids[7], "running")
    want = {t.task_id: t for t in repo.list_tasks()}
    repo._log.close()              # (a crash: no close, no checkpoint of the log)
    repo._dirlock.release()
    with TaskStateRepository(tmp_path, checkpoint_every=4) as again:
        assert {t.task_id: t for t in again.list_tasks()} == want
        assert again.get(ids[7]).status == "running"
