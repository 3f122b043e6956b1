"""How the SQLite comparison times a line: loops with the collector off,
jobs interleaved slice by slice so that a burst of load on a shared machine
falls on every side alike, medians of the repeats, and the rows they make."""
from __future__ import annotations

import gc
import math
import statistics
import time
from typing import Any, Callable, Sequence

from .report import Row

__all__ = ["timed", "interleaved", "median", "time_row", "Loops"]


def timed(fn: Callable[[Any], Any], items: Sequence[Any]) -> float:
    """Nanoseconds per call of ``fn(item)`` over ``items``, GC off."""
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for item in items:
            fn(item)
        t1 = time.perf_counter_ns()
    finally:
        if gc_was:
            gc.enable()
    return (t1 - t0) / max(1, len(items))


def interleaved(jobs: dict[str, Callable[[int], float]], repeats: int, warmup: bool = True,
                slices: int = 1) -> dict[str, list[float]]:
    """Per repeat, run each job ``slices`` times, alternating between jobs; returns ns/op per repeat.

    ``job(i)`` does one slice of a repeat's work and returns its ns/op; a
    repeat's value is the mean over its equal-sized slices. Jobs take turns in
    a rotating order, slice by slice, so that a burst of load from other
    processes on a shared machine falls on every side alike. With ``warmup``,
    every job first runs once untimed (``i = -1``).
    """
    if warmup:
        for job in jobs.values():
            job(-1)
    names = list(jobs)
    out: dict[str, list[float]] = {name: [] for name in jobs}
    for i in range(repeats):
        gc.collect()
        acc: dict[str, list[float]] = {name: [] for name in jobs}
        for j in range(slices):
            shift = (i * slices + j) % len(names)
            order = names[shift:] + names[:shift]
            if (i + j) % 2:
                order.reverse()
            for name in order:
                acc[name].append(jobs[name](i))
        for name in names:
            out[name].append(statistics.fmean(acc[name]))
    return out


def median(xs: Sequence[float | None]) -> float | None:
    ys = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(ys) if ys else None


def time_row(key: str, op: str, res: dict[str, list[float]], vs: str, target: str,
             min_ratio: float | None, *, rune: str = "rune", other: str | None = "sql",
             base: str | None = None, base_vs: str = "", max_base_ratio: float | None = None) -> Row:
    """A row of medians from ``interleaved`` results.

    ``min_ratio``: the target as SQLite / rune_fast at least this;
    ``max_base_ratio``: rune_fast / plain loop at most this. ``met`` needs both
    (where given)."""
    r = median(res[rune])
    o = median(res[other]) if other else None
    b = median(res[base]) if base else None
    row = Row(key, op, r, o, "ns", vs, target, samples_rune=list(res[rune]),
              samples_other=list(res[other]) if other else [], goal=min_ratio,
              base=b, base_vs=base_vs, samples_base=list(res[base]) if base else [])
    checks: list[bool] = []
    if min_ratio is not None and row.ratio is not None:
        checks.append(row.ratio >= min_ratio)
    if max_base_ratio is not None and row.base_ratio is not None:
        checks.append(row.base_ratio <= max_base_ratio)
    if checks:
        row.met = all(checks)
    return row


class Loops:
    """Jobs for :func:`interleaved` that time a read over a list of arguments."""

    def __init__(self, slices: int, repeats: int) -> None:
        self.slices = slices
        self.repeats = repeats

    def cycle(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Callable[[int], float]:
        """A job timing ``fn`` over the next 1/slices of ``items`` per call (cycling)."""
        sl = self.slices
        size = max(1, len(items) // sl)
        chunks = [items[j:j + size] for j in range(0, size * sl, size)] if len(items) >= sl else [items]
        state = {"next": 0}

        def job(_i: int) -> float:
            chunk = chunks[state["next"] % len(chunks)]
            state["next"] += 1
            return timed(fn, chunk)
        return job

    def each(self, fn: Callable[[], Any], count: int = 1) -> Callable[[int], float]:
        """A job timing ``count`` calls of ``fn()``, per call."""
        def job(_i: int) -> float:
            return timed(lambda _x: fn(), range(count))
        return job
