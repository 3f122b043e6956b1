"""Reads of a channel whose hot messages sort before some of its archived
ones (a late merge): window and latest_task read each tier's newest rows,
not the whole channel, and agree with the channel sorted by the order key
(a plain-Python model)."""
from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings, strategies as st

from rune_fast import ConversationMessageRecord, ConversationStateRepository
from rune_fast._order import order_key
from rune_fast.sync import Hlc


def _msg(i, wall, task, stamped=True):
    return ConversationMessageRecord(msg_id=f"m{i:04d}", channel_id="c", role="user", content=f"turn {i}",
                                     task_id=task, ts=1_700_000_000.0 + i,
                                     hlc=str(Hlc(wall, 0, "dev")) if stamped else "", origin="dev")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(walls=st.lists(st.integers(1, 400), min_size=1, max_size=80), late=st.lists(st.integers(0, 400),
       min_size=1, max_size=6), cut=st.integers(0, 80), seed=st.integers(0, 10 ** 6))
def test_an_interleaved_channel_reads_like_the_model(tmp_path_factory, monkeypatch, walls, late, cut, seed):
    rnd = random.Random(seed)
    d = tmp_path_factory.mktemp("i")
    stored = []
    with ConversationStateRepository(d, hot_window=2, compact_every=10 ** 6, durability="none") as repo:
        first = [_msg(i, 1_700_000_000_000 + w, rnd.choice(["", "", "t1", "t2"])) for i, w in enumerate(walls)]
        repo.append_many(first[:cut] + [m for m in first[cut:] if rnd.random() < 0.3])
        stored += first[:cut] + [m for m in first[cut:] if repo.get_message(m.msg_id).record is not None]
        repo.compact()
        # late merges: stamped before archived rows (and one unstamped)
        extra = [_msg(1000 + i, 1_700_000_000_000 + w, rnd.choice(["", "t3"])) for i, w in enumerate(late)]
        extra.append(_msg(2000, 0, "", stamped=False))
        repo.append_many(extra)
        stored += extra
        for m in rnd.sample(stored, min(3, len(stored))):
            repo.delete(m.msg_id)
            stored.remove(m)
        want = sorted(stored, key=lambda m: order_key(m.hlc, m.msg_id, (0 if m.msg_id != "m2000" else 1, 0)))
        monkeypatch.setattr(repo, "_channel_all", None)     # (no whole-channel read)
        for n in (1, 3, 8, 50, 200):
            assert repo.window("c", n) == want[-n:]
        tasks = [m.task_id for m in want if m.task_id]
        assert repo.latest_task("c") == (tasks[-1] if tasks else None)
