"""Freed heap memory handed back to the operating system.

A search that scans decodes pages, builds filters and sorts hits in
transient buffers of a few MB; glibc keeps what they freed (between live
blocks, below its trim threshold) as the process's resident memory. At
100,000 messages the read mix's five searches left ~1.7 MB so (17 bytes a
stored message against the bound of 64, issue 33); ``malloc_trim`` gives
it back in 0.1-0.4 ms, a few percent of a scanning search and nothing
beside the pages it reads. (The mmap threshold that keeps Arrow's large
blocks out of the heap is set in rune_fast.cool.sidecar.)

Arrow's own allocator is chosen here too, as this module loads (the
package loads it first, before pyarrow): see :func:`system_arrow_allocator`."""
from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any, Callable

#: The variable Arrow's C++ library reads once, as it loads, to choose the
#: default allocator of everything it allocates.
ARROW_POOL_VAR = "ARROW_DEFAULT_MEMORY_POOL"


def system_arrow_allocator() -> None:
    """Load pyarrow with the C library's malloc as Arrow's default
    allocator, unless pyarrow is loaded already or the environment chose
    one (``ARROW_DEFAULT_MEMORY_POOL``); the variable is set only for the
    import and removed after it (child processes do not inherit it).
    ``pyarrow.set_memory_pool``, which a cool archive's open calls
    (rune_fast.cool.sidecar), sets pyarrow's default but not the one
    Arrow's C++ code allocates with on its own, which stayed mimalloc:
    its heaps kept ~8 MB after the first compaction of a store of 30,000
    messages (resident growth after compact() 18.0 against 10.2 MB, after
    close 14.7 against 6.9; session 40). (The variable is set and
    removed around the import: a process whose other threads read the
    environment from C while rune_fast is first imported should import
    pyarrow, or set the variable, first.)"""
    if "pyarrow" in sys.modules or ARROW_POOL_VAR in os.environ:
        return
    os.environ[ARROW_POOL_VAR] = "system"
    try:
        import pyarrow  # noqa: F401  (Arrow reads the variable as it loads)
    finally:
        del os.environ[ARROW_POOL_VAR]


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


system_arrow_allocator()
