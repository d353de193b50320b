"""What in a broker store tiered does not understand: directories, files,
CommitLog magics and queue types RocketMQ 5.3.3 does not leave there, or that
tiered cannot read. Each is a ``Finding`` for ``status`` and the
``tiered_store_unknown_layout`` gauge, so nothing is skipped without a word.

What RocketMQ leaves under the store root (``StorePathConfigHelper``,
``MessageStoreConfig``, ``BrokerPathConfigHelper``, ``TimerMessageStore``,
``CompactionStore``, ``PopConsumerService``, DLedger's ``dledger-{id}``):
see ``KNOWN_DIRS`` and ``KNOWN_FILES``. ``config/`` is the broker's own
settings and is not surveyed; ``index/``, ``timerlog/``, ``compaction/``,
``kvStore/`` and the rest are looked at only as far as their names.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiered.errors import TieredError
from tiered.format.codec import BLANK_MAGIC, MAGIC_V1, MAGIC_V2
from tiered.format.jsonfile import read_json

#: Values of the ``kind`` label of ``tiered_store_unknown_layout``.
KINDS: tuple[str, ...] = ("directory", "file", "magic", "queue_type")

KNOWN_DIRS = frozenset({
    "commitlog", "consumequeue", "batchconsumequeue", "consumequeue_ext", "index", "config",
    "timerlog", "compaction", "transaction", "kvStore",
})
# MixAll.string2File keeps the previous content in "{name}.bak" (abort.bak)
KNOWN_FILES = frozenset({
    "abort", "abort.bak", "checkpoint", "lock", "timerwheel", "epochFileCheckpoint",
    "epochFileCheckpoint.bak", "brokerIdentity",
})
KNOWN_DIR_PREFIXES = ("dledger-",)  # DLedger's own store, one per node id
QUEUE_TYPES = frozenset({"SimpleCQ", "BatchCQ"})  # TopicAttributes.QUEUE_TYPE_ATTRIBUTE
_MAGICS = {MAGIC_V1, MAGIC_V2, BLANK_MAGIC, 0}  # 0: a preallocated file not written yet
_MAGIC = struct.Struct(">I")


@dataclass(frozen=True, kw_only=True)
class Finding:
    kind: str  # one of KINDS
    path: str  # relative to the store root
    detail: str

    def line(self) -> str:
        return f"UNKNOWN {self.kind} {self.path}: {self.detail}"

    def to_dict(self) -> dict[str, str]:
        """A row of ``status --json`` (whose ``kind`` says what the row is)."""
        return {"kind": "finding", "unknown": self.kind, "path": self.path, "detail": self.detail}


@dataclass(frozen=True, kw_only=True)
class StoreSurvey:
    findings: tuple[Finding, ...]
    # topic -> the queue.type topics.json gives it, for types tiered cannot read
    unknown_queue_types: tuple[tuple[str, str], ...] = ()

    @property
    def unreadable_topics(self) -> frozenset[str]:
        """Topics whose queues must not be archived as what they are not."""
        return frozenset(t for t, _ in self.unknown_queue_types)

    def counts(self) -> dict[str, int]:
        """Findings per kind, every kind present (0 when none)."""
        seen = Counter(f.kind for f in self.findings)
        return {kind: seen.get(kind, 0) for kind in KINDS}


def survey_store(root: str | os.PathLike[str]) -> StoreSurvey:
    """Look over the store at ``root``: names, 8 bytes per CommitLog file,
    and the queue types in ``config/topics.json``."""
    base = Path(root)
    findings: list[Finding] = []
    topic_configs: Mapping[str, Any] = {}
    try:
        data = read_json(base / "config" / "topics.json")  # the .bak when it cannot be read
        table = data.get("topicConfigTable") if isinstance(data, dict) else None
        if data is not None and not isinstance(table, dict):
            raise ValueError("no topicConfigTable object")
        topic_configs = table or {}
    except (OSError, ValueError, TieredError) as exc:
        findings.append(Finding(kind="file", path="config/topics.json",
                                detail=f"cannot be read, so queue types are unknown: {exc}"))
    for entry in _scan(base):
        name = entry.name
        if entry.is_dir():
            if name not in KNOWN_DIRS and not name.startswith(KNOWN_DIR_PREFIXES):
                findings.append(Finding(kind="directory", path=name, detail="not a directory RocketMQ 5.3.3 writes"))
        elif name not in KNOWN_FILES:
            findings.append(Finding(kind="file", path=name, detail="not a file RocketMQ 5.3.3 writes"))
    findings += _commitlog(base)
    for cq_dir in ("consumequeue", "batchconsumequeue"):
        findings += _queue_tree(base, cq_dir)
    findings += _named_files(base, "timerlog", 20)
    findings += _named_files(base, "index", 17)  # yyyyMMddHHmmssSSS
    unknown = tuple(sorted(_unknown_queue_types(topic_configs).items()))
    findings += [Finding(kind="queue_type", path="config/topics.json",
                         detail=f"topic {t!r} has queue.type {v!r} (neither SimpleCQ nor BatchCQ): "
                                "its queues are not archived") for t, v in unknown]
    return StoreSurvey(findings=tuple(findings), unknown_queue_types=unknown)


def _scan(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _numbered(name: str, digits: int) -> bool:
    return len(name) == digits and name.isascii() and name.isdigit()


def _named_files(base: Path, sub: str, digits: int) -> list[Finding]:
    return [Finding(kind="directory" if e.is_dir() else "file", path=f"{sub}/{e.name}",
                    detail=f"not a file named by {digits} digits")
            for e in _scan(base / sub) if e.is_dir() or not _numbered(e.name, digits)]


def _commitlog(base: Path) -> list[Finding]:
    """Unknown names, and files whose first record's magic is not V1, V2,
    the end-of-file filler or unwritten zeros (records never span files)."""
    findings = _named_files(base, "commitlog", 20)
    for e in _scan(base / "commitlog"):
        if e.is_dir() or not _numbered(e.name, 20):
            continue
        try:
            with open(e.path, "rb") as f:
                head = f.read(8)
        except FileNotFoundError:
            continue  # deleted by the broker meanwhile
        if len(head) < 8:
            continue  # an empty file being created
        (magic,) = _MAGIC.unpack_from(head, 4)
        if magic not in _MAGICS:
            findings.append(Finding(kind="magic", path=f"commitlog/{e.name}",
                                    detail=f"magic 0x{magic:08X} at offset 4 is not a RocketMQ message magic "
                                           "(V1 0xDAA320A7, V2 0xDAA320AB, blank 0xCBD43194)"))
    return findings


def _queue_tree(base: Path, sub: str) -> list[Finding]:
    """``{sub}/{topic}/{queueId}/{20 digits}``; anything else is named."""
    findings = []
    for topic in _scan(base / sub):
        if not topic.is_dir():
            findings.append(Finding(kind="file", path=f"{sub}/{topic.name}",
                                    detail="a file where topic directories are (RocksDB ConsumeQueue files "
                                           "are not read)"))
            continue
        for queue in _scan(Path(topic.path)):
            where = f"{sub}/{topic.name}/{queue.name}"
            if not queue.is_dir() or not (queue.name.isascii() and queue.name.isdigit()):
                findings.append(Finding(kind="directory" if queue.is_dir() else "file", path=where,
                                        detail="not a queue directory (named by its queue id)"))
                continue
            findings += _named_files(base, where, 20)
    return findings


def _unknown_queue_types(topic_configs: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for topic, cfg in topic_configs.items():
        attrs = cfg.get("attributes") if isinstance(cfg, dict) else None
        if not isinstance(attrs, dict):
            continue
        value = attrs.get("queue.type", attrs.get("+queue.type"))
        if value is not None and value not in QUEUE_TYPES:
            out[str(topic)] = str(value)
    return out
