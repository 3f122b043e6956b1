"""Where the time of a bulk load's cooling goes: the load of
``bench/build_10m.py`` (the same workload, batches of 1,000, compact_every 64,
hot_window 512) with the cooling, compaction and archive-writing functions
wrapped to sum their wall and thread CPU time per thread, then the state the
load leaves to the final ``compact()`` and that call's own breakdown.

    python bench/cooling_profile.py --n 200000 --dir /tmp/prof

Inclusive times (a function's callees count in it too); one line per
(phase, thread, function). Not part of the test run.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import os
import shutil
import sys
import threading
import time
from collections import defaultdict
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from rune_fast import conversation_state as cs  # noqa: E402
from rune_fast._conv import compaction, cooling  # noqa: E402
from rune_fast.bench import workload as wl  # noqa: E402
from rune_fast.cool import files, tables, writer  # noqa: E402

_STATS: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
_PHASE = ["load"]
SLOW = 8        # slowest calls shown (wall/cpu ms per function of the main thread)


def _thread() -> str:
    name = threading.current_thread().name
    return name.split("(")[0].strip() if name != "MainThread" else "main"


def _wrap(owner: Any, attr: str, label: str | None = None) -> None:
    fn = getattr(owner, attr, None)
    if fn is None:
        print(f"(not profiled: {getattr(owner, '__name__', owner)}.{attr} is gone)", file=sys.stderr)
        return
    label = label or f"{getattr(owner, '__name__', owner)}.{attr}"

    @functools.wraps(fn)
    def timed(*a: Any, **k: Any) -> Any:
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            s = _STATS[(_PHASE[0], _thread(), label)]
            s[0] += 1
            s[1] += time.perf_counter() - w0
            s[2] += time.thread_time() - c0

    setattr(owner, attr, timed)


def _instrument() -> None:
    R = cs.ConversationStateRepository
    for attr in ("append_many", "_auto_compact", "_compact_now", "_settle_bg", "_stage_cooling",
                 "_lines_table", "_cooled", "_excess", "_compact_segments", "_rewrite_segments",
                 "_write_snapshot", "_write_manifest", "_cool_table_at", "_cool_in_files", "_join_chore",
                 "_roll_tail", "_in_file_order", "_by_task", "_gather", "_fold", "_write_messages",
                 "_index_written", "_unindex_many", "_forget_decoded_many", "_remove_files",
                 "_set_segment_order", "_bound_maps", "_forget_interleaving", "_plan_merge", "_mergeable",
                 "_index_attach", "_index_relocate", "_move_decoded", "_add_segment", "_line_seq",
                 "_new_seg_no", "_index_detach"):
        _wrap(R, attr)
    A = writer._Writer
    for attr in ("stage_table", "stage_parts", "cool_table", "cool_parts", "_write_file", "stage_merge", "adopt", "adopt_merge",
                 "_write_tmp", "unlink_files"):
        _wrap(A, attr)
    _wrap(files._FileSet, "_write_parts")
    _wrap(compaction, "write_file", "compaction.write_file")
    _wrap(writer, "_index_of_keys")
    _wrap(writer, "_file_digest")
    _wrap(writer, "_footer_hash")
    _wrap(writer, "_channel_order")
    _wrap(writer, "_merge_order")
    _wrap(tables, "table_from_lines")
    _wrap(cooling, "table_from_lines")
    _wrap(tables._encode, "cool_columns", "_encode.cool_columns")
    _wrap(pq.ParquetWriter, "write_table", "ParquetWriter.write_table")
    _wrap(os, "fsync")
    _wrap(os, "fdatasync")


_SIZES: dict[str, list[int]] = defaultdict(list)


def _sizes() -> None:
    """Record the bytes a segment rewrite writes and the tail's size at each roll."""
    wf = compaction.write_file

    def write_file(path: str, data: Any, **k: Any) -> Any:
        _SIZES["segment rewrite MB"].append(len(data) >> 20)
        return wf(path, data, **k)

    compaction.write_file = write_file
    R = cs.ConversationStateRepository
    roll = R._roll_tail

    def _roll_tail(self: Any) -> Any:
        _SIZES["tail at roll MB"].append(self._tail.size >> 20)
        return roll(self)

    R._roll_tail = _roll_tail


def _report(title: str) -> None:
    print(f"\n== {title}")
    rows = sorted(_STATS.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[1][1]))
    print(f"{'phase':8} {'thread':22} {'function':42} {'calls':>7} {'wall s':>8} {'cpu s':>8}")
    for (phase, th, label), (n, w, c) in rows:
        print(f"{phase:8} {th:22} {label:42} {n:7d} {w:8.2f} {c:8.2f}")


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) << 10
    return 0


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _Mallinfo2


def _malloc_used() -> int:
    """glibc malloc's bytes in use (small chunks + mmapped blocks)."""
    m = _LIBC.mallinfo2()
    return m.uordblks + m.hblkhd


class _Peak:
    """RssAnon sampled every 5 ms, with what ran at its peak."""

    def __init__(self, store: Any) -> None:
        self.store, self.base, self.peak, self.at = store, _rss_anon(), 0, ""
        self.timeline: list[tuple] = []     # (s, RssAnon growth, pyarrow pool bytes, call no, jobs)
        self.calls = 0
        self.t0 = time.perf_counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(0.005):
            v = _rss_anon() - self.base
            n += 1
            if v > self.peak or n % 20 == 0:
                jobs = []
                for name in ("_bg", "_bg_merge"):
                    job = getattr(self.store, name, None)
                    if job is not None and not job.done.is_set():
                        rows = self.store._cool.file_rows()
                        jobs.append(f"{job.kind}({len(job.locs) or sum(rows.get(n, 0) for n in getattr(job, 'sources', ()))})")
                        if job.kind == "cool":
                            jobs.append(f"queued {job._parts.qsize()}")
                at = f"{_PHASE[0]} {' '.join(jobs) or 'no job'} malloc in use {_malloc_used() >> 20} MiB"
                self.timeline.append((round(time.perf_counter() - self.t0, 3), v, pa.total_allocated_bytes(),
                                      self.calls, at))
                if v > self.peak:
                    self.peak, self.at = v, at


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--dir", required=True)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--timeline", help="write the RssAnon samples (JSON) here")
    p.add_argument("--workload", help="a pickled list of message dicts (bench/bulk_ab.py's workload.pkl)")
    p.add_argument("--bare", action="store_true", help="no function wrapped (timings as the bench's)")
    args = p.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    _sizes()
    if not args.bare:
        _instrument()
    if args.workload:
        # (the bench's bulk probe: the messages generated beforehand, as
        # plain dicts in memory, each batch's records built before its call)
        import pickle
        with open(args.workload, "rb") as f:
            dicts = pickle.load(f)[:args.n]
        batches = (dicts[a:a + args.batch] for a in range(0, len(dicts), args.batch))
    else:
        _c, _t, batches = wl.iter_batches(args.n, args.batch, seed=0)
    store = cs.ConversationStateRepository(args.dir, durability="fsync", compact_every=64, hot_window=512)
    peak = _Peak(store)
    calls = []
    slowest: list[tuple[float, dict]] = []     # the SLOW slowest calls: main thread's time per function
    t_load = time.perf_counter()
    for batch in batches:
        recs = [wl.default_message_factory(m) for m in batch]
        before = {k: (v[1], v[2]) for k, v in _STATS.items() if k[1] == "main"}
        t0 = time.perf_counter()
        store.append_many(recs)
        calls.append(time.perf_counter() - t0)
        peak.calls = len(calls)
        if len(calls) % 100 == 0:
            c = store._cool
            ids = getattr(c, "_ids_d", None)
            print(f"call {len(calls)}: RssAnon {(_rss_anon() - peak.base) >> 20} MiB, malloc in use "
                  f"{_malloc_used() >> 20} MiB, hot index {len(store._index):,} ids {store._index.nbytes >> 20} MiB, "
                  f"decoded {len(store._decoded)} {store._decoded.nbytes >> 20} MiB, cool decoded "
                  f"{store._cool_decoded.nbytes >> 20} MiB, cool ids "
                  f"{(ids.nbytes + ids.memo_bytes + ids.filter_bytes) >> 20 if ids is not None else '?'} MiB, "
                  f"pyarrow {pa.total_allocated_bytes() >> 20} MiB, tail {store._tail.size >> 20} MiB", flush=True)
        if len(slowest) < SLOW or calls[-1] > slowest[-1][0]:
            spent = {k[2]: (v[1] - before.get(k, (0.0, 0.0))[0], v[2] - before.get(k, (0.0, 0.0))[1])
                     for k, v in _STATS.items() if k[1] == "main"}
            slowest.append((calls[-1], {f: w for f, w in spent.items() if w[0] > 0.005}))
            slowest.sort(key=lambda x: -x[0])
            del slowest[SLOW:]
    load = time.perf_counter() - t_load
    excess = len(store._index.excess(store.hot_window))
    job = store._bg
    print(f"after the load: excess {excess:,} rows, cool files {len(store._cool.files())}, "
          f"rows per file {sorted(store._cool.file_rows().values())}, "
          f"job {None if job is None else (job.kind, job.done.is_set())}")
    _PHASE[0] = "compact"
    t0 = time.perf_counter()
    rep = store.compact()
    comp = time.perf_counter() - t0
    files_after = sorted(store._cool.file_rows().values())
    job = getattr(store, "_bg_merge", None)
    _PHASE[0] = "close"
    t0 = time.perf_counter()
    store.close()
    close = time.perf_counter() - t0
    peak.stop.set()
    print(f"peak RssAnon growth {peak.peak / len(calls) / args.batch:.0f} B/msg at: {peak.at}")
    print(f"after compact(): cool files {len(files_after)} {files_after}, merge in flight "
          f"{job is not None and not job.done.is_set()}; close() {close:.2f} s")
    n = len(calls) * args.batch
    print(f"load {load:.1f} s wall, append_many sum {sum(calls):.1f} s = {sum(calls) / n * 1e6:.1f} us/msg, "
          f"max {max(calls) * 1e3:.0f} ms, mean {sum(calls) / len(calls) * 1e3:.1f} ms; "
          f"compact() {comp:.2f} s ({rep})")
    for took, spent in slowest:
        print(f"slow append_many {took * 1e3:.0f} ms: "
              + ", ".join(f"{f.split('.')[-1]} {w * 1e3:.0f}/{c * 1e3:.0f}"
                         for f, (w, c) in sorted(spent.items(), key=lambda x: -x[1][0])))
    for k, v in _SIZES.items():
        print(f"{k}: {len(v)}, largest {sorted(v)[-8:]}")
    _report("inclusive times")
    if args.timeline:
        import json
        with open(args.timeline, "w") as f:
            json.dump({"calls": calls, "samples": peak.timeline}, f)


if __name__ == "__main__":
    main()
