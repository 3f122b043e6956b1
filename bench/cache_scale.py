"""Resident memory and repeated-read speed of a store for several ``cache_bytes``.

    python bench/cache_scale.py STORE_DIR QUERIES_JSON [--cache-bytes N ...] [--rounds R]

``STORE_DIR`` is a copy of a loaded store (``cp -a``: it is opened as a
writer, as the bench's memory probe opens it), ``QUERIES_JSON`` the read mix
``bench/build_10m.py`` wrote beside it (``queries.json``: the channels, 1%
of the tasks, 10,000 ids, the searches). Each setting runs in a fresh
process, the settings interleaved over ``--rounds``: the growth of RssAnon
(and RssFile, not counted) per stored message after open and the read mix
(the bench's memory probe), then the same reads again, timed per call
(medians of each kind: what a repeated read costs with that cache); and
before the mix, window(ch, 8) on every channel twice, the second pass timed
("window alone": the bench's window phase, a working set of its own).
``--cache-bytes default`` opens the store with the constructor's default.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.memory_probe import status  # noqa: E402  (RssAnon and RssFile of this process)


def child(store: str, queries: str, cache: str) -> dict:
    from rune_fast import ConversationStateRepository
    from rune_fast.bench import workload as wl
    with open(queries) as f:
        q = json.load(f)
    wl.default_message_factory(wl.generate(1, seed=99).messages[0])
    gc.collect()
    base = status()
    kw = {} if cache == "default" else {"cache_bytes": int(cache)}
    st = ConversationStateRepository(store, compact_every=64, hot_window=512, **kw)
    n = len(st)
    steps = {"open": status()["RssAnon"]}
    for ch in q["channels"]:
        st.window(ch, 8)
    steps["windows"] = status()["RssAnon"]
    ws = []
    for ch in q["channels"]:    # the window working set alone, as the bench's window phase reads it
        t0 = time.perf_counter_ns()
        st.window(ch, 8)
        ws.append(time.perf_counter_ns() - t0)
    for t in q["tasks"]:
        st.messages_for_task(t)
    steps["tasks"] = status()["RssAnon"]
    for i in q["ids"]:
        st.get_message(i)
    steps["gets"] = status()["RssAnon"]
    for text, limit in q.get("searches", ()):
        st.search(text, limit=limit)
    gc.collect()
    after = status()
    out = {"n": n, "anon": (after["RssAnon"] - base["RssAnon"]) / n,
           "file": (after["RssFile"] - base["RssFile"]) / n,
           "cache_bytes": getattr(st, "_cache_now", None), "window_ws": statistics.median(ws) / 1e3,
           "steps": {k: round((v - base["RssAnon"]) / n, 1) for k, v in steps.items()}}
    for name, fn, items in (("window", lambda c: st.window(c, 8), q["channels"]),  # after the mix
                            ("get", st.get_message, q["ids"]),
                            ("task", st.messages_for_task, q["tasks"])):
        ts = []
        for it in items:
            t0 = time.perf_counter_ns()
            fn(it)
            ts.append(time.perf_counter_ns() - t0)
        out[name] = statistics.median(ts) / 1e3
        out[name + "_mean"] = statistics.mean(ts) / 1e3
    st.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("queries")
    ap.add_argument("--cache-bytes", nargs="+", default=["default"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.store, a.queries, a.child)))
        return
    res: dict[str, list[dict]] = {c: [] for c in a.cache_bytes}
    for _ in range(a.rounds):
        for c in a.cache_bytes:
            p = subprocess.run([sys.executable, __file__, a.store, a.queries, "--child", c],
                               capture_output=True, text=True, check=True)
            res[c].append(json.loads(p.stdout.strip().splitlines()[-1]))
    print(f"{a.store}: medians of {a.rounds} fresh processes")
    print(f"{'cache_bytes':>12} {'eff. MiB':>8} {'RssAnon B/msg':>14} {'RssFile':>8} {'window us':>10} "
          f"{'get us (mean)':>16} {'task us (mean)':>18} {'window alone':>12}")
    for c, rs in res.items():
        m = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        eff = rs[0]["cache_bytes"]
        print(f"{c:>12} {(eff or 0) / 2**20:8.1f} {m('anon'):14.1f} {m('file'):8.1f} {m('window'):10.1f} "
              f"{m('get'):7.1f} ({m('get_mean'):6.1f}) {m('task'):8.1f} ({m('task_mean'):7.1f}) {m('window_ws'):12.1f}")
        print(f"{'':>12} RssAnon B/msg after each step (first run): {rs[0]['steps']}")


if __name__ == "__main__":
    main()
