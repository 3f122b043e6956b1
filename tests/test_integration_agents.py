"""rune_fast.integrations.agents: the OpenAI Agents SDK ``Session``.

Run against the real SDK with a fake ``Model`` (no network, no API key,
tracing off)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.memory import Session, SessionSettings  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import (  # noqa: E402
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import rune_fast  # noqa: E402
from rune_fast import ConversationMessageRecord, ConversationStateRepository  # noqa: E402
from rune_fast.errors import CorruptStateCheckpointError, StateLockedError, StoreClosedError  # noqa: E402
from rune_fast.integrations import agents as rfa  # noqa: E402
from rune_fast.integrations.agents import RuneSession  # noqa: E402
from _kill_support import kill_after_acks  # noqa: E402

set_tracing_disabled(True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------ a fake model


class FakeModel(Model):
    """Answers each call with the next list of output items; remembers the
    input it was given."""

    def __init__(self, turns):
        self.turns = list(turns)
        self.inputs = []
        self._lock = threading.Lock()

    def _next(self, input):
        with self._lock:
            self.inputs.append(input if isinstance(input, str) else list(input))
            return self.turns.pop(0)

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                           handoffs, tracing, *, previous_response_id=None, conversation_id=None,
                           prompt=None, **kwargs):
        return ModelResponse(output=self._next(input), usage=Usage(), response_id=None)

    async def stream_response(self, system_instructions, input, model_settings, tools, output_schema,
                              handoffs, tracing, *, previous_response_id=None, conversation_id=None,
                              prompt=None, **kwargs):
        out = self._next(input)
        yield ResponseCompletedEvent(
            type="response.completed", sequence_number=0,
            response=Response(id="resp_1", created_at=0, model="fake", object="response", output=out,
                              parallel_tool_calls=False, tool_choice="auto", tools=[]))


def said(text, mid="msg_1"):
    return ResponseOutputMessage(id=mid, type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


# a mix of what the SDK stores: messages, tool calls and their outputs,
# reasoning, items with no role, unicode, nesting
ITEMS = [
    {"role": "user", "content": "add 1 and 2 ✓"},
    {"role": "developer", "content": "be brief"},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add",
     "arguments": "{\"a\":1,\"b\":2}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "3"},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "3 — done", "annotations": []}]},
    {"type": "item_reference", "id": "ref_1"},
    {"weird": [1, 2.5, None, True, {"deep": ["x" * 3, {"z": -1}]}], "big": 2 ** 70, "empty": {}},
]


# ----------------------------------------------------------------- imports


def test_import_rune_fast_imports_no_framework():
    code = ("import sys, rune_fast, rune_fast.integrations; "
            "print(sorted(m for m in ('agents', 'langchain_core', 'langchain', 'openai') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_is_an_sdk_session(tmp_path):
    with RuneSession("s", tmp_path) as s:
        assert isinstance(s, Session)
        assert s.session_id == "s"
        assert isinstance(s.session_settings, SessionSettings)
        assert s.channel_id == "agents:s"


# ----------------------------------------------------------- items, order


def test_items_come_back_equal_in_order(tmp_path):
    with RuneSession("s", tmp_path) as s:
        run(s.add_items(ITEMS[:3]))
        run(s.add_items(ITEMS[3:]))
        assert run(s.get_items()) == ITEMS
    with RuneSession("s", tmp_path) as s:     # and after the store is reopened
        assert run(s.get_items()) == ITEMS


def test_identical_items_are_two_items(tmp_path):
    item = {"id": "msg_same", "role": "user", "content": "again"}
    with RuneSession("s", tmp_path) as s:
        run(s.add_items([item, dict(item)]))
        run(s.add_items([item]))
        assert run(s.get_items()) == [item] * 3
        ids = [r.msg_id for r in s.repository.window(s.channel_id, 10)]
        assert len(set(ids)) == 3 and "msg_same" not in ids
        assert run(s.pop_item()) == item
        assert run(s.get_items()) == [item] * 2


def test_insertion_order_holds_when_the_clock_stands_still(tmp_path, monkeypatch):
    # frozen at the present: the process-wide id generator keeps its last
    # millisecond, so a clock frozen in the future would leak into later tests
    frozen_ns = time.time_ns()
    frozen_s = frozen_ns / 1e9
    monkeypatch.setattr(time, "time", lambda: frozen_s)
    monkeypatch.setattr(time, "time_ns", lambda: frozen_ns)
    expected = [{"role": "user", "content": f"item {i}"} for i in range(300)]
    # hot_window=0: a compaction moves every message to the cool tier
    with RuneSession("tick", tmp_path, hot_window=0) as s:
        for i in range(0, 200):
            run(s.add_items([expected[i]]))
        run(s.add_items(expected[200:250]))
        recs = s.repository.window(s.channel_id, 1000)
        assert {r.ts for r in recs} == {frozen_s}
        assert run(s.get_items()) == expected[:250]
        s.repository.compact()
        assert s.repository.stats()["cool"] == 250
        run(s.add_items(expected[250:]))           # cool and hot together
        assert run(s.get_items()) == expected
        assert run(s.get_items(70)) == expected[-70:]
    with RuneSession("tick", tmp_path, hot_window=0) as s:
        assert run(s.get_items()) == expected
        assert run(s.pop_item()) == expected[-1]
        s.repository.compact()
        assert run(s.get_items()) == expected[:-1]


def test_tuples_are_arrays(tmp_path):
    with RuneSession("s", tmp_path) as s:
        run(s.add_items([{"a": (1, 2, ("x",))}]))
        assert run(s.get_items()) == [{"a": [1, 2, ["x"]]}]


def test_records_fields(tmp_path):
    with RuneSession("s", tmp_path) as s:
        run(s.add_items(ITEMS))
        recs = s.repository.window("agents:s", 100)
    assert [r.role for r in recs] == ["user", "system", "assistant", "assistant", "tool", "assistant",
                                      "assistant", "assistant"]
    assert {r.origin for r in recs} == {"agents.item/1"}
    assert {r.channel_id for r in recs} == {"agents:s"}
    assert recs[4].tool_call_id == "call_1"
    assert all(r.msg_id.startswith("msg_") for r in recs)
    assert [r.msg_id for r in recs] == sorted(r.msg_id for r in recs)
    import json
    assert [json.loads(r.content) for r in recs] == ITEMS
    assert recs[0].content == json.dumps(ITEMS[0], ensure_ascii=False, separators=(",", ":"))


def test_search_finds_item_text(tmp_path):
    with RuneSession("s", tmp_path) as s:
        run(s.add_items(ITEMS))
        hits = s.repository.search("done", channel_id=s.channel_id)
        assert len(hits) == 1


# ------------------------------------------------------------------ limits


def test_get_items_limit(tmp_path):
    items = [{"role": "user", "content": str(i)} for i in range(10)]
    with RuneSession("s", tmp_path, session_settings=SessionSettings(limit=3)) as s:
        run(s.add_items(items))
        assert run(s.get_items()) == items[-3:]           # the settings' limit
        assert run(s.get_items(5)) == items[-5:]          # an explicit argument wins
        assert run(s.get_items(0)) == []
        assert run(s.get_items(100)) == items
        s.session_settings = SessionSettings(limit=4)     # read at call time
        assert run(s.get_items()) == items[-4:]
        s.session_settings.limit = None
        assert run(s.get_items()) == items
        with pytest.raises(ValueError, match="limit"):
            run(s.get_items(-1))
        with pytest.raises(TypeError, match="limit"):
            run(s.get_items("3"))
    with RuneSession("s", tmp_path, session_settings={"limit": 2}) as s:
        assert run(s.get_items()) == items[-2:]


# ------------------------------------------------------------- pop, clear


def test_pop_item(tmp_path):
    with RuneSession("s", tmp_path) as s:
        assert run(s.pop_item()) is None
        run(s.add_items(ITEMS))
        assert run(s.pop_item()) == ITEMS[-1]
        assert run(s.pop_item()) == ITEMS[-2]
        assert run(s.get_items()) == ITEMS[:-2]
    with RuneSession("s", tmp_path) as s:
        assert run(s.get_items()) == ITEMS[:-2]


def test_concurrent_pops_never_share_an_item(tmp_path):
    items = [{"role": "user", "content": str(i)} for i in range(120)]
    with RuneSession("s", tmp_path) as s:
        run(s.add_items(items))
    got: list = []
    lock = threading.Lock()

    def popper():
        async def work():
            with RuneSession("s", tmp_path) as mine:
                while (item := await mine.pop_item()) is not None:
                    with lock:
                        got.append(item)
        asyncio.run(work())

    threads = [threading.Thread(target=popper) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(items)
    assert sorted(got, key=lambda i: int(i["content"])) == items


def test_clear_session_clears_only_its_own(tmp_path):
    with RuneSession("a", tmp_path) as a, RuneSession("b", tmp_path) as b:
        run(a.add_items(ITEMS))
        run(b.add_items(ITEMS[:2]))
        run(a.clear_session())
        assert run(a.get_items()) == []
        assert run(b.get_items()) == ITEMS[:2]
        run(a.add_items(ITEMS[:1]))
        assert run(a.get_items()) == ITEMS[:1]


# ---------------------------------------------------------- bad input


def test_add_empty_does_nothing(tmp_path):
    with RuneSession("s", tmp_path) as s:
        run(s.add_items([]))
        assert run(s.get_items()) == []
        assert s.repository.stats()["messages"] == 0


class Opaque:
    pass


@pytest.mark.parametrize("bad", [
    {"x": {1, 2}},
    {"x": float("nan")},
    {"x": float("inf")},
    {1: "int key"},
    {"x": {"y": {(1, 2): "tuple key"}}},
    {"x": Opaque()},
    {"x": b"bytes"},
    {"x": "lone \ud800 surrogate"},
    "not a dict",
    ["a", "list"],
    None,
])
def test_unencodable_item_stores_nothing_of_its_batch(tmp_path, bad):
    with RuneSession("s", tmp_path) as s:
        run(s.add_items(ITEMS[:1]))
        with pytest.raises(TypeError, match="item 1"):
            run(s.add_items([ITEMS[1], bad, ITEMS[2]]))
        assert run(s.get_items()) == ITEMS[:1]
        run(s.add_items(ITEMS[1:3]))                 # still usable
        assert run(s.get_items()) == ITEMS[:3]


def test_cyclic_item_is_refused(tmp_path):
    item: dict = {"role": "user"}
    item["self"] = item
    with RuneSession("s", tmp_path) as s:
        with pytest.raises(TypeError, match="item 0"):
            run(s.add_items([item]))
        assert run(s.get_items()) == []


@pytest.mark.parametrize("sid", ["a/b", "../../etc/passwd", "..", "/", "nul\x00byte", "x" * 10_000,
                                 "line\nbreak", "ünïcødé ✓", " "])
def test_session_ids_never_become_paths(tmp_path, sid):
    state = tmp_path / "state"
    item = {"role": "user", "content": "hi"}
    with RuneSession(sid, state) as s, RuneSession("other", state) as other:
        run(s.add_items([item]))
        assert run(s.get_items()) == [item]
        assert run(other.get_items()) == []
    with RuneSession(sid, state) as s:
        assert run(s.get_items()) == [item]
    assert sorted(os.listdir(tmp_path)) == ["state"]
    for dirpath, dirnames, filenames in os.walk(state):
        for name in dirnames + filenames:
            assert sid not in name or sid in ("/", " ", "..")
            assert len(name) < 100


@pytest.mark.parametrize("sid, exc", [("", ValueError), ("bad \udc80", ValueError), (None, TypeError),
                                      (b"bytes", TypeError), (42, TypeError)])
def test_bad_session_ids_are_refused(tmp_path, sid, exc):
    with pytest.raises(exc, match="session_id"):
        RuneSession(sid, tmp_path)


# ------------------------------------------------ sharing, threads, loops


def test_sessions_share_one_store_per_directory(tmp_path):
    a = RuneSession("a", tmp_path)
    b = RuneSession("b", str(tmp_path) + "/.")
    c = RuneSession("a", tmp_path)
    assert a.repository is b.repository is c.repository
    run(a.add_items(ITEMS[:2]))
    assert run(c.get_items()) == ITEMS[:2]         # another object, same session, while a is open
    a.close()
    b.close()
    with pytest.raises(StateLockedError):           # c still holds the store
        ConversationStateRepository(tmp_path)
    c.close()
    repo = ConversationStateRepository(tmp_path)    # the last close released it
    assert [r.channel_id for r in repo.window("agents:a", 5)] == ["agents:a"] * 2
    repo.close()


def test_an_unclosed_session_releases_the_store_when_collected(tmp_path):
    import gc
    s = RuneSession("a", tmp_path)
    run(s.add_items(ITEMS[:1]))
    del s
    gc.collect()
    repo = ConversationStateRepository(tmp_path)
    repo.close()


def test_other_options_on_a_shared_store_are_refused(tmp_path):
    with RuneSession("a", tmp_path, durability="batch"):
        with pytest.raises(ValueError, match="durability"):
            RuneSession("b", tmp_path)
        with RuneSession("b", tmp_path, durability="batch") as b:
            assert b.repository.durability == "batch"


def test_caller_owned_repository(tmp_path):
    repo = ConversationStateRepository(tmp_path)
    try:
        with RuneSession("a", repository=repo) as s:
            run(s.add_items(ITEMS))
        assert len(repo.window("agents:a", 100)) == len(ITEMS)     # left open
    finally:
        repo.close()
    with pytest.raises(TypeError, match="exactly one"):
        RuneSession("a")
    with pytest.raises(TypeError, match="exactly one"):
        RuneSession("a", tmp_path, repository=repo)


def test_many_sessions_threads_and_loops(tmp_path):
    per = 25
    errors: list = []

    def worker(w):
        async def work():
            sessions = [RuneSession(f"s{w % 3}", tmp_path), RuneSession("common", tmp_path)]
            try:
                for i in range(per):
                    await asyncio.gather(*(s.add_items([{"w": w, "i": i}]) for s in sessions))
            finally:
                for s in sessions:
                    s.close()
        try:
            asyncio.run(work())
        except BaseException as exc:   # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with RuneSession("common", tmp_path) as s:
        common = run(s.get_items())
        assert len(common) == 6 * per
        for w in range(6):          # each writer's items in its own order
            assert [i["i"] for i in common if i["w"] == w] == list(range(per))
        for k in range(3):
            mine = run(RuneSession(f"s{k}", repository=s.repository).get_items())
            assert sorted((i["w"], i["i"]) for i in mine) == sorted(
                (w, i) for w in range(6) if w % 3 == k for i in range(per))


# ------------------------------------------------------------------ close


def test_closed_session_refuses_every_call(tmp_path):
    s = RuneSession("s", tmp_path)
    run(s.add_items(ITEMS[:1]))
    s.close()
    s.close()       # a no-op
    assert s.closed
    for call in (s.get_items(), s.get_items(0), s.add_items([]), s.add_items(ITEMS), s.pop_item(),
                 s.clear_session(), s.branch_from_turn(1, "b")):
        with pytest.raises(StoreClosedError, match="closed"):
            run(call)
    with pytest.raises(StoreClosedError, match="closed"):
        s.repository
    with RuneSession("s", tmp_path) as again:          # the items stayed
        assert run(again.get_items()) == ITEMS[:1]


# ------------------------------------------------------------- damage


def _damage(state_dir, needle: bytes):
    path = os.path.join(state_dir, "hot", "conversation_tail.jsonl")
    with open(path, "r+b") as f:
        data = f.read()
        at = data.index(needle)
        f.seek(at)
        f.write(bytes([needle[0] ^ 0x20]))


def test_a_damaged_item_is_reported(tmp_path):
    items = [{"role": "user", "content": f"entry number {i}"} for i in range(5)]
    with RuneSession("s", tmp_path) as s:
        run(s.add_items(items))
    _damage(tmp_path, b"entry number 3")
    with RuneSession("s", tmp_path) as s:
        with pytest.raises(CorruptStateCheckpointError) as info:
            run(s.get_items())
        assert "conversation_tail.jsonl" in str(info.value)
        assert any("agents session 's'" in n for n in info.value.__notes__)
        assert run(s.get_items(1)) == items[-1:]      # the sound newest one reads
        assert run(s.pop_item()) == items[-1]
        with pytest.raises(CorruptStateCheckpointError):
            run(s.pop_item())                          # the damaged one is not dropped silently
        with pytest.raises(CorruptStateCheckpointError):
            run(s.get_items())


def test_a_foreign_record_in_the_channel_is_reported(tmp_path):
    with RuneSession("s", tmp_path) as s:
        run(s.add_items(ITEMS[:1]))
        s.repository.append(ConversationMessageRecord(role="user", content="plain text",
                                                      channel_id="agents:s"))
        with pytest.raises(CorruptStateCheckpointError, match="origin"):
            run(s.get_items())
        s.repository.append(ConversationMessageRecord(role="user", content="{not json",
                                                      channel_id="agents:s", origin="agents.item/1"))
        with pytest.raises(CorruptStateCheckpointError, match="JSON"):
            run(s.get_items(1))
        with pytest.raises(CorruptStateCheckpointError, match="JSON"):
            run(s.pop_item())
        assert len(s.repository.window("agents:s", 10)) == 3     # nothing popped


def test_other_channels_of_an_existing_store_are_untouched(tmp_path):
    repo = ConversationStateRepository(tmp_path)
    plain = [ConversationMessageRecord(role="user", content=f"m{i}", channel_id="chat") for i in range(3)]
    repo.append_many(plain)
    repo.close()
    with RuneSession("chat", tmp_path) as s:            # the channel differs: "agents:chat"
        assert run(s.get_items()) == []
        run(s.add_items(ITEMS))
        run(s.clear_session())
        assert s.repository.window("chat", 10) == plain


# ------------------------------------------------------------ durability

CHILD = r"""
import asyncio, sys
from rune_fast.integrations.agents import RuneSession

async def main():
    s = RuneSession("crash/../\x00id", sys.argv[1])
    i = 0
    while True:
        await s.add_items([{"role": "user", "content": f"q{i}"},
                           {"type": "function_call_output", "call_id": f"c{i}", "output": "x" * (i % 50)}])
        print(i, flush=True)
        i += 1

asyncio.run(main())
"""


def expected_child_items(n):
    out = []
    for i in range(n):
        out += [{"role": "user", "content": f"q{i}"},
                {"type": "function_call_output", "call_id": f"c{i}", "output": "x" * (i % 50)}]
    return out


def test_acknowledged_items_survive_sigkill(tmp_path):
    acked = kill_after_acks(CHILD, str(tmp_path))
    with RuneSession("crash/../\x00id", tmp_path) as s:
        items = run(s.get_items())
    n = acked + 1
    assert len(items) >= 2 * n
    assert items == expected_child_items(len(items) // 2 + 1)[:len(items)]


# ----------------------------------------------------------- branching


def test_branch_from_turn(tmp_path):
    turn1 = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "1"}]
    turn2 = [{"role": "user", "content": "two"}, {"type": "function_call", "call_id": "c", "name": "f",
                                                  "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": "ok"}]
    turn3 = [{"role": "user", "content": "three"}, {"role": "assistant", "content": "3"}]
    with RuneSession("main", tmp_path) as s:
        run(s.add_items(turn1 + turn2 + turn3))
        with run(s.branch_from_turn(3, "alt")) as b:
            assert b.session_id == "alt"
            assert run(b.get_items()) == turn1 + turn2
            run(b.add_items([{"role": "user", "content": "three, but otherwise"}]))
        with run(s.branch_from_turn(1, "empty-branch")) as b:
            assert run(b.get_items()) == []
        assert run(s.get_items()) == turn1 + turn2 + turn3
        with pytest.raises(ValueError, match="turn 4"):
            run(s.branch_from_turn(4, "nope"))
        with pytest.raises(ValueError, match="already holds"):
            run(s.branch_from_turn(2, "alt"))
        with pytest.raises(TypeError, match="turn_number"):
            run(s.branch_from_turn("2", "x"))
    with RuneSession("alt", tmp_path) as b:      # durable, on its own
        assert run(b.get_items()) == turn1 + turn2 + [{"role": "user", "content": "three, but otherwise"}]


# ----------------------------------------------------------- the Runner


def test_runner_run_with_tool_call(tmp_path):
    model = FakeModel([
        [ResponseFunctionToolCall(id="fc_1", type="function_call", call_id="call_1", name="add",
                                  arguments='{"a":1,"b":2}')],
        [said("3")],
        [said("you asked to add", mid="msg_2")],
    ])
    agent = Agent(name="calc", model=model, tools=[add])
    with RuneSession("run", tmp_path) as s:
        result = run(Runner.run(agent, "add 1 and 2", session=s))
        assert result.final_output == "3"
        items = run(s.get_items())
        assert [i.get("type", "message") for i in items] == ["message", "function_call",
                                                             "function_call_output", "message"]
        assert items[0] == {"content": "add 1 and 2", "role": "user"}
        assert items[2]["output"] == "3"
    with RuneSession("run", tmp_path) as s:       # a later run sees the stored history
        result = run(Runner.run(agent, "what did I ask?", session=s))
        assert result.final_output == "you asked to add"
        assert model.inputs[-1][:4] == items
        assert len(run(s.get_items())) == 6


def test_runner_run_sync_from_a_worker_thread(tmp_path):
    model = FakeModel([[said("a")], [said("b")]])
    agent = Agent(name="t", model=model)
    out: list = []

    def work():
        # run_sync runs on the thread's default loop and leaves it open: this
        # test makes that loop and closes it
        policy = asyncio.get_event_loop_policy()
        loop = policy.new_event_loop()
        policy.set_event_loop(loop)
        try:
            with RuneSession("thread", tmp_path) as s:
                out.append(Runner.run_sync(agent, "first", session=s).final_output)
                out.append(Runner.run_sync(agent, "second", session=s).final_output)
                out.append(run(s.get_items()))
        finally:
            loop.close()
            policy.set_event_loop(None)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out[:2] == ["a", "b"]
    assert [i["role"] for i in out[2]] == ["user", "assistant", "user", "assistant"]
    assert model.inputs[1][:2] == out[2][:2]


def test_runner_streaming(tmp_path):
    model = FakeModel([[said("streamed")], [said("again")]])
    agent = Agent(name="s", model=model)

    async def go(s, text):
        result = Runner.run_streamed(agent, text, session=s)
        async for _event in result.stream_events():
            pass
        return result.final_output

    with RuneSession("stream", tmp_path) as s:
        assert run(go(s, "hello")) == "streamed"
        assert run(go(s, "more")) == "again"
        items = run(s.get_items())
    assert [(i["role"], i.get("type", "message")) for i in items] == [
        ("user", "message"), ("assistant", "message")] * 2
    assert model.inputs[1][:2] == items[:2]


def test_runner_honours_the_session_limit(tmp_path):
    model = FakeModel([[said("x")], [said("y")], [said("z")]])
    agent = Agent(name="l", model=model)
    with RuneSession("lim", tmp_path, session_settings=SessionSettings(limit=2)) as s:
        for text in ("q1", "q2"):
            run(Runner.run(agent, text, session=s))
        assert len(model.inputs[1]) == 3                # two remembered + the new question
        run(Runner.run(agent, "q3", session=s, run_config=RunConfig(session_settings=SessionSettings(limit=4))))
        assert len(model.inputs[2]) == 5
        assert len(run(s.get_items(None))) == 2
        assert len(run(s.get_items(10))) == 6


def test_public_names():
    assert set(rfa.__all__) == {"CHANNEL_PREFIX", "ORIGIN", "RuneSession", "item_role"}
    assert "integrations" not in rune_fast.__all__


def test_bad_settings_take_no_store(tmp_path):
    with pytest.raises(ValueError):
        RuneSession("s", tmp_path, session_settings={"limit": "many"})
    with pytest.raises(TypeError):
        RuneSession("s", tmp_path, session_settings={"bogus": 1})
    ConversationStateRepository(tmp_path).close()       # the store was never taken


def test_another_process_is_locked_out(tmp_path):
    code = ("import sys\nfrom rune_fast.integrations.agents import RuneSession\n"
            "try:\n    RuneSession('s', sys.argv[1])\nexcept Exception as exc:\n"
            "    print(type(exc).__name__)\n")
    with RuneSession("s", tmp_path):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True,
                             text=True, check=True, env=dict(os.environ, PYTHONPATH=ROOT)).stdout
    assert out.strip() == "StateLockedError"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_share_its_parents_store(tmp_path):
    with RuneSession("s", tmp_path) as s:
        run(s.add_items(ITEMS[:1]))
        read_end, write_end = os.pipe()
        with warnings.catch_warnings():     # (3.12+ warns of forking with threads alive)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:            # the child: report, never return into pytest
            code = 1
            try:
                try:
                    RuneSession("s", tmp_path)
                    answer = b"shared"
                except StateLockedError:
                    answer = b"locked"
                s.close()       # releasing the inherited reference closes nothing
                os.write(write_end, answer)
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as f:
            answer = f.read()
        _pid, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0 and answer == b"locked"
        assert not s.closed
        run(s.add_items(ITEMS[1:2]))        # the parent's store is still open and writable
        assert run(s.get_items()) == ITEMS[:2]


@pytest.mark.parametrize("state_dir, exc", [("", ValueError), (42, TypeError), (b"bytes", TypeError)])
def test_bad_state_dir_is_refused(tmp_path, monkeypatch, state_dir, exc):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(exc, match="state_dir"):
        RuneSession("s", state_dir)
    assert os.listdir(tmp_path) == []
