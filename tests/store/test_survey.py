"""The store survey: what RocketMQ 5.3.3 leaves in a store is not reported,
anything else is, by kind and path (stores made by our writer; the 5.3.3
fixture's own run is in tests/e2e/test_rmq5_systopics.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tiered.dispatcher.layoutwatch import SURVEY_INTERVAL_S, LayoutWatch
from tiered.metrics import PrometheusRecorder
from tiered.clock import ManualClock
from tiered.format.codec import BLANK_MAGIC, MAGIC_V2
from tiered.store.localstore import LocalStore
from tiered.store.survey import survey_store


@pytest.fixture
def store(store_writer) -> Path:  # noqa: ANN001
    with store_writer() as w:
        w.put("Orders", 0, b"o" * 20)
        w.put("Orders", 1, b"d", delay_level=3)
    return w.root


def found(root: Path) -> list[tuple[str, str]]:
    return [(f.kind, f.path) for f in survey_store(root).findings]


def test_what_rocketmq_leaves_is_not_reported(store: Path) -> None:
    for name in ("abort", "abort.bak", "lock", "checkpoint", "timerwheel", "epochFileCheckpoint",
                 "epochFileCheckpoint.bak", "brokerIdentity"):
        (store / name).write_bytes(b"")
    for name in ("batchconsumequeue/Bulk/0", "index", "timerlog", "compaction/compactionLog", "kvStore",
                 "dledger-n0/data", "transaction", "consumequeue_ext", "config/rdb"):
        (store / name).mkdir(parents=True, exist_ok=True)
    (store / "batchconsumequeue/Bulk/0" / f"{0:020d}").write_bytes(bytes(46))
    (store / "index" / "20261202001219325").write_bytes(b"")
    (store / "timerlog" / f"{0:020d}").write_bytes(b"")
    (store / "config" / "broker.properties").write_bytes(b"")  # config/ is the broker's, not surveyed
    # a file starting with the end-of-file filler, one of V2 records, one not written yet
    (store / "commitlog" / f"{1 << 30:020d}").write_bytes(struct.pack(">iI", 8, BLANK_MAGIC))
    (store / "commitlog" / f"{2 << 30:020d}").write_bytes(struct.pack(">iI", 99, MAGIC_V2))
    (store / "commitlog" / f"{3 << 30:020d}").write_bytes(bytes(64))
    assert found(store) == []


def test_each_unknown_entry_is_named(store: Path) -> None:
    (store / "backup").mkdir()
    (store / "notes.txt").write_bytes(b"")
    (store / "commitlog" / "00000000000000000000.old").write_bytes(b"")
    (store / "commitlog" / f"{1 << 30:020d}").write_bytes(struct.pack(">iI", 8, 0xCAFEBABE))
    (store / "consumequeue" / "Orders" / "x").mkdir()
    (store / "consumequeue" / "Orders" / "0" / "1").write_bytes(b"")
    (store / "index").mkdir()
    (store / "index" / "index.tmp").write_bytes(b"")
    (store / "timerlog").mkdir()
    (store / "timerlog" / "sub").mkdir()
    assert found(store) == [
        ("directory", "backup"), ("file", "notes.txt"),
        ("file", "commitlog/00000000000000000000.old"), ("magic", f"commitlog/{1 << 30:020d}"),
        ("file", "consumequeue/Orders/0/1"), ("directory", "consumequeue/Orders/x"),
        ("directory", "timerlog/sub"), ("file", "index/index.tmp"),
    ]
    magic = next(f for f in survey_store(store).findings if f.kind == "magic")
    assert magic.detail.startswith("magic 0xCAFEBABE at offset 4")


def write_topics(store: Path, table: object) -> None:
    (store / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": table}), encoding="utf-8")


def test_queue_types(store: Path) -> None:
    write_topics(store, {"A": {"attributes": {"queue.type": "SimpleCQ"}}, "B": {"attributes": {"queue.type": "BatchCQ"}},
                         "C": {"attributes": {"+queue.type": "LogCQ"}}, "D": {"attributes": {"queue.type": "RocksDBCQ"}},
                         "E": {"attributes": None}, "F": {}})
    survey = survey_store(store)
    assert survey.unknown_queue_types == (("C", "LogCQ"), ("D", "RocksDBCQ"))
    assert survey.unreadable_topics == frozenset({"C", "D"})
    assert survey.counts() == {"directory": 0, "file": 0, "magic": 0, "queue_type": 2}


def test_unreadable_topics_json_is_a_finding(store: Path) -> None:
    for name in ("topics.json", "topics.json.bak"):
        (store / "config" / name).write_text("{not json", encoding="utf-8")
    findings = survey_store(store).findings
    assert [(f.kind, f.path) for f in findings] == [("file", "config/topics.json")]
    assert findings[0].detail.startswith("cannot be read, so queue types are unknown")
    write_topics(store, ["not", "a", "table"])
    assert found(store) == [("file", "config/topics.json")]


def test_layout_watch_surveys_once_a_minute_and_counts(store: Path) -> None:
    clock, recorder = ManualClock(), PrometheusRecorder()
    with LocalStore(store) as local:
        watch = LayoutWatch(local, recorder, clock)
        assert watch.current().findings == ()
        (store / "backup").mkdir()
        assert watch.current().findings == ()  # within the minute: the last survey stands
        clock.advance(SURVEY_INTERVAL_S)
        assert [f.path for f in watch.current().findings] == ["backup"]
    assert recorder.registry.get_sample_value("tiered_store_unknown_layout", {"kind": "directory"}) == 1.0
    assert recorder.registry.get_sample_value("tiered_store_unknown_layout", {"kind": "magic"}) == 0.0
