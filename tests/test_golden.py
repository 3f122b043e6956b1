"""Golden files: every later build must still read the committed formats
(frame, event envelope, task checkpoint and task log) unchanged."""
from __future__ import annotations

import os
import shutil

import xxhash

from rune_fast.events import EventStore, frame
from rune_fast.records import TaskStateRecord, payload_hash
from rune_fast.tasks import TaskStateRepository

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def test_frame_golden_bytes():
    # xxh3_64, seed 0: the compiled core's _log.frame must produce these bytes too.
    assert frame(b',"a":1}') == b'{"x":"567f1390f3eabd0b","a":1}\n'
    line = frame(b',"type":"conversation.message","id":"msg_1"}')
    assert line[:6] == b'{"x":"' and line[22:24] == b'",' and line.endswith(b"}\n")
    assert line[6:22] == xxhash.xxh3_64_hexdigest(line[23:-1]).encode()


def test_task_state_v1_fixture(tmp_path):
    state = tmp_path / "state"
    shutil.copytree(os.path.join(FIXTURES, "task_state_v1"), state)
    expected = [
        TaskStateRecord(task_id=f"task_golden_{i}", title=f"golden {i} ☃", channel_id="chan" if i < 3 else "other",
                        created_at=1700000000.0 + i, updated_at=1700000000.5 + i,
                        status=["created", "running", "completed", "awaiting_approval"][i],
                        outcome_ref="o" if i == 2 else "")
        for i in range(4)
    ]
    with TaskStateRepository(state) as repo:
        assert repo.list_tasks() == expected
        assert repo.get_active("chan") == expected[1]
        assert repo.list_open("chan") == expected[:2]
        assert repo.latest("other") == expected[3]
        assert repo.stats()["since_checkpoint"] == 1   # one change read from the log
        envs = list(repo.events.iter_envelopes())
    assert [(e["type"], e["id"], e["payload_hash"]) for e in envs] == [
        ("task_state.imported", r.task_id, payload_hash(r)) for r in expected]
    with EventStore(state / "events.jsonl") as store:
        assert store.verify() == []


def test_public_names_are_pinned():
    # The public surface changes only on purpose: update this list with it.
    import rune_fast.atomic
    import rune_fast.composition
    import rune_fast.events
    import rune_fast.locking
    import rune_fast.records
    import rune_fast.tasks
    assert sorted(rune_fast.records.__all__) == sorted([
        "new_id", "OrchestrationRecord", "TaskStateRecord", "ConversationMessageRecord",
        "TASK_STATUSES", "TERMINAL_STATUSES", "OPEN_STATUSES", "ROLES", "TASK_TRANSITIONS",
        "canonical_json", "record_canonical_json", "payload_hash"])
    assert sorted(rune_fast.events.__all__) == sorted([
        "EVENT_TYPES", "MAX_LINE", "RecoveryWarning", "frame", "frame_object", "check_line",
        "parse_line", "FramedLog", "EventStore"])
    assert rune_fast.atomic.__all__ == ["AtomicStore"]
    assert sorted(rune_fast.locking.__all__) == ["DirLock", "LOCK_KINDS_RE"]
    assert rune_fast.tasks.__all__ == ["TaskStateRepository"]
    assert sorted(rune_fast.composition.__all__) == sorted([
        "AUTHORITY_KINDS", "AuthorityRoot", "build_conversation_state", "compose_conversation_state"])
    for module in (rune_fast.records, rune_fast.events, rune_fast.atomic, rune_fast.locking,
                   rune_fast.tasks, rune_fast.composition):
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)


def test_the_package_re_exports_every_public_name_of_its_api_modules():
    """SPEC section 6: ``rune_fast`` re-exports the public names; a frontend
    switching imports finds the records beside the repositories too."""
    import rune_fast
    import rune_fast.composition
    import rune_fast.conversation_state
    import rune_fast.records
    import rune_fast.sync
    for module in (rune_fast.records, rune_fast.conversation_state, rune_fast.composition, rune_fast.sync):
        missing = set(module.__all__) - set(rune_fast.__all__)
        assert not missing, (module.__name__, sorted(missing))
    for name in rune_fast.__all__:
        assert hasattr(rune_fast, name), name
    assert rune_fast.canonical_json is rune_fast.records.canonical_json
    from rune_fast.conversation_state import ConversationMessageRecord, TaskStateRecord
    assert TaskStateRecord is rune_fast.TaskStateRecord
    assert ConversationMessageRecord is rune_fast.ConversationMessageRecord
