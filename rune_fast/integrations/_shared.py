"""What the framework integrations share: one repository per state directory
per process, session ids as channels, and items as canonical JSON.

A framework makes many history objects (LangChain's ``RunnableWithMessageHistory``
one per call), often for the same state directory, while a store admits one
writer: so every integration object takes a reference to one shared
:class:`~rune_fast.conversation_state.ConversationStateRepository` per
directory (:class:`StoreRef`), and the last reference to go closes it. The
one-writer lock still holds between processes (a second process gets
``StateLockedError``).
"""
from __future__ import annotations

import collections
import json
import os
import threading
import weakref
from typing import Any

from ..atomic import check_path
from ..conversation_state import ConversationStateRepository
from ..errors import CorruptStateCheckpointError, StoreClosedError
from ..records import ConversationMessageRecord

__all__ = ["StoreRef", "channel_for", "decode_item", "encode_item"]

# ----------------------------------------------------------------- the registry
#
# Process-wide by design: the point is that every object of one process shares
# one writer per directory. Guarded by _GUARD; a reference dropped by the
# garbage collector while the guard is held (by this thread or another) is
# queued in _PENDING and released by the next acquire or release.


class _Entry:
    __slots__ = ("key", "repo", "refs", "inherited")

    def __init__(self, key: str, repo: ConversationStateRepository) -> None:
        self.key = key
        self.repo = repo
        self.refs = 1
        self.inherited = False      # True in a forked child: the parent's, never closed here


_GUARD = threading.Lock()
_OPEN: dict[str, _Entry] = {}
_PENDING: collections.deque[_Entry] = collections.deque()


def _release_locked(entry: _Entry) -> None:
    entry.refs -= 1
    if entry.refs > 0 or entry.inherited:
        return
    if _OPEN.get(entry.key) is entry:
        del _OPEN[entry.key]
    entry.repo.close()


def _drain_locked() -> None:
    while _PENDING:
        _release_locked(_PENDING.popleft())


def _collected(entry: _Entry) -> None:
    """A reference's owner was collected without ``close()``: release it now
    if the guard is free, else queue it (never wait: the collector may run
    in a thread that holds the guard)."""
    if _GUARD.acquire(blocking=False):
        try:
            _release_locked(entry)
            _drain_locked()
        finally:
            _GUARD.release()
    else:
        _PENDING.append(entry)


def _forget_after_fork() -> None:
    # A forked child does not own its parent's writers (as locking.DirLock):
    # its sessions open stores of their own, and releasing an inherited
    # reference never closes (writes to) the parent's store.
    global _GUARD
    _GUARD = threading.Lock()
    for entry in list(_OPEN.values()) + list(_PENDING):
        entry.inherited = True
    _OPEN.clear()
    _PENDING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _acquire(state_dir: str | os.PathLike[str], options: dict[str, Any]) -> _Entry:
    check_path("state_dir", state_dir)      # ("" would be the current folder)
    key = os.path.realpath(os.path.abspath(os.fspath(state_dir)))
    with _GUARD:
        _drain_locked()
        entry = _OPEN.get(key)
        if entry is not None and not getattr(entry.repo, "_closed", False):
            for name, value in options.items():
                held = getattr(entry.repo, name)
                if held != value:
                    raise ValueError(
                        f"{name}: this process holds the store {key} open with {name}={held!r}, "
                        f"not {value!r} (every session of one directory shares one store)")
            entry.refs += 1
            return entry
        # (a store closed by its user behind the registry's back is replaced:
        # the references to it keep their entry and only release that one)
        entry = _Entry(key, ConversationStateRepository(key, **options))
        _OPEN[key] = entry
        return entry


class StoreRef:
    """One reference to the repository an integration object writes to.

    With ``state_dir``: the process's shared repository for that directory
    (opened with ``durability`` and the other options on first use; a later
    reference asking other options raises ``ValueError``), released by
    :meth:`close` or when this object is collected; the last release closes
    the repository. With ``repository``: the caller's own, never closed here.
    """

    __slots__ = ("repo", "_entry", "_finalizer", "__weakref__")

    def __init__(self, owner: str, state_dir: str | os.PathLike[str] | None,
                 repository: ConversationStateRepository | None, *, durability: str = "fsync",
                 compact_every: int | None = None, hot_window: int | None = None) -> None:
        if (state_dir is None) == (repository is None):
            raise TypeError(f"{owner}: give exactly one of state_dir and repository")
        self._entry: _Entry | None = None
        self._finalizer: weakref.finalize | None = None
        if repository is not None:
            if not isinstance(repository, ConversationStateRepository):
                raise TypeError(f"{owner}: repository must be a ConversationStateRepository, "
                                f"got {type(repository).__name__}")
            self.repo = repository
            return
        options: dict[str, Any] = {"durability": durability}
        if compact_every is not None:
            options["compact_every"] = compact_every
        if hot_window is not None:
            options["hot_window"] = hot_window
        assert state_dir is not None
        self._hold(_acquire(state_dir, options))

    def _hold(self, entry: _Entry) -> None:
        self._entry = entry
        self.repo = entry.repo
        self._finalizer = weakref.finalize(self, _collected, entry)

    def share(self) -> "StoreRef":
        """Another reference to the same repository (for an object made from
        this one's, e.g. a branch): released on its own."""
        ref = StoreRef.__new__(StoreRef)
        ref._entry = None
        ref._finalizer = None
        ref.repo = self.repo
        if self._entry is not None:
            with _GUARD:
                if self._finalizer is None or not self._finalizer.alive:
                    raise StoreClosedError(f"the reference to {self.repo.state_dir} is released")
                self._entry.refs += 1
            ref._hold(self._entry)
        return ref

    def close(self) -> None:
        """Release the reference (the shared repository closes with its last
        one). A second call does nothing."""
        fin = self._finalizer
        if fin is not None and fin.detach() is not None:
            assert self._entry is not None
            with _GUARD:
                _release_locked(self._entry)
                _drain_locked()


# ----------------------------------------------------------- sessions, items


class SessionHandle:
    """What a framework's session object holds (a mixin): its session id,
    the channel of its items, its share of a store (``_ref``) and whether it
    was closed. ``_OWNER`` names the class in errors."""

    _OWNER = "session"
    session_id: str
    _channel: str
    _closed: bool
    _ref: StoreRef

    @property
    def channel_id(self) -> str:
        """The repository channel that holds this session's items."""
        return self._channel

    @property
    def repository(self) -> ConversationStateRepository:
        """The repository the items are stored in (shared: do not close it)."""
        self._check_open()
        return self._ref.repo

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise closed_error(self._OWNER, self.session_id)


def channel_for(owner: str, prefix: str, session_id: Any) -> str:
    """The channel id of a session: ``prefix + session_id``. ``TypeError``
    unless ``session_id`` is a str; ``ValueError`` if it is empty or not
    valid UTF-8 (a lone surrogate). Any other text is taken as it is (``/``,
    ``..``, NUL, any length): a channel is a field of each record, never a
    file name."""
    if not isinstance(session_id, str):
        raise TypeError(f"{owner}: session_id must be str, got {type(session_id).__name__}")
    if not session_id:
        raise ValueError(f"{owner}: session_id must be a non-empty str")
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{owner}: session_id is not valid UTF-8 "
                         f"(lone surrogate at index {exc.start})") from None
    return prefix + str(session_id)


def closed_error(owner: str, session_id: str) -> StoreClosedError:
    return StoreClosedError(f"{owner} {session_id!r} is closed")


def _str_keys(value: Any, where: str) -> None:
    """TypeError naming ``where`` for a dict key that is not a str (json
    would write it as one, and the item would come back changed)."""
    tp = type(value)
    if tp is dict or isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: a key {k!r} is a {type(k).__name__}, not a str")
            if type(v) in (dict, list, tuple) or isinstance(v, (dict, list, tuple)):
                _str_keys(v, where)
    elif tp is list or tp is tuple or isinstance(value, (list, tuple)):
        for v in value:
            if type(v) in (dict, list, tuple) or isinstance(v, (dict, list, tuple)):
                _str_keys(v, where)


def encode_item(value: Any, where: str) -> str:
    """The canonical JSON text of an item: ``json.dumps(value,
    ensure_ascii=False, separators=(",", ":"))``, keys in the item's own
    order. ``TypeError`` naming ``where`` for anything JSON cannot hold
    exactly: a value of another type, a non-str key, a non-finite number, a
    lone surrogate, a cycle. (Tuples are JSON arrays: they come back lists.)"""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"{where} cannot be stored as JSON: {exc}") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TypeError(f"{where} cannot be stored as JSON: a lone surrogate "
                        f"at index {exc.start} of its text") from None
    _str_keys(value, where)
    return text


def decode_item(rec: ConversationMessageRecord, origin: str, where: str) -> Any:
    """The item a record holds. ``CorruptStateCheckpointError`` naming the
    message and ``where`` if the record is not one of ``origin`` or its
    content is not JSON (a damaged or foreign record is never skipped)."""
    if rec.origin != origin:
        raise CorruptStateCheckpointError(
            f"{where}: message {rec.msg_id} has origin {rec.origin!r}, not {origin!r}: "
            "it was not written by this integration")
    try:
        return json.loads(rec.content)
    except ValueError as exc:
        raise CorruptStateCheckpointError(
            f"{where}: message {rec.msg_id} does not hold JSON: {exc}") from None
