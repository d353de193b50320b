"""``tiered cat --topic T`` without ``--queue``: every archived queue of the
topic, merged by store time (then queue, offset), each record once; with
--since/--until windows that cut segments, --last N, --limit and --follow."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tiered.cli.query as query_cli
from readerkit import BROKER, CLUSTER, T0, archive
from tiered.archive.storage import ObjectStore, open_store
from tiered.cli import app
from tiered.cli.lookup import follow_topic
from tiered.query.reader import ColdReader
from tiered.store.storewriter import StoreWriter
from tiered.timeparse import format_time_ms

SEC = 1000
QUEUES = 3

# (queue, offset, unique key, store ms) of every Orders record written
Written = list[tuple[int, int, str, int]]


def write(w: StoreWriter, first: int, count: int, *, queues: int = QUEUES) -> Written:
    """Orders records ``first``..``first+count``: record i in queue i % queues,
    stored at T0 + (i // 2) s, so that two queues share each second (record
    2 in queue 2 and record 3 in queue 0 tie: queue 0 comes first although
    written second); an Other topic in between that cat must leave out."""
    out: Written = []
    for i in range(first, first + count):
        ts = T0 + (i // 2) * SEC
        a = w.put("Orders", i % queues, bytes([i % 251]) * 300, unique_key=f"O{i:05d}", store_timestamp=ts,
                  born_timestamp=ts)
        out.append((i % queues, a.queue_offset, f"O{i:05d}", ts))
        w.put("Other", 0, b"x" * 50, unique_key=f"X{i:05d}", store_timestamp=ts, born_timestamp=ts)
    return out


def in_time_order(rows: Written) -> Written:
    return sorted(rows, key=lambda r: (r[3], r[0], r[1]))


@pytest.fixture
def orders(tmp_path: Path, store_writer) -> tuple[str, ObjectStore, Written]:  # noqa: ANN001
    """90 Orders records over 3 queues archived in segments of ~2 KiB (several per queue)."""
    with store_writer() as w:
        written = write(w, 0, 90)
    url = f"file://{tmp_path / 'cold'}"
    store = open_store(url)
    archive(tmp_path / "store", store, tmp_path / "state", segment_bytes=2048)
    return url, store, written


def cat(url: str, *args: str):
    return CliRunner().invoke(app, ["cat", "--topic", "Orders", "--cold", url, "--json", *args],
                              env={"TIERED_LOG__LEVEL": "WARNING"})


def got(result) -> Written:
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return [(r["queue_id"], r["queue_offset"], r["unique_key"], r["store_timestamp"]) for r in rows]


def test_since_until_over_every_queue_cuts_segments(orders) -> None:
    url, store, written = orders
    since, until = T0 + 7 * SEC, T0 + 31 * SEC
    reader = ColdReader(store)
    per_queue = [reader.archive.manifest(reader.queue("Orders", q)).segments for q in range(QUEUES)]
    assert all(len(segs) >= 3 for segs in per_queue)
    segments = [s for segs in per_queue for s in segs]
    # both ends fall inside segments, not on their edges
    assert any(s.min_store_ms < since <= s.max_store_ms for s in segments)
    assert any(s.min_store_ms < until <= s.max_store_ms for s in segments)
    want = in_time_order([r for r in written if since <= r[3] < until])
    assert len(want) == 48
    assert got(cat(url, "--since", format_time_ms(since), "--until", str(until))) == want
    # the tie at T0 + 1 s: queue 0's record (written after queue 2's) first
    assert [r[:3] for r in got(cat(url, "--until", str(T0 + 2 * SEC)))] == [
        (0, 0, "O00000"), (1, 0, "O00001"), (0, 1, "O00003"), (2, 0, "O00002")]
    # --queue narrows to one queue, as before
    assert got(cat(url, "--queue", "1", "--since", str(since), "--until", str(until))) == \
        [r for r in want if r[0] == 1]
    # --limit: the first N of the merged stream
    assert got(cat(url, "--since", str(since), "--limit", "5")) == want[:5]


def test_last_n_of_the_topic_by_store_time(orders) -> None:
    url, _, written = orders
    assert got(cat(url, "--last", "7")) == in_time_order(written)[-7:]
    assert got(cat(url, "--last", "200")) == in_time_order(written)
    assert got(cat(url, "--last", "0")) == []
    # the lines name each record's queue
    lines = CliRunner().invoke(app, ["cat", "--topic", "Orders", "--cold", url, "--last", "2"]).stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == [f"Orders/{q}@{o}" for q, o, _, _ in in_time_order(written)[-2:]]


def test_topic_usage_errors(orders) -> None:
    url, _, _ = orders
    result = cat(url, "--offset", "3")
    assert result.exit_code == 2 and "--offset needs --queue" in result.stderr
    result = CliRunner().invoke(app, ["cat", "--topic", "Nope", "--cold", url])
    assert result.exit_code == 1 and "Nope: no archived queue at" in result.stderr


def test_follow_topic_reads_new_records_and_new_queues(orders, tmp_path: Path, store_writer) -> None:  # noqa: ANN001
    url, store, written = orders
    reader = ColdReader(store, cluster=CLUSTER, broker=BROKER)
    refs = reader.archive.queues(lambda t: t == "Orders")
    sleeps: list[int] = []
    later: Written = []

    def sleep() -> None:
        sleeps.append(1)
        if len(sleeps) == 1:  # more traffic, into a fourth queue too, archived while cat waits
            with store_writer() as w:
                later.extend(write(w, 90, 12, queues=4))
            archive(tmp_path / "store", store, tmp_path / "state", segment_bytes=2048)

    since = T0 + 40 * SEC
    starts = {ref: reader.offset_for_time(ref, since) for ref in refs}
    out = [(ref.queue_id, rec.queue_offset, rec.unique_key, rec.store_timestamp)
           for ref, rec in follow_topic(reader, lambda: reader.archive.queues(lambda t: t == "Orders"), starts,
                                        sleep=sleep, stop=lambda: len(sleeps) >= 2)]
    assert {q for q, _, _, _ in later} == {0, 1, 2, 3}
    assert out == in_time_order([r for r in written if r[3] >= since]) + in_time_order(later)
    assert len(sleeps) == 2


def test_cat_follow_last_starts_at_the_topics_last_n(orders, monkeypatch) -> None:
    url, store, written = orders

    class Stop(Exception):
        pass

    slept: list[float] = []

    def sleep(s: float) -> None:  # the first poll ends the command
        slept.append(s)
        raise Stop

    monkeypatch.setattr(query_cli, "time", types.SimpleNamespace(sleep=sleep))
    result = cat(url, "--last", "4", "--follow", "--interval", "3s")
    assert slept == [3.0]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["queue_id"], r["queue_offset"], r["unique_key"], r["store_timestamp"]) for r in rows] == \
        in_time_order(written)[-4:]
