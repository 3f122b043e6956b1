"""One exception tree for rune_fast, rooted at :class:`RuneError`.

Every raise names what failed: the file and byte offset for damage on disk, the
id for an unknown record, the field for a bad argument.
"""
from __future__ import annotations

import os

__all__ = [
    "RuneError",
    "CorruptStateCheckpointError",
    "IllegalTaskTransitionError",
    "StateLockedError",
    "ReadOnlyStoreError",
    "StoreClosedError",
    "DurabilityError",
    "RecordTooLargeError",
    "UnknownTaskError",
    "FramingError",
    "RecoveryWarning",
]


class RuneError(Exception):
    """Root of every error rune_fast raises on purpose."""


class CorruptStateCheckpointError(RuneError):
    """Bytes on disk fail their checksum, digest or format check.

    ``path`` names the file and ``offset`` the byte (or row) where the damage
    starts, when they are known.
    """

    def __init__(self, message: str, *, path: str | os.PathLike | None = None,
                 offset: int | None = None) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.offset = offset
        where = []
        if self.path is not None:
            where.append(f"file {self.path}")
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)


class IllegalTaskTransitionError(RuneError, ValueError):
    """A task status change that ``TASK_TRANSITIONS`` does not allow."""


class StateLockedError(RuneError):
    """Another writer of the same kind holds the state directory's lock."""


class ReadOnlyStoreError(RuneError):
    """A write call on a repository opened with ``read_only=True``."""


class StoreClosedError(RuneError):
    """A call on a repository (or log) after ``close()``."""


class DurabilityError(RuneError):
    """A sync to stable storage failed; the store refuses writes until reopened."""


class RecordTooLargeError(RuneError, ValueError):
    """A record whose encoded size exceeds the documented limit."""


class UnknownTaskError(RuneError, KeyError):
    """``amend``/``transition`` named a task id the ledger does not hold."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the sentence readable
        return str(self.args[0]) if self.args else ""


class FramingError(RuneError, ValueError):
    """Bad input at the log layer: a line too long for the framing, an id with a
    newline, a field that cannot be framed."""


class RecoveryWarning(UserWarning):
    """Recovery kept the bytes of a torn final line in a quarantine file."""
