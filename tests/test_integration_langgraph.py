"""RuneCheckpointSaver: LangGraph's conformance suite, the stored size of a
growing message history, crash durability, odd thread ids, compaction, and a
real graph run on it."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage  # noqa: E402
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint  # noqa: E402
from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, DetectedCapabilities  # noqa: E402
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # noqa: E402
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402

from rune_fast.errors import (  # noqa: E402
    CorruptStateCheckpointError,
    RecoveryWarning,
    StateLockedError,
    StoreClosedError,
)
from rune_fast.integrations.langgraph import LOG_NAME, MAGIC, RuneCheckpointSaver  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- helpers


def _messages(step: int, size: int = 480) -> list[Any]:
    return [HumanMessage(content=f"q{step} " + "q" * size, id=f"h{step}"),
            AIMessage(content=f"a{step} " + "a" * size, id=f"a{step}")]


class _Run:
    """Drives puts the way LangGraph's loop does: one channel, new version each step."""

    def __init__(self, saver: RuneCheckpointSaver, thread_id: str = "t", ns: str = "") -> None:
        self.saver = saver
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
        self.version: Any = None
        self.cp = empty_checkpoint()
        self.values: list[Any] = []
        self.ids: list[str] = []

    def put(self, step: int, value: Any, run_id: str = "r") -> None:
        self.version = self.saver.get_next_version(self.version, None)
        cp = create_checkpoint(self.cp, None, step)
        cp["channel_values"] = {"messages": value}
        cp["channel_versions"] = {"messages": self.version}
        self.config = self.saver.put(self.config, cp, {"source": "loop", "step": step, "run_id": run_id},
                                     {"messages": self.version})
        self.cp = cp
        self.values.append(value)
        self.ids.append(cp["id"])


def _log(saver_dir: Any) -> str:
    return os.path.join(str(saver_dir), "langgraph", LOG_NAME)


def _history(saver: RuneCheckpointSaver, thread_id: str = "t") -> list[Any]:
    return [t.checkpoint["channel_values"].get("messages")
            for t in reversed(list(saver.list({"configurable": {"thread_id": thread_id}})))]


# ---------------------------------------------------------------- conformance


def test_conformance_suite_passes_every_capability(tmp_path):
    made: list[RuneCheckpointSaver] = []

    @checkpointer_test(name="RuneCheckpointSaver")
    async def factory():
        saver = RuneCheckpointSaver(tmp_path / f"s{len(made)}")
        made.append(saver)
        try:
            yield saver
        finally:
            saver.close()

    report = asyncio.run(validate(factory))
    detected = DetectedCapabilities.from_instance(made[0]).detected
    assert detected == ALL_CAPABILITIES
    failures = {name: r.failures for name, r in report.results.items() if r.passed is not True}
    assert not failures, failures
    assert report.conformance_level() == "FULL"
    assert sum(r.tests_passed for r in report.results.values()) >= 80


def test_import_rune_fast_does_not_import_langgraph():
    code = ("import sys, rune_fast, rune_fast.integrations; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_public_names_and_versions(tmp_path):
    import rune_fast.integrations.langgraph as mod
    assert sorted(mod.__all__) == ["LOG_NAME", "MAGIC", "RuneCheckpointSaver"]
    with RuneCheckpointSaver(tmp_path) as saver:
        v1 = saver.get_next_version(None, None)
        v2 = saver.get_next_version(v1, None)
        assert v1 < v2 and v1.split(".")[0] == "0" * 31 + "1" and v2.split(".")[0].endswith("2")
        assert saver.get_next_version(7, None).startswith("0" * 31 + "8.")
        assert repr(saver) == f"RuneCheckpointSaver({str(tmp_path)!r})"


# ---------------------------------------------------------------- size and round trip


@pytest.mark.parametrize("incremental", [True, False])
def test_growing_history_costs_linear_bytes_and_round_trips(tmp_path, incremental):
    steps = 120
    with RuneCheckpointSaver(tmp_path, incremental=incremental) as saver:
        run = _Run(saver)
        msgs: list[Any] = []
        for step in range(steps):
            msgs = msgs + _messages(step)
            run.put(step, msgs)
        whole = len(JsonPlusSerializer().dumps_typed(msgs)[1])
        # Each version whole would be about steps / 2 times the last value.
        assert saver.disk_bytes() < 2 * whole
        assert _history(saver) == run.values
    with RuneCheckpointSaver(tmp_path) as again:
        assert _history(again) == run.values
        newest = again.get_tuple({"configurable": {"thread_id": "t"}})
        assert newest is not None and newest.checkpoint["channel_values"]["messages"] == msgs
        assert newest.checkpoint["id"] == run.ids[-1]


def test_incremental_bytes_equal_a_whole_serialization(tmp_path):
    serde = JsonPlusSerializer()
    with RuneCheckpointSaver(tmp_path) as saver:
        run = _Run(saver)
        msgs: list[Any] = []
        for step in range(20):   # crosses the 16- and (with items) header sizes
            msgs = msgs + _messages(step, size=8) + [{"k": step, "b": b"\x00\xff"}]
            run.put(step, msgs)
            blob = saver._threads["t"].last[("", "messages")]
            assert blob.base is not None or step == 0
            assert saver._full(blob) == serde.dumps_typed(msgs)[1]


def test_replaced_and_removed_items_are_stored_whole_and_read_back(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        run = _Run(saver)
        a = _messages(0) + _messages(1)
        run.put(0, a)
        b = [a[0], AIMessage(content="edited", id=a[1].id), *a[2:]]   # an item replaced
        run.put(1, b)
        c = b[:2]                                                      # shrunk
        run.put(2, c)
        d = c + _messages(2)                                           # grows again
        run.put(3, d)
        run.put(4, {"not": "a list"})
        run.put(5, [])
        run.put(6, [1, 2, 3])
        assert _history(saver) == run.values
    with RuneCheckpointSaver(tmp_path) as again:
        assert _history(again) == run.values


def test_a_list_appended_to_or_edited_in_place_is_stored_as_it_is_at_each_put(tmp_path):
    # a reducer that mutates the channel's list instead of building a new one
    with RuneCheckpointSaver(tmp_path) as saver:
        run = _Run(saver)
        items: list[Any] = [{"n": 0}]
        want = []
        for step in range(1, 5):
            items.append({"n": step})           # same list object, one more item
            run.put(step, items)
            want.append([{"n": k} for k in range(step + 1)])
        items[0] = {"n": "replaced"}            # same list object, a slot replaced
        run.put(5, items)
        want.append([{"n": "replaced"}] + [{"n": k} for k in range(1, 5)])
        assert _history(saver) == want
    with RuneCheckpointSaver(tmp_path) as again:
        assert _history(again) == want


def test_an_item_changed_in_place_is_stored_whole_when_not_incremental(tmp_path):
    with RuneCheckpointSaver(tmp_path, incremental=False) as saver:
        run = _Run(saver)
        items = [{"n": 1}, {"n": 2}]
        run.put(0, list(items))
        items[0]["n"] = 99            # mutated in place: bytes differ, stored whole
        run.put(1, list(items) + [{"n": 3}])
        got = _history(saver)
        assert got[1] == [{"n": 99}, {"n": 2}, {"n": 3}]


def test_channels_not_in_new_versions_are_read_from_their_stored_version(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        cp1 = empty_checkpoint()
        cp1["channel_values"] = {"a": [1], "b": "x"}
        cp1["channel_versions"] = {"a": 1, "b": 1}
        c1 = saver.put(cfg, cp1, {}, {"a": 1, "b": 1})
        cp2 = create_checkpoint(cp1, None, 1)
        cp2["channel_values"] = {"a": [1, 2], "b": "x"}
        cp2["channel_versions"] = {"a": 2, "b": 1}
        c2 = saver.put(c1, cp2, {}, {"a": 2})
        cp3 = create_checkpoint(cp2, None, 2)
        cp3["channel_values"] = {"a": [1, 2]}
        cp3["channel_versions"] = {"a": 2, "c": 1}   # c: a version with no value (empty)
        c3 = saver.put(c2, cp3, {}, {"c": 1})
        assert saver.get_tuple(c1).checkpoint["channel_values"] == {"a": [1], "b": "x"}
        assert saver.get_tuple(c2).checkpoint["channel_values"] == {"a": [1, 2], "b": "x"}
        t3 = saver.get_tuple(c3)
        assert t3.checkpoint["channel_values"] == {"a": [1, 2]}
        assert t3.parent_config["configurable"]["checkpoint_id"] == cp2["id"]


# ---------------------------------------------------------------- ids that are not paths


@pytest.mark.parametrize("thread_id", ["a/b", "..", "../../etc/passwd", "x\x00y", "t" * 10_000, "日本語 ü", ""])
def test_any_thread_id_is_data_never_a_path(tmp_path, thread_id):
    with RuneCheckpointSaver(tmp_path) as saver:
        run = _Run(saver, thread_id=thread_id, ns="sub:/..\x00")
        run.put(0, _messages(0))
        saver.put_writes(run.config, [("ch", 1)], "task/../\x00")
        saver.copy_thread(thread_id, thread_id + "-copy")
    with RuneCheckpointSaver(tmp_path) as again:
        for tid in (thread_id, thread_id + "-copy"):
            tup = again.get_tuple({"configurable": {"thread_id": tid, "checkpoint_ns": "sub:/..\x00"}})
            assert tup is not None and tup.config["configurable"]["thread_id"] == tid
            assert tup.pending_writes == [("task/../\x00", "ch", 1)]
    assert sorted(os.listdir(tmp_path)) == ["langgraph"]
    assert sorted(os.listdir(tmp_path / "langgraph")) == [".lock-langgraph", LOG_NAME]


def test_thread_ids_that_cannot_be_stored_are_refused_with_value_error(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        cp = empty_checkpoint()
        with pytest.raises(ValueError, match="thread_id.*UTF-8"):
            saver.put({"configurable": {"thread_id": "bad\ud800", "checkpoint_ns": ""}}, cp, {}, {})
        with pytest.raises(ValueError, match="thread_id: expected a str, got bytes"):
            saver.get_tuple({"configurable": {"thread_id": b"raw"}})
        with pytest.raises(ValueError, match="thread_id.*more than"):
            saver.delete_thread("x" * (1 << 21))
        with pytest.raises(ValueError, match="prune strategy"):
            saver.prune(["t"], strategy="everything")
        # a refused put wrote nothing
        assert saver.disk_bytes() == len(MAGIC)
        # an int thread id is stored as its text, as the SQLite saver does
        out = saver.put({"configurable": {"thread_id": 7, "checkpoint_ns": ""}}, cp, {}, {})
        assert saver.get_tuple({"configurable": {"thread_id": "7"}}).checkpoint["id"] == out["configurable"]["checkpoint_id"]


# ---------------------------------------------------------------- writes


def test_pending_writes_sorted_idempotent_and_special_channels_replace(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        run = _Run(saver)
        run.put(0, [1])
        saver.put_writes(run.config, [("x", "b1"), ("y", "b2")], "task-b", task_path="~2")
        saver.put_writes(run.config, [("x", "a1")], "task-a", task_path="~1")
        saver.put_writes(run.config, [("x", "again")], "task-a", task_path="~1")   # kept: insert-or-ignore
        saver.put_writes(run.config, [(ERROR, "first")], "task-c")
        saver.put_writes(run.config, [(ERROR, "second")], "task-c")                 # replaced
        saver.put_writes(run.config, [(INTERRUPT, {"why": 1})], "task-c")
        # writes_sort_key: (task_path, task_id, idx); INTERRUPT is idx -3, ERROR -1
        want = [("task-c", INTERRUPT, {"why": 1}), ("task-c", ERROR, "second"),
                ("task-a", "x", "a1"), ("task-b", "x", "b1"), ("task-b", "y", "b2")]
        assert saver.get_tuple(run.config).pending_writes == want
    with RuneCheckpointSaver(tmp_path) as again:
        assert again.get_tuple(run.config).pending_writes == want
        again.compact()
        assert again.get_tuple(run.config).pending_writes == want


# ---------------------------------------------------------------- durability


_WRITER = r"""
import sys
sys.path.insert(0, {root!r})
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
from rune_fast.integrations.langgraph import RuneCheckpointSaver
saver = RuneCheckpointSaver({state!r})
config = {{"configurable": {{"thread_id": "crash", "checkpoint_ns": ""}}}}
cp = empty_checkpoint(); msgs = []; version = None
for step in range(100000):
    msgs = msgs + [HumanMessage(content="q" * 300, id=f"h{{step}}"), AIMessage(content="a" * 300, id=f"a{{step}}")]
    version = saver.get_next_version(version, None)
    cp = create_checkpoint(cp, None, step)
    cp["channel_values"] = {{"messages": msgs}}
    cp["channel_versions"] = {{"messages": version}}
    config = saver.put(config, cp, {{"step": step}}, {{"messages": version}})
    saver.put_writes(config, [("w", step)], "task")
    print(step, cp["id"], flush=True)
"""


@pytest.mark.slow
def test_acknowledged_puts_survive_sigkill(tmp_path):
    state = tmp_path / "state"
    acked: list[tuple[int, str]] = []
    with subprocess.Popen([sys.executable, "-c", _WRITER.format(root=ROOT, state=str(state))],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                step, cid = line.split()
                acked.append((int(step), cid))
                if len(acked) >= 60:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
    assert len(acked) == 60, err
    # a put cut short by the kill may be torn: it is dropped with a warning
    with pytest.warns(RecoveryWarning) if _torn(state) else _nothing():
        saver = RuneCheckpointSaver(state)
    with saver:
        for step, cid in acked:
            tup = saver.get_tuple({"configurable": {"thread_id": "crash", "checkpoint_ns": "", "checkpoint_id": cid}})
            assert tup is not None, f"acknowledged checkpoint of step {step} lost"
            assert len(tup.checkpoint["channel_values"]["messages"]) == 2 * (step + 1)
            if step < acked[-1][0]:
                assert tup.pending_writes == [("task", "w", step)]


def _torn(state: Any) -> bool:
    """True if the log ends inside a frame (a put the kill cut short)."""
    import struct
    with open(_log(state), "rb") as f:
        data = f.read()
    pos = len(MAGIC)
    while pos < len(data):
        if len(data) - pos < 12:
            return True
        ln, _ = struct.unpack_from("<IQ", data, pos)
        pos += 12 + ln
    return pos != len(data)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_torn_tail_is_dropped_with_a_warning_and_damage_before_it_raises(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        run = _Run(saver)
        for step in range(3):
            run.put(step, [step])
        size = saver.disk_bytes()
    with open(_log(tmp_path), "ab") as f:
        f.write(b"\x40\x00\x00\x00garbage")      # a frame header promising more than is there
    with pytest.warns(RecoveryWarning, match=f"torn final append.*offset {size}.*kept in"):
        saver = RuneCheckpointSaver(tmp_path)
    with saver:
        assert saver.disk_bytes() == size
        assert _history(saver) == [[0], [1], [2]]
    assert os.path.getsize(_log(tmp_path)) == size
    with open(f"{_log(tmp_path)}.torn-{size}", "rb") as f:
        assert f.read() == b"\x40\x00\x00\x00garbage"
    # flip a byte inside the first frame: a complete frame fails its checksum
    with open(_log(tmp_path), "r+b") as f:
        f.seek(len(MAGIC) + 20)
        b = f.read(1)
        f.seek(len(MAGIC) + 20)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CorruptStateCheckpointError, match=f"checksum.*offset {len(MAGIC)}"):
        RuneCheckpointSaver(tmp_path)
    with open(_log(tmp_path), "r+b") as f:
        f.write(b"NOTMAGIC")
    with pytest.raises(CorruptStateCheckpointError, match="bad magic"):
        RuneCheckpointSaver(tmp_path)


def test_a_with_allowlist_clone_shares_the_log_with_its_original(tmp_path):
    # LangGraph's compile() may hand the graph saver.with_allowlist(...): a
    # copy.copy with another serde. Both must append to one log, one index.
    strict = JsonPlusSerializer(allowed_msgpack_modules=None)    # as under LANGGRAPH_STRICT_MSGPACK
    with RuneCheckpointSaver(tmp_path, serde=strict) as saver:
        clone = saver.with_allowlist([("my_module", "MyType")])
        assert clone is not saver and clone.serde is not saver.serde
        run = _Run(saver)
        for step in range(6):
            run.saver = clone if step % 2 else saver      # puts alternate between the two
            run.put(step, [step])
        assert _history(saver) == _history(clone) == [[s] for s in range(6)]
        clone.compact()
        saver.put_writes(run.config, [("ch", 1)], "task")
        assert clone.get_tuple(run.config).pending_writes == [("task", "ch", 1)]
    with RuneCheckpointSaver(tmp_path) as again:
        assert _history(again) == [[s] for s in range(6)]


def test_a_compaction_cut_short_leaves_the_old_log_and_its_temp_file_is_removed(tmp_path, monkeypatch):
    with RuneCheckpointSaver(tmp_path) as saver:
        run = _Run(saver)
        for step in range(5):
            run.put(step, list(range(step + 1)))
        saver.delete_for_runs(["r"])
        run.put(5, [5])

        def crash(src: str, dst: str) -> None:
            raise KeyboardInterrupt("killed before the rename")
        monkeypatch.setattr(os, "replace", crash)
        with pytest.raises(KeyboardInterrupt):
            saver.compact()
        monkeypatch.undo()
        assert _history(saver) == [[5]]
    # a crash (not an exception) would leave the temp file behind
    stale = tmp_path / "langgraph" / f".{LOG_NAME}.abc123.tmp"
    stale.write_bytes(b"half a compaction")
    with RuneCheckpointSaver(tmp_path) as again:
        assert _history(again) == [[5]]
        assert not stale.exists()
    assert sorted(os.listdir(tmp_path / "langgraph")) == [".lock-langgraph", LOG_NAME]


def test_one_writer_per_state_dir(tmp_path):
    saver = RuneCheckpointSaver(tmp_path)
    with pytest.raises(StateLockedError, match="langgraph"):
        RuneCheckpointSaver(tmp_path)
    saver.close()
    with pytest.raises(StoreClosedError, match=LOG_NAME):
        saver.get_tuple({"configurable": {"thread_id": "t"}})
    RuneCheckpointSaver(tmp_path).close()


def test_threads_share_one_saver(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                run = _Run(saver, thread_id=f"t{n}")
                msgs: list[Any] = []
                for step in range(15):
                    msgs = msgs + _messages(step, size=20)
                    run.put(step, msgs)
            except BaseException as exc:  # reported below
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors
    with RuneCheckpointSaver(tmp_path) as again:
        for n in range(4):
            hist = _history(again, f"t{n}")
            assert [len(h) for h in hist] == [2 * (s + 1) for s in range(15)]


# ---------------------------------------------------------------- reclaiming


def test_prune_keeps_the_newest_and_reclaims_old_versions(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        run = _Run(saver)
        other = _Run(saver, thread_id="other")
        msgs: list[Any] = []
        for step in range(60):
            msgs = msgs + _messages(step)
            run.put(step, msgs)
            other.put(step, [step])
        # a replaced first item: the newest version is stored whole, the old chain is garbage
        msgs = [AIMessage(content="summary", id="s")] + msgs[1:]
        run.put(60, msgs)
        saver.put_writes(run.config, [("ch", "v")], "task")
        before = saver.disk_bytes()
        saver.prune(["t"], strategy="keep_latest")
        after = saver.disk_bytes()
        whole = len(JsonPlusSerializer().dumps_typed(msgs)[1])
        assert after < before / 1.5
        assert after < whole + 60 * 1024
        got = list(saver.list({"configurable": {"thread_id": "t"}}))
        assert [t.checkpoint["id"] for t in got] == [run.ids[-1]]
        assert got[0].checkpoint["channel_values"]["messages"] == msgs
        assert got[0].pending_writes == [("task", "ch", "v")]
        assert _history(saver, "other") == [[s] for s in range(60)]
    with RuneCheckpointSaver(tmp_path) as again:
        assert again.get_tuple({"configurable": {"thread_id": "t"}}).checkpoint["channel_values"]["messages"] == msgs
        assert _history(again, "other") == [[s] for s in range(60)]
        again.prune(["t", "missing"], strategy="delete")
        assert again.get_tuple({"configurable": {"thread_id": "t"}}) is None
        assert _history(again, "other") == [[s] for s in range(60)]


def test_compaction_keeps_deltas_and_every_live_checkpoint(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        keep = _Run(saver, thread_id="keep")
        gone = _Run(saver, thread_id="gone")
        msgs: list[Any] = []
        for step in range(40):
            msgs = msgs + _messages(step)
            keep.put(step, msgs, run_id=f"run{step // 10}")
            gone.put(step, msgs)
        saver.delete_thread("gone")
        saver.delete_for_runs(["run1"])        # steps 10..19 of "keep"
        reclaimed = saver.compact()
        assert reclaimed > 0
        whole = len(JsonPlusSerializer().dumps_typed(msgs)[1])
        assert saver.disk_bytes() < 2 * whole
        hist = _history(saver, "keep")
        want = [v for i, v in enumerate(keep.values) if not 10 <= i < 20]
        assert hist == want
        assert saver.get_tuple({"configurable": {"thread_id": "gone"}}) is None
        # the saver keeps storing deltas after a compaction
        size = saver.disk_bytes()
        msgs = msgs + _messages(40)
        keep.put(40, msgs)
        assert saver.disk_bytes() - size < 4096
    with RuneCheckpointSaver(tmp_path) as again:
        assert _history(again, "keep") == want + [msgs]


def test_copy_thread_survives_deleting_the_source_and_compaction(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        src = _Run(saver, thread_id="src")
        msgs: list[Any] = []
        for step in range(10):
            msgs = msgs + _messages(step)
            src.put(step, msgs)
        saver.put_writes(src.config, [("ch", 1)], "task")
        saver.copy_thread("src", "dst")
        saver.delete_thread("src")
        saver.compact()
        assert _history(saver, "dst") == src.values
        assert saver.get_tuple({"configurable": {"thread_id": "dst"}}).pending_writes == [("task", "ch", 1)]
        dst = _Run(saver, thread_id="dst")
        dst.config = saver.get_tuple({"configurable": {"thread_id": "dst"}}).config
        dst.version = src.version
        dst.cp = src.cp
        msgs = msgs + _messages(10)
        dst.put(10, msgs)
    with RuneCheckpointSaver(tmp_path) as again:
        assert _history(again, "dst") == src.values + [msgs]


def test_list_filters_before_limit_and_all_threads(tmp_path):
    with RuneCheckpointSaver(tmp_path) as saver:
        a = _Run(saver, thread_id="a")
        b = _Run(saver, thread_id="b", ns="child")
        for step in range(4):
            a.put(step, [step], run_id=f"r{step % 2}")
            b.put(step, [step], run_id="rb")
        everything = list(saver.list(None))
        assert [t.checkpoint["id"] for t in everything] == sorted(a.ids + b.ids, reverse=True)
        assert len(list(saver.list(None, filter={"run_id": "r1"}))) == 2
        assert [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "a"}},
                                                       before={"configurable": {"checkpoint_id": a.ids[2]}},
                                                       limit=1)] == [a.ids[1]]
        assert list(saver.list({"configurable": {"thread_id": "a"}}, limit=0)) == []
        assert list(saver.list({"configurable": {"thread_id": "b", "checkpoint_ns": ""}})) == []
        assert len(list(saver.list({"configurable": {"thread_id": "b", "checkpoint_ns": "child"}}))) == 4


# ---------------------------------------------------------------- a real graph


class State(TypedDict):
    messages: Annotated[list, add_messages]


def _graph(saver: RuneCheckpointSaver) -> Any:
    def agent(state: State) -> dict[str, Any]:
        last = state["messages"][-1]
        return {"messages": [AIMessage(content="echo: " + str(last.content), id=str(uuid.uuid4()))]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=saver)


def test_a_langgraph_graph_runs_and_resumes_on_the_saver(tmp_path):
    config = {"configurable": {"thread_id": "chat/1"}}
    with RuneCheckpointSaver(tmp_path) as saver:
        graph = _graph(saver)
        for i in range(5):
            graph.invoke({"messages": [HumanMessage(content=f"hi {i}", id=f"u{i}")]}, config)
        state = graph.get_state(config)
        assert len(state.values["messages"]) == 10
        history = list(graph.get_state_history(config))
        assert len(history) >= 10
    with RuneCheckpointSaver(tmp_path) as again:
        graph = _graph(again)
        out = graph.invoke({"messages": [HumanMessage(content="after reopen", id="u5")]}, config)
        assert [m.content for m in out["messages"]][-2:] == ["after reopen", "echo: after reopen"]
        assert len(out["messages"]) == 12
        # RemoveMessage: the list shrinks, and reads back shrunk
        graph.update_state(config, {"messages": [RemoveMessage(id="u0")]})
        assert len(graph.get_state(config).values["messages"]) == 11


def test_a_langgraph_graph_runs_async(tmp_path):
    async def main() -> int:
        async with RuneCheckpointSaver(tmp_path) as saver:
            graph = _graph(saver)
            config = {"configurable": {"thread_id": "async"}}
            for i in range(3):
                await graph.ainvoke({"messages": [HumanMessage(content=f"hi {i}", id=f"u{i}")]}, config)
            state = await graph.aget_state(config)
            return len(state.values["messages"])

    assert asyncio.run(main()) == 6


def test_bench_runs_at_a_small_size(tmp_path, capsys):
    from bench import langgraph_compare
    assert langgraph_compare.main(["--steps", "4", "--get-every", "2", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| bytes on disk |" in out and "| put, median |" in out and "list of the whole thread (4" in out
    assert os.listdir(tmp_path) == []
