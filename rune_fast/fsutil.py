"""File-system helpers every store shares: private folders made durable in
their parents, and syncs of a folder or a file by path that fail with a
:class:`~rune_fast.errors.DurabilityError` naming it."""
from __future__ import annotations

import errno
import os

from .errors import DurabilityError

__all__ = ["ensure_private_dir", "fsync_dir", "fdatasync_path"]


def ensure_private_dir(path: str | os.PathLike[str]) -> None:
    """Create ``path`` (and missing parents) as owner-only (0700) folders,
    each new entry made durable by an fsync of its parent. Existing folders
    are left as they are."""
    path = target = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        return
    missing = []
    while not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # made concurrently by another writer
            continue
        fsync_dir(os.path.dirname(folder))
    if not os.path.isdir(target):
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", target)


def fsync_dir(path: str) -> None:
    """fsync a folder so a create/rename/unlink in it is durable;
    :class:`DurabilityError` naming the folder on failure."""
    _sync_path(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, "fsync", "fsync of folder")


def fdatasync_path(path: str) -> None:
    """fdatasync the file at ``path`` (opened for reading: Linux syncs its
    pages whatever the descriptor); :class:`DurabilityError` naming it."""
    _sync_path(path, os.O_RDONLY | os.O_CLOEXEC, "fdatasync", "fdatasync of")


def _sync_path(path: str, flags: int, call: str, what: str) -> None:
    fd = os.open(path, flags)
    try:
        getattr(os, call)(fd)      # looked up now: tests that count syncs patch os
    except OSError as exc:
        raise DurabilityError(f"{what} {path} failed: {exc}") from exc
    finally:
        os.close(fd)


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError as exc:  # already closed: nothing left to release
        if exc.errno != errno.EBADF:
            raise
