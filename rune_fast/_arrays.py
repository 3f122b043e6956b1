"""Array helpers shared by the tiers' read paths."""
from __future__ import annotations

from typing import Any

import numpy as np


def unique(values: Any) -> np.ndarray:
    """The distinct values of a 1-D array (or a sequence), ascending: what
    ``np.unique(values)`` returns. numpy 2's np.unique imports numpy.ma at
    its first call (~0.9 MB resident in every reading process, 9 bytes a
    message of a 100,000-message store's read mix); this sort does not."""
    a = np.sort(np.asarray(values).ravel())
    if len(a) < 2:
        return a
    keep = np.empty(len(a), dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]
