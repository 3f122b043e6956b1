"""A LangGraph checkpointer on rune_fast: ``RuneCheckpointSaver``.

A one-line replacement for LangGraph's SQLite savers::

    from rune_fast.integrations.langgraph import RuneCheckpointSaver
    saver = RuneCheckpointSaver("./rune-state")
    graph = builder.compile(checkpointer=saver)

Needs the ``langgraph`` extra (``pip install rune_fast[langgraph]``);
``import rune_fast`` never imports this module.

Data path: ``put`` -> each channel in ``new_versions`` serialized with
``self.serde`` -> one blob per (thread, namespace, channel, version), stored
once, and for a list that grew (a message history) only the new items plus a
reference to the version before -> one frame appended to
``<state_dir>/langgraph/checkpoints.log`` -> ``fdatasync`` -> in-memory
index. Back: (thread, namespace, id) -> index entry -> ``pread`` -> checksum
-> ``serde.loads_typed``. ``prune`` and ``compact`` rewrite the log with
only what is still reachable (temp file, fsync, rename, fsync of the
folder). The layout is in docs/FORMAT.md, "LangGraph checkpoints".

One writer per state directory (a ``DirLock`` of kind ``langgraph``): a
second saver, in this process or another, gets ``StateLockedError`` at once
instead of a "database is locked" later. One saver is safe to share between
threads and between the sync and async methods.
"""
from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ..events import ensure_private_dir
from ..locking import DirLock
from ._checkpoint_log import (
    _BLOB,
    _CKPT,
    _DEL_CKPTS,
    _DEL_THREAD,
    _WRITES,
    LOG_NAME,
    MAGIC,
    CheckpointLog,
    _array_header,
    _Blob,
    _Cached,
    _Ckpt,
    _msgpack_array_header,
    _Shared,
    _text,
    _Thread,
    _vkey,
)

__all__ = ["RuneCheckpointSaver", "LOG_NAME", "MAGIC"]


class RuneCheckpointSaver(CheckpointLog, BaseCheckpointSaver[str]):
    """LangGraph checkpoint saver storing in ``<state_dir>/langgraph/``.

    ``put`` and ``put_writes`` are durable on return (one ``fdatasync``). A
    channel value is stored once per version; a list that only grew since
    the channel's previous version is stored as its new items.
    ``incremental=True`` (the default) serializes only those new items when
    the new list holds the previous list's items themselves (``is``), as
    LangGraph's reducers build it: LangGraph already requires that a value
    handed to a checkpointer is not changed in place afterwards (its
    ``durability="async"`` mode serializes it while the next step runs).
    ``incremental=False`` serializes every value whole and compares bytes.
    """

    def __init__(self, state_dir: str | os.PathLike[str], *, serde: SerializerProtocol | None = None,
                 incremental: bool = True) -> None:
        super().__init__(serde=serde)
        if not isinstance(state_dir, (str, os.PathLike)) or not os.fspath(state_dir):
            raise ValueError(f"state_dir: expected a non-empty path, got {state_dir!r}")
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        self.folder = os.path.join(self.state_dir, "langgraph")
        self.path = os.path.join(self.folder, LOG_NAME)
        self.incremental = bool(incremental)
        self._state = _Shared()
        self._lock = threading.RLock()
        ensure_private_dir(self.folder)
        self._dirlock = DirLock(self.folder, "langgraph")
        try:
            self._remove_stale_temps()
            self._open()
        except BaseException:
            self._dirlock.release()
            raise

    def close(self) -> None:
        """Close the log and release the directory lock (idempotent)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._dirlock.release()

    def __enter__(self) -> "RuneCheckpointSaver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "RuneCheckpointSaver":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RuneCheckpointSaver({self.state_dir!r})"

    def _blob_frame(self, tid: str, ns: str, channel: str, version: str, value: Any,
                    has_value: bool) -> tuple[list[bytes], "_Cached | None"]:
        """The frame storing ``value`` as (channel, version): whole, or as the
        items it added to the channel's previous version; and what to cache
        of it once appended."""
        th = self._threads.get(tid)
        prev = th.last.get((ns, channel)) if th is not None else None
        meta: dict[str, Any] = {"t": tid, "n": ns, "c": channel, "v": version}
        if not has_value:
            meta["y"] = "empty"
            return self._frame(_BLOB, meta), None
        hit = self._cache.get((tid, ns, channel))
        if hit is not None and hit.blob is not prev:
            hit = None
        if (self.incremental and hit is not None and prev is not None and hit.head and prev.type == "msgpack"
                and isinstance(value, list) and hit.items is not None
                and (prev.base is None or prev.h == len(hit.head))
                and isinstance(self.serde, JsonPlusSerializer)):
            old = hit.items
            n = len(old)
            if len(value) >= n and all(a is b for a, b in zip(value, old)):
                # The same items and new ones after them: msgpack writes an
                # array as its header and each item's bytes, so only the new
                # items are serialized (tested against a whole dumps_typed).
                t2, tail = self.serde.dumps_typed(value[n:])
                ht = _msgpack_array_header(tail)
                if t2 == "msgpack" and ht:
                    head = _array_header(len(value))
                    meta.update(y="msgpack", b=prev.frame, h=len(head), o=len(hit.head))
                    body = tail[ht:]
                    return (self._frame(_BLOB, meta, [head, body]),
                            _Cached(None, head, [*hit.body, body], value, hit.size + len(body)))
        type_, full = self.serde.dumps_typed(value)
        meta["y"] = type_
        data: list[bytes] = [full]
        hn = _msgpack_array_header(full) if type_ == "msgpack" else 0
        if prev is not None and hn and prev.type == "msgpack":
            pfull = hit.full() if hit is not None else self._full(prev)
            hp = _msgpack_array_header(pfull)
            kept = len(pfull) - hp
            if (hp and (prev.base is None or prev.h == hp) and len(full) - hn >= kept
                    and memoryview(full)[hn:hn + kept] == memoryview(pfull)[hp:]):
                meta.update(b=prev.frame, h=hn, o=hp)
                data = [full[:hn], full[hn + kept:]]
        return self._frame(_BLOB, meta, data), _Cached(None, full[:hn], [full[hn:]], value, len(full))

    def _tuple(self, tid: str, ns: str, cid: str, ck: _Ckpt, th: _Thread, config: RunnableConfig | None,
               memo: dict[_Blob, bytes] | None = None) -> tuple[Any, ...]:
        """Raw parts of one tuple, read under the lock; decoded by _decode."""
        raw = self._read(ck.off, ck.cl + ck.ml)
        checkpoint: dict[str, Any] = self.serde.loads_typed((ck.type, raw[:ck.cl]))
        values: list[tuple[str, str, bytes]] = []
        for channel, version in checkpoint.get("channel_versions", {}).items():
            blob = th.blobs.get((ns, channel, _vkey(version)))
            if blob is None or blob.type == "empty":
                continue
            hit = self._cache.get((tid, ns, channel))
            if hit is not None and hit.blob is blob:
                full = hit.full()
            else:
                full = self._full(blob, memo)
            values.append((channel, blob.type, full))
        writes = sorted(th.writes.get((ns, cid), {}).values(),
                        key=lambda w: writes_sort_key(w.path, w.task, w.idx))
        wraw = [(w.task, w.channel, w.type, self._read(w.off, w.ln)) for w in writes]
        return (tid, ns, cid, checkpoint, values, (ck.mtype, raw[ck.cl:]), ck.parent, wraw, config)

    def _decode(self, parts: tuple[Any, ...]) -> CheckpointTuple:
        tid, ns, cid, checkpoint, values, meta, parent, wraw, config = parts
        checkpoint["channel_values"] = {ch: self.serde.loads_typed((t, b)) for ch, t, b in values}
        if config is None:
            config = {"configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": cid}}
        return CheckpointTuple(
            config,
            checkpoint,  # type: ignore[arg-type]
            self.serde.loads_typed(meta),
            {"configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": parent}} if parent else None,
            [(task, ch, self.serde.loads_typed((t, b))) for task, ch, t, b in wraw],
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), else the
        thread's newest in ``checkpoint_ns``; None if there is none."""
        conf = config["configurable"]
        tid = _text("thread_id", conf["thread_id"])
        ns = _text("checkpoint_ns", conf.get("checkpoint_ns", ""))
        cid = get_checkpoint_id(config)
        with self._lock:
            self._check_open()
            th = self._threads.get(tid)
            if th is None:
                return None
            table = th.ckpts.get(ns)
            if not table:
                return None
            if cid:
                ck = table.get(cid)
                if ck is None:
                    return None
                keep: RunnableConfig | None = config
            else:
                cid = th.order[ns][-1]
                ck = table[cid]
                keep = None
            parts = self._tuple(tid, ns, cid, ck, th, keep)
        return self._decode(parts)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by id), of ``config``'s thread (and its
        ``checkpoint_ns`` and ``checkpoint_id`` when given; every thread for
        None), whose metadata has each ``filter`` item, with ids below
        ``before``'s, at most ``limit``."""
        conf = (config or {}).get("configurable", {}) if config is not None else {}
        tid = _text("thread_id", conf["thread_id"]) if conf.get("thread_id") is not None else None
        ns = conf.get("checkpoint_ns")
        ns = _text("checkpoint_ns", ns) if ns is not None else None
        only = get_checkpoint_id(config) if config is not None and conf else None
        below = get_checkpoint_id(before) if before is not None else None
        if limit is not None and limit <= 0:
            return
        with self._lock:
            self._check_open()
            threads = [tid] if tid is not None else list(self._threads)
            found: list[tuple[str, str, str]] = []
            for t in threads:
                th = self._threads.get(t)
                if th is None:
                    continue
                for n, ids in th.order.items():
                    if ns is not None and n != ns:
                        continue
                    table = th.ckpts[n]
                    for cid in ids:
                        if only and cid != only:
                            continue
                        if below is not None and not cid < below:
                            continue
                        if filter and not all(table[cid].meta.get(k) == v for k, v in filter.items()):
                            continue
                        found.append((cid, t, n))
        found.sort(key=lambda x: x[0], reverse=True)
        if limit is not None:
            found = found[:limit]
        memo: dict[_Blob, bytes] = {}
        for cid, t, n in found:
            with self._lock:
                self._check_open()
                th = self._threads.get(t)
                ck = th.ckpts.get(n, {}).get(cid) if th is not None else None
                if ck is None or th is None:
                    continue  # deleted while the caller was reading the ones before
                parts = self._tuple(t, n, cid, ck, th, None, memo)
            yield self._decode(parts)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Store ``checkpoint`` (its ``new_versions`` channels as new blobs,
        the others by reference) under ``config``'s thread and namespace,
        with ``config``'s ``checkpoint_id`` as its parent. Durable on return."""
        conf = config["configurable"]
        tid = _text("thread_id", conf["thread_id"])
        ns = _text("checkpoint_ns", conf.get("checkpoint_ns", ""))
        cid = _text("checkpoint id", checkpoint["id"])
        parent = conf.get("checkpoint_id")
        c = dict(checkpoint)
        values: dict[str, Any] = c.pop("channel_values", {})  # type: ignore[assignment]
        type_, cbytes = self.serde.dumps_typed(c)
        mtype, mbytes = self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
        with self._lock:
            self._check_open()
            frames: list[list[bytes]] = []
            cached: list[tuple[str, _Cached | None]] = []
            for channel, version in new_versions.items():
                ch = _text("channel", channel)
                frame, entry = self._blob_frame(tid, ns, ch, _vkey(version), values.get(channel), channel in values)
                frames.append(frame)
                cached.append((ch, entry))
            frames.append(self._frame(_CKPT, {"t": tid, "n": ns, "id": cid, "p": parent, "y": type_,
                                              "my": mtype, "cl": len(cbytes)}, [cbytes, mbytes]))
            self._append(frames)
            th = self._threads[tid]
            for ch, entry in cached:
                if entry is None:
                    self._cache_drop((tid, ns, ch))
                else:
                    entry.blob = th.last[(ns, ch)]
                    self._cache_put((tid, ns, ch), entry)
        return {"configurable": {"thread_id": conf["thread_id"], "checkpoint_ns": ns, "checkpoint_id": cid}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Store a task's writes for ``config``'s checkpoint: an idx already
        stored for the task is kept (special channels -- errors, interrupts
        -- replace theirs), as the SQLite saver does. Durable on return."""
        conf = config["configurable"]
        tid = _text("thread_id", conf["thread_id"])
        ns = _text("checkpoint_ns", conf.get("checkpoint_ns", ""))
        cid = _text("checkpoint_id", conf["checkpoint_id"])
        task = _text("task_id", task_id)
        replace = all(w[0] in WRITES_IDX_MAP for w in writes)
        items: list[list[Any]] = []
        data: list[bytes] = []
        with self._lock:
            self._check_open()
            th = self._threads.get(tid)
            have = th.writes.get((ns, cid), {}) if th is not None else {}
            for idx, (channel, value) in enumerate(writes):
                i = WRITES_IDX_MAP.get(channel, idx)
                if not replace and (task, i) in have:
                    continue
                t, b = self.serde.dumps_typed(value)
                items.append([i, _text("channel", channel), t, len(b)])
                data.append(b)
            if not items:
                return
            meta: dict[str, Any] = {"t": tid, "n": ns, "id": cid, "k": task, "p": _text("task_path", task_path),
                                    "w": items}
            if replace:
                meta["r"] = 1
            self._append([self._frame(_WRITES, meta, data)])

    def delete_thread(self, thread_id: str) -> None:
        """Forget every checkpoint, write and blob of ``thread_id`` (durable;
        the bytes go at the next compaction)."""
        tid = _text("thread_id", thread_id)
        with self._lock:
            self._check_open()
            if tid not in self._threads:
                return
            self._append([self._frame(_DEL_THREAD, {"t": tid})])
            self._maybe_compact()

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete, in every thread, the checkpoints whose metadata ``run_id``
        is one of ``run_ids``, and their writes."""
        runs = {str(r) for r in run_ids}
        if not runs:
            return
        with self._lock:
            self._check_open()
            frames = []
            for tid, th in self._threads.items():
                for ns, table in th.ckpts.items():
                    ids = [cid for cid, ck in table.items() if ck.meta.get("run_id") in runs]
                    if ids:
                        frames.append(self._frame(_DEL_CKPTS, {"t": tid, "n": ns, "ids": ids}))
            if frames:
                self._append(frames)
                self._maybe_compact()

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint (all namespaces), its writes and blobs from
        one thread to another, ids and order kept (one durable append)."""
        src = _text("source_thread_id", source_thread_id)
        dst = _text("target_thread_id", target_thread_id)
        with self._lock:
            self._check_open()
            th = self._threads.get(src)
            if th is None or src == dst:
                return
            frames: list[list[bytes]] = []
            at = self._end
            moved: dict[int, int] = {}
            blobs = sorted({id(b): (k, b) for k, b in th.blobs.items()}.values(), key=lambda kb: kb[1].frame)
            needed: dict[int, _Blob] = {}
            for _, b in blobs:
                cur: _Blob | None = b
                while cur is not None and cur.frame not in needed:
                    needed[cur.frame] = cur
                    cur = cur.base
            names = {b.frame: k for k, b in th.blobs.items()}
            for frame in sorted(needed):
                b = needed[frame]
                k = names.get(frame)
                meta: dict[str, Any] = {"t": dst, "y": b.type}
                if k is not None:
                    meta.update(n=k[0], c=k[1], v=k[2])
                else:  # a base replaced under its key: kept, under a name nobody reads
                    meta.update(n="", c="\x00base", v=f"f{frame}")
                data = self._read(b.off, b.ln)
                if b.base is not None:
                    meta.update(b=moved[b.base.frame], h=b.h, o=b.o)
                fr = self._frame(_BLOB, meta, data)
                moved[frame] = at
                at += sum(len(p) for p in fr)
                frames.append(fr)
            for ns, ids in th.order.items():
                for cid in ids:
                    ck = th.ckpts[ns][cid]
                    raw = self._read(ck.off, ck.cl + ck.ml)
                    frames.append(self._frame(_CKPT, {"t": dst, "n": ns, "id": cid, "p": ck.parent, "y": ck.type,
                                                      "my": ck.mtype, "cl": ck.cl}, raw))
            for (ns, cid), slot in th.writes.items():
                for w in sorted(slot.values(), key=lambda w: (w.task, w.idx)):
                    frames.append(self._frame(_WRITES, {"t": dst, "n": ns, "id": cid, "k": w.task, "p": w.path,
                                                        "w": [[w.idx, w.channel, w.type, w.ln]], "r": 1},
                                              self._read(w.off, w.ln)))
            if frames:
                self._append(frames)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep each namespace's newest checkpoint (and its
        writes) of each thread; ``"delete"``: delete the threads. Then compact,
        so the pruned checkpoints and channel versions leave the disk.

        Not ``DeltaChannel``-aware (beta in LangGraph): a kept checkpoint
        whose delta channels need pruned ancestors loses them."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy: expected 'keep_latest' or 'delete', got {strategy!r}")
        tids = [_text("thread_id", t) for t in thread_ids]
        with self._lock:
            self._check_open()
            frames = []
            for tid in tids:
                th = self._threads.get(tid)
                if th is None:
                    continue
                if strategy == "delete":
                    frames.append(self._frame(_DEL_THREAD, {"t": tid}))
                    continue
                for ns, ids in th.order.items():
                    if len(ids) > 1:
                        frames.append(self._frame(_DEL_CKPTS, {"t": tid, "n": ns, "ids": ids[:-1]}))
            if frames:
                self._append(frames)
                self.compact()

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Next channel version, as the SQLite saver makes them (zero-padded
        counter and a random fraction)."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple` (in a worker thread)."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list`: each tuple read in a worker thread."""
        it = self.list(config, filter=filter, before=before, limit=limit)
        done = object()
        while True:
            item = await asyncio.to_thread(next, it, done)
            if item is done:
                return
            yield item  # type: ignore[misc]

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        """Async :meth:`put`."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        """Async :meth:`put_writes`."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread`."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs`."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async :meth:`copy_thread`."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async :meth:`prune`."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)
