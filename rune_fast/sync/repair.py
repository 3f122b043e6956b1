"""Repair: any transcript (or window of one) becomes a message list both
providers accept (rules R1-R7 of ``docs/PROVIDER_RULES.md``).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .fold import Turn, _ASSISTANT, _ROLE_OF, _TOOL, _USER, _norm_calls


# ---------------------------------------------------------------- repair

# Working message: [kind, text parts, calls, tool_use_id or tool text]
_K_USER, _K_ASSISTANT, _K_TOOL = 0, 1, 2


_KIND_OF = {_USER: _K_USER, _ASSISTANT: _K_ASSISTANT, _TOOL: _K_TOOL}


def _blank(s: str) -> bool:
    return not s or s.isspace()


def _extract(m: Any, i: int) -> tuple[int, str, Any, str] | None:
    """(kind, text, calls, tool_use_id) of a Turn or message dict; None for a
    turn that is not part of a transcript (system)."""
    r: object       # a Turn's role, or whatever a dict holds under "role"
    if isinstance(m, Turn):
        r = m.role
        if r == "user":
            return _K_USER, m.content, (), ""
        if r == "assistant":
            return _K_ASSISTANT, m.content, m.tool_calls, ""
        if r == "tool":
            return _K_TOOL, m.content, (), m.tool_use_id
        role = _ROLE_OF.get(r, False) if isinstance(r, str) else False
        if role is None:
            return None
        raise ValueError(f"turn {i} ({m.op_id!r}): unknown role {r!r}")
    if not isinstance(m, Mapping):
        raise TypeError(f"message {i}: expected a Turn or a message dict, got "
                        f"{type(m).__name__}")
    r = m.get("role")
    role = _ROLE_OF.get(r, False) if isinstance(r, str) else False
    if role is False:
        raise ValueError(f"message {i}: unknown role {r!r}")
    if role is None:
        return None
    content = m.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str):
        raise TypeError(f"message {i}: content must be a str, got {type(content).__name__}")
    if role is _USER:
        return _K_USER, content, (), ""
    if role is _ASSISTANT:
        raw = m.get("tool_calls")
        return _K_ASSISTANT, content, (_norm_calls(raw, lambda: f"message {i}") if raw else ()), ""
    tuid = m.get("tool_use_id")
    if not tuid:
        tuid = m.get("tool_call_id") or ""
    if not isinstance(tuid, str):
        raise TypeError(f"message {i}: tool_use_id must be a str, got {tuid!r}")
    return _K_TOOL, content, (), tuid


def repair(turns: Iterable[Any]) -> list[dict[str, Any]]:
    """A provider-valid message list from an ordered transcript (a list of
    :class:`Turn`, or of message dicts as :meth:`Turn.to_message` makes them;
    OpenAI-shaped ``tool`` messages with ``tool_call_id`` are read too).

    Rules (``docs/PROVIDER_RULES.md``, section R):

    1. system turns and user/assistant turns with blank text and no tool calls
       are not part of the transcript and are skipped;
    2. adjacent user/user or assistant/assistant turns are coalesced: texts
       joined with ``"\\n"`` (blank texts contribute nothing), tool calls
       concatenated; tool results are never merged with each other;
    3. a tool result survives only in the run of tool results right after the
       assistant message that made its call (matched by ``tool_use_id`` ==
       call ``id``; the first result for a call wins, later ones are dropped);
    4. a call with no result in that run is stripped, call by call; so is a
       call with an empty id or an id already used earlier in the transcript;
    5. an assistant message left with no text and no calls is dropped;
    6. coalescing runs again after the drops and strips.

    The result never contains two adjacent user or assistant messages, and
    ``repair(repair(x)) == repair(x)``. A leading assistant message is kept
    (OpenAI accepts it); :func:`to_anthropic` drops what precedes the first
    user message. Output dicts: ``{"role": "user", "content"}``,
    ``{"role": "assistant", "content", "tool_calls"}``, ``{"role":
    "tool_result", "tool_use_id", "content"}``.
    """
    # Working messages live in parallel lists (kind, text, calls, tool_use_id)
    # rather than one small object each: repair runs over whole transcripts,
    # and every live container costs the garbage collector. A text is a str,
    # or a list of str once two non-blank texts have been coalesced.
    kinds: list[int] = []
    texts: list[Any] = []
    callsl: list[Any] = []
    tuids: list[str] = []
    last = -1  # kind of the last working message
    kind_of = _KIND_OF
    calls: Sequence[dict[str, Any]]
    # Pass 1: coalesce the raw sequence.
    for i, t in enumerate(turns):
        if type(t) is Turn and t[3] in kind_of:
            k = kind_of[t[3]]
            text = t[4]
            calls = t[5] if k == _K_ASSISTANT else ()
            if calls:  # fresh, normalised dicts: the output never aliases a turn
                calls = _norm_calls(calls, lambda: f"turn {i} ({t[0]!r})")
            tuid = t[6]
        else:
            e = _extract(t, i)
            if e is None:
                continue
            k, text, calls, tuid = e
        if k != _K_TOOL:
            if not text or text.isspace():
                if not calls:
                    continue
                text = ""
            if last == k:
                if text:
                    prev = texts[-1]
                    if not prev:
                        texts[-1] = text
                    elif type(prev) is str:
                        texts[-1] = [prev, text]
                    else:
                        prev.append(text)
                if calls:
                    callsl[-1] = [*callsl[-1], *calls]
                continue
        kinds.append(k)
        texts.append(text)
        callsl.append(calls)
        tuids.append(tuid)
        last = k

    # Pass 2: keep tool results only in the block right after their call;
    # strip unanswered calls; drop what is left empty. `kept` holds indices.
    kept: list[int] = []
    seen: set[str] = set()
    n = len(kinds)
    i = 0
    while i < n:
        k = kinds[i]
        if k == _K_USER:
            kept.append(i)
            i += 1
            continue
        if k == _K_TOOL:  # not right after an assistant message: orphan
            i += 1
            continue
        j = i + 1
        while j < n and kinds[j] == _K_TOOL:
            j += 1
        calls = callsl[i]
        if calls:
            cand: dict[str, dict] = {}
            for c in calls:
                cid = c["id"]
                if cid and cid not in seen and cid not in cand:
                    cand[cid] = c
            results = []
            answered: set[str] = set()
            for r in range(i + 1, j):
                tu = tuids[r]
                if tu in cand and tu not in answered:
                    answered.add(tu)
                    results.append(r)
            callsl[i] = calls = [c for cid, c in cand.items() if cid in answered]
            seen.update(answered)
            if texts[i] or calls:
                kept.append(i)
                kept.extend(results)
        elif texts[i]:
            kept.append(i)
        i = j

    # Pass 3: coalesce again (after the drops and strips) while building the
    # message dicts.
    out: list[dict[str, Any]] = []
    append = out.append
    last = -1
    for i in kept:
        k = kinds[i]
        text = texts[i]
        if type(text) is not str:
            text = "\n".join(text)
        if k == last and k != _K_TOOL:
            m = out[-1]
            if text:
                m["content"] = f"{m['content']}\n{text}" if m["content"] else text
            if k == _K_ASSISTANT and callsl[i]:
                m["tool_calls"].extend(callsl[i])
            continue
        last = k
        if k == _K_USER:
            append({"role": "user", "content": text})
        elif k == _K_ASSISTANT:
            c = callsl[i]
            append({"role": "assistant", "content": text,
                    "tool_calls": c if type(c) is list else list(c)})
        else:
            append({"role": "tool_result", "tool_use_id": tuids[i], "content": text})
    return out


def _rule(code: str, i: int | None, text: str) -> str:
    return f"{code} messages[{i}]: {text}" if i is not None else f"{code}: {text}"


def check_repaired(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Violations of the repaired-transcript rules (R1-R7 in
    ``docs/PROVIDER_RULES.md``) in a :func:`repair` output; ``[]`` if valid."""
    v: list[str] = []
    seen: set[str] = set()
    open_calls: set[str] | None = None  # calls of the assistant whose block is open
    answered: set[str] = set()
    prev_role = None
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            v.append(_rule("R1", i, f"not a dict: {m!r}"))
            continue
        role = m.get("role")
        if role not in ("user", "assistant", "tool_result"):
            v.append(_rule("R1", i, f"role {role!r} is not user, assistant or tool_result"))
            continue
        content = m.get("content")
        if not isinstance(content, str):
            v.append(_rule("R7", i, "content is not a str"))
            content = ""
        if role != "tool_result" and role == prev_role:
            v.append(_rule("R2", i, f"two adjacent {role} messages"))
        if role != "tool_result" and open_calls is not None:
            missing = open_calls - answered
            if missing:
                v.append(_rule("R4", i - 1, f"calls without a result: {sorted(missing)}"))
            open_calls = None
        if role == "user":
            if _blank(content):
                v.append(_rule("R6", i, "empty user message"))
        elif role == "assistant":
            calls = m.get("tool_calls", [])
            if not isinstance(calls, list):
                v.append(_rule("R7", i, "tool_calls is not a list"))
                calls = []
            if _blank(content) and not calls:
                v.append(_rule("R6", i, "assistant message with no text and no calls"))
            open_calls = set()
            answered = set()
            for c in calls:
                if not isinstance(c, Mapping) or set(c) != {"id", "name", "arguments"}:
                    v.append(_rule("R7", i, f"tool call is not {{id, name, arguments}}: {c!r}"))
                    continue
                cid = c["id"]
                if not isinstance(cid, str) or not cid:
                    v.append(_rule("R5", i, f"tool call id {cid!r} is empty or not a str"))
                    continue
                if cid in seen:
                    v.append(_rule("R5", i, f"tool call id {cid!r} used twice"))
                seen.add(cid)
                open_calls.add(cid)
        else:
            tu = m.get("tool_use_id")
            if open_calls is None:
                v.append(_rule("R3", i, f"tool result {tu!r} not right after an assistant message"))
            elif tu not in open_calls:
                v.append(_rule("R3", i, f"tool result {tu!r} answers no call of the assistant message"))
            elif tu in answered:
                v.append(_rule("R3", i, f"second tool result for call {tu!r}"))
            else:
                answered.add(tu)
        prev_role = role
    if open_calls is not None and open_calls - answered:
        v.append(_rule("R4", len(messages) - 1,
                       f"calls without a result: {sorted(open_calls - answered)}"))
    return v
