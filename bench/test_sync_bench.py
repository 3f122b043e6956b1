"""Cost of the transcript path on 100,000 turns: fold (dedupe, order), repair,
and the two renderers. Run with ``pytest bench/test_sync_bench.py``."""
from __future__ import annotations

import random

import pytest

from rune_fast.sync import (
    Hlc, LastN, OpRecord, fold, op_from_record_dict, repair, to_anthropic, to_openai,
)

N = 100_000


def _record_dicts(n: int) -> list[dict]:
    """A realistic channel: user question, assistant tool call, tool result,
    assistant answer; two devices; stamped the way HlcClock stamps."""
    out = []
    for i in range(n):
        k = i % 4
        role = ("user", "assistant", "tool", "assistant")[k]
        calls = [{"id": f"call_{i}", "name": "search", "arguments": {"q": f"q{i}"}}] if k == 1 else []
        out.append({
            "msg_id": f"msg_{i:026d}", "ts": 1_700_000_000 + i / 10, "role": role,
            "content": "" if k == 1 else f"turn {i} " + "lorem ipsum " * 8,
            "channel_id": "ch", "task_id": "", "token_estimate": 30, "tool_calls": calls,
            "tool_call_id": f"call_{i - 1}" if k == 2 else "", "origin": "ab"[i % 2],
            "hlc": str(Hlc(1_700_000_000_000 + i * 100, 0, "ab"[i % 2])), "schema_version": 1,
        })
    return out


@pytest.fixture(scope="module")
def wire_ops() -> list[dict]:
    """Ops as exported over the wire (dicts with string hlcs), shuffled, with
    1% resends: what merge/resume sees after an exchange."""
    ops = [op_from_record_dict(d).to_dict() for d in _record_dicts(N)]
    rng = random.Random(1)
    ops += rng.sample(ops, N // 100)
    rng.shuffle(ops)
    return ops


@pytest.fixture(scope="module")
def op_records(wire_ops) -> list[OpRecord]:
    return [OpRecord(o["op_id"], o["hlc"], o["payload"]) for o in wire_ops]


@pytest.mark.benchmark(group="sync")
def test_fold_repair_100k_wire_ops(benchmark, wire_ops):
    out = benchmark.pedantic(lambda: repair(fold(wire_ops, "ch")), rounds=5, iterations=1)
    assert len(out) == N


@pytest.mark.benchmark(group="sync")
def test_fold_repair_100k_op_records(benchmark, op_records):
    out = benchmark.pedantic(lambda: repair(fold(op_records, "ch")), rounds=5, iterations=1)
    assert len(out) == N


# The same work with the cyclic garbage collector paused: the difference is
# the cost of full collections over the ~700,000 objects this module keeps
# alive (an application that gc.freeze()s after loading pays about this).
@pytest.mark.benchmark(group="sync", disable_gc=True)
def test_fold_repair_100k_op_records_gc_paused(benchmark, op_records):
    out = benchmark.pedantic(lambda: repair(fold(op_records, "ch")), rounds=5, iterations=1)
    assert len(out) == N


@pytest.mark.benchmark(group="sync")
def test_fold_100k(benchmark, op_records):
    assert len(benchmark.pedantic(fold, (op_records, "ch"), rounds=5, iterations=1)) == N


@pytest.mark.benchmark(group="sync")
def test_repair_100k(benchmark, op_records):
    turns = fold(op_records, "ch")
    assert len(benchmark.pedantic(repair, (turns,), rounds=5, iterations=1)) == N


@pytest.mark.benchmark(group="sync")
def test_resume_last_50_of_100k(benchmark, op_records):
    turns = fold(op_records, "ch")
    out = benchmark(lambda: repair(LastN(50)(turns)))
    assert 0 < len(out) <= 50


@pytest.mark.benchmark(group="sync")
def test_render_anthropic_100k(benchmark, op_records):
    msgs = repair(fold(op_records, "ch"))
    assert benchmark.pedantic(to_anthropic, (msgs,), rounds=3, iterations=1)


@pytest.mark.benchmark(group="sync")
def test_render_openai_100k(benchmark, op_records):
    msgs = repair(fold(op_records, "ch"))
    assert len(benchmark.pedantic(to_openai, (msgs,), rounds=3, iterations=1)) == N
