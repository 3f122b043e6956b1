"""What every subcommand shares: the state directory and the stores opened
on it, the error for bad input, and the read-only view of a task ledger held
by a running frontend."""
from __future__ import annotations

import argparse
import os
from typing import Any

from .._names import HOT_DIR, TASK_STATE_NAME, task_log_name
from ..errors import CorruptStateCheckpointError, RuneError

DEFAULT_STATE = "./rune-state"


class InputError(RuneError, ValueError):
    """Bad input given to the command (a line of JSON, a file of the wrong kind)."""



def state_dir(args: argparse.Namespace) -> str:
    return os.path.abspath(args.state)


def require_state(args: argparse.Namespace) -> str:
    state = state_dir(args)
    if not os.path.isdir(state):
        raise RuneError(f"no state directory at {state} (give one with --state DIR)")
    return state


def open_reader(args: argparse.Namespace) -> Any:
    """The conversation store, read-only (no lock taken, no file changed)."""
    from ..conversation_state import ConversationStateRepository

    return ConversationStateRepository(require_state(args), read_only=True)


def open_writer(args: argparse.Namespace, **options: Any) -> Any:
    from ..conversation_state import ConversationStateRepository

    return ConversationStateRepository(state_dir(args), **options)


def open_tasks(args: argparse.Namespace) -> Any:
    from ..tasks import TaskStateRepository

    return TaskStateRepository(require_state(args))


class TaskLedgerView:
    """A read-only snapshot of a state directory's task ledger, folded from
    its documented files (``hot/task_state.json`` and the ``task_log`` it
    names; see the task ledger section of the format page) without taking
    the writer's lock or changing a file. Used when a frontend holds the
    ledger open. Same reads as the repository: ``get``, ``get_active``,
    ``list_open``, ``list_tasks``, ``latest``, ``stats``."""

    def __init__(self, state_dir: str) -> None:
        from ..atomic import AtomicStore
        from ..framed_log import FramedLog, parse_checked
        from ..records import TERMINAL_STATUSES, TaskStateRecord

        self._terminal = TERMINAL_STATUSES
        hot = os.path.join(state_dir, HOT_DIR)
        for attempt in range(5):
            tasks: dict[str, Any] = {}
            touched: dict[str, int] = {}
            cp = AtomicStore(os.path.join(hot, TASK_STATE_NAME)).read()
            gen = 0
            if cp is not None:
                try:
                    gen = int(cp["gen"])
                    for item in cp["tasks"]:
                        rec = TaskStateRecord.from_dict(item["r"])
                        tasks[rec.task_id] = rec
                        touched[rec.task_id] = int(item["t"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise CorruptStateCheckpointError(f"task checkpoint has a bad structure: {exc!r}",
                                                      path=os.path.join(hot, TASK_STATE_NAME)) from None
            path = os.path.join(hot, task_log_name(gen))
            try:
                log = FramedLog(path, read_only=True)
            except FileNotFoundError:
                if cp is None:
                    break          # no ledger yet
                continue           # the writer checkpointed meanwhile: read again
            try:
                for offset, line in log.iter_lines(0):
                    entry = parse_checked(line, path=path, offset=offset)     # (iter_lines checked it)
                    try:
                        rec = TaskStateRecord.from_dict(entry["r"])
                        op, n = entry["op"], int(entry["n"])
                    except (KeyError, TypeError, ValueError) as exc:
                        raise CorruptStateCheckpointError(f"task log entry does not parse: {exc!r}",
                                                          path=path, offset=offset) from None
                    tasks[rec.task_id] = rec
                    if op in ("created", "imported", "amended"):
                        touched[rec.task_id] = n
            finally:
                log.close()
            break
        self._tasks, self._touched = tasks, touched

    def get(self, task_id: str) -> Any:
        return self._tasks.get(task_id)

    def list_tasks(self, channel_id: str | None = None) -> list[Any]:
        return [t for t in self._tasks.values() if channel_id is None or t.channel_id == channel_id]

    def list_open(self, channel_id: str) -> list[Any]:
        return [t for t in self.list_tasks(channel_id) if t.status not in self._terminal]

    def get_active(self, channel_id: str) -> Any:
        open_ = self.list_open(channel_id)
        return max(open_, key=lambda t: self._touched.get(t.task_id, -1)) if open_ else None

    def latest(self, channel_id: str) -> Any:
        mine = self.list_tasks(channel_id)
        return mine[-1] if mine else None

    def stats(self) -> dict[str, Any]:
        return {"tasks": len(self._tasks),
                "open": sum(1 for t in self._tasks.values() if t.status not in self._terminal),
                "note": "read-only view: the ledger is open in a writer"}

    def close(self) -> None:
        pass

    def __enter__(self) -> "TaskLedgerView":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def tasks_for_reading(args: argparse.Namespace) -> Any:
    """The task ledger for a read: the repository, or -- when a frontend
    holds its lock -- a :class:`TaskLedgerView` of its files."""
    from ..errors import StateLockedError

    try:
        return open_tasks(args)
    except StateLockedError:
        return TaskLedgerView(require_state(args))
