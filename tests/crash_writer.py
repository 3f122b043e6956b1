"""Writer subprocess for the crash tests (tests/test_crash.py).

Run by path (``python3 tests/crash_writer.py --state DIR ...``) or as
``python3 -m tests.crash_writer``; it puts the repository root on ``sys.path``
itself. It opens a repository in ``--state`` and changes it, printing one line
to stdout per step, written with one unbuffered ``write(2)`` each, so every line
a parent has read was printed before the process died:

conversation mode (``--mode conv``)::

    IMPORTED                     modules loaded, about to open the repository
    READY                        the repository is open (recovery done)
    TRY <id> [<id> ...]          about to append these (new ids, or re-appends)
    ACK <id>                     append/append_many returned and stored <id>
    DUPOK <id>                   re-append of a stored id returned False / did not count it
    TOMBOK <id>                  re-append of a deleted id returned False
    TRYDEL <id> / DEL <id>       about to delete / delete returned True
    NODEL <id>                   delete of a never-appended id returned False
    TRYCLEAR <ch> / CLEAR <ch> <n>   clear_channel about to run / returned n
    TRYCOMPACT / COMPACTED       explicit compact() about to run / returned
    BUG <text>                   the repository broke its contract in-process
    DONE                         ran to the end and closed cleanly

task mode (``--mode task``)::

    TTRY <json>                  about to make this change ({"op", "task_id", ...})
    TACK <json>                  the change returned; the record's to_dict()
    TREFUSED <task_id>           an illegal transition was refused (nothing changed)

compact-die mode (``--mode compact-die --die-at N [--die-after] [--die-phase open]``): a few
appends and ``--tombs`` deletes, then one ``compact()`` during which every
file step (write, fsync, rename, unlink, ...) prints ``SYS <n> <name> <file>``
and step N ends the process with ``os._exit(137)`` (a torn half-write for a
``write``); ``SYSCOUNT <n>`` when it survives. With ``--die-phase open`` the
steps counted are those of opening the repository (crash recovery), and a
process that survives the open exits at once.

Everything a message holds is a pure function of its id (:func:`make_fields`),
so the parent can rebuild the exact record of every id it reads back.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CHANNELS = ("ch-alpha", "ch-beta", "ch-gamma", "ch-scratch")
TASKS = ("", "", "task-x", "task-y", "task-z")
ROLES = ("user", "assistant", "user", "assistant", "system")
BASE_TS = 1_750_000_000.0
WORDS = ("compact", "cool", "parquet", "tail", "segment", "reclaim", "tombstone",
         "fsync", "quarantine", "digest", "window", "agent", "tool", "résumé",
         "naïve", "Straße", "日本語", "emoji\U0001F600", "tab\there", 'quote"d',
         "back\\slash", "new\nline", "ΣΑΣ")
TASK_CHANNELS = ("tch-1", "tch-2", "tch-3")


# ------------------------------------------------------------ deterministic data

def msg_id(gen: int, thread: int, i: int) -> str:
    """Id of message ``i`` of writer thread ``thread`` in generation ``gen``."""
    return f"msg_g{gen:02d}t{thread}_{i:06d}"


def parse_msg_id(mid: str) -> tuple[int, int, int]:
    """``(gen, thread, i)`` of an id made by :func:`msg_id`; ValueError otherwise."""
    if not mid.startswith("msg_g") or len(mid) != len("msg_g00t0_000000"):
        raise ValueError(f"not a crash-writer id: {mid!r}")
    return int(mid[5:7]), int(mid[8]), int(mid[10:])


def make_fields(mid: str) -> dict:
    """The constructor arguments of message ``mid``: a pure function of the id."""
    gen, thread, i = parse_msg_id(mid)
    rng = random.Random(mid)
    n_words = rng.choice((3, 8, 20, 60, 150)) if rng.random() < 0.97 else 900
    body = " ".join(rng.choice(WORDS) for _ in range(n_words))
    return {
        "msg_id": mid,
        "ts": BASE_TS + gen * 100_000 + thread * 10_000 + i + 0.25,
        "role": rng.choice(ROLES),
        "content": f"<<{mid}>> {body}",
        "channel_id": rng.choice(CHANNELS),
        "task_id": rng.choice(TASKS),
    }


def task_repository_class():
    """SPEC: rune_fast.conversation_state re-exports TaskStateRepository; the
    ledger itself lives in rune_fast.tasks (used until the re-export lands)."""
    try:
        from rune_fast.conversation_state import TaskStateRepository
    except ImportError:
        from rune_fast.tasks import TaskStateRepository
    return TaskStateRepository


def make_message(mid: str):
    from rune_fast.records import ConversationMessageRecord
    return ConversationMessageRecord(**make_fields(mid))


def unknown_id(gen: int, thread: int, i: int) -> str:
    """An id of the crash-writer shape that is never appended."""
    return f"msg_g{gen:02d}t{thread + 5}_{i:06d}"


# ---------------------------------------------------------------------- output

_out_lock = threading.Lock()
_os_write = os.write          # out() keeps the real write when arm_syscall_death wraps os.write


def out(line: str) -> None:
    data = (line + "\n").encode("utf-8")
    with _out_lock:
        n = _os_write(1, data)
        while n < len(data):           # a pipe write this small is atomic; be safe anyway
            n += _os_write(1, data[n:])


# --------------------------------------------------------- conversation writer

def conv_thread(repo, args, thread: int, stop: threading.Event) -> None:
    from rune_fast.errors import RuneError
    rng = random.Random(f"{args.seed}:{args.gen}:{thread}")
    acked: list[str] = []              # acked and not deleted, this generation
    acked_set: set[str] = set()
    deleted: list[str] = []
    nxt = 0
    n_unknown = 0
    clears = args.deletes and args.threads == 1

    def new_ids(k: int) -> list[str]:
        nonlocal nxt
        ids = [msg_id(args.gen, thread, nxt + j) for j in range(k)]
        nxt += k
        return ids

    def stored(mid: str) -> None:
        acked.append(mid)
        acked_set.add(mid)

    def forget(mid: str) -> None:
        acked_set.discard(mid)
        acked.remove(mid)

    for step in range(args.count):
        if stop.is_set():
            return
        r = rng.random()
        try:
            if r < 0.50:
                (mid,) = new_ids(1)
                out(f"TRY {mid}")
                if repo.append(make_message(mid)):
                    out(f"ACK {mid}")
                    stored(mid)
                else:
                    out(f"BUG append of new id {mid} returned False")
            elif r < 0.72:
                ids = new_ids(rng.randint(2, 7))
                batch = [make_message(m) for m in ids]
                dups = []
                if acked and rng.random() < 0.5:
                    dups = [rng.choice(acked)]
                    batch.insert(rng.randrange(len(batch) + 1), make_message(dups[0]))
                out("TRY " + " ".join(m.msg_id for m in batch))
                n = repo.append_many(batch)
                if n != len(ids):
                    out(f"BUG append_many of {len(ids)} new + {len(dups)} dup returned {n}")
                for mid in ids:
                    out(f"ACK {mid}")
                    stored(mid)
                for mid in dups:
                    out(f"DUPOK {mid}")
            elif r < 0.78:
                if not acked:
                    continue
                mid = rng.choice(acked)
                out(f"TRY {mid}")
                if repo.append(make_message(mid)):
                    out(f"BUG re-append of stored id {mid} returned True")
                else:
                    out(f"DUPOK {mid}")
            elif r < 0.84 and args.deletes:
                if not acked:
                    continue
                mid = rng.choice(acked)
                out(f"TRYDEL {mid}")
                if repo.delete(mid):
                    out(f"DEL {mid}")
                    forget(mid)
                    deleted.append(mid)
                else:
                    out(f"BUG delete of stored id {mid} returned False")
            elif r < 0.86 and args.deletes:
                mid = unknown_id(args.gen, thread, n_unknown)
                n_unknown += 1
                out(f"TRYDEL {mid}")
                if repo.delete(mid):
                    out(f"BUG delete of never-appended id {mid} returned True")
                else:
                    out(f"NODEL {mid}")
            elif r < 0.875 and clears:
                ch = "ch-scratch"
                out(f"TRYCLEAR {ch}")
                n = repo.clear_channel(ch)
                out(f"CLEAR {ch} {n}")
                for mid in [m for m in acked if make_fields(m)["channel_id"] == ch]:
                    forget(mid)
                    deleted.append(mid)
            elif r < 0.93:
                if thread != 0:
                    continue
                out("TRYCOMPACT")
                repo.compact()
                out("COMPACTED")
            elif r < 0.97 and args.deletes:
                if not deleted:
                    continue
                mid = rng.choice(deleted)
                out(f"TRY {mid}")
                if repo.append(make_message(mid)):
                    out(f"BUG re-append of deleted id {mid} returned True")
                else:
                    out(f"TOMBOK {mid}")
            else:
                if not acked:
                    continue
                mid = rng.choice(acked)
                rd = repo.get_message(mid)
                if rd.record != make_message(mid):
                    out(f"BUG in-process read of {mid}: status={rd.status} tier={rd.tier} "
                        f"record={'None' if rd.record is None else 'different'}")
        except RuneError as exc:
            out(f"BUG step {step}: {type(exc).__name__}: {exc}")
            raise


def run_conv(args) -> None:
    from rune_fast.conversation_state import ConversationStateRepository
    from rune_fast.errors import RuneError
    out("IMPORTED")
    repo = ConversationStateRepository(args.state, compact_every=args.compact_every,
                                       hot_window=args.hot_window, durability=args.durability)
    out("READY")
    # Re-appends of ids earlier generations stored (acked) or deleted.
    for mid in filter(None, args.dups.split(",")):
        out(f"TRY {mid}")
        try:
            if repo.append(make_message(mid)):
                out(f"BUG re-append of id {mid} acked by an earlier writer returned True")
            else:
                out(f"DUPOK {mid}")
        except RuneError as exc:
            out(f"BUG re-append of {mid}: {type(exc).__name__}: {exc}")
            raise
    for mid in filter(None, args.tombs.split(",")):
        out(f"TRY {mid}")
        if repo.append(make_message(mid)):
            out(f"BUG re-append of id {mid} deleted by an earlier writer returned True")
        else:
            out(f"TOMBOK {mid}")
    stop = threading.Event()
    if args.threads == 1:
        conv_thread(repo, args, 0, stop)
    else:
        errors = []

        def body(t: int) -> None:
            try:
                conv_thread(repo, args, t, stop)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                stop.set()

        ths = [threading.Thread(target=body, args=(t,)) for t in range(args.threads)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        if errors:
            raise errors[0]
    repo.close()
    out("DONE")


# ------------------------------------------------------------------ task writer

def run_task(args) -> None:
    from rune_fast.errors import IllegalTaskTransitionError
    from rune_fast.records import TASK_TRANSITIONS
    TaskStateRepository = task_repository_class()
    out("IMPORTED")
    repo = TaskStateRepository(args.state)
    out("READY")
    rng = random.Random(f"{args.seed}:{args.gen}:task")
    open_ids: list[str] = []
    terminal: list[str] = []
    for ch in TASK_CHANNELS:
        open_ids.extend(t.task_id for t in repo.list_open(ch))
    for mid in filter(None, args.tombs.split(",")):   # terminal tasks of earlier writers
        terminal.append(mid)

    def emit(rec) -> None:
        out("TACK " + json.dumps(rec.to_dict(), sort_keys=True))

    for step in range(args.count):
        r = rng.random()
        if r < 0.30 or not open_ids:
            title = f"g{args.gen} task {step}"
            ch = rng.choice(TASK_CHANNELS)
            model = rng.choice(("", "claude", "gpt"))
            out("TTRY " + json.dumps({"op": "create", "title": title, "channel_id": ch,
                                      "assigned_model": model}))
            rec = repo.create(title, ch, model=model or None)
            open_ids.append(rec.task_id)
            emit(rec)
        elif r < 0.55:
            tid = rng.choice(open_ids)
            title = f"g{args.gen} amended {step}"
            out("TTRY " + json.dumps({"op": "amend", "task_id": tid, "title": title}))
            emit(repo.amend(tid, title))
        elif r < 0.95:
            tid = rng.choice(open_ids)
            cur = repo.get(tid)
            new = rng.choice(sorted(TASK_TRANSITIONS[cur.status]))
            outcome = f"out-{args.gen}-{step}" if rng.random() < 0.5 else ""
            out("TTRY " + json.dumps({"op": "transition", "task_id": tid, "status": new,
                                      "outcome_ref": outcome}))
            rec = repo.transition(tid, new, outcome)
            if not TASK_TRANSITIONS[rec.status]:
                open_ids.remove(tid)
                terminal.append(tid)
            emit(rec)
        else:
            if not terminal:
                continue
            tid = rng.choice(terminal)
            try:
                repo.transition(tid, "running")
            except IllegalTaskTransitionError:
                out(f"TREFUSED {tid}")
            else:
                out(f"BUG transition of terminal task {tid} to running was accepted")
    repo.close()
    out("DONE")


# ------------------------------------------ dying at one exact step of compact()

_PATCHED = ("write", "pwrite", "fsync", "fdatasync", "replace", "rename", "unlink", "remove",
            "truncate", "ftruncate", "rmdir")


def arm_syscall_death(die_at: int, after: bool) -> dict:
    """Wrap the ``os`` functions a compaction uses to move files and make them
    durable. Once armed, call ``n`` prints ``SYS <n> <name> <arg>``; call
    ``die_at`` ends the process with ``os._exit(137)``, as SIGKILL would:
    before the call, or (``after``) right after it; a ``write`` dies after
    half its bytes, a torn write. Returns the control dict (``armed``, ``n``)."""
    ctl = {"armed": False, "n": 0}

    def wrap(name, fn):
        def inner(*a, **kw):
            if not ctl["armed"]:
                return fn(*a, **kw)
            ctl["n"] += 1
            n = ctl["n"]
            arg = a[0] if a else ""
            if isinstance(arg, (str, bytes, os.PathLike)):
                arg = os.path.basename(os.fsdecode(arg))
            out(f"SYS {n} {name} {arg}")
            if n == die_at:
                if name in ("write", "pwrite") and len(a) >= 2 and len(a[1]) > 1:
                    half = bytes(a[1])[: len(a[1]) // 2]
                    fn(a[0], half, *a[2:])
                    os._exit(137)
                if not after:
                    os._exit(137)
                fn(*a, **kw)
                os._exit(137)
            return fn(*a, **kw)
        return inner

    for name in _PATCHED:
        if hasattr(os, name):
            setattr(os, name, wrap(name, getattr(os, name)))
    return ctl


def run_compact_die(args) -> None:
    """Open, append a few, delete one, then compact() and die at its
    ``--die-at``-th file step (0: never; prints ``SYSCOUNT`` at the end)."""
    from rune_fast.conversation_state import ConversationStateRepository
    ctl = arm_syscall_death(args.die_at, args.die_after)
    out("IMPORTED")
    if args.die_phase == "open":          # die during open's recovery instead
        ctl["armed"] = True
    repo = ConversationStateRepository(args.state, compact_every=args.compact_every,
                                       hot_window=args.hot_window, durability=args.durability)
    if args.die_phase == "open":
        ctl["armed"] = False
        out("READY")
        out(f"SYSCOUNT {ctl['n']}")
        os._exit(0)                       # a crash right after open: nothing else changes
    out("READY")
    mids = [msg_id(args.gen, 0, i) for i in range(6)]
    for mid in mids[:3]:
        out(f"TRY {mid}")
        if repo.append(make_message(mid)):
            out(f"ACK {mid}")
    out("TRY " + " ".join(mids[3:]))
    if repo.append_many([make_message(m) for m in mids[3:]]) == 3:
        for mid in mids[3:]:
            out(f"ACK {mid}")
    for mid in [mids[1]] + list(filter(None, args.tombs.split(","))):   # ids to delete now
        out(f"TRYDEL {mid}")
        if repo.delete(mid):
            out(f"DEL {mid}")
    out("TRYCOMPACT")
    ctl["armed"] = True
    repo.compact()
    ctl["armed"] = False
    out("COMPACTED")
    out(f"SYSCOUNT {ctl['n']}")
    repo.close()
    out("DONE")


# ------------------------------------------------ helpers for the parent tests

def payload_hash_of(body: dict) -> str:
    """SPEC section 5: sha256 of the canonical JSON of a record body."""
    import hashlib
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode("utf-8")).hexdigest()


def read_envelopes(path: str) -> tuple[list[dict], list[str]]:
    """Every complete line of an event store, parsed as JSON; and a problem per
    complete line that does not parse. Bytes after the last newline are ignored."""
    with open(path, "rb") as f:
        data = f.read()
    envs, problems = [], []
    off = 0
    for line in data.split(b"\n")[:-1]:
        try:
            envs.append(json.loads(line))
        except ValueError as exc:
            problems.append(f"{path} @ {off}: complete line does not parse ({exc}): {line[:80]!r}")
        off += len(line) + 1
    return envs, problems


def all_files(state_dir: str) -> list[str]:
    """Every regular file under ``state_dir``, sorted."""
    found = []
    for dirpath, _dirs, files in os.walk(state_dir):
        for name in files:
            found.append(os.path.join(dirpath, name))
    return sorted(found)


def tree_digest(state_dir: str) -> dict[str, tuple[int, str]]:
    """``relative path -> (size, sha256)`` of every file under ``state_dir``."""
    import hashlib
    out_ = {}
    for p in all_files(state_dir):
        with open(p, "rb") as f:
            data = f.read()
        out_[os.path.relpath(p, state_dir)] = (len(data), hashlib.sha256(data).hexdigest())
    return out_


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state", required=True)
    p.add_argument("--mode", choices=("conv", "task", "compact-die"), default="conv")
    p.add_argument("--gen", type=int, default=0, help="generation: 0..99, makes ids distinct")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=100_000, help="steps before a clean close")
    p.add_argument("--durability", default="fsync")
    p.add_argument("--compact-every", type=int, default=8)
    p.add_argument("--hot-window", type=int, default=4)
    p.add_argument("--deletes", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--die-at", type=int, default=0, help="compact-die: die at this file step")
    p.add_argument("--die-after", action="store_true", help="compact-die: die just after the step")
    p.add_argument("--die-phase", choices=("compact", "open"), default="compact",
                   help="compact-die: count the steps of compact() or of the open (recovery)")
    p.add_argument("--dups", default="", help="comma-separated stored ids to re-append first")
    p.add_argument("--tombs", default="", help="comma-separated deleted ids (task mode: terminal task ids)")
    p.add_argument("--bg-min", type=int, default=0,
                   help="cooling runs of at least this many messages go to the background thread")
    args = p.parse_args(argv)
    if args.bg_min:
        from rune_fast._conv import tuning
        tuning.BG_COOL_MIN_ROWS = args.bg_min
    if not 0 <= args.gen <= 99 or not 1 <= args.threads <= 4:
        p.error("--gen must be 0..99 and --threads 1..4")
    if args.mode == "conv":
        run_conv(args)
    elif args.mode == "compact-die":
        run_compact_die(args)
    else:
        run_task(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
