"""Background archive work (a cooling run, a merge of cool files): the job
object a compaction starts and the next one adopts or discards."""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from ..cool import CoolArchive


class _Staged:
    """Archive work done by a background thread: a cooling run (``kind``
    "cool": the lines were copied under the repository lock; the thread
    makes their table and :meth:`CoolArchive.stage_table` writes and syncs
    their Parquet file without it)
    or a merge of cool files ("merge": :meth:`CoolArchive.stage_merge`). The
    next compaction adopts the result, or discards it. Until then its files
    are strays that no manifest names (a crash leaves them to the next open)."""

    def __init__(self, kind: str, work: Callable[["_Staged"], Any], locs: Sequence[int] = ()) -> None:
        self.kind = kind
        self.locs = locs
        self.table: Any = None  # a cooling run's rows, in the order of locs (set by its thread)
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(work,), name=f"rune-fast-{kind}",
                                       daemon=True)
        self.thread.start()

    def _run(self, work: Callable[["_Staged"], Any]) -> None:
        try:
            self.result = work(self)
        except BaseException as exc:   # reported by the compaction that settles the job
            self.error = exc
        finally:
            self.done.set()

    def discard(self, cool: CoolArchive) -> None:
        if self.result is not None:
            if self.kind == "cool":
                cool.discard(self.result)
            else:
                cool.discard_merge(self.result)


