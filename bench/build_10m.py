"""Build a 10,000,000-message store in bulk and measure the lines that matter at that size.

    python bench/build_10m.py --dir /big/disk/rune10m                  # rune_fast only (~1 h on 2 cores)
    python bench/build_10m.py --dir /big/disk/rune10m --sqlite         # also SQLite (about twice as long)
    python bench/build_10m.py --n 1000000 --dir /tmp/r1m --json r.json # any size

The workload is :func:`rune_fast.bench.workload.iter_batches` (the same messages
``python -m rune_fast.bench --n N`` uses, made batch by batch: the driver never
holds them all). Steps:

1. **Bulk load** in a fresh child process per store: ``append_many`` batches of
   1,000 built from the stream (records made outside the timing), every call
   timed, then ``compact()``; peak anonymous memory growth sampled every 2 ms
   and VmHWM; durable single appends (``fsync``) timed when the store holds
   10,000, 100,000, 1,000,000 and N messages (per-append cost against store
   size; they go to a channel of their own and hold no needle): at each such
   point the store is settled first, as the 1,000,000 bench's stores are
   before their appends are timed: ``compact()`` (N's is the timed one
   after the load) and the wait for the merges of cool files in flight,
   both counted in the load's time; then PROBE_SLICES runs of
   PROBE_APPENDS // PROBE_SLICES appends (their median). Taken mid-load
   instead, beside the cooling run the load leaves in flight (fed by the
   appends themselves) and its merges, they read 117/131/210/203 us (one
   run of 100 beside a merge: 825 us). The child also
   counts every needle's hits with ``str.casefold`` and keeps the newest 20 ids.
2. **Reads** in this process, on the built store: open + first window,
   window(ch, 8), get_message, messages_for_task (random and the biggest
   tasks), and every needle class with and without ``limit=20``; the answers
   are checked against the child's counts. The unlimited search of the common
   needle (most of N messages decoded into one list) is skipped above
   2,000,000 messages: it would not fit in memory, on either side.
3. **Scan floor**: the memmem scan of :class:`rune_fast.bench.floors.ContentBuffer`
   over the content of the first ``--scan-sample`` messages (regenerated),
   scaled linearly to all N (stated as extrapolated in the table); for the 10%
   needle the scan plus the decoding of its hits in that sample, as the 1M bench.
4. **Fresh processes**: resident memory after open + the read mix (window on
   every channel, messages_for_task on 1% of tasks, get_message on 10,000 ids,
   five searches) and each id once / each task once, as in
   ``python -m rune_fast.bench``.

Prints a table (rune_fast, SQLite when ``--sqlite``, plain loop) and writes
``--json``. Leaves the stores in ``--dir`` (``--clean`` removes them).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections import deque
from dataclasses import asdict
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from rune_fast.bench import workload as wl  # noqa: E402
from rune_fast.bench.floors import ContentBuffer, decoder, hit_lines  # noqa: E402
from rune_fast.bench.probes import (SQLITE_REF, PKG_PARENT, StoreSpec, _PeakSampler, _proc_status,  # noqa: E402
                                    _reset_hwm, disk_usage, machine_info, probe, record_type_of,
                                    settle_archive)
from rune_fast.bench.report import RUNE_REF, Report, Row, fmt_value, format_markdown, format_table  # noqa: E402
from rune_fast.bench.searches import LIMIT, hit_id  # noqa: E402

CHECKPOINTS = (10_000, 100_000, 1_000_000, 10_000_000)
PROBE_APPENDS = 100
PROBE_SLICES = 5


def _spec(kind: str) -> StoreSpec:
    if kind == "rune":
        return StoreSpec("rune", RUNE_REF, PKG_PARENT, {"compact_every": 64, "hot_window": 512})
    return StoreSpec("sqlite", SQLITE_REF, PKG_PARENT, {})


# ---------------------------------------------------------------------------
# step 1: the child that loads


def _probe_messages(factory: Any, at: int, k: int) -> list[Any]:
    out = []
    for i in range(k):
        d = wl.generate(1, seed=at + i).messages[0]
        d = dict(d, msg_id=f"msg_PROBE{at:012d}{i:09d}", channel_id="append-probe", task_id="",
                 content=f"durable append probe {i} at {at}: plain words only", tool_calls=(), tool_call_id="")
        if d["role"] == "tool":
            d["role"] = "user"
        out.append(factory(d))
    return out


def _settle_merges(store: Any, timeout: float = 900.0) -> None:
    """Wait until no merge of cool files and no file chore of rune_fast's
    ``store`` runs beside the append probe (SQLite's: nothing to wait for).
    A cooling run in flight is left: the appends feed it its parts, so it
    waits for them (a wait for it would never end)."""
    if not hasattr(store, "_bg_merge"):
        return
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        with store._lock:
            merge, chore = store._bg_merge, store._chore
            if (merge is None or merge.done.is_set()) and (chore is None or not chore.running()):
                return
        time.sleep(0.01)


def _probe(store: Any, factory: Any, at: int) -> tuple[float, list[float]]:
    """(median, runs): PROBE_SLICES runs of PROBE_APPENDS // PROBE_SLICES
    durable appends, ns an append."""
    probe_msgs = _probe_messages(factory, at, PROBE_APPENDS)
    k = PROBE_APPENDS // PROBE_SLICES
    runs = []
    for a in range(0, PROBE_APPENDS, k):
        t0 = time.perf_counter_ns()
        for m in probe_msgs[a:a + k]:
            store.append(m)
        runs.append((time.perf_counter_ns() - t0) / k)
    return statistics.median(runs), runs


def load_child(args: argparse.Namespace) -> None:
    spec = _spec(args.kind)
    factory = wl.default_message_factory
    channels, tasks, batches = wl.iter_batches(args.n, args.batch, seed=args.seed)
    rt = record_type_of(factory(wl.generate(1, seed=99).messages[0]))
    queries = [nd.query for nd in wl.NEEDLES]
    folded = [(q, q.casefold()) for q in queries]
    truth = {q: [0, deque(maxlen=LIMIT)] for q in queries}
    rng = random.Random(7)
    ids: list[str] = []
    sizes: dict[str, int] = {}
    content = 0
    calls: list[int] = []
    appends: dict[int, float] = {}
    append_runs: dict[int, list[float]] = {}
    settle_ns = 0
    spec.cls()
    gc.collect()
    base = _proc_status()
    hwm_reset = _reset_hwm()
    hwm0 = _proc_status().get("VmHWM", 0)
    done = 0
    t_start = time.perf_counter()
    with _PeakSampler() as sampler:
        store = spec.open(args.dir, "fsync", rt)
        for batch in batches:
            for m in batch:  # the answers to check, made outside the timing
                c = m["content"]
                content += len(c.encode("utf-8"))
                text = c.casefold()
                for q, f in folded:
                    if f in text:
                        t = truth[q]
                        t[0] += 1
                        t[1].append(m["msg_id"])
                if m["task_id"]:
                    sizes[m["task_id"]] = sizes.get(m["task_id"], 0) + 1
                if len(ids) < 40_000:
                    ids.append(m["msg_id"])
                else:
                    j = rng.randrange(done + 1)
                    if j < 40_000:
                        ids[j] = m["msg_id"]
                done += 1
            recs = [factory(m) for m in batch]
            t0 = time.perf_counter_ns()
            store.append_many(recs)
            calls.append(time.perf_counter_ns() - t0)
            del recs, batch
            at = next((c for c in CHECKPOINTS if c == done and c < args.n), None)
            if at is not None and at not in appends:
                t0 = time.perf_counter_ns()
                store.compact()
                _settle_merges(store)
                settle_ns += time.perf_counter_ns() - t0
                appends[at], append_runs[at] = _probe(store, factory, at)
            if len(calls) % 500 == 0:
                print(f"  {args.kind}: {done:,} messages, {time.perf_counter() - t_start:.0f} s, "
                      f"RssAnon {_proc_status().get('RssAnon', 0) >> 20} MiB", file=sys.stderr, flush=True)
        t0 = time.perf_counter_ns()
        store.compact()
        compact_ns = time.perf_counter_ns() - t0
        t0 = time.perf_counter_ns()
        _settle_merges(store)
        settle_ns += time.perf_counter_ns() - t0
        appends[done], append_runs[done] = _probe(store, factory, done)
        store.close()
    after = _proc_status()
    out = {"kind": args.kind, "n": done, "calls": calls, "compact_ns": compact_ns, "appends": appends,
           "append_runs": append_runs, "settle_ns": settle_ns,
           "peak_anon": sampler.peak - base.get("RssAnon", 0),
           "peak_rss": after.get("VmHWM", 0) - (hwm0 if hwm_reset else base.get("VmRSS", 0)),
           "hwm_reset": hwm_reset, "content": content, "channels": channels, "tasks": tasks, "ids": ids,
           "task_sizes": sizes, "truth": {q: [t[0], list(t[1])] for q, t in truth.items()}}
    with open(os.path.join(args.dir, "..", f"build-{args.kind}.json"), "w") as f:
        json.dump(out, f)


# ---------------------------------------------------------------------------
# step 2-4: the driver


def _median_ns(fn: Any, items: list[Any], repeats: int) -> float:
    vals = []
    for _ in range(repeats):
        gc.disable()
        t0 = time.perf_counter_ns()
        for x in items:
            fn(x)
        vals.append((time.perf_counter_ns() - t0) / max(1, len(items)))
        gc.enable()
    return statistics.median(vals)


def _decode_ns(decode: Any, lines: list[bytes]) -> int:
    """Nanoseconds to decode ``lines`` (canonical JSON lines) into records (GC off)."""
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for x in lines:
            decode(x)
        return time.perf_counter_ns() - t0
    finally:
        gc.enable()


def drive(args: argparse.Namespace) -> int:
    os.makedirs(args.dir, exist_ok=True)
    kinds = ["rune"] + (["sqlite"] if args.sqlite else [])
    builds: dict[str, dict[str, Any]] = {}
    t_all = time.perf_counter()
    for kind in kinds:
        d = os.path.join(args.dir, kind)
        meta = os.path.join(args.dir, f"build-{kind}.json")
        if args.reuse and os.path.exists(meta):
            print(f"reusing the {kind} store in {d}", file=sys.stderr)
        else:
            shutil.rmtree(d, ignore_errors=True)
            print(f"bulk load of {args.n:,} messages into {kind} (child process) ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, os.path.abspath(__file__), "--load-only", "--kind", kind, "--dir", d,
                   "--n", str(args.n), "--batch", str(args.batch), "--seed", str(args.seed)]
            subprocess.run(cmd, check=True)
        with open(meta) as f:
            builds[kind] = json.load(f)
    b0 = builds["rune"]
    n = b0["n"]
    rows: list[Row] = []
    notes: list[str] = []
    # (untimed) the merges the load's last compact() left to its thread,
    # given up by the close right after it: a session left open merges them
    # (the idle watcher), as a long-lived store would, before any read
    print("merging what the load left (a writer session left open) ...", file=sys.stderr, flush=True)
    st = _spec("rune").open(os.path.join(args.dir, "rune"), "fsync", None)
    try:
        settled = settle_archive(st)
    finally:
        st.close()
    if settled is not None:
        notes.append(f"after the load (untimed): a writer session left open merged the archive from "
                     f"{settled[0]} to {settled[1]} files in {settled[2]:.0f} s (its idle watcher)")
    sq = builds.get("sqlite", {})

    def both(fn: Any) -> tuple[Any, Any]:
        return fn(b0), (fn(sq) if sq else None)

    mean_r, mean_s = both(lambda b: statistics.fmean(b["calls"]))
    rows.append(Row("bulk_many_mean", f"append_many({args.batch:,}) in the bulk load, mean per call", mean_r, mean_s,
                    "ns", "SQLite 1 txn/batch, FULL", ">= 5x"))
    slow_r, slow_s = both(lambda b: float(max(b["calls"])))
    rows.append(Row("bulk_many_slowest", "slowest append_many call of the bulk load", slow_r, slow_s, "ns",
                    "SQLite's slowest batch", ">= 0.5x"))
    tot_r, tot_s = both(lambda b: (sum(b["calls"]) + b["compact_ns"] + b.get("settle_ns", 0)) / b["n"])
    rows.append(Row("bulk_load", f"bulk load of {n:,} incl. compactions, cooling, compact(), per msg "
                    "(and the compact() + merge waits before the append probes)", tot_r, tot_s,
                    "ns", "SQLite 1 txn/batch + checkpoint", ">= 3x"))
    rows.append(Row("compact_after_bulk", "compact() right after the bulk load", *both(lambda b: float(b["compact_ns"])),
                    "ns", "SQLite wal_checkpoint(TRUNCATE)"))
    pa_r, pa_s = both(lambda b: b["peak_anon"] / b["n"])
    rows.append(Row("bulk_peak_anon", f"peak RssAnon growth during the bulk load of {n:,}, per msg", pa_r, pa_s,
                    "B/msg", "SQLite (same load)", "rune <= 128 B", pa_r <= 128))
    rows.append(Row("bulk_peak_rss", "peak VmHWM growth during the same load, per msg",
                    *both(lambda b: b["peak_rss"] / b["n"]), "B/msg", "SQLite (same load)"))
    for at in sorted(int(k) for k in b0["appends"]):
        r = b0["appends"][str(at)]
        s = sq["appends"].get(str(at)) if sq else None
        rows.append(Row(f"append_at_{at}", f"append, durable (fsync), store of {at:,} (median of "
                        f"{PROBE_SLICES} runs of {PROBE_APPENDS // PROBE_SLICES}, store settled)",
                        r, s, "ns", "SQLite FULL (same store size)"))
    first, last = min(b0["appends"], key=int), max(b0["appends"], key=int)
    rows.append(Row("append_flatness", f"append cost growth {int(first):,} -> {int(last):,}",
                    b0["appends"][last] / b0["appends"][first],
                    (sq["appends"][last] / sq["appends"][first]) if sq else None, "x", "SQLite growth",
                    "rune <= 1.25x", b0["appends"][last] / b0["appends"][first] <= 1.25))
    for kind in kinds:
        builds[kind]["disk"] = disk_usage(os.path.join(args.dir, kind))[0]
    dr, ds = both(lambda b: b["disk"] / b["content"])
    rows.append(Row("disk_size", f"on-disk size per content byte ({fmt_value(b0['disk'], 'B')})", dr, ds, "B/B",
                    "SQLite after close", "ratio >= 1", None if ds is None else dr <= ds))

    # -- reads in this process --------------------------------------------------
    factory = wl.default_message_factory
    rt = record_type_of(factory(wl.generate(1, seed=99).messages[0]))
    specs = {kind: _spec(kind) for kind in kinds}
    channels, ids, sizes = b0["channels"], b0["ids"], b0["task_sizes"]
    rng = random.Random(3)
    warm_ids = ids[:2_000]
    task_list = sorted(sizes)
    tasks = [task_list[rng.randrange(len(task_list))] for _ in range(100)]
    big = sorted(sizes, key=lambda t: -sizes[t])[: max(1, len(sizes) // 10)]
    big_q = [big[rng.randrange(len(big))] for _ in range(50)]
    chans = [channels[rng.randrange(len(channels))] for _ in range(2_000)]
    print("reads ...", file=sys.stderr, flush=True)
    res: dict[str, dict[str, float]] = {k: {} for k in kinds}
    answers: dict[str, dict[str, Any]] = {k: {} for k in kinds}
    for kind in kinds:
        d = os.path.join(args.dir, kind)
        opens = []
        for _ in range(args.repeats):
            t0 = time.perf_counter_ns()
            s = specs[kind].open(d, "fsync", rt)
            s.window(channels[0], 8)
            opens.append(time.perf_counter_ns() - t0)
            s.close()
        res[kind]["open"] = statistics.median(opens)
        s = specs[kind].open(d, "fsync", rt)
        search = s.search_ci if kind == "sqlite" else s.search
        res[kind]["window"] = _median_ns(lambda c: s.window(c, 8), chans, args.repeats)
        res[kind]["get"] = _median_ns(s.get_message, warm_ids, args.repeats)
        res[kind]["task"] = _median_ns(s.messages_for_task, tasks, args.repeats)
        res[kind]["task_big"] = _median_ns(s.messages_for_task, big_q, args.repeats)
        for nd in wl.NEEDLES:
            q = nd.query
            print(f"  {kind}: search {q!r} ...", file=sys.stderr, flush=True)
            if not (nd.cls == "common" and n > 2_000_000):
                res[kind][f"s_{nd.cls}"] = _median_ns(search, [q], args.repeats)
                hits = search(q)
                answers[kind][q] = [len(hits), [hit_id(h) for h in hits[-LIMIT:]]]
                del hits
            res[kind][f"sl_{nd.cls}"] = _median_ns(lambda x: search(x, limit=LIMIT), [q], args.repeats)
            answers[kind].setdefault(q, [None, None]).append([hit_id(h) for h in search(q, limit=LIMIT)])
        s.close()

    def rr(key: str, op: str, vs: str, target: str = "", goal: float | None = None, base: float | None = None,
           base_vs: str = "", max_base: float | None = None) -> None:
        r = res["rune"].get(key)
        o = res["sqlite"].get(key) if sq else None
        row = Row(key, op, r, o, "ns", vs, target, goal=goal, base=base, base_vs=base_vs)
        checks = []
        if goal is not None and row.ratio is not None:
            checks.append(row.ratio >= goal)
        if max_base is not None and row.base_ratio is not None:
            checks.append(row.base_ratio <= max_base)
        row.met = all(checks) if checks else None
        rows.append(row)

    rr("open", f"open + first window, {n:,} msgs", "SQLite open + window", ">= 0.10x", 0.1)
    rr("window", "window(ch, 8)", "SQLite index (channel_id, seq)", ">= 30x", 30)
    rr("get", "get_message(id), working set of 2,000", "SQLite unique index", ">= 5x", 5)
    rr("task", f"messages_for_task (avg {statistics.fmean(sizes[t] for t in tasks):.0f} msgs)",
       "SQLite index (task_id, seq)", ">= 15x", 15)
    rr("task_big", f"messages_for_task, biggest 10% (avg {statistics.fmean(sizes[t] for t in big):.0f} msgs)",
       "SQLite index (task_id, seq)", ">= 15x", 15)

    # -- scan floor, extrapolated --------------------------------------------
    sample = min(n, args.scan_sample)
    print(f"scan floor over the first {sample:,} messages' content ...", file=sys.stderr, flush=True)
    _c, _t, it = wl.iter_batches(sample, 10_000, seed=args.seed)
    msgs = [m for b in it for m in b]
    buf = ContentBuffer(msgs)
    scale = b0["content"] / max(1, buf.content_bytes)
    # the 10% needle's loop is the scan plus the decoding of its hits, as in
    # ``python -m rune_fast.bench`` (without it the line compared a search
    # that decodes 884,600 records with a scan that decodes none)
    ten = next(nd for nd in wl.NEEDLES if nd.cls == "ten_pct")
    ten_lines = hit_lines(msgs, ten.query)
    decode = decoder(rt)
    del msgs
    for nd in wl.NEEDLES:
        scan = statistics.median(buf.scan_ns(nd.query) for _ in range(args.repeats)) * scale
        rare = nd.cls in ("rare_ascii", "rare_nonascii", "expansion", "cjk")
        loop, loop_vs = scan, f"memmem scan, extrapolated x{scale:.1f} from {sample:,} msgs"
        if nd is ten:
            loop = statistics.median(buf.scan_ns(nd.query) + _decode_ns(decode, ten_lines)
                                     for _ in range(args.repeats)) * scale
            loop_vs = (f"memmem scan + decoding its {len(ten_lines):,} hits, extrapolated x{scale:.1f} "
                       f"from {sample:,} msgs")
        if f"s_{nd.cls}" in res["rune"]:
            rr(f"s_{nd.cls}", f"search {nd.query!r} ({nd.cls})", "SQLite instr(lower(content), lower(?))",
               ">= 10x, <= 3x loop" if rare else "<= 5x loop" if nd is ten else "", 10 if rare else None,
               base=loop, base_vs=loop_vs, max_base=3 if rare else 5 if nd is ten else None)
        rr(f"sl_{nd.cls}", f"search {nd.query!r}, limit={LIMIT}", "SQLite ... ORDER BY seq DESC LIMIT 20",
           base=scan, base_vs="memmem scan, extrapolated")
    del buf, ten_lines
    for kind in kinds:
        for q, (cnt, newest, *lim) in answers[kind].items():
            want_n, want_ids = b0["truth"][q]
            ok = (cnt is None or cnt == want_n) and (newest is None or newest == want_ids) and lim[-1] == want_ids
            notes.append(f"{kind} search {q!r}: expected {want_n:,} hits (str.casefold), got "
                         f"{'(not run)' if cnt is None else f'{cnt:,}'}; limit={LIMIT} answer "
                         f"{'matches' if lim[-1] == want_ids else 'DIFFERS'}"
                         + ("" if ok or kind == "sqlite" else "  WRONG"))

    # -- fresh processes: memory, each id / task once -----------------------------
    print("fresh processes: memory and cold reads ...", file=sys.stderr, flush=True)
    qfile = os.path.join(args.dir, "queries.json")
    searches = [(nd.query, None) for nd in wl.NEEDLES if nd.cls in ("rare_ascii", "rare_nonascii", "expansion", "cjk")]
    searches.append((next(nd.query for nd in wl.NEEDLES if nd.cls == "common"), LIMIT))
    with open(qfile, "w") as f:
        json.dump({"channels": channels, "tasks": random.Random(21).sample(b0["tasks"], max(1, len(b0["tasks"]) // 100)),
                   "ids": ids[-10_000:], "searches": searches}, f)
    cold_file = os.path.join(args.dir, "cold.json")
    with open(cold_file, "w") as f:
        json.dump({"ids": ids[2_000:4_000], "tasks": [t for t in task_list if t not in set(tasks) | set(big_q)][:100]}, f)
    mem: dict[str, Any] = {}
    cold: dict[str, Any] = {}
    for kind in kinds:
        spec = asdict(specs[kind])
        mem[kind] = probe({"job": "mem", "spec": spec, "dir": os.path.join(args.dir, kind), "queries": qfile}, 7200)
        cold[kind] = probe({"job": "cold", "spec": spec, "dir": os.path.join(args.dir, kind), "queries": cold_file},
                           7200)

    def per(kind: str, key: str) -> float | None:
        if kind not in mem:
            return None
        m = mem[kind]
        return max(0, m["after"].get(key, 0) - m["before"].get(key, 0)) / n

    anon = per("rune", "RssAnon") or 0.0
    rows.append(Row("rss_anon", "RssAnon growth per stored msg, fresh process, open + read mix", anon,
                    per("sqlite", "RssAnon"), "B/msg", "SQLite (2 MiB page cache)", "rune <= 64 B", anon <= 64))
    rows.append(Row("rss_file", "RssFile growth per stored msg, same", per("rune", "RssFile"), per("sqlite", "RssFile"),
                    "B/msg", "SQLite"))
    rows.append(Row("get_message_cold", "get_message(id), each id once (fresh process)", cold["rune"]["ids"],
                    cold["sqlite"]["ids"] if sq else None, "ns", "SQLite unique index", ">= 2x"))
    rows.append(Row("messages_for_task_cold", "messages_for_task, each task once (fresh process)",
                    cold["rune"]["tasks"], cold["sqlite"]["tasks"] if sq else None, "ns", "SQLite index", ">= 2x"))
    for row in rows:
        if row.met is None and row.ratio is not None and row.target.startswith(">="):
            try:
                row.met = row.ratio >= float(row.target.split()[1].rstrip("x"))
            except ValueError:
                pass
    machine = machine_info(args.dir)
    report = Report(config={"n": n, "batch": args.batch, "seed": args.seed, "repeats": args.repeats,
                            "sqlite": args.sqlite, "scan_sample": sample},
                    machine=machine, rows=rows, notes=notes, rune_store=RUNE_REF)
    print()
    print(format_table(report))
    print()
    if args.markdown:
        print(format_markdown(report))
        print()
    for note in notes:
        print(f"note: {note}")
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, {machine['filesystem']}; "
          f"total {time.perf_counter() - t_all:.0f} s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report.to_json(), f, indent=2)
    if args.clean:
        for kind in kinds:
            shutil.rmtree(os.path.join(args.dir, kind), ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10_000_000, help="messages (default 10,000,000)")
    p.add_argument("--dir", required=True, help="where the stores are built (needs ~12 GB a store at 10,000,000)")
    p.add_argument("--batch", type=int, default=1_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sqlite", action="store_true", help="also build and measure SQLite (about twice as long)")
    p.add_argument("--scan-sample", type=int, default=500_000,
                   help="messages whose content the scan floor is measured on (default 500,000)")
    p.add_argument("--reuse", action="store_true", help="measure the stores a previous run left in --dir")
    p.add_argument("--clean", action="store_true", help="remove the stores at the end")
    p.add_argument("--json", dest="json_out")
    p.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    p.add_argument("--load-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kind", default="rune", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.load_only:
        load_child(args)
        return 0
    return drive(args)


if __name__ == "__main__":
    raise SystemExit(main())
