"""The canary runs in a fresh directory and every promise passes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(*args: str, module: str = "rune_fast", timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def ok(p: subprocess.CompletedProcess, rc: int = 0) -> subprocess.CompletedProcess:
    assert p.returncode == rc, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_canary_passes_every_promise():
    p = ok(run("--json", "canary"))
    report = json.loads(p.stdout)
    failed = [f"{r['promise']}: {r['detail']}" for r in report["results"] if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert report["passed"] >= 25
    names = " ".join(r["promise"] for r in report["results"])
    for promise in ("crash", "torn", "flipped byte", "read_only", "merge_ops", "delete", "compact"):
        assert promise in names


def test_canary_module_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "something").write_text("x")
    p = run("--state", str(tmp_path), module="rune_fast.canary")
    assert p.returncode == 2 and "not empty" in p.stderr
