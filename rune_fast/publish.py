"""Publish a store's messages as a Parquet dataset that query engines read.

``publish(source, uri)`` writes every live message of a conversation store
to a Hive-partitioned Parquet dataset on any file system pyarrow knows: a
local or shared folder, or ``s3://bucket/prefix`` on any S3-compatible
store (endpoint, region and credentials from the usual ``AWS_*``
environment variables, options in the URI such as
``?endpoint_override=http://127.0.0.1:9000&scheme=http``, or a
``pyarrow.fs.FileSystem`` passed in). DuckDB, Polars, Spark and pyarrow
read it as it is::

    <root>/day=2026-12-04/bucket=03/part-0.parquet
    <root>/_rune_publish.json

Partitions: the UTC day of the message's ``ts`` and a hash bucket of its
channel (``xxh3_64(channel_id) % buckets``), so a query for a channel or a
time range reads a fraction of the files. One file a partition, so files
grow with the store instead of one per cooling run. Columns: the message
record's fields (as in the cool archive), ``position`` (the message's
place in its channel's order at the publish: ``ORDER BY position`` gives
``window``'s order), ``tier`` (where the store held it when its file was
written) and ``digest`` (the record's ``payload_hash``).

Incremental and idempotent: ``_rune_publish.json`` keeps a digest of each
partition's rows; a publish writes only the partitions whose rows changed
(new, deleted or erased messages, or positions moved by a deletion before
them), removes those that became empty, and a second run with nothing new
writes nothing. Deletions and erasure reach the dataset at the next
publish: the file that held the message is written again without it.

Readers never see a partial file: a partition's file is written under a
hidden temporary name (a leading dot, which Spark, pyarrow and Polars skip,
and no ``.parquet`` ending, which a ``*.parquet`` glob skips) and renamed
over the old one where the file system renames atomically (a local or
shared folder); on S3 an object appears whole when its upload completes.
The manifest is replaced last: a reader that wants the files of one
publish exactly reads ``_rune_publish.json`` (``partitions`` -> ``file``);
a publish that dies half-way leaves every partition either as before or
as new, and the next publish finishes the rest.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import xxhash

from . import codec
from ._names import PUBLISH_MANIFEST_NAME
from .conversation_state import ConversationStateRepository
from .errors import RuneError
from .records import ConversationMessageRecord, payload_hash

__all__ = ["publish", "PublishReport", "PUBLISH_SCHEMA", "MANIFEST_NAME"]

MANIFEST_NAME = PUBLISH_MANIFEST_NAME
_FORMAT = 1

#: The columns of a published file (the partition columns ``day`` and
#: ``bucket`` are in its path, as Hive partitioning has them).
PUBLISH_SCHEMA = pa.schema([
    ("msg_id", pa.string()), ("channel_id", pa.string()), ("task_id", pa.string()),
    ("hlc", pa.string()), ("content", pa.string()), ("ts", pa.float64()), ("role", pa.string()),
    ("token_estimate", pa.int64()), ("tool_calls", pa.string()), ("tool_call_id", pa.string()),
    ("origin", pa.string()), ("schema_version", pa.int64()), ("position", pa.int64()),
    ("tier", pa.string()), ("digest", pa.string()),
])


@dataclasses.dataclass
class PublishReport:
    """What one publish did."""

    uri: str
    messages: int = 0               # live messages in the store
    partitions: int = 0             # partitions in the dataset after it
    files_written: int = 0
    files_removed: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    seconds: float = 0.0


def _resolve(uri: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"uri: a non-empty str expected, got {uri!r}")
    if filesystem is not None:
        return filesystem, uri.rstrip("/")
    if "://" not in uri:
        path = os.path.abspath(uri)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return pafs.LocalFileSystem(), path
    try:
        fs, root = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"uri {uri!r}: {exc}") from None
    return fs, root.rstrip("/")


def _bucket(channel_id: str, buckets: int) -> int:
    return xxhash.xxh3_64_intdigest(channel_id.encode("utf-8")) % buckets


def _day(ts: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d")
    except (OverflowError, OSError, ValueError):
        return "0000-00-00"         # a ts no calendar holds: one partition of its own


def _read_manifest(fs: pafs.FileSystem, root: str) -> dict[str, Any]:
    path = f"{root}/{MANIFEST_NAME}"
    try:
        with fs.open_input_stream(path) as f:
            raw = f.read()
    except FileNotFoundError:
        return {"format": _FORMAT, "partitions": {}}
    except OSError as exc:
        if "not found" in str(exc).lower() or "does not exist" in str(exc).lower():
            return {"format": _FORMAT, "partitions": {}}
        raise
    try:
        m = json.loads(raw)
    except ValueError as exc:
        raise RuneError(f"{path}: the publish manifest is not JSON ({exc}); remove it to publish "
                        f"everything again") from None
    if not isinstance(m, dict) or m.get("format") != _FORMAT or not isinstance(m.get("partitions"), dict):
        raise RuneError(f"{path}: not a publish manifest of format {_FORMAT}")
    return m


def _write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all for a reader (see the module
    doc): in a local folder a hidden temp file, fsynced and renamed over it;
    elsewhere one upload, which the object store shows only once complete."""
    if not isinstance(fs, pafs.LocalFileSystem):
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _table(rows: list[tuple[ConversationMessageRecord, int, str, str]]) -> pa.Table:
    cols: dict[str, list] = {f.name: [] for f in PUBLISH_SCHEMA}
    for r, pos, tier, digest in rows:
        cols["msg_id"].append(r.msg_id)
        cols["channel_id"].append(r.channel_id)
        cols["task_id"].append(r.task_id)
        cols["hlc"].append(r.hlc)
        cols["content"].append(r.content)
        cols["ts"].append(r.ts)
        cols["role"].append(r.role)
        cols["token_estimate"].append(r.token_estimate)
        cols["tool_calls"].append(json.dumps(r.tool_calls, ensure_ascii=False, separators=(",", ":")))
        cols["tool_call_id"].append(r.tool_call_id)
        cols["origin"].append(r.origin)
        cols["schema_version"].append(r.SCHEMA_VERSION)
        cols["position"].append(pos)
        cols["tier"].append(tier)
        cols["digest"].append(digest)
    return pa.table(cols, schema=PUBLISH_SCHEMA)


def _tiers(repo: ConversationStateRepository, ids: list[str]) -> list[str]:
    """Where the store holds each of ``ids`` now: "tail" or "hot" where the
    hot index places it, else "cool" (the ids are live messages). Read from
    the repository's index under its lock (a friend of the class: an exact
    read of each would read every cool row a second time)."""
    with repo._lock:
        locs = repo._index.find_many([codec.key(m) for m in ids]).tolist()
        return [repo._tier_of(loc) if loc >= 0 else "cool" for loc in locs]


def publish(source: ConversationStateRepository | str | os.PathLike[str], uri: str, *,
            buckets: int = 8, filesystem: pafs.FileSystem | None = None) -> PublishReport:
    """Publish the live messages of ``source`` (an open repository, or a
    state directory, opened read-only: a writer may run beside it) to the
    dataset at ``uri``; see the module docstring. ``buckets``: channel hash
    buckets a day (fixed for a dataset: another number raises ValueError).
    Returns a :class:`PublishReport`. ValueError for a bad argument;
    RuneError naming the manifest if it is not one; OSError from the file
    system (the dataset stays as a reader saw it)."""
    if isinstance(buckets, bool) or not isinstance(buckets, int) or not 1 <= buckets <= 4096:
        raise ValueError(f"buckets: an int from 1 to 4096 expected, got {buckets!r}")
    t0 = time.perf_counter()
    fs, root = _resolve(uri, filesystem)
    rep = PublishReport(uri=uri)
    manifest = _read_manifest(fs, root)
    old = manifest["partitions"]
    if old and manifest.get("buckets") != buckets:
        raise ValueError(f"buckets: the dataset at {uri} has {manifest.get('buckets')} buckets a day, "
                         f"not {buckets}")
    own = not isinstance(source, ConversationStateRepository)
    repo: ConversationStateRepository = (
        source if isinstance(source, ConversationStateRepository)
        else ConversationStateRepository(source, read_only=True))
    try:
        parts: dict[str, list[tuple[ConversationMessageRecord, int, str]]] = {}
        total = len(repo)
        for ch in repo.channels():
            b = _bucket(ch, buckets)
            for pos, r in enumerate(repo.window(ch, max(total, 1))):
                key = f"day={_day(r.ts)}/bucket={b:02d}"
                parts.setdefault(key, []).append((r, pos, payload_hash(r)))
                rep.messages += 1
        digests: dict[str, str] = {}
        for key, rows in parts.items():
            h = xxhash.xxh3_128()
            for r, pos, digest in rows:
                h.update(f"{r.msg_id}\0{digest}\0{pos}\n".encode("utf-8", "surrogatepass"))
            digests[key] = h.hexdigest()
        new_parts: dict[str, Any] = {}
        for key in sorted(parts):
            prev = old.get(key)
            if prev is not None and prev.get("digest") == digests[key]:
                new_parts[key] = prev
                continue
            rows = parts[key]
            tiers = _tiers(repo, [r.msg_id for r, _p, _d in rows])
            table = _table([(r, p, t, d) for (r, p, d), t in zip(rows, tiers)])
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink, compression="zstd")
            data = sink.getvalue().to_pybytes()
            name = "part-0.parquet"
            fs.create_dir(f"{root}/{key}", recursive=True)
            _write(fs, f"{root}/{key}/{name}", data)
            new_parts[key] = {"file": f"{key}/{name}", "digest": digests[key], "rows": len(rows),
                              "bytes": len(data)}
            rep.files_written += 1
            rep.rows_written += len(rows)
            rep.bytes_written += len(data)
        for key in sorted(set(old) - set(parts)):
            try:
                fs.delete_file(f"{root}/{old[key]['file']}")
            except FileNotFoundError:
                pass
            rep.files_removed += 1
        if rep.files_written or rep.files_removed or not old:
            body = {"format": _FORMAT, "buckets": buckets, "partitions": new_parts,
                    "messages": rep.messages, "published_at": time.time()}
            _write(fs, f"{root}/{MANIFEST_NAME}", json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
        rep.partitions = len(new_parts)
    finally:
        if own:
            repo.close()
    rep.seconds = time.perf_counter() - t0
    return rep
