"""The bench's bulk-load lines for two (or more) trees of rune_fast, back to
back on the same machine state: each tree's own ``rune_fast.bench`` bulk
probe (``probes._bulk_job``: append_many batches of 1,000 timed call by
call, then compact(), peak RssAnon sampled) in a fresh subprocess on the
same pickled workload, alternating the trees ``--rounds`` times; SQLite's
side once (``--sqlite``), for the ratios.

    python bench/bulk_ab.py --n 1000000 --dir /tmp/ab /tmp/base-tree /work/wt/bulk --sqlite

A tree is a folder holding ``rune_fast/`` (with its compiled modules).
Not part of the test run.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from rune_fast.bench import workload as wl  # noqa: E402

RUNE_REF = "rune_fast.conversation_state:ConversationStateRepository"
SQLITE_REF = "rune_fast.bench.sqlite_store:SQLiteStore"
FACTORY_REF = "rune_fast.bench.workload:default_message_factory"


def _probe(tree: str, kind: str, pkl: str, d: str, batch: int) -> dict:
    spec = {"kind": kind, "ref": RUNE_REF if kind == "rune" else SQLITE_REF, "path": tree,
            "kwargs": {"compact_every": 64, "hot_window": 512} if kind == "rune" else {},
            "factory_ref": FACTORY_REF, "factory_path": tree}
    job = {"job": "bulk", "spec": spec, "dir": d, "workload": pkl, "batch": batch, "raw": False}
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, "-c", "from rune_fast.bench.probes import probe_main; probe_main()", json.dumps(job)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: probe failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _lines(r: dict, n: int) -> dict:
    calls = r["calls"]
    return {"mean_ms": statistics.fmean(calls) / 1e6, "max_ms": max(calls) / 1e6,
            "top5_ms": [round(c / 1e6, 1) for c in sorted(calls)[-5:]],
            "median_ms": statistics.median(calls) / 1e6, "compact_s": r["compact_ns"] / 1e9,
            "load_us_msg": (sum(calls) + r["compact_ns"]) / n / 1e3,
            "peak_anon_b_msg": r["peak_anon"] / n}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("trees", nargs="+")
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--dir", required=True)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--sqlite", action="store_true")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    pkl = os.path.join(args.dir, "workload.pkl")
    with open(pkl, "wb") as f:
        pickle.dump(wl.generate(args.n, seed=0).messages, f, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        if args.sqlite:
            d = os.path.join(args.dir, "sqlite")
            shutil.rmtree(d, ignore_errors=True)
            out = _lines(_probe(args.trees[0], "sqlite", pkl, d, args.batch), args.n)
            print(json.dumps({"tree": "sqlite", **out}), flush=True)
        for rnd in range(args.rounds):
            for i, tree in enumerate(args.trees):
                d = os.path.join(args.dir, f"rune{i}")
                shutil.rmtree(d, ignore_errors=True)
                out = _lines(_probe(tree, "rune", pkl, d, args.batch), args.n)
                print(json.dumps({"tree": tree, "round": rnd, **out}), flush=True)
                shutil.rmtree(d, ignore_errors=True)
    finally:
        os.unlink(pkl)


if __name__ == "__main__":
    main()
