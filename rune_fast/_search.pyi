# Types of rune_fast._search, compiled from csrc/_search.pyx (kept by hand:
# a change of a signature there changes it here).
import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

def find_spans(data: Buffer, starts: npt.ArrayLike, ends: npt.ArrayLike, needle: Buffer,
               ignore_ascii_case: bool = False,
               nonascii_candidates: bool = False) -> npt.NDArray[np.int64]: ...
def block_grams(data: Buffer, offsets: Buffer | npt.NDArray[np.int32], block_rows: int,
                nbits: int = 4096) -> bytes: ...
def gram_blocks(grams: Buffer, nbits: int, needle: Buffer) -> npt.NDArray[np.int64]: ...
