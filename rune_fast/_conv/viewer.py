"""Read-only viewers (``read_only=True``): a type of their own.

``ConversationStateRepository(..., read_only=True)`` makes an instance of a
subclass (:func:`viewer_of`; RocksDB's ``DBImplReadOnly`` is the pattern):
:class:`ReadOnlyViewer` comes first in its bases and holds what a viewer does
otherwise than a writer. Its reads retry when they met a file the writer's
compaction replaced, ``refresh()`` picks up what the writer made durable, a
write raises ReadOnlyStoreError, ``flush()`` has nothing to do, and a read's
damage or a vouched line found gone is only logged (the writer's own open
judges). In the open it writes no file: the steps of recovery that write
(folders, device id, first manifest, stray files, an interrupted roll, a
torn line's quarantine, the envelopes) and its choice of the tail (the one
the writer is rolling, a legacy checkpoint's) are methods of Recovery that
it overrides; what remains of ``read_only`` in recovery are the flags it
hands to WriteThread and CoolArchive.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any, Callable

from .._names import LEGACY_NAME, TAIL_NAME, seg_name
from ..errors import CorruptStateCheckpointError, ReadOnlyStoreError
from ..segments import TailFile
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
                rep = self._index_ingest(self._tail_seg, start, max(start, self._visible_end()),
                                         self._seq_floor(start))
                self._check_ingest(rep, self._tail.path, sealed=False)
                self._set_tail_size(rep.good_end)
                self._note_ingested(rep.added)
                self._forget_interleaving()
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

    # ---- the open: read what the writer made, write nothing (see Recovery)

    def _make_dirs(self) -> None:
        """A viewer of a store not made yet makes nothing."""

    def _settle_open(self) -> None:
        """Nothing to sync, journal or import: the writer's open does that."""

    def _keep_device_id(self, path: str, dev: str) -> None:
        """A viewer's clock uses the new id without writing it."""

    def _open_tail(self, fresh: bool) -> TailFile | None:
        """The tail to read: the sealed file while the writer rolls it, a
        legacy checkpoint's messages in a store that holds only that (see
        Recovery._legacy_tail), None before the writer made one."""
        tail_path = os.path.join(self.hot_dir, TAIL_NAME)
        sealed_tail = os.path.join(self.hot_dir, seg_name(self._tail_seg))
        if self._tail_seg not in self._segs and os.path.exists(sealed_tail):
            tail_path = sealed_tail     # the writer is rolling the tail right now
        legacy = os.path.join(self.hot_dir, LEGACY_NAME)
        if fresh and os.path.exists(legacy):
            return self._legacy_tail(legacy)
        if not os.path.exists(tail_path):
            return None
        return TailFile(tail_path, self._tail_seg, read_only=True)

    def _write_first_manifest(self, m: dict) -> None:
        """The writer's first open writes it."""

    def _remove_stray_segments(self) -> None:
        """Stray files are the writer's to remove (it may be writing them)."""

    def _gc_cool(self, cool_files: list[str]) -> None:
        """Unreferenced archives are the writer's to remove."""

    def _undo_roll(self, sealed: str, tail_path: str) -> None:
        """The writer is mid-roll; read the sealed file as the tail."""

    def _finish_roll_on_disk(self, s: Any, scan: Any, covered: int) -> None:
        """The roll is finished in memory only (the writer's open writes it)."""

    def _quarantine_torn(self, path: str, torn_at: int) -> None:
        """The writer's append in flight: skipped, not quarantined."""

    def _tail_durable_end(self, start: int) -> int | None:
        return None

    def _visible_end(self) -> int:
        """Where the writer's durable lines end in the tail (its DurableMark;
        see Recovery._visible_end)."""
        assert self._tail is not None
        end = self._tail.file_size
        loc = self._writes.published()
        if loc is None:
            return end
        seg = loc >> 40
        if seg == self._tail_seg:
            return min(end, loc & ((1 << 40) - 1))
        return end if seg > self._tail_seg else 0

    def _load_attempts(self) -> None:
        """A viewer races the writer's compactions (a file the manifest it
        read named may be gone by the time it opens it): it reads again
        while the manifest keeps changing under it."""
        # a reload replaces the tail, segments and cool archive: the replaced
        # ones (and those of attempts that failed) are closed once it is done,
        # or a viewer refreshing beside a compacting writer leaks descriptors
        replaced = self._state_files()
        try:
            for attempt in range(50):
                seen = self._manifest_store.read()
                try:
                    return self._load_state_once()
                except (CorruptStateCheckpointError, FileNotFoundError):
                    replaced += self._state_files()
                    if attempt >= 3 and self._manifest_store.read() == seen:
                        raise
                    time.sleep(0.002 * (attempt + 1))
            return self._load_state_once()
        finally:
            current = {id(f) for f in self._state_files()}
            closed: set[int] = set()
            for f in replaced:
                if id(f) not in current and id(f) not in closed:
                    closed.add(id(f))
                    f.close()

