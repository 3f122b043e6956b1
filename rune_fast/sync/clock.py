"""Hybrid logical clocks: the :class:`Hlc` stamp every op carries and the
thread-safe :class:`HlcClock` a device stamps its own ops with.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple


_WALL_MAX = 10**15 - 1      # 15 decimal digits in the string form
_COUNTER_MAX = 10**10 - 1   # 10 decimal digits in the string form


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------- HLC


class _HlcFields(NamedTuple):
    wall_ms: int
    counter: int
    device_id: str


class Hlc(_HlcFields):
    """A hybrid logical clock stamp: ``Hlc(wall_ms, counter, device_id)``.

    Immutable and hashable; ordered by the tuple ``(wall_ms, counter,
    device_id)``, and equal to (and ordered consistently with) its string. ``str(hlc)`` is ``"%015d-%010d-%s" % (wall_ms, counter,
    device_id)``, which sorts as text exactly like the tuple, and
    :meth:`parse` reads it back. ``wall_ms`` must lie in ``0 .. 10**15-1`` and
    ``counter`` in ``0 .. 10**10-1`` (so the string form keeps its widths);
    ``device_id`` is any str, possibly empty (messages with no ``origin``).
    Bad fields raise ``TypeError``/``ValueError`` naming the field.
    """

    __slots__ = ()

    def __new__(cls, wall_ms: int, counter: int, device_id: str) -> Hlc:
        if type(wall_ms) is not int:
            if isinstance(wall_ms, bool) or not isinstance(wall_ms, int):
                raise TypeError(f"Hlc.wall_ms must be an int, got {wall_ms!r}")
            wall_ms = int(wall_ms)
        if type(counter) is not int:
            if isinstance(counter, bool) or not isinstance(counter, int):
                raise TypeError(f"Hlc.counter must be an int, got {counter!r}")
            counter = int(counter)
        if not isinstance(device_id, str):
            raise TypeError(f"Hlc.device_id must be a str, got {device_id!r}")
        if not 0 <= wall_ms <= _WALL_MAX:
            raise ValueError(f"Hlc.wall_ms out of range 0..{_WALL_MAX}: {wall_ms}")
        if not 0 <= counter <= _COUNTER_MAX:
            raise ValueError(f"Hlc.counter out of range 0..{_COUNTER_MAX}: {counter}")
        return tuple.__new__(cls, (wall_ms, counter, str(device_id)))

    def __str__(self) -> str:
        return "%015d-%010d-%s" % self

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    # An Hlc and its string form are interchangeable (SPEC: "hlc an Hlc or its
    # string"): they compare equal, hash alike, and order consistently, since
    # the string sorts like the tuple.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self == other
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self != other
        return tuple.__ne__(self, other)

    def __hash__(self) -> int:
        return hash("%015d-%010d-%s" % self)

    def __lt__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self < other
        # (typeshed wants a tuple here; any other object gives NotImplemented, as it should)
        return tuple.__lt__(self, other)  # type: ignore[operator]

    def __le__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self <= other
        # (typeshed wants a tuple here; any other object gives NotImplemented, as it should)
        return tuple.__le__(self, other)  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self > other
        # (typeshed wants a tuple here; any other object gives NotImplemented, as it should)
        return tuple.__gt__(self, other)  # type: ignore[operator]

    def __ge__(self, other: object) -> bool:
        if isinstance(other, str):
            return "%015d-%010d-%s" % self >= other
        # (typeshed wants a tuple here; any other object gives NotImplemented, as it should)
        return tuple.__ge__(self, other)  # type: ignore[operator]

    @classmethod
    def parse(cls, s: str | Hlc) -> Hlc:
        """Read back ``str(hlc)``. An :class:`Hlc` is returned as it is.

        Raises ``ValueError`` naming the input if it is not exactly 15 ASCII
        digits, ``-``, 10 ASCII digits, ``-``, and the device id (``TypeError``
        for a non-str).
        """
        if type(s) is Hlc:
            return s
        if not isinstance(s, str):
            if isinstance(s, Hlc):
                return tuple.__new__(Hlc, tuple(s))
            raise TypeError(f"Hlc.parse expects a str, got {type(s).__name__}: {s!r}")
        w = s[:15]
        c = s[16:26]
        if (len(s) < 27 or s[15] != "-" or s[26] != "-" or not w.isdigit()
                or not c.isdigit() or not w.isascii() or not c.isascii()):
            raise ValueError(f"malformed hlc {s!r}: expected "
                             "'<15 digits>-<10 digits>-<device_id>'")
        return tuple.__new__(Hlc, (int(w), int(c), s[27:]))


def _as_hlc(h: Any) -> Hlc:
    t = type(h)
    if t is Hlc:
        return h
    if t is str:
        return Hlc.parse(h)
    if isinstance(h, Hlc):
        return tuple.__new__(Hlc, tuple(h))
    if isinstance(h, str):
        return Hlc.parse(str(h))
    if isinstance(h, (tuple, list)) and len(h) == 3:
        return Hlc(*h)
    raise TypeError(f"hlc must be an Hlc or its string form, got {h!r}")


class HlcClock:
    """A hybrid logical clock for one device (thread-safe).

    ``now()`` stamps a local event; ``observe(remote)`` merges a stamp seen on
    another device (an :class:`Hlc` or its string) and returns the stamp of the
    receive event. Every stamp returned is strictly greater than every stamp
    this clock returned or observed before, whatever the wall clock does: when
    the wall clock stands still or goes backwards the counter advances instead
    (and if the counter would overflow its 10 digits, ``wall_ms`` moves on by
    one). ``wall`` is the millisecond wall clock (injectable for tests).
    """

    __slots__ = ("_device_id", "_wall", "_l", "_c", "_lock", "_issued", "_nows")

    def __init__(self, device_id: str, *, wall: Callable[[], int] | None = None) -> None:
        if not isinstance(device_id, str):
            raise TypeError(f"HlcClock device_id must be a str, got {device_id!r}")
        self._device_id = device_id
        self._wall = wall if wall is not None else _wall_ms
        self._l = 0
        self._c = 0
        self._issued = False
        self._nows = 0      # stamps now() returned (see ``nows``)
        self._lock = threading.Lock()

    @property
    def device_id(self) -> str:
        return self._device_id

    @property
    def last(self) -> Hlc | None:
        """The latest stamp returned or observed, or ``None`` before any."""
        with self._lock:
            if not self._issued:
                return None
            return tuple.__new__(Hlc, (self._l, self._c, self._device_id))

    @property
    def last_wall(self) -> int:
        """``wall_ms`` of the latest stamp returned or observed (0 before
        any): every later stamp is after any stamp of an earlier wall time.
        Read without the lock (it only grows)."""
        return self._l

    def pass_wall(self, wall_ms: int) -> None:
        """Make every later stamp of this clock sort after every stamp of
        ``wall_ms`` with counter 0, whatever its device (the stamp section 7
        gives an unstamped message), without issuing one: a cheaper
        ``observe`` for a store's appends."""
        if not 0 <= wall_ms <= _WALL_MAX:
            raise ValueError(f"HlcClock.pass_wall: {wall_ms!r} is outside 0..10**15-1")
        with self._lock:
            if wall_ms > self._l:
                # the next stamp is (wall_ms, 1) or a later wall time
                self._l, self._c, self._issued = wall_ms, 0, True

    def _read_wall(self) -> int:
        pt = self._wall()
        if type(pt) is not int:
            if isinstance(pt, bool) or not isinstance(pt, (int, float)) or pt != pt:
                raise TypeError(f"HlcClock wall() must return milliseconds as a number, "
                                f"got {pt!r}")
            pt = int(pt)
        # A wall clock before the epoch (or absurdly far ahead) cannot be
        # written in the string form; the logical part carries on regardless.
        return min(max(pt, 0), _WALL_MAX)

    def _stamp(self, l: int, c: int) -> Hlc:
        if c > _COUNTER_MAX:
            l, c = l + 1, 0
            if l > _WALL_MAX:
                raise ValueError("HlcClock exhausted: wall_ms past 10**15-1")
        self._l, self._c, self._issued = l, c, True
        return tuple.__new__(Hlc, (l, c, self._device_id))

    @property
    def nows(self) -> int:
        """How many stamps :meth:`now` returned: a store keeps the clock on
        disk when a caller may hold one that nothing stored carries."""
        return self._nows

    def now(self) -> Hlc:
        """Stamp a local event (send): strictly after everything seen so far."""
        with self._lock:
            self._nows += 1
            pt = self._read_wall()
            if pt > self._l:
                return self._stamp(pt, 0)
            return self._stamp(self._l, self._c + 1)

    def now_many(self, k: int) -> list[Hlc]:
        """``k`` stamps, as ``k`` calls of :meth:`now` in a row would give
        them with the wall clock read once (the batch's events happen at
        one moment): a deletion of 123,000 messages stamped each one by
        a call (~3 us, the wall read and the lock each time)."""
        out: list[Hlc] = []
        with self._lock:
            self._nows += k
            pt = self._read_wall()
            for _ in range(k):
                if pt > self._l:
                    out.append(self._stamp(pt, 0))
                else:
                    out.append(self._stamp(self._l, self._c + 1))
        return out

    def observe(self, remote: Hlc | str) -> Hlc:
        """Merge a remote stamp (receive) and return the receive event's stamp,
        strictly after ``remote`` and after every earlier stamp of this clock.
        A malformed string raises ``ValueError`` naming it."""
        r = _as_hlc(remote)
        with self._lock:
            pt = self._read_wall()
            l, c = self._l, self._c
            lm, cm = r[0], r[1]
            nl = max(l, lm, pt)
            if nl == l and nl == lm:
                nc = max(c, cm) + 1
            elif nl == l:
                nc = c + 1
            elif nl == lm:
                nc = cm + 1
            else:
                nc = 0
            return self._stamp(nl, nc)

    def __repr__(self) -> str:
        return f"HlcClock({self._device_id!r}, last={self.last})"
