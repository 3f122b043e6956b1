"""The search filters a search builds are kept on disk and read by the first
search of a later process: a cool file's content-page filters beside its
sidecar (``cool-NNNNNNNN.grams``: the search reads only the pages that may
match) and a sealed segment's block filters beside it
(``conversation_seg-NNNNNNNN.grams``). The files are caches: one that does
not hold for its file (damaged, stale, cut, another file's) is named in a
warning, removed by a writer and built again, and no search answer ever
depends on it."""
from __future__ import annotations

import logging
import os
import shutil

import pytest

from rune_fast._conv import tuning
from rune_fast import ConversationMessageRecord, ConversationStateRepository
from rune_fast.cool import CoolArchive, _decode_grams, _encode_grams, _grams_name
from rune_fast.pages import GRAM_BYTES, PageReader
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
    """An archive of two files whose filters a search built and kept."""
    d = str(tmp_path / "cool")
    a = _open(d)
    rows = _records(1500)
    for r in rows[::150]:
        r["content"] += " zebracorn"         # a rare word: most pages cannot hold it
    cool_rows(a, rows[:900], list(range(900)))
    cool_rows(a, rows[900:], list(range(900, 1500)))
    assert _grams_files(a) == []
    assert _hits(a, "alpha") == _want(rows, "alpha")
    assert len(_grams_files(a)) == 2
    a.close()
    return d, rows


def _pages_read(monkeypatch) -> list[int]:
    """Notes each content page a search decompresses and looks through."""
    seen: list[int] = []
    real = PageReader._find_in

    def counted(self, raw, page, rg, c, probes, out):
        seen.append(page[1])
        return real(self, raw, page, rg, c, probes, out)
    monkeypatch.setattr(PageReader, "_find_in", counted)
    return seen


def test_a_later_process_reads_only_the_pages_that_may_match(kept, monkeypatch):
    d, rows = kept
    seen = _pages_read(monkeypatch)
    cold = _open(d, read_only=True)
    cold._filters.read.update(cold._files)            # as a build without kept filters
    assert _hits(cold, "zebracorn") == _want(rows, "zebracorn")
    full = len(seen)
    seen.clear()
    warm = _open(d, read_only=True)
    assert _hits(warm, "ZebraCorn") == _want(rows, "zebracorn")
    assert warm._filters.by_group and 0 < len(seen) < full / 3, (len(seen), full)
    for needle in ("alpha", "STRASSE", "nothing here at all"):
        assert _hits(warm, needle) == _want(rows, needle)


def test_filters_answer_like_a_full_scan(kept):
    """Every needle, either case rule, any channel: the same hits with the
    kept filters as without them."""
    d, rows = kept
    warm = _open(d, read_only=True)
    cold = _open(d, read_only=True)
    cold._filters.read.update(cold._files)
    for needle in ("alpha", "ALPHA", "straße", "ss", "e", "x" * 5, "日本", "nothing"):
        for cs in (False, True):
            for ch in (None, "ch3"):
                want = [(h.record, h.ord) for h in cold.search(needle, ch, case_sensitive=cs)]
                assert [(h.record, h.ord) for h in warm.search(needle, ch, case_sensitive=cs)] == want


@pytest.mark.parametrize("damage", ["flip", "cut", "zero", "empty", "other file", "bad entry"])
def test_a_filters_file_that_does_not_hold_is_named_removed_and_rebuilt(kept, caplog, damage):
    d, rows = kept
    a = _open(d)
    path = os.path.join(a.index_dir, _grams_name(1))
    data = bytearray(_read(path))
    if damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "cut":
        del data[-GRAM_BYTES:]
    elif damage == "zero":
        data[:] = bytes(len(data))
    elif damage == "empty":
        data.clear()
    elif damage == "other file":
        data[:] = _read(os.path.join(a.index_dir, _grams_name(2)))
    else:       # an entry naming a row group the file does not have, checksum made good
        fi = a._files[1]
        data[:] = _encode_grams(fi.size, fi.footer, [(99, b"\0" * GRAM_BYTES)])
    with open(path, "wb") as f:
        f.write(data)
    with caplog.at_level(logging.WARNING, logger="rune_fast.cool"):
        assert _hits(a, "alpha") == _want(rows, "alpha")
    assert any(path in r.getMessage() and "not used" in r.getMessage() for r in caplog.records)
    # built again by that search and kept: the next process reads it
    fi = a._files[1]
    got = _decode_grams(_read(path), fi.size, fi.footer, len(fi.rg_list) - 1)
    assert sorted(got) == list(range(len(fi.rg_list) - 1))
    caplog.clear()
    b = _open(d, read_only=True)
    with caplog.at_level(logging.WARNING, logger="rune_fast.cool"):
        assert _hits(b, "STRASSE") == _want(rows, "STRASSE")
    assert not caplog.records


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
    os.remove(os.path.join(a.index_dir, names[1]))
    assert _hits(a, "beta") == _want(rows, "beta")
    assert _grams_files(a) == [names[0]]


def test_filters_go_with_their_file(kept):
    """A merge or an erasure retires files: their filters go with them; gc
    removes the filters of a file no longer live (a crash between the two)."""
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


def test_repository_first_search_after_reopen_uses_kept_filters(tmp_path, monkeypatch):
    """Through the repository: a search keeps the cool tier's filters, the
    next open's first search reads a fraction of the pages and finds the same."""
    d = tmp_path / "s"
    msgs = [ConversationMessageRecord(role="user", content=f"message {i} " + ("alpha " if i % 397 == 0 else "")
                                      + "filler text " * 40, channel_id=f"c{i % 3}") for i in range(3000)]
    with ConversationStateRepository(d, hot_window=50, compact_every=10**6) as repo:
        repo.append_many(msgs)
        repo.compact()
    assert not list((d / "hot").rglob("*.grams"))       # no search, no filters
    want = sorted(m.msg_id for m in msgs if "alpha" in m.content)
    seen = _pages_read(monkeypatch)
    with ConversationStateRepository(d, hot_window=50, compact_every=10**6) as repo:
        assert sorted(h.record.msg_id for h in repo.search("ALPHA")) == want
    first = len(seen)
    assert list((d / "hot").rglob("*.grams"))
    seen.clear()
    with ConversationStateRepository(d, hot_window=50, compact_every=10**6) as repo:
        assert sorted(h.record.msg_id for h in repo.search("ALPHA")) == want
        assert 0 < len(seen) < first / 2, (len(seen), first)
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
