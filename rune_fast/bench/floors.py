"""The plain loops the comparison measures beside both stores: the floor of
each operation on this machine, in the same run.

:class:`ContentBuffer` holds every message's content bytes in ONE ``bytes``
buffer (messages separated by a NUL byte) with their offsets, and the
channel, task and id maps of message numbers. Its loops do no decoding and no
checking: a window is 8 slices of the buffer, a task one slice per message, a
search a scan of the needle's UTF-8 over the whole buffer, exact case: glibc's
``memmem`` called through ctypes once per occurrence, and CPython's
``bytes.count`` (its fastsearch, in C); :meth:`ContentBuffer.scan_ns` times
both and reports the faster, the floor of a scan of the same content bytes.
"""
from __future__ import annotations

import ctypes
import gc
import time
from array import array
from typing import Any, Callable, Sequence

try:
    import orjson as _json_mod

    _loads: Callable[[bytes], Any] = _json_mod.loads
except ImportError:  # pragma: no cover - orjson ships with rune_fast
    import json as _json_std

    _loads = _json_std.loads

from . import workload as wl

__all__ = ["ContentBuffer", "hit_lines", "decoder"]


class ContentBuffer:
    """Every message's content bytes in one buffer, with the maps the plain loops read."""

    def __init__(self, messages: Sequence[dict[str, Any]]) -> None:
        parts: list[bytes] = []
        offs = array("q", [0])
        pos = 0
        by_channel: dict[str, array] = {}
        by_task: dict[str, array] = {}
        by_id: dict[str, int] = {}
        for i, m in enumerate(messages):
            b = m["content"].encode("utf-8")
            parts.append(b)
            pos += len(b) + 1
            offs.append(pos)
            by_channel.setdefault(m["channel_id"], array("l")).append(i)
            if m["task_id"]:
                by_task.setdefault(m["task_id"], array("l")).append(i)
            by_id[m["msg_id"]] = i
        self.buf = b"\0".join(parts) + b"\0"
        self.offs = offs
        self.by_channel = by_channel
        self.by_task = by_task
        self.by_id = by_id
        self.content_bytes = len(self.buf) - len(messages)
        self._memmem = _libc_memmem()
        # c_char_p of a bytes object points into it (no copy); self.buf keeps it alive
        self._cbuf = ctypes.c_char_p(self.buf)
        self._base = ctypes.cast(self._cbuf, ctypes.c_void_p).value or 0

    def _slice(self, i: int) -> bytes:
        return self.buf[self.offs[i]:self.offs[i + 1] - 1]

    def window(self, channel_id: str, n: int = 8) -> list[bytes]:
        buf, offs = self.buf, self.offs
        return [buf[offs[i]:offs[i + 1] - 1] for i in self.by_channel.get(channel_id, ())[-n:]]

    def get(self, msg_id: str) -> bytes | None:
        i = self.by_id.get(msg_id)
        return None if i is None else self._slice(i)

    def task(self, task_id: str) -> list[bytes]:
        buf, offs = self.buf, self.offs
        return [buf[offs[i]:offs[i + 1] - 1] for i in self.by_task.get(task_id, ())]

    def scan(self, needle: str) -> int:
        """Occurrences of the folded needle's UTF-8 in the buffer: one C scan of every content byte."""
        return self.buf.count(needle.casefold().encode("utf-8"))

    def memmem_count(self, needle: str) -> int:
        """The same count through glibc ``memmem``, one call per occurrence (-1 without glibc)."""
        mm = self._memmem
        if mm is None:
            return -1
        nb = needle.casefold().encode("utf-8")
        base, size, k = self._base, len(self.buf), len(nb)
        n = pos = 0
        while True:
            hit = mm(base + pos, size - pos, nb, k)
            if not hit:
                return n
            n += 1
            pos = hit - base + k

    def scan_ns(self, needle: str) -> float:
        """Nanoseconds of the faster of :meth:`memmem_count` and :meth:`scan` (GC off)."""
        gc_was = gc.isenabled()
        gc.disable()
        try:
            best = float("inf")
            for fn in (self.memmem_count, self.scan):
                t0 = time.perf_counter_ns()
                if fn(needle) < 0:
                    continue
                best = min(best, time.perf_counter_ns() - t0)
        finally:
            if gc_was:
                gc.enable()
        return best


def _libc_memmem() -> Any:
    try:
        fn = ctypes.CDLL(None).memmem
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    return fn


def hit_lines(messages: Sequence[dict[str, Any]], needle: str) -> list[bytes]:
    """The canonical JSON lines of the messages ``needle`` finds (str.casefold rule)."""
    folded = needle.casefold()
    return [wl.json_line(m) for m in messages if folded in m["content"].casefold()]


def decoder(record_type: Any) -> Callable[[bytes], Any]:
    """JSON line -> record, the cheapest decoding of a stored message into what a read returns."""
    from_dict = getattr(record_type, "from_dict", None)
    if from_dict is None:
        return _loads
    return lambda line: from_dict(_loads(line))
