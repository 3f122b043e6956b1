"""What the SQLite comparison reports: the lines it measures (their keys,
order and descriptions), the sizes of a run, the rows and the report, the
table as text and the bar chart."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RUNE_REF", "DESCRIPTIONS", "OPERATIONS", "Config", "Row", "Report", "fmt_value", "format_table",
           "plot"]

RUNE_REF = "rune_fast.conversation_state:ConversationStateRepository"

#: What each line measures, and at which durability (``--explain`` prints this).
DESCRIPTIONS = {
    "append_fsync": "append(msg) of one new message with durability='fsync' (on stable storage when the "
                    "call returns; includes the store's automatic compactions), per message, on the "
                    "N-message store; vs SQLite WAL synchronous=FULL, one transaction per append.",
    "append_fsync_vs_raw": "the same rune_fast appends vs the floor: os.write + os.fdatasync of each "
                           "message's canonical JSON line to a plain file.",
    "append_many": "append_many of a batch of 1,000 new messages (one sync at the end), per batch (the "
                   "mean of 4 consecutive batches per repeat, so that each repeat pays its share of the "
                   "automatic compactions); vs SQLite one transaction per batch at synchronous=FULL.",
    "append_batch": "append(msg) with durability='batch' from one thread (group commit; each call still "
                    "durable on return); vs SQLite synchronous=FULL (same promise).",
    "append_batch_threads": "append(msg) with durability='batch' from 2 threads at once on one store "
                            "(group commit: concurrent appends share a sync; each call durable on "
                            "return), per message; vs SQLite synchronous=FULL, one connection per thread "
                            "(writers serialise on the WAL lock, default busy handler).",
    "append_none_off": "append(msg) with durability='none' (survives a process crash, not power loss); "
                       "vs SQLite WAL synchronous=OFF (no syncs: the same promise).",
    "append_none_normal": "the same rune_fast appends vs SQLite WAL synchronous=NORMAL (no sync per "
                          "commit, sync at WAL checkpoints: consistent after power loss, may lose the "
                          "latest commits).",
    "window": "window(ch, 8): the last 8 messages of a random channel, decoded into records; vs SQLite "
              "ORDER BY seq DESC LIMIT 8 on the (channel_id, seq) index.",
    "get_message": "get_message(id) of a random stored id (digest verified); vs SQLite lookup on the "
                   "unique msg_id index.",
    "messages_for_task": "messages_for_task(task) of a random task (about 40 messages), all tiers; vs "
                         "SQLite on the (task_id, seq) index.",
    "get_message_cold": "get_message(id), each id read once (ids outside the set the get_message line "
                        "cycles through): no record cache helps rune_fast, SQLite's page cache is as warm "
                        "as the OS keeps it.",
    "messages_for_task_cold": "messages_for_task(task), each task read once, likewise.",
    "search_ci": "search(text) case-insensitive over every message (hot and cool), an ASCII needle "
                 "planted in ~0.3% of messages; vs SQLite's instr(lower(content), lower(?)) full scan "
                 "(ASCII-only folding: see the hit-count notes).",
    "search_first": "the same search, the first after opening the store (close not timed): rune_fast "
                    "builds its search filters then (see the README), SQLite has no such step.",
    "open_first_window": "open the N-message store and read its first window(ch, 8) (page cache warm; "
                         "close not timed); vs SQLite connect + pragmas + the same query.",
    "open_after_kill": "the same, right after a writer process appended 3 messages and was killed with "
                       "SIGKILL (recovery included); SQLite replays its WAL likewise.",
    "open_append_close": "a short session, as a command-line agent runs one: open the N-message store, "
                         "append one message (durability='fsync'), close; vs SQLite connect + pragmas, "
                         "one insert (synchronous=FULL), close (the last connection checkpoints its WAL).",
    "rss_per_msg": "resident memory (VmRSS) added by opening the N-message store and touching it "
                   "(window on every channel, 50 tasks, 1,000 get_message), divided by N; fresh "
                   "subprocess, baseline taken after the imports.",
    "write_amp_bulk": "bytes written to disk (/proc/self/io write_bytes - cancelled_write_bytes) per "
                      "byte of message content, for a bulk load in batches of 1,000 (durability='fsync') "
                      "plus compact() (with cooling beyond hot_window); vs SQLite, one txn per batch.",
    "write_amp_durable": "the same ratio for single durable appends (fsync per append) into a store; "
                         "vs SQLite synchronous=FULL.",
    "write_amp_durable_vs_raw": "the same rune_fast number vs the raw write+fdatasync loop of the "
                                "messages' JSON lines (the floor: every sync re-dirties a 4 KiB page).",
    "disk_size": "allocated bytes of every file of the N-message store after close; vs the SQLite "
                 "database after close (WAL checkpointed away).",
    "append_at_small": "durable append (fsync) cost on a store of the small size (10,000 by default).",
    "append_at_n": "durable append (fsync) cost on the N-message store (same samples as append_fsync).",
    "append_flatness": "growth of the durable append cost from the small store to N (t_N / t_small); "
                       "flat means about 1.",
    "bulk_load": "building the N-message store (append_many batches of 1,000, durability='fsync', then "
                 "compact()), per message, one run only; vs SQLite one transaction per batch.",
}

#: Keys of the rows every run produces, in table order.
OPERATIONS = (
    "append_fsync",
    "append_fsync_vs_raw",
    "append_many",
    "append_batch",
    "append_batch_threads",
    "append_none_off",
    "append_none_normal",
    "window",
    "get_message",
    "messages_for_task",
    "get_message_cold",
    "messages_for_task_cold",
    "search_ci",
    "search_first",
    "open_first_window",
    "open_after_kill",
    "open_append_close",
    "rss_per_msg",
    "write_amp_bulk",
    "write_amp_durable",
    "write_amp_durable_vs_raw",
    "disk_size",
    "append_at_small",
    "append_at_n",
    "append_flatness",
    "bulk_load",
)


# ---------------------------------------------------------------------------
# configuration and results


@dataclass
class Config:
    """Sizes of one run. ``n`` messages in the main stores; the rest scale the loops."""

    n: int = 100_000
    repeats: int = 5
    queries: int = 2_000          # window / get_message calls per repeat
    task_queries: int = 200       # messages_for_task calls per repeat
    search_queries: int = 1       # full searches per repeat
    slices: int = 10              # each repeat of a loop is cut in this many turns, interleaved
    appends: int = 200            # single appends per repeat (each durability mode)
    batch: int = 1_000            # append_many batch size (also the bulk-load batch)
    many_batches: int = 4         # append_many batches per repeat (timed: their mean), so that
                                  # each repeat pays its share of the automatic compactions
    small: int = 10_000           # store size of the flatness baseline
    io_n: int = 50_000            # messages of the bytes-written bulk load
    io_appends: int = 500         # durable appends of the bytes-written measure
    seed: int = 0
    channels: int | None = None   # None: scaled with n (see rune_fast.bench.workload.generate)
    tasks: int | None = None
    workdir: str | None = None
    compact_every: int = 64
    hot_window: int = 512
    subprocess_timeout: float = 600.0

    @classmethod
    def quick(cls, **kw: Any) -> "Config":
        base: dict[str, Any] = dict(n=20_000, queries=500, task_queries=100, appends=100, io_n=20_000, io_appends=300)
        base.update(kw)
        return cls(**base)

    @classmethod
    def tiny(cls, **kw: Any) -> "Config":
        """For the harness test: a few hundred messages, one repeat."""
        base: dict[str, Any] = dict(n=200, repeats=1, slices=1, queries=20, task_queries=5, appends=5, batch=20, small=50,
                    io_n=200, io_appends=10, many_batches=1)
        base.update(kw)
        return cls(**base)

    def fixed(self) -> "Config":
        """Sizes made consistent with ``n``."""
        self.small = max(1, min(self.small, self.n // 2 if self.n >= 4 else self.n))
        self.io_n = max(1, min(self.io_n, self.n))
        self.repeats = max(1, self.repeats)
        self.slices = max(1, min(self.slices, self.appends, self.queries, self.task_queries))
        return self


@dataclass
class Row:
    """One line of the table.

    ``rune`` and ``other`` are in ``unit`` (``ns`` per operation, ``B/msg``,
    ``B/B`` (bytes written per content byte), ``B``, ``x``). ``ratio`` is
    ``other / rune`` (> 1: rune_fast faster or smaller). ``met`` is None when
    the line has no target or a side is missing.
    """

    key: str
    operation: str
    rune: float | None
    other: float | None
    unit: str
    vs: str
    target: str = ""
    met: bool | None = None
    ratio: float | None = None
    goal: float | None = None     # the target as a minimum ratio, where it is one
    samples_rune: list[float] = field(default_factory=list)
    samples_other: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.ratio is None and self.rune and self.other is not None and self.rune > 0:
            self.ratio = self.other / self.rune


@dataclass
class Report:
    config: dict[str, Any]
    machine: dict[str, Any]
    rows: list[Row]
    notes: list[str]
    rune_store: str

    def row(self, key: str) -> Row:
        for r in self.rows:
            if r.key == key:
                return r
        raise KeyError(key)

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "machine": self.machine, "rune_store": self.rune_store,
                "rows": [asdict(r) for r in self.rows], "notes": self.notes}


# ---------------------------------------------------------------------------
# the table and the chart


def fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ns":
        if v >= 1e9:
            return f"{v / 1e9:.2f} s"
        if v >= 1e6:
            return f"{v / 1e6:.2f} ms"
        if v >= 1e3:
            return f"{v / 1e3:.1f} us"
        return f"{v:.0f} ns"
    if unit == "B":
        if v >= 1 << 20:
            return f"{v / (1 << 20):.1f} MiB"
        return f"{v / 1024:.1f} KiB"
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v:.1f} {unit}"


def format_table(report: Report) -> str:
    """The table as text: operation, rune_fast, sqlite (or baseline), ratio, target, vs."""
    head = ("operation", "rune_fast", "sqlite|base", "ratio", "target", "vs (durability)")
    lines = [head]
    for r in report.rows:
        mark = "" if r.met is None else (" ok" if r.met else " MISS")
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append((r.operation, fmt_value(r.rune, r.unit), fmt_value(r.other, r.unit), ratio,
                      (r.target + mark) if r.target else "-", r.vs))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for j, line in enumerate(lines):
        out.append("  ".join(cell.ljust(widths[i]) if i in (0, 4, 5) else cell.rjust(widths[i])
                             for i, cell in enumerate(line)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def plot(report: Report, path: str) -> bool:
    """Bar chart of the ratios (log scale) with target marks; False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in report.rows if r.ratio is not None and r.ratio > 0]
    ratios = [r.ratio for r in rows if r.ratio is not None]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    ys = range(len(rows))
    colors = ["tab:green" if r.met else ("tab:red" if r.met is False else "tab:gray") for r in rows]
    ax.barh(list(ys), ratios, color=colors)
    for y, r, ratio in zip(ys, rows, ratios):
        label = f"{ratio:.0f}" if ratio >= 100 else f"{ratio:.1f}" if ratio >= 10 else f"{ratio:.2g}"
        ax.annotate(f" {label}x", (ratio, y), va="center", fontsize=7)
        if r.goal is not None:
            ax.plot([r.goal], [y], marker="|", color="black", markersize=14, markeredgewidth=2)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r.operation for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("ratio other / rune_fast (> 1: rune_fast faster or smaller)\n"
                  "| = target; green met, red missed, grey no target", fontsize=9)
    title = f"rune_fast vs SQLite, {report.config['n']:,} messages, {report.machine['cpu']}"
    if report.rune_store != RUNE_REF:
        title += f"\n(rune side: {report.rune_store} -- not the real repository)"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
