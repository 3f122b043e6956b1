"""A writer run under the power-loss shim with a fault injected
(RUNE_PL_FAIL, tests/test_io_errors.py): appends from THREADS threads,
then tries one more append and reads back what was acknowledged; prints
one JSON report. Each result is recorded in completion order."""
import json
import sys
import threading

from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.errors import DurabilityError, RuneError
from rune_fast.records import ConversationMessageRecord

state, mode, n, nthreads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
repo = ConversationStateRepository(state, durability=mode, compact_every=10**6)
out = {"events": [], "other": []}
lock = threading.Lock()


def worker(t: int) -> None:
    for i in range(n):
        m = ConversationMessageRecord(msg_id=f"t{t}-{i:05d}", channel_id=f"c{t}", content=f"message {i}")
        try:
            repo.append(m)
            with lock:
                out["events"].append(["ack", m.msg_id, t])
        except DurabilityError as exc:
            with lock:
                out["events"].append(["fail", m.msg_id, t, str(exc)])
        except Exception as exc:       # reported, never expected
            with lock:
                out["other"].append(f"{type(exc).__name__}: {exc}")


threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
for th in threads:
    th.start()
for th in threads:
    th.join()
try:
    repo.append(ConversationMessageRecord(msg_id="after", channel_id="c0", content="x"))
    out["after"] = "stored"
except DurabilityError as exc:
    out["after"] = f"refused: {exc}"
acked = [e[1] for e in out["events"] if e[0] == "ack"]
out["reads_ok"] = all(repo.get_message(m).status is ReadStatus.FOUND_VERIFIED for m in acked)
try:
    repo.close()
except RuneError as exc:
    out["close"] = str(exc)
print(json.dumps(out))
