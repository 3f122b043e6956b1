"""The reading subcommands: window, task, get, search, tasks, stats, verify.

They open the conversation store with ``read_only=True`` (no lock taken, no
file changed), so they work beside a running writer; ``tasks`` and ``stats``
open the task ledger when it is free and read a snapshot of its files when a
frontend holds it."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from .._fmt import (Progress, fmt_time, format_table, indent, kv_table, print_json, print_records, render_value,
                    term_width)
from ..errors import RuneError
from ..verify import verify_state
from ._common import open_reader, require_state, tasks_for_reading

Add = Callable[..., argparse.ArgumentParser]


def register(add: Add) -> None:
    sp = add("window", cmd_window, "the last N messages of a channel")
    sp.add_argument("--channel", required=True, help="channel id")
    sp.add_argument("-n", type=int, default=8, help="how many (default 8)")

    sp = add("task", cmd_task, "every message of a task, all tiers")
    sp.add_argument("task_id", help="task id")

    sp = add("get", cmd_get, "exact read of one message with its verdict",
             "Exact read by msg_id with its verdict: exit 0 FOUND_VERIFIED, 1 NOT_FOUND_CONFIRMED, "
             "2 SOURCE_CORRUPT.")
    sp.add_argument("msg_id", help="message id")

    sp = add("search", cmd_search, "messages whose content contains TEXT")
    sp.add_argument("text", help="the text to find (case-insensitive unless --case-sensitive)")
    sp.add_argument("--channel", help="only this channel")
    sp.add_argument("--limit", type=int, help="only the newest LIMIT hits")
    sp.add_argument("--case-sensitive", action="store_true", help="exact case")

    sp = add("tasks", cmd_tasks, "open tasks of a channel (* marks the active one)")
    sp.add_argument("--channel", required=True, help="channel id")
    sp.add_argument("--all", action="store_true", help="every task of the channel, finished ones too")

    add("stats", cmd_stats, "counts, sizes and recovery notes")

    add("verify", cmd_verify, "full check of every tier (exit 1 and a report on damage)",
        "Full check of every tier: line checksums, archive digests, the index snapshot against the "
        "tail, envelopes against records, the task ledger. Changes nothing. Exit 1 with a report "
        "naming the file and offset of each problem if anything is damaged.")


def cmd_window(args: argparse.Namespace) -> int:
    """Print the last N messages of a channel, oldest first."""
    with open_reader(args) as repo:
        recs = repo.window(args.channel, args.n)
    if args.json:
        print_json([r.to_dict() for r in recs])
    elif not recs:
        print(f"no messages on channel {args.channel!r}")
    else:
        print_records(recs)
    return 0


def cmd_task(args: argparse.Namespace) -> int:
    """Print every message of a task (all tiers), oldest first."""
    with open_reader(args) as repo:
        recs = repo.messages_for_task(args.task_id)
    if args.json:
        print_json([r.to_dict() for r in recs])
    elif not recs:
        print(f"no messages for task {args.task_id!r}")
    else:
        print_records(recs, show_channel=True)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    """Exact read of one message with its verdict: exit 0 found and verified,
    1 not found, 2 stored but corrupt."""
    with open_reader(args) as repo:
        read = repo.get_message(args.msg_id)
    status = getattr(read.status, "name", str(read.status))
    if args.json:
        print_json({"msg_id": args.msg_id, "status": status, "tier": read.tier,
                     "record": read.record.to_dict() if read.record is not None else None})
    else:
        print(f"{args.msg_id}: {status}" + (f" (tier {read.tier})" if read.tier else ""))
        if read.record is not None:
            rec = read.record
            pairs = [(k, v) for k, v in rec.to_dict().items() if k not in ("msg_id",)]
            pairs = [(k, fmt_time(v) + f" ({v})" if k == "ts" else v) for k, v in pairs]
            print(kv_table(pairs))
    if status == "FOUND_VERIFIED":
        return 0
    if status == "SOURCE_CORRUPT":
        print(f"rune-fast: {args.msg_id} is stored but its bytes fail their check; run `rune-fast verify`",
              file=sys.stderr)
        return 2
    return 1


def cmd_search(args: argparse.Namespace) -> int:
    """Print the messages whose content contains TEXT, oldest first."""
    with open_reader(args) as repo:
        hits = repo.search(args.text, args.channel, limit=args.limit, case_sensitive=args.case_sensitive)
    if args.json:
        print_json([{"tier": h.tier, "record": h.record.to_dict()} for h in hits])
    elif not hits:
        print(f"no message contains {args.text!r}")
    else:
        print_records([h.record for h in hits], show_channel=args.channel is None, tiers=[h.tier for h in hits])
        print(f"{len(hits):,} hit{'s' if len(hits) != 1 else ''}")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    """Print the open tasks of a channel (oldest first; * marks the active one)."""
    with tasks_for_reading(args) as tasks:
        if args.all:
            lister = getattr(tasks, "list_tasks", None)
            if lister is None:
                raise RuneError("tasks --all needs TaskStateRepository.list_tasks, missing in this build")
            recs = lister(args.channel)
        else:
            recs = tasks.list_open(args.channel)
        active = tasks.get_active(args.channel)
    active_id = active.task_id if active is not None else None
    if args.json:
        print_json({"channel_id": args.channel, "active": active_id, "tasks": [t.to_dict() for t in recs]})
        return 0
    if not recs:
        print(f"no {'' if args.all else 'open '}tasks on channel {args.channel!r}")
        return 0
    rows = [("*" if t.task_id == active_id else "", t.task_id, t.status, fmt_time(t.created_at), fmt_time(t.updated_at),
             t.parent_task_id or "-", t.title) for t in recs]
    print(format_table(["", "task_id", "status", "created", "updated", "parent", "title"], rows,
                       max_width=term_width(), flex=6))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Counts, sizes and recovery notes of the conversation store and the task ledger."""
    with open_reader(args) as repo:
        conv = repo.stats()
    with tasks_for_reading(args) as tasks:
        tstats = tasks.stats()
    if args.json:
        print_json({"conversation": conv, "tasks": tstats})
    else:
        print("conversation")
        print(indent(kv_table(conv.items())))
        print("tasks")
        print(indent(kv_table(tstats.items())))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Full check of every tier; exit 1 with a report naming file and offset of
    each problem if anything is damaged."""
    state = require_state(args)
    with Progress("verify", 4) as bar:
        result = verify_state(state, bar)
    if args.json:
        print_json(result)
    elif result["ok"]:
        checked = ", ".join(f"{k}={render_value(v)}" for k, v in result["checked"].items())
        print(f"OK: no damage in {state}" + (f" ({checked})" if checked else ""))
    else:
        n = len(result["problems"])
        print(f"DAMAGE: {n} problem{'s' if n != 1 else ''} in {state}")
        rows = [(p["file"], p["offset"], p["message"]) for p in result["problems"]]
        print(format_table(["file", "offset", "problem"], rows, right=(1,)))
    return 0 if result["ok"] else 1
