"""``tiered export``: Parquet by topic and date, incremental, idempotent across
reruns and killed runs; Spark reads it back equal to the data source."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from readerkit import T0, TopicSpec
from tiered.query.export import STATE, Exporter, run_local, run_spark
from tiered.query.spark_source import load

pytestmark = pytest.mark.spark


def exported(out: Path) -> list[tuple]:
    """(topic, cluster, broker, queue_id, queue_offset, body_crc) of every exported row."""
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["topic", "cluster", "broker", "queue_id", "queue_offset", "body_crc", "date"])
    d = table.to_pydict()
    return list(zip(d["topic"], d["cluster"], d["broker"], d["queue_id"], d["queue_offset"], d["body_crc"]))


def files(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*.parquet")}


def assert_exact(spark, cold_url: str, out: Path) -> int:
    """The export holds every archived record exactly once."""
    rows = exported(out)
    keys = [r[:5] for r in rows]
    assert len(keys) == len(set(keys)), "duplicates in the export"
    archived = {(r["topic"], r["cluster"], r["broker"], r["queue_id"], r["queue_offset"], r["body_crc"])
                for r in load(spark, cold_url).select("topic", "cluster", "broker", "queue_id", "queue_offset",
                                                      "body_crc").collect()}
    assert set(rows) == archived
    return len(rows)


def test_export_is_incremental_and_idempotent(spark, build, tmp_path: Path) -> None:
    cold_url = f"file://{tmp_path / 'cold'}"
    store, local, _ = build(cold_url)
    out = tmp_path / "out"
    target_url = f"file://{out}"

    from tiered.archive.storage import open_store

    target = open_store(target_url)
    first = Exporter(store, target).run()
    assert first.rows == 280 and first.files > 0
    assert assert_exact(spark, cold_url, out) == 280
    assert {p.split("/")[0] for p in files(out)} == {"topic=Orders", "topic=%25DLQ%25billing"}

    # Spark reads it as partitions topic and date, equal to the data source
    pq = spark.read.parquet(str(out))
    assert {f.name for f in pq.schema.fields} >= {"topic", "date", "body", "properties", "keys", "store_timestamp"}
    src = load(spark, cold_url)
    for frame in (pq, src):
        frame.createOrReplaceTempView("v")
        agg = spark.sql("SELECT topic, count(*) n, sum(body_crc) c, sum(size(keys)) k, "
                        "sum(size(properties)) p, min(store_timestamp) t FROM v GROUP BY topic ORDER BY topic").collect()
        if frame is pq:
            expected = agg
        else:
            assert agg == expected

    # a rerun with nothing new writes nothing
    before = files(out)
    again = Exporter(store, target).run()
    assert (again.tasks, again.files, again.rows) == (0, 0, 0)
    assert files(out) == before

    # new data: only the new segments are exported; old files are left alone
    from readerkit import archive, write_store

    write_store(tmp_path / "store", [TopicSpec("Orders", queues=2, messages=60, start_ms=T0 + 86_400_000),
                                     TopicSpec("Late", queues=1, messages=30, start_ms=T0 + 86_400_000)], seed=9)
    archive(tmp_path / "store", store, tmp_path / "state-store")
    third = Exporter(store, target).run()
    assert third.rows == 90
    after = files(out)
    assert {k: v for k, v in after.items() if k in before} == before
    assert all("date=2023-11-15" in k for k in set(after) - set(before))
    assert assert_exact(spark, cold_url, out) == 370


def test_a_killed_export_is_finished_by_the_next_run_without_duplicates(spark, build, tmp_path: Path) -> None:
    from tiered.archive.storage import open_store

    cold_url = f"file://{tmp_path / 'cold'}"
    store, local, _ = build(cold_url)
    out = tmp_path / "out"
    target = open_store(f"file://{out}")

    class Killed(Exception):
        pass

    def die(results):  # noqa: ANN001 - the run dies after writing every file, before its commit
        raise Killed()

    with pytest.raises(Killed):
        Exporter(store, target, executor=run_local(1), on_tasks_done=die).run()
    state = json.loads((out / STATE).read_text())
    pending = state["pending"]["tasks"]
    assert pending and state["queues"] == {}
    written = files(out)
    assert written

    # the rerun (on Spark executors this time) redoes exactly the pending tasks, then commits
    report = Exporter(store, target, executor=run_spark(spark)).run()
    assert report.resumed_tasks == len(pending) and report.tasks == 0
    assert set(files(out)) == set(written)
    assert json.loads((out / STATE).read_text())["pending"] is None
    assert assert_exact(spark, cold_url, out) == 280


def test_export_killed_with_sigkill_then_rerun(spark, build, tmp_path: Path, s3_url: str, moto_endpoint: str) -> None:
    store, local, _ = build(s3_url)
    out = tmp_path / "out"
    env = {**os.environ, "TIERED_S3__ENDPOINT_URL": moto_endpoint}
    cmd = [sys.executable, "-m", "tiered.cli", "export", "--cold", s3_url, "--to", f"file://{out}",
           "--format", "parquet", "--parallelism", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    state_file = out / STATE
    deadline = time.monotonic() + 60
    saw_pending = False
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            saw_pending = json.loads(state_file.read_text()).get("pending") is not None
        except (OSError, ValueError):
            saw_pending = False
        if saw_pending:
            break
        time.sleep(0.005)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert saw_pending or proc.returncode == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""

    rerun = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    report = json.loads(rerun.stdout)
    if proc.returncode == -signal.SIGKILL:  # killed mid-run (the usual case): the rerun finished its tasks
        assert report["resumed_tasks"] > 0
    print(f"export killed: {proc.returncode == -signal.SIGKILL}, rerun: {report}")
    rows = exported(out)
    keys = [r[:5] for r in rows]
    assert len(keys) == len(set(keys)) == 280
    assert json.loads(state_file.read_text())["pending"] is None
