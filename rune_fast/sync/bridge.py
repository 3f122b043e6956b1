"""The repository bridge: ops to and from the record dicts of
:class:`~rune_fast.conversation_state.ConversationMessageRecord`.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .clock import Hlc, _WALL_MAX
from .fold import Turn, _conv_of, _turn_from, fold
from .ops import OpRecord, Surface, as_op


log = logging.getLogger("rune_fast.sync")


# ------------------------------------------------------ repository bridge

# Payload keys that are not fields of a ConversationMessageRecord.
_PAYLOAD_ONLY = ("conversation_id", "tool_use_id", "timestamp")


def _stamp_of(ts: Any, origin: Any) -> Hlc:
    """``Hlc(round(ts*1000), 0, origin)`` for any record a store holds: the
    wall time clamped into the Hlc's range (a ts before 1970, or one given in
    milliseconds by mistake, or an infinite one), 0 for a ts that is no
    number (or NaN), and no device for an origin that is no str."""
    try:
        w = float(ts) * 1000
    except (TypeError, ValueError, OverflowError):
        w = 0.0
    wall = 0 if not w > 0 else _WALL_MAX if w >= _WALL_MAX else round(w)
    return Hlc(wall, 0, origin if isinstance(origin, str) else "")


def _record_hlc(hlc_s: str, ts: Any, origin: Any) -> Hlc:
    """A stored message's op stamp by the letter of section 7: its ``hlc``, or
    ``Hlc(round(ts*1000), 0, origin)`` when it has none. ``TypeError``,
    ``ValueError`` or ``OverflowError`` when the values cannot make one."""
    if hlc_s:
        return Hlc.parse(hlc_s)
    return Hlc(round(ts * 1000), 0, origin or "")


def record_stamp(hlc_s: str, ts: Any, origin: Any) -> Hlc:
    """The stamp :func:`op_from_record_dict` gives a stored message with
    ``lenient=True`` (without its warning): a store's place for the message
    in the fold order."""
    try:
        return _record_hlc(hlc_s, ts, origin)
    except (TypeError, ValueError, OverflowError):
        return _stamp_of(ts, origin)


def stamp_key(hlc_s: str, ts: Any, origin: Any) -> tuple:
    """``tuple(record_stamp(hlc_s, ts, origin))``, the plain tuple a sort
    compares in C, made without an Hlc for the usual message with no
    ``hlc`` (a float ``ts`` whose wall time lies in the Hlc's range, a str
    ``origin``): ~0.2 against ~1.5 us, for the reads that key every
    message of a channel or file by its stamp."""
    if not hlc_s and type(ts) is float and type(origin) is str:
        w = ts * 1000
        if 0 < w < _WALL_MAX:       # (NaN fails both; round(w) then lies in range)
            return (round(w), 0, origin)
    return tuple(record_stamp(hlc_s, ts, origin))


#: What Hlc.parse takes (and nothing else): such a string sorts as text
#: exactly like its stamp.
_CANONICAL_HLC = r"^[0-9]{15}-[0-9]{10}-"


def stamp_walls(hlc: Any, ts: Any) -> np.ndarray:
    """The wall time of each row's stamp (``record_stamp(h, t, o)[0]``)
    within a millisecond, for the rows of an ``hlc`` Arrow string array
    and a ``ts`` float64 array: a canonical ``hlc``'s own, exactly; else
    its ``ts``'s, clamped as the stamp clamps it and not yet rounded
    (rounding moves it by at most one; NaN: 0). float64."""
    import pyarrow as pa
    import pyarrow.compute as pc

    with np.errstate(invalid="ignore", over="ignore"):
        w = np.asarray(ts, dtype=np.float64) * 1000.0
        walls = np.where(w > 0, np.minimum(w, float(_WALL_MAX)), 0.0)     # (NaN: 0)
    canon = pc.match_substring_regex(hlc, _CANONICAL_HLC).to_numpy(zero_copy_only=False)
    if canon.any():
        at = np.flatnonzero(canon)
        walls[at] = pc.cast(pc.utf8_slice_codeunits(hlc.take(at), 0, 15), pa.int64()).to_numpy()
    return walls


def newest_stamp(hlc: Any, ts: Any, origin: Any) -> tuple:
    """``max(tuple(record_stamp(h, t, o)))`` over the rows of three columns
    (``hlc`` and ``origin`` Arrow string arrays, ``ts`` float64), ``()``
    for no rows, without a Python step a row: only the rows whose stamp's
    wall time lies within two milliseconds of the largest
    (:func:`stamp_walls`) are keyed."""
    if len(hlc) == 0:
        return ()
    walls = stamp_walls(hlc, ts)
    near = np.flatnonzero(walls >= walls.max() - 2.0)
    t = np.asarray(ts, dtype=np.float64)
    return max(stamp_key(h, t_, o) for h, t_, o in zip(hlc.take(near).to_pylist(), t[near].tolist(),
                                                       origin.take(near).to_pylist()))


def op_from_record_dict(d: Any, *, lenient: bool = False) -> OpRecord:
    """The op of a stored message (SPEC section 7): ``op_id = msg_id``,
    ``hlc`` = the record's ``hlc`` or ``Hlc(round(ts*1000), 0, origin)`` when
    it has none, payload = the record dict plus ``conversation_id``
    (= ``channel_id``), ``role``, ``content``, ``tool_calls``,
    ``tool_use_id`` (= ``tool_call_id``) and ``timestamp`` (= ``ts``).

    ``d`` is ``record.to_dict()`` (or a record with ``to_dict()``); a missing
    key raises ``ValueError`` naming it, a malformed ``hlc`` ``ValueError``
    naming the message -- or, with ``lenient`` (a store exporting what it
    holds: a record may carry any string as its ``hlc`` and any float as its
    ``ts``), a warning naming the message, and the op stamped as if the
    record had no ``hlc``, its wall time clamped into the Hlc's range."""
    if not isinstance(d, Mapping):
        to_dict = getattr(d, "to_dict", None)
        if to_dict is None:
            raise TypeError(f"expected a record dict or record, got {type(d).__name__}")
        d = to_dict()
    try:
        msg_id = d["msg_id"]
        channel_id = d["channel_id"]
        ts = d["ts"]
    except KeyError as e:
        raise ValueError(f"record dict lacks {e.args[0]!r}") from None
    try:
        hlc = _record_hlc(d.get("hlc") or "", ts, d.get("origin"))
    except (TypeError, ValueError, OverflowError) as e:
        if not lenient:
            raise ValueError(f"message {msg_id!r}: {e}") from None
        hlc = _stamp_of(ts, d.get("origin"))
        log.warning("message %r: %s; its op is stamped %s instead", msg_id, e, hlc)
    payload = dict(d)
    payload["conversation_id"] = channel_id
    payload["role"] = d.get("role", "")
    payload["content"] = d.get("content", "")
    payload["tool_calls"] = [dict(c) for c in (d.get("tool_calls") or ())]
    payload["tool_use_id"] = d.get("tool_call_id") or ""
    payload["timestamp"] = ts
    return OpRecord(msg_id, hlc, payload)


def _key_order(keys: list[tuple]) -> list[int]:
    """The positions of ``keys`` (``(wall_ms, counter, device_id, op_id)``
    tuples, unique) in sorted order. A large list is sorted by numpy on the
    two ints, then each run of equal ints by the whole tuples: Python's sort
    of 1,000,000 such tuples took 1.8 s in one C call that never lets
    another thread run (a writer's appends beside an export waited for it);
    this takes ~0.2 s."""
    n = len(keys)
    if n < _NUMPY_SORT_MIN:
        return sorted(range(n), key=keys.__getitem__)
    wall = np.fromiter((k[0] for k in keys), dtype=np.int64, count=n)
    counter = np.fromiter((k[1] for k in keys), dtype=np.int64, count=n)
    order = np.lexsort((counter, wall))
    wall, counter = wall[order], counter[order]
    tie = np.flatnonzero((wall[1:] == wall[:-1]) & (counter[1:] == counter[:-1]))
    out: list[int] = order.tolist()
    if len(tie):
        # tie[j]: positions tie[j] and tie[j] + 1 share their ints; a run of
        # consecutive ones is one group, sorted by the tuples
        first = np.flatnonzero(np.diff(tie, prepend=-2) != 1)
        last = np.append(first[1:], len(tie)) - 1
        for a, b in zip(tie[first].tolist(), (tie[last] + 2).tolist()):
            out[a:b] = sorted(out[a:b], key=keys.__getitem__)
    return out


def export_ops_of(records: Iterable[Any], tombstones: Iterable[OpRecord],
                  since: Hlc | None = None, *, consume: bool = False) -> list[OpRecord]:
    """A store's ``export_ops``: the op of each stored record (exactly what
    ``op_from_record_dict(record.to_dict(), lenient=True)`` makes of it)
    and the ``tombstones`` given, those stamped after ``since`` only
    (exclusive), ordered by ``(hlc, op_id)``.

    Each record's stamp is worked out and compared before its op is made
    (an export since a recent stamp makes few), and the order compares
    plain tuples ``(wall_ms, counter, device_id, op_id)``: an Hlc orders
    like that tuple but compares through Python methods (a sort of
    1,000,000 ops made ~20,000,000 such calls).

    ``consume`` (``records`` a list the caller gives up): a list is
    emptied once read, and each record let go as its op is made, so that
    the records, stamps and sort keys of a whole store are freed a few
    thousand at a time while the ops are built rather than all at once
    when the call returns -- one C call holding the GIL that stalled a
    writer's appends beside a 1,000,000-message export by 0.28-0.34 s."""
    after = None if since is None else tuple(since)
    keys: list[tuple] = []          # (plain tuples: no entry tuple a record, fewer objects to collect)
    items: list[Any] = []
    stamps: list[Hlc | None] = []
    for rec in records:
        h: Hlc | None
        try:
            at = h = _record_hlc(rec.hlc, rec.ts, rec.origin)
            item, oid = rec, rec.msg_id
        except (TypeError, ValueError, OverflowError):
            item = op_from_record_dict(rec.to_dict(), lenient=True)    # (made now: its warning names the message)
            h, at, oid = None, item.hlc, item.op_id
        if after is None or _TUPLE_GT(at, after):
            keys.append((*at, oid))
            items.append(item)
            stamps.append(h)
    if consume and isinstance(records, list):
        _release(records)       # (those kept live on in items)
    for op in tombstones:
        if after is None or _TUPLE_GT(op.hlc, after):
            keys.append((*op.hlc, op.op_id))
            items.append(op)
            stamps.append(None)
    order = _key_order(keys)
    _release(keys)
    out: list[OpRecord] = []
    for i in order:
        h = stamps[i]
        out.append(items[i] if h is None else _record_op(items[i], h))
        if consume:
            items[i] = stamps[i] = None
    return out


def _release(objs: list) -> None:
    """Empty ``objs`` ``_RELEASE_PART`` items at a time, from its end:
    what only it held is freed by a C call per part, between which other
    threads get the GIL."""
    while objs:
        del objs[-_RELEASE_PART:]


def _record_op(rec: Any, hlc: Hlc) -> OpRecord:
    """:func:`op_from_record_dict` of ``rec.to_dict()`` stamped ``hlc``,
    without copying the fresh dict again (its payload: the same keys,
    values and order)."""
    d = rec.to_dict()
    d["conversation_id"] = d["channel_id"]
    if d["tool_calls"]:
        d["tool_calls"] = [dict(c) for c in d["tool_calls"]]
    d["tool_use_id"] = d["tool_call_id"] or ""
    d["timestamp"] = d["ts"]
    return _OP_NEW(OpRecord, (d["msg_id"], hlc, d))


_TUPLE_GT = tuple.__gt__
#: below this many ops an export sorts them in Python (see _key_order)
_NUMPY_SORT_MIN = 4096
#: objects freed by one C call when an export lets its lists go (see _release)
_RELEASE_PART = 8192
_OP_NEW = tuple.__new__


def record_dict_from_op(op: Any) -> dict[str, Any] | None:
    """The message record dict an op carries, for a store to write on merge;
    ``None`` for a tombstone or an op of another surface.

    An op made by :func:`op_from_record_dict` gives back exactly the record
    dict it was made from. Any other conversation op (a legacy or foreign
    payload) gives a record dict built from its payload: ``msg_id = op_id``,
    ``channel_id = conversation_id``, ``ts = timestamp`` (else the hlc's wall
    time), ``tool_call_id = tool_use_id``, ``hlc = str(op.hlc)``, ``origin``
    its device id."""
    op = as_op(op)
    if op.surface is not Surface.CONVERSATION:
        return None
    p = op.payload
    if p.get("deleted") is True:
        return None
    if "msg_id" in p:
        return {k: v for k, v in p.items() if k not in _PAYLOAD_ONLY}
    t = _turn_from(op.op_id, op.hlc, _conv_of(p), p)
    role = str(t.role) if t is not None else "system"
    ts = t.timestamp if t is not None else p.get("timestamp", p.get("ts"))
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        ts = op.hlc.wall_ms / 1000.0
    content = t.content if t is not None else (p.get("content") or p.get("text") or "")
    return {"msg_id": op.op_id, "ts": float(ts), "role": role, "content": content,
            "channel_id": _conv_of(p),
            "tool_calls": [dict(c) for c in t.tool_calls] if t is not None else [],
            "tool_call_id": t.tool_use_id if t is not None else "",
            "origin": op.hlc.device_id, "hlc": str(op.hlc)}


def turns_from_records(record_dicts: Iterable[Any],
                       conversation_id: str | None = None) -> list[Turn]:
    """The folded transcript of stored messages (records or their dicts).
    ``conversation_id`` defaults to the channel of the first record."""
    ops = [op_from_record_dict(d) for d in record_dicts]
    if conversation_id is None:
        if not ops:
            return []
        conversation_id = _conv_of(ops[0].payload)
    return fold(ops, conversation_id)
