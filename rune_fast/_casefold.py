"""Anchors for case-insensitive search of a needle that is not ASCII.

Case-insensitive search means ``needle.casefold() in content.casefold()``
(Unicode full casefolding, no normalization). Casefolding every line to
answer that costs a decode and a fold per line; instead the search looks
for *anchors* in the stored bytes (a plain byte search, at scan speed) and
folds only the lines that hold one.

:func:`anchor_forms` gives, for a casefolded needle, a short list of
strings of which every text matching it holds at least one (sound: no
match is missed; the fold check of the candidates is exact). A character
``x`` of the folded needle comes from a character ``c`` of the text with
``x in c.casefold()`` (its *sources*: ``x`` itself, its upper and title
cases, and characters whose fold expands to several, such as U+00DF sharp
s for ``s``). A window of several needle characters is an anchor only where
every source of each of its characters folds to exactly one character:
otherwise one text character may stand for two needle characters (U+00DF
for ``ss``), and the text's spelling of the window is not a product of
single characters.
"""
from __future__ import annotations

import functools
import itertools
import sys

import numpy as np

__all__ = ["fold_sources", "anchor_forms"]

#: the most strings one anchor may take (each is a byte search)
MAX_FORMS = 16
#: code points a block of _expanding_sources
_BLOCK = 256


@functools.lru_cache(maxsize=1)
def _expanding_sources() -> dict[str, tuple[str, ...]]:
    """folded character -> the characters other than itself whose fold
    holds it (computed once, over every code point; the blocks of _BLOCK
    code points that casefolding leaves alone, all but a few dozen, are
    passed over whole: about 30 ms instead of 0.2 s for the first search
    of a needle that is not ASCII)."""
    out: dict[str, list[str]] = {}
    cps = np.arange(sys.maxunicode + 1, dtype="<u4")
    cps[0xD800:0xE000] = 0x20           # (no str holds a surrogate here; a space folds to itself)
    every = cps.tobytes().decode("utf-32-le")
    for base in range(0, len(every), _BLOCK):
        block = every[base:base + _BLOCK]
        if block.casefold() == block:
            continue
        for c in block:
            f = c.casefold()
            if f == c:
                continue
            for x in set(f):
                out.setdefault(x, []).append(c)
    return {x: tuple(v) for x, v in out.items()}


def fold_sources(x: str) -> tuple[str, ...]:
    """Every character ``c`` with ``x in c.casefold()``, ``x`` first."""
    if len(x) != 1:
        raise ValueError(f"fold_sources: one character expected, got {x!r}")
    others = tuple(c for c in _expanding_sources().get(x, ()) if c != x)
    # x is its own source only where it folds to itself (U+0130 does not)
    return ((x,) if x in x.casefold() else ()) + others


def _single(x: str) -> bool:
    """Whether every source of ``x`` folds to exactly one character."""
    return all(len(c.casefold()) == 1 for c in fold_sources(x))


def _score(window: str, n_forms: int) -> tuple:
    # longer anchors in bytes first (rarer), then fewer forms; non-ASCII
    # bytes are rarer than ASCII letters in most text
    non_ascii = sum(1 for ch in window if ord(ch) > 0x7F)
    return (non_ascii > 0, len(window.encode("utf-8")) + 2 * non_ascii, -n_forms)


def anchor_forms(folded: str) -> list[str] | None:
    """Strings of which any text whose casefold holds ``folded`` holds one;
    None where there is no such list (an empty needle: every text matches;
    a character no text folds to)."""
    if not folded:
        return None
    best: tuple | None = None
    best_forms: list[str] = []
    n = len(folded)
    for i in range(n):
        # single characters are always sound anchors
        forms = list(dict.fromkeys(fold_sources(folded[i])))
        if forms and len(forms) <= MAX_FORMS * 4:
            key = _score(folded[i], len(forms))
            if best is None or key > best:
                best, best_forms = key, forms
        # longer windows where every source folds to one character
        if not _single(folded[i]):
            continue
        parts = [fold_sources(folded[i])]
        for j in range(i + 1, n):
            if not _single(folded[j]):
                break
            parts.append(fold_sources(folded[j]))
            count = 1
            for p in parts:
                count *= len(p)
            if count > MAX_FORMS:
                break
            forms = ["".join(t) for t in itertools.product(*parts)]
            key = _score(folded[i:j + 1], len(forms))
            if best is None or key > best:
                best, best_forms = key, forms
    return best_forms if best is not None else None
