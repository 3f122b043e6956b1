"""A LangChain ``BaseChatMessageHistory`` (``pip install "rune_fast[langchain]"``).

    from rune_fast.integrations.langchain import RuneChatMessageHistory

    history = RuneChatMessageHistory("user-42", "./state")
    history.add_user_message("hi")
    history.add_ai_message("hello")
    history.messages        # [HumanMessage('hi'), AIMessage('hello')]
    history.close()

Each message is one message record of the channel ``"langchain:" +
session_id``, ``content`` holding ``message_to_dict(message)`` as canonical
JSON (docs/FORMAT.md, "Framework items"). Every history object of one state
directory in a process shares one repository (``rune_fast.integrations._shared``),
so a second object with the same session id sees what the first added.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
except ImportError as exc:      # pragma: no cover - the extra is not installed
    raise ImportError('rune_fast.integrations.langchain needs langchain-core: '
                      'pip install "rune_fast[langchain]"') from exc

from ..conversation_state import ConversationStateRepository
from ..errors import CorruptStateCheckpointError
from ..records import ROLES, ConversationMessageRecord, new_id
from ._shared import SessionHandle, StoreRef, channel_for, decode_item, encode_item

__all__ = ["CHANNEL_PREFIX", "ORIGIN", "RuneChatMessageHistory", "message_role"]

#: the channel of session ``s`` is ``CHANNEL_PREFIX + s``
CHANNEL_PREFIX = "langchain:"
#: the ``origin`` of every record that holds a LangChain message
ORIGIN = "langchain.message/1"

_ALL = 1 << 62      # "every message" as a window size (the repository's own cap)
_ROLES = {"human": "user", "ai": "assistant", "AIMessageChunk": "assistant",
          "HumanMessageChunk": "user", "system": "system", "SystemMessageChunk": "system",
          "tool": "tool", "ToolMessageChunk": "tool", "function": "tool",
          "FunctionMessageChunk": "tool"}
_ROLE_SET = frozenset(ROLES)


def message_role(message: BaseMessage) -> str:
    """The record role of a message: ``user`` (human), ``assistant`` (ai),
    ``system``, ``tool`` (tool and function results); a ``ChatMessage``'s
    own role when it is one of :data:`rune_fast.ROLES`; else ``assistant``."""
    role = _ROLES.get(message.type)
    if role is not None:
        return role
    own = getattr(message, "role", None)
    return own if isinstance(own, str) and own in _ROLE_SET else "assistant"


class RuneChatMessageHistory(SessionHandle, BaseChatMessageHistory):
    """Chat history of one session, stored durably; safe to share between
    threads.

    ``session_id``: any non-empty str (never a path). ``state_dir``: the
    repository's directory, shared by every history object of this process
    that names it (opened with ``durability``, ``"fsync"`` by default: a
    message is on disk when ``add_messages`` returns; ``compact_every`` and
    ``hot_window`` as the repository takes them). Or ``repository``: an open
    :class:`~rune_fast.ConversationStateRepository` the caller owns
    (``close`` leaves it open).

    The store is released by :meth:`close` or when the object is collected
    (``RunnableWithMessageHistory`` makes one per call and never closes it).
    After ``close()`` every method raises ``StoreClosedError``.
    """

    _OWNER = "RuneChatMessageHistory"

    def __init__(self, session_id: str, state_dir: str | os.PathLike[str] | None = None, *,
                 repository: ConversationStateRepository | None = None, durability: str = "fsync",
                 compact_every: int | None = None, hot_window: int | None = None) -> None:
        super().__init__()
        self._channel = channel_for("RuneChatMessageHistory", CHANNEL_PREFIX, session_id)
        self.session_id = session_id
        self._closed = False
        self._ref = StoreRef("RuneChatMessageHistory", state_dir, repository, durability=durability,
                             compact_every=compact_every, hot_window=hot_window)

    def _where(self) -> str:
        return f"langchain session {self.session_id!r}"

    # ------------------------------------------------------------- the API
    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """Every message, oldest first, each equal to the one added (same
        type and fields). ``CorruptStateCheckpointError`` if one is damaged."""
        self._check_open()
        where = self._where()
        try:
            recs = self._ref.repo.window(self._channel, _ALL)
            dicts = [decode_item(r, ORIGIN, where) for r in recs]
            return messages_from_dict(dicts)
        except CorruptStateCheckpointError as exc:
            exc.add_note(f"while reading {where} (channel {self._channel!r})")
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStateCheckpointError(
                f"{where}: a stored message is not a LangChain message dict: {exc!r}") from None

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` in order, as one batch: durable on return (with
        ``durability="fsync"``). ``TypeError`` naming the message if one is
        not a ``BaseMessage`` or cannot be stored as JSON; nothing of the
        batch is stored then."""
        self._check_open()
        where = self._where()
        messages = list(messages)
        ts = time.time()
        recs = []
        for i, m in enumerate(messages):
            if not isinstance(m, BaseMessage):
                raise TypeError(f"{where}: message {i} must be a BaseMessage, got {type(m).__name__}")
            text = encode_item(message_to_dict(m), f"{where}: message {i}")
            call_id = getattr(m, "tool_call_id", "")
            recs.append(ConversationMessageRecord(
                msg_id=new_id("msg"), ts=ts, role=message_role(m), content=text,
                channel_id=self._channel, tool_call_id=call_id if isinstance(call_id, str) else "",
                origin=ORIGIN))
        if recs:
            self._ref.repo.append_many(recs)

    def clear(self) -> None:
        """Delete every message of this session (other sessions keep theirs)."""
        self._check_open()
        self._ref.repo.clear_channel(self._channel)

    async def aget_messages(self) -> list[BaseMessage]:
        return await asyncio.to_thread(lambda: self.messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await asyncio.to_thread(self.add_messages, messages)

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)

    # ----------------------------------------------------------- lifetime
    def close(self) -> None:
        """Release the store (the shared one closes with the last object
        using it). A second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._ref.close()

    def __enter__(self) -> "RuneChatMessageHistory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self._ref.repo.state_dir
        return f"RuneChatMessageHistory({self.session_id!r}, {state})"
