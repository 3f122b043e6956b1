"""SPEC's "oldest first" for any strings: unstamped messages in append order,
then stamped ones by ``(hlc, msg_id)`` as Python compares them, in every tier
and every read (window, messages_for_task, search, latest_task), before and
after cooling, a reopen, a rebuild without the index snapshot and a merge of
archive files. Quotes, backslashes and control characters, which the files
store escaped, are where an order of the stored bytes would differ."""
from __future__ import annotations

import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord

chars = st.sampled_from(['"', "\\", "\n", "\x01", "\x1f", " ", "!", "#", "0", "A", "[", "]", "a", "~",
                         "\x7f", "é", "\u2028", "😀", "\ufffd"])
name = st.text(chars, min_size=1, max_size=6)


def _expected(msgs: list[ConversationMessageRecord]) -> list[str]:
    plain = [m.msg_id for m in msgs if not m.hlc]
    stamped = sorted((m for m in msgs if m.hlc), key=lambda m: (m.hlc, m.msg_id))
    return plain + [m.msg_id for m in stamped]


def _check(repo: ConversationStateRepository, msgs: list[ConversationMessageRecord]) -> None:
    want = _expected(msgs)
    task = {m.msg_id: m.task_id for m in msgs}
    assert [r.msg_id for r in repo.window("c", 1000)] == want
    assert [r.msg_id for r in repo.window("c", 3)] == want[-3:]
    for t in ("t0", "t1", "t2"):
        assert [r.msg_id for r in repo.messages_for_task(t)] == [i for i in want if task[i] == t]
    assert [h.record.msg_id for h in repo.search("body")] == want
    assert [h.record.msg_id for h in repo.search("body", limit=2)] == want[-2:]
    assert repo.latest_task("c") == task[want[-1]]


@settings(max_examples=80)
@given(st.lists(st.tuples(name, st.one_of(st.just(""), name)), min_size=1, max_size=14,
                unique_by=lambda t: t[0]))
def test_oldest_first_is_python_string_order_in_every_tier(pairs):
    msgs = [ConversationMessageRecord(msg_id=mid, hlc=hlc, content=f"body {i}", channel_id="c", task_id=f"t{i % 3}",
                                      ts=1_700_000_000.0 + i) for i, (mid, hlc) in enumerate(pairs)]
    with tempfile.TemporaryDirectory() as d:
        with ConversationStateRepository(d, compact_every=5, hot_window=3) as repo:
            for m in msgs:
                repo.append(m)
            _check(repo, msgs)
            repo.compact()                       # all but 3 cool
            _check(repo, msgs)
        with ConversationStateRepository(d, hot_window=3) as repo:
            _check(repo, msgs)
        os.unlink(os.path.join(d, "hot", "conversation_index.snap"))
        with ConversationStateRepository(d, hot_window=0) as repo:    # rebuilt from the lines
            _check(repo, msgs)
            repo.compact()                       # the rest cooled: archive files merged
            _check(repo, msgs)
