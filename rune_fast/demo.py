"""The main job for now: drive the task ledger end to end and say what happened.

``python -m rune_fast.demo [state_dir]`` (default ``./rune-state``) opens the
state directory through :func:`rune_fast.composition.build_conversation_state`,
runs one task through its life, shows a refused transition, closes, reopens to
show that everything persisted, and checks the event journal.
"""
from __future__ import annotations

import os
import sys
import time

from .composition import build_conversation_state
from .errors import IllegalTaskTransitionError
from .events import EventStore
from .tasks import TaskStateRepository


def _say(step: str, detail: str = "") -> None:
    print(f"  {step:<34} {detail}")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the process exit code (0 on success)."""
    args = sys.argv[1:] if argv is None else argv
    state_dir = os.path.abspath(args[0] if args else "rune-state")
    channel = "demo-channel"
    print(f"rune_fast demo: state directory {state_dir}")

    root = build_conversation_state({
        "state": state_dir,
        "events": os.path.join(state_dir, "events.jsonl"),
        "evidence": os.path.join(state_dir, "evidence"),
    })
    with root:
        tasks: TaskStateRepository = root.get("task_state")
        print(f"opened: {len(tasks)} task(s) already in the ledger; authorities: {', '.join(root.kinds())}")
        t0 = time.perf_counter()
        task = tasks.create("summarise the incident report", channel, model="demo-model")
        _say("create", f"{task.task_id} status={task.status}")
        task = tasks.transition(task.task_id, "running")
        _say("transition -> running", task.status)
        task = tasks.amend(task.task_id, "summarise the incident report, with a timeline")
        _say("amend (same task_id)", f"title={task.title!r}")
        task = tasks.transition(task.task_id, "awaiting_approval")
        _say("transition -> awaiting_approval", task.status)
        follow = tasks.create("draft the follow-up email", channel, parent_task_id=task.task_id)
        _say("create follow-up", f"{follow.task_id} parent={follow.parent_task_id}")
        _say("get_active", tasks.get_active(channel).task_id)
        task = tasks.transition(task.task_id, "completed", outcome_ref="evidence/summary.md")
        _say("transition -> completed", f"outcome_ref={task.outcome_ref}")
        try:
            tasks.transition(task.task_id, "running")
        except IllegalTaskTransitionError as exc:
            _say("transition completed -> running", f"refused: {exc}")
        else:
            raise AssertionError("a terminal task was moved")
        tasks.transition(follow.task_id, "cancelled")
        _say("cancel follow-up", f"active now: {tasks.get_active(channel)}")
        elapsed = time.perf_counter() - t0
        print(f"7 durable changes in {elapsed * 1000:.1f} ms ({elapsed / 7 * 1000:.2f} ms each, fsync'd)")

    with TaskStateRepository(state_dir) as reopened:
        again = reopened.get(task.task_id)
        assert again == task, (again, task)
        print(f"reopened: {len(reopened)} task(s); {task.task_id} is {again.status}; "
              f"open on {channel}: {len(reopened.list_open(channel))}")
    with EventStore(os.path.join(state_dir, "events.jsonl")) as events:
        problems = events.verify()
        count = sum(1 for _ in events.iter_envelopes())
    print(f"event journal: {count} envelope(s), {len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
