"""A full disk, for real: small file systems (a size-limited tmpfs and a
loop-mounted ext4 image) filled by the store's own writes. The call that
meets the full disk fails with an error naming the file, the store refuses
writes until reopened, and it reopens with every acknowledged message, then
takes writes again once space is back. Also the tail roll that a failed
compaction interrupted (the store that could not be opened after a full
disk) and a tail whose reserved space is a hole on a full tmpfs (a read of
it through the map was SIGBUS).

Mounting needs root: without it (or where the kernel refuses) these tests
are skipped, and say why."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
import warnings

import pytest

from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.errors import DurabilityError, RecoveryWarning, RuneError
from rune_fast.records import ConversationMessageRecord
from rune_fast.segments import TAIL_NAME, seg_name

BODY = "Grüße aus Zürich, " * 16       # ~300 bytes, non-ASCII


def msg(i: int, prefix: str = "m") -> ConversationMessageRecord:
    return ConversationMessageRecord(msg_id=f"{prefix}{i:07d}", content=f"{BODY}{i}",
                                     channel_id=f"c{i % 5}", ts=1.0 + i)


def _mount(kind: str, where: str, size_mib: int, image: str) -> None:
    if kind == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", where]
    else:
        with open(image, "wb") as f:
            f.truncate(size_mib << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True, capture_output=True)
        cmd = ["mount", "-o", "loop", image, where]
    subprocess.run(cmd, check=True, capture_output=True)


def _image_path(tmp_path) -> str:
    """Where the ext4 image lives: in /dev/shm when there is one, so that
    the syncs of the loop device cost memory copies, not the host disk's
    flushes (the file system, its space accounting and ENOSPC are ext4's
    either way; the test ran 2-3 times longer with the image on disk)."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return os.path.join(shm, f"rune-full-disk-{uuid.uuid4().hex}.img")
    return str(tmp_path / "fs.img")


@pytest.fixture(params=["tmpfs", "ext4"])
def small_fs(request, tmp_path):
    """A file system of a few MiB mounted at a fresh folder; a 512 KiB
    ballast file in it, to be removed for space once it is full."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    if request.param == "ext4" and not shutil.which("mkfs.ext4"):
        pytest.skip("mkfs.ext4 is not installed (Debian's e2fsprogs)")
    where = tmp_path / "fs"
    where.mkdir()
    image = _image_path(tmp_path)
    try:
        try:
            _mount(request.param, str(where), 4 if request.param == "tmpfs" else 8, image)
        except (subprocess.CalledProcessError, OSError) as exc:
            err = getattr(exc, "stderr", b"") or b""
            pytest.skip(f"cannot mount a {request.param} here: {exc} {err.decode(errors='replace')}")
        try:
            with open(where / "ballast", "wb") as f:
                f.write(b"\1" * (512 << 10))
            yield where
        finally:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(image)


def _fill(repo, how: str) -> tuple[list[str], DurabilityError]:
    """Append until the disk is full; the ids acknowledged, and the error."""
    acked: list[str] = []
    for i in range(0, 400_000, 50):
        batch = [msg(j) for j in range(i, i + 50)]
        try:
            if how == "append_many":
                repo.append_many(batch)
                acked += [m.msg_id for m in batch]
            else:
                for m in batch:
                    repo.append(m)
                    acked.append(m.msg_id)
        except DurabilityError as exc:
            return acked, exc
    raise AssertionError("the disk never filled")


@contextlib.contextmanager
def _recovering():
    """A reopen after the full disk may quarantine the torn line of the
    write that met it (RecoveryWarning: reported, expected here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        yield


def _found(repo, msg_id: str) -> bool:
    read = repo.get_message(msg_id)
    if read.status is ReadStatus.FOUND_VERIFIED:
        assert read.record.msg_id == msg_id
        return True
    assert read.status is ReadStatus.NOT_FOUND_CONFIRMED, (msg_id, read)
    return False


def _check_all(d, acked: list[str], **kw) -> None:
    with _recovering(), ConversationStateRepository(d, **kw) as repo:
        missing = [m for m in acked if not _found(repo, m)]
        assert missing == []
        assert repo.verify().ok


@pytest.mark.parametrize("mode", ["fsync", "batch"])
@pytest.mark.parametrize("how", ["append", "append_many"])
def test_a_full_disk_fails_the_call_and_the_store_reopens(small_fs, mode, how):
    d = small_fs / "s"
    kw = dict(durability=mode, compact_every=300, hot_window=1500)
    repo = ConversationStateRepository(d, **kw)
    try:
        acked, exc = _fill(repo, how)
        assert str(small_fs) in str(exc)            # names the file
        with pytest.raises(DurabilityError, match="reopen"):
            repo.append(msg(0, "after"))            # refused until reopened
        assert _found(repo, acked[-1])              # reads go on
    finally:
        try:
            repo.close()
        except RuneError:
            pass
    # still full: a viewer reads it; a writer opens, or says why not
    with _recovering(), ConversationStateRepository(d, read_only=True) as viewer:
        assert _found(viewer, acked[0]) and _found(viewer, acked[-1])
    try:
        with _recovering():
            ConversationStateRepository(d, **kw).close()
    except DurabilityError as exc:
        assert str(small_fs) in str(exc)
    os.unlink(small_fs / "ballast")
    _check_all(d, acked, **kw)
    with _recovering(), ConversationStateRepository(d, **kw) as again:
        again.append_many([msg(i, "later") for i in range(20)])     # writes resume
    _check_all(d, acked + [msg(i, "later").msg_id for i in range(20)], **kw)


def test_a_full_disk_during_deletions_and_compaction(small_fs):
    d = small_fs / "s"
    kw = dict(durability="fsync", compact_every=10_000, hot_window=400)
    acked: list[str] = []
    deleted: list[str] = []
    repo = ConversationStateRepository(d, **kw)
    try:
        for i in range(0, 400_000, 200):
            try:
                repo.append_many([msg(j) for j in range(i, i + 200)])
                acked += [msg(j).msg_id for j in range(i, i + 200)]
                for j in range(i, i + 200, 7):
                    repo.delete(msg(j).msg_id)
                    deleted.append(msg(j).msg_id)
                repo.compact()
            except DurabilityError as exc:
                assert str(small_fs) in str(exc)
                break
        else:
            raise AssertionError("the disk never filled")
    finally:
        try:
            repo.close()
        except RuneError:
            pass
    os.unlink(small_fs / "ballast")
    gone = set(deleted)
    with _recovering(), ConversationStateRepository(d, **kw) as again:
        assert [m for m in acked if m not in gone and not _found(again, m)] == []
        assert [m for m in deleted if _found(again, m)] == []
        again.append_many([msg(i, "later") for i in range(20)])     # writes resume
        assert again.verify().ok



@pytest.mark.parametrize("fails", ["append_encoded", "sync"])
def test_a_deletion_whose_journal_fails_takes_no_effect(tmp_path, monkeypatch, fails):
    """The tombstones are written first, then the journal (one write for
    the batch's envelopes, then its sync): when the journal meets a full
    disk the tombstones are cut again, so the call that failed deletes
    nothing, now or at the next open (the disk above fills at any of the
    three writes; this one is made to fail at the journal)."""
    d = tmp_path / "s"
    with ConversationStateRepository(d, durability="fsync") as repo:
        repo.append_many([msg(i) for i in range(10)])
        assert repo.delete(msg(0).msg_id) is True
        store = type(repo._events)

        def full(*_a, **_k):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(store, fails, full)
        with pytest.raises(DurabilityError) as ei:
            repo.delete(msg(3).msg_id)
        assert "did not take effect" in str(ei.value) and "events.jsonl" in str(ei.value)
        assert _found(repo, msg(3).msg_id)
        monkeypatch.undo()
    with _recovering(), ConversationStateRepository(d, durability="fsync") as again:
        assert _found(again, msg(3).msg_id) and not _found(again, msg(0).msg_id)
        assert again.delete(msg(3).msg_id) is True
        assert again.verify().ok
    with ConversationStateRepository(d, durability="fsync") as last:
        assert [m for m in (msg(i).msg_id for i in range(10)) if _found(last, m)] == \
            [msg(i).msg_id for i in (1, 2, 4, 5, 6, 7, 8, 9)]


_ROLL_WRITER = textwrap.dedent("""
    import os, sys
    from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
    from rune_fast.records import ConversationMessageRecord
    def msg(i):
        return ConversationMessageRecord(msg_id=f"m{i:07d}", content=f"line {i}", channel_id="c", ts=1.0 + i)
    repo = ConversationStateRepository(sys.argv[1], compact_every=10**9)
    repo.append_many([msg(i) for i in range(50)])
    with repo._lock:
        repo._roll_tail()       # the roll of a compaction that then failed, as before the fix
    for i in range(50, 70):
        repo.append(msg(i))     # acknowledged, in the new tail
    os._exit(0)                 # killed: the manifest never moved
""")


def _interrupted_roll(d) -> None:
    subprocess.run([sys.executable, "-c", _ROLL_WRITER, str(d)], check=True)
    hot = d / "hot"
    manifest = json.loads((hot / "conversation_manifest.json").read_text())["body"]
    assert (hot / seg_name(manifest["tail_seg"])).exists()
    assert (hot / TAIL_NAME).stat().st_size > 0


def test_an_interrupted_roll_with_appends_after_it_is_finished_at_open(tmp_path):
    # the state a failed compaction left when later appends were taken:
    # every open refused it ("both the tail and sealed segment N hold data")
    _interrupted_roll(tmp_path)
    ids = [f"m{i:07d}" for i in range(70)]
    with ConversationStateRepository(tmp_path, read_only=True) as viewer:     # writes nothing
        assert [m.msg_id for m in viewer.window("c", 100)] == ids
    with ConversationStateRepository(tmp_path) as repo:
        assert [m.msg_id for m in repo.window("c", 100)] == ids
        repo.append(ConversationMessageRecord(msg_id="after", content="x", channel_id="c", ts=99.0))
        assert repo.verify().ok
    body = json.loads((tmp_path / "hot" / "conversation_manifest.json").read_text())["body"]
    assert not (tmp_path / "hot" / seg_name(body["tail_seg"])).exists()
    with ConversationStateRepository(tmp_path) as repo:
        assert [m.msg_id for m in repo.window("c", 100)] == ids + ["after"]


def test_an_interrupted_roll_derives_lost_envelopes_again(tmp_path):
    _interrupted_roll(tmp_path)
    events = tmp_path / "events.jsonl"
    body = json.loads((tmp_path / "hot" / "conversation_manifest.json").read_text())["body"]
    os.truncate(events, body["events_offset"])      # the envelopes never reached the disk
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == 70
    journaled = _journaled_ids(tmp_path)
    assert {f"m{i:07d}" for i in range(70)} <= journaled


def _journaled_ids(d) -> set[str]:
    from rune_fast.events import EventStore
    store = EventStore(os.path.join(d, "events.jsonl"))
    try:
        return {e["id"] for e in store.iter_envelopes() if e.get("type") == "conversation.message"}
    finally:
        store.close()


def test_an_interrupted_roll_whose_new_tail_holds_only_zeros_is_undone(tmp_path):
    with ConversationStateRepository(tmp_path) as repo:
        repo.append_many([msg(i) for i in range(30)])
        with repo._lock:
            repo._roll_tail()
        repo._tail._ensure_capacity(1)         # space reserved, no line written
        repo._closed = True                     # dies without a checkpoint
        repo._release()
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == 30
        repo.append(msg(99))
    with ConversationStateRepository(tmp_path) as repo:
        assert len(repo) == 31


_HOLE_OPEN = textwrap.dedent("""
    import sys
    from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
    repo = ConversationStateRepository(sys.argv[1])
    print(len(repo), flush=True)
    try:
        repo.close()
    except Exception as exc:
        print(type(exc).__name__, exc, flush=True)
""")


def test_a_hole_in_the_tail_on_a_full_tmpfs_is_no_sigbus(tmp_path):
    # an older build reserved the tail's space ahead with ftruncate (a hole):
    # on a full tmpfs, reading the hole through the map killed the process
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    where = tmp_path / "fs"
    where.mkdir()
    try:
        _mount("tmpfs", str(where), 4, "")
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        d = where / "s"
        with ConversationStateRepository(d) as repo:
            repo.append_many([msg(i) for i in range(40)])
        tail = d / "hot" / TAIL_NAME
        os.truncate(tail, 2 << 20)              # a hole, as ftruncate reserved it
        try:
            with open(where / f"fill-{uuid.uuid4().hex}", "wb") as f:
                while True:
                    f.write(b"\1" * (64 << 10))
                    f.flush()
        except OSError:
            pass
        out = subprocess.run([sys.executable, "-c", _HOLE_OPEN, str(d)], capture_output=True, text=True)
        assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
        assert out.stdout.split()[0] == "40"
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_during_task_changes(small_fs):
    """Task changes (each synced before it returns) until the disk is full:
    the change that meets it fails naming a file, and after space is back
    every acknowledged change is there."""
    from rune_fast.tasks import TaskStateRepository
    d = small_fs / "s"
    acked: dict[str, str] = {}          # task_id -> its last acknowledged status
    maybe: dict[str, str] = {}          # the change that failed: stored or not
    tasks = TaskStateRepository(d, checkpoint_every=50)
    try:
        for i in range(200_000):
            t = None
            try:
                t = tasks.create(f"task {i} " + BODY, "ch0")
                acked[t.task_id] = "created"
                tasks.transition(t.task_id, "running")
                acked[t.task_id] = "running"
            except RuneError as exc:
                assert str(small_fs) in str(exc), exc
                if t is not None:
                    maybe[t.task_id] = "running"
                break
        else:
            raise AssertionError("the disk never filled")
    finally:
        try:
            tasks.close()
        except RuneError:
            pass
    os.unlink(small_fs / "ballast")
    with _recovering(), TaskStateRepository(d) as again:
        for tid, status in acked.items():
            got = again.get(tid)
            assert got is not None and got.status in {status, maybe.get(tid)}, (tid, status, got)
        t = again.create("after the disk had room again", "ch0")        # writes resume
        assert again.get(t.task_id) is not None
