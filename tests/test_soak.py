"""The soak's CI form: tests/soak.py for 30 seconds (four appending
threads, two readers, compactions, a viewer process refreshing and a
`rune-fast verify` loop beside the writer): nothing acknowledged lost, no
deleted message found again, no deadlock, no unexpected exception, no
damage reported while the writer runs, resident memory flat over the
second half, and a clean verify() after a reopen. The documented
ten-minute run is docs/SOAK.md; RUNE_SOAK_SECONDS=60 (or 600) runs this test
longer."""
from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


SECONDS = os.environ.get("RUNE_SOAK_SECONDS", "30")


def test_half_a_minute_of_concurrent_load_loses_nothing(tmp_path):
    root = os.path.dirname(HERE)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, os.path.join(HERE, "soak.py"), "--seconds", SECONDS,
                          "--state", str(tmp_path / "state")],
                         capture_output=True, text=True, timeout=900, env=env, cwd=root)
    try:
        report = json.loads(out.stdout)
    except ValueError:
        raise AssertionError(f"no report (exit {out.returncode}): {out.stderr[-4000:]}") from None
    print(json.dumps({k: report[k] for k in ("appended", "deleted", "reads", "rss_mib")}))
    assert report["not_held"] == [] and out.returncode == 0, (report["not_held"], out.stderr[-4000:])
    assert report["appended"] > 0 and report["reads"] > 0 and report["verify_loop"]["runs"] > 0
