"""Side-by-side comparison of rune_fast and SQLite on the same workload, in one run.

Run::

    python -m rune_fast.bench                 # default size (100,000 messages), ~1-2 minutes
    python -m rune_fast.bench --quick         # 20,000 messages, well under a minute
    python -m rune_fast.bench --smoke         # a few hundred messages: the harness runs (numbers mean nothing)
    python -m rune_fast.bench --n 1000000     # the issue's full size (slow: minutes)
    python -m rune_fast.bench --json out.json --plot out.png --dir /some/tmp
    python -m rune_fast.bench --explain       # what each line measures, at which durability

(``rune-fast bench`` takes the same sizes.) It ships inside the package, so it
runs from any folder of an installed ``rune_fast``.

Both stores get the same seeded workload (:mod:`rune_fast.bench.workload`) in the same
process, and their measurements are interleaved (rune, sqlite, rune, sqlite,
...) so that the noise of a shared machine hits both alike. Every timed line is
the **median of >= 5 repeats** (``--repeats``), each repeat timing a loop of
many operations with ``time.perf_counter_ns`` and the garbage collector off,
after an untimed warm-up. Memory and bytes-written lines are measured in fresh
subprocesses (``/proc/self/status`` and ``/proc/self/io``).

The table's ``ratio`` is *other / rune_fast*: for times, how many times faster
rune_fast is (> 1 = rune_fast faster); for memory and bytes, how many times
less it uses. ``vs`` names what rune_fast is compared against and at which
durability. No line asserts anything about wall time: the targets (from issue
4) are reported as met or not.

The rune_fast side is ``rune_fast.conversation_state.ConversationStateRepository``
unless another store class is passed to :func:`run_comparison` (the harness
test injects a dict-backed fake; its numbers then mean nothing).

This module times the run; :mod:`.report` holds what is reported (the lines,
the sizes, the table, the chart) and :mod:`.probes` the subprocess probes and
the machine facts.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict
from typing import Any, Callable, Sequence

from . import workload as wl
from .probes import (FACTORY_REF, PKG_PARENT, SQLITE_REF, StoreSpec, disk_usage, load_ref, machine_info, probe,
                     probe_all, record_type_of, ref_of)
from .report import DESCRIPTIONS, OPERATIONS, RUNE_REF, Config, Report, Row, fmt_value, format_table, plot

__all__ = ["Config", "Row", "Report", "StoreSpec", "run_comparison", "main", "OPERATIONS", "DESCRIPTIONS",
           "RUNE_REF", "format_table", "plot", "machine_info"]


def _content(rec: Any) -> str:
    if isinstance(rec, dict):
        return rec["content"]
    return rec.content


# ---------------------------------------------------------------------------
# timing


def _timed(fn: Callable[[Any], Any], items: Sequence[Any]) -> float:
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


def _interleaved(jobs: dict[str, Callable[[int], float]], repeats: int, warmup: bool = True,
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


def _median(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------
# the run


def run_comparison(config: Config | None = None, *, rune_store: Any = None,
                   message_factory: Callable[[dict], Any] | None = None,
                   log: Callable[[str], None] | None = print) -> Report:
    """Measure every line of the table for ``rune_store`` against SQLite; returns the report.

    ``rune_store``: the repository class (default
    ``rune_fast.conversation_state.ConversationStateRepository``), opened as
    ``rune_store(state_dir, durability=..., compact_every=..., hot_window=...)``.
    ``message_factory``: dict -> message for that store (default: the real
    record). Both must be importable by name so
    that subprocess probes can open the store too.
    """
    cfg = (config or Config()).fixed()
    say = log or (lambda s: None)
    if rune_store is None:
        rune_store = load_ref(RUNE_REF)
    factory = message_factory or wl.default_message_factory
    ref, path = ref_of(rune_store)
    fref, fpath = ref_of(factory)
    rune = StoreSpec("rune", ref, path, {"compact_every": cfg.compact_every, "hot_window": cfg.hot_window},
                     fref, fpath)
    sql = StoreSpec("sqlite", SQLITE_REF, PKG_PARENT, {}, fref, fpath)

    if cfg.workdir:
        os.makedirs(cfg.workdir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="rune-bench-", dir=cfg.workdir or None)
    try:
        # Warnings from the stores (say, a recovery report after the killed
        # writer) become notes of the report instead of errors or noise.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = _run(cfg, rune, sql, factory, root, say)
        seen: set[str] = set()
        for wmsg in caught:
            text = f"{wmsg.category.__name__}: {wmsg.message}"
            if text not in seen:
                seen.add(text)
                report.notes.append(f"warning during the run: {text}")
        return report
    finally:
        gc.unfreeze()
        shutil.rmtree(root, ignore_errors=True)


def _run(cfg: Config, rune: StoreSpec, sql: StoreSpec, factory: Callable[[dict], Any],
         root: str, say: Callable[[str], None]) -> Report:
    machine = machine_info(root)
    notes: list[str] = []
    rows: list[Row] = []
    reps = cfg.repeats
    say(f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"kernel {machine['kernel']}, Python {machine['python']}, SQLite {machine['sqlite']}")
    say(f"filesystem: {machine['filesystem']}")
    say(f"rune_fast side: {rune.ref}")
    say(f"generating workload: {cfg.n:,} messages (seed {cfg.seed}) ...")
    w = wl.generate(cfg.n, channels=cfg.channels, tasks=cfg.tasks, seed=cfg.seed)
    msgs = [factory(m) for m in w.messages]
    rt = record_type_of(msgs[0])
    need_fresh = (2 * reps + 2) * cfg.appends * 4 + (reps + 1) * cfg.batch * 2 * cfg.many_batches + 64
    fresh = [factory(m) for m in w.fresh(need_fresh, seed=1)]
    fresh_pos = 0

    def take(k: int) -> list[Any]:
        nonlocal fresh_pos
        if fresh_pos + k > len(fresh):
            fresh.extend(factory(m) for m in w.fresh(k + cfg.batch, seed=1000 + fresh_pos))
        out = fresh[fresh_pos:fresh_pos + k]
        fresh_pos += k
        return out

    gc.collect()
    gc.freeze()  # keep the workload out of the collector's way during timings

    content_total = wl.content_bytes(msgs)
    say(f"  {len(w.channel_ids)} channels, {len(w.task_ids)} tasks, "
        f"{content_total / len(msgs):.0f} content bytes/msg on average")

    d_rune = os.path.join(root, "rune")
    d_sql = os.path.join(root, "sqlite")
    d_rune_s = os.path.join(root, "rune-small")
    d_sql_s = os.path.join(root, "sqlite-small")

    # -- bulk load (one run; builds the stores the reads use) ---------------
    say(f"bulk load of {cfg.n:,} messages in append_many batches of {cfg.batch:,} ...")

    def load(spec: StoreSpec, d: str, items: list[Any]) -> float:
        s = spec.open(d, "fsync", rt)
        t0 = time.perf_counter_ns()
        for i in range(0, len(items), cfg.batch):
            s.append_many(items[i:i + cfg.batch])
        s.compact()
        t1 = time.perf_counter_ns()
        s.close()
        return (t1 - t0) / max(1, len(items))

    t_rune = load(rune, d_rune, msgs)
    t_sql = load(sql, d_sql, msgs)
    load(rune, d_rune_s, msgs[:cfg.small])
    load(sql, d_sql_s, msgs[:cfg.small])
    bulk_row = Row("bulk_load", f"bulk load of {cfg.n:,}, per msg (1 run)", t_rune, t_sql, "ns",
                   f"SQLite 1 txn/batch of {cfg.batch:,}, FULL; incl. compact()")

    a_rune = disk_usage(d_rune)
    a_sql = disk_usage(d_sql)
    disk_row = Row("disk_size", f"on-disk size, {cfg.n:,} msgs", float(a_rune[0]), float(a_sql[0]), "B",
                   "SQLite after close (WAL checkpointed)", "ratio >= 1", a_rune[0] <= a_sql[0], goal=1.0)

    # -- open + first window ------------------------------------------------
    say("open + first window ...")
    ch0 = w.sample_channels(1, seed=11)[0]

    def open_job(spec: StoreSpec, d: str) -> Callable[[int], float]:
        def job(_i: int) -> float:
            t0 = time.perf_counter_ns()
            s = spec.open(d, "fsync", rt)
            s.window(ch0, 8)
            t1 = time.perf_counter_ns()
            s.close()
            return float(t1 - t0)
        return job

    res = _interleaved({"rune": open_job(rune, d_rune), "sql": open_job(sql, d_sql)}, reps)
    rows.append(_time_row("open_first_window", f"open + first window, {cfg.n:,} msgs", res,
                          "SQLite open + indexed window (warm page cache)", ">= 0.10x", 0.1))

    def first_search_job(spec: StoreSpec, d: str) -> Callable[[int], float]:
        def job(_i: int) -> float:
            s = spec.open(d, "fsync", rt)
            search = s.search_ci if spec.kind == "sqlite" else s.search
            t0 = time.perf_counter_ns()
            search(wl.NEEDLE_ASCII)
            t1 = time.perf_counter_ns()
            s.close()
            return float(t1 - t0)
        return job

    res = _interleaved({"rune": first_search_job(rune, d_rune), "sql": first_search_job(sql, d_sql)}, reps,
                       warmup=False)
    first_search_row = _time_row("search_first", f"first search {wl.NEEDLE_ASCII!r} after open", res,
                                 "SQLite instr(lower(content), lower(?)) scan", "(none)", None)
    if res["rune"] and res["sql"]:
        notes.append(f"first search after open: the first of the {len(res['rune'])} opens found no search "
                     f"filters kept on disk ({fmt_value(res['rune'][0], 'ns')}, SQLite's first "
                     f"{fmt_value(res['sql'][0], 'ns')}); the later ones read the cool pages' filters that "
                     "search kept (one search an open never builds the hot segments' filters: the second does)")

    def killed_open_job(spec: StoreSpec, d: str) -> Callable[[int], float]:
        inner = open_job(spec, d)

        def job(i: int) -> float:
            probe({"job": "kill_writer", "spec": asdict(spec), "dir": d, "appends": 3,
                    "seed": 5000 + i}, cfg.subprocess_timeout)
            return inner(i)
        return job

    res = _interleaved({"rune": killed_open_job(rune, d_rune), "sql": killed_open_job(sql, d_sql)},
                       reps, warmup=False)
    rows.append(_time_row("open_after_kill", "open + first window after SIGKILLed writer", res,
                          "SQLite WAL recovery after SIGKILL", ">= 0.10x", 0.1))

    session_msgs: dict[int, Any] = {}       # repeat -> the message both sides append (same stores after)

    def session_job(spec: StoreSpec, d: str) -> Callable[[int], float]:
        def job(i: int) -> float:
            if i not in session_msgs:
                session_msgs[i] = take(1)[0]
            m = session_msgs[i]
            t0 = time.perf_counter_ns()
            s = spec.open(d, "fsync", rt)
            s.append(m)
            s.close()
            return float(time.perf_counter_ns() - t0)
        return job

    res = _interleaved({"rune": session_job(rune, d_rune), "sql": session_job(sql, d_sql)}, reps)
    rows.append(_time_row("open_append_close", "open + 1 durable append + close", res,
                          "SQLite connect, insert (FULL), close", "", None))

    # -- resident memory (subprocess) -----------------------------------------
    qfile = os.path.join(root, "queries.json")
    with open(qfile, "w") as f:
        json.dump({"channels": w.channel_ids, "tasks": w.sample_tasks(min(50, len(w.task_ids)), seed=21),
                   "ids": w.sample_ids(min(1000, cfg.n), seed=22)}, f)
    say("resident memory and bytes written to disk (subprocesses) ...")
    io_jobs: dict[Any, dict[str, Any]] = {}
    for spec in (rune, sql):
        io_jobs[("bulk", spec.kind)] = {"job": "io_bulk", "spec": asdict(spec), "n": cfg.io_n, "seed": cfg.seed,
                                        "batch": cfg.batch, "dir": os.path.join(root, f"io-bulk-{spec.kind}")}
        io_jobs[("durable", spec.kind)] = {"job": "io_durable", "spec": asdict(spec), "n": cfg.small,
                                           "seed": cfg.seed, "batch": cfg.batch, "appends": cfg.io_appends,
                                           "dir": os.path.join(root, f"io-durable-{spec.kind}")}
    io_jobs[("durable", "raw")] = {"job": "io_durable", "spec": asdict(sql), "raw": True, "n": 1,
                                   "seed": cfg.seed, "batch": cfg.batch, "appends": cfg.io_appends,
                                   "dir": os.path.join(root, "io-durable-raw")}
    # One subprocess per side, the two side by side: the memory job first (its
    # baseline is the fresh interpreter), then that side's bytes-written jobs.
    plan = {kind: [("mem", {"job": "mem", "spec": asdict(spec), "dir": d, "queries": qfile})]
            + [(key, job) for key, job in io_jobs.items() if key[1] == kind or (kind == "sqlite" and key[1] == "raw")]
            for kind, spec, d in (("rune", rune, d_rune), ("sqlite", sql, d_sql))}
    results = probe_all({kind: {"job": "multi", "jobs": [job for _, job in steps]} for kind, steps in plan.items()},
                        cfg.subprocess_timeout)
    mem: dict[str, Any] = {}
    io: dict[Any, Any] = {}
    for kind, steps in plan.items():
        for (key, _job), result in zip(steps, results[kind]):
            if key == "mem":
                mem[kind] = result
            else:
                io[key] = result

    def rss_per(kind: str, key: str = "VmRSS") -> float:
        r = mem[kind]
        return max(0, r["after"].get(key, 0) - r["before"].get(key, 0)) / cfg.n

    rows.append(Row("rss_per_msg", "resident memory per stored msg (open + touch)", rss_per("rune"),
                    rss_per("sqlite"), "B/msg", "SQLite, default page cache (2 MiB cap)", "ratio >= 1",
                    rss_per("rune") <= rss_per("sqlite"), goal=1.0))
    notes.append(f"RSS per msg, anonymous part only: rune_fast {rss_per('rune', 'RssAnon'):.1f} B, "
                 f"SQLite {rss_per('sqlite', 'RssAnon'):.1f} B (the rest is mapped file pages); "
                 "'touch' = window(ch, 8) on every channel, messages_for_task on 50 tasks, "
                 "get_message on 1,000 ids; SQLite's share is bounded by its page cache, so its "
                 "per-message figure falls as N grows")

    # -- reads -----------------------------------------------------------------
    say("reads: window, get_message, messages_for_task, search ...")
    s_rune = rune.open(d_rune, "fsync", rt)
    s_sql = sql.open(d_sql, "fsync", rt)
    _sanity(w, s_rune, s_sql, notes)

    chans = w.sample_channels(cfg.queries, seed=31)
    ids = w.sample_ids(cfg.queries, seed=32)
    tasks = w.sample_tasks(cfg.task_queries, seed=33)
    needles = [wl.NEEDLE_ASCII] * cfg.search_queries

    sl = cfg.slices

    def loop(fn: Callable[[Any], Any], items: Sequence[Any]) -> Callable[[int], float]:
        """A job timing ``fn`` over the next 1/slices of ``items`` per call (cycling)."""
        size = max(1, len(items) // sl)
        chunks = [items[j:j + size] for j in range(0, size * sl, size)] if len(items) >= sl else [items]
        state = {"next": 0}

        def job(_i: int) -> float:
            chunk = chunks[state["next"] % len(chunks)]
            state["next"] += 1
            return _timed(fn, chunk)
        return job

    res = _interleaved({"rune": loop(lambda c: s_rune.window(c, 8), chans),
                        "sql": loop(lambda c: s_sql.window(c, 8), chans)}, reps, slices=sl)
    rows.append(_time_row("window", "window(ch, 8)", res, "SQLite index (channel_id, seq)", ">= 10x", 10))
    res = _interleaved({"rune": loop(s_rune.get_message, ids), "sql": loop(s_sql.get_message, ids)}, reps,
                       slices=sl)
    rows.append(_time_row("get_message", "get_message(id)", res, "SQLite unique index on msg_id", ">= 3x", 3))
    res = _interleaved({"rune": loop(s_rune.messages_for_task, tasks),
                        "sql": loop(s_sql.messages_for_task, tasks)}, reps, slices=sl)
    rows.append(_time_row("messages_for_task", "messages_for_task(task)", res, "SQLite index (task_id, seq)",
                          ">= 10x", 10))
    def once(fn: Callable[[Any], Any], items: Sequence[Any]) -> Callable[[int], float]:
        """A job timing ``fn`` over the next unread 1/(reps + 1) of ``items``
        (the warm-up takes the first): every item is read once."""
        size = max(1, len(items) // (reps + 1))
        state = {"next": 0}

        def job(_i: int) -> float:
            k = state["next"] % (reps + 1)
            state["next"] += 1
            return _timed(fn, items[k * size:(k + 1) * size])
        return job

    warm_ids, warm_tasks = set(ids), set(tasks)
    pool = [m["msg_id"] for m in w.messages if m["msg_id"] not in warm_ids]
    cold_ids = random.Random(35).sample(pool, min(len(pool), cfg.queries * (reps + 1)))
    pool = [t for t in w.task_ids if t not in warm_tasks]
    cold_tasks = random.Random(36).sample(pool, min(len(pool), cfg.task_queries * (reps + 1)))
    del pool
    res = _interleaved({"rune": once(s_rune.get_message, cold_ids), "sql": once(s_sql.get_message, cold_ids)},
                       reps)
    rows.append(_time_row("get_message_cold", "get_message(id), each id once", res,
                          "SQLite unique index on msg_id", ">= 3x", 3))
    res = _interleaved({"rune": once(s_rune.messages_for_task, cold_tasks),
                        "sql": once(s_sql.messages_for_task, cold_tasks)}, reps)
    rows.append(_time_row("messages_for_task_cold", "messages_for_task(task), each task once", res,
                          "SQLite index (task_id, seq)", ">= 10x", 10))
    res = _interleaved({"rune": loop(lambda t: s_rune.search(t), needles),
                        "sql": loop(s_sql.search_ci, needles)}, reps)
    rows.append(_time_row("search_ci", f"search {wl.NEEDLE_ASCII!r}, case-insensitive", res,
                          "SQLite instr(lower(content), lower(?)) scan", ">= 10x", 10))
    rows.append(first_search_row)
    expect_a = wl.expected_hits(w.messages, wl.NEEDLE_ASCII)
    expect_u = wl.expected_hits(w.messages, wl.NEEDLE_UNICODE)
    hits = {
        "rune_a": len(s_rune.search(wl.NEEDLE_ASCII)), "sql_a": len(s_sql.search_ci(wl.NEEDLE_ASCII)),
        "rune_u": len(s_rune.search(wl.NEEDLE_UNICODE)), "sql_u": len(s_sql.search_ci(wl.NEEDLE_UNICODE)),
    }
    notes.append(f"search hits for {wl.NEEDLE_ASCII!r} (ASCII): expected {expect_a} (Unicode casefold), "
                 f"rune_fast {hits['rune_a']}, SQLite {hits['sql_a']}")
    notes.append(f"search hits for {wl.NEEDLE_UNICODE!r}: expected {expect_u} (Unicode casefold), "
                 f"rune_fast {hits['rune_u']}, SQLite {hits['sql_u']} -- SQLite's lower() is ASCII-only, "
                 "so it misses 'Überweisung'/'ÜBERWEISUNG' (and never folds 'ß' to 'ss')")

    # -- durable single appends, flatness, raw fsync loop ------------------------
    say("appends: fsync, raw write+fdatasync, flatness, append_many ...")
    s_rune_s = rune.open(d_rune_s, "fsync", rt)
    s_sql_s = sql.open(d_sql_s, "fsync", rt)
    raw_path = os.path.join(root, "raw.jsonl")
    raw_fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def raw_append(line: bytes) -> None:
        os.write(raw_fd, line)
        os.fdatasync(raw_fd)

    def raw_job(_i: int) -> float:
        lines = [wl.json_line(m) for m in take(k)]  # encoded outside the timing: the floor
        return _timed(raw_append, lines)

    def append_job(store: Any, k: int) -> Callable[[int], float]:
        return lambda _i: _timed(store.append, take(k))

    # k appends per turn, ``slices`` turns per repeat: cfg.appends per repeat and side.
    k = max(1, cfg.appends // sl)
    res = _interleaved({"rune": append_job(s_rune, k), "sql": append_job(s_sql, k),
                        "raw": raw_job,
                        "rune_s": append_job(s_rune_s, k), "sql_s": append_job(s_sql_s, k)}, reps, slices=sl)
    os.close(raw_fd)
    rows.append(_time_row("append_fsync", "append, durable (fsync), per msg", res,
                          "SQLite WAL synchronous=FULL, 1 txn/append", ">= 1.2x", 1.2))
    rows.append(_time_row("append_fsync_vs_raw", "append, durable, vs raw write+fdatasync", res,
                          "os.write + os.fdatasync of the JSON line", ">= 0.8x", 0.8, other="raw"))
    small = _time_row("append_at_small", f"append, durable, store of {cfg.small:,}", res,
                      "SQLite FULL (same store size)", "", None, rune="rune_s", other="sql_s")
    large = _time_row("append_at_n", f"append, durable, store of {cfg.n:,}", res,
                      "SQLite FULL (same store size)", "", None)
    flat_r = (large.rune / small.rune) if small.rune and large.rune else None
    flat_s = (large.other / small.other) if small.other and large.other else None
    flat = Row("append_flatness", f"append cost growth {cfg.small:,} -> {cfg.n:,} (t_N / t_small)", flat_r, flat_s,
               "x", "SQLite growth (ratio: sqlite/rune)", "rune <= 1.25x",
               None if flat_r is None else flat_r <= 1.25)
    s_rune_s.close()
    s_sql_s.close()

    def many_job(store: Any) -> Callable[[int], float]:
        return lambda _i: _timed(store.append_many, [take(cfg.batch) for _ in range(cfg.many_batches)])

    res = _interleaved({"rune": many_job(s_rune), "sql": many_job(s_sql)}, reps)
    rows.append(_time_row("append_many", f"append_many of {cfg.batch:,} (per batch)", res,
                          "SQLite 1 txn/batch, synchronous=FULL", ">= 5x", 5))
    s_rune.close()
    s_sql.close()

    # -- other durability modes ---------------------------------------------
    say("appends: batch and none durability modes ...")
    s_rune = rune.open(d_rune, "batch", rt)
    s_sql = sql.open(d_sql, "fsync", rt)
    res = _interleaved({"rune": append_job(s_rune, k), "sql": append_job(s_sql, k)}, reps, slices=sl)
    rows.append(_time_row("append_batch", "append, durability=batch, per msg (1 thread)", res,
                          "SQLite FULL (both durable on return)", "", None))
    s_sql2 = sql.open(d_sql, "fsync", rt)

    def threaded_job(stores: list[Any]) -> Callable[[int], float]:
        def job(_i: int) -> float:
            parts = [take(k) for _ in stores]
            barrier = threading.Barrier(len(stores) + 1)
            errors: list[BaseException] = []

            def worker(store: Any, part: list[Any]) -> None:
                barrier.wait()
                try:
                    for m in part:
                        store.append(m)
                except BaseException as exc:  # reported below, not swallowed
                    errors.append(exc)

            threads = [threading.Thread(target=worker, args=(st, part)) for st, part in zip(stores, parts)]
            for t in threads:
                t.start()
            barrier.wait()
            t0 = time.perf_counter_ns()
            for t in threads:
                t.join()
            t1 = time.perf_counter_ns()
            if errors:
                raise errors[0]
            return (t1 - t0) / (k * len(stores))
        return job

    res = _interleaved({"rune": threaded_job([s_rune, s_rune]), "sql": threaded_job([s_sql, s_sql2])}, reps, slices=sl)
    rows.append(_time_row("append_batch_threads", "append, durability=batch, 2 threads, per msg", res,
                          "SQLite FULL, 1 connection per thread", "", None))
    s_rune.close()
    s_sql.close()
    s_sql2.close()
    s_rune = rune.open(d_rune, "none", rt)
    s_off = sql.open(d_sql, "off", rt)
    res = _interleaved({"rune": append_job(s_rune, k), "sql": append_job(s_off, k)}, reps, slices=sl)
    rows.append(_time_row("append_none_off", "append, durability=none vs sync=OFF, per msg", res,
                          "SQLite WAL synchronous=OFF (both: no sync)", "", None))
    s_off.close()
    s_norm = sql.open(d_sql, "normal", rt)
    res = _interleaved({"rune": append_job(s_rune, k), "sql": append_job(s_norm, k)}, reps, slices=sl)
    rows.append(_time_row("append_none_normal", "append, durability=none vs sync=NORMAL, per msg", res,
                          "SQLite WAL synchronous=NORMAL (sync at checkpoint)", "", None))
    s_norm.close()
    s_rune.close()

    # -- bytes written per content byte (measured by the probes above) ----------
    def amp(key: tuple[str, str]) -> float:
        r = io[key]
        return r["io"]["disk_bytes"] / max(1, r["content"])

    rows.append(Row("write_amp_bulk", f"disk bytes written / content byte, bulk {cfg.io_n:,} + compact",
                    amp(("bulk", "rune")), amp(("bulk", "sqlite")), "B/B", "SQLite 1 txn/batch, FULL",
                    "rune <= 3", amp(("bulk", "rune")) <= 3))
    rows.append(Row("write_amp_durable", f"disk bytes written / content byte, {cfg.io_appends} durable appends",
                    amp(("durable", "rune")), amp(("durable", "sqlite")), "B/B", "SQLite FULL, 1 txn/append",
                    "ratio >= 1", amp(("durable", "rune")) <= amp(("durable", "sqlite")), goal=1.0))
    rows.append(Row("write_amp_durable_vs_raw", "disk bytes written / content byte, durable, vs raw",
                    amp(("durable", "rune")), amp(("durable", "raw")), "B/B", "raw write+fdatasync loop",
                    "rune <= 1.2x raw", amp(("durable", "rune")) <= 1.2 * amp(("durable", "raw")), goal=1 / 1.2))
    if io[("durable", "raw")]["io"]["disk_bytes"] <= 0:
        # tmpfs and the like: /proc/self/io counts block-device writes only
        for r in rows[-3:]:
            r.met = None
        notes.append("UNMEASURED: the work directory's file system counted no block writes (tmpfs?); "
                     "the three 'disk bytes written' lines measure nothing here")
    notes.append(
        "bytes written = write_bytes - cancelled_write_bytes of /proc/self/io in a fresh subprocess "
        "(pages dirtied: a synced page dirtied again counts again); SQLite durable "
        f"{amp(('durable', 'sqlite')) / max(1e-9, amp(('durable', 'raw'))):.1f}x the raw loop, "
        f"rune_fast {amp(('durable', 'rune')) / max(1e-9, amp(('durable', 'raw'))):.1f}x")

    rows.extend([disk_row, small, large, flat, bulk_row])
    order = {k: i for i, k in enumerate(OPERATIONS)}
    rows.sort(key=lambda r: order.get(r.key, len(order)))
    return Report(config=asdict(cfg), machine=machine, rows=rows, notes=notes, rune_store=rune.ref)


def _time_row(key: str, op: str, res: dict[str, list[float]], vs: str, target: str,
              min_ratio: float | None, *, rune: str = "rune", other: str = "sql") -> Row:
    r, o = _median(res[rune]), _median(res[other])
    row = Row(key, op, r, o, "ns", vs, target, samples_rune=list(res[rune]), samples_other=list(res[other]),
              goal=min_ratio)
    if min_ratio is not None and row.ratio is not None:
        row.met = row.ratio >= min_ratio
    return row


def _sanity(w: wl.Workload, s_rune: Any, s_sql: Any, notes: list[str]) -> None:
    """Both stores return the stored content for a few reads; a mismatch goes into the notes."""
    for mid in w.sample_ids(5, seed=41):
        want = next(m["content"] for m in w.messages if m["msg_id"] == mid) if len(w) <= 5000 else None
        got_r = s_rune.get_message(mid)
        rec = getattr(got_r, "record", got_r)
        got_s = s_sql.get_message(mid)
        if rec is None or got_s is None:
            notes.append(f"SANITY: get_message({mid}) missing (rune: {rec is not None}, sqlite: {got_s is not None})")
        elif _content(rec) != _content(got_s) or (want is not None and _content(rec) != want):
            notes.append(f"SANITY: get_message({mid}) content differs between stores")
    ch = w.channel_ids[0]
    a, b = s_rune.window(ch, 8), s_sql.window(ch, 8)
    if [_content(x) for x in a] != [_content(x) for x in b]:
        notes.append(f"SANITY: window({ch}, 8) differs between stores")


# ---------------------------------------------------------------------------
# command line


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rune_fast.bench", description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="20,000 messages and shorter loops (well under a minute)")
    size.add_argument("--smoke", action="store_true",
                      help="a few hundred messages, one repeat: checks that the harness runs (numbers mean nothing)")
    p.add_argument("--n", type=int, help="messages in the main stores (default 100,000; the issue's size is 1000000)")
    p.add_argument("--repeats", type=int, help="repeats per timed line, median reported (default 5)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--channels", type=int, help="channels of the workload (default: n // 1000, 2..1000)")
    p.add_argument("--tasks", type=int, help="tasks of the workload (default: n // 40)")
    p.add_argument("--dir", help="parent directory of the temporary stores (default: the system temp dir)")
    p.add_argument("--json", dest="json_out", help="write the report as JSON here")
    p.add_argument("--plot", dest="plot_out", help="write a PNG bar chart of the ratios here (needs matplotlib)")
    p.add_argument("--explain", action="store_true", help="say what each line measures, then exit")
    p.add_argument("--store", default=RUNE_REF, metavar="MODULE:CLASS",
                   help="the store on the rune_fast side (default: %(default)s)")
    p.add_argument("--factory", default=FACTORY_REF, metavar="MODULE:FUNC",
                   help="dict -> message for that store (default: %(default)s)")
    args = p.parse_args(argv)
    if args.explain:
        for key in OPERATIONS:
            print(f"{key}:\n    {DESCRIPTIONS[key]}")
        return 0
    cfg = Config.tiny() if args.smoke else Config.quick() if args.quick else Config()
    if args.n is not None:
        cfg.n = args.n
        if not (args.quick or args.smoke):
            cfg.io_n = min(max(cfg.io_n, args.n // 10), args.n)
    if args.repeats is not None:
        cfg.repeats = args.repeats
    cfg.seed = args.seed
    cfg.channels = args.channels
    cfg.tasks = args.tasks
    cfg.workdir = args.dir
    try:
        rune_store = load_ref(args.store)
        factory = load_ref(args.factory)
    except (ImportError, AttributeError, ValueError) as exc:
        print(f"cannot import {args.store}: {exc}\n(build rune_fast first: make build)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    report = run_comparison(cfg, rune_store=rune_store, message_factory=factory,
                            log=lambda s: print(s, file=sys.stderr, flush=True))
    print()
    if report.rune_store != RUNE_REF:
        print(f"NOTE: the rune_fast column is {report.rune_store}, not the real repository: "
              "its numbers and the ratios mean nothing.")
    print(format_table(report))
    print()
    for note in report.notes:
        print(f"note: {note}")
    m = report.machine
    print(f"machine: {m['cpu']}, {m['cores']} cores ({m['cores_usable']} usable), {m['memory_gib']} GiB, "
          f"{m['filesystem']}; Python {m['python']}, SQLite {m['sqlite']}")
    print(f"each timed line: median of {cfg.repeats} repeats; ratio = sqlite (or baseline) / rune_fast; "
          f"total {time.perf_counter() - t0:.0f} s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report.to_json(), f, indent=2)
    if args.plot_out:
        if plot(report, args.plot_out):
            print(f"plot: {args.plot_out}")
        else:
            print("plot skipped: matplotlib is not installed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
