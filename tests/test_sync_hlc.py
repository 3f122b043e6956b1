"""Hybrid logical clock: the stamp, its string form, and the clock rules."""
from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast.sync import Hlc, HlcClock

device_ids = st.text(max_size=8)
hlcs = st.builds(Hlc, st.integers(0, 10**15 - 1), st.integers(0, 10**10 - 1), device_ids)
small_hlcs = st.builds(Hlc, st.integers(0, 50), st.integers(0, 5), st.sampled_from(["a", "b", "c"]))


def test_string_form_matches_spec():
    h = Hlc(1_700_000_000_123, 7, "laptop")
    assert str(h) == "%015d-%010d-%s" % (1_700_000_000_123, 7, "laptop")
    assert str(h) == "001700000000123-0000000007-laptop"
    assert f"{h}" == str(h)
    assert Hlc.parse(str(h)) == h
    assert (h.wall_ms, h.counter, h.device_id) == (1_700_000_000_123, 7, "laptop")


def test_empty_and_dashed_device_ids_round_trip():
    for d in ("", "a-b-c", "dev 1", "ü"):
        h = Hlc(5, 1, d)
        assert Hlc.parse(str(h)) == h


def test_immutable_and_hashable():
    h = Hlc(1, 2, "a")
    with pytest.raises(AttributeError):
        h.wall_ms = 3  # type: ignore[misc]
    assert {h: 1}[Hlc(1, 2, "a")] == 1
    assert len({Hlc(1, 2, "a"), Hlc(1, 2, "a"), Hlc(1, 2, "b")}) == 2


@pytest.mark.parametrize("bad", [
    "", "12-3-a", "000000000000001-000000000-a", "00000000000000x-0000000000-a",
    "000000000000001_0000000000-a", "000000000000001-0000000000a", "+00000000000001-0000000000-a",
    "٠٠٠٠٠٠٠٠٠٠٠٠٠٠١-0000000000-a",
])
def test_parse_rejects_malformed_naming_the_input(bad):
    with pytest.raises(ValueError) as e:
        Hlc.parse(bad)
    assert repr(bad) in str(e.value)


def test_parse_rejects_non_str():
    with pytest.raises(TypeError):
        Hlc.parse(12)  # type: ignore[arg-type]


@pytest.mark.parametrize("args", [(-1, 0, "a"), (10**15, 0, "a"), (0, -1, "a"), (0, 10**10, "a")])
def test_out_of_range_fields(args):
    with pytest.raises(ValueError):
        Hlc(*args)


@pytest.mark.parametrize("args", [(1.5, 0, "a"), (True, 0, "a"), (0, "1", "a"), (0, 0, 5)])
def test_wrong_field_types(args):
    with pytest.raises(TypeError):
        Hlc(*args)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hlcs, hlcs)
def test_string_sorts_like_the_tuple(a, b):
    ta, tb = (a.wall_ms, a.counter, a.device_id), (b.wall_ms, b.counter, b.device_id)
    assert (a < b) == (ta < tb) == (str(a) < str(b))
    assert (a == b) == (str(a) == str(b))
    assert Hlc.parse(str(a)) == a


def _clock(walls):
    it = iter(walls)
    return HlcClock("me", wall=lambda: next(it))


def test_clock_basic_rules():
    c = _clock([100, 100, 90, 200, 150, 150])
    a = c.now()
    assert a == Hlc(100, 0, "me")
    b = c.now()
    assert b == Hlc(100, 1, "me")
    # wall clock went backwards: the counter carries the order
    assert c.now() == Hlc(100, 2, "me")
    assert c.now() == Hlc(200, 0, "me")
    # a remote stamp from the future: adopt its wall time, counter + 1
    r = c.observe("000000000000500-0000000003-other")
    assert r == Hlc(500, 4, "me")
    assert c.observe(Hlc(500, 9, "x")) == Hlc(500, 10, "me")
    assert c.last == Hlc(500, 10, "me")


def test_clock_observe_rejects_malformed():
    c = HlcClock("me")
    with pytest.raises(ValueError, match="not-an-hlc"):
        c.observe("not-an-hlc")


def test_clock_counter_overflow_moves_wall_on():
    c = HlcClock("me", wall=lambda: 5)
    c.observe(Hlc(5, 10**10 - 1, "x"))
    assert c.last == Hlc(6, 0, "me")
    assert c.now() > Hlc(5, 10**10 - 1, "x")


def test_clock_default_wall_is_close_to_time():
    import time
    before = time.time_ns() // 1_000_000
    h = HlcClock("d").now()
    assert before <= h.wall_ms <= time.time_ns() // 1_000_000 + 1
    assert h.device_id == "d"


actions = st.lists(st.tuples(st.integers(0, 60), st.one_of(st.none(), small_hlcs)),
                   min_size=1, max_size=60)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions)
def test_clock_monotonic_and_after_every_observed_stamp(steps):
    walls = iter([w for w, _ in steps])
    c = HlcClock("b", wall=lambda: next(walls))
    prev = None
    seen_max = None
    for _, remote in steps:
        h = c.now() if remote is None else c.observe(remote)
        assert h.device_id == "b"
        if prev is not None:
            assert h > prev
        if remote is not None:
            assert h > remote
            assert (h.wall_ms, h.counter) > (remote.wall_ms, remote.counter)
            seen_max = remote if seen_max is None else max(seen_max, remote)
        if seen_max is not None:
            assert h > seen_max
        assert str(h) > str(prev) if prev is not None else True
        prev = h


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 1000), min_size=2, max_size=40))
def test_two_clocks_exchanging_preserve_causality(walls):
    """A stamp made after observing another device's stamp sorts after it."""
    a, b = HlcClock("a", wall=lambda: walls[0]), HlcClock("b", wall=lambda: walls[-1])
    ha = a.now()
    b.observe(ha)
    hb = b.now()
    assert hb > ha
    a.observe(hb)
    assert a.now() > hb


def test_clock_thread_safe():
    c = HlcClock("t", wall=lambda: 42)  # a frozen wall clock forces the counter path
    out: list[list[Hlc]] = [[] for _ in range(4)]

    def work(k):
        for _ in range(2000):
            out[k].append(c.now())

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [h for seq in out for h in seq]
    assert len(set(every)) == len(every) == 8000
    for seq in out:
        assert seq == sorted(seq)


def test_hlc_and_its_string_are_interchangeable():
    h = Hlc(3, 1, "a")
    s = str(h)
    assert h == s and s == h and not (h != s)
    assert hash(h) == hash(s)
    assert {h: 1}[s] == 1
    assert Hlc(2, 0, "z") < s < Hlc(3, 1, "b")
    assert h <= s and h >= s and not (h < s) and not (h > s)
    assert sorted([str(Hlc(5, 0, "a")), Hlc(1, 0, "a"), str(Hlc(3, 0, "a"))]) == [
        Hlc(1, 0, "a"), Hlc(3, 0, "a"), Hlc(5, 0, "a")]
    assert h == (3, 1, "a") and h != Hlc(3, 1, "b")


def test_clock_accepts_float_milliseconds_and_refuses_garbage():
    assert HlcClock("f", wall=lambda: 12.9).now() == Hlc(12, 0, "f")
    with pytest.raises(TypeError, match="milliseconds"):
        HlcClock("f", wall=lambda: "now").now()
    with pytest.raises(TypeError):
        HlcClock("f", wall=lambda: float("nan")).now()


@settings(max_examples=200, deadline=None)
@given(walls=st.lists(st.integers(0, 50), min_size=1, max_size=6), ks=st.lists(st.integers(0, 5), min_size=1,
       max_size=6), near_max=st.booleans())
def test_now_many_is_now_called_in_a_row(walls, ks, near_max):
    """now_many(k): the stamps k calls of now() give when the wall clock
    reads the same for all of them (also past the counter's 10 digits)."""
    base = 1_700_000_000_000
    clocks = []
    for _ in range(2):
        it = iter(walls * 4)
        clocks.append(HlcClock("dev", wall=lambda it=it: base + next(it, walls[-1])))
    a, b = clocks
    if near_max:
        for c in clocks:
            c._l, c._c, c._issued = base + 100, 10 ** 10 - 3, True
    for k in ks:
        got = a.now_many(k)
        w = b._wall
        fixed = w()
        b._wall = lambda: fixed
        want = [b.now() for _ in range(k)]
        b._wall = w
        assert got == want and a.last == b.last and a.nows == b.nows
