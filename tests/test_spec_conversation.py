"""SPEC section 4: ConversationStateRepository (black-box)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rune_fast.conversation_state import (
    ConversationStateRepository,
    MessageRead,
    ReadStatus,
    RuneError,
    SearchHit,
    StateLockedError,
    TaskStateRepository,
)
from rune_fast.records import ConversationMessageRecord, TaskStateRecord

from spec_helpers import msg, tree_snapshot

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def sd(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def repo(sd):
    r = ConversationStateRepository(sd)
    yield r
    r.close()


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def full(content="full ✓ content", channel_id="ch", **kw):
    base = dict(ts=1700000000.123456, role="assistant", task_id="task_abc", token_estimate=42,
                tool_calls=({"id": "call_1", "name": "search", "arguments": {"q": "x", "k": [1, 2, {"z": None}]}},),
                origin="dev-1")
    base.update(kw)
    return ConversationMessageRecord(content=content, channel_id=channel_id, **base)


def cooled_repo(sd, n=6, hot_window=2, ch="ch", **kw):
    """A store whose channel ch has n messages, the oldest n-hot_window cooled."""
    r = ConversationStateRepository(sd, hot_window=hot_window, **kw)
    ms = [msg(f"message number {i}", ch, task_id="task_T") for i in range(n)]
    for m in ms:
        assert r.append(m) is True
    r.compact()
    return r, ms


# ------------------------------------------------------------------ append

def test_append_new_then_duplicate_tail(repo):
    m = msg("a")
    assert repo.append(m) is True
    assert repo.append(m) is False
    assert len(repo) == 1


def test_duplicate_with_other_fields_not_stored(repo):
    m = msg("original")
    repo.append(m)
    impostor = ConversationMessageRecord(msg_id=m.msg_id, role="assistant", content="impostor", channel_id="other")
    assert repo.append(impostor) is False
    assert repo.get_message(m.msg_id).record == m
    assert repo.window("other") == []
    assert len(repo) == 1


def test_duplicate_hot_tier(repo):
    m = msg("a")
    repo.append(m)
    repo.compact()
    assert repo.get_message(m.msg_id).tier == "hot"
    assert repo.append(m) is False
    assert repo.append_many([m]) == 0
    assert len(repo) == 1


def test_duplicate_cool_tier(sd):
    r, ms = cooled_repo(sd)
    try:
        assert r.get_message(ms[0].msg_id).tier == "cool"
        for m in ms:
            assert r.append(m) is False
        assert r.append_many(ms) == 0
        assert len(r) == len(ms)
        assert r.window("ch", 100) == ms
    finally:
        r.close()


def test_duplicate_after_reopen_every_tier(sd):
    r, ms = cooled_repo(sd)
    extra = msg("tail one")
    r.append(extra)
    r.close()
    with ConversationStateRepository(sd, hot_window=2) as r:
        for m in ms + [extra]:
            assert r.append(m) is False
        assert len(r) == len(ms) + 1


def test_append_many_counts(repo):
    a, b, c = msg("a"), msg("b"), msg("c")
    assert repo.append(a) is True
    assert repo.append_many([a, b, c]) == 2
    assert repo.append_many([]) == 0
    assert repo.append_many([a, b, c]) == 0
    assert repo.window("ch", 10) == [a, b, c]


def test_append_many_duplicate_within_batch(repo):
    # ASSUMPTION: a msg_id repeated inside one batch is stored once and counted once.
    a, b = msg("a"), msg("b")
    assert repo.append_many([a, b, a]) == 2
    assert repo.window("ch", 10) == [a, b]
    assert len(repo) == 2


def test_append_many_accepts_generator(repo):
    ms = [msg(str(i)) for i in range(5)]
    assert repo.append_many(m for m in ms) == 5
    assert repo.window("ch", 10) == ms


# ------------------------------------------------------------------ window

def test_window_order_and_sizes(repo):
    ms = [msg(f"m{i}") for i in range(12)]
    for m in ms:
        repo.append(m)
    repo.append(msg("other", "ch2"))
    assert repo.window("ch") == ms[-8:]
    assert repo.window("ch", 3) == ms[-3:]
    assert repo.window("ch", 1) == ms[-1:]
    assert repo.window("ch", 100) == ms
    assert repo.window("ch", 12) == ms
    assert repo.window("ch", 0) == []
    assert repo.window("ch", -5) == []
    assert repo.window("nope", 5) == []
    assert all(isinstance(x, ConversationMessageRecord) for x in repo.window("ch"))


def test_window_spans_cool_tier(sd):
    r, ms = cooled_repo(sd, n=6, hot_window=2)
    try:
        assert [r.get_message(m.msg_id).tier for m in ms] == ["cool"] * 4 + ["hot"] * 2
        assert r.window("ch", 6) == ms
        assert r.window("ch", 4) == ms[-4:]
        assert r.window("ch", 100) == ms
        extra = msg("fresh", "ch")
        r.append(extra)
        assert r.window("ch", 100) == ms + [extra]
        assert r.window("ch", 3) == ms[-2:] + [extra]
    finally:
        r.close()


def test_window_after_compaction_mixed(repo):
    ms = [msg(f"m{i}") for i in range(5)]
    for m in ms[:3]:
        repo.append(m)
    repo.compact()
    for m in ms[3:]:
        repo.append(m)
    assert repo.window("ch", 4) == ms[1:]
    assert [repo.get_message(m.msg_id).tier for m in ms] == ["hot"] * 3 + ["tail"] * 2


# ------------------------------------------------------------------ messages_for_task

def test_messages_for_task_across_tiers(sd):
    r = ConversationStateRepository(sd, hot_window=2)
    try:
        t = [msg(f"t{i}", "ch", task_id="task_A") for i in range(5)]
        noise = [msg(f"n{i}", "ch", task_id="task_B") for i in range(3)]
        seq = [t[0], noise[0], t[1], t[2], noise[1], t[3]]
        for m in seq:
            r.append(m)
        r.compact()  # ch has 6 messages: 4 cool, 2 hot
        r.append(t[4])  # tail
        tiers = {r.get_message(m.msg_id).tier for m in t}
        assert tiers == {"cool", "hot", "tail"}
        assert r.messages_for_task("task_A") == t
        assert r.messages_for_task("task_B") == noise[:2]
        assert r.messages_for_task("task_none") == []
    finally:
        r.close()


def test_messages_for_task_across_channels(repo):
    # ASSUMPTION: a task's messages on several channels come back in global
    # append order (all unstamped).
    a = msg("a", "c1", task_id="task_X")
    b = msg("b", "c2", task_id="task_X")
    c = msg("c", "c1", task_id="task_X")
    for m in (a, b, c):
        repo.append(m)
    assert repo.messages_for_task("task_X") == [a, b, c]


# ------------------------------------------------------------------ get_message

def test_get_message_statuses_and_tiers(sd):
    r = ConversationStateRepository(sd, hot_window=1)
    try:
        a, b = msg("a"), msg("b")
        r.append(a)
        rd = r.get_message(a.msg_id)
        assert isinstance(rd, MessageRead)
        assert rd.status == ReadStatus.FOUND_VERIFIED
        assert rd.record == a and rd.tier == "tail"
        r.compact()
        rd = r.get_message(a.msg_id)
        assert rd.status == ReadStatus.FOUND_VERIFIED and rd.tier == "hot" and rd.record == a
        r.append(b)
        r.compact()  # hot_window=1: a cools
        rd = r.get_message(a.msg_id)
        assert rd.status == ReadStatus.FOUND_VERIFIED and rd.tier == "cool" and rd.record == a
        assert r.get_message(b.msg_id).tier == "hot"
        nf = r.get_message("msg_does_not_exist")
        assert nf.status == ReadStatus.NOT_FOUND_CONFIRMED
        assert nf.record is None and nf.tier is None
    finally:
        r.close()


def test_read_status_members():
    names = {s.name for s in ReadStatus}
    assert {"FOUND_VERIFIED", "SOURCE_CORRUPT", "NOT_FOUND_CONFIRMED"} <= names


@pytest.mark.parametrize("tier", ["tail", "hot", "cool"])
def test_records_come_back_exactly(sd, tier):
    ms = [
        full(),
        full(content="", role="user", tool_calls=(), task_id="", origin="", token_estimate=0),
        full(content="tool output \n with \"quotes\" and \\ backslash \t tab \x00 nul \u2028 ls", role="tool",
             tool_calls=(), tool_call_id="call_1"),
        full(content="emoji 😀 and CJK 漢字 and RTL \u202e", ts=0.1 + 0.2, hlc=""),
        full(content="stamped", hlc="%015d-%010d-%s" % (1700000000000, 1, "dev1")),
        ConversationMessageRecord(role="system", content="sys", channel_id="ch"),
    ]
    r = ConversationStateRepository(sd, hot_window=1 if tier == "cool" else 512)
    try:
        filler = msg("filler", "ch", hlc="%015d-%010d-%s" % (4102444800000, 0, "zzz"))  # year 2100: sorts last
        for m in ms:
            assert r.append(m) is True
        if tier != "tail":
            r.append(filler)  # sorts last: the others leave the hot window when cooling
            r.compact()
        for m in ms:
            rd = r.get_message(m.msg_id)
            assert rd.status == ReadStatus.FOUND_VERIFIED
            assert rd.tier == tier
            assert rd.record == m
            assert rd.record.to_dict() == m.to_dict()
            assert type(rd.record.ts) is float and rd.record.ts == m.ts
    finally:
        r.close()
    with ConversationStateRepository(sd, hot_window=1 if tier == "cool" else 512) as r:
        for m in ms:
            assert r.get_message(m.msg_id).record == m


@pytest.mark.parametrize("tier", ["tail", "hot", "cool"])
def test_large_record_every_tier(sd, tier):
    big = msg("L" * 700_000 + "✓" * 100_000 + "\n\"end", task_id="task_big")
    with ConversationStateRepository(sd, hot_window=1) as r:
        assert r.append(big) is True
        if tier != "tail":
            if tier == "cool":
                r.append(msg("newer"))
            r.compact()
        assert r.get_message(big.msg_id).tier == tier
        assert r.get_message(big.msg_id).record == big
        assert r.messages_for_task("task_big") == [big]
        assert [h.record for h in r.search("✓\n\"END")] == [big]
    with ConversationStateRepository(sd, hot_window=1) as r:
        assert r.get_message(big.msg_id).record == big


# ------------------------------------------------------------------ search

def _hits(repo, *a, **kw):
    hits = repo.search(*a, **kw)
    assert all(isinstance(h, SearchHit) for h in hits)
    return hits


CASE_TABLE = [
    ("Hello World", "hello", True),
    ("hello world", "WORLD", True),
    ("Straße", "STRASSE", True),
    ("STRASSE", "straße", True),
    ("Strasse", "ß", True),
    ("\u212aelvin", "kelvin", True),          # KELVIN SIGN casefolds to k
    ("kelvin", "\u212aELVIN", True),
    ("İstanbul", "istanbul", False),         # İ casefolds to i + U+0307
    ("İstanbul", "i\u0307stanbul", True),
    ("istanbul", "İstanbul", False),
    ("ΣΊΣΥΦΟΣ", "σίσυφος", True),            # final sigma folds to σ
    ("ﬁle", "FILE", True),                    # ligature fi casefolds to fi
    ("abc", "abd", False),
]


@pytest.mark.parametrize("content,needle,expected", CASE_TABLE)
def test_search_casefold_rules(repo, content, needle, expected):
    assert (needle.casefold() in content.casefold()) is expected  # the table agrees with the SPEC formula
    m = msg(content)
    repo.append(m)
    repo.append(msg("unrelated zzz"))
    hits = _hits(repo, needle)
    assert [h.record for h in hits] == ([m] if expected else [])


@pytest.mark.parametrize("content,needle,expected", CASE_TABLE)
def test_search_casefold_rules_cool(sd, content, needle, expected):
    with ConversationStateRepository(sd, hot_window=1) as r:
        m = msg(content)
        r.append(m)
        r.append(msg("unrelated zzz"))
        r.compact()
        assert r.get_message(m.msg_id).tier == "cool"
        hits = _hits(r, needle)
        assert [h.record for h in hits] == ([m] if expected else [])
        if expected:
            assert hits[0].tier == "cool"


def test_search_case_sensitive(repo):
    a, b, c = msg("Hello there"), msg("hello there"), msg("HELLO")
    for m in (a, b, c):
        repo.append(m)
    assert [h.record for h in _hits(repo, "Hello", case_sensitive=True)] == [a]
    assert [h.record for h in _hits(repo, "hello", case_sensitive=True)] == [b]
    assert [h.record for h in _hits(repo, "hello")] == [a, b, c]
    assert [h.record for h in _hits(repo, "Straße", case_sensitive=True)] == []


def test_search_channel_filter_limit_and_empty(repo):
    ms = []
    for i in range(6):
        m = msg(f"needle {i}", "c1" if i % 2 == 0 else "c2")
        ms.append(m)
        repo.append(m)
    repo.append(msg("haystack", "c1"))
    assert [h.record for h in _hits(repo, "needle")] == ms
    assert [h.record for h in _hits(repo, "needle", "c1")] == [ms[0], ms[2], ms[4]]
    assert [h.record for h in _hits(repo, "needle", channel_id="c2")] == [ms[1], ms[3], ms[5]]
    assert [h.record for h in _hits(repo, "needle", limit=2)] == ms[-2:]
    assert [h.record for h in _hits(repo, "needle", "c1", limit=2)] == [ms[2], ms[4]]
    assert [h.record for h in _hits(repo, "needle", limit=100)] == ms
    assert _hits(repo, "needle", limit=0) == []
    assert _hits(repo, "needle", "unknown-channel") == []
    everything = [h.record for h in _hits(repo, "")]
    assert len(everything) == 7 and everything[:6] == ms
    assert [h.record for h in _hits(repo, "", "c2")] == [ms[1], ms[3], ms[5]]


def test_search_spans_tiers_with_tier(sd):
    with ConversationStateRepository(sd, hot_window=2) as r:
        ms = [msg(f"findme {i}") for i in range(5)]
        for m in ms:
            r.append(m)
        r.compact()
        last = msg("findme tail")
        r.append(last)
        hits = _hits(r, "FINDME")
        assert [h.record for h in hits] == ms + [last]
        assert [h.tier for h in hits] == ["cool", "cool", "cool", "hot", "hot", "tail"]
        assert [h.record for h in _hits(r, "findme", limit=3)] == [ms[3], ms[4], last]
        assert [h.tier for h in _hits(r, "findme 1")] == ["cool"]


def test_search_across_channels_spanning_tiers(sd):
    # ASSUMPTION: "oldest first" across channels means append order for unstamped
    # messages (the same order search gives before any compaction).
    with ConversationStateRepository(sd, hot_window=1) as r:
        a = msg("alpha A", "c1")  # oldest; stays hot (its channel's newest)
        c0 = [msg(f"alpha {i}", "c0") for i in range(4)]
        r.append(a)
        r.append_many(c0)
        before = [h.record for h in r.search("alpha")]
        assert before == [a] + c0
        r.compact()  # c0's three oldest cool
        assert [r.get_message(m.msg_id).tier for m in c0] == ["cool", "cool", "cool", "hot"]
        assert [h.record for h in r.search("alpha")] == [a] + c0
        assert [h.record for h in r.search("alpha", limit=4)] == c0  # the newest four hits
        assert [h.record for h in r.search("", limit=1)] == c0[-1:]


def test_messages_for_task_across_channels_spanning_tiers(sd):
    # ASSUMPTION: as above, global append order for unstamped messages.
    with ConversationStateRepository(sd, hot_window=1) as r:
        ms = [msg(f"t{i}", f"c{i % 2}", task_id="task_X") for i in range(6)]
        r.append_many(ms)
        assert r.messages_for_task("task_X") == ms
        r.compact()
        assert r.messages_for_task("task_X") == ms


_alpha = st.sampled_from(list("aAbBßsSkK\u212aİiı\u0307 Σσςﬃﬅſϐβ\u1e9eFfItT"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=st.lists(st.text(_alpha, max_size=8), min_size=1, max_size=6),
       needle=st.text(_alpha, max_size=3), cs=st.booleans())
def test_search_matches_model(contents, needle, cs):
    with tempfile.TemporaryDirectory() as d:
        with ConversationStateRepository(Path(d) / "s", hot_window=2) as r:
            ms = [msg(c) for c in contents]
            r.append_many(ms)
            if len(ms) > 3:
                r.compact()
            if cs:
                want = [m for m in ms if needle in m.content]
            else:
                want = [m for m in ms if needle.casefold() in m.content.casefold()]
            assert [h.record for h in r.search(needle, case_sensitive=cs)] == want


# ------------------------------------------------------------------ latest_task

def test_latest_task(repo):
    assert repo.latest_task("ch") is None
    repo.append(msg("no task"))
    assert repo.latest_task("ch") is None
    repo.append(msg("a", task_id="task_1"))
    repo.append(msg("b", task_id="task_2"))
    repo.append(msg("c"))
    repo.append(msg("d", "other", task_id="task_9"))
    assert repo.latest_task("ch") == "task_2"
    assert repo.latest_task("other") == "task_9"
    assert repo.latest_task("unknown") is None


def test_latest_task_across_tiers(sd):
    with ConversationStateRepository(sd, hot_window=1) as r:
        r.append(msg("a", task_id="task_old"))
        r.append(msg("b"))
        r.compact()
        assert r.latest_task("ch") == "task_old"  # the message carrying it is cool now


# ------------------------------------------------------------------ compaction

def test_auto_compact_every(sd):
    with ConversationStateRepository(sd, compact_every=3) as r:
        a, b, c = msg("a"), msg("b"), msg("c")
        r.append(a)
        r.append(b)
        assert r.append(a) is False
        assert r.append(b) is False  # duplicates do not count
        assert r.get_message(a.msg_id).tier == "tail"
        r.append(c)  # third stored message: compaction runs by itself
        assert r.get_message(a.msg_id).tier == "hot"
        assert r.get_message(c.msg_id).tier == "hot"


def test_auto_compact_cools(sd):
    with ConversationStateRepository(sd, compact_every=4, hot_window=2) as r:
        ms = [msg(f"m{i}") for i in range(4)]
        for m in ms:
            r.append(m)
        assert [r.get_message(m.msg_id).tier for m in ms] == ["cool", "cool", "hot", "hot"]
        assert r.window("ch", 10) == ms


def test_compact_returns_and_reads_unchanged(sd):
    with ConversationStateRepository(sd, hot_window=3) as r:
        ms = [msg(f"m{i}", f"c{i % 2}", task_id=f"task_{i % 3}") for i in range(20)]
        r.append_many(ms)
        before = (r.window("c0", 100), r.window("c1", 100), r.messages_for_task("task_1"),
                  [h.record for h in r.search("m1")], len(r), sorted(r.channels()))
        r.compact()
        r.compact()  # idempotent
        after = (r.window("c0", 100), r.window("c1", 100), r.messages_for_task("task_1"),
                 [h.record for h in r.search("m1")], len(r), sorted(r.channels()))
        assert before == after
    with ConversationStateRepository(sd, hot_window=3) as r:
        assert (r.window("c0", 100), r.window("c1", 100), r.messages_for_task("task_1"),
                [h.record for h in r.search("m1")], len(r), sorted(r.channels())) == after


# ------------------------------------------------------------------ misc API

def test_len_channels_flush_stats(repo):
    assert len(repo) == 0
    assert list(repo.channels()) == []
    repo.append(msg("a", "c1"))
    repo.append(msg("b", "c2"))
    repo.append(msg("c", "c1"))
    assert len(repo) == 3
    assert sorted(repo.channels()) == ["c1", "c2"]
    repo.flush()
    s = repo.stats()
    assert s is not None


def test_context_manager_releases_lock(sd):
    with ConversationStateRepository(sd) as r:
        r.append(msg("x"))
    with ConversationStateRepository(sd) as r:
        assert len(r) == 1


@pytest.mark.parametrize("mode", ["fsync", "batch", "none"])
def test_durability_modes(sd, mode):
    ms = [msg(f"{mode} {i}") for i in range(10)]
    with ConversationStateRepository(sd, durability=mode) as r:
        for m in ms[:5]:
            assert r.append(m) is True
        assert r.append_many(ms[5:]) == 5
        assert r.window("ch", 100) == ms
    with ConversationStateRepository(sd, durability=mode) as r:
        assert r.window("ch", 100) == ms


@pytest.mark.parametrize("mode", ["sync", "FSYNC", "", "always", None, 1])
def test_bad_durability(sd, mode):
    with pytest.raises((ValueError, TypeError)):
        ConversationStateRepository(sd, durability=mode)
    # ASSUMPTION: a refused open leaves no writer lock behind.
    ConversationStateRepository(sd).close()


@pytest.mark.parametrize("mode", ["fsync", "batch", "none"])
def test_acknowledged_survives_process_kill(sd, mode):
    code = (
        "import sys, os\n"
        "from rune_fast.conversation_state import ConversationStateRepository\n"
        "from rune_fast.records import ConversationMessageRecord\n"
        "r = ConversationStateRepository(sys.argv[1], durability=sys.argv[2], compact_every=7, hot_window=3)\n"
        "for i in range(20):\n"
        "    m = ConversationMessageRecord(role='user', content='k%d' % i, channel_id='ch')\n"
        "    r.append(m)\n"
        "    print(m.msg_id, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(sd), mode], cwd=ROOT, env=_env(), capture_output=True,
                         text=True, timeout=60)
    ids = out.stdout.split()
    assert len(ids) == 20, out.stderr
    with ConversationStateRepository(sd, hot_window=3) as r:
        assert [m.msg_id for m in r.window("ch", 100)] == ids
        assert len(r) == 20


def test_batch_mode_threads(sd):
    with ConversationStateRepository(sd, durability="batch") as r:
        _hammer(r)


def _hammer(r, threads=4, per=40):
    made = [[msg(f"t{k}-{i}", f"c{k % 2}") for i in range(per)] for k in range(threads)]
    results = [[] for _ in range(threads)]
    errors = []

    def work(k):
        try:
            for i, m in enumerate(made[k]):
                results[k].append(r.append(m))
                # also re-append someone else's message: never a second copy
                other = made[(k + 1) % threads][i]
                r.append(other)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ths = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert not errors, errors
    assert len(r) == threads * per
    for k in range(threads):
        ch = r.window(f"c{k % 2}", 10_000)
        assert len(ch) == len({m.msg_id for m in ch})
        # each thread's own messages keep its append order
        own = [m for m in ch if m.content.startswith(f"t{k}-")]
        assert own == made[k]
    for k in range(threads):
        for m in made[k]:
            assert r.get_message(m.msg_id).record == m


def test_threads_append_concurrently(sd):
    with ConversationStateRepository(sd, compact_every=16, hot_window=8) as r:
        _hammer(r)
    with ConversationStateRepository(sd, hot_window=8) as r:
        assert len(r) == 160


# ------------------------------------------------------------------ order

def test_order_stamped_by_hlc_unstamped_first(repo):
    s2 = msg("s2", hlc="000000000002000-0000000000-dev")
    u1 = msg("u1")
    s1 = msg("s1", hlc="000000000001000-0000000000-dev")
    u2 = msg("u2")
    s1b = msg("s1b", msg_id="msg_00", hlc="000000000001000-0000000000-dev")  # same hlc as s1, smaller msg_id
    for m in (s2, u1, s1, u2, s1b):
        repo.append(m)
    expect = [u1, u2]
    expect += sorted([s2, s1, s1b], key=lambda m: (m.hlc, m.msg_id))
    assert expect[2:] == [s1b, s1, s2]
    assert repo.window("ch", 10) == expect
    assert repo.window("ch", 2) == [s1, s2]
    assert [h.record for h in repo.search("s")] == [m for m in expect if "s" in m.content]
    repo.compact()
    assert repo.window("ch", 10) == expect


def test_order_holds_across_cool_tier(sd):
    with ConversationStateRepository(sd, hot_window=2) as r:
        stamped = [msg(f"s{i}", task_id="task_o", hlc=f"{1000 * (5 - i):015d}-0000000000-dev") for i in range(5)]
        for m in stamped:
            r.append(m)
        r.compact()
        late = msg("late unstamped", task_id="task_o")
        r.append(late)
        want = [late] + sorted(stamped, key=lambda m: (m.hlc, m.msg_id))
        assert r.window("ch", 100) == want
        assert r.messages_for_task("task_o") == want
        assert [h.record for h in r.search("", "ch")] == want
        assert r.window("ch", 2) == want[-2:]


# ------------------------------------------------------------------ bad input

# ASSUMPTION: a plain dict is a wrong type for append (the API takes records).
@pytest.mark.parametrize("bad", [None, "text", 5, {"role": "user", "content": "x", "channel_id": "c"},
                                 TaskStateRecord(title="t", channel_id="c")])
def test_append_wrong_type(sd, bad):
    with ConversationStateRepository(sd) as r:
        r.append(msg("keep"))
        snap = tree_snapshot(sd)
        with pytest.raises((TypeError, ValueError)):
            r.append(bad)
        assert len(r) == 1
        assert tree_snapshot(sd) == snap


def test_append_many_bad_element_writes_nothing(sd):
    # ASSUMPTION: append_many validates the whole batch before writing any of it.
    with ConversationStateRepository(sd) as r:
        r.append(msg("keep"))
        snap = tree_snapshot(sd)
        good = msg("good")
        with pytest.raises((TypeError, ValueError)):
            r.append_many([good, "not a record"])
        assert tree_snapshot(sd) == snap
        assert r.get_message(good.msg_id).status == ReadStatus.NOT_FOUND_CONFIRMED
        assert len(r) == 1


def test_append_that_raises_stores_nothing(sd):
    """The largest stamp the HLC string form can hold: the store may refuse it,
    but then it must store nothing; or it stores it and says True."""
    m = msg("max stamp", hlc="%015d-%010d-%s" % (10**15 - 1, 10**10 - 1, "zzz"))
    with ConversationStateRepository(sd) as r:
        try:
            ok = r.append(m)
        except (ValueError, RuneError):
            assert r.get_message(m.msg_id).status == ReadStatus.NOT_FOUND_CONFIRMED
            assert len(r) == 0
        else:
            assert ok is True
            assert r.get_message(m.msg_id).record == m
        n = msg("plain message after")
        assert r.append(n) is True
    with ConversationStateRepository(sd) as r:
        assert r.get_message(n.msg_id).record == n


def test_append_many_non_iterable(repo):
    with pytest.raises(TypeError):
        repo.append_many(5)


# ------------------------------------------------------------------ permissions

@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_owner_only_permissions(tmp_path, umask):
    sd = tmp_path / "state"
    old = os.umask(umask)
    try:
        with ConversationStateRepository(sd, hot_window=2, compact_every=5) as r:
            for i in range(12):
                r.append(msg(f"m{i}", f"c{i % 2}", task_id="task_p"))
            r.compact()
            d = msg("to delete", "c0")
            r.append(d)
            r.delete(d.msg_id)
            r.compact()
        with TaskStateRepository(sd) as t:
            t.create("x", "c0")
    finally:
        os.umask(old)
    assert (sd / "events.jsonl").exists()
    assert any((sd / "hot" / "conversation_cool").rglob("*")), "no cool archive was written"
    bad = []
    for p in [sd] + list(sd.rglob("*")):
        mode = stat.S_IMODE(os.lstat(p).st_mode)
        if p.is_dir():
            if mode & 0o077:
                bad.append((str(p), oct(mode)))
        elif mode & 0o077:
            bad.append((str(p), oct(mode)))
    assert not bad, bad


# ------------------------------------------------------------------ hostile ids

HOSTILE = [
    "../escape", "../../../../tmp/evil", "/abs/path", "a/b/c", "..", ".", "~", "C:\\win\\path",
    "con", "nul.txt", "x" * 300, "ch\u202eevil", "😀/😀", "sp ace", "%2e%2e%2f", "\\..\\..",
    "-rf", "*", "ch:colon", "İ", "ß",
]


def test_hostile_ids_stay_inside(tmp_path):
    sd = tmp_path / "inside" / "state"
    sd.parent.mkdir()
    parent_before = sorted(os.listdir(tmp_path))
    stored = []
    with ConversationStateRepository(sd, hot_window=1) as r:
        for i, h in enumerate(HOSTILE):
            m = ConversationMessageRecord(msg_id=h + f"#{i}" if i % 2 else h, role="user", content=f"c{i}",
                                          channel_id=h, task_id=h)
            assert r.append(m) is True
            m2 = msg(f"second {i}", h, task_id=h)
            r.append(m2)
            stored.append((h, m, m2))
        r.compact()
        for h, m, m2 in stored:
            assert r.get_message(m.msg_id).record == m
            assert r.window(h, 10) == [m, m2]
            assert r.latest_task(h) == h
    with TaskStateRepository(sd) as t:
        for h in HOSTILE:
            t.create("x", h)
    with ConversationStateRepository(sd, hot_window=1) as r:
        for h, m, m2 in stored:
            assert r.window(h, 10) == [m, m2]
            assert r.messages_for_task(h) == [m, m2]
        assert sorted(r.channels()) == sorted(HOSTILE)
    assert sorted(os.listdir(tmp_path)) == parent_before
    assert sorted(os.listdir(sd.parent)) == ["state"]
    for p in sd.rglob("*"):
        assert p.resolve().is_relative_to(sd.resolve())
        assert not p.is_symlink()


def test_control_characters_in_ids(sd):
    # ASSUMPTION: any str without lone surrogates is a valid id (SPEC puts no other
    # limit on ids), newline and other control characters included.
    ids = ["a\nb", "tab\there", "cr\rlf", "\x01\x02", "quote\"back\\slash"]
    with ConversationStateRepository(sd, hot_window=1) as r:
        ms = []
        for i, h in enumerate(ids):
            m = ConversationMessageRecord(msg_id=h, role="user", content=f"c{i}", channel_id=h, task_id=h)
            assert r.append(m) is True
            ms.append(m)
        r.append(msg("filler", ids[0]))
        r.compact()
        for h, m in zip(ids, ms):
            assert r.get_message(h).record == m
            assert r.messages_for_task(h) == [m]
    with ConversationStateRepository(sd, hot_window=1) as r:
        for h, m in zip(ids, ms):
            assert r.get_message(h).record == m
    assert sorted(os.listdir(sd.parent)) == ["state"]


# ------------------------------------------------------------------ read_only

def test_read_only_beside_writer(sd):
    w = ConversationStateRepository(sd, hot_window=2)
    try:
        ms = [msg(f"m{i}", task_id="task_r") for i in range(5)]
        for m in ms[:3]:
            w.append(m)
        w.compact()
        for m in ms[3:]:
            w.append(m)
        snap = tree_snapshot(sd)
        ro = ConversationStateRepository(sd, read_only=True)
        try:
            assert ro.window("ch", 100) == ms
            assert ro.get_message(ms[0].msg_id).record == ms[0]
            assert ro.messages_for_task("task_r") == ms
            assert [h.record for h in ro.search("m")] == ms
            assert len(ro) == 5
            for call in (lambda: ro.append(msg("no")), lambda: ro.append_many([msg("no")]),
                         lambda: ro.delete(ms[0].msg_id), lambda: ro.clear_channel("ch"), ro.compact,
                         lambda: ro.merge_ops(w.export_ops())):
                with pytest.raises(RuneError):
                    call()
            assert len(ro) == 5
            assert tree_snapshot(sd) == snap
            # the writer still works while the reader is open
            new = msg("after reader opened", task_id="task_r")
            assert w.append(new) is True
            ro.refresh()
            assert ro.get_message(new.msg_id).record == new
            assert ro.window("ch", 100) == ms + [new]
            snap2 = tree_snapshot(sd)
            ro.refresh()
            ro.window("ch", 3)
            assert tree_snapshot(sd) == snap2
        finally:
            ro.close()
        assert tree_snapshot(sd) == snap2
    finally:
        w.close()


def test_read_only_refresh_after_writer_compaction(sd):
    w = ConversationStateRepository(sd, hot_window=2)
    try:
        first = [msg(f"a{i}") for i in range(3)]
        w.append_many(first)
        ro = ConversationStateRepository(sd, read_only=True)
        try:
            assert ro.window("ch", 100) == first
            more = [msg(f"b{i}") for i in range(4)]
            w.append_many(more)
            w.compact()
            last = msg("c")
            w.append(last)
            ro.refresh()
            assert ro.window("ch", 100) == first + more + [last]
            assert ro.get_message(first[0].msg_id).record == first[0]
            assert len(ro) == 8
        finally:
            ro.close()
    finally:
        w.close()


def test_read_only_does_not_take_writer_lock(sd):
    with ConversationStateRepository(sd) as w:
        w.append(msg("x"))
    ro = ConversationStateRepository(sd, read_only=True)
    try:
        w = ConversationStateRepository(sd)  # a writer can still open
        w.close()
    finally:
        ro.close()


def test_read_only_other_process_sees_messages(sd):
    with ConversationStateRepository(sd) as w:
        ms = [msg(f"p{i}") for i in range(3)]
        w.append_many(ms)
        code = (
            "import sys\n"
            "from rune_fast.conversation_state import ConversationStateRepository\n"
            "r = ConversationStateRepository(sys.argv[1], read_only=True)\n"
            "print(' '.join(m.msg_id for m in r.window('ch', 10)))\n"
            "r.close()\n"
        )
        out = subprocess.run([sys.executable, "-c", code, str(sd)], cwd=ROOT, env=_env(), capture_output=True,
                             text=True, timeout=60)
        assert out.stdout.split() == [m.msg_id for m in ms], out.stderr


# ------------------------------------------------------------------ locking

def test_second_conversation_writer_locked(sd):
    with ConversationStateRepository(sd) as w:
        with pytest.raises(StateLockedError):
            ConversationStateRepository(sd)
        assert w.append(msg("ok")) is True
        code = (
            "import sys\n"
            "from rune_fast.conversation_state import ConversationStateRepository, StateLockedError\n"
            "try:\n"
            "    ConversationStateRepository(sys.argv[1])\n"
            "except StateLockedError:\n"
            "    print('LOCKED')\n"
            "else:\n"
            "    print('OPENED')\n"
        )
        out = subprocess.run([sys.executable, "-c", code, str(sd)], cwd=ROOT, env=_env(), capture_output=True,
                             text=True, timeout=60)
        assert out.stdout.strip() == "LOCKED", out.stderr


def test_writers_of_different_kinds_coexist(sd):
    with ConversationStateRepository(sd) as c, TaskStateRepository(sd) as t:
        tk = t.create("x", "ch")
        m = msg("y", task_id=tk.task_id)
        assert c.append(m) is True
    with ConversationStateRepository(sd) as c, TaskStateRepository(sd) as t:
        assert c.get_message(m.msg_id).record == m
        assert t.get(tk.task_id) == tk


def test_conversation_lock_dies_with_process(sd):
    code = (
        "import sys, time\n"
        "from rune_fast.conversation_state import ConversationStateRepository\n"
        "from rune_fast.records import ConversationMessageRecord\n"
        "r = ConversationStateRepository(sys.argv[1])\n"
        "r.append(ConversationMessageRecord(role='user', content='held', channel_id='ch'))\n"
        "print('READY', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(sd)], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "READY"
        with pytest.raises(StateLockedError):
            ConversationStateRepository(sd)
    finally:
        p.kill()
        p.wait(timeout=30)
        p.stdout.close()
        p.stderr.close()
    with ConversationStateRepository(sd) as r:
        assert [m.content for m in r.window("ch")] == ["held"]


# ------------------------------------------------------------------ legacy import

def _legacy_dicts():
    ms = [msg(f"legacy {i}", "c1" if i < 3 else "c2", task_id="task_L", ts=1000.0 + i) for i in range(5)]
    dicts = []
    for m in ms:
        d = m.to_dict()
        # seed-era dicts: no tool/sync fields
        for k in ("tool_calls", "tool_call_id", "origin", "hlc"):
            d.pop(k, None)
        dicts.append(d)
    return ms, dicts


@pytest.mark.parametrize("form", ["list", "object"])
def test_legacy_fat_checkpoint_imported_once(sd, form):
    ms, dicts = _legacy_dicts()
    payload = dicts + [dicts[1], dicts[3]]  # duplicates inside the legacy file
    (sd / "hot").mkdir(parents=True)
    data = payload if form == "list" else {"messages": payload}
    (sd / "hot" / "conversation_messages.json").write_text(json.dumps(data))
    with ConversationStateRepository(sd) as r:
        assert len(r) == 5
        assert r.window("c1", 10) == ms[:3]
        assert r.window("c2", 10) == ms[3:]
        for m in ms:
            assert r.get_message(m.msg_id).record == m
        assert r.messages_for_task("task_L") == ms
        assert r.append(ms[0]) is False
        new = msg("post-import", "c1")
        assert r.append(new) is True
    for _ in range(2):
        with ConversationStateRepository(sd) as r:
            assert len(r) == 6
            assert r.window("c1", 10) == ms[:3] + [new]


def test_legacy_import_dedupes_against_stored(sd):
    ms, dicts = _legacy_dicts()
    with ConversationStateRepository(sd) as r:
        r.append(ms[0])
    (sd / "hot").mkdir(parents=True, exist_ok=True)
    legacy = sd / "hot" / "conversation_messages.json"
    # ASSUMPTION: the store may use this path itself; only place the legacy file
    # if the store left nothing there.
    if legacy.exists():
        pytest.skip("store keeps its own file at the legacy path")
    legacy.write_text(json.dumps(dicts))
    with ConversationStateRepository(sd) as r:
        assert len(r) == 5
        assert r.window("c1", 10) == ms[:3]


def test_readers_during_writes_and_compaction(sd):
    with ConversationStateRepository(sd, compact_every=10, hot_window=5) as r:
        stop = threading.Event()
        errors = []
        made = [msg(f"w{i}", task_id="task_w") for i in range(120)]

        def reader():
            try:
                while not stop.is_set():
                    w = r.window("ch", 20)
                    ids = [m.msg_id for m in w]
                    assert len(ids) == len(set(ids))
                    order = {m.msg_id: i for i, m in enumerate(made)}
                    assert [order[i] for i in ids] == sorted(order[i] for i in ids)
                    r.search("w1")
                    if w:
                        assert r.get_message(w[0].msg_id).status == ReadStatus.FOUND_VERIFIED
                    r.messages_for_task("task_w")
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        ths = [threading.Thread(target=reader) for _ in range(2)]
        for t in ths:
            t.start()
        try:
            for m in made:
                assert r.append(m) is True
        finally:
            stop.set()
            for t in ths:
                t.join()
        assert not errors, errors
        assert r.window("ch", 1000) == made
        assert r.messages_for_task("task_w") == made


def test_read_only_refresh_sees_deletions_and_erasure(sd):
    w = ConversationStateRepository(sd, hot_window=2)
    try:
        ms = [msg(f"d{i}") for i in range(6)]
        w.append_many(ms)
        w.compact()
        ro = ConversationStateRepository(sd, read_only=True)
        try:
            assert ro.window("ch", 100) == ms
            assert w.delete(ms[0].msg_id) is True  # a cool one
            assert w.delete(ms[5].msg_id) is True  # a hot one
            ro.refresh()
            assert ro.window("ch", 100) == ms[1:5]
            assert ro.get_message(ms[0].msg_id).status == ReadStatus.NOT_FOUND_CONFIRMED
            w.compact()  # erasure rewrites files under the reader
            w.append(msg("after erase"))
            ro.refresh()
            assert [m.content for m in ro.window("ch", 100)] == ["d1", "d2", "d3", "d4", "after erase"]
            assert len(ro) == 5
        finally:
            ro.close()
    finally:
        w.close()


_REFRESH_LOOP_SCRIPT = 'import sys, threading\nfrom pathlib import Path\nsys.path.insert(0, sys.argv[2])\nfrom spec_helpers import msg\nfrom rune_fast.conversation_state import ConversationStateRepository, ReadStatus\nsd = Path(sys.argv[1])\nw = ConversationStateRepository(sd, hot_window=3, compact_every=5)\nerrors = []\nstop = threading.Event()\ntry:\n    w.append(msg("seed"))\n    ro = ConversationStateRepository(sd, read_only=True)\n\n    def reader():\n        try:\n            last = 0\n            while not stop.is_set():\n                ro.refresh()\n                got = ro.window("ch", 1000)\n                assert len(got) >= last, "a reader lost messages it had seen"\n                assert len(got) == len({m.msg_id for m in got})\n                last = len(got)\n        except Exception as e:  # noqa: BLE001 - reported below\n            errors.append(e)\n\n    t = threading.Thread(target=reader)\n    t.start()\n    try:\n        for i in range(150):  # 30 compactions, each racing the reader\n            w.append(msg(f"w{i}"))\n    finally:\n        stop.set()\n        t.join()\n    ro.refresh()\n    assert ro.window("ch", 1000) == w.window("ch", 1000)\n    ro.close()\nfinally:\n    w.close()\nassert not errors, errors\nprint(\'OK\')\n'


def test_read_only_refresh_loop_while_writer_compacts(sd):
    """A viewer refreshing in a loop beside a writer that compacts: never a
    false damage report, never a lost message (run in a child process so a
    crash of the reader cannot take the test run down)."""
    out = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _REFRESH_LOOP_SCRIPT, str(sd),
                          str(Path(__file__).parent)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "OK", (out.returncode, out.stderr[-3000:])


def test_threads_append_delete_compact(sd):
    import random

    with ConversationStateRepository(sd, hot_window=4, compact_every=9) as r:
        made = [[msg(f"t{k}-{i}", f"c{k}") for i in range(40)] for k in range(3)]
        deleted = set()
        lock = threading.Lock()
        errors = []

        def writer(k):
            try:
                for m in made[k]:
                    assert r.append(m) is True
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        def deleter():
            rnd = random.Random(3)
            try:
                for _ in range(40):
                    k = rnd.randrange(3)
                    i = rnd.randrange(40)
                    m = made[k][i]
                    if r.get_message(m.msg_id).status == ReadStatus.FOUND_VERIFIED:
                        if r.delete(m.msg_id):
                            with lock:
                                deleted.add(m.msg_id)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        def compactor():
            try:
                for _ in range(10):
                    r.compact()
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        ths = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
        ths += [threading.Thread(target=deleter), threading.Thread(target=compactor)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        assert not errors, errors
        live = [[m for m in made[k] if m.msg_id not in deleted] for k in range(3)]
        for k in range(3):
            assert r.window(f"c{k}", 1000) == live[k]
        assert len(r) == sum(len(x) for x in live)
        r.compact()
        rep = r.verify()
        from spec_helpers import problems_text, verify_ok

        assert verify_ok(rep), problems_text(rep)
    with ConversationStateRepository(sd, hot_window=4) as r:
        for k in range(3):
            assert r.window(f"c{k}", 1000) == live[k]
        for mid in deleted:
            assert r.get_message(mid).status == ReadStatus.NOT_FOUND_CONFIRMED


@pytest.mark.parametrize("hlc", ["garbage", "1-2-3", "000000000000001-0000000000-", "-", " "])
def test_append_odd_hlc_atomic(sd, hlc):
    """A record whose hlc is not an Hlc string: refused with nothing written, or
    stored and returned exactly."""
    m = msg("odd stamp", hlc=hlc)
    with ConversationStateRepository(sd) as r:
        snap = tree_snapshot(sd)
        try:
            ok = r.append(m)
        except (ValueError, TypeError):
            assert r.get_message(m.msg_id).status == ReadStatus.NOT_FOUND_CONFIRMED
            assert len(r) == 0
            assert tree_snapshot(sd) == snap
        else:
            assert ok is True
            assert r.get_message(m.msg_id).record == m


def test_corrupt_legacy_checkpoint_is_loud(sd):
    from rune_fast.conversation_state import CorruptStateCheckpointError

    (sd / "hot").mkdir(parents=True)
    (sd / "hot" / "conversation_messages.json").write_text('[{"msg_id": "m1", "role": "user", "cont')
    with pytest.raises(CorruptStateCheckpointError) as ei:
        ConversationStateRepository(sd)
    assert "conversation_messages.json" in str(ei.value)


def test_hot_window_per_channel_by_order(sd):
    with ConversationStateRepository(sd, hot_window=3) as r:
        sizes = {"c1": 1, "c5": 5, "c10": 10}
        made = {}
        for ch, k in sizes.items():
            made[ch] = [msg(f"{ch}-{i}", ch) for i in range(k)]
            r.append_many(made[ch])
        # stamped messages appended newest first: the hot ones are the newest by hlc
        st_ = [msg(f"s{i}", "cs", hlc=f"{1000 + i:015d}-0000000000-d") for i in range(6)]
        r.append_many(list(reversed(st_)))
        r.compact()
        for ch, ms in made.items():
            tiers = [r.get_message(m.msg_id).tier for m in ms]
            k = len(ms)
            assert tiers == ["cool"] * max(0, k - 3) + ["hot"] * min(k, 3), (ch, tiers)
        assert [r.get_message(m.msg_id).tier for m in st_] == ["cool"] * 3 + ["hot"] * 3
        assert r.window("cs", 10) == st_


_NO_REFRESH_SCRIPT = 'import sys\nfrom pathlib import Path\nsys.path.insert(0, sys.argv[2])\nfrom spec_helpers import msg\nfrom rune_fast.conversation_state import ConversationStateRepository, ReadStatus\nsd = Path(sys.argv[1])\nw = ConversationStateRepository(sd, hot_window=2)\ntry:\n    ms = [msg(f"v{i}", task_id="task_v") for i in range(5)]\n    w.append_many(ms)\n    w.compact()\n    ro = ConversationStateRepository(sd, read_only=True)\n    try:\n        old = ro.window("ch", 100)\n        assert old == ms\n        more = [msg(f"n{i}", task_id="task_v") for i in range(6)]\n        w.append_many(more)\n        w.delete(ms[0].msg_id)\n        w.compact()\n        w.compact()\n        new = w.window("ch", 100)\n        for _ in range(2):\n            assert ro.window("ch", 100) in (old, new)\n            assert ro.messages_for_task("task_v") in (old, new)\n            assert [h.record for h in ro.search("v")] in (\n                [m for m in old if "v" in m.content], [m for m in new if "v" in m.content])\n            rd = ro.get_message(ms[3].msg_id)\n            assert rd.status == ReadStatus.FOUND_VERIFIED and rd.record == ms[3]\n        ro.refresh()\n        assert ro.window("ch", 100) == new\n    finally:\n        ro.close()\nfinally:\n    w.close()\nprint(\'OK\')\n'


def test_read_only_without_refresh_stays_usable(sd):
    # ASSUMPTION: a reader that has not refreshed keeps serving a consistent
    # (possibly older) view while the writer compacts, cools and erases.
    # Run in a child process: a reader that maps files the writer rewrites in
    # place can die of SIGBUS, which would take the whole test run down.
    out = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _NO_REFRESH_SCRIPT, str(sd), str(Path(__file__).parent)],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "OK", (out.returncode, out.stderr[-3000:])


# ASSUMPTION: reads given the wrong types refuse them (TypeError/ValueError)
# rather than answering "not found" or failing deep inside.
@pytest.mark.parametrize("call", [
    lambda r: r.get_message(123),
    lambda r: r.get_message(None),
    lambda r: r.window(None),
    lambda r: r.window("ch", "3"),
    lambda r: r.search(None),
    lambda r: r.search(b"bytes"),
    lambda r: r.messages_for_task(5),
    lambda r: r.delete(7),
])
def test_reads_with_wrong_types(repo, call):
    repo.append(msg("x"))
    with pytest.raises((TypeError, ValueError)):
        call(repo)
    assert len(repo) == 1


@pytest.mark.parametrize("mode", ["fsync", "batch"])
def test_concurrent_same_message_stored_once(sd, mode):
    from spec_helpers import hashes_of

    with ConversationStateRepository(sd, durability=mode) as r:
        for round_ in range(5):
            m = msg(f"race {round_}")
            results = []
            barrier = threading.Barrier(8)

            def go():
                barrier.wait()
                results.append(r.append(m))

            ths = [threading.Thread(target=go) for _ in range(8)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            assert sorted(results) == [False] * 7 + [True]
        assert len(r) == 5
        assert len(r.window("ch", 100)) == 5
    c = hashes_of(sd / "events.jsonl", "conversation.message")
    assert len(c) == 5 and len(set(c)) == 5
