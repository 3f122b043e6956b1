"""Side-by-side comparison of rune_fast and SQLite on the same workload, in one run.

Run::

    python -m rune_fast.bench                 # default size (100,000 messages), a few minutes
    python -m rune_fast.bench --quick         # 20,000 messages, well under a minute
    python -m rune_fast.bench --smoke         # a few hundred messages: the harness runs (numbers mean nothing)
    python -m rune_fast.bench --n 1000000     # the issue's full size (slow: a quarter of an hour)
    python bench/build_10m.py                 # 10,000,000 messages, rune_fast side only (see docs/BENCHMARKS.md)
    python -m rune_fast.bench --json out.json --plot out.png --dir /some/tmp
    python -m rune_fast.bench --explain       # what each line measures, at which durability

(``rune-fast bench`` takes the same sizes.) It ships inside the package, so it
runs from any folder of an installed ``rune_fast``.

Both stores get the same seeded workload (:mod:`rune_fast.bench.workload`: 100
channels, 1,000 tasks, about 450 content bytes a message, most of them with
non-ASCII text, planted needles of every class), and their measurements are
interleaved (rune, sqlite, plain loop, rune, ...) so that the noise of a
shared machine hits every side alike. Every timed line is the **median of the
repeats** (``--repeats``, 5 by default), each repeat timing a loop of many
operations with ``time.perf_counter_ns`` and the garbage collector off, after
an untimed warm-up. The bulk loads, memory, bytes written and the "each id
once" reads run in fresh subprocesses (``/proc/self/status``, ``/proc/self/io``).

The table's ``ratio`` is *SQLite / rune_fast*: for times, how many times faster
rune_fast is (> 1 = rune_fast faster); for memory and bytes, how many times
less it uses. ``plain loop`` is the floor of the same work measured in the
same run (a scan of the same content bytes, slices of one buffer, a bare
``write`` + ``fdatasync``) and ``x loop`` is *rune_fast / plain loop*. No line
asserts anything about wall time: the targets (issue 33) are reported as met
or not. Every search answer is checked against ``str.casefold``: a wrong
rune_fast answer is a ``WRONG:`` note.

The rune_fast side is ``rune_fast.conversation_state.ConversationStateRepository``
unless another store class is passed to :func:`run_comparison` (the harness
test injects a dict-backed fake; its numbers then mean nothing).

This module times the run; :mod:`.report` holds what is reported (the lines,
the sizes, the table, the chart) and :mod:`.probes` the subprocess probes and
the machine facts.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict
from typing import Any, Callable, Sequence

from . import workload as wl
from .phases import Run
from .probes import FACTORY_REF, PKG_PARENT, SQLITE_REF, StoreSpec, load_ref, machine_info, record_type_of, ref_of
from .report import (DESCRIPTIONS, OPERATIONS, RUNE_REF, Config, Report, Row, format_markdown, format_table,
                     operation_of, plot)

__all__ = ["Config", "Row", "Report", "StoreSpec", "run_comparison", "main", "OPERATIONS", "DESCRIPTIONS",
           "RUNE_REF", "format_table", "format_markdown", "plot", "machine_info"]


def _content(rec: Any) -> str:
    if isinstance(rec, dict):
        return rec["content"]
    return rec.content


# ---------------------------------------------------------------------------
# the run


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
        rune_store = load_ref(RUNE_REF)
    factory = message_factory or wl.default_message_factory
    ref, path = ref_of(rune_store)
    fref, fpath = ref_of(factory)
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
    say(f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"kernel {machine['kernel']}, Python {machine['python']}, SQLite {machine['sqlite']}")
    say(f"filesystem: {machine['filesystem']}")
    say(f"rune_fast side: {rune.ref}")
    say(f"generating workload: {cfg.n:,} messages (seed {cfg.seed}) ...")
    w = wl.generate(cfg.n, channels=cfg.channels, tasks=cfg.tasks, seed=cfg.seed)
    rt = record_type_of(factory(w.messages[0]))
    run = Run(cfg, w, rune, sql, factory, rt, root, say)
    content_total = wl.content_bytes(w.messages)
    sizes = w.task_sizes()
    say(f"  {len(w.channel_ids)} channels, {len(w.task_ids)} tasks (up to {max(sizes.values(), default=0)} "
        f"messages), {content_total / max(1, len(w)):.0f} content bytes/msg, "
        f"{wl.non_ascii_share(w.messages):.0%} of messages with non-ASCII text")
    run.notes.append(f"workload: {cfg.n:,} messages, {len(w.channel_ids)} channels, {len(w.task_ids)} tasks "
                     f"(mean {cfg.n / max(1, len(w.task_ids)):.0f}, largest {max(sizes.values(), default=0)} "
                     f"messages), {content_total / max(1, len(w)):.0f} content bytes/msg on average, "
                     f"{wl.non_ascii_share(w.messages):.0%} of messages with non-ASCII text "
                     "(de, fr, es, tr, el, ru, ja, zh, emoji), tool calls")
    rows: list[Row] = []
    rows += run.record_rows()
    rows += run.bulk_rows()
    gc.collect()
    gc.freeze()  # keep the workload out of the collector's way during timings
    mem_rows, io = run.memory_io_rows()
    rows += mem_rows
    rows += run.cold_rows()
    # The reads and searches first, while the stores hold exactly the
    # workload (the answers are checked against it); the opens append.
    s_rune = run.open(rune)
    s_sql = run.open(sql)
    _sanity(w, s_rune, s_sql, run.notes)
    rows += run.read_rows(s_rune, s_sql)
    s_rune.close()
    s_sql.close()
    say("open + first window ...")
    rows += run.open_rows()
    rows += run.append_rows()
    rows += Run.write_amp_rows(cfg, io, run.notes)
    order = {k: i for i, k in enumerate(OPERATIONS)}
    rows.sort(key=lambda r: order.get(operation_of(r.key), len(order)))
    return Report(config=asdict(cfg), machine=machine, rows=rows, notes=run.notes, rune_store=rune.ref)


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
# command line


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rune_fast.bench", description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="20,000 messages and shorter loops (well under a minute)")
    size.add_argument("--smoke", action="store_true",
                      help="a few hundred messages, one repeat: checks that the harness runs (numbers mean nothing)")
    p.add_argument("--n", type=int, help="messages in the main stores (default 100,000; the issue's size is 1000000)")
    p.add_argument("--repeats", type=int, help="repeats per timed line, median reported (default 5)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--channels", type=int, help="channels of the workload (default 100; fewer below 10,000 messages)")
    p.add_argument("--tasks", type=int, help="tasks of the workload (default 1,000; fewer below 10,000 messages)")
    p.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
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
        rune_store = load_ref(args.store)
        factory = load_ref(args.factory)
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
    if args.markdown:
        print(format_markdown(report))
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
