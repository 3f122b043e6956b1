"""verify's compiled check of the usual message envelopes
(``_log.message_envelope_keys``): a line it takes is one the Python check
finds sound, a message envelope, with the same id key, hash and offset;
the lines EventStore writes for messages are all taken; a store's verify
reports the same with it as without it."""
from __future__ import annotations

import os
import struct

import numpy as np
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from rune_fast import ConversationMessageRecord, ConversationStateRepository
from rune_fast._log import message_envelope_keys, scan_frames
from rune_fast._conv import verify as V
from rune_fast.events import EventStore, _envelope_problem, frame


def _python_entry(line: bytes, offset: int) -> bytes | None:
    """What verify keeps of a line through the Python check, or None."""
    try:
        env = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if _envelope_problem(env) or env.get("type") != "conversation.message":
        return None
    return V._id_key(env["id"]) + bytes.fromhex(env["payload_hash"][:16]) + struct.pack("<q", offset)


_hex = "0123456789abcdef"
_ids = st.one_of(st.text(min_size=0, max_size=12),
                 st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), min_size=1, max_size=40))
_hashes = st.one_of(
    st.text(alphabet=_hex, min_size=64, max_size=64),
    st.builds(lambda h, i, c: h[:i] + c + h[i + 1:], st.text(alphabet=_hex, min_size=64, max_size=64),
              st.integers(0, 63), st.sampled_from('ABCDEFgx-" \\é')),       # one digit not lowercase hex
    st.text(alphabet=_hex, min_size=62, max_size=66),
)
_numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: orjson.dumps(f).decode()),
    st.integers(-10**20, 10**20).map(str),
    st.sampled_from(["0", "-0", "01", "1.", ".5", "1e400", "1E5", "-1.5e-3", "1.0", "00.1", "- 1", "1_0",
                     "123456789012345", "1234567890123456", "0.12345678901234567890", "0.123456789012345678901",
                     "NaN", "Infinity", '"1"', "null", "1.5 "]),
)


@st.composite
def _rests(draw) -> bytes:
    """The part of a line after its frame: usually the message envelope as
    EventStore writes it, with each piece sometimes another spelling."""
    kind = draw(st.sampled_from(["conversation.message", "conversation.message", "conversation.deleted", "nope"]))
    rid = draw(_ids)
    h = draw(_hashes)
    num = draw(_numbers)
    id_json = orjson.dumps(rid).decode() if draw(st.booleans()) else f'"{rid}"'
    parts = [f'"type":"{kind}"', f'"id":{id_json}', f'"payload_hash":"{h}"', f'"ts":{num}']
    if draw(st.integers(0, 9)) == 0:
        parts = draw(st.permutations(parts))
    if draw(st.integers(0, 9)) == 0:
        parts.insert(draw(st.integers(0, len(parts))), '"more":1')
    sep = draw(st.sampled_from([",", ",", ",", ", "]))
    return ("," + sep.join(parts) + "}").encode("utf-8", "surrogatepass")


@settings(max_examples=500, deadline=None)
@given(st.lists(_rests(), min_size=1, max_size=8), st.integers(0, 1 << 40))
def test_a_line_taken_in_c_is_sound_with_the_same_entry(rests, base):
    lines = []
    for rest in rests:
        try:
            lines.append(frame(rest))
        except Exception:
            continue        # (not a line the log would hold)
    data = b"".join(lines)
    scan = scan_frames(data)
    assert len(scan.offsets) == len(lines)
    entries, taken = message_envelope_keys(data, scan.offsets, scan.lengths, base)
    assert len(entries) == 32 * int(taken.sum())
    got = [entries[i:i + 32] for i in range(0, len(entries), 32)]
    want = []
    for at, n, took in zip(scan.offsets.tolist(), scan.lengths.tolist(), taken.tolist()):
        entry = _python_entry(data[at:at + n], base + at)
        if took:
            assert entry is not None, data[at:at + n]
            want.append(entry)
    assert got == want


def test_the_message_envelopes_a_store_writes_are_taken(tmp_path):
    ev = EventStore(str(tmp_path / "events.jsonl"))
    ids = ["m1", "msg_01KAV9FY725VRJ1VKK4ZWSD5GG", "a b!~", "ü-not-ascii", 'quote"d']
    for i, rid in enumerate(ids):
        ev.append("conversation.message", rid, f"{i:064x}")
    ev.append("conversation.deleted", "m1", "f" * 64)
    ev.append("conversation.message", "m9", "e" * 64, more=1)
    ev.close()
    data = (tmp_path / "events.jsonl").read_bytes()
    scan = scan_frames(data)
    _entries, taken = message_envelope_keys(data, scan.offsets, scan.lengths, 0)
    assert taken.tolist()[:3] == [1, 1, 1]          # (plain ASCII ids)
    assert taken.tolist()[3:] == [0, 0, 0, 0]       # (left to the Python check)


def test_verify_reports_the_same_with_and_without_the_c_check(tmp_path, monkeypatch):
    """A store whose event store holds usual envelopes, others, one whose
    hash disagrees with its record and a damaged line: verify's report and
    counts are the same when every line goes through the Python check."""
    d = tmp_path / "s"
    with ConversationStateRepository(d, durability="none", hot_window=2, compact_every=10**6) as repo:
        repo.append_many([ConversationMessageRecord(msg_id=f"m{i}", channel_id=f"c{i % 2}", content=f"x {i} é",
                                                    ts=1.0 + i) for i in range(40)])
        repo.append(ConversationMessageRecord(msg_id="ünï", channel_id="c0", content="y", ts=50.0))
        repo.compact()
        repo.delete("m3")
    path = os.path.join(d, "events.jsonl")
    with open(path, "ab") as f:          # an envelope of m5 with another hash, spelled as usual
        f.write(EventStore.encode("conversation.message", "m5", "0" * 64))
        f.write(EventStore.encode("conversation.message", "m6", "1" * 64))
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[data.rindex(b'"id":"m6"') + 6] ^= 0x01          # the last line damaged
    with open(path, "wb") as f:
        f.write(bytes(data))
    took: list[int] = []
    real = message_envelope_keys

    def counted(*args):
        entries, taken = real(*args)
        took.append(int(taken.sum()))
        return entries, taken

    def report():
        with ConversationStateRepository(d, read_only=True) as repo:
            rep = repo.verify()
        return sorted((str(p.file), p.offset, p.message) for p in rep.problems), rep.checked

    monkeypatch.setattr("rune_fast.events.message_envelope_keys", counted)
    fast = report()
    assert sum(took) == 41              # (m0-m39 and the second m5; not "ünï", the deletion, m6)
    monkeypatch.setattr("rune_fast.events.message_envelope_keys",
                        lambda data, offs, lens, base: (b"", np.zeros(len(offs), np.uint8)))
    slow = report()
    assert fast == slow
    problems = [p for _f, _o, p in fast[0]]
    assert any("does not match its record" in p for p in problems), problems
    assert any(o is not None and path.endswith(os.path.basename(f)) for f, o, _p in fast[0])
