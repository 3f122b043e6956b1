"""Publish benchmark: messages a second to a local dataset and to an S3
server on 127.0.0.1 (moto), and DuckDB's and Spark's time for the four
queries of tests/test_publish.py over the dataset.

    python -m bench.publish_bench --n 1000000 --out docs/PUBLISH.md

Builds a store of ``--n`` messages (100 channels, 1,000 tasks, mixed
languages, spread over 30 days) with append_many in "none" mode, publishes
it, and prints a Markdown table (machine, date, commit)."""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.publish import publish
from rune_fast.records import ConversationMessageRecord

WORDS = ("error", "deploy", "Zürich", "Straße", "naïve", "café", "日本語", "ΣΟΦΙΑ", "rollback", "server",
         "latency", "München", "tool", "result", "the", "and", "user", "agent")
QUERIES = {
    "count per channel": "SELECT channel_id, count(*) FROM ds GROUP BY channel_id",
    "last 8 of a channel": "SELECT msg_id FROM ds WHERE channel_id = 'ch7' ORDER BY position DESC LIMIT 8",
    "every message of a task": "SELECT msg_id FROM ds WHERE task_id = 'task42'",
    "case-insensitive substring": "SELECT count(*) FROM ds WHERE lower(content) LIKE '%zürich%'",
}


def build(root: str, n: int) -> float:
    rng = random.Random(1)
    t0 = time.perf_counter()
    with ConversationStateRepository(root, durability="none", compact_every=50_000) as repo:
        for start in range(0, n, 1000):
            repo.append_many([ConversationMessageRecord(
                msg_id=f"m{i:09d}", channel_id=f"ch{rng.randrange(100)}",
                task_id=f"task{rng.randrange(1000)}" if rng.random() < 0.3 else "",
                content=" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80))),
                ts=1_764_806_400.0 + i * (30 * 86_400 / n), role=rng.choice(("user", "assistant")))
                for i in range(start, min(n, start + 1000))])
        repo.compact()
    return time.perf_counter() - t0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def timed(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--out", help="write the Markdown table here too")
    p.add_argument("--no-spark", action="store_true")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="rune-publish-bench-")
    rows: list[tuple[str, str]] = []
    try:
        state, ds = os.path.join(work, "state"), os.path.join(work, "ds")
        rows.append(("build the store (append_many, 'none')", f"{build(state, args.n):.1f} s"))
        rep = publish(state, ds)
        rows.append(("publish to a local folder", f"{rep.messages / rep.seconds:,.0f} messages/s "
                     f"({rep.seconds:.1f} s, {rep.files_written} files, {rep.bytes_written / 2**20:.0f} MiB)"))
        again = publish(state, ds)
        rows.append(("publish again, nothing changed", f"{again.seconds:.1f} s, {again.files_written} files"))
        import pyarrow.fs as pafs
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                          AWS_EC2_METADATA_DISABLED="true")
        with moto_server() as port:
            pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1",
                              allow_bucket_creation=True).create_dir("bench")
            s3 = publish(state, f"s3://bench/rune?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1")
            rows.append(("publish to S3 (moto on 127.0.0.1)", f"{s3.messages / s3.seconds:,.0f} messages/s "
                         f"({s3.seconds:.1f} s)"))
        import duckdb
        con = duckdb.connect()
        con.execute(f"CREATE VIEW ds AS SELECT * FROM read_parquet('{ds}/**/*.parquet', hive_partitioning=true)")
        for name, sql in QUERIES.items():
            rows.append((f"DuckDB: {name}", f"{timed(lambda: con.execute(sql).fetchall()) * 1e3:.1f} ms"))
        if not args.no_spark and shutil.which("java"):
            from pyspark.sql import SparkSession
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            t0 = time.perf_counter()
            spark = (SparkSession.builder.master("local[2]").appName("rune-publish-bench")
                     .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                     .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
            spark.read.parquet(ds).createOrReplaceTempView("ds")
            rows.append(("Spark: start and read the dataset", f"{time.perf_counter() - t0:.1f} s"))
            try:
                for name, sql in QUERIES.items():
                    rows.append((f"Spark (local[2]): {name}",
                                 f"{timed(lambda: spark.sql(sql).collect()) * 1e3:.0f} ms"))
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    head = (f"Publish benchmark, {args.n:,} messages: `python -m bench.publish_bench --n {args.n}` on "
            f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, commit {commit or '?'} "
            f"(medians of three runs for the queries).")
    table = "\n".join([head, "", "| what | measured |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]) + "\n"
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Publishing the archive\n\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
