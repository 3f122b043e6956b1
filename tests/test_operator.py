"""The operator's send_task rules and the legacy operator.json migration.

The rules are checked against the real task ledger and a plain in-memory
conversation (the operator only appends and reads windows); the migration and
``ConversationOperator.open`` also against the real conversation repository.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from rune_fast.errors import IllegalTaskTransitionError
from rune_fast.operator import (
    ConversationOperator,
    LegacyFormatError,
    Operator,
    is_confirmation,
    legacy_message_ids,
    map_legacy_status,
    migrate_operator_tasks,
)
from rune_fast.records import ConversationMessageRecord
from rune_fast.tasks import TaskStateRepository

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "legacy", "operator.json")
CURRENT = "task_01J9Z3Q8M5K2W7XH0C4V6B1N8R"


def _load_fixture() -> dict:
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


class MemoryConversation:
    """The part of the conversation repository the operator uses, in memory."""

    def __init__(self) -> None:
        self.messages: list[ConversationMessageRecord] = []
        self.ids: set[str] = set()

    def append(self, msg: ConversationMessageRecord) -> bool:
        if msg.msg_id in self.ids:
            return False
        self.ids.add(msg.msg_id)
        self.messages.append(msg)
        return True

    def window(self, channel_id: str, n: int = 8) -> list[ConversationMessageRecord]:
        if n <= 0:
            return []
        return [m for m in self.messages if m.channel_id == channel_id][-n:]


@pytest.fixture
def tasks(tmp_path):
    with TaskStateRepository(tmp_path / "state") as repo:
        yield repo


@pytest.fixture
def op(tasks):
    return ConversationOperator(tasks, MemoryConversation(), model="m1")


# ---------------------------------------------------------------- confirmations


@pytest.mark.parametrize("text", ["yes", "Yes!", "  OK. ", "okay", "continue", "Go ahead", "sure", "proceed",
                                  "y", "yep", "do it", "DO IT!!", "go  ahead"])
def test_confirmations(text):
    assert is_confirmation(text)


@pytest.mark.parametrize("text", ["yes, but use sqlite", "okay so what about the logs", "no", "stop", "",
                                  "yesterday's deploy", "continue with the migration of table users"])
def test_not_confirmations(text):
    assert not is_confirmation(text)


# ---------------------------------------------------------------- send rules


def test_no_active_task_creates_with_lineage(op, tasks):
    first = op.send("ch", "summarise the deploy log")
    assert first.action == "created"
    assert first.task.parent_task_id == ""
    assert first.task.assigned_model == "m1"
    assert first.message.task_id == first.task_id and first.message.role == "user"
    op.complete(first.task_id, "done: three services")
    second = op.send("ch", "why did billing pause?")
    assert second.action == "created"
    assert second.task_id != first.task_id
    assert second.task.parent_task_id == first.task_id   # the previous (latest) task
    other = op.send("elsewhere", "hello")
    assert other.task.parent_task_id == ""               # lineage is per channel


def test_running_task_is_amended_with_the_follow_up(op, tasks):
    t = op.send("ch", "review PR 4217").task
    op.start(t.task_id)
    res = op.send("ch", "also check the migrations")
    assert res.action == "amended"
    assert res.task_id == t.task_id
    assert tasks.get(t.task_id).title == "also check the migrations"
    assert tasks.get(t.task_id).status == "running"
    assert [m.task_id for m in op.conversation_window("ch")] == [t.task_id, t.task_id]
    assert len(tasks.list_open("ch")) == 1


def test_confirmation_amends_and_keeps_the_title(op, tasks):
    t = op.send("ch", "rotate the TLS certificates").task
    assert t.status == "created"
    res = op.send("ch", "Go ahead!")
    assert res.action == "amended" and res.task_id == t.task_id
    assert tasks.get(t.task_id).title == "rotate the TLS certificates"
    assert res.message.content == "Go ahead!" and res.message.task_id == t.task_id


def test_confirmation_of_a_task_awaiting_approval_resumes_it(op, tasks):
    t = op.send("ch", "restart the workers").task
    op.start(t.task_id)
    tasks.transition(t.task_id, "awaiting_approval")
    res = op.send("ch", "yes")
    assert res.action == "amended" and res.task_id == t.task_id
    assert tasks.get(t.task_id).status == "running"


def test_waiting_task_and_a_new_request_supersedes(op, tasks):
    old = op.send("ch", "plan the postgres upgrade").task
    res = op.send("ch", "actually, estimate GPU costs first")
    assert res.action == "superseded"
    assert res.superseded.task_id == old.task_id
    assert tasks.get(old.task_id).status == "superseded"
    assert res.task_id != old.task_id
    assert res.task.parent_task_id == old.task_id
    assert tasks.get_active("ch").task_id == res.task_id
    # also from awaiting_approval
    op.start(res.task_id)
    tasks.transition(res.task_id, "awaiting_approval")
    again = op.send("ch", "no, do something else")
    assert again.action == "superseded" and tasks.get(res.task_id).status == "superseded"


def test_send_refuses_bad_input_and_writes_nothing(op, tasks):
    with pytest.raises(TypeError):
        op.send("ch", 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        op.send("", "hi")
    assert len(tasks) == 0 and op.conversation.messages == []


def test_send_task_and_operator_aliases(tasks):
    o = Operator(tasks, MemoryConversation())
    assert o.send_task("c", "x").action == "created"
    assert o.get_conversation_window("c", 1)[0].content == "x"


# ---------------------------------------------------------------- complete


def test_complete_from_created_passes_through_running(op, tasks):
    t = op.send("ch", "list the open PRs").task
    done = op.complete(t.task_id, "PRs 4211 and 4217")
    assert done.status == "completed"
    answer = op.conversation_window("ch")[-1]
    assert answer.role == "assistant" and answer.task_id == t.task_id and answer.content == "PRs 4211 and 4217"
    assert done.outcome_ref == answer.msg_id
    assert tasks.get_active("ch") is None


def test_complete_with_failure_and_tool_calls(op, tasks):
    t = op.send("ch", "open an incident").task
    op.start(t.task_id)
    call = {"id": "toolu_1", "name": "tickets", "arguments": {"title": "latency"}}
    done = op.complete(t.task_id, "the ticketing API returned 503", status="failed", tool_calls=[call])
    assert done.status == "failed"
    assert op.conversation_window("ch")[-1].tool_calls == (call,)


def test_complete_illegal_writes_nothing(op, tasks):
    t = op.send("ch", "x").task
    op.complete(t.task_id, "first answer")
    n = len(op.conversation.messages)
    with pytest.raises(IllegalTaskTransitionError):
        op.complete(t.task_id, "second answer")
    with pytest.raises(KeyError):
        op.complete("task_unknown", "nope")
    assert len(op.conversation.messages) == n


# ---------------------------------------------------------------- legacy statuses


@pytest.mark.parametrize("legacy,has_result,current,want,known", [
    ("done", True, False, "completed", True),
    ("In Progress", False, False, "running", True),
    ("in-progress", False, False, "running", True),
    ("pending", False, False, "created", True),
    ("canceled", False, False, "cancelled", True),
    ("error", True, False, "failed", True),
    ("waiting", False, False, "awaiting_approval", True),
    ("zombie", True, False, "completed", False),
    ("zombie", False, False, "cancelled", False),
    ("zombie", False, True, "awaiting_approval", False),
    (None, False, False, "cancelled", False),
])
def test_map_legacy_status(legacy, has_result, current, want, known):
    assert map_legacy_status(legacy, has_result=has_result, is_current=current) == (want, known)


# ---------------------------------------------------------------- migration


def test_migrate_fixture_exactly_once(tasks):
    conv = MemoryConversation()
    report = migrate_operator_tasks(FIXTURE, tasks, conv)
    assert report.tasks_seen == 9
    assert report.tasks_imported == 9
    assert report.messages_imported == 13          # 9 prompts + 4 results
    assert report.current_task == CURRENT and report.current_task_active
    assert report.unknown_statuses == {"task_01J9Z0G7H8J9KMNPQRSTVWXYZ0": "'zombie' -> cancelled"}
    legacy = _load_fixture()
    for entry in legacy["tasks"]:
        t = tasks.get(entry["id"])
        assert t is not None, entry["id"]
        assert t.channel_id == entry.get("channel", "ops")
    first = tasks.get("task_01J9Z0A1B2C3D4E5F6G7H8J9KM")
    assert (first.title, first.status, first.assigned_model) == ("Summarise yesterday's deploy log", "completed",
                                                                 "claude-sonnet")
    assert first.created_at == 1727000000.0 and first.updated_at == 1727000042.5
    prompt_id, result_id = legacy_message_ids(first.task_id)
    assert first.outcome_ref == result_id
    msgs = {m.msg_id: m for m in conv.messages}
    assert msgs[prompt_id].role == "user" and msgs[prompt_id].content == first.title
    assert msgs[result_id].role == "assistant" and msgs[result_id].content.startswith("Three services")
    second = tasks.get("task_01J9Z0B2C3D4E5F6G7H8J9KMNP")
    assert second.status == "completed" and second.parent_task_id == first.task_id
    assert second.created_at == pytest.approx(1727000100.0)  # 2024-09-22T10:15:00Z
    assert tasks.get("task_01J9Z0D4E5F6G7H8J9KMNPQRST").status == "failed"
    structured = msgs[legacy_message_ids("task_01J9Z0E5F6G7H8J9KMNPQRSTVW")[1]]
    assert json.loads(structured.content) == {"prs": [4211, 4217], "repo": "payments"}
    assert structured.channel_id == "code-review"
    # the current task is honoured although a task was created after it
    assert tasks.get_active("ops").task_id == CURRENT
    assert tasks.get(CURRENT).status == "running"

    again = migrate_operator_tasks(FIXTURE, tasks, conv)
    assert not again.imported_anything
    assert (again.tasks_imported, again.messages_imported) == (0, 0)
    assert (again.tasks_already_present, again.messages_already_present) == (9, 13)
    assert len(tasks) == 9 and len(conv.messages) == 13


def test_migrate_then_the_operator_continues_the_current_task(tasks):
    conv = MemoryConversation()
    migrate_operator_tasks(FIXTURE, tasks, conv)
    op = ConversationOperator(tasks, conv)
    res = op.send("ops", "also compare v40")
    assert res.action == "amended" and res.task_id == CURRENT


def test_migrate_refuses_a_bad_file_and_writes_nothing(tmp_path, tasks):
    data = _load_fixture()
    data["tasks"][3]["created_at"] = "last tuesday"
    bad = tmp_path / "operator.json"
    bad.write_text(json.dumps(data))
    conv = MemoryConversation()
    with pytest.raises(LegacyFormatError, match="task_01J9Z0D4E5F6G7H8J9KMNPQRST"):
        migrate_operator_tasks(bad, tasks, conv)
    assert len(tasks) == 0 and conv.messages == []
    for text in ("not json", "[]", '{"tasks": 5}', '{"tasks": [{"title": "no id"}]}',
                 '{"tasks": [{"id": "a"}, {"id": "a"}]}'):
        bad.write_text(text)
        with pytest.raises(LegacyFormatError):
            migrate_operator_tasks(bad, tasks, conv)
    assert len(tasks) == 0


def test_migrate_accepts_a_task_mapping_and_pointer_object(tmp_path, tasks):
    src = tmp_path / "operator.json"
    src.write_text(json.dumps({
        "current_task": {"id": "t2"},
        "tasks": {"t1": {"prompt": "a", "state": "finished", "output": "b", "created": 1700000000000},
                  "t2": {"title": "c", "status": "queued", "created_at": 1700000001}},
    }))
    conv = MemoryConversation()
    report = migrate_operator_tasks(src, tasks, conv, default_channel="main")
    assert report.tasks_imported == 2 and report.messages_imported == 3
    assert tasks.get("t1").created_at == 1700000000.0   # milliseconds read as such
    assert tasks.get_active("main").task_id == "t2"


# ---------------------------------------------------------------- with the real store


def test_open_migrates_once_with_the_real_repositories(tmp_path):
    pytest.importorskip("rune_fast.conversation_state")
    legacy = tmp_path / "operator.json"
    shutil.copy(FIXTURE, legacy)
    state = tmp_path / "state"
    with ConversationOperator.open(state, legacy_operator_json=legacy) as op:
        assert op.migration.tasks_imported == 9 and op.migration.messages_imported == 13
        prompt_id, result_id = legacy_message_ids("task_01J9Z0A1B2C3D4E5F6G7H8J9KM")
        assert op.conversation.get_message(result_id).record.content.startswith("Three services")
        res = op.send("ops", "ok")
        assert res.action == "amended" and res.task_id == CURRENT
        op.complete(CURRENT, "v42 introduced the regression")
        assert op.conversation.messages_for_task(CURRENT)[-1].content == "v42 introduced the regression"
    with ConversationOperator.open(state, legacy_operator_json=legacy) as op:
        assert not op.migration.imported_anything
        assert op.tasks.get(CURRENT).status == "completed"
        assert [m.role for m in op.conversation_window("ops", 3)][-2:] == ["user", "assistant"]
