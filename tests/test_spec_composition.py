"""SPEC section 6: composition and module names (black-box)."""
from __future__ import annotations

import pytest

import rune_fast
from rune_fast import composition, conversation_state, records, sync
from rune_fast.composition import AUTHORITY_KINDS, build_conversation_state, compose_conversation_state
from rune_fast.conversation_state import ConversationStateRepository, TaskStateRepository

from spec_helpers import canonical_hash, hashes_of, msg, read_envelopes


def _close(root_get):
    for kind in ("conversation_state", "task_state"):
        obj = root_get(kind)
        if obj is not None:
            obj.close()


def test_authority_kinds():
    assert "conversation_state" in AUTHORITY_KINDS
    assert "task_state" in AUTHORITY_KINDS


def test_build_with_events_outside_state(tmp_path):
    events = tmp_path / "run" / "events.jsonl"
    events.parent.mkdir()
    state = tmp_path / "state"
    root = build_conversation_state({"events": events, "evidence": tmp_path / "evidence", "state": state})
    try:
        tasks = root.get("task_state")
        conv = root.get("conversation_state")
        assert isinstance(tasks, TaskStateRepository)
        assert isinstance(conv, ConversationStateRepository)
        t = tasks.create("title", "ch")
        m = msg("hello", "ch", task_id=t.task_id)
        assert conv.append(m) is True
        assert conv.get_message(m.msg_id).record == m
        assert tasks.get(t.task_id) == t
    finally:
        _close(root.get)
    assert canonical_hash(t.to_dict()) in hashes_of(events, "task_state.created")
    assert canonical_hash(m.to_dict()) in hashes_of(events, "conversation.message")
    # ASSUMPTION: the one shared event store is the "events" path; nothing is
    # journaled a second time under state/events.jsonl.
    assert read_envelopes(state / "events.jsonl") == []


def test_build_passes_options(tmp_path):
    root = build_conversation_state({"events": tmp_path / "events.jsonl", "evidence": tmp_path / "ev",
                                     "state": tmp_path / "state"}, compact_every=2, hot_window=1,
                                    durability="batch")
    try:
        conv = root.get("conversation_state")
        a, b = msg("a"), msg("b")
        conv.append(a)
        conv.append(b)  # compact_every=2: compaction runs; hot_window=1: a cools
        assert conv.get_message(a.msg_id).tier == "cool"
        assert conv.get_message(b.msg_id).tier == "hot"
    finally:
        _close(root.get)


def test_build_bad_option_rejected(tmp_path):
    with pytest.raises(ValueError):
        build_conversation_state({"events": tmp_path / "events.jsonl", "evidence": tmp_path / "ev",
                                  "state": tmp_path / "state"}, durability="sometimes")


def test_build_reopen(tmp_path):
    paths = {"events": tmp_path / "e" / "events.jsonl", "evidence": tmp_path / "ev", "state": tmp_path / "s"}
    (tmp_path / "e").mkdir()
    root = build_conversation_state(paths)
    t = root.get("task_state").create("x", "ch")
    m = msg("persisted", "ch")
    root.get("conversation_state").append(m)
    _close(root.get)
    root = build_conversation_state(paths)
    try:
        assert root.get("task_state").get(t.task_id) == t
        assert root.get("conversation_state").get_message(m.msg_id).record == m
    finally:
        _close(root.get)


class PlainRoot:
    def __init__(self):
        self.items = {}

    def get(self, kind):
        return self.items.get(kind)

    def register(self, kind, obj):
        self.items[kind] = obj


def test_compose_onto_plain_root(tmp_path):
    root = PlainRoot()
    sd = tmp_path / "state"
    out = compose_conversation_state(root, sd)
    try:
        assert out is root
        assert isinstance(root.get("task_state"), TaskStateRepository)
        assert isinstance(root.get("conversation_state"), ConversationStateRepository)
        t = root.get("task_state").create("x", "ch")
        m = msg("y", "ch")
        root.get("conversation_state").append(m)
    finally:
        _close(root.get)
    assert canonical_hash(t.to_dict()) in hashes_of(sd / "events.jsonl", "task_state.created")
    assert canonical_hash(m.to_dict()) in hashes_of(sd / "events.jsonl", "conversation.message")


def test_compose_onto_dict_root(tmp_path):
    root = {}
    out = compose_conversation_state(root, tmp_path / "state")
    try:
        assert out is root
        assert isinstance(root["task_state"], TaskStateRepository)
        assert isinstance(root["conversation_state"], ConversationStateRepository)
        assert root.get("conversation_state").append(msg("z")) is True
    finally:
        _close(root.get)


def test_composing_twice_for_one_state_dir_keeps_the_root_as_it_is(tmp_path):
    """A second compose_conversation_state of the same state directory (a
    frontend's setup run twice) returns the root with the repositories it
    holds: it opened second writers, which got StateLockedError."""
    root = {}
    compose_conversation_state(root, tmp_path / "state")
    try:
        held = (root["task_state"], root["conversation_state"])
        assert compose_conversation_state(root, tmp_path / "state") is root
        assert compose_conversation_state(root, tmp_path / "state", durability="fsync", hot_window=512) is root
        assert (root["task_state"], root["conversation_state"]) == held
        assert root["conversation_state"].append(msg("again")) is True
        with pytest.raises(ValueError, match="durability='fsync', not 'none'"):
            compose_conversation_state(root, tmp_path / "state", durability="none")
        with pytest.raises(TypeError, match="bogus"):
            compose_conversation_state(root, tmp_path / "state", bogus=1)
        assert (root["task_state"], root["conversation_state"]) == held
    finally:
        _close(root.get)


@pytest.mark.parametrize("order", ["as registered", "reversed"])
def test_closing_everything_a_composed_root_holds_in_any_order(tmp_path, order):
    """A caller that closes every object of its root (the shared event store
    registered with the repositories) may do so in any order: the store syncs
    at its close, and a repository closed after it has nothing left to sync."""
    root = {}
    sd = tmp_path / "state"
    compose_conversation_state(root, sd)
    t = root["task_state"].create("x", "ch")
    m = msg("y", "ch")
    assert root["conversation_state"].append(m) is True
    objs = list(root.values())
    for obj in objs if order == "as registered" else objs[::-1]:
        close = getattr(obj, "close", None)
        if close is not None:
            close()
    assert canonical_hash(t.to_dict()) in hashes_of(sd / "events.jsonl", "task_state.created")
    assert canonical_hash(m.to_dict()) in hashes_of(sd / "events.jsonl", "conversation.message")
    again = {}
    compose_conversation_state(again, sd)
    try:
        assert again["task_state"].get(t.task_id) == t
        assert again["conversation_state"].get_message(m.msg_id).record == m
    finally:
        _close(again.get)


def test_compose_keeps_existing_entries(tmp_path):
    root = PlainRoot()
    root.register("other", 123)
    compose_conversation_state(root, tmp_path / "state")
    try:
        assert root.get("other") == 123
    finally:
        _close(root.get)


NAMES = {
    records: ["new_id", "OrchestrationRecord", "TaskStateRecord", "ConversationMessageRecord", "TASK_TRANSITIONS"],
    conversation_state: ["TaskStateRepository", "ConversationStateRepository", "ReadStatus", "MessageRead",
                         "SearchHit", "RuneError", "CorruptStateCheckpointError", "IllegalTaskTransitionError",
                         "StateLockedError"],
    composition: ["AUTHORITY_KINDS", "build_conversation_state", "compose_conversation_state"],
    sync: ["Hlc", "HlcClock", "OpRecord", "fold", "Turn", "repair", "to_anthropic", "to_openai", "LastN",
           "DEFAULT_CONVERSATION"],
}


@pytest.mark.parametrize("mod", list(NAMES), ids=lambda m: m.__name__)
def test_top_level_reexports(mod):
    for name in NAMES[mod]:
        assert hasattr(mod, name), f"{mod.__name__}.{name}"
        assert getattr(rune_fast, name) is getattr(mod, name), name


def test_error_tree():
    from rune_fast.conversation_state import (
        CorruptStateCheckpointError,
        IllegalTaskTransitionError,
        RuneError,
        StateLockedError,
    )
    for e in (CorruptStateCheckpointError, IllegalTaskTransitionError, StateLockedError):
        assert issubclass(e, RuneError)
    assert issubclass(RuneError, Exception)
