"""Ops, surfaces and the transcript fold: every device that holds the same set of
ops sees a byte-identical transcript, whatever the delivery order."""
from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast.sync import (
    DEFAULT_CONVERSATION, Hlc, OpRecord, Role, Surface, Turn, as_op, canonical_json,
    LastN, fold, is_tombstone, repair, tombstone_op, transcript_hash,
)


def P(role, content="", conv="c", **kw):
    p = {"conversation_id": conv, "role": role, "content": content, "tool_calls": [],
         "tool_use_id": "", "timestamp": 1.0}
    p.update(kw)
    return p


def H(w, c=0, d="a"):
    return Hlc(w, c, d)


# ------------------------------------------------------------------ ops

def test_op_forms_are_equivalent():
    p = P("user", "hi")
    forms = [
        OpRecord("m1", H(1), p),
        OpRecord("m1", str(H(1)), p),
        ("m1", H(1), p),
        ("m1", str(H(1)), p),
        {"op_id": "m1", "hlc": str(H(1)), "payload": p},
        {"op_id": "m1", "hlc": H(1), "payload": p, "surface": "conversation"},
    ]
    ops = [as_op(f) for f in forms]
    assert all(o == ops[0] for o in ops)
    assert all(type(o.hlc) is Hlc for o in ops)
    assert ops[0].surface is Surface.CONVERSATION
    op_id, hlc, payload = forms[0][:3]
    assert (op_id, hlc, payload) == ("m1", H(1), p)
    for f in forms:
        assert fold([f], "c") == fold([forms[0]], "c")


def test_an_op_is_a_three_tuple_and_reads_like_its_mapping():
    """SPEC section 7: an op is ``(op_id, hlc, payload)``; the surface rides
    beside the tuple, so unpacking never sees it."""
    import pickle
    p = P("user", "hi")
    op = OpRecord("m1", H(1), p)
    op_id, hlc, payload = op
    assert (op_id, hlc, payload) == ("m1", H(1), p) and len(op) == 3
    assert op == ("m1", H(1), p) and ("m1", H(1), p) == op
    assert (op["op_id"], op["hlc"], op["payload"], op["surface"]) == ("m1", H(1), p, Surface.CONVERSATION)
    assert op[0] == "m1" and op[-1] is p and op[:2] == ("m1", H(1))
    with pytest.raises(KeyError):
        op["content"]
    routed = OpRecord("m1", H(1), p, "routing")
    assert len(routed) == 3 and tuple(routed) == tuple(op)
    assert routed.surface is Surface.ROUTING and routed["surface"] is Surface.ROUTING
    assert routed != op and op != routed and not (routed == op)
    assert as_op(routed).surface is Surface.ROUTING
    assert as_op(("m1", H(1), p, "entity")).surface is Surface.ENTITY
    for o in (op, routed):
        back = pickle.loads(pickle.dumps(o))
        assert back == o and back.surface is o.surface and type(back) is OpRecord
    assert "routing" in repr(routed) and "surface" not in repr(op)
    assert routed._replace(payload={}).surface is Surface.ROUTING and routed._replace(payload={}).payload == {}
    assert routed._replace(surface="conversation") == ("m1", H(1), p)
    with pytest.raises(ValueError, match="content"):
        op._replace(content="x")


def test_op_to_dict_round_trips():
    op = OpRecord("m1", H(3, 1, "x"), P("user", "hi"))
    d = op.to_dict()
    assert d == {"op_id": "m1", "hlc": str(H(3, 1, "x")), "payload": P("user", "hi")}
    assert as_op(d) == op


@pytest.mark.parametrize("bad, exc", [
    (("m1", "junk", {}), ValueError),
    (("", str(H(1)), {}), ValueError),
    ((5, str(H(1)), {}), TypeError),
    (("m1", str(H(1)), "payload"), TypeError),
    (("m1", str(H(1))), ValueError),
    ({"op_id": "m1", "payload": {}}, ValueError),
    ({"op_id": "m1", "hlc": str(H(1)), "payload": {}, "surface": "nope"}, ValueError),
    (42, TypeError),
])
def test_bad_ops_are_refused(bad, exc):
    with pytest.raises(exc):
        as_op(bad)


def test_bad_hlc_error_names_op():
    with pytest.raises(ValueError, match="m9"):
        as_op(("m9", "garbage", {}))


def test_surfaces_say_what_tolerates_retention():
    assert Surface.CONVERSATION.is_event_stream and Surface.CONVERSATION.tolerates_retention
    assert not Surface.CONVERSATION.is_replay_stream
    assert Surface.ROUTING.is_event_stream and Surface.ROUTING.is_replay_stream
    assert not Surface.ROUTING.tolerates_retention
    assert not Surface.ENTITY.is_event_stream and not Surface.ENTITY.tolerates_retention


def test_fold_ignores_other_surfaces():
    ops = [OpRecord("m1", H(1), P("user", "hi")),
           OpRecord("r1", H(2), P("user", "route"), Surface.ROUTING),
           ("e1", H(3), P("user", "entity"), "entity")]
    assert [t.op_id for t in fold(ops, "c")] == ["m1"]


# ----------------------------------------------------------------- fold

def test_fold_filters_dedupes_and_orders():
    ops = [
        ("m3", H(3), P("assistant", "third")),
        ("m1", H(1), P("user", "first")),
        ("x1", H(2), P("user", "other conversation", conv="d")),
        ("m2", H(2, 0, "b"), P("user", "second")),
        ("m1", H(1), P("user", "first")),  # resent
        ("s1", H(0), P("system", "you are helpful")),
    ]
    ts = fold(ops, "c")
    assert [t.op_id for t in ts] == ["m1", "m2", "m3"]
    t = ts[0]
    assert isinstance(t, Turn)
    assert (t.op_id, t.hlc, t.conversation_id, t.role, t.content, t.tool_calls,
            t.tool_use_id, t.timestamp) == ("m1", H(1), "c", Role.USER, "first", (), "", 1.0)
    assert t.role == "user" and str(Role.ASSISTANT) == "assistant" and Role.TOOL.value == "tool"
    assert [t.op_id for t in fold(ops, "d")] == ["x1"]
    assert fold(ops, "nobody") == []
    assert fold([], "c") == []


def test_ties_on_hlc_break_on_op_id():
    ops = [("b", H(1), P("user", "x")), ("a", H(1), P("user", "y"))]
    assert [t.op_id for t in fold(ops, "c")] == ["a", "b"]


def test_order_is_hlc_tuple_order_not_arrival():
    ops = [("m1", H(2, 0, "a"), P("user", "1")), ("m2", H(1, 5, "z"), P("user", "2")),
           ("m3", H(2, 0, "0"), P("user", "3"))]
    assert [t.op_id for t in fold(ops, "c")] == ["m2", "m3", "m1"]


def test_resent_op_stored_once():
    op = ("m1", H(1), P("user", "yes"))
    assert len(fold([op, op, dict(op_id=op[0], hlc=str(op[1]), payload=op[2])], "c")) == 1


def test_identical_payloads_with_distinct_op_ids_stay_two_turns():
    p = P("user", "yes", timestamp=5)  # the same second, the same text: a double confirm
    ts = fold([("m1", H(1), p), ("m2", H(1), dict(p))], "c")
    assert [t.op_id for t in ts] == ["m1", "m2"]
    assert [m["content"] for m in repair(ts)] == ["yes\nyes"]


def test_legacy_payload_folds_into_default_conversation():
    ops = [("l1", H(1), {"speaker": "user", "text": "hello", "timestamp": "2024-01-01T00:00:00"}),
           ("l2", H(2), {"speaker": "assistant", "text": "hi there", "timestamp": 2}),
           ("n1", H(3), {"role": "user", "content": "explicit none", "conversation_id": None})]
    ts = fold(ops, DEFAULT_CONVERSATION)
    assert [(t.role, t.content, t.conversation_id) for t in ts] == [
        (Role.USER, "hello", DEFAULT_CONVERSATION),
        (Role.ASSISTANT, "hi there", DEFAULT_CONVERSATION),
        (Role.USER, "explicit none", DEFAULT_CONVERSATION)]
    assert ts[0].timestamp == "2024-01-01T00:00:00"
    assert fold(ops) == ts
    assert repair(ts) == [{"role": "user", "content": "hello"},
                          {"role": "assistant", "content": "hi there", "tool_calls": []},
                          {"role": "user", "content": "explicit none"}]


def test_legacy_speaker_names_map_to_roles():
    """A legacy turn's speaker is a role name (any case), an assistant-side
    name, or a person's name (a user turn); it never fails the fold."""
    speakers = ["User", " ASSISTANT ", "alice", "bot", "Agent", "tool", "system", "", None, 7]
    ops = [(f"l{i}", H(i), {"speaker": s, "text": f"t{i}", "timestamp": i}) for i, s in enumerate(speakers)]
    got = [(t.op_id, t.role) for t in fold(ops)]
    assert got == [("l0", Role.USER), ("l1", Role.ASSISTANT), ("l2", Role.USER), ("l3", Role.ASSISTANT),
                   ("l4", Role.ASSISTANT), ("l5", Role.TOOL), ("l7", Role.USER), ("l8", Role.USER),
                   ("l9", Role.USER)]
    with pytest.raises(ValueError, match="r1"):     # the modern role key stays strict
        fold([("r1", H(1), {"role": "alice", "content": "x"})])


def test_a_turn_built_by_hand_is_normalised_like_a_folded_one():
    folded = fold([("o1", H(5, 1, "d"), P("assistant", "hi", tool_calls=[{"id": "k", "name": "f",
                                                                         "arguments": {}}]))], "c")[0]
    by_hand = Turn("o1", str(H(5, 1, "d")), "c", "assistant", "hi", [{"id": "k", "name": "f", "arguments": {}}],
                   "", 1.0)
    assert by_hand == folded and type(by_hand.hlc) is Hlc and by_hand.role is Role.ASSISTANT
    assert by_hand.tool_calls == ({"id": "k", "name": "f", "arguments": {}},)
    turns = [Turn(f"o{i}", str(H(i)), "c", "user" if i % 2 else "assistant", f"x{i}", (), "", i) for i in range(6)]
    assert [t.op_id for t in LastN(2)(turns[::-1])] == ["o4", "o5"]
    with pytest.raises(ValueError, match="role"):
        Turn("o1", H(1), "c", "narrator", "x", (), "", 0)
    with pytest.raises(ValueError, match="hlc"):
        Turn("o1", "yesterday", "c", "user", "x", (), "", 0)


def test_unknown_role_names_the_op():
    with pytest.raises(ValueError, match="bad1"):
        fold([("bad1", H(1), P("wizard", "x"))], "c")


def test_non_str_content_names_the_op():
    with pytest.raises(TypeError, match="bad2"):
        fold([("bad2", H(1), P("user", ["block"]))], "c")


def test_tool_turn_fields_and_messages():
    call = {"id": "call_1", "name": "search", "arguments": {"q": "x"}}
    ts = fold([
        ("m1", H(1), P("user", "find x")),
        ("m2", H(2), P("assistant", "", tool_calls=[call])),
        ("m3", H(3), P("tool", "found", tool_use_id="call_1")),
        ("m4", H(4), P("assistant", "here")),
    ], "c")
    assert ts[1].tool_calls == (call,)
    assert ts[2].tool_use_id == "call_1" and ts[2].role is Role.TOOL
    assert [t.to_message() for t in ts] == [
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool_result", "tool_use_id": "call_1", "content": "found"},
        {"role": "assistant", "content": "here", "tool_calls": []},
    ]
    assert ts[1].to_message()["tool_calls"][0] is not ts[1].tool_calls[0]


def test_openai_shaped_tool_calls_and_tool_call_id_are_read():
    ts = fold([
        ("m1", H(1), {"conversation_id": "c", "role": "assistant", "content": None,
                      "tool_calls": [{"id": "c1", "type": "function",
                                      "function": {"name": "f", "arguments": "{}"}}]}),
        ("m2", H(2), {"conversation_id": "c", "role": "tool", "content": "r", "tool_call_id": "c1"}),
    ], "c")
    assert ts[0].tool_calls == ({"id": "c1", "name": "f", "arguments": "{}"},)
    assert ts[0].content == ""
    assert ts[1].tool_use_id == "c1"


# ------------------------------------------------------------ tombstones

@pytest.mark.parametrize("order", [0, 1, 2])
def test_delete_wins_in_any_order(order):
    msg = ("m1", H(5), P("user", "secret"))
    keep = ("m2", H(6), P("user", "kept"))
    tomb = tombstone_op("m1", H(1, 0, "b"), "c")  # even an older stamp wins
    assert is_tombstone(tomb) and not is_tombstone(msg)
    assert tomb.payload == {"deleted": True, "conversation_id": "c"}
    seqs = [[msg, keep, tomb], [tomb, msg, keep], [keep, tomb, msg, msg]]
    assert [t.op_id for t in fold(seqs[order], "c")] == ["m2"]


def test_tombstone_as_wire_dict():
    tomb = {"op_id": "m1", "hlc": str(H(9)), "payload": {"deleted": True, "conversation_id": "c"}}
    assert fold([("m1", H(1), P("user", "x")), tomb], "c") == []


# ------------------------------------------------------ conflicting versions

def test_conflicting_versions_resolve_to_smallest_hlc_then_payload():
    a = ("m1", H(2), P("user", "late"))
    b = ("m1", H(1), P("user", "early"))
    assert fold([a, b], "c")[0].content == "early"
    assert fold([b, a], "c")[0].content == "early"
    x = ("m1", H(1), P("user", "bbb"))
    y = ("m1", H(1), P("user", "aaa"))
    assert fold([x, y], "c") == fold([y, x], "c")
    assert fold([x, y], "c")[0].content == "aaa"


def test_versions_equal_as_values_but_spelled_apart_resolve_alike():
    """1, 1.0 and True compare equal in Python but are three canonical
    payloads: the winner is the smaller canonical JSON whatever the order of
    arrival, so every device folds the same bytes."""
    from rune_fast.sync import canonical_json
    vs = [("m1", H(1), P("user", "hi", timestamp=t)) for t in (1.0, True, 1)]
    folds = {canonical_json(fold(order, "c")) for order in itertools.permutations(vs)}
    assert len(folds) == 1
    assert fold(vs, "c")[0].timestamp == 1 and type(fold(vs, "c")[0].timestamp) is int


# -------------------------------------------------------------- properties

ROLES = ["user", "user", "assistant", "assistant", "tool", "system"]
CALL_IDS = ["c1", "c2", "c3", "c4"]


@st.composite
def payloads(draw, convs=("c", "d")):
    role = draw(st.sampled_from(ROLES))
    p = {"conversation_id": draw(st.sampled_from(convs)), "role": role,
         "content": draw(st.sampled_from(["", " ", "yes", "no", "hello", "x\ny", "ü"])),
         "tool_calls": [], "tool_use_id": "", "timestamp": draw(st.integers(0, 3))}
    if role == "assistant":
        ids = draw(st.lists(st.sampled_from(CALL_IDS), max_size=3))
        p["tool_calls"] = [{"id": i, "name": "f", "arguments": draw(st.sampled_from(
            [{}, {"a": 1}, '{"b": [1, 2]}', ""]))} for i in ids]
    if role == "tool":
        p["tool_use_id"] = draw(st.sampled_from(CALL_IDS))
    if draw(st.integers(0, 9)) == 0:  # legacy shape
        p = {"speaker": role, "text": p["content"], "timestamp": 0}
    return p


@st.composite
def op_sets(draw, max_ops=30):
    n = draw(st.integers(0, max_ops))
    ops = []
    for i in range(n):
        op_id = f"m{i:03d}"
        h = Hlc(draw(st.integers(0, 12)), draw(st.integers(0, 2)), draw(st.sampled_from("abc")))
        ops.append(OpRecord(op_id, h, draw(payloads())))
        if draw(st.integers(0, 11)) == 0:  # a conflicting second version of the same op
            h2 = Hlc(draw(st.integers(0, 12)), 0, draw(st.sampled_from("abc")))
            ops.append(OpRecord(op_id, h2, draw(payloads())))
    for op in list(ops):
        if draw(st.integers(0, 7)) == 0:
            ops.append(tombstone_op(op.op_id, Hlc(draw(st.integers(0, 12)), 0, "z"),
                                    op.payload.get("conversation_id") or DEFAULT_CONVERSATION))
    return ops


def _wire(op, form):
    if form == 0:
        return op
    if form == 1:
        return (op.op_id, str(op.hlc), op.payload)
    return op.to_dict()


def _deliver(ops, rng):
    """What one device receives: every op at least once, some twice, in any
    order, in any of the accepted forms."""
    got = list(ops) + [rng.choice(ops) for _ in range(rng.randint(0, len(ops)))] if ops else []
    rng.shuffle(got)
    return [_wire(op, rng.randint(0, 2)) for op in got]


def _bytes(turns):
    return canonical_json(turns)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op_sets(), st.randoms(use_true_random=False))
def test_any_delivery_order_gives_byte_identical_transcripts(ops, rng):
    devices = [_deliver(ops, rng) for _ in range(3)]
    for conv in ("c", "d", DEFAULT_CONVERSATION):
        folds = [fold(d, conv) for d in devices]
        ref = _bytes(folds[0])
        assert all(_bytes(f) == ref for f in folds)
        assert len({transcript_hash(f) for f in folds}) == 1
        msgs = [repair(f) for f in folds]
        assert all(canonical_json(m) == canonical_json(msgs[0]) for m in msgs)
        assert len({transcript_hash(m) for m in msgs}) == 1
        ts = folds[0]
        assert [(t.hlc, t.op_id) for t in ts] == sorted((t.hlc, t.op_id) for t in ts)
        assert len({t.op_id for t in ts}) == len(ts)
        assert all(t.conversation_id == conv and t.role in ("user", "assistant", "tool") for t in ts)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op_sets(), st.randoms(use_true_random=False))
def test_fold_is_a_function_of_the_op_set(ops, rng):
    """Merging deliveries (a set union of ops) in any grouping gives the same fold."""
    a = _deliver(ops, rng)
    b = _deliver(ops, rng)
    half = len(a) // 2
    assert fold(a[:half] + b + a[half:], "c") == fold(ops, "c")
    deleted = {o.op_id for o in ops if is_tombstone(o)}
    assert not deleted & {t.op_id for t in fold(ops, "c")}


def test_transcript_hash_is_sha256_of_canonical_json():
    import hashlib
    import json
    ts = fold([("m1", H(1), P("user", "ü"))], "c")
    body = json.dumps([t.to_dict() for t in ts], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()
    assert transcript_hash(ts) == hashlib.sha256(body).hexdigest()
    assert transcript_hash(repair(ts)) == hashlib.sha256(json.dumps(
        repair(ts), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def test_big_shuffle_is_stable():
    rng = random.Random(7)
    ops = [OpRecord(f"m{i}", Hlc(rng.randint(0, 50), rng.randint(0, 3), rng.choice("ab")),
                    P(rng.choice(["user", "assistant"]), str(i % 5))) for i in range(2000)]
    ref = canonical_json(fold(ops, "c"))
    for _ in range(3):
        rng.shuffle(ops)
        assert canonical_json(fold(ops + ops[:100], "c")) == ref


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.text("ab\x00-", max_size=3),
                          st.text("xy\x00", min_size=1, max_size=3)),
                unique_by=lambda x: x[3], max_size=30))
def test_order_is_exactly_hlc_tuple_then_op_id(stamps):
    """Device ids that are prefixes of each other, or hold odd characters, still
    order exactly like the tuple."""
    ops = [(op_id, Hlc(w, c, d), P("user", "x")) for w, c, d, op_id in stamps]
    got = [(t.hlc.wall_ms, t.hlc.counter, t.hlc.device_id, t.op_id) for t in fold(ops, "c")]
    assert got == sorted(stamps)


def test_public_names_are_pinned():
    from rune_fast import sync
    assert sorted(sync.__all__) == sorted([
        "DEFAULT_CONVERSATION", "Hlc", "HlcClock", "Surface", "OpRecord", "as_op", "Role", "Turn",
        "fold", "repair", "to_anthropic", "to_openai", "check_repaired", "check_anthropic",
        "check_openai", "LastN", "compact", "SyncState", "resume_messages", "canonical_json",
        "transcript_hash", "is_tombstone", "tombstone_op", "op_from_record_dict",
        "record_dict_from_op", "turns_from_records"])
    assert all(hasattr(sync, n) for n in sync.__all__)


def test_every_checked_rule_is_written_down():
    """The checkers' rule ids and docs/PROVIDER_RULES.md agree, both ways."""
    import pathlib
    import re

    from rune_fast import sync
    src = "".join(p.read_text(encoding="utf-8")
                  for p in sorted(pathlib.Path(sync.__file__).parent.glob("*.py")))
    doc = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "PROVIDER_RULES.md"
           ).read_text(encoding="utf-8")
    used = set(re.findall(r'_rule\("([ARO]\d+)"', src))
    written = set(re.findall(r"^\| ([ARO]\d+) \|", doc, flags=re.M))
    assert used == written, (used ^ written)


def test_canonical_json_same_for_hlc_whatever_the_codec():
    small = canonical_json({"h": Hlc(1, 2, "a"), "n": 1})
    big = canonical_json({"h": Hlc(1, 2, "a"), "n": 2**70})  # beyond orjson: the stdlib path
    assert small == b'{"h":"000000000000001-0000000002-a","n":1}'
    assert big == b'{"h":"000000000000001-0000000002-a","n":1180591620717411303424}'
    with pytest.raises(ValueError):
        canonical_json({"x": object()})


def test_fold_none_or_empty_conversation_means_default():
    ops = [("l1", H(1), {"speaker": "user", "text": "hi"})]
    assert fold(ops, None) == fold(ops, "") == fold(ops, DEFAULT_CONVERSATION)  # type: ignore[arg-type]
    assert len(fold(ops, None)) == 1  # type: ignore[arg-type]


def test_turn_messages_share_nothing_with_the_turn():
    # to_message/to_dict/to_op copy the call dicts down to the arguments: a
    # caller editing a rendered message's arguments used to edit the Turn's
    t = Turn("o1", str(H(5, 1, "d")), "c", "assistant", "hi",
             [{"id": "k", "name": "f", "arguments": {"q": [1, {"x": 2}]}}], "", 1)
    for out in (t.to_message()["tool_calls"], t.to_dict()["tool_calls"], t.to_op().payload["tool_calls"]):
        out[0]["arguments"]["q"][1]["x"] = 99
        out[0]["arguments"]["q"].append(3)
    assert t.tool_calls[0]["arguments"] == {"q": [1, {"x": 2}]}
