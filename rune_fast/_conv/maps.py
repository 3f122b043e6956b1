"""The mapped pages' budget: how many file pages the hot reads left resident,
and when to drop them from this process's page tables.

A read fault in a segment or tail map maps a whole page-cache folio; left
alone, reads spread over the segments would keep them all resident.
:class:`MapBudget` alone writes the count of lines decoded from the maps
since it last looked, the resident file pages after the last release, and
whether releasing works at all here; the repository tells it what it read
and hands it the maps to release.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable

from ..segments import release_pages
from . import tuning
from .common import _resident_file_bytes

log = logging.getLogger("rune_fast")


class MapBudget:
    """See the module docstring. ``where``: the folder named in a warning."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._reads = 0                 # lines decoded from the maps since the last look
        self._release = True            # False once a release failed (logged)
        self._base: int | None = None   # resident file pages after the last release

    def read(self, n: int = 1) -> bool:
        """Count ``n`` lines read through the maps; True when it is time to
        look at the budget (every MAP_RELEASE_READS lines)."""
        self._reads += n
        return self._reads >= tuning.MAP_RELEASE_READS

    def over(self) -> bool:
        """Look at the budget (the count starts again): True if the
        resident file pages grew past MAP_BUDGET_BYTES since the last
        release (Linux: /proc/self/statm, whose third field counts them;
        elsewhere, at every look), or none was made yet."""
        self._reads = 0
        now = _resident_file_bytes()
        if now is None or self._base is None or now - self._base > tuning.MAP_BUDGET_BYTES:
            return True
        if now < self._base:
            self._base = now        # (the kernel reclaimed pages meanwhile)
        return False

    def release(self, bufs: Iterable[Any]) -> None:
        """Drop the pages of the maps ``bufs`` from this process's page
        tables (``segments.release_pages``): they stay in the page cache, and
        a read of one maps it again. A failure is logged once, and no
        release is tried again."""
        if not self._release:
            return
        self._base = None
        try:
            for buf in bufs:
                release_pages(buf)
        except (OSError, ValueError) as exc:     # (ValueError: a map closed meanwhile)
            self._release = False
            log.warning("%s: mapped segment pages cannot be released (%s); they stay resident",
                        self._where, exc)
            return
        self._base = _resident_file_bytes()
