"""The subcommands that check rune_fast itself rather than a state directory:
``bench`` (the side-by-side comparison with SQLite, :mod:`rune_fast.bench`)
and ``canary`` (every promise of the contract, :mod:`rune_fast.canary`)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from .._fmt import Progress, print_json

Add = Callable[..., argparse.ArgumentParser]


def register(add: Add) -> None:
    sp = add("bench", cmd_bench, "side-by-side comparison against SQLite",
             "Run rune_fast.bench (also `python -m rune_fast.bench`): the same seeded workload against "
             "rune_fast and SQLite (WAL, same durability), with ratios. Ships with the package: runs "
             "from any folder.")
    sp.add_argument("--quick", action="store_true", help="20,000 messages, well under a minute")
    sp.add_argument("--smoke", action="store_true",
                    help="a few hundred messages, one repeat: checks that the harness runs (numbers mean nothing)")
    sp.add_argument("--n", type=int, help="messages in the main stores (default 100,000)")
    sp.add_argument("--repeats", type=int, help="repeats per timed line (median reported)")
    sp.add_argument("--out", help="write the report as JSON to this file")
    sp.add_argument("--plot", help="write a PNG bar chart here (needs matplotlib)")

    sp = add("canary", cmd_canary, "exercise every contract promise in a fresh directory",
             "Exercise every contract method in a fresh directory (not --state), crash a writer on "
             "purpose, reopen, verify; one PASS/FAIL line per promise; exit 1 if any fails.")
    sp.add_argument("--dir", help="run in this (new or empty) directory and keep it")


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the side-by-side comparison against SQLite (WAL, same durability)."""
    from ..bench import compare

    if args.smoke:
        cfg = compare.Config.tiny()
    else:
        cfg = compare.Config.quick() if args.quick else compare.Config()
    if args.n is not None:
        cfg.n = args.n
    if args.repeats is not None:
        cfg.repeats = args.repeats
    with Progress("bench") as bar:
        def log(line: str) -> None:
            if bar.enabled:
                bar.advance(1, line.strip()[:70])
            else:
                print(line, file=sys.stderr, flush=True)

        report = compare.run_comparison(cfg, log=log)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=2)
    if args.plot:
        if compare.plot(report, args.plot):
            print(f"plot: {args.plot}", file=sys.stderr)
        else:
            print("plot skipped: matplotlib is not installed (pip install 'rune_fast[demo]')", file=sys.stderr)
    if args.json:
        print_json(report.to_json())
    else:
        print(compare.format_table(report))
        for note in report.notes:
            print(f"note: {note}")
    return 0


def cmd_canary(args: argparse.Namespace) -> int:
    """Exercise every contract promise against a fresh directory; exit 1 if any fails."""
    from .. import canary

    argv = ["--state", args.dir] if args.dir else []
    if args.json:
        argv.append("--json")
    return canary.main(argv)
