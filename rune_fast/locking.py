"""One writer per kind per state directory.

``DirLock(state_dir, kind)`` takes an exclusive, non-blocking ``flock`` on
``state_dir/.lock-<kind>``. The kernel drops it when the holding process dies,
so a crashed writer never leaves a stale lock behind.
"""
from __future__ import annotations

import fcntl
import os
import re
import threading
import weakref

from ._names import lock_name
from .errors import StateLockedError
from .events import ensure_private_dir

__all__ = ["DirLock", "LOCK_KINDS_RE"]

LOCK_KINDS_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")

# Process-wide registry of held locks, keyed by (realpath of state_dir, kind).
# It must be module state: flock on a second descriptor of the same file in the
# same process would succeed, so only a registry shared by every DirLock in the
# process can refuse a second holder there. Weak values: a DirLock dropped
# without release() (its owner garbage collected, as when a process dies) frees
# its slot and, in __del__, its flock. Emptied in a forked child (the child does
# not own its parent's writers).
_HELD: "weakref.WeakValueDictionary[tuple[str, str], DirLock]" = weakref.WeakValueDictionary()
_HELD_LOCK = threading.Lock()


def _forget_after_fork() -> None:
    # The child shares its parent's lock descriptions; close its copies so a
    # long-lived child never keeps the parent's lock alive after the parent
    # releases it (the parent's own descriptors still hold the flock).
    global _HELD_LOCK
    _HELD_LOCK = threading.Lock()
    for lock in list(_HELD.values()):
        fd, lock._fd = lock._fd, -1
        if fd >= 0:
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class DirLock:
    """Exclusive lock of ``kind`` (e.g. ``"task"``, ``"conversation"``) on
    ``state_dir``, taken when constructed.

    Creates ``state_dir`` (0700) and the lock file (0600) if missing. If any
    holder -- another process, or another DirLock in this process -- has the
    same kind on the same directory, raises :class:`StateLockedError` naming
    the directory, the kind and the holder's pid when known. ``kind`` must
    match ``[a-z][a-z0-9_]*`` (``ValueError`` otherwise). :meth:`release`
    (idempotent) or the end of the process frees it; usable as a context
    manager.
    """

    def __init__(self, state_dir: str | os.PathLike[str], kind: str) -> None:
        if not isinstance(kind, str) or not LOCK_KINDS_RE.fullmatch(kind):
            raise ValueError(f"DirLock kind must match [a-z][a-z0-9_]* (at most 32 chars), got {kind!r}")
        self.kind = kind
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        ensure_private_dir(self.state_dir)
        self._key = (os.path.realpath(self.state_dir), kind)
        self.path = os.path.join(self.state_dir, lock_name(kind))
        self._fd = -1
        with _HELD_LOCK:
            if _HELD.get(self._key) is not None:
                raise StateLockedError(
                    f"state dir {self.state_dir} is already locked for {kind!r} writers "
                    f"by this process (pid {os.getpid()})")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f" by pid {holder}" if holder else ""
                raise StateLockedError(
                    f"state dir {self.state_dir} is locked for {kind!r} writers{who} "
                    f"(lock file {self.path})") from None
            except BaseException:
                os.close(fd)
                raise
            # Record the holder for the error message of the next contender.
            # (the common case, a pid of the same length, writes in place: a
            # truncate to zero costs the file system a block free and reallocation)
            pid = f"{os.getpid()}\n".encode("ascii")
            os.pwrite(fd, pid, 0)
            if os.fstat(fd).st_size != len(pid):
                os.ftruncate(fd, len(pid))
            self._fd = fd
            _HELD[self._key] = self

    @property
    def held(self) -> bool:
        """True until :meth:`release`."""
        return self._fd >= 0

    def release(self) -> None:
        """Release the lock (idempotent)."""
        with _HELD_LOCK:
            if self._fd < 0:
                return
            if _HELD.get(self._key) is self:
                del _HELD[self._key]
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> "DirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        # Dropped without release(): free the flock like process exit would.
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            self._fd = -1
            os.close(fd)

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"DirLock({self.state_dir!r}, {self.kind!r}, {state})"


def _read_pid(fd: int) -> int | None:
    data = os.pread(fd, 32, 0).strip()
    return int(data) if data.isdigit() else None
