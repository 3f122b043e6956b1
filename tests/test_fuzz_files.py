"""Malformed files: every file the store reads (tail and segment lines, the
index snapshot, the manifest, the cool archives and their sidecars, the
tombstones, the task ledger and its checkpoint, the durable mark, the
event log, the device id) replaced by random bytes or mutated (random
bytes written over a slice or inserted, a slice repeated, the file cut),
then opened as a writer and as a viewer, read everywhere and verified.

What may happen: the store opens and reads (a read may say SOURCE_CORRUPT),
or a documented error (a RuneError) names the file or the state
directory. What may not: any other exception, a crash, a hang (each
example runs under an alarm). test_flip_store.py checks the finer promise
for single flipped bits (never a wrong record); this one checks that no
parser can be driven off its rails."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.errors import RecoveryWarning, RuneError
from rune_fast.records import ConversationMessageRecord
from rune_fast.tasks import TaskStateRepository

EXAMPLES = int(os.environ.get("RUNE_FUZZ_EXAMPLES", "150"))


def _msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(
        msg_id=f"msg_{i:05d}", role="user" if i % 2 else "assistant", channel_id=f"ch{i % 3}",
        task_id=f"t{i % 4}" if i % 5 else "", content=f"message {i}: Grüße {'x' * (i % 40)}",
        ts=1_700_000_000.0 + i)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A closed store holding every kind of file: cool archives and their
    sidecars, sealed segments, a tail past the snapshot, tombstones, tasks."""
    root = tmp_path_factory.mktemp("fuzz") / "base"
    with ConversationStateRepository(root, hot_window=6, compact_every=10_000) as repo:
        repo.append_many(_msg(i) for i in range(60))
        repo.delete("msg_00009")
        repo.compact()
        repo.search("grüße")            # (the search filters of sealed segments are kept)
        repo.append_many(_msg(i) for i in range(60, 80))
        repo.delete("msg_00070")
    with TaskStateRepository(root, checkpoint_every=2) as tasks:
        for k in range(5):
            t = tasks.create(f"task {k}", "ch0")
            tasks.transition(t.task_id, "running")
    files = sorted(os.path.relpath(os.path.join(d, n), root)
                   for d, _dirs, names in os.walk(root) for n in names)
    assert any(f.endswith(".parquet") for f in files) and any("seg-" in f for f in files)
    return root, files


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _alarm(seconds: int):
    def ring(_sig, _frame):
        raise _Hang(f"no answer in {seconds} s")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _mutate(data: bytes, how: str, a: float, b: float, junk: bytes) -> bytes:
    n = len(data)
    i, j = sorted((int(a * n), int(b * n)))
    if how == "replace":
        return junk
    if how == "overwrite":
        return data[:i] + junk[: max(1, j - i)] + data[i + len(junk[: max(1, j - i)]):]
    if how == "insert":
        return data[:i] + junk + data[i:]
    if how == "repeat":
        return data[:j] + data[i:j] + data[j:]
    return data[:i]     # cut


def _exercise(root, *, read_only: bool) -> None:
    """Open, read everything, verify, close: RuneError (naming a file) or nothing."""
    try:
        with ConversationStateRepository(root, read_only=read_only) as repo:
            for ch in repo.channels():
                repo.window(ch, 100)
            for i in range(80):
                repo.get_message(f"msg_{i:05d}")
            for t in ("t0", "t1", "t2", "t3"):
                repo.messages_for_task(t)
            repo.search("grüße")
            repo.search("message 4", limit=3)
            repo.verify()
            len(repo)
    except RuneError as exc:
        _names_a_file(exc, root)
    if read_only:
        return
    try:
        with TaskStateRepository(root) as tasks:
            tasks.list_tasks()
            tasks.list_open("ch0")
    except RuneError as exc:
        _names_a_file(exc, root)


def _names_a_file(exc: RuneError, root) -> None:
    path = getattr(exc, "path", None)
    assert path or str(root) in str(exc), f"{type(exc).__name__} names no file: {exc}"


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(data=st.data(), how=st.sampled_from(["replace", "overwrite", "insert", "repeat", "cut"]),
       a=st.floats(0, 1), b=st.floats(0, 1), junk=st.binary(min_size=1, max_size=600))
def test_a_malformed_file_is_refused_by_name_or_read_never_a_crash(base, tmp_path_factory, data, how, a, b, junk):
    src, files = base
    name = data.draw(st.sampled_from(files), label="file")
    if how == "replace":
        junk = data.draw(st.sampled_from([junk, b"", b"\0" * len(junk), b"\n" * len(junk)]), label="junk")
    root = tmp_path_factory.mktemp("case") / "s"
    shutil.copytree(src, root)
    path = root / name
    path.write_bytes(_mutate(path.read_bytes(), how, a, b, junk))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        with _alarm(60):
            _exercise(root, read_only=True)
            _exercise(root, read_only=False)
    shutil.rmtree(root.parent)
