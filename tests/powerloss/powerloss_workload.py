"""The writer the power-loss suite records (run under the shim, see shim.c).

``python powerloss_workload.py ROOT DURABILITY SEED`` makes ``ROOT/state`` (a new
store) and changes it; every acknowledgement is one ``write(2)`` to
``ROOT/acks`` (outside the state folder, inside the recorded one), so the
recording places each acknowledgement among the file-system calls:

    TRY <id> [<id> ...]     about to append these
    M <id>                  append/append_many returned: <id> is stored
    TRYDEL <id> / D <id>    about to delete / delete returned True
    TT <task_id> <status>   about to move the task to <status>
    T <task_id> <status>    create (status "created") or transition returned

Everything a message holds is a pure function of its id (:func:`fields`), so
the checker rebuilds the exact record of every id it finds.
"""
from __future__ import annotations

import os
import random
import sys
import threading

CHANNELS = ("ch-a", "ch-b", "ch-c")
TASKS = ("", "", "task-1", "task-2")
WORDS = ("tail", "fsync", "page", "torn", "résumé", "日本語", "quote\"d", "new\nline", "tab\there")


def fields(mid: str) -> dict:
    """The constructor arguments of message ``mid``."""
    rng = random.Random(mid)
    n = rng.choice((2, 10, 40, 200, 900))
    return {"msg_id": mid, "ts": 1_750_000_000.0 + rng.randrange(10**6) / 8,
            "role": rng.choice(("user", "assistant")),
            "content": f"<<{mid}>> " + " ".join(rng.choice(WORDS) for _ in range(n)),
            "channel_id": rng.choice(CHANNELS), "task_id": rng.choice(TASKS)}


class Acks:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        data = (line + "\n").encode()
        with self.lock:
            assert os.write(self.fd, data) == len(data)


def conv_thread(repo, ack: Acks, thread: int, steps: int, seed: int) -> None:
    from rune_fast.records import ConversationMessageRecord as Rec
    rng = random.Random(f"{seed}:{thread}")
    stored: list[str] = []
    nxt = 0
    for _ in range(steps):
        r = rng.random()
        if r < 0.55:
            mid = f"m{thread}-{nxt:05d}"
            nxt += 1
            ack(f"TRY {mid}")
            if repo.append(Rec(**fields(mid))):
                ack(f"M {mid}")
                stored.append(mid)
        elif r < 0.85:
            ids = [f"m{thread}-{nxt + j:05d}" for j in range(rng.randint(2, 6))]
            nxt += len(ids)
            ack("TRY " + " ".join(ids))
            repo.append_many([Rec(**fields(m)) for m in ids])
            for m in ids:
                ack(f"M {m}")
            stored.extend(ids)
        elif stored:
            mid = stored.pop(rng.randrange(len(stored)))
            ack(f"TRYDEL {mid}")
            if repo.delete(mid):
                ack(f"D {mid}")


def task_thread(tasks, ack: Acks, seed: int) -> None:
    rng = random.Random(f"{seed}:tasks")
    for i in range(4):
        rec = tasks.create(f"task {i}", rng.choice(CHANNELS))
        ack(f"T {rec.task_id} created")
        for status in rng.choice((("running", "completed"), ("running", "awaiting_approval", "failed"),
                                  ("cancelled",))):
            ack(f"TT {rec.task_id} {status}")
            tasks.transition(rec.task_id, status)
            ack(f"T {rec.task_id} {status}")


def main() -> None:
    root, durability, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    steps = int(os.environ.get("RUNE_POWERLOSS_STEPS", "40"))
    from rune_fast.conversation_state import ConversationStateRepository
    from rune_fast.tasks import TaskStateRepository
    if os.environ.get("RUNE_POWERLOSS_SYNC_OVERLAP_MIN"):
        # batches this large sync in a thread of their own (BackgroundSync)
        from rune_fast._conv import tuning
        tuning.SYNC_OVERLAP_MIN = int(os.environ["RUNE_POWERLOSS_SYNC_OVERLAP_MIN"])
    state = os.path.join(root, "state")
    ack = Acks(os.path.join(root, "acks"))
    repo = ConversationStateRepository(state, compact_every=12, hot_window=6, durability=durability)
    tasks = TaskStateRepository(state)
    workers = [threading.Thread(target=conv_thread, args=(repo, ack, t, steps, seed)) for t in range(3)]
    workers.append(threading.Thread(target=task_thread, args=(tasks, ack, seed)))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    # a second session on the same files: recovery's own writes are recorded too
    tasks.close()
    repo.close()
    repo = ConversationStateRepository(state, compact_every=12, hot_window=6, durability=durability)
    conv_thread(repo, ack, 3, steps // 2, seed)
    repo.compact()
    repo.close()
    ack("DONE")


if __name__ == "__main__":
    main()
