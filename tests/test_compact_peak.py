"""What the compact() after a bulk load holds while it cools (the top of the
load's resident memory was the end of its last file): the excess and its
file order as int64 arrays, not lists of ints, put in file order a batch of
task postings at a time; a file's adoption kept as each channel's newest
stamp only, its ids read from the lines (not its id, channel and stamp
strings); the file's index built with its key parts let go, its sidecar
written without a copy of the whole, its search filters written to their
temp file as they are made -- the same bytes on disk."""
from __future__ import annotations

import os
import struct

import numpy as np
import pyarrow as pa
import xxhash

from rune_fast._conv import cooling
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.cool import grams
from rune_fast.cool.sidecar import _IDX_MAGIC, _FileIndex, _KeyParts, _index_of_keys

from test_compact_files import CHANNELS, _append, check_reads, small_files  # noqa: F401


def _stamp(i: int) -> str:
    return f"{1000 + i:015d}-0000000000-dev"


def test_the_excess_and_its_file_order_are_int64_arrays(tmp_path, small_files, monkeypatch):  # noqa: F811
    seen: dict[str, list] = {"excess": [], "order": []}
    real_excess, real_order = cooling.Cooling._excess, cooling.Cooling._in_file_order

    def excess(self, full):
        out = real_excess(self, full)
        seen["excess"].append(out)
        return out

    def in_file_order(self, excess, limit=None):
        out = real_order(self, excess, limit)
        seen["order"].append((excess, out))
        return out
    monkeypatch.setattr(cooling.Cooling, "_excess", excess)
    monkeypatch.setattr(cooling.Cooling, "_in_file_order", in_file_order)
    stored: dict = {}
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=3) as repo:
        _append(repo, stored, range(120), _stamp)
        rep = repo.compact()
        assert rep.cooled == 120 - 3 * len(CHANNELS)
        for got in seen["excess"]:
            assert isinstance(got, np.ndarray) and got.dtype == np.int64
        (given, order), = seen["order"]
        assert isinstance(order, np.ndarray) and order.dtype == np.int64
        assert sorted(order.tolist()) == sorted(given.tolist())       # (the same locations, reordered)
        check_reads(repo, stored)
        # nothing beyond the window: an empty excess, still an array
        assert len(repo._excess(True)) == 0 and repo._excess(True).dtype == np.int64
        assert repo.verify().ok


def test_an_inline_files_adoption_keeps_each_channels_newest_stamp_only(tmp_path, small_files,  # noqa: F811
                                                                         monkeypatch):
    # (no table, not even its ids: the hot index drops them by their
    # locations and the hashes of their ids read from the lines cooled,
    # HotIndex.remove_located, 8 bytes a row)
    adopted: list[tuple[object, dict]] = []
    real = cooling.Cooling._cooled

    def cooled(self, locs, hashes, *, staged=None, maxima=None):
        adopted.append((None if staged is None and hashes.dtype == np.uint64 and len(hashes) == len(locs)
                        else "?", dict(maxima or {})))
        return real(self, locs, hashes, staged=staged, maxima=maxima)
    monkeypatch.setattr(cooling.Cooling, "_cooled", cooled)
    stored: dict = {}
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=3) as repo:
        # stamped, unstamped every 4th; newest stamps not in append order
        _append(repo, stored, range(160), lambda i: "" if i % 4 == 3 else _stamp((i * 37) % 160))
        repo.compact()
        assert adopted and all(cols is None for cols, _m in adopted)
        hot = {r.msg_id for ch in CHANNELS for r in repo.window(ch, 3)}
        for ch in CHANNELS:
            cool = [m for m in stored.values() if m.channel_id == ch and m.msg_id not in hot and m.hlc]
            assert repo._cool_max[ch] == max((m.hlc, m.msg_id) for m in cool)
        merged: dict = {}
        for _cols, maxima in adopted:
            for ch, stamp in maxima.items():
                merged[ch] = max(stamp, merged.get(ch, stamp))
        assert merged == repo._cool_max
        assert len(repo) == len(stored)
        for mid, m in stored.items():
            assert repo.get_message(mid).record == m
        for ch in CHANNELS:
            assert sorted(r.msg_id for r in repo.window(ch, 10_000)) == \
                sorted(mid for mid, m in stored.items() if m.channel_id == ch)
        assert repo.verify().ok


def _keys(parts: list[tuple[list[str], list[str], list[str]]]) -> _KeyParts:
    keys = _KeyParts()
    for ids, chans, tasks in parts:
        keys.add(pa.array(ids), pa.array(chans), pa.array(tasks))
    return keys


def _old_encode(fi: _FileIndex) -> bytes:
    """The sidecar's bytes as the format lays them out (the join of each piece)."""
    import json
    names = list(fi.tasks)
    rows = [fi.tasks[t] for t in names]
    offs = np.cumsum([0] + [len(r) for r in rows]).tolist()
    tb = json.dumps([[t, offs[i], offs[i + 1]] for i, t in enumerate(names)],
                    ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    hb_end = 28 + struct.unpack_from("<I", fi.encode(), 24)[0]
    hb = bytes(fi.encode()[28:hb_end])      # (the header as encode() writes it: not what is tested)
    tb += b" " * (-len(tb) % 8)
    all_rows = (np.concatenate(rows) if rows else np.zeros(0, np.uint32)).astype("<u4")
    body = b"".join([struct.pack("<I", len(hb)), hb, tb, fi.hashes.astype("<u8").tobytes(),
                     fi.hrows.astype("<u4").tobytes(), b"\0" * (4 if fi.rows % 2 else 0),
                     all_rows.tobytes(), b"\0" * (4 if len(all_rows) % 2 else 0)]
                    + ([] if fi.pagedir is None else [fi.pagedir[0].astype("<i8").tobytes(),
                                                      fi.pagedir[1].astype("<i8").tobytes()]))
    return _IDX_MAGIC + xxhash.xxh3_128_digest(body) + body


def test_a_files_index_lets_its_key_parts_go_and_its_sidecar_is_the_same_bytes():
    parts = []
    n = 0
    for size, ch in ((7, "a"), (300, "a"), (5, "b"), (1, "c"), (250, "d")):
        parts.append(([f"id{(n + i) * 7919 % 1013:05d}-{n + i}" for i in range(size)], [ch] * size,
                      ["" if (n + i) % 3 == 0 else f"t{(n + i) % 5}" for i in range(size)]))
        n += size
    keys = _keys(parts)
    fi = _index_of_keys(3, 999, "f" * 16, keys, [200, 363], "/nowhere")
    assert keys._hashes == [] and keys._codes == []         # (let go: not held beside the index)
    ref = _keys(parts)
    hashes = ref.hashes()
    order = np.argsort(hashes, kind="stable")
    assert fi.rows == n and fi.hashes.tolist() == hashes[order].tolist()
    assert fi.hrows.dtype == np.uint32 and fi.hrows.tolist() == order.tolist()
    tasks = [t for p in parts for t in p[2]]
    for t in {t for t in tasks if t}:
        assert fi.tasks[t].dtype == np.uint32
        assert fi.tasks[t].tolist() == [i for i, x in enumerate(tasks) if x == t]
    chans = [c for p in parts for c in p[1]]
    for ch, (a, b, latest) in fi.channels.items():
        rows = [i for i, c in enumerate(chans) if c == ch]
        assert (a, b) == (rows[0], rows[-1] + 1)
        assert latest == max([i for i in rows if tasks[i]], default=-1)
    for pagedir in (None, (np.arange(4, dtype=np.int64), np.arange(9, dtype=np.int64))):
        fi.pagedir = pagedir
        got = fi.encode()
        assert bytes(got) == _old_encode(fi)
        # (written as pieces: the arrays' own bytes, no buffer of the whole)
        pieces = fi.pieces()
        assert b"".join(pieces) == bytes(got)
        assert any(np.shares_memory(np.frombuffer(p, dtype=np.uint8), fi.hashes) for p in pieces[1:])
    fi.pagedir = None
    back = _FileIndex.decode(bytes(fi.encode()), 3, "/nowhere")
    assert back.hashes.tolist() == fi.hashes.tolist() and back.hrows.tolist() == fi.hrows.tolist()
    assert {t: r.tolist() for t, r in back.tasks.items()} == {t: r.tolist() for t, r in fi.tasks.items()}


def test_filters_go_to_their_temp_file_as_they_are_made(tmp_path, caplog):
    col = pa.array([f"row {i} about zürich and topic{i % 11}" * (1 + i % 4) for i in range(9000)])
    ref = grams.GramSink()
    tmp, path = str(tmp_path / ".f.grams.tmp"), str(tmp_path / "f.grams")
    f = grams.GramFile(tmp)
    for x in range(0, len(col), 1234):
        ref.add(col.slice(x, 1234))
        f.add(col.slice(x, 1234))
        # (nothing held but the carried rows' block: the filters are on disk)
        assert f._parts == [] and os.path.getsize(tmp) == grams.HEAD.size + (x + 1234) // 32 * 1024 \
            or x + 1234 > len(col)
    assert f.keep(path, 777, "0123456789abcdef", len(col))
    assert not os.path.exists(tmp)
    with open(path, "rb") as fh:
        data = fh.read()
    assert data == grams.encode(777, "0123456789abcdef", len(col), ref.finish())
    assert len(grams.check(data, 777, "0123456789abcdef", len(col))) == grams.blocks_for(len(col)) * grams.BLOCK_BYTES
    # too few rows for the filters made: ValueError, nothing kept
    g = grams.GramFile(tmp)
    g.add(col.slice(0, 100))
    try:
        g.keep(str(tmp_path / "g.grams"), 1, "0123456789abcdef", 5000)
        raise AssertionError("kept")
    except ValueError:
        pass
    assert not os.path.exists(tmp) and not os.path.exists(tmp_path / "g.grams")
    # a temp that cannot be written: a warning naming it, nothing kept
    h = grams.GramFile(str(tmp_path / "no-such-folder" / ".h.grams.tmp"))
    h.add(col.slice(0, 100))
    assert not h.keep(str(tmp_path / "h.grams"), 1, "0123456789abcdef", 100)
    assert "no-such-folder" in caplog.text and not os.path.exists(tmp_path / "h.grams")


def test_task_ranks_are_the_task_postings_looked_up_in_the_run(tmp_path):
    """HotIndex.task_ranks (the compiled pass cooling orders a run by task
    with) gives each location of the run 1 + the position of the task whose
    postings hold it, 0 for none: the same as looking each task's
    task_locs up in the run, for tasks the index does not know too."""
    stored: dict = {}
    with ConversationStateRepository(tmp_path, compact_every=10**6, hot_window=1000) as repo:
        _append(repo, stored, range(300), _stamp)
        index = repo._index
        every = np.sort(np.concatenate([index.channel_locs(ch) for ch in index.channels()]))
        known = sorted(index.task_keys())
        assert len(known) == 9
        with_unknown = [known[0], b"another-unknown"] + known[1:] + [b"no-such-task"]
        for keys in (with_unknown, known[1:]):      # (known[1:]: the first task's locations get 0)
            for run in (every, every[::3], every[:1], every[:0]):
                want = np.zeros(len(run), dtype=np.int32)
                for r, k in enumerate(keys, 1):
                    posted = index.task_locs(k)
                    at = np.searchsorted(run, posted)
                    inside = at < len(run)
                    want[at[inside][run[at[inside]] == posted[inside]]] = r
                got = index.task_ranks(run, keys)
                assert got.dtype == np.int32 and got.tolist() == want.tolist()
        some = index.task_ranks(every, known[1:])
        assert (some > 0).any() and (some == 0).any()


