"""Read-only viewers: a read that met a file the writer replaced retries on the
new state; refresh() picks up what the writer made durable."""
from __future__ import annotations

import functools
import logging
import time


from ..errors import CorruptStateCheckpointError
from .common import (_VIEWER_ATTEMPTS, MessageRead, ReadStatus)

from .host import Host

log = logging.getLogger("rune_fast")


def _viewer_retry(method):
    """For a read-only viewer: a read that met a file the writer's compaction
    replaced reloads the state once the manifest shows it moved, and retries
    (backing off a little each time) for as long as the manifest keeps
    moving: a writer compacting every few milliseconds can replace files
    again between a reload and the read after it. Damage raises at once."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if not self.read_only:
            return method(self, *args, **kwargs)
        last = _VIEWER_ATTEMPTS - 1
        for attempt in range(_VIEWER_ATTEMPTS):
            seen = self._reloads      # another thread's refresh() may reload meanwhile
            try:
                out = method(self, *args, **kwargs)
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
        return method(self, *args, **kwargs)
    return wrapper


class Viewer(Host):
    """What a read-only viewer does beyond a writer (a mixin of the repository)."""

    def _refresh(self) -> int:
        if not self.read_only:
            return 0
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
