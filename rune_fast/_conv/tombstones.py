"""Deletions: the tombstone file (read, appended, synced, refreshed by a viewer)
and what a deletion hides from every tier until a compaction erases it."""
from __future__ import annotations

import logging
import os
from typing import Sequence, cast


from .. import codec
from .._log import frame_many, scan_frames
from ..errors import CorruptStateCheckpointError, DurabilityError
from ..events import fdatasync_path
from ..records import payload_hash
from ..segments import (fsync_dir, quarantine_bytes)
from .common import (QUARANTINE_DIR, TOMBSTONES_NAME, _unlink)

from .host import Host

log = logging.getLogger("rune_fast")


class Tombstones(Host):
    """Tombstones and erasure bookkeeping (a mixin of the repository)."""

    def _load_tombstones(self) -> dict[str, str]:
        path = os.path.join(self.hot_dir, TOMBSTONES_NAME)
        self._tomb_path = path
        out: dict[str, str] = {}
        self._tomb_size = self._tomb_last = 0
        self._tomb_erased = 0           # tombstones before this offset: erased by a compaction
        self._tomb_unsynced = self._tomb_dir_unsynced = False
        self._unerased: list[str] = []
        self._tomb_hlcs: list[str] = []
        # (size, start of its last line) the manifest vouches for: synced before it was written
        vouched = self._manifest.get("tombstones_synced") or [0, 0]
        if not os.path.exists(path):
            if vouched[0] > 0:
                raise CorruptStateCheckpointError(
                    f"the tombstone file is missing; the manifest vouches for {vouched[0]} bytes of it",
                    path=path)
            return out
        with open(path, "rb") as f:
            data = f.read()
        self._tomb_size = len(data)
        scan = scan_frames(data)
        if scan.damaged_offset >= 0:
            raise CorruptStateCheckpointError(f"damaged tombstone line: {scan.damage}", path=path,
                                              offset=scan.damaged_offset)
        if scan.good_end < vouched[1]:
            # deletions before the last one the manifest vouches for are gone
            # (cut off or zeroed): they would come back; only the final line
            # may read as torn, as a crash leaves it
            raise CorruptStateCheckpointError(
                f"the tombstone file lost deletions the manifest vouches for: its complete lines "
                f"end at {scan.good_end}, the manifest's reach past {vouched[1]}", path=path,
                offset=scan.good_end)
        if scan.good_end < vouched[0] and scan.torn_offset < 0 and not self.read_only:
            # (a part left of it is quarantined and reported below)
            self._report_lost(path, vouched[0], "the final deletion the manifest vouches for is "
                              "gone (the message it deleted reads again)")
        if scan.torn_offset >= 0 and not self.read_only:
            torn = data[scan.torn_offset:].rstrip(b"\0")
            qpath = quarantine_bytes(os.path.join(self.hot_dir, QUARANTINE_DIR), path,
                                     scan.torn_offset, torn)
            self._quarantined.append({"path": path, "offset": scan.torn_offset,
                                      "length": len(torn), "quarantine": qpath})
            with open(path, "r+b") as f:
                f.truncate(scan.torn_offset)
                os.fsync(f.fileno())
        elif scan.good_end < len(data) and not self.read_only:
            # zero padding: cut it so the next tombstone follows the last line
            with open(path, "r+b") as f:
                f.truncate(scan.good_end)
                os.fsync(f.fileno())
        erased_upto = int(self._manifest.get("tombstones_erased", 0))
        self._tomb_erased = erased_upto
        # a killed "none" session may have left deletions (or the file's
        # folder entry) unsynced: synced before a manifest vouches for them
        self._tomb_unsynced = self._tomb_dir_unsynced = not self.read_only
        offsets = scan.offsets.tolist()
        self._tomb_size = scan.good_end if not self.read_only else len(data)
        self._tomb_last = offsets[-1] if offsets else 0
        for off, ln in zip(offsets, scan.lengths.tolist()):
            body = codec.decode_body(data[off + len(codec.TOMBSTONE_PREFIX) + 23: off + ln - 1],
                                     path=path, offset=off)
            out[body["msg_id"]] = body["channel_id"]
            self._tomb_hlcs.append(body["hlc"])
            if off >= erased_upto:
                self._unerased.append(body["msg_id"])
        return out

    def _sync_tombstones(self) -> None:
        """fdatasync the tombstones file (and fsync the folder that names it)
        if deletions since the last sync, or a session before this open that
        ``durability="none"`` let off, may not be on disk; lock held."""
        if (self._tomb_unsynced or self._tomb_dir_unsynced) and os.path.exists(self._tomb_path):
            if self._tomb_unsynced:
                fdatasync_path(self._tomb_path)
            if self._tomb_dir_unsynced:
                fsync_dir(self.hot_dir)
        self._tomb_unsynced = self._tomb_dir_unsynced = False

    def _delete_ids(self, ids: Sequence[str], *, record_unknown: bool,
                    hlcs: dict[str, str] | None = None, channels: dict[str, str] | None = None) -> int:
        """Tombstone ``ids`` (lock held): one sync for the batch. Returns how many
        stored messages were deleted. With ``record_unknown`` an id that is not
        stored is tombstoned too (a tombstone op merged ahead of its message)."""
        assert self._events is not None     # a writer always has its event store
        lines = []
        todo: list[tuple[str, str, int, bool]] = []  # (id, channel, loc, in_cool)
        for mid in dict.fromkeys(ids):
            if mid in self._tombstones:
                continue
            k = codec.key(mid)
            loc = self._index.find(k)
            channel = None
            in_cool = False
            if loc >= 0:
                channel = self._read_loc(loc).channel_id
            elif self._cool.contains(mid):
                in_cool = True
                channel = cast("dict", self._cool.get(mid))["channel_id"]   # contains() just found it
            elif record_unknown:
                channel = (channels or {}).get(mid, "")
            else:
                continue
            hlc = (hlcs or {}).get(mid) or str(self._clock.now())
            lines.append(codec.tombstone_rest(mid, channel, hlc))
            todo.append((mid, channel, loc, in_cool))
        if not todo:
            return 0
        data = frame_many(lines)
        fd = os.open(self._tomb_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            new_file = os.fstat(fd).st_size == 0
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.durability != "none":
                os.fdatasync(fd)
        except OSError as exc:
            self._writes.fail(exc)
            raise DurabilityError(f"write of tombstones to {self._tomb_path} failed: {exc}; the store "
                                  "refuses writes until reopened") from exc
        finally:
            os.close(fd)
        self._tomb_last = self._tomb_size + data.rfind(b"\n", 0, len(data) - 1) + 1
        self._tomb_size += len(data)
        self._tomb_unsynced = self.durability == "none"
        self._manifest_dirty = True     # its close records the tombstones it can vouch for
        if new_file:
            if self.durability != "none":
                fsync_dir(self.hot_dir)
            else:
                self._tomb_dir_unsynced = True
        deleted = 0
        for mid, channel, loc, in_cool in todo:
            self._tombstones[mid] = channel
            if loc >= 0:
                self._index.remove(codec.key(mid))
                self._decoded.pop(loc, None)
                self._dirty_segs.add(loc >> 40)
                self._pending_erase.add(mid)
                deleted += 1
            elif in_cool:
                self._cool_deleted.add(mid)
                self._pending_erase.add(mid)
                deleted += 1
        self._snap_changes += len(todo)
        # (after the reads see the deletions: the tombstones are durable, and
        # every read must agree with what the next open will read)
        try:
            for mid, channel, _loc, _in_cool in todo:
                self._events.append("conversation.deleted", mid, payload_hash({"msg_id": mid}),
                                    channel_id=channel)
            if self.durability != "none":
                self._events.sync()
        except (OSError, DurabilityError) as exc:
            self._writes.fail(exc)
            raise DurabilityError(f"journal of {len(todo)} deletion(s) in {self._events.path} failed: {exc}; "
                                  "the store refuses writes until reopened") from exc
        return deleted

    def _tombstone_hlcs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if not os.path.exists(self._tomb_path):
            return out
        with open(self._tomb_path, "rb") as f:
            data = f.read()
        scan = scan_frames(data)
        for off, ln in zip(scan.offsets.tolist(), scan.lengths.tolist()):
            body = codec.decode_body(data[off + len(codec.TOMBSTONE_PREFIX) + 23: off + ln - 1],
                                     path=self._tomb_path, offset=off)
            out[body["msg_id"]] = body["hlc"]
        return out

    def _refresh_tombstones(self) -> None:
        """Apply deletions the writer made since the tombstones were read."""
        try:
            size = os.path.getsize(self._tomb_path)
        except FileNotFoundError:
            return
        if size == self._tomb_size:
            return
        for mid, ch in self._load_tombstones().items():
            if mid in self._tombstones:
                continue
            self._tombstones[mid] = ch
            loc = self._index.remove(codec.key(mid))
            if loc >= 0:
                self._decoded.pop(loc, None)
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
