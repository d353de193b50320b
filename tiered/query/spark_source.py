"""The ``rocketmq`` Spark data source (pyspark >= 4.1 Python DataSource API).

::

    df = (spark.read.format("rocketmq")   # registered by pyspark_rocketmq, or register(spark)
          .option("endpoint", "http://minio:9000")          # S3-compatible endpoint
          .option("topics", "Orders,%DLQ%billing")
          .option("startTime", "2024-05-01T00:00:00Z")
          .load("s3://bucket/archive"))
    df = load(spark, "s3://bucket/archive", endpoint="http://minio:9000")  # registers, then loads

The URL is a cold-tier root (``s3://bucket/prefix``, ``file:///path``).
Every cluster and broker under it is read unless ``cluster`` / ``broker``
name some (comma-separated). Schema and derived columns:
``tiered.query.spark_schema``.

Options (case-insensitive):

============================  ===============================================
``endpoint``, ``region``      S3 endpoint URL and region (default: the
                              standard AWS settings of the executors)
``access_key_id``,            credentials; they travel to the executors with
``secret_access_key``,        the plan and are never logged or shown (prefer
``session_token``             the executors' own AWS settings where possible)
``addressing``                ``auto`` | ``path`` | ``virtual``
``checksum_mode``             ``when_supported`` | ``when_required``
``s3fs.NAME``                 passed to ``s3fs.S3FileSystem`` as NAME (JSON
                              values are parsed: ``s3fs.anon=true``)
``cluster``, ``broker``       only these (comma-separated)
``topics``, ``queues``        only these topics / queue ids (comma-separated)
``startTime``, ``endTime``    store time range [start, end): ISO 8601 or epoch
                              ms; rows outside are dropped
``skipCorrupt``               ``true``: skip and count corrupt records (a body
                              that does not decompress too) or unreadable
                              objects instead of failing the query; each skip
                              is logged with object and offset, and counted
                              in ``statsPath``
``verifyCrc``                 ``false``: do not check body CRCs (faster)
``narrowTime``                ``false``: a store-time range prunes whole
                              segments only, never inside one (for archives
                              written across a broker clock step back: the
                              search inside a segment assumes store times
                              grow with queue offsets)
``maxPartitionBytes``         largest input partition (default 128 MiB);
                              larger segments are split
``openCostInBytes``           cost of one more segment in a partition when
                              packing small segments together (default 4 MiB)
``key``                       only records whose KEYS hold it or whose
                              UNIQ_KEY is it: the segments' bloom filters and
                              key indexes pick the records to read
``decompress``                ``false``: ``body`` holds the bytes as stored
                              (default: bodies a producer compressed, sys_flag
                              bit 0, are decompressed as consumers see them)
``statsPath``                 a directory on the executors: each partition
                              appends a JSON line with its object-store
                              requests, bytes, rows and skipped records
``columns``                   the DataFrame's columns (comma-separated; as
                              ``.schema(...)`` with a subset of the schema):
                              only these are decoded. ``body`` unnamed: no
                              body byte is copied or CRC-checked. Queue
                              columns only (``cluster``, ``broker``,
                              ``topic``, ``queue_id``, ``queue_offset``), or
                              none (``.schema(StructType([]))``): the rows
                              come from the manifests, no object is read
``msgId``                     a message id: the broker's offset id (32 hex
                              digits, 56 for an IPv6 store host; found by a
                              binary search of each queue's record headers)
                              or the client's UNIQ_KEY id (key indexes)
============================  ===============================================

An unknown option is an error listing the valid ones; so is an option value
of the wrong type, and a URL with no archive under it.

Pruning comes from the options (``cluster``, ``broker``, ``topics``,
``queues``, ``startTime``/``endTime``): the catalog and the manifests drop
queues and segments before any data is read, a time range narrows the read
inside a segment, ``key`` reads only the records a key index lists and
``msgId`` one record. Columns come from the declared schema (``columns`` or
``.schema(...)``): Spark 4.1-4.3 give a Python source neither the columns a
query uses nor its aggregates (``PythonScanBuilder`` pushes filters only, and
``reader(schema)`` always gets the whole declared schema), so a ``count(*)``
over ``load(url)`` decodes every column. Filters in the query (``WHERE topic = ...``) are
applied by Spark to the rows, exactly, but do not prune: Spark 4.1-4.3 keep
the plan a Python source produces for pushed filters on the loaded relation,
shared by every scan of it (both sides of a self-join, every subquery, CTE
reference and thread), so a plan pruned for one scan's filters would be read
by another. Every scan of one loaded DataFrame therefore plans the same
thing, from its options alone, and every query shape is exact. To read less,
load with options (one ``load()`` per selection is cheap: planning reads the
catalog and the manifests only).

The data source, its reader and its partitions pickle to plain data (URL,
options, segment descriptors); the object store is built inside ``read()``
on the executor, once per Python worker. Nothing depends on driver state.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from tiered.query.columnar import BatchDecoder, QueueInfo
from tiered.config import parse_size
from tiered.errors import NoArchiveError, OptionError
from tiered.query.reader import Archive, ReadStats
from tiered.query.msgid import MessageId, locate, parse_message_id
from tiered.query.scan import (DEFAULT_SLICE_BYTES, METADATA_COLUMNS, Bounds, ScanSpec, Slice, SliceResult,
                               metadata_batches, plan, read_slice)
from tiered.query.spark_schema import COLUMN_NAMES, arrow_schema, spark_schema
from tiered.archive.storage import ObjectStore, S3Options, open_store
from tiered.timeparse import parse_time_ms

log = logging.getLogger(__name__)

NAME = "rocketmq"
DEFAULT_OPEN_COST = 4 << 20
# Arrow bytes a row answered from the manifests costs (a queue offset and a
# share of a topic string): partitions of such scans are sized by it
METADATA_ROW_BYTES = 16
# Every option the source takes (lower case: Spark's options are case-insensitive),
# with the spelling the docs use; ``s3fs.NAME`` options are passed through.
OPTIONS = ("path", "endpoint", "endpoint_url", "region", "access_key_id", "secret_access_key", "session_token",
           "addressing", "checksum_mode", "cluster", "broker", "topics", "queues", "startTime", "endTime",
           "skipCorrupt", "verifyCrc", "narrowTime", "maxPartitionBytes", "openCostInBytes", "statsPath",
           "decompress", "key", "msgId", "columns")
_KNOWN = {o.lower() for o in OPTIONS} | {"paths"}


def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    value = options.get(name.lower())
    if value is None:
        return default
    v = str(value).strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise OptionError(f"option {name}: expected true or false")


def _list(options: dict[str, str], name: str) -> list[str] | None:
    value = options.get(name.lower())
    if value is None or not str(value).strip():
        return None
    return [v.strip() for v in str(value).split(",") if v.strip()]


@dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """Everything the reader needs, parsed once from the options: plain data."""

    url: str
    s3: S3Options
    spec: ScanSpec  # from the options alone
    option_store_us: Bounds  # startTime/endTime: filtered exactly
    skip_corrupt: bool = False
    verify_crc: bool = True
    max_partition_bytes: int = DEFAULT_SLICE_BYTES
    open_cost: int = DEFAULT_OPEN_COST
    narrow_time: bool = True
    decompress: bool = True
    stats_path: str | None = None
    key: str | None = None
    msg_id: MessageId | None = None
    columns: tuple[str, ...] | None = None  # the ``columns`` option: the DataFrame's schema

    @classmethod
    def from_options(cls, options: Any) -> SourceConfig:
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        unknown = sorted(k for k in opts if k not in _KNOWN and not k.startswith("s3fs."))
        if unknown:
            raise OptionError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                              f"the rocketmq source takes: {', '.join(o for o in OPTIONS if o != 'path')}, s3fs.NAME")
        url = opts.get("path")
        if not url and opts.get("paths"):
            paths = json.loads(opts["paths"])
            if len(paths) != 1:
                raise OptionError("load() takes one cold-tier URL")
            url = paths[0]
        if not url:
            raise OptionError("no cold-tier URL: spark.read.format('rocketmq').load('s3://bucket/prefix')")
        extra: list[tuple[str, Any]] = []
        for k, v in opts.items():
            if k.startswith("s3fs."):
                try:
                    parsed = json.loads(v)
                except (TypeError, ValueError):
                    parsed = v
                extra.append((k[5:], parsed))
        addressing = opts.get("addressing", "auto")
        if addressing not in ("auto", "path", "virtual"):
            raise OptionError("option addressing: auto, path or virtual")
        checksum_mode = opts.get("checksum_mode", "when_supported")
        if checksum_mode not in ("when_supported", "when_required"):
            raise OptionError("option checksum_mode: when_supported or when_required")
        s3 = S3Options(
            endpoint_url=opts.get("endpoint") or opts.get("endpoint_url"), region=opts.get("region"),
            addressing=addressing, checksum_mode=checksum_mode,
            access_key_id=opts.get("access_key_id"), secret_access_key=opts.get("secret_access_key"),
            session_token=opts.get("session_token"), extra=tuple(sorted(extra)),
        )
        spec = ScanSpec()
        for opt, attr in (("cluster", "clusters"), ("broker", "brokers"), ("topics", "topics")):
            values = _list(opts, opt)
            if values is not None:
                spec = spec.with_set(attr, frozenset(values))
        queues = _list(opts, "queues")
        if queues is not None:
            try:
                spec = spec.with_set("queue_ids", frozenset(int(q) for q in queues))
            except ValueError:
                raise OptionError("option queues: comma-separated queue ids") from None
        bounds = Bounds()
        try:
            if opts.get("starttime"):
                bounds = bounds.and_(lo=parse_time_ms(opts["starttime"]) * 1000)
            if opts.get("endtime"):
                bounds = bounds.and_(hi=parse_time_ms(opts["endtime"]) * 1000 - 1)
        except ValueError as exc:
            raise OptionError(f"option startTime/endTime: {exc}") from None
        spec = replace(spec, store_us=bounds)
        sizes = {}
        for name, default in (("maxPartitionBytes", DEFAULT_SLICE_BYTES), ("openCostInBytes", DEFAULT_OPEN_COST)):
            try:
                sizes[name] = parse_size(opts.get(name.lower(), default))
            except (TypeError, ValueError) as exc:
                raise OptionError(f"option {name}: a size such as 64MiB ({exc})") from None
        max_bytes, open_cost = sizes["maxPartitionBytes"], sizes["openCostInBytes"]
        if max_bytes <= 0:
            raise OptionError("option maxPartitionBytes: must be positive")
        return cls(url=url, s3=s3, spec=spec, option_store_us=bounds, msg_id=_msg_id(opts),
                   columns=_column_list(opts),
                   skip_corrupt=_flag(opts, "skipCorrupt", False), verify_crc=_flag(opts, "verifyCrc", True),
                   max_partition_bytes=max_bytes, open_cost=open_cost, narrow_time=_flag(opts, "narrowTime", True),
                   decompress=_flag(opts, "decompress", True), stats_path=opts.get("statspath"),
                   key=opts.get("key") or None)

    def __repr__(self) -> str:  # the S3Options repr hides secrets; keep it that way
        return f"SourceConfig(url={self.url!r}, spec={self.spec!r})"


# --- stores, once per Python worker -----------------------------------------------

_STORES: dict[tuple[str, S3Options], ObjectStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(url: str, s3: S3Options) -> ObjectStore:
    key = (url, s3)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = open_store(url, s3=s3)
        return store


# --- partitions ---------------------------------------------------------------------


class SlicesPartition(InputPartition):
    """One input partition: slices of segments (one segment, part of a large
    one, or several small ones packed together)."""

    def __init__(self, index: int, slices: list[Slice]) -> None:
        super().__init__(index)
        self.index = index
        self.slices = slices

    def __repr__(self) -> str:
        return f"SlicesPartition({self.index}, {len(self.slices)} slices: {', '.join(map(str, self.slices[:3]))})"


def read_estimate(sl: Slice, store_us: Bounds) -> int:
    """Bytes a read of ``sl`` is expected to fetch: all of it, or with a
    store-time range narrowing inside it, the share of its time span the
    range covers (times taken as evenly spread: an estimate for packing only)."""
    if store_us.unbounded:
        return sl.est_bytes
    lo, hi = sl.min_store_ms * 1000, sl.max_store_ms * 1000 + 999
    a = lo if store_us.lo is None else max(lo, store_us.lo)
    b = hi if store_us.hi is None else min(hi, store_us.hi)
    return sl.est_bytes * max(0, b - a + 1) // max(1, hi - lo + 1)


def pack(slices: list[Slice], max_bytes: int, open_cost: int,
         store_us: Bounds | None = None) -> list[list[Slice]]:
    """Consecutive slices packed into groups of at most ``max_bytes`` (each
    slice costing at least ``open_cost``). A store-time range counts only the
    bytes it will read: a Python task costs Spark about 0.1 s whatever it
    reads, so one hour of a day is a few partitions, not one per segment."""
    groups: list[list[Slice]] = []
    current: list[Slice] = []
    size = 0
    for sl in slices:
        est = read_estimate(sl, store_us or Bounds())
        cost = max(est, open_cost) if open_cost else est
        if current and size + cost > max_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(sl)
        size += cost
    if current:
        groups.append(current)
    return groups


def pack_rows(slices: list[Slice], max_rows: int) -> list[list[Slice]]:
    """Consecutive slices packed into groups of at most ``max_rows`` messages
    (for scans answered from the manifests, which read no object)."""
    groups: list[list[Slice]] = []
    rows = 0
    for sl in slices:
        if not groups or rows + sl.messages > max_rows:
            groups.append([])
            rows = 0
        groups[-1].append(sl)
        rows += sl.messages
    return groups


# --- the reader ---------------------------------------------------------------------


def _msg_id(opts: dict[str, str]) -> MessageId | None:
    if not opts.get("msgid"):
        return None
    try:
        msg_id = parse_message_id(opts["msgid"])
    except ValueError as exc:
        raise OptionError(f"option msgId: {exc}") from None
    if opts.get("key"):
        raise OptionError("options key and msgId: give one of them")
    return msg_id


def _column_list(opts: dict[str, str]) -> tuple[str, ...] | None:
    """The ``columns`` option: the DataFrame holds only these columns (in this
    order), so a scan decodes only them (Spark 4.1-4.3 never tell a Python
    source which columns a query uses: the module docstring)."""
    names = _list(opts, "columns")
    if names is None:
        return None
    unknown = [n for n in names if n not in COLUMN_NAMES]
    if unknown:
        raise OptionError(f"option columns: unknown column{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                          f"the rocketmq source has: {', '.join(COLUMN_NAMES)}")
    if len(set(names)) != len(names):
        raise OptionError("option columns: a column is named twice")
    return tuple(names)


def _columns(schema: Any) -> tuple[str, ...]:
    """The requested columns: the full schema, or a subset of it given with
    ``.schema(...)`` (same names and types) to decode only those."""
    names = tuple(f.name for f in schema.fields)
    full = spark_schema()
    by_name = {f.name: f for f in full.fields}
    for f in schema.fields:
        known = by_name.get(f.name)
        if known is None:
            raise OptionError(f"unknown column {f.name!r}; the rocketmq source has: {', '.join(COLUMN_NAMES)}")
        if known.dataType != f.dataType:
            raise OptionError(f"column {f.name!r} is {known.dataType.simpleString()}, "
                              f"not {f.dataType.simpleString()}")
    return names


class RocketMQReader(DataSourceReader):
    """Plans from the options alone (see the module docstring: a plan that
    depended on one scan's filters would be read by other scans of the same
    relation) and holds no state a scan could leave behind: each ``plan()``
    builds its own ``Archive`` (catalog and manifest caches)."""

    def __init__(self, config: SourceConfig, columns: tuple[str, ...]) -> None:
        self.config = config
        self.columns = columns
        # Columns the manifests know (or none: count(*)) need no data read,
        # unless rows are filtered (time range, key, message id) or corrupt
        # records are to be skipped (that needs the records read and checked).
        self.from_manifests = (set(columns) <= METADATA_COLUMNS and config.key is None and config.msg_id is None
                               and config.option_store_us.unbounded and not config.skip_corrupt)

    def _read_records(self, store: ObjectStore, slices: list[Slice], stats: ReadStats,
                      result: SliceResult) -> Iterator[pa.RecordBatch]:
        """The slices' records decoded into ``self.columns`` (plus what a key
        or message-id filter needs, dropped after it)."""
        cfg = self.config
        columns = self.columns
        need: tuple[str, ...] = ()
        key, mid = cfg.key, cfg.msg_id
        match: Callable[[pa.RecordBatch], Any] | None = None
        if key is not None:
            need = ("keys", "unique_key")
            match = lambda batch: key_mask(batch, key)  # noqa: E731
        elif mid is not None:
            need = ("unique_key", "commitlog_offset", "store_host")
            match = lambda batch: msg_id_mask(batch, mid)  # noqa: E731
        columns += tuple(c for c in need if c not in columns)
        for sl in slices:
            decoder = BatchDecoder(QueueInfo(sl.cluster, sl.broker, sl.topic, sl.queue_id), columns,
                                   verify_crc=cfg.verify_crc, skip_corrupt=cfg.skip_corrupt,
                                   decompress=cfg.decompress)
            batches = read_slice(store, sl, decoder, store_us=cfg.spec.store_us if cfg.narrow_time else Bounds(),
                                 exact_store_us=cfg.option_store_us, stats=stats, result=result,
                                 narrow=cfg.narrow_time)
            if match is None:
                yield from batches
                continue
            for batch in batches:
                batch = batch.filter(match(batch)).select(list(self.columns))
                if batch.num_rows:
                    yield batch

    def plan(self) -> tuple[list[SlicesPartition], Any]:
        store = store_for(self.config.url, self.config.s3)
        spec = self.config.spec
        clusters, brokers = spec.clusters, spec.brokers
        skip = self.config.skip_corrupt
        if clusters is not None and brokers is not None and len(clusters) == 1 and len(brokers) == 1:
            archive = Archive(store, brokers=[(next(iter(clusters)), next(iter(brokers)))], skip_corrupt=skip)
        else:
            archive = Archive(store, cluster=next(iter(clusters)) if clusters and len(clusters) == 1 else None,
                              broker=next(iter(brokers)) if brokers and len(brokers) == 1 else None,
                              skip_corrupt=skip)
        if not archive.brokers:
            raise NoArchiveError(f"no archive at {self.config.url}"
                                 + (f" for cluster {sorted(clusters)}" if clusters else "")
                                 + (f" broker {sorted(brokers)}" if brokers else "")
                                 + ": no <cluster>/<broker>/ prefixes under it")
        if self.config.msg_id is not None:
            p = self._plan_msg_id(archive, self.config.msg_id)
        else:
            p = plan(archive, spec, max_slice_bytes=self.config.max_partition_bytes, key=self.config.key)
        if self.from_manifests:  # nothing read: a partition costs only the rows it emits
            groups = pack_rows(p.slices, max(1, self.config.max_partition_bytes // METADATA_ROW_BYTES))
        else:
            groups = pack(p.slices, self.config.max_partition_bytes, self.config.open_cost,
                          spec.store_us if self.config.narrow_time else Bounds())
        return [SlicesPartition(i, g) for i, g in enumerate(groups)], p

    def _plan_msg_id(self, archive: Archive, mid: MessageId) -> Any:
        """The slices that may hold message id ``mid``: as an offset id, a
        binary search of each queue (``tiered.query.msgid``); as a client id
        (UNIQ_KEY), the key indexes. Each record once; ``read`` keeps the rows
        that match exactly."""
        cfg = self.config
        found = plan(archive, cfg.spec, max_slice_bytes=cfg.max_partition_bytes, key=mid.text)
        slices = list(found.slices)
        offset = mid.physical_offset
        if mid.is_offset_id and offset is not None:
            whole = plan(archive, cfg.spec, max_slice_bytes=cfg.max_partition_bytes)
            by_queue: dict[Any, list[Slice]] = {}
            for sl in whole.slices:
                by_queue.setdefault(sl.ref, []).append(sl)
            with ThreadPoolExecutor(8, thread_name_prefix="tiered-msgid") as pool:
                located = pool.map(lambda q: locate(archive.store, q, offset), by_queue.values())
                slices += [sl for group in located for sl in group]
        seen: set[tuple[Any, int, int]] = set()
        unique = []
        for sl in slices:
            if (sl.ref, sl.q_start, sl.q_end) not in seen:
                seen.add((sl.ref, sl.q_start, sl.q_end))
                unique.append(sl)
        return replace(found, slices=unique)

    def partitions(self) -> list[InputPartition]:
        parts, p = self.plan()
        log.info("rocketmq scan: %d partitions, %d slices of %d/%d segments of %d queues", len(parts),
                 len(p.slices), p.segments_kept, p.segments, p.queues)
        return list(parts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SlicesPartition):
            return  # the empty plan: Spark's single InputPartition(None)
        cfg = self.config
        stats = ReadStats()
        result = SliceResult()
        started = time.perf_counter()
        if self.from_manifests:  # no object-store request at all
            for sl in partition.slices:
                result.rows += sl.messages
                yield from metadata_batches(sl, self.columns)
        else:
            yield from self._read_records(store_for(cfg.url, cfg.s3), partition.slices, stats, result)
        if result.skipped:
            log.warning("rocketmq partition %d: skipped %d corrupt records: %s", partition.index, result.skipped,
                        "; ".join(result.problems[:3]))
        if cfg.stats_path:
            _write_stats(cfg.stats_path, {
                "partition": partition.index, "slices": [str(s) for s in partition.slices],
                "requests": stats.gets, "bytes": stats.bytes, "rows": result.rows, "skipped": result.skipped,
                "problems": result.problems[:10], "seconds": round(time.perf_counter() - started, 4)})


def msg_id_mask(batch: pa.RecordBatch, mid: MessageId) -> pa.Array:
    """Rows whose client id (UNIQ_KEY) is ``mid`` or, for an offset id, whose
    store host and CommitLog offset are the ones it encodes."""
    mask = pc.fill_null(pc.equal(batch.column("unique_key"), mid.text), False)
    if mid.is_offset_id:
        at = pc.and_(pc.equal(batch.column("commitlog_offset"), mid.physical_offset),
                     pc.equal(batch.column("store_host"), str(mid.store_host)))
        mask = pc.or_(mask, pc.fill_null(at, False))
    return mask


def key_mask(batch: pa.RecordBatch, key: str) -> pa.Array:
    """Rows whose ``keys`` hold ``key`` or whose ``unique_key`` is ``key`` (the
    key index may point at hash collisions: they stop here)."""
    keys = batch.column("keys")
    hit_rows = pc.filter(pc.list_parent_indices(keys), pc.equal(pc.list_flatten(keys), key))
    in_keys = pc.is_in(pa.array(range(batch.num_rows), pa.int64()), value_set=hit_rows.cast(pa.int64()))
    return pc.or_(in_keys, pc.fill_null(pc.equal(batch.column("unique_key"), key), False))


def _write_stats(path: str, doc: dict[str, Any]) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(doc) + "\n")
    except OSError as exc:
        log.warning("cannot write scan stats to %s: %s", path, exc)


class RocketMQDataSource(DataSource):
    """``spark.read.format("rocketmq").load(URL)``: archived RocketMQ messages."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> Any:
        # Spark asks for the schema at load(): options are checked there, so a
        # misspelt or ill-typed option fails the load, not a later action
        config = SourceConfig.from_options(self.options)
        return spark_schema(config.columns or COLUMN_NAMES)

    def reader(self, schema: Any) -> DataSourceReader:
        return RocketMQReader(SourceConfig.from_options(self.options), _columns(schema))


def register(spark: Any) -> None:
    """Register the ``rocketmq`` format on a session."""
    spark.dataSource.register(RocketMQDataSource)


def load(spark: Any, url: str, **options: str) -> Any:
    """``spark.read.format("rocketmq").options(**options).load(url)``, registered."""
    register(spark)
    return spark.read.format(NAME).options(**options).load(url)


def plan_partitions(options: dict[str, str], schema: Any = None) -> tuple[list[SlicesPartition], Any]:
    """Plan a scan as Spark would, without Spark: (partitions, plan). For
    tests and tools that check pruning."""
    reader = RocketMQDataSource(options).reader(schema or spark_schema())
    assert isinstance(reader, RocketMQReader)
    return reader.plan()


__all__ = ["NAME", "NoArchiveError", "OptionError", "RocketMQDataSource", "SourceConfig", "arrow_schema", "load",
           "plan_partitions", "register"]
