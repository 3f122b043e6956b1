"""Search filters kept on disk: a cool file's filters of its casefolded
content (``cool-NNNNNNNN.grams`` beside its sidecar, written with the file;
rune_fast.cool.grams: the search reads only the pages that may match, and
no page of a row group none of whose blocks may) and a sealed segment's
block filters beside it (``conversation_seg-NNNNNNNN.grams``). The files are
caches: one that does not hold for its file (damaged, stale, cut, another
file's) is named in a warning, removed by a writer and built again, and no
search answer ever depends on it."""
from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rune_fast._conv import tuning
from rune_fast import ConversationMessageRecord, ConversationStateRepository
from rune_fast._search import fold_block_grams, gram_blocks_any
from rune_fast.cool import CoolArchive, _decode_grams, _encode_grams, _grams_name
from rune_fast.cool import grams as cool_grams
from rune_fast import pages
from test_cool import cool_rows

from test_pages import _records


def _open(d: str, **kw) -> CoolArchive:
    """The archive in ``d`` with every Parquet file there live (what the
    repository's manifest would name)."""
    if not os.path.isdir(d):
        return CoolArchive(d, row_group_rows=256, cache_bytes=1, **kw)
    files = sorted(n for n in os.listdir(d) if n.endswith(".parquet"))
    return CoolArchive(d, files, row_group_rows=256, cache_bytes=1, **kw)


def _grams_files(a: CoolArchive) -> list[str]:
    return sorted(n for n in os.listdir(a.index_dir) if n.endswith(".grams"))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _hits(a: CoolArchive, needle: str, **kw) -> list[str]:
    return sorted(h.record["msg_id"] for h in a.search(needle, **kw))


def _want(rows: list[dict], needle: str) -> list[str]:
    return sorted(r["msg_id"] for r in rows if needle.casefold() in r["content"].casefold())


@pytest.fixture
def kept(tmp_path):
    """An archive of two files, their filters written with them."""
    d = str(tmp_path / "cool")
    a = _open(d)
    rows = _records(1500)
    for r in rows[::150]:
        r["content"] += " zebracorn"         # a rare word: most pages cannot hold it
    cool_rows(a, rows[:900], list(range(900)))
    cool_rows(a, rows[900:], list(range(900, 1500)))
    assert len(_grams_files(a)) == 2
    a.close()
    return d, rows


def _pages_read(monkeypatch) -> list[int]:
    """Notes each content page a search decompresses and looks through."""
    seen: list[int] = []
    real = pages.find_pages

    def counted(*args, **kwargs):
        return real(*args, seen=seen, **kwargs)
    monkeypatch.setattr(pages, "find_pages", counted)
    return seen


def _without_filters(a: CoolArchive) -> CoolArchive:
    a._filters.read.update(a._files)            # as if no file had usable filters
    return a


def test_a_search_reads_only_the_pages_that_may_match(kept, monkeypatch):
    d, rows = kept
    seen = _pages_read(monkeypatch)
    cold = _without_filters(_open(d, read_only=True))
    assert _hits(cold, "zebracorn") == _want(rows, "zebracorn")
    full = len(seen)
    seen.clear()
    warm = _open(d, read_only=True)
    assert _hits(warm, "ZebraCorn") == _want(rows, "zebracorn")
    assert warm._filters.by_file and 0 < len(seen) < full / 3, (len(seen), full)
    seen.clear()
    assert _hits(warm, "nothing here at all") == [] and seen == []     # every group ruled out unread
    for needle in ("alpha", "STRASSE", "nothing here at all"):
        assert _hits(warm, needle) == _want(rows, needle)


def test_filters_answer_like_a_full_scan(kept):
    """Every needle, either case rule, any channel: the same hits with the
    filters as without them."""
    d, rows = kept
    warm = _open(d, read_only=True)
    cold = _without_filters(_open(d, read_only=True))
    for needle in ("alpha", "ALPHA", "straße", "STRASSE", "ss", "e", "x" * 5, "日本", "nothing", "ZEBRACORN"):
        for cs in (False, True):
            for ch in (None, "ch3"):
                want = [(h.record, h.ord) for h in cold.search(needle, ch, case_sensitive=cs)]
                assert [(h.record, h.ord) for h in warm.search(needle, ch, case_sensitive=cs)] == want


_TEXT = st.text(st.sampled_from("aAsSß\u1e9e\u017fkK\u212a\u03a3\u03c3\u03c2\u0130\u0131iI\u0307\ufb00\ufb03fl"
                                "\u00fc\u00dcu\u0308\u91cf\u5b50\U0001f680 xyz"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(_TEXT, min_size=1, max_size=70), _TEXT, st.integers(1, 9))
def test_folded_filters_never_rule_out_a_block_holding_the_needle(texts, needle, block):
    """fold_block_grams / gram_blocks_any against str.casefold over text of
    expansions (ß ẞ ſ ﬀ ﬃ), Kelvin sign, final sigma, dotted and dotless i,
    combining marks, CJK and emoji: a block holding a row whose casefold
    holds the casefolded needle always passes, and so does it for the
    needle as a case-sensitive substring."""
    raw = [t.encode("utf-8") for t in texts]
    offs = np.cumsum([0] + [len(r) for r in raw]).astype(np.int32)
    g = fold_block_grams(b"".join(raw), offs, block, 4096)
    passed = set(gram_blocks_any(g, 4096, [needle.casefold().encode("utf-8")]).tolist())
    for i, t in enumerate(texts):
        if needle.casefold() in t.casefold() or needle in t:
            assert i // block in passed, (t, needle)


def test_folded_filters_rule_out_blocks_without_the_needle():
    texts = ["Goethestraße 12", "plain words", "ZÜRICH HBF", "量子計算機の", "bad \udcff"]
    raw = [t.encode("utf-8", "surrogateescape" if "\udcff" in t else "strict") for t in texts]
    offs = np.cumsum([0] + [len(r) for r in raw]).astype(np.int32)
    g = fold_block_grams(b"".join(raw), offs, 1, 4096)
    assert gram_blocks_any(g, 4096, ["GOETHESTRASSE".casefold().encode()]).tolist() == [0, 4]
    assert gram_blocks_any(g, 4096, ["zürich".encode()]).tolist() == [2, 4]
    assert gram_blocks_any(g, 4096, ["量子計算機".encode()]).tolist() == [3, 4]
    # a row that does not decode: its block passes every needle
    assert gram_blocks_any(g, 4096, [b"nothing like it"]).tolist() == [4]
    assert gram_blocks_any(g, 4096, [b"ab"]).tolist() == [0, 1, 2, 3, 4]      # too short to test
    assert gram_blocks_any(g, 4096, [b"nothing", b"plain"]).tolist() == [1, 4]
    assert gram_blocks_any(g, 4096, [b"plain"], 2, 4).tolist() == []


@pytest.mark.parametrize("damage", ["flip", "cut", "zero", "empty", "other file", "bad count", "old format"])
def test_a_filters_file_that_does_not_hold_is_named_removed_and_rebuilt(kept, caplog, damage):
    d, rows = kept
    a = _open(d)
    path = os.path.join(a.index_dir, _grams_name(1))
    data = bytearray(_read(path))
    fi = a._files[1]
    if damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "cut":
        del data[-cool_grams.BLOCK_BYTES:]
    elif damage == "zero":
        data[:] = bytes(len(data))
    elif damage == "empty":
        data.clear()
    elif damage == "other file":
        data[:] = _read(os.path.join(a.index_dir, _grams_name(2)))
    elif damage == "bad count":     # filters for fewer rows, checksum made good
        with pytest.raises(ValueError):
            _encode_grams(fi.size, fi.footer, fi.rows, b"\0" * cool_grams.BLOCK_BYTES)
        body = b"\0" * cool_grams.BLOCK_BYTES * (cool_grams.blocks_for(fi.rows) - 1)
        data[:] = _encode_grams(fi.size, fi.footer, fi.rows - cool_grams.BLOCK_ROWS, body)
    else:       # the layout of an earlier build (version 1: filters a page), checksum good
        from rune_fast.segments import seal
        data[:] = seal(b"RFGRAMS1" + bytes(64))
    with open(path, "wb") as f:
        f.write(data)
    with caplog.at_level(logging.WARNING, logger="rune_fast.cool"):
        assert _hits(a, "zebracorn") == _want(rows, "zebracorn")
    assert any(path in r.getMessage() and "not used" in r.getMessage() for r in caplog.records)
    # built again by that search and kept: the next process maps it
    got = _decode_grams(_read(path), fi.size, fi.footer, fi.rows)
    assert len(got) == cool_grams.blocks_for(fi.rows) * cool_grams.BLOCK_BYTES
    caplog.clear()
    b = _open(d, read_only=True)
    with caplog.at_level(logging.WARNING, logger="rune_fast.cool"):
        assert _hits(b, "STRASSE") == _want(rows, "STRASSE")
        assert _hits(b, "zebracorn") == _want(rows, "zebracorn")
    assert not caplog.records and b._filters.by_file


def test_filters_damaged_in_every_way_never_hide_a_hit(kept):
    """Whatever the bytes of a filters file (a flip anywhere, all zero,
    bits cleared with the checksum made good is not among them: a writer
    never makes those), a search finds what a full scan finds."""
    d, rows = kept
    a = _open(d, read_only=True)
    path = os.path.join(a.index_dir, _grams_name(1))
    good = _read(path)
    want = _want(rows, "zebracorn")
    for at in range(0, len(good), max(1, len(good) // 37)):
        bad = bytearray(good)
        bad[at] ^= 0xFF
        with open(path, "wb") as f:
            f.write(bad)
        assert _hits(_open(d, read_only=True), "zebracorn") == want, at


def test_a_viewer_reads_filters_but_never_writes_or_removes_them(kept, caplog):
    d, rows = kept
    a = _open(d, read_only=True)
    names = _grams_files(a)
    path = os.path.join(a.index_dir, names[0])
    with open(path, "r+b") as f:
        f.seek(40)
        b = f.read(1)
        f.seek(40)
        f.write(bytes([b[0] ^ 1]))
    with caplog.at_level(logging.WARNING, logger="rune_fast.cool"):
        assert _hits(a, "alpha") == _want(rows, "alpha")
    assert any(path in r.getMessage() for r in caplog.records)
    assert _grams_files(a) == names and os.path.exists(path)    # still damaged, still there
    assert a._filters.nbytes > 0                                 # built and held instead
    os.remove(os.path.join(a.index_dir, names[1]))
    b = _open(d, read_only=True)
    assert _hits(b, "beta") == _want(rows, "beta")
    assert _grams_files(b) == [names[0]]


def test_a_file_written_before_filters_gets_them_from_its_first_search(kept, monkeypatch):
    d, rows = kept
    a = _open(d)
    for n in _grams_files(a):
        os.remove(os.path.join(a.index_dir, n))
    assert _hits(a, "zebracorn") == _want(rows, "zebracorn")
    assert len(_grams_files(a)) == 2
    seen = _pages_read(monkeypatch)
    assert _hits(_open(d, read_only=True), "zebracorn") == _want(rows, "zebracorn")
    assert 0 < len(seen) < 40


def test_filters_go_with_their_file(kept):
    """A merge or an erasure retires files: their filters go with them (the
    new files have their own); gc removes the filters of a file no longer
    live (a crash between the two)."""
    d, rows = kept
    a = _open(d)
    old = list(a.files())
    change = a.erase([rows[0]["msg_id"]])
    a.unlink_files(change.removed)
    assert _grams_name(1) not in _grams_files(a)
    assert _hits(a, "alpha") == _want(rows[1:], "alpha")
    live = {n.replace(".parquet", ".grams") for n in a.files()}
    assert set(_grams_files(a)) == live
    stray = os.path.join(a.index_dir, _grams_name(77))
    shutil.copy(os.path.join(a.index_dir, sorted(live)[0]), stray)
    assert _grams_name(77) in a.gc()
    assert not os.path.exists(stray) and set(_grams_files(a)) == live
    assert old != a.files()
    merged = a.merge([a.files()])
    a.unlink_files(merged.removed)
    assert set(_grams_files(a)) == {n.replace(".parquet", ".grams") for n in a.files()}
    assert _hits(a, "zebracorn") == _want(rows[1:], "zebracorn")


def test_repository_search_uses_the_filters_written_with_the_files(tmp_path, monkeypatch):
    """Through the repository: compaction writes each cool file's filters;
    the first search after an open reads a fraction of the pages."""
    d = tmp_path / "s"
    msgs = [ConversationMessageRecord(role="user", content=f"message {i} " + ("alpha " if i % 397 == 0 else "")
                                      + "filler text " * 40, channel_id=f"c{i % 3}") for i in range(3000)]
    with ConversationStateRepository(d, hot_window=50, compact_every=10**6) as repo:
        repo.append_many(msgs)
        repo.compact()
    assert list((d / "hot").rglob("cool-*.grams"))       # written with the files
    want = sorted(m.msg_id for m in msgs if "alpha" in m.content)
    seen = _pages_read(monkeypatch)
    with ConversationStateRepository(d, hot_window=50, compact_every=10**6) as repo:
        assert sorted(h.record.msg_id for h in repo.search("ALPHA")) == want
        assert 0 < len(seen) <= len(want), (len(seen), len(want))
        assert repo.verify().ok


# ---- the hot tier: sealed segments' block filters ---------------------------


def _hot_store(tmp_path, monkeypatch):
    """A store of several sealed segments (small rolls) whose filters two
    whole-store searches built and kept; returns (dir, messages)."""
    monkeypatch.setattr(tuning, "ROLL_BYTES", 96 << 10)
    d = tmp_path / "h"
    msgs = [ConversationMessageRecord(role="user", channel_id=f"c{i % 4}",
                                      content=f"entry {i} " + ("Quarterly report " if i % 211 == 0 else "")
                                      + "lorem ipsum dolor sit amet " * 12) for i in range(2400)]
    with ConversationStateRepository(d, hot_window=10**6, compact_every=200) as repo:
        for i in range(0, len(msgs), 100):
            repo.append_many(msgs[i:i + 100])
        repo.compact()
        assert len(repo._seg_order) >= 3
        for _ in range(2):      # the second whole-store search builds the filters; kept after it
            repo.search("quarterly report")
    return d, msgs


def _seg_grams(d) -> list[str]:
    return sorted(p.name for p in (d / "hot").glob("conversation_seg-*.grams"))


def _want_hot(msgs, needle: str) -> list[str]:
    return sorted(m.msg_id for m in msgs if needle.casefold() in m.content.casefold())


def test_sealed_segments_filters_serve_the_first_search_of_a_later_open(tmp_path, monkeypatch):
    d, msgs = _hot_store(tmp_path, monkeypatch)
    names = _seg_grams(d)
    assert len(names) >= 3
    with ConversationStateRepository(d, hot_window=10**6, compact_every=200) as repo:
        for s in repo._seg_order:
            assert repo._index.seg_filter_blocks(s) == 0          # nothing until a search
        for needle in ("quarterly report", "QUARTERLY", "entry 1999 ", "dolor sit", "absent words"):
            assert sorted(h.record.msg_id for h in repo.search(needle)) == _want_hot(msgs, needle)
        kept = [s for s in repo._seg_order if repo._index.seg_filter_blocks(s) > 0]
        assert len(kept) == len(names) >= 3          # taken from the files at the first search
    with ConversationStateRepository(d, read_only=True) as viewer:
        assert sorted(h.record.msg_id for h in viewer.search("Quarterly Report")) == _want_hot(msgs, "quarterly report")
        assert all(viewer._index.seg_filter_blocks(s) > 0 for s in viewer._seg_order if s in kept)


def test_sealed_segments_filters_are_read_where_their_file_is_mapped(tmp_path, monkeypatch):
    """The index reads a kept file's words in its map (file pages: no
    copy counted as the process's memory) and answers as a full scan."""
    d, msgs = _hot_store(tmp_path, monkeypatch)
    with ConversationStateRepository(d, hot_window=10**6, compact_every=200) as repo:
        repo.search("absent words")
        segs = [s for s in repo._seg_order if repo._index.seg_filter_blocks(s) > 0]
        assert len(segs) >= 3 and all(repo._index.seg_filters_mapped(s) for s in segs)
        for needle in ("quarterly report", "entry 77 ", "dolor sit"):
            assert sorted(h.record.msg_id for h in repo.search(needle)) == _want_hot(msgs, needle)
        assert all(repo._index.seg_filters_mapped(s) for s in segs)


def test_filters_a_writer_built_and_kept_are_read_from_the_file_then(tmp_path, monkeypatch):
    """The search that builds a segment's filters keeps them in a file and
    from then on reads the file's map: its own copy is let go."""
    monkeypatch.setattr(tuning, "ROLL_BYTES", 96 << 10)
    msgs = [ConversationMessageRecord(role="user", channel_id=f"c{i % 4}", content=f"entry {i} " + "lorem ipsum " * 20)
            for i in range(2400)]
    with ConversationStateRepository(tmp_path / "w", hot_window=10**6, compact_every=200) as repo:
        for i in range(0, len(msgs), 100):
            repo.append_many(msgs[i:i + 100])
        repo.compact()
        segs = list(repo._seg_order)
        assert len(segs) >= 3
        repo.search("entry 5 ")                 # the first scan builds nothing
        assert not _seg_grams(tmp_path / "w")
        assert sorted(h.record.msg_id for h in repo.search("ENTRY 7 ")) == _want_hot(msgs, "entry 7 ")
        assert len(_seg_grams(tmp_path / "w")) == len(segs)
        assert all(repo._index.seg_filters_mapped(s) for s in segs)
        assert sorted(h.record.msg_id for h in repo.search("lorem ipsum entry")) == []
        assert sorted(h.record.msg_id for h in repo.search("entry 99 ")) == _want_hot(msgs, "entry 99 ")


def test_version_1_segment_filters_are_copied_then_written_again(tmp_path, monkeypatch):
    """A file of the unpadded first version (words unaligned in its map):
    the index copies its words, answers are the same, and a writer keeps
    the file again after the search in the current version, read in place
    from then on and by the next open. A viewer copies and leaves the file
    as it is."""
    from rune_fast import segments
    d, msgs = _hot_store(tmp_path, monkeypatch)
    for name in _seg_grams(d):
        path = d / "hot" / name
        raw = path.read_bytes()
        head = segments._FILTERS_HEAD
        fields = list(head.unpack_from(raw, 0))
        assert fields[1] == segments._FILTERS_VERSION
        fields[1] = 1
        fields[-3:-1] = [len(memoryview(_seg_map(d, name))), segments.segment_ident(_seg_map(d, name))]
        body = head.pack(*fields) + raw[head.size + 4:-8]
        path.write_bytes(segments.seal(body))
    v1 = {n: (d / "hot" / n).read_bytes() for n in _seg_grams(d)}
    with ConversationStateRepository(d, read_only=True) as viewer:
        assert sorted(h.record.msg_id for h in viewer.search("Quarterly")) == _want_hot(msgs, "quarterly")
        segs = [s for s in viewer._seg_order if viewer._index.seg_filter_blocks(s) > 0]
        assert len(segs) >= 3 and not any(viewer._index.seg_filters_mapped(s) for s in segs)
    assert {n: (d / "hot" / n).read_bytes() for n in _seg_grams(d)} == v1
    with ConversationStateRepository(d, hot_window=10**6, compact_every=200) as repo:
        assert sorted(h.record.msg_id for h in repo.search("Quarterly")) == _want_hot(msgs, "quarterly")
        assert all(repo._index.seg_filters_mapped(s) for s in segs)      # (kept again, then mapped)
    for name, old in v1.items():
        new = (d / "hot" / name).read_bytes()
        assert len(new) == len(old) + 4 and segments._FILTERS_HEAD.unpack_from(new, 0)[1] == 3
    with ConversationStateRepository(d, hot_window=10**6, compact_every=200) as repo:
        assert sorted(h.record.msg_id for h in repo.search("dolor sit")) == _want_hot(msgs, "dolor sit")
        assert all(repo._index.seg_filters_mapped(s) for s in segs)


def _seg_map(d, grams_name: str):
    """The bytes of the segment a filters file is named for, as a map shows them."""
    from rune_fast.segments import map_file
    m, _size = map_file(str(d / "hot" / grams_name.replace(".grams", ".jsonl")))
    return m


def test_segment_filters_are_bound_to_the_lines_not_to_the_zeros_after_them():
    """A sealed segment's map may show more or fewer of the zeros reserved
    after its last line (ext4 reports the last block of an unwritten extent
    as data while its page is cached, as a hole once evicted): kept
    filters hold for the same lines whatever zeros follow them, and for
    no other lines."""
    from rune_fast import segments
    layout = (16384, 256, 12, 64)
    lines = b"".join(b'{"n":%d,"c":"lorem ipsum dolor"}\n' % i for i in range(3000))
    words = bytes(range(256)) * 2 * 3            # three blocks' words
    raw = segments.encode_filters(layout, lines + bytes(1 << 20), words)
    for zeros in (0, 100, 4096, 70_000, 1 << 20, (1 << 20) + 5000):
        assert bytes(segments.decode_filters(raw, layout, lines + bytes(zeros))) == words
    assert segments.lines_end(lines + bytes(200_000)) == len(lines)
    assert segments.lines_end(bytes(200_000)) == 0
    other = bytearray(lines)
    other[-10] ^= 1
    for buf in (bytes(other), lines[:-40], lines + b"x\n", b"x" + lines[1:]):
        with pytest.raises(ValueError, match="other bytes"):
            segments.decode_filters(raw, layout, buf)


def test_version_2_segment_filters_are_taken_then_written_again_bound_to_the_lines(tmp_path, monkeypatch):
    """A file of version 2 (bound to the segment's whole map, as this open
    maps it) is taken where it is mapped, and a writer keeps it again in
    the current version after the search (bound to the lines, so that no
    later change of the page cache gets it refused); a viewer leaves it."""
    from rune_fast import segments
    d, msgs = _hot_store(tmp_path, monkeypatch)
    names = _seg_grams(d)
    for name in names:
        path = d / "hot" / name
        raw = path.read_bytes()
        head = segments._FILTERS_HEAD
        fields = list(head.unpack_from(raw, 0))
        buf = _seg_map(d, name)
        fields[1] = 2
        fields[-3:-1] = [len(memoryview(buf)), segments.segment_ident(buf)]
        path.write_bytes(segments.seal(head.pack(*fields) + raw[head.size:-8]))
    v2 = {n: (d / "hot" / n).read_bytes() for n in names}
    with ConversationStateRepository(d, read_only=True) as viewer:
        assert sorted(h.record.msg_id for h in viewer.search("Quarterly")) == _want_hot(msgs, "quarterly")
        assert all(viewer._index.seg_filters_mapped(s) for s in viewer._seg_order
                   if viewer._index.seg_filter_blocks(s) > 0)
    assert {n: (d / "hot" / n).read_bytes() for n in names} == v2
    with ConversationStateRepository(d, hot_window=10**6, compact_every=200) as repo:
        assert sorted(h.record.msg_id for h in repo.search("Quarterly")) == _want_hot(msgs, "quarterly")
        segs = [s for s in repo._seg_order if repo._index.seg_filter_blocks(s) > 0]
        assert len(segs) >= 3 and all(repo._index.seg_filters_mapped(s) for s in segs)
    for name in names:
        new = (d / "hot" / name).read_bytes()
        assert segments._FILTERS_HEAD.unpack_from(new, 0)[1] == segments._FILTERS_VERSION
        words = segments._FILTERS_HEADS[2]
        assert new[words:-8] == v2[name][words:-8]        # (the same words, bound anew)
    with ConversationStateRepository(d, hot_window=10**6, compact_every=200) as repo:
        assert sorted(h.record.msg_id for h in repo.search("dolor sit")) == _want_hot(msgs, "dolor sit")
        assert all(repo._index.seg_filters_mapped(s) for s in segs)


def _map_lengths(d, names: list[str], *, cached: bool) -> list[int]:
    """How long a map of each named segment is (map_file's data end) with
    its pages read into the page cache (``cached``), or dropped from it."""
    from rune_fast._log import data_end
    out = []
    for name in names:
        fd = os.open(d / "hot" / name.replace(".grams", ".jsonl"), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if cached:
                os.pread(fd, size, 0)
            else:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            out.append(data_end(fd, size))
        finally:
            os.close(fd)
    return out


def test_segment_filters_hold_after_the_page_cache_lets_a_segment_go(tmp_path, monkeypatch, caplog):
    """Sealed segments whose last block is an unwritten extent (a tail
    reserves space ahead in chunks of unaligned length): ext4 maps them to
    the file's end while that block's page is cached, and ~a block after
    the last line once it is evicted. Filters kept over the longer map are
    taken over the shorter one (they were refused as "made for other bytes",
    removed and built again). Skipped where the file system shows no
    difference."""
    monkeypatch.setattr(tuning, "ROLL_BYTES", 96 << 10)
    d = tmp_path / "pc"
    msgs = [ConversationMessageRecord(role="user", channel_id=f"c{i % 4}",
                                      content=f"entry {i} " + ("Quarterly report " if i % 211 == 0 else "")
                                      + "lorem ipsum dolor sit amet " * (10 + i % 13)) for i in range(4000)]
    with ConversationStateRepository(d, hot_window=10**6, compact_every=800) as repo:
        for i in range(0, len(msgs), 800):      # ~350 KB writes: chunks of ~1.4 MB reserved ahead
            repo.append_many(msgs[i:i + 800])
    names = sorted(p.name.replace(".jsonl", ".grams") for p in (d / "hot").glob("conversation_seg-*.jsonl"))
    long = _map_lengths(d, names, cached=True)
    with ConversationStateRepository(d, hot_window=10**6, compact_every=800) as repo:
        for _ in range(2):      # filters built over the maps as they are now, and kept
            repo.search("quarterly report")
    assert _seg_grams(d) == names
    if _map_lengths(d, names, cached=False) == long:
        pytest.skip("this file system maps a sealed segment alike whatever the page cache holds")
    kept = {n: (d / "hot" / n).read_bytes() for n in names}
    with ConversationStateRepository(d, hot_window=10**6, compact_every=800) as repo:
        with caplog.at_level(logging.WARNING, logger="rune_fast"):
            assert sorted(h.record.msg_id for h in repo.search("quarterly report")) == \
                _want_hot(msgs, "quarterly report")
        assert not [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
        assert all(repo._index.seg_filter_blocks(s) > 0 for s in repo._seg_order)
    assert {n: (d / "hot" / n).read_bytes() for n in names} == kept


@pytest.mark.parametrize("damage", ["flip", "cut", "other segment", "empty"])
def test_a_segment_filters_file_that_does_not_hold_is_named_and_removed(tmp_path, monkeypatch, caplog, damage):
    d, msgs = _hot_store(tmp_path, monkeypatch)
    names = _seg_grams(d)
    path = d / "hot" / names[0]
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0x04
    elif damage == "cut":
        del data[-100:]
    elif damage == "other segment":
        data[:] = (d / "hot" / names[1]).read_bytes()
    else:
        data.clear()
    path.write_bytes(bytes(data))
    with ConversationStateRepository(d, hot_window=10**6, compact_every=200) as repo:
        with caplog.at_level(logging.WARNING, logger="rune_fast"):
            assert sorted(h.record.msg_id for h in repo.search("quarterly report")) == \
                _want_hot(msgs, "quarterly report")
        assert any(str(path) in r.getMessage() and "not used" in r.getMessage() for r in caplog.records)
        assert not path.exists()
        repo.search("dolor")                 # the second search builds them again, and keeps them
        assert path.exists()


def test_segment_filters_go_with_their_segment(tmp_path, monkeypatch):
    """A compaction that rewrites or drops a segment removes its filters;
    an open removes the filters of a segment the manifest does not name."""
    d, msgs = _hot_store(tmp_path, monkeypatch)
    before = _seg_grams(d)
    stray = d / "hot" / "conversation_seg-99999999.grams"
    stray.write_bytes(b"left by a crash")
    (d / "hot" / "conversation_seg-99999998.grams.tmp").write_bytes(b"x")
    with ConversationStateRepository(d, hot_window=10, compact_every=10**6) as repo:
        assert not stray.exists() and _seg_grams(d) == before
        repo.compact()                          # cools all but 10 a channel: segments go
        live = {f"conversation_seg-{s:08d}.grams" for s in repo._seg_order}
        assert set(before) - live and set(_seg_grams(d)) <= live
        assert sorted(h.record.msg_id for h in repo.search("quarterly report")) == \
            _want_hot(msgs, "quarterly report")
    assert not (d / "hot" / "conversation_seg-99999998.grams.tmp").exists()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_TEXT, min_size=1, max_size=120), st.lists(_TEXT.filter(bool), min_size=1, max_size=4),
       st.integers(3, 70))
def test_archive_search_with_filters_is_str_casefold(tmp_path_factory, texts, needles, rg_rows):
    """End to end through the archive (row groups of any size, so blocks of
    32 rows straddle them): every search with the filters written at
    cooling finds exactly the rows str.casefold (or ``in``) says, in both
    case rules and per channel."""
    from test_cool import rec
    d = str(tmp_path_factory.mktemp("hc") / "cool")
    a = CoolArchive(d, row_group_rows=rg_rows, cache_bytes=1)
    rows = [rec(i, f"ch{i % 3}", content=t) for i, t in enumerate(texts)]
    half = len(rows) // 2
    cool_rows(a, rows[:half], list(range(half)))
    cool_rows(a, rows[half:], list(range(half, len(rows))))
    assert len(_grams_files(a)) == (2 if half else 1)
    for needle in needles + [texts[0][1:5]]:
        for cs in (False, True):
            for ch in (None, "ch1"):
                want = sorted(r["msg_id"] for r in rows if (ch is None or r["channel_id"] == ch)
                              and (needle in r["content"] if cs else needle.casefold() in r["content"].casefold()))
                assert sorted(h.record["msg_id"] for h in a.search(needle, ch, case_sensitive=cs)) == want
    a.close()


def test_a_viewer_past_its_budget_searches_without_filters(kept, monkeypatch):
    """A viewer does not build filters it could not hold (past _GRAMS_BUDGET):
    those files are searched page by page, with the same hits."""
    import rune_fast.cool.search as cs
    d, rows = kept
    a = _open(d)
    for n in _grams_files(a):
        os.remove(os.path.join(a.index_dir, n))
    monkeypatch.setattr(cs, "_GRAMS_BUDGET", cool_grams.BLOCK_BYTES)
    v = _open(d, read_only=True)
    for needle in ("zebracorn", "STRASSE", "alpha"):
        assert _hits(v, needle) == _want(rows, needle)
    assert not v._filters.by_file and v._filters.nbytes == 0 and _grams_files(v) == []


def test_a_file_whose_filters_could_not_be_written_is_searched_all_the_same(tmp_path, monkeypatch, caplog):
    """The filters are a cache written after their file: when they cannot be
    (here: a wrong length), the file is written and served as ever, the
    failure named, and the first search builds them."""
    d = str(tmp_path / "cool")
    a = _open(d)
    rows = _records(300)
    keep = cool_grams.GramFile.keep
    monkeypatch.setattr(cool_grams.GramFile, "keep",
                        lambda self, path, size, footer, rows: keep(self, path, size, footer, rows + 64))
    with caplog.at_level(logging.WARNING, logger="rune_fast.cool"):
        cool_rows(a, rows, list(range(300)))
    assert any("not written" in r.getMessage() for r in caplog.records)
    assert _grams_files(a) == [] and a.verify() == []
    monkeypatch.undo()
    assert _hits(a, "STRASSE") == _want(rows, "STRASSE")
    assert _grams_files(a) == [_grams_name(1)]
