"""Damage on disk gets the behaviour SPEC section 5 names.

- a final line cut short (a crash mid-append): the store opens, warns, logs,
  keeps the bytes in a quarantine file and reports it in ``stats()``;
- zero bytes after the last complete line (preallocation): opens silently,
  nothing lost;
- a flipped byte in a complete line: ``CorruptStateCheckpointError`` naming
  the file and offset, from open or from the first read that would return the
  record (``SOURCE_CORRUPT`` from an exact read), and reported by ``verify()``;
- a damaged checkpoint (manifest, task checkpoint): ``CorruptStateCheckpointError``;
- a damaged or missing Parquet archive: ``CorruptStateCheckpointError`` from
  reads (or open), a problem in ``verify()``, never a wrong or missing-but-
  "not found" record;
- the same rules for ``events.jsonl`` and the task ledger.

Files are found by listing ``state_dir``: the helpers locate the line that holds
a given message id rather than trusting file names.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
import warnings

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str, filename: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, filename))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


cw = _load("rune_crash_writer", "crash_writer.py")

BIG = 1 << 20
GEN = 50          # generation number of the ids these tests append
# Warnings that are not recovery reports (garbage collection, deprecations).
IGNORED_WARNINGS = (ResourceWarning, DeprecationWarning, PendingDeprecationWarning)


# --------------------------------------------------------------------- helpers

def ids(n: int, start: int = 0) -> list[str]:
    return [cw.msg_id(GEN, 0, i) for i in range(start, start + n)]


def open_conv(state, **kw):
    """Open with every warning recorded (pytest turns warnings into errors)."""
    from rune_fast.conversation_state import ConversationStateRepository
    kw.setdefault("compact_every", 100_000)
    kw.setdefault("hot_window", 512)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        repo = ConversationStateRepository(state, **kw)
    return repo, [str(w.message) for w in caught if not issubclass(w.category, IGNORED_WARNINGS)]


def open_tasks(state):
    TaskStateRepository = cw.task_repository_class()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        repo = TaskStateRepository(state)
    return repo, [str(w.message) for w in caught if not issubclass(w.category, IGNORED_WARNINGS)]


def _fill(repo, mids: list[str], compact: bool) -> None:
    n = len(mids)
    for mid in mids[: n // 2]:
        assert repo.append(cw.make_message(mid))
    assert repo.append_many([cw.make_message(m) for m in mids[n // 2: -1]]) == len(mids[n // 2: -1])
    assert repo.append(cw.make_message(mids[-1]))
    if compact:
        repo.compact()


def build(state, n: int = 12, *, compact: bool = False, crash: bool = False, **kw) -> list[str]:
    """A store holding ``n`` messages; closed cleanly, or (``crash``) left as a
    writer process that died without ``close()`` leaves it."""
    mids = ids(n)
    if crash:
        kw.setdefault("compact_every", 100_000)
        kw.setdefault("hot_window", 512)
        run_child(f"""
from rune_fast.conversation_state import ConversationStateRepository
repo = ConversationStateRepository({state!r}, **{kw!r})
_fill(repo, {mids!r}, {compact!r})
""")
        return mids
    repo, warns = open_conv(state, **kw)
    assert not warns
    try:
        _fill(repo, mids, compact)
    finally:
        repo.close()
    return mids


def run_child(body: str) -> None:
    """Run ``body`` in a fresh interpreter that then dies without cleanup
    (``os._exit``): no close(), no atexit; the lock goes with the process.
    ``cw`` and ``_fill`` are defined there."""
    import inspect
    import subprocess
    import textwrap
    root = os.path.dirname(HERE)
    code = "\n".join([
        "import importlib.util, os, sys",
        f"sys.path.insert(0, {root!r})",
        f"spec = importlib.util.spec_from_file_location('rune_crash_writer', {cw.__file__!r})",
        "cw = importlib.util.module_from_spec(spec)",
        "sys.modules['rune_crash_writer'] = cw",
        "spec.loader.exec_module(cw)",
        inspect.getsource(_fill),
        textwrap.dedent(body),
        "os._exit(0)",
        "",
    ])
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"child failed ({res.returncode}):\n{res.stderr[-3000:]}"


def files_under(state: str, *, ext: str = "", exclude_quarantine: bool = True) -> list[str]:
    out = []
    for p in cw.all_files(state):
        if exclude_quarantine and "quarantin" in os.path.relpath(p, state).lower():
            continue
        if p.endswith(ext):
            out.append(p)
    return out


def hot_logs(state: str) -> list[str]:
    """Every .jsonl log under hot/ (tail, sealed segments, ...)."""
    return [p for p in files_under(os.path.join(state, "hot"), ext=".jsonl")]


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def logical_end(data: bytes) -> int:
    """End of the bytes that are not trailing zero padding."""
    return len(data.rstrip(b"\0"))


def line_of(state: str, mid: str, *, message: bool = True) -> tuple[str, int, int]:
    """``(path, start, end)`` of the complete line under hot/ holding message
    ``mid`` (``message=False``: a line naming ``mid`` without its content, a
    tombstone); ``end`` is the offset of its newline."""
    needle = f'"{mid}"'.encode()
    marker = f"<<{mid}>>".encode()
    found = []
    for path in hot_logs(state):
        with open(path, "rb") as f:
            data = f.read()
        pos = data.find(needle)
        while pos >= 0:
            start = data.rfind(b"\n", 0, pos) + 1
            end = data.find(b"\n", pos)
            if end > 0 and (marker in data[start:end]) == message and (path, start, end) not in found:
                found.append((path, start, end))
            pos = data.find(needle, pos + 1)
    assert len(found) == 1, f"expected one {'message' if message else 'tombstone'} line for {mid} " \
                            f"under hot/, found {found}"
    return found[0]


def tail_path(state: str, newest_mid: str) -> str:
    """The open tail: the hot/ log holding the newest message."""
    return line_of(state, newest_mid)[0]


def flip(path: str, pos: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))


def quarantine_count(stats) -> int:
    n = 0
    if not isinstance(stats, dict):
        return 0
    for k, v in stats.items():
        if "quarantin" in str(k).lower():
            if isinstance(v, bool):
                n += int(v)
            elif isinstance(v, int):
                n += v
            elif isinstance(v, (list, tuple, dict, set)):
                n += len(v)
            elif v:
                n += 1
        elif isinstance(v, dict):
            n += quarantine_count(v)
    return n


def file_containing(state: str, data: bytes, exclude: str) -> list[str]:
    out = []
    for p in cw.all_files(state):
        if os.path.abspath(p) == os.path.abspath(exclude):
            continue
        with open(p, "rb") as f:
            if data in f.read():
                out.append(p)
    return out


def verify_report(repo):
    rep = repo.verify()
    ok = rep.ok if hasattr(rep, "ok") else rep["ok"]
    probs = rep.problems if hasattr(rep, "problems") else rep["problems"]
    return ok, [str(p) if not isinstance(p, dict) else repr(p) for p in probs]


def assert_names(err, path: str, lo: int | None = None, hi: int | None = None) -> None:
    """The error names the file (and, with lo/hi, an offset in [lo, hi])."""
    base = os.path.basename(path)
    where = f"{getattr(err, 'path', None)} {err}"
    assert base in where, f"{type(err).__name__} does not name {base}: {err}"
    if lo is not None:
        off = getattr(err, "offset", None)
        assert off is not None and lo <= off <= hi, \
            f"{type(err).__name__} offset {off} is not the damaged line's [{lo}, {hi}]: {err}"


def assert_refused(state: str, path: str, lo: int | None = None, hi: int | None = None):
    """A viewer's open and a writer's both raise CorruptStateCheckpointError
    naming ``path`` (and an offset in [lo, hi]), and change no file; returns
    the writer's error."""
    from rune_fast.conversation_state import CorruptStateCheckpointError
    before = cw.tree_digest(state)
    for read_only in (True, False):
        with pytest.raises(CorruptStateCheckpointError) as ei:
            open_conv(state, read_only=read_only)
        assert_names(ei.value, path, lo, hi)
    assert cw.tree_digest(state) == before, "a refused open changed files"
    return ei.value


def assert_all_present(repo, mids) -> None:
    from rune_fast.conversation_state import ReadStatus
    for mid in mids:
        rd = repo.get_message(mid)
        assert rd.status == ReadStatus.FOUND_VERIFIED, f"{mid}: {rd.status}"
        assert rd.record == cw.make_message(mid), mid
    got = []
    for ch in cw.CHANNELS:
        got += [r.msg_id for r in repo.window(ch, BIG)]
    assert sorted(got) == sorted(mids)
    assert len(repo) == len(mids)


# ------------------------------------------------------------ torn final lines

@pytest.mark.parametrize("how", ["truncate", "zero-rest", "partial-newline-missing"])
def test_torn_final_tail_line_is_quarantined(tmp_path, caplog, how):
    from rune_fast.conversation_state import ReadStatus
    state = str(tmp_path / "s")
    mids = build(state, crash=True)
    path, start, end = line_of(state, mids[-1])
    with open(path, "rb") as f:
        data = f.read()
    assert logical_end(data) == end + 1, "the newest message is not the tail's last line"
    cut = start + (end - start) // 2
    if how == "zero-rest":
        cut = start + 40     # inside the record body
    if how == "partial-newline-missing":
        cut = end            # everything but the newline
    torn = data[start:cut]
    if how == "zero-rest":
        with open(path, "r+b") as f:
            f.seek(cut)
            f.write(b"\0" * (end + 1 - cut))
    else:
        os.truncate(path, cut)
    with caplog.at_level(logging.WARNING):
        repo, warns = open_conv(state)
    try:
        assert warns, "a torn final line must be reported with a warnings warning"
        assert any(r.levelno >= logging.WARNING for r in caplog.records), \
            "a torn final line must be reported with a log record"
        assert quarantine_count(repo.stats()) >= 1, f"stats() does not report it: {repo.stats()}"
        holders = file_containing(state, torn, exclude=path)
        assert holders, "no quarantine file holds the torn line's bytes"
        assert_all_present(repo, mids[:-1])
        assert repo.get_message(mids[-1]).status == ReadStatus.NOT_FOUND_CONFIRMED
        ok, probs = verify_report(repo)
        assert ok, probs
        # The torn append was never acknowledged: appending it again stores it.
        assert repo.append(cw.make_message(mids[-1])) is True
        extra = ids(1, start=100)[0]
        assert repo.append(cw.make_message(extra)) is True
    finally:
        repo.close()
    repo, warns = open_conv(state)
    try:
        assert not warns, f"the second reopen warned again: {warns}"
        assert_all_present(repo, mids + [extra])
        assert verify_report(repo)[0]
    finally:
        repo.close()
    assert file_containing(state, torn, exclude=path), "the quarantine file was removed"


def test_read_only_open_skips_torn_line_and_changes_nothing(tmp_path):
    """Beside a writer, an incomplete final line is the writer's append in
    flight: a read-only open skips it, quarantines nothing, writes nothing."""
    from rune_fast.conversation_state import ReadStatus
    state = str(tmp_path / "s")
    mids = build(state, crash=True)
    path, start, end = line_of(state, mids[-1])
    os.truncate(path, start + (end - start) // 2)
    before = cw.tree_digest(state)
    repo, warns = open_conv(state, read_only=True)
    try:
        assert not warns, f"read-only open warned: {warns}"
        for mid in mids[:-1]:
            rd = repo.get_message(mid)
            assert rd.status == ReadStatus.FOUND_VERIFIED and rd.record == cw.make_message(mid)
        assert repo.get_message(mids[-1]).status == ReadStatus.NOT_FOUND_CONFIRMED
    finally:
        repo.close()
    assert cw.tree_digest(state) == before, "a read-only open changed files"


@pytest.mark.parametrize("nzeros", [1, 7, 4096, 1 << 20])
def test_zero_bytes_after_last_line_are_not_damage(tmp_path, nzeros):
    state = str(tmp_path / "s")
    mids = build(state)
    path = tail_path(state, mids[-1])
    with open(path, "ab") as f:
        f.write(b"\0" * nzeros)
    repo, warns = open_conv(state)
    try:
        assert not warns, f"zero padding warned: {warns}"
        assert quarantine_count(repo.stats()) == 0, repo.stats()
        assert_all_present(repo, mids)
        assert verify_report(repo)[0]
        more = ids(3, start=200)
        assert repo.append_many([cw.make_message(m) for m in more]) == 3
    finally:
        repo.close()
    repo, warns = open_conv(state)
    try:
        assert not warns
        assert_all_present(repo, mids + more)
    finally:
        repo.close()


@pytest.mark.parametrize("how", ["zero-tail", "zero-last-two", "cut-last-two", "cut-all"])
@pytest.mark.parametrize("durability", ["fsync", "none"])
def test_tail_that_lost_lines_its_snapshot_vouches_for_is_loud(tmp_path, how, durability):
    """After a clean close the index snapshot vouches for every tail line (it
    is written after the tail is synced). Only the final line may then be
    found cut short (read as a torn append, as a crash leaves it); a tail that
    lost more -- zeroed or cut off past its final line, which no crash does
    to synced bytes -- raises CorruptStateCheckpointError naming the tail,
    from a writer's open and a viewer's: never an open with messages missing
    and nothing said."""
    state = str(tmp_path / "s")
    mids = build(state, durability=durability)
    path, start, end = line_of(state, mids[-1])
    _p, prev_start, _e = line_of(state, mids[-2])
    data = read_bytes(path)
    if how == "zero-tail":
        cut, new = None, bytes(len(data))
    elif how == "zero-last-two":
        cut, new = None, data[:prev_start + 3] + bytes(end + 1 - prev_start - 3) + data[end + 1:]
    else:
        cut, new = (prev_start + 5 if how == "cut-last-two" else 0), None
    with open(path, "r+b") as f:
        if new is not None:
            f.write(new)
        else:
            f.truncate(cut)
    err = assert_refused(state, path, 0, end)
    assert "snapshot" in str(err)


def test_snapshot_never_covers_unsynced_tail_bytes(tmp_path, monkeypatch):
    """With durability='none' appends are not synced, but the index snapshot a
    compaction writes vouches only for tail bytes synced before it."""
    from rune_fast import segments
    from rune_fast._index import HotIndex
    state = str(tmp_path / "s")
    synced: list[int] = []
    real_sync = segments.TailFile.sync

    def sync(self):
        real_sync(self)
        synced.append(self.size)
    monkeypatch.setattr(segments.TailFile, "sync", sync)
    repo, _w = open_conv(state, durability="none")
    try:
        mids = ids(4200, start=1000)
        assert repo.append_many([cw.make_message(m) for m in mids]) == len(mids)
        assert not synced
        assert repo.compact().snapshot_written
        snap = [f for f in files_under(state, exclude_quarantine=True) if f.endswith(".snap")]
        assert len(snap) == 1
        _idx, covered = HotIndex.load_snapshot(snap[0])
        tail_seg = covered[-1]
        assert synced and covered[tail_seg] <= max(synced)
    finally:
        repo.close()


# ------------------------------------------------------- flipped bytes in lines

def _value_at(line: bytes, key: str) -> int:
    """Offset of the first byte of the string value of ``key`` in a JSON line."""
    m = re.search(b'"' + key.encode() + rb'"\s*:\s*"', line)
    assert m, f"no {key!r} in {line[:120]!r}"
    return m.end()


def _flip_target(line: bytes, mid: str, field: str) -> int:
    """Offset within ``line`` of the byte to flip for ``field``."""
    if field == "checksum":
        return 10                                    # inside the 16 hex digits
    if field == "content":
        return line.index(f"<<{mid}>>".encode()) + 6
    if field == "msg_id":
        return line.index(f'"{mid}"'.encode()) + 7
    if field == "channel_id":
        return _value_at(line, "channel_id") + 3
    raise AssertionError(field)


@pytest.mark.parametrize("field", ["content", "msg_id", "channel_id", "checksum"])
@pytest.mark.parametrize("tier", ["tail", "hot"])
def test_flipped_byte_in_complete_line_is_loud(tmp_path, tier, field):
    from rune_fast.conversation_state import ReadStatus
    from rune_fast.errors import CorruptStateCheckpointError
    state = str(tmp_path / "s")
    mids = build(state, compact=(tier == "hot"), crash=True)
    target = mids[5]
    repo, _ = open_conv(state, read_only=True)
    try:
        assert repo.get_message(target).tier == tier
    finally:
        repo.close()
    path, start, end = line_of(state, target)
    with open(path, "rb") as f:
        f.seek(start)
        line = f.read(end - start)
    pos = start + _flip_target(line, target, field)
    flip(path, pos)
    try:
        repo, warns = open_conv(state)
    except CorruptStateCheckpointError as err:
        assert_names(err, path, start, pos)
        return
    try:
        assert not warns, f"a damaged complete line is not a tear: {warns}"
        rd = repo.get_message(target)
        assert rd.status == ReadStatus.SOURCE_CORRUPT, \
            f"exact read of the damaged record: {rd.status} (tier {rd.tier})"
        assert rd.record is None
        ch = cw.make_fields(target)["channel_id"]
        with pytest.raises(CorruptStateCheckpointError) as ei:
            repo.window(ch, BIG)
        assert_names(ei.value, path)
        with pytest.raises(CorruptStateCheckpointError):
            repo.search("")
        task = cw.make_fields(target)["task_id"]
        if task:
            with pytest.raises(CorruptStateCheckpointError):
                repo.messages_for_task(task)
        # Other records are still served, and only as they were written.
        for mid in mids:
            if mid == target:
                continue
            other = repo.get_message(mid)
            assert other.status == ReadStatus.FOUND_VERIFIED and other.record == cw.make_message(mid)
        ok, probs = verify_report(repo)
        assert not ok, "verify() passed a store with a flipped byte"
        assert any(os.path.basename(path) in p for p in probs), probs
        assert any(str(start) in p for p in probs), f"no problem names offset {start}: {probs}"
    finally:
        repo.close()


def test_flipped_byte_in_tombstone_is_loud(tmp_path):
    """A deletion's record is what decides that a read returns nothing: a
    flipped byte in it must not silently bring the message back."""
    from rune_fast.conversation_state import ReadStatus
    from rune_fast.errors import CorruptStateCheckpointError
    state = str(tmp_path / "s")
    mids = build(state)
    repo, _ = open_conv(state)
    try:
        assert repo.delete(mids[3])
    finally:
        repo.close()
    path, start, end = line_of(state, mids[3], message=False)
    with open(path, "rb") as f:
        f.seek(start)
        line = f.read(end - start)
    pos = start + line.index(mids[3].encode()) + 6
    flip(path, pos)
    try:
        repo, _ = open_conv(state)
    except CorruptStateCheckpointError as err:
        assert_names(err, path, start, pos)
        return
    try:
        rd = repo.get_message(mids[3])
        assert rd.status != ReadStatus.FOUND_VERIFIED, "a damaged tombstone brought the message back"
        ok, probs = verify_report(repo)
        assert not ok and any(os.path.basename(path) in p for p in probs), probs
    finally:
        repo.close()


# ----------------------------------------------------------------- checkpoints

def _damage(path: str, how: str) -> None:
    with open(path, "rb") as f:
        data = f.read()
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "flip":
        mid = len(data) // 2
        data = data[:mid] + bytes([data[mid] ^ 0x01]) + data[mid + 1:]
    elif how == "digit":
        # change one digit of a number: still valid JSON, wrong value
        cands = [i for i in range(len(data) // 3, len(data)) if data[i:i + 1].isdigit()
                 and data[i - 1:i] in (b":", b" ", b",", b"[")]
        cands = cands or [i for i in range(1, len(data)) if data[i:i + 1].isdigit()
                          and data[i - 1:i] in (b":", b" ", b",", b"[")]
        assert cands, f"no number in {data[:200]!r}"
        i = cands[0]
        data = data[:i] + (b"7" if data[i:i + 1] != b"7" else b"3") + data[i + 1:]
    elif how == "garbage":
        data = b"{not json" + b"\x00\xff" * 10
    elif how == "empty":
        data = b""
    else:
        raise AssertionError(how)
    with open(path, "wb") as f:
        f.write(data)


def manifest_path(state: str) -> str:
    found = [p for p in files_under(os.path.join(state, "hot"), ext=".json")
             if "manifest" in os.path.basename(p)]
    assert len(found) == 1, f"expected one manifest under hot/: {cw.all_files(state)}"
    return found[0]


@pytest.mark.parametrize("how", ["truncate", "flip", "digit", "garbage", "empty"])
def test_damaged_manifest_raises(tmp_path, how):
    from rune_fast.errors import CorruptStateCheckpointError
    state = str(tmp_path / "s")
    build(state, 30, compact=True, hot_window=4)
    path = manifest_path(state)
    _damage(path, how)
    with pytest.raises(CorruptStateCheckpointError) as ei:
        repo, _ = open_conv(state)
        repo.close()
    assert_names(ei.value, path)


def _task_checkpoint(state: str) -> str:
    found = [p for p in files_under(os.path.join(state, "hot"), ext=".json") if "task" in os.path.basename(p)]
    assert len(found) == 1, f"expected one task checkpoint under hot/: {cw.all_files(state)}"
    return found[0]


def _build_tasks(state: str, n: int = 6) -> list[dict]:
    repo, warns = open_tasks(state)
    assert not warns
    out = []
    try:
        for i in range(n):
            t = repo.create(f"task {i}", cw.TASK_CHANNELS[i % 3])
            if i % 2:
                t = repo.transition(t.task_id, "running")
            out.append(t.to_dict())
    finally:
        repo.close()
    return out


@pytest.mark.parametrize("how", ["truncate", "flip", "digit", "garbage"])
def test_damaged_task_checkpoint_raises(tmp_path, how):
    from rune_fast.errors import CorruptStateCheckpointError
    state = str(tmp_path / "s")
    _build_tasks(state)
    path = _task_checkpoint(state)
    _damage(path, how)
    with pytest.raises(CorruptStateCheckpointError) as ei:
        repo, _ = open_tasks(state)
        repo.close()
    assert_names(ei.value, path)


def test_damaged_task_log_line_raises(tmp_path):
    """A task change in the ledger's log (a writer that died before any
    checkpoint folded it) with a flipped byte: loud, with file and offset."""
    from rune_fast.errors import CorruptStateCheckpointError
    state = str(tmp_path / "s")
    run_child(f"""
repo = cw.task_repository_class()({state!r})
t = repo.create("first", "tch-1")
repo.amend(t.task_id, "second title")
repo.transition(t.task_id, "running")
""")
    logs = [p for p in files_under(os.path.join(state, "hot"), ext=".jsonl")
            if b"second title" in read_bytes(p)]
    assert len(logs) == 1, f"expected the change in one task log under hot/: {cw.all_files(state)}"
    path = logs[0]
    with open(path, "rb") as f:
        data = f.read()
    pos = data.index(b"second title") + 3
    start = data.rfind(b"\n", 0, pos) + 1
    flip(path, pos)
    with pytest.raises(CorruptStateCheckpointError) as ei:
        repo, _ = open_tasks(state)
        repo.close()
    assert_names(ei.value, path, start, pos)


def test_torn_task_log_line_is_quarantined(tmp_path):
    state = str(tmp_path / "s")
    run_child(f"""
repo = cw.task_repository_class()({state!r})
t = repo.create("first", "tch-1")
print(t.task_id)
repo.amend(t.task_id, "second title")
repo.transition(t.task_id, "running")
""")
    logs = [p for p in files_under(os.path.join(state, "hot"), ext=".jsonl")
            if b"second title" in read_bytes(p)]
    assert len(logs) == 1, cw.all_files(state)
    path = logs[0]
    data, start, end = _last_line(path)
    assert b'"running"' in data[start:end], "the transition is not the task log's last line"
    cut = start + (end - start) // 2
    os.truncate(path, cut)
    repo, warns = open_tasks(state)
    try:
        assert warns, "a torn task log line must be reported with a warning"
        assert quarantine_count(repo.stats()) >= 1, repo.stats()
        assert file_containing(state, data[start:cut], exclude=path)
        tasks = repo.list_open("tch-1")
        assert len(tasks) == 1 and tasks[0].title == "second title" and tasks[0].status == "created"
    finally:
        repo.close()
    repo, warns = open_tasks(state)
    try:
        assert not warns
        assert repo.list_open("tch-1")[0].title == "second title"
    finally:
        repo.close()


# ---------------------------------------------------------------- cool archives

@pytest.mark.parametrize("how", ["garbage", "truncate", "flip", "missing"])
def test_damaged_cool_archive_is_loud(tmp_path, how):
    from rune_fast.conversation_state import ReadStatus
    from rune_fast.errors import CorruptStateCheckpointError
    state = str(tmp_path / "s")
    mids = ids(40)
    repo, _ = open_conv(state, hot_window=2)
    try:
        _fill(repo, mids, True)
        cooled_then = [m for m in mids if repo.get_message(m).tier == "cool"]
    finally:
        repo.close()
    assert cooled_then, "compact() with hot_window=2 cooled nothing"
    repo, _ = open_conv(state, read_only=True)
    try:
        tiers = {m: repo.get_message(m).tier for m in mids}
    finally:
        repo.close()
    cooled = [m for m in cooled_then if tiers[m] == "cool"]
    assert cooled == cooled_then, (
        f"after a reopen, {len(cooled_then) - len(cooled)} of the {len(cooled_then)} messages compact() "
        f"cooled are no longer read from the archive: tiers {sorted(set(tiers[m] for m in cooled_then))}")
    archives = files_under(state, ext=".parquet")
    assert len(archives) == 1, f"one cooling run should write one archive: {archives}"
    path = archives[0]
    if how == "missing":
        os.unlink(path)
    elif how == "garbage":
        size = os.path.getsize(path)
        with open(path, "wb") as f:
            f.write(bytes((i * 131 + 7) & 0xFF for i in range(size)))
    else:
        _damage(path, how)
    try:
        repo, _ = open_conv(state)
    except CorruptStateCheckpointError as err:
        assert_names(err, path)
        return
    try:
        intact = 0
        for mid in cooled:
            try:
                rd = repo.get_message(mid)
            except CorruptStateCheckpointError as err:
                assert_names(err, path)
                continue
            if rd.status == ReadStatus.FOUND_VERIFIED:
                assert rd.record == cw.make_message(mid), f"{mid} served from a damaged archive, altered"
                intact += 1
            else:
                assert rd.status == ReadStatus.SOURCE_CORRUPT, \
                    f"{mid} in a damaged archive read as {rd.status}: silently lost"
        if how != "flip":
            assert intact == 0, f"{intact} rows served from an unreadable archive"
        damaged_channels = {cw.make_fields(m)["channel_id"] for m in cooled}
        for ch in sorted(damaged_channels):
            try:
                got = repo.window(ch, BIG)
            except CorruptStateCheckpointError as err:
                assert_names(err, path)
            else:
                assert how == "flip", f"window({ch!r}) over an unreadable archive returned {len(got)} records"
                want = [m for m in mids if cw.make_fields(m)["channel_id"] == ch]
                assert [r.msg_id for r in got] == want and all(r == cw.make_message(r.msg_id) for r in got)
        if how != "flip":
            with pytest.raises(CorruptStateCheckpointError):
                repo.search("")
        ok, probs = verify_report(repo)
        assert not ok, f"verify() passed a damaged archive ({how})"
        assert any(os.path.basename(path) in p for p in probs), probs
        # the hot tier is unaffected
        for mid in mids:
            if mid not in cooled:
                rd = repo.get_message(mid)
                assert rd.status == ReadStatus.FOUND_VERIFIED and rd.record == cw.make_message(mid)
    finally:
        repo.close()


# ------------------------------------------------------------------ events.jsonl

def events_path(state: str) -> str:
    p = os.path.join(state, "events.jsonl")
    assert os.path.exists(p), cw.all_files(state)
    return p


def _last_line(path: str) -> tuple[bytes, int, int]:
    with open(path, "rb") as f:
        data = f.read()
    end = logical_end(data) - 1
    assert data[end:end + 1] == b"\n"
    start = data.rfind(b"\n", 0, end) + 1
    return data, start, end


def test_torn_events_line_conversation(tmp_path, caplog):
    state = str(tmp_path / "s")
    mids = build(state, crash=True)
    path = events_path(state)
    data, start, end = _last_line(path)
    cut = start + (end - start) // 2
    os.truncate(path, cut)
    with caplog.at_level(logging.WARNING):
        repo, warns = open_conv(state)
    try:
        assert warns, "a torn events.jsonl line must be reported with a warning"
        assert any(r.levelno >= logging.WARNING for r in caplog.records)
        stats = repo.stats()
        assert file_containing(state, data[start:cut], exclude=path), "torn envelope bytes not quarantined"
        assert_all_present(repo, mids)
        assert verify_report(repo)[0]
    finally:
        repo.close()
    envs, problems = cw.read_envelopes(path)
    assert not problems
    have = {e["id"]: e["payload_hash"] for e in envs if e.get("type") == "conversation.message"}
    for mid in mids:   # the tail holds the body: recovery re-derives the lost envelope
        assert have.get(mid) == cw.payload_hash_of(cw.make_message(mid).to_dict()), mid
    assert quarantine_count(stats) >= 1, f"stats() does not report the quarantined envelope line: {stats}"


def test_zero_bytes_after_events_are_not_damage(tmp_path):
    state = str(tmp_path / "s")
    mids = build(state)
    with open(events_path(state), "ab") as f:
        f.write(b"\0" * 5000)
    repo, warns = open_conv(state)
    try:
        assert not warns
        assert quarantine_count(repo.stats()) == 0
        assert_all_present(repo, mids)
        assert verify_report(repo)[0]
        repo.append(cw.make_message(ids(1, start=300)[0]))
    finally:
        repo.close()
    envs, problems = cw.read_envelopes(events_path(state))
    assert not problems


@pytest.mark.parametrize("field", ["payload_hash", "checksum", "type"])
def test_flipped_byte_in_events_line_is_loud(tmp_path, field):
    from rune_fast.errors import CorruptStateCheckpointError
    state = str(tmp_path / "s")
    build(state)
    path = events_path(state)
    with open(path, "rb") as f:
        data = f.read()
    lines = data[:logical_end(data)].split(b"\n")[:-1]
    k = len(lines) // 2
    start = sum(len(x) + 1 for x in lines[:k])
    line = lines[k]
    rel = {"checksum": 10, "type": _value_at(line, "type") + 3,
           "payload_hash": _value_at(line, "payload_hash") + 20}[field]
    flip(path, start + rel)
    try:
        repo, warns = open_conv(state)
    except CorruptStateCheckpointError as err:
        assert_names(err, path, start, start + rel)
        return
    try:
        assert not warns, f"a damaged complete events line is not a tear: {warns}"
        ok, probs = verify_report(repo)
        assert not ok, "verify() passed a damaged events.jsonl"
        assert any("events.jsonl" in p for p in probs), probs
        assert any(str(start) in p for p in probs), f"no problem names offset {start}: {probs}"
    finally:
        repo.close()


def test_torn_events_line_task_ledger(tmp_path):
    state = str(tmp_path / "s")
    made = _build_tasks(state)
    path = events_path(state)
    data, start, end = _last_line(path)
    cut = start + (end - start) // 3
    os.truncate(path, cut)
    repo, warns = open_tasks(state)
    try:
        assert warns, "a torn events.jsonl line must be reported with a warning"
        stats = repo.stats()
        assert file_containing(state, data[start:cut], exclude=path)
        for d in made:
            got = repo.get(d["task_id"])
            assert got is not None and got.to_dict() == d
    finally:
        repo.close()
    assert quarantine_count(stats) >= 1, f"stats() does not report the quarantined envelope line: {stats}"


def test_flipped_byte_in_events_line_task_ledger(tmp_path):
    from rune_fast.errors import CorruptStateCheckpointError
    state = str(tmp_path / "s")
    _build_tasks(state)
    path = events_path(state)
    with open(path, "rb") as f:
        data = f.read()
    lines = data[:logical_end(data)].split(b"\n")[:-1]
    k = len(lines) // 2
    start = sum(len(x) + 1 for x in lines[:k])
    pos = start + _value_at(lines[k], "payload_hash") + 20
    flip(path, pos)
    try:
        repo, _ = open_tasks(state)
    except CorruptStateCheckpointError as err:
        assert_names(err, path, start, pos)
        return
    repo.close()
    # The ledger did not read the damaged envelope on open; the conversation
    # repository on the same directory reads and verifies the event store.
    try:
        conv, _ = open_conv(state)
    except CorruptStateCheckpointError as err:
        assert_names(err, path, start, pos)
        return
    try:
        ok, probs = verify_report(conv)
    finally:
        conv.close()
    assert not ok and any("events.jsonl" in p and str(start) in p for p in probs), probs


# ------------------------------------------------------- deletion, then a crash

@pytest.mark.parametrize("end", ["crash", "close"])
def test_delete_then_reopen_then_compact_erases_every_tier(tmp_path, end):
    """Issue 7: a writer deletes a message in each tier and dies (or closes)
    before any compaction; the reopened store keeps them deleted, and its next
    compact() erases their content from every file under state_dir."""
    from rune_fast.conversation_state import ReadStatus
    state = str(tmp_path / "s")
    mids = ids(40)
    run_child(f"""
from rune_fast.conversation_state import ConversationStateRepository
repo = ConversationStateRepository({state!r}, compact_every=100_000, hot_window=4)
mids = {mids!r}
repo.append_many([cw.make_message(m) for m in mids[:24]])
repo.compact()
for m in mids[24:]:
    repo.append(cw.make_message(m))
tiers = {{m: repo.get_message(m).tier for m in mids}}
doomed = [next(m for m in mids if tiers[m] == t) for t in ("cool", "hot", "tail")]
for m in doomed:
    assert repo.delete(m)
with open({str(tmp_path / "doomed")!r}, "w") as f:
    f.write(",".join(doomed))
if {end!r} == "close":
    repo.close()
""")
    doomed = (tmp_path / "doomed").read_text().split(",")
    repo, warns = open_conv(state, hot_window=4)
    try:
        assert not warns
        for m in doomed:
            assert repo.get_message(m).status == ReadStatus.NOT_FOUND_CONFIRMED, m
        repo.compact()
        assert_all_present(repo, [m for m in mids if m not in doomed])
        assert verify_report(repo)[0]
    finally:
        repo.close()
    held = {}
    for path in cw.all_files(state):
        texts = [read_bytes(path)]
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq
            tab = pq.read_table(path)
            texts.append("\n".join(str(v) for col in tab.columns for v in col.to_pylist()).encode())
        for m in doomed:
            if any(f"<<{m}>>".encode() in t for t in texts):
                held.setdefault(m, []).append(os.path.relpath(path, state))
    assert not held, f"compact() after the reopen ({end}) left deleted content on disk: {held}"


def test_erasure_of_a_cooled_message_reaches_every_copy(tmp_path):
    """A cooled message whose original line still sits in the tail (not yet
    reclaimed) is deleted; the next compact() in the same session must erase
    both the Parquet row and that line (SPEC 4: no file under state_dir
    contains the deleted content). The writer then dies, as in a crash."""
    state = str(tmp_path / "s")
    mids = ids(40)
    run_child(f"""
from rune_fast.conversation_state import ConversationStateRepository
repo = ConversationStateRepository({state!r}, compact_every=100_000, hot_window=4)
mids = {mids!r}
repo.append_many([cw.make_message(m) for m in mids])
repo.compact()
doomed = next(m for m in mids if repo.get_message(m).tier == "cool")
assert repo.delete(doomed)
repo.compact()
with open({str(tmp_path / "doomed")!r}, "w") as f:
    f.write(doomed)
""")
    doomed = (tmp_path / "doomed").read_text()
    held = [os.path.relpath(p, state) for p in cw.all_files(state)
            if f"<<{doomed}>>".encode() in read_bytes(p)]
    assert not held, f"compact() erased the archive row of {doomed} but its content is still in {held}"


# ------------------------------------------ derived files: snapshot and sidecars

def _derived_file(state: str, which: str) -> str:
    hot = os.path.join(state, "hot")
    if which == "snapshot":
        found = [p for p in files_under(hot) if os.path.dirname(p) == hot
                 and not p.endswith((".jsonl", ".json")) and ("snap" in p or "index" in p)]
    else:
        found = [p for p in files_under(hot) if p.endswith(".idx")]
    if not found:
        pytest.skip(f"this build writes no {which} file: {cw.all_files(state)}")
    return sorted(found)[-1]


@pytest.mark.parametrize("how", ["flip-head", "flip-middle", "flip-end", "truncate", "garbage"])
@pytest.mark.parametrize("which", ["snapshot", "cool-sidecar"])
def test_damaged_derived_file_is_never_trusted(tmp_path, which, how):
    """The index snapshot and the cool sidecar index decide where a read looks.
    Damaged, they may be rebuilt (open then serves every message exactly) or
    refused with CorruptStateCheckpointError -- never trusted."""
    from rune_fast.errors import CorruptStateCheckpointError
    state = str(tmp_path / "s")
    mids = build(state, 40, compact=True, hot_window=4)
    repo, _ = open_conv(state)
    try:                    # a few more, and a close that writes the snapshot
        more = ids(6, start=40)
        assert repo.append_many([cw.make_message(m) for m in more]) == 6
    finally:
        repo.close()
    path = _derived_file(state, which)
    data = read_bytes(path)
    if how.startswith("flip"):
        pos = {"flip-head": min(12, len(data) - 1), "flip-middle": len(data) // 2,
               "flip-end": len(data) - 3}[how]
        flip(path, pos, 0x10)
    elif how == "truncate":
        os.truncate(path, len(data) * 2 // 3)
    else:
        with open(path, "wb") as f:
            f.write(bytes((i * 37 + 11) & 0xFF for i in range(len(data))))
    try:
        repo, _ = open_conv(state)
    except CorruptStateCheckpointError as err:
        assert_names(err, path)
        return
    try:
        assert_all_present(repo, mids + more)
        for mid in (mids + more)[::7]:
            hits = repo.search(f"<<{mid}>>")
            assert [h.record.msg_id for h in hits] == [mid]
        ok, probs = verify_report(repo)
        # verify() may report the damaged derived file; if it does, it names it
        assert ok or any(os.path.basename(path) in p for p in probs), probs
    finally:
        repo.close()


def test_torn_tombstone_line_is_quarantined(tmp_path):
    """A delete cut short by a crash (its tombstone line torn) was never
    acknowledged: the store opens, warns, quarantines the bytes, and serves
    the message either as stored or as deleted -- consistently."""
    from rune_fast.conversation_state import ReadStatus
    state = str(tmp_path / "s")
    mids = ids(12)
    run_child(f"""
from rune_fast.conversation_state import ConversationStateRepository
repo = ConversationStateRepository({state!r}, compact_every=100_000)
repo.append_many([cw.make_message(m) for m in {mids!r}])
assert repo.delete({mids[2]!r})
assert repo.delete({mids[7]!r})
""")
    tomb_files = [p for p in hot_logs(state) if f'"{mids[7]}"'.encode() in read_bytes(p)
                  and f"<<{mids[7]}>>".encode() not in read_bytes(p)]
    if not tomb_files:
        pytest.skip("no separate tombstone file: deletions live in the tail (covered by the tail tests)")
    path = tomb_files[0]
    data, start, end = _last_line(path)
    assert mids[7].encode() in data[start:end], "the last delete is not the tombstone file's last line"
    cut = start + (end - start) // 2
    os.truncate(path, cut)
    repo, warns = open_conv(state)
    try:
        assert warns, "a torn tombstone line must be reported with a warning"
        stats = repo.stats()
        assert file_containing(state, data[start:cut], exclude=path)
        assert repo.get_message(mids[2]).status == ReadStatus.NOT_FOUND_CONFIRMED
        rd = repo.get_message(mids[7])
        listed = mids[7] in [r.msg_id for ch in cw.CHANNELS for r in repo.window(ch, BIG)]
        if rd.status == ReadStatus.FOUND_VERIFIED:
            assert rd.record == cw.make_message(mids[7]) and listed
        else:
            assert rd.status == ReadStatus.NOT_FOUND_CONFIRMED and not listed
        assert verify_report(repo)[0]
        assert repo.delete(mids[9])          # the recovered file takes new tombstones
    finally:
        repo.close()
    repo, warns = open_conv(state)
    try:
        assert not warns, f"the reopen after recovery warned again: {warns}"
        for m in (mids[2], mids[9]):
            assert repo.get_message(m).status == ReadStatus.NOT_FOUND_CONFIRMED, m
        assert verify_report(repo)[0]
    finally:
        repo.close()
    assert quarantine_count(stats) >= 1, f"stats() does not report the quarantined tombstone line: {stats}"


@pytest.mark.parametrize("how", ["zero-first", "cut-second", "remove"])
def test_tombstones_that_lost_deletions_the_manifest_records_are_loud(tmp_path, how):
    """The manifest records the tombstones file it saw synced; a file that
    lost deletions before its last line (zeroed, cut off, gone) would bring
    deleted messages back, so the open refuses it, naming the file."""
    state = str(tmp_path / "s")
    mids = build(state)
    repo, _w = open_conv(state)
    try:
        for m in (mids[1], mids[4], mids[8]):
            assert repo.delete(m)
    finally:
        repo.close()
    path = [p for p in hot_logs(state) if f'"{mids[8]}"'.encode() in read_bytes(p)
            and f"<<{mids[8]}>>".encode() not in read_bytes(p)][0]
    data = read_bytes(path)
    first_end = data.index(b"\n") + 1
    if how == "zero-first":
        with open(path, "r+b") as f:
            f.write(bytes(first_end))
    elif how == "cut-second":
        os.truncate(path, first_end + 10)
    else:
        os.unlink(path)
    assert_refused(state, path)


def _build_sealed(state: str) -> None:
    """A closed store of 40 messages whose tail rolled into sealed segments
    (the caller lowers ROLL_BYTES)."""
    mids = ids(40)
    repo, _w = open_conv(state)
    try:
        for k in range(0, 40, 8):
            assert repo.append_many([cw.make_message(m) for m in mids[k:k + 8]]) == 8
            repo.compact()
    finally:
        repo.close()


def test_sealed_segment_of_another_size_than_its_snapshot_records_is_loud(tmp_path, monkeypatch):
    """A sealed segment never changes once sealed (a rewrite makes a new one):
    one cut at a line boundary, which a rescan would read as fewer lines and
    no damage, is refused at open, naming it."""
    from rune_fast._conv import tuning
    from rune_fast.conversation_state import CorruptStateCheckpointError
    monkeypatch.setattr(tuning, "ROLL_BYTES", 2000)
    state = str(tmp_path / "s")
    _build_sealed(state)
    segs = [p for p in hot_logs(state) if "seg-" in os.path.basename(p)]
    assert segs, "no sealed segment"
    path = segs[0]
    data = read_bytes(path)
    cut = data.rstrip(b"\0")[:-1].rfind(b"\n") + 1          # drop its last line whole
    assert 0 < cut < len(data)
    os.truncate(path, cut)
    with pytest.raises(CorruptStateCheckpointError) as ei:
        open_conv(state)
    assert_names(ei.value, path)


def test_a_checkpoint_vouches_only_for_bytes_synced_before_it(tmp_path, monkeypatch):
    """A writer killed in durability='none' leaves tail lines and deletions
    that nobody synced; the next session's index snapshot and manifest vouch
    for them, so it syncs them first (whatever its own mode): a power loss
    after it can then not leave a checkpoint that vouches for lost bytes,
    which the next open would refuse as damage."""
    from rune_fast.conversation_state import ReadStatus
    state = str(tmp_path / "s")
    mids = ids(12)
    run_child(f"""
from rune_fast.conversation_state import ConversationStateRepository
repo = ConversationStateRepository({state!r}, durability="none", compact_every=100_000, hot_window=4)
repo.append_many([cw.make_message(m) for m in {mids[:8]!r}])
repo.flush()
repo.append_many([cw.make_message(m) for m in {mids[8:]!r}])   # never synced
assert repo.delete({mids[1]!r})                                  # never synced
""")
    synced: list[str] = []
    order: list[str] = []
    real_fd, real_f, real_replace = os.fdatasync, os.fsync, os.replace

    def rec(fn):
        def w(fd):
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
            synced.append(name)
            order.append("sync " + name)
            return fn(fd)
        return w

    def replace(src, dst, *a, **k):
        order.append("replace " + os.path.basename(str(dst)))
        return real_replace(src, dst, *a, **k)
    monkeypatch.setattr(os, "fdatasync", rec(real_fd))
    monkeypatch.setattr(os, "fsync", rec(real_f))
    monkeypatch.setattr(os, "replace", replace)
    repo, _w = open_conv(state, durability="none", hot_window=4)
    try:
        repo.compact()
        assert repo.get_message(mids[1]).status == ReadStatus.NOT_FOUND_CONFIRMED
    finally:
        repo.close()
    for what, needs in (("conversation_index.snap", "conversation_tail.jsonl"),
                        ("conversation_manifest.json", "conversation_tombstones.jsonl")):
        writes = [k for k, o in enumerate(order) if o == "replace " + what]
        assert writes, (what, order)
        first = writes[0]
        assert "sync " + needs in order[:first], f"{what} written before {needs} was synced: {order}"


@pytest.mark.parametrize("how", ["cut-at-a-line", "zero-last-line"])
def test_sealed_segment_that_lost_lines_is_loud_without_a_snapshot(tmp_path, monkeypatch, how):
    """With no index snapshot to vouch (a writer that died before writing
    one), the manifest still records where each sealed segment's lines end:
    a rebuild that finds fewer complete lines (cut at a line boundary, or its
    last lines zeroed, which would read as preallocation) refuses the store."""
    from rune_fast._conv import tuning
    monkeypatch.setattr(tuning, "ROLL_BYTES", 2000)
    state = str(tmp_path / "s")
    _build_sealed(state)
    os.unlink(os.path.join(state, "hot", "conversation_index.snap"))
    path = [p for p in hot_logs(state) if "seg-" in os.path.basename(p)][0]
    data = read_bytes(path)
    end = len(data.rstrip(b"\0"))
    last = data[:end - 1].rfind(b"\n") + 1
    if how == "cut-at-a-line":
        os.truncate(path, last)
    else:
        with open(path, "r+b") as f:
            f.seek(last)
            f.write(bytes(end - last))
    assert_refused(state, path)
