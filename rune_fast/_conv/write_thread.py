"""Group commit: which appended tail bytes are durable, and who syncs them.

RocksDB keeps this in ``write_thread.cc``; here :class:`WriteThread` alone
writes the counters of the session's appended bytes, the sync in flight, the
first failed write or sync (after which the store refuses writes until it is
reopened), and the durable mark that tells viewers how far the tail's lines
are durable. The repository calls :meth:`WriteThread.wrote` after each tail
write (under its lock) and :meth:`WriteThread.wait_durable` after it (without
the lock), so that concurrent appenders share one sync.
"""
from __future__ import annotations

import threading
from typing import Callable

from ..errors import DurabilityError
from ..segments import DurableMark, TailFile


class WriteThread:
    """The group commit of one repository's tail (see the module docstring).

    ``tail`` returns the repository's current tail (None in a viewer that
    found none): a roll replaces it. ``mark_path``: the DurableMark file,
    written by a writer (``writer``), read by viewers."""

    def __init__(self, mark_path: str, *, writer: bool, durability: str,
                 tail: Callable[[], TailFile | None]) -> None:
        self._tail = tail
        self._durability = durability
        # the condition's lock, taken as it is (its C enter and exit) where
        # nothing waits: the one appending thread's sync takes it twice an
        # append, and notifies only when a waiter counted itself (_wait)
        self._lk = threading.Lock()
        self._cond = threading.Condition(self._lk)
        self._waiters = 0
        # where the durable tail lines end, for viewers (see DurableMark)
        self._mark = DurableMark(mark_path, writer=writer)
        # the tail location after the last write (what the next sync makes
        # durable), and the one last published to viewers (see publish)
        self._wmark = -1
        self._published = -1
        self.reset()

    def reset(self) -> None:
        """Start counting bytes appended in this session (at each load of the state)."""
        # Group commit counts bytes appended in this session, across tail rolls.
        self._wpos = 0
        self._synced = 0
        self._syncing = False
        self._error: BaseException | None = None
        # the token of a sync sync_begin started that nobody ended yet
        # (its caller, or a sync_now that came first: see there)
        self._begun: tuple | None = None

    @property
    def error(self) -> BaseException | None:
        """The failed write or sync that makes the store refuse writes, or None."""
        return self._error

    def published(self) -> int | None:
        """The location the writer last published as durable (a viewer's
        view of the tail ends there); None if no writer ever published one."""
        return self._mark.read()

    def stored(self) -> int | None:
        """(writer) The location the mark held when this writer opened it
        (``DurableMark.stored``): how far an earlier writer knew its tail durable."""
        return self._mark.stored()

    def opened(self, loc: int) -> None:
        """A writer's open: the tail lines up to ``loc`` (all it found, a
        killed writer's unsynced ones too) are durable from here on."""
        self._wmark = loc
        self.publish(loc, force=True)

    def publish(self, loc: int, *, force: bool = False) -> None:
        """Tell viewers that the tail lines up to ``loc`` (a location) are
        durable: what ``refresh()`` may show (SPEC: "what the writer has made
        durable"). Never backwards but at open (which runs alone). Callers
        hold the condition (a sync), or the repository lock in "none" mode,
        where nothing publishes without it."""
        if loc > self._published or force:
            self._mark.publish(loc)
            self._published = loc

    def wrote(self, end: int, nbytes: int) -> int:
        """Count ``nbytes`` appended to the tail, ending at location ``end``
        (repository lock held); returns the count a caller waits for."""
        # _wmark before _wpos: a syncer reads _wpos first, so one that sees
        # these bytes counted also sees (and publishes) where they end
        self._wmark = end
        self._wpos += nbytes
        if self._durability == "none":
            self.publish(end)      # (the OS has it: all this mode promises)
        return self._wpos

    def rolled(self, tail_seg: int) -> None:
        """The tail was sealed (its lines synced) and a new empty one opened."""
        with self._cond:
            self._wmark = tail_seg << 40
            self.publish(self._wmark)

    def wait_durable(self, target: int) -> None:
        """Return once the tail is synced up to ``target`` (group commit)."""
        if self._durability == "none":
            return
        with self._lk:
            while True:
                if self._error is not None:
                    path = getattr(self._tail(), "path", "the tail")
                    raise DurabilityError(f"sync of {path} failed: {self._error}") from self._error
                if self._synced >= target:
                    return
                if not self._syncing:
                    self._syncing = True
                    break
                self._wait()
        # the leader syncs at once: appenders that write meanwhile wait behind
        # this sync, and the next leader syncs all they wrote (group commit).
        # Measured: with 2-4 appending threads in "batch" mode, a leader that
        # waited 0.5 ms for them first had 1.5-2x less throughput.
        self._sync_as_syncer()

    def sync_begin(self) -> tuple | None:
        """Start, as the group commit's syncer, a sync of what was written so
        far in a thread of its own (TailFile.sync_begin), so that the caller's
        work after its write (a large batch's indexing, caching and journal)
        overlaps the disk's; the caller passes the token to :meth:`sync_end`,
        whatever happens, then waits as usual (:meth:`wait_durable`). None if
        there is nothing to start: mode "none", a sync in flight (it or the
        next one covers the write), a failure recorded, or no thread to be had
        (wait_durable then syncs as before)."""
        if self._durability == "none":
            return None
        cond = self._cond
        with cond:
            if self._syncing or self._error is not None:
                return None
            self._syncing = True
            upto, mark = self._wpos, self._wmark    # (_wpos first: see wrote)
        tail = self._tail()
        try:
            assert tail is not None                 # a writer always has its tail
            job = tail.sync_begin()
        except BaseException:
            with cond:
                self._syncing = False
                cond.notify_all()
            return None
        token = (job, upto, mark, tail)
        with cond:
            self._begun = token
        return token

    def sync_end(self, token: tuple) -> None:
        """Finish the sync :meth:`sync_begin` started: count what it made
        durable, publish it to viewers, wake the waiters; a failure is
        recorded for every waiter (the store then refuses writes) and raised.
        Nothing to do if a :meth:`sync_now` ended it first (its failure is
        then what :meth:`wait_durable` raises)."""
        with self._lk:
            if self._begun is not token:
                return
            self._begun = None
        job, upto, mark, tail = token
        try:
            tail.sync_end(job)
        except BaseException as exc:
            self._sync_failed(exc)
            raise
        self._synced_to(upto, mark)

    def fail(self, exc: BaseException) -> None:
        """Refuse every later write until the store is reopened: a write or
        sync failed (SPEC: reported, never retried silently). Waiters of a
        group commit are woken to see it."""
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def sync_now(self) -> None:
        """Sync the tail now (repository lock held); records a failure for
        every waiter. Nothing to do when every byte this session wrote is
        synced already and the open synced what it found (not in "none"
        mode: there it synced nothing)."""
        tail = self._tail()
        if tail is None:
            return
        with self._lk:
            begun = self._begun
        if begun is not None:
            # a sync begun by an append_many that has not ended it yet: it
            # may be this very thread (its automatic compaction runs while
            # its sync is in flight), or one waiting for the repository
            # lock held here, so it is ended here (sync_end: once only)
            self.sync_end(begun)
        with self._lk:
            while self._syncing:
                self._wait()
            if self._error is not None:
                raise DurabilityError(f"sync of {tail.path} failed: {self._error}")
            if self._synced >= self._wpos and self._durability != "none":
                return
            self._syncing = True
        self._sync_as_syncer()

    def _sync_as_syncer(self) -> None:
        """The sync of the thread that set ``_syncing`` (group commit): sync
        what was written so far, publish where it ends to viewers, wake the
        waiters; a failure is recorded for every waiter (the store then
        refuses writes) and raised."""
        try:
            upto, mark = self._wpos, self._wmark    # (_wpos first: see wrote)
            tail = self._tail()
            assert tail is not None                 # a writer always has its tail
            tail.sync()
        except BaseException as exc:
            self._sync_failed(exc)
            raise
        self._synced_to(upto, mark)

    def _synced_to(self, upto: int, mark: int) -> None:
        """(the syncer) Its sync made the session's bytes up to ``upto``
        durable: counted, ``mark`` published to viewers, the waiters woken."""
        with self._lk:
            if upto > self._synced:
                self._synced = upto
            if mark > self._published:
                self._mark.publish(mark)
                self._published = mark
            self._syncing = False
            if self._waiters:
                self._cond.notify_all()

    def _wait(self) -> None:
        """Wait to be notified (the lock held), counted: a sync that ends
        notifies only when some thread waits (_synced_to)."""
        self._waiters += 1
        try:
            self._cond.wait()
        finally:
            self._waiters -= 1

    def _sync_failed(self, exc: BaseException) -> None:
        """(the syncer) Its sync failed: every waiter sees the first failure
        and the store refuses writes until reopened."""
        with self._cond:
            if self._error is None:
                self._error = exc
            self._syncing = False
            self._cond.notify_all()

    def close(self) -> None:
        self._mark.close()
