"""Wiring the two repositories into an authority root.

``build_conversation_state(paths, **options)`` makes a fresh
:class:`AuthorityRoot` holding the task ledger and the conversation repository,
both journaling into one :class:`~rune_fast.events.EventStore`;
``compose_conversation_state(root, state_dir)`` adds them to a root the caller
already has.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from ._names import EVENTS_NAME
from .events import EventStore, ensure_private_dir
from .tasks import TaskStateRepository

__all__ = ["AUTHORITY_KINDS", "AuthorityRoot", "build_conversation_state", "compose_conversation_state"]

log = logging.getLogger("rune_fast.composition")

AUTHORITY_KINDS: tuple[str, ...] = ("events", "evidence", "task_state", "conversation_state")
"""The kinds of authority a root hands out: the shared event store, the
evidence folder, the task ledger and the conversation repository."""


class AuthorityRoot:
    """A registry of the authorities of one run, by kind.

    ``get(kind)`` returns the registered object or ``None``; ``root[kind]``
    raises ``KeyError`` naming the kind instead. ``register(kind, obj)`` (or
    ``root[kind] = obj``) adds or replaces one. ``events`` is the shared event
    store (``None`` if there is none). :meth:`close` closes every registered
    object that has a ``close()``, the repositories before the event store.
    """

    def __init__(self, events: EventStore | None = None) -> None:
        self._items: dict[str, Any] = {}
        if events is not None:
            self._items["events"] = events

    @property
    def events(self) -> EventStore | None:
        """The shared event store, or ``None``."""
        store = self._items.get("events")
        return store if isinstance(store, EventStore) else None

    event_store = events

    def get(self, kind: str, default: Any = None) -> Any:
        """The authority registered for ``kind``, or ``default``."""
        return self._items.get(kind, default)

    def register(self, kind: str, obj: Any) -> Any:
        """Register ``obj`` as the authority for ``kind`` (a non-empty str) and
        return it."""
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"authority kind must be a non-empty str, got {kind!r}")
        self._items[kind] = obj
        return obj

    def __getitem__(self, kind: str) -> Any:
        try:
            return self._items[kind]
        except KeyError:
            raise KeyError(f"no authority registered for kind {kind!r}") from None

    def __setitem__(self, kind: str, obj: Any) -> None:
        self.register(kind, obj)

    def __contains__(self, kind: object) -> bool:
        return kind in self._items

    def kinds(self) -> list[str]:
        """The registered kinds, in registration order."""
        return list(self._items)

    def close(self) -> None:
        """Close every registered authority with a ``close()`` (repositories
        first, the event store last). Idempotent if they are."""
        items = [(k, v) for k, v in self._items.items() if k != "events"]
        if "events" in self._items:
            items.append(("events", self._items["events"]))
        for _kind, obj in items:
            close = getattr(obj, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> "AuthorityRoot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AuthorityRoot({', '.join(self._items)})"


def _conversation_class() -> Any:
    """ConversationStateRepository, imported late (its module imports much of
    the package). ``None``, with a logged warning, only while that module does
    not exist yet in this build; any other import error propagates."""
    try:
        from .conversation_state import ConversationStateRepository
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.conversation_state":
            raise
        log.warning("rune_fast.conversation_state is not part of this build: "
                    "the root hands out task_state only")
        return None
    return ConversationStateRepository


def _register(root: Any, kind: str, obj: Any) -> None:
    register = getattr(root, "register", None)
    if callable(register):
        register(kind, obj)
    elif hasattr(root, "__setitem__"):
        root[kind] = obj
    else:
        raise TypeError(
            f"root {type(root).__name__} has neither register(kind, obj) nor item assignment "
            f"(needed to add {kind!r})")


def _root_event_store(root: Any) -> EventStore | str | os.PathLike[str] | None:
    """The root's event store (or its path), if it has one."""
    for attr in ("events", "event_store"):
        store = getattr(root, attr, None)
        if isinstance(store, (EventStore, str, os.PathLike)):
            return store
    get = getattr(root, "get", None)
    if callable(get):
        for kind in ("events", "event_store"):
            try:
                store = get(kind)
            except KeyError:  # a root whose get() raises for an unknown kind
                continue
            if isinstance(store, (EventStore, str, os.PathLike)):
                return store
    return None


#: The options a composed root's conversation store keeps as attributes.
_HELD_OPTIONS = ("compact_every", "hot_window", "durability", "read_only")


def _composed_for(root: Any, state_dir: str) -> bool:
    """Whether ``root`` already holds this module's two repositories, open,
    for ``state_dir``."""
    get = getattr(root, "get", None)
    if not callable(get):
        return False
    held = []
    for kind in ("task_state", "conversation_state"):
        try:
            held.append(get(kind))
        except KeyError:
            return False
    tasks, conversation = held
    conversation_cls = _conversation_class()
    return (isinstance(tasks, TaskStateRepository) and conversation_cls is not None
            and isinstance(conversation, conversation_cls)
            and not (tasks.closed or getattr(conversation, "_closed", False))
            and tasks.state_dir == conversation.state_dir == state_dir)


def build_conversation_state(paths: Mapping[str, str | os.PathLike[str]], **options: Any) -> AuthorityRoot:
    """Open both repositories for one run and return an :class:`AuthorityRoot`.

    ``paths``: ``"state"`` (required) the state directory; ``"events"`` the
    event store file (default ``state/events.jsonl``; it may lie outside the
    state directory); ``"evidence"`` a folder, created (0700) if given and
    registered as the ``"evidence"`` authority. ``options`` (``compact_every``,
    ``hot_window``, ``durability``, ...) go to ``ConversationStateRepository``.

    The root's ``get("task_state")`` and ``get("conversation_state")`` share
    the one :class:`EventStore` that is ``root.events``. If opening anything
    fails, whatever was opened is closed again before the error propagates.
    """
    if not isinstance(paths, Mapping):
        raise TypeError(f"build_conversation_state: paths must be a mapping, got {type(paths).__name__}")
    if "state" not in paths or paths["state"] is None:
        raise ValueError("build_conversation_state: paths['state'] (the state directory) is required")
    unknown = set(paths) - {"state", "events", "evidence"}
    if unknown:
        raise ValueError(f"build_conversation_state: unknown paths keys {sorted(unknown)}")
    state_dir = os.path.abspath(os.fspath(paths["state"]))
    events_path = paths.get("events")
    events_path = os.path.join(state_dir, EVENTS_NAME) if events_path is None else os.fspath(events_path)

    ensure_private_dir(state_dir)
    store = EventStore(events_path)
    root = AuthorityRoot(store)
    try:
        evidence = paths.get("evidence")
        if evidence is not None:
            evidence = os.path.abspath(os.fspath(evidence))
            ensure_private_dir(evidence)
            root.register("evidence", evidence)
        root.register("task_state", TaskStateRepository(state_dir, events=store))
        conversation_cls = _conversation_class()
        if conversation_cls is not None:
            root.register("conversation_state", conversation_cls(state_dir, events=store, **options))
    except BaseException:
        root.close()
        raise
    return root


def compose_conversation_state(root: Any, state_dir: str | os.PathLike[str], **options: Any) -> Any:
    """Add ``task_state`` and ``conversation_state`` for ``state_dir`` to an
    existing ``root`` (anything with ``get(kind)`` and ``register(kind, obj)``
    or item assignment) and return the root.

    Both journal into the root's event store if it has one (attribute
    ``events``/``event_store`` or ``root.get("events")``: an
    :class:`EventStore`, or a path opened once here), else into
    ``state_dir/events.jsonl``. An event store opened here is registered as the
    root's ``"events"`` authority when the root has none. ``options`` go to
    ``ConversationStateRepository``. A root that already holds both, open,
    for ``state_dir`` is returned as it is (ValueError if ``options`` ask for
    other settings than its conversation store has).
    """
    state_dir = os.path.abspath(os.fspath(state_dir))
    if _composed_for(root, state_dir):
        # composed already: a second call must not open second writers, nor
        # hand back a store other than the one it asks for
        held = root.get("conversation_state")
        for name, value in options.items():
            if name not in _HELD_OPTIONS:
                raise TypeError(f"compose_conversation_state: unexpected option {name!r}")
            if getattr(held, name) != value:
                raise ValueError(f"compose_conversation_state: the root already holds the conversation "
                                 f"store of {state_dir} with {name}={getattr(held, name)!r}, not {value!r}")
        return root
    found = _root_event_store(root)
    opened = None
    if isinstance(found, EventStore):
        store = found
    else:
        path = os.path.join(state_dir, EVENTS_NAME) if found is None else os.fspath(found)
        ensure_private_dir(state_dir)
        store = opened = EventStore(path)
    made: list[Any] = []
    try:
        tasks = TaskStateRepository(state_dir, events=store)
        made.append(tasks)
        conversation_cls = _conversation_class()
        conversation = None
        if conversation_cls is not None:
            conversation = conversation_cls(state_dir, events=store, **options)
            made.append(conversation)
        if opened is not None and found is None:
            _register(root, "events", opened)
        _register(root, "task_state", tasks)
        if conversation is not None:
            _register(root, "conversation_state", conversation)
    except BaseException:
        for obj in reversed(made):
            obj.close()
        if opened is not None:
            opened.close()
        raise
    return root
