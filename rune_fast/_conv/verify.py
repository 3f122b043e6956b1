"""verify(): a full check of every tier that raises nothing and reports every
problem with its file and offset."""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
from array import array
from contextlib import contextmanager, nullcontext
from typing import Iterator

import numpy as np
from xxhash import xxh3_128_digest

from .._index import HotIndex
from .._log import scan_frames
from ..errors import CorruptStateCheckpointError, RuneError
from ..events import EventStore
from ..records import payload_hash
from .common import (SNAPSHOT_NAME, _OFF_MASK, _REPEATED, _VIEWER_ATTEMPTS, Problem, VerifyReport,
                     _noted)

from .host import Host
from .reads import HotCopy

log = logging.getLogger("rune_fast")

#: a record's entry of PayloadHashes: its id's 128-bit xxh3 (two halves),
#: the first 8 bytes of its payload hash; an envelope's: the same, and its
#: offset
_REC = np.dtype([("a", "<u8"), ("b", "<u8"), ("h", "<u8")])
_ENV = np.dtype([("a", "<u8"), ("b", "<u8"), ("h", "<u8"), ("o", "<i8")])
_OFFSET = struct.Struct("<q")


def _id_key(mid: str) -> bytes:
    return xxh3_128_digest(mid.encode("utf-8", "surrogatepass"))


def _by_key(entries: np.ndarray) -> np.ndarray:
    """The order of ``entries`` by their id keys (those of one key in their order)."""
    return np.lexsort((entries["b"], entries["a"]))


def _lookup(keys: np.ndarray, qa: np.ndarray, qb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(at, found)``: for each key ``(qa, qb)``, the first place in
    ``keys`` (sorted by :func:`_by_key`) holding it, and whether one does.
    Searched by the first half; another key sharing it (one pair in ~10^13
    at 1,000,000 ids) is told apart by a step along its run."""
    n = len(keys)
    pos = np.searchsorted(keys["a"], qa)
    at = np.minimum(pos, max(n - 1, 0))
    if not n:
        return at, np.zeros(len(qa), dtype=bool)
    near = keys["a"][at] == qa
    found = near & (keys["b"][at] == qb)
    for k in np.flatnonzero(near & ~found).tolist():
        j = int(pos[k])
        while j < n and keys["a"][j] == qa[k]:
            if keys["b"][j] == qb[k]:
                at[k], found[k] = j, True
                break
            j += 1
    return at, found


def _firsts(keys: np.ndarray) -> np.ndarray:
    """The place of each key's first entry in ``keys`` (sorted by :func:`_by_key`)."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    a, b = keys["a"], keys["b"]
    return np.flatnonzero(np.concatenate([[True], (a[1:] != a[:-1]) | (b[1:] != b[:-1])]))


class PayloadHashes:
    """Each checked record's payload hash by its msg_id, for the envelope
    check, in buffers: the id's 128-bit xxh3 and the hash's first 8 bytes
    (24 bytes), and the id to name it (~45): a dict of the ids and hex
    hashes held ~250 bytes a record (a writer's verify of 1,000,000
    messages grew ~490 MB, and kept half of it after)."""

    def __init__(self) -> None:
        self._recs = bytearray()
        self._ids = bytearray()
        self._ends = array("q")

    def add(self, mid: str, digest: bytes) -> None:
        """``digest``: the payload hash's bytes (the first 8 at least; the
        id key's bytes read as two little-endian halves)."""
        b = mid.encode("utf-8", "surrogatepass")
        self._recs += xxh3_128_digest(b)
        self._recs += digest[:8]
        self._ids += b
        self._ends.append(len(self._ids))

    def add_hex(self, mid: str, hexdigest: str) -> None:
        self.add(mid, bytes.fromhex(hexdigest[:16]))

    def sorted(self) -> tuple[np.ndarray, np.ndarray]:
        """The entries by id key (those of one id in the order added) and
        where each was added."""
        recs = np.frombuffer(bytes(self._recs), dtype=_REC)
        order = _by_key(recs)
        return recs[order], order

    def mid(self, i: int) -> str:
        """The id of the ``i``-th entry added."""
        start = self._ends[i - 1] if i else 0
        return bytes(self._ids[start:self._ends[i]]).decode("utf-8", "surrogatepass")


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
        hashes = PayloadHashes()
        with self._lock if self.read_only else nullcontext():
            with self._lock:
                self._check_open()
                lines = self._verify_hot(problems, checked)
                gone = set(self._cool_deleted)
                cool, events = self._cool, self._events
            self._verify_hot_lines(lines, problems, hashes)
            del lines

            def sound(mid: str, canonical: bytes) -> None:     # for the envelope check below
                if mid not in gone:
                    hashes.add(mid, hashlib.sha256(canonical).digest())     # (its payload_hash)
            with _noted(problems, cool.cool_dir, "cool archive check"):
                for p in cool.verify(checked, sound, self._held_open):
                    problems.append(Problem(cool.path_of(p.file), p.row, p.problem))
            recs, order = hashes.sorted()
            checked["records"] = len(_firsts(recs))
            if events is not None:
                self._verify_events(events, problems, checked, hashes, recs, order)
            elif self._events_path is not None and os.path.exists(self._events_path):
                # a viewer reads the writer's event store as it is: an append
                # in flight may have its line before its envelope is complete
                with _noted(problems, self._events_path, "event store check"):
                    with EventStore(self._events_path, read_only=True) as theirs:
                        self._verify_events(theirs, problems, checked, hashes, recs, order, every=False)
        return VerifyReport(ok=not problems, problems=problems, checked=checked)

    @contextmanager
    def _held_open(self) -> Iterator[None]:
        """The repository's lock, on an open repository (StoreClosedError)."""
        with self._lock:
            self._check_open()
            yield

    def _verify_hot(self, problems: list[Problem], checked: dict[str, int]) -> list[HotCopy]:
        """The hot tier's check (lock held): every segment's lines, the index
        rebuilt from them, the snapshot, and every indexed line checked;
        returns the indexed lines' copies (:class:`HotCopy`), for
        :meth:`_verify_hot_lines` (without the lock: ~0.3 s of the 0.4 s
        the lock was held at 1,000,000 messages)."""
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
        # live index against the files: every indexed line checked and
        # copied here (decoded from its bytes after, without the lock: not
        # the decode cache's record)
        copies: list[HotCopy] = []
        with _noted(problems, self.hot_dir, "index check"):
            ks = list(self._index.channels())
            locs = np.concatenate([self._index.channel_locs(k, -1) for k in ks]) if ks else np.zeros(0, np.int64)
            try:
                copies.append(self._copy_lines(locs))
            except CorruptStateCheckpointError:
                # (a damaged line: each checked alone, every one named)
                for loc in locs.tolist():
                    try:
                        copies.append(self._copy_lines(np.array([loc], dtype=np.int64)))
                    except CorruptStateCheckpointError as exc:
                        path, offset = self._where(loc)
                        problems.append(Problem(path, offset, str(exc)))
        self._bound_maps()
        return copies

    @staticmethod
    def _verify_hot_lines(copies: list[HotCopy], problems: list[Problem], hashes: PayloadHashes) -> None:
        """Decode each hot line :meth:`_verify_hot` copied (checked) and add
        its record's payload hash to ``hashes``; a line that does not
        decode is a problem naming where it was."""
        for copy in copies:
            for i in range(len(copy.starts)):
                try:
                    rec = copy.record(i)
                    hashes.add_hex(rec.msg_id, payload_hash(rec))
                except CorruptStateCheckpointError as exc:
                    loc = int(copy.locs[i])
                    problems.append(Problem(copy.paths[loc >> 40], loc & _OFF_MASK, str(exc)))

    def _verify_events(self, events: EventStore, problems: list[Problem], checked: dict[str, int],
                       hashes: PayloadHashes, recs: np.ndarray, order: np.ndarray, every: bool = True) -> None:
        """The event store's lines and envelopes, each message's against its
        record's payload hash (``hashes``: ``recs``, ``order`` are its
        :meth:`PayloadHashes.sorted`), and (``every``: a writer's, whose
        envelopes are written with its records) every record journaled.
        The envelopes are kept as their id keys, hashes and offsets (32
        bytes each) and compared with the records in a few numpy steps."""
        try:
            envs = bytearray()

            def enveloped(env: dict) -> None:     # each sound envelope, in the check's one pass
                checked["envelopes"] += 1
                if env.get("type") == "conversation.message":
                    envs.extend(_id_key(env["id"]))
                    envs.extend(bytes.fromhex(env["payload_hash"][:16]))
                    envs.extend(_OFFSET.pack(env["offset"]))
            def keyed(entries: bytes) -> None:    # the usual message envelopes of a part, checked in C
                checked["envelopes"] += len(entries) // _ENV.itemsize
                envs.extend(entries)
            damage = events.verify(enveloped, keyed)
            problems += [Problem(ep["path"], ep["offset"], ep["problem"]) for ep in damage]
            env = np.frombuffer(bytes(envs), dtype=_ENV)
            del envs
            if len(env) > 1 and not bool((env["o"][1:] > env["o"][:-1]).all()):
                env = env[np.argsort(env["o"], kind="stable")]     # (a part's C-checked ones came first)
            at, found = _lookup(recs, env["a"], env["b"])
            if len(recs):
                found &= recs["h"][at] != env["h"]      # (now: found with another hash)
            for k in np.flatnonzero(found).tolist():
                problems.append(Problem(events.path, int(env["o"][k]),
                                        f"envelope of {hashes.mid(int(order[at[k]]))} does not match its record"))
            journaled = env[_by_key(env)]
            del env
            firsts = _firsts(recs)
            lost = firsts[~_lookup(journaled, recs["a"][firsts], recs["b"][firsts])[1]]
            if len(lost) and every and not damage:     # (a damaged line may be the envelope: named above)
                names = [hashes.mid(i) for i in np.sort(order[lost])[:3].tolist()]
                problems.append(Problem(
                    events.path, events.size,
                    f"{len(lost)} stored message(s) have no envelope, e.g. "
                    f"{', '.join(map(repr, names))}"))
        except CorruptStateCheckpointError as exc:
            if not any(p.file == events.path and p.offset == exc.offset for p in problems):
                problems.append(Problem(events.path, exc.offset, str(exc)))
        except (OSError, RuneError) as exc:     # (a file gone or replaced by another kind)
            problems.append(Problem(events.path, None, f"event store check failed: {exc!r}"))

