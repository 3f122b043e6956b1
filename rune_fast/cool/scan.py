"""The scans of a search over the row groups of one cool file: the two
threads that decompress and search pages, and the batches in which the
groups a rare needle touches are read.

A rare needle passes a few rows of most groups (its hits are spread over
the archive): each such group costs a content page or two and, for its
hits, a page of each other column, ~14 small zstd frames. Group by group,
the GIL would be taken and given back around every page, so two threads
ran no faster than one. :class:`FewGroups` reads a window of groups at a
time instead: the pages of all of them in two batches side by side, each
one stretch without the GIL (``PageReader.fetch``), then each group is
searched and its hits built from those pages on the asking thread.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

import numpy as np

from ..pages import PageError, Unsupported

_SCAN_POOL: Any = None
_SCAN_POOL_LOCK = threading.Lock()

#: groups a FewGroups batch reads at once (a group's pages: ~2 content
#: pages of ~14 KB and ~25 small ones; with AHEAD, a few MB in flight)
WINDOW = 32
#: windows staged (searched, their hit pages fetching) ahead of the one being
#: built: 2 kept the scan threads fed (a rare search at 10,000,000 ~5% faster than 1)
AHEAD = 2


class Deferred:
    """A call made when its result is asked for (a future's ``result()``)."""

    __slots__ = ("_fn", "_arg")

    def __init__(self, fn: Callable[[Any], Any], arg: Any) -> None:
        self._fn = fn
        self._arg = arg

    def result(self) -> Any:
        return self._fn(self._arg)


def scan_pool() -> Any:
    """The threads that decompress and search cool pages for searches (two;
    made at the first search that scans the files)."""
    global _SCAN_POOL
    with _SCAN_POOL_LOCK:
        if _SCAN_POOL is None:
            from concurrent.futures import ThreadPoolExecutor
            _SCAN_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rune-fast-scan")
        return _SCAN_POOL


def _forget_scan_pool() -> None:
    # A forked child has none of the parent's threads: a pool inherited from
    # it would queue work that nothing runs. The child makes its own.
    global _SCAN_POOL, _SCAN_POOL_LOCK
    _SCAN_POOL = None
    _SCAN_POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_scan_pool)


class Fetch:
    """The pages ``wants`` names (row group, directory indices), to be read
    by ``reader`` (PageReader.fetch: one stretch without the GIL): planned
    here, fetched on a scan thread once :meth:`start` is called, or at
    :meth:`get` in two batches, one on a scan thread and one on the asking
    thread (which takes the other too if no scan thread has started it: the
    pool may be busy with this search's other groups)."""

    def __init__(self, reader: Any, wants: list[tuple[int, list[int]]]) -> None:
        self._reader = reader
        self._wants = wants
        self._fields = [reader.fields(rg, pages) for rg, pages in wants]
        self._all = np.concatenate(self._fields) if self._fields else np.zeros((0, 5), np.int64)
        self._fut: Any = None

    def start(self) -> "Fetch":
        if len(self._all):
            self._fut = scan_pool().submit(self._reader.fetch, self._all)
        return self

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
            other = scan_pool().submit(fetch, np.ascontiguousarray(allf[half:]))
            got = fetch(np.ascontiguousarray(allf[:half]))
            got += fetch(np.ascontiguousarray(allf[half:])) if other.cancel() else other.result()
        out, at = [], 0
        for (_rg, pages), f in zip(self._wants, self._fields):
            out.append(dict(zip(pages, got[at:at + len(f)])))
            at += len(f)
        return out


class FewGroups:
    """The scans of ``rgs`` (ascending), groups whose filters pass few rows,
    run WINDOW at a time when the first of a window is asked for
    (:meth:`handle` gives a future-like handle a group), as a pipeline: the
    scan threads fetch the next window's content pages and this window's
    hit pages while the asking thread searches and builds (the Python part,
    which holds the GIL). ``found(rg, fetched)``: the group's hits from its
    content pages (``(local, named, hits)``); ``built(rg, local, named,
    hits, fetched)``: what the search takes of them. ``content_pages(rg)``
    and ``hit_pages(rg, local)``: the pages each reads. A window whose
    content pages do not fetch (damage, a read error) is scanned group by
    group (``scan``), which names the damage in the group it is in; a group
    whose hit pages do not, reads its own (naming it)."""

    def __init__(self, reader: Any, rgs: list[int], found: Callable[..., Any], built: Callable[..., Any],
                 scan: Callable[[int], Any], content_pages: Callable[[int], list[int]],
                 hit_pages: Callable[[int, list[int]], list[int]]) -> None:
        self._reader = reader
        self._rgs = rgs
        self._at = {rg: i for i, rg in enumerate(rgs)}
        self._found, self._built, self._scan = found, built, scan
        self._content_pages, self._hit_pages = content_pages, hit_pages
        self._done: dict[int, Any] = {}
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
        return Fetch(self._reader, [(rg, self._content_pages(rg)) for rg in self._rgs[at:at + WINDOW]])

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
        found, hit_fetch = staged
        try:
            more = dict(zip([rg for rg, f in found.items() if f[0]], hit_fetch.get()))
        except (PageError, Unsupported):
            more = {}           # (each group's take reads its own pages, naming any damage)
        for rg, f in found.items():
            try:
                self._done[rg] = self._built(rg, *f, more.get(rg))
            except (PageError, Unsupported) as exc:
                self._done[rg] = exc

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
        try:
            hit_fetch = Fetch(self._reader, [(rg, self._hit_pages(rg, f[0])) for rg, f in found.items()
                                             if f[0]]).start()
        except (PageError, Unsupported):
            hit_fetch = Fetch(self._reader, [])
        self._staged[at] = (found, hit_fetch)
