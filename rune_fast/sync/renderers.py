"""Request renderers: repaired messages become Anthropic Messages or
OpenAI Chat Completions ``messages``, and the checkers of both (rules A and O
of ``docs/PROVIDER_RULES.md``).
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .repair import _K_ASSISTANT, _K_TOOL, _K_USER, _blank, _extract, _rule


# -------------------------------------------------------------- renderers

_ANTHROPIC_ID = re.compile(r"[A-Za-z0-9_-]+")
_ANTHROPIC_BAD = re.compile(r"[^A-Za-z0-9_-]")
_OPENAI_ID_MAX = 40


def _anthropic_id(cid: str) -> str:
    """Anthropic tool ids match ``^[a-zA-Z0-9_-]+$``: other ids map, the same
    way every time, to ``t_<cleaned>_<8 hex of sha256>``."""
    if _ANTHROPIC_ID.fullmatch(cid):
        return cid
    h = hashlib.sha256(cid.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"t_{_ANTHROPIC_BAD.sub('_', cid)[:48]}_{h}"


def _openai_id(cid: str) -> str:
    """OpenAI tool call ids are at most 40 characters: longer ids map, the
    same way every time, to ``call_<32 hex of sha256>``."""
    if len(cid) <= _OPENAI_ID_MAX:
        return cid
    return "call_" + hashlib.sha256(cid.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _args_object(args: Any, cid: str) -> dict[str, Any]:
    if isinstance(args, dict):
        return args
    if args is None or args == "":
        return {}
    if isinstance(args, str):
        try:
            obj = json.loads(args)
        except ValueError as e:
            raise ValueError(f"tool call {cid!r}: arguments are not JSON ({e}): {args!r}") from None
        if isinstance(obj, dict):
            return obj
        raise ValueError(f"tool call {cid!r}: arguments are not a JSON object: {args!r}")
    if isinstance(args, Mapping):
        return dict(args)
    raise ValueError(f"tool call {cid!r}: arguments must be an object or a JSON "
                     f"string of one, got {args!r}")


def _args_string(args: Any) -> str:
    # no arguments (None or "") are the empty object, as in _args_object
    if args is None or args == "":
        return "{}"
    if isinstance(args, str):
        return args
    try:
        return json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"tool call arguments are not JSON-serialisable: {e}") from None


def _messages_in(messages: Iterable[Any]) -> list[tuple[int, str, Any, str]]:
    out = []
    for i, m in enumerate(messages):
        e = _extract(m, i)
        if e is not None:
            out.append(e)
    return out


def to_anthropic(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Render a repaired message list as Anthropic Messages API ``messages``.

    Every message's content is a list of blocks: ``{"type": "text", "text"}``
    (blank text is left out), ``{"type": "tool_use", "id", "name", "input"}``
    (``input`` the arguments object; a JSON-string argument is parsed) and, in
    user-role messages, ``{"type": "tool_result", "tool_use_id", "content"}``.
    Adjacent same-role messages are merged into one block list with tool
    results first. Messages before the first user message are dropped (the
    API requires the first message from the user; nothing is invented to
    precede them). Trailing whitespace of a final assistant message is
    removed (the API rejects it). Tool ids outside ``[A-Za-z0-9_-]+`` are
    mapped deterministically. Raises ``ValueError`` naming the call whose
    arguments are not a JSON object.
    """
    items = _messages_in(messages)
    start = next((i for i, e in enumerate(items) if e[0] == _K_USER and not _blank(e[1])),
                 len(items))
    out: list[dict[str, Any]] = []
    for k, text, calls, tuid in items[start:]:
        if k == _K_TOOL:
            role = "user"
            blocks: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": _anthropic_id(tuid),
                                             "content": text}]
        else:
            role = "user" if k == _K_USER else "assistant"
            blocks = [] if _blank(text) else [{"type": "text", "text": text}]
            for c in calls if k == _K_ASSISTANT else ():
                blocks.append({"type": "tool_use", "id": _anthropic_id(c["id"]),
                               "name": c["name"], "input": _args_object(c["arguments"], c["id"])})
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for m in out:
        if m["role"] == "user":
            blocks = m["content"]
            # Tool results must open the user turn that answers the calls.
            if any(b["type"] == "tool_result" for b in blocks[1:]):
                m["content"] = ([b for b in blocks if b["type"] == "tool_result"]
                                + [b for b in blocks if b["type"] != "tool_result"])
    while out and out[-1]["role"] == "assistant":
        blocks = out[-1]["content"]
        last = blocks[-1]
        if last["type"] != "text" or last["text"] == last["text"].rstrip():
            break
        stripped = last["text"].rstrip()
        if stripped:
            blocks[-1] = {"type": "text", "text": stripped}
            break
        blocks.pop()
        if blocks:
            continue
        out.pop()
    return out


def to_openai(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Render a repaired message list as OpenAI Chat Completions ``messages``.

    ``{"role": "user", "content"}``; ``{"role": "assistant", "content",
    "tool_calls": [{"id", "type": "function", "function": {"name",
    "arguments": <JSON string>}}]}`` (``tool_calls`` left out when there are
    none, ``content`` ``None`` when blank beside calls); ``{"role": "tool",
    "tool_call_id", "content"}`` for tool results. Tool ids longer than 40
    characters are mapped deterministically.
    """
    out: list[dict[str, Any]] = []
    for k, text, calls, tuid in _messages_in(messages):
        if k == _K_USER:
            out.append({"role": "user", "content": text})
        elif k == _K_TOOL:
            out.append({"role": "tool", "tool_call_id": _openai_id(tuid), "content": text})
        elif calls:
            out.append({"role": "assistant", "content": None if _blank(text) else text,
                        "tool_calls": [{"id": _openai_id(c["id"]), "type": "function",
                                        "function": {"name": c["name"],
                                                     "arguments": _args_string(c["arguments"])}}
                                       for c in calls]})
        else:
            out.append({"role": "assistant", "content": text})
    return out


def _req_list(req: Any) -> Sequence[Any]:
    if isinstance(req, Mapping):
        return req.get("messages", [])
    return req


def check_anthropic(req_messages: Any) -> list[str]:
    """Violations of the Anthropic request rules (A1-A10 in
    ``docs/PROVIDER_RULES.md``) in a ``messages`` list (or a request dict
    holding one); ``[]`` if valid."""
    msgs = _req_list(req_messages)
    v: list[str] = []
    tool_ids: set[str] = set()
    prev_role = None
    prev_uses: set[str] = set()
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping):
            v.append(_rule("A1", i, f"not a dict: {m!r}"))
            continue
        role = m.get("role")
        if role not in ("user", "assistant"):
            v.append(_rule("A1", i, f"role {role!r} is not user or assistant"))
            continue
        if i == 0 and role != "user":
            v.append(_rule("A2", i, "first message is not from the user"))
        if role == prev_role:
            v.append(_rule("A3", i, f"roles do not alternate ({role} after {role})"))
        blocks = m.get("content")
        if isinstance(blocks, str):
            if _blank(blocks):
                v.append(_rule("A4", i, "empty or whitespace-only content"))
            blocks = [{"type": "text", "text": blocks}]
        if not isinstance(blocks, list) or not blocks:
            v.append(_rule("A4", i, "content is empty or not a list of blocks"))
            blocks = []
        uses: set[str] = set()
        results: set[str] = set()
        seen_non_result = False
        for b in blocks:
            t = b.get("type") if isinstance(b, Mapping) else None
            if t == "text":
                if not isinstance(b.get("text"), str) or _blank(b["text"]):
                    v.append(_rule("A5", i, "text block empty or whitespace-only"))
                seen_non_result = True
            elif t == "tool_use":
                if role != "assistant":
                    v.append(_rule("A6", i, "tool_use block in a user message"))
                bid = b.get("id")
                if not isinstance(bid, str) or not _ANTHROPIC_ID.fullmatch(bid):
                    v.append(_rule("A7", i, f"tool_use id {bid!r} does not match ^[a-zA-Z0-9_-]+$"))
                elif bid in tool_ids:
                    v.append(_rule("A7", i, f"tool_use id {bid!r} used twice"))
                else:
                    tool_ids.add(bid)
                    uses.add(bid)
                if not isinstance(b.get("name"), str) or not isinstance(b.get("input"), dict):
                    v.append(_rule("A6", i, "tool_use block needs a str name and an object input"))
                seen_non_result = True
            elif t == "tool_result":
                if role != "user":
                    v.append(_rule("A6", i, "tool_result block in an assistant message"))
                tu = b.get("tool_use_id")
                if tu not in prev_uses:
                    v.append(_rule("A8", i, f"tool_result {tu!r} answers no tool_use of the "
                                            "previous message"))
                elif tu in results:
                    v.append(_rule("A8", i, f"second tool_result for {tu!r}"))
                results.add(tu)
                if seen_non_result:
                    v.append(_rule("A9", i, "tool_result block after another block"))
                if not isinstance(b.get("content", ""), (str, list)):
                    v.append(_rule("A6", i, "tool_result content is not a str or block list"))
            else:
                v.append(_rule("A6", i, f"unknown block {b!r}"))
        if prev_uses:
            missing = prev_uses - (results if role == "user" else set())
            if missing:
                v.append(_rule("A8", i - 1, f"tool_use without a tool_result in the next "
                                            f"message: {sorted(missing)}"))
        prev_uses = uses
        prev_role = role
    if prev_uses:
        v.append(_rule("A8", len(msgs) - 1, f"tool_use without a tool_result: {sorted(prev_uses)}"))
    if msgs and isinstance(msgs[-1], Mapping) and msgs[-1].get("role") == "assistant":
        blocks = msgs[-1].get("content")
        last = blocks[-1] if isinstance(blocks, list) and blocks else None
        text = blocks if isinstance(blocks, str) else (
            last.get("text") if isinstance(last, Mapping) and last.get("type") == "text" else None)
        if isinstance(text, str) and text != text.rstrip():
            v.append(_rule("A10", len(msgs) - 1, "final assistant content ends with whitespace"))
    return v


def check_openai(req_messages: Any) -> list[str]:
    """Violations of the OpenAI Chat Completions rules (O1-O7 in
    ``docs/PROVIDER_RULES.md``) in a ``messages`` list (or a request dict
    holding one); ``[]`` if valid."""
    msgs = _req_list(req_messages)
    v: list[str] = []
    ids: set[str] = set()
    open_calls: set[str] | None = None
    answered: set[str] = set()
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping):
            v.append(_rule("O1", i, f"not a dict: {m!r}"))
            continue
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            v.append(_rule("O1", i, f"unknown role {role!r}"))
            continue
        if role != "tool" and open_calls is not None:
            if open_calls - answered:
                v.append(_rule("O4", i - 1, f"tool_calls without a tool reply: "
                                            f"{sorted(open_calls - answered)}"))
            open_calls = None
        content = m.get("content")
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list) or not calls:
                    v.append(_rule("O3", i, "tool_calls present but empty or not a list"))
                    calls = []
            if content is None and not calls:
                v.append(_rule("O2", i, "assistant message with neither content nor tool_calls"))
            elif content is not None and not isinstance(content, str):
                v.append(_rule("O2", i, "assistant content is not a str"))
            if calls:
                open_calls = set()
                answered = set()
                for c in calls:
                    f = c.get("function") if isinstance(c, Mapping) else None
                    if (not isinstance(f, Mapping) or c.get("type") != "function"
                            or not isinstance(f.get("name"), str)
                            or not isinstance(f.get("arguments"), str)):
                        v.append(_rule("O3", i, f"malformed tool call {c!r}"))
                        continue
                    cid = c.get("id")
                    if not isinstance(cid, str) or not cid or len(cid) > _OPENAI_ID_MAX:
                        v.append(_rule("O5", i, f"tool call id {cid!r} empty, not a str or "
                                                f"longer than {_OPENAI_ID_MAX}"))
                        continue
                    if cid in ids:
                        v.append(_rule("O5", i, f"tool call id {cid!r} used twice"))
                    ids.add(cid)
                    open_calls.add(cid)
        elif role == "tool":
            tu = m.get("tool_call_id")
            if not isinstance(content, str):
                v.append(_rule("O2", i, "tool content is not a str"))
            if open_calls is None:
                v.append(_rule("O6", i, f"tool reply {tu!r} does not follow an assistant "
                                        "message with tool_calls"))
            elif tu not in open_calls:
                v.append(_rule("O6", i, f"tool reply {tu!r} answers no preceding tool call"))
            elif tu in answered:
                v.append(_rule("O6", i, f"second tool reply for {tu!r}"))
            else:
                answered.add(tu)
        else:
            if not isinstance(content, str):
                v.append(_rule("O2", i, f"{role} content is not a str"))
            if "tool_calls" in m:
                v.append(_rule("O7", i, f"tool_calls on a {role} message"))
    if open_calls is not None and open_calls - answered:
        v.append(_rule("O4", len(msgs) - 1, f"tool_calls without a tool reply: "
                                            f"{sorted(open_calls - answered)}"))
    return v
