"""Every file and folder name rune_fast gives on disk, in one place.

docs/FORMAT.md describes what each file holds; this module is the one
place the names are spelled, so that the writers, recovery, ``verify`` and
the CLI's read-only readers agree on them (a name is part of the on-disk
format: none of these may change). A state directory holds::

    events.jsonl                          EVENTS_NAME (the shared event journal)
    .lock-<kind>                          lock_name(kind)
    hot/                                  HOT_DIR
      conversation_manifest.json          MANIFEST_NAME
      conversation_tail.jsonl             TAIL_NAME
      conversation_tail.durable           MARK_NAME
      conversation_seg-<n:08d>.jsonl      seg_name(n)
      conversation_seg-<n:08d>.grams      filters_name(n)
      conversation_index.snap             SNAPSHOT_NAME
      conversation_tombstones.jsonl       TOMBSTONES_NAME
      conversation_messages.json          LEGACY_NAME (an old store's checkpoint)
      device_id                           DEVICE_NAME
      task_state.json                     TASK_STATE_NAME
      task_log-<gen:08d>.jsonl            task_log_name(gen)
      redis-<digest>.published            redis_published_name(digest)
      quarantine/                         QUARANTINE_DIR (torn final lines)
      conversation_cool/                  COOL_DIR
        cool-<n:08d>.parquet              cool_parquet_name(n)
      conversation_cool_index/            cool_index_dir(cool_dir)
        cool-<n:08d>.idx, .grams          cool_idx_name(n), cool_grams_name(n)

Temporary files are ``.<name>.tmp`` beside their final name (tmp_name).
"""
from __future__ import annotations

import os
import re

EVENTS_NAME = "events.jsonl"
HOT_DIR = "hot"

MANIFEST_NAME = "conversation_manifest.json"
SNAPSHOT_NAME = "conversation_index.snap"
TOMBSTONES_NAME = "conversation_tombstones.jsonl"
LEGACY_NAME = "conversation_messages.json"
DEVICE_NAME = "device_id"
QUARANTINE_DIR = "quarantine"
TAIL_NAME = "conversation_tail.jsonl"
MARK_NAME = "conversation_tail.durable"
#: what every sealed segment's file name (and its filters') begins with
SEG_PREFIX = "conversation_seg-"

COOL_DIR = "conversation_cool"
#: a cool archive's own file name
COOL_PARQUET_RE = re.compile(r"^cool-(\d{8,})\.parquet$")
#: any file the cool archive writes (its archives, sidecars and their temporaries)
COOL_OURS_RE = re.compile(r"^\.?cool-(\d{8,})\.(parquet|idx|grams)(\.tmp)?$")

TASK_STATE_NAME = "task_state.json"
TASK_LOG_RE = re.compile(r"task_log-(\d{8})\.jsonl")
TASK_LOG_PREFIX = "task_log-"

#: the publish manifest written last into a published dataset's folder
PUBLISH_MANIFEST_NAME = "_rune_publish.json"
#: the LangGraph checkpoint saver's log in its own folder
CHECKPOINT_LOG_NAME = "checkpoints.log"


def seg_name(seg: int) -> str:
    """File name of sealed segment ``seg``."""
    return f"{SEG_PREFIX}{seg:08d}.jsonl"


def filters_name(seg: int) -> str:
    """File name of the search filters kept for sealed segment ``seg``."""
    return f"{SEG_PREFIX}{seg:08d}.grams"


def task_log_name(gen: int) -> str:
    """File name of the task ledger's log of generation ``gen``."""
    return f"{TASK_LOG_PREFIX}{gen:08d}.jsonl"


def cool_parquet_name(no: int) -> str:
    """File name of cool archive ``no``."""
    return f"cool-{no:08d}.parquet"


def cool_idx_name(no: int) -> str:
    """File name of the id sidecar of cool archive ``no``."""
    return f"cool-{no:08d}.idx"


def cool_grams_name(no: int) -> str:
    """File name of the gram-filter sidecar of cool archive ``no``."""
    return f"cool-{no:08d}.grams"


def cool_index_dir(cool_dir: str) -> str:
    """The folder of the sidecars of the archive in ``cool_dir``: its
    sibling ``<cool_dir>_index``."""
    return os.path.normpath(cool_dir) + "_index"


def lock_name(kind: str) -> str:
    """File name of the lock of ``kind`` ("conversation", "task", ...)."""
    return f".lock-{kind}"


def redis_published_name(digest: str) -> str:
    """File name of the keys a Redis sync published (``digest`` names the stream)."""
    return f"redis-{digest}.published"


def tmp_name(name: str) -> str:
    """The hidden temporary a file ``name`` is written as before its rename."""
    return "." + name + ".tmp"
