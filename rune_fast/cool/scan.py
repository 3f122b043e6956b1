"""The scans of a search over the row groups of one cool file: the two
threads that decompress and search pages, and the batches in which the
groups a rare needle touches are read.

A rare needle passes a few rows of most groups (its hits are spread over
the archive): each such group costs a content page or two and, for its
hits, a page of each other column, ~14 small zstd frames. Group by group,
the GIL would be taken and given back around every page, so two threads
ran no faster than one. :class:`FewGroups` reads a window of groups at a
time instead, in two batches each one stretch without the GIL: the content
pages of all of them (``PageReader.fetch``), searched on the asking
thread, then their hits' other columns (``PageReader.take_many``: pages
fetched and values found), from which the asking thread builds the
records. The batches run on a helper thread, or on the asking thread when
it gets to one no helper has started.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

import numpy as np

from .._pages import zstd_release
from ..pages import PageError, Unsupported

_SCAN_POOL: Any = None
_FEW_POOL: Any = None
_SCAN_POOL_LOCK = threading.Lock()

#: groups a FewGroups batch reads at once (a group's pages: ~2 content
#: pages of ~14 KB and ~25 small ones; with AHEAD, a few MB in flight)
WINDOW = 32
#: windows staged (searched, their hits reading) ahead of the one being
#: built: 2 kept the scan threads fed (a rare search at 10,000,000 ~5% faster than 1)
AHEAD = 2
#: threads that read FewGroups' batches beside the search's own, which reads
#: a batch itself when it gets to one no helper has started (Ahead, Fetch):
#: one fewer than the cores, at most 2. On 2 cores the search's thread and
#: two helpers were three threads on two: a rare search at 10,000,000
#: (18,000 hits) took 1.50 s, with one helper 1.28 s (less CPU too: 2.05 s
#: against 2.30). The other scans keep two threads (scan_pool): their
#: thread waits on them, it does not help.
FEW_HELPERS = min(2, max(1, (os.cpu_count() or 2) - 1))


class Deferred:
    """A call made when its result is asked for (a future's ``result()``)."""

    __slots__ = ("_fn", "_arg")

    def __init__(self, fn: Callable[[Any], Any], arg: Any) -> None:
        self._fn = fn
        self._arg = arg

    def result(self) -> Any:
        return self._fn(self._arg)


def _released(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    finally:
        zstd_release()


def _pool(workers: int, name: str) -> Any:
    """A thread pool whose jobs free their thread's libzstd context when
    they end (``_pages.zstd_release``: ~96 KB a thread, remade by the next
    job's first page in a few us), so that idle pool threads hold none."""
    from concurrent.futures import ThreadPoolExecutor

    class Pool(ThreadPoolExecutor):
        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            return super().submit(_released, fn, *args, **kwargs)

    return Pool(max_workers=workers, thread_name_prefix=name)


def scan_pool() -> Any:
    """The threads that decompress and search cool pages for searches (two;
    made at the first search that scans the files)."""
    global _SCAN_POOL
    with _SCAN_POOL_LOCK:
        if _SCAN_POOL is None:
            _SCAN_POOL = _pool(2, "rune-fast-scan")
        return _SCAN_POOL


def few_pool() -> Any:
    """The FEW_HELPERS threads that read FewGroups' batches."""
    global _FEW_POOL
    with _SCAN_POOL_LOCK:
        if _FEW_POOL is None:
            _FEW_POOL = _pool(FEW_HELPERS, "rune-fast-few")
        return _FEW_POOL


class _NotStarted:
    """A job no helper will start: the asker runs it (see NO_HELPER)."""

    def cancel(self) -> bool:
        return True


class _NoHelper:
    """In place of few_pool() for a scan of an archive under FEW_HELPED_ROWS
    rows: every job is left to the asking thread, which runs it where it
    needs the result (the pipeline's own fallback)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> _NotStarted:
        return _NotStarted()


NO_HELPER = _NoHelper()
#: FewGroups scans use the helper thread in an archive of at least this
#: many rows. A helper, once it has run, keeps ~0.8 MB resident (its stack
#: and malloc arena): 8 bytes a message of the 100,000-message bench
#: store's read mix (bound 64), whose ~49,000 archived rows a rare search
#: scans in ~10 ms with it and ~12 without; at 1,000,000 messages a
#: search's ~900 groups gain the overlap of a core.
FEW_HELPED_ROWS = 128 * 1024


def _forget_scan_pool() -> None:
    # A forked child has none of the parent's threads: a pool inherited from
    # it would queue work that nothing runs. The child makes its own.
    global _SCAN_POOL, _FEW_POOL, _SCAN_POOL_LOCK
    _SCAN_POOL = _FEW_POOL = None
    _SCAN_POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_scan_pool)


class Fetch:
    """The pages ``wants`` names (row group, directory indices), to be read
    by ``reader`` (PageReader.fetch: one stretch without the GIL): planned
    here, fetched on a FewGroups helper once :meth:`start` is called, or at
    :meth:`get` in two batches, one on a helper and one on the asking thread
    (which takes the other too if no helper has started it: it may be busy
    with this search's other batches); :meth:`run` fetches all of them on
    the asking thread."""

    def __init__(self, reader: Any, wants: list[tuple[int, list[int]]], pool: Any = None) -> None:
        self._reader = reader
        self._wants = wants
        self._pool = pool if pool is not None else few_pool()
        self._fields = [reader.fields(rg, pages) for rg, pages in wants]
        self._all = np.concatenate(self._fields) if self._fields else np.zeros((0, 5), np.int64)
        self._fut: Any = None

    def start(self) -> "Fetch":
        if len(self._all):
            self._fut = self._pool.submit(self._reader.fetch, self._all)
        return self

    def run(self) -> list[dict[int, bytes]]:
        """:meth:`get`'s answer, every page fetched on this thread."""
        got = self._reader.fetch(self._all) if len(self._all) else []
        return self._split(got)

    def get(self) -> list[dict[int, bytes]]:
        """A dict a group: directory index -> page bytes. PageError as
        ``PageReader.fetch``."""
        fetch, allf = self._reader.fetch, self._all
        if self._fut is not None and not self._fut.cancel():
            got = self._fut.result()
        elif len(allf) < 2:
            got = fetch(allf) if len(allf) else []
        else:
            half = len(allf) // 2
            other = self._pool.submit(fetch, np.ascontiguousarray(allf[half:]))
            got = fetch(np.ascontiguousarray(allf[:half]))
            got += fetch(np.ascontiguousarray(allf[half:])) if other.cancel() else other.result()
        return self._split(got)

    def _split(self, got: list[bytes]) -> list[dict[int, bytes]]:
        out, at = [], 0
        for (_rg, pages), f in zip(self._wants, self._fields):
            out.append(dict(zip(pages, got[at:at + len(f)])))
            at += len(f)
        return out


class Ahead:
    """``fn()`` run on a FewGroups helper (:func:`few_pool`), or on the
    asking thread at :meth:`get` if no helper has started it by then."""

    def __init__(self, fn: Callable[[], Any], pool: Any = None) -> None:
        self._fn = fn
        self._fut = (pool if pool is not None else few_pool()).submit(fn)

    def get(self) -> Any:
        return self._fn() if self._fut.cancel() else self._fut.result()


class FewGroups:
    """The scans of ``rgs`` (ascending), groups whose filters pass few rows,
    run WINDOW at a time when the first of a window is asked for
    (:meth:`handle` gives a future-like handle a group), as a pipeline: the
    helpers fetch the next windows' content pages and read the hits of the
    windows staged while the asking thread searches and builds (the Python
    part, which holds the GIL). ``found(rg, fetched)``: the group's hits from its
    content pages (``(local, named, hits)``); ``content_pages(rg)``: the
    content pages a group's search reads; ``hit_reads(items)``, for the
    ``(rg, local)`` of the groups with hits: a call that reads their hits'
    other columns on a helper (without the GIL); ``built_many(found,
    read)``: what the search takes of a window's groups (rg -> result, or
    the PageError a group raised), from what that call read (None if it
    failed: each group then reads its own, naming any damage). ``helped``:
    the helper thread takes part (else the asking thread does it all,
    see FEW_HELPED_ROWS). A window
    whose content pages do not fetch (damage, a read error) is scanned
    group by group (``scan``), which names the damage in the group it is
    in."""

    def __init__(self, reader: Any, rgs: list[int], found: Callable[..., Any], built_many: Callable[..., Any],
                 scan: Callable[[int], Any], content_pages: Callable[[int], list[int]],
                 hit_reads: Callable[[list[tuple[int, list[int]]]], Callable[[], Any]], helped: bool = True) -> None:
        self._reader = reader
        self._rgs = rgs
        self._at = {rg: i for i, rg in enumerate(rgs)}
        self._found, self._built_many, self._scan = found, built_many, scan
        self._content_pages, self._hit_reads = content_pages, hit_reads
        self._done: dict[int, Any] = {}
        self._pool = few_pool() if helped else NO_HELPER
        self._next = 0
        self._ahead: tuple[int, Fetch] | None = None     # (window, its content pages in flight)
        self._staged: dict[int, Any] = {}                # window -> (found, its hit pages in flight)

    def handle(self, rg: int) -> Deferred:
        return Deferred(self.result, rg)

    def result(self, rg: int) -> Any:
        while rg not in self._done and self._next <= self._at[rg]:
            self._run(self._next)
            self._next += WINDOW
        got = self._done.pop(rg, None)
        if got is None:
            return self._scan(rg)
        if isinstance(got, BaseException):
            raise got
        return got

    def _content(self, at: int) -> Fetch:
        return Fetch(self._reader, [(rg, self._content_pages(rg)) for rg in self._rgs[at:at + WINDOW]], self._pool)

    def _run(self, at: int) -> None:
        """Window ``at`` done: staged (and the AHEAD next ones, their hit
        pages fetched meanwhile), then built."""
        if at not in self._staged:
            self._stage(at)
        for ahead in range(1, AHEAD + 1):
            nxt = at + ahead * WINDOW
            if nxt < len(self._rgs) and nxt not in self._staged:
                self._stage(nxt)
        staged = self._staged.pop(at)
        if staged is None:
            return              # (each scanned alone, see result)
        found, hit_reads = staged
        try:
            read = hit_reads.get() if hit_reads is not None else None
        except (PageError, Unsupported):
            read = None         # (each group's take reads its own pages, naming any damage)
        self._done.update(self._built_many(found, read))

    def _stage(self, at: int) -> None:
        """Window ``at`` searched (its content pages fetched, the next
        window's started) and its hit pages started."""
        cur = self._ahead[1] if self._ahead is not None and self._ahead[0] == at else self._content(at)
        self._ahead = None
        try:
            if at + WINDOW < len(self._rgs):
                self._ahead = (at + WINDOW, self._content(at + WINDOW).start())
            pages = cur.get()
        except (PageError, Unsupported):
            self._staged[at] = None
            return
        found: dict[int, Any] = {}
        for rg, fetched in zip(self._rgs[at:at + WINDOW], pages):
            try:
                found[rg] = self._found(rg, fetched)
            except (PageError, Unsupported) as exc:
                self._done[rg] = exc
        items = [(rg, f[0]) for rg, f in found.items() if f[0]]
        try:
            hit_reads = Ahead(self._hit_reads(items), self._pool) if items else None
        except (PageError, Unsupported):
            hit_reads = None
        self._staged[at] = (found, hit_reads)
