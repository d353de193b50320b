"""What the manifest-chunk tests watch at the store: every write that
reaches it (its ``_raw_*`` hooks), the bytes of each commit (the head, the
chunk objects written since the last head, and the manifest chunks carried
in the segment objects written since), and an optional crash of the next
head write after a chunk was written (standalone or carried)."""

from __future__ import annotations

import json
import time

import pytest

from tiered.cleaner.orphans import collect_orphans
from tiered.cleaner.report import CleanReport
from dispatchkit import BROKER, CLUSTER
from tiered.archive import layout, segmeta
from tiered.archive.chunks import CHUNK_DIR
from tiered.archive import manifest as manifest_mod
from tiered.archive.manifest import CATALOG, MANIFEST, Manifest
from tiered.archive.coldtier import ColdTier
from tiered.archive.storage import ObjectStore
from tiered.errors import CorruptRecordError, FormatVersionError
from tiered.recorder import NullRecorder

GRACE_MS = 3_600_000


def orphan_pass(store: ObjectStore) -> list[str]:
    """One orphan collection, as the cleaner runs it, with the grace period past."""
    now = time.time_ns() // 1_000_000 + 2 * GRACE_MS  # object times are the store's real clock
    report = CleanReport(now)
    collect_orphans(ColdTier(store, CLUSTER, BROKER), now, GRACE_MS, report, NullRecorder())
    assert report.ok, report.errors
    return sorted(report.orphans)


def carried_docs(section: bytes) -> list[dict]:
    """The chunk documents of a carried section (concatenated JSON)."""
    decoder = json.JSONDecoder()
    text, at, out = section.decode("utf-8"), 0, []
    while at < len(text):
        doc, at = decoder.raw_decode(text, at)
        out.append(doc)
    return out


class Recording:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.commits: list[int] = []
        self.heads: list[int] = []
        self.chunk_puts: list[str] = []  # standalone chunk objects
        self.carried: list[tuple[str, bytes]] = []  # (segment object, the chunks section it carries)
        self.writes: list[str] = []  # the key of every write request that reached the store
        self.crash_after_chunk = False
        self._pending = 0
        raw_put, raw_put_if = store._raw_put, store._raw_put_if

        def put(key: str, data: bytes, *crc: int | None) -> None:
            if f"/{CHUNK_DIR}/" in key:
                self.chunk_puts.append(key)
                self._pending += len(data)
            elif "/segment/" in key:
                section = self.section(key, bytes(data))
                if section:
                    self.carried.append((key, section))
                    self._pending += len(section)
            out = raw_put(key, data, *crc)
            self.writes.append(key)
            return out

        def put_if(key: str, data: bytes, etag: str | None) -> str:
            if key.endswith("/" + MANIFEST):
                if self.crash_after_chunk and self._pending:
                    self.crash_after_chunk = False
                    raise PermissionError("the process died here")  # non-retriable: the commit never happens
                self.commits.append(len(data) + self._pending)
                self.heads.append(len(data))
                self._pending = 0
            out = raw_put_if(key, data, etag)
            self.writes.append(key)
            return out

        store._raw_put = put  # type: ignore[method-assign]
        store._raw_put_if = put_if  # type: ignore[method-assign]

    @staticmethod
    def section(key: str, data: bytes) -> bytes:
        """The manifest chunks a v2 segment object carries (b"": none)."""
        payload = layout.decompress(data, key) if layout.compressed(key) else data
        desc = segmeta.parse(payload, key)
        if desc is None or desc.chunks is None:
            return b""
        at, length = desc.chunks
        return data[at:at + length]

    def levels(self) -> list[int]:
        """The level of every chunk written: standalone, then carried."""
        out = [int(k.rsplit("/", 1)[1].split("-")[1][1:]) for k in self.chunk_puts]
        return out + [d["level"] for _, s in self.carried for d in carried_docs(s)]

    def catalog_writes(self) -> int:
        return sum(1 for k in self.writes if k.endswith("/" + CATALOG))


def assert_older_readers_refuse(head: bytes, key: str, monkeypatch: pytest.MonkeyPatch, *, major: int) -> None:
    """The manifest head ``head`` (format ``major``.0) is refused loudly: read
    without its chunks, and by a tiered knowing formats up to ``major`` - 1."""
    with pytest.raises(CorruptRecordError, match="without its chunks"):
        Manifest.from_bytes(head, key)
    monkeypatch.setattr(manifest_mod, "FORMAT_MAJOR", major - 1)  # what an older tiered knows
    with pytest.raises(FormatVersionError, match=rf"format version {major}\.0.*upgrade tiered"):
        Manifest.from_bytes(head, key)
