"""A flipped bit anywhere in a closed store (segments, tail, index snapshot,
manifest, cool files and their sidecars, events): the reopen refuses the
store, or every read returns each acknowledged message exactly as appended,
or says the bytes are damaged (CorruptStateCheckpointError, SOURCE_CORRUPT).
A read never returns a wrong record and never drops one silently; the only
message allowed to go missing is a final tail line whose newline the flip
removed, which recovery quarantines and reports (it then reads as a tear)."""
from __future__ import annotations

import os
import shutil
import warnings

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.errors import CorruptStateCheckpointError, RuneError
from rune_fast.records import ConversationMessageRecord

N = 60


def _msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(
        msg_id=f"msg_{i:05d}", role="user" if i % 2 else "assistant", channel_id=f"ch{i % 3}",
        task_id=f"t{i % 4}" if i % 5 else "", content=f"message {i} about {'alpha' if i % 7 == 0 else 'beta'}",
        ts=1_700_000_000.0 + i)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A closed store: cooled messages, hot segments, a tail, a snapshot."""
    import rune_fast.conversation_state as cs
    d = str(tmp_path_factory.mktemp("flip-template") / "state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cs, "ROLL_BYTES", 3000)      # sealed segments, not just a tail
        with ConversationStateRepository(d, hot_window=4, compact_every=1_000_000) as repo:
            for i in range(40):
                assert repo.append(_msg(i))
                if i % 8 == 7:
                    repo.compact()
            for i in range(40, N):
                assert repo.append(_msg(i))
    files = sorted(os.path.relpath(os.path.join(r, f), d) for r, _ds, fs in os.walk(d) for f in fs
                   if not f.startswith(".lock"))
    assert any(f.endswith(".parquet") for f in files) and any("seg-" in f for f in files)
    # where each file's bytes end (the tail and events are preallocated with zeros)
    ends = {}
    for f in files:
        with open(os.path.join(d, f), "rb") as fh:
            ends[f] = len(fh.read().rstrip(b"\0")) + 8
    return d, files, ends


@settings(max_examples=int(os.environ.get("RUNE_FLIP_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 10_000), frac=st.floats(0.0, 1.0, exclude_max=True), bit=st.integers(0, 7))
def test_a_flipped_bit_anywhere_in_a_store_is_never_served(template, tmp_path_factory, which, frac, bit):
    src, files, ends = template
    d = str(tmp_path_factory.mktemp("flip") / "state")
    shutil.copytree(src, d)
    name = files[which % len(files)]
    path = os.path.join(d, name)
    size = min(os.path.getsize(path), ends[name])
    if size == 0:
        return
    with open(path, "r+b") as f:
        f.seek(int(frac * size))
        b = f.read(1)
        f.seek(int(frac * size))
        f.write(bytes([b[0] ^ (1 << bit)]))
    want = {m.msg_id: m for m in (_msg(i) for i in range(N))}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            repo = ConversationStateRepository(d, hot_window=4, compact_every=1_000_000)
    except CorruptStateCheckpointError:
        event(f"refused at open: {name.split('-')[0].split('_')[-1]}")
        return
    event(f"opened: {name.split('-')[0].split('_')[-1]}")
    with repo:
        may_miss = {f"msg_{N - 1:05d}"} if repo.stats().get("quarantined") else set()

        def check(recs):
            for r in recs:
                assert r == want[r.msg_id], (name, r.msg_id)

        def bulk(read):
            try:
                return read()
            except CorruptStateCheckpointError:
                return None

        for mid, m in want.items():
            try:
                got = repo.get_message(mid)
            except CorruptStateCheckpointError:
                continue
            if got.status is ReadStatus.FOUND_VERIFIED:
                assert got.record == m, (name, mid)
            elif got.status is ReadStatus.NOT_FOUND_CONFIRMED:
                assert mid in may_miss, (name, mid, "acknowledged message not found")
        for ch in ("ch0", "ch1", "ch2"):
            recs = bulk(lambda: repo.window(ch, 100))
            if recs is not None:
                check(recs)
                ids = {r.msg_id for r in recs}
                missing = {mid for mid, m in want.items() if m.channel_id == ch} - ids
                assert missing <= may_miss, (name, ch, sorted(missing))
        for t in ("t1", "t2", "t3"):
            recs = bulk(lambda: repo.messages_for_task(t))
            if recs is not None:
                check(recs)
                missing = {mid for mid, m in want.items() if m.task_id == t} - {r.msg_id for r in recs}
                assert missing <= may_miss, (name, t, sorted(missing))
        hits = bulk(lambda: repo.search("ALPHA"))
        if hits is not None:
            check([h.record for h in hits])
            missing = {mid for mid, m in want.items() if "alpha" in m.content} - {h.record.msg_id for h in hits}
            assert missing <= may_miss, (name, "search", sorted(missing))
        try:
            n = len(repo)
        except RuneError:
            return
        assert N - len(may_miss) <= n <= N, (name, n)
