"""repair() and the provider renderers: every output obeys the rules written in
docs/PROVIDER_RULES.md, for any input sequence."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast.sync import (
    Hlc, Role, Turn, check_anthropic, check_openai, check_repaired, fold, repair,
    to_anthropic, to_openai,
)

_n = iter(range(10**9))


def T(role, content="", calls=(), tuid=""):
    i = next(_n)
    return Turn(f"t{i:06d}", Hlc(i, 0, "a"), "c", Role(role), content,
                tuple({"id": c, "name": "f", "arguments": {"k": c}} if isinstance(c, str) else c
                      for c in calls), tuid, None)


def U(text):
    return {"role": "user", "content": text}


def A(text, *ids):
    return {"role": "assistant", "content": text,
            "tool_calls": [{"id": i, "name": "f", "arguments": {"k": i}} for i in ids]}


def R(tuid, text="ok"):
    return {"role": "tool_result", "tool_use_id": tuid, "content": text}


def valid_everywhere(msgs):
    assert check_repaired(msgs) == []
    assert check_anthropic(to_anthropic(msgs)) == []
    assert check_openai(to_openai(msgs)) == []


# ------------------------------------------------------------- rule examples

def test_clean_transcript_passes_unchanged():
    ts = [T("user", "q"), T("assistant", "", ["c1"]), T("tool", "r", tuid="c1"),
          T("assistant", "a")]
    out = repair(ts)
    assert out == [U("q"), A("", "c1"), R("c1", "r"), A("a")]
    assert out == [t.to_message() for t in ts]
    valid_everywhere(out)


def test_orphan_tool_result_dropped():
    out = repair([T("user", "q"), T("tool", "lost", tuid="c9"), T("assistant", "a")])
    assert out == [U("q"), A("a")]


def test_leading_orphan_result_from_a_window_cut_dropped():
    out = repair([T("tool", "r", tuid="c1"), T("assistant", "so"), T("user", "next")])
    assert out == [A("so"), U("next")]
    valid_everywhere(out)


def test_result_for_a_call_of_another_assistant_message_dropped():
    out = repair([T("user", "q"), T("assistant", "", ["c1"]), T("tool", "r1", tuid="c1"),
                  T("assistant", "", ["c2"]), T("tool", "r?", tuid="c1"),
                  T("tool", "r2", tuid="c2")])
    assert out == [U("q"), A("", "c1"), R("c1", "r1"), A("", "c2"), R("c2", "r2")]


def test_dangling_call_stripped_call_by_call():
    out = repair([T("user", "q"), T("assistant", "let me", ["c1", "c2"]),
                  T("tool", "r2", tuid="c2"), T("user", "more")])
    assert out == [U("q"), A("let me", "c2"), R("c2", "r2"), U("more")]
    valid_everywhere(out)


def test_dangling_only_call_at_the_end_stripped_and_empty_assistant_dropped():
    out = repair([T("user", "q"), T("assistant", "", ["c1"])])
    assert out == [U("q")]


def test_result_after_intervening_user_is_not_in_the_block():
    out = repair([T("user", "q"), T("assistant", "hm", ["c1"]), T("user", "wait"),
                  T("tool", "r", tuid="c1")])
    assert out == [U("q"), A("hm"), U("wait")]


def test_concurrent_assistant_replies_coalesced():
    # two devices each answered the same user turn
    out = repair([T("user", "hi"), T("assistant", "hello from laptop"),
                  T("assistant", "hello from phone")])
    assert out == [U("hi"), A("hello from laptop\nhello from phone")]
    valid_everywhere(out)


def test_adjacent_users_coalesced_and_tool_calls_concatenated():
    out = repair([T("user", "a"), T("user", "b"), T("assistant", "x", ["c1"]),
                  T("assistant", "y", ["c2"]), T("tool", "r1", tuid="c1"),
                  T("tool", "r2", tuid="c2")])
    assert out == [U("a\nb"), A("x\ny", "c1", "c2"), R("c1", "r1"), R("c2", "r2")]
    valid_everywhere(out)


def test_tool_results_never_merged_with_each_other():
    out = repair([T("user", "q"), T("assistant", "", ["c1", "c2"]),
                  T("tool", "one", tuid="c1"), T("tool", "two", tuid="c2")])
    assert out[2:] == [R("c1", "one"), R("c2", "two")]


def test_coalescing_runs_again_after_drops():
    # the orphan between the two user turns goes, then the users merge
    out = repair([T("user", "a"), T("tool", "orphan", tuid="zz"), T("user", "b")])
    assert out == [U("a\nb")]
    # an assistant left empty by stripping goes, then its neighbours merge
    out = repair([T("user", "a"), T("assistant", "", ["c1"]), T("user", "b")])
    assert out == [U("a\nb")]
    # an assistant whose calls were stripped merges with the next assistant
    out = repair([T("user", "q"), T("assistant", "thinking", ["c1"]),
                  T("tool", "x", tuid="zz"), T("assistant", "", ["c2"]),
                  T("tool", "r", tuid="c2")])
    assert out == [U("q"), A("thinking", "c2"), R("c2", "r")]
    valid_everywhere(out)


def test_duplicate_result_and_reused_call_id():
    out = repair([T("user", "q"), T("assistant", "", ["c1", "c1"]), T("tool", "a", tuid="c1"),
                  T("tool", "b", tuid="c1"), T("user", "again"),
                  T("assistant", "", ["c1"]), T("tool", "c", tuid="c1")])
    assert out == [U("q"), A("", "c1"), R("c1", "a"), U("again")]
    valid_everywhere(out)


def test_system_and_blank_turns_are_not_part_of_the_transcript():
    sys_turn = {"role": "system", "content": "be brief"}
    out = repair([sys_turn, U("q"), A("", "c1"), sys_turn, R("c1"), U("  "), A("\n")])
    assert out == [U("q"), A("", "c1"), R("c1")]


def test_accepts_openai_shaped_messages():
    out = repair([U("q"), {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}])
    assert out == [U("q"), {"role": "assistant", "content": "",
                            "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}]},
                   R("c1", "r")]


def test_repair_refuses_garbage_naming_it():
    with pytest.raises(ValueError, match="message 1"):
        repair([U("q"), {"role": "wizard", "content": ""}])
    with pytest.raises(TypeError, match="message 0"):
        repair([{"role": "user", "content": 5}])


def test_leading_assistant_kept_for_openai_dropped_for_anthropic():
    msgs = repair([T("assistant", "welcome back", ["c1"]), T("tool", "r", tuid="c1"),
                   T("assistant", "so"), T("user", "hi"), T("assistant", "hello  ")])
    assert to_openai(msgs)[0]["role"] == "assistant"
    ant = to_anthropic(msgs)
    assert ant == [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                   {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}]
    valid_everywhere(msgs)
    assert to_anthropic(repair([T("assistant", "only me")])) == []


# ------------------------------------------------------------------ renderers

def test_anthropic_shapes():
    msgs = [U("weather?"), A("checking", "c1", "c2"), R("c1", "sunny"), R("c2", "warm"),
            U("thanks"), A("bye")]
    msgs[1]["tool_calls"][1]["arguments"] = '{"city": "Oslo"}'
    assert to_anthropic(msgs) == [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "checking"},
            {"type": "tool_use", "id": "c1", "name": "f", "input": {"k": "c1"}},
            {"type": "tool_use", "id": "c2", "name": "f", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "c2", "content": "warm"},
            {"type": "text", "text": "thanks"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "bye"}]},
    ]
    valid_everywhere(msgs)


def test_openai_shapes():
    msgs = [U("weather?"), A("", "c1"), R("c1", "sunny"), A("sunny")]
    msgs[1]["tool_calls"][0]["arguments"] = {"city": "Oslo", "n": 1}
    assert to_openai(msgs) == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": '{"city":"Oslo","n":1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "sunny"},
    ]
    args = to_openai(msgs)[1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"city": "Oslo", "n": 1}


def test_string_arguments_pass_through_openai_and_parse_for_anthropic():
    msgs = [U("q"), A("", "c1"), R("c1")]
    msgs[1]["tool_calls"][0]["arguments"] = '{"a": [1, 2]}'
    assert to_openai(msgs)[1]["tool_calls"][0]["function"]["arguments"] == '{"a": [1, 2]}'
    assert to_anthropic(msgs)[1]["content"][0]["input"] == {"a": [1, 2]}
    msgs[1]["tool_calls"][0]["arguments"] = "[1]"
    with pytest.raises(ValueError, match="c1"):
        to_anthropic(msgs)


def test_no_arguments_render_as_the_empty_object_for_both_providers():
    # None and "" are "no arguments": {} for Anthropic, "{}" (a JSON string) for OpenAI
    for none in (None, ""):
        msgs = [U("q"), A("", "c1"), R("c1")]
        msgs[1]["tool_calls"][0]["arguments"] = none
        assert to_openai(msgs)[1]["tool_calls"][0]["function"]["arguments"] == "{}"
        assert to_anthropic(msgs)[1]["content"][0]["input"] == {}


def test_tool_ids_mapped_where_providers_restrict_them():
    long_id = "functions.get_weather:0/" + "x" * 50
    msgs = [U("q"), A("", long_id), R(long_id)]
    ant, oai = to_anthropic(msgs), to_openai(msgs)
    assert ant[1]["content"][0]["id"] == ant[2]["content"][0]["tool_use_id"] != long_id
    assert oai[1]["tool_calls"][0]["id"] == oai[2]["tool_call_id"] != long_id
    assert len(oai[2]["tool_call_id"]) <= 40
    assert to_anthropic(msgs) == ant  # deterministic
    valid_everywhere(msgs)


def test_checkers_catch_violations():
    assert any(v.startswith("A2") for v in check_anthropic([{"role": "assistant", "content": "x"}]))
    assert any(v.startswith("A3") for v in check_anthropic([
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
    assert any(v.startswith("A8") for v in check_anthropic([
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]},
        {"role": "user", "content": "b"}]))
    assert any(v.startswith("A9") for v in check_anthropic([
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "b"},
                                     {"type": "tool_result", "tool_use_id": "c", "content": ""}]}]))
    assert any(v.startswith("A10") for v in check_anthropic([
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b "}]))
    assert any(v.startswith("O6") for v in check_openai([
        {"role": "user", "content": "a"}, {"role": "tool", "tool_call_id": "c", "content": ""}]))
    assert any(v.startswith("O4") for v in check_openai([
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "b"}]))
    assert any(v.startswith("O3") for v in check_openai([
        {"role": "assistant", "content": "x", "tool_calls": []}]))
    assert any(v.startswith("R2") for v in check_repaired([U("a"), U("b")]))
    assert any(v.startswith("R3") for v in check_repaired([U("a"), R("c")]))
    assert any(v.startswith("R4") for v in check_repaired([U("a"), A("", "c")]))
    assert any(v.startswith("R6") for v in check_repaired([U("a"), A("")]))


# ------------------------------------------------------------------ properties

CALL_IDS = ["c1", "c2", "c3", "", "fn.x:1"]


@st.composite
def any_turn(draw):
    role = draw(st.sampled_from(["user", "assistant", "tool", "system"]))
    text = draw(st.sampled_from(["", " ", "\n", "hi", "ok ", "two\nlines", "ü"]))
    if role == "system":
        return {"role": "system", "content": text}
    calls = []
    if role == "assistant":
        calls = [{"id": i, "name": "f", "arguments": draw(st.sampled_from([{}, {"a": 1}, '{"b":2}', None]))}
                 for i in draw(st.lists(st.sampled_from(CALL_IDS), max_size=3))]
    tuid = draw(st.sampled_from(CALL_IDS)) if role == "tool" else ""
    i = draw(st.integers(0, 10**6))
    t = Turn(f"t{i}", Hlc(i, 0, "x"), "c", Role(role), text, tuple(calls), tuid, None)
    return t.to_message() if draw(st.booleans()) else t


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_turn(), max_size=25))
def test_every_repair_output_obeys_the_provider_rules(seq):
    out = repair(seq)
    assert check_repaired(out) == []
    ant = to_anthropic(out)
    assert check_anthropic(ant) == [], ant
    oai = to_openai(out)
    assert check_openai(oai) == [], oai
    assert repair(out) == out  # idempotent
    # nothing a user said is lost
    said = [m.content if isinstance(m, Turn) else m["content"] for m in seq
            if (m.role if isinstance(m, Turn) else m["role"]) == "user"]
    joined = "\n".join(m["content"] for m in out if m["role"] == "user")
    assert all(s in joined for s in said if s.strip())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_turn(), max_size=25), st.integers(0, 25))
def test_any_window_of_a_repaired_transcript_repairs_validly(seq, cut):
    out = repair(repair(seq)[cut:])
    assert check_repaired(out) == []
    assert check_anthropic(to_anthropic(out)) == []
    assert check_openai(to_openai(out)) == []


def test_fold_then_repair_end_to_end():
    ops = [("m1", Hlc(1, 0, "a"), {"conversation_id": "c", "role": "user", "content": "q"}),
           ("m2", Hlc(2, 0, "a"), {"conversation_id": "c", "role": "assistant", "content": "a1"}),
           ("m3", Hlc(2, 0, "b"), {"conversation_id": "c", "role": "assistant", "content": "a2"})]
    assert repair(fold(ops, "c")) == [U("q"), A("a1\na2")]
