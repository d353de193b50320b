"""The ``rocketmq`` source through a real Spark Connect server (the one pyspark
ships), registered on the server by ``pyspark_rocketmq`` alone: the client
never calls ``register()``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from readerkit import local_rows

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
ORDERS, DLQ = "Orders", "%DLQ%billing"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("grpc", reason="the Spark Connect client needs pyspark[connect]")
    import pyspark

    home = Path(pyspark.__file__).parent
    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = dict(os.environ, SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable,
               # an editable install is invisible to pkgutil.iter_modules(), which Spark's
               # lookup uses; a regular install puts pyspark_rocketmq in site-packages
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.session.timeZone=UTC",
             "--conf", "spark.sql.shuffle.partitions=2", "spark-internal"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180  # a readiness wait, not a timing assertion
        while b"Spark Connect server started" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "Spark Connect server did not start: " + log.read_text()[-3000:]
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def connect_session(connect_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """A Spark Connect client session on the real server, stopped after the test."""
    from pyspark.sql import SparkSession

    # builder.remote() switches the whole process into Connect mode through
    # these variables: undone after the test, so later tests get classic sessions
    # (setenv first: monkeypatch restores only what it recorded, and an unset
    # variable is recorded by setenv, not by delenv)
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"):
        if name not in os.environ:
            monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    spark = SparkSession.builder.remote(connect_url).create()
    try:
        yield spark
    finally:
        spark.stop()


def test_connect_client_reads_the_archive_exactly(connect_session, build, tmp_path: Path) -> None:  # noqa: ANN001
    spark = connect_session
    url = f"file://{tmp_path / 'cold'}"
    _, local, _ = build(url)
    rows = local_rows(local)
    df = spark.read.format("rocketmq").load(url)
    assert df.count() == len(rows)
    df.createOrReplaceTempView("m")
    got = spark.sql(f"SELECT (SELECT count(*) FROM m WHERE topic = '{ORDERS}'), "
                    f"(SELECT sum(body_crc) FROM m WHERE topic = '{DLQ}')").collect()[0]
    assert tuple(got) == (240, sum(r["body_crc"] for r in rows if r["topic"] == DLQ))
    a = df.where(f"topic = '{DLQ}'").select("queue_id", "queue_offset")
    b = df.where(f"topic = '{ORDERS}'").select("queue_id", "queue_offset")
    orders = {(r["queue_id"], r["queue_offset"]) for r in rows if r["topic"] == ORDERS}
    assert a.join(b, ["queue_id", "queue_offset"]).count() == sum(
        1 for r in rows if r["topic"] == DLQ and (r["queue_id"], r["queue_offset"]) in orders)

    conds = [(f"topic = '{ORDERS}' AND queue_id = 1", lambda r: r["topic"] == ORDERS and r["queue_id"] == 1),
             (f"topic = '{DLQ}'", lambda r: r["topic"] == DLQ), ("true", lambda r: True)]
    jobs = [conds[i % len(conds)] for i in range(6)]
    with ThreadPoolExecutor(3) as pool:
        counts = list(pool.map(lambda job: df.where(job[0]).count(), jobs))
    assert counts == [sum(1 for r in rows if keep(r)) for _, keep in jobs]
