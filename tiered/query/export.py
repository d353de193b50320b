"""Incremental, idempotent export of the archive to Parquet.

Layout under the target URL (Hive style, what Spark, Trino and pyarrow
datasets read as partitions ``topic`` and ``date``)::

    {to}/_tiered_export.json                       state: exported offset per queue, pending run
    {to}/topic={topic}/date={YYYY-MM-DD}/{cluster}.{broker}.{queueId}.{qStart:020d}-{qEnd:020d}.parquet

``date`` is the UTC date of the store time; ``topic`` lives in the path only
(as Spark writes partition columns); every other column of
``tiered.query.spark_schema`` is in the files.

A run is a plan, then execution, then one commit:

1. The state names, per queue, the first queue offset not yet exported. The
   run plans tasks covering [that offset, the manifest's end) of every queue
   (whole segments, split when large) and writes them into the state as the
   *pending* run before writing any data.
2. Each task writes one file per date under a name fixed by its queue and
   offset range, so doing a task again writes the same names with the same
   rows: nothing is ever duplicated, however often a task runs.
3. The state is replaced (conditionally on its ETag: one export at a time)
   with the new offsets and no pending run.

A killed run leaves a pending run; the next run does exactly those tasks
again first (overwriting whatever files they had written), then commits,
then plans anything newer. A pending task whose segment is gone from the
archive (expired or merged away meanwhile) has its possible files deleted
and is re-planned from the current manifest.
"""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tiered.query.columnar import BatchDecoder, QueueInfo
from tiered.errors import ExportError, ObjectNotFoundError, PreconditionFailedError
from tiered.query.reader import Archive, QueueRef, ReadStats
from tiered.query.scan import DEFAULT_SLICE_BYTES, Slice, SliceResult, manifest_slices, read_slice
from tiered.query.spark_schema import COLUMN_NAMES
from tiered.archive.storage import ObjectStore

log = logging.getLogger(__name__)

STATE = "_tiered_export.json"
FORMAT_VERSION = "1.0"
FILE_COLUMNS = tuple(c for c in COLUMN_NAMES if c != "topic")
_DAY_US = 86_400_000_000

# Spark's ExternalCatalogUtils.escapePathName: these become %XX in partition paths.
_ESCAPE = set(chr(c) for c in range(0x01, 0x20)) | set('"#%\'*/:=?\\\x7f{[]^')


def escape_path_name(value: str) -> str:
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPE else ch for ch in value)


def _day(us: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=us)).date().isoformat()


def file_key(sl: Slice, day: str) -> str:
    name = ".".join(escape_path_name(p) for p in (sl.cluster, sl.broker, str(sl.queue_id)))
    return (f"topic={escape_path_name(sl.topic)}/date={day}/"
            f"{name}.{sl.q_start:020d}-{sl.q_end:020d}.parquet")


def possible_keys(sl: Slice) -> list[str]:
    """Every file a task may have written: one per date of its segment's
    store-time range."""
    first = datetime.fromtimestamp(sl.min_store_ms / 1000, tz=timezone.utc).date()
    last = datetime.fromtimestamp(sl.max_store_ms / 1000, tz=timezone.utc).date()
    days = min((last - first).days, 366 * 5)
    return [file_key(sl, (first + timedelta(days=d)).isoformat()) for d in range(days + 1)]


def slice_to_dict(sl: Slice) -> dict[str, Any]:
    return asdict(sl)


def slice_from_dict(d: dict[str, Any]) -> Slice:
    return Slice(**d)


# --- one task ---------------------------------------------------------------------


@dataclass
class TaskResult:
    files: list[str] = field(default_factory=list)
    rows: int = 0
    skipped: int = 0
    bytes_read: int = 0
    problems: list[str] = field(default_factory=list)
    missing: bool = False  # the segment is gone from the archive


@dataclass(frozen=True)
class TaskContext:
    """What a task needs besides its slice: picklable (stores pickle without clients)."""

    cold: ObjectStore
    target: ObjectStore
    skip_corrupt: bool = False
    verify_crc: bool = True
    compression: str = "snappy"
    row_group_rows: int = 128 * 1024


def run_task(ctx: TaskContext, slice_doc: dict[str, Any]) -> dict[str, Any]:
    """Export one slice: read it, write one Parquet file per date. Runs in a
    worker process or on a Spark executor; returns a plain dict."""
    sl = slice_from_dict(slice_doc)
    out = TaskResult()
    decoder = BatchDecoder(QueueInfo(sl.cluster, sl.broker, sl.topic, sl.queue_id), FILE_COLUMNS,
                           verify_crc=ctx.verify_crc, skip_corrupt=ctx.skip_corrupt)
    stats = ReadStats()
    result = SliceResult()
    writers: dict[str, tuple[io.BytesIO, pq.ParquetWriter]] = {}
    schema = decoder.schema
    try:
        for batch in read_slice(ctx.cold, sl, decoder, stats=stats, result=result):
            ts = batch.column("store_timestamp")
            days = _days(ts)
            for day in pc.unique(days).to_pylist():
                part = batch.filter(pc.equal(days, day))
                if day not in writers:
                    buf = io.BytesIO()
                    writers[day] = (buf, pq.ParquetWriter(buf, schema, compression=ctx.compression))
                writers[day][1].write_batch(part, row_group_size=ctx.row_group_rows)
    except ObjectNotFoundError as exc:
        out.missing = True
        out.problems.append(str(exc))
        return asdict(out)
    for day, (buf, writer) in sorted(writers.items()):
        writer.close()
        key = file_key(sl, day)
        ctx.target.put(key, buf.getvalue())
        out.files.append(key)
    out.rows = result.rows
    out.skipped = result.skipped
    out.problems = result.problems[:10]
    out.bytes_read = stats.bytes
    return asdict(out)


def _days(ts: pa.Array) -> pa.Array:
    """UTC dates of timestamps as YYYY-MM-DD strings."""
    us = ts.cast(pa.int64())
    return pc.divide(us, _DAY_US).cast(pa.int32()).cast(pa.date32()).cast(pa.string())


# --- the state ----------------------------------------------------------------------


@dataclass
class ExportState:
    queues: dict[str, int] = field(default_factory=dict)  # "cluster/broker/topic/qid" -> next offset to export
    pending: dict[str, Any] | None = None  # {"run": id, "tasks": [slice dicts], "targets": {queue: offset}}
    runs: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""  # the cold-tier URL exported (one archive per target)
    format_version: str = FORMAT_VERSION

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ExportState:
        d = json.loads(data)
        major = int(str(d.get("format_version", "1.0")).split(".")[0])
        if major > 1:
            raise ExportError(f"{STATE} written by a newer tiered (format {d['format_version']}): upgrade tiered")
        return cls(queues={k: int(v) for k, v in d.get("queues", {}).items()}, pending=d.get("pending"),
                   runs=list(d.get("runs", []))[-20:], source=str(d.get("source", "")),
                   format_version=d.get("format_version", FORMAT_VERSION))


def queue_id_str(ref: QueueRef) -> str:
    return f"{ref.cluster}/{ref.broker}/{ref.topic}/{ref.queue_id}"


class StateFile:
    """The export state, replaced only if nobody else replaced it meanwhile."""

    def __init__(self, target: ObjectStore) -> None:
        self.target = target
        self.etag: str | None = None

    def load(self) -> ExportState:
        try:
            data, self.etag = self.target.get_with_etag(STATE)
        except ObjectNotFoundError:
            self.etag = None
            return ExportState()
        try:
            return ExportState.from_bytes(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise ExportError(f"{STATE} is unreadable ({type(exc).__name__}); fix or remove it") from None

    def save(self, state: ExportState) -> None:
        try:
            if self.etag is None:
                self.etag = self.target.put_if_absent(STATE, state.to_bytes())
            else:
                self.etag = self.target.put_if_match(STATE, state.to_bytes(), self.etag)
        except PreconditionFailedError:
            raise ExportError(f"{STATE} changed under this run: another export is running on the same target")\
                from None


# --- a run --------------------------------------------------------------------------


@dataclass
class ExportReport:
    run: str = ""
    tasks: int = 0
    resumed_tasks: int = 0
    files: int = 0
    rows: int = 0
    skipped: int = 0
    bytes_read: int = 0
    expired_before_export: int = 0  # messages the archive dropped before they were exported
    queues: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


Executor = Callable[[TaskContext, list[dict[str, Any]]], list[dict[str, Any]]]


def run_local(parallelism: int) -> Executor:
    """Tasks in this process (parallelism 1) or in a pool of processes."""
    def execute(ctx: TaskContext, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if parallelism <= 1 or len(tasks) <= 1:
            return [run_task(ctx, t) for t in tasks]
        import multiprocessing

        with ProcessPoolExecutor(min(parallelism, len(tasks)), mp_context=multiprocessing.get_context("spawn")) as pool:
            return list(pool.map(run_task, [ctx] * len(tasks), tasks))
    return execute


def run_spark(spark: Any) -> Executor:
    """Tasks on Spark executors, one Spark task each."""
    def execute(ctx: TaskContext, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not tasks:
            return []
        rdd = spark.sparkContext.parallelize(tasks, len(tasks))
        return rdd.map(lambda t: run_task(ctx, t)).collect()
    return execute


class Exporter:
    def __init__(self, cold: ObjectStore, target: ObjectStore, *, archive: Archive | None = None,
                 topics: Callable[[str], bool] | None = None, skip_corrupt: bool = False, verify_crc: bool = True,
                 max_task_bytes: int = DEFAULT_SLICE_BYTES, compression: str = "snappy",
                 executor: Executor | None = None, on_tasks_done: Callable[[list[dict[str, Any]]], None] | None = None
                 ) -> None:
        self.cold = cold
        self.target = target
        self.archive = archive or Archive(cold)
        self.topics = topics
        self.ctx = TaskContext(cold, target, skip_corrupt=skip_corrupt, verify_crc=verify_crc, compression=compression)
        self.max_task_bytes = max_task_bytes
        self.executor = executor or run_local(1)
        self.on_tasks_done = on_tasks_done  # a hook between execution and commit (tests)
        self.state_file = StateFile(target)

    def _execute(self, tasks: list[dict[str, Any]], report: ExportReport) -> list[dict[str, Any]]:
        results = self.executor(self.ctx, tasks)
        for r in results:
            report.files += len(r["files"])
            report.rows += r["rows"]
            report.skipped += r["skipped"]
            report.bytes_read += r["bytes_read"]
            report.problems.extend(r["problems"][:3])
        if self.on_tasks_done is not None:
            self.on_tasks_done(results)
        return results

    def run(self) -> ExportReport:
        started = time.perf_counter()
        report = ExportReport()
        state = self.state_file.load()
        if state.source and state.source != self.cold.url:
            raise ExportError(f"the target holds an export of {state.source}, not of {self.cold.url}: "
                              f"export each archive to its own target")
        state.source = self.cold.url
        if state.pending:
            self._finish_pending(state, report)
        tasks, targets = self._plan(state, report)
        report.run = uuid.uuid4().hex[:12]
        report.tasks = len(tasks)
        if tasks or targets != {k: state.queues.get(k) for k in targets}:
            state.pending = {"run": report.run, "tasks": tasks, "targets": targets, "started_ms": int(time.time() * 1000)}
            self.state_file.save(state)  # before any file: a killed run is redone exactly
            results = self._execute(tasks, report)
            if any(r["missing"] for r in results):
                self._drop_missing(tasks, results, targets)
            self._commit(state, targets, report)
        report.seconds = time.perf_counter() - started
        return report

    def _finish_pending(self, state: ExportState, report: ExportReport) -> None:
        pending = state.pending or {}
        tasks = pending.get("tasks", [])
        targets = {k: int(v) for k, v in pending.get("targets", {}).items()}
        log.warning("export run %s did not finish: doing its %d tasks again", pending.get("run"), len(tasks))
        report.resumed_tasks = len(tasks)
        results = self._execute(tasks, report)
        if any(r["missing"] for r in results):
            self._drop_missing(tasks, results, targets)
        self._commit(state, targets, report)

    def _drop_missing(self, tasks: list[dict[str, Any]], results: list[dict[str, Any]],
                      targets: dict[str, int]) -> None:
        """Some tasks found their segment gone (expired or merged away since the
        plan). For each such queue, everything this run wrote from the first
        missing range on is deleted and the queue's export offset stays there:
        the next plan covers that range again from the current manifest."""
        first_missing: dict[str, int] = {}
        for t, r in zip(tasks, results):
            if r["missing"]:
                sl = slice_from_dict(t)
                q = queue_id_str(sl.ref)
                first_missing[q] = min(first_missing.get(q, sl.q_start), sl.q_start)
        keys: list[str] = []
        for t, r in zip(tasks, results):
            sl = slice_from_dict(t)
            q = queue_id_str(sl.ref)
            if q in first_missing and sl.q_start >= first_missing[q]:
                keys.extend(r["files"])
                keys.extend(possible_keys(sl))
        for q, start in first_missing.items():
            targets[q] = start
            log.warning("%s: archive segment from offset %d is gone; re-planning from there", q, start)
        self.target.delete_many(keys)
        self.archive.forget()

    def _commit(self, state: ExportState, targets: dict[str, int], report: ExportReport) -> None:
        state.queues.update(targets)
        state.pending = None
        state.runs = (state.runs + [{"run": report.run, "finished_ms": int(time.time() * 1000), "tasks": report.tasks,
                                     "rows": report.rows, "files": report.files, "skipped": report.skipped}])[-20:]
        self.state_file.save(state)

    def _plan(self, state: ExportState, report: ExportReport) -> tuple[list[dict[str, Any]], dict[str, int]]:
        refs = self.archive.queues(self.topics)
        manifests = self.archive.manifests(refs)
        report.queues = len(manifests)
        tasks: list[dict[str, Any]] = []
        targets: dict[str, int] = {}
        for ref, m in sorted(manifests.items()):
            q = queue_id_str(ref)
            start = state.queues.get(q)
            if start is None:
                start = m.first_offset
            if start >= m.next_offset:
                continue
            if start < m.first_offset:
                report.expired_before_export += m.first_offset - start
                log.warning("%s: offsets [%d,%d) left the archive before they were exported", q, start, m.first_offset)
            for sl in manifest_slices(ref, m, start, m.next_offset, self.max_task_bytes):
                tasks.append(slice_to_dict(sl))
            targets[q] = m.next_offset
        return tasks, targets


def export(cold: ObjectStore, target: ObjectStore, **kw: Any) -> ExportReport:
    return Exporter(cold, target, **kw).run()


def iter_files(target: ObjectStore) -> Iterable[str]:
    return [o.key for o in target.list_keys("") if o.key.endswith(".parquet")]
