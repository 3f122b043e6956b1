"""The durable event store (``events.jsonl``): typed envelopes, one framed line each.

The framed append-only log under it (the frame, :class:`FramedLog`, its
recovery) lives in :mod:`rune_fast.framed_log`; its names are re-exported here.
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable, Literal, overload

import orjson

from ._log import frame_many, message_envelope_keys
from .fsutil import ensure_private_dir, fdatasync_path, fsync_dir  # noqa: F401 (re-exported)
from .framed_log import (  # noqa: F401 (re-exported)
    MAX_LINE,
    FramedLog,
    _Pending,
    check_line,
    frame,
    frame_object,
    parse_checked,
    parse_line,
)
from .records import payload_hash
from .errors import (
    RecoveryWarning,
    CorruptStateCheckpointError,
    FramingError,
    StoreClosedError,
)

__all__ = [
    "EVENT_TYPES",
    "MAX_LINE",
    "RecoveryWarning",
    "frame",
    "frame_object",
    "check_line",
    "parse_line",
    "FramedLog",
    "EventStore",
]

EVENT_TYPES: frozenset[str] = frozenset({
    "task_state.created",
    "task_state.amended",
    "task_state.transition",
    "task_state.imported",
    "conversation.message",
    "conversation.deleted",
})

_HASH_RE = re.compile(r"[0-9a-f]{64}")
_RESERVED = frozenset({"x", "type", "id", "payload_hash", "ts", "offset"})

# --------------------------------------------------------------- event store


class EventStore:
    """Typed envelopes in ``events.jsonl``, one framed line each::

        {"x":"...","type":"task_state.created","id":"task_...","payload_hash":"<sha256 hex>","ts":1.7e9,...}

    ``type`` is one of :data:`EVENT_TYPES`, ``id`` the record id,
    ``payload_hash`` the sha256 hex of the canonical JSON of the record body
    (:func:`rune_fast.records.payload_hash`), ``ts`` the append time; extra
    JSON-safe fields may follow. Opening recovers as :class:`FramedLog` does.
    Appends are not durable until :meth:`sync`, so a caller can make several
    envelopes durable with one sync; :meth:`append_durable` does both. Several
    EventStores, in one or many processes, may append to the same file.
    """

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        self._log = FramedLog(path, read_only=read_only, zeroed_lost=True)
        self.path = self._log.path

    @property
    def quarantined(self) -> list[dict[str, Any]]:
        """What recovery on open moved to quarantine files."""
        return self._log.quarantined

    @property
    def read_only(self) -> bool:
        return self._log.read_only

    @property
    def closed(self) -> bool:
        return self._log.closed

    @staticmethod
    def encode(type: str, record_id: str, payload_hash: str, **extra: Any) -> bytes:
        """The framed line of one envelope; ``ValueError``/``TypeError`` naming
        the field for an unknown type, an empty id, a malformed hash or an
        extra field that is reserved or not JSON."""
        if type not in EVENT_TYPES:
            raise ValueError(f"event type: unknown {type!r} (one of {', '.join(sorted(EVENT_TYPES))})")
        if not isinstance(record_id, str) or not record_id:
            raise ValueError(f"event id: must be a non-empty str, got {record_id!r}")
        if not isinstance(payload_hash, str) or not _HASH_RE.fullmatch(payload_hash):
            raise ValueError(f"event payload_hash: must be 64 lowercase hex digits, got {payload_hash!r}")
        env = {"type": type, "id": record_id, "payload_hash": payload_hash, "ts": time.time()}
        for key, value in extra.items():
            if key in _RESERVED:
                raise ValueError(f"event field {key!r} is reserved")
            env[key] = value
        try:
            return frame_object(env)
        except FramingError as exc:
            raise ValueError(f"event for id {record_id!r}: {exc}") from None

    @staticmethod
    def encode_deleted(deletions: Iterable[tuple[str, str]]) -> bytes:
        """The framed lines of the ``conversation.deleted`` envelopes of
        ``(msg_id, channel_id)`` pairs, as :meth:`encode` makes each (its
        checks hold by construction for a stored message's id: a deletion
        of 123,000 messages spent ~8 us an envelope in them and in a frame
        made in Python). ``ValueError`` for an empty id."""
        rests = []
        for mid, channel in deletions:
            if not isinstance(mid, str) or not mid:
                raise ValueError(f"event id: must be a non-empty str, got {mid!r}")
            env = {"type": "conversation.deleted", "id": mid,
                   "payload_hash": payload_hash({"msg_id": mid}),
                   "ts": time.time(), "channel_id": channel}
            rests.append(b"," + orjson.dumps(env)[1:])
        return frame_many(rests)

    def append(self, type: str, record_id: str, payload_hash: str, **extra: Any) -> int:
        """Append one envelope (one ``write(2)``, not synced); return its offset."""
        return self._log.append_bytes(self.encode(type, record_id, payload_hash, **extra))

    def append_many(self, envelopes: Iterable[tuple[str, str, str] | tuple[str, str, str, Mapping[str, Any]]]) -> list[int]:
        """Append ``(type, id, payload_hash[, extra])`` envelopes with one
        ``write(2)`` (not synced); return their offsets."""
        lines = []
        for env in envelopes:
            if len(env) == 4:
                t, rid, h, extra = env  # type: ignore[misc]
                lines.append(self.encode(t, rid, h, **extra))
            else:
                t, rid, h = env  # type: ignore[misc]
                lines.append(self.encode(t, rid, h))
        if not lines:
            return []
        start = self._log.append_bytes(b"".join(lines))
        offsets = []
        for line in lines:
            offsets.append(start)
            start += len(line)
        return offsets

    @overload
    def append_encoded(self, lines: bytes, *, offset: Literal[True] = ...) -> int: ...
    @overload
    def append_encoded(self, lines: bytes, *, offset: bool) -> int | None: ...
    @overload
    def append_encoded(self, lines: bytes, *, offset: Literal[False], background: Literal[True]) -> _Pending: ...

    def append_encoded(self, lines: bytes, *, offset: bool = True, background: bool = False) -> int | _Pending | None:
        """Append lines made by :meth:`encode` (one or several, concatenated)
        with one ``write(2)``, not synced; return the offset of the first
        (None with ``offset=False``: one system call less). ``background``
        (with ``offset=False``): the write runs in a thread of its own
        (:meth:`FramedLog.append_bytes_begin`); returns what the caller
        ends with ``.end()``. ``ValueError`` if ``lines`` is empty or does
        not end with a newline."""
        if not lines or not lines.endswith(b"\n"):
            raise ValueError(f"append_encoded to {self.path}: expected whole framed lines")
        if background and not offset:
            return self._log.append_bytes_begin(lines)
        return self._log.append_bytes(lines, offset=offset)

    def sync(self) -> None:
        """Make every envelope appended so far durable (one fdatasync)."""
        self._log.sync()

    def append_durable(self, type: str, record_id: str, payload_hash: str, **extra: Any) -> int:
        """:meth:`append` then :meth:`sync`: on stable storage when it returns."""
        offset = self.append(type, record_id, payload_hash, **extra)
        self._log.sync()
        return offset

    @property
    def size(self) -> int:
        """Size of ``events.jsonl`` in bytes."""
        return self._log.size

    def iter_envelopes(self, start: int = 0) -> Iterator[dict[str, Any]]:
        """Yield each envelope from offset ``start`` on as a dict (without
        ``"x"``) with its byte ``"offset"`` added. A damaged line raises
        :class:`CorruptStateCheckpointError` naming the file and offset."""
        for offset, line in self._log.iter_lines(start):
            env = parse_checked(line, path=self.path, offset=offset)     # (iter_lines checked it)
            env["offset"] = offset
            yield env

    def envelope_at(self, offset: int, *, loud: bool = False) -> dict[str, Any] | None:
        """The envelope of the sound line that starts at byte ``offset``, or
        ``None`` if no complete line passing its check starts there (past the
        end, mid-line, torn or damaged: :meth:`verify` reports damage).
        ``loud=True``: a complete line (newline included) that starts there,
        holds no zero byte, and fails its check or is no envelope raises
        CorruptStateCheckpointError naming the file and offset instead."""
        if self._log.closed:
            raise StoreClosedError(f"event store {self.path} is closed")
        if not isinstance(offset, int) or offset < 0:
            return None
        with open(self.path, "rb") as f:
            if offset > 0:
                f.seek(offset - 1)
                if f.read(1) != b"\n":
                    return None
            line = f.readline(MAX_LINE + 1)
        if not line.endswith(b"\n"):
            return None
        problem = check_line(line[:-1])
        env: Any = None
        if not problem:
            try:
                env = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                problem = f"JSON error {exc}"
            else:
                problem = "" if isinstance(env, dict) else "not a JSON object"
        if problem:
            # zeros are what a power loss leaves (past the end, or a page of an
            # unsynced region lost between two that were kept), not damage
            if loud and b"\0" not in line:
                raise CorruptStateCheckpointError(f"damaged envelope line: {problem}",
                                                  path=self.path, offset=offset)
            return None
        del env["x"]
        return env

    def line_end(self) -> int:
        """Where complete lines end now (see :meth:`FramedLog.line_end`): the
        size a checkpoint may record."""
        return self._log.line_end()

    def next_line_start(self, offset: int) -> int:
        """See :meth:`FramedLog.next_line_start`."""
        return self._log.next_line_start(offset)

    def verify(self, sound: Callable[[dict[str, Any]], None] | None = None,
               keys: Callable[[bytes], None] | None = None) -> list[dict[str, Any]]:
        """Check every line and envelope up to where complete lines ended
        when it started (another appender's envelope in flight is not
        damage), in one pass; never raises for damage. Return one
        ``{"path", "offset", "problem"}`` dict per problem, by offset.
        ``sound(envelope)``: each sound envelope, as :meth:`iter_envelopes`
        gives it (a check of the envelopes against records reads the file
        once); with ``keys``, but the message envelopes spelled as
        :meth:`append` writes them, which go to ``keys(entries)`` instead,
        a part of the file at a time: 32 bytes each, in order
        (``_log.message_envelope_keys``: the xxh3_128 digest of the id, the
        first 8 bytes of the payload hash, the offset; checked in C, where
        parsing each in Python took ~2.5 us, 2.5 s of a verify at 1,000,000
        messages)."""
        def content(offset: int, line: bytes) -> str:
            try:
                env = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                return f"JSON error {exc}"
            problem = _envelope_problem(env)
            if not problem and sound is not None:
                del env["x"]
                env["offset"] = offset
                sound(env)
            return problem

        taken = None
        if keys is not None and sound is not None:
            def taken(data: bytes, offsets: Any, lengths: Any, base: int) -> Any:
                entries, took = message_envelope_keys(data, offsets, lengths, base)
                keys(entries)
                return took

        problems = self._log.verify(self._log.line_end(), content, taken)
        problems.sort(key=lambda p: p["offset"])
        return problems

    def close(self) -> None:
        """Sync and close the file (idempotent); a repository sharing the
        store may still close after it (its sync is then a no-op)."""
        self._log.close()

    def __enter__(self) -> "EventStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventStore({self.path!r})"


def _envelope_problem(env: Any) -> str:
    if not isinstance(env, dict):
        return "envelope is not a JSON object"
    if env.get("type") not in EVENT_TYPES:
        return f"unknown envelope type {env.get('type')!r}"
    if not isinstance(env.get("id"), str) or not env["id"]:
        return "envelope id missing or empty"
    h = env.get("payload_hash")
    if not isinstance(h, str) or not _HASH_RE.fullmatch(h):
        return "envelope payload_hash is not 64 hex digits"
    return ""
