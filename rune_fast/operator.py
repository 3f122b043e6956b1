"""Operator integration: the ``send_task`` rules of the source design, as a
class a frontend (chat TUI, agent operator) can adopt, and the one-time import
of a legacy ``operator.json``.

The rules (``ConversationOperator.send``), for a user message on a channel:

1. No active task (``tasks.get_active(channel)`` is ``None``): create one,
   titled with the message, with ``parent_task_id`` = the channel's latest task
   (any status) if there is one, so follow-ups keep their lineage.
2. An active task that is ``running``, or any message that is a confirmation
   (``yes``, ``ok``, ``continue``, ``go ahead``, ... -- the whole message,
   case-insensitive, trailing punctuation ignored): amend the active task --
   the same ``task_id`` continues. A follow-up on a running task becomes its
   new title (the latest instruction); a confirmation keeps the title (``"ok"``
   is not an instruction), and a confirmation of a task ``awaiting_approval``
   also moves it back to ``running`` (the user approved).
3. An active task that is not running (``created`` or ``awaiting_approval``)
   and a message that is not a confirmation: the seed amends only running tasks
   or confirmations, so this message is a new request. The waiting task is
   ``superseded`` (it never ran, or the user moved on instead of approving)
   and a new task is created with ``parent_task_id`` = the superseded task.

Every send appends the user message (with its ``task_id``) to the conversation
repository; :meth:`ConversationOperator.complete` appends the assistant answer
and moves the task to its final status.

The legacy ``operator.json`` format that :func:`migrate_operator_tasks`
accepts is documented in ``docs/FORMAT.md`` (Legacy formats).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import threading
from typing import Any, Iterable, Mapping

from .errors import IllegalTaskTransitionError, RuneError

__all__ = [
    "CONFIRMATION_PATTERNS",
    "ConversationOperator",
    "Operator",
    "SendResult",
    "LegacyFormatError",
    "MigrationReport",
    "is_confirmation",
    "map_legacy_status",
    "legacy_message_ids",
    "load_operator_json",
    "migrate_operator_tasks",
]

#: Whole messages (after :func:`normalize_message`) that confirm the active task.
CONFIRMATION_PATTERNS: frozenset[str] = frozenset({
    "y", "yes", "yeah", "yep", "yup", "ya", "sure", "ok", "okay", "k", "kk", "alright", "all right",
    "continue", "go", "go ahead", "go on", "proceed", "do it", "please do", "yes please",
    "sounds good", "lgtm", "looks good", "approved", "approve", "confirm", "confirmed",
    "ship it", "carry on", "keep going", "next", "right", "correct", "agreed", "fine",
    "ok go", "ok do it", "yes do it", "yes go ahead", "ok continue", "yes continue", "ok proceed",
    "yes proceed", "go for it", "👍",
})

_TRAILING = re.compile(r"[\s.!,;:…]+$")
_SPACES = re.compile(r"\s+")


def normalize_message(message: str) -> str:
    """Casefolded, whitespace collapsed, trailing punctuation removed."""
    return _TRAILING.sub("", _SPACES.sub(" ", message.strip().casefold()))


def is_confirmation(message: str) -> bool:
    """True if the whole ``message`` is a confirmation (``"Yes!"``, ``"go ahead"``,
    ``"OK."``); ``"yes, but use sqlite"`` is not."""
    if not isinstance(message, str):
        raise TypeError(f"message must be str, got {type(message).__name__}")
    return normalize_message(message) in CONFIRMATION_PATTERNS


@dataclasses.dataclass(frozen=True)
class SendResult:
    """What one :meth:`ConversationOperator.send` did.

    ``action``: ``"created"`` (new task), ``"amended"`` (the active task
    continues) or ``"superseded"`` (the waiting task was superseded and a new
    one created). ``task`` is the task the message belongs to (after the
    change), ``message`` the stored user message, ``superseded`` the task that
    was superseded (or ``None``).
    """

    action: str
    task: Any
    message: Any
    superseded: Any = None

    @property
    def task_id(self) -> str:
        return self.task.task_id


class ConversationOperator:
    """The send/complete cycle of an agent frontend over the two repositories.

    ``tasks`` is a :class:`~rune_fast.tasks.TaskStateRepository`,
    ``conversation`` a :class:`~rune_fast.conversation_state.ConversationStateRepository`
    (or anything with the same methods). ``model`` is recorded as the
    ``assigned_model`` of the tasks this operator creates. ``stamp=True``
    stamps each message with ``conversation.clock.now()`` (multi-device use).
    All methods are thread-safe; each write is durable when it returns (the
    repositories' promise).
    """

    def __init__(self, tasks: Any, conversation: Any, *, model: str | None = None,
                 stamp: bool = False) -> None:
        self.tasks = tasks
        self.conversation = conversation
        self.model = model
        self.stamp = stamp
        self._lock = threading.RLock()
        self._root: Any = None
        #: The :class:`MigrationReport` of :meth:`open`'s legacy import, if it ran.
        self.migration: MigrationReport | None = None

    # ------------------------------------------------------------ wiring

    @classmethod
    def open(cls, state_dir: str | os.PathLike[str], *, legacy_operator_json: str | os.PathLike[str] | None = None,
             model: str | None = None, stamp: bool = False, **options: Any) -> "ConversationOperator":
        """Open both repositories on ``state_dir`` (one shared event store, via
        :func:`rune_fast.composition.build_conversation_state`; ``options`` go to
        the conversation repository) and, if ``legacy_operator_json`` names an
        existing file, run :func:`migrate_operator_tasks` on it (idempotent).
        :meth:`close` closes what was opened. The migration report is kept in
        :attr:`migration`."""
        from .composition import build_conversation_state

        root = build_conversation_state({"state": state_dir}, **options)
        try:
            op = cls(root.get("task_state"), root.get("conversation_state"), model=model, stamp=stamp)
            op._root = root
            if legacy_operator_json is not None and os.path.exists(legacy_operator_json):
                op.migration = migrate_operator_tasks(legacy_operator_json, op.tasks, op.conversation)
        except BaseException:
            root.close()
            raise
        return op

    def close(self) -> None:
        """Close the repositories if :meth:`open` opened them (else a no-op:
        the caller owns them)."""
        if self._root is not None:
            self._root.close()
            self._root = None

    def __enter__(self) -> "ConversationOperator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ messages

    def _message(self, **fields: Any) -> Any:
        from .records import ConversationMessageRecord

        if self.stamp:
            fields["hlc"] = str(self.conversation.clock.now())
        return ConversationMessageRecord(**fields)

    # ------------------------------------------------------------ the rules

    def send(self, channel_id: str, message: str, *, model: str | None = None) -> SendResult:
        """Record a user ``message`` on ``channel_id`` under the task the rules
        (module docstring) pick, and return a :class:`SendResult`. The task
        change is made first, then the user message is appended with its
        ``task_id``. ``TypeError``/``ValueError`` for a non-str message or an
        empty channel (nothing is written then)."""
        if not isinstance(message, str):
            raise TypeError(f"message must be str, got {type(message).__name__}")
        if not isinstance(channel_id, str) or not channel_id:
            raise ValueError(f"channel_id must be a non-empty str, got {channel_id!r}")
        with self._lock:
            tasks = self.tasks
            active = tasks.get_active(channel_id)
            confirm = is_confirmation(message)
            superseded = None
            if active is None:
                previous = tasks.latest(channel_id)
                task = tasks.create(message, channel_id, model=model or self.model,
                                    parent_task_id=previous.task_id if previous is not None else None)
                action = "created"
            elif active.status == "running" or confirm:
                title = active.title if confirm else message
                task = tasks.amend(active.task_id, title)
                if confirm and task.status == "awaiting_approval":
                    task = tasks.transition(task.task_id, "running")
                action = "amended"
            else:
                superseded = tasks.transition(active.task_id, "superseded")
                task = tasks.create(message, channel_id, model=model or self.model,
                                    parent_task_id=active.task_id)
                action = "superseded"
            record = self._message(role="user", content=message, channel_id=channel_id,
                                   task_id=task.task_id)
            self.conversation.append(record)
            return SendResult(action, task, record, superseded)

    send_task = send

    def start(self, task_id: str) -> Any:
        """Mark a task ``running`` (the model started on it); a task already
        running is returned unchanged. ``IllegalTaskTransitionError`` from a
        terminal status, ``KeyError`` for an unknown id."""
        with self._lock:
            task = self._require(task_id)
            if task.status == "running":
                return task
            return self.tasks.transition(task_id, "running")

    def _require(self, task_id: str) -> Any:
        task = self.tasks.get(task_id)
        if task is None:
            from .errors import UnknownTaskError

            raise UnknownTaskError(f"unknown task_id {task_id!r}")
        return task

    def complete(self, task_id: str, content: str, status: str = "completed", *,
                 tool_calls: Iterable[Mapping[str, Any]] = (), outcome_ref: str | None = None) -> Any:
        """Append the assistant message ``content`` to the task's channel and
        move the task to ``status`` (``completed``, ``failed``, ``cancelled``,
        ``superseded`` or ``awaiting_approval``), passing through ``running``
        first when the task is still ``created`` and the status needs it.
        ``outcome_ref`` defaults to the assistant message's ``msg_id``. Returns
        the task record after the change. ``IllegalTaskTransitionError`` (and
        nothing written) if the task cannot reach ``status``; ``KeyError`` for
        an unknown id."""
        from .records import TASK_TRANSITIONS

        if not isinstance(content, str):
            raise TypeError(f"content must be str, got {type(content).__name__}")
        with self._lock:
            task = self._require(task_id)
            path = _transition_path(task.status, status, TASK_TRANSITIONS)
            if path is None:
                raise IllegalTaskTransitionError(
                    f"task {task_id}: cannot complete with status {status!r} from {task.status!r}")
            record = self._message(role="assistant", content=content, channel_id=task.channel_id,
                                   task_id=task_id, tool_calls=tuple(tool_calls))
            self.conversation.append(record)
            ref = record.msg_id if outcome_ref is None else outcome_ref
            for step in path:
                task = self.tasks.transition(task_id, step, ref if step == path[-1] else "")
            return task

    def conversation_window(self, channel_id: str, n: int = 8) -> list[Any]:
        """The last ``n`` messages of the channel, oldest first (all tiers)."""
        return self.conversation.window(channel_id, n)

    get_conversation_window = conversation_window

    def active_task(self, channel_id: str) -> Any:
        """The channel's active task, or ``None``."""
        return self.tasks.get_active(channel_id)


Operator = ConversationOperator


def _transition_path(current: str, target: str, transitions: Mapping[str, Any]) -> list[str] | None:
    """The shortest legal path of statuses from ``current`` to ``target``
    (excluding ``current``), or ``None``."""
    if target not in transitions:
        return None
    if target in transitions.get(current, ()):
        return [target]
    if "running" in transitions.get(current, ()) and target in transitions.get("running", ()):
        return ["running", target]
    return None


# ---------------------------------------------------------------- legacy import


class LegacyFormatError(RuneError, ValueError):
    """A legacy file that does not have the documented shape (``docs/FORMAT.md`` (Legacy formats));
    the message names the file and the entry."""


#: Legacy status (casefolded, ``-`` and spaces as ``_``) -> contract status.
LEGACY_STATUS_MAP: dict[str, str] = {
    **{s: s for s in ("created", "running", "awaiting_approval", "completed", "failed",
                      "cancelled", "superseded")},
    **dict.fromkeys(("new", "pending", "queued", "open", "todo", "draft", "submitted"), "created"),
    **dict.fromkeys(("in_progress", "active", "working", "started", "processing", "executing",
                     "busy", "dispatched"), "running"),
    **dict.fromkeys(("awaiting", "awaiting_confirmation", "needs_approval", "waiting",
                     "waiting_for_user", "blocked", "paused", "on_hold", "needs_input"),
                    "awaiting_approval"),
    **dict.fromkeys(("done", "complete", "success", "succeeded", "finished", "ok",
                     "resolved", "answered"), "completed"),
    **dict.fromkeys(("error", "errored", "failure", "crashed", "timeout", "timed_out"), "failed"),
    **dict.fromkeys(("canceled", "aborted", "stopped", "killed", "abandoned", "dropped",
                     "interrupted"), "cancelled"),
    **dict.fromkeys(("replaced", "obsolete", "stale", "amended"), "superseded"),
}


def map_legacy_status(status: Any, *, has_result: bool, is_current: bool) -> tuple[str, bool]:
    """``(contract status, known)`` for a legacy status string.

    Known spellings map by :data:`LEGACY_STATUS_MAP`. An unknown or missing
    status maps to ``completed`` when the task has a result, else to
    ``awaiting_approval`` for the current task (it stays the active task and
    waits for the user) and ``cancelled`` for any other task (it is not
    resumed behind the user's back); ``known`` is then False.
    """
    if isinstance(status, str):
        key = re.sub(r"[\s\-]+", "_", status.strip().casefold())
        if key in LEGACY_STATUS_MAP:
            return LEGACY_STATUS_MAP[key], True
    if has_result:
        return "completed", False
    return ("awaiting_approval" if is_current else "cancelled"), False


def legacy_message_ids(task_id: str) -> tuple[str, str]:
    """The deterministic ``msg_id``s of a migrated task's prompt and result
    messages (so a second import finds them and stores nothing)."""
    return f"msg_{task_id}.prompt", f"msg_{task_id}.result"


@dataclasses.dataclass
class MigrationReport:
    """What :func:`migrate_operator_tasks` did (``to_dict()`` for JSON)."""

    source: str
    tasks_seen: int = 0
    tasks_imported: int = 0
    tasks_already_present: int = 0
    messages_imported: int = 0
    messages_already_present: int = 0
    current_task: str | None = None
    current_task_active: bool = False
    statuses: dict[str, int] = dataclasses.field(default_factory=dict)
    unknown_statuses: dict[str, str] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def imported_anything(self) -> bool:
        return bool(self.tasks_imported or self.messages_imported)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _first(entry: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if name in entry and entry[name] is not None:
            return entry[name]
    return None


def _timestamp(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise LegacyFormatError(f"{where}: timestamp must be a number or ISO 8601 string, got {value!r}")
    if isinstance(value, (int, float)):
        v = float(value)
        return v / 1000.0 if v > 1e11 else v  # milliseconds
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        try:
            parsed = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise LegacyFormatError(f"{where}: timestamp {value!r} is not epoch seconds or ISO 8601") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=_dt.timezone.utc)
        return parsed.timestamp()
    raise LegacyFormatError(f"{where}: timestamp must be a number or ISO 8601 string, got {type(value).__name__}")


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, int, float, bool)):
        # A structured result (a tool's JSON) is kept as its JSON text.
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    raise LegacyFormatError(f"{where}: expected text, got {type(value).__name__}")


def load_operator_json(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """Read a legacy ``operator.json``: ``(task entries, current task id,
    default channel)``. :class:`LegacyFormatError` naming the file for
    anything that is not the documented shape."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise LegacyFormatError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise LegacyFormatError(f"{path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    return parse_operator_json(data, path)


def parse_operator_json(data: Any, source: str = "operator.json") -> tuple[list[dict[str, Any]], str | None, str | None]:
    """The parsed form of :func:`load_operator_json` for already-decoded JSON."""
    if not isinstance(data, dict) or "tasks" not in data:
        raise LegacyFormatError(f"{source}: a legacy operator.json is a JSON object with a \"tasks\" key")
    raw = data["tasks"]
    entries: list[dict[str, Any]] = []
    if isinstance(raw, dict):  # {"<task id>": {...}, ...}
        for key, entry in raw.items():
            if not isinstance(entry, dict):
                raise LegacyFormatError(f"{source}: tasks[{key!r}] is not an object")
            entry = dict(entry)
            entry.setdefault("id", key)
            entries.append(entry)
    elif isinstance(raw, list):
        for i, entry in enumerate(raw):
            if not isinstance(entry, dict):
                raise LegacyFormatError(f"{source}: tasks[{i}] is not an object")
            entries.append(dict(entry))
    else:
        raise LegacyFormatError(f"{source}: \"tasks\" must be a list or an object, got {type(raw).__name__}")
    current = _first(data, "current_task", "current_task_id", "active_task")
    if isinstance(current, dict):
        current = _first(current, "id", "task_id")
    if current is not None and not isinstance(current, str):
        raise LegacyFormatError(f"{source}: current_task must be a task id (str), an object with an id, or null")
    channel = _first(data, "channel", "channel_id")
    if channel is not None and (not isinstance(channel, str) or not channel):
        raise LegacyFormatError(f"{source}: channel must be a non-empty str")
    return entries, current or None, channel


def migrate_operator_tasks(operator_json_path: str | os.PathLike[str], tasks_repo: Any, conversation_repo: Any,
                           *, default_channel: str = "default", progress: Any = None) -> MigrationReport:
    """Import a legacy ``operator.json`` into the two repositories, exactly once.

    Every task keeps its original id (``tasks_repo.import_task``, journaled as
    ``task_state.imported``), title, mapped status (:func:`map_legacy_status`),
    channel (the task's, else the file's, else ``default_channel``), model,
    parent and timestamps; its prompt becomes a user message and its result (if
    any) an assistant message, both with ids from :func:`legacy_message_ids`,
    and the task's ``outcome_ref`` names the result message. Tasks are
    imported oldest first; the current task (``current_task``) is imported
    last on its channel so that, when open, it is the channel's active task.

    Idempotent: ids already present are skipped, so a second run imports
    nothing, and a run cut short by a crash is completed by the next one.
    ``progress``: an optional callable ``(done, total)``. Returns a
    :class:`MigrationReport`. :class:`LegacyFormatError` (nothing written)
    for a file that is not the documented shape.
    """
    from .records import ConversationMessageRecord, TaskStateRecord

    source = os.fspath(operator_json_path)
    entries, current, file_channel = load_operator_json(source)
    report = MigrationReport(source=source, tasks_seen=len(entries), current_task=current)

    # Validate and build every record first: a bad entry writes nothing.
    planned: list[tuple[Any, list[Any], float]] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{source}: tasks[{i}]"
        task_id = _first(entry, "id", "task_id")
        if not isinstance(task_id, str) or not task_id:
            raise LegacyFormatError(f"{where}: missing task id (\"id\" or \"task_id\", a non-empty str)")
        where = f"{source}: task {task_id}"
        if task_id in seen:
            raise LegacyFormatError(f"{where}: the id appears twice")
        seen.add(task_id)
        title = _text(_first(entry, "title", "prompt", "message", "text", "request", "description"), where)
        result = _text(_first(entry, "result", "output", "response", "answer"), where)
        channel = _first(entry, "channel", "channel_id") or file_channel or default_channel
        if not isinstance(channel, str):
            raise LegacyFormatError(f"{where}: channel must be a str")
        created = _timestamp(_first(entry, "created_at", "created", "timestamp", "ts"), where)
        updated = _timestamp(_first(entry, "updated_at", "updated", "completed_at", "finished_at"), where)
        if created is None:
            created = updated if updated is not None else 0.0
            report.warnings.append(f"task {task_id}: no created_at; used {created}")
        if updated is None or updated < created:
            updated = created
        raw_status = _first(entry, "status", "state")
        status, known = map_legacy_status(raw_status, has_result=bool(result), is_current=task_id == current)
        if not known:
            report.unknown_statuses[task_id] = f"{raw_status!r} -> {status}"
        report.statuses[status] = report.statuses.get(status, 0) + 1
        model = _first(entry, "model", "assigned_model") or ""
        parent = _first(entry, "parent_task_id", "parent", "parent_id") or ""
        prompt_id, result_id = legacy_message_ids(task_id)
        try:
            task = TaskStateRecord(task_id=task_id, title=title, status=status, channel_id=channel,
                                   parent_task_id=parent, assigned_model=model, created_at=created,
                                   updated_at=updated, outcome_ref=result_id if result else "")
            msgs = [ConversationMessageRecord(msg_id=prompt_id, ts=created, role="user", content=title,
                                              channel_id=channel, task_id=task_id)]
            if result:
                msgs.append(ConversationMessageRecord(msg_id=result_id, ts=updated, role="assistant",
                                                      content=result, channel_id=channel, task_id=task_id))
        except (TypeError, ValueError) as exc:
            raise LegacyFormatError(f"{where}: {exc}") from None
        planned.append((task, msgs, created))
    if current is not None and current not in seen:
        report.warnings.append(f"current_task {current!r} is not among the tasks; ignored")
        report.current_task = None
        current = None

    # Oldest first (stable for equal times), the current task last on its channel.
    order = sorted(range(len(planned)), key=lambda k: (planned[k][0].task_id == current, planned[k][2], k))
    total = len(order)
    for done, k in enumerate(order, 1):
        task, msgs, _ = planned[k]
        if tasks_repo.import_task(task):
            report.tasks_imported += 1
        else:
            report.tasks_already_present += 1
        for m in msgs:
            if conversation_repo.append(m):
                report.messages_imported += 1
            else:
                report.messages_already_present += 1
        if progress is not None:
            progress(done, total)
    if current is not None:
        planned_current = next(t for t, _, _ in planned if t.task_id == current)
        active = tasks_repo.get_active(planned_current.channel_id)
        report.current_task_active = active is not None and active.task_id == current
        if not report.current_task_active and not planned_current.is_terminal:
            report.warnings.append(
                f"current task {current} is open but not the active task of {planned_current.channel_id!r} "
                f"(a task was created or amended there after the first import)")
    return report
