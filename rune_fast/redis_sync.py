"""Devices that sync through a Redis stream.

Each store publishes its ops (``export_ops``: messages and tombstones) to
one Redis stream and reads everyone's with a consumer group of its own
(named after its device id). An entry is acknowledged (``XACK``) only after
``merge_ops`` stored it (durable on return in the store's durability mode),
so delivery is at least once and a crash re-reads what it had not merged;
merging is idempotent, so duplicates and reordering change nothing. Local
appends never wait for Redis: the exchange runs beside them.

``RedisSync(repo, url).sync_once()`` publishes what is new and merges what
arrived; ``run(stop)`` loops, retrying with backoff (logged) while Redis is
unreachable. ``rune-fast sync --redis URL`` runs that loop. The ``redis``
client is an optional extra (``pip install "rune_fast[redis]"``).

What this store has published is kept in ``hot/redis-<digest>.published``
(the stream's epoch on the first line, then one op key a line, appended
after the entries were added, and a ``cursor`` line after each push: where
in the store's event store it read the changes up to, so that the next
push reads only the envelopes written since; see
``ConversationStateRepository._export_changes``; past a few thousand keys a
push that moved the cursor writes the file again as its epoch and cursor
alone): a crash between the two publishes some ops again, which merging
absorbs. The epoch is a random value kept beside the stream (key
``<stream>:epoch``): a Redis that lost the stream (restarted without
persistence, flushed) lost it too, and the store then publishes everything
again.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from typing import Any

import xxhash

from . import sync as _sync
from ._names import redis_published_name
from .segments import fsync_dir, write_file
from .conversation_state import ConversationStateRepository
from .errors import RuneError

__all__ = ["RedisSync", "RedisSyncError"]

log = logging.getLogger("rune_fast")

#: Op keys kept in the published file (and in memory) before a push that
#: moved the cursor writes it again without them (see _restart_published):
#: a store of 1,000,000 messages kept 1,000,000 keys, ~30 MB on disk and
#: ~100 MB in memory.
_KEYS_KEPT = 4096


class RedisSyncError(RuneError):
    """Redis could not be reached or answered something unexpected."""


def _op_key(op: _sync.OpRecord) -> str:
    kind = "d" if op.payload.get("deleted") is True else "m"
    return f"{kind}:{op.op_id}"


class RedisSync:
    """The op exchange of one store through the stream ``stream`` at ``url``
    (``redis://127.0.0.1:6379/0``), as consumer group ``group`` (default:
    the store's device id). Thread-safe: calls are serialized."""

    def __init__(self, repo: ConversationStateRepository, url: str, *, stream: str = "rune:ops",
                 group: str | None = None, client: Any = None, batch: int = 500) -> None:
        if not isinstance(repo, ConversationStateRepository):
            raise TypeError(f"repo: a ConversationStateRepository expected, got {type(repo).__name__}")
        if repo.read_only:
            raise ValueError(f"repo: {repo.state_dir} is open read-only; syncing merges into it")
        for field, value in (("url", url), ("stream", stream)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{field}: a non-empty str expected, got {value!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch: an int >= 1 expected, got {batch!r}")
        if client is None:
            try:
                import redis
            except ImportError:
                raise ImportError("RedisSync needs the redis client: pip install 'rune_fast[redis]'") from None
            client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        self.repo, self.url, self.stream, self.batch = repo, url, stream, batch
        self.group = group or repo.clock.device_id
        self._r = client
        self._lock = threading.Lock()
        digest = xxhash.xxh3_64_hexdigest(f"{url}\0{stream}\0{self.group}".encode())
        self._path = os.path.join(repo.hot_dir, redis_published_name(digest))
        self._file_epoch = ""
        self._cursor: tuple[str, int] | None = None
        self._published = self._load_published()
        self._group_ready = False
        self._pending_first = True      # after a start, entries delivered and never acknowledged first

    def _load_published(self) -> set[str]:
        try:
            with open(self._path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return set()
        lines = data.split(b"\n")
        # (a cut-short last line, from a crash, is dropped: published again)
        keys = [ln.decode("utf-8", "replace") for ln in lines[:-1] if ln]
        if not keys or not keys[0].startswith("epoch "):
            return set()
        self._file_epoch = keys[0][6:]
        published = set()
        for k in keys[1:]:
            if k.startswith("cursor "):         # (op keys start "m:" or "d:")
                ident, _, at = k[7:].rpartition(" ")
                self._cursor = (ident, int(at)) if ident and at.isdigit() else None
            else:
                published.add(k)
        return published

    def _check_epoch(self) -> None:
        """Start the published list again when the stream is not the one it
        names (see the module doc)."""
        key = f"{self.stream}:epoch"
        self._r.set(key, uuid.uuid4().hex, nx=True)
        raw = self._r.get(key)
        epoch = raw.decode() if isinstance(raw, bytes) else str(raw)
        if epoch != self._file_epoch:
            if self._file_epoch:
                log.warning("redis stream %s at %s is not the one this store published to: "
                            "publishing everything again", self.stream, self.url)
            self._file_epoch = epoch
            self._restart_published(None)

    def _note_published(self, keys: list[str], cursor: tuple[str, int] | None = None) -> None:
        """Append ``keys`` (and, after them, ``cursor``: where the store's
        changes were read up to) to the published file, synced."""
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            lines = [k + "\n" for k in keys]
            if cursor is not None:
                lines.append(f"cursor {cursor[0]} {cursor[1]}\n")
            data = "".join(lines).encode("utf-8", "surrogatepass")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        self._published.update(keys)
        if cursor is not None:
            self._cursor = cursor

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        self._check_epoch()
        try:
            self._r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except Exception as exc:       # redis.ResponseError BUSYGROUP: it exists
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def push(self) -> int:
        """Publish the ops this store holds that it has not published; returns how many.

        The ops of what the store took since the last push (its event
        store's envelopes since the cursor kept in the published file:
        the work follows what changed, not the size of the store); every
        op the first time, and whenever the cursor names another event
        store file or a stream that lost what was published."""
        with self._lock:
            self._ensure_group()
            ops, cursor = self.repo._export_changes(self._cursor)
            new = [op for op in ops if _op_key(op) not in self._published]
            for i in range(0, len(new), self.batch):
                part = new[i:i + self.batch]
                pipe = self._r.pipeline(transaction=False)
                for op in part:
                    pipe.xadd(self.stream, {"op": json.dumps(op.to_dict(), ensure_ascii=False,
                                                             separators=(",", ":"))})
                pipe.execute()
                self._note_published([_op_key(op) for op in part])
            if cursor != self._cursor:
                if len(self._published) > _KEYS_KEPT:
                    # every key names an op whose envelope lies before the
                    # cursor (push and pull take turns under the lock, and a
                    # pull's merges are journaled before its keys are
                    # noted): no later push from this cursor meets it again
                    self._restart_published(cursor)
                else:
                    self._note_published([], cursor)
            return len(new)

    def _restart_published(self, cursor: tuple[str, int] | None) -> None:
        """Write the published file again as its epoch and ``cursor`` (if
        any) alone, forgetting every key (temp file, fsync, rename, fsync
        of the folder): a new stream's start, or a push's cursor past every
        key held (keeps the file and the set from growing with the store)."""
        tmp = self._path + ".tmp"
        head = f"epoch {self._file_epoch}\n" + ("" if cursor is None else f"cursor {cursor[0]} {cursor[1]}\n")
        write_file(tmp, head.encode())
        os.replace(tmp, self._path)
        fsync_dir(os.path.dirname(self._path))
        self._published = set()
        self._cursor = cursor

    def pull(self, *, block_ms: int | None = None) -> int:
        """Merge what arrived for this store's group; returns how many
        messages were new to the store. Entries are acknowledged after the
        merge; one that is not an op is acknowledged and logged (a warning
        naming its stream id), never merged."""
        with self._lock:
            self._ensure_group()
            new = 0
            while True:
                start = "0" if self._pending_first else ">"
                got = self._r.xreadgroup(self.group, self.group, {self.stream: start},
                                         count=self.batch, block=block_ms if start == ">" else None)
                entries = got[0][1] if got else []
                if start == "0" and not entries:
                    self._pending_first = False
                    continue
                if not entries:
                    return new
                ops, ids = [], []
                for entry_id, fields in entries:
                    ids.append(entry_id)
                    raw = fields.get(b"op") if isinstance(fields, dict) else None
                    try:
                        ops.append(_sync.as_op(json.loads(raw if raw is not None else b"")))
                    except (TypeError, ValueError) as exc:
                        log.warning("redis stream %s entry %r is not an op (%s): acknowledged, not merged",
                                    self.stream, entry_id, exc)
                new += self.repo.merge_ops(ops)
                self._r.xack(self.stream, self.group, *ids)
                # (merged ops are the store's too: never published again)
                self._note_published([k for k in dict.fromkeys(map(_op_key, ops)) if k not in self._published])
                if start == ">" and len(entries) < self.batch:
                    return new

    def sync_once(self) -> tuple[int, int]:
        """push(), then pull(): (ops published, messages new to the store)."""
        return self.push(), self.pull()

    def run(self, stop: threading.Event, *, interval: float = 0.5, max_backoff: float = 5.0) -> None:
        """sync_once() every ``interval`` seconds until ``stop`` is set;
        while Redis is unreachable, retry with doubling waits (a log warning
        each time). A RuneError of the store (damage, a failed write) ends
        the loop: it is raised."""
        wait = interval
        while not stop.is_set():
            try:
                self.sync_once()
                wait = interval
            except RuneError:
                raise
            except Exception as exc:        # redis.ConnectionError, TimeoutError, ...
                self._group_ready = False
                self._pending_first = True
                wait = min(max(wait * 2, interval), max_backoff)
                log.warning("redis sync with %s failed (%s: %s); retrying in %.1f s",
                            self.url, type(exc).__name__, exc, wait)
            stop.wait(wait)

    def close(self) -> None:
        """Close the Redis connection (the store stays open: it is the caller's)."""
        close = getattr(self._r, "close", None)
        if close is not None:
            close()
