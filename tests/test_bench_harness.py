"""The benchmark harness (rune_fast.bench) runs end to end at tiny scale.

These tests check that every line of the comparison table is produced and
that its ratios are finite numbers; they never assert on wall time. The
rune_fast side is a dict-backed fake here (its numbers mean nothing), and the
real ``ConversationStateRepository`` when it is importable.
"""
from __future__ import annotations

import json
import math
import os
from types import SimpleNamespace
from typing import Any

import pytest

from rune_fast.bench import compare, workload
from rune_fast.bench.sqlite_store import SQLiteStore


def as_dict(d: dict[str, Any]) -> dict[str, Any]:
    """Message factory that keeps the plain dict (for the fake store)."""
    return d


class FakeRepository:
    """A dict-backed stand-in honouring the repository API the harness calls.

    Messages are plain dicts (:func:`as_dict`), kept in memory and in
    one JSON-lines file (synced per append with ``durability="fsync"``) so the
    harness can reopen it, also from a subprocess.
    """

    def __init__(self, state_dir: str, *, compact_every: int = 64, hot_window: int = 512,
                 durability: str = "fsync", read_only: bool = False) -> None:
        if durability not in ("fsync", "batch", "none"):
            raise ValueError(durability)
        os.makedirs(state_dir, exist_ok=True)
        self.durability = durability
        self.path = os.path.join(state_dir, "fake.jsonl")
        self.by_id: dict[str, dict] = {}
        self.order: list[str] = []
        self.by_channel: dict[str, list[dict]] = {}
        self.by_task: dict[str, list[dict]] = {}
        if os.path.exists(self.path):
            with open(self.path, "rb") as f:
                for line in f:
                    if line.endswith(b"\n"):
                        self._index(json.loads(line))
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _index(self, d: dict) -> bool:
        if d["msg_id"] in self.by_id:
            return False
        self.by_id[d["msg_id"]] = d
        self.order.append(d["msg_id"])
        self.by_channel.setdefault(d["channel_id"], []).append(d)
        self.by_task.setdefault(d["task_id"], []).append(d)
        return True

    def _write(self, msgs: list[dict]) -> None:
        os.write(self.fd, b"".join(workload.json_line(m) for m in msgs))
        if self.durability != "none":
            os.fdatasync(self.fd)

    def append(self, msg: dict) -> bool:
        return self.append_many([msg]) == 1

    def append_many(self, msgs: list[dict]) -> int:
        new = [m for m in msgs if self._index(workload.to_plain_dict(m))]
        if new:
            self._write(new)
        return len(new)

    def _all(self) -> list[dict]:
        return [self.by_id[i] for i in self.order]

    def window(self, channel_id: str, n: int = 8) -> list[dict]:
        if n <= 0:
            return []
        return self.by_channel.get(channel_id, [])[-n:]

    def get_message(self, msg_id: str) -> Any:
        rec = self.by_id.get(msg_id)
        return SimpleNamespace(status="FOUND_VERIFIED" if rec else "NOT_FOUND_CONFIRMED",
                               record=rec, tier="hot" if rec else None)

    def messages_for_task(self, task_id: str) -> list[dict]:
        return list(self.by_task.get(task_id, []))

    def search(self, text: str, channel_id: str | None = None, *, limit: int | None = None,
               case_sensitive: bool = False) -> list[Any]:
        fold = (lambda s: s) if case_sensitive else str.casefold
        needle = fold(text)
        hits = [SimpleNamespace(record=m, tier="hot") for m in self._all()
                if needle in fold(m["content"]) and (channel_id is None or m["channel_id"] == channel_id)]
        if limit is None:
            return hits
        return hits[-limit:] if limit > 0 else []

    def compact(self) -> dict:
        return {}

    def stats(self) -> dict:
        return {"messages": len(self.by_id)}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _check_report(report: compare.Report) -> None:
    from rune_fast.bench.report import operation_of

    keys = list(dict.fromkeys(operation_of(r.key) for r in report.rows))
    assert keys == list(compare.OPERATIONS)
    # on a file system that counts no block writes (tmpfs) the write lines say so
    unmeasured = any(n.startswith("UNMEASURED") for n in report.notes)
    for row in report.rows:
        assert row.rune is not None, row.key
        if row.key == "record_new":                      # no SQLite side: the plain loop only
            assert row.other is None and row.base is not None and row.base_ratio is not None
            continue
        assert row.other is not None, row.key
        if unmeasured and row.key.startswith("write_amp"):
            assert row.ratio is None and row.met is None, row.key
            continue
        if row.unit == "B/msg" and 0 in (row.rune, row.other):  # memory growth of a tiny store
            continue
        assert row.ratio is not None and math.isfinite(row.ratio), row.key
        assert row.ratio >= 0, row.key
        if row.base is not None:
            assert row.base_ratio is not None and math.isfinite(row.base_ratio), row.key
    table = compare.format_table(report)
    for row in report.rows:
        assert row.operation in table
    assert compare.format_markdown(report).count("\n") == len(report.rows) + 1
    json.dumps(report.to_json())
    assert not [n for n in report.notes if n.startswith(("SANITY", "WRONG"))], report.notes
    # every needle class is searched, with and without a limit, and its answer checked
    for nd in workload.NEEDLES:
        assert report.row(f"search_{nd.cls}").base is not None
        assert report.row(f"search_{nd.cls}_limit").rune is not None
        assert any(n.startswith(f"search {nd.query!r}") for n in report.notes), nd.query


def test_every_line_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(compare.DESCRIPTIONS) == set(compare.OPERATIONS)
    assert compare.main(["--explain"]) == 0
    out = capsys.readouterr().out
    assert all(key in out for key in compare.OPERATIONS)


def test_workload_is_deterministic_and_realistic() -> None:
    a = workload.generate(300, seed=7)
    b = workload.generate(300, seed=7)
    assert a.messages == b.messages
    assert workload.generate(300, seed=8).messages != a.messages
    roles = {m["role"] for m in a.messages}
    assert roles >= {"user", "assistant", "tool"}
    assert all(m["msg_id"].startswith("msg_") and len(m["msg_id"]) == 30 for m in a.messages)
    assert len({m["msg_id"] for m in a.messages}) == 300
    tools = [m for m in a.messages if m["role"] == "tool"]
    assert tools and all(m["tool_call_id"].startswith("call_") for m in tools)
    calls = [c for m in a.messages for c in m["tool_calls"]]
    assert calls and all(isinstance(json.loads(c["arguments"]), dict) for c in calls)
    fresh = a.fresh(20, seed=1)
    assert not {m["msg_id"] for m in fresh} & {m["msg_id"] for m in a.messages}


def test_workload_has_the_volume_shape() -> None:
    # issue 33: 100 channels, 1,000 tasks spread over the archive, ~450 content
    # bytes, >= 30% non-ASCII text in several scripts, needles of every class
    w = workload.generate(20_000, seed=0)
    assert len(w.channel_ids) == 100 and len(w.task_ids) == 1_000
    assert 350 <= workload.content_bytes(w.messages) / len(w) <= 550
    assert workload.non_ascii_share(w.messages) >= 0.30
    text = "".join(m["content"] for m in w.messages[:5_000])
    for probe in ("ß", "é", "ñ", "ı", "İ", "ς", "Σ", "ж", "東", "数", "🚀"):
        assert probe in text, probe
    sizes = w.task_sizes()
    pos = {m["msg_id"]: i for i, m in enumerate(w.messages)}
    biggest = max(sizes, key=sizes.__getitem__)
    idx = [pos[m["msg_id"]] for m in w.messages if m["task_id"] == biggest]
    assert idx[-1] - idx[0] > len(w) // 10                          # spread over the archive
    truth = workload.needle_truth(w.messages, [nd.query for nd in workload.NEEDLES])
    for nd in workload.NEEDLES:
        share = truth[nd.query].count / len(w)
        assert 0.5 * nd.share <= share <= 1.6 * nd.share + 0.001, (nd.cls, share)
    # the expansion needle is found through its 'ß' spelling only by a Unicode fold
    assert any("Goethestraße" in m["content"] for m in w.messages)
    # generate() and iter_batches() give the same messages
    _c, _t, batches = workload.iter_batches(20_000, 1_000, seed=0)
    assert [m for b in batches for m in b] == w.messages


def test_sqlite_store_round_trip(tmp_path) -> None:
    w = workload.generate(100, seed=3)
    s = SQLiteStore(tmp_path, durability="fsync")
    assert s.append(w.messages[0]) is True
    assert s.append(w.messages[0]) is False
    assert s.append_many(w.messages) == 99
    ch = w.messages[-1]["channel_id"]
    want = [m for m in w.messages if m["channel_id"] == ch][-8:]
    got = s.window(ch, 8)
    assert [m["msg_id"] for m in got] == [m["msg_id"] for m in want]
    assert got[-1]["tool_calls"] == list(want[-1]["tool_calls"])
    assert s.get_message(w.messages[5]["msg_id"])["content"] == w.messages[5]["content"]
    assert s.get_message("msg_nope") is None
    base = dict(w.messages[0], channel_id="fold", task_id="")
    s.append_many([dict(base, msg_id=f"msg_fold{i}", content=c)
                   for i, c in enumerate(("QUARTERLY report", "ÜBERWEISUNG", "überweisung"))])
    assert len(s.search_ci("quarterly REPORT", channel_id="fold")) == 1
    # SQLite's lower() folds ASCII only: the upper-case umlaut is missed.
    assert [m["content"] for m in s.search_ci("überweisung", channel_id="fold")] == ["überweisung"]
    assert len(s.search_ci("", channel_id="fold", limit=2)) == 2
    task = w.messages[10]["task_id"]
    assert [m["msg_id"] for m in s.messages_for_task(task)] == \
        [m["msg_id"] for m in w.messages if m["task_id"] == task]
    s.close()
    with pytest.raises(ValueError):
        SQLiteStore(tmp_path, durability="sometimes")


def test_harness_runs_with_fake_store(tmp_path) -> None:
    cfg = compare.Config.tiny(workdir=str(tmp_path))
    report = compare.run_comparison(cfg, rune_store=FakeRepository, message_factory=as_dict, log=None)
    _check_report(report)
    assert report.rune_store.endswith("FakeRepository")


def test_python_m_rune_fast_bench_runs_from_any_folder(tmp_path, monkeypatch, capsys) -> None:
    # The comparison with the real repository ships inside the package:
    # `python -m rune_fast.bench --smoke` from a folder that is not the
    # checkout (run in-process through runpy, as -m runs it; its probe
    # subprocesses find this same rune_fast).
    import runpy
    import sys

    work = tmp_path / "elsewhere"
    work.mkdir()
    out = tmp_path / "report.json"
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "argv", ["python -m rune_fast.bench", "--smoke", "--dir", str(tmp_path),
                                      "--json", str(out)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("rune_fast.bench", run_name="__main__", alter_sys=True)
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    j = json.loads(out.read_text())
    report = compare.Report(config=j["config"], machine=j["machine"], rows=[compare.Row(**r) for r in j["rows"]],
                            notes=j["notes"], rune_store=j["rune_store"])
    _check_report(report)
    assert report.rune_store == compare.RUNE_REF
    assert compare.format_table(report) in printed
    assert os.listdir(work) == []                                       # nothing left in the caller's folder


def test_even_turns_gives_every_job_the_same_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit=20 growth line's samples (searches.even_turns): no timed call
    right after the per-repeat collection (it leaves the caches cold), and
    between a job's timed call and its own call before it, one call of each
    other job -- for any number of repeats (interleaved's turns gave the
    first job the cold turn in 2 of 3 repeats)."""
    from rune_fast.bench import searches

    log: list[tuple[str, int]] = []
    monkeypatch.setattr(searches.gc, "collect", lambda *a: log.append(("collect", 0)) or 0)

    def job(name: str) -> Any:
        def run(i: int) -> float:
            log.append((name, i))
            return float(len(log))
        return run

    names = ["rune", "sql", "rune_s", "sql_s"]
    for repeats in (1, 3, 5, 8):
        log.clear()
        out = searches.even_turns({n: job(n) for n in names}, repeats)
        assert {n: len(v) for n, v in out.items()} == {n: repeats for n in names}
        for at, (name, i) in enumerate(log):
            if name == "collect":
                assert log[at + 1][1] == -1          # an untimed call first
            elif i >= 0:
                before = max(k for k in range(at) if log[k][0] == name)
                between = sorted(n for n, _i in log[before + 1:at])
                assert between == sorted(set(names) - {name})
        firsts = [log[at + 1 + len(names)][0] for at, (n, _i) in enumerate(log) if n == "collect"]
        assert len(set(firsts)) == min(repeats, len(names))     # the first timed turn rotates


def test_whole_calls_script_runs_on_a_small_store(tmp_path, capsys) -> None:
    """bench/whole_calls.py (docs/BENCHMARKS.md's whole-store table) at a
    size the test suite can afford: every line it reports is there."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "whole_calls.py")
    spec = importlib.util.spec_from_file_location("whole_calls", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(tmp_path / "w"), "--n", "3000", "--tasks", "50"]) == 0
    out = capsys.readouterr().out
    for what in ("export_ops(), 3,000 ops", "first resume_messages", "first window", "a push's changes after "
                 "10 appends: 10 ops", "verify() of the writer", "ok=True", "integrity_check: ",
                 "clear_channel", "SQLite DELETE", "task create at 40-50 tasks"):
        assert what in out, (what, out)
