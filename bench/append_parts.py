"""Where one ``append_many(1,000)`` spends its time, part by part.

    python bench/append_parts.py STORE_DIR [--calls N] [--batch B] [--sqlite SQLITE_DIR]

``STORE_DIR`` is a copy of a loaded store (``cp -a``: it is written to).
Fresh records of the bench workload (``rune_fast.bench.workload``) are built
outside the timing; each call's parts are timed by wrapping the functions
the append path calls (a few hundred ns of wrapper each), and the garbage
collector's passes by ``gc.callbacks``. Prints, per part, the median per
call in microseconds, wall and the main thread's CPU ("[cpu]"), and with
``--sqlite`` SQLite's one-transaction batch interleaved call by call
(``synchronous=FULL``: both durable on return). ``--no-parts`` times the
calls alone (no wrappers): what the before/after runs compare.

The main thread's CPU is the number to compare on a shared machine: with
more runnable threads than cores the wall time of every part stretches by
the load (measured at load 7-8 on 2 cores: wall about 3.5x CPU).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rune_fast import ConversationStateRepository, codec  # noqa: E402
from rune_fast._conv import writes  # noqa: E402
from rune_fast.bench import workload as wl  # noqa: E402

PARTS: dict[str, float] = defaultdict(float)


def wrap(owner: Any, name: str, part: str) -> None:
    fn = getattr(owner, name)

    def timed(*a: Any, **k: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            PARTS[part] += time.perf_counter() - t0
            PARTS[part + " [cpu]"] += time.thread_time() - c0
    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--sqlite")
    ap.add_argument("--no-parts", action="store_true")
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--compact-every", type=int, default=64)
    ap.add_argument("--durability", default="fsync")
    ap.add_argument("--switch", type=float, help="sys.setswitchinterval (seconds)")
    args = ap.parse_args()

    if args.switch:
        sys.setswitchinterval(args.switch)
    w = wl.generate(2000, seed=1)
    fresh = w.fresh(args.calls * args.batch * (2 if args.sqlite else 1), seed=args.seed)
    recs = [wl.default_message_factory(m) for m in fresh]
    repo = ConversationStateRepository(args.store, compact_every=args.compact_every, hot_window=512,
                                       durability=args.durability)
    sql = None
    if args.sqlite:
        from rune_fast.bench.sqlite_store import SQLiteStore
        sql = SQLiteStore(args.sqlite, durability="fsync", record_type=type(recs[0]))
    if not args.no_parts:
        wp = writes.WritePath
        wrap(codec, "encode_batch", "encode (encode_messages)")
        wrap(wp, "_fresh", "fresh (find_many, tombstones)")
        wrap(writes, "frame_messages", "frame_messages")
        wrap(type(repo._tail), "append", "tail write")
        wrap(type(repo._writes), "sync_begin", "sync_begin")
        wrap(type(repo._writes), "sync_end", "sync_end (join the tail's sync)")
        wrap(type(repo._writes), "wait_durable", "wait_durable")
        wrap(type(repo), "_index_ingest", "index ingest")
        wrap(type(repo), "_index_written", "_index_written (all after the write)")
        wrap(type(repo), "_observe_stamps", "observe stamps")
        # (the payload hashes: in message_envelopes' caller, or a C thread's since the encoding)
        wrap(codec, "hash_canonical", "sha256 payload hashes (hashlib, before b883d5f)")
        wrap(writes, "message_envelopes", "message_envelopes")
        wrap(type(repo._events), "append_encoded", "journal write")
        wrap(type(repo), "_auto_compact", "auto compaction")
        wrap(type(repo), "_trim_cache", "trim cache")
        wrap(type(repo), "_write_messages", "_write_messages (under lock)")
        wrap(type(repo._cool), "contains_many", "fresh: archive contains_many")
    gc_t = [0.0, 0]

    def gc_cb(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t[1] = time.perf_counter()
        else:
            PARTS["gc"] += time.perf_counter() - gc_t[1]
    gc.callbacks.append(gc_cb)

    per: dict[str, list[float]] = defaultdict(list)
    pos = 0
    for c in range(args.calls):
        batch = recs[pos:pos + args.batch]
        pos += args.batch
        PARTS.clear()
        PARTS["threads alive at the start (count)"] = 1e-6 * (threading.active_count() - 1)
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        repo.append_many(batch)
        t1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
        per["TOTAL wall"].append(t1 - t0)
        per["TOTAL main-thread CPU"].append(c1 - c0)
        per["TOTAL process CPU (all threads)"].append(p1 - p0)
        for k, v in PARTS.items():
            per[k].append(v)
        if sql is not None:
            sb = recs[pos:pos + args.batch]
            pos += args.batch
            PARTS.clear()
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            sql.append_many(sb)
            t1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
            per["SQLITE wall"].append(t1 - t0)
            per["SQLITE main-thread CPU"].append(c1 - c0)
            per["SQLITE process CPU (all threads)"].append(p1 - p0)
            per["SQLITE gc"].append(PARTS.get("gc", 0.0))
        del batch
    repo.close()
    if sql is not None:
        sql.close()
    print(f"{args.calls} calls of append_many({args.batch}) into {args.store}; medians (mean) in us per call")
    for k in sorted(per, key=lambda k: -statistics.median(per[k] + [0] * (args.calls - len(per[k])))):
        v = per[k] + [0.0] * (args.calls - len(per[k]))
        print(f"  {k:40s} {statistics.median(v) * 1e6:10.0f} ({statistics.mean(v) * 1e6:8.0f})")


if __name__ == "__main__":
    main()
