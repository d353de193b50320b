"""``tiered sql`` and ``tiered.query.spark_sql.sql``: columns and pruning
options derived from each query's optimised plan, on a real ``local[2]``.
Every query shape stays exact (truth from the local store); a count reads no
object; a query not selecting ``body`` reads no body; a store-time range is
pushed only when every scan of the view has one."""

from __future__ import annotations

import glob
from concurrent.futures import ThreadPoolExecutor
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from readerkit import BROKER, CLUSTER, T0, local_rows
from tiered.archive import layout
from tiered.archive.storage import open_store
from tiered.format.codec import Host, offset_msg_id
from tiered.cli import app
from tiered.query.reader import Archive, QueueRef
from tiered.query.spark_sql import prepare, sql

pytestmark = pytest.mark.spark

MIN = 60_000
ORDERS, DLQ = "Orders", "%DLQ%billing"


@pytest.fixture
def archived(build, tmp_path: Path):
    url = f"file://{tmp_path / 'cold'}"
    _, local, _ = build(url)
    return url, local_rows(local)


def of(rows: list[dict], **where) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


def stats(path: Path) -> list[dict]:
    return [json.loads(line) for f in glob.glob(str(path / "*.jsonl")) for line in open(f)]


def cli(url: str, query: str, *options: str, explain: bool = False):
    args = ["sql", query, "--cold", url, "--json"] + (["--explain"] if explain else [])
    for o in options:
        args += ["--option", o]
    return CliRunner().invoke(app, args)


def shapes(rows: list[dict]) -> list[tuple[str, tuple, dict[str, str]]]:
    """(query, its answer from the local store, the pruning options derived)."""
    late, early = T0 + 200 * MIN, T0 + 30 * MIN
    orders_q1 = of(rows, topic=ORDERS, queue_id=1)
    dlq_late = [r for r in of(rows, topic=DLQ) if r["store_timestamp"] >= late]
    orders = {(r["queue_id"], r["queue_offset"]): r for r in of(rows, topic=ORDERS)}
    pairs = [orders[(d["queue_id"], d["queue_offset"])] for d in of(rows, topic=DLQ)
             if (d["queue_id"], d["queue_offset"]) in orders]
    delayed = {r["queue_offset"] for r in of(rows, topic=DLQ) if "DELAY" in r["properties"]}
    in_delayed = [r for r in of(rows, topic=ORDERS) if r["queue_offset"] in delayed]
    both = f"{DLQ},{ORDERS}"
    return [
        (f"SELECT (SELECT count(*) FROM messages WHERE topic = '{ORDERS}') AS a, "
         f"(SELECT count(*) FROM messages WHERE topic = '{DLQ}') AS b", (240, 40), {"topics": both}),
        (f"SELECT count(*) AS n, sum(body_crc) AS s FROM (SELECT * FROM messages WHERE topic = '{ORDERS}' AND "
         f"queue_id = 1 UNION ALL SELECT * FROM messages WHERE topic = '{DLQ}' AND "
         f"store_timestamp >= timestamp_millis({late}))",
         (len(orders_q1) + len(dlq_late), sum(r["body_crc"] for r in orders_q1 + dlq_late)), {"topics": both}),
        (f"SELECT count(*) AS n, sum(o.body_crc) AS s FROM messages d JOIN messages o ON d.queue_id = o.queue_id "
         f"AND d.queue_offset = o.queue_offset WHERE d.topic = '{DLQ}' AND o.topic = '{ORDERS}'",
         (len(pairs), sum(o["body_crc"] for o in pairs)), {"topics": both}),
        (f"SELECT count(*) AS n, sum(body_crc) AS s FROM messages WHERE topic = '{ORDERS}' AND queue_offset IN "
         f"(SELECT queue_offset FROM messages WHERE topic = '{DLQ}' AND delay_level IS NOT NULL)",
         (len(in_delayed), sum(r["body_crc"] for r in in_delayed)), {"topics": both}),
        (f"WITH t AS (SELECT * FROM messages) SELECT (SELECT count(*) FROM t WHERE topic = '{ORDERS}' AND "
         f"queue_id = 0) AS a, (SELECT count(*) FROM t WHERE store_timestamp < timestamp_millis({early})) AS b",
         (len(of(rows, topic=ORDERS, queue_id=0)), sum(1 for r in rows if r["store_timestamp"] < early)), {}),
    ]


def test_every_shape_is_exact_through_the_function_and_the_command(spark, archived) -> None:
    url, rows = archived
    for query, want, options in shapes(rows):
        df, derived = prepare(spark, url, query)
        assert tuple(df.collect()[0]) == want, query
        assert derived is not None and dict(derived.options) == options, query
        assert derived.scans == 2 and derived.columns is not None and "body" not in derived.columns
        result = cli(url, query)
        assert result.exit_code == 0, result.output
        assert tuple(json.loads(result.stdout).values()) == want, query
    # the DataFrame of ``sql`` is the query's, whatever the view holds later
    df = sql(spark, url, f"SELECT count(*) FROM messages WHERE topic = '{DLQ}'")
    sql(spark, url, "SELECT count(*) FROM messages")
    assert df.collect()[0][0] == 40


def test_count_is_answered_from_the_manifests(spark, archived, tmp_path: Path) -> None:
    url, rows = archived
    st = tmp_path / "stats"
    df, derived = prepare(spark, url, "SELECT count(*) FROM messages", statsPath=str(st))
    assert derived is not None and derived.columns == () and derived.options == ()
    assert df.collect()[0][0] == len(rows) == 280
    done = stats(st)
    assert done and sum(s["rows"] for s in done) == 280
    assert all(s["requests"] == 0 and s["bytes"] == 0 for s in done)
    # a topic filter: the column the filter reads is a queue column, the topic an option: still no object
    st = tmp_path / "topic"
    df, derived = prepare(spark, url, f"SELECT count(*) FROM messages WHERE topic = '{DLQ}'", statsPath=str(st))
    assert derived is not None and derived.columns == ("topic",) and derived.options == (("topics", DLQ),)
    assert df.collect()[0][0] == 40
    assert stats(st) and all(s["requests"] == 0 for s in stats(st)) and sum(s["rows"] for s in stats(st)) == 40
    result = cli(url, "SELECT count(*) AS n FROM messages", explain=True)
    assert result.exit_code == 0 and json.loads(result.stdout) == {"n": 280}
    assert "derived: 1 scan of the view; columns: none (from the manifests); pruning: none" in result.stderr


def corrupt_a_body(url: str) -> tuple[str, int, int]:
    """Flip a byte inside the body of the second record of an Orders segment:
    (object, offset in it, queue offset)."""
    store = open_store(url)
    seg = Archive(store).manifest(QueueRef(CLUSTER, BROKER, ORDERS, 1)).segments[1]
    obj, at, _length = layout.split(seg.commitlog_key)  # the records' section of the segment's object
    data = bytearray(store.get(obj))
    pos = int.from_bytes(layout.read_part(store, seg.consumequeue_key)[20:28], "big") - seg.cl_start
    data[at + pos + 100] ^= 0x55
    store.put(obj, bytes(data))
    return seg.commitlog_key, pos, seg.q_start + 1


def test_a_query_not_selecting_body_reads_no_body(spark, archived) -> None:
    url, rows = archived
    key, pos, offset = corrupt_a_body(url)
    orders = of(rows, topic=ORDERS)
    query = (f"SELECT count(*), sum(body_crc), max(tags) FROM messages WHERE topic = '{ORDERS}' "
             f"AND reconsume_times >= 0")
    df, derived = prepare(spark, url, query)
    assert derived is not None and derived.columns == ("topic", "reconsume_times", "tags", "body_crc")
    assert tuple(df.collect()[0]) == (240, sum(r["body_crc"] for r in orders), max(r["tags"] for r in orders if r["tags"] is not None))
    # selecting the body reads it, and the damage is reported where it is
    bad = cli(url, f"SELECT sum(length(body)) FROM messages WHERE topic = '{ORDERS}'")
    assert bad.exit_code == 1 and len(bad.stderr.strip().splitlines()) <= 2
    assert f"CorruptRecordError: {key} @ {pos}: queue offset {offset}: body CRC mismatch" \
        in " ".join(bad.stderr.split())


def test_time_range_is_pushed_only_when_every_scan_has_one(spark, archived, tmp_path: Path) -> None:
    url, rows = archived
    a, b, c = T0 + 10 * MIN, T0 + 20 * MIN + 500, T0 + 50 * MIN
    stamps = [r["store_timestamp"] for r in rows]
    in_ab = sum(1 for t in stamps if a <= t < b)
    after_c = sum(1 for t in stamps if t > c)
    # both sides filtered by store time (different ranges): the widest is pushed
    both = (f"SELECT count(*) FROM (SELECT topic FROM messages WHERE store_timestamp >= timestamp_millis({a}) AND "
            f"store_timestamp < timestamp_millis({b}) UNION ALL SELECT topic FROM messages WHERE "
            f"store_timestamp > timestamp_millis({c}))")
    st = tmp_path / "both"
    df, derived = prepare(spark, url, both, statsPath=str(st))
    assert derived is not None and dict(derived.options) == {"startTime": str(a)}  # the second side has no end
    assert df.collect()[0][0] == in_ab + after_c
    widest = sum(1 for t in stamps if t >= a)
    assert sum(s["rows"] for s in stats(st)) == 2 * widest < 2 * len(rows)  # each scan read from a on only
    closed = (f"SELECT count(*) FROM messages x JOIN messages y ON x.queue_offset = y.queue_offset AND "
              f"x.topic = y.topic AND x.queue_id = y.queue_id WHERE x.store_timestamp BETWEEN "
              f"timestamp_millis({a}) AND timestamp_millis({b}) AND y.store_timestamp = timestamp_millis({c})")
    df, derived = prepare(spark, url, closed)
    assert derived is not None and dict(derived.options) == {"startTime": str(a), "endTime": str(c + 1)}
    assert df.collect()[0][0] == 0
    # one side unfiltered: no range pushed, still exact
    one = (f"SELECT count(*) FROM (SELECT topic FROM messages WHERE store_timestamp >= timestamp_millis({a}) "
           f"UNION ALL SELECT topic FROM messages WHERE topic = '{DLQ}')")
    st = tmp_path / "one"
    df, derived = prepare(spark, url, one, statsPath=str(st))
    assert derived is not None and derived.options == () and derived.columns == ("topic", "store_timestamp")
    assert "not every scan is filtered" in derived.describe()
    assert df.collect()[0][0] == widest + len(of(rows, topic=DLQ))
    assert sum(s["rows"] for s in stats(st)) == 2 * len(rows)


def test_options_given_are_narrowed_never_widened(spark, archived) -> None:
    url, rows = archived
    query = f"SELECT count(*) FROM messages WHERE topic IN ('{ORDERS}', 'Nothing') AND queue_id = 1"
    df, derived = prepare(spark, url, query, topics=f"{ORDERS},{DLQ}", startTime=str(T0 + 100 * MIN))
    assert derived is not None and dict(derived.options) == {"topics": f"Nothing,{ORDERS}", "queues": "1"}
    assert df.collect()[0][0] == sum(1 for r in of(rows, topic=ORDERS, queue_id=1)
                                     if r["store_timestamp"] >= T0 + 100 * MIN)
    # a user's columns stay the view's when the query reads them all
    df, derived = prepare(spark, url, "SELECT * FROM messages", columns="queue_offset,topic")
    assert derived is not None and derived.columns is None and df.columns == ["queue_offset", "topic"]
    assert df.count() == 280


def test_star_with_positions_keeps_every_column_and_commands_run_once(spark, archived) -> None:
    url, rows = archived
    query = "SELECT queue_offset, body_crc FROM (SELECT * FROM messages ORDER BY 3 DESC, 17 LIMIT 3)"
    df, derived = prepare(spark, url, query)
    assert derived is not None and derived.columns is None
    want = sorted(((r["queue_offset"], r["body_crc"]) for r in rows), key=lambda t: (-t[0], t[1]))[:3]
    assert [tuple(r) for r in df.collect()] == want
    df, derived = prepare(spark, url, "SHOW TABLES")
    assert derived is None and ("messages", True) in [(r["tableName"], r["isTemporary"]) for r in df.collect()]


def test_lookups_become_key_and_msg_id_options_when_every_scan_has_them(spark, archived, tmp_path: Path) -> None:
    url, rows = archived
    uniq = "UNIQ%DLQ%billing00000005"
    st = tmp_path / "uniq"
    df, derived = prepare(spark, url, f"SELECT topic, queue_id, queue_offset FROM messages WHERE unique_key = '{uniq}'",
                          statsPath=str(st))
    assert derived is not None and dict(derived.options) == {"key": uniq}
    assert [tuple(r) for r in df.collect()] == [(DLQ, 0, 5)]
    assert sum(s["rows"] for s in stats(st)) == 1  # the key index picked one record
    # the same KEYS entry on both sides of a self-join: pushed; a different one on each: not
    shared = [r for r in rows if "shared-3" in r["keys"]]
    query = ("SELECT count(*) FROM messages a JOIN messages b ON a.unique_key = b.unique_key "
             "WHERE array_contains(a.keys, 'shared-3') AND array_contains(b.keys, '{}')")
    df, derived = prepare(spark, url, query.format("shared-3"))
    assert derived is not None and dict(derived.options) == {"key": "shared-3"}
    assert df.collect()[0][0] == len(shared)
    df, derived = prepare(spark, url, query.format("Orders-k77"))
    assert derived is not None and derived.options == ()
    assert df.collect()[0][0] == sum(1 for r in shared if "Orders-k77" in r["keys"])
    # store host and CommitLog offset: the broker's offset message id, one record
    target = next(r for r in rows if r["topic"] == DLQ and r["queue_offset"] == 8)
    st = tmp_path / "msgid"
    df, derived = prepare(spark, url, f"SELECT queue_offset, body_crc FROM messages WHERE store_host = "
                                      f"'{target['store_host']}' AND commitlog_offset = {target['commitlog_offset']}",
                          statsPath=str(st))
    assert derived is not None and dict(derived.options).get("msgId") == offset_msg_id(
        Host.parse(target["store_host"]), target["commitlog_offset"])
    assert [tuple(r) for r in df.collect()] == [(8, target["body_crc"])]
    assert sum(s["rows"] for s in stats(st)) == 1


def test_threads_calling_sql_on_one_session(spark, archived) -> None:
    url, rows = archived
    jobs = [(f"SELECT count(*), sum(body_crc) FROM messages WHERE topic = '{DLQ}'", of(rows, topic=DLQ)),
            (f"SELECT count(*), sum(body_crc) FROM messages WHERE queue_id = 1 AND "
             f"store_timestamp < timestamp_millis({T0 + 60 * MIN})",
             [r for r in rows if r["queue_id"] == 1 and r["store_timestamp"] < T0 + 60 * MIN]),
            ("SELECT count(*), sum(body_crc) FROM messages", rows)] * 3
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda job: tuple(sql(spark, url, job[0]).collect()[0]), jobs))
    assert got == [(len(want), sum(r["body_crc"] for r in want)) for _, want in jobs]
