"""The cool tier's fast paths: the hashed id index, the compact row-group
cache (compressed before evicted), span search with exact Unicode casefold,
and the fsync budget of a cooling run (durable and not)."""
from __future__ import annotations

import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rune_fast import cool as coolmod
from rune_fast.cool import COOL_SCHEMA, SPECIAL_FOLD, CoolArchive, _relevant_specials
from rune_fast.errors import CorruptStateCheckpointError
from test_cool import cool_rows, task_records


def rec(i: int, ch: str = "ch", *, content: str | None = None, task: str = "") -> dict:
    return {
        "msg_id": f"msg_{i:08d}", "channel_id": ch, "task_id": task, "hlc": "",
        "content": f"message number {i}" if content is None else content,
        "ts": 1700000000.0 + i, "role": "user" if i % 2 else "assistant",
        "token_estimate": i % 50, "tool_calls": [], "tool_call_id": "",
        "origin": "", "schema_version": 1,
    }


@pytest.fixture
def cdir(tmp_path):
    return str(tmp_path / "hot" / "conversation_cool")


def test_special_fold_list_is_complete():
    """SPECIAL_FOLD must hold every non-ASCII character whose casefold holds
    an ASCII one (the search's correctness rests on it)."""
    want = []
    for cp in range(128, sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        f = chr(cp).casefold()
        if any(ord(x) < 128 for x in f):
            want.append(chr(cp))
    assert "".join(want) == SPECIAL_FOLD


def test_relevant_specials():
    assert _relevant_specials("strasse") and "\u00df" in _relevant_specials("strasse")
    assert "\u00df" not in _relevant_specials("quarterly report")
    assert "\ufb01" in _relevant_specials("if")        # ends with a prefix of "fi"
    assert "\ufb01" in _relevant_specials("ix")        # starts with a suffix of "fi"
    assert "\u212a" in _relevant_specials("k")


ALPHABET = "aAbBsSkKiIfFlLtT \u00df\u1e9e\u212a\ufb01\ufb02\u0130\u017f\u00fc\u00dc\u03c3\u03a3\u03c2\u6771"


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(alphabet=ALPHABET, max_size=14), min_size=1, max_size=40),
       needle=st.text(alphabet=ALPHABET, max_size=4), cs=st.booleans(),
       cache=st.sampled_from([1, 1 << 20]))
def test_search_matches_casefold_exactly(tmp_path_factory, texts, needle, cs, cache):
    d = str(tmp_path_factory.mktemp("s") / "cool")
    a = CoolArchive(d, row_group_rows=7, cache_bytes=cache, durable=False)
    rows = [rec(i, content=t) for i, t in enumerate(texts)]
    cool_rows(a, rows, list(range(len(rows))))
    if cs:
        want = [r["msg_id"] for r in rows if needle in r["content"]]
    else:
        f = needle.casefold()
        want = [r["msg_id"] for r in rows if f in r["content"].casefold()]
    got = [r.record["msg_id"] for r in a.search(needle, case_sensitive=cs)]
    assert got == want
    # twice: the second time from the cache (or its compressed form)
    assert [r.record["msg_id"] for r in a.search(needle, case_sensitive=cs)] == want


def test_search_special_fold_cases(cdir):
    a = CoolArchive(cdir, durable=False)
    texts = ["Stra\u00dfe", "STRASSE", "\ufb01le", "FILE", "\u212aelvin", "kelvin", "plain text",
             "\u0130stanbul", "\u00dcberweisung", "UEBER"]
    cool_rows(a, [rec(i, content=t) for i, t in enumerate(texts)], list(range(len(texts))))
    hit = lambda n: [r.record["content"] for r in a.search(n)]  # noqa: E731
    assert hit("strasse") == ["Stra\u00dfe", "STRASSE"]
    assert hit("fil") == ["\ufb01le", "FILE"]
    assert hit("KELVIN") == ["\u212aelvin", "kelvin"]
    assert hit("i\u0307stan") == ["\u0130stanbul"]
    assert hit("\u00fcberweisung") == ["\u00dcberweisung"]
    assert hit("ss") == ["Stra\u00dfe", "STRASSE"]


def test_contains_index_and_memory(cdir):
    a = CoolArchive(cdir, durable=False)
    for k in range(5):
        cool_rows(a, [rec(i) for i in range(k * 1000, (k + 1) * 1000)], list(range(k * 1000, (k + 1) * 1000)))
    assert all(a.contains(f"msg_{i:08d}") for i in range(0, 5000, 37))
    assert not any(a.contains(f"msg_{i:08d}") for i in range(5000, 5100))
    assert a.stats()["index_bytes"] <= 40 * 5000
    # merge and erase keep the index exact (entries of dropped files removed)
    a.merge(max_files=1)
    ch = a.erase([f"msg_{i:08d}" for i in range(0, 5000, 2)])
    a.unlink_files(ch.removed)
    assert all(a.contains(f"msg_{i:08d}") == (i % 2 == 1) for i in range(0, 5000, 7))
    assert a.verify() == []
    b = CoolArchive.open(cdir, a.files())
    assert all(b.contains(f"msg_{i:08d}") == (i % 2 == 1) for i in range(0, 5000, 7))


def test_contains_hit_reads_only_the_id_column(cdir, monkeypatch):
    a = CoolArchive(cdir, durable=False)
    cool_rows(a, [rec(i) for i in range(100)], list(range(100)))
    b = CoolArchive.open(cdir, a.files())
    assert b.contains("msg_00000042")
    (g,) = b._cache.values()
    assert set(g.cols) == {"msg_id"}
    assert b.get("msg_00000042")["content"] == "message number 42"


def test_cache_budget_is_kept_and_reads_stay_exact(cdir):
    rnd = random.Random(3)
    words = ["alpha", "beta", "gr\u00fc\u00df", "\u6771\u4eac", "delta"]
    rows = [rec(i, ch=f"c{i % 5}", task=f"t{i % 17}",
                content=" ".join(rnd.choice(words) for _ in range(rnd.randint(5, 60))))
            for i in range(3000)]
    rows.sort(key=lambda r: r["channel_id"])
    a = CoolArchive(cdir, row_group_rows=256, cache_bytes=200_000, durable=False)
    cool_rows(a, rows, [int(r["msg_id"][4:]) for r in rows])
    by_id = {r["msg_id"]: r for r in rows}
    for i in rnd.sample(range(3000), 300):
        assert a.get(f"msg_{i:08d}") == by_id[f"msg_{i:08d}"]
        assert a.stats()["cached_bytes"] <= 200_000 + 150_000   # one group may exceed alone
    for t in ("t3", "t11"):
        assert [r.record["msg_id"] for r in task_records(a, t)] == \
            sorted((r["msg_id"] for r in rows if r["task_id"] == t), key=lambda m: int(m[4:]))
    got = [r.record["msg_id"] for r in a.search("GR\u00dcSS")]
    assert sorted(got) == sorted(r["msg_id"] for r in rows if "gr\u00fcss" in r["content"].casefold())
    # the cache compresses before it evicts: both forms serve the same rows
    groups = list(a._cache.values())
    assert any(g.cols.get("content") and g.cols["content"][2].data is None for g in groups)
    assert a.channel_rows("c2") == [r for r in a.channel_rows("c2")]


def _count_fsyncs(monkeypatch) -> list:
    calls = []
    real = os.fsync

    def counting(fd):
        calls.append(fd)
        return real(fd)
    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_cooling_fsync_budget(cdir, monkeypatch):
    a = CoolArchive(cdir)
    calls = _count_fsyncs(monkeypatch)
    cool_rows(a, [rec(i) for i in range(10)], list(range(10)))
    assert len(calls) == 3          # parquet + sidecar + one folder fsync
    calls.clear()
    cool_rows(a, [rec(i) for i in range(10, 20)], list(range(10, 20)), durable=False)
    assert calls == []
    b = CoolArchive(cdir + "2", durable=False)
    cool_rows(b, [rec(i) for i in range(10)], list(range(10)))
    cool_rows(b, [rec(i) for i in range(10, 20)], list(range(10, 20)))
    ch = b.merge([b.files()])
    b.unlink_files(ch.removed)
    ch = b.erase(["msg_00000003"])
    b.unlink_files(ch.removed)
    b.gc()
    assert calls == []
    assert CoolArchive.open(cdir + "2", b.files()).get("msg_00000004")["content"] == "message number 4"


def test_nondurable_write_is_still_atomic(cdir, monkeypatch):
    a = CoolArchive(cdir, durable=False)
    cool_rows(a, [rec(i) for i in range(10)], list(range(10)))
    before = sorted(os.listdir(cdir))

    def boom(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        cool_rows(a, [rec(i) for i in range(10, 20)], list(range(10, 20)))
    assert sorted(os.listdir(cdir)) == before      # no temp file left behind
    assert a.files() == ["cool-00000001.parquet"]


def test_malformed_row_is_loud_through_the_fast_path(cdir):
    a = CoolArchive(cdir, durable=False)
    cool_rows(a, [rec(i) for i in range(10)], list(range(10)))
    with pytest.raises(CorruptStateCheckpointError):
        a._rows(1, 0, 11)


@settings(max_examples=80, deadline=None)
@given(texts=st.lists(st.text(alphabet="sStTkKfFiIlLhHwWyYaAjJnN \u00e9" + SPECIAL_FOLD, max_size=12),
                      min_size=1, max_size=30),
       needle=st.text(alphabet="sStTkKfFiIlLhHwWyYaAjJnN \u0307\u02be\u02bc", min_size=1, max_size=4))
def test_search_every_special_fold(tmp_path_factory, texts, needle):
    """Every SPECIAL_FOLD character against needles made of the letters
    (and combining marks) their folds produce."""
    d = str(tmp_path_factory.mktemp("f") / "cool")
    a = CoolArchive(d, row_group_rows=5, durable=False)
    rows = [rec(i, content=t) for i, t in enumerate(texts)]
    cool_rows(a, rows, list(range(len(rows))))
    f = needle.casefold()
    want = [r["msg_id"] for r in rows if f in r["content"].casefold()]
    assert [r.record["msg_id"] for r in a.search(needle)] == want


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="sStTkKfFiIaA \u00e9\u6771" + SPECIAL_FOLD, max_size=16),
       needle=st.text(alphabet="sStTkKfFiIaA \u0307", min_size=1, max_size=4))
def test_ascii_fold_matcher(text, needle):
    from rune_fast.cool import ascii_fold_matcher
    has = ascii_fold_matcher(needle)
    if has is None:
        assert not needle.casefold().isascii()
        return
    assert has(text.encode("utf-8")) == (needle.casefold() in text.casefold())


def test_id_index_is_the_sidecars_runs_and_answers_alike(cdir):
    """After an open, id lookups search the files' sorted hashes where the
    sidecars hold them (nothing is built, however many lookups), and a
    change to the file set keeps every answer exact."""
    a = CoolArchive(cdir, durable=False)
    for f in range(4):
        rows = [rec(f * 100 + i, ch=f"c{i % 3}") for i in range(100)]
        cool_rows(a, rows, list(range(f * 100, f * 100 + 100)))
    files = a.files()
    b = CoolArchive(cdir, files, durable=False)
    ids = [f"msg_{i:08d}" for i in range(0, 400, 7)] + ["msg_99999999", "nope"]
    first = [(b.contains(m), (b.get(m) or {}).get("content")) for m in ids[:10]]
    assert len(b._ids) == 400 and b._ids.files == 4
    assert all(not h.flags.writeable for no in b._files for h in b._ids.run(no)), "not the mapped sidecars"
    change = b.erase(["msg_00000007", "msg_00000203"])     # drops and adds files before the build
    b.unlink_files(change.removed)
    for m in ids:
        gone = m in ("msg_00000007", "msg_00000203")
        want = m.startswith("msg_0000") and not gone
        assert b.contains(m) is want, m
        r = b.get(m)
        assert (r is not None) is want and (r is None or r["msg_id"] == m)
    assert first[0] == (True, "message number 0")
    for _ in range(100):
        b.contains("msg_00000014")
    assert len(b._ids) == 398
    assert b.contains("msg_00000399") and not b.contains("msg_00000203")


def test_batch_lookups_answer_as_single_ones(cdir):
    """contains_many (the append path's batch duplicate check) answers as
    contains does, found or not, and builds nothing."""
    a = CoolArchive(cdir, durable=False)
    for f in range(3):
        cool_rows(a, [rec(f * 50 + i) for i in range(50)], list(range(f * 50, f * 50 + 50)))
    b = CoolArchive(cdir, a.files(), durable=False)
    fresh = [f"new_{i:08d}" for i in range(32)]
    assert not b.contains_many(fresh).any()
    mixed = fresh + ["msg_00000003", "msg_00000149", "msg_00000150"]
    want = [False] * len(fresh) + [True, True, False]
    assert b.contains_many(mixed).tolist() == want
    assert len(b._ids) == 150 and b.contains_many(mixed).tolist() == [b.contains(m) for m in mixed]


def test_malformed_row_is_loud_on_a_first_exact_read(cdir):
    """A row whose extra column is no JSON object cannot make a record: the
    first exact read (the direct page path, no group cached) raised a bare
    TypeError before its malformed-row check; it must name the file and row."""
    a = CoolArchive(cdir, durable=False)
    cool_rows(a, [rec(i) for i in range(3)], list(range(3)))
    table = pq.read_table(os.path.join(cdir, a.files()[0]))
    extra = table.column("extra").to_pylist()
    extra[1] = "[1]"
    table = table.set_column(table.schema.get_field_index("extra"), "extra", pa.array(extra, pa.string()))
    b = CoolArchive(cdir + "2", durable=False)
    b.cool_table(table.cast(COOL_SCHEMA))
    for _ in range(2):      # the direct path, then the cached group's
        fresh = CoolArchive.open(cdir + "2", b.files())
        with pytest.raises(CorruptStateCheckpointError, match="row 1 is malformed") as err:
            fresh.get("msg_00000001")
        assert err.value.path.endswith(b.files()[0])
    assert CoolArchive.open(cdir + "2", b.files()).get("msg_00000002")["content"] == "message number 2"
