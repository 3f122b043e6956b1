"""Two devices (two state directories) that append, delete, crash and exchange
ops in both directions several times end with identical transcripts."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

from rune_fast import sync
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WRITER = textwrap.dedent("""
    import sys
    from rune_fast.conversation_state import ConversationStateRepository
        state, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    repo = ConversationStateRepository(state, compact_every=5, hot_window=3)
    for i in range(n):
        ch = "ch%d" % (i % 2)
        role = ("user", "assistant")[i % 2]
        m = ConversationMessageRecord(msg_id="msg_%s_%04d" % (tag, i), role=role, channel_id=ch,
                                      content="%s says %d" % (tag, i), hlc=str(repo.clock.now()))
        repo.append(m)
        print("ACK", m.msg_id, flush=True)
    print("DONE", flush=True)
    import time
    time.sleep(60)
""")


def crash_writer(state: str, tag: str, n: int, rng: random.Random) -> set[str]:
    """Run a writer that appends ``n`` stamped messages; SIGKILL it at a random
    moment; return the acknowledged ids."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, state, tag, str(n)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(rng.uniform(0.2, 1.2))
    proc.send_signal(signal.SIGKILL)
    out, _err = proc.communicate()
    return {line.split()[1] for line in out.splitlines() if line.startswith("ACK")}


def open_repo(state: str) -> ConversationStateRepository:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # a torn final line is reported, then kept aside
        return ConversationStateRepository(state, compact_every=5, hot_window=3)


def test_two_devices_exchange_with_crashes(tmp_path):
    rng = random.Random(20261130)
    a_dir, b_dir = str(tmp_path / "laptop"), str(tmp_path / "phone")
    acked: set[str] = set()
    deleted: set[str] = set()
    for rnd in range(3):
        acked |= crash_writer(a_dir, f"a{rnd}", 40, rng)
        acked |= crash_writer(b_dir, f"b{rnd}", 40, rng)
        a, b = open_repo(a_dir), open_repo(b_dir)
        try:
            for repo, ids in ((a, [m for m in acked if m.startswith("msg_a")]),
                              (b, [m for m in acked if m.startswith("msg_b")])):
                for mid in ids:
                    if mid not in deleted:
                        assert repo.get_message(mid).status is ReadStatus.FOUND_VERIFIED, mid
            # each device deletes one of its own messages
            for repo, tag in ((a, "msg_a"), (b, "msg_b")):
                mine = sorted(m for m in acked if m.startswith(f"{tag}{rnd}") and m not in deleted)
                if mine:
                    victim = rng.choice(mine)
                    assert repo.delete(victim)
                    deleted.add(victim)
            # exchange in both directions, in both orders over the rounds
            if rnd % 2:
                a.merge_ops(b.export_ops())
                b.merge_ops(a.export_ops())
            else:
                b.merge_ops(a.export_ops())
                a.merge_ops(b.export_ops())
            a.compact()
        finally:
            a.close()
            b.close()
    a, b = open_repo(a_dir), open_repo(b_dir)
    try:
        b.merge_ops(a.export_ops())
        a.merge_ops(b.export_ops())
        for ch in ("ch0", "ch1"):
            ra, rb = a.resume_messages(ch), b.resume_messages(ch)
            assert ra == rb
            assert sync.transcript_hash(ra) == sync.transcript_hash(rb)
            assert [m.msg_id for m in a.window(ch, 1000)] == [m.msg_id for m in b.window(ch, 1000)]
        for mid in deleted:
            assert a.get_message(mid).status is ReadStatus.NOT_FOUND_CONFIRMED
            assert b.get_message(mid).status is ReadStatus.NOT_FOUND_CONFIRMED
        live = acked - deleted
        for repo in (a, b):
            for mid in live:
                assert repo.get_message(mid).status is ReadStatus.FOUND_VERIFIED, mid
        assert {o.op_id for o in map(sync.as_op, a.export_ops())} == \
            {o.op_id for o in map(sync.as_op, b.export_ops())}
        assert a.verify().ok and b.verify().ok
    finally:
        a.close()
        b.close()
