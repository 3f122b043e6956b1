"""RuneCheckpointSaver beside LangGraph's SqliteSaver, at the same durability.

Run::

    python -m bench.langgraph_compare               # 1,000 steps (about 1-2 minutes)
    python -m bench.langgraph_compare --steps 200   # quicker
    python -m bench.langgraph_compare --dir /some/tmp --json out.json

The workload is a LangGraph agent thread of ``--steps`` super-steps whose state
is one ``messages`` channel (``add_messages``-style: each step's list is the
previous list plus a ``HumanMessage`` and an ``AIMessage`` of about 500 bytes
each). Every step calls ``put`` exactly as LangGraph's loop does (a new channel
version from ``get_next_version``, ``new_versions`` naming the channel, the
previous checkpoint as parent). Both savers get the same calls with the same
objects, one step of one then the same step of the other, so a shared
machine's noise hits both alike.

Durability: SQLite in WAL mode (the saver's own ``setup``) with
``PRAGMA synchronous=FULL``, so each ``put`` commit is fsynced before it
returns; rune_fast ``fdatasync``s each ``put`` before it returns.

Lines: bytes on disk at the end (every file in each store's folder: for SQLite
the database, its ``-wal`` and ``-shm``); ``put`` latency (median over all
steps); ``get_tuple`` of the newest checkpoint (median over one call every
``--get-every`` steps); one ``list`` of the whole thread (wall time, decoding
every checkpoint). Ratio = SQLite / rune_fast (> 1: rune_fast smaller or
faster). Nothing asserts on wall time; the goals (10x less disk, 3x faster
``put``) are reported as met or not.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, create_checkpoint, empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver

from rune_fast.integrations.langgraph import RuneCheckpointSaver


def _folder_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class _Thread:
    """One saver's side of the run: its config chain and channel version."""

    def __init__(self, saver: BaseCheckpointSaver, thread_id: str) -> None:
        self.saver = saver
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.version: Any = None
        self.checkpoint = empty_checkpoint()
        self.put_s: list[float] = []
        self.get_s: list[float] = []

    def step(self, step: int, messages: list[Any]) -> None:
        self.version = self.saver.get_next_version(self.version, None)
        cp = create_checkpoint(self.checkpoint, None, step)
        cp["channel_values"] = {"messages": messages}
        cp["channel_versions"] = {"messages": self.version}
        cp["versions_seen"] = {"agent": {"messages": self.version}}
        metadata = {"source": "loop", "step": step, "parents": {}}
        t0 = time.perf_counter()
        self.config = self.saver.put(self.config, cp, metadata, {"messages": self.version})  # type: ignore[arg-type]
        self.put_s.append(time.perf_counter() - t0)
        self.checkpoint = cp

    def get(self) -> None:
        t0 = time.perf_counter()
        tup = self.saver.get_tuple({"configurable": {"thread_id": self.config["configurable"]["thread_id"],
                                                     "checkpoint_ns": ""}})
        self.get_s.append(time.perf_counter() - t0)
        assert tup is not None and tup.checkpoint["id"] == self.checkpoint["id"]

    def list_all(self) -> tuple[float, int]:
        t0 = time.perf_counter()
        n = sum(1 for _ in self.saver.list({"configurable": {"thread_id": self.config["configurable"]["thread_id"]}}))
        return time.perf_counter() - t0, n


def run(steps: int, folder: str, get_every: int, content_bytes: int = 480) -> dict[str, Any]:
    rune_dir = os.path.join(folder, "rune")
    sqlite_dir = os.path.join(folder, "sqlite")
    os.makedirs(sqlite_dir)
    conn = sqlite3.connect(os.path.join(sqlite_dir, "checkpoints.sqlite"), check_same_thread=False)
    sqlite_saver = SqliteSaver(conn)
    sqlite_saver.setup()                       # journal_mode=WAL
    conn.execute("PRAGMA synchronous=FULL")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    rune_saver = RuneCheckpointSaver(rune_dir)
    sides = {"rune_fast": _Thread(rune_saver, "thread-1"), "sqlite": _Thread(sqlite_saver, "thread-1")}
    messages: list[Any] = []
    gc.disable()
    try:
        for step in range(steps):
            messages = messages + [
                HumanMessage(content=f"question {step}: " + "q" * content_bytes, id=f"h{step}"),
                AIMessage(content=f"answer {step}: " + "a" * content_bytes, id=f"a{step}"),
            ]
            for side in sides.values():
                side.step(step, messages)
            if (step + 1) % get_every == 0:
                for side in sides.values():
                    side.get()
    finally:
        gc.enable()
    lists = {name: side.list_all() for name, side in sides.items()}
    out: dict[str, Any] = {
        "steps": steps, "messages": len(messages),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, {platform.system()} {platform.release()}, "
                   f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "rows": [],
    }
    rune_saver.close()
    conn.close()
    disk = {"rune_fast": _folder_bytes(rune_dir), "sqlite": _folder_bytes(sqlite_dir)}
    rows = [
        ("bytes on disk", disk["rune_fast"], disk["sqlite"], "B"),
        ("put, median", statistics.median(sides["rune_fast"].put_s) * 1e3,
         statistics.median(sides["sqlite"].put_s) * 1e3, "ms"),
        ("get_tuple (newest), median", statistics.median(sides["rune_fast"].get_s) * 1e3,
         statistics.median(sides["sqlite"].get_s) * 1e3, "ms"),
        (f"list of the whole thread ({lists['rune_fast'][1]} checkpoints)", lists["rune_fast"][0] * 1e3,
         lists["sqlite"][0] * 1e3, "ms"),
    ]
    assert lists["rune_fast"][1] == lists["sqlite"][1] == steps
    for name, rune, sqlite, unit in rows:
        out["rows"].append({"what": name, "rune_fast": rune, "sqlite": sqlite, "unit": unit,
                            "ratio": sqlite / rune if rune else float("inf")})
    out["disk_goal_met"] = disk["sqlite"] >= 10 * disk["rune_fast"]
    out["put_goal_met"] = out["rows"][1]["ratio"] >= 3
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        f"LangGraph checkpointers, {result['steps']} steps ({result['messages']} messages of ~500 B), "
        f"{result['date']}, commit {result['commit']}",
        f"machine: {result['machine']}",
        "durability: both durable on return of put (SQLite WAL + synchronous=FULL; rune_fast fdatasync)",
        "",
        "| what | rune_fast | SQLite (SqliteSaver) | ratio (SQLite / rune_fast) |",
        "|---|---:|---:|---:|",
    ]
    for row in result["rows"]:
        if row["unit"] == "B":
            a, b = f"{row['rune_fast'] / 1e6:,.2f} MB", f"{row['sqlite'] / 1e6:,.2f} MB"
        else:
            a, b = f"{row['rune_fast']:,.2f} ms", f"{row['sqlite']:,.2f} ms"
        lines.append(f"| {row['what']} | {a} | {b} | {row['ratio']:,.1f}x |")
    lines.append("")
    lines.append(f"goal 10x less disk: {'met' if result['disk_goal_met'] else 'NOT met'}; "
                 f"goal 3x faster put: {'met' if result['put_goal_met'] else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.langgraph_compare", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1000, help="super-steps in the thread (default 1000)")
    ap.add_argument("--get-every", type=int, default=10, help="one get_tuple every N steps (default 10)")
    ap.add_argument("--dir", default=None, help="folder for both stores (default: a temp folder, removed)")
    ap.add_argument("--json", default=None, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.get_every < 1:
        ap.error("--steps and --get-every must be at least 1")
    folder = tempfile.mkdtemp(prefix="lg-bench-", dir=args.dir)
    try:
        result = run(args.steps, folder, args.get_every)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
