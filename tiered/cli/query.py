"""``tiered cat``, ``tiered find``, ``tiered sql`` and ``tiered export``: query the archive.

They read the object store only (never a broker's disk). Without
``--cluster``/``--broker`` (flag, ``TIERED_*`` environment or config file)
every cluster and broker under the cold-tier root is read.
"""

from __future__ import annotations

import base64
import importlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import date, datetime
from typing import Annotated, Any, Optional

import typer

from tiered.cli.app import app, fail
from tiered.cli.common import BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, StoreOpt, WideOpt, settings_from
from tiered.cli.failures import fail_with
from tiered.cli.lookup import find_msg_id, follow, follow_topic, topic_records, window
from tiered.cli.output import Col, dumps, human_bytes, note, out, print_json, progress, progress_enabled, table
from tiered.config import parse_duration
from tiered.cli.wiring import archive_store, s3_options
from tiered.format.codec import Record, entry_offset
from tiered.format.lmq import is_lmq
from tiered.format.compression import BodyDecompressError, codec_name, decompress
from tiered.config import Settings
from tiered.errors import TieredError
from tiered.query import batchread
from tiered.query.reader import ColdReader, QueueRef, ReadStatus
from tiered.timeparse import format_time_ms, parse_time_ms

JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON object per record (the 'tiered inspect --json' fields).")]
BodyOpt = Annotated[bool, typer.Option("--body", help="Add the body to each record (text, or base64 when binary).")]
SkipOpt = Annotated[bool, typer.Option("--skip-corrupt", help="Skip and count corrupt archived records instead of stopping.")]
MasterOpt = Annotated[str, typer.Option("--master", help="Spark master (an active session is reused).")]


def _settings(config: Any, cold: str | None, cluster: str | None, broker: str | None) -> Settings:
    return settings_from(config, cold_url=cold, cluster=cluster, broker=broker)


def _scope(settings: Settings) -> tuple[str | None, str | None]:
    """Cluster and broker when given (flag, environment, file); None reads all."""
    given = settings.model_fields_set
    return (settings.cluster if "cluster" in given else None, settings.broker if "broker" in given else None)


def _reader(settings: Settings, *, skip_corrupt: bool = False) -> ColdReader:
    cluster, broker = _scope(settings)
    return ColdReader(archive_store(settings), cluster=cluster, broker=broker, skip_corrupt=skip_corrupt)


RawOpt = Annotated[bool, typer.Option("--raw-body", help="With --body: the bytes as stored, not decompressed.")]


def _shown_body(rec: Record, raw: bool) -> tuple[bytes, dict[str, str]]:
    """(body, notes): the body as a consumer receives it (producer compression
    undone) unless ``raw``; notes name the codec, or the error of a body that
    does not decompress (then the stored bytes are shown)."""
    stored = rec.body_bytes()
    codec = codec_name(rec.sys_flag)
    if raw or codec is None:
        return stored, {}
    try:
        return decompress(stored, rec.sys_flag), {"body_compression": codec}
    except BodyDecompressError as exc:
        return stored, {"body_compression": codec, "body_error": str(exc)}


def _record_json(rec: Record, with_body: bool, raw: bool = False, ref: QueueRef | None = None) -> str:
    d = rec.to_dict()
    if ref is not None and is_lmq(ref.topic) and d["topic"] != ref.topic:
        # a parent topic's record read through an LMQ queue: where it was read, as RocketMQ's read-back names it
        d.update(cq_topic=ref.topic, cq_queue_id=ref.queue_id, cq_offset=entry_offset(rec, ref.topic))
    if with_body:
        body, notes = _shown_body(rec, raw)
        d.update(notes)
        try:
            d["body"] = body.decode("utf-8")
            d["body_encoding"] = "utf-8"
        except UnicodeDecodeError:
            d["body"] = base64.b64encode(body).decode("ascii")
            d["body_encoding"] = "base64"
    return dumps(d)


def _record_line(ref: QueueRef, rec: Record, with_body: bool, *, show_broker: bool, raw: bool = False) -> str:
    d = rec.to_dict()
    where = f"{ref.cluster}/{ref.broker} " if show_broker else ""
    line = (f"{where}{ref.topic}/{ref.queue_id}@{entry_offset(rec, ref.topic)}  {format_time_ms(d['store_timestamp'])}  "
            f"tags={d['tags'] or '-'}  keys={','.join(d['keys']) or '-'}  uniq={d['unique_key'] or '-'}  "
            f"{d['body_length']} bytes")
    if with_body:
        body, notes = _shown_body(rec, raw)
        if "body_error" in notes:
            line += f"  [{notes['body_error']}; stored bytes follow]"
        elif notes:
            line += f"  [{notes['body_compression']}]"
        try:
            line += "  " + body.decode("utf-8")
        except UnicodeDecodeError:
            line += "  base64:" + base64.b64encode(body).decode("ascii")
    return line


def _report_skipped(reader: ColdReader) -> None:
    if reader.skipped:
        note(f"skipped {reader.skipped} corrupt or missing archived records")
        for problem in reader.problems[:5]:
            note(f"  {problem}")


def _time_flag(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_time_ms(value)
    except ValueError as exc:
        fail(f"{name}: {exc}", 2)


@app.command()
def cat(
    topic: Annotated[str, typer.Option("--topic", help="Topic.")],
    queue: Annotated[Optional[int], typer.Option("--queue", help="Only this queue id (default: every archived queue of the topic, merged by store time).")] = None,
    offset: Annotated[Optional[int], typer.Option("--offset", min=0, help="With --queue: first queue offset (default: the first archived).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", "--count", min=0, help="At most this many records (default: to the end).")] = None,
    since: Annotated[Optional[str], typer.Option("--since", help="From the first record stored at or after this time (ISO 8601 or epoch ms).")] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="Up to the last record stored before this time.")] = None,
    last: Annotated[Optional[int], typer.Option("--last", min=0, help="The last N archived records.")] = None,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing newly archived records (Ctrl-C ends).")] = False,
    interval: Annotated[str, typer.Option("--interval", help="With --follow: how often to look for new records.")] = "2s",
    as_json: JsonOpt = False,
    body: BodyOpt = False,
    raw_body: RawOpt = False,
    skip_corrupt: SkipOpt = False,
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
    group: Annotated[Optional[str], typer.Option("--group", help="From this consumer group's committed offsets (needs the store): archive first, then local.")] = None,
    store: StoreOpt = None,
) -> None:
    """Print archived records of a topic (every queue, merged by store time) or of one --queue: from a store
    time (--since/--until), the --last N, an --offset (with --queue); --follow.
    With --group: that group's records of the topic from its committed offsets, archive first, then local."""
    if group is not None:
        from tiered.cli.consumers import cat_group_command

        cat_group_command(settings_from(config, cold_url=cold, cluster=cluster, broker=broker, store=store),
                          _reader, group=group, topic=topic, queue=queue, count=limit, skip_corrupt=skip_corrupt,
                          emit=lambda ref, rec, _src: out(
                              _record_json(rec, body, raw_body, ref) if as_json
                              else _record_line(ref, rec, body, show_broker=False, raw=raw_body)))
        return
    if offset is not None and queue is None:
        fail("--offset needs --queue (offsets are per queue)", 2)
    if sum(x is not None for x in (offset, since, last)) > 1:
        fail("give at most one of --offset, --since, --last", 2)
    if follow_ and (until is not None or limit is not None):
        fail("--follow reads to the end and waits: it takes no --until or --limit", 2)
    since_ms, until_ms = _time_flag("--since", since), _time_flag("--until", until)
    try:
        poll_s = parse_duration(interval)
    except ValueError as exc:
        fail(f"--interval: {exc}", 2)
    settings = _settings(config, cold, cluster, broker)
    reader = _reader(settings, skip_corrupt=skip_corrupt)

    def show(ref: QueueRef, rec: Record) -> None:
        out(_record_json(rec, body, raw_body, ref) if as_json
            else _record_line(ref, rec, body, show_broker=len(reader.archive.brokers) > 1, raw=raw_body))

    try:
        if queue is None:
            _cat_topic(reader, topic, settings.cold_url, since_ms=since_ms, until_ms=until_ms, last=last,
                       limit=limit, follow_s=poll_s if follow_ else None, show=show)
        else:
            _cat_queue(reader, topic, queue, settings.cold_url, offset=offset, since_ms=since_ms,
                       until_ms=until_ms, last=last, limit=limit, follow_s=poll_s if follow_ else None,
                       show=show, quiet=as_json)
    except TieredError as exc:
        fail_with(exc, 1)
    _report_skipped(reader)


def _cat_queue(reader: ColdReader, topic: str, queue: int, url: str, *, offset: int | None, since_ms: int | None,
               until_ms: int | None, last: int | None, limit: int | None, follow_s: float | None,
               show: Callable[[QueueRef, Record], None], quiet: bool) -> None:
    ref = reader.queue(topic, queue)
    if ref is None:
        fail(f"{topic}/{queue}: not in the archive at {url}", 1)
    m = reader.archive.manifest(ref)
    records: Iterable[Record]
    if m is not None and batchread.is_batch(m):  # offsets count the messages inside its records
        first = batchread.message_bounds(m)[0]
        start, end = batchread.message_window(reader, ref, m, offset=offset, since_ms=since_ms, until_ms=until_ms,
                                              last=last, limit=limit)
        records = (batchread.follow_messages(reader, ref, start, sleep=lambda: time.sleep(follow_s))
                   if follow_s is not None else
                   batchread.iter_messages(reader, ref, m, start, None if end is None else end - start))
    else:
        first = m.first_offset if m is not None else 0
        win = window(reader, ref, offset=offset, since_ms=since_ms, until_ms=until_ms, last=last, limit=limit)
        records = (follow(reader, ref, win.start, sleep=lambda: time.sleep(follow_s)) if follow_s is not None else
                   reader.iter_queue(ref, win.start, None if win.end is None else win.end - win.start))
    if m is not None and offset is not None and offset < first and not quiet:
        note(f"offsets below {first} are no longer archived; starting there")
    for rec in records:
        show(ref, rec)


def _start(reader: ColdReader, ref: QueueRef, since_ms: int | None) -> int:
    """Where ``cat --topic --follow`` starts a queue (a BatchCQ queue: a message offset)."""
    m = reader.archive.manifest(ref)
    if batchread.is_batch(m) and m is not None:
        return batchread.message_window(reader, ref, m, offset=None, since_ms=since_ms, until_ms=None, last=None,
                                        limit=None)[0]
    return window(reader, ref, offset=None, since_ms=since_ms, until_ms=None, last=None, limit=None).start


def _cat_topic(reader: ColdReader, topic: str, url: str, *, since_ms: int | None, until_ms: int | None,
               last: int | None, limit: int | None, follow_s: float | None,
               show: Callable[[QueueRef, Record], None]) -> None:
    """Every archived queue of ``topic``, merged by store time (then queue, offset)."""

    def refs() -> list[QueueRef]:
        return reader.archive.queues(lambda t: t == topic)

    found = refs()
    if not found and follow_s is None:
        fail(f"{topic}: no archived queue at {url}", 1)
    if follow_s is None:
        for ref, rec in topic_records(reader, found, since_ms=since_ms, until_ms=until_ms, last=last, limit=limit):
            show(ref, rec)
        return
    starts = {ref: _start(reader, ref, since_ms) for ref in found}
    if last is not None:  # from the topic's last N: where each queue's share of them starts, else its end
        tail = list(topic_records(reader, found, since_ms=None, until_ms=None, last=last, limit=None))
        for ref in found:
            m = reader.archive.manifest(ref)
            end = batchread.message_bounds(m)[1] if batchread.is_batch(m) and m is not None else \
                m.next_offset if m is not None else 0
            starts[ref] = min((rec.queue_offset for r, rec in tail if r == ref), default=end)
    for ref, rec in follow_topic(reader, refs, starts, sleep=lambda: time.sleep(follow_s)):
        show(ref, rec)


@app.command()
def find(
    key: Annotated[Optional[str], typer.Option("--key", help="A KEYS entry or a UNIQ_KEY (client message id).")] = None,
    msg_id: Annotated[Optional[str], typer.Option("--msg-id", help="A message id: the broker's offset id (store host, port, CommitLog offset) or the client's UNIQ_KEY id.")] = None,
    time_: Annotated[Optional[str], typer.Option("--time", help="ISO 8601 or epoch ms: per queue, the first record stored at or after it.")] = None,
    topic: Annotated[Optional[str], typer.Option("--topic", help="Only this topic (required with --time).")] = None,
    as_json: JsonOpt = False,
    body: BodyOpt = False,
    raw_body: RawOpt = False,
    skip_corrupt: SkipOpt = False,
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
    wide: WideOpt = False,
) -> None:
    """Find archived records by key, by message id, or the first record at or after a time (exit 1 when none):
    a table (--wide adds the UNIQ_KEY and message ids), or with --body or --json one record per line."""
    if sum(x is not None for x in (key, msg_id, time_)) != 1:
        fail("give exactly one of --key, --msg-id or --time", 2)
    if time_ is not None and topic is None:
        fail("--time needs --topic", 2)
    settings = _settings(config, cold, cluster, broker)
    reader = _reader(settings, skip_corrupt=skip_corrupt)
    only = (lambda t: t == topic) if topic else None
    found = 0
    try:
        many = len(reader.archive.brokers) > 1
        if time_ is None:
            hits = (reader.find_key(key, topics=only) if key is not None else
                    find_msg_id(reader, msg_id or "", topics=only))
        else:
            hits = _find_time(reader, topic or "", _time_flag("--time", time_) or 0, quiet=as_json)
        if as_json or body:  # records as they are found; a body is data, not a table cell
            for ref, rec in hits:
                found += 1
                out(_record_json(rec, body, raw_body, ref) if as_json
                    else _record_line(ref, rec, body, show_broker=many, raw=raw_body))
        else:
            rows = list(hits)
            found = len(rows)
            if rows:
                _hits_table(rows, many=many, wide=wide)
    except TieredError as exc:
        fail_with(exc, 1)
    _report_skipped(reader)
    if not found:
        raise typer.Exit(1)


def _hits_table(rows: list[tuple[QueueRef, Record]], *, many: bool, wide: bool) -> None:
    cols = [*([Col(name="broker")] if many else []), Col(name="topic", keep=True), Col(name="queue", right=True),
            Col(name="offset", right=True), Col(name="stored"), Col(name="tags", wrap=True),
            Col(name="keys", wrap=True), Col(name="body", right=True), Col(name="uniq key", wide=True),
            Col(name="msg id", wide=True)]
    table(cols, ([*([f"{ref.cluster}/{ref.broker}"] if many else []), ref.topic, ref.queue_id,
                  entry_offset(rec, ref.topic), format_time_ms(rec.store_timestamp), rec.tags, " ".join(rec.keys), human_bytes(rec.body_length),
                  rec.unique_key, rec.msg_id] for ref, rec in rows), wide=wide)


def _find_time(reader: ColdReader, topic: str, ts: int, *, quiet: bool) -> Iterator[tuple[QueueRef, Record]]:
    """Per queue of ``topic``, the first record stored at or after ``ts``."""
    for ref in reader.archive.queues(lambda t: t == topic):
        off = reader.offset_for_time(ref, ts)
        if off is None:
            continue
        res = reader.read(ref, off, max_count=1)
        if res.status is not ReadStatus.FOUND or not res.records:
            if not quiet:
                note(f"{ref}: nothing stored at or after {format_time_ms(ts)} (archive ends at offset {res.next_offset})")
            continue
        yield ref, res.records[0]


# --- Spark ------------------------------------------------------------------------------


def source_options(settings: Settings, extra: list[str] | None = None) -> dict[str, str]:
    """Data source options from the settings (S3 endpoint, credentials, scope)
    plus ``--option k=v`` pairs."""
    s3 = s3_options(settings)
    opts: dict[str, str] = {}
    for name, value in (("endpoint", s3.endpoint_url), ("region", s3.region), ("access_key_id", s3.access_key_id),
                        ("secret_access_key", s3.secret_access_key), ("session_token", s3.session_token),
                        ("addressing", s3.addressing), ("checksum_mode", s3.checksum_mode)):
        if value:
            opts[name] = str(value)
    cluster, broker = _scope(settings)
    if cluster:
        opts["cluster"] = cluster
    if broker:
        opts["broker"] = broker
    for item in extra or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            fail(f"--option takes NAME=VALUE (got {name or item!r})", 2)
        opts[name.strip()] = value
    return opts


def require_query_extra(*modules: str) -> None:
    """Fail in one line when the query side is not installed: pyspark and
    pyarrow are the optional `spark` extra, which the sidecar image leaves out."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        fail(f"{' and '.join(missing)} not installed: this command needs the 'spark' extra "
             f"(pip install 'rocketmq-tiered[spark]')", 2)


def spark_session(master: str) -> tuple[Any, bool]:
    """(session, created): the active session if there is one, else a new one."""
    from pyspark.sql import SparkSession

    from tiered.query.spark_source import register

    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active, False
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName("tiered")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.python.filterPushdown.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark, True


@contextmanager
def spark_progress(spark: Any, poll_s: float = 0.5) -> Iterator[None]:
    """Spark's running stages as one bar (tasks done of tasks, rate, ETA) on a
    terminal; nothing otherwise. Spark's own console bar is off."""
    if not progress_enabled():
        yield
        return
    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()
    with progress("spark", unit="tasks") as bar:

        def poll() -> None:
            while not done.wait(poll_s):
                stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
                stages = [s for s in stages if s is not None]
                if stages:
                    bar.set_total(sum(s.numTasks for s in stages))
                    bar.set_completed(sum(s.numCompletedTasks for s in stages))

        watcher = threading.Thread(target=poll, name="tiered-spark-progress", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()


def progress_executor(inner: Any, chunk: int) -> Any:
    """``inner`` run on chunks of tasks so that a bar can advance between them;
    the plain executor off a terminal (one batch, as before)."""
    if not progress_enabled():
        return inner

    def execute(ctx: Any, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        with progress("exporting", total=len(tasks), unit="tasks") as bar:
            for i in range(0, len(tasks), chunk):
                results += inner(ctx, tasks[i:i + chunk])
                bar.advance(len(tasks[i:i + chunk]))
        return results

    return execute


# "tiered.errors.CorruptRecordError: ..." inside a Python worker's traceback that
# Spark wraps (PYTHON_DATA_SOURCE_ERROR, PythonException): the real cause.
_CAUSE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception)): (.+)$")
_WRAPPERS = ("PySpark", "Py4J", "Python", "Spark", "Analysis", "Captured", "Java")


def spark_error_summary(exc: BaseException) -> str:
    """One line for a failed Spark query: the analysis error as Spark states it
    (without its query context), or the storage/data error a Python worker
    raised, not the wrappers around it."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    causes = [m for m in map(_CAUSE.match, lines) if m and not m.group(1).startswith(_WRAPPERS)]
    if causes:
        return f"{causes[-1].group(1)}: {causes[-1].group(2).strip()}"
    first = lines[0].strip() if lines else type(exc).__name__
    return f"{type(exc).__name__}: {first}"


def _cell(v: Any) -> str:
    """A table cell of a Spark row: times in ISO 8601 UTC, bytes as base64, the rest as text."""
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, datetime):
        return v.isoformat().replace("+00:00", "Z")
    if isinstance(v, date):
        return v.isoformat()
    return "null" if v is None else str(v)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="Spark SQL over the temporary view 'messages'.")],
    option: Annotated[Optional[list[str]], typer.Option("--option", help="Data source option NAME=VALUE (repeatable): topics, startTime, skipCorrupt...")] = None,
    limit: Annotated[int, typer.Option("--limit", min=0, help="Rows to print in table form (0: all).")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Every row as one JSON object per line.")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Print what was derived from the query's plan (columns read, pruning options) on stderr.")] = False,
    master: MasterOpt = "local[*]",
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
) -> None:
    """Run Spark SQL on the archive, exposed as the temporary view 'messages'. The columns the query reads and
    the topics, queues and store-time range every read of the view is filtered to are derived from its plan."""
    require_query_extra("pyspark", "pyarrow")
    settings = _settings(config, cold, cluster, broker)
    archive_store(settings)  # before Spark starts: a URL with nothing under it fails in a moment
    opts = source_options(settings, option)
    spark, created = spark_session(master)
    try:
        from tiered.query.spark_sql import prepare

        # PySpark logs a failed query's context as its own JSON line on stderr:
        # the command reports the error once, in its one line
        logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
        try:
            result, derived = prepare(spark, settings.cold_url, query, **opts)
            if derived is not None:
                logging.getLogger("tiered.query.spark_sql").info("tiered sql: %s", derived.describe())
                if explain:
                    note(f"derived: {derived.describe()}")
            with spark_progress(spark):
                if as_json:
                    for row in result.toLocalIterator():
                        out(dumps(row.asDict(recursive=True)))
                else:
                    rows = (result.limit(limit) if limit else result).collect()
            if not as_json:
                # any column may hold long text (a body, properties): it wraps; topics stay whole
                table([Col(name=c, keep=c.lower() == "topic", wrap=c.lower() != "topic", literal=True)
                       for c in result.columns],
                      ([_cell(v) for v in row] for row in rows))
        except typer.Exit:
            raise
        except Exception as exc:  # noqa: BLE001 - the CLI's edge: one line, not a JVM stack
            from pyspark.errors import AnalysisException

            # a query Spark cannot parse or resolve is the caller's usage error
            fail(spark_error_summary(exc), 2 if isinstance(exc, AnalysisException) else 1)
    finally:
        if created:
            spark.stop()


@app.command("export")
def export_cmd(
    to: Annotated[str, typer.Option("--to", help="Target URL: file:///path or s3://bucket/prefix.")],
    fmt: Annotated[str, typer.Option("--format", help="Output format (parquet).")] = "parquet",
    topics: Annotated[Optional[list[str]], typer.Option("--topic", "--topics", help="Only this topic (repeatable, or comma-separated).")] = None,
    engine: Annotated[str, typer.Option("--engine", help="local (processes on this machine) or spark.")] = "local",
    parallelism: Annotated[int, typer.Option("--parallelism", min=1, help="Local worker processes.")] = max(1, (os.cpu_count() or 1)),
    compression: Annotated[str, typer.Option("--compression", help="Parquet compression codec.")] = "snappy",
    skip_corrupt: SkipOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run report as JSON.")] = False,
    master: MasterOpt = "local[*]",
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
) -> None:
    """Export the archive to Parquet partitioned by topic and date, incrementally (reruns add only new data)."""
    require_query_extra("pyarrow", *(["pyspark"] if engine == "spark" else []))
    from tiered.query.export import Exporter, run_local, run_spark
    from tiered.query.reader import Archive
    from tiered.archive.storage import open_store

    if fmt.lower() != "parquet":
        fail(f"--format {fmt}: only parquet is supported", 2)
    if engine not in ("local", "spark"):
        fail("--engine: local or spark", 2)
    settings = _settings(config, cold, cluster, broker)
    store = archive_store(settings)
    try:
        target = open_store(to, s3=s3_options(settings))
    except ValueError as exc:
        fail(f"--to: {exc}", 2)
    c, b = _scope(settings)
    wanted = {t.strip() for item in topics for t in item.split(",") if t.strip()} if topics else None
    spark = None
    created = False
    if engine == "spark":
        spark, created = spark_session(master)
        executor = progress_executor(run_spark(spark), 64)
    else:
        executor = progress_executor(run_local(parallelism), 4 * parallelism)
    try:
        report = Exporter(store, target, archive=Archive(store, cluster=c, broker=b),
                          topics=(lambda t: t in wanted) if wanted else None, skip_corrupt=skip_corrupt,
                          compression=compression, executor=executor).run()
    except TieredError as exc:  # ExportError included
        fail(str(exc), 1)
    finally:
        if created and spark is not None:
            spark.stop()
    if as_json:
        print_json(report.__dict__)
    else:
        note(
            f"exported {report.rows} records into {report.files} files ({report.tasks} new tasks, "
            f"{report.resumed_tasks} redone from an unfinished run) over {report.queues} queues "
            f"in {report.seconds:.1f}s")
        if report.expired_before_export:
            note(f"{report.expired_before_export} records left the archive before they were exported")
        if report.skipped:
            note(f"skipped {report.skipped} corrupt records")
            for p in report.problems[:5]:
                note(f"  {p}")
