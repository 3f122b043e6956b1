"""A seeded, realistic workload of LLM-agent conversation messages.

``generate(n, seed=...)`` returns a :class:`Workload`: ``n`` messages spread
over ``channels`` channels (busy and quiet ones, Zipf-like) and ``tasks`` tasks,
deterministic for a given seed. :func:`iter_batches` yields the same messages
batch by batch without keeping them (the 10,000,000-message build).

Each message is a plain dict with the constructor fields of
``rune_fast.records.ConversationMessageRecord`` (``msg_id``, ``ts``, ``role``,
``content``, ``channel_id``, ``task_id``, ``tool_calls``, ``tool_call_id``,
``origin``, ``hlc``). A store under test turns them into its own message type
through a *message factory* (:func:`default_message_factory` builds the real
record).

What makes it realistic (the shape issue 33 asks for):

- 100 channels and 1,000 tasks by default (fewer for tiny workloads); turns
  follow the shape of agent traffic per channel: ``user`` -> ``assistant``
  (about a third carry 1-2 ``tool_calls`` with JSON string arguments) -> one
  ``tool`` message per call (with its ``tool_call_id``) -> ``assistant`` ...;
  about 4% ``system`` messages;
- a task is a stretch of its channel's life that overlaps the channel's other
  tasks, of varied length: its messages are interleaved with other tasks' and
  other channels' traffic, so they end up spread over many archive files, and
  the biggest tasks hold hundreds of messages from 100,000 messages on;
- content lengths are log-normal per role (short user lines, medium
  assistant answers, tool outputs up to 16 KiB), about 450 bytes of UTF-8 on
  average;
- about a third of the conversational messages are written in another
  language than English (German, French, Spanish, Turkish with its dotted and
  dotless i, Greek with final sigma, Russian, Japanese, Chinese), English
  prose carries names and accents, and emoji turn up everywhere: more than
  30% of the messages hold non-ASCII text (:func:`non_ascii_share`);
- ids are ``"msg_"`` + 26 Crockford base32 characters (ULID-like: 48-bit
  milliseconds + 80 random bits), ``"task_"`` + 26 likewise.

Search needles (:data:`NEEDLES`) are planted in a known share of messages in
several case variants each, one per class: rare ASCII, rare non-ASCII, an
expansion (``ß`` found by ``SS``), CJK, one in about 10% of messages and a
common one in most messages. :func:`needle_truth` counts their hits with
``str.casefold`` (SPEC's rule), so the harness checks every store's answer.
"""
from __future__ import annotations

import json
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..records import ConversationMessageRecord

__all__ = [
    "NEEDLE_ASCII",
    "NEEDLE_UNICODE",
    "Needle",
    "NEEDLES",
    "Workload",
    "generate",
    "iter_batches",
    "new_id",
    "to_plain_dict",
    "json_line",
    "content_bytes",
    "expected_hits",
    "needle_truth",
    "non_ascii_share",
    "default_message_factory",
]


@dataclass(frozen=True)
class Needle:
    """A planted search term: ``query`` is what the benchmark searches for.

    ``variants`` are the spellings planted (each in about ``share / len``
    of the messages); a Unicode case fold matches every one of them, SQLite's
    ASCII-only ``lower()`` may not.
    """

    cls: str
    query: str
    variants: tuple[str, ...]
    share: float
    about: str


#: One needle per class, in table order.
NEEDLES: tuple[Needle, ...] = (
    Needle("rare_ascii", "quarterly report", ("quarterly report", "Quarterly Report", "QUARTERLY REPORT"),
           0.002, "rare ASCII (0.2%)"),
    Needle("rare_nonascii", "zürich", ("zürich", "Zürich", "ZÜRICH"), 0.002,
           "rare non-ASCII (0.2%; SQLite's lower() misses 'ZÜRICH')"),
    Needle("expansion", "GOETHESTRASSE", ("Goethestraße", "GOETHESTRASSE", "goethestrasse"), 0.002,
           "expansion: 'GOETHESTRASSE' finds 'Goethestraße' (0.2%)"),
    Needle("cjk", "量子計算機", ("量子計算機",), 0.002, "CJK, no case (0.2%)"),
    Needle("ten_pct", "checkpoint", ("checkpoint", "Checkpoint", "CHECKPOINT"), 0.10,
           "in about 10% of messages"),
    Needle("common", "session", ("session", "Session", "SESSION"), 0.70, "common: in about 70% of messages"),
)
_BY_CLASS = {nd.cls: nd for nd in NEEDLES}

#: The rare ASCII needle (kept for callers of the older harness).
NEEDLE_ASCII = _BY_CLASS["rare_ascii"].query
#: The rare non-ASCII needle: ``ZÜRICH`` matches it only under Unicode case folding.
NEEDLE_UNICODE = _BY_CLASS["rare_nonascii"].query

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
# Names, accents and symbols that turn up in English prose.
_SPRINKLE = (
    "café naïve façade résumé déjà-vu Straße groß Grüße Ärger Ñandú señor São Paulo İstanbul "
    "Øresund Ångström Ελλάδα Москва 東京 日本語 中文 한국어 🚀 😀 ✅ 🔥 👍 🎉 🤖 ±5 µs €42 — «ok»"
).split()
# Per language: (words, joiner). The lists avoid every needle.
_LANGS: dict[str, tuple[str, str]] = {
    "de": ("und der die das ist nicht für mit über größer Größe Straße müssen können Bestellung "
           "Rechnung Kunde Lieferung Übersicht Änderung prüfen Fehler Zahlung bitte danke schön "
           "heute morgen Grüße Fußgänger weiß Maßnahme äußerst Empfänger Schlüssel", " "),
    "fr": ("le la les des une est pas pour avec être été déjà très où façade garçon naïve Noël "
           "français problème réponse données requête mise à jour tâche élève cœur œuvre "
           "Ça marche réglé ÉTÉ", " "),
    "es": ("el la los las una está para con año señor niño mañana pequeño información búsqueda "
           "configuración ¿qué? ¡hola! canción corazón también después AÑO Ñandú", " "),
    "tr": ("ve bir bu için değil ılık ışık İstanbul İzmir şehir çalışma kılavuz dosya sunucu "
           "arama sıra görev ileti kullanıcı büyük küçük iyi IŞIK DİKKAT ığdır", " "),
    "el": ("και το της είναι για με στο Ελλάδα λόγος ΣΊΣΥΦΟΣ Σίσυφος οδός αναζήτηση μήνυμα "
           "διακομιστής σφάλμα ρυθμίσεις χρήστης κόσμος νόμος ΟΔΟΣ ΚΌΣΜΟΣ", " "),
    "ru": ("и в не на что это для как Москва сообщение ошибка поиск сервер задача пользователь "
           "данные файл запрос ответ привет спасибо ёлка ПРИВЕТ Ёж", " "),
    "ja": ("これは テスト です データベース 検索 会議 東京 日本語 メッセージ エラー サーバー 設定 "
           "ユーザー ファイル 確認 お願いします ありがとう 。 、", ""),
    "zh": ("我们 数据 会话 搜索 服务器 错误 用户 文件 请求 响应 配置 任务 消息 谢谢 今天 明天 问题 。 ，", ""),
}
_LANG_NAMES = tuple(_LANGS)
# Share of user/assistant/system messages written in another language than English.
_FOREIGN_SHARE = 0.34

_TOOLS = ("read_file", "run_shell", "search_code", "http_get", "sql_query",
          "write_file", "list_dir", "calendar_lookup")
_PATHS = ("src/app.py", "src/db/models.py", "README.md", "docs/guide.md",
          "tests/test_api.py", "web/index.tsx", "config/prod.yaml", "Makefile")

# Per role: (median length in characters, log-normal sigma, min, max).
_LENGTHS = {
    "user": (90.0, 0.9, 2, 4_000),
    "assistant": (300.0, 0.9, 8, 12_000),
    "tool": (380.0, 1.1, 4, 16_000),
    "system": (200.0, 0.6, 20, 3_000),
}
# Messages per generation chunk: generate() and iter_batches() draw the same
# random numbers in the same order, so their messages are identical.
_CHUNK = 10_000


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


def _prose_corpus(rng: random.Random, chars: int, words: Sequence[str], joiner: str = " ",
                  sprinkle: float = 0.015) -> str:
    parts: list[str] = []
    size = 0
    sentence = 0
    while size < chars:
        word = rng.choice(_SPRINKLE) if rng.random() < sprinkle else rng.choice(words)
        if sentence == 0 and joiner:
            word = word[:1].upper() + word[1:]
        sentence += 1
        if sentence > rng.randint(6, 18):
            if joiner:
                word += rng.choice((".", ".", ".", "?", "!", ".\n", ".\n\n"))
            sentence = 0
        elif joiner and rng.random() < 0.06:
            word += ","
        parts.append(word)
        size += len(word) + len(joiner)
    return joiner.join(parts)


def _tool_corpus(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    notes = _WORDS + _SPRINKLE + _LANGS["de"][0].split() + _LANGS["ja"][0].split()
    while size < chars:
        kind = rng.random()
        if kind < 0.4:
            line = json.dumps({
                "path": rng.choice(_PATHS), "line": rng.randint(1, 4000),
                "status": rng.choice(("ok", "modified", "error", "skipped")),
                "note": " ".join(rng.choice(notes) for _ in range(rng.randint(2, 9))),
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
                    + " ".join(rng.choice(notes) for _ in range(rng.randint(1, 6))))
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
        return self._gen.stream(rng, count, {}, fresh=True)

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

    def task_sizes(self) -> dict[str, int]:
        """Messages per task id (tasks with no message are left out)."""
        sizes: dict[str, int] = {}
        for m in self.messages:
            t = m["task_id"]
            if t:
                sizes[t] = sizes.get(t, 0) + 1
        return sizes


class _Generator:
    def __init__(self, seed: int, channel_ids: list[str], channel_tasks: dict[str, list[str]],
                 weights: list[float], n: int) -> None:
        rng = random.Random(seed ^ 0xC0FFEE)
        # Texts are slices of corpora at random offsets; small workloads get
        # smaller corpora (still far longer than the longest message).
        chars = min(400_000, max(40_000, 1_000 * n))
        self.prose = _prose_corpus(rng, chars, _WORDS)
        self.tool = _tool_corpus(rng, chars)
        self.foreign = {lang: _prose_corpus(rng, max(20_000, chars // 4), words.split(), joiner, 0.02)
                        for lang, (words, joiner) in _LANGS.items()}
        self.channel_ids = channel_ids
        self.channel_tasks = channel_tasks
        self.cum_weights = list(_accumulate(weights))
        # Per channel conversation state: pending tool call ids, last role.
        self.pending: dict[str, list[str]] = {c: [] for c in channel_ids}
        self.last: dict[str, str] = {c: "" for c in channel_ids}
        self.ts = 1_764_000_000.0

    def _text(self, rng: random.Random, role: str) -> str:
        n = _draw_length(rng, role)
        if role == "tool":
            corpus = self.tool
        elif rng.random() < _FOREIGN_SHARE:
            corpus = self.foreign[_LANG_NAMES[rng.randrange(len(_LANG_NAMES))]]
        else:
            corpus = self.prose
        n = min(n, len(corpus) - 2)
        start = rng.randrange(0, len(corpus) - n - 1)
        text = corpus[start:start + n].strip() or "ok"
        for nd in NEEDLES:
            if rng.random() < nd.share:
                variant = nd.variants[rng.randrange(len(nd.variants))]
                cut = rng.randrange(0, len(text) + 1)
                text = f"{text[:cut]} {variant} {text[cut:]}"
        return text

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

    def stream(self, rng: random.Random, count: int, pos: dict[str, int], *, fresh: bool = False,
               task_plan: Callable[[str, int], str] | None = None) -> list[dict[str, Any]]:
        """``count`` messages; ``pos`` (messages so far per channel) is updated in place."""
        out: list[dict[str, Any]] = []
        choices = rng.choices(self.channel_ids, cum_weights=self.cum_weights, k=count)
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
                    args = {"path": rng.choice(_PATHS), "query": rng.choice(_WORDS + _SPRINKLE),
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


def _apportion(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights``, at least 1 each, summing to ``total``
    (largest remainders) when ``total >= len(weights)``."""
    raw = [total * w / sum(weights) for w in weights]
    out = [max(1, int(x)) for x in raw]
    by_fraction = sorted(range(len(raw)), key=lambda i: int(raw[i]) - raw[i])
    i = 0
    while sum(out) < total:
        out[by_fraction[i % len(out)]] += 1
        i += 1
    while sum(out) > total and max(out) > 1:
        out[out.index(max(out))] -= 1
    return out


class _Plan:
    """Channels, tasks and the generator of one workload, before any message."""

    def __init__(self, n: int, channels: int | None, tasks: int | None, seed: int) -> None:
        if channels is None:
            channels = 100 if n >= 10_000 else max(2, n // 100)
        if tasks is None:
            tasks = 1_000 if n >= 10_000 else max(channels, n // 10)
        self.n = n
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.channel_ids = [f"chan-{i:04d}-{rng.choice(('discord', 'slack', 'cli', 'web'))}"
                            for i in range(channels)]
        weights = [1.0 / (i + 1) ** 0.8 for i in range(channels)]
        total_w = sum(weights)
        # Tasks per channel in proportion to its expected traffic (at least one each).
        per_channel = _apportion(tasks, weights)
        self.channel_tasks: dict[str, list[str]] = {}
        self.task_ids: list[str] = []
        ts0 = 1_763_000_000.0
        # Each task covers a stretch [start, end) of its channel's life (as a
        # fraction of it); stretches overlap, so a task's messages are
        # interleaved with its channel's other tasks and spread over the archive.
        self.spans: dict[str, list[tuple[float, float, str]]] = {}
        span_rng = random.Random(seed ^ 0x7A5C)
        for c, k in zip(self.channel_ids, per_channel):
            ids = [new_id("task", ts0 + len(self.task_ids), rng) for _ in range(k)]
            self.channel_tasks[c] = ids
            self.task_ids.extend(ids)
            spans = []
            for j, t in enumerate(ids):
                length = min(0.9, span_rng.lognormvariate(math.log(2.5 / k), 0.8))
                start = min(1.0 - length / 2, max(0.0, (j + span_rng.random()) / k - length / 2))
                spans.append((start, start + length, t))
            self.spans[c] = spans
        self.expected = {c: max(1.0, n * w / total_w) for c, w in zip(self.channel_ids, weights)}
        self.plan_rng = random.Random(seed ^ 0x9E37)
        self.gen = _Generator(seed, self.channel_ids, self.channel_tasks, weights, n)
        self.pos: dict[str, int] = {}

    def task_of(self, channel: str, i: int) -> str:
        f = i / self.expected[channel]
        spans = self.spans[channel]
        live = [t for s, e, t in spans if s <= f < e]
        if live:
            return live[self.plan_rng.randrange(len(live))]
        return min(spans, key=lambda sp: min(abs(sp[0] - f), abs(sp[1] - f)))[2]

    def batches(self, size: int = _CHUNK) -> Iterator[list[dict[str, Any]]]:
        done = 0
        while done < self.n:
            k = min(_CHUNK, self.n - done)
            chunk = self.gen.stream(self.rng, k, self.pos, task_plan=self.task_of)
            done += k
            for i in range(0, len(chunk), size):
                yield chunk[i:i + size]


def generate(n: int, *, channels: int | None = None, tasks: int | None = None,
             seed: int = 0) -> Workload:
    """``n`` messages over ``channels`` channels and ``tasks`` tasks, deterministic for ``seed``.

    Defaults: 100 channels and 1,000 tasks from 10,000 messages on (issue 33's
    shape); a tiny workload gets ``n // 100`` channels (at least 2) and ``n // 10`` tasks.
    """
    plan = _Plan(n, channels, tasks, seed)
    messages: list[dict[str, Any]] = []
    for chunk in plan.batches():
        messages.extend(chunk)
    return Workload(seed=seed, messages=messages, channel_ids=plan.channel_ids,
                    task_ids=plan.task_ids, channel_tasks=plan.channel_tasks, _gen=plan.gen)


def iter_batches(n: int, batch: int, *, channels: int | None = None, tasks: int | None = None,
                 seed: int = 0) -> tuple[list[str], list[str], Iterator[list[dict[str, Any]]]]:
    """``(channel_ids, task_ids, batches)``: the messages of ``generate(n, ...)`` in lists
    of at most ``batch``, made as they are consumed (memory bounded by the chunk)."""
    plan = _Plan(n, channels, tasks, seed)
    return plan.channel_ids, plan.task_ids, plan.batches(batch)


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


def _content_of(m: Any) -> str:
    return m["content"] if isinstance(m, dict) else m.content


def content_bytes(messages: Iterable[Any]) -> int:
    """Total UTF-8 bytes of the ``content`` of ``messages`` (dicts or records)."""
    return sum(len(_content_of(m).encode("utf-8")) for m in messages)


def non_ascii_share(messages: Sequence[Any]) -> float:
    """Share of ``messages`` whose content holds any non-ASCII character."""
    if not messages:
        return 0.0
    return sum(1 for m in messages if not _content_of(m).isascii()) / len(messages)


def expected_hits(messages: Iterable[Any], needle: str) -> int:
    """How many messages contain ``needle`` under SPEC's rule ``text.casefold() in content.casefold()``."""
    folded = needle.casefold()
    return sum(1 for m in messages if folded in _content_of(m).casefold())


@dataclass
class Truth:
    """What a correct ``search(query)`` returns: its hit count and the ids of its newest hits."""

    count: int = 0
    newest: deque = field(default_factory=lambda: deque(maxlen=20))


def needle_truth(messages: Iterable[Any], queries: Iterable[str], keep: int = 20) -> dict[str, Truth]:
    """Per query, one pass of ``str.casefold``: hit count and the ids of the newest ``keep`` hits
    (in append order), the answer every store's search must give."""
    folded = [(q, q.casefold()) for q in queries]
    out = {q: Truth(0, deque(maxlen=keep)) for q, _ in folded}
    for m in messages:
        text = _content_of(m).casefold()
        for q, f in folded:
            if f in text:
                t = out[q]
                t.count += 1
                t.newest.append(m["msg_id"] if isinstance(m, dict) else m.msg_id)
    return out


def default_message_factory(d: dict[str, Any]) -> Any:
    """Message factory for the real store: ``ConversationMessageRecord(**d)``."""
    return ConversationMessageRecord(**d)
