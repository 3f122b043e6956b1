"""Memory probe: resident memory per stored message, anonymous and mapped apart.

    python -m bench.memory_probe N [--dir DIR] [--hot-window H] [--reuse]
                                   [--no-search] [--trace K]

Three fresh processes, so that none measures what another left behind:

1. *generate*: the bench workload of ``N`` messages (``rune_fast.bench.workload``),
   written to ``DIR.jsonl`` with the read mix's ids (``DIR.mix.json``);
2. *load*: an empty store at ``DIR`` filled by ``append_many`` in batches of
   1,000 read one at a time from ``DIR.jsonl`` (the workload's own memory is
   not the store's), then ``compact()``; the peak growth of RssAnon over the
   process after its imports, sampled after every batch and by a thread every
   2 ms, per message;
3. *read*: the store opened read-only, then the read mix of issue 33 --
   ``window(ch, 8)`` on every channel, ``messages_for_task`` on 1% of the
   tasks, ``get_message`` on 10,000 ids, five ``search(q, limit=20)`` -- and
   the growth of RssAnon and RssFile after each step, per stored message.

Mapped file pages (RssFile: the segment maps, the index snapshot, Parquet
reads) are the page cache's; they are shown, not counted. ``--reuse`` skips
steps 1-2 when ``DIR`` exists; ``--trace K`` prints the K largest tracemalloc
sites after the reads (slow; the RSS numbers then include tracemalloc's own).

Measured 2026-12-05 (2 shared cores; RssAnon growth per stored message
after the read mix without searches, one run each; the searches belong to
the search path's own fix):

=============  ==========================  ==========================
store          before (1f08298)            after (cache_bytes 48 MiB)
=============  ==========================  ==========================
100,000        980 B (entry-bound caches)  440-513 B (caches <= 48 MiB)
1,000,000      168 B                       93-111 B
=============  ==========================  ==========================

At 1,000,000 the 111 B were: the record caches (23 + 5 MiB counted) and
the row groups (17 MiB), all bounded by ``cache_bytes``; the cool tier's id index
17 MiB (a C hash table, 37 B per cool row), task maps ~5 MiB, the rest
allocator slack (malloc_trim gives back ~19 MiB). RssFile is not counted.
The bulk load's peak (1,805 B/msg at 1,000,000 before; these caches do
not change it) is the cooling: a background run builds one Arrow table of
every row it cools (up to 426 MiB allocated at once, 758 MiB RssAnon
during the appends), and the final compact() peaked at 1,518 MiB (438 MiB
of it Arrow's). After: peak 1,603 B/msg, Arrow's pool at its peak 1,254.

Session 24 (branch memory; same probe, one run each, 2 shared cores with
tests running; default cache_bytes 48 MiB):

==============================  ==================  ======================
                                before (ffb8895)    after
==============================  ==================  ======================
100,000: bulk-load peak         1,334-1,604 B/msg   623-634 B/msg
  (Arrow's pool at its peak)    470-585             127-159
100,000: read mix, gets/search  237-244 / 300       186-197 / 256-267
1,000,000: bulk-load peak       844 B/msg           230 B/msg
  appends / final compact()     (not shown apart)   215 / 230
  (Arrow's pool at its peak)    457                 86
1,000,000: read mix             75.3 / 94.8         48.8 / 75.0
==============================  ==================  ======================

What changed: cool files written a row group at a time (merges channel
by channel), compactions cool at most 16,384 messages a file, Arrow on
malloc (mimalloc kept what background threads freed), the cool id index
at 23 bytes a row (37). At 100,000 the 48 MiB of caches are most of what
is left (see tuning.CACHE_BYTES); ``--cache-bytes`` measures others.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any

QUERIES = ("Quarterly report", "überweisung", "error", "zürich", "东京")


def status() -> dict[str, int]:
    """RssAnon and RssFile of this process, in bytes (/proc/self/status)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def _generate(d: str, n: int) -> None:
    from rune_fast.bench import workload
    w = workload.generate(n, seed=0)
    rng = random.Random(1)
    with open(d + ".jsonl", "wb") as f:
        for m in w.messages:
            f.write(workload.json_line(m))
    ids = [m["msg_id"] for m in rng.sample(w.messages, min(10_000, n))]
    tasks = rng.sample(w.task_ids, max(1, len(w.task_ids) // 100))
    with open(d + ".mix.json", "w") as f:
        json.dump({"n": n, "channels": w.channel_ids, "tasks": tasks, "ids": ids}, f)


def _load(d: str, hot_window: int, cache_bytes: int | None) -> dict[str, Any]:
    from rune_fast.bench import workload
    from rune_fast.conversation_state import ConversationStateRepository
    import rune_fast.cool  # noqa: F401  (imports are not the load's memory)
    import pyarrow.parquet  # noqa: F401
    base = status()["RssAnon"]
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], status()["RssAnon"])

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    kw = {} if cache_bytes is None else {"cache_bytes": cache_bytes}
    repo = ConversationStateRepository(d, durability="batch", hot_window=hot_window, **kw)
    n = 0
    slowest = 0.0
    with open(d + ".jsonl", "rb") as f:
        while True:
            lines = [f.readline() for _ in range(1000)]
            batch = [workload.default_message_factory(json.loads(x)) for x in lines if x]
            if not batch:
                break
            t1 = time.perf_counter()
            repo.append_many(batch)
            slowest = max(slowest, time.perf_counter() - t1)
            n += len(batch)
            del batch, lines
            peak[0] = max(peak[0], status()["RssAnon"])
    import pyarrow as pa
    load_peak, load_arrow = peak[0], pa.default_memory_pool().max_memory()
    before = status()["RssAnon"]
    t2 = time.perf_counter()
    repo.compact()
    compact_s = time.perf_counter() - t2
    peak[0] = max(peak[0], status()["RssAnon"])
    end = status()["RssAnon"]
    repo.close()
    done.set()
    t.join()
    return {"n": n, "seconds": time.perf_counter() - t0, "slowest_batch_ms": slowest * 1e3,
            "peak_anon_per_msg": (peak[0] - base) / n, "end_anon_per_msg": (end - base) / n,
            "arrow_peak_per_msg": pa.default_memory_pool().max_memory() / n,
            "appends_peak_per_msg": (load_peak - base) / n, "appends_arrow_per_msg": load_arrow / n,
            "before_compact_per_msg": (before - base) / n, "compact_ms": compact_s * 1e3}


def _read(d: str, search: bool, trace: int, cache_bytes: int | None) -> dict[str, Any]:
    from rune_fast.conversation_state import ConversationStateRepository
    import rune_fast.cool  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    with open(d + ".mix.json") as f:
        mix = json.load(f)
    if trace:
        import tracemalloc
        tracemalloc.start(8)
    r0 = status()
    steps = []
    kw = {} if cache_bytes is None else {"cache_bytes": cache_bytes}
    repo = ConversationStateRepository(d, read_only=True, **kw)
    n = len(repo)
    steps.append(("open", status()))
    for ch in mix["channels"]:
        repo.window(ch, 8)
    steps.append(("windows", status()))
    for t in mix["tasks"]:
        repo.messages_for_task(t)
    steps.append(("tasks", status()))
    for i in mix["ids"]:
        repo.get_message(i)
    steps.append(("gets", status()))
    if search:
        for q in QUERIES:
            repo.search(q, limit=20)
        steps.append(("searches", status()))
    out: dict[str, Any] = {"n": n}
    for name, r in steps:
        out[name] = {k: round((r[k] - r0[k]) / n, 1) for k in ("RssAnon", "RssFile")}
    if trace:
        snap = tracemalloc.take_snapshot()
        out["trace"] = [(round(s.size / n, 2), s.count, s.traceback.format()[-4:])
                        for s in snap.statistics("traceback")[:trace]]
    repo.close()
    return out


def _child(step: str, *args: str) -> Any:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cp = subprocess.run([sys.executable, "-m", "bench.memory_probe", "--step", step, *args],
                        cwd=here, capture_output=True, text=True)
    if cp.returncode:
        raise SystemExit(f"memory_probe {step} failed:\n{cp.stderr}")
    return json.loads(cp.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("n", type=int)
    ap.add_argument("--dir")
    ap.add_argument("--hot-window", type=int, default=512)
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--no-search", action="store_true")
    ap.add_argument("--trace", type=int, default=0)
    ap.add_argument("--cache-bytes", type=int, default=None,
                    help="the repository's cache_bytes (default: its default)")
    ap.add_argument("--step", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    d = os.path.abspath(a.dir or f"/tmp/rf_memprobe_{a.n}_{a.hot_window}")
    os.makedirs(os.path.dirname(d), exist_ok=True)
    if a.step == "generate":
        _generate(d, a.n)
        print(json.dumps({}))
        return
    if a.step == "load":
        print(json.dumps(_load(d, a.hot_window, a.cache_bytes)))
        return
    if a.step == "read":
        print(json.dumps(_read(d, not a.no_search, a.trace, a.cache_bytes)))
        return
    common = [str(a.n), "--dir", d, "--hot-window", str(a.hot_window)]
    if a.cache_bytes is not None:
        common += ["--cache-bytes", str(a.cache_bytes)]
    if not (a.reuse and os.path.isdir(d)):
        if os.path.exists(d):
            raise SystemExit(f"{d} exists: remove it or pass --reuse")
        if not os.path.exists(d + ".mix.json"):
            _child("generate", *common)
        load = _child("load", *common)
        print(f"bulk load of {load['n']:,}: {load['seconds']:.1f} s, slowest batch "
              f"{load['slowest_batch_ms']:.0f} ms, peak RssAnon growth "
              f"{load['peak_anon_per_msg']:.0f} B/msg (at the end {load['end_anon_per_msg']:.0f}; "
              f"Arrow's pool at its peak {load['arrow_peak_per_msg']:.0f})\n"
              f"  during the appends: peak {load['appends_peak_per_msg']:.0f} B/msg (Arrow "
              f"{load['appends_arrow_per_msg']:.0f}), before compact() {load['before_compact_per_msg']:.0f}; "
              f"compact() {load['compact_ms']:.0f} ms")
    extra = (["--no-search"] if a.no_search else []) + ["--trace", str(a.trace)]
    got = _child("read", *common, *extra)
    print(f"read mix on {got['n']:,} messages (growth per stored message, bytes):")
    for name in ("open", "windows", "tasks", "gets", "searches"):
        if name in got:
            print(f"  after {name:9s} RssAnon {got[name]['RssAnon']:8.1f}   RssFile {got[name]['RssFile']:8.1f}")
    for size, count, tb in got.get("trace", ()):
        print(f"{size:8.2f} B/msg {count:9d} blocks", *tb, sep="\n    ")


if __name__ == "__main__":
    main()
