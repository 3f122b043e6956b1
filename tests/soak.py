"""Soak: hours of concurrent load in minutes, with nothing acknowledged lost.

One writer process holds a store (durability "batch": group commit) and
runs four appending threads (``append``, ``append_many``, ``delete`` of
their own older messages, so the store stays about the same size), two
reading threads (``window``, ``get_message``, ``messages_for_task``,
``search``) and a thread calling ``compact()`` now and then, while the
automatic compactions cool and erase. Beside it a viewer process calls
``refresh()`` and reads, and another runs ``rune-fast verify`` in a loop.

At the end: no thread raised anything unexpected, every thread stopped
(no deadlock: a stuck one is dumped with faulthandler), the viewer and
the verify loop saw no error and no damage, resident memory stayed flat
(its growth over the second half of the run is bounded), and after a
reopen every acknowledged message that was not deleted reads back
verified, every deleted one is gone, and ``verify()`` is clean.

Run: ``python tests/soak.py --seconds 600 --report docs/SOAK.md`` (the
documented ten-minute run); tests/test_soak.py runs it for 30 seconds
(RUNE_SOAK_SECONDS for longer).
Exit 0 when everything held; the report (JSON on stdout) says what ran.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

WORDS = ("Zürich", "error", "Straße", "naïve", "日本語", "deploy", "ΣΟΦΙΑ", "rollback", "café")
CHANNELS = [f"ch{i}" for i in range(12)]
TASKS = [f"task{i}" for i in range(40)]
LIVE_PER_THREAD = 3_000         # each appender deletes its oldest beyond this
RATE = 400                      # messages a second per appender, at most


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _message(tid: int, n: int):
    from rune_fast.records import ConversationMessageRecord
    rng = random.Random(tid * 1_000_003 + n)
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
    return ConversationMessageRecord(
        msg_id=f"t{tid}-{n:09d}", channel_id=rng.choice(CHANNELS), content=f"{text} #{n}",
        task_id=rng.choice(TASKS) if rng.random() < 0.3 else "", ts=time.time(),
        role=rng.choice(("user", "assistant")))


class Appender(threading.Thread):
    def __init__(self, repo: Any, tid: int, stop: threading.Event) -> None:
        super().__init__(name=f"appender-{tid}", daemon=True)
        self.repo, self.tid, self.stop = repo, tid, stop
        self.acked: list[str] = []
        self.deleted: list[str] = []
        self.lock = threading.Lock()        # readers look at acked/deleted
        self.error: BaseException | None = None
        self.calls = 0

    def run(self) -> None:
        rng = random.Random(self.tid)
        n = 0
        live_from = 0
        t0 = time.monotonic()
        try:
            while not self.stop.is_set():
                op = rng.random()
                if op < 0.5:
                    m = _message(self.tid, n)
                    n += 1
                    if self.repo.append(m):
                        with self.lock:
                            self.acked.append(m.msg_id)
                else:
                    batch = [_message(self.tid, n + k) for k in range(rng.randint(1, 40))]
                    n += len(batch)
                    added = self.repo.append_many(batch)
                    assert added == len(batch), (added, len(batch))
                    with self.lock:
                        self.acked.extend(m.msg_id for m in batch)
                self.calls += 1
                while len(self.acked) - live_from > LIVE_PER_THREAD:
                    victim = self.acked[live_from]
                    live_from += 1
                    assert self.repo.delete(victim), victim
                    with self.lock:
                        self.deleted.append(victim)
                ahead = n / RATE - (time.monotonic() - t0)
                if ahead > 0:
                    self.stop.wait(ahead)
        except BaseException as exc:
            self.error = exc


class Reader(threading.Thread):
    def __init__(self, repo: Any, rid: int, appenders: list[Appender], stop: threading.Event) -> None:
        super().__init__(name=f"reader-{rid}", daemon=True)
        self.repo, self.rid, self.appenders, self.stop = repo, rid, appenders, stop
        self.error: BaseException | None = None
        self.reads = 0

    def run(self) -> None:
        from rune_fast.conversation_state import ReadStatus
        rng = random.Random(100 + self.rid)
        try:
            while not self.stop.is_set():
                op = rng.random()
                if op < 0.4:
                    self.repo.window(rng.choice(CHANNELS), rng.choice((8, 50)))
                elif op < 0.8:
                    a = rng.choice(self.appenders)
                    with a.lock:
                        if not a.acked:
                            continue
                        mid = a.acked[rng.randrange(len(a.acked))]
                    read = self.repo.get_message(mid)
                    if read.status is ReadStatus.FOUND_VERIFIED:
                        assert read.record.msg_id == mid
                    else:
                        # only a deletion may hide an acknowledged message
                        assert read.status is ReadStatus.NOT_FOUND_CONFIRMED, (mid, read)
                        with a.lock:
                            assert mid in a.deleted, f"{mid} acknowledged, not deleted, not found"
                elif op < 0.95:
                    self.repo.messages_for_task(rng.choice(TASKS))
                else:
                    self.repo.search(rng.choice(WORDS), limit=20)
                self.reads += 1
        except BaseException as exc:
            self.error = exc


class Compactor(threading.Thread):
    def __init__(self, repo: Any, stop: threading.Event) -> None:
        super().__init__(name="compactor", daemon=True)
        self.repo, self.stop = repo, stop
        self.error: BaseException | None = None
        self.runs = 0

    def run(self) -> None:
        try:
            while not self.stop.wait(3.0):
                self.repo.compact()
                self.runs += 1
        except BaseException as exc:
            self.error = exc


VIEWER = r"""
import json, sys, time
from rune_fast.conversation_state import ConversationStateRepository
state, until = sys.argv[1], float(sys.argv[2])
out = {"refreshes": 0, "errors": []}
try:
    with ConversationStateRepository(state, read_only=True) as v:
        while time.time() < until:
            v.refresh()
            n = len(v)
            for ch in v.channels()[:3]:
                v.window(ch, 8)
            out["refreshes"] += 1
            time.sleep(0.05)
except Exception as exc:
    out["errors"].append(f"{type(exc).__name__}: {exc}")
print(json.dumps(out))
"""


def _verify_loop(state: str, until: float) -> dict[str, Any]:
    runs, problems = 0, []
    while time.time() < until:
        out = subprocess.run([sys.executable, "-m", "rune_fast", "--state", state, "--json", "verify"],
                             capture_output=True, text=True, timeout=300)
        runs += 1
        if out.returncode != 0:
            problems.append((out.returncode, out.stdout[-2000:], out.stderr[-2000:]))
    return {"runs": runs, "problems": problems}


def soak(seconds: float, state: str) -> dict[str, Any]:
    from rune_fast.conversation_state import ConversationStateRepository, ReadStatus

    repo = ConversationStateRepository(state, durability="batch", compact_every=2_000, hot_window=300)
    stop = threading.Event()
    appenders = [Appender(repo, t, stop) for t in range(4)]
    readers = [Reader(repo, r, appenders, stop) for r in range(2)]
    compactor = Compactor(repo, stop)
    until = time.time() + seconds
    viewer = subprocess.Popen([sys.executable, "-c", VIEWER, state, str(until)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    verify_result: dict[str, Any] = {}
    verifier = threading.Thread(target=lambda: verify_result.update(_verify_loop(state, until)),
                                name="verify-loop", daemon=True)
    threads: list[threading.Thread] = [*appenders, *readers, compactor]
    for t in [*threads, verifier]:
        t.start()
    rss: list[tuple[float, int]] = []
    t0 = time.time()
    while time.time() < until and not any(getattr(t, "error", None) for t in threads):
        rss.append((round(time.time() - t0, 1), _rss()))
        time.sleep(1.0)
    stop.set()
    stuck = []
    for t in threads:
        t.join(timeout=60)
        if t.is_alive():
            stuck.append(t.name)
    if stuck:
        faulthandler.dump_traceback(all_threads=True)
    v_out, v_err = viewer.communicate(timeout=120)
    verifier.join(timeout=300)
    repo.close()
    errors = [f"{t.name}: {type(t.error).__name__}: {t.error}" for t in threads if getattr(t, "error", None)]
    acked = [m for a in appenders for m in a.acked]
    deleted = {m for a in appenders for m in a.deleted}
    lost, resurrected = [], []
    with ConversationStateRepository(state) as again:
        for mid in acked:
            st = again.get_message(mid).status
            if mid in deleted:
                if st is not ReadStatus.NOT_FOUND_CONFIRMED:
                    resurrected.append(mid)
            elif st is not ReadStatus.FOUND_VERIFIED:
                lost.append((mid, st.value))
        report = again.verify()
        live = len(again)
    try:
        viewer_report = json.loads(v_out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        viewer_report = {"errors": [f"viewer printed no report (exit {viewer.returncode}): {v_err[-2000:]}"]}
    half = [b for t, b in rss if t >= seconds / 2]
    growth = (max(half) - half[0]) if half else 0
    return {
        "seconds": seconds, "appended": len(acked), "deleted": len(deleted), "live_after": live,
        "append_calls": sum(a.calls for a in appenders), "reads": sum(r.reads for r in readers),
        "explicit_compactions": compactor.runs, "errors": errors, "stuck": stuck,
        "viewer": viewer_report, "verify_loop": verify_result,
        "lost": lost[:20], "lost_count": len(lost), "resurrected": resurrected[:20],
        "verify_ok": report.ok, "verify_problems": [str(p) for p in report.problems][:20],
        "rss_mib": {"start": round(rss[0][1] / 2**20, 1) if rss else 0,
                    "half": round(half[0] / 2**20, 1) if half else 0,
                    "end": round(rss[-1][1] / 2**20, 1) if rss else 0,
                    "growth_second_half": round(growth / 2**20, 1)},
    }


def held(r: dict[str, Any], *, rss_bound_mib: float) -> list[str]:
    """What did not hold (empty: everything held)."""
    bad = []
    for key in ("errors", "stuck", "lost", "resurrected"):
        if r[key]:
            bad.append(f"{key}: {r[key]}")
    if r["viewer"].get("errors"):
        bad.append(f"viewer: {r['viewer']['errors']}")
    if r["verify_loop"].get("problems"):
        bad.append(f"verify loop: {r['verify_loop']['problems'][:3]}")
    if not r["verify_ok"]:
        bad.append(f"final verify: {r['verify_problems']}")
    if r["rss_mib"]["growth_second_half"] > rss_bound_mib:
        bad.append(f"resident memory grew {r['rss_mib']['growth_second_half']} MiB in the second half")
    if not r["viewer"].get("refreshes") or not r["verify_loop"].get("runs"):
        bad.append("the viewer or the verify loop never ran")
    return bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--state", help="state directory (default: a new temporary one)")
    p.add_argument("--rss-bound-mib", type=float, default=64,
                   help="largest resident-memory growth allowed over the second half")
    p.add_argument("--report", help="also write the report as a Markdown page here")
    args = p.parse_args()
    state = args.state or tempfile.mkdtemp(prefix="rune-soak-")
    r = soak(args.seconds, state)
    bad = held(r, rss_bound_mib=args.rss_bound_mib)
    r["held"] = not bad
    r["not_held"] = bad
    print(json.dumps(r, indent=1))
    if args.report:
        with open(args.report, "w") as f:
            f.write(_markdown(r))
    return 0 if not bad else 1


def _markdown(r: dict[str, Any]) -> str:
    import platform
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    rows = [("duration", f"{r['seconds']:.0f} s"),
            ("messages appended (acknowledged)", f"{r['appended']:,}"),
            ("append calls", f"{r['append_calls']:,}"), ("deleted", f"{r['deleted']:,}"),
            ("live after reopen", f"{r['live_after']:,}"), ("reads", f"{r['reads']:,}"),
            ("explicit compactions", r["explicit_compactions"]),
            ("viewer refreshes", r["viewer"].get("refreshes")),
            ("`rune-fast verify` runs beside the writer", r["verify_loop"].get("runs")),
            ("acknowledged and lost", r["lost_count"]), ("deleted and found again", len(r["resurrected"])),
            ("unexpected exceptions / stuck threads", f"{len(r['errors'])} / {len(r['stuck'])}"),
            ("final verify()", "clean" if r["verify_ok"] else "PROBLEMS"),
            ("resident memory MiB (start / half / end)",
             f"{r['rss_mib']['start']} / {r['rss_mib']['half']} / {r['rss_mib']['end']}"),
            ("held", "yes" if r["held"] else f"NO: {r['not_held']}")]
    out = ["# Soak run", "",
           f"`python tests/soak.py --seconds {r['seconds']:.0f} --report docs/SOAK.md` on "
           f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
           f"{time.strftime('%Y-%m-%d')}, commit {commit}. What it runs: tests/soak.py's docstring.", "",
           "| what | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
