"""Automatic registration of the ``rocketmq`` Spark data source.

Spark looks, in its driver's Python, for top-level modules named ``pyspark_*``
with a ``DefaultSource`` (a ``pyspark.sql.datasource.DataSource``) and
registers each under its ``name()`` before the first Python data source call.
So wherever ``rocketmq-tiered`` is installed next to Spark -- a Spark Connect
server, a cluster's driver -- ``spark.read.format("rocketmq")`` works with no
``register()`` call, including from Spark Connect clients, which cannot run
code on the server.
"""

from tiered.query.spark_source import RocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
