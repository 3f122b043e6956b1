"""mypy stays clean over the package.

rune_fast ships ``py.typed``: its annotations are what users' type checkers
see, so they must say what the code does. The check runs mypy (a test
dependency) with the ``[tool.mypy]`` configuration of pyproject.toml, from the
repository root, as a developer would; its cache goes to a temporary folder,
so every run checks from scratch and nothing is left in the tree (about 4 s).
"""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_reports_nothing(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
         "--cache-dir", str(tmp_path / "mypy-cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, (
        f"mypy exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}")
