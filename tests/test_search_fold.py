"""Case-insensitive search decides its candidates in compiled code
(rune_fast._search.fold_find: the content bytes decoded, JSON escapes
included, each code point folded through str.casefold's table) and finds
them by anchors searched ASCII-case-blind (rune_fast._casefold.anchor_plan,
which lines each expanding source up with the needle). Both are checked
against ``needle.casefold() in content.casefold()`` over random text drawn
from the characters casefolding treats specially (sharp s and capital sharp
s, long s, ligatures, Greek sigmas and iota with dialytika and tonos, dotted
and dotless i, combining marks, Cherokee, the Kelvin and Angstrom signs),
CJK, emoji and the characters JSON escapes; and end to end over every tier,
with and without a limit, case-sensitive both ways."""
from __future__ import annotations

import json
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast import codec
from rune_fast._casefold import anchor_plan
from rune_fast._search import fold_find, fold_find_list
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord

HARD = ("ßẞſsStTfFlLiIİıkK\u212a\u212bÅåΣσςΐΰǰ\u0390\u03b0ŉʼnﬁﬂﬀﬃﬄﬅﬆǅǄǆµμüÜ"
        "\u0300\u0301\u0307\u0308\u030c\u0331\u0345\u036fᏸᏰꮰᎠꭰ日本語中文量子😀🎉Ωω\u2126ÆæŒœ"
        "\"\\/\n\t\r\x00\x01\x1f\u2028\u2029 hH")
TEXT = st.text(alphabet=st.sampled_from(HARD), max_size=24)
NEEDLE = st.text(alphabet=st.sampled_from(HARD), min_size=1, max_size=6)


def _case_blind(text: str) -> str:
    """What an ASCII-case-blind byte search sees: ASCII letters lowered."""
    return text.encode("utf-8", "surrogatepass").lower().decode("utf-8", "surrogatepass")


@settings(max_examples=3000, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(TEXT, min_size=1, max_size=6), needle=NEEDLE)
def test_fold_find_is_casefold_containment(texts, needle):
    folded = needle.casefold()
    want = [i for i, t in enumerate(texts) if folded in t.casefold()]
    hits, unsure = fold_find_list([t.encode("utf-8") for t in texts], folded)
    assert (hits.tolist(), unsure.tolist()) == (want, [])
    # the hot lines' form: JSON-escaped content
    hits, unsure = fold_find_list([codec.key(t) for t in texts], folded, True)
    assert (hits.tolist(), unsure.tolist()) == (want, [])
    # (a list of bytes is read value by value, anything else joined first)
    hits, unsure = fold_find_list(tuple(codec.key(t) for t in texts), folded, True)
    assert (hits.tolist(), unsure.tolist()) == (want, [])


@settings(max_examples=500)
@given(text=TEXT, needle=NEEDLE)
def test_fold_find_reads_any_json_escape_spelling(text, needle):
    """Escapes another writer may use: every character as \\uXXXX (surrogate
    pairs beyond the BMP), upper-case hex digits."""
    esc = json.dumps(text, ensure_ascii=True)[1:-1].encode("ascii")
    folded = needle.casefold()
    for raw in (esc, esc.upper().replace(b"\\U", b"\\u").replace(b"\\N", b"\\n").replace(b"\\T", b"\\t")
                .replace(b"\\R", b"\\r").replace(b"\\B", b"\\b").replace(b"\\F", b"\\f")):
        try:
            if json.loads(b'"' + raw + b'"') != text:
                continue
        except ValueError:
            continue
        hits, unsure = fold_find_list([raw], folded, True)
        assert (hits.tolist(), unsure.tolist()) == ([0] if folded in text.casefold() else [], [])


def test_fold_find_leaves_what_does_not_decode_to_the_caller():
    bad = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"ok"]
    hits, unsure = fold_find_list(bad, "ok")
    assert hits.tolist() == [5] and unsure.tolist() == [0, 1, 2, 3, 4]
    esc = [b"\\ud800", b"\\udc00x", b"\\q", b"\\u12", b"\\", b"\\u00e9"]
    hits, unsure = fold_find_list(esc, "\u00e9", True)
    assert hits.tolist() == [5] and unsure.tolist() == [0, 1, 2, 3, 4]
    # spans clipped to the buffer; an empty needle is in every text
    hits, _u = fold_find(b"abc", [0, 2, 5], [3, 9, 9], "c")
    assert hits.tolist() == [0, 1]
    assert fold_find_list([b"", b"x"], "")[0].tolist() == [0, 1]


def test_anchor_plan_windows():
    # sharp s lines up only with the final 'ss': 'goethe' is one case-blind scan
    assert anchor_plan("goethestrasse") == ["goethe"]
    assert anchor_plan("量子計算機") == ["量子計算機"]
    assert set(anchor_plan("zürich")) == {"züric", "zÜric"}
    assert anchor_plan("") is None
    for needle in ("ss", "f", "i", "σ", "ǰ", "k", "st", "ﬃ", "İ"):
        assert anchor_plan(needle.casefold())
    assert anchor_plan("\u01f0") is None       # (no text folds to it: its fold is 'j' + U+030C)


@settings(max_examples=3000)
@given(text=TEXT, needle=NEEDLE)
def test_anchor_plan_never_misses_a_match(text, needle):
    folded = needle.casefold()
    forms = anchor_plan(folded)
    if folded in text.casefold():
        seen = _case_blind(text)
        assert forms is None or any(f in seen for f in forms), (text, needle, forms)


@settings(max_examples=400)
@given(prefix=TEXT, needle=NEEDLE, suffix=TEXT)
def test_anchor_plan_finds_a_needle_planted_in_any_case(prefix, needle, suffix):
    folded = needle.casefold()
    forms = anchor_plan(folded)
    for variant in (needle, needle.upper(), needle.lower(), needle.title(), needle.swapcase(), folded):
        text = prefix + variant + suffix
        if folded in text.casefold():
            assert forms is None or any(f in _case_blind(text) for f in forms), (text, needle, forms)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(contents=st.lists(TEXT, min_size=1, max_size=40),
       needles=st.lists(NEEDLE, min_size=1, max_size=5), data=st.data())
def test_search_is_casefold_containment_in_every_tier(tmp_path_factory, contents, needles, data):
    """Tail, sealed segments and the cool archive (a cache-held group and,
    in a fresh open, pages), with and without a limit, case-sensitive both
    ways: the hits are the model's, a limited answer the tail of the full one."""
    root = tmp_path_factory.mktemp("fold")
    msgs = [ConversationMessageRecord(msg_id=f"m{i:04d}", channel_id=f"c{i % 3}", content=c, ts=1.0 + i)
            for i, c in enumerate(contents)]
    queries = needles + [m.content[1:4] for m in msgs[:3] if len(m.content) > 3]

    def check(repo):
        for needle in queries:
            for cs in (False, True):
                want = sorted(m.msg_id for m in msgs
                              if (needle in m.content if cs else needle.casefold() in m.content.casefold()))
                full = [h.record.msg_id for h in repo.search(needle, case_sensitive=cs)]
                assert sorted(full) == want, (needle, cs, full, want)
                k = data.draw(st.integers(1, 5))
                part = [h.record.msg_id for h in repo.search(needle, limit=k, case_sensitive=cs)]
                assert part == full[-k:], (needle, cs, k, part, full)

    with ConversationStateRepository(root, hot_window=3, compact_every=10_000) as repo:
        half = len(msgs) // 2
        repo.append_many(msgs[:half])
        repo.compact()                  # the first half: cooled beyond 3 a channel, the rest sealed
        repo.append_many(msgs[half:])   # the tail
        check(repo)
    with ConversationStateRepository(root, read_only=True) as viewer:
        check(viewer)


def test_a_character_whose_lower_holds_ascii_has_it_as_casefold():
    """What the repository's check of an ASCII needle rests on (_conv.search:
    an ASCII needle in a text's lower() is in its casefold): every code point
    whose lower() holds an ASCII character has that lower() as its casefold."""
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp < 0xE000:
            continue
        x = chr(cp)
        low = x.lower()
        if not low.isascii() and not any(ord(ch) < 128 for ch in low):
            continue
        assert x.casefold() == low, hex(cp)


@given(text=TEXT, needle=st.text(alphabet=st.sampled_from("aAsSkKiIfFlLtThH x"), min_size=1, max_size=4))
def test_the_ascii_needle_check_is_casefold_containment(text, needle):
    from rune_fast._conv.search import _Plan
    assert _Plan(needle, False).check(text) == (needle.casefold() in text.casefold())
