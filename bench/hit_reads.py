"""Searches with many archived hits and tasks spread over the archive, timed
on one store by two (or more) source trees in the same run: each round
starts a fresh viewer process per tree (``read_only=True``: the store is
never changed), in turn, so a noisy machine weighs on every tree alike.

    python bench/hit_reads.py --store /tmp/b1m [--trees /tmp/base .] [--rounds 3]

Per tree and line: the median over rounds of each round's median wall time
(and CPU time of the process). Lines: unlimited searches of the bench's
needles (bench.workload.NEEDLES: 'checkpoint' in ~10% of messages,
'session' in ~65%, a rare one), the same with limit=20, and
messages_for_task over the biggest tenth of the archive's tasks. A child
warms each line once, then collects and freezes the heap (as
bench.compare does with its workload), the collector left on. Not part of
the test run.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
LINES = ("search:checkpoint", "search:session", "search:zürich", "search:quarterly report",
         "limit:checkpoint", "limit:session", "task_big", "task_some")


def _child(store: str, lines: list[str], reps: int) -> dict[str, Any]:
    from rune_fast import ConversationStateRepository
    repo = ConversationStateRepository(store, read_only=True)
    jobs: dict[str, Callable[[], Any]] = {}
    cool = repo._cool
    with cool._lock:
        tasks = sorted(cool._task_map(), key=lambda t: (-cool.task_len(t), t))
    big = tasks[:max(1, len(tasks) // 10)]
    for line in lines:
        kind, _, arg = line.partition(":")
        if kind == "search":
            jobs[line] = (lambda q=arg: repo.search(q))
        elif kind == "limit":
            jobs[line] = (lambda q=arg: repo.search(q, limit=20))
        elif kind == "task_big":
            pick = random.Random(34).sample(big, min(20, len(big)))
            jobs[line] = (lambda ts=pick: [repo.messages_for_task(t) for t in ts])
        elif kind == "task_some":
            pick = random.Random(21).sample(tasks, min(20, len(tasks)))
            jobs[line] = (lambda ts=pick: [repo.messages_for_task(t) for t in ts])
    out: dict[str, Any] = {}
    for line, fn in jobs.items():
        got = fn()          # warm: sidecars, filters, directories
        n = len(got) if not line.startswith("task") else sum(len(x) for x in got)
        del got
        gc.collect()
        gc.freeze()
        walls, cpus = [], []
        for _ in range(reps):
            w0, c0 = time.perf_counter(), time.process_time()
            got = fn()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            del got
        gc.unfreeze()
        per = 20 if line.startswith("task") else 1
        out[line] = {"n": n, "wall": statistics.median(walls) / per, "cpu": statistics.median(cpus) / per}
    repo.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--trees", nargs="+", default=[os.path.dirname(HERE)])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lines", nargs="+", default=list(LINES))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a.store, a.lines, a.reps)))
        return
    got: dict[str, list[dict]] = {t: [] for t in a.trees}
    for r in range(a.rounds):
        for tree in a.trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--store", a.store,
                                  "--reps", str(a.reps), "--lines", *a.lines],
                                 env=env, cwd=os.path.abspath(tree), capture_output=True, text=True)
            if res.returncode:
                sys.exit(f"{tree}: {res.stderr}")
            got[tree].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {tree} done", file=sys.stderr)
    print(f"{'line':26} {'hits':>9} " + " ".join(f"{os.path.basename(os.path.abspath(t))[:18]:>26}" for t in a.trees))
    for line in a.lines:
        n = got[a.trees[0]][0][line]["n"]
        cells = []
        for t in a.trees:
            w = statistics.median(x[line]["wall"] for x in got[t])
            c = statistics.median(x[line]["cpu"] for x in got[t])
            cells.append(f"{w * 1e3:10.1f} ms (cpu {c * 1e3:8.1f})")
        print(f"{line:26} {n:9,} " + " ".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
