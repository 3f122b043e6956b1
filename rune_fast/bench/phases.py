"""The phases of one comparison run, in the order :func:`rune_fast.bench.compare.run_comparison`
runs them: records, bulk load, opens, memory and bytes written, reads,
searches, appends. Each phase returns its rows; :class:`Run` carries what
they share (the workload, both stores' specs and folders, fresh messages)."""
from __future__ import annotations

import json
import os
import pickle
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from . import workload as wl
from .floors import ContentBuffer
from .probes import StoreSpec, disk_usage, probe, probe_all, settle_archive
from .report import Config, Row, fmt_value
from .searches import check_answers, limit_flatness_row, search_rows
from .timing import Loops, interleaved, time_row, timed

__all__ = ["Run"]


@dataclass
class Run:
    cfg: Config
    w: wl.Workload
    rune: StoreSpec
    sql: StoreSpec
    factory: Callable[[dict], Any]
    rt: Any
    root: str
    say: Callable[[str], None]
    notes: list[str] = field(default_factory=list)
    fresh: list[Any] = field(default_factory=list)
    fresh_pos: int = 0

    def dir(self, kind: str, size: int | None = None) -> str:
        return os.path.join(self.root, kind if size is None or size == self.cfg.n else f"{kind}-{size}")

    def take(self, k: int) -> list[Any]:
        """``k`` messages no store holds yet (the same ones are never handed out twice)."""
        if self.fresh_pos + k > len(self.fresh):
            more = max(k, 4 * self.cfg.batch)
            self.fresh.extend(self.factory(m) for m in self.w.fresh(more, seed=1000 + len(self.fresh)))
        out = self.fresh[self.fresh_pos:self.fresh_pos + k]
        self.fresh_pos += k
        return out

    def open(self, spec: StoreSpec, size: int | None = None, durability: str = "fsync") -> Any:
        return spec.open(self.dir(spec.kind, size), durability, self.rt)

    # ------------------------------------------------------------------ records
    def record_rows(self) -> list[Row]:
        dicts = self.w.messages[: min(len(self.w.messages), 20_000)]
        fields = list(dicts[0])
        tuples = [tuple(d[f] for f in fields) for d in dicts]
        factory = self.factory
        loops = Loops(self.cfg.slices, self.cfg.repeats)
        res = interleaved({"rune": loops.cycle(factory, dicts),
                           "base": loops.cycle(lambda t: tuple(t), [list(t) for t in tuples])},
                          self.cfg.repeats, slices=self.cfg.slices)
        row = time_row("record_new", "construct one ConversationMessageRecord", res, "no SQLite side",
                       "<= 1 us", None, other=None, base="base", base_vs="tuple() of the same 10 values")
        row.met = row.rune is not None and row.rune <= 1_000
        return [row]

    # ---------------------------------------------------------------- bulk load
    def bulk_rows(self) -> list[Row]:
        cfg = self.cfg
        pkl = os.path.join(self.root, "workload.pkl")
        with open(pkl, "wb") as f:
            pickle.dump(self.w.messages, f, protocol=pickle.HIGHEST_PROTOCOL)
        out: dict[str, dict[str, Any]] = {}
        for kind, spec in (("rune", self.rune), ("sqlite", self.sql), ("raw", self.sql)):
            self.say(f"bulk load of {cfg.n:,} messages in append_many batches of {cfg.batch:,}: {kind} "
                     "(fresh subprocess) ...")
            job = {"job": "bulk", "spec": asdict(spec), "dir": self.dir(kind), "workload": pkl,
                   "batch": cfg.batch, "raw": kind == "raw"}
            out[kind] = probe(job, cfg.subprocess_timeout)
        os.unlink(pkl)
        r, s, b = out["rune"], out["sqlite"], out["raw"]
        n = max(1, cfg.n)

        def mean(x: dict[str, Any]) -> float:
            return statistics.fmean(x["calls"]) if x["calls"] else 0.0

        rows = [
            Row("bulk_many_mean", f"append_many({cfg.batch:,}) in the bulk load, mean per call "
                f"({cfg.batch * 1e9 / max(1.0, mean(r)):,.0f} msg/s)", mean(r), mean(s), "ns",
                "SQLite 1 txn/batch, FULL", ">= 5x", base=mean(b), base_vs="write + fdatasync of the batch",
                goal=5.0),
            Row("bulk_many_slowest", f"slowest append_many({cfg.batch:,}) call of the bulk load",
                float(max(r["calls"], default=0)), float(max(s["calls"], default=0)), "ns",
                "SQLite's slowest batch", ">= 0.5x", base=float(max(b["calls"], default=0)),
                base_vs="slowest write + fdatasync", goal=0.5),
            Row("bulk_load", f"bulk load of {cfg.n:,} incl. compactions, cooling, compact(), per msg (1 run)",
                (sum(r["calls"]) + r["compact_ns"]) / n, (sum(s["calls"]) + s["compact_ns"]) / n, "ns",
                f"SQLite 1 txn/batch of {cfg.batch:,}, FULL, + checkpoint", ">= 3x",
                base=sum(b["calls"]) / n, base_vs="write + fdatasync per batch", goal=3.0),
            Row("compact_after_bulk", "compact() right after the bulk load (1 run)", float(r["compact_ns"]),
                float(s["compact_ns"]), "ns", "SQLite wal_checkpoint(TRUNCATE)"),
            Row("bulk_peak_anon", f"peak RssAnon growth during the bulk load of {cfg.n:,}, per msg",
                r["peak_anon"] / n, s["peak_anon"] / n, "B/msg", "SQLite (same load)", "rune <= 128 B",
                r["peak_anon"] / n <= 128),
            Row("bulk_peak_rss", "peak VmHWM growth (anon + mapped) during the same load, per msg",
                r["peak_rss"] / n, s["peak_rss"] / n, "B/msg", "SQLite (same load)"),
        ]
        for row in rows[:3]:
            if row.ratio is not None and row.goal is not None:
                row.met = row.ratio >= row.goal
        if not (r.get("hwm_reset") and s.get("hwm_reset")):
            self.notes.append("VmHWM could not be reset (/proc/self/clear_refs refused): the peak-RSS line "
                              "is measured from the process's start, an upper bound")
        slow_r = sorted(r["calls"])[-5:]
        self.notes.append(f"bulk load: rune_fast's 5 slowest append_many calls "
                          f"{', '.join(fmt_value(x, 'ns') for x in slow_r)}; median call "
                          f"{fmt_value(statistics.median(r['calls']) if r['calls'] else 0, 'ns')} "
                          f"(SQLite {fmt_value(statistics.median(s['calls']) if s['calls'] else 0, 'ns')})")
        self._settle_archive()
        # the smaller stores of the per-append and limit=20 flatness lines, loaded here untimed
        for size in cfg.sizes():
            if size == cfg.n:
                continue
            for spec in (self.rune, self.sql):
                st = self.open(spec, size)
                for i in range(0, size, cfg.batch):
                    st.append_many([self.factory(m) for m in self.w.messages[i:min(size, i + cfg.batch)]])
                st.compact()
                st.close()
        a_rune = disk_usage(self.dir("rune"))[0]
        a_sql = disk_usage(self.dir("sqlite"))[0]
        content = wl.content_bytes(self.w.messages)
        rows.append(Row("disk_size", f"on-disk size per content byte, {cfg.n:,} msgs "
                        f"({fmt_value(a_rune, 'B')} / {fmt_value(a_sql, 'B')})", a_rune / content,
                        a_sql / content, "B/B", "SQLite after close (WAL checkpointed)", "ratio >= 1",
                        a_rune <= a_sql, goal=1.0))
        return rows

    def _settle_archive(self) -> None:
        """:func:`settle_archive` on the loaded store (untimed; noted)."""
        st = self.open(self.rune)
        try:
            got = settle_archive(st)
        finally:
            st.close()
        if got is not None:
            before, after, took = got
            self.notes.append(f"after the bulk load (untimed): a writer session left open merged the archive "
                              f"from {before} to {after} files in {took:.1f} s (its idle watcher); the lines "
                              "below read that store")

    # -------------------------------------------------------------------- opens
    def open_rows(self) -> list[Row]:
        cfg, rune, sql, rt = self.cfg, self.rune, self.sql, self.rt
        rows: list[Row] = []
        reps = cfg.repeats
        ch0 = self.w.sample_channels(1, seed=11)[0]
        d_rune, d_sql = self.dir("rune"), self.dir("sqlite")

        def open_job(spec: StoreSpec, d: str) -> Callable[[int], float]:
            def job(_i: int) -> float:
                t0 = time.perf_counter_ns()
                s = spec.open(d, "fsync", rt)
                s.window(ch0, 8)
                t1 = time.perf_counter_ns()
                s.close()
                return float(t1 - t0)
            return job

        res = interleaved({"rune": open_job(rune, d_rune), "sql": open_job(sql, d_sql)}, reps)
        rows.append(time_row("open_first_window", f"open + first window, {cfg.n:,} msgs", res,
                             "SQLite open + indexed window (warm page cache)", ">= 0.10x", 0.1))

        def first_search_job(spec: StoreSpec, d: str) -> Callable[[int], float]:
            def job(_i: int) -> float:
                s = spec.open(d, "fsync", rt)
                search = s.search_ci if spec.kind == "sqlite" else s.search
                t0 = time.perf_counter_ns()
                search(wl.NEEDLE_ASCII)
                t1 = time.perf_counter_ns()
                s.close()
                return float(t1 - t0)
            return job

        res = interleaved({"rune": first_search_job(rune, d_rune), "sql": first_search_job(sql, d_sql)}, reps,
                          warmup=False)
        rows.append(time_row("search_first", f"first search {wl.NEEDLE_ASCII!r} after open", res,
                             "SQLite instr(lower(content), lower(?)) scan", "", None))
        if res["rune"] and res["sql"]:
            self.notes.append(f"first search after open: the first of the {len(res['rune'])} opens took "
                              f"{fmt_value(res['rune'][0], 'ns')} (SQLite's first {fmt_value(res['sql'][0], 'ns')})")

        def killed_open_job(spec: StoreSpec, d: str) -> Callable[[int], float]:
            inner = open_job(spec, d)

            def job(i: int) -> float:
                probe({"job": "kill_writer", "spec": asdict(spec), "dir": d, "appends": 3,
                       "seed": 5000 + i}, cfg.subprocess_timeout)
                return inner(i)
            return job

        res = interleaved({"rune": killed_open_job(rune, d_rune), "sql": killed_open_job(sql, d_sql)},
                          reps, warmup=False)
        rows.append(time_row("open_after_kill", "open + first window after SIGKILLed writer", res,
                             "SQLite WAL recovery after SIGKILL", ">= 0.10x", 0.1))

        session_msgs: dict[int, Any] = {}

        def session_job(spec: StoreSpec, d: str) -> Callable[[int], float]:
            def job(i: int) -> float:
                if i not in session_msgs:
                    session_msgs[i] = self.take(1)[0]
                m = session_msgs[i]
                t0 = time.perf_counter_ns()
                s = spec.open(d, "fsync", rt)
                s.append(m)
                s.close()
                return float(time.perf_counter_ns() - t0)
            return job

        res = interleaved({"rune": session_job(rune, d_rune), "sql": session_job(sql, d_sql)}, reps)
        rows.append(time_row("open_append_close", "open + 1 durable append + close", res,
                             "SQLite connect, insert (FULL), close", "", None))
        return rows

    # ------------------------------------------------- memory and bytes written
    def memory_io_rows(self) -> tuple[list[Row], dict[Any, Any]]:
        cfg, w, rune, sql = self.cfg, self.w, self.rune, self.sql
        qfile = os.path.join(self.root, "queries.json")
        searches: list[tuple[str, int | None]] = [(nd.query, None) for nd in wl.NEEDLES if nd.cls in ("rare_ascii", "rare_nonascii",
                                                                       "expansion", "cjk")]
        searches.append((next(nd.query for nd in wl.NEEDLES if nd.cls == "common"), 20))
        with open(qfile, "w") as f:
            json.dump({"channels": w.channel_ids,
                       "tasks": random.Random(21).sample(w.task_ids, max(1, len(w.task_ids) // 100)),
                       "ids": w.sample_ids(min(cfg.mem_ids, max(1, cfg.n)), seed=22), "searches": searches}, f)
        self.say("resident memory and bytes written to disk (subprocesses) ...")
        io_jobs: dict[Any, dict[str, Any]] = {}
        for spec in (rune, sql):
            io_jobs[("bulk", spec.kind)] = {"job": "io_bulk", "spec": asdict(spec), "n": cfg.io_n,
                                            "seed": cfg.seed, "batch": cfg.batch,
                                            "dir": os.path.join(self.root, f"io-bulk-{spec.kind}")}
            io_jobs[("durable", spec.kind)] = {"job": "io_durable", "spec": asdict(spec), "n": cfg.small,
                                               "seed": cfg.seed, "batch": cfg.batch, "appends": cfg.io_appends,
                                               "dir": os.path.join(self.root, f"io-durable-{spec.kind}")}
        io_jobs[("durable", "raw")] = {"job": "io_durable", "spec": asdict(sql), "raw": True, "n": 1,
                                       "seed": cfg.seed, "batch": cfg.batch, "appends": cfg.io_appends,
                                       "dir": os.path.join(self.root, "io-durable-raw")}
        # One subprocess per side, the two side by side: the memory job first (its
        # baseline is the fresh interpreter), then that side's bytes-written jobs.
        plan = {kind: [("mem", {"job": "mem", "spec": asdict(spec), "dir": self.dir(kind), "queries": qfile})]
                + [(key, job) for key, job in io_jobs.items()
                   if key[1] == kind or (kind == "sqlite" and key[1] == "raw")]
                for kind, spec in (("rune", rune), ("sqlite", sql))}
        results = probe_all({kind: {"job": "multi", "jobs": [job for _, job in steps]}
                             for kind, steps in plan.items()}, cfg.subprocess_timeout)
        mem: dict[str, Any] = {}
        io: dict[Any, Any] = {}
        for kind, steps in plan.items():
            for (key, _job), result in zip(steps, results[kind]):
                if key == "mem":
                    mem[kind] = result
                else:
                    io[key] = result

        def per(kind: str, key: str, stage: str = "after") -> float:
            r = mem[kind]
            return max(0, r[stage].get(key, 0) - r["before"].get(key, 0)) / max(1, cfg.n)

        anon_r = per("rune", "RssAnon")
        rows = [
            Row("rss_anon", "RssAnon growth per stored msg, fresh process, open + read mix", anon_r,
                per("sqlite", "RssAnon"), "B/msg", "SQLite, default page cache (2 MiB cap)", "rune <= 64 B",
                anon_r <= 64),
            Row("rss_file", "RssFile growth (mapped file pages) per stored msg, same", per("rune", "RssFile"),
                per("sqlite", "RssFile"), "B/msg", "SQLite (same reads)"),
        ]
        self.notes.append(
            f"memory after open only (before the reads): rune_fast RssAnon {per('rune', 'RssAnon', 'opened'):.1f} "
            f"B/msg, RssFile {per('rune', 'RssFile', 'opened'):.1f} B/msg; read mix = window(ch, 8) on all "
            f"{len(w.channel_ids)} channels, messages_for_task on {max(1, len(w.task_ids) // 100)} tasks (1%), "
            f"get_message on {min(cfg.mem_ids, cfg.n):,} ids, searches {[q for q, _ in searches]} "
            "(the last with limit=20)")
        return rows, io

    @staticmethod
    def write_amp_rows(cfg: Config, io: dict[Any, Any], notes: list[str]) -> list[Row]:
        def amp(key: tuple[str, str]) -> float:
            r = io[key]
            return r["io"]["disk_bytes"] / max(1, r["content"])

        rows = [
            Row("write_amp_bulk", f"disk bytes written / content byte, bulk {cfg.io_n:,} + compact",
                amp(("bulk", "rune")), amp(("bulk", "sqlite")), "B/B", "SQLite 1 txn/batch, FULL",
                "rune <= 3", amp(("bulk", "rune")) <= 3),
            Row("write_amp_durable", f"disk bytes written / content byte, {cfg.io_appends} durable appends",
                amp(("durable", "rune")), amp(("durable", "sqlite")), "B/B", "SQLite FULL, 1 txn/append",
                ">= 1x, <= 1.2x loop", amp(("durable", "rune")) <= amp(("durable", "sqlite"))
                and amp(("durable", "rune")) <= 1.2 * amp(("durable", "raw")), goal=1.0,
                base=amp(("durable", "raw")), base_vs="raw write+fdatasync loop"),
        ]
        if io[("durable", "raw")]["io"]["disk_bytes"] <= 0:
            # tmpfs and the like: /proc/self/io counts block-device writes only
            for r in rows:
                r.met = None
                r.ratio = None
                r.base_ratio = None
            notes.append("UNMEASURED: the work directory's file system counted no block writes (tmpfs?); "
                         "the 'disk bytes written' lines measure nothing here")
        return rows

    # -------------------------------------------------------------------- reads
    def read_rows(self, s_rune: Any, s_sql: Any) -> list[Row]:
        cfg, w = self.cfg, self.w
        reps, sl = cfg.repeats, cfg.slices
        self.say("content buffer of the plain loops ...")
        buf = ContentBuffer(w.messages)
        self.buf = buf
        loops = Loops(sl, reps)
        chans = w.sample_channels(cfg.queries, seed=31)
        ids = w.sample_ids(cfg.queries, seed=32)
        tasks = w.sample_tasks(cfg.task_queries, seed=33)
        sizes = w.task_sizes()
        ranked = sorted(sizes, key=lambda t: -sizes[t])
        big = ranked[: max(1, len(ranked) // 10)]
        big_q = w.sample(big, cfg.task_queries, seed=34)
        mean_all = statistics.fmean(sizes[t] for t in tasks if t in sizes) if sizes else 0.0
        mean_big = statistics.fmean(sizes[t] for t in big) if big else 0.0
        rows: list[Row] = []
        self.say("reads: window, get_message, messages_for_task ...")
        res = interleaved({"rune": loops.cycle(lambda c: s_rune.window(c, 8), chans),
                           "sql": loops.cycle(lambda c: s_sql.window(c, 8), chans),
                           "base": loops.cycle(lambda c: buf.window(c, 8), chans)}, reps, slices=sl)
        rows.append(time_row("window", "window(ch, 8)", res, "SQLite index (channel_id, seq)", ">= 30x", 30,
                             base="base", base_vs="8 slices of the content buffer"))
        res = interleaved({"rune": loops.cycle(s_rune.get_message, ids), "sql": loops.cycle(s_sql.get_message, ids),
                           "base": loops.cycle(buf.get, ids)}, reps, slices=sl)
        rows.append(time_row("get_message", "get_message(id)", res, "SQLite unique index on msg_id", ">= 5x", 5,
                             base="base", base_vs="dict + 1 slice"))
        res = interleaved({"rune": loops.cycle(s_rune.messages_for_task, tasks),
                           "sql": loops.cycle(s_sql.messages_for_task, tasks),
                           "base": loops.cycle(buf.task, tasks)}, reps, slices=sl)
        rows.append(time_row("messages_for_task", f"messages_for_task(task) (avg {mean_all:.0f} msgs)", res,
                             "SQLite index (task_id, seq)", ">= 15x", 15, base="base",
                             base_vs="1 slice per message"))
        res = interleaved({"rune": loops.cycle(s_rune.messages_for_task, big_q),
                           "sql": loops.cycle(s_sql.messages_for_task, big_q),
                           "base": loops.cycle(buf.task, big_q)}, reps, slices=sl)
        rows.append(time_row("messages_for_task_big", f"messages_for_task, biggest 10% (avg {mean_big:.0f} msgs)",
                             res, "SQLite index (task_id, seq)", ">= 15x", 15, base="base",
                             base_vs="1 slice per message"))
        self.say("searches: every needle class, unlimited and limit=20, vs SQLite and a scan ...")
        rows += search_rows(w.messages, buf, self.rt, s_rune, s_sql, reps, self.say)
        s_rune_s, s_sql_s = self.open(self.rune, cfg.small), self.open(self.sql, cfg.small)
        rows.append(limit_flatness_row(cfg.n, cfg.small, s_rune, s_sql, s_rune_s, s_sql_s, reps))
        s_rune_s.close()
        s_sql_s.close()
        check_answers(w.messages, s_rune, s_sql, self.notes)
        return rows

    def cold_rows(self) -> list[Row]:
        """Each id once and each task once, in a fresh process per repeat and side (no store
        open in this process: ids and tasks outside the working sets of :meth:`read_rows`)."""
        cfg, w = self.cfg, self.w
        warm_ids = set(w.sample_ids(cfg.queries, seed=32))
        warm_tasks = set(w.sample_tasks(cfg.task_queries, seed=33))
        reps = cfg.repeats
        self.say("reads: each id once, each task once (fresh processes) ...")
        pool = [m["msg_id"] for m in w.messages if m["msg_id"] not in warm_ids]
        ids = random.Random(35).sample(pool, min(len(pool), cfg.cold_ids * reps))
        pool = [t for t in w.task_ids if t not in warm_tasks] or list(w.task_ids)
        tasks = random.Random(36).sample(pool, min(len(pool), cfg.cold_tasks * reps))
        per_i, per_t = max(1, len(ids) // reps), max(1, len(tasks) // reps)
        res: dict[str, list[float]] = {"rune": [], "sql": [], "rune_t": [], "sql_t": []}
        for i in range(reps):
            qfile = os.path.join(self.root, f"cold-{i}.json")
            with open(qfile, "w") as f:
                json.dump({"ids": ids[i * per_i:(i + 1) * per_i], "tasks": tasks[i * per_t:(i + 1) * per_t]}, f)
            order = [("rune", self.rune), ("sql", self.sql)]
            if i % 2:
                order.reverse()
            for name, spec in order:
                r = probe({"job": "cold", "spec": asdict(spec), "dir": self.dir(spec.kind), "queries": qfile},
                          cfg.subprocess_timeout)
                res[name].append(r["ids"])
                res[name + "_t"].append(r["tasks"])
        return [
            time_row("get_message_cold", "get_message(id), each id once (fresh process)", res,
                     "SQLite unique index on msg_id", ">= 2x", 2),
            time_row("messages_for_task_cold", "messages_for_task(task), each task once (fresh process)", res,
                     "SQLite index (task_id, seq)", ">= 2x", 2, rune="rune_t", other="sql_t"),
        ]

    # ------------------------------------------------------------------ appends
    def append_rows(self) -> list[Row]:
        cfg, rune, sql = self.cfg, self.rune, self.sql
        reps, sl = cfg.repeats, cfg.slices
        rows: list[Row] = []
        self.say("appends: fsync, raw write+fdatasync, store sizes, append_many ...")
        sizes = cfg.sizes()
        stores = {(kind, size): self.open(spec, size) for size in sizes for kind, spec in
                  (("rune", rune), ("sql", sql))}
        raw_fd = os.open(os.path.join(self.root, "raw.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def raw_append(line: bytes) -> None:
            os.write(raw_fd, line)
            os.fdatasync(raw_fd)

        k = max(1, cfg.appends // sl)

        def raw_job(_i: int) -> float:
            lines = [wl.json_line(m) for m in self.take(k)]  # encoded outside the timing: the floor
            return timed(raw_append, lines)

        def append_job(store: Any) -> Callable[[int], float]:
            return lambda _i: timed(store.append, self.take(k))

        jobs: dict[str, Callable[[int], float]] = {"base": raw_job}
        for (kind, size), st in stores.items():
            jobs[f"{kind}@{size}"] = append_job(st)
        res = interleaved(jobs, reps, slices=sl)
        n = cfg.n
        res["rune"], res["sql"] = res[f"rune@{n}"], res[f"sql@{n}"]
        row = time_row("append_fsync", "append, durable (fsync), per msg", res,
                       "SQLite WAL synchronous=FULL, 1 txn/append", ">= 1.2x, <= 1.25x loop", 1.2, base="base",
                       base_vs="os.write + os.fdatasync of the JSON line", max_base_ratio=1.25)
        rows.append(row)
        size_rows = [time_row(f"append_at_{size}", f"append, durable, store of {size:,}", res,
                              "SQLite FULL (same store size)", "", None, rune=f"rune@{size}", other=f"sql@{size}")
                     for size in sizes]
        first, last = size_rows[0], size_rows[-1]
        flat_r = last.rune / first.rune if first.rune and last.rune else None
        flat_s = last.other / first.other if first.other and last.other else None
        flat = Row("append_flatness", f"append cost growth {sizes[0]:,} -> {sizes[-1]:,} (t_N / t_small)", flat_r,
                   flat_s, "x", "SQLite growth (ratio: sqlite/rune)", "rune <= 1.25x",
                   None if flat_r is None else flat_r <= 1.25)
        os.close(raw_fd)
        for (_kind, size), st in stores.items():
            if size != n:
                st.close()
        s_rune, s_sql = stores[("rune", n)], stores[("sql", n)]
        raw_many_fd = os.open(os.path.join(self.root, "raw-many.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                              0o600)

        def raw_many(data: bytes) -> None:
            os.write(raw_many_fd, data)
            os.fdatasync(raw_many_fd)

        def many_job(store: Any) -> Callable[[int], float]:
            return lambda _i: timed(store.append_many, [self.take(cfg.batch) for _ in range(cfg.many_batches)])

        def raw_many_job(_i: int) -> float:
            data = [b"".join(wl.json_line(m) for m in self.take(cfg.batch)) for _ in range(cfg.many_batches)]
            return timed(raw_many, data)

        res = interleaved({"rune": many_job(s_rune), "sql": many_job(s_sql), "base": raw_many_job}, reps)
        os.close(raw_many_fd)
        rows.append(time_row("append_many", f"append_many of {cfg.batch:,} (per batch)", res,
                             "SQLite 1 txn/batch, synchronous=FULL", ">= 5x", 5, base="base",
                             base_vs="1 write + fdatasync of the batch"))
        s_rune.close()
        s_sql.close()
        rows += self.mode_rows(k)
        rows += size_rows
        rows.append(flat)
        return rows

    def mode_rows(self, k: int) -> list[Row]:
        cfg, rune, sql = self.cfg, self.rune, self.sql
        reps, sl = cfg.repeats, cfg.slices
        rows: list[Row] = []
        self.say("appends: batch and none durability modes ...")

        def append_job(store: Any) -> Callable[[int], float]:
            return lambda _i: timed(store.append, self.take(k))

        s_rune = self.open(rune, durability="batch")
        s_sql = self.open(sql)
        res = interleaved({"rune": append_job(s_rune), "sql": append_job(s_sql)}, reps, slices=sl)
        rows.append(time_row("append_batch", "append, durability=batch, per msg (1 thread)", res,
                             "SQLite FULL (both durable on return)", "", None))
        s_sql2 = self.open(sql)

        def threaded_job(stores: list[Any]) -> Callable[[int], float]:
            def job(_i: int) -> float:
                parts = [self.take(k) for _ in stores]
                barrier = threading.Barrier(len(stores) + 1)
                errors: list[BaseException] = []

                def worker(store: Any, part: list[Any]) -> None:
                    barrier.wait()
                    try:
                        for m in part:
                            store.append(m)
                    except BaseException as exc:  # reported below, not swallowed
                        errors.append(exc)

                threads = [threading.Thread(target=worker, args=(st, part)) for st, part in zip(stores, parts)]
                for t in threads:
                    t.start()
                barrier.wait()
                t0 = time.perf_counter_ns()
                for t in threads:
                    t.join()
                t1 = time.perf_counter_ns()
                if errors:
                    raise errors[0]
                return (t1 - t0) / (k * len(stores))
            return job

        res = interleaved({"rune": threaded_job([s_rune, s_rune]), "sql": threaded_job([s_sql, s_sql2])}, reps,
                          slices=sl)
        rows.append(time_row("append_batch_threads", "append, durability=batch, 2 threads, per msg", res,
                             "SQLite FULL, 1 connection per thread", "", None))
        s_rune.close()
        s_sql.close()
        s_sql2.close()
        s_rune = self.open(rune, durability="none")
        s_off = self.open(sql, durability="off")
        res = interleaved({"rune": append_job(s_rune), "sql": append_job(s_off)}, reps, slices=sl)
        rows.append(time_row("append_none_off", "append, durability=none vs sync=OFF, per msg", res,
                             "SQLite WAL synchronous=OFF (both: no sync)", "", None))
        s_off.close()
        s_norm = self.open(sql, durability="normal")
        res = interleaved({"rune": append_job(s_rune), "sql": append_job(s_norm)}, reps, slices=sl)
        rows.append(time_row("append_none_normal", "append, durability=none vs sync=NORMAL, per msg", res,
                             "SQLite WAL synchronous=NORMAL (sync at checkpoint)", "", None))
        s_norm.close()
        s_rune.close()
        return rows
