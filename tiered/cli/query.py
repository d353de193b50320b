"""``tiered cat``, ``tiered find``, ``tiered sql`` and ``tiered export``: query the archive.

They read the object store only (never a broker's disk). Without
``--cluster``/``--broker`` (flag, ``TIERED_*`` environment or config file)
every cluster and broker under the cold-tier root is read.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from datetime import date, datetime
from typing import Annotated, Any, Optional

import typer

from tiered.cli.app import app, err_console, fail
from tiered.cli.common import BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, settings_from
from tiered.cli.wiring import object_store, s3_options
from tiered.codec import Record
from tiered.compression import BodyDecompressError, codec_name, decompress
from tiered.config import Settings
from tiered.errors import TieredError
from tiered.reader import ColdReader, QueueRef, ReadStatus
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
    return ColdReader(object_store(settings), cluster=cluster, broker=broker, skip_corrupt=skip_corrupt)


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


def _record_json(rec: Record, with_body: bool, raw: bool = False) -> str:
    d = rec.to_dict()
    if with_body:
        body, notes = _shown_body(rec, raw)
        d.update(notes)
        try:
            d["body"] = body.decode("utf-8")
            d["body_encoding"] = "utf-8"
        except UnicodeDecodeError:
            d["body"] = base64.b64encode(body).decode("ascii")
            d["body_encoding"] = "base64"
    return json.dumps(d, ensure_ascii=False)


def _record_line(ref: QueueRef, rec: Record, with_body: bool, *, show_broker: bool, raw: bool = False) -> str:
    d = rec.to_dict()
    where = f"{ref.cluster}/{ref.broker} " if show_broker else ""
    line = (f"{where}{ref.topic}/{ref.queue_id}@{rec.queue_offset}  {format_time_ms(d['store_timestamp'])}  "
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


def _emit(line: str) -> None:
    try:
        sys.stdout.write(line + "\n")
    except BrokenPipeError:  # `tiered cat ... | head`
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the interpreter's final flush
        finally:
            raise typer.Exit(0)


def _report_skipped(reader: ColdReader) -> None:
    if reader.skipped:
        err_console.print(f"[yellow]skipped {reader.skipped} corrupt or missing archived records[/yellow]")
        for problem in reader.problems[:5]:
            err_console.print(f"[yellow]  {problem}[/yellow]")


@app.command()
def cat(
    topic: Annotated[str, typer.Option("--topic", help="Topic.")],
    queue: Annotated[int, typer.Option("--queue", help="Queue id.")],
    offset: Annotated[int, typer.Option("--offset", min=0, help="First queue offset.")] = 0,
    count: Annotated[Optional[int], typer.Option("--count", min=0, help="At most this many records (default: to the end).")] = None,
    as_json: JsonOpt = False,
    body: BodyOpt = False,
    raw_body: RawOpt = False,
    skip_corrupt: SkipOpt = False,
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
) -> None:
    """Print archived records of one queue from a queue offset."""
    settings = _settings(config, cold, cluster, broker)
    reader = _reader(settings, skip_corrupt=skip_corrupt)
    try:
        ref = reader.queue(topic, queue)
        if ref is None:
            fail(f"{topic}/{queue}: not in the archive at {settings.cold_url}", 1)
        m = reader.archive.manifest(ref)
        if m is not None and offset < m.first_offset and not as_json:
            err_console.print(f"[yellow]offsets below {m.first_offset} are no longer archived; "
                              f"starting there[/yellow]")
        for rec in reader.iter_queue(ref, offset, count):
            _emit(_record_json(rec, body, raw_body) if as_json
                  else _record_line(ref, rec, body, show_broker=False, raw=raw_body))
    except TieredError as exc:
        fail(str(exc), 1)
    _report_skipped(reader)


@app.command()
def find(
    key: Annotated[Optional[str], typer.Option("--key", help="A KEYS entry or a UNIQ_KEY (client message id).")] = None,
    time: Annotated[Optional[str], typer.Option("--time", help="ISO 8601 or epoch ms: per queue, the first record stored at or after it.")] = None,
    topic: Annotated[Optional[str], typer.Option("--topic", help="Topic (required with --time).")] = None,
    as_json: JsonOpt = False,
    body: BodyOpt = False,
    raw_body: RawOpt = False,
    skip_corrupt: SkipOpt = False,
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
) -> None:
    """Find archived records by key, or the first record at or after a time (exit 1 when none)."""
    if (key is None) == (time is None):
        fail("give exactly one of --key or --time", 2)
    if time is not None and topic is None:
        fail("--time needs --topic", 2)
    settings = _settings(config, cold, cluster, broker)
    reader = _reader(settings, skip_corrupt=skip_corrupt)
    found = 0
    try:
        many = len(reader.archive.brokers) > 1
        if key is not None:
            for ref, rec in reader.find_key(key, topics=(lambda t: t == topic) if topic else None):
                found += 1
                _emit(_record_json(rec, body, raw_body) if as_json
                      else _record_line(ref, rec, body, show_broker=many, raw=raw_body))
        else:
            try:
                ts = parse_time_ms(time or "")
            except ValueError as exc:
                fail(str(exc), 2)
            for ref in reader.archive.queues(lambda t: t == topic):
                off = reader.offset_for_time(ref, ts)
                if off is None:
                    continue
                res = reader.read(ref, off, max_count=1)
                if res.status is not ReadStatus.FOUND or not res.records:
                    if not as_json:
                        err_console.print(f"{ref}: nothing stored at or after {format_time_ms(ts)} "
                                          f"(archive ends at offset {res.next_offset})")
                    continue
                found += 1
                rec = res.records[0]
                _emit(_record_json(rec, body, raw_body) if as_json
                      else _record_line(ref, rec, body, show_broker=many, raw=raw_body))
    except TieredError as exc:
        fail(str(exc), 1)
    _report_skipped(reader)
    if not found:
        raise typer.Exit(1)


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


def spark_session(master: str) -> tuple[Any, bool]:
    """(session, created): the active session if there is one, else a new one."""
    from pyspark.sql import SparkSession

    from tiered.spark_source import register

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


def _json_value(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, datetime):
        return v.isoformat().replace("+00:00", "Z")
    if isinstance(v, date):
        return v.isoformat()
    return str(v)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="Spark SQL over the temporary view 'messages'.")],
    option: Annotated[Optional[list[str]], typer.Option("--option", help="Data source option NAME=VALUE (repeatable): topics, startTime, skipCorrupt...")] = None,
    limit: Annotated[int, typer.Option("--limit", min=0, help="Rows to print in table form (0: all).")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Every row as one JSON object per line.")] = False,
    master: MasterOpt = "local[*]",
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
) -> None:
    """Run Spark SQL on the archive, exposed as the temporary view 'messages'."""
    settings = _settings(config, cold, cluster, broker)
    opts = source_options(settings, option)
    spark, created = spark_session(master)
    try:
        from tiered.spark_source import load

        try:
            load(spark, settings.cold_url, **opts).createOrReplaceTempView("messages")
            result = spark.sql(query)
            if as_json:
                for row in result.toLocalIterator():
                    _emit(json.dumps(row.asDict(recursive=True), default=_json_value, ensure_ascii=False))
            else:
                result.show(limit or max(1, result.count()), truncate=40)
        except Exception as exc:  # noqa: BLE001 - the CLI's edge: one line, not a JVM stack
            fail(spark_error_summary(exc), 1)
    finally:
        if created:
            spark.stop()


@app.command("export")
def export_cmd(
    to: Annotated[str, typer.Option("--to", help="Target URL: file:///path or s3://bucket/prefix.")],
    fmt: Annotated[str, typer.Option("--format", help="Output format (parquet).")] = "parquet",
    topics: Annotated[Optional[str], typer.Option("--topics", help="Only these topics (comma-separated).")] = None,
    engine: Annotated[str, typer.Option("--engine", help="local (processes on this machine) or spark.")] = "local",
    parallelism: Annotated[int, typer.Option("--parallelism", min=1, help="Local worker processes.")] = max(1, (os.cpu_count() or 1)),
    compression: Annotated[str, typer.Option("--compression", help="Parquet compression codec.")] = "snappy",
    skip_corrupt: SkipOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run report as JSON.")] = False,
    master: MasterOpt = "local[*]",
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
) -> None:
    """Export the archive to Parquet partitioned by topic and date, incrementally (reruns add only new data)."""
    from tiered.export import Exporter, ExportError, run_local, run_spark
    from tiered.reader import Archive
    from tiered.storage import open_store

    if fmt.lower() != "parquet":
        fail(f"--format {fmt}: only parquet is supported", 2)
    if engine not in ("local", "spark"):
        fail("--engine: local or spark", 2)
    settings = _settings(config, cold, cluster, broker)
    store = object_store(settings)
    try:
        target = open_store(to, s3=s3_options(settings))
    except ValueError as exc:
        fail(f"--to: {exc}", 2)
    c, b = _scope(settings)
    wanted = {t.strip() for t in topics.split(",") if t.strip()} if topics else None
    spark = None
    created = False
    if engine == "spark":
        spark, created = spark_session(master)
        executor = run_spark(spark)
    else:
        executor = run_local(parallelism)
    try:
        report = Exporter(store, target, archive=Archive(store, cluster=c, broker=b),
                          topics=(lambda t: t in wanted) if wanted else None, skip_corrupt=skip_corrupt,
                          compression=compression, executor=executor).run()
    except (TieredError, ExportError) as exc:
        fail(str(exc), 1)
    finally:
        if created and spark is not None:
            spark.stop()
    if as_json:
        print(json.dumps(report.__dict__, default=str))
    else:
        err_console.print(
            f"exported {report.rows} records into {report.files} files ({report.tasks} new tasks, "
            f"{report.resumed_tasks} redone from an unfinished run) over {report.queues} queues "
            f"in {report.seconds:.1f}s")
        if report.expired_before_export:
            err_console.print(f"[yellow]{report.expired_before_export} records left the archive before they were "
                              f"exported[/yellow]")
        if report.skipped:
            err_console.print(f"[yellow]skipped {report.skipped} corrupt records[/yellow]")
            for p in report.problems[:5]:
                err_console.print(f"[yellow]  {p}[/yellow]")
