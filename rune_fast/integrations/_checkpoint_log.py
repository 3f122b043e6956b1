"""The checkpoint log behind :class:`~rune_fast.integrations.langgraph.RuneCheckpointSaver`:
its frames on disk, the in-memory index rebuilt from them at open, recovery
of a torn final write, and compaction (docs/FORMAT.md, "LangGraph
checkpoints"). Nothing here imports LangGraph."""
from __future__ import annotations

import bisect
import os
import struct
import tempfile
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson
import xxhash

from .._names import CHECKPOINT_LOG_NAME
from ..errors import CorruptStateCheckpointError, DurabilityError, RecoveryWarning, StoreClosedError
from ..events import fsync_dir

LOG_NAME = CHECKPOINT_LOG_NAME
MAGIC = b"RFLGCK01"
_FRAME = struct.Struct("<IQ")          # payload length, xxh3_64 of the payload
_META = struct.Struct("<BI")           # kind, length of the JSON meta
_MAX_PAYLOAD = 0xFFFF_FFFF
_MAX_ID_BYTES = 1 << 20                # thread ids, namespaces, channels, task ids

_BLOB, _CKPT, _WRITES, _DEL_THREAD, _DEL_CKPTS = 1, 2, 3, 4, 5
_KINDS = {_BLOB, _CKPT, _WRITES, _DEL_THREAD, _DEL_CKPTS}

_CACHE_BYTES = 128 << 20               # full bytes kept of each channel's newest blob


class _Blob:
    """One stored channel value. ``base`` is None for a whole value; else
    the value is ``data[:h] + full(base)[o:] + data[h:]``."""
    __slots__ = ("off", "ln", "type", "base", "h", "o", "frame")

    def __init__(self, off: int, ln: int, type_: str, base: "_Blob | None", h: int, o: int, frame: int) -> None:
        self.off, self.ln, self.type, self.base, self.h, self.o, self.frame = off, ln, type_, base, h, o, frame


class _Ckpt:
    __slots__ = ("off", "cl", "ml", "type", "mtype", "parent", "meta", "frame")

    def __init__(self, off: int, cl: int, ml: int, type_: str, mtype: str, parent: str | None,
                 meta: dict[str, Any], frame: int) -> None:
        self.off, self.cl, self.ml, self.type, self.mtype = off, cl, ml, type_, mtype
        self.parent, self.meta, self.frame = parent, meta, frame


class _Write:
    __slots__ = ("task", "idx", "channel", "type", "off", "ln", "path", "frame")

    def __init__(self, task: str, idx: int, channel: str, type_: str, off: int, ln: int, path: str,
                 frame: int) -> None:
        self.task, self.idx, self.channel, self.type = task, idx, channel, type_
        self.off, self.ln, self.path, self.frame = off, ln, path, frame


class _Cached:
    """A channel's newest stored value, kept to store the next one as a
    delta: its bytes (``head`` + the pieces of ``body``) and, for a list, the
    items it held when stored (a tuple: a list changed in place afterwards,
    appended to or an item replaced, is still compared with what was stored)."""
    __slots__ = ("blob", "head", "body", "items", "size")

    def __init__(self, blob: _Blob | None, head: bytes, body: list[bytes], value: Any, size: int) -> None:
        self.blob, self.head, self.body, self.size = blob, head, body, size
        self.items: tuple[Any, ...] | None = tuple(value) if isinstance(value, list) else None

    def full(self) -> bytes:
        if len(self.body) != 1:
            self.body = [b"".join(self.body)]
        return self.head + self.body[0]


class _Thread:
    """Everything stored for one thread id."""
    __slots__ = ("ckpts", "order", "writes", "blobs", "last")

    def __init__(self) -> None:
        self.ckpts: dict[str, dict[str, _Ckpt]] = {}              # ns -> id -> checkpoint
        self.order: dict[str, list[str]] = {}                      # ns -> sorted ids
        self.writes: dict[tuple[str, str], dict[tuple[str, int], _Write]] = {}  # (ns, id) -> ...
        self.blobs: dict[tuple[str, str, str], _Blob] = {}         # (ns, channel, version) -> blob
        self.last: dict[tuple[str, str], _Blob] = {}               # (ns, channel) -> newest blob


def _msgpack_array_header(data: bytes | memoryview) -> int:
    """Length of the msgpack array header ``data`` starts with, 0 if none."""
    if not data:
        return 0
    b = data[0]
    if 0x90 <= b <= 0x9F:
        return 1
    if b == 0xDC:
        return 3 if len(data) >= 3 else 0
    if b == 0xDD:
        return 5 if len(data) >= 5 else 0
    return 0


def _frame_problem(view: memoryview, pos: int, size: int) -> str:
    """Why the frame at ``pos`` is not whole and intact ("" if it is)."""
    if size - pos < _FRAME.size:
        return "truncated frame header"
    ln, digest = _FRAME.unpack_from(view, pos)
    end = pos + _FRAME.size + ln
    if end > size:
        return f"frame of {ln} bytes runs past the end of the file"
    if xxhash.xxh3_64_intdigest(view[pos + _FRAME.size:end]) != digest:
        return "frame checksum mismatch"
    return ""


def _frames_follow(view: memoryview, pos: int, size: int) -> bool:
    """True if intact frames run from the end of the (bad) frame at ``pos`` to
    the end of the file: the damage is inside the log, not a torn last append."""
    if size - pos < _FRAME.size:
        return False
    ln, _ = _FRAME.unpack_from(view, pos)
    pos += _FRAME.size + ln
    if pos >= size:
        return False
    while pos < size:
        if _frame_problem(view, pos, size):
            return False
        ln, _ = _FRAME.unpack_from(view, pos)
        pos += _FRAME.size + ln
    return True


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _vkey(version: Any) -> str:
    """Index key of a channel version (int, float or str, as LangGraph allows)."""
    return orjson.dumps(version).decode("ascii") if not isinstance(version, str) else "s" + version


def _text(field: str, value: Any) -> str:
    """A thread id, namespace, channel or task id as stored: any str (``/``,
    ``..``, NUL are data, never a path); ValueError naming ``field`` if it
    cannot be stored."""
    if isinstance(value, bytes) or value is None:
        raise ValueError(f"{field}: expected a str, got {type(value).__name__}")
    text = value if isinstance(value, str) else str(value)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"{field} {text[:40]!r}...: not valid UTF-8 ({exc.reason} at {exc.start})") from None
    if size > _MAX_ID_BYTES:
        raise ValueError(f"{field}: {size} bytes, more than the {_MAX_ID_BYTES} a checkpoint log stores")
    return text


class _Shared:
    """The state behind a saver and the clones ``with_allowlist`` makes of it
    (``copy.copy`` + another serde, as LangGraph does when it compiles a
    graph): one log, one index, one end offset for all of them."""
    __slots__ = ("fd", "end", "failed", "threads", "cache", "cache_bytes", "dead", "frames")

    def __init__(self) -> None:
        self.fd = -1
        self.end = 0
        self.failed: str | None = None
        self.threads: dict[str, _Thread] = {}
        self.cache: OrderedDict[tuple[str, str, str], _Cached] = OrderedDict()
        self.cache_bytes = 0
        self.dead = 0
        self.frames: dict[int, _Blob] = {}


def _shared(name: str) -> Any:
    def get(self: "CheckpointLog") -> Any:
        return getattr(self._state, name)

    def set_(self: "CheckpointLog", value: Any) -> None:
        setattr(self._state, name, value)
    return property(get, set_)



class CheckpointLog:
    """The log half of the saver (a mixin): the file, its index (shared
    with the clones ``with_allowlist`` makes: :class:`_Shared`), appends,
    reads, recovery and compaction. The saver half turns LangGraph's calls
    into frames and back."""

    # set by the saver's __init__ (annotations only: no class attribute)
    state_dir: str
    folder: str
    path: str
    _state: _Shared
    _lock: threading.RLock
    serde: Any              # LangGraph's SerializerProtocol, the saver's

    def _remove_stale_temps(self) -> None:
        """Remove what a compaction a crash interrupted left (its temp file is
        never read: the rename is the commit). Only under the lock."""
        prefix = "." + LOG_NAME + "."
        for name in os.listdir(self.folder):
            if name.startswith(prefix) and name.endswith(".tmp"):
                os.unlink(os.path.join(self.folder, name))

    _fd: int = _shared("fd")

    _end: int = _shared("end")

    _failed: str | None = _shared("failed")

    _threads: dict[str, _Thread] = _shared("threads")

    _cache: "OrderedDict[tuple[str, str, str], _Cached]" = _shared("cache")

    _cache_bytes: int = _shared("cache_bytes")

    _dead: int = _shared("dead")

    # blobs by frame offset: a delta names its base by where it is, so a
    # later blob under the same key never changes what a delta reads.
    _frames: dict[int, _Blob] = _shared("frames")

    def _open(self) -> None:
        self._threads = {}
        self._cache = OrderedDict()
        self._cache_bytes = 0
        self._dead = 0
        self._frames = {}
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                os.write(fd, MAGIC)
                os.fsync(fd)
                fsync_dir(self.folder)
                size = len(MAGIC)
            self._fd = fd
            self._end = self._replay(size)
        except BaseException:
            self._fd = -1
            os.close(fd)
            raise

    def _replay(self, size: int) -> int:
        """Rebuild the index from the log; returns the end of the last good
        frame. A torn final frame (an append a crash cut short: it was never
        acknowledged) is cut off with a :class:`RecoveryWarning`; damage
        before the end raises :class:`CorruptStateCheckpointError`."""
        with open(self.path, "rb", buffering=0) as f:
            data = f.read(size)
        if data[:len(MAGIC)] != MAGIC:
            raise CorruptStateCheckpointError("not a rune_fast LangGraph checkpoint log (bad magic)",
                                              path=self.path, offset=0)
        view = memoryview(data)
        pos = len(MAGIC)
        while pos < size:
            bad = _frame_problem(view, pos, size)
            if bad:
                if _frames_follow(view, pos, size):
                    raise CorruptStateCheckpointError(f"checkpoint log damaged: {bad}", path=self.path, offset=pos)
                self._quarantine(data, pos, bad)
                return pos
            ln, _ = _FRAME.unpack_from(view, pos)
            end = pos + _FRAME.size + ln
            self._apply(view, pos, end, 0)
            pos = end
        return pos

    def _quarantine(self, data: bytes, pos: int, bad: str) -> None:
        """Keep the bytes of a torn final append in ``checkpoints.log.torn-<offset>``
        (0600, durable), then cut them off the log."""
        kept = f"{self.path}.torn-{pos}"
        fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)[pos:]
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(self.path, "r+b") as f:
            f.truncate(pos)
            os.fsync(f.fileno())
        fsync_dir(self.folder)
        warnings.warn(RecoveryWarning(
            f"checkpoint log {self.path}: a torn final append ({bad}) at offset {pos}: its "
            f"{len(data) - pos} bytes were never acknowledged; kept in {kept} and cut off"), stacklevel=4)

    def _apply(self, view: memoryview, vframe: int, vend: int, shift: int) -> None:
        """Apply one frame, ``view[vframe:vend]``, found at file offset
        ``vframe + shift``, to the index."""
        start = vframe + _FRAME.size
        frame = vframe + shift
        kind, mlen = _META.unpack_from(view, start)
        if kind not in _KINDS or start + _META.size + mlen > vend:
            raise CorruptStateCheckpointError(f"checkpoint log frame of unknown kind {kind}",
                                              path=self.path, offset=frame)
        try:
            meta = orjson.loads(view[start + _META.size:start + _META.size + mlen])
        except orjson.JSONDecodeError as exc:
            raise CorruptStateCheckpointError(f"checkpoint log frame meta does not parse: {exc}",
                                              path=self.path, offset=frame) from None
        vdata = start + _META.size + mlen
        doff = vdata + shift
        end = vend + shift
        if kind == _BLOB:
            th = self._thread(meta["t"])
            base = None
            if "b" in meta:
                base = self._frames.get(meta["b"])
                if base is None:
                    raise CorruptStateCheckpointError(
                        f"blob of channel {meta['c']!r} refers to a missing base at {meta['b']}",
                        path=self.path, offset=frame)
            blob = _Blob(doff, end - doff, meta["y"], base, meta.get("h", 0), meta.get("o", 0), frame)
            self._frames[frame] = blob
            old = th.blobs.get((meta["n"], meta["c"], meta["v"]))
            if old is not None:
                self._dead += 1
            th.blobs[(meta["n"], meta["c"], meta["v"])] = blob
            th.last[(meta["n"], meta["c"])] = blob
        elif kind == _CKPT:
            th = self._thread(meta["t"])
            ns, cid = meta["n"], meta["id"]
            cl = meta["cl"]
            mt = self.serde.loads_typed((meta["my"], bytes(view[vdata + cl:vend])))
            ck = _Ckpt(doff, cl, end - doff - cl, meta["y"], meta["my"], meta.get("p"), mt, frame)
            ids = th.ckpts.setdefault(ns, {})
            if cid in ids:
                self._dead += 1
            else:
                order = th.order.setdefault(ns, [])
                if order and order[-1] > cid:
                    bisect.insort(order, cid)
                else:
                    order.append(cid)
            ids[cid] = ck
        elif kind == _WRITES:
            th = self._thread(meta["t"])
            slot = th.writes.setdefault((meta["n"], meta["id"]), {})
            replace = bool(meta.get("r"))
            off = doff
            for idx, channel, type_, ln in meta["w"]:
                key = (meta["k"], idx)
                if replace or key not in slot:
                    slot[key] = _Write(meta["k"], idx, channel, type_, off, ln, meta.get("p", ""), frame)
                off += ln
        elif kind == _DEL_THREAD:
            self._drop_thread(meta["t"])
        else:  # _DEL_CKPTS
            owner = self._threads.get(meta["t"])
            if owner is not None:
                self._drop_ckpts(owner, meta["n"], meta["ids"])

    def _thread(self, tid: str) -> _Thread:
        th = self._threads.get(tid)
        if th is None:
            th = self._threads[tid] = _Thread()
        return th

    def _drop_thread(self, tid: str) -> None:
        th = self._threads.pop(tid, None)
        if th is not None:
            self._dead += 1 + len(th.blobs) + sum(len(t) for t in th.ckpts.values())
        for key in [k for k in self._cache if k[0] == tid]:
            self._cache_drop(key)

    def _drop_ckpts(self, th: _Thread, ns: str, ids: Sequence[str]) -> None:
        table = th.ckpts.get(ns, {})
        gone = {cid for cid in ids if table.pop(cid, None) is not None}
        for cid in ids:
            th.writes.pop((ns, cid), None)
        if gone:
            self._dead += len(gone)
            th.order[ns] = [cid for cid in th.order.get(ns, []) if cid not in gone]
        if not table:
            th.ckpts.pop(ns, None)
            th.order.pop(ns, None)

    def _frame(self, kind: int, meta: dict[str, Any], data: bytes | Sequence[bytes] = b"") -> list[bytes]:
        """The pieces of one frame (header, meta, data)."""
        mbytes = orjson.dumps(meta)
        parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
        payload_len = _META.size + len(mbytes) + sum(len(p) for p in parts)
        if payload_len > _MAX_PAYLOAD:
            raise ValueError(f"checkpoint log frame for thread {str(meta.get('t'))[:80]!r}: {payload_len} bytes, "
                             f"more than the {_MAX_PAYLOAD} one frame holds")
        h = xxhash.xxh3_64()
        head = _META.pack(kind, len(mbytes))
        h.update(head)
        h.update(mbytes)
        for p in parts:
            h.update(p)
        return [_FRAME.pack(payload_len, h.intdigest()), head, mbytes, *parts]

    def _append(self, frames: list[list[bytes]]) -> int:
        """Append frames (one write, one fdatasync), apply them to the index;
        returns the offset of the first. Durable on return."""
        if self._fd < 0:
            raise StoreClosedError(f"checkpoint log {self.path} is closed")
        if self._failed is not None:
            raise DurabilityError(f"checkpoint log {self.path} refuses writes until reopened: {self._failed}")
        buf = b"".join(b"".join(f) for f in frames)
        start = self._end
        try:
            view = memoryview(buf)
            while view:
                view = view[os.write(self._fd, view):]
            os.fdatasync(self._fd)
        except OSError as exc:
            self._failed = f"append at offset {start} failed: {exc}"
            raise DurabilityError(f"checkpoint log {self.path}: {self._failed}") from exc
        self._end = start + len(buf)
        bview = memoryview(buf)
        pos = 0
        while pos < len(buf):
            ln, _ = _FRAME.unpack_from(bview, pos)
            self._apply(bview, pos, pos + _FRAME.size + ln, start)
            pos += _FRAME.size + ln
        return start

    def _read(self, off: int, ln: int) -> bytes:
        data = os.pread(self._fd, ln, off)
        if len(data) != ln:
            raise CorruptStateCheckpointError(f"checkpoint log ends inside a record ({len(data)} of {ln} bytes)",
                                              path=self.path, offset=off)
        return data

    def _full(self, blob: _Blob, memo: dict[_Blob, bytes] | None = None) -> bytes:
        """The whole serialized value of ``blob`` (following its bases)."""
        def read(b: _Blob) -> bytes:
            if memo is None:
                return self._read(b.off, b.ln)
            data = memo.get(b)   # keyed by the object: a compaction makes new ones
            if data is None:
                data = memo[b] = self._read(b.off, b.ln)
            return data

        data = read(blob)
        if blob.base is None:
            return data
        pieces = [data[blob.h:]]
        cur, off = blob.base, blob.o
        while cur.base is not None:
            d = read(cur)
            pieces.append(d[cur.h:])
            cur, off = cur.base, cur.o
        pieces.append(read(cur)[off:])
        pieces.reverse()
        return data[:blob.h] + b"".join(pieces)

    def _cache_put(self, key: tuple[str, str, str], entry: "_Cached") -> None:
        self._cache_drop(key)
        self._cache[key] = entry
        self._cache_bytes += entry.size
        while self._cache_bytes > _CACHE_BYTES and len(self._cache) > 1:
            self._cache_drop(next(iter(self._cache)))

    def _cache_drop(self, key: tuple[str, str, str]) -> None:
        hit = self._cache.pop(key, None)
        if hit is not None:
            self._cache_bytes -= hit.size

    def _maybe_compact(self) -> None:
        if self._dead > 64 and self._end > (1 << 20) and self._dead * 2 > self._live_records():
            self.compact()

    def _live_records(self) -> int:
        return sum(len(th.blobs) + sum(len(t) for t in th.ckpts.values()) for th in self._threads.values())

    def compact(self) -> int:
        """Rewrite the log with only what a read can reach: live checkpoints,
        their writes and the channel versions they name (each version whole or
        as the items it added to the previous kept one). Temp file, fsync,
        rename, fsync of the folder: a crash leaves the old log or the new.
        Returns the bytes reclaimed."""
        with self._lock:
            self._check_open()
            old_size = self._end
            fd, tmp = tempfile.mkstemp(prefix="." + LOG_NAME + ".", suffix=".tmp", dir=self.folder)
            try:
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(MAGIC)
                        self._write_live(f)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, self.path)
                except OSError as exc:
                    raise DurabilityError(f"compaction of checkpoint log {self.path} failed: {exc}") from exc
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
            fsync_dir(self.folder)
            os.close(self._fd)
            self._fd = -1
            self._open()
            return old_size - self._end

    def _write_live(self, f: Any) -> None:
        """Write every live record to ``f`` (positioned after the magic)."""
        at = len(MAGIC)

        def emit(fr: list[bytes]) -> None:
            nonlocal at
            for p in fr:
                f.write(p)
                at += len(p)

        for tid, th in self._threads.items():
            memo: dict[_Blob, bytes] = {}
            keep: dict[tuple[str, str], dict[str, _Blob]] = {}
            for ns, table in th.ckpts.items():
                for ck in table.values():
                    cp = self.serde.loads_typed((ck.type, self._read(ck.off, ck.cl)))
                    for channel, version in cp.get("channel_versions", {}).items():
                        v = _vkey(version)
                        blob = th.blobs.get((ns, channel, v))
                        if blob is not None:
                            keep.setdefault((ns, channel), {})[v] = blob
            for (ns, channel), versions in keep.items():
                prev_full: bytes | None = None
                prev_at = -1
                for v, blob in sorted(versions.items(), key=lambda kv: kv[1].frame):
                    meta: dict[str, Any] = {"t": tid, "n": ns, "c": channel, "v": v, "y": blob.type}
                    if blob.type == "empty":
                        emit(self._frame(_BLOB, meta))
                        prev_full = None
                        continue
                    full = self._full(blob, memo)
                    data: list[bytes] = [full]
                    hn = _msgpack_array_header(full) if blob.type == "msgpack" else 0
                    if prev_full is not None and hn:
                        hp = _msgpack_array_header(prev_full)
                        kept = len(prev_full) - hp
                        if (hp and len(full) - hn >= kept
                                and memoryview(full)[hn:hn + kept] == memoryview(prev_full)[hp:]):
                            meta.update(b=prev_at, h=hn, o=hp)
                            data = [full[:hn], full[hn + kept:]]
                    prev_full, prev_at = (full, at) if hn else (None, -1)
                    emit(self._frame(_BLOB, meta, data))
            for ns, ids in th.order.items():
                for cid in ids:
                    ck = th.ckpts[ns][cid]
                    emit(self._frame(_CKPT, {"t": tid, "n": ns, "id": cid, "p": ck.parent, "y": ck.type,
                                             "my": ck.mtype, "cl": ck.cl}, self._read(ck.off, ck.cl + ck.ml)))
            for (ns, cid), slot in th.writes.items():
                for w in sorted(slot.values(), key=lambda w: (w.task, w.idx)):
                    emit(self._frame(_WRITES, {"t": tid, "n": ns, "id": cid, "k": w.task, "p": w.path,
                                               "w": [[w.idx, w.channel, w.type, w.ln]], "r": 1},
                                     self._read(w.off, w.ln)))

    def _check_open(self) -> None:
        if self._fd < 0:
            raise StoreClosedError(f"checkpoint log {self.path} is closed")

    def disk_bytes(self) -> int:
        """Bytes the log takes on disk now."""
        with self._lock:
            return self._end
