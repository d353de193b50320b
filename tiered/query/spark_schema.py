"""The columns of an archived message, as Spark and Arrow see them.

One row per archived record. Times are UTC instants (Spark ``TimestampType``,
Arrow ``timestamp[us, tz=UTC]``) made from the broker's millisecond stamps.

Derived columns, and where they come from:

- ``tags``, ``keys``, ``unique_key``: the ``TAGS``, ``KEYS`` (split on
  spaces, empty entries dropped; ``[]`` when absent) and ``UNIQ_KEY``
  properties, as ``tiered inspect --json`` shows them.
- ``delay_level``: the ``DELAY`` property as an int (null when absent or not
  a number).
- ``real_topic``: the business topic the message belongs to: the first of
  ``RETRY_TOPIC`` (retry and dead-letter messages: the topic they were first
  sent to), ``DLQ_ORIGIN_TOPIC``, ``REAL_TOPIC`` (delayed and transactional
  messages parked in a system topic) that is set, else ``topic`` itself. So
  ``WHERE real_topic = 'Orders'`` finds a message wherever it ended up.
- ``cluster``, ``broker``: the first two levels of the cold-tier key; a
  queue is identified by (broker, topic, queue_id).

``body_crc`` is the CRC the broker stored (zlib CRC32 of the body masked
with 0x7FFFFFFF); the reader checks it against the body unless told not to.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

# (name, arrow type); the Spark type follows from it (see spark_schema()).
_STR = pa.string()
_MAP = pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string()))
TIMESTAMP = pa.timestamp("us", tz="UTC")

COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("topic", _STR),
    ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()),
    ("commitlog_offset", pa.int64()),
    ("born_timestamp", TIMESTAMP),
    ("store_timestamp", TIMESTAMP),
    ("born_host", _STR),
    ("store_host", _STR),
    ("sys_flag", pa.int32()),
    ("flag", pa.int32()),
    ("reconsume_times", pa.int32()),
    ("tags", _STR),
    ("keys", pa.list_(pa.field("element", _STR))),
    ("unique_key", _STR),
    ("properties", _MAP),
    ("body", pa.binary()),
    ("body_crc", pa.int32()),
    ("delay_level", pa.int32()),
    ("real_topic", _STR),
    ("cluster", _STR),
    ("broker", _STR),
)
COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in COLUMNS)
ARROW_TYPES: dict[str, pa.DataType] = dict(COLUMNS)

# Columns filters can prune on (through the catalog, the manifests, the segments).
PRUNABLE = frozenset({"cluster", "broker", "topic", "queue_id", "queue_offset", "store_timestamp", "born_timestamp"})


def arrow_schema(columns: tuple[str, ...] | list[str] = COLUMN_NAMES) -> pa.Schema:
    """The Arrow schema Spark expects for ``columns`` (every field nullable,
    as in the Spark schema)."""
    return pa.schema([pa.field(name, ARROW_TYPES[name]) for name in columns])


def spark_schema(columns: tuple[str, ...] | list[str] = COLUMN_NAMES) -> Any:
    """The Spark ``StructType`` (built from objects: parsing DDL needs a JVM,
    which a Python worker does not have)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    spark_types = {
        _STR: StringType(), pa.int32(): IntegerType(), pa.int64(): LongType(), TIMESTAMP: TimestampType(),
        pa.binary(): BinaryType(),
    }

    def convert(t: pa.DataType) -> Any:
        if isinstance(t, pa.MapType):
            return MapType(StringType(), StringType(), valueContainsNull=True)
        if isinstance(t, pa.ListType):
            return ArrayType(StringType(), containsNull=True)
        return spark_types[t]

    return StructType([StructField(name, convert(ARROW_TYPES[name]), nullable=True) for name in columns])
