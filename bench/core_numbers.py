"""One table of the core's numbers on this machine (medians of repeats).

    python3 bench/core_numbers.py [n_messages]

Builds an n-message tail (default 1,000,000, ~400 bytes a line, 200 channels
written to in random order, each working through tasks of ~50 messages of which
half carry the task id, half the messages stamped with an hlc) in a temp folder, then
measures: scan with checksum verification, full rescan into the index, id
lookup and insert cost inside the core, index bytes per message, snapshot save
and open, and content search (exact and ASCII-case-insensitive).
"""
from __future__ import annotations

import mmap
import os
import random
import statistics
import sys
import tempfile
import time

# numpy's BLAS worker threads are never used by the core; on a 2-core machine
# their idle spinning only steals CPU from the measurement
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import orjson  # noqa: E402

from rune_fast import _index, _log  # noqa: E402

REPEATS = 7


def key(s: str) -> bytes:
    return orjson.dumps(s)[1:-1]


def make_rests(n: int, seed: int = 1) -> list[bytes]:
    rnd = random.Random(seed)
    words = ("the quick brown fox jumps over lazy dog agent tool call result assistant user "
             "plan step retry error function return value context window token").split()
    out = []
    current = {}          # channel -> (task, messages left in it): agents work task by task
    ntask = 0
    for i in range(n):
        ch = f"ch_{rnd.randrange(200):04d}"
        task, left = current.get(ch, ("", 0))
        if left == 0:
            ntask += 1
            task, left = f"task_{ntask:022d}", 50
        current[ch] = (task, left - 1)
        task = task if i % 2 else ""
        hlc = f"{1732900000000 + i:015d}-0000000000-dev1" if i % 4 < 2 else ""
        text = " ".join(rnd.choice(words) for _ in range(rnd.randrange(10, 40)))
        out.append(b',"k":"m","r":{"msg_id":"' + key(f"msg_{i:026d}") + b'","channel_id":"'
                   + ch.encode() + b'","task_id":"' + task.encode() + b'","hlc":"' + hlc.encode()
                   + b'","content":"' + text.encode() + b'","role":"user","ts":1732900000.5,'
                   b'"token_estimate":12,"tool_calls":[],"tool_call_id":"","origin":""}}')
    return out


def median_time(fn, repeats=REPEATS):
    """Median wall time of fn; the median CPU time of the process is kept in
    CPU[0] (on a shared, noisy machine it shows the cost of the code itself)."""
    ts, cs = [], []
    for _ in range(repeats):
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        cs.append(time.process_time() - c0)
    CPU[0] = statistics.median(cs)
    return statistics.median(ts)


CPU = [0.0]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    d = tempfile.mkdtemp(prefix="rf-core-bench-")
    seg = os.path.join(d, "seg-00000000.jsonl")
    rests = make_rests(n)
    data = _log.frame_many(rests)
    del rests
    w = _log.TailWriter(seg)
    w.append(data)
    w.sync()
    w.close()
    size = len(data)
    f = open(seg, "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    rows = []

    t = median_time(lambda: _log.scan_frames(m))
    rows.append(("scan + xxh3 verify (scan_frames)", f"{size / t / 1e9:.2f} GB/s",
                 f"{size / CPU[0] / 1e9:.2f} GB/s", ">= 1 GB/s"))
    scan_cpu = CPU[0]

    def rescan():
        ix = _index.HotIndex()
        ix.attach(0, m)
        ix.ingest(0)
        return ix
    t = median_time(rescan, 5)
    c = CPU[0]
    rows.append(("open by full rescan (ingest, verify, index)", f"{t * 1e3:.0f} ms",
                 f"{c * 1e3:.0f} ms", "< 1 s"))
    scan_t = median_time(lambda: _log.scan_frames(m), 3)
    rows.append(("insert cost inside the core ((ingest - scan) / n)",
                 f"{max(t - scan_t, 0) / n * 1e9:.0f} ns", f"{max(c - scan_cpu, 0) / n * 1e9:.0f} ns",
                 "< 300 ns"))

    ix = rescan()
    rnd = random.Random(2)
    keys = [key(f"msg_{rnd.randrange(n):026d}") for _ in range(200_000)]
    misses = [key(f"msg_x{rnd.randrange(n):025d}") for _ in range(200_000)]
    empty = [b""] * 0
    base = median_time(lambda: ix.find_many(empty), 3)
    t = median_time(lambda: ix.find_many(keys))
    rows.append(("id lookup, hit, verified against the line (find_many)",
                 f"{(t - base) / len(keys) * 1e9:.0f} ns", f"{CPU[0] / len(keys) * 1e9:.0f} ns",
                 "< 300 ns"))
    t = median_time(lambda: ix.find_many(misses))
    rows.append(("id lookup, miss", f"{(t - base) / len(misses) * 1e9:.0f} ns",
                 f"{CPU[0] / len(misses) * 1e9:.0f} ns", "< 300 ns"))
    t = median_time(lambda: [ix.find(k) for k in keys[:100_000]], 5)
    rows.append(("id lookup from Python (find, one call each, cold)", f"{t / 100_000 * 1e9:.0f} ns",
                 f"{CPU[0] / 100_000 * 1e9:.0f} ns", ""))
    rows.append(("index memory per message (nbytes / len)", f"{ix.nbytes / len(ix):.1f} B", "",
                 "<= 32 B"))

    snap = os.path.join(d, "index.snap")
    t = median_time(lambda: ix.save_snapshot(snap, {0: size}), 3)
    rows.append(("snapshot save (incl. fsync)", f"{t * 1e3:.0f} ms", f"{CPU[0] * 1e3:.0f} ms", ""))

    def open_snap():
        j, _ = _index.HotIndex.load_snapshot(snap)
        j.attach(0, m)
        j.ingest(0, size)          # the bytes after the snapshot (none here)
        return j
    t = median_time(open_snap)
    rows.append(("open from snapshot (load + attach)", f"{t * 1e3:.1f} ms", f"{CPU[0] * 1e3:.1f} ms",
                 "< 100 ms"))
    j = open_snap()
    ch = b"ch_0007"
    assert j.channel_locs(ch).tolist() == ix.channel_locs(ch).tolist()
    del j

    t = median_time(lambda: ix.search(b"zebra"), 5)
    rows.append(("search exact, no hit (all channels)", f"{size / t / 1e9:.2f} GB/s",
                 f"{size / CPU[0] / 1e9:.2f} GB/s", ">= 1 GB/s"))
    t = median_time(lambda: ix.search(b"ZEBRA", True), 5)
    rows.append(("search ASCII-case-insensitive, no hit", f"{size / t / 1e9:.2f} GB/s",
                 f"{size / CPU[0] / 1e9:.2f} GB/s", ">= 1 GB/s"))
    t = median_time(lambda: ix.search(b"window token", True), 5)
    hits = len(ix.search(b"window token", True))
    rows.append((f"search ASCII-ci, {hits / n:.0%} of lines hit", f"{size / t / 1e9:.2f} GB/s",
                 f"{size / CPU[0] / 1e9:.2f} GB/s", ""))
    t = median_time(lambda: ix.channel_locs(ch, 8), 9)
    rows.append(("window: last 8 locs of a channel", f"{t * 1e6:.1f} us", f"{CPU[0] * 1e6:.1f} us", ""))

    print(f"rune_fast core, {n:,} messages, tail {size / 1e6:.0f} MB, "
          f"{os.cpu_count()} CPUs, medians of up to {REPEATS} runs")
    w1 = max(len(r[0]) for r in rows)
    print(f"{'measure':<{w1}}  {'wall':>11}  {'cpu':>11}  target")
    for name, val, cpu, tgt in rows:
        print(f"{name:<{w1}}  {val:>11}  {cpu:>11}  {tgt}")
    del ix
    m.close()
    f.close()
    for p in os.listdir(d):
        os.unlink(os.path.join(d, p))
    os.rmdir(d)


if __name__ == "__main__":
    main()
