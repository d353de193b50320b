"""Spark over the archive against Spark over Parquet of the same rows (issue 15).

    python bench/spark_scan.py                 # 512 MiB of CommitLog (the default)
    python bench/spark_scan.py --size-mb 2048  # closer to a real day of a broker

1. Writes a broker store of ``--size-mb`` of CommitLog records (JSON-like
   bodies of about 1 KiB, keys, tags, UNIQ_KEY) spread evenly over one day
   of store time in 7 queues of 3 topics, and archives it with the real
   dispatcher (layout v2 unless ``--layout 1``) into a file:// cold tier (default segment size, so a segment
   spans hours: a one-hour query has to narrow inside segments).
2. Writes Parquet of the same rows with Spark itself: every column, the same
   body bytes, range-partitioned by store time and sorted (the layout a
   careful export has: Parquet can skip files by their time statistics).
3. In one Spark ``local[2]`` session, each side split as its defaults split
   it (128 MiB input partitions for both: at the default size, at least 4
   partitions each; ``--partition-mb`` sets both), times each query on each
   side (best of ``--repeat``), checks that both sides give the same answer,
   and prints the speed ratios (Parquet's time / the archive's: 1.0x is as
   fast as Parquet). Then the share of the archive's bytes a one-hour query
   reads.

The queries mean the same on both sides; the archive side runs each one
over the DataFrame a user would load for it:

- ``archive``: ``load(url)``, every column. Spark 4.1-4.3 give a Python data
  source neither the columns a query uses nor its aggregates, so this side
  decodes every column of every row (the honest worst case).
- ``archive_cols``: ``load(url, columns=...)`` naming the columns the query
  uses: only those are decoded; queue columns only (or none) are answered
  from the manifests without reading an object.
- ``archive_opts``: the store-time range or the looked-up key / message id
  as source options (``startTime``/``endTime``, ``key``, ``msgId``): they prune
  before anything is read. The SQL ``WHERE`` is kept, so the result is the
  same query's.
- ``tiered_sql``: the very SQL text of the Parquet side through
  ``tiered.query.spark_sql.sql`` (what ``tiered sql`` runs) over the plain
  URL: columns and pruning options derived from the query's plan, the
  derivation (analysis, view registration) timed with the query.

Goals: >= 0.5x Parquet's speed for count(*), sum(length(body)) and the
hour by topic; a lookup in <= 2x Parquet's time (ratio >= 0.5x); the
one-hour query reads <= 10% of the archive's bytes. The script prints the
figures and whether each goal holds; it never fails on them (wall-clock
numbers depend on the machine, printed first).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchdocs import add_option, recorded  # noqa: E402

DAY_MS = 86_400_000
T0 = 1_717_200_000_000  # 2024-06-01T00:00:00Z
CLUSTER, BROKER = "BenchCluster", "broker-bench"
TOPICS = (("Orders", 4), ("Payments", 2), ("%DLQ%billing", 1))


def write_store(root: Path, size_bytes: int, seed: int = 1) -> tuple[int, int]:
    """(messages, bytes) written: one day of store time, evenly spaced."""
    from tiered.store.storewriter import StoreWriter

    rng = random.Random(seed)
    words = [f"{rng.getrandbits(48):012x}" for _ in range(4096)]
    queues = [(t, q) for t, n in TOPICS for q in range(n)]
    written = 0
    total = 0  # messages spread over the day: set from the first record's size
    with StoreWriter(root, commitlog_file_size=1 << 30) as w:
        i = 0
        while written < size_bytes:
            topic, qid = queues[i % len(queues)]
            ts = T0 + i * DAY_MS // max(total, 1)
            payload = " ".join(rng.choice(words) for _ in range(60))
            body = (f'{{"id":{i},"user":"u{rng.randrange(100000)}","amount":{rng.randrange(10**6)},'
                    f'"currency":"EUR","items":{rng.randrange(1, 9)},"note":"{payload}"}}').encode()
            props = {"DELAY": "2", "REAL_TOPIC": "Orders"} if i % 50 == 0 else None
            a = w.put(topic, qid, body, tags=("created", "paid", "shipped")[i % 3], keys=[f"order-{i}"],
                      unique_key=f"{rng.getrandbits(128):032X}", properties=props,
                      store_timestamp=ts, born_timestamp=ts - rng.randrange(50))
            written += a.size
            if i == 0:
                total = int(size_bytes / a.size * 1.01) + 1
            i += 1
    return i, written


def archive(store_dir: Path, cold_url: str, state_dir: Path, layout: int) -> None:
    from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions
    from tiered.archive.coldtier import ColdTier
    from tiered.store.localstore import LocalStore
    from tiered.archive.storage import open_store

    store = open_store(cold_url)
    local = LocalStore(store_dir)
    cold = ColdTier(store, CLUSTER, BROKER, state_dir=state_dir, writer="bench")
    options = DispatchOptions(archive=ArchiveOptions(upload_bytes=1, max_delay_ms=0, layout=layout), parallelism=2,
                              round_budget_s=float("inf"))
    d = Dispatcher(local, cold, options=options)
    for _ in range(100):
        r = d.run_round()
        if r.errors:
            raise SystemExit(f"archiving failed: {r.errors}")
        if r.lag_messages == 0 and r.segments == 0:
            break


def archive_bytes(cold_dir: Path) -> int:
    return sum(p.stat().st_size for p in cold_dir.rglob("*") if p.is_file() and not p.name.endswith(".json"))


def timed(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def prepare(args: argparse.Namespace, work: Path) -> tuple[str, Path]:
    """The archive (built once per workdir): its URL and directory."""
    store_dir, cold_dir = work / "store", work / "cold"
    if not (cold_dir / CLUSTER).exists():
        t = time.perf_counter()
        messages, nbytes = write_store(store_dir, args.size_mb << 20)
        print(f"store:   {messages:,} messages, {nbytes / 2**20:,.0f} MiB in {time.perf_counter() - t:.1f}s")
        t = time.perf_counter()
        archive(store_dir, f"file://{cold_dir}", work / "state", args.layout)
        print(f"archive: {archive_bytes(cold_dir) / 2**20:,.0f} MiB in {time.perf_counter() - t:.1f}s")
        shutil.rmtree(store_dir)
    return f"file://{cold_dir}", cold_dir


def session(partition_bytes: int):  # noqa: ANN201 - a SparkSession
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[2]").appName("tiered-bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "3g").config("spark.sql.shuffle.partitions", "2"))
    if partition_bytes:  # Parquet split like the archive (the defaults are the same: 128 MiB, 4 MiB)
        builder = (builder.config("spark.sql.files.maxPartitionBytes", str(partition_bytes))
                   .config("spark.sql.files.openCostInBytes", str(min(4 << 20, partition_bytes))))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def base_options(args: argparse.Namespace, partition_bytes: int) -> dict[str, str]:
    """Source options every archive view shares."""
    base = {"verifyCrc": args.verify_crc}
    if partition_bytes:
        base.update(maxPartitionBytes=str(partition_bytes), openCostInBytes=str(min(4 << 20, partition_bytes)))
    return base


def views(spark, cold_url: str, out_dir: Path, args: argparse.Namespace, partition_bytes: int,
          targets: dict[str, str]) -> None:
    """Every view the queries use (see the module docstring)."""
    base = base_options(args, partition_bytes)

    def view(name: str, **options: str) -> None:
        spark.read.format("rocketmq").options(**base, **options).load(cold_url).createOrReplaceTempView(name)

    view("archive")
    spark.read.parquet(str(out_dir)).createOrReplaceTempView("parquet")
    view("count_cols", columns="topic,queue_id,queue_offset")
    view("body_cols", columns="body")
    view("hour_opts", startTime=targets["lo"], endTime=targets["hi"])
    view("hour_cols", startTime=targets["lo"], endTime=targets["hi"], columns="topic,tags,store_timestamp")
    view("key_opts", key=targets["key"])
    view("uniq_opts", key=targets["uniq"])
    view("msgid_opts", msgId=targets["msgid"])


def write_parquet(spark, cold_url: str, out_dir: Path, parts: int) -> None:
    from pyspark.sql import functions as F

    t = time.perf_counter()
    df = spark.read.format("rocketmq").load(cold_url)
    df.repartitionByRange(parts, "store_timestamp").sortWithinPartitions("store_timestamp") \
        .write.mode("overwrite").parquet(str(out_dir))
    pq_bytes = sum(p.stat().st_size for p in out_dir.rglob("*.parquet"))
    n = spark.read.parquet(str(out_dir)).select(F.count("*")).collect()[0][0]
    print(f"parquet: {n:,} rows, {len(list(out_dir.rglob('*.parquet')))} files ({pq_bytes / 2**20:,.0f} MiB, "
          f"snappy) in {time.perf_counter() - t:.1f}s")


def pick_targets(spark) -> dict[str, str]:
    """A message to look up (by KEYS entry, UNIQ_KEY and offset message id)
    and the one-hour window: read from the Parquet side."""
    from tiered.format.codec import Host, offset_msg_id

    r = spark.sql("SELECT keys[0], unique_key, store_host, commitlog_offset FROM parquet "
                  "WHERE topic = 'Payments' AND queue_id = 1 AND queue_offset = 1234").collect()[0]
    lo = T0 + 12 * 3_600_000
    return {"key": r[0], "uniq": r[1], "host": r[2], "offset": str(r[3]),
            "msgid": offset_msg_id(Host.parse(r[2]), r[3]), "lo": str(lo), "hi": str(lo + 3_600_000)}


def queries(t: dict[str, str]) -> list[tuple[str, str, tuple[str, ...], bool]]:
    """(name, SQL with {view}, archive views, a lookup?)"""
    window = (f"store_timestamp >= timestamp_millis({t['lo']}) AND store_timestamp < timestamp_millis({t['hi']})")
    return [
        ("count(*)", "SELECT count(*) FROM {view}", ("archive", "count_cols"), False),
        ("sum(length(body))", "SELECT sum(length(body)) FROM {view}", ("archive", "body_cols"), False),
        ("hour by topic", f"SELECT topic, count(*), sum(length(tags)) FROM {{view}} WHERE {window} "
                          f"GROUP BY topic ORDER BY topic", ("archive", "hour_opts", "hour_cols"), False),
        ("KEYS lookup", f"SELECT topic, queue_id, queue_offset FROM {{view}} WHERE array_contains(keys, '{t['key']}')",
         ("archive", "key_opts"), True),
        ("UNIQ_KEY lookup", f"SELECT topic, queue_id, queue_offset FROM {{view}} WHERE unique_key = '{t['uniq']}'",
         ("archive", "uniq_opts"), True),
        ("msgId lookup", f"SELECT topic, queue_id, queue_offset FROM {{view}} WHERE store_host = '{t['host']}' "
                         f"AND commitlog_offset = {t['offset']}", ("archive", "msgid_opts"), True),
    ]


SQL_VIEW = "tiered_sql"  # the view tiered.query.spark_sql.sql registers per query


def run_queries(spark, t: dict[str, str], repeat: int, cold_url: str, base: dict[str, str]) -> None:
    from tiered.query.spark_sql import prepare

    results: dict[str, float] = {}
    answers: dict[str, list] = {}
    for name, sql, archive_views, _ in queries(t):
        for view in ("parquet",) + archive_views + (SQL_VIEW,):
            text = sql.format(view=view)
            if view == SQL_VIEW:
                run = lambda: prepare(spark, cold_url, text, view=SQL_VIEW, **base)[0].collect()  # noqa: E731
                print(f"{'':18s} {view:11s} derived: {prepare(spark, cold_url, text, view=SQL_VIEW, **base)[1].describe()}")
            else:
                run = lambda: spark.sql(text).collect()  # noqa: E731
            seconds, out = timed(run, repeat)
            results[f"{name}/{view}"] = seconds
            answers[f"{name}/{view}"] = sorted(tuple(r) for r in out)
            print(f"{name:18s} {view:11s} {seconds:7.2f}s   {answers[f'{name}/{view}'][:3]}")
            if answers[f"{name}/{view}"] != answers[f"{name}/parquet"]:
                raise SystemExit(f"{name}: {view} answers differently from Parquet")
    print("\nspeed = Parquet's time / the archive's time (goal >= 0.5x for every line)")
    for name, _, archive_views, lookup in queries(t):
        for view in archive_views + (SQL_VIEW,):
            ratio = results[f"{name}/parquet"] / results[f"{name}/{view}"]
            goal = "time <= 2x Parquet's" if lookup else "speed >= 0.5x"
            print(f"speed {name:18s} {view:11s} {ratio:6.3f}x   ({goal}: {'met' if ratio >= 0.5 else 'NOT met'})")


def one_hour_share(spark, cold_url: str, cold_dir: Path, stats_dir: Path, t: dict[str, str]) -> None:
    shutil.rmtree(stats_dir, ignore_errors=True)
    q = (spark.read.format("rocketmq").option("statsPath", str(stats_dir)).option("startTime", t["lo"])
         .option("endTime", t["hi"]).option("columns", "store_timestamp").load(cold_url))
    start = time.perf_counter()
    rows = q.count()
    seconds = time.perf_counter() - start
    read = [json.loads(line) for f in glob.glob(str(stats_dir / "*.jsonl")) for line in open(f)]
    got, total = sum(r["bytes"] for r in read), archive_bytes(cold_dir)
    print(f"one-hour query: {rows:,} rows in {seconds:.2f}s, read {got / 2**20:,.1f} MiB of "
          f"{total / 2**20:,.0f} MiB archived = {got / total:.1%} in {sum(r['requests'] for r in read)} requests "
          f"(goal <= 10%: {'met' if got / total <= 0.10 else 'NOT met'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=512, help="CommitLog MiB to archive (default 512)")
    ap.add_argument("--layout", type=int, default=2, choices=[1, 2],
                    help="segment layout archived (default 2, dispatch.layout's default)")
    ap.add_argument("--files", type=int, default=8, help="Parquet files written (default 8)")
    ap.add_argument("--partition-mb", type=int, default=0,
                    help="input partition size on both sides (default: their defaults, 128 MiB)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per query; the best counts (default 3)")
    ap.add_argument("--workdir", help="keep data here (default: a temp dir, removed)")
    ap.add_argument("--verify-crc", default="true", choices=["true", "false"], help="data source verifyCrc")
    add_option(ap)
    args = ap.parse_args()
    with recorded(args, "spark_scan"):
        compare(args)


def compare(args: argparse.Namespace) -> None:
    print(f"cores: {os.cpu_count()} (wall-clock times; other load on the machine skews them)")

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="tiered-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        cold_url, cold_dir = prepare(args, work)
        partition_bytes = args.partition_mb << 20
        spark = session(partition_bytes)
        from tiered.query.spark_source import register

        register(spark)
        out_dir = work / "parquet"
        if not out_dir.exists():
            write_parquet(spark, cold_url, out_dir, args.files)
        spark.read.parquet(str(out_dir)).createOrReplaceTempView("parquet")
        t = pick_targets(spark)
        views(spark, cold_url, out_dir, args, partition_bytes, t)
        n_src = spark.table("archive").rdd.getNumPartitions()
        n_pq = spark.table("parquet").rdd.getNumPartitions()
        print(f"partitions: archive {n_src}, parquet {n_pq}\n")
        run_queries(spark, t, args.repeat, cold_url, base_options(args, partition_bytes))
        one_hour_share(spark, cold_url, cold_dir, work / "stats", t)
        spark.stop()
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
