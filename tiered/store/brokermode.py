"""Which replication mode wrote a store, and the confirm offset it binds.

RocketMQ honours the checkpoint's confirm offset (byte 32) only in controller
mode (``CommitLog.getConfirmOffset``): there a record past it may still be
truncated on a fail-over, so the archive waits at it. In default mode the
field is whatever the last normal recovery left (the *start* of the last
record it found) and the broker serves everything up to its max offset, so
it binds nothing. A DLedger broker keeps its CommitLog in DLedger's own files
(``dledger-{selfId}/data``, records wrapped in DLedger entries), which tiered
does not read: such a store is refused, as is a RocksDB ConsumeQueue
(``storeType=defaultRocksDB``: a RocksDB database in ``consumequeue/``).

The mode comes from the ``broker_mode`` setting, or (``auto``) from the
signs RocketMQ leaves in the store root; docs/brokermode.md lists them.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from tiered.errors import UnsupportedStoreError

MODES = ("default", "controller", "dledger")
CHECKPOINT_CONFIRM_AT = 32  # StoreCheckpoint: five big-endian longs, confirmPhyOffset the last
CHECKPOINT_MIN_SIZE = CHECKPOINT_CONFIRM_AT + 8
EPOCH_FILE = "epochFileCheckpoint"  # MessageStoreConfig.getStorePathEpochFile's default
BROKER_PROPERTIES = ("config", "broker.properties")  # BrokerPathConfigHelper's default, under ~/store
_CONFIRM = struct.Struct(">q")


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerMode:
    """The mode, how it was told, and (controller mode only) the CommitLog
    offset the cluster confirmed: records ending after it are not archived."""

    mode: str  # default | controller | dledger
    told_by: str
    confirm_offset: int | None = None
    problem: str | None = None  # the checkpoint could not give a clean confirm offset

    @property
    def bound_applies(self) -> bool:
        return self.mode == "controller"

    def holds(self, commitlog_offset: int, size: int) -> bool:
        """The record at ``commitlog_offset`` ends past the confirm offset:
        it waits for the cluster (RocketMQ's reput stops there too)."""
        return self.confirm_offset is not None and commitlog_offset + size > self.confirm_offset

    def describe(self) -> str:
        """``controller (auto: ... exists)``: one status line's words."""
        return f"{self.mode} ({self.told_by})"


def _properties(root: Path) -> dict[str, str]:
    """``config/broker.properties`` (written by the broker's Configuration.persist
    when it is kept under the store root), as key -> value; {} when absent."""
    try:
        text = root.joinpath(*BROKER_PROPERTIES).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _dledger_dirs(root: Path) -> list[Path]:
    """DLedger's store directories: ``{root}/dledger-{selfId}`` holding ``data/``."""
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("dledger-"))
    except OSError:
        return []
    return [root / n for n in names if (root / n / "data").is_dir()]


def tell(root: Path, setting: str = "auto") -> BrokerMode:
    """The mode (without the bound): the setting, or what the store shows."""
    if setting != "auto":
        if setting not in MODES:
            raise ValueError(f"broker_mode must be auto or one of {', '.join(MODES)}, not {setting!r}")
        return BrokerMode(mode=setting, told_by="broker_mode setting")
    props = _properties(root)
    where = "/".join(BROKER_PROPERTIES)
    if props.get("enableDLegerCommitLog", "").lower() == "true":
        return BrokerMode(mode="dledger", told_by=f"auto: enableDLegerCommitLog=true in {where}")
    if props.get("enableControllerMode", "").lower() == "true":
        return BrokerMode(mode="controller", told_by=f"auto: enableControllerMode=true in {where}")
    dledger = _dledger_dirs(root)
    if dledger:
        return BrokerMode(mode="dledger", told_by=f"auto: {dledger[0].name}/data exists")
    for name in (EPOCH_FILE, EPOCH_FILE + ".bak"):
        if (root / name).is_file():
            return BrokerMode(mode="controller", told_by=f"auto: {name} exists")
    return BrokerMode(mode="default", told_by=f"auto: no {EPOCH_FILE} and no dledger-*/data in the store")


def read_confirm(root: Path) -> tuple[int, str | None]:
    """The checkpoint's confirm offset and, when it is not a clean reading,
    why. RocketMQ maps a missing or short checkpoint as zeros and its
    controller-mode recovery raises a zero to the CommitLog's first offset:
    nothing the archive can take is confirmed, so it waits at 0 (and says so)."""
    path = root / "checkpoint"
    try:
        with open(path, "rb") as fh:
            data = fh.read(CHECKPOINT_MIN_SIZE)
    except FileNotFoundError:
        return 0, f"{path} is missing: no confirm offset, the archive waits"
    if len(data) < CHECKPOINT_MIN_SIZE:
        return 0, (f"{path} is {len(data)} bytes, shorter than the {CHECKPOINT_MIN_SIZE} that hold the confirm "
                   f"offset (byte {CHECKPOINT_CONFIRM_AT}): the confirm offset is unknown, the archive waits")
    confirm = _CONFIRM.unpack_from(data, CHECKPOINT_CONFIRM_AT)[0]
    if confirm <= 0:
        return 0, (f"{path} @ {CHECKPOINT_CONFIRM_AT}: the confirm offset is {confirm}: the cluster has confirmed "
                   f"nothing, the archive waits")
    return confirm, None


def with_bound(told: BrokerMode, root: Path) -> BrokerMode:
    """``told`` with the confirm offset read now (controller mode only: the
    broker moves it as replicas acknowledge)."""
    if not told.bound_applies:
        return told
    confirm, problem = read_confirm(root)
    return replace(told, confirm_offset=confirm, problem=problem)


def refuse_unreadable(root: Path, told: BrokerMode) -> None:
    """Raise UnsupportedStoreError (exit 2) for a store tiered cannot read:
    a DLedger CommitLog or a RocksDB ConsumeQueue. Never archive nothing quietly."""
    if told.mode == "dledger":
        dirs = _dledger_dirs(root)
        where = dirs[0] / "data" if dirs else root / "dledger-*" / "data"
        raise UnsupportedStoreError(
            "dledger", str(where),
            f"{root}: broker mode dledger ({told.told_by}): the CommitLog is in DLedger's own files ({where}), "
            f"which tiered does not read; nothing is archived")
    props = _properties(root)
    cq = root / "consumequeue"
    rocks = _rocksdb_files(cq)
    configured = props.get("storeType", "").lower() == "defaultrocksdb"
    double_write = props.get("rocksdbCQDoubleWriteEnable", "").lower() == "true" and not configured
    if configured or (rocks and not double_write):
        why = "storeType=defaultRocksDB in " + "/".join(BROKER_PROPERTIES) if configured else f"{rocks} found"
        raise UnsupportedStoreError(
            "defaultRocksDB", str(cq),
            f"{root}: store type defaultRocksDB ({why}): the ConsumeQueues are a RocksDB database in {cq}, "
            f"which tiered cannot read; nothing is archived")


def _rocksdb_files(cq: Path) -> str | None:
    """The name of a RocksDB file in ``consumequeue/`` (RocksDBConsumeQueueStore
    opens its database right there), or None."""
    try:
        names = os.listdir(cq)
    except OSError:
        return None
    for name in sorted(names):
        if (name == "CURRENT" or name.startswith("MANIFEST-")) and (cq / name).is_file():
            return name
    return None
