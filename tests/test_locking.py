"""DirLock: one writer per kind per state directory, in any process."""
from __future__ import annotations

import gc
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from rune_fast.errors import StateLockedError
from rune_fast.locking import DirLock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from rune_fast.locking import DirLock
    lock = DirLock(sys.argv[2], sys.argv[3])
    print("locked", flush=True)
    sys.stdin.readline()
""")


def _hold(state_dir, kind):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, ROOT, str(state_dir), kind],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_lock_in_same_process_refused(tmp_path):
    lock = DirLock(tmp_path, "task")
    with pytest.raises(StateLockedError) as info:
        DirLock(tmp_path, "task")
    assert str(tmp_path) in str(info.value) and "task" in str(info.value)
    # a different kind is independent
    other = DirLock(tmp_path, "conversation")
    lock.release()
    lock.release()
    again = DirLock(tmp_path, "task")
    assert again.held and other.held
    again.release()
    other.release()


def test_same_dir_through_symlink_is_same_lock(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with DirLock(real, "task"):
        with pytest.raises(StateLockedError):
            DirLock(link, "task")


def test_lock_file_is_private(tmp_path):
    state = tmp_path / "state"
    with DirLock(state, "task") as lock:
        assert stat.S_IMODE(os.stat(lock.path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert not lock.held


def test_other_process_holding_lock(tmp_path):
    proc = _hold(tmp_path, "task")
    try:
        with pytest.raises(StateLockedError) as info:
            DirLock(tmp_path, "task")
        assert str(proc.pid) in str(info.value)
        DirLock(tmp_path, "conversation").release()
    finally:
        proc.communicate(timeout=10)
    DirLock(tmp_path, "task").release()


def test_lock_dies_with_its_process(tmp_path):
    proc = _hold(tmp_path, "task")
    proc.kill()
    proc.communicate(timeout=10)
    DirLock(tmp_path, "task").release()


def test_dropped_lock_is_freed(tmp_path):
    lock = DirLock(tmp_path, "task")
    del lock
    gc.collect()
    DirLock(tmp_path, "task").release()


@pytest.mark.parametrize("kind", ["", "../x", "Task", "a/b", 3])
def test_bad_kind(tmp_path, kind):
    with pytest.raises(ValueError, match="kind"):
        DirLock(tmp_path, kind)


def test_forked_child_does_not_keep_the_lock(tmp_path):
    lock = DirLock(tmp_path, "task")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: its copy of the lock is gone, the parent's still holds
        code = 0
        try:
            try:
                DirLock(tmp_path, "task")
                code = 1
            except StateLockedError:
                pass
            os.close(r)
            os.write(w, b"1")
            os.close(w)
            import time
            time.sleep(1.0)  # stay alive while the parent releases and re-takes
        finally:
            os._exit(code)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.close(r)
    lock.release()
    DirLock(tmp_path, "task").release()  # the live child does not hold it
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
