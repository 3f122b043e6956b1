"""Helpers of the core tests: message lines built the way codec.py writes them."""
from __future__ import annotations

import orjson

from rune_fast import _log


def key(s: str) -> bytes:
    """The escaped JSON bytes of s (the index key of an id, channel or task)."""
    return orjson.dumps(s)[1:-1]


def rest(msg_id: str, channel: str, task: str = "", hlc: str = "", content: str = "",
         kind: str = "m", **extra) -> bytes:
    tail = b"".join(b"," + orjson.dumps(k) + b":" + orjson.dumps(v) for k, v in extra.items())
    return (b',"k":"' + kind.encode() + b'","r":{"msg_id":"' + key(msg_id)
            + b'","channel_id":"' + key(channel) + b'","task_id":"' + key(task)
            + b'","hlc":"' + key(hlc) + b'","content":"' + key(content) + b'"' + tail + b"}}")


def line(msg_id: str, channel: str, task: str = "", hlc: str = "", content: str = "",
         kind: str = "m", **extra) -> bytes:
    return _log.frame(rest(msg_id, channel, task, hlc, content, kind, **extra))


def tombstone(msg_id: str, channel: str, hlc: str = "") -> bytes:
    return line(msg_id, channel, "", hlc, "", kind="d")


def word_lines(rng, n: int, words: list[str], chans=("c0", "c1", "c2"), pre: str = "m",
               count: tuple[int, int] = (5, 120)) -> list[bytes]:
    """``n`` message lines ``{pre}{i}`` over ``chans`` in turn, each holding a
    random run of ``words`` (``randrange(*count)`` of them)."""
    return [line(f"{pre}{i}", chans[i % len(chans)],
                 content=" ".join(rng.choice(words) for _ in range(rng.randrange(*count))))
            for i in range(n)]


def by_channels(ix, needle: bytes, ci: bool) -> list[int]:
    """HotIndex.search channel by channel (never filtered), in the order of
    the whole-store search."""
    return [loc for ch in ix.channels() for loc in ix.search(needle, ci, False, ch).tolist()]
