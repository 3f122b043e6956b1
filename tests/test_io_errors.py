"""I/O errors below the process: EIO injected into a write, an fsync or a
read by the power-loss shim (tests/powerloss/shim.c, RUNE_PL_FAIL), in a
real writer process. A failed write or sync fails the call that met it
with a DurabilityError naming the file, is reported to every waiter of a
group commit, and leaves the store refusing writes until reopened -- also
when the kernel's next sync would succeed (it is never retried as if
nothing happened); reads of intact data keep working; every acknowledged
message is there after a reopen. A failed read is a RuneError naming the
file (or SOURCE_CORRUPT on an exact read), never a crash, and verify()
names the file."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.records import ConversationMessageRecord

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "powerloss"))
from powerloss_replay import build_shim  # noqa: E402


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    out = build_shim(str(tmp_path_factory.mktemp("shim")))
    if out is None:
        pytest.skip("no C compiler (cc, gcc or clang): the fault injector is built from C")
    return out


def _run(shim: str, state, fail: str, script: str, *args: str, work) -> tuple[int, str, str]:
    env = dict(os.environ, LD_PRELOAD=shim, RUNE_PL_DIR=str(state), RUNE_PL_LOG=str(work / "fs.log"),
               RUNE_PL_FAIL=fail, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(HERE, script), str(state), *args],
                          env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def _writer(shim, tmp_path, fail: str, mode: str = "fsync", n: int = 30, threads: int = 1) -> dict:
    state = tmp_path / "state"
    state.mkdir()
    code, out, err = _run(shim, state, fail, "io_error_writer.py", mode, str(n), str(threads), work=tmp_path)
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["other"] == [], report["other"]
    return report


def _reopened_holds(tmp_path, ids: list[str]) -> None:
    with ConversationStateRepository(tmp_path / "state") as repo:
        assert [m for m in ids if repo.get_message(m).status is not ReadStatus.FOUND_VERIFIED] == []
        assert repo.verify().ok
        repo.append(ConversationMessageRecord(msg_id="reopened", channel_id="c0", content="writes again"))


@pytest.mark.parametrize("fail", ["sync:conversation_tail.jsonl:4", "write:conversation_tail.jsonl:3",
                                  "write:events.jsonl:3"])
def test_a_failed_write_or_sync_stops_writes_and_loses_nothing_acknowledged(shim, tmp_path, fail):
    report = _writer(shim, tmp_path, fail)
    kinds = [e[0] for e in report["events"]]
    first = kinds.index("fail")                 # the fault was met...
    assert "ack" not in kinds[first:]           # ...and nothing is acknowledged after it
    assert first >= 1 and all(k == "fail" for k in kinds[first:])
    failed = report["events"][first]
    assert fail.split(":")[1] in failed[3]      # the error names the file
    assert report["after"].startswith("refused") and "reopen" in report["after"]
    assert report["reads_ok"]                   # reads of what was stored go on
    _reopened_holds(tmp_path, [e[1] for e in report["events"] if e[0] == "ack"])


def test_a_failed_group_commit_is_reported_to_every_waiter(shim, tmp_path):
    report = _writer(shim, tmp_path, "sync:conversation_tail.jsonl:6", mode="batch", n=40, threads=3)
    fails = [e for e in report["events"] if e[0] == "fail"]
    assert fails and {e[2] for e in fails} == {0, 1, 2}     # every thread was told
    assert report["after"].startswith("refused")
    _reopened_holds(tmp_path, [e[1] for e in report["events"] if e[0] == "ack"])


READER = r"""
import json, sys
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.errors import RuneError
out = {"opened": False, "hot": None, "cool": [], "verify": None, "error": None}
try:
    with ConversationStateRepository(sys.argv[1], read_only=True) as repo:
        out["opened"] = True
        out["hot"] = [m.msg_id for m in repo.window("c", 5)]
        for i in range(0, 60, 7):
            try:
                out["cool"].append(repo.get_message(f"m{i:03d}").status.value)
            except RuneError as exc:
                out["cool"].append("error: " + str(exc))
        rep = repo.verify()
        out["verify"] = [str(p) for p in rep.problems]
except RuneError as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def test_a_failed_read_is_named_and_intact_reads_go_on(shim, tmp_path):
    state = tmp_path / "state"
    with ConversationStateRepository(state, hot_window=5, compact_every=10**6) as repo:
        repo.append_many(ConversationMessageRecord(msg_id=f"m{i:03d}", channel_id="c", content=f"line {i}",
                                                   ts=1.0 + i) for i in range(60))
        repo.compact()          # all but the newest 5 archived in Parquet
        hot = [m.msg_id for m in repo.window("c", 5)]
    script = tmp_path / "reader.py"
    script.write_text(READER)
    met = 0
    for n in range(1, 25):
        env_fail = f"read:.parquet:{n}"
        proc = subprocess.run([sys.executable, str(script), str(state)], capture_output=True, text=True,
                              timeout=300, env=dict(os.environ, LD_PRELOAD=shim, RUNE_PL_DIR=str(state),
                                                    RUNE_PL_LOG=str(tmp_path / f"fs{n}.log"),
                                                    RUNE_PL_FAIL=env_fail,
                                                    PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
        assert proc.returncode == 0, (env_fail, proc.stderr[-3000:])
        out = json.loads(proc.stdout)
        if out["error"] is not None:
            assert ".parquet" in out["error"] or "conversation_cool" in out["error"], out["error"]
            met += 1
            continue
        assert out["hot"] == hot                    # intact data reads on
        bad = [s for s in out["cool"] if s != "found_verified"]
        named = [p for p in out["verify"] if ".parquet" in p or "conversation_cool" in p]
        assert all(s == "source_corrupt" or ".parquet" in s or "conversation_cool" in s for s in bad), bad
        if bad or out["verify"]:
            met += 1
            assert named or bad, out
    assert met > 0, "no injected read failure was met"
    with ConversationStateRepository(state, read_only=True) as repo:    # nothing was damaged on disk
        assert repo.verify().ok and len(repo) == 60
