"""Devices that sync through Redis Streams, against a real redis-server
started here on 127.0.0.1 at a free port (Debian's, installed by make
setup-test; skipped, saying so, where it is missing).

Three stores append concurrently with random delays while their sync
loops run; the test adds duplicates of stream entries in reverse order,
kills one device with SIGKILL while it runs (and restarts it), and
restarts the Redis server once. At the end every store's
resume_messages of every channel is byte-identical, and every
acknowledged message is in every store exactly once."""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord

HERE = os.path.dirname(os.path.abspath(__file__))
redis = pytest.importorskip("redis")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, folder) -> None:
        self.folder, self.port, self.proc = str(folder), _free_port(), None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.folder,
             "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            with contextlib.suppress(Exception):
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
            self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@pytest.fixture
def server(tmp_path):
    if not shutil.which("redis-server"):
        pytest.skip("no redis-server (make setup-test installs Debian's redis-server)")
    s = RedisServer(tmp_path / "redis")
    os.makedirs(s.folder)
    s.start()
    yield s
    s.stop()


def _device(state, url, name, count, seed, batch=500) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, os.path.join(HERE, "redis_device.py"), str(state), url, name,
                             str(count), str(seed), str(batch)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _acked(out: str) -> list[str]:
    return [ln for ln in out.split() if ln != "done"]


def test_sync_through_redis_api_basics(server, tmp_path):
    from rune_fast.redis_sync import RedisSync
    with ConversationStateRepository(tmp_path / "a") as a, ConversationStateRepository(tmp_path / "b") as b:
        sa, sb = RedisSync(a, server.url), RedisSync(b, server.url)
        a.append(ConversationMessageRecord(msg_id="x1", channel_id="c", content="hi"))
        assert sa.sync_once() == (1, 0)
        assert sa.push() == 0                       # nothing new: nothing published
        assert sb.sync_once() == (0, 1)
        assert b.get_message("x1").found
        b.delete("x1")                              # a tombstone travels like any op
        sb.sync_once()
        sa.pull()
        assert not a.get_message("x1").found
        with pytest.raises(ValueError, match="url"):
            RedisSync(a, "")
        sa.close(), sb.close()


def test_a_push_reads_only_what_changed_since_the_last(server, tmp_path, monkeypatch):
    """The first push publishes every op; the next ones the ops of what the
    store took since (read from its event store after the cursor the
    published file keeps), not a read of every message: a sync loop on a
    store of a million messages held its lock for seconds every half
    second. A new RedisSync on the same file goes on from its cursor."""
    from rune_fast.redis_sync import RedisSync
    with ConversationStateRepository(tmp_path / "a", hot_window=2, compact_every=10**6) as a, \
            ConversationStateRepository(tmp_path / "b") as b:
        a.append_many([ConversationMessageRecord(msg_id=f"x{i}", channel_id="c", content=f"m {i}", ts=float(i))
                       for i in range(10)])
        a.compact()
        sa, sb = RedisSync(a, server.url), RedisSync(b, server.url)
        assert sa.push() == 10
        monkeypatch.setattr(a, "_live_snapshot", lambda *a: pytest.fail("a full read for a push of a few changes"))
        a.append(ConversationMessageRecord(msg_id="y", channel_id="c", content="new", ts=20.0))
        a.delete("x1")                                      # archived
        assert sa.push() == 2
        assert sa.push() == 0
        sa.close()
        sa = RedisSync(a, server.url)                       # its cursor, from the published file
        assert sa.push() == 0
        a.append(ConversationMessageRecord(msg_id="z", channel_id="c", content="newer", ts=21.0))
        assert sa.push() == 1
        assert sb.sync_once() == (0, 11)             # x1 came with its tombstone: never stored
        assert {r.msg_id for r in b.window("c", 20)} == {f"x{i}" for i in range(10) if i != 1} | {"y", "z"}
        sa.close(), sb.close()


def test_the_published_file_stays_small_and_merged_ops_are_not_echoed(server, tmp_path, monkeypatch):
    """Past _KEYS_KEPT keys, a push that moved its cursor writes the
    published file again as its epoch and cursor: its keys named ops
    before the cursor, which no later push meets. Ops merged from the
    stream are still not published back, and a restart goes on from the
    cursor."""
    from rune_fast import redis_sync
    from rune_fast.redis_sync import RedisSync
    monkeypatch.setattr(redis_sync, "_KEYS_KEPT", 10)
    with ConversationStateRepository(tmp_path / "a") as a, ConversationStateRepository(tmp_path / "b") as b:
        sa, sb = RedisSync(a, server.url), RedisSync(b, server.url)
        a.append_many([ConversationMessageRecord(msg_id=f"a{i}", channel_id="c", content="x") for i in range(30)])
        assert sa.push() == 30
        with open(sa._path, "rb") as f:
            assert f.read().count(b"\n") == 2             # the epoch and the cursor
        assert sb.sync_once() == (0, 30)
        b.append_many([ConversationMessageRecord(msg_id=f"b{i}", channel_id="c", content="y") for i in range(20)])
        assert sb.push() == 20                               # b's own, not the 30 it merged
        assert sa.pull() == 20 and sa.push() == 0            # nor does a echo b's
        assert sb.sync_once() == (0, 0)
        sa.close()
        sa = RedisSync(a, server.url)
        a.append(ConversationMessageRecord(msg_id="a-late", channel_id="c", content="z"))
        assert sa.push() == 1
        assert sb.pull() == 1 and len(b) == 51
        sa.close(), sb.close()


def test_three_devices_converge_through_kills_duplicates_and_a_server_restart(server, tmp_path):
    rng = random.Random(7)
    states = {n: tmp_path / n for n in ("A", "B", "C")}
    procs = {n: _device(states[n], server.url, n, 600, i, batch=7) for i, n in enumerate(states)}
    acked: dict[str, list[str]] = {n: [] for n in ("A", "B", "C", "C2")}
    out: dict[str, str] = {}

    def drain(name: str, proc: subprocess.Popen) -> None:
        o, e = proc.communicate(timeout=300)
        out[name] = o
        acked[name].extend(_acked(o))
        if proc.returncode not in (0, -signal.SIGKILL):
            raise AssertionError(f"device {name} exited {proc.returncode}: {e[-3000:]}")

    time.sleep(1.0)
    # duplicates, reversed: entries already in the stream added again
    r = redis.Redis(port=server.port)
    entries = r.xrange("rune:ops")
    for _id, fields in reversed(rng.sample(entries, min(20, len(entries)))):
        r.xadd("rune:ops", fields)
    # device C killed while it appends and merges, then restarted
    time.sleep(rng.random() * 0.5)
    assert procs["C"].poll() is None, "device C ended before it could be killed"
    procs["C"].send_signal(signal.SIGKILL)
    drain("C", procs["C"])
    assert procs["C"].returncode == -signal.SIGKILL
    procs["C2"] = _device(states["C"], server.url, "C2", 60, 99, batch=7)
    # the Redis server restarted once (its append-only file keeps the stream and groups)
    time.sleep(0.5)
    assert procs["A"].poll() is None and procs["B"].poll() is None, "the devices ended before the restart"
    server.stop()
    time.sleep(0.5)
    server.start()
    threads = [threading.Thread(target=drain, args=(n, p)) for n, p in procs.items() if n != "C"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "done" in out["A"] and "done" in out["B"] and "done" in out["C2"]
    # settle: each store syncs until a round brings nothing
    from rune_fast.redis_sync import RedisSync
    for _round in range(6):
        moved = 0
        for n, path in states.items():
            with ConversationStateRepository(path) as repo:
                s = RedisSync(repo, server.url)
                pushed, merged = s.sync_once()
                moved += pushed + merged
                s.close()
        if moved == 0:
            break
    every = [m for n in ("A", "B", "C", "C2") for m in acked[n]]
    assert len(every) >= 600 * 2 + 60
    transcripts = {}
    for n, path in states.items():
        with ConversationStateRepository(path) as repo:
            ids = [m.msg_id for ch in repo.channels() for m in repo.window(ch, 10_000)]
            assert len(ids) == len(set(ids)), f"store {n} holds a message twice"
            assert set(every) <= set(ids), f"store {n} lacks {sorted(set(every) - set(ids))[:5]}"
            transcripts[n] = {ch: json.dumps(repo.resume_messages(ch), sort_keys=True, ensure_ascii=False)
                              for ch in repo.channels()}
    assert transcripts["A"] == transcripts["B"] == transcripts["C"]


def test_an_unreachable_server_is_retried_and_appends_never_wait(tmp_path, caplog):
    from rune_fast.redis_sync import RedisSync
    with ConversationStateRepository(tmp_path / "a") as a:
        s = RedisSync(a, f"redis://127.0.0.1:{_free_port()}/0")
        stop = threading.Event()
        loop = threading.Thread(target=s.run, args=(stop,), kwargs={"interval": 0.05, "max_backoff": 0.2})
        with caplog.at_level("WARNING", logger="rune_fast"):
            loop.start()
            for i in range(20):
                a.append(ConversationMessageRecord(msg_id=f"m{i}", channel_id="c", content="x"))
            time.sleep(0.5)
            stop.set()
            loop.join(timeout=10)
        assert not loop.is_alive() and len(a) == 20
        assert any("redis sync" in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records)
        with pytest.raises(redis.ConnectionError):
            s.push()


def test_the_sync_command_and_a_server_that_lost_the_stream(server, tmp_path):
    from rune_fast.cli import main
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with ConversationStateRepository(a) as repo:
        repo.append(ConversationMessageRecord(msg_id="x1", channel_id="c", content="hi"))
    assert main(["--state", a, "sync", "--redis", server.url, "--once"]) == 0
    # the server restarts without its data: the store publishes everything again
    server.stop()
    for name in os.listdir(server.folder):
        shutil.rmtree(os.path.join(server.folder, name), ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(server.folder, name))
    server.start()
    assert main(["--state", a, "sync", "--redis", server.url, "--once"]) == 0
    assert main(["--state", b, "sync", "--redis", server.url, "--once"]) == 0     # a new device
    with ConversationStateRepository(b) as repo:
        assert repo.get_message("x1").found
