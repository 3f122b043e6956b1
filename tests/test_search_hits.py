"""Searches with many archived hits: the cool tier's scan builds the records
of each row group's hits where their pages are (CoolArchive.search_records:
the content values the scan matched, the other columns' pages read once,
_pages.records_from_columns checking every digest), instead of naming every
hit and reading it again. Checked here: the records it builds are the ones
the row-by-row dict path reads, every hit once, in the files' order; the
repository's answers equal a plain model over stores with several cool
files, stamped and unstamped messages, tool calls, deletions and a search
asked again (hits the decode cache holds); damage in any column of a hit's
pages, or a value changed under its digest, still raises and names the
file; and what a search hands out is the caller's own."""
from __future__ import annotations

import gc
import os

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.cool import CoolArchive, index_dir_for
from rune_fast.cool.schema import _COLS, cool_loc
from rune_fast.cool.search import EVERY_LOC
from rune_fast.errors import CorruptStateCheckpointError
from rune_fast.pages import page_directories
from rune_fast.records import ConversationMessageRecord
from rune_fast._order import order_key
from test_cool import cool_rows, rec
from test_cool_reads import dict_path, every_loc, rewrite_keeping_layout
from test_search_limit import _run as search_limit_run

R = ConversationMessageRecord

WORDS = ("error", "Error", "ERROR", "straße", "STRASSE", "Zürich", "zürich", "東京", "the", "\u212aelvin",
         "kelvin", "café", "a\"b", "tab\tstop", "ﬁle", "x")
NEEDLES = ("error", "strasse", "straße", "zürich", "東京", "the", "kelvin", "é", "a\"b", "", "absent",
           "\t", "fi", "E")


def _hlc(wall: int, counter: int) -> str:
    return "%015d-%010d-%s" % (wall, counter, "dev")


def _calls(i: int) -> list:
    return [{"id": f"call_{i}", "name": "lookup", "arguments": {"q": f"row {i}", "n": [i, 1.5]}}]


def _matches(needle: str, content: str, cs: bool) -> bool:
    return needle in content if cs else needle.casefold() in content.casefold()


# ----------------------------------------------------------------- the archive

@st.composite
def _archive_rows(draw):
    """Rows of one to three files, each sorted by channel (the cooled
    layout), in append order within a channel."""
    files, i = [], 0
    for _f in range(draw(st.integers(1, 3))):
        rows = []
        for _r in range(draw(st.integers(1, 40))):
            words = draw(st.lists(st.sampled_from(WORDS), max_size=4))
            calls = _calls(i) if draw(st.integers(0, 4)) == 0 else None
            rows.append(rec(i, draw(st.sampled_from(["a", "b"])), content=" ".join(words), tool_calls=calls))
            i += 1
        files.append(sorted(rows, key=lambda r: r["channel_id"]))
    return files


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=_archive_rows(), needle=st.sampled_from(NEEDLES), cs=st.booleans(),
       channel=st.sampled_from([None, "a", "b"]), data=st.data())
def test_built_hits_are_the_dict_paths_records(tmp_path_factory, files, needle, cs, channel, data):
    """search_records: every hit once (built, read as a row, or named when
    known), each built record equal to the row-by-row dict path's, with its
    ord, in the files' row order; the hits are exactly the model's."""
    d = str(tmp_path_factory.mktemp("c") / "cool")
    a = CoolArchive(d, row_group_rows=8)
    for rows in files:
        cool_rows(a, rows, [int(r["msg_id"][4:]) for r in rows])
    locs = every_loc(a)
    known = frozenset(data.draw(st.lists(st.sampled_from(locs), max_size=10)))
    got = CoolArchive.open(d, a.files()).search_records(needle, channel, case_sensitive=cs, record_type=R,
                                                        known=known)
    ref = CoolArchive.open(d, a.files())
    rows, named = ref.search_known(needle, channel, case_sensitive=cs, known=EVERY_LOC)
    want = {ref.loc_of(r): r.record["msg_id"] for r in rows}
    want.update((loc, r.msg_id) for loc, (r, _o) in zip(named, dict_path(ref, named)))
    reached = got.locs + [ref.loc_of(r) for r in got.rows] + got.named
    assert sorted(reached) == sorted(want) and len(set(reached)) == len(reached)
    assert set(got.named) <= known and got.locs == sorted(got.locs)
    for loc, r, o, (w, wo) in zip(got.locs, got.records, got.ords, dict_path(ref, got.locs)):
        assert r == w and r.tool_calls == w.tool_calls and o == wo and type(o) is int
        assert gc.is_tracked(r) == bool(r.tool_calls)
    model = {r["msg_id"] for rows_ in files for r in rows_
             if (channel is None or r["channel_id"] == channel) and _matches(needle, r["content"], cs)}
    if got.exact:
        assert set(want.values()) == model
    else:
        assert set(want.values()) >= model


def _rewrite_sidecar(d: str, path: str, no: int) -> None:
    """Bind file ``no``'s sidecar to the rewritten file at ``path`` (its
    footer hash and page directories), as a sound sidecar of it would be."""
    from rune_fast.cool import _FileIndex, _footer_hash
    ipath = os.path.join(index_dir_for(d), f"cool-{no:08d}.idx")
    with open(ipath, "rb") as f:
        fi = _FileIndex.decode(f.read(), no, ipath)
    fi.size, fi.footer = _footer_hash(path)
    fi.pagedir = page_directories(path, pq.read_metadata(path))
    with open(ipath, "wb") as f:
        f.write(fi.encode())
    gpath = os.path.join(index_dir_for(d), f"cool-{no:08d}.grams")
    if os.path.exists(gpath):
        os.unlink(gpath)        # (bound to the old file: built again)


def test_a_value_changed_under_its_digest_is_named(tmp_path):
    """A hit whose content was changed under the old digest, in the page
    layout the scan reads: the compiled path declines it and the read it
    falls back to names file and row; the other hits are still served."""
    d = str(tmp_path / "cool")
    a = CoolArchive(d)      # (one row group, as rewrite_keeping_layout writes it)
    cool_rows(a, [rec(i, content=f"needle row {i}") for i in range(20)], range(20))
    name = a.files()[0]
    path = os.path.join(d, name)
    rewrite_keeping_layout(path, 11, "needle row 11, changed")
    _rewrite_sidecar(d, path, 1)
    b = CoolArchive.open(d, [name])
    assert b._reader(1) is not None
    with pytest.raises(CorruptStateCheckpointError) as ei:
        b.search_records("needle", record_type=R)
    assert ei.value.path == path and ei.value.offset == 11
    got = CoolArchive.open(d, [name]).search_records("needle row 7", record_type=R)
    assert [r.msg_id for r in got.records] == ["msg_00000007"] and not got.rows


def _flip(path: str, column: str, *, back: int, mask: int) -> None:
    """XOR ``mask`` into the byte ``back`` bytes before the end of
    ``column``'s chunk in the first row group of the Parquet file ``path``."""
    cc = pq.read_metadata(path).row_group(0).column(_COLS.index(column))
    start = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
    at = start + cc.total_compressed_size - back
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


@pytest.mark.parametrize("column", ["msg_id", "content", "digest", "ts", "tool_calls"])
def test_a_damaged_page_of_any_column_raises(tmp_path, column):
    """A flipped byte in a page of any column of a hit's row group: the
    search raises CorruptStateCheckpointError naming the file (the scan's
    page reads check every CRC; the group is then read the way that names
    it), never serves the row."""
    d = str(tmp_path / "cool")
    a = CoolArchive(d, row_group_rows=64)
    cool_rows(a, [rec(i, content=f"needle row {i} " * 8, tool_calls=_calls(i) if i % 3 == 0 else None)
                  for i in range(40)], range(40))
    name = a.files()[0]
    path = os.path.join(d, name)
    _flip(path, column, back=3, mask=0x20)
    with pytest.raises(CorruptStateCheckpointError) as ei:
        CoolArchive.open(d, [name]).search_records("needle", record_type=R)
    assert ei.value.path == path


# ----------------------------------------------------------------- the repository

@st.composite
def _ops(draw):
    ops = []
    for i in range(draw(st.integers(5, 70))):
        kind = draw(st.sampled_from(["m"] * 6 + ["d", "c"]))
        if kind == "m":
            ops.append(("m", draw(st.integers(0, 2)), " ".join(draw(st.lists(st.sampled_from(WORDS), max_size=4))),
                        _hlc(draw(st.integers(1, 40)), i) if draw(st.booleans()) else "",
                        draw(st.integers(0, 3)) == 0))
        else:
            ops.append((kind, draw(st.integers(0, 10_000)), "", "", False))
    return ops


def _message(i, a, content, hlc, calls):
    return R(msg_id=f"m{i:04d}", channel_id=f"ch{a}", content=content, ts=1.0 + i, hlc=hlc,
             role="assistant" if calls else "user", tool_calls=_calls(i) if calls else ())


def _run(repo, ops):
    """Apply ops (test_search_limit's model loop, records with tool calls)."""
    return search_limit_run(repo, ops, make=_message)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops(), needles=st.lists(st.sampled_from(NEEDLES), min_size=1, max_size=4), cs=st.booleans(),
       channel=st.sampled_from([None, "ch0", "ch1"]))
def test_unlimited_search_is_the_model(tmp_path_factory, ops, needles, cs, channel):
    """Whole searches over hot, tail and several cool files (compactions
    between appends, deletions before and after them, stamps): the hits
    are the model's, oldest first by the order key, each record exactly
    as appended; asked again (hits the decode cache now holds) and after a
    reopen (nothing cached), the same."""
    d = tmp_path_factory.mktemp("s")
    with ConversationStateRepository(d, compact_every=10_000, hot_window=3) as repo:
        model = _run(repo, ops)
        for q in needles:
            folded = q.casefold()
            want = sorted((order_key(r.hlc, r.msg_id, s), r) for r, s in model.values()
                          if (channel is None or r.channel_id == channel)
                          and ((q in r.content) if cs else (folded in r.content.casefold())))
            for _again in range(2):
                got = repo.search(q, channel, case_sensitive=cs)
                assert [h.record.msg_id for h in got] == [r.msg_id for _k, r in want]
                assert [h.record for h in got] == [r for _k, r in want]
                assert all(h.record.tool_calls == r.tool_calls for h, (_k, r) in zip(got, want))
    with ConversationStateRepository(d, compact_every=10_000, hot_window=3, read_only=True) as viewer:
        for q in needles:
            assert [h.record for h in viewer.search(q, channel, case_sensitive=cs)] == \
                [h.record for h in repo_search_fresh(d, q, channel, cs)]


def repo_search_fresh(d, q, channel, cs):
    with ConversationStateRepository(d, compact_every=10_000, hot_window=3, read_only=True) as r:
        return r.search(q, channel, case_sensitive=cs)


def _cooled_store(d, n=300):
    """A store whose oldest messages are cooled over several files; every
    third holds a tool call, every message the word 'needle'."""
    with ConversationStateRepository(d, compact_every=10_000, hot_window=10) as repo:
        for run in range(3):
            repo.append_many([R(msg_id=f"m{run}{i:04d}", channel_id=f"ch{i % 3}", content=f"needle {run} {i}",
                                ts=float(i), role="assistant" if i % 3 == 0 else "user",
                                tool_calls=_calls(i) if i % 3 == 0 else ()) for i in range(n // 3)])
            repo.compact()
        assert len(repo._cool.files()) >= 2
        return [m for m in repo.search("needle")]


def test_hits_are_the_callers_own(tmp_path):
    """A caller that tries to edit the tool-call dicts of the hits it got
    gets TypeError (read-only): no later read (a search asked again, with
    hits the decode cache now holds, or an exact read) sees an edit. Archived hits without tool calls are
    left out of the cyclic collector's walks, with their records."""
    first = _cooled_store(tmp_path)
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=10) as repo:
        hits = repo.search("needle")
        assert [h.record for h in hits] == [h.record for h in first]
        cool = [h for h in hits if h.tier == "cool"]
        assert len(cool) > 200
        for h in cool:
            assert gc.is_tracked(h) == gc.is_tracked(h.record) == bool(h.record.tool_calls)
        for h in hits:
            for c in h.record.tool_calls:
                with pytest.raises(TypeError, match="read-only"):
                    c["arguments"]["q"] = "edited"
        again = repo.search("needle")
        assert [h.record for h in again] == [h.record for h in first]
        assert all(c["arguments"]["q"] != "edited" for h in again for c in h.record.tool_calls)
        for h in first[::7]:
            assert repo.get_message(h.record.msg_id).record == h.record


def test_deleted_cool_hits_are_gone_before_and_after_erasure(tmp_path):
    first = _cooled_store(tmp_path)
    gone = {h.record.msg_id for h in first[::5] if h.tier == "cool"}
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=10) as repo:
        for mid in gone:
            assert repo.delete(mid)
        want = [h.record for h in first if h.record.msg_id not in gone]
        assert [h.record for h in repo.search("needle")] == want
        repo.compact()
        assert [h.record for h in repo.search("needle")] == want
        assert [h.record for h in repo.search("NEEDLE", "ch1")] == [r for r in want if r.channel_id == "ch1"]


def test_a_damaged_page_under_the_repository_raises_on_search(tmp_path):
    """SPEC section 5: damage is found no later than the first bulk read
    that would return the damaged record (CorruptStateCheckpointError
    naming the file), here in the hits' task_id column."""
    _cooled_store(tmp_path)
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=10) as repo:
        name = repo._cool.files()[0]
    path = os.path.join(str(tmp_path), "hot", "conversation_cool", name)
    _flip(path, "task_id", back=2, mask=0x01)
    with ConversationStateRepository(tmp_path, compact_every=10_000, hot_window=10) as repo:
        with pytest.raises(CorruptStateCheckpointError) as ei:
            repo.search("needle")
        assert ei.value.path == path
