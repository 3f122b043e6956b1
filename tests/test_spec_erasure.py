"""SPEC section 4 (delete, clear_channel) and the erasure promise (black-box)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rune_fast.conversation_state import ConversationStateRepository, ReadStatus

from spec_helpers import all_files, canonical_hash, hashes_of, msg, problems_text, verify_ok


@pytest.fixture
def sd(tmp_path):
    return tmp_path / "state"


def content_places(sd: Path, secret: str) -> list[str]:
    """Every place under sd that still holds secret: raw bytes of any file, or a
    string cell of any Parquet file (the archive may be compressed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    places = []
    raw = secret.encode()
    escaped = json.dumps(secret)[1:-1].encode()
    for p in all_files(sd):
        data = p.read_bytes()
        if raw in data or escaped in data:
            places.append(str(p))
        if data[:4] == b"PAR1":
            t = pq.read_table(p)
            for name in t.column_names:
                col = t.column(name)
                if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                    if any(v is not None and secret in v for v in col.to_pylist()):
                        places.append(f"{p}:{name}")
    return places


def _resume_contents(r, ch):
    out = []
    for m in r.resume_messages(ch):
        c = m.get("content")
        out.append(c if isinstance(c, str) else json.dumps(c))
    return " | ".join(out)


def _setup(sd, tier):
    """A store (hot_window=2) whose message `target` is in the given tier."""
    r = ConversationStateRepository(sd, hot_window=2)
    secret = f"SECRET-ERASE-{tier}-7f3a9"
    target = msg(f"user says {secret} here", "ch", task_id="task_secret")
    before = [msg("first", "ch", task_id="task_prev"), msg("second", "ch")]
    after = [msg("third", "ch"), msg("fourth", "ch")]
    other = msg("other channel", "ch2", task_id="task_secret")
    if tier == "cool":
        seq_a, seq_b = before + [target] + after, []
    elif tier == "hot":
        seq_a, seq_b = before + after + [target], []
    else:
        seq_a, seq_b = before + after, [target]
    # ASSUMPTION: a message not stamped with hlc is ordered by append order, so
    # `target` is newest in the hot and tail cases.
    r.append(other)
    r.append_many(seq_a)
    r.compact()
    r.append_many(seq_b)
    assert r.get_message(target.msg_id).tier == tier
    kept = [m for m in seq_a + seq_b if m is not target]
    return r, target, secret, kept, other


def _assert_gone(r, target, secret, kept, other):
    rd = r.get_message(target.msg_id)
    assert rd.status == ReadStatus.NOT_FOUND_CONFIRMED
    assert rd.record is None and rd.tier is None
    assert r.window("ch", 100) == kept
    assert target not in r.window("ch", 1)
    assert r.messages_for_task("task_secret") == [other]
    assert r.search(secret) == []
    assert [h.record for h in r.search("", "ch")] == kept
    assert secret not in _resume_contents(r, "ch")
    assert r.latest_task("ch") == "task_prev"
    assert len(r) == len(kept) + 1


@pytest.mark.parametrize("tier", ["tail", "hot", "cool"])
def test_delete_in_each_tier(sd, tier):
    r, target, secret, kept, other = _setup(sd, tier)
    try:
        assert secret in _resume_contents(r, "ch")
        assert r.latest_task("ch") == "task_secret"
        n = len(r)
        assert content_places(sd, secret), "test setup: secret not stored"
        assert r.delete(target.msg_id) is True
        assert len(r) == n - 1
        _assert_gone(r, target, secret, kept, other)
        assert r.delete(target.msg_id) is False
        assert r.append(target) is False
        assert r.append_many([target]) == 0
        _assert_gone(r, target, secret, kept, other)
        r.compact()
        _assert_gone(r, target, secret, kept, other)
        assert content_places(sd, secret) == []
        rep = r.verify()
        assert verify_ok(rep), problems_text(rep)
    finally:
        r.close()
    with ConversationStateRepository(sd, hot_window=2) as r:
        _assert_gone(r, target, secret, kept, other)
        assert r.append(target) is False
    assert content_places(sd, secret) == []


@pytest.mark.parametrize("tier", ["tail", "hot", "cool"])
def test_delete_then_reopen_then_compact(sd, tier):
    r, target, secret, kept, other = _setup(sd, tier)
    try:
        assert r.delete(target.msg_id) is True
    finally:
        r.close()
    with ConversationStateRepository(sd, hot_window=2) as r:
        _assert_gone(r, target, secret, kept, other)
        assert r.append(target) is False
        r.compact()
        _assert_gone(r, target, secret, kept, other)
    assert content_places(sd, secret) == []
    with ConversationStateRepository(sd, hot_window=2) as r:
        _assert_gone(r, target, secret, kept, other)


def test_deleted_envelope(sd):
    with ConversationStateRepository(sd) as r:
        m = msg("to be deleted")
        r.append(m)
        assert r.delete(m.msg_id) is True
    hashes = hashes_of(sd / "events.jsonl", "conversation.deleted")
    assert canonical_hash({"msg_id": m.msg_id}) in hashes


def test_delete_unknown_is_false(sd):
    with ConversationStateRepository(sd) as r:
        r.append(msg("x"))
        assert r.delete("msg_never_stored") is False
        assert len(r) == 1


@pytest.mark.parametrize("tier", ["tail", "hot", "cool"])
def test_clear_channel_each_tier(sd, tier):
    with ConversationStateRepository(sd, hot_window=2) as r:
        keep = [msg(f"keep {i}", "other", task_id="task_k") for i in range(3)]
        gone = [msg(f"CLEARME-{tier}-{i}", "doomed", task_id="task_g") for i in range(5)]
        r.append_many(keep)
        if tier == "tail":
            r.compact()
            r.append_many(gone)
        else:
            r.append_many(gone)
            r.compact()  # hot_window=2: three of them cool, the newest two stay hot
        tiers = {r.get_message(m.msg_id).tier for m in gone}
        assert tier in tiers
        assert r.clear_channel("doomed") == 5
        assert r.clear_channel("doomed") == 0
        assert r.clear_channel("never-existed") == 0
        for m in gone:
            assert r.get_message(m.msg_id).status == ReadStatus.NOT_FOUND_CONFIRMED
            assert r.append(m) is False
        assert r.window("doomed", 100) == []
        assert r.messages_for_task("task_g") == []
        assert r.search("CLEARME") == []
        assert r.resume_messages("doomed") == []
        assert r.latest_task("doomed") is None
        assert len(r) == 3
        # ASSUMPTION: a cleared channel is no longer listed by channels().
        assert sorted(r.channels()) == ["other"]
        assert r.window("other", 100) == keep
        r.compact()
        assert content_places(sd, f"CLEARME-{tier}") == []
        assert r.window("other", 100) == keep
        assert verify_ok(r.verify())
        new = msg("fresh start", "doomed")
        assert r.append(new) is True
        assert r.window("doomed") == [new]
    with ConversationStateRepository(sd, hot_window=2) as r:
        assert r.window("other", 100) == keep
        assert r.window("doomed") == [new]
        assert len(r) == 4


def test_clear_channel_envelopes(sd):
    with ConversationStateRepository(sd) as r:
        ms = [msg(f"c{i}", "gone") for i in range(3)]
        r.append_many(ms)
        assert r.clear_channel("gone") == 3
    hashes = hashes_of(sd / "events.jsonl", "conversation.deleted")
    for m in ms:
        assert canonical_hash({"msg_id": m.msg_id}) in hashes


def test_erasure_rewrites_only_files_that_held_content(sd):
    import pyarrow.parquet as pq

    with ConversationStateRepository(sd, hot_window=2) as r:
        first = [msg(f"ERASE-RUN1-{i}", "a") for i in range(5)]
        r.append_many(first)
        r.compact()  # first cooling run: 3 rows from channel a
        second = [msg(f"RUN2-{i}", "b") for i in range(5)]
        r.append_many(second)
        r.compact()  # second cooling run: 3 rows from channel b
        parquet = {p: p.read_bytes() for p in all_files(sd / "hot" / "conversation_cool")
                   if p.read_bytes()[:4] == b"PAR1"}
        untouched = {p: b for p, b in parquet.items()
                     if not any("ERASE-RUN1-0" in (v or "") for v in pq.read_table(p).column("content").to_pylist())}
        assert len(untouched) < len(parquet)
        assert r.get_message(first[0].msg_id).tier == "cool"
        assert r.delete(first[0].msg_id) is True
        r.compact()
        for p, b in untouched.items():
            assert p.exists() and p.read_bytes() == b, f"{p} was rewritten though it held no deleted message"
        assert content_places(sd, "ERASE-RUN1-0") == []
        assert r.window("a", 100) == first[1:]
        assert r.window("b", 100) == second


def test_delete_many_then_window_still_right(sd):
    with ConversationStateRepository(sd, hot_window=4) as r:
        ms = [msg(f"m{i}") for i in range(40)]
        r.append_many(ms)
        r.compact()
        for m in ms[:-3]:
            assert r.delete(m.msg_id) is True
        assert r.window("ch", 5) == ms[-3:]
        assert len(r) == 3
        r.compact()
        assert r.window("ch", 5) == ms[-3:]
        assert verify_ok(r.verify())


def test_erasure_reaches_imported_legacy_checkpoint(sd):
    """The fat legacy checkpoint is superseded after import: deleting an
    imported message and compacting leaves its content nowhere under state_dir."""
    ms = [msg(f"LEGACY-SECRET-{i}-q9", "c1", ts=100.0 + i) for i in range(3)]
    (sd / "hot").mkdir(parents=True)
    (sd / "hot" / "conversation_messages.json").write_text(json.dumps([m.to_dict() for m in ms]))
    with ConversationStateRepository(sd) as r:
        assert r.window("c1", 10) == ms
        assert r.delete(ms[1].msg_id) is True
        r.compact()
        assert r.window("c1", 10) == [ms[0], ms[2]]
    assert content_places(sd, "LEGACY-SECRET-1-q9") == []
    with ConversationStateRepository(sd) as r:
        assert r.window("c1", 10) == [ms[0], ms[2]]
        assert len(r) == 2


def test_deleted_message_not_exported_as_message(sd):
    from rune_fast.sync import fold

    with ConversationStateRepository(sd) as r:
        a, b = msg("keep", "c"), msg("drop", "c")
        r.append_many([a, b])
        r.delete(b.msg_id)
        turns = fold(r.export_ops(), "c")
        assert [t.op_id for t in turns] == [a.msg_id]


def test_delete_durable_across_sigkill(sd):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    code = (
        "import sys, os\n"
        "from rune_fast.conversation_state import ConversationStateRepository\n"
        "from rune_fast.records import ConversationMessageRecord\n"
        "r = ConversationStateRepository(sys.argv[1], hot_window=2, compact_every=4)\n"
        "ms = [ConversationMessageRecord(role='user', content='KILLSECRET-%d-zz' % i, channel_id='ch')"
        " for i in range(6)]\n"
        "r.append_many(ms)\n"
        "r.compact()\n"
        "for m in ms[:3]:\n"
        "    assert r.delete(m.msg_id)\n"
        "    print(m.msg_id, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(sd)], cwd=root, env=env, capture_output=True, text=True,
                         timeout=60)
    ids = out.stdout.split()
    assert len(ids) == 3, out.stderr
    with ConversationStateRepository(sd, hot_window=2) as r:
        for mid in ids:
            assert r.get_message(mid).status == ReadStatus.NOT_FOUND_CONFIRMED
        assert len(r) == 3
        r.compact()
    for i in range(3):
        assert content_places(sd, f"KILLSECRET-{i}-zz") == []
