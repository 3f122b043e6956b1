"""CoolArchive against a plain-Python model: cooling runs, erasures, merges,
reopens (with lost sidecars and crash leftovers) and every read."""
from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rune_fast.cool import CoolArchive, index_dir_for
from test_cool import cool_rows, task_records

CHANNELS = ["a", "b", "ß"]
TASKS = ["", "", "t1", "t2"]
WORDS = ["alpha", "Beta", "STRASSE", "straße", "\u212aelvin", "kilo", "x\x00y", "😀"]


def order_key(rec: dict, ord_: int) -> tuple:
    if rec["hlc"] == "":
        return (0, ord_, "", "")
    return (1, 0, rec["hlc"], rec["msg_id"])


class CoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="cool-model-")
        self.dir = os.path.join(self.tmp, "cool")
        self.archive = CoolArchive(self.dir, row_group_rows=8)
        self.model: dict[str, tuple[dict, int]] = {}
        self.next_id = 0
        self.erased: list[str] = []

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    @rule(specs=st.lists(st.tuples(st.sampled_from(CHANNELS), st.sampled_from(TASKS),
                                   st.booleans(), st.lists(st.sampled_from(WORDS), max_size=3)),
                         min_size=1, max_size=12))
    def cool(self, specs):
        batch = []
        for ch, task, stamped, words in specs:
            i = self.next_id
            self.next_id += 1
            rec = {"msg_id": f"m{i:05d}", "channel_id": ch, "task_id": task,
                   "hlc": f"{(i * 7919) % 1000:015d}-0000000000-d" if stamped else "",
                   "content": " ".join(words), "ts": float(i), "role": "user", "token_estimate": i,
                   "tool_calls": [{"id": "c", "name": "f", "arguments": {"i": i}}] if i % 4 == 0 else [],
                   "tool_call_id": "", "origin": "", "schema_version": 1}
            batch.append((rec, i))
        batch.sort(key=lambda p: (p[0]["channel_id"], order_key(*p)))
        cool_rows(self.archive, [r for r, _ in batch], [o for _, o in batch])
        for r, o in batch:
            self.model[r["msg_id"]] = (r, o)

    @rule(data=st.data())
    def erase(self, data):
        ids = list(self.model)
        chosen = data.draw(st.lists(st.sampled_from(ids), max_size=4)) if ids else []
        chosen += ["never-there"]
        change = self.archive.erase(chosen)
        self.archive.unlink_files(change.removed)
        for m in chosen:
            self.model.pop(m, None)
        assert change.not_found == ["never-there"]
        self.erased += [m for m in chosen if m != "never-there"]

    @rule(max_files=st.none() | st.integers(1, 3))
    def merge(self, max_files):
        change = self.archive.merge(max_files=max_files)
        self.archive.unlink_files(change.removed)
        if max_files is not None:
            assert len(self.archive.files()) <= max_files

    @rule(lose_sidecar=st.booleans(), crash_leftover=st.booleans())
    def reopen(self, lose_sidecar, crash_leftover):
        files = self.archive.files()
        if crash_leftover and self.model:
            # a cooling run whose manifest never moved
            extra = CoolArchive(self.dir, files)
            cool_rows(extra, [dict(next(iter(self.model.values()))[0], msg_id="stray")], [0])
        if lose_sidecar and files:
            os.unlink(os.path.join(index_dir_for(self.dir), files[0][:-8] + ".idx"))
        self.archive = CoolArchive.open(self.dir, files, row_group_rows=8)
        self.archive.gc()
        assert self.archive.gc() == []

    @rule(text=st.sampled_from(WORDS + ["", "ss", "k", "a", "zz"]), cs=st.booleans(),
          ch=st.none() | st.sampled_from(CHANNELS))
    def search(self, text, cs, ch):
        got = [r.record["msg_id"] for r in self.archive.search(text, ch, case_sensitive=cs)]
        want = sorted(
            (m for m, (r, _o) in self.model.items()
             if (ch is None or r["channel_id"] == ch)
             and ((text in r["content"]) if cs else (text.casefold() in r["content"].casefold()))),
            key=lambda m: order_key(*self.model[m]))
        assert got == want

    @rule(n=st.integers(0, 20))
    def tails(self, n):
        for ch in CHANNELS:
            want = sorted((p for p in self.model.values() if p[0]["channel_id"] == ch),
                          key=lambda p: order_key(*p))
            assert [(r.record, r.ord) for r in self.archive.channel_rows(ch)] == want
            assert [(r.record, r.ord) for r in self.archive.channel_tail(ch, n)] == (want[-n:] if n else [])
            tasks = [p[0]["task_id"] for p in want if p[0]["task_id"]]
            assert self.archive.latest_task(ch) == (tasks[-1] if tasks else None)

    @invariant()
    def reads_match(self):
        assert len(self.archive) == len(self.model)
        assert self.archive.channels() == sorted({r["channel_id"] for r, _ in self.model.values()})
        for m, (r, o) in list(self.model.items())[:10]:
            row = self.archive.get_row(m)
            assert row is not None and row.record == r and row.ord == o
        for m in self.erased[-3:]:
            assert self.archive.get(m) is None
        for t in ("t1", "t2"):
            want = sorted((p for p in self.model.values() if p[0]["task_id"] == t),
                          key=lambda p: order_key(*p))
            assert [(r.record, r.ord) for r in task_records(self.archive, t)] == want

    @precondition(lambda self: self.next_id % 5 == 0)
    @rule()
    def verify(self):
        assert self.archive.verify() == []


CoolMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=20, deadline=None)
TestCoolModel = CoolMachine.TestCase
