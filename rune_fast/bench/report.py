"""What the SQLite comparison reports: the lines it measures (their keys,
order and descriptions), the sizes of a run, the rows and the report, the
table as text and the bar chart."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RUNE_REF", "DESCRIPTIONS", "OPERATIONS", "operation_of", "Config", "Row", "Report", "fmt_value",
           "format_table", "plot"]

RUNE_REF = "rune_fast.conversation_state:ConversationStateRepository"

from .workload import NEEDLES

_SEARCH_DESC = ("search(q) with Unicode case folding over every message (hot and cool), {about}, "
                "every hit decoded; vs SQLite's instr(lower(content), lower(?)) full scan (ASCII-only "
                "folding: see the hit-count notes). Plain loop: a scan for the folded needle's UTF-8 "
                "over ONE buffer holding every message's content bytes, exact case, measured in the same "
                "run: the faster of glibc memmem (through ctypes, one call per occurrence) and "
                "bytes.count (CPython's fastsearch){extra}.")
_LIMIT_DESC = ("search(q, limit=20): the newest 20 hits of the same needle ({about}); vs SQLite "
               "ORDER BY seq DESC LIMIT 20 over the same instr(lower()) condition, the two sides "
               "taking turns (each sample after one call of the other side; at least 15). Plain "
               "loop: the same full scan.")


def _search_lines() -> tuple[dict[str, str], tuple[str, ...]]:
    desc: dict[str, str] = {}
    keys: list[str] = []
    for nd in NEEDLES:
        extra = ("; for this needle the plain loop is the scan PLUS decoding every hit (orjson.loads "
                 "of its canonical JSON line + from_dict into a record)") if nd.cls == "ten_pct" else ""
        desc[f"search_{nd.cls}"] = _SEARCH_DESC.format(about=nd.about, extra=extra)
        desc[f"search_{nd.cls}_limit"] = _LIMIT_DESC.format(about=nd.about)
        keys += [f"search_{nd.cls}", f"search_{nd.cls}_limit"]
    return desc, tuple(keys)


_SDESC, _SKEYS = _search_lines()

#: What each line measures, and at which durability (``--explain`` prints this).
DESCRIPTIONS = {
    "record_new": "constructing one ConversationMessageRecord from keyword arguments (with its "
                  "validation), in the timing process; plain loop: building a tuple of the same 10 "
                  "values. No SQLite side.",
    "append_fsync": "append(msg) of one new message with durability='fsync' (on stable storage when the "
                    "call returns; includes the store's automatic compactions), per message, on the "
                    "N-message store; vs SQLite WAL synchronous=FULL, one transaction per append. Plain "
                    "loop: os.write + os.fdatasync of the message's canonical JSON line to a plain file.",
    "append_many": "append_many of a batch of 1,000 new messages into the loaded N-message store (one "
                   "sync at the end), per batch (the mean of 4 consecutive batches per repeat, so that "
                   "each repeat pays its share of the automatic compactions); vs SQLite one transaction "
                   "per batch at synchronous=FULL. Plain loop: one os.write of the 1,000 JSON lines + "
                   "os.fdatasync.",
    "bulk_many_mean": "the append_many(1,000) calls of the bulk load that builds the N-message store "
                      "(fresh subprocess, durability='fsync'), mean per call (records built outside "
                      "the timing); vs SQLite's one-transaction batches in the same kind of load. Plain "
                      "loop: os.write of the batch's JSON lines + os.fdatasync, per batch.",
    "bulk_many_slowest": "the slowest single append_many(1,000) call of that bulk load (a call that "
                         "runs a compaction or cooling shows here); vs SQLite's slowest batch.",
    "bulk_load": "the whole bulk load of N messages per message: every append_many(1,000) call plus "
                 "the final compact() (all compactions and cooling included), one run; vs SQLite, one "
                 "transaction per batch + WAL checkpoint. Plain loop: write + fdatasync per batch.",
    "compact_after_bulk": "compact() right after the bulk load's last batch (one run); vs SQLite's "
                          "PRAGMA wal_checkpoint(TRUNCATE).",
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
    "append_sizes": "durable append (fsync) cost per message on stores of several sizes (the small one, "
                    "N/10 when it is larger, N), interleaved in the same loop; vs SQLite at the same "
                    "sizes. One line per size.",
    "append_flatness": "growth of the durable append cost from the smallest store to N (t_N / t_small); "
                       "flat means about 1. The ratio column is SQLite's growth / rune_fast's.",
    "window": "window(ch, 8): the last 8 messages of a random channel, decoded into records; vs SQLite "
              "ORDER BY seq DESC LIMIT 8 on the (channel_id, seq) index. Plain loop: 8 slices of the "
              "one content buffer by precomputed offsets (Python, no decoding).",
    "get_message": "get_message(id) of a random stored id from a working set of 2,000 (digest "
                   "verified); vs SQLite lookup on the unique msg_id index. Plain loop: dict lookup + "
                   "one slice of the content buffer.",
    "messages_for_task": "messages_for_task(task) of a random task (sizes vary, its messages interleaved "
                         "with other tasks' over the archive), all tiers; vs SQLite on the (task_id, seq) "
                         "index. Plain loop: one slice of the content buffer per message.",
    "messages_for_task_big": "the same on the biggest tenth of the tasks (hundreds of messages spread "
                             "over the archive from 100,000 messages on; the label gives their mean size).",
    "get_message_cold": "get_message(id), each id read once, in a FRESH process per repeat and side "
                        "(open untimed; ids outside the warm working set): nothing of the process helps, "
                        "the OS page cache is as warm as it is for both sides.",
    "messages_for_task_cold": "messages_for_task(task), each task read once, in a fresh process per "
                              "repeat and side, likewise.",
    **_SDESC,
    "search_limit_flatness": "search(common needle, limit=20) on the N-message store / the same on the "
                             "small store: flat means about 1. Each sample (two calls) follows one call of "
                             "each other side, never the per-repeat collection; at least 15 samples. "
                             "Ratio column: SQLite's growth / rune_fast's.",
    "search_first": "search of the rare ASCII needle, the first after opening the store (close not "
                    "timed): rune_fast builds or reads its search filters then, SQLite has no such step.",
    "open_first_window": "open the N-message store and read its first window(ch, 8) (page cache warm; "
                         "close not timed); vs SQLite connect + pragmas + the same query.",
    "open_after_kill": "the same, right after a writer process appended 3 messages and was killed with "
                       "SIGKILL (recovery included); SQLite replays its WAL likewise.",
    "open_append_close": "a short session, as a command-line agent runs one: open the N-message store, "
                         "append one message (durability='fsync'), close; vs SQLite connect + pragmas, "
                         "one insert (synchronous=FULL), close (the last connection checkpoints its WAL).",
    "rss_anon": "anonymous resident memory (RssAnon of /proc/self/status) added by opening the N-message "
                "store in a FRESH process and a realistic read mix (window(ch, 8) on every channel, "
                "messages_for_task on 1% of the tasks, get_message on 10,000 ids, five searches: the four "
                "rare needles and the common one with limit=20), after gc.collect(), per stored "
                "message; baseline taken after the imports. SQLite: its default page cache (2 MiB cap).",
    "rss_file": "the file-backed part (RssFile: mapped file pages the reads touched) of the same "
                "growth, per stored message: the page cache's business, shown apart.",
    "bulk_peak_anon": "peak growth of anonymous resident memory during the bulk load of N messages (fresh "
                      "subprocess, RssAnon sampled every 2 ms by a thread; baseline after the workload is "
                      "in memory as plain dicts; records built per batch), per message.",
    "bulk_peak_rss": "peak growth of the whole resident set (VmHWM, reset through /proc/self/clear_refs "
                     "after the baseline: exact, includes mapped file pages) during the same load, per "
                     "message.",
    "write_amp_bulk": "bytes written to disk (/proc/self/io write_bytes - cancelled_write_bytes) per "
                      "byte of message content, for a bulk load in batches of 1,000 (durability='fsync') "
                      "plus compact() (with cooling beyond hot_window); vs SQLite, one txn per batch.",
    "write_amp_durable": "the same ratio for single durable appends (fsync per append) into a store; "
                         "vs SQLite synchronous=FULL. Plain loop: the raw write+fdatasync loop of the "
                         "messages' JSON lines (every sync re-dirties a 4 KiB page).",
    "disk_size": "allocated bytes of every file of the N-message store after close, per byte of "
                 "message content; vs the SQLite database after close (WAL checkpointed away).",
}

#: Keys of the rows every run produces, in table order (``append_sizes`` stands
#: for one row per store size, keyed ``append_at_<size>``).
OPERATIONS = (
    "record_new",
    "append_fsync",
    "append_many",
    "bulk_many_mean",
    "bulk_many_slowest",
    "bulk_load",
    "compact_after_bulk",
    "append_batch",
    "append_batch_threads",
    "append_none_off",
    "append_none_normal",
    "append_sizes",
    "append_flatness",
    "window",
    "get_message",
    "messages_for_task",
    "messages_for_task_big",
    "get_message_cold",
    "messages_for_task_cold",
    *_SKEYS,
    "search_limit_flatness",
    "search_first",
    "open_first_window",
    "open_after_kill",
    "open_append_close",
    "rss_anon",
    "rss_file",
    "bulk_peak_anon",
    "bulk_peak_rss",
    "write_amp_bulk",
    "write_amp_durable",
    "disk_size",
)


def operation_of(key: str) -> str:
    """The OPERATIONS entry a row key belongs to (``append_at_10000`` -> ``append_sizes``)."""
    return "append_sizes" if key.startswith("append_at_") else key


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
    small: int = 10_000           # store size of the flatness baselines
    io_n: int = 50_000            # messages of the bytes-written bulk load
    io_appends: int = 500         # durable appends of the bytes-written measure
    cold_ids: int = 2_000         # ids read once per fresh process (each repeat)
    cold_tasks: int = 100         # tasks read once per fresh process (each repeat)
    mem_ids: int = 10_000         # get_message calls of the memory probe's read mix
    seed: int = 0
    channels: int | None = None   # None: scaled with n (see rune_fast.bench.workload.generate)
    tasks: int | None = None
    workdir: str | None = None
    compact_every: int = 64
    hot_window: int = 512
    subprocess_timeout: float = 3600.0

    @classmethod
    def quick(cls, **kw: Any) -> "Config":
        base: dict[str, Any] = dict(n=20_000, repeats=3, queries=500, task_queries=60, appends=60, io_n=10_000,
                                    io_appends=100, small=5_000, cold_ids=500, cold_tasks=30, mem_ids=2_000,
                                    many_batches=2)
        base.update(kw)
        return cls(**base)

    @classmethod
    def tiny(cls, **kw: Any) -> "Config":
        """For the harness test: a few hundred messages, one repeat."""
        base: dict[str, Any] = dict(n=200, repeats=1, slices=1, queries=20, task_queries=5, appends=5, batch=20,
                                    small=50, io_n=200, io_appends=10, many_batches=1, cold_ids=20, cold_tasks=3,
                                    mem_ids=50)
        base.update(kw)
        return cls(**base)

    def fixed(self) -> "Config":
        """Sizes made consistent with ``n``."""
        self.small = max(1, min(self.small, self.n // 2 if self.n >= 4 else self.n))
        self.io_n = max(1, min(self.io_n, self.n))
        self.repeats = max(1, self.repeats)
        self.slices = max(1, min(self.slices, self.appends, self.queries, self.task_queries))
        return self

    def sizes(self) -> list[int]:
        """Store sizes of the per-append cost lines: small, n // 10 when larger, n."""
        out = [self.small]
        if self.n // 10 > 2 * self.small:
            out.append(self.n // 10)
        if self.n > self.small:
            out.append(self.n)
        return out


@dataclass
class Row:
    """One line of the table.

    ``rune``, ``other`` (SQLite) and ``base`` (the plain loop) are in ``unit``
    (``ns`` per operation, ``B/msg``, ``B/B`` (bytes per content byte), ``x``).
    ``ratio`` is ``other / rune`` (> 1: rune_fast faster or smaller);
    ``base_ratio`` is ``rune / base`` (how many times the plain loop's cost
    rune_fast pays; 1 = as fast as the floor). ``met`` is None when the line
    has no target or a side is missing.
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
    base: float | None = None
    base_ratio: float | None = None
    base_vs: str = ""
    samples_base: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.ratio is None and self.rune and self.other is not None and self.rune > 0:
            self.ratio = self.other / self.rune
        if self.base_ratio is None and self.rune is not None and self.base:
            self.base_ratio = self.rune / self.base


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
    if unit == "B/B":
        return f"{v:.2f} B/B"
    return f"{v:.1f} {unit}"


def format_table(report: Report) -> str:
    """The table as text: operation, rune_fast, sqlite, ratio, plain loop, rune/loop, target, vs."""
    head = ("operation", "rune_fast", "sqlite", "ratio", "plain loop", "x loop", "target", "vs (durability)")
    lines = [head]
    for r in report.rows:
        mark = "" if r.met is None else (" ok" if r.met else " MISS")
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        bratio = "-" if r.base_ratio is None else f"{r.base_ratio:.2f}x"
        lines.append((r.operation, fmt_value(r.rune, r.unit), fmt_value(r.other, r.unit), ratio,
                      fmt_value(r.base, r.unit), bratio, (r.target + mark) if r.target else "-", r.vs))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for j, line in enumerate(lines):
        out.append("  ".join(cell.ljust(widths[i]) if i in (0, 6, 7) else cell.rjust(widths[i])
                             for i, cell in enumerate(line)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_markdown(report: Report) -> str:
    """The same table in Markdown (for README and docs/BENCHMARKS.md)."""
    out = ["| operation | rune_fast | SQLite | ratio | plain loop | x loop | target | compared with |",
           "|---|---|---|---|---|---|---|---|"]
    for r in report.rows:
        mark = "" if r.met is None else (" ok" if r.met else " **MISS**")
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        bratio = "-" if r.base_ratio is None else f"{r.base_ratio:.2f}x"
        out.append(f"| {r.operation} | {fmt_value(r.rune, r.unit)} | {fmt_value(r.other, r.unit)} | {ratio} | "
                   f"{fmt_value(r.base, r.unit)} | {bratio} | {(r.target + mark) if r.target else '-'} | "
                   f"{r.vs}{'; loop: ' + r.base_vs if r.base_vs else ''} |")
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
