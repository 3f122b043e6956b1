"""A seeded, realistic workload of LLM-agent conversation messages.

``generate(n, seed=...)`` returns a :class:`Workload`: ``n`` messages spread
over ``channels`` channels (busy and quiet ones, Zipf-like) and ``tasks`` tasks
(contiguous stretches of a channel's traffic), deterministic for a given seed.

Each message is a plain dict with the constructor fields of
``rune_fast.records.ConversationMessageRecord`` (``msg_id``, ``ts``, ``role``,
``content``, ``channel_id``, ``task_id``, ``tool_calls``, ``tool_call_id``,
``origin``, ``hlc``). A store under test turns them into its own message type
through a *message factory* (:func:`default_message_factory` builds the real
record).

What makes it realistic:

- turns follow the shape of agent traffic per channel: ``user`` ->
  ``assistant`` (about a third carry 1-2 ``tool_calls`` with JSON string
  arguments) -> one ``tool`` message per call (with its ``tool_call_id``) ->
  ``assistant`` ...; about 4% ``system`` messages;
- content lengths are log-normal per role: short user lines, medium assistant
  answers, tool outputs up to 16 KiB; the median over all messages is about
  300 bytes of UTF-8;
- text mixes English technical prose, accents (``café``, ``naïve``), German
  ``ß``, CJK, emoji and JSON/log-shaped tool output;
- ids are ``"msg_"`` + 26 Crockford base32 characters (ULID-like: 48-bit
  milliseconds + 80 random bits), ``"task_"`` + 26 likewise;
- two marker phrases are planted in a known fraction of messages, in three
  case variants each, for searches: :data:`NEEDLE_ASCII` (about 0.3% of
  messages) and :data:`NEEDLE_UNICODE` (about 0.1%; only a Unicode-aware
  case fold finds all its variants).
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from ..records import ConversationMessageRecord

__all__ = [
    "NEEDLE_ASCII",
    "NEEDLE_UNICODE",
    "Workload",
    "generate",
    "new_id",
    "to_plain_dict",
    "json_line",
    "content_bytes",
    "expected_hits",
    "default_message_factory",
]

#: Needle of the case-insensitive search timings: ASCII, so SQLite's ``lower()``
#: and a Unicode case fold agree on which messages match.
NEEDLE_ASCII = "Quarterly report"
#: Needle of the correctness line: its variants ``Überweisung`` and
#: ``ÜBERWEISUNG`` match only under Unicode case folding, not SQLite's ASCII ``lower()``.
NEEDLE_UNICODE = "überweisung"

_ASCII_VARIANTS = ("quarterly report", "Quarterly Report", "QUARTERLY REPORT")
_UNICODE_VARIANTS = ("überweisung", "Überweisung", "ÜBERWEISUNG")

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

_WORDS = (
    "the a to of and in is for that it with on as be this are we can not you "
    "file function error test build deploy server request response cache index "
    "query latency memory thread lock commit branch merge review patch config "
    "value return string list dict number timeout retry token model prompt "
    "context window channel task message agent tool result output input schema "
    "version update delete create read write check parse format encode decode "
    "please could would should maybe thanks sure okay done next step plan "
    "because however therefore instead also only then when while where which "
    "python rust sqlite parquet numpy json yaml docker kubernetes linux socket "
    "user assistant system customer invoice payment order report summary draft"
).split()
_UNICODE_WORDS = (
    "café naïve façade résumé déjà-vu Straße groß Fußgänger Grüße Ärger "
    "Ñandú señor São Paulo İstanbul Øresund Ångström ΣΊΣΥΦΟΣ Ελλάδα Москва "
    "東京 日本語 データベース 検索 中文 数据 会话 한국어 🚀 😀 ✅ 🔥 👍 ±5 µs €42 —"
).split()
_TOOLS = ("read_file", "run_shell", "search_code", "http_get", "sql_query",
          "write_file", "list_dir", "calendar_lookup")
_PATHS = ("src/app.py", "src/db/models.py", "README.md", "docs/guide.md",
          "tests/test_api.py", "web/index.tsx", "config/prod.yaml", "Makefile")

# Per role: (median length in characters, log-normal sigma, min, max).
_LENGTHS = {
    "user": (130.0, 0.9, 2, 4_000),
    "assistant": (480.0, 0.95, 8, 12_000),
    "tool": (800.0, 1.25, 4, 16_000),
    "system": (260.0, 0.6, 20, 3_000),
}


def _crockford(value: int, width: int) -> str:
    out = []
    for _ in range(width):
        out.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_id(prefix: str, ts: float, rng: random.Random) -> str:
    """``prefix + "_" + 26`` Crockford base32 chars: 48-bit ms of ``ts`` + 80 random bits."""
    ms = int(ts * 1000) & ((1 << 48) - 1)
    return f"{prefix}_{_crockford((ms << 80) | rng.getrandbits(80), 26)}"


def _prose_corpus(rng: random.Random, chars: int) -> str:
    parts: list[str] = []
    size = 0
    sentence = 0
    while size < chars:
        if rng.random() < 0.07:
            word = rng.choice(_UNICODE_WORDS)
        else:
            word = rng.choice(_WORDS)
        if sentence == 0:
            word = word[:1].upper() + word[1:]
        sentence += 1
        if sentence > rng.randint(6, 18):
            word += rng.choice((".", ".", ".", "?", "!", ".\n", ".\n\n"))
            sentence = 0
        elif rng.random() < 0.06:
            word += ","
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)


def _tool_corpus(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        kind = rng.random()
        if kind < 0.4:
            line = json.dumps({
                "path": rng.choice(_PATHS), "line": rng.randint(1, 4000),
                "status": rng.choice(("ok", "modified", "error", "skipped")),
                "note": " ".join(rng.choice(_WORDS + _UNICODE_WORDS) for _ in range(rng.randint(2, 9))),
            }, ensure_ascii=False)
        elif kind < 0.75:
            line = (f"2026-11-{rng.randint(1, 30):02d}T{rng.randint(0, 23):02d}:"
                    f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z "
                    f"{rng.choice(('INFO', 'WARN', 'DEBUG', 'ERROR'))} "
                    f"{rng.choice(_WORDS)}.{rng.choice(_WORDS)}: "
                    + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))))
        else:
            line = (f"    def {rng.choice(_WORDS)}_{rng.choice(_WORDS)}(self, "
                    f"{rng.choice(_WORDS)}: int = {rng.randint(0, 99)}) -> str:  # "
                    + " ".join(rng.choice(_WORDS + _UNICODE_WORDS) for _ in range(rng.randint(1, 6))))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _draw_length(rng: random.Random, role: str) -> int:
    median, sigma, lo, hi = _LENGTHS[role]
    return max(lo, min(hi, int(rng.lognormvariate(math.log(median), sigma))))


@dataclass
class Workload:
    """The generated messages (plain dicts) and the ids to query them by."""

    seed: int
    messages: list[dict[str, Any]]
    channel_ids: list[str]
    task_ids: list[str]
    channel_tasks: dict[str, list[str]] = field(repr=False)
    _gen: "_Generator" = field(repr=False)

    def __len__(self) -> int:
        return len(self.messages)

    def fresh(self, count: int, seed: int) -> list[dict[str, Any]]:
        """``count`` new messages (ids not in ``messages``) on the same channels and tasks.

        Deterministic for a given ``seed``; used for the append timings, which
        must add messages the store does not hold yet.
        """
        rng = random.Random((self.seed << 20) ^ 0x5EED ^ seed)
        return self._gen.stream(rng, count, fresh=True)

    def sample(self, seq: Sequence[Any], k: int, seed: int) -> list[Any]:
        """``k`` items drawn (with replacement) from ``seq``, deterministic for ``seed``."""
        rng = random.Random(seed)
        return [seq[rng.randrange(len(seq))] for _ in range(k)]

    def sample_ids(self, k: int, seed: int = 1) -> list[str]:
        return [m["msg_id"] for m in self.sample(self.messages, k, seed)]

    def sample_channels(self, k: int, seed: int = 2) -> list[str]:
        return self.sample(self.channel_ids, k, seed)

    def sample_tasks(self, k: int, seed: int = 3) -> list[str]:
        return self.sample(self.task_ids, k, seed)


class _Generator:
    def __init__(self, seed: int, channel_ids: list[str], channel_tasks: dict[str, list[str]],
                 weights: list[float], n: int) -> None:
        rng = random.Random(seed ^ 0xC0FFEE)
        # Texts are slices of two corpora at random offsets; small workloads get
        # smaller corpora (still far longer than the longest message).
        chars = min(400_000, max(40_000, 1_000 * n))
        self.prose = _prose_corpus(rng, chars)
        self.tool = _tool_corpus(rng, chars)
        self.channel_ids = channel_ids
        self.channel_tasks = channel_tasks
        self.cum_weights = list(_accumulate(weights))
        # Per channel conversation state: pending tool call ids, last role.
        self.pending: dict[str, list[str]] = {c: [] for c in channel_ids}
        self.last: dict[str, str] = {c: "" for c in channel_ids}
        self.ts = 1_764_000_000.0

    def _text(self, rng: random.Random, role: str) -> str:
        n = _draw_length(rng, role)
        corpus = self.tool if role == "tool" else self.prose
        start = rng.randrange(0, len(corpus) - n - 1)
        text = corpus[start:start + n].strip() or "ok"
        r = rng.random()
        if r < 0.003:
            variant = _ASCII_VARIANTS[rng.randrange(3)]
        elif r < 0.004:
            variant = _UNICODE_VARIANTS[rng.randrange(3)]
        else:
            return text
        cut = rng.randrange(0, len(text) + 1)
        return f"{text[:cut]} {variant} {text[cut:]}"

    def _next_role(self, rng: random.Random, channel: str) -> str:
        if self.pending[channel]:
            return "tool"
        last = self.last[channel]
        if last == "user":
            return "assistant"
        if last == "tool":
            return "assistant"
        if rng.random() < 0.04:
            return "system"
        return "user"

    def stream(self, rng: random.Random, count: int, *, fresh: bool = False,
               task_plan: Callable[[str, int], str] | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        choices = rng.choices(self.channel_ids, cum_weights=self.cum_weights, k=count)
        pos: dict[str, int] = {}
        for channel in choices:
            self.ts += rng.expovariate(0.5)
            role = self._next_role(rng, channel)
            i = pos.get(channel, 0)
            pos[channel] = i + 1
            if task_plan is not None:
                task = task_plan(channel, i)
            else:
                task = self.channel_tasks[channel][-1]
            if role == "system" or rng.random() < 0.05:
                task = ""
            tool_calls: tuple[dict[str, str], ...] = ()
            tool_call_id = ""
            content = self._text(rng, role)
            if role == "assistant" and rng.random() < 0.35:
                calls = []
                for _ in range(rng.choice((1, 1, 1, 2))):
                    call_id = "call_" + _crockford(rng.getrandbits(120), 24).lower()
                    name = rng.choice(_TOOLS)
                    args = {"path": rng.choice(_PATHS), "query": rng.choice(_WORDS + _UNICODE_WORDS),
                            "limit": rng.randint(1, 100)}
                    calls.append({"id": call_id, "name": name,
                                  "arguments": json.dumps(args, ensure_ascii=False)})
                tool_calls = tuple(calls)
                self.pending[channel] = [c["id"] for c in calls]
                if rng.random() < 0.5:
                    content = content[: max(0, len(content) // 8)]
            elif role == "tool":
                tool_call_id = self.pending[channel].pop(0)
            self.last[channel] = role
            out.append({
                "msg_id": new_id("msg", self.ts, rng),
                "ts": round(self.ts, 6),
                "role": role,
                "content": content,
                "channel_id": channel,
                "task_id": task,
                "tool_calls": tool_calls,
                "tool_call_id": tool_call_id,
                "origin": "",
                "hlc": "",
            })
        return out


def _accumulate(values: Iterable[float]) -> Iterable[float]:
    total = 0.0
    for v in values:
        total += v
        yield total


def generate(n: int, *, channels: int | None = None, tasks: int | None = None,
             seed: int = 0) -> Workload:
    """``n`` messages over ``channels`` channels and ``tasks`` tasks, deterministic for ``seed``.

    Defaults scale with ``n``: ``channels = clamp(n // 1000, 2, 1000)`` and
    ``tasks = max(channels, n // 40)`` (a task holds about 40 messages).
    """
    if channels is None:
        channels = max(2, min(1000, n // 1000))
    if tasks is None:
        tasks = max(channels, n // 40)
    rng = random.Random(seed)
    channel_ids = [f"chan-{i:04d}-{rng.choice(('discord', 'slack', 'cli', 'web'))}"
                   for i in range(channels)]
    weights = [1.0 / (i + 1) ** 0.8 for i in range(channels)]
    total_w = sum(weights)
    # Tasks per channel in proportion to its expected traffic (at least one each).
    per_channel = [max(1, round(tasks * w / total_w)) for w in weights]
    channel_tasks: dict[str, list[str]] = {}
    task_ids: list[str] = []
    ts0 = 1_763_000_000.0
    for c, k in zip(channel_ids, per_channel):
        ids = [new_id("task", ts0 + len(task_ids), rng) for _ in range(k)]
        channel_tasks[c] = ids
        task_ids.extend(ids)
    expected = {c: max(1.0, n * w / total_w) for c, w in zip(channel_ids, weights)}

    def plan(channel: str, i: int) -> str:
        ts = channel_tasks[channel]
        return ts[min(len(ts) - 1, int(i * len(ts) / expected[channel]))]

    gen = _Generator(seed, channel_ids, channel_tasks, weights, n)
    messages = gen.stream(rng, n, task_plan=plan)
    return Workload(seed=seed, messages=messages, channel_ids=channel_ids,
                    task_ids=task_ids, channel_tasks=channel_tasks, _gen=gen)


def to_plain_dict(msg: Any) -> dict[str, Any]:
    """The JSON-safe dict of a message: ``msg.to_dict()`` for a record, else the dict with lists."""
    to_dict = getattr(msg, "to_dict", None)
    if to_dict is not None:
        return to_dict()
    d = dict(msg)
    d["tool_calls"] = [dict(c) for c in d.get("tool_calls", ())]
    return d


def json_line(msg: Any) -> bytes:
    """The canonical JSON line of a message (SPEC section 5's encoding, plus a newline).

    These are the bytes the raw ``write`` + ``fdatasync`` baseline writes.
    """
    return json.dumps(to_plain_dict(msg), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8") + b"\n"


def content_bytes(messages: Iterable[Any]) -> int:
    """Total UTF-8 bytes of the ``content`` of ``messages`` (dicts or records)."""
    total = 0
    for m in messages:
        c = m["content"] if isinstance(m, dict) else m.content
        total += len(c.encode("utf-8"))
    return total


def expected_hits(messages: Iterable[Any], needle: str) -> int:
    """How many messages contain ``needle`` under SPEC's rule ``text.casefold() in content.casefold()``."""
    folded = needle.casefold()
    n = 0
    for m in messages:
        c = m["content"] if isinstance(m, dict) else m.content
        if folded in c.casefold():
            n += 1
    return n


def default_message_factory(d: dict[str, Any]) -> Any:
    """Message factory for the real store: ``ConversationMessageRecord(**d)``."""
    return ConversationMessageRecord(**d)
