"""resume_messages of a channel out of fold order keeps its newest archived
rows by stamp between calls (exchange._archived_by_stamp): every call is
still section 7's fold of the store's ops, through deletions, new archive
files, merges and erasures, for any n, with the kept candidates few."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rune_fast import ConversationMessageRecord, ConversationStateRepository, sync
from rune_fast._conv import exchange
from rune_fast.sync import Hlc

class _Messages:
    """Messages of channel "c", m001, m002, ... in the order they are made."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, ts: float, role: str, wall: int | str) -> ConversationMessageRecord:
        self.made += 1
        k = self.made
        return ConversationMessageRecord(msg_id=f"m{k:03d}", channel_id="c", role=role, content=f"turn {k}",
                                         ts=ts, hlc="" if wall == "" else str(Hlc(wall, 0, "dev")))


_steps = st.lists(st.one_of(
    st.tuples(st.just("resume"), st.integers(1, 12)),
    st.tuples(st.just("delete"), st.integers(0, 200)),
    st.tuples(st.just("append"), st.integers(1, 20)),
    st.tuples(st.just("compact"), st.just(0)),
), min_size=1, max_size=14)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(0, 5000), st.sampled_from(["user", "assistant", "system"]),
                          st.one_of(st.just(""), st.integers(0, 9000))), min_size=5, max_size=60),
       _steps, st.integers(0, 4))
def test_every_transcript_is_the_fold_of_the_ops(tmp_path_factory, monkeypatch, msgs, steps, hot):
    monkeypatch.setattr(exchange, "_STAMP_TOPS", 3)     # (few kept: the refills are reached)
    d = tmp_path_factory.mktemp("tops")
    record = _Messages()

    with ConversationStateRepository(d, compact_every=10**6, hot_window=hot, durability="none") as repo:
        repo.append_many([record(*m) for m in msgs])
        repo.compact()
        for what, x in steps:
            if what == "resume":
                for n in (x, x, 1):         # (the second and third from what the first kept)
                    assert repo.resume_messages("c", n) == sync.resume_messages(repo.export_ops(), "c", n)
            elif what == "delete":
                repo.delete(f"m{x % record.made + 1:03d}")
            elif what == "append":
                repo.append_many([record(*msgs[(x + i) % len(msgs)]) for i in range(x)])
            else:
                repo.compact()              # new files, merges, erasures of the deleted
        assert repo.resume_messages("c", 5) == sync.resume_messages(repo.export_ops(), "c", 5)


def test_a_later_transcript_reads_no_archived_stamp(tmp_path, monkeypatch):
    """Once a channel's newest archived rows are kept, a transcript reads
    the stamps of none (until its files change)."""
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=4, durability="none") as repo:
        repo.append_many([ConversationMessageRecord(msg_id=f"m{i:03d}", channel_id="c", content=f"t {i}",
                                                    ts=float((i * 37) % 101)) for i in range(300)])
        repo.compact()
        assert not repo._fold_consistent("c") and repo._cool.channel_len("c") > 200
        want = repo.resume_messages("c", 10)
        real = repo._cool.channel_stamp_arrays
        calls: list[object] = []
        monkeypatch.setattr(repo._cool, "channel_stamp_arrays",
                            lambda ch, only=None: calls.append(only) or real(ch, only))
        assert repo.resume_messages("c", 10) == want
        assert repo.resume_messages("c", 3) == sync.resume_messages(repo.export_ops(), "c", 3)
        assert calls == []
        assert len(repo._stamp_tops["c"][2]) == exchange._STAMP_TOPS
        repo.append_many([ConversationMessageRecord(msg_id=f"n{i:03d}", channel_id="c", content=f"u {i}",
                                                    ts=float(i)) for i in range(50)])
        before = set(repo._cool.channel_files("c"))
        repo.compact()                      # a new file of the channel: its stamps alone read
        assert repo.resume_messages("c", 10) == sync.resume_messages(repo.export_ops(), "c", 10)
        assert calls == [set(repo._cool.channel_files("c")) - before] and calls[0]


@pytest.mark.parametrize("n", [1, 40, 200])
def test_a_transcript_longer_than_the_kept_rows_reads_them_again(tmp_path, n):
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=2, durability="none") as repo:
        repo.append_many([ConversationMessageRecord(msg_id=f"m{i:03d}", channel_id="c", content=f"t {i}",
                                                    ts=float((i * 53) % 211)) for i in range(400)])
        repo.compact()
        assert repo.resume_messages("c", 5) == sync.resume_messages(repo.export_ops(), "c", 5)
        assert repo.resume_messages("c", n) == sync.resume_messages(repo.export_ops(), "c", n)
        newest = [op.op_id for op in repo.export_ops()][-30:]       # (ops by stamp: the newest last)
        for mid in newest[:25]:
            repo.delete(mid)                # most of what was kept deleted
        assert repo.resume_messages("c", n) == sync.resume_messages(repo.export_ops(), "c", n)


def _turns(repo, n):
    return repo.resume_messages("c", n), sync.resume_messages(repo.export_ops(), "c", n)


def test_rows_added_to_kept_ones_keep_them_every_row_from_their_oldest_on(tmp_path, monkeypatch):
    """The kept rows (the newest 3 of 20) and a new file's rows, older than
    the oldest kept but for one: what is kept after holds every live row
    from its oldest on, not a new row past an old one it never read."""
    monkeypatch.setattr(exchange, "_STAMP_TOPS", 3)
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=0, durability="none") as repo:
        repo.append_many([ConversationMessageRecord(msg_id=f"m{i:03d}", channel_id="c", content=f"t {i}",
                                                    ts=100.0 + (19 - i if i < 2 else i)) for i in range(20)])
        repo.compact()
        assert not repo._fold_consistent("c")
        got, want = _turns(repo, 1)
        assert got == want and not repo._stamp_tops["c"][1]         # the newest 3 kept, not all
        repo.append_many([ConversationMessageRecord(msg_id=f"n{i}", channel_id="c", content=f"u {i}",
                                                    ts=110.5 + i) for i in range(5)] +
                         [ConversationMessageRecord(msg_id="n9", channel_id="c", content="u 9", ts=200.0)])
        repo.compact()                      # a new file: five rows older than the kept ones, one newer
        for n in (3, 5, 2, 10):             # (3: the new rows joined; 5: from what was kept)
            got, want = _turns(repo, n)
            assert got == want, n


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.tuples(st.floats(0, 5000), st.sampled_from(["user", "assistant", "system"]),
                                   st.one_of(st.just(""), st.integers(0, 9000))), min_size=1, max_size=8),
                min_size=1, max_size=6),
       st.integers(1, 6))
def test_a_viewer_keeps_its_verdicts_as_the_writer_does(tmp_path_factory, batches, n):
    """A viewer's refresh notes the writer's new messages in its fold-order
    verdicts as the writer does on append (it forgot them, and worked each
    out again from every message); its transcripts stay the fold of its ops."""
    d = tmp_path_factory.mktemp("viewer")
    record = _Messages()

    with ConversationStateRepository(d, compact_every=10**6, hot_window=3, durability="none") as w:
        w.append_many([record(1.0 + i, "user", "") for i in range(10)])
        w.compact()
        with ConversationStateRepository(d, read_only=True) as v:
            assert w._fold_consistent("c") and v._fold_consistent("c")
            for batch in batches:
                w.append_many([record(*m) for m in batch])
                v.refresh()
                assert v._fold_order["c"][0] == w._fold_order["c"][0]
                assert v.resume_messages("c", n) == sync.resume_messages(v.export_ops(), "c", n)


def _said(turns):
    """The contents of a transcript's messages (a turn joins its role's in a row)."""
    return "\n".join(m["content"] for m in turns).split("\n")


def test_the_kept_hot_candidates_follow_appends_deletions_and_cooling(tmp_path, monkeypatch):
    """The newest hot messages kept between transcripts of a channel out
    of fold order: a new line is keyed and joins them, a deleted or cooled
    one makes them be worked out again; every transcript is the fold."""
    monkeypatch.setattr(exchange, "_STAMP_TOPS", 3)
    record = _Messages()
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=4, durability="none") as repo:
        repo.append_many([record(100.0 + (7 * i) % 13, "user", "") for i in range(20)])
        repo.compact()
        repo.append_many([record(200.0 + i, "user", "") for i in range(6)])     # hot, newest
        assert not repo._fold_consistent("c")
        got, want = _turns(repo, 2)
        assert got == want and _said(got) == ["turn 25", "turn 26"]
        kept = repo._hot_tops["c"]
        repo.append(record(150.0, "user", ""))              # older than the kept: it does not join
        got, want = _turns(repo, 2)
        assert got == want and repo._hot_tops["c"][2] == kept[2]
        repo.append(record(300.0, "assistant", ""))         # newest: joins
        got, want = _turns(repo, 2)
        assert got == want and _said(got)[-1] == "turn 28"
        repo.delete("m028")                                 # a kept one deleted
        got, want = _turns(repo, 2)
        assert got == want and _said(got) == ["turn 25", "turn 26"]
        repo.delete("m026")
        repo.delete("m025")
        got, want = _turns(repo, 3)
        assert got == want and _said(got) == ["turn 22", "turn 23", "turn 24"]
        repo.compact()                                      # hot lines cooled and moved
        for n in (1, 3, 8):
            got, want = _turns(repo, n)
            assert got == want, n
