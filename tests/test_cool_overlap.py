"""The cooling pipeline's two threads (compact(): the caller parses lines
into columns, a ``_GroupWriter`` thread compresses row groups and folds the
search filters): what each needs of the GIL, and what they write.

- cool_columns parses and writes its columns without the GIL, a block of
  lines at a time (a thread writing row groups, or an appender beside a
  background cooling run, runs meanwhile), and gives what the dict path
  gives across its blocks, tool-call lines and lines it leaves included;
- the Parquet files are written through Arrow's own file (no Python write
  call, each of which took the GIL);
- the search filters' fold (fed without a copy of the row) sets exactly
  the bits of the trigrams of each row's casefold.
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _cool_lines import dict_table, framed_lines, lines_blob
from rune_fast import ConversationMessageRecord, ConversationStateRepository, _encode, codec
from rune_fast import cool
from rune_fast._search import fold_block_grams


def _messages(n):
    msgs = []
    for i in range(n):
        calls = ()
        if i % 3 == 1:
            calls = ({"id": f"c{i}", "name": "skip" if i % 7 == 1 else "f",
                      "arguments": {"z": [i, 2.5, None], "a": "x\"y é"}},)
        # (a time past 1e16 is written with an exponent: the dict path takes it)
        ts = 1e17 + i if i % 97 == 5 else 1764000000.25 + i
        msgs.append(ConversationMessageRecord(content=f"row {i} Zürich \n" * (1 + i % 4), channel_id="c",
                                              task_id=f"t{i % 5}", tool_calls=calls, ts=ts))
    return msgs


def test_cool_columns_blocks_give_the_dict_path():
    """Lines over several of cool_columns' blocks (256 lines), tool-call
    lines among them (their texts asked between a block's parse and its
    columns), some the caller's calls_texts refuses, some the compiled
    reader leaves: the same taken lines and the same table as the dict
    path."""
    msgs = _messages(700)
    lines = framed_lines(msgs, 11)

    def calls_texts(raw):
        return None if b'"skip"' in raw else cool._calls_texts(raw)

    taken, _cols = _encode.cool_columns(*lines_blob(lines), calls_texts)
    want = [i for i, m in enumerate(msgs)
            if m.ts < 1e16 and not (m.tool_calls and m.tool_calls[0]["name"] == "skip")]
    assert taken == want
    assert 0 < len(want) < 700
    data, starts = lines_blob(lines)

    def fallback(i):
        d = codec.decode_body(lines[i], path="t", offset=0)
        return d["r"], d.get("s")
    assert cool.table_from_lines(data, starts, fallback).to_pylist() == dict_table(lines).to_pylist()
    # a line not followed by a newline in a later block is still named
    bad = starts.copy()
    bad[600] += 1
    with pytest.raises(ValueError, match=r"line 599 \(at \d+\) is not followed by a newline"):
        _encode.cool_columns(data, bad, cool._calls_texts)


@settings(max_examples=25, deadline=None)
@given(st.sets(st.integers(0, 1099), max_size=4), st.sets(st.integers(0, 1099), max_size=3))
def test_cool_columns_resumes_its_stretch_after_the_callers_blocks(asked_at, refused_at):
    """The blocks run in one stretch without the GIL until one holds tool
    calls the caller spells (a float among the arguments): that block's
    texts are asked, and the stretch goes on from the next. Wherever those
    lines fall (the first block, the last, several in one, none), and
    whether the caller refuses some: the lines asked are those, the taken
    ones all but the refused, the table the dict path's."""
    asked_at = asked_at | refused_at
    msgs = [ConversationMessageRecord(
        content=f"row {i} Zürich", channel_id="c",
        tool_calls=({"id": f"c{i}", "name": "skip" if i in refused_at else "f",
                     "arguments": {"x": 2.5}},) if i in asked_at
        else ({"id": f"c{i}", "name": "g", "arguments": {"z": [i, None]}},) if i % 5 == 0 else ())
        for i in range(1100)]
    lines = framed_lines(msgs, 7)
    data, starts = lines_blob(lines)
    asked: list[int] = []

    def calls_texts(raw):
        asked.append(int(raw.split(b'"id":"c')[1].split(b'"')[0]))
        return None if b'"skip"' in raw else cool._calls_texts(raw)

    taken, _cols = _encode.cool_columns(data, starts, calls_texts)
    assert asked == sorted(asked_at)
    assert taken == [i for i in range(1100) if i not in refused_at]

    def fallback(i):
        d = codec.decode_body(lines[i], path="t", offset=0)
        return d["r"], d.get("s")
    assert cool.table_from_lines(data, starts, fallback).to_pylist() == dict_table(lines).to_pylist()


def test_cool_columns_lets_other_threads_run():
    """With no forced switch (a switch interval of 100 s) a thread runs only
    where another lets go of the GIL: it runs while cool_columns parses
    (the old reader held the GIL for the whole call)."""
    lines = framed_lines([ConversationMessageRecord(content=f"plain {i} " * 20, channel_id="c")
                    for i in range(20000)])
    data, starts = lines_blob(lines)
    inside = threading.Event()
    stop = threading.Event()
    ran: list[int] = []

    def other() -> None:
        while not stop.is_set():
            if inside.is_set():
                ran.append(1)
            time.sleep(0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    t = threading.Thread(target=other, daemon=True)
    try:
        t.start()
        inside.set()
        taken, _cols = _encode.cool_columns(data, starts, cool._calls_texts)
        inside.clear()
    finally:
        stop.set()
        sys.setswitchinterval(old)
        t.join()
    assert len(taken) == 20000
    assert ran


def test_cool_files_are_written_through_arrows_own_file(tmp_path, monkeypatch):
    """compact()'s Parquet writer writes to an Arrow file, not a Python one
    (each of whose writes takes the GIL, which the cooling thread then
    waited for while the caller parsed); the file is private (0600)."""
    seen = []
    init = pq.ParquetWriter.__init__

    def spy(self, where, *args, **kwargs):
        seen.append(where)
        return init(self, where, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "__init__", spy)
    d = str(tmp_path / "s")
    with ConversationStateRepository(d, hot_window=8, compact_every=10**9) as repo:
        repo.append_many([ConversationMessageRecord(content=f"m{i}", channel_id="c") for i in range(300)])
        assert repo.compact().cooled == 292
        assert [r.content for r in repo.window("c", 300)] == [f"m{i}" for i in range(300)]
    assert seen and all(isinstance(w, pa.NativeFile) for w in seen)
    cdir = os.path.join(d, "hot", "conversation_cool")
    names = [n for n in os.listdir(cdir) if n.endswith(".parquet")]
    assert names
    for n in names:
        assert os.stat(os.path.join(cdir, n)).st_mode & 0o777 == 0o600


_TEXT = st.text(st.sampled_from("aAzZsSß\u1e9e\u017fkK\u212a\u03a3\u03c3\u03c2\u0130\u0131iI\u0307\ufb00\ufb03"
                                "\u00fc\u00dc\u041c\u043e\u0441\u91cf\u5b50\U0001f680 xyz0@[`{"), max_size=60)


def _model(raw, block, nbits):
    """The filters fold_block_grams makes, from str.casefold: each block's
    bit of every trigram of each row's casefold (ASCII letters lowered),
    every bit for a block holding a row that does not decode."""
    lg = nbits.bit_length() - 1
    words = []
    for b in range(0, len(raw), block):
        bits = 0
        for r in raw[b:b + block]:
            try:
                f = r.decode("utf-8").casefold().encode("utf-8")
            except UnicodeDecodeError:
                bits = (1 << nbits) - 1
                break
            f = bytes(c | 0x20 if 0x41 <= c <= 0x5A else c for c in f)
            for j in range(2, len(f)):
                x = (f[j - 2] << 16) | (f[j - 1] << 8) | f[j]
                bits |= 1 << (((x * 2654435761) & 0xFFFFFFFF) >> (32 - lg))
        words.append(bits.to_bytes(nbits // 8, "little"))
    return b"".join(words)


@settings(max_examples=200, deadline=None)
@given(st.lists(_TEXT, min_size=1, max_size=40), st.integers(1, 9), st.sampled_from([4096, 8192, 16384]),
       st.lists(st.integers(0, 39), max_size=3))
def test_folded_filters_are_the_casefolds_trigrams(texts, block, nbits, broken):
    raw = [t.encode("utf-8") for t in texts]
    for i in broken:
        if i < len(raw):
            raw[i] = raw[i] + b"\xc3"       # (cut inside a code point: does not decode)
    offs = np.cumsum([0] + [len(r) for r in raw]).astype(np.int32)
    assert fold_block_grams(b"".join(raw), offs, block, nbits) == _model(raw, block, nbits)


def test_filters_fold_on_a_thread_of_their_own_and_its_error_is_raised(tmp_path, monkeypatch):
    """compact()'s filters are folded beside the row groups' writes, on a
    thread of their own (on the writer's, they made it the longer of the
    two threads); an error there is raised by the compaction, which cools
    nothing then."""
    from rune_fast.cool import grams
    names = []
    add = grams.GramFile.add

    def spy(self, content):
        names.append(threading.current_thread().name)
        return add(self, content)

    monkeypatch.setattr(grams.GramFile, "add", spy)
    msgs = [ConversationMessageRecord(content=f"m{i}", channel_id="c") for i in range(300)]
    with ConversationStateRepository(str(tmp_path / "a"), hot_window=8, compact_every=10**9) as repo:
        repo.append_many(msgs)
        assert repo.compact().cooled == 292
    assert names and set(names) == {"rune-fast-filters"}

    def boom(self, content):
        raise RuntimeError("filters: boom")

    monkeypatch.setattr(grams.GramFile, "add", boom)
    with ConversationStateRepository(str(tmp_path / "b"), hot_window=8, compact_every=10**9) as repo:
        repo.append_many(msgs)
        with pytest.raises(RuntimeError, match="filters: boom"):
            repo.compact()
        assert [r.content for r in repo.window("c", 300)] == [f"m{i}" for i in range(300)]
    cdir = tmp_path / "b" / "hot" / "conversation_cool"
    assert not cdir.exists() or not [n for n in os.listdir(cdir) if n.endswith(".parquet")]
