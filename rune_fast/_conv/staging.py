"""Background archive work (a cooling run, a merge of cool files): the job
object a compaction starts and the next one adopts or discards."""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Sequence

import numpy as np

from ..cool import CoolArchive
from ..errors import RuneError
from . import tuning

log = logging.getLogger("rune_fast")


class _Staged:
    """Archive work done by a background thread: a cooling run (``kind``
    "cool": its lines are copied under the repository lock, a part at a
    time by the compactions that follow its start (:meth:`feed`); the
    thread parses each as it comes and :meth:`CoolArchive.stage_parts`
    writes it to the run's Parquet file, synced at the end, without it)
    or a merge of cool files ("merge": :meth:`CoolArchive.stage_merge`). The
    next compaction adopts the result, or discards it. Until then its files
    are strays that no manifest names (a crash leaves them to the next open)."""

    def __init__(self, kind: str, work: Callable[["_Staged"], Any], locs: "Sequence[int] | np.ndarray" = (),
                 fed: bool = False) -> None:
        self.kind = kind
        self.locs = locs
        # a fed job (a cooling run): its input comes a part at a time through
        # feed(), from compactions that hold the repository lock (see
        # Cooling._feed_cooling); ``fed_to``: how many of ``locs`` were fed,
        # None once the input is complete (or given up)
        self.fed_to: int | None = 0 if fed else None
        self._parts: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._taken = threading.Event()     # set each time the thread takes a part
        self.table: Any = None  # a cooling run's msg_ids (a table), in the order of locs (set by its thread)
        # each channel's newest stamp among its rows (set by its thread too:
        # the adoption, under the lock, then need not make them)
        self.maxima: dict[str, tuple[str, str]] | None = None
        # a cooling run's id hashes, in the order of locs (filled as its
        # parts are fed: HotIndex.gather_lines)
        self.hashes: np.ndarray | None = None
        self.result: Any = None
        self.sources: set[str] = set()  # a merge's source files (set by the compaction that starts it)
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.cancel = threading.Event()     # set: a merge gives up (close() does not wait for it)
        self.thread = threading.Thread(target=self._run, args=(work,), name=f"rune-fast-{kind}",
                                       daemon=True)
        self.thread.start()

    def _run(self, work: Callable[["_Staged"], Any]) -> None:
        try:
            self.result = work(self)
        except BaseException as exc:   # reported by the compaction that settles the job
            self.error = exc
        finally:
            self.done.set()

    def feeding(self) -> bool:
        """Whether the job still waits for parts of its input."""
        return self.fed_to is not None

    def wants_part(self) -> bool:
        """Whether the job waits for parts and its thread has fewer than
        ``tuning.BG_COOL_QUEUED_PARTS`` fed parts not taken yet (a part a
        compaction would otherwise pile up behind a slower thread)."""
        return self.fed_to is not None and self._parts.qsize() < tuning.BG_COOL_QUEUED_PARTS

    def wait_for_room(self, timeout: float) -> bool:
        """Wait (up to ``timeout`` s) until the thread holds fewer than
        ``tuning.BG_COOL_QUEUED_PARTS`` untaken parts, or has ended;
        whether it has room (or ended) now."""
        self._taken.clear()
        if self.wants_part() or self.done.is_set():
            return True
        self._taken.wait(timeout)
        return self.wants_part() or self.done.is_set()

    def feed(self, part: Any, upto: int) -> None:
        """Hand the thread the next part of its input (``locs[fed_to:upto]``)."""
        assert self.fed_to is not None
        self._parts.put(part)
        self.fed_to = upto
        if upto >= len(self.locs):
            self._parts.put(None)
            self.fed_to = None

    def stop_feeding(self) -> None:
        """Give up the input: the thread ends (its error says so; the job is
        cancelled, so the compaction that settles it does not log it)."""
        if self.fed_to is not None:
            self.cancel.set()
            self._parts.put(None)
            self.fed_to = None

    def next_part(self) -> Any:
        """The next part fed (in the job's thread; blocks until there is
        one); None once the input is complete. RuneError if it was given up."""
        part = self._parts.get()
        self._taken.set()
        if part is None and self.cancel.is_set():
            raise RuneError(f"background {self.kind}: its input was given up")
        return part

    def discard(self, cool: CoolArchive) -> None:
        if self.result is not None:
            if self.kind == "cool":
                cool.discard(self.result)
            else:
                cool.discard_merge(self.result)




class _Chore:
    """File work an automatic compaction leaves to a thread once nothing
    depends on it (the unlinks of files the new manifest no longer names;
    the write of an index snapshot already built in memory), so that no
    append waits for it. A crash before it finishes leaves what a crash in
    the compaction itself would: stray files the next open removes, or the
    older snapshot (a cache the open checks against the files). One runs at
    a time: the next compaction, an explicit ``compact()`` and ``close()``
    wait for it first (:meth:`join`), so an explicit compaction still
    returns with every file it retired gone. A failure is logged: what it
    left is what the next open cleans up or rebuilds."""

    def __init__(self, what: str, work: Callable[[], Any]) -> None:
        self.what = what
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(work,), name=f"rune-fast-{what}",
                                       daemon=True)
        self.thread.start()

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            work()
        except BaseException as exc:   # logged by join
            self.error = exc

    def running(self) -> bool:
        return self.thread.is_alive()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            log.warning("background %s failed (the next open finishes it): %s", self.what, self.error)
