"""A real cluster: ``local-cluster[2,1,512]`` (a standalone master and two
workers in separate JVMs, each executor with its own Python workers), the
source registered by ``pyspark_rocketmq`` and the package on the executors'
Python. Results equal the local store's."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from readerkit import local_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_local_cluster_reads_the_archive_on_separate_executors(build, tmp_path: Path) -> None:
    import pyspark

    url = f"file://{tmp_path / 'cold'}"
    _, local, _ = build(url)
    rows = local_rows(local)
    stats = tmp_path / "stats"
    env = dict(os.environ, SPARK_HOME=str(Path(pyspark.__file__).parent), PYSPARK_PYTHON=sys.executable,
               # executors inherit it: the checkout on the workers' Python path, as an
               # installed package would be (see README, "On a cluster")
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("cluster_driver.py")),
                           "local-cluster[2,1,512]", url, str(stats)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    want = {}
    for r in rows:
        n, crc = want.get(r["topic"], (0, 0))
        want[r["topic"]] = (n + 1, crc + r["body_crc"])
    assert {t: tuple(v) for t, v in out["by_topic"].items()} == want
    assert out["pair"] == [want["Orders"][0], want["%DLQ%billing"][0]]
    assert out["executors"] == 2 and out["partitions"] > 2
    # the partitions were read by Python workers of the executors, not by the driver
    pids = {int(Path(f).stem) for f in glob.glob(str(stats / "*.jsonl"))}
    assert pids and out["driver_pid"] not in pids
    read = [json.loads(line) for f in glob.glob(str(stats / "*.jsonl")) for line in open(f)]
    assert sum(r["rows"] for r in read) == 3 * len(rows)  # three scans (a group-by, two subqueries), all rows each
