"""Pages that reads map in the hot segment and tail maps are released.

A read fault maps a whole page-cache folio, so reads spread over the hot
segments used to leave every page they ever touched resident. The repository
drops them from its page tables (``madvise(MADV_DONTNEED)``) every
``MAP_RELEASE_READS`` decoded lines and after its whole-store passes; the file
pages stay in the page cache and reads map them again. These tests measure the
mapped pages through /proc/self/smaps (Linux) and check every read still
returns what was appended.
"""
from __future__ import annotations

import mmap
import os
import re

import pytest

from rune_fast._conv import tuning
from rune_fast._log import map_file
from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.records import ConversationMessageRecord
from rune_fast.segments import release_pages

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/smaps"),
                                reason="resident pages are read from /proc/self/smaps (Linux)")

_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def mapped_kib(prefix: str) -> int:
    """Resident KiB of this process's maps of files under ``prefix``."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if _HEADER.match(line):
                parts = line.split(maxsplit=5)
                inside = len(parts) == 6 and parts[5].strip().startswith(prefix)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def msg(i: int, channel: str) -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"msg_{i:08d}", role="user", channel_id=channel,
                                     content=f"message {i} " + "lorem ipsum dolor sit amet " * 30,
                                     ts=1_700_000_000.0 + i)


def test_release_pages_unmaps_and_keeps_every_byte(tmp_path):
    """Both kinds of map (a sealed segment's MappedFile, the tail's mmap):
    touched pages count as resident, a release drops them all, and the bytes
    read afterwards are the file's."""
    path = str(tmp_path / "seg")
    data = bytes(range(256)) * (4 * 4096)      # 4 MiB
    with open(path, "wb") as f:
        f.write(data)
    buf, size = map_file(path)
    assert size == len(data)
    view = memoryview(buf)
    assert sum(view[i] for i in range(0, size, 4096)) == sum(data[i] for i in range(0, size, 4096))
    assert mapped_kib(path) >= 1024
    release_pages(buf)
    assert mapped_kib(path) == 0
    assert bytes(view) == data
    view.release()
    del buf                     # unmapped with its last view
    assert mapped_kib(path) == 0

    fd = os.open(path, os.O_RDONLY)
    try:
        m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    assert m[::4096] == data[::4096]
    assert mapped_kib(path) >= 1024
    release_pages(m)
    assert mapped_kib(path) == 0
    assert m[:] == data
    m.close()
    release_pages(None)         # (an empty file has no map)


def segments_kib(state_dir) -> int:
    """Resident KiB of the maps of the store's segments and tail (not its
    index snapshot, whose private map is the index itself)."""
    hot = os.path.join(str(state_dir), "hot") + os.sep
    return mapped_kib(hot + "conversation_seg-") + mapped_kib(hot + "conversation_tail.jsonl")


def _store(path, n: int) -> list[ConversationMessageRecord]:
    msgs = [msg(i, f"c{i % 7}") for i in range(n)]
    with ConversationStateRepository(path, compact_every=10**6, hot_window=10**6) as repo:
        repo.append_many(msgs)
        repo.compact()
    return msgs


def test_exact_reads_keep_the_mapped_pages_within_the_budget(tmp_path, monkeypatch):
    """get_message over every message of a 16 MB hot tier, looked at every
    16 decoded lines: with a budget of 1 MiB the segments' resident pages
    stay a small part of what the same reads leave with a budget larger than
    the store (a working set under the budget is never released, so a warm
    loop re-faults nothing); every read is exact. (A read fault may map a
    whole 2 MiB folio: the store is several of them.)"""
    msgs = _store(tmp_path / "s", 16000)
    monkeypatch.setattr(tuning, "MAP_RELEASE_READS", 16)
    released = []

    release = ConversationStateRepository._release_maps

    def counted(repo: ConversationStateRepository) -> None:
        released.append(tuning.MAP_BUDGET_BYTES)
        release(repo)
    monkeypatch.setattr(ConversationStateRepository, "_release_maps", counted)

    def read_all(budget: int) -> int:
        monkeypatch.setattr(tuning, "MAP_BUDGET_BYTES", budget)
        with ConversationStateRepository(tmp_path / "s") as repo:
            for m in msgs:
                got = repo.get_message(m.msg_id)
                assert got.status is ReadStatus.FOUND_VERIFIED and got.record == m
            return segments_kib(tmp_path / "s")

    kept = read_all(1 << 30)
    assert kept >= 12 << 10, kept              # (the reads mapped most of the segments)
    assert released == [1 << 30, 1 << 30]      # the first look (it sets the base), the close
    assert read_all(1 << 20) * 3 < kept
    assert released.count(1 << 20) > 2


def test_whole_store_passes_release_what_they_mapped(tmp_path, monkeypatch):
    """search (its first pass checks every hot line), verify() and a
    compaction that cools read lines by the thousand; past the budget (here
    none) none leaves them mapped, and what they return is exact. Nor does a
    close, whatever the budget."""
    msgs = _store(tmp_path / "s", 3000)
    monkeypatch.setattr(tuning, "MAP_BUDGET_BYTES", 0)
    with ConversationStateRepository(tmp_path / "s", compact_every=10**6, hot_window=100) as repo:
        hits = repo.search("message 12")
        assert sorted(h.record.msg_id for h in hits) == sorted(m.msg_id for m in msgs
                                                              if "message 12" in m.content)
        assert segments_kib(tmp_path / "s") == 0
        assert repo.verify().ok
        assert segments_kib(tmp_path / "s") == 0
        rep = repo.compact()
        assert rep.cooled == 3000 - 7 * 100
        assert segments_kib(tmp_path / "s") == 0
        assert repo.get_message(msgs[5].msg_id).record == msgs[5]
        assert [m.msg_id for m in repo.window("c3", 3)] == [m.msg_id for m in msgs if m.channel_id == "c3"][-3:]
        monkeypatch.setattr(tuning, "MAP_BUDGET_BYTES", 1 << 30)
        for m in msgs[:500]:
            repo.get_message(m.msg_id)
        assert segments_kib(tmp_path / "s") > 0
    assert segments_kib(tmp_path / "s") == 0       # closed (repo still referenced: its maps live on)


def test_the_kept_statm_reads_this_process_and_a_forked_childs_own():
    """_resident_file_bytes keeps /proc/self/statm open and reads it again
    from its start: each look is the process's count now, and a forked child
    reads its own file, not its parent's."""
    from rune_fast._conv.common import _resident_file_bytes

    def fresh() -> int:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[2]) * mmap.PAGESIZE

    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc/self/statm")
    before = _resident_file_bytes()
    assert before is not None and abs(before - fresh()) <= 64 * mmap.PAGESIZE
    with open(__file__, "rb") as f:                  # map and touch pages: the count grows
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            big = fresh()
            assert abs(_resident_file_bytes() - big) <= 64 * mmap.PAGESIZE
        finally:
            m.close()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                     # the child: its count, not the parent's
        try:
            os.close(r)
            # (a child's count starts small and grows as it touches pages:
            # its look lies between two fresh reads around it; the parent's
            # count is far above)
            lo = fresh()
            got = _resident_file_bytes()
            hi = fresh()
            ok = got is not None and lo - 16 * mmap.PAGESIZE <= got <= hi + 16 * mmap.PAGESIZE
            os.write(w, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 2) == b"ok"
    os.close(r)
