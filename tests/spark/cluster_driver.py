"""A Spark driver on a real cluster (``local-cluster[2,1,512]``: a master, two
worker JVMs, executors in their own processes), reading an archive with the
auto-registered ``rocketmq`` source. Prints one JSON line of results."""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession


def main(master: str, url: str, stats: str) -> None:
    spark = (SparkSession.builder.master(master).appName("tiered-cluster-test")
             .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
             .config("spark.executor.memory", "512m").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    try:
        df = spark.read.format("rocketmq").load(url, statsPath=stats, maxPartitionBytes="64KiB", openCostInBytes="1")
        df.createOrReplaceTempView("m")
        by_topic = {r[0]: [r[1], r[2]] for r in spark.sql(
            "SELECT topic, count(*), sum(body_crc) FROM m GROUP BY topic").collect()}
        pair = spark.sql("SELECT (SELECT count(*) FROM m WHERE topic = 'Orders'), "
                         "(SELECT count(*) FROM m WHERE topic = '%DLQ%billing')").collect()[0]
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
        print(json.dumps({"by_topic": by_topic, "pair": list(pair), "partitions": df.rdd.getNumPartitions(),
                          "executors": executors, "driver_pid": os.getpid()}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
