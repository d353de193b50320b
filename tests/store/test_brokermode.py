"""The broker mode (tiered.store.brokermode): told from the store's signs or
the setting; the checkpoint's confirm offset binds in controller mode only;
DLedger and RocksDB ConsumeQueue stores are refused with exit 2."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from tiered.cli import app
from tiered.errors import UnsupportedStoreError
from tiered.store.brokermode import read_confirm, tell
from tiered.store.localstore import LocalStore
from tiered.store.storewriter import Appended, StoreWriter

FILE = 64 * 1024


def make_store(store_writer: Callable[..., StoreWriter], n: int = 20) -> tuple[Path, list[Appended]]:
    """A store of ``n`` records in queue T/0: its root, and where each went."""
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=50) as w:
        return w.root, [w.put("T", 0, b"x" * 200, store_timestamp=1_700_000_000_000 + i) for i in range(n)]


def write_checkpoint(root: Path, confirm: int) -> None:
    """Five big-endian longs padded to a page, as StoreCheckpoint.flush leaves them."""
    (root / "checkpoint").write_bytes(struct.pack(">qqqqq", 1, 1, 1, 0, confirm).ljust(4096, b"\0"))


def write_epoch_file(root: Path, name: str = "epochFileCheckpoint") -> None:
    """CheckpointFile's layout: entry count, CRC32 of the entry lines, one ``epoch-startOffset`` a line."""
    import zlib

    entries = "1-0\n2-4096\n"
    (root / name).write_text(f"2\n{zlib.crc32(entries.encode())}\n{entries}")


def offsets(store: LocalStore) -> list[int]:
    return [item.queue_offset for item in store.iter_queue("T", 0, 0)]


def test_default_mode_ignores_a_stale_confirm_offset(store_writer) -> None:
    root, appended = make_store(store_writer)
    write_checkpoint(root, appended[7].commitlog_offset)  # what recoverNormally leaves: a record's start
    with LocalStore(root) as store:
        mode = store.broker_mode()
        assert (mode.mode, mode.confirm_offset, mode.problem) == ("default", None, None)
        assert mode.told_by.startswith("auto: no epochFileCheckpoint")
        assert store.confirmed_offset() is None
        assert offsets(store) == list(range(20))


@pytest.mark.parametrize("name", ["epochFileCheckpoint", "epochFileCheckpoint.bak"])
def test_auto_tells_controller_mode_from_the_epoch_file(store_writer, name: str) -> None:
    root, appended = make_store(store_writer)
    end7 = appended[7].commitlog_offset + appended[7].size
    write_checkpoint(root, end7)
    write_epoch_file(root, name)
    with LocalStore(root) as store:
        mode = store.broker_mode()
        assert (mode.mode, mode.told_by, mode.confirm_offset, mode.problem) == (
            "controller", f"auto: {name} exists", end7, None)
        assert offsets(store) == list(range(8))
    write_checkpoint(root, end7 - 1)  # record 7 not wholly confirmed; read again, not cached
    with LocalStore(root) as store:
        assert offsets(store) == list(range(7))


def test_the_setting_overrides_what_the_store_shows(store_writer) -> None:
    root, appended = make_store(store_writer)
    end3 = appended[3].commitlog_offset + appended[3].size
    write_checkpoint(root, end3)
    with LocalStore(root, broker_mode="controller") as store:
        assert store.broker_mode().told_by == "broker_mode setting"
        assert offsets(store) == [0, 1, 2, 3]
    write_epoch_file(root)
    with LocalStore(root, broker_mode="default") as store:
        assert store.confirmed_offset() is None
        assert offsets(store) == list(range(20))
    with pytest.raises(ValueError, match="broker_mode must be"):
        tell(root, "raft")


def test_broker_properties_in_the_store_tell_the_mode(store_writer) -> None:
    root, _ = make_store(store_writer)
    props = root / "config" / "broker.properties"
    props.write_text("# written by Configuration.persist\nbrokerName=broker-a\nenableControllerMode=true\n")
    assert tell(root).mode == "controller"
    assert tell(root).told_by == "auto: enableControllerMode=true in config/broker.properties"
    props.write_text("enableControllerMode=false\nenableDLegerCommitLog=true\n")
    with pytest.raises(UnsupportedStoreError) as err:
        LocalStore(root)
    assert err.value.store_type == "dledger"


@pytest.mark.parametrize("size", [0, 20, 36])
def test_controller_mode_with_a_checkpoint_shorter_than_40_bytes_waits_and_says_so(store_writer, size: int) -> None:
    root, _ = make_store(store_writer)
    (root / "checkpoint").write_bytes(b"\x00\x00\x00\x00\x00\x2c\x00\x00" * 5)  # a real confirm, cut short
    (root / "checkpoint").write_bytes((root / "checkpoint").read_bytes()[:size])
    with LocalStore(root, broker_mode="controller") as store:
        mode = store.broker_mode()
        assert mode.confirm_offset == 0
        assert mode.problem is not None
        assert f"is {size} bytes, shorter than the 40" in mode.problem and "unknown" in mode.problem
        assert offsets(store) == []  # nothing is known to be confirmed: nothing archived
    with LocalStore(root) as store:  # default mode never reads it
        assert store.broker_mode().problem is None and len(offsets(store)) == 20


def test_controller_mode_with_a_zeroed_or_missing_confirm_offset_waits_and_says_so(store_writer) -> None:
    root, _ = make_store(store_writer)
    write_checkpoint(root, 0)
    with LocalStore(root, broker_mode="controller") as store:
        mode = store.broker_mode()
        assert (mode.confirm_offset, offsets(store)) == (0, [])
        assert mode.problem == (f"{root / 'checkpoint'} @ 32: the confirm offset is 0: the cluster has "
                                f"confirmed nothing, the archive waits")
    (root / "checkpoint").unlink()
    confirm, problem = read_confirm(root)
    assert confirm == 0 and problem is not None and "is missing" in problem


def test_a_dledger_directory_is_refused(store_writer) -> None:
    root, _ = make_store(store_writer)
    (root / "dledger-n0" / "data").mkdir(parents=True)  # DLedgerConfig: {storeBaseDir}/dledger-{selfId}/data
    (root / "dledger-n0" / "index").mkdir()
    with pytest.raises(UnsupportedStoreError) as err:
        LocalStore(root)
    assert (err.value.store_type, err.value.directory) == ("dledger", str(root / "dledger-n0" / "data"))
    assert "auto: dledger-n0/data exists" in str(err.value)
    assert "which tiered does not read; nothing is archived" in str(err.value)
    with LocalStore(root, broker_mode="default") as store:  # the operator's word wins
        assert len(offsets(store)) == 20


def rocksdb_consumequeue(root: Path) -> Path:
    """A RocksDB database where RocksDBConsumeQueueStore opens it: in ``consumequeue/`` itself."""
    cq = root / "consumequeue"
    cq.mkdir(parents=True, exist_ok=True)
    (cq / "CURRENT").write_text("MANIFEST-000005\n")
    for name in ("MANIFEST-000005", "000004.log", "OPTIONS-000007", "IDENTITY", "LOCK"):
        (cq / name).write_bytes(b"\0" * 16)
    return cq


def test_a_rocksdb_consumequeue_is_refused(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    cq = rocksdb_consumequeue(tmp_path)
    with pytest.raises(UnsupportedStoreError) as err:
        LocalStore(tmp_path)
    assert (err.value.store_type, err.value.directory) == ("defaultRocksDB", str(cq))
    assert str(err.value) == (f"{tmp_path}: store type defaultRocksDB (CURRENT found): the ConsumeQueues are a "
                              f"RocksDB database in {cq}, which tiered cannot read; nothing is archived")


def test_rocksdb_double_write_keeps_the_file_consumequeues_readable(store_writer) -> None:
    root, _ = make_store(store_writer)
    rocksdb_consumequeue(root)
    props = root / "config" / "broker.properties"
    props.write_text("storeType=default\nrocksdbCQDoubleWriteEnable=true\n")
    with LocalStore(root) as store:
        assert len(offsets(store)) == 20
    props.write_text("storeType=defaultRocksDB\n")
    with pytest.raises(UnsupportedStoreError, match=r"\(storeType=defaultRocksDB in config/broker.properties\)"):
        LocalStore(root)


@pytest.mark.parametrize("command", ["dispatch", "status", "verify", "inspect", "serve"])
def test_every_command_that_reads_the_store_refuses_rocksdb_with_exit_2(tmp_path: Path, command: str) -> None:
    store = tmp_path / "store"
    (store / "commitlog").mkdir(parents=True)
    cq = rocksdb_consumequeue(store)
    args = [command, "--store", str(store)]
    if command != "inspect":
        args += ["--cold", f"file://{tmp_path}/cold"]
    env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_METRICS__PORT": "0"}
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "store type defaultRocksDB" in lines[0] and str(cq) in lines[0]
    assert not (tmp_path / "cold").exists() or not any((tmp_path / "cold").rglob("manifest*"))


def test_verify_judges_the_oldest_unarchived_record_whatever_holds_it(store_writer) -> None:
    from tiered.ops.verify import PendingCheck, VerifyReport, check_pending

    root, appended = make_store(store_writer)
    end7 = appended[7].commitlog_offset + appended[7].size
    write_checkpoint(root, end7)

    archived_to = 8  # what the archive holds: 0..7, all confirmed

    def pending(local: LocalStore, now_ms: int) -> VerifyReport:
        report = VerifyReport()
        manifests: Any = {("T", 0): SimpleNamespace(next_offset=archived_to)}
        check_pending(manifests, local, PendingCheck(accepts=lambda t: True, max_delay_ms=60_000, now_ms=now_ms),
                      report)
        return report

    stored = 1_700_000_000_000 + 8  # record 8's store time
    with LocalStore(root, broker_mode="controller") as local:
        young = pending(local, stored + 10_000)
        assert (young.within_delay, young.waiting_confirm, young.pending) == ({"T/0"}, {"T/0": end7}, {})
        old = pending(local, stored + 120_000)
        assert old.pending == {"T/0": f"12 messages from offset 8 not archived, the oldest stored 120 s ago (max "
                                      f"delay 60 s); waiting for the cluster to confirm: confirmed CommitLog "
                                      f"offset {end7}, the first record ends at {end7 + appended[8].size}"}
    with LocalStore(root) as local:
        old = pending(local, stored + 120_000)
        assert old.waiting_confirm == {} and old.pending["T/0"].endswith("archive ends at offset 8")
    # the first unarchived record zeroed while later entries exist: lost, not late, so a problem
    with open(root / "commitlog" / f"{0:020d}", "r+b") as fh:
        fh.seek(appended[8].commitlog_offset)
        fh.write(b"\0" * appended[8].size)
    with LocalStore(root) as local:
        report = pending(local, stored + 120_000)
        assert report.pending == {} and len(report.problems) == 1
        assert report.problems[0].startswith("T/0: its first unarchived record (offset 8) is missing while later "
                                             "ConsumeQueue entries exist: ")
