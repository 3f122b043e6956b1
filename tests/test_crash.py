"""Crash safety proven by crashes: a writer subprocess (tests/crash_writer.py)
appends, deletes and compacts while printing what each call acknowledged, and is
killed with SIGKILL at random moments; the store is then reopened here and must
hold every acknowledged message exactly once, with its exact content, and
nothing else (SPEC sections 4-5, issues 4 and 7).

Several kill generations run on one state directory; each reopen checks every
read path (get_message, window, messages_for_task, search, len, channels),
verify(), the event store's envelopes, and that a read-only open changes no file.
Then a fresh writer continues on the same directory.

Some kills also tear the final line of the tail or events.jsonl, as a write
cut short would. Two deterministic sweeps complete the random kills: the
writer dies (``os._exit``, which loses what SIGKILL loses) just before or just
after one file step (write -- torn in half --, fsync, rename, unlink) of a
compact() that folds, cools, erases and rolls the tail; and of a recovering
open. Contract failures that do not depend on the crash (order of bulk reads,
erasure, stats() reporting) are collected and reported at the end of a test,
so the crash checks keep running past them.

Kill points are random; the checks are not. The seed is printed in every
failure; rerun with RUNE_CRASH_SEED=<seed> to replay the same plan (the kill
instants themselves depend on timing).
"""
from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WRITER = os.path.join(HERE, "crash_writer.py")


def _load_writer():
    name = "rune_crash_writer"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, WRITER)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


cw = _load_writer()

SEED = int(os.environ.get("RUNE_CRASH_SEED", random.SystemRandom().randrange(1 << 31)))

pytestmark = pytest.mark.slow

LIVE, DELETED, ABSENT, MAYBE_LIVE, MAYBE_DELETED = "live", "deleted", "absent", "maybe-live", "maybe-deleted"
BIG = 1 << 20
# Chance that a kill also tears the final line of each log file.
TEAR_P = float(os.environ.get("RUNE_CRASH_TEAR_P", "0.25"))
# Warnings that are not recovery reports (garbage collection, deprecations).
IGNORED_WARNINGS = (ResourceWarning, DeprecationWarning, PendingDeprecationWarning)


# ------------------------------------------------------------ the subprocess

class WriterRun:
    """One writer subprocess: its stdout lines as they arrive, and how it ended."""

    def __init__(self, state: str, errfile: str, **opts) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.eof = False
        self.killed_at: str = "(not killed)"
        argv = [sys.executable, WRITER, "--state", state]
        for k, v in opts.items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                argv.append(flag)
            elif v is not False and v is not None:
                argv += [flag, str(v)]
        self.argv = argv
        self.errfile = errfile
        self._err = open(errfile, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._err, cwd=ROOT,
                                     env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            if not raw.endswith(b"\n"):
                break                                 # cannot happen: one write(2) per line
            with self.cond:
                self.lines.append(raw[:-1].decode("utf-8"))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_for(self, pred, timeout: float = 60.0) -> bool:
        """Wait until ``pred(lines)`` holds or the writer's stdout closed."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self.lines):
                if self.eof:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"writer stuck: no progress in {timeout}s; last lines "
                                         f"{self.lines[-5:]}; stderr:\n{self.stderr()}")
                self.cond.wait(left)
            return True

    def kill(self) -> None:
        with self.cond:
            self.killed_at = self.lines[-1] if self.lines else "(before any output)"
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def finish(self, timeout: float = 120.0) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(30)
        self.proc.stdout.close()
        self._err.close()
        return rc

    def stderr(self) -> str:
        if not self._err.closed:
            self._err.flush()
        with open(self.errfile, "rb") as f:
            return f.read().decode("utf-8", "replace")[-4000:]


def plan_kill(rng: random.Random) -> tuple:
    """Where to kill: during open/recovery, after some acknowledgements, inside
    an explicit compact() (the automatic ones run every few appends anyway),
    or after a random time."""
    r = rng.random()
    only = os.environ.get("RUNE_CRASH_PLANS")        # e.g. "open,compact": debug one kind
    if only:
        r = {"open": 0.05, "acks": 0.2, "compact": 0.5, "time": 0.9}[rng.choice(only.split(","))]
    if r < 0.12:
        return ("open", round(rng.uniform(0.0, 0.08), 4))
    if r < 0.40:
        return ("acks", rng.randint(1, 90), round(rng.uniform(0.0, 0.01), 4))
    if r < 0.65:
        return ("compact", rng.randint(1, 4), round(rng.uniform(0.0, 0.004), 5))
    return ("time", round(rng.uniform(0.0, 0.5), 4))


def execute(run: WriterRun, plan: tuple | None) -> int:
    if plan is None:
        return run.finish()
    kind = plan[0]
    if kind == "open":
        ok = run.wait_for(lambda ls: "IMPORTED" in ls)
        delay = plan[1]
    elif kind == "acks":
        n = plan[1]
        ok = run.wait_for(lambda ls: sum(1 for x in ls if x.startswith(("ACK", "TACK"))) >= n)
        delay = plan[2]
    elif kind == "compact":
        n = plan[1]
        ok = run.wait_for(lambda ls: sum(1 for x in ls if x == "TRYCOMPACT") >= n
                          or sum(1 for x in ls if x.startswith("TACK")) >= 20 * n)
        delay = plan[2]
    else:
        ok = run.wait_for(lambda ls: "READY" in ls)
        delay = plan[1]
    if ok:
        time.sleep(delay)
    run.kill()
    return run.finish()


# ------------------------------------------------------------- the models

class Failures(list):
    """Hard failures (crash safety: lost, invented, duplicated, altered, a
    reopen that raises) stop a test at once. Soft ones (order of a bulk read,
    erasure by compact()) are contract bugs that do not depend on the crash:
    they are collected, the kill generations go on, and the test fails at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.soft: list[str] = []

    def add(self, msg: str) -> None:
        self.append(msg)

    def add_soft(self, msg: str) -> None:
        self.soft.append(msg)


class SoftLog:
    """Soft failures of a whole test, the first of each kind with its context."""

    def __init__(self) -> None:
        self.first: dict[str, str] = {}
        self.count: dict[str, int] = {}

    def take(self, fails: Failures, where: str) -> None:
        for msg in fails.soft:
            kind = msg.split(":", 1)[0] if ":" in msg else msg[:40]
            kind = kind.split("(", 1)[0] + ("/order" if "append order" in msg else "")
            if "still in" in msg:
                kind = "erasure"
            self.count[kind] = self.count.get(kind, 0) + 1
            self.first.setdefault(kind, f"{where}: {msg}")
        fails.soft.clear()

    def check(self, head: str) -> None:
        if self.first:
            pytest.fail(head + "\n  - " + "\n  - ".join(
                f"[{self.count[k]}x] {v}" for k, v in sorted(self.first.items())), pytrace=False)


class ConvModel:
    """What the store must hold, from the writers' acknowledgements."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}
        self.fields: dict[str, dict] = {}
        self.acked_msgs: set[str] = set()      # ACKed (or observed stored after a crash)
        self.acked_dels: set[str] = set()      # DEL/CLEAR acknowledged

    def f(self, mid: str) -> dict:
        d = self.fields.get(mid)
        if d is None:
            d = self.fields[mid] = cw.make_fields(mid)
        return d

    def apply(self, lines: list[str], fails: Failures) -> None:
        for line in lines:
            word, _, rest = line.partition(" ")
            if word == "TRY":
                for mid in rest.split():
                    self.state.setdefault(mid, MAYBE_LIVE)
            elif word == "ACK":
                if self.state.get(rest) in (DELETED, ABSENT):
                    fails.add(f"writer got ACK for {rest}, which is {self.state[rest]}")
                self.state[rest] = LIVE
                self.acked_msgs.add(rest)
            elif word in ("DUPOK", "TOMBOK", "NODEL"):
                if word == "DUPOK" and self.state.get(rest) != LIVE:
                    fails.add(f"re-append of {rest} returned False but the model has it {self.state.get(rest)}")
            elif word == "TRYDEL":
                st = self.state.get(rest)
                if st is None:
                    self.state[rest] = ABSENT       # a never-appended id
                elif st == LIVE:
                    self.state[rest] = MAYBE_DELETED
            elif word == "DEL":
                self.state[rest] = DELETED
                self.acked_dels.add(rest)
            elif word == "TRYCLEAR":
                for mid, st in self.state.items():
                    if st == LIVE and self.f(mid)["channel_id"] == rest:
                        self.state[mid] = MAYBE_DELETED
            elif word == "CLEAR":
                ch, n = rest.split()
                hit = [m for m, st in self.state.items()
                       if st in (MAYBE_DELETED, MAYBE_LIVE) and self.f(m)["channel_id"] == ch]
                if int(n) != len(hit):
                    fails.add(f"clear_channel({ch!r}) returned {n}, expected {len(hit)}")
                for mid in hit:
                    self.state[mid] = DELETED
                    self.acked_dels.add(mid)
            elif word == "BUG":
                fails.add(f"writer reported: {line}")
            elif word not in ("IMPORTED", "READY", "TRYCOMPACT", "COMPACTED", "DONE", "SYS", "SYSCOUNT"):
                fails.add(f"unparsable writer line {line!r}")

    def live(self) -> list[str]:
        return [m for m, s in self.state.items() if s == LIVE]

    def deleted(self) -> list[str]:
        return [m for m, s in self.state.items() if s == DELETED]


def _stream_order_ok(ids: list[str]) -> str | None:
    """Append order of the crash writer: generations in order; within one
    generation and writer thread, increasing index. None if ``ids`` respects it."""
    last_gen = -1
    last_i: dict[tuple[int, int], int] = {}
    for pos, mid in enumerate(ids):
        g, t, i = cw.parse_msg_id(mid)
        if g < last_gen:
            return f"{mid} (generation {g}) at position {pos} after a generation-{last_gen} message"
        last_gen = g
        if last_i.get((g, t), -1) >= i:
            return f"{mid} at position {pos} after message index {last_i[(g, t)]} of the same writer"
        last_i[(g, t)] = i
    return None


def inject_tears(state: str, rng: random.Random, files: list[tuple[str, str]] | None = None) -> list[str]:
    """What a write cut short by the kill leaves: at the logical end (before any
    zero preallocation) of the tail and/or events.jsonl, the first part of a
    line (a copy of the file's last line, so it looks like a real frame).
    Returns which files were torn ("tail", "events")."""
    torn = []
    if files is None:
        files = [("tail", os.path.join(state, "hot", "conversation_tail.jsonl")),
                 ("events", os.path.join(state, "events.jsonl"))]
    for kind, path in files:
        if rng.random() >= TEAR_P or not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        end = len(data.rstrip(b"\0"))
        if end == 0 or data[end - 1:end] != b"\n":
            continue
        start = data.rfind(b"\n", 0, end - 1) + 1
        piece = data[start:start + rng.randint(1, end - start - 1)]
        with open(path, "r+b") as f:
            f.seek(end)
            f.write(piece)
        torn.append(kind)
    return torn


def _open_conv(state: str, cfg: dict, **kw):
    from rune_fast.conversation_state import ConversationStateRepository
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        repo = ConversationStateRepository(state, compact_every=cfg["compact_every"],
                                           hot_window=cfg["hot_window"],
                                           durability=cfg["durability"], **kw)
    return repo, [f"{w.category.__name__}: {w.message}" for w in caught
                  if not issubclass(w.category, IGNORED_WARNINGS)]


def quarantine_count(stats) -> int:
    """How many quarantined items ``stats()`` reports, wherever it nests them
    (any key containing "quarantin": a list, a dict, a count or a path)."""
    n = 0
    if isinstance(stats, dict):
        items = stats.items()
    elif hasattr(stats, "__dict__"):
        items = vars(stats).items()
    else:
        return 0
    for k, v in items:
        if "quarantin" in str(k).lower():
            if isinstance(v, bool):
                n += int(v)
            elif isinstance(v, int):
                n += v
            elif isinstance(v, (list, tuple, dict, set)):
                n += len(v)
            elif v:
                n += 1
        elif isinstance(v, dict):
            n += quarantine_count(v)
    return n


def _quarantine_reported(stats) -> bool:
    return quarantine_count(stats) > 0


def check_read_only(state: str, cfg: dict, model: ConvModel, fails: Failures) -> None:
    """A read-only open of what a dead writer left: every acknowledged message,
    exactly, no file changed (an incomplete final line is skipped)."""
    from rune_fast.conversation_state import ReadStatus
    before = cw.tree_digest(state)
    try:
        ro, _warns = _open_conv(state, cfg, read_only=True)
    except Exception as exc:  # noqa: BLE001
        fails.add(f"read-only open after the kill raised {type(exc).__name__}: {exc}")
        return
    try:
        missing = []
        for mid in model.live():
            rd = ro.get_message(mid)
            if rd.status != ReadStatus.FOUND_VERIFIED or rd.record != cw.make_message(mid):
                missing.append((mid, rd.status.name, rd.tier))
        if missing:
            fails.add(f"read-only open: {len(missing)} of {len(model.live())} acknowledged messages "
                      f"not served, e.g. {missing[:6]}")
        listed = {r.msg_id for ch in cw.CHANNELS for r in ro.window(ch, BIG)}
        gone = [m for m in model.live() if m not in listed]
        if gone:
            fails.add(f"read-only open: window() misses {len(gone)} acknowledged messages, e.g. {gone[:6]}")
    except Exception as exc:  # noqa: BLE001
        fails.add(f"read-only reads raised {type(exc).__name__}: {exc}")
    finally:
        ro.close()
    after = cw.tree_digest(state)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        fails.add(f"read-only open changed files: {changed}")


def check_conv_store(repo, model: ConvModel, fails: Failures, *, promote: bool) -> None:
    """Every read path against the model. With ``promote``, ids whose fate was
    open (a call in flight at the kill) are fixed to what this reopen found."""
    from rune_fast.conversation_state import ReadStatus
    present: set[str] = set()
    for mid, st in sorted(model.state.items()):
        try:
            rd = repo.get_message(mid)
        except Exception as exc:  # noqa: BLE001 - reported as a failure with its type
            fails.add(f"get_message({mid}) raised {type(exc).__name__}: {exc}")
            continue
        if rd.status == ReadStatus.FOUND_VERIFIED:
            present.add(mid)
            if rd.record != cw.make_message(mid):
                fails.add(f"get_message({mid}) returned a different record (tier {rd.tier}): "
                          f"{rd.record!r:.300}")
            if rd.tier not in ("hot", "tail", "cool"):
                fails.add(f"get_message({mid}).tier is {rd.tier!r}")
            if st in (DELETED, ABSENT):
                fails.add(f"{mid} is {st} but get_message found it (tier {rd.tier})")
        elif rd.status == ReadStatus.NOT_FOUND_CONFIRMED:
            if rd.record is not None:
                fails.add(f"get_message({mid}) is NOT_FOUND_CONFIRMED with a record")
            if st == LIVE:
                fails.add(f"acknowledged message {mid} lost: NOT_FOUND_CONFIRMED "
                          f"(channel {model.f(mid)['channel_id']}, task {model.f(mid)['task_id']!r})")
        else:
            fails.add(f"get_message({mid}) is {rd.status} (tier {rd.tier}) in a store nobody damaged")

    def bulk(name: str, got, want: set[str], check_order: bool = True) -> None:
        ids = [r.msg_id for r in got]
        if len(ids) != len(set(ids)):
            dup = sorted({m for m in ids if ids.count(m) > 1})
            fails.add(f"{name}: duplicated ids {dup[:10]}")
        unknown = [m for m in ids if m not in model.state]
        if unknown:
            fails.add(f"{name}: invented ids {unknown[:10]}")
        for r in got:
            if r.msg_id in model.state and r != cw.make_message(r.msg_id):
                fails.add(f"{name}: record {r.msg_id} differs from what was appended: {r!r:.300}")
        missing = sorted(want - set(ids))
        extra = sorted(set(ids) - want)
        if missing:
            fails.add(f"{name}: missing {len(missing)} messages get_message finds, e.g. "
                      f"{[(m, model.state.get(m)) for m in missing[:8]]}")
        if extra:
            fails.add(f"{name}: {len(extra)} messages get_message does not find, e.g. "
                      f"{[(m, model.state.get(m)) for m in extra[:8]]}")
        if check_order and not unknown:
            bad = _stream_order_ok(ids)
            if bad:
                fails.add_soft(f"{name}: not in append order: {bad}")

    def guarded(name: str, fn, *a, **kw):
        try:
            return fn(*a, **kw)
        except Exception as exc:  # noqa: BLE001
            fails.add(f"{name} raised {type(exc).__name__}: {exc}")
            return None

    for ch in cw.CHANNELS:
        want = {m for m in present if model.f(m)["channel_id"] == ch}
        w = guarded(f"window({ch!r})", repo.window, ch, BIG)
        if w is not None:
            bulk(f"window({ch!r}, {BIG})", w, want)
            w3 = guarded(f"window({ch!r}, 3)", repo.window, ch, 3)
            if w3 is not None and [r.msg_id for r in w3] != [r.msg_id for r in w[-3:]]:
                fails.add(f"window({ch!r}, 3) = {[r.msg_id for r in w3]} but the last 3 of the "
                          f"full window are {[r.msg_id for r in w[-3:]]}")
    for task in sorted(set(cw.TASKS) - {""}):
        want = {m for m in present if model.f(m)["task_id"] == task}
        got = guarded(f"messages_for_task({task!r})", repo.messages_for_task, task)
        if got is not None:
            bulk(f"messages_for_task({task!r})", got, want)
    hits = guarded("search('')", repo.search, "")
    if hits is not None:
        bulk("search('')", [h.record for h in hits], present, check_order=False)
    if present:
        probe = sorted(present)[len(present) // 2]
        hits = guarded("search(marker)", repo.search, f"<<{probe}>>")
        if hits is not None and [h.record.msg_id for h in hits] != [probe]:
            fails.add(f"search('<<{probe}>>') gave {[h.record.msg_id for h in hits]}")
    n = guarded("len(repo)", len, repo)
    if n is not None and n != len(present):
        fails.add(f"len(repo) = {n}, but get_message finds {len(present)} messages")
    chans = guarded("channels()", repo.channels)
    if chans is not None:
        need = {model.f(m)["channel_id"] for m in present}
        if not need <= set(chans) or not set(chans) <= set(cw.CHANNELS):
            fails.add(f"channels() = {sorted(chans)}; channels with messages: {sorted(need)}")
    rep = guarded("verify()", repo.verify)
    if rep is not None:
        ok = rep.ok if hasattr(rep, "ok") else rep["ok"]
        if not ok:
            probs = rep.problems if hasattr(rep, "problems") else rep.get("problems")
            fails.add(f"verify() not ok on an undamaged store: {[str(p) for p in probs][:5]}")
    if promote:
        for mid, st in list(model.state.items()):
            if st == MAYBE_LIVE:
                model.state[mid] = LIVE if mid in present else ABSENT
                if mid in present:
                    model.acked_msgs.add(mid)
            elif st == MAYBE_DELETED:
                model.state[mid] = LIVE if mid in present else DELETED


def check_envelopes(state: str, model: ConvModel, fails: Failures) -> None:
    """After a writable reopen, every stored message and every acknowledged
    deletion has its envelope in events.jsonl (SPEC 5; issue 4: recovery
    re-derives envelopes a crash lost), once, with the right payload_hash."""
    path = os.path.join(state, "events.jsonl")
    if not os.path.exists(path):
        fails.add("events.jsonl does not exist")
        return
    envs, problems = cw.read_envelopes(path)
    for p in problems:
        fails.add(p)
    msgs: dict[str, list[str]] = {}
    dels: dict[str, list[str]] = {}
    for e in envs:
        if e.get("type") == "conversation.message":
            msgs.setdefault(e.get("id"), []).append(e.get("payload_hash"))
        elif e.get("type") == "conversation.deleted":
            dels.setdefault(e.get("id"), []).append(e.get("payload_hash"))
    for mid in sorted(model.acked_msgs):
        want = cw.payload_hash_of(cw.make_message(mid).to_dict())
        got = msgs.get(mid, [])
        if not got:
            fails.add(f"no conversation.message envelope for stored message {mid}")
        elif len(got) > 1:
            fails.add(f"{len(got)} conversation.message envelopes for {mid} (one append)")
        elif got[0] != want:
            fails.add(f"envelope of {mid}: payload_hash {got[0]} != {want}")
    for mid in sorted(model.acked_dels):
        want = cw.payload_hash_of({"msg_id": mid})
        got = dels.get(mid, [])
        if not got:
            fails.add(f"no conversation.deleted envelope for acknowledged delete of {mid}")
        elif want not in got:
            fails.add(f"conversation.deleted envelope of {mid}: payload_hash {got} != {want}")
    invented = sorted(m for m in msgs if m not in model.state)
    if invented:
        fails.add(f"conversation.message envelopes for ids never appended: {invented[:10]}")


# ----------------------------------------------------------- conversation runs

CONV_CONFIGS = {
    # name: options; gens = killed writer generations on one directory
    "fsync-deletes": dict(durability="fsync", compact_every=8, hot_window=4, deletes=True, threads=1, gens=6),
    "fsync-plain": dict(durability="fsync", compact_every=12, hot_window=6, deletes=False, threads=1, gens=4),
    "batch-threads": dict(durability="batch", compact_every=16, hot_window=8, deletes=True, threads=2, gens=5),
    "none-deletes": dict(durability="none", compact_every=32, hot_window=16, deletes=True, threads=1, gens=5),
    # cooling runs and merges staged by the background thread (a kill may land
    # while a staged file is written, synced or waiting to be adopted)
    "fsync-background": dict(durability="fsync", compact_every=8, hot_window=4, deletes=True, threads=2,
                             gens=6, bg_min=4),
}


@pytest.mark.parametrize("name", sorted(CONV_CONFIGS))
def test_sigkill_conversation_writer(tmp_path, name):
    cfg = CONV_CONFIGS[name]
    seed = SEED + sorted(CONV_CONFIGS).index(name)
    rng = random.Random(seed)
    state = str(tmp_path / "state")
    model = ConvModel()
    log: list[str] = []
    soft = SoftLog()

    def fail_here(fails: Failures, gen: int, plan, run: WriterRun | None, rc) -> None:
        head = (f"crash test {name!r} failed: seed={seed} (rerun with RUNE_CRASH_SEED={SEED}), "
                f"generation {gen}, kill plan {plan}, writer rc {rc}")
        if run is not None:
            head += (f"\nkilled after stdout line: {run.killed_at!r}\nlast writer lines: "
                     f"{run.lines[-8:]}\nwriter argv: {' '.join(run.argv)}\nwriter stderr:\n{run.stderr()}")
        pytest.fail(head + "\nhistory:\n  " + "\n  ".join(log[-12:]) + "\nfailures:\n  - "
                    + "\n  - ".join(fails[:40] + [f"(contract) {m}" for m in fails.soft[:5]]),
                    pytrace=False)

    n_gens = cfg["gens"] + 1
    for gen in range(n_gens):
        final = gen == n_gens - 1
        plan = None if final else plan_kill(rng)
        live, dels = model.live(), model.deleted()
        dups = rng.sample(live, min(3, len(live)))
        tombs = rng.sample(dels, min(2, len(dels)))
        run = WriterRun(state, str(tmp_path / f"writer-{gen}.err"), mode="conv", gen=gen, seed=seed,
                        durability=cfg["durability"], compact_every=cfg["compact_every"],
                        hot_window=cfg["hot_window"], deletes=cfg["deletes"], threads=cfg["threads"],
                        count=40 if final else 100_000, dups=",".join(dups), tombs=",".join(tombs),
                        bg_min=cfg.get("bg_min"))
        rc = execute(run, plan)
        fails = Failures()
        model.apply(run.lines, fails)
        if plan is None and (rc != 0 or "DONE" not in run.lines):
            fails.add(f"the final writer (not killed) exited with {rc}")
        if plan is not None and rc not in (-signal.SIGKILL, 0):
            fails.add(f"the writer died by itself with exit code {rc} before the kill")
        n_ack = sum(1 for ln in run.lines if ln.startswith("ACK"))
        log.append(f"gen {gen}: plan {plan}, rc {rc}, {len(run.lines)} lines, {n_ack} ACKs, "
                   f"killed after {run.killed_at!r}")
        if fails:
            fail_here(fails, gen, plan, run, rc)

        # Sometimes the kill also tore a write: half of a copy of the last line
        # at the logical end of the tail and/or of events.jsonl.
        torn = inject_tears(state, rng) if plan is not None else []
        if torn:
            log.append(f"gen {gen}: tore the final line of {torn}")

        # A read-only open (every other generation) sees every acknowledged
        # message and changes no file, torn tail or not.
        if gen % 2 == 1:
            check_read_only(state, cfg, model, fails)   # reported with the writable checks below

        try:
            repo, warns = _open_conv(state, cfg)
        except Exception as exc:  # noqa: BLE001
            fails.add(f"reopen after the kill raised {type(exc).__name__}: {exc}")
            fail_here(fails, gen, plan, run, rc)
        try:
            if warns:
                log.append(f"gen {gen}: reopen warned: {warns}")
            if torn and not warns:
                fails.add(f"the torn final line of {torn} was recovered without a warning")
            n_quar = quarantine_count(repo.stats())
            if "tail" in torn and n_quar == 0:
                fails.add(f"the torn tail line is not reported by stats(): {repo.stats()!r:.500}")
            elif (warns and n_quar == 0) or n_quar < len(torn):
                fails.add_soft(f"stats() does not report the quarantine of the torn line the "
                               f"reopen warned about ({torn or warns})")
            if repo.stats()["lost"]:
                fails.add(f"a kill (which loses nothing acknowledged) reads as lost messages: "
                          f"{repo.stats()['lost']!r:.500}")
            check_conv_store(repo, model, fails, promote=True)
        finally:
            repo.close()
        check_envelopes(state, model, fails)
        soft.take(fails, f"generation {gen} (kill plan {plan}, killed after {run.killed_at!r})")
        if fails:
            fail_here(fails, gen, plan, run, rc)

    # A last reopen after the clean close: same answers, nothing quarantined;
    # then compact() erases every deleted message's content from every file.
    fails = Failures()
    repo, warns = _open_conv(state, cfg)
    try:
        if warns:
            fails.add(f"reopen after a clean close warned: {warns}")
        check_conv_store(repo, model, fails, promote=False)
        repo.compact()
        check_conv_store(repo, model, fails, promote=False)
    finally:
        repo.close()
    check_erased(state, model, fails)
    soft.take(fails, "after the last clean writer and compact()")
    if fails:
        fail_here(fails, n_gens, None, None, 0)
    assert model.live(), f"seed {seed}: no message was ever acknowledged; the test proved nothing"
    print(f"crash test {name!r} seed {seed}:\n  " + "\n  ".join(log))   # shown with -s
    soft.check(f"crash test {name!r} (seed {seed}): every crash check passed, but these contract "
               f"checks failed:")


# ------------------------------------------------------------------ task ledger

class TaskModel:
    def __init__(self) -> None:
        self.tasks: dict[str, dict] = {}
        self.order: list[str] = []              # creation order
        self.touch: dict[str, int] = {}         # seq of the last create/amend
        self.seq = 0
        self.acked: list[dict] = []             # every acknowledged change: (op, record dict)
        self.pending: dict | None = None

    def apply(self, lines: list[str], fails: Failures) -> None:
        import json
        for line in lines:
            word, _, rest = line.partition(" ")
            if word == "TTRY":
                self.pending = json.loads(rest)
            elif word == "TACK":
                rec = json.loads(rest)
                op = self.pending["op"] if self.pending else "?"
                self._put(op, rec)
                self.acked.append({"op": op, "rec": rec})
                self.pending = None
            elif word == "TREFUSED":
                pass
            elif word == "BUG":
                fails.add(f"writer reported: {line}")
            elif word not in ("IMPORTED", "READY", "DONE"):
                fails.add(f"unparsable writer line {line!r}")

    def _put(self, op: str, rec: dict) -> None:
        tid = rec["task_id"]
        self.seq += 1
        if tid not in self.tasks:
            self.order.append(tid)
        if op in ("create", "amend") or tid not in self.tasks:
            self.touch[tid] = self.seq
        self.tasks[tid] = rec

    def terminal(self) -> list[str]:
        from rune_fast.records import TASK_TRANSITIONS
        return [t for t, r in self.tasks.items() if not TASK_TRANSITIONS[r["status"]]]


def _pending_matches(p: dict, old: dict | None, new: dict) -> bool:
    if p["op"] == "create":
        return (old is None and new["title"] == p["title"] and new["channel_id"] == p["channel_id"]
                and new["status"] == "created")
    if old is None:
        return False
    same = {k: v for k, v in old.items() if k not in ("title", "status", "outcome_ref", "updated_at")}
    if {k: new.get(k) for k in same} != same or new["updated_at"] < old["updated_at"]:
        return False
    if p["op"] == "amend":
        return new["title"] == p["title"] and new["status"] == old["status"]
    # outcome_ref="" may mean "leave it" or "clear it": SPEC does not say
    outcome_ok = new["outcome_ref"] == p["outcome_ref"] or (
        p["outcome_ref"] == "" and new["outcome_ref"] == old["outcome_ref"])
    return new["status"] == p["status"] and outcome_ok and new["title"] == old["title"]


def task_files(state: str) -> list[tuple[str, str]]:
    hot = os.path.join(state, "hot")
    logs = sorted(n for n in os.listdir(hot) if n.startswith("task_log") and n.endswith(".jsonl")) \
        if os.path.isdir(hot) else []
    out = [("events", os.path.join(state, "events.jsonl"))]
    if logs:
        out.insert(0, ("tasklog", os.path.join(hot, logs[-1])))
    return out


def check_tasks(state: str, model: TaskModel, fails: Failures, torn: list[str] = ()) -> None:
    TaskStateRepository = cw.task_repository_class()
    from rune_fast.records import TASK_TRANSITIONS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            repo = TaskStateRepository(state)
        except Exception as exc:  # noqa: BLE001
            fails.add(f"task ledger reopen raised {type(exc).__name__}: {exc}")
            return
    try:
        p = model.pending
        applied = None
        for tid in model.order:
            want = model.tasks[tid]
            got = repo.get(tid)
            if got is None:
                fails.add(f"acknowledged task {tid} lost")
                continue
            gd = got.to_dict()
            if gd == want:
                continue
            if p is not None and p.get("task_id") == tid and _pending_matches(p, want, gd):
                applied = gd
                continue
            fails.add(f"task {tid}: reopened as {gd}, last acknowledged {want}, in flight {p}")
        seen: set[str] = set()
        for ch in cw.TASK_CHANNELS:
            for t in repo.list_open(ch):
                seen.add(t.task_id)
                if t.task_id in model.tasks:
                    continue
                if p is not None and p["op"] == "create" and applied is None \
                        and _pending_matches(p, None, t.to_dict()):
                    applied = t.to_dict()
                else:
                    fails.add(f"list_open({ch!r}) holds a task nobody created: {t.to_dict()}")
        if applied is not None:
            model._put(p["op"], applied)
            model.acked.append({"op": p["op"], "rec": applied})
        model.pending = None
        for ch in cw.TASK_CHANNELS:
            want_open = [t for t in model.order if model.tasks[t]["channel_id"] == ch
                         and TASK_TRANSITIONS[model.tasks[t]["status"]]]
            got_open = [t.task_id for t in repo.list_open(ch)]
            if got_open != want_open:
                fails.add(f"list_open({ch!r}) = {got_open}, expected (oldest first) {want_open}")
            active = max(want_open, key=lambda t: model.touch[t], default=None)
            ga = repo.get_active(ch)
            if (ga.task_id if ga else None) != active:
                fails.add(f"get_active({ch!r}) = {ga.task_id if ga else None}, expected {active}")
            created = [t for t in model.order if model.tasks[t]["channel_id"] == ch]
            gl = repo.latest(ch)
            if (gl.task_id if gl else None) != (created[-1] if created else None):
                fails.add(f"latest({ch!r}) = {gl.task_id if gl else None}, expected "
                          f"{created[-1] if created else None}")
        caught = [w for w in caught if not issubclass(w.category, IGNORED_WARNINGS)]
        if torn and not caught:
            fails.add(f"the torn final line of {torn} was recovered without a warning")
        n_quar = quarantine_count(repo.stats())
        if "tasklog" in torn and n_quar == 0:
            fails.add(f"the torn task log line is not reported by stats(): {repo.stats()}")
        elif (caught and n_quar == 0) or n_quar < len(torn):
            fails.add_soft(f"stats() does not report the quarantine of the torn line the task "
                           f"ledger's reopen warned about ({torn or [str(w.message) for w in caught]})")
    finally:
        repo.close()
    envs, problems = cw.read_envelopes(os.path.join(state, "events.jsonl"))
    for pr in problems:
        fails.add(pr)
    have = {(e.get("type"), e.get("id"), e.get("payload_hash")) for e in envs}
    for ch in model.acked:
        typ = {"create": "task_state.created", "amend": "task_state.amended",
               "transition": "task_state.transition"}.get(ch["op"])
        key = (typ, ch["rec"]["task_id"], cw.payload_hash_of(ch["rec"]))
        if key not in have:
            fails.add(f"no {typ} envelope with the record's payload_hash for acknowledged change "
                      f"{ch['op']} of {ch['rec']['task_id']}")


def test_sigkill_task_ledger(tmp_path):
    seed = SEED + 100
    rng = random.Random(seed)
    state = str(tmp_path / "state")
    model = TaskModel()
    soft = SoftLog()
    gens = 5
    for gen in range(gens + 1):
        final = gen == gens
        plan = None if final else plan_kill(rng)
        run = WriterRun(state, str(tmp_path / f"task-{gen}.err"), mode="task", gen=gen, seed=seed,
                        count=30 if final else 100_000, tombs=",".join(model.terminal()[:3]))
        rc = execute(run, plan)
        fails = Failures()
        model.apply(run.lines, fails)
        if plan is None and (rc != 0 or "DONE" not in run.lines):
            fails.add(f"the final task writer exited with {rc}")
        if plan is not None and rc not in (-signal.SIGKILL, 0):
            fails.add(f"the task writer died by itself with exit code {rc}")
        torn = inject_tears(state, rng, task_files(state)) if plan is not None and not fails else []
        if not fails:
            check_tasks(state, model, fails, torn)
        soft.take(fails, f"generation {gen} (torn: {torn})")
        print(f"task gen {gen}: plan {plan}, killed after {run.killed_at!r}, torn {torn}")   # shown with -s
        if fails:
            pytest.fail(f"task crash test failed: seed={seed} (RUNE_CRASH_SEED={SEED}), generation "
                        f"{gen}, kill plan {plan}, killed after {run.killed_at!r}, rc {rc}\n"
                        f"torn: {torn}\nlast writer lines: {run.lines[-6:]}\nstderr:\n{run.stderr()}"
                        f"\nfailures:\n  - "
                        + "\n  - ".join(fails[:30]), pytrace=False)
    assert model.tasks, f"seed {seed}: no task change was ever acknowledged"
    soft.check(f"task crash test (seed {seed}): every crash check passed, but these contract "
               f"checks failed:")


# ---------------------------------------------- death at each step of compact()

def files_holding_content(state: str, mids: list[str]) -> dict[str, list[str]]:
    """For each id, the files under ``state`` that still hold its content
    marker: raw bytes, and the decoded rows of every readable Parquet file."""
    found: dict[str, list[str]] = {}
    markers = {m: f"<<{m}>>" for m in mids}
    for path in cw.all_files(state):
        if "quarantin" in os.path.relpath(path, state):
            # inject_tears copies a stored line: its torn copy in quarantine is
            # an artefact of this test (a real torn line was never stored)
            continue
        with open(path, "rb") as f:
            data = f.read()
        texts = [data]
        if path.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq
                tab = pq.read_table(path)
                texts.append("\n".join(str(v) for col in tab.columns for v in col.to_pylist()).encode())
            except Exception:  # noqa: BLE001 - an unreadable archive is judged elsewhere
                pass
        for m, mk in markers.items():
            if any(mk.encode() in t for t in texts):
                found.setdefault(m, []).append(os.path.relpath(path, state))
    return found


def check_erased(state: str, model: ConvModel, fails: Failures) -> None:
    held = files_holding_content(state, model.deleted())
    for mid, paths in sorted(held.items()):
        fails.add_soft(f"after compact() the content of deleted {mid} is still in {paths}")


COMPACT_CFG = dict(durability="fsync", compact_every=100_000, hot_window=4)


def _compact_template(state: str) -> ConvModel:
    """A store with cooled, hot and tail messages and pending deletions in each tier."""
    from rune_fast.conversation_state import ConversationStateRepository
    model = ConvModel()
    mids = [cw.msg_id(0, 0, i) for i in range(40)]
    repo = ConversationStateRepository(state, **COMPACT_CFG)
    try:
        assert repo.append_many([cw.make_message(m) for m in mids[:24]]) == 24
        repo.compact()
        for m in mids[24:]:
            assert repo.append(cw.make_message(m))
        tiers = {m: repo.get_message(m).tier for m in mids}
        assert {"cool", "hot", "tail"} <= set(tiers.values()), tiers
        doomed = [next(m for m in mids if tiers[m] == t) for t in ("cool", "hot", "tail")]
        for m in doomed:
            assert repo.delete(m)
    finally:
        repo.close()
    for m in mids:
        model.state[m] = DELETED if m in doomed else LIVE
        model.acked_msgs.add(m)
    model.acked_dels.update(doomed)
    model.tiers = tiers
    return model


@pytest.mark.slow
def test_death_at_each_step_of_compaction(tmp_path):
    """compact() folds, cools into Parquet, erases deletions and reclaims
    segments; the writer dies (os._exit, as SIGKILL) just before or just after
    one of its file steps (write -- torn in half --, fsync, rename, unlink...).
    Every reopen holds every acknowledged message once and nothing deleted;
    the next compact() finishes the job and erases the deleted content."""
    import copy
    import shutil
    seed = SEED + 200
    rng = random.Random(seed)
    template = str(tmp_path / "template")
    base = _compact_template(template)
    # deleted during the run, with one of the run's own appends: erasure in the
    # cool tier, a rewrite of the old tail's segment and a roll of the new tail
    victims = [next(m for m in base.live() if base.tiers[m] == t) for t in ("cool", "hot")]

    def run_at(k: int, after: bool, tag: str):
        state = str(tmp_path / tag)
        shutil.copytree(template, state, symlinks=True)
        run = WriterRun(state, str(tmp_path / f"{tag}.err"), mode="compact-die", gen=1, seed=seed,
                        die_at=k, die_after=after, tombs=",".join(victims), **COMPACT_CFG)
        return state, run, run.finish()

    state, dry, rc = run_at(0, False, "dry")
    counts = [ln for ln in dry.lines if ln.startswith("SYSCOUNT")]
    assert rc == 0 and counts, f"dry run failed (rc {rc}): {dry.lines[-5:]}\n{dry.stderr()}"
    steps = [ln for ln in dry.lines if ln.startswith("SYS ")]
    total = int(counts[0].split()[1])
    assert total > 0, "compact() made no file step this test can intercept"
    # always: the step that seals the tail (a rename), so the store is caught
    # with the tail renamed and the manifest not yet moved
    rolls = {i + 1 for i, st in enumerate(steps) if st.split(" ")[2] in ("replace", "rename")
             and "tail" in st}
    points = sorted({1, total} | rolls | set(rng.sample(range(1, total + 1), min(total, 5))))
    done = []
    soft = SoftLog()
    for k in points:
        for after in ((False, True) if k in (1, total) else (True,) if k in rolls
                      else (rng.random() < 0.5,)):
            tag = f"k{k}{'a' if after else 'b'}"
            state, run, rc = run_at(k, after, tag)
            model = copy.deepcopy(base)
            fails = Failures()
            model.apply(run.lines, fails)
            survived = rc == 0 and "COMPACTED" in run.lines   # this compact() made fewer steps
            if rc != 137 and not survived:
                fails.add(f"the writer should have died at step {k} but exited with {rc}")
            if not fails:
                # the read-only view first (it must not change a file), then
                # the writable reopen, whatever the read-only view found
                check_read_only(state, COMPACT_CFG, model, fails)
                try:
                    repo, warns = _open_conv(state, COMPACT_CFG)
                except Exception as exc:  # noqa: BLE001
                    fails.add(f"reopen raised {type(exc).__name__}: {exc}")
                else:
                    try:
                        check_conv_store(repo, model, fails, promote=True)
                        repo.compact()
                        check_conv_store(repo, model, fails, promote=False)
                    finally:
                        repo.close()
                    check_envelopes(state, model, fails)
                    check_erased(state, model, fails)
            done.append(tag)
            soft.take(fails, f"death at step {k} ({'after' if after else 'before'} "
                             f"{steps[k - 1] if k <= len(steps) else '?'})")
            if fails:
                pytest.fail(f"death at compaction step {k} ({'after' if after else 'before'} "
                            f"{steps[k - 1] if k <= len(steps) else '?'}), seed {seed}: last writer lines "
                            f"{run.lines[-4:]}\nstderr:\n{run.stderr()}\nsteps of a whole compact(): "
                            f"{[s.split(' ', 2)[2] for s in steps]}\nfailures:\n  - "
                            + "\n  - ".join(fails[:30]), pytrace=False)
    assert done
    soft.check(f"death at each compaction step (seed {seed}, died at steps {points} of "
               f"{[st.split(' ', 2)[2] for st in steps]}): the store survived every death, but "
               f"these contract checks failed:")


class _Always(random.Random):
    """An rng whose random() always says "tear"."""

    def random(self) -> float:
        return 0.0


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["rolled", "torn-tail"])
def test_death_at_each_step_of_recovery(tmp_path, scenario):
    """A store left by a writer that died in compact() just after sealing its
    tail ("rolled": the file renamed, the manifest not moved yet) or just
    before ("torn-tail", with a torn final line in the tail), and with a torn
    final line in events.jsonl. Opening it recovers (finish the roll,
    quarantine, truncate, re-journal envelopes, drop strays); the opener dies
    at each file step of that recovery. The next open must still hold every
    acknowledged message exactly once."""
    import copy
    import shutil
    seed = SEED + 300 + (scenario == "rolled")
    rng = random.Random(seed)
    template = str(tmp_path / "template")
    base = _compact_template(template)
    victims = [next(m for m in base.live() if base.tiers[m] == t) for t in ("cool", "hot")]

    def run(state: str, tag: str, **kw):
        r = WriterRun(state, str(tmp_path / f"{tag}.err"), mode="compact-die", gen=1, seed=seed,
                      tombs=",".join(victims), **COMPACT_CFG, **kw)
        return r, r.finish()

    # 1. find the compaction step just after the tail was sealed, and die there
    probe = str(tmp_path / "probe")
    shutil.copytree(template, probe)
    dry, rc = run(probe, "probe", die_at=0)
    steps = [ln.split(" ", 3) for ln in dry.lines if ln.startswith("SYS ")]
    assert rc == 0 and steps, f"dry run failed (rc {rc}): {dry.lines[-4:]}\n{dry.stderr()}"
    roll = [int(n) for _s, n, name, arg in steps if name in ("replace", "rename") and "tail" in arg]
    k_roll = roll[0] if roll else len(steps) // 2
    crashed = str(tmp_path / "crashed")
    shutil.copytree(template, crashed)
    first, rc = run(crashed, "crashed", die_at=k_roll, die_after=(scenario == "rolled"))
    assert rc == 137, f"the first writer did not die at step {k_roll}: {first.lines[-4:]}"
    base = copy.deepcopy(base)
    fails = Failures()
    base.apply(first.lines, fails)
    assert not fails, fails
    tail = os.path.join(crashed, "hot", "conversation_tail.jsonl")
    files = [("events", os.path.join(crashed, "events.jsonl"))]
    if scenario == "torn-tail":
        files.append(("tail", tail))
    torn = inject_tears(crashed, _Always(), files)
    assert torn, f"nothing to tear in {cw.all_files(crashed)}"

    # 2. die at each step of the recovering open
    def open_at(k: int, after: bool, tag: str):
        state = str(tmp_path / tag)
        shutil.copytree(crashed, state)
        r, rc = run(state, tag, die_at=k, die_after=after, die_phase="open")
        return state, r, rc

    state, dry, rc = open_at(0, False, "open-dry")
    counts = [ln for ln in dry.lines if ln.startswith("SYSCOUNT")]
    assert rc == 0 and counts, f"recovering open failed (rc {rc}): {dry.lines[-4:]}\n{dry.stderr()}"
    total = int(counts[0].split()[1])
    rsteps = [ln.split(" ", 2)[2] for ln in dry.lines if ln.startswith("SYS ")]
    points = sorted({1, total} | set(rng.sample(range(1, total + 1), min(total, 4)))) if total else []
    soft = SoftLog()
    for k in points:
        for after in ((False, True) if k == 1 else (rng.random() < 0.5,)):
            tag = f"open-k{k}{'a' if after else 'b'}"
            state, r, rc = open_at(k, after, tag)
            fails = Failures()
            if rc not in (137, 0):
                fails.add(f"the opener exited with {rc}")
            model = copy.deepcopy(base)
            check_read_only(state, COMPACT_CFG, model, fails)
            for _ in range(2):          # the reopen after the death, then one more
                try:
                    repo, warns = _open_conv(state, COMPACT_CFG)
                except Exception as exc:  # noqa: BLE001
                    fails.add(f"reopen after dying at recovery step {k} raised {type(exc).__name__}: {exc}")
                    break
                try:
                    check_conv_store(repo, model, fails, promote=True)
                finally:
                    repo.close()
            if not fails:
                check_envelopes(state, model, fails)
            soft.take(fails, f"death at recovery step {k}")
            if fails:
                pytest.fail(f"death at recovery step {k} ({'after' if after else 'before'} "
                            f"{rsteps[k - 1] if k <= len(rsteps) else '?'}) of {rsteps}; first writer died "
                            f"after compaction step {k_roll} ({steps[k_roll - 1][2:]}), torn {torn}; seed {seed}"
                            f"\nstderr:\n{r.stderr()}\nfailures:\n  - " + "\n  - ".join(fails[:30]),
                            pytrace=False)
    soft.check(f"death at each recovery step (seed {seed}, steps {rsteps}): every crash check passed, "
               f"but these contract checks failed:")


# -------------------------------------------- a read-only viewer beside the writer

@pytest.mark.slow
def test_read_only_viewer_beside_a_dying_writer(tmp_path):
    """SPEC 4: a read-only repository opened beside a running writer, with
    refresh(), is the viewer next to an agent. While the writer appends,
    compacts, cools and reclaims, every refresh shows only records that were
    appended, exactly, once each; after the writer is killed, one refresh shows
    every acknowledged message."""
    from rune_fast.conversation_state import ReadStatus
    seed = SEED + 400
    rng = random.Random(seed)
    cfg = dict(durability="fsync", compact_every=8, hot_window=4)
    state = str(tmp_path / "state")
    model = ConvModel()
    soft = SoftLog()
    for gen in range(3):
        run = WriterRun(state, str(tmp_path / f"viewer-{gen}.err"), mode="conv", gen=gen, seed=seed,
                        deletes=False, threads=1, count=100_000, **cfg)
        fails = Failures()
        assert run.wait_for(lambda ls: "READY" in ls), f"writer did not start: {run.stderr()}"
        seen: list[list[str]] = []
        try:
            viewer, _ = _open_conv(state, cfg, read_only=True)
        except Exception as exc:  # noqa: BLE001
            run.kill()
            run.finish()
            pytest.fail(f"read-only open beside a running writer raised {type(exc).__name__}: {exc}")
        try:
            deadline = time.monotonic() + rng.uniform(0.3, 0.8)
            while time.monotonic() < deadline:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", ResourceWarning)
                        viewer.refresh()
                        ids_now = [r.msg_id for ch in cw.CHANNELS for r in viewer.window(ch, BIG)]
                        for mid in ids_now[:: max(1, len(ids_now) // 10)]:
                            rd = viewer.get_message(mid)
                            if rd.status != ReadStatus.FOUND_VERIFIED:
                                fails.add_soft(f"viewer: get_message({mid}) is {rd.status} though "
                                               f"window() lists it")
                except Exception as exc:  # noqa: BLE001
                    fails.add_soft(f"viewer refresh/read beside the writer raised "
                                   f"{type(exc).__name__}: {exc}")
                    break
                if len(ids_now) != len(set(ids_now)):
                    fails.add(f"viewer: duplicated ids {sorted({m for m in ids_now if ids_now.count(m) > 1})[:8]}")
                seen.append(ids_now)
                time.sleep(rng.uniform(0.0, 0.03))
            run.kill()
            rc = run.finish()
            model.apply(run.lines, fails)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                try:
                    viewer.refresh()
                    final = {r.msg_id: r for ch in cw.CHANNELS for r in viewer.window(ch, BIG)}
                except Exception as exc:  # noqa: BLE001
                    final = None
                    fails.add_soft(f"viewer refresh after the kill raised {type(exc).__name__}: {exc}")
        finally:
            viewer.close()
        for ids_now in seen:
            bad = [m for m in ids_now if m not in model.state or model.state[m] in (ABSENT, DELETED)]
            if bad:
                fails.add(f"viewer showed ids never appended: {bad[:8]}")
                break
        if final is not None:
            lost = [m for m in model.live() if m not in final]
            if lost:
                fails.add_soft(f"viewer refresh after the kill misses {len(lost)} acknowledged messages, "
                               f"e.g. {lost[:5]}")
            wrong = [m for m, r in final.items() if m in model.state and r != cw.make_message(m)]
            if wrong:
                fails.add(f"viewer served altered records: {wrong[:5]}")
        # the writable reopen holds everything, as in the other crash tests
        repo, _warns = _open_conv(state, cfg)
        try:
            check_conv_store(repo, model, fails, promote=True)
        finally:
            repo.close()
        soft.take(fails, f"generation {gen} (killed after {run.killed_at!r}, {len(seen)} refreshes)")
        if fails:
            pytest.fail(f"viewer test failed: seed {seed}, generation {gen}, writer rc {rc}, killed after "
                        f"{run.killed_at!r}\nfailures:\n  - " + "\n  - ".join(fails[:30]), pytrace=False)
    soft.check(f"viewer beside a dying writer (seed {seed}): nothing was lost or invented, but:")


@pytest.mark.slow
def test_death_at_each_step_of_legacy_import(tmp_path):
    """SPEC 5: a fat legacy checkpoint (hot/conversation_messages.json) is
    imported once on open, deduplicated, then superseded. The importing
    process dies at each file step of that open; the next open holds every
    legacy message exactly once, and the legacy file is never imported twice."""
    import copy
    import json
    import shutil
    seed = SEED + 500
    rng = random.Random(seed)
    template = str(tmp_path / "template")
    os.makedirs(os.path.join(template, "hot"), mode=0o700)
    mids = [cw.msg_id(0, 0, i) for i in range(60)]
    items = [cw.make_message(m).to_dict() for m in mids]
    items += [cw.make_message(m).to_dict() for m in mids[::9]]        # duplicates
    with open(os.path.join(template, "hot", "conversation_messages.json"), "w", encoding="utf-8") as f:
        json.dump({"messages": items}, f, ensure_ascii=False)
    base = ConvModel()
    for m in mids:
        base.state[m] = LIVE
        base.acked_msgs.add(m)

    def open_at(k: int, after: bool, tag: str):
        state = str(tmp_path / tag)
        shutil.copytree(template, state)
        r = WriterRun(state, str(tmp_path / f"{tag}.err"), mode="compact-die", gen=1, seed=seed,
                      die_at=k, die_after=after, die_phase="open", durability="fsync",
                      compact_every=16, hot_window=8)
        return state, r, r.finish()

    state, dry, rc = open_at(0, False, "dry")
    counts = [ln for ln in dry.lines if ln.startswith("SYSCOUNT")]
    assert rc == 0 and counts, f"importing open failed (rc {rc}): {dry.lines[-4:]}\n{dry.stderr()}"
    total = int(counts[0].split()[1])
    steps = [ln.split(" ", 2)[2] for ln in dry.lines if ln.startswith("SYS ")]
    points = [0] + sorted({1, total} | set(rng.sample(range(1, total + 1), min(total, 3))))
    soft = SoftLog()
    cfg = dict(durability="fsync", compact_every=16, hot_window=8)
    for k in points:
        after = k > 0 and rng.random() < 0.5
        tag = f"imp-k{k}{'a' if after else 'b'}"
        state, r, rc = (state, dry, rc) if k == 0 else open_at(k, after, tag)
        fails = Failures()
        if rc not in (137, 0):
            fails.add(f"the importing opener exited with {rc}")
        model = copy.deepcopy(base)
        for _ in range(2):      # the reopen after the death, then one more: no second import
            try:
                repo, warns = _open_conv(state, cfg)
            except Exception as exc:  # noqa: BLE001
                fails.add(f"reopen raised {type(exc).__name__}: {exc}")
                break
            try:
                check_conv_store(repo, model, fails, promote=False)
            finally:
                repo.close()
        if os.path.exists(os.path.join(state, "hot", "conversation_messages.json")):
            fails.add_soft("the legacy checkpoint is still in place after a completed import")
        if not fails:
            check_envelopes(state, model, fails)
        soft.take(fails, f"death at import step {k}")
        if fails:
            pytest.fail(f"death at legacy-import step {k} ({'after' if after else 'before'} "
                        f"{steps[k - 1] if 0 < k <= len(steps) else '-'}) of {steps}; seed {seed}\n"
                        f"stderr:\n{r.stderr()}\nfailures:\n  - " + "\n  - ".join(fails[:30]), pytrace=False)
    soft.check(f"legacy import (seed {seed}): nothing was lost or duplicated, but:")
