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
from typing import Iterator

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
    for c, f in _folded_pairs():
        for x in set(f):
            out.setdefault(x, []).append(c)
    return {x: tuple(v) for x, v in out.items()}


def _folded_pairs() -> tuple[tuple[str, str], ...]:
    """``(c, c.casefold())`` of every code point that casefolding changes,
    in code point order (the blocks it leaves alone passed over whole):
    computed once a process, for the anchors and for the compiled
    matcher's table (each took the walk over every code point, most of the
    first search of a process)."""
    return _folded_pairs_kept()


@functools.lru_cache(maxsize=1)
def _folded_pairs_kept() -> tuple[tuple[str, str], ...]:
    return tuple(_walk_folded_pairs())


def _walk_folded_pairs() -> Iterator[tuple[str, str]]:
    cps = np.arange(sys.maxunicode + 1, dtype="<u4")
    cps[0xD800:0xE000] = 0x20           # (no str holds a surrogate here; a space folds to itself)
    every = cps.tobytes().decode("utf-32-le")
    big = _BLOCK * 64                   # (most of these are left alone whole: planes 2-16 are)
    for top in range(0, len(every), big):
        chunk = every[top:top + big]
        if chunk.casefold() == chunk:
            continue
        for base in range(0, len(chunk), _BLOCK):
            block = chunk[base:base + _BLOCK]
            if block.casefold() == block:
                continue
            for c in block:
                f = c.casefold()
                if f != c:
                    yield c, f


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


# ---- anchors searched ASCII-case-blind, aligned with the needle -------------
#
# anchor_forms treats every character whose fold expands as a break in a
# window. A finer look: a source ``c`` whose fold F has several characters
# can stand for position j of the needle only where F lies along the needle
# there (F[k] == folded[j] for some k, and every other character of F equals
# the needle's character it falls on, or falls outside the needle). It then
# covers the positions of F inside the needle; a window is spelled one text
# character a position (a product of sources) as long as no such source
# covers two of its positions. 'goethestrasse': sharp s lines up only with
# the final 'ss', so 'goethe' is a window of ASCII letters alone: one
# ASCII-case-blind scan finds every candidate.

#: the most ASCII-case-blind byte searches one anchor may take
MAX_SCANS = 4
#: the longest window looked at (characters; longer ones add little)
MAX_WINDOW = 24


def _aligned_sources(folded: str) -> list[tuple[list[str], list[tuple[str, int, int]]]]:
    """Per position j of ``folded``: (the sources that fold to exactly
    ``folded[j]``, the sources whose longer fold lines up with the needle
    over j, each as (character, first, end) of the positions it covers)."""
    n = len(folded)
    out = []
    for j, x in enumerate(folded):
        single, multi = [], []
        for c in fold_sources(x):
            f = c.casefold()
            if len(f) == 1:
                single.append(c)
                continue
            for k, y in enumerate(f):
                if y != x:
                    continue
                a = j - k
                if all(not 0 <= a + t < n or folded[a + t] == f[t] for t in range(len(f))):
                    multi.append((c, max(a, 0), min(a + len(f), n)))
        out.append((single, multi))
    return out


def _alternatives(single: list[str], multi: list[tuple[str, int, int]], j: int, a: int, b: int) -> list[str] | None:
    """The spellings of position j inside the window [a, b) (ASCII letters
    as one lowercase spelling, searched case-blind), or None where a source
    covers two positions of the window."""
    alts: dict[str, None] = {}
    for c in single:
        alts[c.lower() if c.isascii() else c] = None
    for c, s, e in multi:
        if min(e, b) - max(s, a) > 1:
            return None
        alts[c] = None
    return list(alts)


def anchor_plan(folded: str) -> list[str] | None:
    """See _anchor_plan (kept for the needles searched lately: the plan of a
    long needle takes a millisecond)."""
    forms = _anchor_plan(folded)
    return list(forms) if forms is not None else None


@functools.lru_cache(maxsize=256)
def _anchor_plan(folded: str) -> tuple[str, ...] | None:
    """Strings, each to be searched ASCII-case-blind (they hold no ASCII
    upper case), of which any text whose casefold holds ``folded`` holds
    one; at most MAX_SCANS of them for a window of several characters (one
    character may take more: 'f' is also five ligatures). None where there is none (an empty
    needle, a character no text folds to): every line is a candidate.
    The window chosen weighs its length in bytes (non-ASCII bytes count
    double: rarer) against the number of scans it takes."""
    if not folded:
        return None
    per = _aligned_sources(folded)
    n = len(folded)
    best: tuple | None = None
    best_forms: list[str] = []
    for a in range(n):
        parts: list[list[str]] = []
        for b in range(a + 1, min(n, a + MAX_WINDOW) + 1):
            # the new position, and the earlier ones a source may now cover twice
            ok = True
            new_parts = []
            for j in range(a, b):
                alt = _alternatives(*per[j], j, a, b)
                if not alt:
                    ok = False
                    break
                new_parts.append(alt)
            if not ok:
                break
            parts = new_parts
            count = 1
            for p in parts:
                count *= len(p)
            if count > MAX_SCANS and (b - a > 1 or count > MAX_FORMS * 4):
                break
            forms = ["".join(t) for t in itertools.product(*parts)]
            weight = min(min(len(f.encode("utf-8")) + sum(1 for ch in f if ord(ch) > 0x7F) for f in forms), 12)
            key = (weight - 2 * (count.bit_length() - 1), -count, b - a)
            if best is None or key > best:
                best, best_forms = key, forms
    return tuple(best_forms) if best is not None else None


def ascii_probes(folded: str, specials: "tuple[str, ...]") -> list[str]:
    """The anchors of an ASCII needle that some of ``specials`` (characters
    of other scripts whose fold holds ASCII letters, lined up with it) may
    fold into: its anchor_plan's, or where those are short (a scan of one
    or two letters finds most lines) the specials themselves, of which any
    such hit holds one."""
    forms = anchor_plan(folded) or []
    if not forms or min(len(f.encode("utf-8")) for f in forms) < 4:
        return list(specials)
    return forms


def fold_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The casefold of every code point that does not fold to itself, for
    the compiled matcher: (keys, ascending uint32; offsets, uint32, one
    more than keys; the folded code points, uint32; a bitmap of the keys
    over all code points, uint8). ``str.casefold`` folds each code point
    alone (no context: final sigma folds as sigma), so a text's fold is the
    concatenation of its characters' folds."""
    return _fold_table()


@functools.lru_cache(maxsize=1)
def _fold_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    keys: list[int] = []
    offs = [0]
    vals: list[int] = []
    for c, f in _folded_pairs():
        keys.append(ord(c))
        vals.extend(ord(y) for y in f)
        offs.append(len(vals))
    k = np.asarray(keys, dtype=np.uint32)
    bits = np.zeros((sys.maxunicode + 1) // 8, dtype=np.uint8)
    np.bitwise_or.at(bits, k >> 3, (1 << (k & 7)).astype(np.uint8))
    return k, np.asarray(offs, dtype=np.uint32), np.asarray(vals, dtype=np.uint32), bits
