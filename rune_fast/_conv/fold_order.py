"""A channel's fold-order verdict from its archived rows' stamp columns,
in array steps (:func:`fold_state`): what ``Exchange._fold_consistent``
works out once per channel and process. The loop it stands for keys
every message (~6 us each: 0.75 s for a channel of 122,500 messages at
1,000,000); the arrays read the same answer from the columns (~80 ms
with their pages' reads).

The store order puts the unstamped messages first (the archived ones by
``ord``, then the hot ones in their order), then the stamped ones by
``(hlc, msg_id)``. The fold order keys a message by ``(its stamp,
msg_id)``: a canonical ``hlc`` parsed (its text sorts exactly like that
stamp), or ``(round(ts * 1000), 0, origin)`` without one. So the stamped
messages, all canonical, stand in the fold order among themselves
whatever their number; what is left to check is the unstamped run (the
wall times must not fall; equal ones compare ``(origin, msg_id)``) and
the one step from it to the first stamped message."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import sync as _sync
from ..cool.keys import StampArrays
from ..sync.bridge import _CANONICAL_HLC, stamp_walls
from ..sync.clock import _WALL_MAX

_CANONICAL = re.compile(_CANONICAL_HLC)


def fold_state(hot: list[tuple[str, str, str, tuple]], cool: StampArrays,
               deleted: Any = ()) -> list | None:
    """``[verdict, fold key of the last message, (hlc, msg_id) of the last
    stamped one]`` of a channel, as ``Exchange._fold_consistent``'s loop
    makes it over the store order (only the verdict when it is False).
    ``hot``: ``(hlc, msg_id, role, fold key)`` of each hot message in the
    hot order; ``cool``: the archived rows' columns; ``deleted``: msg_ids
    whose archived rows are left out. None when the columns hold what only
    the loop decides: a null, a stamp that is not canonical, a wall time
    outside the Hlc's range."""
    if any(a.null_count for a in (cool.mid, cool.hlc, cool.origin, cool.role)):
        return None
    mid, hlc, origin = cool.mid, cool.hlc, cool.origin
    stamped = pc.not_equal(pc.binary_length(hlc), 0).to_numpy(zero_copy_only=False)
    system = pc.equal(cool.role, "system").to_numpy(zero_copy_only=False)
    live = _not_deleted(cool, deleted)
    if (live & stamped).any():
        canon = pc.match_substring_regex(hlc, _CANONICAL_HLC).to_numpy(zero_copy_only=False)
        if (live & stamped & ~canon).any():
            return None
    if any(h and not _CANONICAL.match(h) for h, _m, _r, _k in hot):
        return None
    # the unstamped archived rows in the store order: by ord
    plain = np.flatnonzero(live & ~stamped)
    # (stable: rows that share an ord keep the columns' order, as the loop's sort)
    order = plain[np.argsort(cool.ord[plain], kind="stable")]
    run = order[~system[order]]
    state: list = [True, None, None]
    if len(run):
        with np.errstate(invalid="ignore", over="ignore"):
            w = cool.ts[run] * 1000.0
            if not ((w > 0) & (w < _WALL_MAX)).all():
                return None
        step = np.diff(np.rint(w).astype(np.int64))
        if (step < 0).any():
            return [False, None, None]
        ties = np.flatnonzero(step == 0)
        if len(ties):
            # (UTF-8 bytes compare as the str's code points: as Python compares them)
            a, b = run[ties], run[ties + 1]
            o1, o2, m1, m2 = origin.take(a), origin.take(b), mid.take(a), mid.take(b)
            back = pc.or_(pc.less(o2, o1), pc.and_(pc.equal(o2, o1), pc.less(m2, m1)))
            if pc.any(back).as_py():
                return [False, None, None]
        last = int(run[-1])
        m = mid[last].as_py()
        state[1] = (_sync.record_stamp("", float(cool.ts[last]), origin[last].as_py()), m)
    # the unstamped hot messages follow, in the hot order
    for h, m, role, k in hot:
        if h or role == "system":
            continue
        if state[1] is not None and k < state[1]:
            return [False, None, None]
        state[1] = k
    # the stamped ones: the first (not a system message) must not sort
    # before the unstamped run's last, the last of them keys what follows
    rows = np.flatnonzero(live & stamped)
    talk = rows[~system[rows]]
    said = [(h, m) for h, m, role, _k in hot if h and role != "system"]
    if said or len(talk):
        first = min(said + _ends(hlc, mid, talk, "min"))
        k = (_sync.record_stamp(first[0], 0.0, ""), first[1])
        if state[1] is not None and k < state[1]:
            return [False, None, None]
        newest = max(said + _ends(hlc, mid, talk, "max"))
        state[1] = (_sync.record_stamp(newest[0], 0.0, ""), newest[1])
    stamps = [(h, m) for h, m, _role, _k in hot if h] + _ends(hlc, mid, rows, "max")
    if stamps:
        state[2] = max(stamps)
    return state


def _not_deleted(cool: StampArrays, deleted: Any) -> np.ndarray:
    """Whether each archived row's msg_id is not one of ``deleted``."""
    if not deleted or not len(cool.mid):
        return np.ones(len(cool.mid), dtype=bool)
    return ~pc.is_in(cool.mid, value_set=pa.array(list(deleted), pa.string())).to_numpy(zero_copy_only=False)


def _ends(hlc: pa.Array, mid: pa.Array, rows: np.ndarray, end: str) -> list[tuple[str, str]]:
    """``[min or max of (hlc, msg_id)]`` (``end``) over the archived rows
    ``rows`` ([] for none)."""
    if not len(rows):
        return []
    h = hlc.take(rows)
    top = pc.min_max(h)[end].as_py()
    at = rows[np.flatnonzero(pc.equal(h, top).to_numpy(zero_copy_only=False))]
    pick = min if end == "min" else max
    return [pick(zip(hlc.take(at).to_pylist(), mid.take(at).to_pylist()))]


def newest_candidates(cool: StampArrays, k: int, deleted: Any = ()) -> tuple[list[tuple], bool]:
    """``(rows, cut)``: the rows (``CoolArchive.channel_stamps``' tuples, in their order)
    among which the ``k`` newest by stamp of the channel's archived
    messages are, system messages and ``deleted`` msg_ids left out: every
    row whose wall time (a canonical ``hlc``'s, else its ``ts``'s, clamped
    as the stamp clamps it) lies within two milliseconds of the k-th
    newest's (rounding moves it by at most one). The caller keys just
    these by their stamps (0.33 s -> ~40 ms for a channel of 122,500).
    ``cut``: whether rows were left out."""
    live = _not_deleted(cool, deleted) & ~pc.equal(cool.role, "system").to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(live)
    total = len(rows)
    if len(rows) > k > 0:
        wall = stamp_walls(cool.hlc.take(rows), cool.ts[rows])
        kth = np.partition(wall, len(rows) - k)[len(rows) - k]
        rows = rows[wall >= kth - 2.0]
    elif k <= 0:
        rows = rows[:0]
    cols = [c.take(rows).to_pylist() for c in (cool.mid, cool.hlc, cool.origin, cool.role)]
    return (list(zip(cool.locs[rows].tolist(), *cols, cool.ts[rows].tolist(), cool.ord[rows].tolist())),
            len(rows) < total)
