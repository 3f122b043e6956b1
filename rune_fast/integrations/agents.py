"""A ``Session`` for the OpenAI Agents SDK (``pip install "rune_fast[agents]"``).

    from agents import Agent, Runner
    from rune_fast.integrations.agents import RuneSession

    session = RuneSession("user-42", "./state")
    result = await Runner.run(agent, "What did I ask before?", session=session)
    session.close()

Each item is one message record of the channel ``"agents:" + session_id``,
its JSON text verbatim in ``content`` (docs/FORMAT.md, "Framework items").
Every session object of one state directory in a process shares one
repository (``rune_fast.integrations._shared``).
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

try:
    from agents.memory import SessionSettings
    from agents.memory.session_settings import coerce_session_settings
except ImportError as exc:      # pragma: no cover - the extra is not installed
    raise ImportError('rune_fast.integrations.agents needs the OpenAI Agents SDK: '
                      'pip install "rune_fast[agents]"') from exc

from ..conversation_state import ConversationStateRepository
from ..errors import CorruptStateCheckpointError
from ..records import ROLES, ConversationMessageRecord, new_id
from ._shared import SessionHandle, StoreRef, channel_for, decode_item, encode_item

__all__ = ["CHANNEL_PREFIX", "ORIGIN", "RuneSession", "item_role"]

#: the channel of session ``s`` is ``CHANNEL_PREFIX + s``
CHANNEL_PREFIX = "agents:"
#: the ``origin`` of every record that holds an Agents SDK item
ORIGIN = "agents.item/1"

_T = TypeVar("_T")
_ROLE_SET = frozenset(ROLES)
_ALL = 1 << 62      # "every item" as a window size (the repository's own cap)


def item_role(item: Any) -> str:
    """The record role of an item: its own ``role`` when it is one of
    :data:`rune_fast.ROLES`, ``"system"`` for ``"developer"``, ``"tool"``
    for an item whose ``type`` ends in ``_output`` (a tool's result),
    ``"assistant"`` for anything else (tool calls, reasoning, items with no
    role at all)."""
    role = item.get("role") if isinstance(item, dict) else None
    if isinstance(role, str):
        if role in _ROLE_SET:
            return role
        if role == "developer":
            return "system"
    kind = item.get("type") if isinstance(item, dict) else None
    if isinstance(kind, str) and kind.endswith("_output"):
        return "tool"
    return "assistant"


async def _finish(awaitable: Awaitable[_T]) -> _T:
    """Await a write to its end even if the caller is cancelled meanwhile
    (then re-raise the cancellation): a write that stored items must not be
    reported as not done."""
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    try:
        result = task.result()
    except BaseException:
        if cancelled is not None:
            raise cancelled from None
        raise
    if cancelled is not None:
        raise cancelled from None
    return result


class RuneSession(SessionHandle):
    """Conversation history of one Agents SDK session, stored durably.

    ``session_id``: any non-empty str (never a path). ``state_dir``: the
    repository's directory, shared by every session object of this process
    that names it (opened with ``durability``, ``"fsync"`` by default: an
    item is on disk when ``add_items`` returns; ``compact_every`` and
    ``hot_window`` as the repository takes them). Or ``repository``: an open
    :class:`~rune_fast.ConversationStateRepository` the caller owns (``close``
    leaves it open). ``session_settings``: the SDK's
    :class:`~agents.memory.SessionSettings` (or a dict of them); its ``limit``
    is read at each ``get_items(None)``.

    The methods are coroutines that run the store's work in a worker thread,
    so any event loop in any thread may call them, as many objects as wanted
    at once. After :meth:`close` each raises ``StoreClosedError``.
    """

    _OWNER = "RuneSession"

    session_settings: SessionSettings | None

    def __init__(self, session_id: str, state_dir: str | os.PathLike[str] | None = None, *,
                 repository: ConversationStateRepository | None = None,
                 session_settings: SessionSettings | dict[str, Any] | None = None,
                 durability: str = "fsync", compact_every: int | None = None,
                 hot_window: int | None = None) -> None:
        channel = channel_for("RuneSession", CHANNEL_PREFIX, session_id)
        settings = SessionSettings() if session_settings is None else coerce_session_settings(session_settings)
        # (everything checked before the store is taken)
        self._setup(session_id, channel, settings,
                    StoreRef("RuneSession", state_dir, repository, durability=durability,
                             compact_every=compact_every, hot_window=hot_window))

    def _setup(self, session_id: str, channel: str, settings: SessionSettings | None, ref: StoreRef) -> None:
        self.session_id = session_id
        self._channel = channel
        self.session_settings = settings
        self._closed = False
        self._ref = ref

    def _where(self) -> str:
        return f"agents session {self.session_id!r}"

    # ------------------------------------------------------ the sync work
    def _read(self, n: int) -> list[Any]:
        self._check_open()
        try:
            recs = self._ref.repo.window(self._channel, n)
            return [decode_item(r, ORIGIN, self._where()) for r in recs]
        except CorruptStateCheckpointError as exc:
            exc.add_note(f"while reading {self._where()} (channel {self._channel!r})")
            raise

    def _records(self, items: Iterable[Any]) -> list[ConversationMessageRecord]:
        where = self._where()
        texts = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise TypeError(f"{where}: item {i} must be a dict (a JSON object), "
                                f"got {type(item).__name__}")
            texts.append((encode_item(item, f"{where}: item {i}"), item))
        ts = time.time()
        recs = []
        for text, item in texts:
            call_id = item.get("call_id") if item_role(item) == "tool" else None
            recs.append(ConversationMessageRecord(
                msg_id=new_id("msg"), ts=ts, role=item_role(item), content=text,
                channel_id=self._channel, tool_call_id=call_id if isinstance(call_id, str) else "",
                origin=ORIGIN))
        return recs

    def _add(self, recs: list[ConversationMessageRecord]) -> None:
        self._check_open()
        self._ref.repo.append_many(recs)

    def _pop(self) -> Any:
        repo = self._ref.repo
        while True:
            self._check_open()
            recs = repo.window(self._channel, 1)
            if not recs:
                return None
            # decoded before it is deleted: a damaged item raises and stays
            item = decode_item(recs[0], ORIGIN, self._where())
            if repo.delete(recs[0].msg_id):
                return item
            # another object popped it first: take the next newest

    def _clear(self) -> None:
        self._check_open()
        self._ref.repo.clear_channel(self._channel)

    # ------------------------------------------------------------- the API
    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The newest ``limit`` items, oldest first, each equal to the item
        added (tuples come back as lists). ``limit=None`` uses
        ``session_settings.limit`` (``None`` there: every item); ``0`` gives
        ``[]``. ``CorruptStateCheckpointError`` if a stored item is damaged."""
        self._check_open()
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is None:
            n = _ALL
        elif isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"{self._where()}: limit must be an int or None, got {type(limit).__name__}")
        elif limit < 0:
            raise ValueError(f"{self._where()}: limit must be >= 0, got {limit}")
        else:
            n = limit
        if n == 0:
            return []
        return await asyncio.to_thread(self._read, n)

    async def add_items(self, items: list[Any]) -> None:
        """Append ``items`` (JSON objects) in order, as one batch: durable on
        return (with ``durability="fsync"``). ``TypeError`` naming the item
        if one cannot be stored as JSON; nothing of the batch is stored then.
        An empty list does nothing."""
        self._check_open()
        recs = self._records(items)
        if not recs:
            return
        await _finish(asyncio.to_thread(self._add, recs))

    async def pop_item(self) -> Any:
        """Remove and return the newest item (``None`` if there is none).
        Two callers never get the same item."""
        self._check_open()
        return await _finish(asyncio.to_thread(self._pop))

    async def clear_session(self) -> None:
        """Delete every item of this session (other sessions keep theirs)."""
        self._check_open()
        await _finish(asyncio.to_thread(self._clear))

    async def branch_from_turn(self, turn_number: int, new_session_id: str) -> "RuneSession":
        """A new session ``new_session_id`` on the same store that holds this
        session's items from before its ``turn_number``-th user message (the
        first is 1): the state in which that turn was asked, to ask it
        another way. The copy is one durable batch; this session is left as
        it is. ``ValueError`` if the turn does not exist or the new session
        already holds items. The caller closes the returned session."""
        self._check_open()
        if isinstance(turn_number, bool) or not isinstance(turn_number, int):
            raise TypeError(f"{self._where()}: turn_number must be an int, got {type(turn_number).__name__}")
        channel = channel_for("RuneSession", CHANNEL_PREFIX, new_session_id)
        branch = RuneSession.__new__(RuneSession)
        branch._setup(new_session_id, channel, self.session_settings, self._ref.share())
        try:
            await _finish(asyncio.to_thread(self._branch, branch, turn_number))
        except BaseException:
            branch.close()
            raise
        return branch

    def _branch(self, branch: "RuneSession", turn_number: int) -> None:
        items = self._read(_ALL)
        users = [i for i, item in enumerate(items) if _is_user_message(item)]
        if not 1 <= turn_number <= len(users):
            raise ValueError(f"{self._where()}: no user turn {turn_number} "
                             f"(the session has {len(users)})")
        if branch._ref.repo.window(branch._channel, 1):
            raise ValueError(f"{branch._where()} already holds items: a branch starts a new session")
        upto = users[turn_number - 1]
        if upto:
            branch._add(branch._records(items[:upto]))

    # ----------------------------------------------------------- lifetime
    def close(self) -> None:
        """Release the store (the shared one closes with the last session
        using it). Every later call raises ``StoreClosedError``; a second
        ``close()`` does nothing."""
        if self._closed:
            return
        self._closed = True
        self._ref.close()

    def __enter__(self) -> "RuneSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "RuneSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self._ref.repo.state_dir
        return f"RuneSession({self.session_id!r}, {state})"


def _is_user_message(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") == "user" \
        and item.get("type", "message") == "message"
