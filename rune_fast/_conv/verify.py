"""verify(): a full check of every tier that raises nothing and reports every
problem with its file and offset."""
from __future__ import annotations

import hashlib
import logging
import os
import time
from contextlib import contextmanager, nullcontext
from typing import Iterator


from .._index import HotIndex
from .._log import scan_frames
from ..errors import CorruptStateCheckpointError, RuneError
from ..events import EventStore
from ..records import payload_hash
from .common import (SNAPSHOT_NAME, _OFF_MASK, _REPEATED, _VIEWER_ATTEMPTS, Problem, VerifyReport,
                     _noted)

from .host import Host

log = logging.getLogger("rune_fast")


class Verify(Host):
    """The integrity check (a mixin of the repository)."""

    def _verify(self) -> VerifyReport:
        report = self._verify_once()
        attempt = 0
        while self.read_only and not report.ok and attempt < _VIEWER_ATTEMPTS - 1:
            with self._lock:
                if self._closed or not self._stale_view():
                    break
                try:
                    self._load_state()
                except CorruptStateCheckpointError as exc:     # the new state is damaged
                    return VerifyReport(ok=False, problems=[Problem(exc.path or self.hot_dir, exc.offset,
                                                                    str(exc))], checked=report.checked)
            time.sleep(0.001 * min(attempt, 10))
            attempt += 1
            report = self._verify_once()
        with self._lock:
            if not self._closed:
                self._bound_maps()      # the check read every line through the maps
        return report

    def _verify_once(self) -> VerifyReport:
        """The check in three steps: the hot tier under the lock (its
        segments, the index rebuilt and the live one decoded: ~50,000 lines
        at most by the hot window), the archive a file at a time (a writer
        takes its lock to choose each file and reads the file without it,
        so appends and compactions go on; a compaction that would unlink
        that file waits for its check. A viewer holds its lock throughout:
        its reads would reload state under it), then the event store (read
        to where its complete lines ended) against the records' payload
        hashes."""
        problems: list[Problem] = []
        checked: dict[str, int] = {"lines": 0, "cool_rows": 0, "envelopes": 0, "records": 0}
        hashes: dict[str | None, str] = {}     # msg_id -> payload hash
        with self._lock if self.read_only else nullcontext():
            with self._lock:
                self._check_open()
                self._verify_hot(problems, checked, hashes)
                gone = set(self._cool_deleted)
                cool, events = self._cool, self._events

            def sound(mid: str, canonical: bytes) -> None:     # for the envelope check below
                if mid not in gone:
                    hashes[mid] = hashlib.sha256(canonical).hexdigest()     # (its payload_hash)
            with _noted(problems, cool.cool_dir, "cool archive check"):
                for p in cool.verify(checked, sound, self._held_open):
                    problems.append(Problem(cool.path_of(p.file), p.row, p.problem))
            checked["records"] = len(hashes)
            if events is not None:
                self._verify_events(events, problems, checked, hashes)
            elif self._events_path is not None and os.path.exists(self._events_path):
                # a viewer reads the writer's event store as it is: an append
                # in flight may have its line before its envelope is complete
                with _noted(problems, self._events_path, "event store check"):
                    with EventStore(self._events_path, read_only=True) as theirs:
                        self._verify_events(theirs, problems, checked, hashes, every=False)
        return VerifyReport(ok=not problems, problems=problems, checked=checked)

    @contextmanager
    def _held_open(self) -> Iterator[None]:
        """The repository's lock, on an open repository (StoreClosedError)."""
        with self._lock:
            self._check_open()
            yield

    def _verify_hot(self, problems: list[Problem], checked: dict[str, int], hashes: dict) -> None:
        """The hot tier's check (lock held): every segment's lines, the index
        rebuilt from them, the snapshot, and every indexed line decoded from
        its bytes, its payload hash in ``hashes``."""
        files = [(seg, self._segs[seg].path, self._segs[seg].buf, self._segs[seg].size)
                 for seg in self._seg_order]
        if self._tail is not None:
            files.append((self._tail_seg, self._tail.path, self._tail.buf, self._tail.size))
        fresh = HotIndex()
        for seg, path, buf, size in files:
            scan = scan_frames(buf if buf is not None else b"", 0, size)
            checked["lines"] += len(scan.offsets)
            if scan.damaged_offset >= 0:
                problems.append(Problem(path, scan.damaged_offset, f"damaged line: {scan.damage}"))
            if scan.torn_offset >= 0:
                problems.append(Problem(path, scan.torn_offset, "final line cut short"))
        try:
            for seg, path, buf, size in files:
                fresh.attach(seg, buf)
            seq = -1
            for seg, path, buf, size in files:
                rep = fresh.ingest(seg, 0, size, seq)
                seq = rep.last_seq
                if rep.damaged_offset >= 0 and rep.damage.startswith("append sequence"):
                    problems.append(Problem(path, rep.damaged_offset, f"damaged line: {rep.damage}"))
                for loc in rep.dup_locs.tolist():
                    problems.append(Problem(path, loc & _OFF_MASK, _REPEATED))
        except RuneError as exc:
            problems.append(Problem(self.hot_dir, None, f"index rebuild failed: {exc}"))
        # index snapshot against the tail
        snap_path = os.path.join(self.hot_dir, SNAPSHOT_NAME)
        if os.path.exists(snap_path):
            with _noted(problems, snap_path, "index snapshot check"):
                try:
                    HotIndex.load_snapshot(snap_path, lazy_tasks=False)
                except CorruptStateCheckpointError as exc:
                    problems.append(Problem(snap_path, getattr(exc, "offset", None), str(exc)))
        # live index against the files: every indexed line verifies and
        # decodes (from its bytes: not the decode cache's record)
        with _noted(problems, self.hot_dir, "index check"):
            for ch in list(self._index.channels()):
                for loc in self._index.channel_locs(ch, -1).tolist():
                    try:
                        rec, _seq = self._decode_loc(loc)
                        hashes[rec.msg_id] = payload_hash(rec)
                    except CorruptStateCheckpointError as exc:
                        problems.append(Problem(self._path_of(loc >> 40), loc & ((1 << 40) - 1), str(exc)))

    def _verify_events(self, events: EventStore, problems: list[Problem], checked: dict[str, int], hashes: dict,
                       every: bool = True) -> None:
        """The event store's lines and envelopes, each message's against its
        record's payload hash (``hashes``), and (``every``: a writer's, whose
        envelopes are written with its records) every record journaled."""
        try:
            journaled: set = set()
            unmatched: list[Problem] = []

            def enveloped(env: dict) -> None:     # each sound envelope, in the check's one pass
                checked["envelopes"] += 1
                if env.get("type") != "conversation.message":
                    return
                mid = env.get("id")
                journaled.add(mid)
                if mid in hashes and env.get("payload_hash") != hashes[mid]:
                    unmatched.append(Problem(events.path, env.get("offset"),
                                             f"envelope of {mid} does not match its record"))
            damage = events.verify(enveloped)
            problems += [Problem(ep["path"], ep["offset"], ep["problem"]) for ep in damage]
            problems += unmatched
            unjournaled = [mid for mid in hashes if mid not in journaled]
            if unjournaled and every and not damage:  # (a damaged line may be the envelope: named above)
                problems.append(Problem(
                    events.path, events.size,
                    f"{len(unjournaled)} stored message(s) have no envelope, e.g. "
                    f"{', '.join(map(repr, unjournaled[:3]))}"))
        except CorruptStateCheckpointError as exc:
            if not any(p.file == events.path and p.offset == exc.offset for p in problems):
                problems.append(Problem(events.path, exc.offset, str(exc)))
        except (OSError, RuneError) as exc:     # (a file gone or replaced by another kind)
            problems.append(Problem(events.path, None, f"event store check failed: {exc!r}"))

