"""publish(): the store's messages as a Hive-partitioned Parquet dataset.

Each engine -- DuckDB and Polars over a local dataset, Apache Spark in
local mode over the same one, pyarrow (with DuckDB over its table) over an
S3-compatible server on 127.0.0.1 -- answers four queries (count per
channel, the last 8 messages of a channel, every message of a task, a
case-insensitive substring filter) exactly as rune_fast's own reads do.
A second publish writes nothing; deletions reach the dataset; a publish
that dies half-way leaves nothing partial and the next one finishes it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.publish import MANIFEST_NAME, publish
from rune_fast.records import ConversationMessageRecord

DAY = 86_400.0
T0 = 1_764_806_400.0        # 2025-12-04 00:00 UTC
WORDS = ["Zürich", "error", "Straße", "deploy", "日本語", "café", "rollback", "ERROR"]


def _msg(i: int) -> ConversationMessageRecord:
    return ConversationMessageRecord(
        msg_id=f"m{i:05d}", channel_id=f"ch{i % 4}", task_id=f"t{i % 5}" if i % 3 else "",
        content=f"{WORDS[i % len(WORDS)]} message {i} {WORDS[(i * 7) % len(WORDS)]}",
        ts=T0 + (i % 3) * DAY + i, role="user" if i % 2 else "assistant")


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "state"
    with ConversationStateRepository(root, hot_window=20, compact_every=10_000) as repo:
        repo.append_many(_msg(i) for i in range(300))
        repo.compact()          # some cooled, some hot
        repo.append_many(_msg(i) for i in range(300, 340))
        repo.delete("m00007")
    return root


def _truth(root) -> dict:
    with ConversationStateRepository(root, read_only=True) as repo:
        chans = repo.channels()
        return {
            "count": {ch: len(repo.window(ch, 10_000)) for ch in chans},
            "last8": {ch: [m.msg_id for m in repo.window(ch, 8)] for ch in chans},
            "task": {t: sorted(m.msg_id for m in repo.messages_for_task(t)) for t in ("t1", "t2")},
            "search": {q: sorted(h.record.msg_id for h in repo.search(q)) for q in ("zürich", "error")},
        }


QUERIES = {
    "count": "SELECT channel_id, count(*) AS n FROM ds GROUP BY channel_id",
    "last8": "SELECT msg_id FROM ds WHERE channel_id = '{ch}' ORDER BY position DESC LIMIT 8",
    "task": "SELECT msg_id FROM ds WHERE task_id = '{t}' ORDER BY msg_id",
    "search": "SELECT msg_id FROM ds WHERE lower(content) LIKE '%{q}%' ORDER BY msg_id",
}


def _answers(run, truth) -> dict:
    """The four queries through ``run(sql) -> list of tuples``."""
    return {
        "count": {ch: n for ch, n in run(QUERIES["count"])},
        "last8": {ch: [r[0] for r in run(QUERIES["last8"].format(ch=ch))][::-1] for ch in truth["last8"]},
        "task": {t: [r[0] for r in run(QUERIES["task"].format(t=t))] for t in truth["task"]},
        "search": {q: [r[0] for r in run(QUERIES["search"].format(q=q))] for q in truth["search"]},
    }


def _duckdb_local(ds) -> callable:
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    con.execute(f"CREATE VIEW ds AS SELECT * FROM read_parquet('{ds}/**/*.parquet', hive_partitioning=true)")
    return lambda sql: con.execute(sql).fetchall()


def test_duckdb_and_polars_answer_as_the_store_does(store, tmp_path):
    ds = tmp_path / "ds"
    rep = publish(store, str(ds))
    assert rep.messages == 339 and rep.files_written == rep.partitions > 3
    truth = _truth(store)
    assert _answers(_duckdb_local(ds), truth) == truth
    pl = pytest.importorskip("polars")
    ctx = pl.SQLContext(ds=pl.scan_parquet(f"{ds}/**/*.parquet", hive_partitioning=True))
    assert _answers(lambda sql: ctx.execute(sql).collect().rows(), truth) == truth


def test_a_second_publish_writes_nothing_and_changes_reach_the_dataset(store, tmp_path):
    ds = tmp_path / "ds"
    first = publish(store, str(ds))
    files = {p: p.stat().st_mtime_ns for p in ds.rglob("*.parquet")}
    again = publish(store, str(ds))
    assert (again.files_written, again.files_removed) == (0, 0)
    assert {p: p.stat().st_mtime_ns for p in ds.rglob("*.parquet")} == files
    with ConversationStateRepository(store) as repo:
        # a new day for one channel: only its partition is written
        repo.append(ConversationMessageRecord(msg_id="new", channel_id="ch1", content="fresh error",
                                              ts=T0 + 10 * DAY))
        # every message of one partition deleted: its file goes
        gone = [m for m in repo.window("ch2", 10_000) if T0 + DAY <= m.ts < T0 + 2 * DAY]
        for m in gone:
            repo.delete(m.msg_id)
        repo.compact()          # (erased from every file of the store too)
    rep = publish(store, str(ds))
    assert rep.files_written >= 1 and rep.files_removed == 1
    assert rep.files_written < first.files_written
    truth = _truth(store)
    answers = _answers(_duckdb_local(ds), truth)
    assert answers == truth
    run = _duckdb_local(ds)
    assert run("SELECT count(*) FROM ds WHERE msg_id = 'new'") == [(1,)]
    assert run(f"SELECT count(*) FROM ds WHERE msg_id IN ({','.join(repr(m.msg_id) for m in gone)})") == [(0,)]


def test_a_publish_that_dies_half_way_leaves_no_partial_file(store, tmp_path, monkeypatch):
    import rune_fast.publish as pub
    ds = tmp_path / "ds"
    real = pub._write
    calls = []

    def dying(fs, path, data):
        calls.append(path)
        if len(calls) == 3:
            # a crash in the middle of writing the third file
            with open(os.path.join(os.path.dirname(path), ".half.tmp"), "wb") as f:
                f.write(data[: len(data) // 2])
            raise OSError("killed")
        real(fs, path, data)
    monkeypatch.setattr(pub, "_write", dying)
    with pytest.raises(OSError, match="killed"):
        publish(store, str(ds))
    run = _duckdb_local(ds)
    assert run("SELECT count(*) FROM ds")[0][0] > 0       # what was written reads whole
    assert not (ds / MANIFEST_NAME).exists()
    monkeypatch.setattr(pub, "_write", real)
    publish(store, str(ds))
    truth = _truth(store)
    assert _answers(_duckdb_local(ds), truth) == truth


def test_bad_arguments_are_refused(store, tmp_path):
    with pytest.raises(ValueError, match="buckets"):
        publish(store, str(tmp_path / "ds"), buckets=0)
    publish(store, str(tmp_path / "ds"), buckets=4)
    with pytest.raises(ValueError, match="4 buckets"):
        publish(store, str(tmp_path / "ds"), buckets=8)
    with pytest.raises(ValueError, match="uri"):
        publish(store, "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _moto_server():
    pytest.importorskip("moto")
    pytest.importorskip("flask")    # moto's server mode
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the S3 server did not start")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_an_s3_dataset_answers_as_the_store_does(store, monkeypatch):
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    duckdb = pytest.importorskip("duckdb")
    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    with _moto_server() as port:
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1",
                               access_key="test", secret_key="test", allow_bucket_creation=True)
        fs.create_dir("bucket")
        uri = f"s3://bucket/rune?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        rep = publish(store, uri)
        assert rep.files_written == rep.partitions > 3
        assert publish(store, uri).files_written == 0
        table = pads.dataset("bucket/rune", filesystem=fs, format="parquet",
                             partitioning="hive", exclude_invalid_files=True).to_table()
        con = duckdb.connect()
        con.register("ds", table)
        truth = _truth(store)
        assert _answers(lambda sql: con.execute(sql).fetchall(), truth) == truth


def test_spark_reads_the_dataset_as_the_store_does(store, tmp_path):
    if not shutil.which("java"):
        pytest.skip("no Java runtime (make setup-test installs Debian's default-jre-headless)")
    pyspark = pytest.importorskip("pyspark")
    ds = tmp_path / "ds"
    publish(store, str(ds))
    from pyspark.sql import SparkSession
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[1]").appName("rune-publish-test")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    try:
        spark.read.parquet(str(ds)).createOrReplaceTempView("ds")
        truth = _truth(store)
        # each query is a Spark job: one of each kind (the JVM is slow to warm)
        truth = {"count": truth["count"], "last8": {"ch1": truth["last8"]["ch1"]},
                 "task": {"t1": truth["task"]["t1"]}, "search": {"zürich": truth["search"]["zürich"]}}
        answers = _answers(lambda sql: [tuple(r) for r in spark.sql(sql).collect()], truth)
        assert answers == truth
    finally:
        spark.stop()
    assert pyspark.__version__


def test_the_publish_command(store, tmp_path, capsys):
    import json as _json

    from rune_fast.cli import main
    assert main(["--state", str(store), "--json", "publish", str(tmp_path / "ds")]) == 0
    rep = _json.loads(capsys.readouterr().out)
    assert rep["messages"] == 339 and rep["files_written"] == rep["partitions"]
    assert main(["--state", str(store), "publish", str(tmp_path / "ds"), "--buckets", "3"]) == 2
    assert "buckets" in capsys.readouterr().err
