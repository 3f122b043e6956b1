"""The ``rune-fast`` command: inspect, feed, check and repair a state directory.

Every subcommand takes ``--state DIR`` (default ``./rune-state``) and
``--json`` (one JSON document on stdout, for scripts; tables otherwise).
Exit status: 0 success; 1 a negative answer (``get``: not found, ``verify``:
damage found, ``canary``: a promise failed); 2 an error (one line on stderr,
never a traceback for an expected failure) -- also ``get`` of a corrupt record.

The reading subcommands (``window``, ``task``, ``get``, ``search``, ``stats``,
``verify``, ``export``) open the conversation store with ``read_only=True``:
they work beside a running writer and change no file; ``verify`` reads the
task ledger's files read-only too. ``tasks`` and ``stats`` open the task
ledger itself (it has no read-only mode) when it is free, and beside a running
frontend read a snapshot of its files instead (:class:`TaskLedgerView`).

One module per group of subcommands: :mod:`.read`, :mod:`.write` (with
import and export), :mod:`.share` (publish, sync), :mod:`.tools` (bench,
canary); :mod:`._common` holds the state directory and the stores opened on
it.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from typing import Any, Callable, Sequence

from .._fmt import Progress, format_table
from ..errors import RuneError
from ..verify import DuringVerifyFilter
from . import read, share, tools, write
from ._common import DEFAULT_STATE, InputError, TaskLedgerView
from .write import detect_import_kind

__all__ = ["main", "build_parser", "Progress", "format_table", "detect_import_kind", "InputError",
           "TaskLedgerView"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rune_fast")
    except PackageNotFoundError:
        return "(source checkout, not installed)"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state", metavar="DIR", default=argparse.SUPPRESS,
                        help=f"the state directory (default {DEFAULT_STATE})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print one JSON document instead of tables (for scripts)")

    p = argparse.ArgumentParser(
        prog="rune-fast",
        description="Inspect, feed, check and repair a rune_fast state directory.",
        epilog="exit status: 0 ok; 1 negative answer (not found, damage found, canary failure); 2 error",
    )
    p.add_argument("--version", action="version", version=f"rune-fast {_version()}")
    p.add_argument("--state", metavar="DIR", default=DEFAULT_STATE,
                   help=f"the state directory (default {DEFAULT_STATE})")
    p.add_argument("--json", action="store_true", default=False,
                   help="print one JSON document instead of tables (for scripts)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], int], help: str,
            description: str | None = None) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, parents=[common], help=help, description=description or help)
        sp.set_defaults(func=func)
        return sp

    write.register(add)
    read.register(add)
    share.register(add)
    tools.register(add)
    return p


def _warning_line(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    print(f"rune-fast: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Recovery notes arrive both as a warning and a log record: show the
    # warning (one line), and of the log only errors (e.g. a failed exact read)
    # -- not those a verify reports anyway. Both are undone on return.
    shown = warnings.showwarning
    warnings.showwarning = _warning_line
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter("rune-fast: %(message)s"))
    handler.addFilter(DuringVerifyFilter())
    store_log = logging.getLogger("rune_fast")
    store_log.addHandler(handler)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("rune-fast: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): not an error; silence the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (RuneError, OSError, ValueError) as exc:
        print(f"rune-fast: {_one_line(exc)}", file=sys.stderr)
        return 2
    finally:
        store_log.removeHandler(handler)
        warnings.showwarning = shown


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
        text = f"{text}: {exc.filename}"
    if not isinstance(exc, RuneError):
        text = f"{type(exc).__name__}: {text}"
    return " ".join(text.split())
