"""Composition: the authority root wires both repositories to one event store.

ConversationStateRepository is written elsewhere; these tests inject a small
fake with its constructor signature so the wiring is checked on its own.
"""
from __future__ import annotations

import os
import stat
import sys
import types

import pytest

from rune_fast.composition import (
    AUTHORITY_KINDS,
    AuthorityRoot,
    build_conversation_state,
    compose_conversation_state,
)
from rune_fast.errors import StateLockedError
from rune_fast.events import EventStore
from rune_fast.locking import DirLock
from rune_fast.records import ConversationMessageRecord, payload_hash
from rune_fast.tasks import TaskStateRepository


class FakeConversationRepo:
    """Same constructor as ConversationStateRepository; journals appends."""

    instances: list["FakeConversationRepo"] = []

    def __init__(self, state_dir, *, events=None, compact_every=64, hot_window=512,
                 durability="fsync", read_only=False):
        self.state_dir = os.fspath(state_dir)
        self.events = events
        self.options = {"compact_every": compact_every, "hot_window": hot_window,
                        "durability": durability, "read_only": read_only}
        self.lock = DirLock(state_dir, "conversation")
        self.closed = False
        FakeConversationRepo.instances.append(self)

    def append(self, msg):
        self.events.append_durable("conversation.message", msg.msg_id, payload_hash(msg))
        return True

    def close(self):
        self.closed = True
        self.lock.release()


@pytest.fixture
def fake_conversation(monkeypatch):
    module = types.ModuleType("rune_fast.conversation_state")
    module.ConversationStateRepository = FakeConversationRepo
    monkeypatch.setitem(sys.modules, "rune_fast.conversation_state", module)
    import rune_fast
    monkeypatch.setattr(rune_fast, "conversation_state", module, raising=False)
    FakeConversationRepo.instances = []
    return FakeConversationRepo


def test_authority_kinds():
    assert "conversation_state" in AUTHORITY_KINDS
    assert "task_state" in AUTHORITY_KINDS


def test_build_shares_one_event_store_outside_state(tmp_path, fake_conversation):
    state = tmp_path / "run" / "state"
    events = tmp_path / "elsewhere" / "events.jsonl"
    evidence = tmp_path / "run" / "evidence"
    root = build_conversation_state({"events": events, "evidence": evidence, "state": state},
                                    compact_every=8, hot_window=16, durability="batch")
    with root:
        tasks = root.get("task_state")
        conv = root.get("conversation_state")
        assert isinstance(tasks, TaskStateRepository)
        assert isinstance(conv, FakeConversationRepo)
        assert root["task_state"] is tasks and root["conversation_state"] is conv
        assert isinstance(root.events, EventStore)
        assert tasks.events is root.events and conv.events is root.events
        assert root.events.path == str(events)
        assert conv.options == {"compact_every": 8, "hot_window": 16, "durability": "batch", "read_only": False}
        assert os.path.isdir(evidence)
        assert stat.S_IMODE(os.stat(evidence).st_mode) == 0o700
        assert root.get("evidence") == str(evidence)

        t = tasks.create("t", "c")
        m = ConversationMessageRecord(role="user", content="hi", channel_id="c", task_id=t.task_id)
        conv.append(m)
        envs = list(root.events.iter_envelopes())
        assert [(e["type"], e["id"]) for e in envs] == [("task_state.created", t.task_id),
                                                         ("conversation.message", m.msg_id)]
        assert not os.path.exists(state / "events.jsonl")
    assert tasks.closed and conv.closed and root.events.closed


def test_build_default_events_path(tmp_path, fake_conversation):
    with build_conversation_state({"state": tmp_path}) as root:
        assert root.events.path == str(tmp_path / "events.jsonl")
        root.get("task_state").create("t", "c")
    assert (tmp_path / "events.jsonl").exists()


def test_build_requires_state(tmp_path, fake_conversation):
    with pytest.raises(ValueError, match="state"):
        build_conversation_state({"events": tmp_path / "e.jsonl"})
    with pytest.raises(ValueError, match="bogus"):
        build_conversation_state({"state": tmp_path, "bogus": tmp_path})


def test_build_failure_closes_what_it_opened(tmp_path, fake_conversation):
    held = DirLock(tmp_path, "conversation")
    with pytest.raises(StateLockedError):
        build_conversation_state({"state": tmp_path})
    held.release()
    # the task lock was released: a fresh build works
    build_conversation_state({"state": tmp_path}).close()


def test_build_without_conversation_module_hands_out_tasks(tmp_path, monkeypatch, caplog):
    # None in sys.modules makes the import fail as a missing module would.
    monkeypatch.setitem(sys.modules, "rune_fast.conversation_state", None)
    with caplog.at_level("WARNING", logger="rune_fast.composition"):
        root = build_conversation_state({"state": tmp_path})
    with root:
        assert isinstance(root.get("task_state"), TaskStateRepository)
        assert root.get("conversation_state") is None
    assert any("conversation_state" in r.getMessage() for r in caplog.records)


def test_other_import_errors_propagate(tmp_path, monkeypatch):
    module = types.ModuleType("rune_fast.conversation_state")  # lacks the class
    monkeypatch.setitem(sys.modules, "rune_fast.conversation_state", module)
    with pytest.raises(ImportError):
        build_conversation_state({"state": tmp_path})
    TaskStateRepository(tmp_path).close()  # nothing left locked


class PlainRoot:
    """A foreign root with get/register and its own event store attribute."""

    def __init__(self, events=None):
        self.items = {}
        if events is not None:
            self.events = events

    def get(self, kind):
        return self.items.get(kind)

    def register(self, kind, obj):
        self.items[kind] = obj


class ItemRoot(dict):
    """A foreign root that only supports get() and item assignment."""


def test_compose_uses_root_event_store(tmp_path, fake_conversation):
    store = EventStore(tmp_path / "shared" / "events.jsonl")
    root = PlainRoot(events=store)
    assert compose_conversation_state(root, tmp_path / "state", hot_window=4) is root
    tasks, conv = root.items["task_state"], root.items["conversation_state"]
    assert tasks.events is store and conv.events is store
    assert conv.options["hot_window"] == 4
    tasks.create("t", "c")
    assert [e["type"] for e in store.iter_envelopes()] == ["task_state.created"]
    tasks.close()
    conv.close()
    assert not store.closed
    store.close()


def test_compose_uses_store_from_get(tmp_path, fake_conversation):
    root = ItemRoot()
    store = EventStore(tmp_path / "ev.jsonl")
    root["events"] = store
    compose_conversation_state(root, tmp_path / "state")
    assert root["task_state"].events is store and root["conversation_state"].events is store
    root["task_state"].close()
    root["conversation_state"].close()
    store.close()


def test_compose_defaults_to_state_events(tmp_path, fake_conversation):
    root = ItemRoot()
    compose_conversation_state(root, tmp_path)
    tasks, conv = root["task_state"], root["conversation_state"]
    assert tasks.events is conv.events
    assert tasks.events.path == str(tmp_path / "events.jsonl")
    assert root["events"] is tasks.events
    tasks.close()
    conv.close()
    root["events"].close()


def test_compose_onto_authority_root(tmp_path, fake_conversation):
    root = AuthorityRoot()
    root.register("other", object())
    with compose_conversation_state(root, tmp_path):
        assert isinstance(root.get("task_state"), TaskStateRepository)
        assert root.events is root.get("task_state").events
        assert set(root.kinds()) >= {"other", "task_state", "conversation_state", "events"}


def test_compose_refuses_root_without_registration(tmp_path, fake_conversation):
    class Bare:
        def get(self, kind):
            return None

    with pytest.raises(TypeError, match="register"):
        compose_conversation_state(Bare(), tmp_path)
    # everything opened was closed again
    TaskStateRepository(tmp_path).close()


def test_authority_root_basics():
    root = AuthorityRoot()
    assert root.get("task_state") is None
    with pytest.raises(KeyError, match="task_state"):
        root["task_state"]
    root["x"] = 1
    assert root.get("x") == 1 and "x" in root
    with pytest.raises(ValueError):
        root.register("", 1)
    assert root.events is None


def test_demo_runs(tmp_path, capsys):
    from rune_fast import demo
    argv = [str(tmp_path / "state"), "--history", "10", "--tasks", "2", "--no-bench"]
    assert demo.main(argv) == 0
    assert demo.main(argv) == 0  # and again on the same directory
    out = capsys.readouterr().out
    assert out.count("OK: no damage") == 2 and "its bytes are gone from every file" in out
