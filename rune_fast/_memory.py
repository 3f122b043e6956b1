"""Freed heap memory handed back to the operating system.

A search that scans decodes pages, builds filters and sorts hits in
transient buffers of a few MB; glibc keeps what they freed (between live
blocks, below its trim threshold) as the process's resident memory. At
100,000 messages the read mix's five searches left ~1.7 MB so (17 bytes a
stored message against the bound of 64, issue 33); ``malloc_trim`` gives
it back in 0.1-0.4 ms, a few percent of a scanning search and nothing
beside the pages it reads. (The mmap threshold that keeps Arrow's large
blocks out of the heap is set in rune_fast.cool.sidecar.)"""
from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable


@functools.cache
def _malloc_trim() -> Callable[[int], Any] | None:
    """glibc's malloc_trim, or None on another C library."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version     # (glibc's only)
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim_heap() -> None:
    """Give the heap's free pages back to the OS (glibc; elsewhere nothing)."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
