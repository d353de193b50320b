"""A store with every record kind the project reads, archived by the real
dispatcher: the input of the restore and consumer-position tests."""

from __future__ import annotations

import json
from pathlib import Path

from readerkit import archive

from tiered.format.codec import Host, MagicVersion, Message
from tiered.store.storewriter import StoreWriter

CLUSTER = "ReadCluster"
BROKER = "broker-r"
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z
MINUTE = 60_000
CL_FILE = 32 * 1024  # several CommitLog files


def write_kinds(root: Path, *, per_topic: int = 60, cq_entries: int = 50) -> None:
    """Orders (3 queues, keys, tags, user properties, IPv4 and IPv6 hosts, a v2
    record), %RETRY%g1, %DLQ%g1, transactional commit/rollback records, and a
    queue that starts above offset 0 (filler entries), interleaved in time."""
    with StoreWriter(root, commitlog_file_size=CL_FILE, cq_entries_per_file=cq_entries) as w:
        w.fill_queue_head("Late", 0, 73)
        for i in range(per_topic):
            ts = T0 + i * MINUTE
            six = i % 3 == 0
            host = Host("2001:db8::7", 40000 + i) if six else Host(f"10.0.0.{i % 7}", 40000)
            w.put("Orders", i % 3, f"order-{i}".encode() * (5 + i % 40), tags=("TagA", "TagB", None)[i % 3],
                  keys=[f"order-{i}", "shared"], unique_key=f"UNIQ-O-{i:06d}",
                  properties={"app": "shop", "region": "eu-west-1"}, store_timestamp=ts, born_timestamp=ts - 3,
                  born_host=host, store_host=Host("::1", 10911) if six else None, flag=i)
            w.put("%RETRY%g1", 0, f"retry-{i}".encode() * 20, tags="TagA", reconsume_times=1 + i % 3,
                  properties={"RETRY_TOPIC": "Orders", "ORIGIN_MESSAGE_ID": f"ORIG{i}", "MAX_RECONSUME_TIMES": "16"},
                  store_timestamp=ts + 1, born_timestamp=ts - 100)
            w.put("%DLQ%g1", 0, bytes(range(256)) * (1 + i % 4), properties={
                "DLQ_ORIGIN_TOPIC": "Orders", "DLQ_ORIGIN_MESSAGE_ID": f"MSG{i}"},
                reconsume_times=16, store_timestamp=ts + 2, born_timestamp=ts - 200)
            kind = 0x8 if i % 2 == 0 else 0xC  # transaction commit / rollback
            w.append(Message(topic="TxOrders", queue_id=i % 2, body=f"tx-{i}".encode() * 30,
                             properties={"TRAN_MSG": "true", "PGROUP": "txgroup", "UNIQ_KEY": f"TX{i:05d}"},
                             sys_flag=kind, prepared_transaction_offset=1_000_000 + i * 97,
                             born_timestamp=ts - 1, store_timestamp=ts + 3, born_host=Host("10.1.1.1", 50000),
                             version=MagicVersion.V2 if i % 5 == 0 else None))
            if i >= per_topic // 2:
                w.put("Late", 0, f"late-{i}".encode(), tags="L", store_timestamp=ts + 4, born_timestamp=ts + 4)


def build(root: Path, store, state: Path) -> None:  # noqa: ANN001 - an ObjectStore
    write_kinds(root)
    archive(root, store, state, segment_bytes=8 * 1024)


def inspect_rows(runner, store: Path) -> list[dict]:  # noqa: ANN001 - a CliRunner
    from tiered.cli import app

    res = runner.invoke(app, ["inspect", "--store", str(store), "--json"])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines()]


def without_positions(rows: list[dict]) -> list[dict]:
    """Every field but the CommitLog position and what is derived from it."""
    return [{k: v for k, v in r.items() if k not in ("commitlog_offset", "msg_id")} for r in rows]
