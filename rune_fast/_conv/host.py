"""The repository's attributes, declared once by the room that writes them.

The rooms of :mod:`rune_fast._conv` that are still mixins of
``ConversationStateRepository`` (every one but :class:`WriteThread`) read
and write the attributes below. Declaring them here, grouped by the room
that owns (writes) them, gives the type checker their types and gives a
reader the map of who may change what; a room reads another's state but
changes it only through that room's methods. ``Host`` is what each mixin
subclasses: these declarations for the type checker (plus ``Any`` for the
methods the other rooms define), a plain ``object`` at run time.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading
    from .._encode import FrameBuffer
    from .._index import HotIndex, LocCache
    from ..atomic import AtomicStore
    from ..cool import CoolArchive
    from ..events import EventStore
    from ..locking import DirLock
    from ..segments import Segment, TailFile
    from .. import sync as _sync
    from .common import CompactionReport
    from .staging import _Chore, _Staged
    from .tombstones import TombstoneFile
    from .maps import MapBudget
    from .write_thread import WriteThread


class RepoState:
    """Annotations only: no value, no behaviour."""

    # the facade (conversation_state.py): options, the lock, lifecycle
    state_dir: str
    hot_dir: str
    durability: str
    compact_every: int
    hot_window: int
    cache_bytes: int | None
    read_only: bool
    _lock: threading.RLock
    _closed: bool
    _lockfile: DirLock | None
    _own_events: bool
    _events: EventStore | None
    _events_private: bool
    _events_path: str | None

    # recovery.py: the live file set as the manifest names it, and what the open found
    _manifest_store: AtomicStore
    _manifest: dict
    _clock: _sync.HlcClock
    _writes: WriteThread
    _reloads: int
    _covered: int
    _covered_events: int
    _tail_seg: int
    _next_seg: int
    _next_seq: int
    _segs: dict[int, Segment]
    _seg_order: list[int]
    _seg_ends: dict[int, int]
    _tail: TailFile | None
    _cool: CoolArchive
    _cool_max: dict[str, tuple]
    _quarantined: list[dict]
    _lost: list[dict]
    _uncovered: tuple[int, int, list[str]] | None
    _rejournaled: int
    _vouched: dict[int, int]

    # snapshot.py: the hot index and its snapshot on disk
    _index: HotIndex
    _snap_events: int
    _snap_files: tuple | None
    _snap_changes: int
    _tail_read: int

    # tombstones.py: deletions and what waits for erasure
    _tombstones: dict[str, str]
    _tombfile: TombstoneFile
    _pending_erase: set[str]
    _dirty_segs: set[int]
    _cool_deleted: set[str]
    _unlocated: set[str]

    # reads.py: decode caches, mapped pages, order verdicts
    _decoded: LocCache
    _cool_decoded: LocCache
    _cool_dense: LocCache
    _cache_now: int
    _cache_rescale_left: int
    _maps: MapBudget
    _interleaved: dict[str, bool]
    _task_asks: dict[str, int]
    _task_clock: int

    # search.py: what search has checked and kept
    _lines_checked: set[int]
    _tail_checked: tuple[int, int]
    _filters_read: bool
    _filters_kept: dict[int, int]
    _ragged: set[int]
    _special_cache: dict[int, dict[str, tuple[int, list[int]]]]

    # compaction.py and cooling.py: the schedule, the manifest checkpoint, staged work
    _since_compact: int
    _segs_unchecked: bool
    _rewrite_due: bool      # an adoption left the segment rewrite to the next compactions
    _sync_owed: bool        # a compaction has yet to end the batch's tail sync (see _sync_first)
    _manifest_dirty: bool
    _compactions: int
    _last_compaction: CompactionReport | None
    _bg: _Staged | None         # a cooling run written by a thread
    _bg_merge: _Staged | None   # a merge of cool files written by another
    _cool_backlog: int          # excess the last cooling run left for the next (0: caught up)
    _chore: _Chore | None
    _behind: set[str] | None
    _clock_nows: int
    _clock_unheld: bool
    _idle_stop: threading.Event     # set at close: the idle watcher ends

    # exchange.py: fold-order verdicts, archive files' and channels' newest stamps
    _fold_order: dict[str, list]
    _export_tops: dict[int, tuple]
    _stamp_tops: dict[str, tuple[tuple[int, ...], bool, list[tuple[tuple, int]]]]
    _hot_tops: dict[str, tuple[Any, bool, list[tuple[tuple, tuple[int]]]]]

    # writes.py: the room a batch's tail lines are framed in (see WritePath)
    _frame_buf: FrameBuffer | None


if TYPE_CHECKING:
    class Host(RepoState, Any):  # type: ignore[misc]
        """The declarations, and Any for the methods of the other rooms."""
else:
    Host = object
