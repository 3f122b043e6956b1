"""The calls whose work spans a whole store, channel or ledger, at a size:
``export_ops()`` (every message as an op) beside SQLite's read of every
row into records, a Redis push after a few appends (``_export_changes``
from its cursor), ``clear_channel`` of the busiest channel beside SQLite's
``DELETE ... WHERE channel_id = ?`` (both durable), a writer's
``verify()`` with durable appends beside it (their slowest: the check's
longest lock hold) and SQLite's ``PRAGMA integrity_check``, the first
``resume_messages(ch, 20)`` and ``window(ch, 1000)`` of a fresh open, and
a task ``create`` as the ledger grows.

    python bench/whole_calls.py DIR [--n 100000] [--tasks 30000]

Builds both stores under ``DIR`` from the bench's workload (append_many of
1,000, then compact(); SQLite one transaction a batch) unless they are
there. Destructive calls run on copies. One run, wall times; the machine
is shared, so repeat for anything close.

Session 43 (2 shared cores; the table in docs/BENCHMARKS.md): export_ops
2.35-2.59 -> 0.80-0.96 s at 100,000 and 42-70 -> 9-11 s at 1,000,000 (SQLite
reading every row into a record: 1.0 and 13-14 s); a push after ten appends
0.4 ms (a full export before); clear_channel of 1,086 messages 1.75 s -> 37
ms; resume_messages(ch, 20) of a channel of 123,000 out of fold order 2.8 s
-> 0.29 s a call; a task create 358 us at 3,000 tasks and 2.6 ms at 30,000
-> ~200-250 us at both. Session 44: a writer's verify() at 1,000,000 held
the lock for all of its 25.8 s; now 18.7 s with 16,804 durable appends
beside it, the slowest 400 ms (SQLite's integrity_check 2.2 s). Session
45: a writer's export_ops() reads the archive without the lock too (the
export's own lines, beside appends, below the verify line).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rune_fast import ConversationMessageRecord, ConversationStateRepository, TaskStateRepository  # noqa: E402
from rune_fast.bench import workload as wl  # noqa: E402
from rune_fast.bench.sqlite_store import DB_NAME, SQLiteStore  # noqa: E402


def _build(d: str, n: int) -> None:
    rune, sql = os.path.join(d, "rune"), os.path.join(d, "sqlite")
    if os.path.isdir(rune) and os.path.isdir(sql):
        return
    shutil.rmtree(d, ignore_errors=True)
    msgs = [wl.default_message_factory(m) for m in wl.generate(n, seed=0).messages]
    with ConversationStateRepository(rune) as r:
        for i in range(0, n, 1000):
            r.append_many(msgs[i:i + 1000])
        r.compact()
    s = SQLiteStore(sql, record_type=ConversationMessageRecord)
    for i in range(0, n, 1000):
        s.append_many(msgs[i:i + 1000])
    s.close()


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _beside_appends(w: ConversationStateRepository, call) -> tuple:
    """``call()`` (verify, an export) in a thread while this one appends
    (durably) one message at a time: its result and each append's latency
    (what the call's lock holds cost a writer)."""
    out: dict = {}
    th = threading.Thread(target=lambda: out.setdefault("rep", call()))
    th.start()
    lat = []
    while th.is_alive():
        t0 = time.perf_counter()
        w.append(ConversationMessageRecord(channel_id="verify-probe", content=f"probe {len(lat)}"))
        lat.append(time.perf_counter() - t0)
    th.join()
    return out["rep"], lat


def _busiest(d: str) -> str:
    con = sqlite3.connect(os.path.join(d, "sqlite", DB_NAME))
    (ch,) = con.execute("SELECT channel_id FROM messages GROUP BY channel_id ORDER BY count(*) DESC LIMIT 1").fetchone()
    con.close()
    return ch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--tasks", type=int, default=30_000)
    a = p.parse_args(argv)
    _build(a.dir, a.n)
    ch = _busiest(a.dir)
    rune = ConversationStateRepository(os.path.join(a.dir, "rune"), read_only=True)
    sql = SQLiteStore(os.path.join(a.dir, "sqlite"), record_type=ConversationMessageRecord, read_only=True)
    t, ops = _timed(rune.export_ops)
    t_sql, rows = _timed(lambda: [sql._decode(r) for r in sql.conn.execute(
        "SELECT msg_id, channel_id, task_id, ts, content, extra FROM messages ORDER BY seq")])
    print(f"export_ops(), {len(ops):,} ops: {t:.2f} s; SQLite, every row as a record: {t_sql:.2f} s")
    del ops, rows
    t, got = _timed(lambda: rune.resume_messages(ch, 20))
    print(f"first resume_messages({ch!r}, 20): {t * 1e3:.1f} ms")
    rune.close()
    rune = ConversationStateRepository(os.path.join(a.dir, "rune"), read_only=True)
    t, got = _timed(lambda: rune.window(ch, 1000))
    print(f"first window({ch!r}, 1000): {t * 1e3:.1f} ms")
    rune.close()
    sql.close()

    work = os.path.join(a.dir, "copy")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(a.dir, work, ignore=shutil.ignore_patterns("copy"))
    with ConversationStateRepository(os.path.join(work, "rune")) as w:
        _ops, cursor = w._export_changes(None)
        del _ops
        w.append_many([ConversationMessageRecord(channel_id=ch, content=f"new {i}") for i in range(10)])
        t, (ops, cursor) = _timed(lambda: w._export_changes(cursor))
        print(f"a push's changes after 10 appends: {len(ops)} ops in {t * 1e3:.2f} ms")
        t, (rep, lat) = _timed(lambda: _beside_appends(w, w.verify))
        print(f"verify() of the writer: {t:.2f} s, ok={rep.ok}; {len(lat)} durable appends meanwhile, "
              f"the slowest {max(lat, default=0) * 1e3:.1f} ms")
        t, (ops, lat) = _timed(lambda: _beside_appends(w, w.export_ops))
        print(f"export_ops() of the writer: {t:.2f} s, {len(ops):,} ops; {len(lat)} durable appends "
              f"meanwhile, the slowest {max(lat, default=0) * 1e3:.1f} ms")
        since = ops[-2000].hlc
        del ops
        t, (ops, lat) = _timed(lambda: _beside_appends(w, lambda: w.export_ops(since)))
        print(f"first export_ops(since) of the writer, {len(ops):,} ops: {t:.2f} s; {len(lat)} durable "
              f"appends meanwhile, the slowest {max(lat, default=0) * 1e3:.1f} ms")
        del ops
        t, k = _timed(lambda: w.clear_channel(ch))
    con = sqlite3.connect(os.path.join(work, "sqlite", DB_NAME), isolation_level=None)
    t_sql, (res,) = _timed(lambda: con.execute("PRAGMA integrity_check").fetchone())
    print(f"SQLite PRAGMA integrity_check: {t_sql:.2f} s ({res})")
    con.execute("PRAGMA synchronous=FULL")
    t_sql, cur = _timed(lambda: con.execute("DELETE FROM messages WHERE channel_id = ?", (ch,)))
    print(f"clear_channel({ch!r}), {k:,} messages: {t * 1e3:.1f} ms; SQLite DELETE: {t_sql * 1e3:.1f} ms")
    con.close()
    shutil.rmtree(work)

    tasks = os.path.join(a.dir, "tasks")
    shutil.rmtree(tasks, ignore_errors=True)
    step = max(1, a.tasks // 5)
    with TaskStateRepository(tasks) as led:
        for k in range(5):
            t, _ = _timed(lambda: [led.create(f"task {k}-{i}", f"chan-{i % 100}") for i in range(step)])
            print(f"task create at {k * step:,}-{(k + 1) * step:,} tasks: {t / step * 1e6:.0f} us each")
    shutil.rmtree(tasks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
