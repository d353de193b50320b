"""The fast produce path and the buffered writer write exactly what the
general path (``StoreWriter.put``, unbuffered) writes, byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatchkit import produce_draws
from tiered.format.codec import Host
from tiered.store.storewriter import StoreWriter, produce_messages

BORN = Host("127.0.0.1", 50000)


def tree(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if path.parent.name == "config":
                continue  # topics.json carries a wall-clock timestamp
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def put_reference(root: Path, topic: str, n: int, *, queues: int, body_size: int, keys: bool, tags: str | None,
                  start_ms: int, store_host: Host, born: Host) -> None:
    """What produce wrote before the fast path: one put() per message."""
    with StoreWriter(root, commitlog_file_size=8192, cq_entries_per_file=5, store_host=store_host) as w:
        for i, (uid, body) in enumerate(produce_draws(7, n, body_size)):
            w.put(topic, i % queues, body, tags=tags, keys=[f"key-{i}"] if keys else None,
                  unique_key=uid, store_timestamp=start_ms + i * 3, born_timestamp=start_ms + i * 3, born_host=born)


@pytest.mark.parametrize(("topic", "keys", "tags", "ipv6"), [
    ("T", True, "TagA", False),
    ("T", False, None, False),
    ("%RETRY%group", True, None, False),
    ("%DLQ%group", False, "x y", True),
    ("L" * 200, True, "t", False),  # magic v2: a two-byte topic length
])
def test_produce_messages_equals_put_byte_for_byte(tmp_path: Path, topic: str, keys: bool, tags: str | None,
                                                   ipv6: bool) -> None:
    store_host = Host("::1", 10911) if ipv6 else Host("127.0.0.1", 10911)
    born = Host("::1", 50000) if ipv6 else BORN
    put_reference(tmp_path / "ref", topic, 37, queues=3, body_size=300, keys=keys, tags=tags,
                  start_ms=1_700_000_000_000, store_host=store_host, born=born)
    with StoreWriter(tmp_path / "fast", commitlog_file_size=8192, cq_entries_per_file=5, store_host=store_host,
                     buffer_bytes=1000) as w:
        produce_messages(w, topic, queues=3, messages=37, body_size=300, keys=keys, tags=tags, seed=7,
                         start_ms=1_700_000_000_000, interval_ms=3, born_host=born)
    ref, fast = tree(tmp_path / "ref"), tree(tmp_path / "fast")
    assert sorted(ref) == sorted(fast)
    assert len([k for k in ref if k.startswith("commitlog")]) > 1  # the files rolled
    for name in ref:
        assert fast[name] == ref[name], name


def test_buffered_writer_holds_entries_until_their_records_are_written(tmp_path: Path) -> None:
    w = StoreWriter(tmp_path, commitlog_file_size=1 << 20, cq_entries_per_file=100, buffer_bytes=1 << 20)
    a = w.put("T", 0, b"x" * 100, store_timestamp=1)
    cq = tmp_path / "consumequeue" / "T" / "0" / f"{0:020d}"
    cl = tmp_path / "commitlog" / f"{0:020d}"
    assert not cq.exists() or cq.read_bytes()[:20] == bytes(20)  # nothing visible yet
    w.write_pending()
    assert cl.read_bytes()[a.commitlog_offset:a.commitlog_offset + 4] == a.size.to_bytes(4, "big")
    assert cq.read_bytes()[:12] == a.commitlog_offset.to_bytes(8, "big") + a.size.to_bytes(4, "big")
    b = w.put("T", 0, b"y" * 10, store_timestamp=2)
    w.close()  # close writes what is pending
    assert cq.read_bytes()[20:32] == b.commitlog_offset.to_bytes(8, "big") + b.size.to_bytes(4, "big")
    assert b.queue_offset == 1 and b.commitlog_offset == a.commitlog_offset + a.size


@pytest.mark.parametrize("chunk_bytes", [1, 700, 1 << 20])  # one message a chunk, a few, all at once
def test_produce_equals_put_across_chunks_digits_and_file_rolls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                chunk_bytes: int) -> None:
    # 1,234 messages: key digits change at 10, 100 and 1,000 (a record grows by
    # a byte there), 7 queues, CommitLog files of 8 KiB and ConsumeQueue files
    # of 5 entries roll all the time
    from tiered.store import storewriter

    monkeypatch.setattr(storewriter, "_CHUNK_BYTES", chunk_bytes)
    put_reference(tmp_path / "ref", "T", 1234, queues=7, body_size=41, keys=True, tags="TagA",
                  start_ms=1_700_000_000_000, store_host=Host("127.0.0.1", 10911), born=BORN)
    with StoreWriter(tmp_path / "fast", commitlog_file_size=8192, cq_entries_per_file=5, buffer_bytes=5000) as w:
        produce_messages(w, "T", queues=7, messages=1234, body_size=41, keys=True, tags="TagA", seed=7,
                         start_ms=1_700_000_000_000, interval_ms=3, born_host=BORN)
        assert [w.next_queue_offset("T", q) for q in range(7)] == [len(range(q, 1234, 7)) for q in range(7)]
    ref, fast = tree(tmp_path / "ref"), tree(tmp_path / "fast")
    assert sorted(ref) == sorted(fast) and len(ref) > 200
    assert [name for name in ref if fast[name] != ref[name]] == []


def test_produce_appends_after_what_a_store_holds(tmp_path: Path) -> None:
    # a second produce continues every queue's offsets and the CommitLog position
    with StoreWriter(tmp_path / "s", commitlog_file_size=8192, cq_entries_per_file=5) as w:
        w.put("T", 1, b"first", store_timestamp=5, born_host=BORN)
    with StoreWriter(tmp_path / "s", commitlog_file_size=8192, cq_entries_per_file=5) as w:
        at = w.position
        produce_messages(w, "T", queues=3, messages=4, body_size=10, keys=False, tags=None, seed=1,
                         start_ms=7, interval_ms=0, born_host=BORN)
        assert [w.next_queue_offset("T", q) for q in range(3)] == [2, 2, 1]
    from tiered.store.localstore import LocalStore

    with LocalStore(tmp_path / "s") as store:
        got = [(item.queue_offset, item.record.physical_offset, item.record.body_bytes())
               for item in store.iter_queue("T", 1, 0)]
        first = next(iter(store.iter_queue("T", 0, 0))).record  # message 0 of the produce
    bodies = [body for _uid, body in produce_draws(1, 4, 10)]
    assert (first.physical_offset, first.body_bytes()) == (at, bodies[0])
    assert got == [(0, 0, b"first"), (1, at + first.size, bodies[1])]
