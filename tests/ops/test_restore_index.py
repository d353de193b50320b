"""``tiered restore`` writes the broker's index: keys and unique keys found
through it as the broker looks them up, at the restored positions."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from readerkit import archive
from restorekit import CL_FILE
from tiered.cli import app
from tiered.store.indexfile import IndexFile, file_size, index_files, query_offsets, record_keys
from tiered.store.localstore import LocalStore

runner = CliRunner()


@pytest.fixture
def env(archived, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    return archived


def _restore(env, target: Path, *extra: str) -> dict:  # noqa: ANN001
    res = runner.invoke(app, ["restore", "--cold", env.url, "--to", str(target), "--json",
                              "--commitlog-file-size", str(CL_FILE), "--cq-entries", "40", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _restored_records(target: Path) -> list:
    with LocalStore(target) as local:
        out = []
        for topic, qid in local.queues():
            rng = local.queue_range(topic, qid)
            out.extend(item.record for item in local.iter_queue(topic, qid, rng.min_offset))
        return sorted(out, key=lambda r: r.physical_offset)


def _checkpoint(target: Path) -> tuple[int, ...]:
    data = (target / "checkpoint").read_bytes()
    assert len(data) == 4096
    return struct.unpack_from(">qqqqq", data)


@pytest.mark.parametrize("sizes", [(), ("--index-hash-slots", "53", "--index-entries", "40")],
                         ids=["broker-defaults", "small-files"])
def test_every_key_found_at_its_restored_offset(env, tmp_path: Path, sizes: tuple[str, ...]) -> None:
    target = tmp_path / "restored"
    out = _restore(env, target, *sizes)
    kw = {"hash_slots": int(sizes[1]), "entries": int(sizes[3])} if sizes else {}
    index = target / "index"
    names = [p.name for p in index_files(index)]
    assert out["index"]["files"] == names
    records = _restored_records(target)
    keyed = [(r, k.split("#", 1)[1]) for r in records for k in record_keys(r.topic, r.properties, r.sys_flag)]
    assert out["index"]["keys"] == len(keyed) == 60 * 3 + 30  # Orders: unique key + 2 keys; tx commits
    if sizes:
        assert len(names) == -(-len(keyed) // 39)  # entry 0 is never used
    else:
        assert len(names) == 1 and (index / names[0]).stat().st_size == file_size(5_000_000, 20_000_000)
    for rec, key in keyed:
        if key == "shared":
            continue
        assert query_offsets(index, rec.topic, key, **kw) == [rec.physical_offset], (rec.topic, key)
    orders = [r.physical_offset for r in records if r.topic == "Orders"]
    assert query_offsets(index, "Orders", "shared", **kw) == orders[::-1]  # newest first
    # rollbacks are not indexed: their unique keys find nothing
    rollbacks = [r for r in records if r.topic == "TxOrders" and r.sys_flag & 0xC == 0xC]
    assert len(rollbacks) == 30
    for r in rollbacks:
        assert query_offsets(index, "TxOrders", r.properties["UNIQ_KEY"], **kw) == []
    assert query_offsets(index, "Orders", "order-1", **kw) != []
    assert query_offsets(index, "TxOrders", "order-1", **kw) == []  # the topic is part of the key
    # the checkpoint keeps every restored index file on an abnormal start
    last = IndexFile(index / names[-1], **kw)
    assert last.header.end_timestamp == max(r.store_timestamp for r, _ in keyed)
    assert last.header.end_phy_offset == max(r.physical_offset for r, _ in keyed)
    assert _checkpoint(target) == (0, 0, last.header.end_timestamp, 0, 0)
    last.close()


def test_no_index(env, tmp_path: Path) -> None:
    target = tmp_path / "restored"
    out = _restore(env, target, "--no-index")
    assert out["index"] == {"files": [], "keys": 0}
    assert not (target / "index").exists()
    assert _checkpoint(target) == (0, 0, 0, 0, 0)


def test_index_sizes_are_checked(env, tmp_path: Path) -> None:
    res = runner.invoke(app, ["restore", "--cold", env.url, "--to", str(tmp_path / "r"),
                              "--index-entries", "1"])
    assert res.exit_code == 2
    assert not (tmp_path / "r").exists()


def test_restored_rocketmq_store_answers_as_the_original(rmq5_store: Path, open_cold, tmp_path: Path) -> None:  # noqa: ANN001
    """The 5.3.3 fixture archived and restored (its business topics): every
    key and unique key the broker's own index finds in the original finds
    the same messages (topic, queue, queue offset) in the restored store."""
    url = f"file://{tmp_path / 'cold'}"
    archive(rmq5_store, open_cold(url), tmp_path / "state", segment_bytes=64 * 1024)
    target = tmp_path / "restored"
    topics = ["Shipment", "Invoice", "AuditLog", "Reminder"]
    res = runner.invoke(app, ["restore", "--cold", url, "--to", str(target), "--json", "--commitlog-file-size",
                              str(1 << 20), "--cq-entries", "250", "--index-hash-slots", "1500",
                              "--index-entries", "6000", *[a for t in topics for a in ("--topic", t)]])
    assert res.exit_code == 0, res.output
    kw = {"hash_slots": 1500, "entries": 6000}

    def identity(local: LocalStore, offsets: list[int]) -> list[tuple[str, int, int]]:
        recs = [local.read_at(o) for o in offsets]
        return sorted((r.topic, r.queue_id, r.queue_offset) for r in recs)

    looked = 0
    with LocalStore(rmq5_store) as original, LocalStore(target) as restored:
        for topic in topics:
            for qid in original.queue_ids(topic):
                rng = original.queue_range(topic, qid)
                for item in original.iter_queue(topic, qid, rng.min_offset):
                    rec = item.record
                    for key in [k.split("#", 1)[1] for k in record_keys(topic, rec.properties, rec.sys_flag)]:
                        mine = identity(original, query_offsets(rmq5_store / "index", topic, key, **kw))
                        theirs = identity(restored, query_offsets(target / "index", topic, key, **kw))
                        # hash collisions with records of topics not restored are all the original has more
                        assert [m for m in mine if m[0] in topics] == theirs, (topic, key)
                        assert (topic, qid, item.queue_offset) in theirs
                        looked += 1
    assert looked > 3000
