"""Case-insensitive search of needles that are not ASCII finds its
candidate lines by anchors (rune_fast._casefold) instead of folding every
line: the anchors must never miss a match. Checked against str.casefold
over random text made of the characters casefolding treats specially
(expansions such as sharp s and ligatures, final sigma, dotted and dotless
i, the Kelvin and Angstrom signs, titlecase digraphs, combining marks),
CJK without case, and emoji; and end to end against a plain-Python model
of search over a store whose lines sit in the tail, sealed segments and
the cool archive."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rune_fast._casefold import anchor_forms, fold_sources
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord

TRICKY = ("ßẞſsSkKK\u212a\u212bÅåΣσςİıIiﬁﬀﬃǅǄǆµμΐ\u0390ŉʼnüÜu\u0308\u0301\u0307"
          "ΆάẞfFlL日本語中文😀🎉Ωω\u2126ÆæŒœ")
TEXT = st.text(alphabet=st.sampled_from(TRICKY), max_size=30)


def test_sources_are_what_folds_to_the_character():
    assert set(fold_sources("s")) >= {"s", "S", "ß", "ẞ", "ſ", "ﬆ"}
    assert set(fold_sources("σ")) >= {"σ", "Σ", "ς"}
    assert "İ" in fold_sources("\u0307") and "İ" in fold_sources("i")
    assert fold_sources("日") == ("日",)
    assert anchor_forms("") is None


@settings(max_examples=3000)
@given(text=TEXT, needle=TEXT.filter(bool))
def test_anchors_never_miss_a_casefold_match(text, needle):
    folded = needle.casefold()
    forms = anchor_forms(folded)
    if folded in text.casefold():
        assert forms is None or any(f in text for f in forms), (text, needle, forms)


@settings(max_examples=300)
@given(prefix=TEXT, needle=TEXT.filter(bool), suffix=TEXT)
def test_anchors_find_a_needle_planted_in_any_case(prefix, needle, suffix):
    for variant in (needle, needle.upper(), needle.lower(), needle.title(), needle.swapcase()):
        text = prefix + variant + suffix
        folded = needle.casefold()
        if folded in text.casefold():
            forms = anchor_forms(folded)
            assert forms is None or any(f in text for f in forms), (text, needle, forms)


@settings(max_examples=25, deadline=None)
@given(contents=st.lists(TEXT, min_size=1, max_size=40), needles=st.lists(TEXT.filter(bool), min_size=1,
                                                                            max_size=6))
def test_search_matches_the_model_in_every_tier(tmp_path_factory, contents, needles):
    root = tmp_path_factory.mktemp("s")
    msgs = [ConversationMessageRecord(msg_id=f"m{i:04d}", channel_id=f"c{i % 2}", content=c, ts=1.0 + i)
            for i, c in enumerate(contents)]
    with ConversationStateRepository(root, hot_window=3, compact_every=10_000) as repo:
        half = len(msgs) // 2
        repo.append_many(msgs[:half])
        repo.compact()                  # the first half: cooled beyond 3 a channel, the rest sealed
        repo.append_many(msgs[half:])   # the tail
        queries = needles + [m.content[1:4] for m in msgs[:3] if len(m.content) > 3]
        for needle in queries:
            folded = needle.casefold()
            want = [m.msg_id for m in msgs if folded in m.content.casefold()]
            got = [h.record.msg_id for h in repo.search(needle)]
            assert sorted(got) == sorted(want), (needle, got, want)
    # a fresh open: the archive's groups are searched in their pages, not a cache
    with ConversationStateRepository(root, read_only=True) as viewer:
        for needle in queries:
            folded = needle.casefold()
            want = [m.msg_id for m in msgs if folded in m.content.casefold()]
            assert sorted(h.record.msg_id for h in viewer.search(needle)) == sorted(want), needle
