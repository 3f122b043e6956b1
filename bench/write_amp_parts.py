"""Where the bytes of the bench's write-amplification job go.

    python bench/write_amp_parts.py DIR [--n 100000] [--runs 3]

Runs the job of ``rune_fast.bench`` (``io_bulk``: ``append_many`` of 1,000
at a time into a new store in ``DIR``, then ``compact()`` and ``close()``)
``--runs`` times, each in this process, and prints per run the bytes the
process wrote to disk per content byte (``/proc/self/io`` ``write_bytes``
less ``cancelled_write_bytes``, the bench's measure) and what made them,
counted by wrapping the calls that write whole files or lines:

- ``tail``: the message lines appended to the tail (fixed by the format);
- ``events``: the envelopes appended to ``events.jsonl`` (ditto);
- ``seg rewrite``: live lines of sparse segments copied into a new one
  (``tuning.SPARSE_FRACTION``);
- ``snapshot``: index snapshots (``tuning.SNAPSHOT_EVERY``; the last one
  is what the next open reads);
- ``cool files``: Parquet files and their sidecars as renamed into place
  (cooling runs and merges: the merges vary with the threads' timing);
- ``rest``: what the disk counted beyond those (grams, manifests, pages
  dirtied again after a sync, a cancelled merge's writes).

Session 27 used it to find that of ~135 MB written for 43.6 MB of content
at 100,000 messages, 79 MB are tail lines and 20 MB envelopes.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rune_fast import events, segments  # noqa: E402
from rune_fast import conversation_state as cs  # noqa: E402
from rune_fast._conv import tuning  # noqa: E402
from rune_fast.bench import workload as wl  # noqa: E402
from rune_fast.bench.probes import _io_delta, _proc_io  # noqa: E402

PARTS: collections.Counter = collections.Counter()


def wrap(owner: Any, name: str, count: Any) -> None:
    fn = getattr(owner, name)

    def counted(*a: Any, **k: Any) -> Any:
        out = fn(*a, **k)
        count(a, k, out)
        return out
    setattr(owner, name, counted)


def install() -> None:
    """Count each part where it is written (see the module docstring)."""
    def tail(a: tuple, _k: dict, _out: Any) -> None:
        PARTS["tail"] += len(a[1])
    wrap(segments.TailFile, "append", tail)

    def envelopes(a: tuple, _k: dict, _out: Any) -> None:
        PARTS["events"] += len(a[1])
    wrap(events.EventStore, "append_encoded", envelopes)

    def rewrite(a: tuple, _k: dict, seg: int) -> None:
        PARTS["seg rewrite"] += a[0]._segs[seg].size
    wrap(cs.ConversationStateRepository, "_rewrite_segments", rewrite)

    real_replace = os.replace

    def replace(src: Any, dst: Any, *a: Any, **k: Any) -> Any:
        name = os.path.basename(os.fspath(dst))
        size = os.path.getsize(src) if os.path.exists(src) else 0
        real_replace(src, dst, *a, **k)
        if name.startswith("conversation_index.snap"):
            PARTS["snapshot"] += size
        elif re.match(r"cool-\d+\.(parquet|idx)$", name):
            PARTS["cool files"] += size
    os.replace = replace        # (the snapshot's write, the cool writer and AtomicStore all rename)


def run(state: str, n: int) -> dict[str, float]:
    shutil.rmtree(state, ignore_errors=True)
    w = wl.generate(n, seed=0)
    msgs = [wl.default_message_factory(m) for m in w.messages]
    content = wl.content_bytes(msgs)
    PARTS.clear()
    store = cs.ConversationStateRepository(state, compact_every=64, hot_window=512)
    before = _proc_io()
    t0 = time.perf_counter()
    for i in range(0, len(msgs), 1000):
        store.append_many(msgs[i:i + 1000])
    store.compact()
    store.close()
    seconds = time.perf_counter() - t0
    disk = _io_delta(before, _proc_io())["disk_bytes"]
    out = {k: v / content for k, v in PARTS.items()}
    out["rest"] = (disk - sum(PARTS.values())) / content
    out["total"] = disk / content
    out["seconds"] = seconds
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                    help="a tuning knob for these runs (e.g. SPARSE_FRACTION=0.4); repeatable")
    args = ap.parse_args()
    for item in args.set:
        name, _, value = item.partition("=")
        setattr(tuning, name, type(getattr(tuning, name))(value))
    install()
    runs = [run(os.path.join(args.dir, f"run{i}"), args.n) for i in range(args.runs)]
    keys = ["total", "tail", "events", "cool files", "seg rewrite", "snapshot", "rest"]
    print(f"bytes written per content byte, bulk {args.n:,} + compact() + close(), {args.runs} runs"
          + (f" ({', '.join(args.set)})" if args.set else ""))
    for k in keys:
        vals = [r.get(k, 0.0) for r in runs]
        print(f"  {k:12s} median {statistics.median(vals):5.3f}   runs " + " ".join(f"{v:5.3f}" for v in vals))
    for i in range(args.runs):
        shutil.rmtree(os.path.join(args.dir, f"run{i}"), ignore_errors=True)


if __name__ == "__main__":
    main()
