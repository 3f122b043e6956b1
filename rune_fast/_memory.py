"""The process's memory policy: the allocators, their thresholds, and
freed heap memory handed back to the operating system.

A search that scans decodes pages, builds filters and sorts hits in
transient buffers of a few MB; glibc keeps what they freed (between live
blocks, below its trim threshold) as the process's resident memory. At
100,000 messages the read mix's five searches left ~1.7 MB so (17 bytes a
stored message against the bound of 64, issue 33); ``malloc_trim`` gives
it back in 0.1-0.4 ms, a few percent of a scanning search and nothing
beside the pages it reads. glibc's mmap and trim thresholds
(:func:`fix_malloc_thresholds`) and Arrow's allocator
(:func:`system_arrow_allocator` as this module loads: the package loads it
first, before pyarrow; :func:`use_system_arrow_pool` where pyarrow was
loaded before) are chosen here too, and so is when the cyclic collector
pauses (:func:`collector_paused`)."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

#: The variable Arrow's C++ library reads once, as it loads, to choose the
#: default allocator of everything it allocates.
ARROW_POOL_VAR = "ARROW_DEFAULT_MEMORY_POOL"


def system_arrow_allocator() -> None:
    """Load pyarrow with the C library's malloc as Arrow's default
    allocator, unless pyarrow is loaded already or the environment chose
    one (``ARROW_DEFAULT_MEMORY_POOL``); the variable is set only for the
    import and removed after it (child processes do not inherit it).
    ``pyarrow.set_memory_pool``, which a cool archive's open calls
    (:func:`use_system_arrow_pool`), sets pyarrow's default but not the one
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
def _glibc() -> Any:
    """glibc, or None under another C library."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version     # (glibc's only)
    except (OSError, AttributeError):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def trim_heap() -> None:
    """Give the heap's free pages back to the OS (glibc; elsewhere nothing)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def use_system_arrow_pool() -> None:
    """Make the C library's malloc Arrow's default allocator, unless the
    process chose one (``ARROW_DEFAULT_MEMORY_POOL`` set; or it was set to
    something else already): what the archive decodes and writes is then
    given back when freed. pyarrow's default, mimalloc, keeps what a thread
    freed (a heap each background cooling or merge thread, purged late):
    measured with bench/memory_probe.py on a bulk load of 100,000 messages
    (1 MiB caches), 78-87 MB of resident anonymous memory after the
    appends against 15-25 MB with malloc, and 30-40 bytes a stored message
    more after the read mix; read and load timings alike within the noise.
    The pool is the process's: its buffers keep the pool that made them.
    (pyarrow's default only: a pyarrow loaded before rune_fast keeps its
    C++ default, see :func:`system_arrow_allocator`.)"""
    if os.environ.get(ARROW_POOL_VAR):
        return
    import pyarrow as pa
    if pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())
    fix_malloc_thresholds()


#: Allocations of at least this many bytes are mapped (and unmapped when
#: freed) by glibc's malloc, and free space past TRIM_THRESHOLD at the top
#: of a heap goes back to the OS, see :func:`fix_malloc_thresholds`.
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 16 << 20
_M_TRIM_THRESHOLD = -1      # (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3


@functools.cache
def fix_malloc_thresholds() -> None:
    """Fix glibc's malloc thresholds for the blocks of Arrow's buffers and
    of the cooling parts: blocks of MMAP_THRESHOLD or more are mapped (a
    freed one goes back to the OS at once), smaller ones come from the
    heap, whose free top is given back past TRIM_THRESHOLD. glibc's
    default raises the mmap threshold to the size of each mapped block
    freed (up to 32 MiB), and the heap then kept what cooling runs and
    merges freed between live blocks: a 300,000-message load peaked at
    131-136 MiB of resident anonymous memory (74-86 of it the heap's free)
    against 105-108 MiB with a fixed 256 KiB threshold (bench/cooling_profile.py,
    session 30). 256 KiB in turn mapped, faulted in, zeroed and unmapped
    each part's gathered lines and parsed columns (~3.4 MB a part of 4,096
    lines: two thirds of a compaction's page faults): the 1,000,000-message
    bulk load with compact() took 10.7-11.2 us a message, its compact()
    1.0-1.5 s of system time; at 4 MiB / 16 MiB 10.1-10.6 us and 0.5 s,
    its peak growth 83-85 B a message against 76 (session 40, two runs
    each); the read mix's resident growth alike (52 against 56 B a message
    at 100,000, 42.5 against 41.6 at 1,000,000). Process-wide, as the pool
    (:func:`use_system_arrow_pool`); each left alone when the environment sets it
    (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``), and on a C
    library other than glibc."""
    libc = _glibc()
    if libc is None:
        return
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)

system_arrow_allocator()


_paused_lock = threading.Lock()
_paused = [0, False]        # calls inside collector_paused, and whether they disabled the collector


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a call builds a result of
    millions of containers (an export's ops: a dict, a list and a tuple a
    message, none in a cycle). Each full collection walks every tracked
    object of the process, and CPython runs one whenever the long-lived
    ones grew by a quarter: building the 1,000,000 ops of an export took
    ~29 of them, 9 of its 13 s. The collector runs again (if it ran when
    the first of such calls began) when the last one in any thread ends,
    whatever happened inside; nothing it would have freed is lost, only
    collected later. As it runs again, the objects made meanwhile (the
    export's ops, by then the caller's) are moved to the oldest generation
    (``gc.freeze()`` then ``gc.unfreeze()``: no walk), unless the process
    froze objects of its own: else the first young collection after walked
    them all at once, 1.7 s holding the GIL after an export of 1,000,000
    messages (a writer's appends beside it waited for it), and the next
    older one again."""
    with _paused_lock:
        if _paused[0] == 0:
            _paused[1] = gc.isenabled()
            gc.disable()
        _paused[0] += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused[0] -= 1
            if _paused[0] == 0 and _paused[1]:
                if gc.get_freeze_count() == 0:
                    gc.freeze()         # (every tracked object to the permanent generation,
                    gc.unfreeze()       # then all of them to the oldest)
                gc.enable()
