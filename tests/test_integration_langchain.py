"""rune_fast.integrations.langchain: a ``BaseChatMessageHistory``.

Run against the real langchain-core with fake chat models (no network)."""
from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading

import pytest

pytest.importorskip("langchain_core")

from langchain_core._api.deprecation import LangChainDeprecationWarning  # noqa: E402
from langchain_core.chat_history import BaseChatMessageHistory  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    get_buffer_string,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402
from langchain_core.runnables.history import RunnableWithMessageHistory  # noqa: E402

from rune_fast import ConversationMessageRecord, ConversationStateRepository  # noqa: E402
from rune_fast.errors import CorruptStateCheckpointError, StateLockedError, StoreClosedError  # noqa: E402
from rune_fast.integrations import langchain as rfl  # noqa: E402
from rune_fast.integrations.langchain import RuneChatMessageHistory  # noqa: E402
from _kill_support import kill_after_acks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MESSAGES = [
    SystemMessage("you are terse"),
    HumanMessage("what is 2+3? ✓"),
    AIMessage("", tool_calls=[{"name": "add", "args": {"a": 2, "b": 3}, "id": "call_1"}]),
    ToolMessage("5", tool_call_id="call_1", name="add"),
    AIMessage("5 — done", id="run-1", response_metadata={"model": "fake", "finish": "stop"},
              usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}),
    HumanMessage([{"type": "text", "text": "and this?"}, {"type": "image_url", "image_url": {"url": "x"}}],
                 name="ann", additional_kwargs={"k": [1, None, 2.5]}),
    ChatMessage(role="critic", content="fine"),
    FunctionMessage(name="f", content="legacy"),
    AIMessageChunk(content="chunk"),
]


def test_import_rune_fast_imports_no_framework():
    code = ("import sys, rune_fast, rune_fast.integrations; "
            "print([m for m in ('langchain_core', 'langchain', 'agents') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_messages_come_back_equal(tmp_path):
    with RuneChatMessageHistory("s", tmp_path) as h:
        assert isinstance(h, BaseChatMessageHistory)
        assert h.messages == []
        h.add_messages(MESSAGES[:4])
        h.add_messages(MESSAGES[4:])
        got = h.messages
        assert got == MESSAGES
        assert [type(m) for m in got] == [type(m) for m in MESSAGES]
        assert [m.id for m in got] == [m.id for m in MESSAGES]            # no ids invented
        assert got[2].tool_calls == MESSAGES[2].tool_calls
        assert got[3].tool_call_id == "call_1"
    with RuneChatMessageHistory("s", tmp_path) as h:     # after the store is reopened
        assert h.messages == MESSAGES


def test_records_fields(tmp_path):
    with RuneChatMessageHistory("s", tmp_path) as h:
        h.add_messages(MESSAGES)
        recs = h.repository.window("langchain:s", 100)
    assert [r.role for r in recs] == ["system", "user", "assistant", "tool", "assistant", "user",
                                      "assistant", "tool", "assistant"]
    assert {r.origin for r in recs} == {"langchain.message/1"}
    assert recs[3].tool_call_id == "call_1"
    assert rfl.message_role(ChatMessage(role="user", content="x")) == "user"


def test_convenience_methods_and_str(tmp_path):
    with RuneChatMessageHistory("s", tmp_path) as h:
        h.add_user_message("hi")
        h.add_ai_message("hello")
        h.add_user_message(HumanMessage("again"))
        h.add_ai_message(AIMessage("yes"))
        h.add_message(SystemMessage("sys"))
        assert h.messages == [HumanMessage("hi"), AIMessage("hello"), HumanMessage("again"),
                              AIMessage("yes"), SystemMessage("sys")]
        assert str(h) == get_buffer_string(h.messages)
        assert str(h).splitlines()[0] == "Human: hi"


def test_clear_clears_only_its_own(tmp_path):
    with RuneChatMessageHistory("a", tmp_path) as a, RuneChatMessageHistory("b", tmp_path) as b:
        a.add_messages(MESSAGES)
        b.add_messages(MESSAGES[:2])
        a.clear()
        assert a.messages == []
        assert b.messages == MESSAGES[:2]
        a.add_user_message("fresh")
        assert a.messages == [HumanMessage("fresh")]


def test_async_methods(tmp_path):
    async def go():
        with RuneChatMessageHistory("s", tmp_path) as h:
            await h.aadd_messages(MESSAGES[:3])
            assert await h.aget_messages() == MESSAGES[:3]
            await h.aclear()
            assert await h.aget_messages() == []
            await asyncio.gather(*(h.aadd_messages([HumanMessage(str(i))]) for i in range(10)))
            got = await h.aget_messages()
            assert sorted(int(m.content) for m in got) == list(range(10))
    asyncio.run(go())


def test_a_second_object_sees_the_history_while_the_first_is_open(tmp_path):
    first = RuneChatMessageHistory("s", tmp_path)
    first.add_messages(MESSAGES[:2])
    second = RuneChatMessageHistory("s", tmp_path)
    assert second.messages == MESSAGES[:2]
    second.add_ai_message("from the second")
    assert first.messages == MESSAGES[:2] + [AIMessage("from the second")]
    assert first.repository is second.repository
    first.close()
    assert second.messages[-1] == AIMessage("from the second")
    with pytest.raises(StateLockedError):
        ConversationStateRepository(tmp_path)
    second.close()
    ConversationStateRepository(tmp_path).close()      # the last close released the store


def test_thread_safe(tmp_path):
    per = 30
    with RuneChatMessageHistory("s", tmp_path) as h:
        def worker(w):
            for i in range(per):
                h.add_messages([HumanMessage(f"{w}:{i}")])
                h.messages          # reads interleaved with the writes

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = [m.content for m in h.messages]
    assert len(got) == 5 * per
    for w in range(5):
        assert [c for c in got if c.startswith(f"{w}:")] == [f"{w}:{i}" for i in range(per)]


class Opaque:
    pass


@pytest.mark.parametrize("bad", [
    AIMessage("x", additional_kwargs={"obj": Opaque()}),
    AIMessage("x", additional_kwargs={"nan": float("nan")}),
    AIMessage("x", additional_kwargs={1: "int key"}),
    HumanMessage("lone \ud800"),
    "a plain str",
    {"type": "human", "data": {"content": "dict"}},
])
def test_a_bad_message_stores_nothing_of_its_batch(tmp_path, bad):
    with RuneChatMessageHistory("s", tmp_path) as h:
        h.add_user_message("before")
        with pytest.raises(TypeError, match="message 1"):
            h.add_messages([HumanMessage("ok"), bad, HumanMessage("ok too")])
        assert h.messages == [HumanMessage("before")]
        h.add_ai_message("after")
        assert h.messages == [HumanMessage("before"), AIMessage("after")]


def test_closed_history_refuses_every_call(tmp_path):
    h = RuneChatMessageHistory("s", tmp_path)
    h.add_user_message("kept")
    h.close()
    h.close()       # a no-op
    calls = [lambda: h.messages, lambda: h.add_user_message("x"), lambda: h.add_messages([]),
             h.clear, lambda: str(h), lambda: asyncio.run(h.aget_messages()),
             lambda: asyncio.run(h.aadd_messages([HumanMessage("x")])), lambda: asyncio.run(h.aclear())]
    for call in calls:
        with pytest.raises(StoreClosedError, match="closed"):
            call()
    with RuneChatMessageHistory("s", tmp_path) as again:
        assert again.messages == [HumanMessage("kept")]


@pytest.mark.parametrize("sid", ["a/b", "../..", "nul\x00", "y" * 10_000, "ünï ✓"])
def test_session_ids_never_become_paths(tmp_path, sid):
    state = tmp_path / "state"
    with RuneChatMessageHistory(sid, state) as h, RuneChatMessageHistory("x", state) as other:
        h.add_user_message("hi")
        assert h.messages == [HumanMessage("hi")]
        assert other.messages == []
    assert sorted(os.listdir(tmp_path)) == ["state"]
    for _dirpath, dirnames, filenames in os.walk(state):
        for name in dirnames + filenames:
            assert len(name) < 100 and "/" not in name and "\x00" not in name and "y" * 50 not in name


@pytest.mark.parametrize("sid, exc", [("", ValueError), ("\udc80", ValueError), (None, TypeError), (7, TypeError)])
def test_bad_session_ids_are_refused(tmp_path, sid, exc):
    with pytest.raises(exc, match="session_id"):
        RuneChatMessageHistory(sid, tmp_path)


def test_a_damaged_message_is_reported(tmp_path):
    with RuneChatMessageHistory("s", tmp_path) as h:
        h.add_messages([HumanMessage(f"entry number {i}") for i in range(4)])
    path = os.path.join(tmp_path, "hot", "conversation_tail.jsonl")
    with open(path, "r+b") as f:
        data = f.read()
        f.seek(data.index(b"entry number 2"))
        f.write(b"E")
    with RuneChatMessageHistory("s", tmp_path) as h:
        with pytest.raises(CorruptStateCheckpointError) as info:
            h.messages
        assert any("langchain session 's'" in n for n in info.value.__notes__)


def test_a_foreign_record_is_reported(tmp_path):
    with RuneChatMessageHistory("s", tmp_path) as h:
        h.repository.append(ConversationMessageRecord(role="user", content='{"type":"alien","data":{}}',
                                                      channel_id="langchain:s", origin="langchain.message/1"))
        with pytest.raises(CorruptStateCheckpointError, match="not a LangChain message"):
            h.messages
        h.clear()
        h.repository.append(ConversationMessageRecord(role="user", content="text", channel_id="langchain:s"))
        with pytest.raises(CorruptStateCheckpointError, match="origin"):
            h.messages


# ------------------------------------------------ RunnableWithMessageHistory


def _chain(tmp_path, answers, seen):
    model = GenericFakeChatModel(messages=iter([AIMessage(a) for a in answers]))
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{input}")])

    def spy(value):
        seen.append(value.to_messages())
        return value

    with pytest.warns(LangChainDeprecationWarning, match="RunnableWithMessageHistory"):
        return RunnableWithMessageHistory(
            prompt | RunnableLambda(spy) | model,
            # a new history object per call, never closed: released when collected
            lambda session_id: RuneChatMessageHistory(session_id, tmp_path),
            input_messages_key="input", history_messages_key="history")


def _texts(messages):
    return [(m.type, m.content) for m in messages]


def test_runnable_with_message_history_sync_and_stream(tmp_path):
    seen: list = []
    chain = _chain(tmp_path, ["first answer", "second answer", "third"], seen)
    cfg = {"configurable": {"session_id": "conv/1"}}
    assert chain.invoke({"input": "one"}, config=cfg).content == "first answer"
    chunks = list(chain.stream({"input": "two"}, config=cfg))
    assert "".join(c.content for c in chunks) == "second answer"
    assert _texts(seen[1]) == [("human", "one"), ("ai", "first answer"), ("human", "two")]
    chain.invoke({"input": "other"}, config={"configurable": {"session_id": "conv/2"}})
    assert _texts(seen[2]) == [("human", "other")]
    gc.collect()
    with RuneChatMessageHistory("conv/1", tmp_path) as h:
        assert _texts(h.messages) == [("human", "one"), ("ai", "first answer"), ("human", "two"),
                                      ("AIMessageChunk", "second answer")]


def test_runnable_with_message_history_async(tmp_path):
    seen: list = []
    chain = _chain(tmp_path, ["a1", "a2 streamed"], seen)
    cfg = {"configurable": {"session_id": "async"}}

    async def go():
        assert (await chain.ainvoke({"input": "q1"}, config=cfg)).content == "a1"
        chunks = [c async for c in chain.astream({"input": "q2"}, config=cfg)]
        assert "".join(c.content for c in chunks) == "a2 streamed"

    asyncio.run(go())
    assert _texts(seen[1]) == [("human", "q1"), ("ai", "a1"), ("human", "q2")]
    gc.collect()
    with RuneChatMessageHistory("async", tmp_path) as h:
        assert [m.content for m in h.messages] == ["q1", "a1", "q2", "a2 streamed"]


# ------------------------------------------------------------ durability

CHILD = r"""
import sys
from langchain_core.messages import AIMessage, HumanMessage
from rune_fast.integrations.langchain import RuneChatMessageHistory

h = RuneChatMessageHistory("crash/..", sys.argv[1])
i = 0
while True:
    h.add_messages([HumanMessage(f"q{i}"), AIMessage(f"a{i}", tool_calls=[{"name": "t", "args": {"i": i}, "id": f"c{i}"}])])
    print(i, flush=True)
    i += 1
"""


def test_acknowledged_messages_survive_sigkill(tmp_path):
    acked = kill_after_acks(CHILD, str(tmp_path))
    with RuneChatMessageHistory("crash/..", tmp_path) as h:
        got = h.messages
    assert len(got) >= 2 * (acked + 1)
    for k, m in enumerate(got):
        i = k // 2
        assert m == (HumanMessage(f"q{i}") if k % 2 == 0 else
                     AIMessage(f"a{i}", tool_calls=[{"name": "t", "args": {"i": i}, "id": f"c{i}"}]))


def test_public_names():
    assert set(rfl.__all__) == {"CHANNEL_PREFIX", "ORIGIN", "RuneChatMessageHistory", "message_role"}
