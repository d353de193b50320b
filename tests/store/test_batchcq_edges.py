"""BatchCQ layouts the one real store does not have, written with the
project's store writer following RocketMQ's code: several
BatchConsumeQueue files per queue, a queue whose files start above entry 0
(the broker deleted the first ones) with offsets above 0; read, archived,
read back and restored."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from tiered.cli import app
from tiered.store.batchcq import BCQ_ENTRY_SIZE, BatchEntry
from tiered.store.batchwriter import BatchWriter, InnerDraft
from tiered.store.localstore import LocalStore
from tiered.store.storewriter import StoreWriter

runner = CliRunner()
T0 = 1_790_000_000_000
PER_FILE = 4


def build(store_writer: Callable[..., StoreWriter]) -> dict[int, list[tuple[int, str]]]:
    """Queue 0 from 0: 11 records over 3 files; queue 1 from entry 8 (its
    third file) at offset 1000: 5 records. Returns (offset, key) per message."""
    want: dict[int, list[tuple[int, str]]] = {0: [], 1: []}
    with store_writer(commitlog_file_size=1 << 16, cq_entries_per_file=10) as w:
        bw = BatchWriter(w, bcq_entries_per_file=PER_FILE)
        bw.start_at("Bulk", 1, entry=2 * PER_FILE, offset=1000)
        w.put("Plain", 0, b"not a batch", store_timestamp=T0)
        t = T0
        for i in range(16):
            qid = 0 if i < 11 else 1
            t += 10
            if i % 4 == 3:
                key = f"S-{qid}-{i}"
                bw.put_single("Bulk", qid, f"single {i}".encode(), store_timestamp=t,
                              properties={"KEYS": key, "TAGS": "one"})
                want[qid].append((bw.next_offset("Bulk", qid) - 1, key))
                continue
            n = 1 + i % 5
            base = bw.next_offset("Bulk", qid)
            drafts = [InnerDraft(body=f"batch {i} message {j} ".encode() * (j + 1),
                                 properties={"KEYS": f"K-{qid}-{i}-{j}", "TAGS": "evt", "UNIQ_KEY": f"U{i:03d}{j:02d}"})
                      for j in range(n)]
            bw.put_batch("Bulk", qid, drafts, properties={"UNIQ_KEY": f"OUTER{i:03d}", "WAIT": "true"},
                         store_timestamp=t)
            want[qid].extend((base + j, f"K-{qid}-{i}-{j}") for j in range(n))
        w.write_checkpoint()
    return want


def env(tmp_path: Path) -> dict[str, str]:
    return {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "C", "TIERED_BROKER": "b",
            "TIERED_LOG__LEVEL": "WARNING"}


def test_read_several_files_and_a_queue_above_zero(tmp_path: Path, store_writer) -> None:
    store = tmp_path / "store"
    want = build(store_writer)
    q1 = sorted(p.name for p in (store / "batchconsumequeue" / "Bulk" / "1").iterdir())
    assert q1 == [f"{2 * PER_FILE * BCQ_ENTRY_SIZE:020d}", f"{3 * PER_FILE * BCQ_ENTRY_SIZE:020d}"]
    assert len(list((store / "batchconsumequeue" / "Bulk" / "0").iterdir())) == 3
    with LocalStore(store) as local:
        assert local.is_batch("Bulk") and not local.is_batch("Plain")
        assert local.queue_range("Bulk", 1).min_offset == 2 * PER_FILE
        assert local.batch_offset_range("Bulk", 1) == type(local.queue_range("Bulk", 1))(1000, want[1][-1][0] + 1)
        assert local.batch_offset_range("Bulk", 0).max_offset == len(want[0])
    result = runner.invoke(app, ["inspect", "--store", str(store), "--topic", "Bulk", "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    for qid in (0, 1):
        msgs = [(m["queue_offset"], m["keys"][0]) for r in rows if r["queue_id"] == qid for m in r["inner_messages"]]
        assert msgs == want[qid]
    result = runner.invoke(app, ["inspect", "--store", str(store), "--topic", "Bulk", "--queue", "1",
                                 "--offset", "1003", "--limit", "1", "--json"])
    # 1003 is the last message of the batch at 1001 (a single at 1000, then three)
    assert [json.loads(line)["cq_offset"] for line in result.stdout.splitlines()] == [1001]


def test_archive_read_back_and_restore(tmp_path: Path, store_writer) -> None:
    store = tmp_path / "store"
    want = build(store_writer)
    cold = f"file://{tmp_path}/cold"
    result = runner.invoke(app, ["dispatch", "--all", "--store", str(store), "--cold", cold], env=env(tmp_path))
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["verify", "--store", str(store), "--cold", cold], env=env(tmp_path))
    assert result.exit_code == 0, result.output
    for qid in (0, 1):
        result = runner.invoke(app, ["cat", "--topic", "Bulk", "--queue", str(qid), "--cold", cold, "--json"],
                               env=env(tmp_path))
        assert result.exit_code == 0, result.output
        assert [(d["queue_offset"], d["keys"][0]) for d in map(json.loads, result.stdout.splitlines())] == want[qid]
    result = runner.invoke(app, ["cat", "--topic", "Bulk", "--queue", "1", "--cold", cold, "--json", "--offset",
                                 "1002", "--limit", "3"], env=env(tmp_path))
    assert [json.loads(line)["queue_offset"] for line in result.stdout.splitlines()] == [1002, 1003, 1004]

    target = tmp_path / "restored"
    result = runner.invoke(app, ["restore", "--to", str(target), "--cold", cold, "--commitlog-file-size", "65536",
                                 "--cq-entries", "10", "--bcq-entries", str(PER_FILE), "--json"], env=env(tmp_path))
    assert result.exit_code == 0, result.output
    topics = json.loads((target / "config" / "topics.json").read_text())["topicConfigTable"]
    assert topics["Bulk"]["attributes"] == {"queue.type": "BatchCQ"} and topics["Plain"]["attributes"] == {}
    with LocalStore(target) as restored:
        for qid in (0, 1):
            d_orig = store / "batchconsumequeue" / "Bulk" / str(qid)
            d_new = target / "batchconsumequeue" / "Bulk" / str(qid)
            assert sorted(p.name for p in d_new.iterdir()) == sorted(p.name for p in d_orig.iterdir())
            for f in d_orig.iterdir():
                a, b = f.read_bytes(), (d_new / f.name).read_bytes()
                assert len(a) == len(b) == PER_FILE * BCQ_ENTRY_SIZE
                for at in range(0, len(a), BCQ_ENTRY_SIZE):
                    old, new = BatchEntry.unpack(a, at), BatchEntry.unpack(b, at)
                    if not old.written:
                        assert not new.written
                        continue
                    # every field as the broker wrote it but the record's new CommitLog position
                    assert new.pack()[8:] == old.pack()[8:]
                    assert restored.read_at(new.commitlog_offset).size == new.size


def test_status_and_verify_count_messages(tmp_path: Path, store_writer) -> None:
    """Archived, then two batches of 3 and 4 messages more: status and verify
    speak of the 7 messages from the archive's end, not of 2 entries."""
    store = tmp_path / "store"
    want = build(store_writer)
    cold = f"file://{tmp_path}/cold"
    result = runner.invoke(app, ["dispatch", "--all", "--store", str(store), "--cold", cold], env=env(tmp_path))
    assert result.exit_code == 0, result.output
    end = len(want[0])
    with store_writer() as w:
        bw = BatchWriter(w, bcq_entries_per_file=PER_FILE)
        bw.start_at("Bulk", 0, entry=11, offset=end)
        for n in (3, 4):
            bw.put_batch("Bulk", 0, [InnerDraft(body=b"more %d" % j) for j in range(n)], store_timestamp=T0 + 999)
    result = runner.invoke(app, ["status", "--store", str(store), "--cold", cold, "--topic", "Bulk", "--json"],
                           env=env(tmp_path))
    rows = {r["queue_id"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert {k: rows[0][k] for k in ("local_min_offset", "local_max_offset", "archived_first_offset",
                                    "archived_next_offset", "lag_messages", "batch")} == {
        "local_min_offset": 0, "local_max_offset": end + 7, "archived_first_offset": 0,
        "archived_next_offset": end, "lag_messages": 7, "batch": True}
    assert (rows[1]["local_min_offset"], rows[1]["archived_first_offset"], rows[1]["lag_messages"]) == (1000, 1000, 0)
    result = runner.invoke(app, ["verify", "--store", str(store), "--cold", cold, "--topic", "Bulk"],
                           env=env(tmp_path))
    assert result.exit_code == 1
    assert f"Bulk/0: 7 messages from offset {end} not archived" in result.output


def test_consumer_positions_are_message_offsets(tmp_path: Path, store_writer) -> None:
    """Consumers commit message offsets: a BatchCQ queue's ranges against
    them are its messages' (1000.. for queue 1), never its entries'."""
    from tiered.archive.manifest import Manifest
    from tiered.store.consumeroffsets import PositionState, archived_ranges, store_positions

    store = tmp_path / "store"
    want = build(store_writer)
    cold = f"file://{tmp_path}/cold"
    result = runner.invoke(app, ["dispatch", "--all", "--store", str(store), "--cold", cold], env=env(tmp_path))
    assert result.exit_code == 0, result.output
    (store / "config" / "consumerOffset.json").write_text(json.dumps(
        {"offsetTable": {"Bulk@g": {"0": 3, "1": 1002}}}))
    manifests = {}
    for qid in (0, 1):
        manifests[("Bulk", qid)] = Manifest.from_bytes(
            (tmp_path / "cold" / "C" / "b" / "Bulk" / str(qid) / "manifest.json").read_bytes())
    with LocalStore(store) as local:
        rows = {p.queue_id: p for p in store_positions(local, archived_ranges(manifests))}
    assert (rows[1].local_min_offset, rows[1].local_max_offset, rows[1].archived_first_offset,
            rows[1].archived_next_offset, rows[1].state) == (1000, want[1][-1][0] + 1, 1000, want[1][-1][0] + 1,
                                                             PositionState.LOCAL)
    assert (rows[0].local_max_offset, rows[0].archived_next_offset) == (len(want[0]), len(want[0]))


def test_cat_group_from_committed_message_offsets(tmp_path: Path, store_writer) -> None:
    """``cat --group``: queue 0's first BatchConsumeQueue file deleted by the
    broker, its committed offset 3 is read from the archive up to the local
    store's first message, then locally; queue 1 from 1002, inside a batch."""
    store = tmp_path / "store"
    want = build(store_writer)
    cold = f"file://{tmp_path}/cold"
    result = runner.invoke(app, ["dispatch", "--all", "--store", str(store), "--cold", cold], env=env(tmp_path))
    assert result.exit_code == 0, result.output
    (store / "batchconsumequeue" / "Bulk" / "0" / f"{0:020d}").unlink()
    (store / "config" / "consumerOffset.json").write_text(json.dumps({"offsetTable": {"Bulk@g": {"0": 3, "1": 1002}}}))
    result = runner.invoke(app, ["cat", "--topic", "Bulk", "--group", "g", "--store", str(store), "--cold", cold,
                                 "--json"], env=env(tmp_path))
    assert result.exit_code == 0, result.output
    got = [(d["queue_id"], d["queue_offset"], d["keys"][0]) for d in map(json.loads, result.stdout.splitlines())]
    assert got == [(0, o, k) for o, k in want[0] if o >= 3] + [(1, o, k) for o, k in want[1] if o >= 1002]


def test_an_unreadable_topics_json_leaves_the_directories_to_tell(tmp_path: Path, store_writer) -> None:
    store = tmp_path / "store"
    build(store_writer)
    (store / "config" / "topics.json").write_text("{not json")
    (store / "config" / "topics.json.bak").write_text("[1]")
    with LocalStore(store) as local:
        assert local.topics() == ["Bulk", "Plain"] and local.is_batch("Bulk") and not local.is_batch("Plain")
        assert local.batch_offset_range("Bulk", 1).min_offset == 1000


def test_many_small_segments(tmp_path: Path, store_writer) -> None:
    """Segments of 1 KiB (a few records each): message offsets are found
    across and inside segments, and ls, verify, find and export agree."""
    store = tmp_path / "store"
    want = build(store_writer)
    cold = f"file://{tmp_path}/cold"
    small = {**env(tmp_path), "TIERED_DISPATCH__SEGMENT_BYTES": "1KiB", "TIERED_DISPATCH__UPLOAD_BYTES": "1KiB"}
    result = runner.invoke(app, ["dispatch", "--all", "--store", str(store), "--cold", cold], env=small)
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "cold" / "C" / "b" / "Bulk" / "0" / "manifest.json").read_text())
    segs = manifest["segments"]
    assert len(segs) >= 4 and all(a["msg_end"] == b["msg_start"] for a, b in zip(segs, segs[1:]))
    assert (segs[0]["msg_start"], segs[-1]["msg_end"]) == (0, len(want[0]))
    assert runner.invoke(app, ["verify", "--store", str(store), "--cold", cold], env=env(tmp_path)).exit_code == 0
    result = runner.invoke(app, ["ls", "--cold", cold, "--json"], env=env(tmp_path))
    assert {(r["queue_id"], r["first_offset"], r["next_offset"]) for r in map(json.loads, result.stdout.splitlines())
            if r["topic"] == "Bulk"} == {(0, 0, len(want[0])), (1, 1000, want[1][-1][0] + 1)}
    for qid in (0, 1):
        for start in [o for o, _k in want[qid]]:
            result = runner.invoke(app, ["cat", "--topic", "Bulk", "--queue", str(qid), "--cold", cold, "--json",
                                         "--offset", str(start), "--limit", "2"], env=env(tmp_path))
            assert [(d["queue_offset"], d["keys"][0]) for d in map(json.loads, result.stdout.splitlines())] == [
                (o, k) for o, k in want[qid] if o >= start][:2]
    result = runner.invoke(app, ["find", "--key", "K-0-9-3", "--cold", cold, "--json"], env=env(tmp_path))
    assert [json.loads(line)["queue_offset"] for line in result.stdout.splitlines()] == [23]
    # the cleaner merges them: one segment, its message range the run's, its key index the messages' keys
    merging = {**env(tmp_path), "TIERED_RETENTION__DEFAULT_HOURS": "forever", "TIERED_CLEANER__MERGE_MIN_BYTES": "3KiB",
               "TIERED_CLEANER__MERGE_TARGET_BYTES": "1MiB"}
    result = runner.invoke(app, ["clean", "--store", str(store), "--cold", cold], env=merging)
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "cold" / "C" / "b" / "Bulk" / "0" / "manifest.json").read_text())
    assert [(s["q_start"], s["q_end"], s["msg_start"], s["msg_end"]) for s in manifest["segments"]] == [
        (0, 11, 0, len(want[0]))]
    assert runner.invoke(app, ["verify", "--store", str(store), "--cold", cold], env=env(tmp_path)).exit_code == 0
    result = runner.invoke(app, ["find", "--key", "K-0-9-3", "--cold", cold, "--json"], env=env(tmp_path))
    assert [json.loads(line)["queue_offset"] for line in result.stdout.splitlines()] == [23]
