"""The SQLite baseline: the same records in stdlib ``sqlite3``, at a stated durability.

One file ``messages.sqlite3`` (plus its ``-wal``/``-shm`` while open) under the
state directory, in WAL mode. Schema::

    messages(seq INTEGER PRIMARY KEY,        -- rowid: append order
             msg_id TEXT NOT NULL UNIQUE,    -- the message key (a unique b-tree,
                                             --  what a TEXT PRIMARY KEY is in a rowid table)
             channel_id TEXT NOT NULL, task_id TEXT NOT NULL,
             ts REAL NOT NULL, content TEXT NOT NULL,
             extra TEXT NOT NULL)            -- JSON of every other field of to_dict()
    INDEX (channel_id, seq), INDEX (task_id, seq)

Durability, matched to rune_fast's modes (see :data:`SYNCHRONOUS`):

- ``"fsync"``: ``synchronous=FULL``, one transaction per ``append`` (the WAL is
  fsynced at each commit: durable on return, like rune_fast's per-append
  ``fdatasync``), one transaction per ``append_many`` batch.
- ``"normal"``: ``synchronous=NORMAL`` (WAL synced only at checkpoints: survives a
  process crash, may lose the last commits on power loss).
- ``"off"``: ``synchronous=OFF`` (no syncs at all; survives a process crash).
  ``"none"`` is an alias: it is the mode whose promise equals rune_fast's ``"none"``.

Reads return what the repository returns: records built with the message
type's ``from_dict`` when a ``record_type`` is given (so decode costs are
compared fairly), else plain dicts.

Note: ``search_ci`` is ``instr(lower(content), lower(?))`` over every row.
SQLite's built-in ``lower()`` folds ASCII letters only (``'Ü'`` stays ``'Ü'``,
``'ß'`` never matches ``'ss'``), so it is *not* the Unicode case fold rune_fast's
``search`` promises; the comparison reports both hit counts.
"""
from __future__ import annotations

import json
import os
import sqlite3
from typing import Any, Iterable

from .workload import to_plain_dict

__all__ = ["SQLiteStore", "SYNCHRONOUS", "DB_NAME"]

DB_NAME = "messages.sqlite3"

#: durability name -> PRAGMA synchronous value.
SYNCHRONOUS = {"fsync": "FULL", "full": "FULL", "batch": "FULL",
               "normal": "NORMAL", "off": "OFF", "none": "OFF"}

_COLUMNS = ("msg_id", "channel_id", "task_id", "ts", "content")
_SELECT = "SELECT msg_id, channel_id, task_id, ts, content, extra FROM messages"


class SQLiteStore:
    """SQLite holding the same messages, with the repository's read/write calls.

    ``durability`` is one of ``"fsync"`` (``synchronous=FULL``), ``"batch"``
    (also ``FULL``: each call is durable on return), ``"normal"``, ``"off"`` /
    ``"none"``. ``record_type``: a class with ``from_dict`` used to build read
    results (None: plain dicts).
    """

    def __init__(self, state_dir: str | os.PathLike, *, durability: str = "fsync",
                 record_type: Any = None, read_only: bool = False, **_ignored: Any) -> None:
        if durability not in SYNCHRONOUS:
            raise ValueError(f"durability must be one of {sorted(SYNCHRONOUS)}, not {durability!r}")
        self.durability = durability
        self.synchronous = SYNCHRONOUS[durability]
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(os.fspath(state_dir), DB_NAME)
        self._from_dict = getattr(record_type, "from_dict", None)
        # isolation_level=None: autocommit, so a bare INSERT is one transaction
        # and batches use explicit BEGIN/COMMIT.
        # check_same_thread=False: a connection may be handed to one worker thread
        # (never used by two threads at once).
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={self.synchronous}")
        if read_only:
            self.conn.execute("PRAGMA query_only=ON")
        else:
            self.conn.executescript(
                """
                CREATE TABLE IF NOT EXISTS messages (
                    seq INTEGER PRIMARY KEY,
                    msg_id TEXT NOT NULL UNIQUE,
                    channel_id TEXT NOT NULL,
                    task_id TEXT NOT NULL,
                    ts REAL NOT NULL,
                    content TEXT NOT NULL,
                    extra TEXT NOT NULL
                );
                CREATE INDEX IF NOT EXISTS messages_channel ON messages (channel_id, seq);
                CREATE INDEX IF NOT EXISTS messages_task ON messages (task_id, seq);
                """
            )
        self._insert = ("INSERT OR IGNORE INTO messages (msg_id, channel_id, task_id, ts, content, extra)"
                        " VALUES (?, ?, ?, ?, ?, ?)")

    # -- encoding -----------------------------------------------------------
    @staticmethod
    def _row(msg: Any) -> tuple:
        d = to_plain_dict(msg)
        extra = {k: v for k, v in d.items() if k not in _COLUMNS}
        return (d["msg_id"], d["channel_id"], d.get("task_id", ""), d.get("ts", 0.0), d["content"],
                json.dumps(extra, separators=(",", ":"), ensure_ascii=False))

    def _decode(self, row: tuple) -> Any:
        d = json.loads(row[5])
        d["msg_id"], d["channel_id"], d["task_id"], d["ts"], d["content"] = row[:5]
        return self._from_dict(d) if self._from_dict is not None else d

    # -- writes ---------------------------------------------------------------
    def append(self, msg: Any) -> bool:
        """One message in its own transaction (durable on return at ``synchronous=FULL``).

        True if stored, False if the ``msg_id`` was already there.
        """
        return self.conn.execute(self._insert, self._row(msg)).rowcount == 1

    def append_many(self, msgs: Iterable[Any]) -> int:
        """A batch in one transaction (one WAL sync at commit); returns how many were new."""
        rows = [self._row(m) for m in msgs]
        self.conn.execute("BEGIN")
        try:
            n = self.conn.executemany(self._insert, rows).rowcount
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return n

    # -- reads ----------------------------------------------------------------
    def window(self, channel_id: str, n: int = 8) -> list[Any]:
        """Last ``n`` messages of the channel, oldest first (index ``(channel_id, seq)``)."""
        if n <= 0:
            return []
        rows = self.conn.execute(_SELECT + " WHERE channel_id = ? ORDER BY seq DESC LIMIT ?",
                                 (channel_id, n)).fetchall()
        rows.reverse()
        return [self._decode(r) for r in rows]

    def get_message(self, msg_id: str) -> Any | None:
        """The record of ``msg_id`` (unique index lookup), or None."""
        row = self.conn.execute(_SELECT + " WHERE msg_id = ?", (msg_id,)).fetchone()
        return None if row is None else self._decode(row)

    def messages_for_task(self, task_id: str) -> list[Any]:
        """Every message of the task, oldest first (index ``(task_id, seq)``)."""
        rows = self.conn.execute(_SELECT + " WHERE task_id = ? ORDER BY seq", (task_id,)).fetchall()
        return [self._decode(r) for r in rows]

    def search_ci(self, text: str, channel_id: str | None = None, limit: int | None = None) -> list[Any]:
        """Messages whose content contains ``text``, ASCII-case-insensitively, oldest first.

        A full scan: ``instr(lower(content), lower(?)) > 0``. SQLite's ``lower()``
        is ASCII-only, so non-ASCII letters are compared case-sensitively.
        With ``limit``, the newest ``limit`` hits (as the repository's ``search``).
        """
        sql = _SELECT + " WHERE instr(lower(content), lower(?)) > 0"
        args: list[Any] = [text]
        if channel_id is not None:
            sql += " AND channel_id = ?"
            args.append(channel_id)
        if limit is not None:
            sql += " ORDER BY seq DESC LIMIT ?"
            args.append(limit)
            rows = self.conn.execute(sql, args).fetchall()
            rows.reverse()
        else:
            rows = self.conn.execute(sql + " ORDER BY seq", args).fetchall()
        return [self._decode(r) for r in rows]

    search = search_ci

    def compact(self) -> None:
        """The nearest SQLite analogue of compaction: a WAL checkpoint (TRUNCATE)."""
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        """Close the connection (the last connection checkpoints and removes the WAL)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None  # type: ignore[assignment]
