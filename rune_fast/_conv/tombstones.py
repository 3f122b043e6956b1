"""Deletions: the tombstone file (read, appended, synced, refreshed by a viewer)
and what a deletion hides from every tier until a compaction erases it."""
from __future__ import annotations

import logging
import os
from typing import Callable, Sequence


from .. import codec
from .._log import frame_many, scan_frames
from ..errors import CorruptStateCheckpointError, DurabilityError
from ..events import fdatasync_path
from ..segments import (fsync_dir, quarantine_bytes)
from .common import (QUARANTINE_DIR, TOMBSTONES_NAME, _unlink)

from .host import Host

log = logging.getLogger("rune_fast")


def _cut(fd: int, start: int) -> bool:
    """Cut the file open at ``fd`` back to ``start`` bytes, durably; False
    if it failed (shrinking a file needs no free space, but an I/O error
    can still refuse it)."""
    try:
        os.ftruncate(fd, start)
        os.fdatasync(fd)
        return True
    except OSError:
        return False


class TombstoneFile:
    """The tombstone file ``conversation_tombstones.jsonl``: its size, the
    start of its last line, how far a compaction erased (all the manifest
    records of it), whether it awaits a sync, and what the open read
    (``unerased`` ids, every ``hlcs`` stamp). A new one is made at each
    (re)load of the state; only its methods change it."""

    def __init__(self, hot_dir: str, *, writer: bool, durability: str) -> None:
        self._hot_dir = hot_dir
        self._writer = writer
        self._durability = durability
        self.path = os.path.join(hot_dir, TOMBSTONES_NAME)
        self.size = self.last = 0
        self.erased = 0                 # tombstones before this offset: erased by a compaction
        self._unsynced = self._dir_unsynced = False
        self.unerased: list[str] = []   # deleted ids a compaction has not erased yet
        self.hlcs: list[str] = []

    def load(self, manifest: dict, *, report_lost: Callable[..., None], quarantined: list[dict]) -> dict[str, str]:
        """Read the file (a writer cuts a torn final line, quarantined and
        noted in ``quarantined``, or zero padding): msg_id -> channel_id of
        every deletion. What the manifest vouches for must be there."""
        path = self.path
        out: dict[str, str] = {}
        # (size, start of its last line) the manifest vouches for: synced before it was written
        vouched = manifest.get("tombstones_synced") or [0, 0]
        if not os.path.exists(path):
            if vouched[0] > 0:
                raise CorruptStateCheckpointError(
                    f"the tombstone file is missing; the manifest vouches for {vouched[0]} bytes of it",
                    path=path)
            return out
        with open(path, "rb") as f:
            data = f.read()
        self.size = len(data)
        scan = scan_frames(data)
        torn_at = scan.torn_offset
        if scan.damaged_offset >= 0:
            bad = data[scan.damaged_offset:data.find(b"\n", scan.damaged_offset)]
            if scan.damaged_offset < vouched[0] or b"\0" not in bad:
                raise CorruptStateCheckpointError(f"damaged tombstone line: {scan.damage}", path=path,
                                                  offset=scan.damaged_offset)
            # past what the manifest vouches for, a line holding zeros is a
            # deletion a power loss tore (a page lost before a later one
            # kept): never acknowledged (each deletion is synced before it
            # returns, and a sync covers every earlier byte), nor any after it
            torn_at = scan.damaged_offset
        if scan.good_end < vouched[1]:
            # deletions before the last one the manifest vouches for are gone
            # (cut off or zeroed): they would come back; only the final line
            # may read as torn, as a crash leaves it
            raise CorruptStateCheckpointError(
                f"the tombstone file lost deletions the manifest vouches for: its complete lines "
                f"end at {scan.good_end}, the manifest's reach past {vouched[1]}", path=path,
                offset=scan.good_end)
        if scan.good_end < vouched[0] and torn_at < 0 and self._writer:
            # (a part left of it is quarantined and reported below)
            report_lost(path, vouched[0], "the final deletion the manifest vouches for is "
                              "gone (the message it deleted reads again)")
        if torn_at >= 0 and self._writer:
            torn = data[torn_at:].rstrip(b"\0")
            qpath = quarantine_bytes(os.path.join(self._hot_dir, QUARANTINE_DIR), path, torn_at, torn)
            quarantined.append({"path": path, "offset": torn_at,
                                "length": len(torn), "quarantine": qpath})
            with open(path, "r+b") as f:
                f.truncate(torn_at)
                os.fsync(f.fileno())
        elif scan.good_end < len(data) and self._writer:
            # zero padding: cut it so the next tombstone follows the last line
            with open(path, "r+b") as f:
                f.truncate(scan.good_end)
                os.fsync(f.fileno())
        erased_upto = int(manifest.get("tombstones_erased", 0))
        self.erased = erased_upto
        # a killed "none" session may have left deletions (or the file's
        # folder entry) unsynced: synced before a manifest vouches for them
        self._unsynced = self._dir_unsynced = self._writer
        offsets = scan.offsets.tolist()
        self.size = scan.good_end if self._writer else len(data)
        self.last = offsets[-1] if offsets else 0
        for off, ln in zip(offsets, scan.lengths.tolist()):
            body = codec.decode_body(data[off + len(codec.TOMBSTONE_PREFIX) + 23: off + ln - 1],
                                     path=path, offset=off)
            out[body["msg_id"]] = body["channel_id"]
            self.hlcs.append(body["hlc"])
            if off >= erased_upto:
                self.unerased.append(body["msg_id"])
        return out

    def sync(self) -> None:
        """fdatasync the file (and fsync the folder that names it) if
        deletions since the last sync, or a session before this open that
        ``durability="none"`` let off, may not be on disk; lock held."""
        if (self._unsynced or self._dir_unsynced) and os.path.exists(self.path):
            if self._unsynced:
                fdatasync_path(self.path)
            if self._dir_unsynced:
                fsync_dir(self._hot_dir)
        self._unsynced = self._dir_unsynced = False

    def write(self, data: bytes) -> int:
        """Append framed tombstone lines (synced unless in "none" mode);
        return the file's size before them (0: the file was new). An
        OSError cuts what it wrote (:meth:`undo`) and leaves the counts as
        they were."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            start = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if self._durability != "none":
                    os.fdatasync(fd)
            except OSError:
                _cut(fd, start)
                raise
        finally:
            os.close(fd)
        return start

    def undo(self, start: int) -> bool:
        """Cut the lines a :meth:`write` that returned ``start`` appended
        (the journal of their deletions failed: the call that wrote them
        fails, and its deletions must not come back at the next open).
        False if the cut itself failed (they may then take effect)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return _cut(fd, start)
        finally:
            os.close(fd)

    def wrote(self, data: bytes, new_file: bool) -> None:
        """Count the lines :meth:`write` appended; a new file's folder entry
        is synced (or left for the next sync in "none" mode)."""
        self.last = self.size + data.rfind(b"\n", 0, len(data) - 1) + 1
        self.size += len(data)
        self._unsynced = self._durability == "none"
        if new_file:
            if self._durability != "none":
                fsync_dir(self._hot_dir)
            else:
                self._dir_unsynced = True

    def erased_all(self) -> None:
        """A compaction erased every deletion so far."""
        self.erased = self.size

    def manifest_fields(self) -> dict:
        """What the manifest records of the file (a sync comes first: it vouches for them)."""
        return {"tombstones_erased": self.erased, "tombstones_synced": [self.size, self.last]}

    def grown(self) -> bool:
        """Whether the file on disk is not the size read (a viewer's writer deleted more)."""
        try:
            return os.path.getsize(self.path) != self.size
        except FileNotFoundError:
            return False

    def hlcs_by_id(self) -> dict[str, str]:
        """msg_id -> hlc of every tombstone in the file (read now)."""
        out: dict[str, str] = {}
        if not os.path.exists(self.path):
            return out
        with open(self.path, "rb") as f:
            data = f.read()
        scan = scan_frames(data)
        for off, ln in zip(scan.offsets.tolist(), scan.lengths.tolist()):
            body = codec.decode_body(data[off + len(codec.TOMBSTONE_PREFIX) + 23: off + ln - 1],
                                     path=self.path, offset=off)
            out[body["msg_id"]] = body["hlc"]
        return out


class Tombstones(Host):
    """Tombstones and erasure bookkeeping (a mixin of the repository)."""

    # ---- the state this room owns: written here only (tests/test_ownership.py)

    def _reset_tombstone_state(self, tombstones: dict[str, str]) -> None:
        """The deletions as loaded: ``tombstones`` (msg_id -> channel_id)."""
        self._tombstones = tombstones
        self._pending_erase = set()    # deleted ids whose bytes are still on disk
        self._dirty_segs = set()       # segments holding lines of deleted messages
        self._cool_deleted = set()     # deleted ids still present in a cool file
        # deleted ids no tier was found to hold (see _note_unerased)
        self._unlocated = set()

    def _note_unerased(self) -> None:
        """Deletions whose erasure no compaction has finished yet: the cool rows
        are hidden, and the next compaction looks for any hot line left."""
        for mid in self._tombfile.unerased:
            self._pending_erase.add(mid)
            if self._cool.contains(mid):
                self._cool_deleted.add(mid)
            else:
                self._unlocated.add(mid)

    def _mark_erasable(self, mid: str, seg: int) -> None:
        """The deleted ``mid`` still has its line in segment ``seg``."""
        self._pending_erase.add(mid)
        self._dirty_segs.add(seg)

    def _mark_dirty(self, seg: int) -> None:
        """Segment ``seg`` holds the dead line of a deleted message."""
        self._dirty_segs.add(seg)

    def _erasures_done(self) -> None:
        """A compaction erased every pending deletion."""
        self._dirty_segs.clear()
        self._pending_erase.clear()
        self._unlocated.clear()
        self._cool_deleted.clear()

    def _load_tombstones(self) -> dict[str, str]:
        """Read the tombstone file anew (a new TombstoneFile): msg_id -> channel_id."""
        tf = TombstoneFile(self.hot_dir, writer=not self.read_only, durability=self.durability)
        self._tombfile = tf
        return tf.load(self._manifest, report_lost=self._report_lost, quarantined=self._quarantined)

    def _sync_tombstones(self) -> None:
        self._tombfile.sync()

    def _delete_ids(self, ids: Sequence[str], *, record_unknown: bool,
                    hlcs: dict[str, str] | None = None, channels: dict[str, str] | None = None,
                    stored_in: str | None = None) -> int:
        """Tombstone ``ids`` (lock held): one sync for the batch. Returns how many
        stored messages were deleted. With ``record_unknown`` an id that is not
        stored is tombstoned too (a tombstone op merged ahead of its message).
        ``stored_in``: the channel every one of ``ids`` is stored in (the
        caller read them under the lock): none is read again."""
        assert self._events is not None     # a writer always has its event store
        lines = []
        todo: list[tuple[str, str, int, bool]] = []  # (id, channel, loc, in_cool)
        for mid in dict.fromkeys(ids):
            if mid in self._tombstones:
                continue
            k = codec.key(mid)
            loc = self._index.find(k)
            channel: str
            in_cool = False
            if loc >= 0:
                channel = self._read_loc(loc).channel_id if stored_in is None else stored_in
            elif stored_in is not None:
                in_cool, channel = True, stored_in
            else:
                rec = self._cool_exact(mid)
                if rec is not None:
                    in_cool, channel = True, rec.channel_id
                elif record_unknown:
                    channel = (channels or {}).get(mid, "")
                else:
                    continue
            todo.append((mid, channel, loc, in_cool))
        if not todo:
            return 0
        given = hlcs or {}
        # (the clock read once for the batch: ~3 us a deletion a call)
        stamps = iter(self._clock.now_many(sum(1 for t in todo if not given.get(t[0]))))
        for mid, channel, _loc, _in_cool in todo:
            lines.append(codec.tombstone_rest(mid, channel, given.get(mid) or str(next(stamps))))
        data = frame_many(lines)
        tf = self._tombfile
        try:
            start = tf.write(data)
        except OSError as exc:
            self._writes.fail(exc)
            raise DurabilityError(f"write of tombstones to {tf.path} failed: {exc}; the store "
                                  "refuses writes until reopened") from exc
        # the journal, before any read sees the deletions: a call that fails
        # takes none of them (its tombstones are cut again), so what the
        # reads of this session and of the next open see agrees
        try:
            # (one write for the batch: a clear_channel of 123,000 messages spent ~1 s on one a line)
            self._events.append_encoded(self._events.encode_deleted((t[0], t[1]) for t in todo),
                                        offset=False)
            if self.durability != "none":
                self._events.sync()
        except (OSError, DurabilityError) as exc:
            self._writes.fail(exc)
            undone = tf.undo(start)
            raise DurabilityError(
                f"journal of {len(todo)} deletion(s) in {self._events.path} failed: {exc}; "
                + ("the deletions did not take effect" if undone else
                   f"their tombstones in {tf.path} could not be cut: they take effect at the next open")
                + "; the store refuses writes until reopened") from exc
        self._mark_manifest_dirty()     # its close records the tombstones it can vouch for
        tf.wrote(data, start == 0)
        deleted = 0
        for mid, channel, loc, in_cool in todo:
            self._tombstones[mid] = channel
            if loc >= 0:
                self._unindex(mid)
                self._forget_decoded(loc)
                self._dirty_segs.add(loc >> 40)
                self._pending_erase.add(mid)
                deleted += 1
            elif in_cool:
                self._cool_deleted.add(mid)
                self._pending_erase.add(mid)
                deleted += 1
        self._count_changes(len(todo))
        return deleted

    def _refresh_tombstones(self) -> None:
        """Apply deletions the writer made since the tombstones were read."""
        if not self._tombfile.grown():
            return
        for mid, ch in self._load_tombstones().items():
            if mid in self._tombstones:
                continue
            self._tombstones[mid] = ch
            loc = self._unindex(mid)
            if loc >= 0:
                self._forget_decoded(loc)
            elif self._cool.contains(mid):
                self._cool_deleted.add(mid)

    def _erase_quarantined(self, ids: set[str]) -> None:
        """Unlink the quarantined torn lines of deleted messages: a line cut
        short by a crash names its message before its content, so a file
        holding a deleted id's record is the only one that can hold its
        content (SPEC: after the erasing compaction no file holds it)."""
        needles = [b'"msg_id":"' + codec.key(m) + b'"' for m in ids]
        removed = False
        for path, data in self._torn_lines():
            if any(n in data for n in needles):
                _unlink(path)
                removed = True
                log.info("erased quarantined line %s: it held a deleted message", path)
        if removed:
            fsync_dir(os.path.join(self.hot_dir, QUARANTINE_DIR))
