"""Read-only viewers (``read_only=True``): a type of their own.

``ConversationStateRepository(..., read_only=True)`` makes an instance of a
subclass (:func:`viewer_of`; RocksDB's ``DBImplReadOnly`` is the pattern):
:class:`ReadOnlyViewer` comes first in its bases and holds what a viewer does
otherwise than a writer. Its reads retry when they met a file the writer's
compaction replaced, ``refresh()`` picks up what the writer made durable, a
write raises ReadOnlyStoreError, ``flush()`` has nothing to do, and a read's
damage or a vouched line found gone is only logged (the writer's own open
judges). What differs in the open (no lock, no file written) still reads
``read_only``.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable

from ..errors import CorruptStateCheckpointError, ReadOnlyStoreError
from .common import _VIEWER_ATTEMPTS, MessageRead, ReadStatus
from .host import Host

log = logging.getLogger("rune_fast")

#: the public reads a viewer retries (see _retry)
RETRIED_READS = ("get_message", "window", "messages_for_task", "search", "latest_task", "channels",
                 "resume_messages", "export_ops")


def _retry(self: Any, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """A viewer's read: one that met a file the writer's compaction
    replaced reloads the state once the manifest shows it moved, and retries
    (backing off a little each time) for as long as the manifest keeps
    moving: a writer compacting every few milliseconds can replace files
    again between a reload and the read after it. Damage raises at once."""
    last = _VIEWER_ATTEMPTS - 1
    for attempt in range(_VIEWER_ATTEMPTS):
        seen = self._reloads      # another thread's refresh() may reload meanwhile
        try:
            out = call(self, *args, **kwargs)
        except CorruptStateCheckpointError:
            with self._lock:
                if attempt == last or self._closed:
                    raise
                if self._reloads == seen:
                    if not self._stale_view():
                        raise
                    self._load_state()
            time.sleep(0.001 * min(attempt, 10))
            continue
        if (isinstance(out, MessageRead) and out.status is ReadStatus.SOURCE_CORRUPT
                and attempt < last):
            with self._lock:
                if not self._closed and self._reloads != seen:
                    continue
                if not self._closed and self._stale_view():
                    self._load_state()
                    continue
        if isinstance(out, MessageRead) and out.status is ReadStatus.SOURCE_CORRUPT:
            log.error("exact read of %s in viewer of %s: SOURCE_CORRUPT (the state did not move: "
                      "damage, not a replaced file)", args[0] if args else kwargs.get("msg_id"),
                      self.state_dir)
        return out
    return call(self, *args, **kwargs)


def _retried(base: type, name: str) -> Callable[..., Any]:
    """The read ``name`` of ``base`` under :func:`_retry` (looked up at each
    call, so a patched method is the one retried)."""
    @functools.wraps(getattr(base, name))
    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _retry(self, getattr(base, name), args, kwargs)
    return read


_VIEWERS: dict[type, type] = {}


def viewer_of(cls: type) -> type:
    """The read-only viewer type of the repository class ``cls`` (made once):
    same name and module, :class:`ReadOnlyViewer` first in its bases."""
    viewer = _VIEWERS.get(cls)
    if viewer is None:
        ns: dict[str, Any] = {name: _retried(cls, name) for name in RETRIED_READS}
        ns.update(__module__=cls.__module__, __qualname__=cls.__qualname__,
                  __doc__=cls.__doc__)
        viewer = _VIEWERS[cls] = type(cls.__name__, (ReadOnlyViewer, cls), ns)
    return viewer


class ReadOnlyViewer(Host):
    """What a read-only viewer does otherwise than a writer (see the module docstring)."""

    def refresh(self) -> int:
        """Pick up what the writer made durable since open or the last refresh.
        Returns how many more messages it shows than before: ``len`` after
        minus ``len`` before (negative when the writer deleted more than it
        appended meanwhile)."""
        with self._lock:
            self._check_open()
            return self._refresh()

    def flush(self) -> None:
        """Nothing to make durable: a viewer writes nothing."""
        with self._lock:
            self._check_open()

    def _check_writable(self) -> None:
        self._check_open()
        raise ReadOnlyStoreError(f"conversation repository {self.state_dir} is open read-only")

    def _read_damage(self, fmt: str, *args: Any) -> None:
        """A debug record: the read may have met a file its writer's
        compaction just replaced (:func:`_retry` reloads and reads again, and
        logs the error if the read stays SOURCE_CORRUPT)."""
        log.debug(fmt, *args)

    def _report_lost(self, path: str, offset: int, what: str, *, where: str = "it ended at offset") -> None:
        """Logged only: a viewer may meet the writer mid-roll (the writer's own open judges)."""
        log.info(f"rune_fast: {path}: {what} ({where} {offset})")

    def _refresh(self) -> int:
        before = len(self)
        m = self._manifest_store.read()
        if m != self._manifest:
            self._load_state()
        elif self._tail is not None:
            try:
                start = self._tail.size
                if self._tail.refresh_map():
                    self._reattach_tail()
                rep = self._index.ingest(self._tail_seg, start, max(start, self._visible_end()),
                                         self._seq_floor(start))
                self._check_ingest(rep, self._tail.path, sealed=False)
                self._tail.size = rep.good_end
                self._fold_order.clear()
                self._interleaved.clear()
                self._refresh_tombstones()
            except CorruptStateCheckpointError:
                # the writer moved the manifest meanwhile (a file read here
                # was replaced): read the new state whole; damage raises
                if not self._stale_view():
                    raise
                self._load_state()
        else:
            self._load_state()
        return len(self) - before
