"""Opening a cool archive keeps glibc's malloc mapping Arrow's large
buffers (``sidecar._fix_mmap_threshold``): a block freed after the first
large ones goes back to the OS, instead of staying in the heap (the peak
of resident memory of a bulk load's cooling runs and merges)."""
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
libc.free(libc.malloc(8 << 20))     # a large block freed: the dynamic threshold would rise to 8 MiB
before = libc.mallinfo2().hblks
p = libc.malloc(1 << 20)            # a row group's buffer
print(libc.mallinfo2().hblks - before)
libc.free(p)
'''


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None,
                    reason="glibc's malloc, threshold not set by the environment")
def test_large_blocks_stay_mapped_after_an_archive_opens(tmp_path):
    try:
        os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        pytest.skip("not glibc")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)

    def mapped(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", CHILD, mode, str(tmp_path / mode)], env=env,
                             capture_output=True, text=True, check=True)
        return int(out.stdout.strip())
    assert mapped("default") == 0       # (glibc's dynamic threshold: from the heap)
    assert mapped("fixed") == 1         # mapped: unmapped again when freed
