"""A writer child killed with SIGKILL once it has acknowledged enough:
the harness the framework integrations' durability tests share."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kill_after_acks(child: str, arg: str, at_least: int = 40) -> int:
    """Run ``python -c child arg`` (from the checkout), which prints the
    number of each acknowledged write on its own line; SIGKILL it once it
    printed ``at_least``; return the last number it printed."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    acked = -1
    with subprocess.Popen([sys.executable, "-c", child, arg], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                acked = int(line)
                if acked >= at_least:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            _out, err = proc.communicate()
    assert acked >= at_least, err
    return acked
