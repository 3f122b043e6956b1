"""Encode: a message record to the bytes of its tail line, and back.

A message line is a frame (see docs/FORMAT.md) whose rest is
``,"k":"m","r":<record JSON>,"s":<seq>}``: ``s`` is the store-wide append
sequence number, which orders unstamped messages across channels and tiers. The
record JSON starts with the five fields the
compiled scanner reads at positions the writer controls (``msg_id``,
``channel_id``, ``task_id``, ``hlc``, ``content``), which
``ConversationMessageRecord.to_dict()`` always puts first.

JSON is encoded with orjson (3-10x faster than the standard library on these
records, measured in bench/); the rare value orjson refuses (an integer wider
than 64 bits inside tool-call arguments) falls back to the standard library,
whose output orjson and the scanner read alike.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Callable, overload

import orjson

from . import _encode
from .errors import CorruptStateCheckpointError, RecordTooLargeError
from .records import (ConversationMessageRecord, _json_value, _stored_calls_ok, check_message_fields,
                      check_tool_calls, fast_canonical_json, message_canonical_json, message_from_stored,
                      _plain_calls)

__all__ = [
    "MAX_RECORD_BYTES",
    "MESSAGE_PREFIX",
    "TOMBSTONE_PREFIX",
    "BODY_START",
    "key",
    "dumps",
    "message_rest",
    "message_body",
    "message_body_and_hash",
    "encode_batch",
    "hash_canonical",
    "own_calls",
    "rest_from_body",
    "tombstone_rest",
    "decode_body",
    "loads_exact",
    "record_from_line",
]

#: The largest encoded record a store accepts (bytes of its JSON).
MAX_RECORD_BYTES = 8 * 1024 * 1024

MESSAGE_PREFIX = b',"k":"m","r":'
TOMBSTONE_PREFIX = b',"k":"d","r":'
#: A message line is 23 bytes of frame prefix, then MESSAGE_PREFIX, then the body.
BODY_START = 23 + len(MESSAGE_PREFIX)


def dumps(value: Any) -> bytes:
    """Compact JSON bytes of ``value`` (UTF-8, no ASCII escaping)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        # orjson refuses integers wider than 64 bits; the stdlib does not.
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")


def key(s: str) -> bytes:
    """The index key of an id, channel or task: its JSON-escaped UTF-8 bytes,
    exactly as they stand between the quotes in a tail line. ValueError
    naming the id for a str that is not valid UTF-8 (a lone surrogate: no
    such id can be stored)."""
    try:
        return orjson.dumps(s)[1:-1]
    except orjson.JSONEncodeError:
        if isinstance(s, str):
            raise ValueError(f"id {s!r} is not valid UTF-8 (a lone surrogate)") from None
        raise


def _check_finite(value: Any, field: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{field}: {value!r} is not a finite number and cannot be stored as JSON")


def message_rest(record: ConversationMessageRecord, seq: int) -> bytes:
    """The frame rest of ``record``'s tail line, with append sequence ``seq``."""
    return rest_from_body(message_body(record), seq)


def rest_from_body(body: bytes, seq: int) -> bytes:
    """The frame rest of a message line from its record JSON and sequence."""
    return b"".join((MESSAGE_PREFIX, body, b',"s":', str(seq).encode(), b"}"))


def message_body(record: ConversationMessageRecord) -> bytes:
    """The record JSON of a message line (the costly part, done outside locks).

    Raises ``RecordTooLargeError`` (naming the msg_id) past ``MAX_RECORD_BYTES``
    and ``ValueError`` for values JSON cannot hold exactly.
    """
    return _body(record, _stored_dict(record))


def message_body_and_hash(record: ConversationMessageRecord) -> tuple[bytes, str]:
    """:func:`message_body` and the record's ``payload_hash`` (sha256 of its
    canonical JSON) from one ``to_dict()``."""
    d = _stored_dict(record)
    return _body(record, d), hashlib.sha256(message_canonical_json(record, d)).hexdigest()


def _stored_dict(record: ConversationMessageRecord) -> dict:
    """``record.to_dict()`` as it is stored: its tool calls checked again (see
    records.check_tool_calls), a caller's later edit stored as the
    constructor would take it."""
    d = record.to_dict()
    if record.tool_calls:
        calls = check_tool_calls(record)
        if calls is not record.tool_calls:
            d["tool_calls"] = list(calls)
    return d


@overload
def encode_batch(msgs: list, *, defer_hash: bool = False, hash_job: None = None,
                 ) -> tuple[list[bytes], list, list[bytes]]: ...
@overload
def encode_batch(msgs: list, *, defer_hash: bool = False, hash_job: bool,
                 ) -> tuple[list[bytes], _encode.HashJob, list[bytes]]: ...


def encode_batch(msgs: list, *, defer_hash: bool = False,
                 hash_job: bool | None = None) -> tuple[list[bytes], Any, list[bytes]]:
    """``(bodies, hashes, keys)`` of a batch of records, what
    :func:`message_body_and_hash` and :func:`key` give for each, from the
    compiled encoder (``csrc/_encode.pyx``; about 6x faster). Anything but a
    ConversationMessageRecord (or a subclass's instance) raises TypeError
    naming its index. ``defer_hash``: ``hashes`` may hold a record's
    canonical JSON (bytes) in place of its hash, for :func:`hash_canonical`
    to turn into it later. ``hash_job`` (the append path): ``hashes`` is an
    ``_encode.HashJob`` whose ``result()`` is the list of hashes; it holds
    the canonical JSONs in one buffer and, if ``hash_job`` is true, hashes
    them in a C thread without the GIL from the end of the encoding on
    (OpenSSL's sha256 from the libcrypto hashlib loaded:
    ``_encode.compiled_sha256``; else hashlib's, at ``result()``)."""
    return _encode.encode_messages(msgs, ConversationMessageRecord, _encode_slow, _calls_json, defer_hash,
                                   hash_job)


#: ``hash_canonical(hashes) -> hashes``: the ``payload_hash`` of each
#: canonical JSON that ``encode_batch(..., defer_hash=True)`` left in
#: ``hashes``, in place (compiled: csrc/_encode.pyx).
hash_canonical: Callable[[list], list] = _encode.hash_canonical


def _copy_record(record: ConversationMessageRecord) -> ConversationMessageRecord:
    """own_calls' copy of a subclass's instance (the store caches an appended
    record as given): every slot of every class and the instance dict, if
    any, as they are; the tool calls as their stored JSON values, read-only."""
    cls = type(record)
    new = object.__new__(cls)
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(record, name):
                object.__setattr__(new, name, getattr(record, name))
    if hasattr(record, "__dict__"):
        new.__dict__.update(record.__dict__)
    calls = _encode.read_only_calls([_stored_value(c) for c in record.tool_calls])
    object.__setattr__(new, "tool_calls", calls)
    return new


def _stored_value(value: Any) -> Any:
    # the JSON value stored for a tool-call value (tuples as lists, Mappings as dicts), detached
    return _json_value("tool_calls", value)


def _calls_from_json(raw: bytes) -> tuple | None:
    """A line's non-empty tool-call list as :func:`message_from_stored` takes
    it from a fresh decode (for the compiled decoder); None: the Python path."""
    try:
        calls = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(calls) is list and calls and _stored_calls_ok(calls):
        return _encode.fresh_read_only_calls(calls)     # (read-only: the caches hand it out as it is)
    return None


def _encode_slow(record: ConversationMessageRecord) -> tuple[bytes, str, bytes]:
    # a record the compiled encoder does not spell (or one over the size limit,
    # or one whose fields were set past the constructor: checked again here)
    check_message_fields(record)
    body, h = message_body_and_hash(record)
    return body, h, key(record.msg_id)


def _calls_json(record: ConversationMessageRecord) -> tuple[bytes, bytes]:
    """The ``tool_calls`` value of a record's line JSON and of its canonical
    JSON (which the encoder splices in; JSON encoding is compositional).
    The common case -- plain dicts of values orjson spells as json does --
    is one check and two encodes; anything else is checked and spelled by
    check_tool_calls, dumps and fast_canonical_json."""
    calls = list(record.tool_calls)
    if _plain_calls(calls):
        try:
            return orjson.dumps(calls), orjson.dumps(calls, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:      # a lone surrogate, an int past 64 bits
            pass
    calls = list(check_tool_calls(record))
    return dumps(calls), fast_canonical_json(calls)


_encode.max_record_bytes = MAX_RECORD_BYTES
_encode.own_calls_setup(ConversationMessageRecord, _copy_record, _stored_value)

#: ``own_calls(records) -> records``: give every record whose tool calls
#: are not read-only a copy with read-only ones, in place (the list is
#: returned). The reads hand out records from their caches, and the dicts
#: inside ``tool_calls`` would be the one mutable part of a record: the
#: decoders and the append's cache make them read-only once
#: (:func:`_encode.read_only_calls`), so a read hands a cached record out as
#: it is (a check of each call's type); a copy (~0.3 us a record) is left
#: for a record that entered a cache another way. Compiled: csrc/_encode.pyx.
own_calls: Callable[[list], list] = _encode.own_calls


def _body(record: ConversationMessageRecord, d: dict) -> bytes:
    _check_finite(d["ts"], "ts")
    body = dumps(d)
    if len(body) > MAX_RECORD_BYTES:
        raise RecordTooLargeError(
            f"message {record.msg_id!r}: encoded size {len(body)} bytes exceeds the limit "
            f"of {MAX_RECORD_BYTES} bytes")
    return body


def tombstone_rest(msg_id: str, channel_id: str, hlc: str) -> bytes:
    """The frame rest of a deletion tombstone line."""
    body = dumps({"msg_id": msg_id, "channel_id": channel_id, "task_id": "",
                  "hlc": hlc, "content": ""})
    return TOMBSTONE_PREFIX + body + b"}"


def decode_body(body: bytes | memoryview, *, path: str, offset: int) -> dict:
    """Parse a record body; damage raises ``CorruptStateCheckpointError``."""
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise CorruptStateCheckpointError(f"record body is not valid JSON: {exc}",
                                          path=path, offset=offset) from None
    if not isinstance(d, dict):
        raise CorruptStateCheckpointError("record body is not a JSON object",
                                          path=path, offset=offset)
    r = d.get("r")
    if type(r) is dict and (r.get("tool_calls") or type(r.get("token_estimate")) is float) \
            and _has_long_number(body):
        # orjson reads an integer beyond 64 bits as a float; such a record was
        # written by json (see dumps), and json reads it back exactly
        try:
            d = json.loads(bytes(body))
        except ValueError as exc:
            raise CorruptStateCheckpointError(f"record body is not valid JSON: {exc}",
                                              path=path, offset=offset) from None
    return d


#: a run of digits that may be an integer beyond 64 bits
_LONG_NUMBER = re.compile(rb"\d{19}")


def loads_exact(data: bytes) -> Any:
    """A JSON document read as ``json.loads`` reads it (integers beyond 64
    bits exact): with orjson, unless a run of 19 digits may be one (orjson
    reads it as a float). ``ValueError`` if it is not JSON."""
    if _LONG_NUMBER.search(data) is None:
        return orjson.loads(data)
    return json.loads(data)


def _has_long_number(body: bytes | memoryview) -> bool:
    """Whether the numbers of a message line (``token_estimate`` and what
    follows it: the content, which comes before, is a string) hold a run of
    19 digits. The search starts at the record's own key, the first one: a
    tool call's arguments may hold another ``"token_estimate":`` after it."""
    b = body if type(body) is bytes else bytes(body)
    return _LONG_NUMBER.search(b, max(0, b.find(b'"token_estimate":'))) is not None


def record_from_line(line: bytes | memoryview, *, path: str, offset: int,
                     ) -> tuple[ConversationMessageRecord, int | None]:
    """Decode a verified message line (without its newline) into its record
    and append sequence number (None in lines written before it existed).
    A line spelled as the encoder spells it is read by the compiled decoder
    (``csrc/_encode.pyx``: no dict in between); any other goes through
    orjson and :func:`message_from_stored`, which name what is wrong."""
    hit = _encode.record_from_line(line, ConversationMessageRecord, _calls_from_json)
    if hit is not None:
        return hit
    d = decode_body(line, path=path, offset=offset)
    r = d.get("r")
    seq = d.get("s")
    if not isinstance(r, dict) or not (seq is None or type(seq) is int):
        raise CorruptStateCheckpointError("message line lacks its record or sequence",
                                          path=path, offset=offset)
    try:
        return message_from_stored(r, fresh_json=True), seq
    except (TypeError, ValueError, KeyError) as exc:
        raise CorruptStateCheckpointError(f"stored record does not validate: {exc}",
                                          path=path, offset=offset) from None
