"""The canary: every promise of the contract, exercised once against a fresh
directory, with one PASS/FAIL line each.

    python -m rune_fast.canary [--state DIR] [--json]
    rune-fast canary [--dir DIR]

It creates, amends and transitions tasks; appends, reads, searches, compacts,
cools, deletes, exports and merges messages; opens a read-only viewer beside a
writer; starts a writer in a subprocess and SIGKILLs it mid-stream, reopens and
checks that every acknowledged message is there; tears a final line and flips
a byte and checks that both are reported, never served. Exit status 0 when
every promise holds, 1 otherwise. ``--state DIR`` runs in DIR (new or empty)
and keeps it; by default a temporary directory is used and removed (kept, and
named, when something fails).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable

from ._names import COOL_DIR, HOT_DIR, TAIL_NAME

__all__ = ["Canary", "main"]

_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CRASH_WRITER = r"""
import sys
from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord
repo = ConversationStateRepository(sys.argv[1], compact_every=16, hot_window=8)
i = 0
while True:
    m = ConversationMessageRecord(role="user" if i % 2 == 0 else "assistant",
                                  content="crash test message %d " % i + "x" * (i % 50),
                                  channel_id="crash-%d" % (i % 3), task_id="task_crash")
    repo.append(m)
    sys.stdout.write(m.msg_id + "\n")
    sys.stdout.flush()
    i += 1
"""

_SECOND_WRITER = r"""
import sys
from rune_fast.errors import StateLockedError
kind = sys.argv[2]
try:
    if kind == "conversation":
        from rune_fast.conversation_state import ConversationStateRepository as R
    else:
        from rune_fast.tasks import TaskStateRepository as R
    R(sys.argv[1]).close()
except StateLockedError as exc:
    print("locked:", exc)
    sys.exit(0)
print("NOT LOCKED")
sys.exit(3)
"""


class Failed(AssertionError):
    """A promise that did not hold."""


def expect(cond: Any, message: str) -> None:
    if not cond:
        raise Failed(message)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    return env


def _files(root: str) -> list[str]:
    out: list[str] = []
    for base, _dirs, names in os.walk(root):
        out.extend(os.path.join(base, n) for n in names)
    return out


def _holding(root: str, needle: bytes) -> list[str]:
    found = []
    for path in _files(root):
        with open(path, "rb") as f:
            if needle in f.read():
                found.append(path)
    return found


class Canary:
    """Runs the checks in ``root`` and collects ``(name, ok, detail)``."""

    def __init__(self, root: str, *, say: Callable[[str], None] = print) -> None:
        self.root = root
        self.say = say
        self.results: list[dict[str, Any]] = []
        from . import conversation_state, records, tasks

        self.cs = conversation_state
        self.rec = records
        self.tasks_mod = tasks
        self.Msg = records.ConversationMessageRecord

    # -- harness -----------------------------------------------------------

    def check(self, name: str, fn: Callable[[], Any]) -> bool:
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                detail = fn()
            ok = True
        except Failed as exc:
            ok, detail = False, str(exc)
        except Exception as exc:  # a promise that blew up is a failed promise; say how
            ok = False
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            detail = f"{type(exc).__name__}: {exc} (at {os.path.basename(tb.filename)}:{tb.lineno})"
        ms = (time.perf_counter() - t0) * 1000
        self.results.append({"promise": name, "ok": ok, "detail": detail or "", "ms": round(ms, 1)})
        line = f"{'PASS' if ok else 'FAIL'}  {name}"
        if detail:
            line += f"  -- {detail}"
        self.say(line)
        return ok

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def conv(self, name: str, **kw: Any) -> Any:
        return self.cs.ConversationStateRepository(self.path(name), **kw)

    def msg(self, channel: str, content: str, role: str = "user", **kw: Any) -> Any:
        return self.Msg(role=role, content=content, channel_id=channel, **kw)

    # -- the run -----------------------------------------------------------

    def run(self) -> bool:
        c = self.check
        c("records: new_id is unique and sorts in creation order", self.records_ids)
        c("records: to_dict/from_dict round-trip, bad fields refused", self.records_roundtrip)
        c("tasks: create, get, latest, get_active", self.tasks_create)
        c("tasks: amend keeps the task id and bumps updated_at", self.tasks_amend)
        c("tasks: only legal transitions; illegal ones change nothing", self.tasks_transition)
        c("tasks: a terminal transition clears the active task", self.tasks_active)
        c("tasks: list_open oldest first; every change survives reopen", self.tasks_reopen)
        c("conversation: append stores once (duplicate -> False)", self.conv_append)
        c("conversation: append_many counts the new ones", self.conv_append_many)
        c("conversation: window = last n, oldest first", self.conv_window)
        c("conversation: messages_for_task, latest_task", self.conv_task)
        c("conversation: get_message verdicts and exact records", self.conv_get)
        c("conversation: search (case, limit, channel)", self.conv_search)
        c("conversation: compact cools into Parquet; reads span tiers", self.conv_compact)
        c("conversation: resume_messages is provider-valid (tool calls)", self.conv_resume)
        c("conversation: delete forgets at once, compact erases the bytes", self.conv_delete)
        c("conversation: clear_channel", self.conv_clear)
        c("sync: export_ops/merge_ops converge, deletions travel", self.conv_sync)
        c("conversation: stats and verify on a sound store", self.conv_verify_ok)
        c("conversation: read_only viewer + refresh beside a writer", self.conv_read_only)
        c("conversation: durability modes fsync/batch/none, others refused", self.conv_durability)
        c("locks: a second writer gets StateLockedError", self.locks)
        c("events: typed envelopes with payload_hash, shared store", self.events)
        c("crash: SIGKILLed writer loses no acknowledged message", self.crash)
        c("crash: a torn final line is quarantined and reported", self.torn)
        c("damage: a flipped byte is never served; verify names file+offset", self.flip)
        c("privacy: files 0600, folders 0700", self.privacy)
        c("privacy: caller ids never become paths outside state_dir", self.paths)
        failed = [r for r in self.results if not r["ok"]]
        return not failed

    # -- records -----------------------------------------------------------

    def records_ids(self) -> str:
        ids = [self.rec.new_id("msg") for _ in range(2000)]
        expect(len(set(ids)) == len(ids), "duplicate ids")
        expect(all(len(i) == 4 + 26 for i in ids), f"id length: {ids[0]!r}")
        tails = [i.split("_", 1)[1] for i in ids]
        expect(tails == sorted(tails), "ids do not sort in creation order")
        a, b = self.rec.new_id("task"), self.rec.new_id("msg")
        expect(a.split("_", 1)[1] < b.split("_", 1)[1], "ids do not sort across prefixes")
        return ""

    def records_roundtrip(self) -> str:
        m = self.msg("c", "héllo", role="assistant", task_id="t1",
                     tool_calls=({"id": "call_1", "name": "f", "arguments": {"a": [1, 2]}},))
        expect(self.Msg.from_dict(m.to_dict()) == m, "message round trip")
        t = self.rec.TaskStateRecord(title="x", channel_id="c")
        expect(self.rec.TaskStateRecord.from_dict(t.to_dict()) == t, "task round trip")
        bad: Any        # (fields of a bad message, by name)
        for bad in (dict(role="bot", content="x", channel_id="c"), dict(role="user", content="x", channel_id=""),
                    dict(role="user", content="\ud800", channel_id="c")):
            try:
                self.Msg(**bad)
            except ValueError:
                continue
            raise Failed(f"accepted {bad}")
        try:
            self.Msg(role="user", content=5, channel_id="c")  # type: ignore[arg-type]
        except TypeError:
            pass
        else:
            raise Failed("accepted non-str content")
        return ""

    # -- tasks -------------------------------------------------------------

    def _tasks(self) -> Any:
        return self.tasks_mod.TaskStateRepository(self.path("tasks"))

    def tasks_create(self) -> str:
        with self._tasks() as t:
            a = t.create("first", "ch")
            expect(a.status == "created", f"status {a.status}")
            expect(t.get(a.task_id) == a, "get")
            expect(t.get("task_unknown") is None, "get(unknown) is not None")
            b = t.create("second", "ch", parent_task_id=a.task_id)
            expect(t.latest("ch") == b, "latest")
            expect(t.get_active("ch") == b, "active is not the newest")
            expect(t.get_active("other") is None and t.latest("other") is None, "unknown channel")
        return ""

    def tasks_amend(self) -> str:
        with self._tasks() as t:
            a = t.create("draft", "amend")
            b = t.amend(a.task_id, "draft v2")
            expect(b.task_id == a.task_id and b.title == "draft v2", "amend changed the id or kept the title")
            expect(b.updated_at > a.updated_at, "updated_at not bumped")
            try:
                t.amend("task_nope", "x")
            except KeyError:
                pass
            else:
                raise Failed("amend(unknown) did not raise KeyError")
            t.transition(a.task_id, "cancelled")
            try:
                t.amend(a.task_id, "again")
            except self.cs.IllegalTaskTransitionError:
                pass
            else:
                raise Failed("amending a terminal task did not raise")
        return ""

    def tasks_transition(self) -> str:
        with self._tasks() as t:
            a = t.create("work", "tr")
            for s in ("running", "awaiting_approval", "running", "completed"):
                a = t.transition(a.task_id, s, outcome_ref="ref" if s == "completed" else "")
            expect(a.status == "completed" and a.outcome_ref == "ref", "final status/outcome_ref")
            b = t.create("other", "tr")
            before = t.get(b.task_id)
            try:
                t.transition(b.task_id, "completed")
            except self.cs.IllegalTaskTransitionError:
                pass
            else:
                raise Failed("created -> completed was allowed")
            expect(t.get(b.task_id) == before, "a refused transition changed the task")
        return ""

    def tasks_active(self) -> str:
        with self._tasks() as t:
            a = t.create("a", "act")
            b = t.create("b", "act")
            t.transition(a.task_id, "running")
            expect(t.get_active("act").task_id == b.task_id, "a transition made a task more recent")
            t.transition(b.task_id, "cancelled")
            expect(t.get_active("act").task_id == a.task_id, "next open task did not become active")
            t.amend(a.task_id, "a2")
            t.transition(a.task_id, "completed")
            expect(t.get_active("act") is None, "active after every task finished")
        return ""

    def tasks_reopen(self) -> str:
        with self._tasks() as t:
            ids = [t.create(f"open {i}", "reopen").task_id for i in range(3)]
            t.transition(ids[1], "superseded")
            want = [x for x in ids if x != ids[1]]
            expect([r.task_id for r in t.list_open("reopen")] == want, "list_open order")
            snapshot = {i: t.get(i) for i in ids}
        with self._tasks() as t:
            expect({i: t.get(i) for i in ids} == snapshot, "tasks differ after reopen")
            expect([r.task_id for r in t.list_open("reopen")] == want, "list_open after reopen")
        return ""

    # -- conversation ------------------------------------------------------

    def conv_append(self) -> str:
        with self.conv("c1") as r:
            m = self.msg("a", "hello")
            expect(r.append(m) is True, "first append not True")
            expect(r.append(m) is False, "duplicate append not False")
            expect(len(r) == 1, f"len {len(r)}")
        with self.conv("c1") as r:
            expect(r.append(m) is False, "duplicate after reopen not False")
            expect(r.get_message(m.msg_id).record == m, "record changed by the store")
        return ""

    def conv_append_many(self) -> str:
        with self.conv("c2") as r:
            ms = [self.msg("b", f"m{i}") for i in range(10)]
            expect(r.append_many(ms[:6]) == 6, "first batch")
            expect(r.append_many(ms) == 4, "second batch should store 4")
            expect(len(r) == 10, f"len {len(r)}")
        return ""

    def conv_window(self) -> str:
        with self.conv("c3") as r:
            ms = [self.msg("w", f"w{i}") for i in range(12)]
            r.append_many(ms)
            r.append(self.msg("other", "x"))
            expect(r.window("w", 5) == ms[-5:], "window(5)")
            expect(r.window("w") == ms[-8:], "default n=8")
            expect(r.window("w", 100) == ms, "window larger than the channel")
            expect(r.window("w", 0) == [] and r.window("w", -1) == [], "n <= 0")
            expect(r.window("nope") == [], "unknown channel")
            expect(sorted(r.channels()) == ["other", "w"], f"channels {r.channels()}")
        return ""

    def conv_task(self) -> str:
        with self.conv("c4") as r:
            a = [self.msg("t", f"a{i}", task_id="task_a") for i in range(3)]
            b = [self.msg("t", f"b{i}", task_id="task_b") for i in range(2)]
            r.append_many([a[0], b[0], a[1], b[1], a[2]])
            r.append(self.msg("t", "no task"))
            expect(r.messages_for_task("task_a") == a, "messages_for_task order")
            expect(r.messages_for_task("task_zz") == [], "unknown task")
            expect(r.latest_task("t") == "task_a", f"latest_task {r.latest_task('t')}")
            expect(r.latest_task("nope") is None, "latest_task unknown channel")
        return ""

    def conv_get(self) -> str:
        RS = self.cs.ReadStatus
        with self.conv("c5") as r:
            m = self.msg("g", "exact")
            r.append(m)
            got = r.get_message(m.msg_id)
            expect(got.status == RS.FOUND_VERIFIED and got.record == m, f"verdict {got.status}")
            expect(got.tier in ("tail", "hot"), f"tier {got.tier}")
            miss = r.get_message("msg_never")
            expect(miss.status == RS.NOT_FOUND_CONFIRMED and miss.record is None, "unknown id")
        return ""

    def conv_search(self) -> str:
        with self.conv("c6") as r:
            ms = [self.msg("s", "Deploy the API"), self.msg("s", "deploy again"), self.msg("s2", "DEPLOY three"),
                  self.msg("s", "nothing"), self.msg("s", "Straße")]
            r.append_many(ms)
            expect([h.record for h in r.search("deploy")] == ms[:3], "case-insensitive")
            expect([h.record for h in r.search("deploy", case_sensitive=True)] == [ms[1]], "case-sensitive")
            expect([h.record for h in r.search("deploy", limit=2)] == ms[1:3], "limit keeps the newest")
            expect(r.search("deploy", limit=0) == [], "limit=0")
            expect([h.record for h in r.search("deploy", "s")] == ms[:2], "channel filter")
            expect(len(r.search("")) == len(ms), "empty text matches all")
            expect([h.record for h in r.search("STRASSE")] == [ms[4]], "Unicode casefold")
        return ""

    def conv_compact(self) -> str:
        with self.conv("c7", hot_window=4, compact_every=1000) as r:
            ms = [self.msg("k", f"cool me {i}", task_id="task_k") for i in range(20)]
            r.append_many(ms)
            rep = r.compact()
            d = rep.to_dict() if hasattr(rep, "to_dict") else dict(rep)
            tiers = {r.get_message(m.msg_id).tier for m in ms}
            expect("cool" in tiers, f"nothing cooled (tiers {tiers}, report {d})")
            expect(r.get_message(ms[0].msg_id).tier == "cool", "oldest not cool")
            expect(r.window("k", 20) == ms, "window across tiers")
            expect(r.messages_for_task("task_k") == ms, "messages_for_task across tiers")
            hits = r.search("cool me 1")
            expect({h.tier for h in hits} >= {"cool"}, "search does not span the cool tier")
            expect(len(r) == 20, f"len {len(r)}")
        cool_dir = os.path.join(self.path("c7"), HOT_DIR, COOL_DIR)
        parquet = [p for p in _files(cool_dir) if p.endswith(".parquet")] if os.path.isdir(cool_dir) else []
        expect(parquet, "no Parquet archive under hot/conversation_cool/")
        import pyarrow.parquet as pq

        cols = pq.read_schema(parquet[0]).names
        expect("content" in cols, f"archive columns {cols}")
        with self.conv("c7", hot_window=4) as r:
            expect(r.window("k", 20) == ms, "window across tiers after reopen")
        return f"{len(parquet)} archive(s)"

    def conv_resume(self) -> str:
        from . import sync

        with self.conv("c8") as r:
            call = {"id": "toolu_1", "name": "lookup", "arguments": {"q": "weather"}}
            seq = [self.msg("r", "You are terse.", role="system"),
                   self.msg("r", "what's the weather?"),
                   self.msg("r", "", role="assistant", tool_calls=(call,)),
                   self.msg("r", "sunny", role="tool", tool_call_id="toolu_1"),
                   self.msg("r", "It is sunny.", role="assistant"),
                   self.msg("r", "thanks"), self.msg("r", "and tomorrow?")]
            r.append_many(seq)
            msgs = r.resume_messages("r")
            roles = [m["role"] for m in msgs]
            expect(roles == ["user", "assistant", "tool_result", "assistant", "user"], f"roles {roles}")
            expect(msgs[-1]["content"] == "thanks\nand tomorrow?", "adjacent user turns not coalesced")
            expect(len(r.resume_messages("r", 2)) >= 1, "resume_messages(n)")
            rendered = sync.to_anthropic(msgs)
            expect(rendered and rendered[0]["role"] == "user", "to_anthropic")
            json.dumps(rendered)
            sync.to_openai(msgs)
        return ""

    def conv_delete(self) -> str:
        RS = self.cs.ReadStatus
        secret = "canary secret 7c1e"
        with self.conv("c9") as r:
            keep = self.msg("d", "keep me", task_id="task_d")
            gone = self.msg("d", secret, task_id="task_d")
            r.append_many([keep, gone])
            expect(r.delete(gone.msg_id) is True, "delete of a stored message not True")
            expect(r.delete("msg_never") is False, "delete of unknown not False")
            expect(r.get_message(gone.msg_id).status == RS.NOT_FOUND_CONFIRMED, "still found")
            expect(r.window("d") == [keep] and r.messages_for_task("task_d") == [keep], "still listed")
            expect(r.search("secret") == [] and len(r) == 1, "still searchable or counted")
            expect(r.append(gone) is False, "a deleted id was stored again")
            r.compact()
        with self.conv("c9") as r:
            expect(r.get_message(gone.msg_id).status == RS.NOT_FOUND_CONFIRMED, "found after reopen")
        left = _holding(self.path("c9"), secret.encode())
        expect(not left, f"deleted content still on disk in {left}")
        return ""

    def conv_clear(self) -> str:
        with self.conv("c10") as r:
            r.append_many([self.msg("x", f"x{i}") for i in range(5)] + [self.msg("y", "y")])
            expect(r.clear_channel("x") == 5, "clear_channel count")
            expect(r.window("x") == [] and len(r) == 1, "channel not cleared")
            expect(r.clear_channel("x") == 0, "second clear")
        return ""

    def conv_sync(self) -> str:
        with self.conv("sa") as a, self.conv("sb") as b:
            a.append_many([self.msg("chat", f"from a {i}", hlc=str(a.clock.now())) for i in range(3)])
            b.append_many([self.msg("chat", f"from b {i}", hlc=str(b.clock.now())) for i in range(2)])
            n = b.merge_ops(a.export_ops())
            expect(n == 3, f"merge into b stored {n}")
            a.merge_ops(b.export_ops())
            expect(b.merge_ops(a.export_ops()) == 0, "a second merge stored something")
            expect(a.resume_messages("chat") == b.resume_messages("chat"), "transcripts differ")
            expect(a.window("chat", 10) == b.window("chat", 10), "windows differ")
            victim = a.window("chat", 10)[0]
            a.delete(victim.msg_id)
            b.merge_ops(a.export_ops())
            expect(b.get_message(victim.msg_id).status == self.cs.ReadStatus.NOT_FOUND_CONFIRMED,
                   "deletion did not travel")
            expect(b.append(victim) is False, "deleted message re-appended")
        return ""

    def conv_verify_ok(self) -> str:
        with self.conv("c3") as r:
            st = r.stats()
            expect(isinstance(st, dict) and st, "stats() is not a dict")
            rep = r.verify()
            expect(rep.ok, f"verify found problems on a sound store: {[str(p) for p in rep.problems]}")
        return ""

    def conv_read_only(self) -> str:
        with self.conv("ro") as w:
            w.append(self.msg("v", "before"))
            with self.cs.ConversationStateRepository(self.path("ro"), read_only=True) as ro:
                expect(len(ro) == 1, "viewer does not see the first message")
                m = self.msg("v", "after")
                w.append(m)
                ro.refresh()
                expect(ro.get_message(m.msg_id).record == m, "refresh did not pick up the new message")
                try:
                    ro.append(self.msg("v", "nope"))
                except self.cs.RuneError:
                    pass
                else:
                    raise Failed("append on a read-only store did not raise")
        return ""

    def conv_durability(self) -> str:
        for mode in ("fsync", "batch", "none"):
            with self.conv(f"dur-{mode}", durability=mode) as r:
                m = self.msg("d", mode)
                r.append(m)
                r.append_many([self.msg("d", f"{mode} {i}") for i in range(5)])
            with self.conv(f"dur-{mode}") as r:
                expect(r.get_message(m.msg_id).record == m, f"{mode}: not stored")
        try:
            self.conv("dur-bad", durability="sometimes")
        except ValueError:
            return ""
        raise Failed("durability='sometimes' accepted")

    def locks(self) -> str:
        d = self.path("locked")
        with self.conv("locked"), self.tasks_mod.TaskStateRepository(d):
            for kind in ("conversation", "task"):
                p = subprocess.run([sys.executable, "-c", _SECOND_WRITER, d, kind], capture_output=True,
                                   text=True, env=_child_env(), timeout=60)
                expect(p.returncode == 0, f"second {kind} writer: {p.stdout.strip()} {p.stderr.strip()[-300:]}")
        with self.conv("locked"):
            pass  # the lock is released on close
        return ""

    def events(self) -> str:
        from .composition import build_conversation_state
        from .events import EventStore

        d = self.path("composed")
        ev = self.path("events-outside.jsonl")
        with build_conversation_state({"events": ev, "state": d}) as root:
            t = root.get("task_state").create("composed", "e")
            m = self.msg("e", "hello", task_id=t.task_id)
            root.get("conversation_state").append(m)
            root.get("conversation_state").append(m)  # duplicate: no envelope
        with EventStore(ev, read_only=True) as store:
            envs = list(store.iter_envelopes(0))
        types = [e["type"] for e in envs]
        expect(types == ["task_state.created", "conversation.message"], f"envelopes {types}")
        expect(envs[1]["payload_hash"] == self.rec.payload_hash(m), "payload_hash of the message")
        expect(envs[0]["payload_hash"] == self.rec.payload_hash(t), "payload_hash of the task")
        return ""

    # -- crash and damage ---------------------------------------------------

    def crash(self) -> str:
        d = self.path("crash")
        proc = subprocess.Popen([sys.executable, "-c", _CRASH_WRITER, d], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=_child_env())
        acked: list[str] = []
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 60
            while len(acked) < 120 and time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                acked.append(line.decode().strip())
            proc.send_signal(signal.SIGKILL)
            rest = proc.stdout.read()
            acked.extend(x for x in rest.decode().split() if x)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            err = proc.stderr.read().decode() if proc.stderr else ""
            for f in (proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
        expect(len(acked) >= 20, f"the writer acknowledged only {len(acked)} messages: {err[-400:]}")
        expect(proc.returncode == -signal.SIGKILL, f"writer ended with {proc.returncode}")
        RS = self.cs.ReadStatus
        with self.conv("crash", compact_every=16, hot_window=8) as r:
            missing = [i for i in acked if r.get_message(i).status is not RS.FOUND_VERIFIED]
            expect(not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}")
            rep = r.verify()
            expect(rep.ok, f"verify after the crash: {[str(p) for p in rep.problems][:3]}")
            n = len(r)
        return f"{len(acked)} acknowledged, {n} stored"

    def _tail_file(self, d: str) -> str:
        # The open tail's documented name (docs/FORMAT.md).
        return os.path.join(d, HOT_DIR, TAIL_NAME)

    def torn(self) -> str:
        with self.conv("torn") as r:
            ms = [self.msg("t", f"whole {i}") for i in range(5)]
            r.append_many(ms)
        tail = self._tail_file(self.path("torn"))
        expect(os.path.exists(tail), f"no tail file at {tail}")
        with open(tail, "ab") as f:
            f.write(b'{"x":"0123456789abcdef","k":"m","r":{"msg_id":"msg_torn"')
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with self.conv("torn") as r:
                got = [r.get_message(m.msg_id).record for m in ms]
                st = r.stats()
        expect(got == ms, "acknowledged messages lost after a torn line")
        expect(caught, "no warning about the torn line")
        expect(st.get("quarantined"), f"stats() does not report the quarantine: {st.get('quarantined')!r}")
        return f"warning: {str(caught[0].message)[:80]}"

    def flip(self) -> str:
        from .verify import verify_state

        d = self.path("flip")
        target = b"flip target 5e2a"
        with self.conv("flip") as r:
            r.append_many([self.msg("f", f"fine {i}") for i in range(5)])
            victim = self.msg("f", target.decode())
            r.append(victim)
            r.append(self.msg("f", "after"))
        holders = [p for p in _holding(d, target) if "quarantine" not in p]
        expect(holders, "the message bytes are not on disk")
        path = holders[0]
        with open(path, "r+b") as f:
            data = f.read()
            pos = data.index(target) + 5
            f.seek(pos)
            f.write(bytes([data[pos] ^ 0x20]))
        served = None
        try:
            with self.cs.ConversationStateRepository(d, read_only=True) as r:
                got = r.get_message(victim.msg_id)
                expect(got.status is not self.cs.ReadStatus.FOUND_VERIFIED, "the damaged record was served as sound")
                served = got.status.name
        except self.cs.CorruptStateCheckpointError as exc:
            served = f"open refused: {exc}"
        report = verify_state(d)
        expect(not report["ok"], "verify did not notice the flipped byte")
        named = [p for p in report["problems"] if p["file"] and os.path.basename(path) in str(p["file"])
                 and isinstance(p["offset"], int)]
        expect(named, f"verify did not name {os.path.basename(path)} with an offset: {report['problems']}")
        return f"{served}; verify: {named[0]['file']} @ {named[0]['offset']}"

    def privacy(self) -> str:
        bad = []
        for base, dirs, names in os.walk(self.root):
            for p in [os.path.join(base, n) for n in dirs + names]:
                mode = stat.S_IMODE(os.lstat(p).st_mode)
                if mode & 0o077 and not os.path.islink(p):
                    bad.append(f"{os.path.relpath(p, self.root)} {oct(mode)}")
        expect(not bad, f"{len(bad)} too open, e.g. {bad[:3]}")
        return ""

    def paths(self) -> str:
        sandbox = self.path("sandbox")
        os.makedirs(sandbox, mode=0o700)
        d = os.path.join(sandbox, "state")
        evil = ["../../escape", "/etc/passwd", "..", "a/../../b", "C:\\x", "hot"]
        before = set(os.listdir(sandbox))
        with self.cs.ConversationStateRepository(d, hot_window=1) as r:
            for e in evil:
                ms = [self.msg(e, f"evil {i}", task_id=e, msg_id=f"{e}-{i}") for i in range(3)]
                r.append_many(ms)
            r.compact()
            for e in evil:
                expect(r.window(e, 5)[-1].content == "evil 2", f"channel {e!r} not readable")
        after = set(os.listdir(sandbox))
        expect(after - before == {"state"}, f"files outside the state dir: {after - before}")
        expect(not os.path.exists(os.path.join(self.root, "escape")), "wrote ../escape")
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rune_fast.canary", description=__doc__.split("\n\n")[0])
    p.add_argument("--state", metavar="DIR", help="run in DIR (new or empty) and keep it")
    p.add_argument("--json", action="store_true", help="print the results as one JSON document")
    args = p.parse_args(argv)
    if args.state:
        root = os.path.abspath(args.state)
        if os.path.isdir(root) and os.listdir(root):
            print(f"canary: {root} is not empty; give a new or empty directory", file=sys.stderr)
            return 2
        os.makedirs(root, mode=0o700, exist_ok=True)
        os.chmod(root, 0o700)
        owned = False
    else:
        root = tempfile.mkdtemp(prefix="rune-canary-")
        owned = True
    say = (lambda s: None) if args.json else (lambda s: print(s, flush=True))
    # The store logs what it recovers and refuses; the canary provokes exactly
    # that, and its PASS/FAIL lines say what happened.
    logging.getLogger("rune_fast").addHandler(logging.NullHandler())
    t0 = time.perf_counter()
    canary = Canary(root, say=say)
    ok = canary.run()
    secs = time.perf_counter() - t0
    passed = sum(r["ok"] for r in canary.results)
    failed = len(canary.results) - passed
    if args.json:
        json.dump({"ok": ok, "passed": passed, "failed": failed, "seconds": round(secs, 2), "state_dir": root,
                   "results": canary.results}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"canary: {passed} passed, {failed} failed in {secs:.1f} s"
              + (f" (kept {root})" if failed or not owned else ""))
    if owned and ok:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
