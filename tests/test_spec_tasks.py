"""SPEC section 3: TaskStateRepository (black-box)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rune_fast.conversation_state import (
    IllegalTaskTransitionError,
    RuneError,
    StateLockedError,
    TaskStateRepository,
)
from rune_fast.records import TASK_TRANSITIONS, TaskStateRecord

from spec_helpers import canonical_hash, envelopes_of, hashes_of, read_envelopes

ROOT = Path(__file__).resolve().parents[1]
STATUSES = ["created", "running", "awaiting_approval", "completed", "failed", "cancelled", "superseded"]
TERMINAL = {"completed", "failed", "cancelled", "superseded"}


@pytest.fixture
def sd(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def repo(sd):
    r = TaskStateRepository(sd)
    yield r
    r.close()


def _path_to(status):
    """Legal path of transitions from created to status."""
    return {
        "created": [],
        "running": ["running"],
        "awaiting_approval": ["running", "awaiting_approval"],
        "completed": ["running", "completed"],
        "failed": ["running", "failed"],
        "cancelled": ["cancelled"],
        "superseded": ["superseded"],
    }[status]


def _make(repo, status, title="t", ch="ch"):
    t = repo.create(title, ch)
    for s in _path_to(status):
        t = repo.transition(t.task_id, s)
    assert t.status == status
    return t


# ------------------------------------------------------------------ create / get

def test_create_returns_record(repo):
    before = time.time()
    t = repo.create("Write report", "c1")
    assert isinstance(t, TaskStateRecord)
    assert t.title == "Write report"
    assert t.channel_id == "c1"
    assert t.status == "created"
    assert t.task_id.startswith("task_")
    assert t.parent_task_id == ""
    assert t.assigned_model == ""
    assert t.outcome_ref == ""
    assert before - 1 <= t.created_at <= time.time() + 1
    assert repo.get(t.task_id) == t


def test_create_with_model_and_parent(repo):
    p = repo.create("parent", "c1")
    t = repo.create("child", "c1", model="claude-x", parent_task_id=p.task_id)
    assert t.assigned_model == "claude-x"
    assert t.parent_task_id == p.task_id
    assert repo.get(t.task_id) == t


def test_create_ids_unique(repo):
    ids = {repo.create(f"t{i}", "c").task_id for i in range(50)}
    assert len(ids) == 50


def test_get_unknown_is_none(repo):
    assert repo.get("task_nope") is None


def test_create_empty_channel_rejected_and_nothing_written(repo, sd):
    before = len(read_envelopes(sd / "events.jsonl"))
    with pytest.raises((ValueError, TypeError)):
        repo.create("t", "")
    assert len(read_envelopes(sd / "events.jsonl")) == before
    assert repo.latest("") is None


# ------------------------------------------------------------------ amend

def test_amend_keeps_id_changes_title_bumps_updated_at(repo):
    t = repo.create("first", "c")
    time.sleep(0.01)
    a = repo.amend(t.task_id, "second")
    assert a.task_id == t.task_id
    assert a.title == "second"
    assert a.status == t.status
    assert a.created_at == t.created_at
    assert a.updated_at > t.updated_at
    assert a.channel_id == t.channel_id
    assert repo.get(t.task_id) == a


@pytest.mark.parametrize("status", sorted(TERMINAL))
def test_amend_terminal_raises_and_changes_nothing(repo, sd, status):
    t = _make(repo, status)
    n = len(read_envelopes(sd / "events.jsonl"))
    with pytest.raises(IllegalTaskTransitionError):
        repo.amend(t.task_id, "new title")
    assert repo.get(t.task_id) == t
    assert len(read_envelopes(sd / "events.jsonl")) == n


def test_amend_unknown_is_keyerror(repo):
    with pytest.raises(KeyError):
        repo.amend("task_unknown", "x")


# ------------------------------------------------------------------ transition

@pytest.mark.parametrize("src", STATUSES)
@pytest.mark.parametrize("dst", STATUSES)
def test_transition_edges(repo, sd, src, dst):
    t = _make(repo, src)
    if dst in TASK_TRANSITIONS[src]:
        time.sleep(0.002)
        r = repo.transition(t.task_id, dst, outcome_ref="out://1")
        assert r.status == dst
        assert r.task_id == t.task_id
        assert r.title == t.title
        assert r.outcome_ref == "out://1"
        assert r.updated_at >= t.updated_at
        assert repo.get(t.task_id) == r
    else:
        n = len(read_envelopes(sd / "events.jsonl"))
        with pytest.raises(IllegalTaskTransitionError):
            repo.transition(t.task_id, dst)
        assert repo.get(t.task_id) == t
        assert len(read_envelopes(sd / "events.jsonl")) == n


def test_transition_to_unknown_status_is_illegal(repo):
    t = repo.create("t", "c")
    with pytest.raises(IllegalTaskTransitionError):
        repo.transition(t.task_id, "done")
    assert repo.get(t.task_id) == t


def test_transition_unknown_task_is_keyerror(repo):
    with pytest.raises(KeyError):
        repo.transition("task_unknown", "running")


def test_illegal_transition_error_is_rune_error():
    assert issubclass(IllegalTaskTransitionError, RuneError)
    assert issubclass(StateLockedError, RuneError)


# ------------------------------------------------------------------ get_active

def test_get_active_none_for_empty_or_unknown(repo):
    assert repo.get_active("c") is None
    repo.create("t", "other")
    assert repo.get_active("c") is None


def test_get_active_most_recent_created(repo):
    a = repo.create("a", "c")
    b = repo.create("b", "c")
    assert repo.get_active("c").task_id == b.task_id
    assert repo.get_active("c") == repo.get(b.task_id)
    assert a.task_id != b.task_id


def test_get_active_amend_makes_recent(repo):
    a = repo.create("a", "c")
    b = repo.create("b", "c")
    repo.amend(a.task_id, "a2")
    act = repo.get_active("c")
    assert act.task_id == a.task_id
    assert act.title == "a2"
    repo.amend(b.task_id, "b2")
    assert repo.get_active("c").task_id == b.task_id


def test_get_active_plain_transition_does_not_make_recent(repo):
    a = repo.create("a", "c")
    b = repo.create("b", "c")
    repo.transition(a.task_id, "running")
    assert repo.get_active("c").task_id == b.task_id
    repo.transition(a.task_id, "awaiting_approval")
    assert repo.get_active("c").task_id == b.task_id
    repo.transition(a.task_id, "running")
    assert repo.get_active("c").task_id == b.task_id


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_get_active_terminal_clears_and_next_becomes_active(repo, terminal):
    a = repo.create("a", "c")
    b = repo.create("b", "c")
    c = repo.create("c", "c")
    repo.amend(a.task_id, "a amended")  # order of recency now: b < c < a
    for s in _path_to(terminal):
        repo.transition(a.task_id, s)
    assert repo.get_active("c").task_id == c.task_id
    for s in _path_to(terminal):
        repo.transition(c.task_id, s)
    assert repo.get_active("c").task_id == b.task_id
    for s in _path_to(terminal):
        repo.transition(b.task_id, s)
    assert repo.get_active("c") is None


def test_get_active_awaiting_approval_is_open(repo):
    a = repo.create("a", "c")
    repo.transition(a.task_id, "running")
    repo.transition(a.task_id, "awaiting_approval")
    act = repo.get_active("c")
    assert act is not None and act.task_id == a.task_id and act.status == "awaiting_approval"


def test_get_active_per_channel(repo):
    a = repo.create("a", "c1")
    b = repo.create("b", "c2")
    assert repo.get_active("c1").task_id == a.task_id
    assert repo.get_active("c2").task_id == b.task_id
    repo.transition(a.task_id, "cancelled")
    assert repo.get_active("c1") is None
    assert repo.get_active("c2").task_id == b.task_id


def test_get_active_after_reopen(sd):
    with TaskStateRepository(sd) as r:
        a = r.create("a", "c")
        b = r.create("b", "c")
        r.amend(a.task_id, "a2")
        r.transition(b.task_id, "running")
    with TaskStateRepository(sd) as r:
        assert r.get_active("c").task_id == a.task_id
        r.transition(a.task_id, "cancelled")
        assert r.get_active("c").task_id == b.task_id


# ------------------------------------------------------------------ list_open / latest

def test_list_open_oldest_first_excludes_terminal(repo):
    ts = [repo.create(f"t{i}", "c") for i in range(6)]
    repo.transition(ts[1].task_id, "cancelled")
    repo.transition(ts[3].task_id, "running")
    repo.transition(ts[3].task_id, "completed")
    repo.transition(ts[4].task_id, "running")
    repo.create("elsewhere", "other")
    got = repo.list_open("c")
    assert [t.task_id for t in got] == [ts[0].task_id, ts[2].task_id, ts[4].task_id, ts[5].task_id]
    assert got[2].status == "running"
    assert all(isinstance(t, TaskStateRecord) for t in got)
    assert repo.list_open("nochan") == []


def test_list_open_oldest_first_after_amend(repo):
    # ASSUMPTION: "oldest first" in list_open is by creation; amending a task
    # makes it active but does not make it younger.
    a = repo.create("a", "c")
    b = repo.create("b", "c")
    repo.amend(a.task_id, "a2")
    assert [t.task_id for t in repo.list_open("c")] == [a.task_id, b.task_id]


def test_latest_any_status(repo):
    assert repo.latest("c") is None
    a = repo.create("a", "c")
    b = repo.create("b", "c")
    assert repo.latest("c").task_id == b.task_id
    repo.transition(b.task_id, "cancelled")
    latest = repo.latest("c")
    assert latest.task_id == b.task_id and latest.status == "cancelled"
    repo.amend(a.task_id, "a2")  # amend does not make a task more recently *created*
    assert repo.latest("c").task_id == b.task_id
    assert repo.latest("other") is None


# ------------------------------------------------------------------ durability / reopen

def test_reopen_keeps_everything(sd):
    with TaskStateRepository(sd) as r:
        a = r.create("a", "c", model="m1")
        b = r.create("b", "c", parent_task_id=a.task_id)
        r.transition(a.task_id, "running")
        a = r.amend(a.task_id, "a2")
        b = r.transition(b.task_id, "cancelled", outcome_ref="why")
        c = r.create("c", "c2")
        snapshot = {t.task_id: r.get(t.task_id) for t in (a, b, c)}
        open_c = r.list_open("c")
        latest_c = r.latest("c")
    with TaskStateRepository(sd) as r:
        for tid, rec in snapshot.items():
            assert r.get(tid) == rec
        assert r.list_open("c") == open_c
        assert r.latest("c") == latest_c
        assert r.get_active("c").task_id == a.task_id
        assert r.get_active("c2").task_id == c.task_id
        # still writable with the same rules
        with pytest.raises(IllegalTaskTransitionError):
            r.transition(b.task_id, "running")
        r.transition(a.task_id, "completed")
        assert r.get(a.task_id).status == "completed"


def test_durable_without_close_other_process_sees_it(sd):
    """A change is durable when the call returns: a reader process opened
    after the writer dies (without close) sees it."""
    code = (
        "import sys, os\n"
        "from rune_fast.conversation_state import TaskStateRepository\n"
        "r = TaskStateRepository(sys.argv[1])\n"
        "t = r.create('durable', 'c')\n"
        "r.transition(t.task_id, 'running')\n"
        "print(t.task_id, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(sd)], cwd=ROOT, env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    tid = out.stdout.strip()
    with TaskStateRepository(sd) as r:
        t = r.get(tid)
        assert t is not None and t.status == "running" and t.title == "durable"


def test_context_manager_closes(sd):
    with TaskStateRepository(sd) as r:
        r.create("x", "c")
    # the lock is released: a new writer opens
    r2 = TaskStateRepository(sd)
    r2.close()


def test_threads_create_concurrently(repo):
    out = []
    lock = threading.Lock()

    def work(k):
        for i in range(20):
            t = repo.create(f"{k}-{i}", f"ch{k % 2}")
            with lock:
                out.append(t.task_id)

    ths = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert len(set(out)) == 80
    assert len(repo.list_open("ch0")) + len(repo.list_open("ch1")) == 80


# ------------------------------------------------------------------ envelopes

def test_envelopes_created_amended_transition(repo, sd):
    ev = sd / "events.jsonl"
    t = repo.create("a", "c")
    assert canonical_hash(t.to_dict()) in hashes_of(ev, "task_state.created")
    a = repo.amend(t.task_id, "b")
    assert canonical_hash(a.to_dict()) in hashes_of(ev, "task_state.amended")
    r = repo.transition(t.task_id, "running")
    assert canonical_hash(r.to_dict()) in hashes_of(ev, "task_state.transition")
    assert len(envelopes_of(ev, "task_state.created")) == 1
    assert len(envelopes_of(ev, "task_state.amended")) == 1
    assert len(envelopes_of(ev, "task_state.transition")) == 1


def test_refused_transition_writes_no_envelope(repo, sd):
    ev = sd / "events.jsonl"
    t = repo.create("a", "c")
    before = ev.read_bytes()
    with pytest.raises(IllegalTaskTransitionError):
        repo.transition(t.task_id, "completed")
    assert ev.read_bytes() == before


# ------------------------------------------------------------------ locking

def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_second_writer_same_process_locked(sd):
    r = TaskStateRepository(sd)
    try:
        with pytest.raises(StateLockedError):
            TaskStateRepository(sd)
        # the first writer is untouched by the refused second one
        t = r.create("still works", "c")
        assert r.get(t.task_id) == t
    finally:
        r.close()
    TaskStateRepository(sd).close()


def test_second_writer_other_process_locked(sd):
    r = TaskStateRepository(sd)
    try:
        code = (
            "import sys\n"
            "from rune_fast.conversation_state import TaskStateRepository, StateLockedError\n"
            "try:\n"
            "    TaskStateRepository(sys.argv[1])\n"
            "except StateLockedError:\n"
            "    print('LOCKED')\n"
            "else:\n"
            "    print('OPENED')\n"
        )
        out = subprocess.run([sys.executable, "-c", code, str(sd)], cwd=ROOT, env=_env(), capture_output=True,
                             text=True, timeout=60)
        assert out.stdout.strip() == "LOCKED", out.stderr
    finally:
        r.close()


def test_lock_dies_with_process(sd):
    code = (
        "import sys, time\n"
        "from rune_fast.conversation_state import TaskStateRepository\n"
        "r = TaskStateRepository(sys.argv[1])\n"
        "r.create('x', 'c')\n"
        "print('READY', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(sd)], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "READY"
        with pytest.raises(StateLockedError):
            TaskStateRepository(sd)
    finally:
        p.kill()
        p.wait(timeout=30)
        p.stdout.close()
        p.stderr.close()
    with TaskStateRepository(sd) as r:
        assert r.latest("c").title == "x"


@pytest.mark.parametrize("bad", [None, 5, b"x", "bad\ud800"])
def test_create_bad_title_writes_nothing(repo, sd, bad):
    n = len(read_envelopes(sd / "events.jsonl"))
    with pytest.raises((TypeError, ValueError)):
        repo.create(bad, "c")
    assert len(read_envelopes(sd / "events.jsonl")) == n
    assert repo.latest("c") is None


def test_amend_bad_title_changes_nothing(repo, sd):
    t = repo.create("ok", "c")
    n = len(read_envelopes(sd / "events.jsonl"))
    with pytest.raises((TypeError, ValueError)):
        repo.amend(t.task_id, None)
    assert repo.get(t.task_id) == t
    assert len(read_envelopes(sd / "events.jsonl")) == n


def test_tasks_survive_sigkill(sd):
    import time as _time

    code = (
        "import sys\n"
        "from rune_fast.conversation_state import TaskStateRepository\n"
        "r = TaskStateRepository(sys.argv[1])\n"
        "i = 0\n"
        "while True:\n"
        "    t = r.create('t%d' % i, 'ch%d' % (i % 2))\n"
        "    r.transition(t.task_id, 'running')\n"
        "    sys.stdout.write(t.task_id + '\\n')\n"
        "    sys.stdout.flush()\n"
        "    i += 1\n"
    )
    acked = []
    for run in range(2):
        p = subprocess.Popen([sys.executable, "-c", code, str(sd)], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        first = p.stdout.readline()
        _time.sleep(0.1 + 0.1 * run)
        p.kill()
        rest, err = p.stdout.read(), p.stderr.read()  # not communicate(): it skips what readline() buffered
        p.stdout.close(), p.stderr.close()
        p.wait(timeout=30)
        acked += [x.decode() for x in (first + rest).split(b"\n")[:-1] if x]
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # a torn final envelope is reported with a warning
            r = TaskStateRepository(sd)
        try:
            for tid in acked:
                t = r.get(tid)
                assert t is not None and t.status == "running", (run, tid, t, len(acked), acked.index(tid),
                                                                 [str(w.message) for w in caught],
                                                                 err.decode()[-2000:])
            opened = r.list_open("ch0") + r.list_open("ch1")
            assert len(opened) == len({t.task_id for t in opened})
        finally:
            r.close()
    assert acked


def test_concurrent_transitions_exactly_one_wins(repo, sd):
    for _ in range(5):
        t = repo.create("race", "c")
        ok, refused, other = [], [], []
        barrier = threading.Barrier(8)

        def go():
            barrier.wait()
            try:
                ok.append(repo.transition(t.task_id, "running"))
            except IllegalTaskTransitionError:
                refused.append(1)
            except Exception as e:  # noqa: BLE001
                other.append(e)

        ths = [threading.Thread(target=go) for _ in range(8)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        assert not other, other
        assert len(ok) == 1 and len(refused) == 7
        assert repo.get(t.task_id).status == "running"
        assert hashes_of(sd / "events.jsonl", "task_state.transition").count(canonical_hash(ok[0].to_dict())) == 1
    n = len(envelopes_of(sd / "events.jsonl", "task_state.transition"))
    assert n == 5
