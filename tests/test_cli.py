"""The rune-fast command, driven through subprocesses (``python -m rune_fast``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "legacy" / "operator.json"
CURRENT = "task_01J9Z3Q8M5K2W7XH0C4V6B1N8R"
SUBCOMMANDS = ("append", "window", "task", "get", "search", "tasks", "compact", "stats", "verify", "export",
               "import", "delete", "bench", "canary")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("COLUMNS", None)
    return env


def run(*args: str, state: Path | None = None, stdin: str | None = None, module: str = "rune_fast",
        timeout: float = 120, cwd: Path = REPO) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", module]
    if state is not None:
        cmd += ["--state", str(state)]
    cmd += list(args)
    return subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True, env=_env(),
                          timeout=timeout, stdin=None if stdin is not None else subprocess.DEVNULL)


def ok(p: subprocess.CompletedProcess, rc: int = 0) -> subprocess.CompletedProcess:
    assert p.returncode == rc, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    return p


def as_json(p: subprocess.CompletedProcess):
    return json.loads(ok(p).stdout)


def lines(*msgs: dict) -> str:
    return "".join(json.dumps(m) + "\n" for m in msgs)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A state directory fed through the command: arguments, stdin, operator.json."""
    state = tmp_path_factory.mktemp("cli") / "state"
    one = as_json(run("--json", "append", "--channel", "general", "--role", "user",
                      "--content", "Deploy the API to staging", "--task", "task_a", state=state))
    assert one["stored"] == 1
    msgs = [{"msg_id": f"msg_s{i:02d}", "channel_id": "general" if i % 2 else "random",
             "role": "user" if i % 3 else "assistant", "content": f"stdin message {i} deploy" if i % 4 == 0
             else f"stdin message {i}", "task_id": "task_b" if i < 5 else ""} for i in range(10)]
    p = ok(run("append", state=state, stdin=lines(*msgs)))
    assert "stored 10 new messages (0 already stored)" in p.stdout
    return {"state": state, "first": one["msg_ids"][0], "msgs": msgs}


# ---------------------------------------------------------------- help


def test_help_on_every_subcommand(capsys):
    top = ok(run("--help")).stdout      # the real entry point, once
    from rune_fast import canary
    from rune_fast.cli import build_parser

    parser = build_parser()
    for name in SUBCOMMANDS:            # each subcommand's --help, in-process (same parser)
        assert name in top
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args([name, "--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: rune-fast {name}"), out
        assert "--state" in out and "--json" in out
    with pytest.raises(SystemExit):
        canary.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m rune_fast.canary")


# ---------------------------------------------------------------- reads


def test_append_duplicates_are_counted(store):
    p = ok(run("append", state=store["state"], stdin=lines(*store["msgs"][:3])))
    assert "stored 0 new messages (3 already stored)" in p.stdout
    p = ok(run("append", "--channel", "general", "--content", "x", "--msg-id", store["first"], state=store["state"]))
    assert p.stdout.strip() == f"already stored {store['first']}"


def test_window_table_and_json(store):
    out = ok(run("window", "--channel", "general", "-n", "3", state=store["state"])).stdout
    assert "stdin message 9" in out and "stdin message 5" in out and "msg_s07" in out
    assert out.splitlines()[0].split()[:2] == ["time", "role"]
    # --state and --json also after the subcommand
    recs = as_json(run("window", "--channel", "general", "-n", "100", "--json", "--state", str(store["state"])))
    assert [r["content"] for r in recs][0] == "Deploy the API to staging"
    assert [r["msg_id"] for r in recs][1:] == ["msg_s01", "msg_s03", "msg_s05", "msg_s07", "msg_s09"]


def test_task_messages(store):
    recs = as_json(run("--json", "task", "task_b", state=store["state"]))
    assert [r["msg_id"] for r in recs] == [f"msg_s{i:02d}" for i in range(5)]
    out = ok(run("task", "task_a", state=store["state"])).stdout
    assert "Deploy the API to staging" in out and "general" in out


def test_get_verdicts(store):
    p = ok(run("get", "msg_s03", state=store["state"]))
    assert "msg_s03: FOUND_VERIFIED" in p.stdout and "stdin message 3" in p.stdout
    p = ok(run("get", "msg_nope", state=store["state"]), rc=1)
    assert "NOT_FOUND_CONFIRMED" in p.stdout


def test_search_options(store):
    hits = as_json(run("--json", "search", "DEPLOY", state=store["state"]))
    assert [h["record"]["msg_id"] for h in hits] == [store["first"], "msg_s00", "msg_s04", "msg_s08"]
    hits = as_json(run("--json", "search", "Deploy", "--case-sensitive", state=store["state"]))
    assert [h["record"]["msg_id"] for h in hits] == [store["first"]]
    hits = as_json(run("--json", "search", "deploy", "--limit", "2", "--channel", "random", state=store["state"]))
    assert [h["record"]["msg_id"] for h in hits] == ["msg_s04", "msg_s08"]
    out = ok(run("search", "deploy", state=store["state"])).stdout
    assert "4 hits" in out and "tier" in out.splitlines()[0]


# ---------------------------------------------------------------- imports


def test_import_operator_json_twice(tmp_path):
    state = tmp_path / "state"
    first = as_json(run("--json", "import", str(FIXTURE), state=state))
    assert first["kind"] == "operator"
    assert (first["tasks_imported"], first["messages_imported"]) == (9, 13)
    assert first["current_task"] == CURRENT and first["current_task_active"]
    p = ok(run("import", str(FIXTURE), state=state))
    assert p.stdout.startswith("imported 0 tasks and 0 messages")
    assert "9 tasks and 13 messages already present" in p.stdout
    tasks = as_json(run("--json", "tasks", "--channel", "ops", state=state))
    assert tasks["active"] == CURRENT
    assert [t["task_id"] for t in tasks["tasks"]][-1] == CURRENT
    out = ok(run("tasks", "--channel", "ops", state=state)).stdout
    assert any(line.startswith("*") and CURRENT in line for line in out.splitlines())
    everything = as_json(run("--json", "tasks", "--channel", "ops", "--all", state=state))
    assert len(everything["tasks"]) == 7


def test_import_legacy_checkpoint_and_jsonl(tmp_path):
    state = tmp_path / "state"
    legacy = [{"role": "user", "content": "hi", "channel_id": "c"},
              {"role": "assistant", "content": "hello", "channel_id": "c"},
              {"role": "user", "content": "hi", "channel_id": "c"},          # same body, a second turn
              {"msg_id": "msg_keep", "role": "user", "content": "kept id", "channel_id": "c"}]
    listed = tmp_path / "conversation_messages.json"
    listed.write_text(json.dumps(legacy))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"messages": legacy}, indent=2))
    assert as_json(run("--json", "import", str(listed), state=state))["messages_imported"] == 4
    again = as_json(run("--json", "import", str(wrapped), state=state))
    assert (again["kind"], again["messages_imported"], again["messages_already_present"]) == ("checkpoint", 0, 4)
    jl = tmp_path / "more.jsonl"
    jl.write_text(lines({"role": "user", "content": "no channel"}, {"role": "tool", "content": "r",
                                                                     "channel_id": "d", "tool_call_id": "t1"}))
    p = ok(run("import", str(jl), "--channel", "fallback", state=state))
    assert "imported 2 messages" in p.stdout and "(jsonl;" in p.stdout
    p = ok(run("import", str(jl), "--channel", "fallback", state=state))
    assert "imported 0 messages" in p.stdout
    recs = as_json(run("--json", "window", "--channel", "fallback", state=state))
    assert [r["content"] for r in recs] == ["no channel"]
    p = ok(run("import", "-", state=state, stdin=lines({"role": "user", "content": "piped", "channel_id": "p"})))
    assert "imported 1 messages" in p.stdout


def test_export_jsonl_and_parquet_round_trip(store, tmp_path):
    out = ok(run("export", state=store["state"])).stdout
    exported = [json.loads(line) for line in out.splitlines()]
    assert len(exported) == 11
    parquet = tmp_path / "all.parquet"
    d = as_json(run("--json", "export", "--format", "parquet", "--out", str(parquet), state=store["state"]))
    assert d["exported"] == 11
    import pyarrow.parquet as pq

    table = pq.read_table(parquet)
    assert table.num_rows == 11 and "content" in table.column_names
    fresh = tmp_path / "fresh"
    assert as_json(run("--json", "import", str(parquet), state=fresh))["messages_imported"] == 11
    jl = tmp_path / "all.jsonl"
    ok(run("export", "--out", str(jl), state=fresh))
    assert sorted(jl.read_text().splitlines()) == sorted(out.splitlines())
    chan = ok(run("export", "--channel", "random", state=store["state"])).stdout.splitlines()
    assert len(chan) == 5
    ok(run("export", "--format", "parquet", state=store["state"]), rc=2)   # needs --out


def test_parquet_export_is_written_a_row_group_at_a_time(store, tmp_path, monkeypatch, capsys):
    """export --format parquet holds one row group's values at a time (it
    held every value of the store: ~2 GB at 1,000,000 messages): the file
    has several groups when the export is larger than one, the same rows
    in the same order as the JSON lines, and an empty store exports an
    empty file with the schema."""
    import pyarrow.parquet as pq

    from rune_fast.cli import main, write
    monkeypatch.setattr(write, "EXPORT_GROUP_ROWS", 4)
    parquet = tmp_path / "groups.parquet"
    assert main(["--state", str(store["state"]), "export", "--format", "parquet", "--out", str(parquet)]) == 0
    jl = [json.loads(line) for line in ok(run("export", state=store["state"])).stdout.splitlines()]
    f = pq.ParquetFile(parquet)
    assert f.metadata.num_row_groups == 3 and f.metadata.num_rows == 11
    assert f.read().column("msg_id").to_pylist() == [d["msg_id"] for d in jl]
    empty = tmp_path / "empty.parquet"
    from rune_fast import ConversationStateRepository
    ConversationStateRepository(tmp_path / "nothing").close()
    assert main(["--state", str(tmp_path / "nothing"), "export", "--format", "parquet", "--out", str(empty)]) == 0
    assert pq.read_table(empty).num_rows == 0 and "content" in pq.read_table(empty).column_names
    capsys.readouterr()


# ---------------------------------------------------------------- maintenance


def test_compact_stats_delete(tmp_path):
    state = tmp_path / "state"
    msgs = [{"msg_id": f"msg_c{i:03d}", "channel_id": "c", "role": "user", "content": f"compact me {i}"}
            for i in range(40)]
    ok(run("append", state=state, stdin=lines(*msgs)))
    report = as_json(run("--json", "compact", "--hot-window", "10", state=state))
    assert isinstance(report, dict) and report
    assert as_json(run("--json", "get", "msg_c000", state=state))["tier"] == "cool"
    p = ok(run("delete", "msg_c001", "msg_nope", state=state), rc=1)
    assert "deleted msg_c001" in p.stdout and "not found msg_nope" in p.stdout
    assert ok(run("compact", state=state)).stdout.strip()       # the table form
    stats = as_json(run("--json", "stats", state=state))
    assert set(stats) == {"conversation", "tasks"}
    assert stats["conversation"]["messages"] == 39
    out = ok(run("stats", state=state)).stdout
    assert out.startswith("conversation") and "\ntasks\n" in out


def test_verify_ok_then_damaged(tmp_path):
    state = tmp_path / "state"
    msgs = [{"msg_id": f"msg_v{i}", "channel_id": "v", "role": "user", "content": f"line {i}"} for i in range(5)]
    msgs.insert(3, {"msg_id": "msg_victim", "channel_id": "v", "role": "user", "content": "flip-me-please"})
    ok(run("append", state=state, stdin=lines(*msgs)))
    p = ok(run("verify", state=state))
    assert p.stdout.startswith("OK")
    assert as_json(run("--json", "verify", state=state))["ok"] is True

    tail = state / "hot" / "conversation_tail.jsonl"
    data = bytearray(tail.read_bytes())
    pos = data.index(b"flip-me-please")
    line_start = data.rfind(b"\n", 0, pos) + 1
    data[pos + 3] ^= 0x01
    tail.write_bytes(bytes(data))

    p = ok(run("verify", state=state), rc=1)
    assert "DAMAGE" in p.stdout
    assert "SOURCE_CORRUPT" not in p.stderr, p.stderr     # the store's error log lines are not repeated
    named = [line for line in p.stdout.splitlines() if "conversation_tail.jsonl" in line]
    assert named and any(str(line_start) in line.split() for line in named), p.stdout
    j = run("--json", "verify", state=state)
    assert j.returncode == 1
    problems = json.loads(j.stdout)["problems"]
    assert any(pr["file"].endswith("conversation_tail.jsonl") and pr["offset"] == line_start for pr in problems)
    g = run("get", "msg_victim", state=state)
    assert g.returncode == 2 and "Traceback" not in g.stderr
    assert "FOUND_VERIFIED" not in g.stdout

    events = state / "events.jsonl"
    data = bytearray(events.read_bytes())
    second = data.index(b"\n") + 1                      # damage the second envelope
    data[second + 40] ^= 0x01
    events.write_bytes(bytes(data))
    j = run("--json", "verify", state=state)
    assert j.returncode == 1
    problems = json.loads(j.stdout)["problems"]
    assert any(pr["file"].endswith("events.jsonl") and pr["offset"] == second for pr in problems), problems


def test_expected_failures_are_one_line(tmp_path):
    missing = tmp_path / "missing"
    p = ok(run("window", "--channel", "x", state=missing), rc=2)
    assert p.stderr.startswith("rune-fast: ") and len(p.stderr.strip().splitlines()) == 1
    p = ok(run("append", state=tmp_path / "s", stdin='{"role": "user", "content": "a", "channel_id": "c"}\nnot json\n'),
           rc=2)
    assert "stdin line 2" in p.stderr
    p = ok(run("append", state=tmp_path / "s", stdin=lines({"role": "bot", "content": "a", "channel_id": "c"})), rc=2)
    assert "role" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    junk = tmp_path / "junk.txt"
    junk.write_text("this is not json\n")
    p = ok(run("import", str(junk), state=tmp_path / "s"), rc=2)
    assert "junk.txt" in p.stderr
    bad_op = tmp_path / "operator.json"
    bad_op.write_text(json.dumps({"tasks": [{"title": "no id"}]}))
    p = ok(run("import", str(bad_op), state=tmp_path / "s"), rc=2)
    assert "task id" in p.stderr


# ---------------------------------------------------------------- bench, demo


def test_bench_subcommand(tmp_path):
    # The comparison ships inside the package: it runs from a folder that is
    # not the checkout (nothing named bench/ there).
    out = tmp_path / "bench.json"
    p = ok(run("bench", "--smoke", "--out", str(out), timeout=300, cwd=tmp_path))
    assert "sqlite" in p.stdout.splitlines()[0]
    assert json.loads(out.read_text())["rows"]


def test_demo_small(tmp_path):
    state = tmp_path / "rune-state"
    p = ok(run("--state", str(state), "--history", "30", "--tasks", "6", "--no-bench", module="rune_fast.demo"))
    assert (state / ".rune-demo").exists()
    assert "its bytes are gone from every file" in p.stdout
    assert "OK: no damage" in p.stdout
    # a directory the demo did not make is left alone: the demo works beside it
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    ok(run("--state", str(foreign), "--history", "10", "--tasks", "2", "--no-bench", module="rune_fast.demo"))
    assert (foreign / "keep.txt").read_text() == "mine"
    assert [d.name for d in foreign.iterdir() if d.name.startswith("demo-")]


def test_demo_wipes_only_its_own_directory(tmp_path):
    from rune_fast.demo import MARKER, prepare_state_dir

    base = tmp_path / "rune-state"
    first = prepare_state_dir(str(base))
    assert first == str(base) and (base / MARKER).exists()
    (base / "old.txt").write_text("from the last demo")
    assert prepare_state_dir(str(base)) == str(base)
    assert not (base / "old.txt").exists()            # the demo's own directory: wiped
    (base / MARKER).write_text("someone else's")       # not the demo's marker text
    other = prepare_state_dir(str(base))
    assert other != str(base) and os.path.dirname(other) == str(base)


def test_canary_and_demo_do_not_import_the_command():
    # No import cycle: the canary, the demo, the formatting module and the
    # state check use the public API, never the command's modules (imports
    # inside functions count too).
    import ast

    for name in ("canary.py", "demo.py", "_fmt.py", "verify.py"):
        path = REPO / "rune_fast" / name
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = "." * node.level + (node.module or "")
                names = [target + "." + a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for full in names:
                assert not (full.startswith((".cli", "rune_fast.cli")) or full in ("..cli", ".cli")), \
                    f"{path}:{node.lineno} imports {full}"


def test_progress_bar_only_on_a_terminal():
    import io

    from rune_fast.cli import Progress

    quiet = io.StringIO()                        # not a TTY: nothing drawn
    with Progress("import", 10, stream=quiet) as bar:
        bar.update(5, force=True)
    assert quiet.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    with Progress("import", 10, stream=tty) as bar:
        bar.update(5, "half", force=True)
        assert "[############------------]  50% 5/10  half" in tty.getvalue()
    assert tty.getvalue().endswith("\r")        # the line is cleared at the end


def test_task_ledger_view_matches_the_repository(tmp_path):
    from rune_fast.cli import TaskLedgerView
    from rune_fast.tasks import TaskStateRepository

    state = tmp_path / "state"
    with TaskStateRepository(state, checkpoint_every=7) as repo:   # some changes checkpointed, some in the log
        made = {}
        for i in range(12):
            ch = f"c{i % 3}"
            t = repo.create(f"task {i}", ch, parent_task_id=made.get(ch))
            made[ch] = t.task_id
            if i % 5 == 0:
                repo.amend(t.task_id, f"task {i} amended")
            if i % 4 == 1:
                repo.transition(t.task_id, "running")
            if i % 4 == 2:
                repo.transition(t.task_id, "cancelled")
        first = repo.list_open("c0")[0]
        repo.amend(first.task_id, "the oldest open task, amended last")
        view = TaskLedgerView(str(state))                         # beside the open writer
        for ch in ("c0", "c1", "c2", "none"):
            assert view.list_open(ch) == repo.list_open(ch)
            assert view.get_active(ch) == repo.get_active(ch)
            assert view.latest(ch) == repo.latest(ch)
            assert view.list_tasks(ch) == repo.list_tasks(ch)
        assert view.get_active("c0").task_id == first.task_id
