"""Record the workload under the shim and check crash states of the recording.

Used by tests/test_power_loss.py; also runnable by hand::

    python tests/powerloss/powerloss_replay.py fsync 300      # durability, states

which prints one line per failing state and the totals.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
if ROOT not in sys.path:        # (run by path: the checkout's rune_fast, as under pytest)
    sys.path.insert(1, ROOT)

import powerloss_model as model  # noqa: E402
from powerloss_workload import fields  # noqa: E402


def build_shim(dest_dir: str) -> str | None:
    """Compile shim.c into ``dest_dir``; None when there is no C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    out = os.path.join(dest_dir, "rune_pl_shim.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", out, os.path.join(HERE, "shim.c"), "-ldl", "-lpthread"],
                   check=True, capture_output=True)
    return out


def record(shim: str, work: str, durability: str, seed: int, pythonpath: str,
           steps: int | None = None) -> model.Recording:
    """Run the workload under the shim in ``work/root``; parse its log."""
    root = os.path.join(work, "root")
    os.makedirs(root)
    log = os.path.join(work, "fs.log")
    env = dict(os.environ, RUNE_PL_DIR=root, RUNE_PL_LOG=log, LD_PRELOAD=shim, PYTHONPATH=pythonpath)
    if steps is not None:
        env["RUNE_POWERLOSS_STEPS"] = str(steps)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "powerloss_workload.py"), root, durability, str(seed)],
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"workload ({durability}, seed {seed}) failed under the shim:\n{proc.stderr}")
    rec = model.parse(log, root, os.path.join(root, "acks"))
    last = rec.acks[-1][1] if rec.acks else None
    if last != "DONE":
        raise RuntimeError(f"recording {log}: the workload's last ack is {last!r}, not DONE")
    return rec


def scratch_dir(fallback: str) -> str:
    """A folder for the crash states: in memory (/dev/shm) when there is
    one, so that the opens' syncs cost no disk flushes."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return tempfile.mkdtemp(prefix="rune_pl_states_", dir="/dev/shm")
    return tempfile.mkdtemp(prefix="rune_pl_states_", dir=fallback)


@dataclass
class Verdict:
    ok: bool
    opened: bool
    reason: str = ""


def check(state: str, orc: model.Oracle, strict: bool) -> Verdict:
    """Open the store a crash left in ``state`` and hold it to the oracle:
    it opens; no message it holds was invented or doubled; with ``strict``,
    every acknowledged message and task change is there and no acknowledged
    deletion came back."""
    from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
    from rune_fast.errors import CorruptStateCheckpointError
    from rune_fast.records import ConversationMessageRecord
    from rune_fast.tasks import TaskStateRepository
    problems: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # quarantine reports are expected
        try:
            repo = ConversationStateRepository(state, compact_every=12, hot_window=6)
        except Exception as exc:        # the verdict names any refusal
            return Verdict(False, False, f"open: {type(exc).__name__}: {exc}")
        try:
            seen: dict[str, int] = {}
            for ch in repo.channels():
                for m in repo.window(ch, 1 << 30):
                    seen[m.msg_id] = seen.get(m.msg_id, 0) + 1
                    if m.msg_id not in orc.tried:
                        problems.append(f"invented message {m.msg_id!r}")
                    elif m != ConversationMessageRecord(**fields(m.msg_id)):
                        problems.append(f"message {m.msg_id!r} differs from what was appended")
            doubled = [mid for mid, n in seen.items() if n > 1]
            if doubled:
                problems.append(f"messages served twice: {doubled[:5]}")
            if len(repo) != len(seen):
                problems.append(f"len() is {len(repo)}, windows hold {len(seen)}")
            if strict:
                for mid in sorted(orc.acked):
                    r = repo.get_message(mid)
                    if r.status is not ReadStatus.FOUND_VERIFIED:
                        problems.append(f"acknowledged {mid} lost: {r.status.name}")
                    elif mid not in seen:
                        problems.append(f"acknowledged {mid} missing from its channel's window")
                for mid in sorted(orc.deleted):
                    if mid in seen or repo.get_message(mid).status is not ReadStatus.NOT_FOUND_CONFIRMED:
                        problems.append(f"deleted {mid} came back")
        except CorruptStateCheckpointError as exc:     # a bulk read found damage: loud, named
            return Verdict(False, True, f"read: {type(exc).__name__}: {exc}")
        finally:
            repo.close()
        try:
            tasks = TaskStateRepository(state)
        except Exception as exc:
            return Verdict(False, False, f"task open: {type(exc).__name__}: {exc}")
        try:
            if strict:
                for tid, allowed in orc.tasks.items():
                    got = tasks.get(tid)
                    if got is None or got.status not in allowed:
                        problems.append(f"task {tid}: {got and got.status} not in {sorted(allowed)}")
        finally:
            tasks.close()
    return Verdict(not problems, True, "; ".join(problems[:4]))


@dataclass
class Tally:
    states: int = 0
    held: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, desc: str, v: Verdict) -> None:
        self.states += 1
        if v.ok:
            self.held += 1
        else:
            self.failures.append(f"{desc}: {v.reason}")


def run_states(rec: model.Recording, n: int, seed: int, strict: bool, scratch: str,
               tally: Tally | None = None) -> Tally:
    """Check ``n`` crash states of ``rec`` drawn with a seeded RNG."""
    tally = tally or Tally()
    rng = random.Random(seed)
    for j in range(n):
        k = rng.randint(1, rec.n)
        mode = "prefix" if rng.random() < 0.7 else "subset"
        crash = model.crash_state(rec, k, rng, mode)
        dest = os.path.join(scratch, f"s{j}")
        model.materialize(crash, rec.root, dest)
        try:
            v = check(os.path.join(dest, "state"), model.oracle(rec, k), strict)
        except Exception:       # a checker fault is a failure too, with its trace
            v = Verdict(False, True, "checker raised: " + traceback.format_exc(limit=3))
        shutil.rmtree(dest)
        if not v.ok and len(tally.failures) < 5:     # the state as the crash left it
            model.materialize(crash, rec.root, os.path.join(scratch, f"failed-{j}"))
        tally.add(f"seed {seed} state {j} ({crash.desc[:120]})", v)
    return tally


def main() -> None:
    import logging
    logging.getLogger("rune_fast").setLevel(logging.CRITICAL)
    durability = sys.argv[1]
    n = int(sys.argv[2])
    shim_dir = tempfile.mkdtemp(prefix="rune_pl_")
    shim = build_shim(shim_dir)
    assert shim, "no C compiler"
    rec = record(shim, shim_dir, durability, 1, ROOT)
    print(f"recording: {rec.n} events, {len(rec.acks)} ack lines")
    t = run_states(rec, n, 7, durability != "none", scratch_dir(shim_dir))
    for f in t.failures:
        print(f)
    print(f"{t.states} states, {t.held} held; kept in {shim_dir}")


if __name__ == "__main__":
    main()
