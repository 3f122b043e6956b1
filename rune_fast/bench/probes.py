"""The parts of the SQLite comparison that run outside the timing process:
stores named by reference (so a subprocess can open them), the machine and
disk facts, and the probe subprocesses that measure memory, bytes written and
a killed writer from a fresh interpreter."""
from __future__ import annotations

import gc
import importlib
import json
import os
import pickle
import platform
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import workload as wl

__all__ = ["PKG_PARENT", "FACTORY_REF", "SQLITE_REF", "StoreSpec", "ref_of", "load_ref", "record_type_of",
           "machine_info", "disk_usage", "probe", "probe_all", "probe_main"]

# The folder holding the rune_fast package (a checkout's root, or site-packages):
# probe subprocesses import this same rune_fast from there.
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FACTORY_REF = "rune_fast.bench.workload:default_message_factory"
SQLITE_REF = "rune_fast.bench.sqlite_store:SQLiteStore"


# ---------------------------------------------------------------------------
# stores by reference (so subprocesses can open them too)


def ref_of(obj: Any) -> tuple[str, str | None]:
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


def load_ref(ref: str, path: str | None = None) -> Any:
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
        return load_ref(self.ref, self.path)

    def message_factory(self) -> Callable[[dict], Any]:
        return load_ref(self.factory_ref, self.factory_path)

    def open(self, state_dir: str, durability: str, record_type: Any = None) -> Any:
        cls = self.cls()
        if self.kind == "sqlite":
            return cls(state_dir, durability=durability, record_type=record_type)
        return cls(state_dir, durability=durability, **self.kwargs)


def record_type_of(msg: Any) -> Any:
    t = type(msg)
    return t if hasattr(t, "from_dict") else None


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
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:", "RssShmem:")):
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


def probe(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one probe job in a fresh interpreter; returns its JSON result."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-c", "from rune_fast.bench.probes import probe_main; probe_main()", json.dumps(job)]
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


def probe_all(jobs: dict[Any, dict[str, Any]], timeout: float, workers: int = 2) -> dict[Any, dict[str, Any]]:
    """Run probe jobs two at a time (they report per-process counters only: RSS and
    /proc/self/io are not disturbed by a neighbour, and no probe's time is reported)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(probe, job, timeout) for key, job in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


def settle_archive(store: Any, timeout: float = 3600.0) -> "tuple[int, int, float] | None":
    """Wait until the idle watcher of ``store`` (a rune_fast writer just
    opened) merged what a bulk load left: compact() leaves its large merges
    to a thread, and a close right after it gives them up. What a
    long-lived store looks like, and no merge runs beside the timed reads
    that follow. Returns (cool files before, after, seconds); None for a
    store without that watcher (another ``--store``)."""
    if not hasattr(store, "_idle_work_due") or getattr(store, "_cool", None) is None:
        return None
    before = len(store._cool.files())
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        time.sleep(0.25)
        with store._lock:
            if store._bg is None and store._bg_merge is None and not store._idle_work_due():
                break
    return before, len(store._cool.files()), time.perf_counter() - t0


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
        rt = record_type_of(probe_msg)
        del cls, probe_msg
        gc.collect()
        base = _proc_status()
        store = spec.open(job["dir"], "fsync", rt)
        opened = _proc_status()
        getter = store.get_message
        search = store.search_ci if spec.kind == "sqlite" else store.search
        for ch in q["channels"]:
            store.window(ch, 8)
        for t in q["tasks"]:
            store.messages_for_task(t)
        for i in q["ids"]:
            getter(i)
        for text, limit in q.get("searches", ()):
            search(text, limit=limit)
        gc.collect()
        after = _proc_status()
        store.close()
        return {"before": base, "opened": opened, "after": after}
    if kind == "bulk":
        return _bulk_job(job, factory, given)
    if kind == "cold":
        spec = need_spec()
        rt = record_type_of(factory(wl.generate(1, seed=99).messages[0]))
        with open(job["queries"]) as f:
            q = json.load(f)
        store = spec.open(job["dir"], "fsync", rt)
        out: dict[str, Any] = {}
        for name, fn, items in (("ids", store.get_message, q["ids"]),
                                ("tasks", store.messages_for_task, q["tasks"])):
            gc.disable()
            t0 = time.perf_counter_ns()
            for item in items:
                fn(item)
            t1 = time.perf_counter_ns()
            gc.enable()
            out[name] = (t1 - t0) / max(1, len(items))
        store.close()
        return out
    if kind in ("io_bulk", "io_durable"):
        w = wl.generate(job["n"], seed=job["seed"])
        msgs = [factory(m) for m in w.messages]
        fresh = [factory(m) for m in w.fresh(job.get("appends", 0), seed=777)]
        rt = record_type_of(msgs[0]) if msgs else None
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
        store = need_spec().open(job["dir"], "fsync", record_type_of(fresh[0]))
        for m in fresh:
            store.append(m)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(f"unknown probe job {kind!r}")


class _PeakSampler:
    """A thread reading RssAnon every ``interval`` seconds; ``peak`` is the highest seen.

    VmHWM (reset through ``/proc/self/clear_refs``) gives the exact peak of the
    whole resident set, mapped pages included; this gives the anonymous part."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = _proc_status().get("RssAnon", 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _proc_status().get("RssAnon", 0))

    def __enter__(self) -> "_PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _proc_status().get("RssAnon", 0))


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _bulk_job(job: dict[str, Any], factory: Callable[[dict], Any], spec: StoreSpec | None) -> dict[str, Any]:
    """Load the pickled workload in batches, timing each call; peak memory growth sampled.

    The workload is in memory as plain dicts before the baseline; each batch's
    records are built outside the timing and dropped after the call, so
    whatever the store keeps shows as growth. ``raw``: the plain loop, one
    ``os.write`` of the batch's JSON lines + ``os.fdatasync`` per batch.
    """
    with open(job["workload"], "rb") as f:
        dicts = pickle.load(f)
    batch = job["batch"]
    rt = record_type_of(factory(dicts[0])) if dicts else None
    calls: list[int] = []
    os.makedirs(job["dir"], exist_ok=True)
    if job.get("raw"):
        fd = os.open(os.path.join(job["dir"], "raw.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for i in range(0, len(dicts), batch):
            data = b"".join(wl.json_line(d) for d in dicts[i:i + batch])
            t0 = time.perf_counter_ns()
            os.write(fd, data)
            os.fdatasync(fd)
            calls.append(time.perf_counter_ns() - t0)
        os.close(fd)
        return {"calls": calls, "compact_ns": 0, "n": len(dicts)}
    if spec is None:
        raise ValueError("probe job 'bulk' names no store (its field 'spec' is empty)")
    spec.cls()
    gc.collect()
    base = _proc_status()
    hwm_reset = _reset_hwm()
    hwm0 = _proc_status().get("VmHWM", 0)
    with _PeakSampler() as sampler:
        store = spec.open(job["dir"], "fsync", rt)
        for i in range(0, len(dicts), batch):
            recs = [factory(d) for d in dicts[i:i + batch]]
            t0 = time.perf_counter_ns()
            store.append_many(recs)
            calls.append(time.perf_counter_ns() - t0)
            del recs
        t0 = time.perf_counter_ns()
        store.compact()
        compact_ns = time.perf_counter_ns() - t0
        store.close()
    after = _proc_status()
    return {"calls": calls, "compact_ns": compact_ns, "n": len(dicts),
            "peak_anon": sampler.peak - base.get("RssAnon", 0),
            "peak_rss": (after.get("VmHWM", 0) - (hwm0 if hwm_reset else base.get("VmRSS", 0))),
            "hwm_reset": hwm_reset, "before": base, "after": after}


def probe_main() -> None:
    """Entry of a probe subprocess: one job, or ``{"job": "multi", "jobs": [...]}`` run in order."""
    job = json.loads(sys.argv[1])
    if job["job"] == "multi":
        print(json.dumps([_probe_job(j) for j in job["jobs"]]))
    else:
        print(json.dumps(_probe_job(job)))
