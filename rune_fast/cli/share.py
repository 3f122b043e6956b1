"""The subcommands that hand a store to engines beyond this machine:
``publish`` (a Parquet dataset query engines read, :mod:`rune_fast.publish`)
and ``sync`` (devices exchanging ops through Redis Streams,
:mod:`rune_fast.redis_sync`)."""
from __future__ import annotations

import argparse
import dataclasses
import signal
import threading
from typing import Callable

from .._fmt import kv_table, print_json
from ._common import open_writer, require_state

Add = Callable[..., argparse.ArgumentParser]


def register(add: Add) -> None:
    sp = add("publish", cmd_publish, "write the messages as a partitioned Parquet dataset",
             "Write every live message to a Hive-partitioned Parquet dataset (day, channel hash "
             "bucket) at URI: a folder or s3://bucket/prefix (endpoint and credentials from the "
             "AWS_* environment variables or the URI's options). Incremental: only partitions whose "
             "messages changed are written. Opens the store read-only, beside a running writer.")
    sp.add_argument("uri", help="a folder, or s3://bucket/prefix[?endpoint_override=HOST:PORT&scheme=http]")
    sp.add_argument("--buckets", type=int, default=8, help="channel hash buckets a day (default 8; fixed per dataset)")

    sp = add("sync", cmd_sync, "exchange messages with other devices through Redis Streams",
             "Publish this store's new messages and deletions to a Redis stream and merge the other "
             "devices' (at least once; merging is idempotent), every --interval seconds until "
             "interrupted, or once with --once. Takes the store's writer lock: run it where no "
             "other writer holds the store, or use rune_fast.redis_sync.RedisSync in the writer.")
    sp.add_argument("--redis", required=True, metavar="URL", help="redis://HOST:PORT/DB")
    sp.add_argument("--stream", default="rune:ops", help="the stream name (default rune:ops)")
    sp.add_argument("--interval", type=float, default=1.0, help="seconds between rounds (default 1)")
    sp.add_argument("--once", action="store_true", help="one round, then exit")


def cmd_publish(args: argparse.Namespace) -> int:
    """Publish the store's messages as a Parquet dataset."""
    from ..publish import publish

    rep = publish(require_state(args), args.uri, buckets=args.buckets)
    if args.json:
        print_json(dataclasses.asdict(rep))
    else:
        print(kv_table(dataclasses.asdict(rep).items()))
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    """Sync the store with other devices through Redis Streams."""
    from ..redis_sync import RedisSync

    with open_writer(args) as repo:        # (a new device's store is made here)
        sync = RedisSync(repo, args.redis, stream=args.stream)
        try:
            if args.once:
                pushed, merged = sync.sync_once()
                out = {"published": pushed, "merged": merged, "group": sync.group}
                if args.json:
                    print_json(out)
                else:
                    print(kv_table(out.items()))
                return 0
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            try:
                sync.run(stop, interval=args.interval)
            except KeyboardInterrupt:
                stop.set()
            return 0
        finally:
            sync.close()
