"""Opening a cool archive fixes glibc's malloc thresholds
(``rune_fast._memory.fix_malloc_thresholds``): a block of MMAP_THRESHOLD or more
stays mapped after larger ones were freed (goes back to the OS when
freed, instead of staying in the heap: the peak of resident memory of a
bulk load's cooling runs and merges), and the heap keeps up to
TRIM_THRESHOLD of free top for the next cooling part's buffers (which
glibc's default trims and faults in again)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = r'''
import ctypes, sys
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MI2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "fixed":
    from rune_fast import cool
    cool.CoolArchive(sys.argv[2]).close()       # (an open makes the choice)
    from rune_fast import _memory
    # blocks below the threshold, freed newest first into the heap's top
    blocks = [libc.malloc(3 << 20) for _ in range(3)]
    for b in reversed(blocks):
        libc.free(b)
    kept = libc.mallinfo2().keepcost
    blocks = [libc.malloc(3 << 20) for _ in range(7)]
    for b in reversed(blocks):
        libc.free(b)
    print(kept >= 8 << 20, libc.mallinfo2().keepcost < _memory.TRIM_THRESHOLD)
libc.free(libc.malloc(16 << 20))    # a large block freed: the dynamic threshold would rise to 16 MiB
before = libc.mallinfo2().hblks
p = libc.malloc(6 << 20)            # a block past MMAP_THRESHOLD
print(libc.mallinfo2().hblks - before)
libc.free(p)
'''


_SET_BY_ENV = any(os.environ.get(v) is not None for v in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"))


@pytest.mark.skipif(not sys.platform.startswith("linux") or _SET_BY_ENV,
                    reason="glibc's malloc, thresholds not set by the environment")
def test_large_blocks_stay_mapped_after_an_archive_opens(tmp_path):
    try:
        os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        pytest.skip("not glibc")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)

    def mapped(mode: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", CHILD, mode, str(tmp_path / mode)], env=env,
                             capture_output=True, text=True, check=True)
        return out.stdout.split("\n")
    assert mapped("default")[0] == "0"          # (glibc's dynamic threshold: from the heap)
    trim, mmap_ = mapped("fixed")[:2]
    assert mmap_ == "1"                         # mapped: unmapped again when freed
    assert trim == "True True"                  # 9 MiB of free top kept; 21 MiB trimmed


POOL_CHILD = r'''
import os, sys
if sys.argv[1] == "pyarrow-first":
    import pyarrow
first = None if "pyarrow" not in sys.modules else sys.modules["pyarrow"].default_memory_pool().backend_name
import rune_fast
import pyarrow as pa
print(first, pa.default_memory_pool().backend_name, os.environ.get("ARROW_DEFAULT_MEMORY_POOL"))
'''


def test_rune_fast_loads_pyarrow_with_the_system_allocator(tmp_path):
    """``import rune_fast`` loads pyarrow with malloc as Arrow's default
    allocator (the C++ library's too, not only pyarrow's), and leaves the
    environment as it found it; a choice the environment made is kept, and
    a pyarrow loaded before keeps its allocator."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env["PYTHONPATH"] = root

    def run(mode: str, **extra: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", POOL_CHILD, mode], env=dict(env, **extra),
                             capture_output=True, text=True, check=True)
        return out.stdout.split()

    assert run("rune-first") == ["None", "system", "None"]
    first, now, var = run("pyarrow-first")
    assert first == now and var == "None"
    assert run("rune-first", ARROW_DEFAULT_MEMORY_POOL="mimalloc")[1:] == ["mimalloc", "mimalloc"]
