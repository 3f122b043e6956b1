"""Real crashes: a child process cools, erases and merges, recording its
"manifest" (live files + the ids they hold) atomically after each change, and
is SIGKILLed at random moments. Every reopen from the last manifest must read
every id it names, nothing else, with a clean verify()."""
from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time

from rune_fast.cool import CoolArchive

CHILD = r'''
import json, os, sys
from rune_fast.cool import CoolArchive, _table_from_records, record_digest
d, manifest = sys.argv[1], sys.argv[2]
def save(files, ids, n):
    tmp = manifest + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"files": files, "ids": sorted(ids), "n": n}, f)
        f.flush(); os.fsync(f.fileno())
    os.replace(tmp, manifest)
    print("saved", flush=True)      # (the parent times its kill from the first)
if os.path.exists(manifest):
    with open(manifest) as f:
        m = json.load(f)
else:
    m = {"files": [], "ids": [], "n": 0}
a = CoolArchive(d, m["files"], row_group_rows=16)
a.gc()
ids, n = set(m["ids"]), m["n"]
step = 0
while True:
    step += 1
    batch = []
    for j in range(40):
        batch.append({"msg_id": f"m{n:07d}", "channel_id": f"c{n % 3}", "task_id": "", "hlc": "",
                      "content": f"content {n} " * 5, "ts": float(n), "role": "user",
                      "token_estimate": 1, "tool_calls": [], "tool_call_id": "", "origin": "",
                      "schema_version": 1})
        n += 1
    batch.sort(key=lambda r: r["channel_id"])
    run = a.cool_table(_table_from_records(batch, [int(r["msg_id"][1:]) for r in batch],
                                           [record_digest(r) for r in batch]))
    ids |= {r["msg_id"] for r in batch}
    save(run.files, ids, n)
    if step % 2 == 0 and ids:
        gone = sorted(ids)[::7][:5]
        ch = a.erase(gone)
        ids -= set(gone)
        save(ch.files, ids, n)
        a.unlink_files(ch.removed)
    if step % 3 == 0:
        ch = a.merge(fanout=3)
        save(ch.files, ids, n)
        a.unlink_files(ch.removed)
'''


def test_sigkill_at_random_moments(tmp_path):
    d = str(tmp_path / "cool")
    manifest = str(tmp_path / "manifest.json")
    rnd = random.Random(1234)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    checked = 0
    for _ in range(5):
        p = subprocess.Popen([sys.executable, "-c", CHILD, d, manifest], env=env, stdout=subprocess.PIPE)
        # killed at a random moment after its first change, however long a
        # loaded machine takes to start it (a kill at a fixed time after the
        # start could come before any change)
        assert p.stdout is not None
        ready, _w, _x = select.select([p.stdout], [], [], 120)
        assert ready and p.stdout.readline() == b"saved\n", "the child made no change"
        time.sleep(rnd.uniform(0.0, 0.7))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        if not os.path.exists(manifest):
            continue
        with open(manifest) as f:
            m = json.load(f)
        a = CoolArchive.open(d, m["files"])
        assert sorted(r.record["msg_id"] for ch in a.channels() for r in a.channel_rows(ch)) == m["ids"]
        assert a.verify() == []
        a.gc()
        assert a.gc() == []
        checked += 1
    assert checked == 5
