"""The repository against a plain-Python model (SPEC sections 4 and 5), as a
hypothesis state machine: appends, duplicates, deletes, clears, compactions,
reopens and every read."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.records import ConversationMessageRecord

CHANNELS = ["c0", "c1", "c2"]
WORDS = ["alpha", "Beta", "straße", "STRASSE", "kelvin", "\u212aelvin", "x", ""]


class RepoModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="spec_model_"))
        self.kw = dict(hot_window=3, compact_every=5)
        self.repo = ConversationStateRepository(self.dir / "s", **self.kw)
        self.order: list[ConversationMessageRecord] = []  # live messages, append order
        self.deleted: dict[str, ConversationMessageRecord] = {}
        self.n = 0

    def teardown(self):
        try:
            self.repo.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _new(self, ch, word, task):
        self.n += 1
        return ConversationMessageRecord(role="user" if self.n % 2 else "assistant",
                                         content=f"{word} {self.n}", channel_id=ch,
                                         task_id=f"task_{ch}_{task}" if task is not None else "")

    @rule(ch=st.sampled_from(CHANNELS), word=st.sampled_from(WORDS), task=st.none() | st.integers(0, 1))
    def append(self, ch, word, task):
        m = self._new(ch, word, task)
        assert self.repo.append(m) is True
        self.order.append(m)

    @rule(data=st.data(), k=st.integers(1, 4))
    def append_many(self, data, k):
        ms = [self._new(data.draw(st.sampled_from(CHANNELS)), data.draw(st.sampled_from(WORDS)), None)
              for _ in range(k)]
        assert self.repo.append_many(ms) == k
        self.order.extend(ms)

    @precondition(lambda self: self.order or self.deleted)
    @rule(data=st.data())
    def append_duplicate(self, data):
        pool = self.order + list(self.deleted.values())
        m = data.draw(st.sampled_from(pool))
        assert self.repo.append(m) is False

    @precondition(lambda self: self.order)
    @rule(data=st.data())
    def delete(self, data):
        m = data.draw(st.sampled_from(self.order))
        assert self.repo.delete(m.msg_id) is True
        self.order.remove(m)
        self.deleted[m.msg_id] = m

    @rule(ch=st.sampled_from(CHANNELS))
    def clear(self, ch):
        gone = [m for m in self.order if m.channel_id == ch]
        assert self.repo.clear_channel(ch) == len(gone)
        for m in gone:
            self.order.remove(m)
            self.deleted[m.msg_id] = m

    @rule()
    def compact(self):
        self.repo.compact()

    @rule()
    def reopen(self):
        self.repo.close()
        self.repo = ConversationStateRepository(self.dir / "s", **self.kw)

    @rule(ch=st.sampled_from(CHANNELS), n=st.integers(-1, 12))
    def window(self, ch, n):
        want = [m for m in self.order if m.channel_id == ch]
        want = want[-n:] if n > 0 else []
        assert self.repo.window(ch, n) == want

    @rule(ch=st.sampled_from(CHANNELS), task=st.integers(0, 1))
    def task_reads(self, ch, task):
        tid = f"task_{ch}_{task}"
        assert self.repo.messages_for_task(tid) == [m for m in self.order if m.task_id == tid]
        with_task = [m for m in self.order if m.channel_id == ch and m.task_id]
        assert self.repo.latest_task(ch) == (with_task[-1].task_id if with_task else None)

    # cross-channel order is pinned by its own tests in test_spec_conversation.py
    @rule(word=st.sampled_from(WORDS + ["STRASSE", "ss", "K"]), ch=st.sampled_from(CHANNELS),
          limit=st.none() | st.integers(0, 3), cs=st.booleans())
    def search(self, word, ch, limit, cs):
        def hit(m):
            return word in m.content if cs else word.casefold() in m.content.casefold()
        want = [m for m in self.order if hit(m) and (ch is None or m.channel_id == ch)]
        if limit is not None:
            want = want[-limit:] if limit > 0 else []
        got = self.repo.search(word, ch, limit=limit, case_sensitive=cs)
        assert [h.record for h in got] == want

    @precondition(lambda self: self.order or self.deleted)
    @rule(data=st.data())
    def get(self, data):
        m = data.draw(st.sampled_from(self.order + list(self.deleted.values())))
        rd = self.repo.get_message(m.msg_id)
        if m.msg_id in self.deleted:
            assert rd.status == ReadStatus.NOT_FOUND_CONFIRMED and rd.record is None
        else:
            assert rd.status == ReadStatus.FOUND_VERIFIED and rd.record == m
            assert rd.tier in ("tail", "hot", "cool")

    @invariant()
    def size(self):
        assert len(self.repo) == len(self.order)
        # ASSUMPTION: channels() lists only channels that hold a live message.
        assert sorted(self.repo.channels()) == sorted({m.channel_id for m in self.order})


RepoModel.TestCase.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)
TestRepoModel = RepoModel.TestCase
