"""A channel's fold-order verdict from its stamp columns
(rune_fast._conv.fold_order.fold_state) against the loop it stands for:
every message keyed, sorted in the store order and walked (the model
below, as Exchange._fold_consistent runs it when the columns cannot say)."""
from __future__ import annotations

import operator
import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from rune_fast import ConversationMessageRecord, ConversationStateRepository
from rune_fast._conv.fold_order import fold_state, newest_candidates
from rune_fast._order import order_key
from rune_fast.cool.keys import StampArrays
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.sync.bridge import record_stamp, stamp_key
from test_cool_reads import flip_column_tail


def model_state(hot, cool_rows, deleted):
    """The loop: ``hot`` as fold_state takes it, ``cool_rows`` ``(msg_id,
    hlc, origin, role, ts, ord)`` in any order."""
    keyed = [(order_key(h[0], h[1], (1, i)), h) for i, h in enumerate(hot)]
    keyed += [(order_key(hlc, mid, (0, o)), (hlc, mid, role, (record_stamp(hlc, ts, origin), mid)))
              for mid, hlc, origin, role, ts, o in cool_rows if mid not in deleted]
    keyed.sort(key=operator.itemgetter(0))
    state = [True, None, None]
    for _key, (hlc, mid, role, k) in keyed:
        if hlc:
            state[2] = (hlc, mid)
        if role == "system":
            continue
        if state[1] is not None and k < state[1]:
            return [False, None, None]
        state[1] = k
    return state


def arrays(cool_rows):
    cols = list(zip(*cool_rows)) if cool_rows else [[]] * 6
    return StampArrays(np.arange(len(cool_rows), dtype=np.int64),
                       *(pa.array(list(c), pa.string()) for c in cols[:4]),
                       np.array(cols[4], dtype=np.float64), np.array(cols[5], dtype=np.int64))


def hlc_text(wall, counter, device):
    return f"{wall:015d}-{counter:010d}-{device}"


# a row: (moved to the other tier?, stamp choice, wall ms step, origin,
# role); a channel is made in order (the wall times rise with the row's
# place, its oldest rows archived) so that both verdicts come up, then
# twisted: a row in the other tier, an odd ts, ids out of order
ROW = st.tuples(st.integers(0, 15), st.sampled_from(["", "", "", "hlc", "hlc", "bad"]),
                st.integers(0, 3), st.sampled_from(["", "dev-a", "dev-b"]),
                st.sampled_from(["user", "user", "assistant", "system"]))
ODD_TS = [-1.0, float("nan"), 1e13, 0.0]
CANONICAL = re.compile(r"^[0-9]{15}-[0-9]{10}-")


@settings(max_examples=500, deadline=None)
@given(st.lists(ROW, min_size=2, max_size=30), st.randoms(use_true_random=False), st.integers(0, 9),
       st.booleans())
def test_fold_state_matches_the_loop(rows, rnd, twists, ids_in_order):
    hot, cool_rows = [], []
    wall = 1_700_000_000_000
    split = rnd.randint(0, len(rows))
    ords = sorted(rnd.sample(range(1000), len(rows)))
    for i, (moved, kind, step, origin, role) in enumerate(rows):
        wall += step
        mid = f"m{i:04d}" if ids_in_order else f"m{rnd.randrange(10 ** 6):06d}"
        ts = wall / 1000.0
        hlc = ""
        if kind == "hlc":
            hlc = hlc_text(wall, rnd.randrange(3), origin or "dev-z")
        elif kind == "bad" and twists > 4:
            hlc = rnd.choice(["not-an-hlc", hlc_text(wall, 0, "d")[1:]])
        if twists and rnd.random() < 0.08:
            ts = rnd.choice(ODD_TS + [ts - 0.05, ts + 0.05, ts - 0.001])
        if (i >= split) != (moved == 0):
            hot.append((hlc, mid, role, (record_stamp(hlc, ts, origin), mid)))
        else:
            cool_rows.append((mid, hlc, origin, role, ts, ords[i]))
    if twists > 7 and len(cool_rows) > 1:
        a, b = rnd.sample(range(len(cool_rows)), 2)
        cool_rows[a] = cool_rows[a][:5] + (cool_rows[b][5],)      # two rows, one ord
    rnd.shuffle(cool_rows)          # (the columns come in file order, not store order)
    deleted = {r[0] for r in cool_rows if rnd.random() < 0.15}
    want = model_state(hot, cool_rows, deleted)
    got = fold_state(hot, arrays(cool_rows), deleted)
    if got is None:
        live = [r for r in cool_rows if r[0] not in deleted]
        plain = [r for r in live if not r[1]]
        assert (any(h and not CANONICAL.match(h) for h in [r[1] for r in live] + [h[0] for h in hot])
                or any(not 0 < r[4] * 1000 < 10 ** 15 - 1 for r in plain if r[3] != "system")
                ), (hot, cool_rows, deleted, want)
        return
    assert got[0] == want[0], (hot, cool_rows, deleted, want, got)
    if want[0]:
        assert got == want


def test_fold_state_of_a_store_matches_the_loop(tmp_path):
    """A store cooled in part: the repository's verdict from the columns
    equals the loop's, for a channel in order and one out of it."""
    repo = ConversationStateRepository(str(tmp_path / "s"), hot_window=8)
    t = 1_700_000_000.0
    for i in range(300):
        repo.append(ConversationMessageRecord(channel_id="in", role="user", content=f"a{i}", ts=t + i))
        late = 30 if i == 150 else 0
        repo.append(ConversationMessageRecord(channel_id="out", role="user", content=f"b{i}", ts=t + i - late))
    repo.compact()
    assert repo._cool_has_channel("in") and repo._cool_has_channel("out")
    for ch, verdict in (("in", True), ("out", False)):
        cols = repo._fold_state_of_columns(ch)
        assert cols is not None and cols[0] is verdict
        hot = [(r.hlc, r.msg_id, r.role, (record_stamp(r.hlc, r.ts, r.origin), r.msg_id))
               for r, _t in repo._hot_channel(ch)]
        a = repo._cool.channel_stamp_arrays(ch)
        rows = list(zip(a.mid.to_pylist(), a.hlc.to_pylist(), a.origin.to_pylist(), a.role.to_pylist(),
                        a.ts.tolist(), a.ord.tolist()))
        assert model_state(hot, rows, set()) == (cols if verdict else [False, None, None])
        assert repo._fold_consistent(ch) is verdict
    repo.close()


def test_rows_that_share_an_ord_keep_the_columns_order():
    """Two archived rows with one ord: the loop's sort keeps them in the
    order the columns give them (it keys on the store order alone), and
    so do the columns' steps."""
    t = 1_700_000_000.0
    rows = [("b", "", "", "user", t + 1, 5), ("a", "", "", "user", t + 2, 5)]
    for rows in (rows, rows[::-1]):
        assert fold_state([], arrays(rows), set()) == model_state([], rows, set())
    assert fold_state([], arrays(rows), set())[0] is False


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "", "hlc", "bad"]), st.integers(-3, 40),
                          st.sampled_from(["", "dev-a", "dev-b"]), st.sampled_from(["user", "system"]),
                          st.sampled_from([0.0, 0.0, 0.0004, 0.0006, -0.0004, -1e-4])),
                max_size=40),
       st.integers(0, 12), st.randoms(use_true_random=False))
def test_newest_candidates_hold_the_newest_by_stamp(rows, k, rnd):
    """Every one of the k newest live rows by stamp (stamp_key, as the
    transcript keys them) is among the candidates, and ``cut`` says
    whether rows were left out."""
    cool_rows = []
    for i, (kind, wall, origin, role, jitter) in enumerate(rows):
        wall_ms = 1_700_000_000_000 + wall
        hlc = {"": "", "hlc": hlc_text(wall_ms, rnd.randrange(3), "dev-h"),
               "bad": "x" + hlc_text(wall_ms, 0, "d")}[kind]
        ts = wall_ms / 1000.0 + jitter if wall >= 0 else rnd.choice([float("nan"), -5.0, 1e13])
        cool_rows.append((f"m{i:03d}", hlc, origin, role, ts, i))
    deleted = {r[0] for r in cool_rows if rnd.random() < 0.1}
    got, cut = newest_candidates(arrays(cool_rows), k, deleted)
    live = [r for r in cool_rows if r[3] != "system" and r[0] not in deleted]
    key = {r[0]: (*stamp_key(r[1], r[4], r[2]), r[0]) for r in live}
    want = sorted(key, key=key.get, reverse=True)[:k]
    names = [g[1] for g in got]
    assert set(want) <= set(names) <= set(key)
    assert cut == (len(names) < len(live))
    assert repr(got) == repr([(i, *r) for i, r in enumerate(cool_rows) if r[0] in set(names)])   # (NaN ts)


def test_a_newest_stamp_rounded_up_is_a_candidate():
    """Two wall times 0.8 ms apart that round to one millisecond: the
    stamp orders them by origin, so the lower of the two is the newest."""
    t = 1_700_000_000.0
    rows = [("m1", "", "", "user", t + 0.0004, 1), ("m2", "", "dev-b", "user", t - 0.0004, 2),
            ("m3", "", "", "user", t - 0.5, 3)]
    got, cut = newest_candidates(arrays(rows), 1)
    assert {g[1] for g in got} == {"m1", "m2"} and cut
    key = {r[0]: (*stamp_key(r[1], r[4], r[2]), r[0]) for r in rows}
    assert max(key, key=key.get) == "m2"


def test_a_damaged_stamp_page_is_named(tmp_path):
    """A flipped byte in an archive file's ``hlc`` pages: the columns are
    not taken (their page fails its CRC), and the rows' read names the
    file, for the verdict and for the newest stamps alike."""
    t = 1_700_000_000.0
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=10 ** 6) as repo:
        repo.append_many([ConversationMessageRecord(channel_id="c", role="user", content=f"t {i}",
                                                    ts=t + (i * 37) % 101) for i in range(300)])
        repo.compact()
        path = repo._cool.path_of(repo._cool.files()[0])
    flip_column_tail(path, "hlc")
    with ConversationStateRepository(tmp_path, hot_window=4, compact_every=10 ** 6) as repo:
        assert repo._cool.channel_stamp_arrays("c") is None
        with pytest.raises(CorruptStateCheckpointError) as ei:
            repo._fold_consistent("c")
        assert ei.value.path is not None and ei.value.path.endswith(path.rsplit("/", 1)[1])
        repo._fold_order["c"] = [False, None, None]         # (as if worked out before the damage)
        with pytest.raises(CorruptStateCheckpointError) as ei:
            repo.resume_messages("c", 5)
        assert ei.value.path is not None and ei.value.path.endswith(path.rsplit("/", 1)[1])


@pytest.mark.parametrize("first, second, verdict", [
    (("", "m1"), ("", "m2"), True), (("", "m2"), ("", "m1"), False),
    (("a", "m2"), ("b", "m1"), True), (("b", "m1"), ("a", "m2"), False),
    (("z", "m1"), ("é", "m0"), True), (("é", "m1"), ("z", "m0"), False),     # (code points, not bytes' signs)
    (("😀", "m1"), ("\uffff", "m2"), False),
])
def test_equal_wall_times_compare_origin_then_id(first, second, verdict):
    """Two archived messages in one millisecond: the fold orders them by
    (origin, msg_id), as Python compares str."""
    t = 1_700_000_000.0
    rows = [(first[1], "", first[0], "user", t, 1), (second[1], "", second[0], "user", t + 0.0001, 2)]
    assert model_state([], rows, set())[0] is verdict
    assert fold_state([], arrays(rows), set())[0] is verdict
