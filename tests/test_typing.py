"""mypy stays clean over the package, and the stubs of the compiled core say
what it is.

rune_fast ships ``py.typed``: its annotations are what users' type checkers
see, so they must say what the code does. The check runs mypy (a test
dependency) with the ``[tool.mypy]`` configuration of pyproject.toml, from the
repository root, as a developer would; its cache goes to a temporary folder,
so every run checks from scratch and nothing is left in the tree (about 4 s).

The compiled modules (csrc/*.pyx) are typed by hand-written stubs beside
them (rune_fast/_*.pyi), which the first check reads wherever the package
uses them. The second holds the stubs to the built modules with
``mypy.stubtest``: every public name, parameter name, kind and default as
the compiled code has it (Cython's ``binding`` directive makes them
visible), save the Cython artefacts listed in tests/stubtest_allowlist.txt.
"""
from __future__ import annotations

import glob
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


def test_every_compiled_module_has_a_stub():
    names = sorted(os.path.splitext(os.path.basename(p))[0]
                   for p in glob.glob(os.path.join(ROOT, "csrc", "*.pyx")))
    assert names, "no csrc/*.pyx found"
    missing = [n for n in names if not os.path.exists(os.path.join(ROOT, "rune_fast", n + ".pyi"))]
    assert not missing, f"compiled modules without a stub in rune_fast/: {missing}"


def test_stubs_match_the_compiled_modules(tmp_path):
    modules = sorted("rune_fast." + os.path.splitext(os.path.basename(p))[0]
                     for p in glob.glob(os.path.join(ROOT, "csrc", "*.pyx")))
    # stubtest keeps its cache in the working folder (it takes no --cache-dir):
    # it runs in tmp_path, and imports and reads the package of this tree
    env = dict(os.environ, PYTHONPATH=ROOT, MYPYPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", *modules,
         "--mypy-config-file", os.path.join(ROOT, "pyproject.toml"),
         "--allowlist", os.path.join(ROOT, "tests", "stubtest_allowlist.txt")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, (
        f"stubtest exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}")
