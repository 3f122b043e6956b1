"""The conversation repository against a plain-Python model (hypothesis state machine).

Appends (new and duplicate, stamped and unstamped), batches, deletions,
compactions with cooling, and reopens (with and without the index snapshot);
every read is checked against the model after each step.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rune_fast._conv import tuning
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.records import ConversationMessageRecord

CHANNELS = ["general", "ops/éé", "c\"3"]
TASKS = ["", "task_a", "task_b"]
WORDS = ["alpha", "Beta", "straße", "STRASSE", "kelvin \u212a", "zeta\nline", "ω"]


def model_order(recs):
    """SPEC order: unstamped in append order first, then stamped by (hlc, msg_id)."""
    unstamped = [r for r in recs if not r.hlc]
    stamped = sorted((r for r in recs if r.hlc), key=lambda r: (r.hlc, r.msg_id))
    return unstamped + stamped


class RepositoryModel(RuleBasedStateMachine):
    OPTS = dict(compact_every=7, hot_window=3)

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="rune-model-")
        self.repo = ConversationStateRepository(self.dir, **self.OPTS)
        self.stored: dict[str, ConversationMessageRecord] = {}
        self.appended: list[str] = []          # append order of live ids
        self.deleted: set[str] = set()
        self.n = 0
        self.view: ConversationStateRepository | None = None   # a read-only viewer, once opened

    def teardown(self) -> None:
        if self.view is not None:
            self.view.close()
        self.repo.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _new(self, channel, task, word, stamp):
        self.n += 1
        hlc = f"{1000 + stamp:015d}-{self.n % 3:010d}-dev{stamp % 2}" if stamp >= 0 else ""
        return ConversationMessageRecord(msg_id=f"msg_{self.n:06d}", role="user",
                                         content=f"{word} #{self.n}", channel_id=channel,
                                         task_id=task, hlc=hlc, ts=1_700_000_000.0 + self.n)

    @rule(channel=st.sampled_from(CHANNELS), task=st.sampled_from(TASKS),
          word=st.sampled_from(WORDS), stamp=st.integers(-3, 20))
    def append(self, channel, task, word, stamp):
        rec = self._new(channel, task, word, stamp)
        assert self.repo.append(rec) is True
        self.stored[rec.msg_id] = rec
        self.appended.append(rec.msg_id)

    @rule(data=st.data())
    @precondition(lambda self: self.stored or self.deleted)
    def duplicate(self, data):
        mid = data.draw(st.sampled_from(sorted(set(self.stored) | self.deleted)))
        rec = self.stored.get(mid) or ConversationMessageRecord(
            msg_id=mid, role="user", content="again", channel_id="general")
        assert self.repo.append(rec) is False

    @rule(k=st.integers(1, 5), channel=st.sampled_from(CHANNELS), stamp=st.integers(-3, 20))
    def append_many(self, k, channel, stamp):
        recs = [self._new(channel, TASKS[i % 3], WORDS[i % len(WORDS)], stamp) for i in range(k)]
        recs.append(recs[0])   # a duplicate inside the batch
        assert self.repo.append_many(recs) == k
        for r in recs[:k]:
            self.stored[r.msg_id] = r
            self.appended.append(r.msg_id)

    @rule(data=st.data())
    @precondition(lambda self: self.stored)
    def delete(self, data):
        mid = data.draw(st.sampled_from(sorted(self.stored)))
        assert self.repo.delete(mid) is True
        del self.stored[mid]
        self.appended.remove(mid)
        self.deleted.add(mid)
        assert self.repo.delete(mid) is False

    @rule(channel=st.sampled_from(CHANNELS))
    def clear_channel(self, channel):
        gone = [m for m in self.appended if self.stored[m].channel_id == channel]
        assert self.repo.clear_channel(channel) == len(gone)
        for mid in gone:
            del self.stored[mid]
            self.appended.remove(mid)
            self.deleted.add(mid)

    @rule()
    def compact(self):
        self.repo.compact()
        # SPEC: compact() cools each channel's messages beyond its newest
        # hot_window, counting the cool ones too (a late or unstamped
        # message can sort before a newer cool one)
        hot_window = self.OPTS["hot_window"]
        for ch in CHANNELS:
            older = self._channel(ch)[:-hot_window] if hot_window else self._channel(ch)
            for rec in older:
                assert self.repo.get_message(rec.msg_id).tier == "cool", (ch, rec.msg_id)

    @rule(snapshot=st.booleans())
    def reopen(self, snapshot):
        self.repo.close()
        if not snapshot:
            path = os.path.join(self.dir, "hot", "conversation_index.snap")
            if os.path.exists(path):
                os.unlink(path)
        self.repo = ConversationStateRepository(self.dir, **self.OPTS)
        self._check_envelopes()

    def _check_envelopes(self) -> None:
        """One conversation.message envelope per append ever acknowledged and
        one conversation.deleted per deletion, whatever the reopens re-derived."""
        import collections
        import json
        kinds: collections.Counter = collections.Counter()
        with open(os.path.join(self.dir, "events.jsonl"), "rb") as f:
            for line in f.read().rstrip(b"\0").splitlines():
                env = json.loads(line)
                kinds[(env["type"], env["id"])] += 1
        want = collections.Counter({("conversation.message", m): 1 for m in set(self.stored) | self.deleted})
        want.update({("conversation.deleted", m): 1 for m in self.deleted})
        assert kinds == want, sorted((k, kinds[k], want[k]) for k in set(kinds) | set(want) if kinds[k] != want[k])

    def _channel(self, ch):
        return model_order([self.stored[m] for m in self.appended if self.stored[m].channel_id == ch])

    @rule(channel=st.sampled_from(CHANNELS), data=st.data())
    def viewer(self, channel, data):
        """A read-only viewer beside the writer (opened once, then refreshed)
        sees what the model holds: every append and deletion here is durable
        on return, whatever compactions and reopens the writer went through."""
        if self.view is None:
            self.view = ConversationStateRepository(self.dir, read_only=True, **self.OPTS)
        else:
            self.view.refresh()
        assert len(self.view) == len(self.stored)
        assert self.view.window(channel, 100) == self._channel(channel)
        mids = sorted(set(self.stored) | self.deleted)
        if mids:
            mid = data.draw(st.sampled_from(mids))
            r = self.view.get_message(mid)
            if mid in self.deleted:
                assert r.status is ReadStatus.NOT_FOUND_CONFIRMED
            else:
                assert r.status is ReadStatus.FOUND_VERIFIED and r.record == self.stored[mid]

    @rule(channel=st.sampled_from(CHANNELS), n=st.integers(-1, 12))
    def window(self, channel, n):
        expect = self._channel(channel)[-n:] if n > 0 else []
        assert self.repo.window(channel, n) == expect

    @rule(task=st.sampled_from(TASKS[1:]))
    def task(self, task):
        got = self.repo.messages_for_task(task)
        assert sorted(r.msg_id for r in got) == sorted(m for m in self.appended
                                                     if self.stored[m].task_id == task)
        for ch in CHANNELS:   # within a channel, the task's messages keep channel order
            sub = [r for r in got if r.channel_id == ch]
            assert sub == [r for r in self._channel(ch) if r.task_id == task]

    @rule(word=st.sampled_from(WORDS + ["ss", "K", "#1", ""]), cs=st.booleans(),
          channel=st.sampled_from([None] + CHANNELS))
    def search(self, word, cs, channel):
        hits = self.repo.search(word, channel, case_sensitive=cs)
        if cs:
            expect = {m for m, r in self.stored.items() if word in r.content}
        else:
            expect = {m for m, r in self.stored.items() if word.casefold() in r.content.casefold()}
        if channel is not None:
            expect = {m for m in expect if self.stored[m].channel_id == channel}
        assert sorted(h.record.msg_id for h in hits) == sorted(expect)
        for h in hits:
            assert h.record == self.stored[h.record.msg_id]
            assert h.tier in ("tail", "hot", "cool")

    @rule(data=st.data())
    @precondition(lambda self: self.stored or self.deleted)
    def get(self, data):
        mid = data.draw(st.sampled_from(sorted(set(self.stored) | self.deleted)))
        r = self.repo.get_message(mid)
        if mid in self.deleted:
            assert r.status is ReadStatus.NOT_FOUND_CONFIRMED and r.record is None
        else:
            assert r.status is ReadStatus.FOUND_VERIFIED
            assert r.record == self.stored[mid]
            assert r.tier in ("tail", "hot", "cool")

    @invariant()
    def length(self):
        assert len(self.repo) == len(self.stored)

    @invariant()
    def channels(self):
        assert self.repo.channels() == sorted({r.channel_id for r in self.stored.values()})

    @invariant()
    def latest_task(self):
        for ch in CHANNELS:
            tasks = [r.task_id for r in self._channel(ch) if r.task_id]
            assert self.repo.latest_task(ch) == (tasks[-1] if tasks else None)


RepositoryModel.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestRepositoryModel = RepositoryModel.TestCase


class BackgroundRepositoryModel(RepositoryModel):
    """The same model with every automatic cooling run of 2 or more messages,
    and every automatic merge, staged by the background thread: deletes,
    reopens and reads land while jobs are in flight or waiting to be adopted."""

    OPTS = dict(compact_every=3, hot_window=1)

    def __init__(self) -> None:
        self._saved_min = tuning.BG_COOL_MIN_ROWS
        tuning.BG_COOL_MIN_ROWS = 2
        super().__init__()

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            tuning.BG_COOL_MIN_ROWS = self._saved_min


BackgroundRepositoryModel.TestCase.settings = settings(
    max_examples=30, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestBackgroundRepositoryModel = BackgroundRepositoryModel.TestCase


class FoldingRepositoryModel(RepositoryModel):
    """The same model where most automatic compactions only fold the tail (a
    wide hot window: nothing to cool), so reopens, deletions and closes land
    between a fold and the compaction that records it."""

    OPTS = dict(compact_every=2, hot_window=6)


FoldingRepositoryModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestFoldingRepositoryModel = FoldingRepositoryModel.TestCase
