"""Helpers of the tests of calls that read the archive without the
repository's lock (verify, export_ops): a call run on a thread, and a store
whose messages are spread over several archive files."""
from __future__ import annotations

import threading
from typing import Any, Callable

from rune_fast import ConversationMessageRecord, ConversationStateRepository


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict]:
    """``fn()`` started on a thread: the thread, and a dict that gets its
    ``"value"`` or the ``"error"`` it raised."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:     # (handed to the test)
            out["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    return t, out


def archived_store(state: str, **options: Any) -> ConversationStateRepository:
    """A writer with three batches of six messages on two channels, each
    batch cooled into an archive file of its own (``hot_window=1``;
    ``options``: the repository's others)."""
    repo = ConversationStateRepository(state, hot_window=1, **options)
    for batch in range(3):       # three archive files
        repo.append_many([ConversationMessageRecord(msg_id=f"b{batch}-{i}", role="user",
                                                    content=f"é {batch}-{i} secret{batch}{i}x",
                                                    channel_id=f"c{i % 2}") for i in range(6)])
        repo.compact()
    assert len(repo._cool.files()) >= 3
    return repo
