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
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import platform
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from . import workload as wl

__all__ = ["Config", "Row", "Report", "StoreSpec", "run_comparison", "main", "OPERATIONS", "DESCRIPTIONS",
           "format_table", "plot", "machine_info"]

# The folder holding the rune_fast package (a checkout's root, or site-packages):
# probe subprocesses import this same rune_fast from there.
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FACTORY_REF = "rune_fast.bench.workload:default_message_factory"
SQLITE_REF = "rune_fast.bench.sqlite_store:SQLiteStore"
RUNE_REF = "rune_fast.conversation_state:ConversationStateRepository"

#: What each line measures, and at which durability (``--explain`` prints this).
DESCRIPTIONS = {
    "append_fsync": "append(msg) of one new message with durability='fsync' (on stable storage when the "
                    "call returns; includes the store's automatic compactions), per message, on the "
                    "N-message store; vs SQLite WAL synchronous=FULL, one transaction per append.",
    "append_fsync_vs_raw": "the same rune_fast appends vs the floor: os.write + os.fdatasync of each "
                           "message's canonical JSON line to a plain file.",
    "append_many": "append_many of a batch of 1,000 new messages (one sync at the end), per batch (the "
                   "mean of 4 consecutive batches per repeat, so that each repeat pays its share of the "
                   "automatic compactions); vs SQLite one transaction per batch at synchronous=FULL.",
    "append_batch": "append(msg) with durability='batch' from one thread (group commit; each call still "
                    "durable on return); vs SQLite synchronous=FULL (same promise).",
    "append_batch_threads": "append(msg) with durability='batch' from 2 threads at once on one store "
                            "(group commit: concurrent appends share a sync; each call durable on "
                            "return), per message; vs SQLite synchronous=FULL, one connection per thread "
                            "(writers serialise on the WAL lock, default busy handler).",
    "append_none_off": "append(msg) with durability='none' (survives a process crash, not power loss); "
                       "vs SQLite WAL synchronous=OFF (no syncs: the same promise).",
    "append_none_normal": "the same rune_fast appends vs SQLite WAL synchronous=NORMAL (no sync per "
                          "commit, sync at WAL checkpoints: consistent after power loss, may lose the "
                          "latest commits).",
    "window": "window(ch, 8): the last 8 messages of a random channel, decoded into records; vs SQLite "
              "ORDER BY seq DESC LIMIT 8 on the (channel_id, seq) index.",
    "get_message": "get_message(id) of a random stored id (digest verified); vs SQLite lookup on the "
                   "unique msg_id index.",
    "messages_for_task": "messages_for_task(task) of a random task (about 40 messages), all tiers; vs "
                         "SQLite on the (task_id, seq) index.",
    "get_message_cold": "get_message(id), each id read once (ids outside the set the get_message line "
                        "cycles through): no record cache helps rune_fast, SQLite's page cache is as warm "
                        "as the OS keeps it.",
    "messages_for_task_cold": "messages_for_task(task), each task read once, likewise.",
    "search_ci": "search(text) case-insensitive over every message (hot and cool), an ASCII needle "
                 "planted in ~0.3% of messages; vs SQLite's instr(lower(content), lower(?)) full scan "
                 "(ASCII-only folding: see the hit-count notes).",
    "search_first": "the same search, the first after opening the store (close not timed): rune_fast "
                    "builds its search filters then (see the README), SQLite has no such step.",
    "open_first_window": "open the N-message store and read its first window(ch, 8) (page cache warm; "
                         "close not timed); vs SQLite connect + pragmas + the same query.",
    "open_after_kill": "the same, right after a writer process appended 3 messages and was killed with "
                       "SIGKILL (recovery included); SQLite replays its WAL likewise.",
    "open_append_close": "a short session, as a command-line agent runs one: open the N-message store, "
                         "append one message (durability='fsync'), close; vs SQLite connect + pragmas, "
                         "one insert (synchronous=FULL), close (the last connection checkpoints its WAL).",
    "rss_per_msg": "resident memory (VmRSS) added by opening the N-message store and touching it "
                   "(window on every channel, 50 tasks, 1,000 get_message), divided by N; fresh "
                   "subprocess, baseline taken after the imports.",
    "write_amp_bulk": "bytes written to disk (/proc/self/io write_bytes - cancelled_write_bytes) per "
                      "byte of message content, for a bulk load in batches of 1,000 (durability='fsync') "
                      "plus compact() (with cooling beyond hot_window); vs SQLite, one txn per batch.",
    "write_amp_durable": "the same ratio for single durable appends (fsync per append) into a store; "
                         "vs SQLite synchronous=FULL.",
    "write_amp_durable_vs_raw": "the same rune_fast number vs the raw write+fdatasync loop of the "
                                "messages' JSON lines (the floor: every sync re-dirties a 4 KiB page).",
    "disk_size": "allocated bytes of every file of the N-message store after close; vs the SQLite "
                 "database after close (WAL checkpointed away).",
    "append_at_small": "durable append (fsync) cost on a store of the small size (10,000 by default).",
    "append_at_n": "durable append (fsync) cost on the N-message store (same samples as append_fsync).",
    "append_flatness": "growth of the durable append cost from the small store to N (t_N / t_small); "
                       "flat means about 1.",
    "bulk_load": "building the N-message store (append_many batches of 1,000, durability='fsync', then "
                 "compact()), per message, one run only; vs SQLite one transaction per batch.",
}

#: Keys of the rows every run produces, in table order.
OPERATIONS = (
    "append_fsync",
    "append_fsync_vs_raw",
    "append_many",
    "append_batch",
    "append_batch_threads",
    "append_none_off",
    "append_none_normal",
    "window",
    "get_message",
    "messages_for_task",
    "get_message_cold",
    "messages_for_task_cold",
    "search_ci",
    "search_first",
    "open_first_window",
    "open_after_kill",
    "open_append_close",
    "rss_per_msg",
    "write_amp_bulk",
    "write_amp_durable",
    "write_amp_durable_vs_raw",
    "disk_size",
    "append_at_small",
    "append_at_n",
    "append_flatness",
    "bulk_load",
)


# ---------------------------------------------------------------------------
# configuration and results


@dataclass
class Config:
    """Sizes of one run. ``n`` messages in the main stores; the rest scale the loops."""

    n: int = 100_000
    repeats: int = 5
    queries: int = 2_000          # window / get_message calls per repeat
    task_queries: int = 200       # messages_for_task calls per repeat
    search_queries: int = 1       # full searches per repeat
    slices: int = 10              # each repeat of a loop is cut in this many turns, interleaved
    appends: int = 200            # single appends per repeat (each durability mode)
    batch: int = 1_000            # append_many batch size (also the bulk-load batch)
    many_batches: int = 4         # append_many batches per repeat (timed: their mean), so that
                                  # each repeat pays its share of the automatic compactions
    small: int = 10_000           # store size of the flatness baseline
    io_n: int = 50_000            # messages of the bytes-written bulk load
    io_appends: int = 500         # durable appends of the bytes-written measure
    seed: int = 0
    channels: int | None = None   # None: scaled with n (see rune_fast.bench.workload.generate)
    tasks: int | None = None
    workdir: str | None = None
    compact_every: int = 64
    hot_window: int = 512
    subprocess_timeout: float = 600.0

    @classmethod
    def quick(cls, **kw: Any) -> "Config":
        base: dict[str, Any] = dict(n=20_000, queries=500, task_queries=100, appends=100, io_n=20_000, io_appends=300)
        base.update(kw)
        return cls(**base)

    @classmethod
    def tiny(cls, **kw: Any) -> "Config":
        """For the harness test: a few hundred messages, one repeat."""
        base: dict[str, Any] = dict(n=200, repeats=1, slices=1, queries=20, task_queries=5, appends=5, batch=20, small=50,
                    io_n=200, io_appends=10, many_batches=1)
        base.update(kw)
        return cls(**base)

    def fixed(self) -> "Config":
        """Sizes made consistent with ``n``."""
        self.small = max(1, min(self.small, self.n // 2 if self.n >= 4 else self.n))
        self.io_n = max(1, min(self.io_n, self.n))
        self.repeats = max(1, self.repeats)
        self.slices = max(1, min(self.slices, self.appends, self.queries, self.task_queries))
        return self


@dataclass
class Row:
    """One line of the table.

    ``rune`` and ``other`` are in ``unit`` (``ns`` per operation, ``B/msg``,
    ``B/B`` (bytes written per content byte), ``B``, ``x``). ``ratio`` is
    ``other / rune`` (> 1: rune_fast faster or smaller). ``met`` is None when
    the line has no target or a side is missing.
    """

    key: str
    operation: str
    rune: float | None
    other: float | None
    unit: str
    vs: str
    target: str = ""
    met: bool | None = None
    ratio: float | None = None
    goal: float | None = None     # the target as a minimum ratio, where it is one
    samples_rune: list[float] = field(default_factory=list)
    samples_other: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.ratio is None and self.rune and self.other is not None and self.rune > 0:
            self.ratio = self.other / self.rune


@dataclass
class Report:
    config: dict[str, Any]
    machine: dict[str, Any]
    rows: list[Row]
    notes: list[str]
    rune_store: str

    def row(self, key: str) -> Row:
        for r in self.rows:
            if r.key == key:
                return r
        raise KeyError(key)

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "machine": self.machine, "rune_store": self.rune_store,
                "rows": [asdict(r) for r in self.rows], "notes": self.notes}


# ---------------------------------------------------------------------------
# stores by reference (so subprocesses can open them too)


def _ref_of(obj: Any) -> tuple[str, str | None]:
    """``("module:qualname", sys.path entry or None)`` naming a class or function."""
    module = obj.__module__
    ref = f"{module}:{obj.__qualname__}"
    mod = sys.modules.get(module)
    path = None
    file = getattr(mod, "__file__", None)
    if file:
        path = os.path.dirname(os.path.abspath(file))
        for _ in range(module.count(".")):
            path = os.path.dirname(path)
        if module == "__main__":
            raise ValueError("a store defined in __main__ cannot be opened by a subprocess")
    return ref, path


def _load_ref(ref: str, path: str | None = None) -> Any:
    if path and path not in sys.path:
        sys.path.insert(0, path)
    module, _, qual = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class StoreSpec:
    """How to open one side: ``kind`` is ``"rune"`` or ``"sqlite"``; ``ref`` its class."""

    kind: str
    ref: str
    path: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    factory_ref: str = FACTORY_REF
    factory_path: str | None = None

    def cls(self) -> Any:
        return _load_ref(self.ref, self.path)

    def message_factory(self) -> Callable[[dict], Any]:
        return _load_ref(self.factory_ref, self.factory_path)

    def open(self, state_dir: str, durability: str, record_type: Any = None) -> Any:
        cls = self.cls()
        if self.kind == "sqlite":
            return cls(state_dir, durability=durability, record_type=record_type)
        return cls(state_dir, durability=durability, **self.kwargs)


def _record_type(msg: Any) -> Any:
    t = type(msg)
    return t if hasattr(t, "from_dict") else None


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
# machine and disk helpers


def machine_info(path: str) -> dict[str, Any]:
    """CPU model, cores, memory, kernel, Python, SQLite, and the filesystem of ``path``."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    fs = "unknown"
    try:
        best = ""
        real = os.path.realpath(path)
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype, opts = line.split()[:4]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best = mnt
                    fs = f"{fstype} on {mnt} ({dev}; {opts})"
    except OSError:
        pass
    affinity: int | None
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {
        "cpu": cpu, "cores": os.cpu_count(), "cores_usable": affinity, "memory_gib": mem_gib,
        "kernel": platform.release(), "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version, "filesystem": fs, "workdir": path,
    }


def disk_usage(path: str) -> tuple[int, int]:
    """``(allocated bytes, apparent bytes)`` of every file under ``path``."""
    alloc = apparent = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            alloc += st.st_blocks * 512
            apparent += st.st_size
    return alloc, apparent


def _proc_io() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k.strip()] = int(v)
    except OSError:
        pass
    return out


def _proc_status() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:")):
                k, _, v = line.partition(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def _io_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # Bytes that reached (or will reach) the block layer: pages dirtied minus
    # dirty pages dropped by truncation before writeback.
    d["disk_bytes"] = d.get("write_bytes", 0) - d.get("cancelled_write_bytes", 0)
    return d


# ---------------------------------------------------------------------------
# subprocess probes: memory, bytes written, killed writer


def _probe(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one probe job in a fresh interpreter; returns its JSON result."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-c", "from rune_fast.bench.compare import _probe_main; _probe_main()", json.dumps(job)]
    # cwd: the folder of this rune_fast, so that no other one in the caller's
    # folder shadows it (``-c`` puts the cwd first on sys.path).
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=PKG_PARENT, timeout=timeout)
    if job["job"] == "kill_writer":
        if proc.returncode != -signal.SIGKILL:
            raise RuntimeError(f"killed-writer probe ended with {proc.returncode}: {proc.stderr[-2000:]}")
        return {}
    if proc.returncode != 0:
        raise RuntimeError(f"probe {job['job']} failed ({proc.returncode}): {proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _probes(jobs: dict[Any, dict[str, Any]], timeout: float, workers: int = 2) -> dict[Any, dict[str, Any]]:
    """Run probe jobs two at a time (they report per-process counters only: RSS and
    /proc/self/io are not disturbed by a neighbour, and no probe's time is reported)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(_probe, job, timeout) for key, job in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


def _probe_job(job: dict[str, Any]) -> dict[str, Any]:
    """Do one probe job in this (fresh) process and return its counters."""
    kind = job["job"]
    given = StoreSpec(**job["spec"]) if job.get("spec") else None
    factory = given.message_factory() if given else wl.default_message_factory

    def need_spec() -> StoreSpec:
        if given is None:
            raise ValueError(f"probe job {kind!r} names no store (its field 'spec' is empty)")
        return given

    if kind == "mem":
        spec = need_spec()
        with open(job["queries"]) as f:
            q = json.load(f)
        cls = spec.cls()  # import the store's modules before the baseline
        probe_msg = factory(wl.generate(1, seed=99).messages[0])
        rt = _record_type(probe_msg)
        del cls, probe_msg
        gc.collect()
        base = _proc_status()
        store = spec.open(job["dir"], "fsync", rt)
        getter = store.get_message
        for ch in q["channels"]:
            store.window(ch, 8)
        for t in q["tasks"]:
            store.messages_for_task(t)
        for i in q["ids"]:
            getter(i)
        gc.collect()
        after = _proc_status()
        store.close()
        return {"before": base, "after": after}
    if kind in ("io_bulk", "io_durable"):
        w = wl.generate(job["n"], seed=job["seed"])
        msgs = [factory(m) for m in w.messages]
        fresh = [factory(m) for m in w.fresh(job.get("appends", 0), seed=777)]
        rt = _record_type(msgs[0]) if msgs else None
        state_dir = job["dir"]
        if job.get("raw"):
            lines = [wl.json_line(m) for m in fresh]
            os.makedirs(state_dir, exist_ok=True)
            fd = os.open(os.path.join(state_dir, "raw.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            before = _proc_io()
            t0 = time.perf_counter_ns()
            for line in lines:
                os.write(fd, line)
                os.fdatasync(fd)
            t1 = time.perf_counter_ns()
            after = _proc_io()
            os.close(fd)
            return {"io": _io_delta(before, after), "content": wl.content_bytes(fresh), "ns": t1 - t0}
        store = need_spec().open(state_dir, "fsync", rt)
        batch = job["batch"]
        if kind == "io_bulk":
            before = _proc_io()
            t0 = time.perf_counter_ns()
            for i in range(0, len(msgs), batch):
                store.append_many(msgs[i:i + batch])
            store.compact()
            store.close()
            t1 = time.perf_counter_ns()
            after = _proc_io()
            content = wl.content_bytes(msgs)
        else:
            for i in range(0, len(msgs), batch):
                store.append_many(msgs[i:i + batch])
            store.compact()
            before = _proc_io()
            t0 = time.perf_counter_ns()
            for m in fresh:
                store.append(m)
            t1 = time.perf_counter_ns()
            after = _proc_io()
            store.close()
            content = wl.content_bytes(fresh)
        return {"io": _io_delta(before, after), "content": content, "ns": t1 - t0}
    if kind == "kill_writer":
        w = wl.generate(2, seed=job["seed"])
        # On a channel of their own, so the killed writer's messages disturb no measured read.
        fresh = [factory(dict(m, channel_id="killed-writer", task_id=""))
                 for m in w.fresh(job["appends"], seed=job["seed"])]
        store = need_spec().open(job["dir"], "fsync", _record_type(fresh[0]))
        for m in fresh:
            store.append(m)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(f"unknown probe job {kind!r}")


def _probe_main() -> None:
    """Entry of a probe subprocess: one job, or ``{"job": "multi", "jobs": [...]}`` run in order."""
    job = json.loads(sys.argv[1])
    if job["job"] == "multi":
        print(json.dumps([_probe_job(j) for j in job["jobs"]]))
    else:
        print(json.dumps(_probe_job(job)))


# ---------------------------------------------------------------------------
# the run


def _fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ns":
        if v >= 1e9:
            return f"{v / 1e9:.2f} s"
        if v >= 1e6:
            return f"{v / 1e6:.2f} ms"
        if v >= 1e3:
            return f"{v / 1e3:.1f} us"
        return f"{v:.0f} ns"
    if unit == "B":
        if v >= 1 << 20:
            return f"{v / (1 << 20):.1f} MiB"
        return f"{v / 1024:.1f} KiB"
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v:.1f} {unit}"


def format_table(report: Report) -> str:
    """The table as text: operation, rune_fast, sqlite (or baseline), ratio, target, vs."""
    head = ("operation", "rune_fast", "sqlite|base", "ratio", "target", "vs (durability)")
    lines = [head]
    for r in report.rows:
        mark = "" if r.met is None else (" ok" if r.met else " MISS")
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append((r.operation, _fmt_value(r.rune, r.unit), _fmt_value(r.other, r.unit), ratio,
                      (r.target + mark) if r.target else "-", r.vs))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for j, line in enumerate(lines):
        out.append("  ".join(cell.ljust(widths[i]) if i in (0, 4, 5) else cell.rjust(widths[i])
                             for i, cell in enumerate(line)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


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
        rune_store = _load_ref(RUNE_REF)
    factory = message_factory or wl.default_message_factory
    ref, path = _ref_of(rune_store)
    fref, fpath = _ref_of(factory)
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
    rt = _record_type(msgs[0])
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
                     f"filters kept on disk ({_fmt_value(res['rune'][0], 'ns')}, SQLite's first "
                     f"{_fmt_value(res['sql'][0], 'ns')}); the later ones read the cool pages' filters that "
                     "search kept (one search an open never builds the hot segments' filters: the second does)")

    def killed_open_job(spec: StoreSpec, d: str) -> Callable[[int], float]:
        inner = open_job(spec, d)

        def job(i: int) -> float:
            _probe({"job": "kill_writer", "spec": asdict(spec), "dir": d, "appends": 3,
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
    results = _probes({kind: {"job": "multi", "jobs": [job for _, job in steps]} for kind, steps in plan.items()},
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
# plot and CLI


def plot(report: Report, path: str) -> bool:
    """Bar chart of the ratios (log scale) with target marks; False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in report.rows if r.ratio is not None and r.ratio > 0]
    ratios = [r.ratio for r in rows if r.ratio is not None]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    ys = range(len(rows))
    colors = ["tab:green" if r.met else ("tab:red" if r.met is False else "tab:gray") for r in rows]
    ax.barh(list(ys), ratios, color=colors)
    for y, r, ratio in zip(ys, rows, ratios):
        label = f"{ratio:.0f}" if ratio >= 100 else f"{ratio:.1f}" if ratio >= 10 else f"{ratio:.2g}"
        ax.annotate(f" {label}x", (ratio, y), va="center", fontsize=7)
        if r.goal is not None:
            ax.plot([r.goal], [y], marker="|", color="black", markersize=14, markeredgewidth=2)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r.operation for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("ratio other / rune_fast (> 1: rune_fast faster or smaller)\n"
                  "| = target; green met, red missed, grey no target", fontsize=9)
    title = f"rune_fast vs SQLite, {report.config['n']:,} messages, {report.machine['cpu']}"
    if report.rune_store != RUNE_REF:
        title += f"\n(rune side: {report.rune_store} -- not the real repository)"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


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
        rune_store = _load_ref(args.store)
        factory = _load_ref(args.factory)
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
