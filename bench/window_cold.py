"""What window(ch, 8) costs in the bench's turns, and where: CPU time per call
in slices of 200 windows over random channels, each slice timed alone (the
previous slice left the working set in the caches) and right after a slice
of SQLite windows (as ``rune_fast.bench`` interleaves them: SQLite's reads
evict the window's lines and records), for the whole window and its parts.

    python bench/window_cold.py STORE_DIR [--rounds R]

``STORE_DIR`` holds ``rune/`` and ``sqlite/`` (``bench/build_10m.py
--sqlite``, or a bench run's stores): a COPY, since both are opened as
writers. Parts: the 8 lines' checksums (``HotIndex.check_lines``, with its
prefetch), the decode cache's 8 lookups, the window without its copies of
tool calls (own_calls replaced by the identity; a Python call more), and an
empty loop. CPU time (``time.thread_time_ns``) rather than wall time: on a
shared machine another process's turn on this core is not counted (its
traces in the caches are).

Session 30, on a freshly bulk-loaded 1,000,000-message bench store (the
machine loaded by three other helpers), medians: window 1.30 us alone,
2.44 us after SQLite's slice; its 8 checksums 0.71 / 1.41 us (the lines'
~6.7 KB, 834 B a line, read again from memory); without the tool-call
copies (16% of records) 0.96 / 1.6-2.0 us. The bench's line (1.98 us) is
the mean of the two kinds of turn: ~87 of a slice's 200 windows are a
channel's first since SQLite's slice.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args(argv)
    from rune_fast import _index, codec
    from rune_fast._encode import OWN_CALLS_C
    from rune_fast.bench.sqlite_store import SQLiteStore
    from rune_fast.conversation_state import ConversationStateRepository, own_calls
    from rune_fast.records import ConversationMessageRecord

    repo = ConversationStateRepository(os.path.join(args.store, "rune"), compact_every=64, hot_window=512)
    sql = SQLiteStore(os.path.join(args.store, "sqlite"), durability="fsync", record_type=ConversationMessageRecord)
    try:
        chs = [c for c in repo.channels() if sql.window(c, 1)]
        chans = random.Random(31).choices(chs, k=2_000)
        slices = [chans[i:i + 200] for i in range(0, len(chans), 200)]
        window, s_window = repo.window, sql.window
        for c in chans:
            window(c, 8)
            s_window(c, 8)
        ix, cache = repo._index, repo._decoded
        locs = {c: ix.channel_locs(codec.key(c), 8).tolist() for c in chs}
        lens = [len(ix.line(loc)) for c in chs for loc in locs[c]]
        calls = sum(1 for c in chs for r in window(c, 8) if r.tool_calls) / max(1, 8 * len(chs))
        print(f"{len(chs)} channels; mean line {statistics.fmean(lens):.0f} B; records with tool calls "
              f"{calls:.0%}")
        check = ix.check_lines

        def lookups(c: str) -> None:
            for loc in locs[c]:
                cache.get(loc)

        def own_identity(c: str) -> None:
            window(c, 8)

        parts = {"window": lambda c: window(c, 8), "checksums": lambda c: check(locs[c]), "cache_get": lookups,
                 "no_copies": own_identity, "loop": lambda c: None}
        res: dict[str, list[float]] = {f"{k}/{m}": [] for k in parts for m in ("alone", "after_sql")}
        clock = time.thread_time_ns
        gc.disable()
        try:
            for _ in range(args.rounds):
                for name, fn in parts.items():
                    if name == "no_copies":
                        _index.repo_window_setup(lambda recs: recs)
                    try:
                        for sl in slices:
                            for c in sl:
                                fn(c)
                            t0 = clock()
                            for c in sl:
                                fn(c)
                            res[f"{name}/alone"].append((clock() - t0) / len(sl))
                            for c in sl:
                                s_window(c, 8)
                            t0 = clock()
                            for c in sl:
                                fn(c)
                            res[f"{name}/after_sql"].append((clock() - t0) / len(sl))
                    finally:
                        if name == "no_copies":
                            _index.repo_window_setup(own_calls, OWN_CALLS_C)
        finally:
            gc.enable()
        for key, vals in res.items():
            print(f"{key:22s} median {statistics.median(vals):6.0f} ns CPU  (min {min(vals):.0f})")
    finally:
        repo.close()
        sql.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
