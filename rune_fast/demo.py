"""The demo (``make demo``, ``python -m rune_fast.demo``): what rune_fast is for,
in about a minute.

1. Sets up a fresh state directory: ``./rune-state`` if it does not exist or
   was made by an earlier demo (it carries the marker file ``.rune-demo``);
   otherwise -- a directory with someone's data -- ``./rune-state/demo-<time>``.
   Nothing the demo did not create is ever deleted.
2. Runs an agent frontend's workload through :class:`rune_fast.operator.ConversationOperator`:
   many channels, tasks that are created, amended, confirmed, superseded,
   completed and failed, tool calls and tool results, earlier history imported
   in bulk, compaction and cooling into Parquet archives (a small hot window),
   and a deletion that compaction erases from disk.
3. Prints what was stored: stats, a window, a search across tiers, the resumed
   transcript rendered as an Anthropic request, and a full verify.
4. Runs the side-by-side comparison against SQLite (WAL, same durability) of
   :mod:`rune_fast.bench` in quick mode, prints its table and writes
   ``bench-results.png`` (matplotlib, from ``pip install 'rune_fast[demo]'``;
   the demo says so when it cannot plot).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from typing import Any

__all__ = ["main", "prepare_state_dir", "run_workload"]

MARKER = ".rune-demo"
MARKER_TEXT = "made by python -m rune_fast.demo; the demo may wipe this directory\n"

CHANNELS = ("support", "ops", "research", "code-review", "billing", "infra", "data", "personal")

REQUESTS = {
    "support": ["Why was customer {n} charged twice?", "Draft a reply to ticket #{n}",
                "Summarise the complaints about the mobile login this week", "Find the refund policy for annual plans"],
    "ops": ["Summarise the deploy log of release v{n}", "Why did the billing rollout pause at {n}%?",
            "Check the error budget of the checkout service", "Page the on-call if p99 latency exceeds {n} ms"],
    "research": ["Compare three vector databases for {n}M embeddings", "Read the paper on speculative decoding",
                 "What is the state of the art for long-context retrieval?", "Outline a study of {n} user interviews"],
    "code-review": ["Review PR {n}", "Why does test_payment_retry flake?", "List the open PRs touching billing",
                    "Suggest a refactor of the {n}-line session module"],
    "billing": ["Reconcile invoice batch {n}", "Explain the spike in failed charges",
                "Forecast next month's revenue from {n} renewals", "Find duplicate subscriptions"],
    "infra": ["Plan the Postgres {n} upgrade", "Why is node {n} out of disk?", "Rotate the TLS certificates",
              "Estimate the cost of {n} more GPU nodes"],
    "data": ["Build a dashboard of weekly active users", "Why did the ETL job fail at step {n}?",
             "Deduplicate the {n}k contact rows", "Write the SQL for cohort retention"],
    "personal": ["Plan a {n}-day trip to Lisbon", "Summarise my unread email", "Book a dentist appointment",
                 "Draft a birthday message for Sam"],
}
FOLLOW_UPS = ["also include last week's numbers", "make it shorter", "use a table please", "and check staging too",
              "focus on the EU region", "cite your sources"]
CONFIRMS = ["ok", "yes", "go ahead", "Sure!", "continue", "do it"]
TOOLS = [("search_logs", "query"), ("run_sql", "sql"), ("http_get", "url"), ("read_file", "path"),
         ("list_prs", "repo"), ("get_metrics", "service")]
RESULTS = ["Found {n} matching lines; the first error is a connection timeout to db-{n}.",
           "{n} rows returned; median 42 ms, p99 950 ms.", "HTTP 200, {n} bytes.",
           "The file has {n} lines; the retry loop starts at line 118.",
           "{n} open pull requests, 3 touching billing.", "error rate {n}.2% over the last hour"]
ANSWERS = ["Done. In short: {r} I recommend rolling back the last change and re-running the canary.",
           "Here is the summary: {r} Nothing else needs attention today.",
           "The root cause is a connection pool limit; {r} I opened a ticket with the details.",
           "I checked both regions. {r} The EU numbers are within budget."]


def _say(text: str = "") -> None:
    print(text, flush=True)


def _section(title: str) -> None:
    _say()
    _say(title)
    _say("=" * len(title))


def prepare_state_dir(base: str) -> str:
    """A fresh, empty state directory the demo owns (see the module docstring)."""
    base = os.path.abspath(base)
    marker = os.path.join(base, MARKER)
    if os.path.isdir(base) and os.path.isfile(marker):
        with open(marker, encoding="utf-8") as f:
            ours = f.read() == MARKER_TEXT
        if ours:
            shutil.rmtree(base)
    if os.path.exists(base):
        # Someone's directory (or a file): leave it alone, work beside it.
        if not os.path.isdir(base):
            raise SystemExit(f"demo: {base} exists and is not a directory; give --state DIR")
        state = os.path.join(base, time.strftime("demo-%Y%m%d-%H%M%S"))
    else:
        state = base
    os.makedirs(state, mode=0o700)
    os.chmod(state, 0o700)
    with open(os.path.join(state, MARKER), "w", encoding="utf-8") as f:
        f.write(MARKER_TEXT)
    os.chmod(os.path.join(state, MARKER), 0o600)
    return state


def _history(rng: random.Random, channel: str, count: int, start_ts: float) -> list[Any]:
    """Earlier history of a channel (as a frontend would import it): user /
    assistant pairs with tool use, oldest first."""
    from .records import ConversationMessageRecord as M

    out: list[Any] = []
    ts = start_ts
    k = 0
    while len(out) < count:
        k += 1
        task = f"task_hist_{channel}_{k:04d}"
        ask = rng.choice(REQUESTS[channel]).format(n=rng.randint(2, 999))
        ts += rng.uniform(5, 300)
        out.append(M(ts=ts, role="user", content=ask, channel_id=channel, task_id=task))
        if rng.random() < 0.5:
            name, arg = rng.choice(TOOLS)
            call_id = f"toolu_h{channel[:3]}{k:05d}"
            ts += 1.5
            out.append(M(ts=ts, role="assistant", content="", channel_id=channel, task_id=task,
                         tool_calls=({"id": call_id, "name": name, "arguments": {arg: ask[:40]}},)))
            ts += 0.7
            out.append(M(ts=ts, role="tool", content=rng.choice(RESULTS).format(n=rng.randint(1, 99)),
                         channel_id=channel, task_id=task, tool_call_id=call_id))
        ts += rng.uniform(2, 30)
        out.append(M(ts=ts, role="assistant", channel_id=channel, task_id=task,
                     content=rng.choice(ANSWERS).format(r=rng.choice(RESULTS).format(n=rng.randint(1, 99)))))
    return out[:count]


def run_workload(state: str, *, history_per_channel: int = 600, live_tasks: int = 64, seed: int = 7,
                 hot_window: int = 64, progress: Any = None) -> dict[str, Any]:
    """The demo workload into ``state``; returns counts of what it did."""
    from .operator import ConversationOperator
    from .records import ConversationMessageRecord as M

    rng = random.Random(seed)
    counts: dict[str, Any] = {"history": 0, "live_messages": 0, "tasks_created": 0, "amended": 0,
                              "superseded": 0, "completed": 0, "failed": 0, "tool_calls": 0}
    t0 = time.time() - 30 * 86400
    total_steps = len(CHANNELS) + live_tasks
    step = 0

    def tick(note: str) -> None:
        nonlocal step
        step += 1
        if progress is not None:
            progress.update(step, note)

    if progress is not None:
        progress.total = total_steps
    with ConversationOperator.open(state, model="claude-sonnet", hot_window=hot_window, compact_every=512) as op:
        conv = op.conversation
        # Earlier history, imported in bulk (one sync per batch).
        for ch in CHANNELS:
            msgs = _history(rng, ch, history_per_channel, t0)
            for i in range(0, len(msgs), 500):
                counts["history"] += conv.append_many(msgs[i:i + 500])
            tick(f"history of {ch}")
        # Live traffic through the operator's send_task rules.
        for k in range(live_tasks):
            ch = CHANNELS[k % len(CHANNELS)]
            ask = rng.choice(REQUESTS[ch]).format(n=rng.randint(2, 999))
            res = op.send(ch, ask)
            counts["tasks_created"] += res.action != "amended"
            counts["superseded"] += res.action == "superseded"
            task = res.task
            if rng.random() < 0.15:
                # The user changes their mind before the task starts: the waiting
                # task is superseded by a new one.
                res = op.send(ch, rng.choice(REQUESTS[ch]).format(n=rng.randint(2, 999)))
                counts["superseded"] += res.action == "superseded"
                counts["tasks_created"] += 1
                task = res.task
            op.start(task.task_id)
            if rng.random() < 0.35:
                op.send(ch, rng.choice(FOLLOW_UPS))  # follow-up on a running task: amended
                counts["amended"] += 1
            # The model calls a tool or two.
            for _ in range(rng.randint(0, 2)):
                name, arg = rng.choice(TOOLS)
                call: dict[str, Any] = {"id": f"toolu_{k:03d}{rng.randint(0, 99999):05d}", "name": name,
                                        "arguments": {arg: ask[:48]}}
                conv.append(M(role="assistant", content="", channel_id=ch, task_id=task.task_id, tool_calls=(call,)))
                conv.append(M(role="tool", content=rng.choice(RESULTS).format(n=rng.randint(1, 99)), channel_id=ch,
                              task_id=task.task_id, tool_call_id=call["id"]))
                counts["tool_calls"] += 1
                counts["live_messages"] += 2
            if rng.random() < 0.2:
                # The model asks for approval; the user confirms.
                op.tasks.transition(task.task_id, "awaiting_approval")
                conv.append(M(role="assistant", content="This will restart production workers. Proceed?",
                              channel_id=ch, task_id=task.task_id))
                op.send(ch, rng.choice(CONFIRMS))
                counts["amended"] += 1
                counts["live_messages"] += 2
            answer = rng.choice(ANSWERS).format(r=rng.choice(RESULTS).format(n=rng.randint(1, 99)))
            if rng.random() < 0.1:
                op.complete(task.task_id, "I could not finish: the metrics API kept timing out.", status="failed")
                counts["failed"] += 1
            else:
                op.complete(task.task_id, answer)
                counts["completed"] += 1
            counts["live_messages"] += 2
            tick(f"task {k + 1} on {ch}")
        # One task left running, so the channel has an active task to show.
        op.start(op.send("ops", "Watch the checkout error rate for the next hour").task.task_id)
        # A message the user asks to forget: deleted now, erased by compaction.
        secret = M(role="user", content="my card number is 4111 1111 1111 1111 (please forget this)",
                   channel_id="personal")
        conv.append(secret)
        conv.delete(secret.msg_id)
        counts["deleted"] = 1
        counts["compaction"] = conv.compact().to_dict()
        counts["secret_msg_id"] = secret.msg_id
    return counts


def _show_store(state: str) -> None:
    from . import sync
    from ._fmt import kv_table, print_records
    from .conversation_state import ConversationStateRepository
    from .tasks import TaskStateRepository
    from .verify import verify_state

    with ConversationStateRepository(state, read_only=True) as conv:
        st = conv.stats()
        _section("What is stored (rune-fast stats)")
        keys = ("messages", "channels", "hot_and_tail", "cool", "cool_files", "segments", "tail_bytes",
                "hot_bytes", "cool_bytes", "tombstones", "compactions", "durability")
        _say(kv_table([(k, st[k]) for k in keys if k in st] or list(st.items())))
        with TaskStateRepository(state) as tasks:
            ts = tasks.stats()
            active = tasks.get_active("ops")
        _say(kv_table([("tasks", ts.get("tasks")), ("open tasks", ts.get("open")),
                        ("active task on ops", f"{active.task_id} ({active.status}): {active.title}"
                         if active else "none")]))

        _section("The last 6 messages of #ops (rune-fast window --channel ops -n 6)")
        print_records(conv.window("ops", 6))

        _section("Search across hot and cool tiers (rune-fast search timeout --limit 6)")
        hits = conv.search("timeout", limit=6)
        print_records([h.record for h in hits], show_channel=True, tiers=[h.tier for h in hits])
        tiers: dict[str, int] = {}
        for h in conv.search("timeout"):
            tiers[h.tier] = tiers.get(h.tier, 0) + 1
        _say(f"all hits by tier: {', '.join(f'{t} {n}' for t, n in sorted(tiers.items()))}")

        channel = _channel_with_tool_use(conv)
        _section(f"Resume #{channel} for a model (resume_messages({channel!r}, 8), rendered by to_anthropic)")
        msgs = conv.resume_messages(channel, 8)
        rendered = sync.to_anthropic(msgs)
        width = shutil.get_terminal_size((160, 24)).columns
        for m in rendered:
            text = json.dumps(m, ensure_ascii=False)
            _say("  " + (text if len(text) <= width - 2 else text[: width - 5] + "..."))
        _say(f"({len(rendered)} provider messages from the last 8 turns: tool calls paired with their results, "
             f"adjacent same-role turns merged, system messages left out)")

    _section("Integrity (rune-fast verify)")
    report = verify_state(state)
    if report["ok"]:
        checked = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in report["checked"].items())
        _say(f"OK: no damage ({checked})")
    else:
        _say(f"DAMAGE: {report['problems']}")


def _channel_with_tool_use(conv: Any) -> str:
    """A channel whose last few messages include a tool call (the demo's
    most interesting transcript); "ops" if none does."""
    for ch in CHANNELS:
        if any(m.tool_calls for m in conv.window(ch, 6)):
            return ch
    return "ops"


def _erased(state: str, needle: bytes) -> list[str]:
    left = []
    for base, _dirs, names in os.walk(state):
        for n in names:
            p = os.path.join(base, n)
            with open(p, "rb") as f:
                if needle in f.read():
                    left.append(p)
    return left


def _bench(n: int | None, plot_path: str, repeats: int | None) -> None:
    from ._fmt import Progress
    from .bench import compare as bc

    cfg = bc.Config.quick()
    if n is not None:
        cfg.n = n
    if repeats is not None:
        cfg.repeats = repeats
    _section(f"Side by side with SQLite (WAL, same durability): rune_fast.bench --quick, {cfg.n:,} messages")
    t0 = time.perf_counter()
    with Progress("bench") as bar:
        def log(line: str) -> None:
            if bar.enabled:
                bar.advance(1, line.strip()[:70])
            else:
                print(f"  {line}", file=sys.stderr, flush=True)

        report = bc.run_comparison(cfg, log=log)
    _say(bc.format_table(report))
    for note in report.notes:
        _say(f"note: {note}")
    m = report.machine
    _say(f"machine: {m.get('cpu')}, {m.get('cores')} cores; each timed line the median of {cfg.repeats} "
         f"repeats; ratio = sqlite / rune_fast (> 1: rune_fast faster or smaller); {time.perf_counter() - t0:.0f} s")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        _say("plot: not written -- matplotlib is not installed (`pip install 'rune_fast[demo]'`, "
             "or run `make demo`, which installs it)")
        return
    if bc.plot(report, plot_path):
        _say(f"plot: {plot_path}")
    else:
        _say("plot: not written (matplotlib unavailable)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rune_fast.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("state_dir", nargs="?", help="same as --state")
    p.add_argument("--state", default="./rune-state", help="where to put the demo state (default ./rune-state)")
    p.add_argument("--history", type=int, default=600, help="earlier messages per channel (default 600)")
    p.add_argument("--tasks", type=int, default=64, help="live tasks through the operator (default 64)")
    # Quick mode, scaled so that `make demo` on a fresh clone (venv, build,
    # demo) stays under two minutes on a 2-core machine; `rune-fast bench
    # --quick` or `python -m rune_fast.bench` give the fuller run.
    p.add_argument("--bench-n", type=int, default=10_000,
                   help="messages in the SQLite comparison (default 10,000; rune_fast.bench --quick uses 20,000)")
    p.add_argument("--bench-repeats", type=int, default=3,
                   help="repeats per timed line, median reported (default 3)")
    p.add_argument("--no-bench", action="store_true", help="skip the SQLite comparison")
    p.add_argument("--plot", default="bench-results.png", help="where to write the plot (default bench-results.png)")
    args = p.parse_args(argv)

    from ._fmt import Progress

    t0 = time.perf_counter()
    state = prepare_state_dir(args.state_dir or args.state)
    _section("rune_fast demo: the storage core of an LLM agent frontend")
    _say(f"state directory: {state}")
    _say(f"workload: {len(CHANNELS)} channels x {args.history} messages of earlier history, then {args.tasks} "
         f"live tasks through ConversationOperator (create / amend / confirm / supersede / tool calls / "
         f"complete / fail), hot window 64 so older messages cool into Parquet, one deletion")
    w0 = time.perf_counter()
    with Progress("workload") as bar:
        counts = run_workload(state, history_per_channel=args.history, live_tasks=args.tasks, progress=bar)
    secs = time.perf_counter() - w0
    comp = counts.pop("compaction")
    secret_id = counts.pop("secret_msg_id")
    _say(f"done in {secs:.1f} s: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in counts.items()))
    _say("compaction: " + ", ".join(f"{k.replace('_', ' ')} {v:.3f}" if isinstance(v, float) else f"{k.replace('_', ' ')} {v:,}"
                                    for k, v in comp.items() if v not in (0, False, 0.0) and not isinstance(v, bool)))
    left = _erased(state, b"4111 1111 1111 1111")
    _say(f"deleted message {secret_id}: "
         + ("its bytes are gone from every file" if not left else f"STILL ON DISK in {left}"))
    _show_store(state)
    if not args.no_bench:
        _bench(args.bench_n, args.plot, args.bench_repeats)
    _section("Next")
    rel = os.path.relpath(state)
    flag = "" if os.path.abspath(state) == os.path.abspath("./rune-state") else f" --state {rel}"
    for cmd in ("stats", "window --channel ops", "tasks --channel ops", "search refund --limit 5", "verify",
                "export --format parquet --out messages.parquet", "--help"):
        _say(f"  rune-fast{flag} {cmd}")
    _say(f"demo finished in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
