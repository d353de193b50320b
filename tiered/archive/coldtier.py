"""Manifests in the cold tier, their local cache, and the commit protocol.

Commit = data objects first (stable names), then one conditional manifest
write: ``IfNoneMatch: *`` for a queue's first manifest, ``IfMatch: <etag>``
after. The manifest chunks a commit seals (tiered/archive/chunks.py) ride in
the segment object uploaded for it (``append``, tiered/archive/append.py),
or, when the commit is not an upload's or its base changed, are objects of
their own written before the head. A lost race (another writer, or the
cleaner in this process) re-reads the manifest and re-applies the change, or
gives up when the change no longer applies (``ConflictError``). The catalog
is written by ``refresh_catalog`` when it is due (tiered/archive/catalog.py).

The local cache (one JSON file per queue under the state directory, written
with tmp/bak/rename) lets a round with nothing new make no request at all;
the manifest chunks are kept beside it (tiered/archive/chunkcache.py).
It is rebuilt from the bucket when it is lost, corrupt, or was written under
another lease epoch. A queue missing from the cache is looked up in the
bucket once before anything is written for it, so a stale cache can never
lead to overwriting archived objects.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tiered.clock import Clock, SystemClock
from tiered.errors import (ConflictError, CorruptRecordError, FormatVersionError, ManifestChunkError,
                           ObjectNotFoundError, PreconditionFailedError, TieredError,
                           UnaccountedObjectsError)
from tiered.format.jsonfile import read_json, write_json
from tiered.archive import chunks
from tiered.archive.append import SegmentParts, carry, gap_change, segment_change, upload
from tiered.archive.catalog import DEFAULT_REFRESH_S, CatalogKeeper
from tiered.archive.chunkcache import ChunkCache, cache_name, prefetch
from tiered.archive.chunks import Carried, chunk_key
from tiered.archive.filewrite import write_whole
from tiered.archive.manifest import (CATALOG, IDENTITY, MANIFEST, Catalog, CatalogEntry, Gap, Manifest, Segment,
                                     broker_prefix, history_id, queue_prefix, topic_of_dir)
from tiered.archive.rebuild import RebuildPlan, RepairReport, plan_rebuild, queues_in, scan_queue
from tiered.recorder import NullRecorder, Recorder
from tiered.archive.segmeta import Descriptor
from tiered.archive.storage import ObjectStore

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


class _Entry:
    __slots__ = ("manifest", "etag", "verified", "recovered")

    def __init__(self, manifest: Manifest | None, etag: str | None, verified: bool, recovered: bool = False) -> None:
        self.manifest = manifest
        self.etag = etag
        self.verified = verified  # bucket state known (present with etag, or absent)
        self.recovered = recovered  # absent, and the bucket holds no segment to rebuild it from


def _queues_with_objects(keys: list[str], prefix: str) -> set[QueueKey]:
    """Every (topic, queue id) with any object under ``{prefix}/{topic}/{qid}/``:
    a manifest, a segment, a manifest chunk, an object of a future layout."""
    out: set[QueueKey] = set()
    for key in keys:
        parts = key[len(prefix) + 1:].split("/", 2) if key.startswith(prefix + "/") else []
        if len(parts) == 3 and parts[1].isdigit():
            out.add((topic_of_dir(parts[0]), int(parts[1])))
    return out


def _carrying(m: Manifest) -> bool:
    """Whether a chunk ``m`` reaches is carried in a segment object (format 4.0)."""
    return any(f"/{chunks.CHUNK_DIR}/" not in k for k in m.chunk_keys)


class ColdTier:
    """Manifests of one ``{cluster}/{broker}`` prefix.

    With ``state_dir`` the manifests are cached on local disk (a writer);
    without it they are only held in memory (readers, CLI).
    """

    def __init__(
        self,
        store: ObjectStore,
        cluster: str,
        broker: str,
        *,
        state_dir: Path | None = None,
        writer: str = "",
        clock: Clock | None = None,
        recorder: Recorder | None = None,
        catalog_refresh_s: float = DEFAULT_REFRESH_S,
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.broker = broker
        self.prefix = broker_prefix(cluster, broker)
        self.writer = writer
        self.clock = clock or SystemClock()
        self.recorder: Recorder = recorder or NullRecorder()
        self.identity = ""  # the bucket prefix's identity, once checked (see check_identity)
        self._known_identity: str | None = None  # what the local state recorded
        self._epoch = 0
        self.retention: dict[str, tuple[float, str]] | None = None  # see record_retention
        self.broken: dict[QueueKey, str] = {}  # queues whose manifest cannot be read, and why
        self.state_dir = state_dir  # the writer's local state (the dispatcher keeps its own beside)
        self.cache_dir = state_dir / "manifests" / cluster / broker if state_dir else None
        self._entries: dict[QueueKey, _Entry] = {}
        self._locks: dict[QueueKey, threading.Lock] = {}
        self._guard = threading.Lock()
        self._catalog_lock = threading.Lock()
        self._catalog = CatalogKeeper(catalog_refresh_s, self.cache_dir / "_catalog" / "written.json"
                                      if self.cache_dir is not None else None)
        self._chunks = ChunkCache(store, cluster, broker, self.cache_dir)
        # Queues with any object in the LIST of the whole prefix that the last
        # load made (None: it made none, it read the catalog or the cache). A
        # queue outside it had nothing in the bucket then, and since then only
        # a lease holder writes: ``current`` takes that as the answer of its
        # GET and LIST (two requests per new queue in the first round).
        self._listed: set[QueueKey] | None = None
        self.loaded = False

    # --- cache -----------------------------------------------------------------

    def lock(self, topic: str, queue_id: int) -> threading.Lock:
        """One lock per queue: never two rounds (or a round and a clean) of a queue at once."""
        with self._guard:
            return self._locks.setdefault((topic, queue_id), threading.Lock())

    def load(self, epoch: int = 0, *, rebuild: bool = False) -> None:
        """Load the local cache; rebuild it from the bucket when it is missing,
        corrupt, from another lease epoch, another cold-tier URL or another
        bucket identity (a new or emptied bucket), or when ``rebuild`` asks
        for it (a writer that lost its lease and won it back)."""
        meta: dict[str, Any] = {}
        self._listed = None  # a listing of an earlier lease is nobody's answer now
        if self.cache_dir is not None:
            try:
                meta = read_json(self.cache_dir / "_meta.json") or {}
            except (CorruptRecordError, ValueError) as exc:
                log.warning("manifest cache unusable (%s); rebuilding from the bucket", exc)
            self._known_identity = meta.get("identity") if isinstance(meta, dict) else None
            rebuild = self.check_identity(create=False) or rebuild
        if self.cache_dir is not None and not rebuild:
            try:
                if (meta and meta.get("epoch") == epoch and meta.get("complete")
                        and meta.get("store", self.store.url) == self.store.url):
                    self._load_cache_files()
                    self._catalog.load_copy(self.manifests())
                    self.loaded = True
                    return
            except (CorruptRecordError, ValueError, KeyError, TypeError) as exc:
                log.warning("manifest cache unusable (%s); rebuilding from the bucket", exc)
        self.rebuild()
        self._epoch = epoch
        self._write_meta()
        self.loaded = True

    def _write_meta(self) -> None:
        if self.cache_dir is not None:
            write_json(self.cache_dir / "_meta.json", {"epoch": self._epoch, "complete": True,
                                                       "store": self.store.url, "identity": self.identity})

    def check_identity(self, *, create: bool = True) -> bool:
        """Compare the bucket prefix's identity with the one the local state
        knows; create it at first use (the dispatcher's rounds do; loading,
        which a dry run also does, only reads). True when it changed (a new,
        emptied or replaced bucket): the cache is then dropped and rebuilt
        from the bucket, so everything the bucket lacks is archived again.
        One GET when the identity is there."""
        key = f"{self.prefix}/{IDENTITY}"
        ident = self._read_identity(key)
        if ident is None and not create:
            if self._known_identity is None:
                return False
            self._identity_changed("none", self._known_identity)  # known before, gone now: emptied
            self._known_identity = None
            return True
        if ident is None:
            fresh = json.dumps({"id": uuid.uuid4().hex, "created_ms": self.clock.now_ms()}).encode()
            try:
                self.store.put_if_absent(key, fresh)
            except PreconditionFailedError:
                pass  # another process created it first: theirs counts
            ident = self._read_identity(key)
            if ident is None:
                raise CorruptRecordError(key, 0, "identity vanished right after it was written")
        known, self.identity = self._known_identity, ident
        self._known_identity = ident
        if known is None or known == ident:
            if known is None and self.loaded:
                self._write_meta()
            return False
        self._identity_changed(ident, known)
        if self.loaded:
            self.rebuild()
            self._write_meta()
        return True

    def _identity_changed(self, ident: str, known: str) -> None:
        log.error("the cold tier at %s is not the one the local state describes (identity %s, expected %s): "
                  "a new or emptied bucket; dropping the local manifest cache and archiving again what the "
                  "bucket lacks", self.store.url, ident, known, extra={"prefix": self.prefix})
        self.recorder.recovery("bucket_identity_changed")

    def _read_identity(self, key: str) -> str | None:
        try:
            doc = json.loads(self.store.get(key))
            return str(doc["id"])
        except ObjectNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise CorruptRecordError(key, 0, "the bucket identity object is not {\"id\": ...}") from None

    def _load_cache_files(self) -> None:
        assert self.cache_dir is not None
        entries: dict[QueueKey, _Entry] = {}
        for bak in self.cache_dir.glob("*.json.bak"):
            if bak.name != "_meta.json.bak":
                # backups of an older version's writes, which no write renews
                # now: a torn cache file is rebuilt, never read from one of them
                bak.unlink(missing_ok=True)
        for path in self.cache_dir.glob("*.json"):
            if path.name == "_meta.json" or path.name.endswith((".tmp", ".bak")):
                continue
            doc = read_json(path)
            if not isinstance(doc, dict):
                raise ValueError(f"{path}: not an object")
            head = doc["manifest"]
            refs = Manifest.chunk_refs(head, str(path))
            if refs:  # the head as committed; its chunks from the local copies (or the bucket)
                topic, qid = str(head["topic"]), int(head["queue_id"])
                load = self._chunks.loader(topic, qid)
                m = Manifest.from_dict(head, str(path), prefix=chunks.flatten(refs, load))
                m = self._chunks.stored_in(m, refs, load)
            else:
                m = Manifest.from_dict(head, str(path))
            entries[(m.topic, m.queue_id)] = _Entry(m, doc["etag"], True)
        self._entries = entries

    def rebuild(self, *, use_catalog: bool = True) -> None:
        """Every manifest of the prefix, from the bucket: the catalog names the
        queues (one GET); a LIST covers a missing or unreadable catalog, and
        is what a full check asks for (``use_catalog=False``). A queue the
        catalog missed is still safe: ``current`` looks it up before any write."""
        keys: list[str] | None = None
        catalog: Catalog | None = None
        if use_catalog:
            try:
                catalog = self.read_catalog()
                keys = [f"{queue_prefix(self.cluster, self.broker, q.topic, q.queue_id)}/{MANIFEST}"
                        for q in catalog.queues]
            except (ObjectNotFoundError, CorruptRecordError, FormatVersionError):
                keys = None  # a catalog is a hint: the LIST below is the truth
        listed: set[QueueKey] | None = None
        if keys is None:
            every = [o.key for o in self.store.list_keys(self.prefix + "/")]
            keys = [k for k in every if k.endswith("/" + MANIFEST)]
            listed = _queues_with_objects(every, self.prefix)
        entries: dict[QueueKey, _Entry] = {}
        broken: dict[QueueKey, str] = {}
        for key in keys:
            queue = next(iter(queues_in([key], self.prefix)), None)
            if queue is None:
                continue
            try:
                data, etag = self.store.get_with_etag(key)
                entries[queue] = _Entry(self._parse(data, key, *queue), etag, True)
            except ObjectNotFoundError:
                continue
            except TieredError as exc:
                # this queue only: every other queue goes on (fetch raises it again)
                broken[queue] = str(exc)
                log.error("manifest unreadable; queue %s/%s stopped until it is repaired: %s", *queue, exc,
                          extra={"topic": queue[0], "queue": queue[1], "key": key})
        self._entries = entries
        self.broken = broken
        self._listed = listed
        # what the bucket's catalog says: the one just read, else unknown (written at the next refresh)
        self._catalog.reset(catalog)
        if self.cache_dir is not None:
            for path in self.cache_dir.glob("*.json*"):
                if not path.name.startswith("_meta"):
                    path.unlink()
            for (topic, qid), entry in entries.items():
                self._persist(topic, qid, entry)
            self._chunks.prune(e.manifest for e in entries.values() if e.manifest is not None)
        log.info("manifest cache rebuilt from the bucket: %d queues", len(entries))

    def _persist(self, topic: str, queue_id: int, entry: _Entry, head: bytes | None = None) -> None:
        """The cache file of a queue: its head as committed (``head``, the
        bytes just written to the bucket, else encoded again) and its ETag."""
        if self.cache_dir is None or entry.manifest is None:
            return
        if head is None:
            # The head as committed, not the whole manifest: a commit's local write
            # stays as small as its bucket write (chunks are copied once, below).
            m = entry.manifest
            head = json.dumps(m.head_dict(m.chunks, sum(r.live for r in m.chunks), carried=_carrying(m)),
                              separators=(",", ":"), sort_keys=True).encode("utf-8")
        doc = b'{"etag":' + json.dumps(entry.etag).encode("utf-8") + b',"manifest":' + head + b"}"
        # No fsync and no .bak: a cache file lost or torn by a power cut is
        # rebuilt from the bucket (or found one commit behind, which the
        # conditional commit detects); tmp + rename keeps a crash from tearing it.
        path = self.cache_dir / cache_name(topic, queue_id)
        tmp = path.with_name(path.name + ".tmp")
        try:
            write_whole(tmp, doc, sync=False)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)  # once, not at every commit
            write_whole(tmp, doc, sync=False)
        os.replace(tmp, path)

    # --- reading -----------------------------------------------------------------

    def cached(self, topic: str, queue_id: int) -> Manifest | None:
        """The cached manifest, without any request (None: none known)."""
        entry = self._entries.get((topic, queue_id))
        return entry.manifest if entry else None

    def manifests(self) -> dict[QueueKey, Manifest]:
        # a snapshot: the dispatcher and the cleaner add queues from other threads
        return {k: e.manifest for k, e in list(self._entries.items()) if e.manifest is not None}

    def fetch(self, topic: str, queue_id: int) -> Manifest | None:
        """The manifest as the bucket has it now; updates the cache."""
        key = f"{queue_prefix(self.cluster, self.broker, topic, queue_id)}/{MANIFEST}"
        try:
            data, etag = self.store.get_with_etag(key)
            m = self._parse(data, key, topic, queue_id)
        except ObjectNotFoundError:
            self._entries[(topic, queue_id)] = _Entry(None, None, True)
            self.broken.pop((topic, queue_id), None)
            return None
        except TieredError as exc:
            self._entries.pop((topic, queue_id), None)
            self.broken[(topic, queue_id)] = str(exc)
            raise
        self.broken.pop((topic, queue_id), None)
        entry = _Entry(m, etag, True)
        self._entries[(topic, queue_id)] = entry
        self._persist(topic, queue_id, entry)
        self._catalog.changed((topic, queue_id))  # perhaps a queue the catalog does not list
        return m

    def _parse(self, data: bytes, key: str, topic: str, queue_id: int) -> Manifest:
        """A manifest read from ``key``, which must be the one of ``topic``/``queue_id``;
        the chunks a head references are read (in parallel, cached)."""
        doc = Manifest.document(data, key)
        refs = Manifest.chunk_refs(doc, key)
        if not refs:
            m = Manifest.from_dict(doc, key)
            if (m.topic, m.queue_id) != (topic, queue_id):
                raise CorruptRecordError(key, 0, f"foreign manifest: it describes {m.topic}/{m.queue_id}")
            return m
        if (doc.get("topic"), doc.get("queue_id")) != (topic, queue_id):  # before reading its chunks
            raise CorruptRecordError(key, 0, f"foreign manifest: it describes {doc.get('topic')}/{doc.get('queue_id')}")
        load = self._chunks.loader(topic, queue_id)
        prefetch(refs, load)
        m = Manifest.from_dict(doc, key, prefix=chunks.flatten(refs, load))
        try:
            m.check()
        except ValueError as exc:
            raise ManifestChunkError(key, 0, f"the chunks and the head do not tile the archive: {exc}") from None
        return self._chunks.stored_in(m, refs, load)

    def current(self, topic: str, queue_id: int) -> Manifest | None:
        """The manifest to build on: cached, or looked up once for a queue the
        cache does not know (never assume a queue is new). A manifest missing
        from the bucket is rebuilt from the queue's segment objects first, so
        a lost manifest never restarts a queue's history (tiered/archive/rebuild.py);
        UnaccountedObjectsError when the objects cannot be accounted for."""
        entry = self._entries.get((topic, queue_id))
        listed = self._listed
        if entry is None and listed is not None and (topic, queue_id) not in listed:
            # nothing of the queue in the bucket at load, when we listed it all:
            # what fetch (no manifest) and recover (no object) would find
            entry = self._entries[(topic, queue_id)] = _Entry(None, None, True, recovered=True)
        if entry is None or not entry.verified:
            self.fetch(topic, queue_id)
            entry = self._entries[(topic, queue_id)]
        if entry.manifest is None and not entry.recovered:
            return self.recover(topic, queue_id)
        return entry.manifest

    def plan_recovery(self, topic: str, queue_id: int) -> RebuildPlan:
        prefix = queue_prefix(self.cluster, self.broker, topic, queue_id)
        found, sizes = scan_queue(self.store, prefix, topic, queue_id)
        return plan_rebuild(topic, queue_id, found, sizes)

    def recover(self, topic: str, queue_id: int) -> Manifest | None:
        """Rebuild a missing manifest from the bucket and commit it (create-only,
        so a manifest that appeared meanwhile wins). None: nothing to adopt."""
        plan = self.plan_recovery(topic, queue_id)
        where = f"{queue_prefix(self.cluster, self.broker, topic, queue_id)}/{MANIFEST}"
        if not plan.ok:
            raise UnaccountedObjectsError(where, plan.problems)
        self._entries[(topic, queue_id)] = _Entry(None, None, True, recovered=True)
        if plan.manifest is None:
            return None
        rebuilt = self.commit(topic, queue_id, lambda current: current or plan.manifest)  # type: ignore[arg-type,return-value]
        self.recorder.recovery("manifest_rebuilt", topic)
        log.warning("manifest of %s/%s was missing; rebuilt from %d segment objects in the bucket, "
                    "archive continues at %d", topic, queue_id, len(plan.adopted), rebuilt.next_offset,
                    extra={"topic": topic, "queue": queue_id, "segments": len(plan.adopted),
                           "offset": rebuilt.first_offset, "end_offset": rebuilt.next_offset})
        return rebuilt

    def repair(self, *, dry_run: bool = False) -> RepairReport:
        """Rebuild every missing manifest of the prefix from its segment
        objects (``tiered repair``); report the queues that cannot be."""
        keys = [o.key for o in self.store.list_keys(self.prefix + "/")]
        adopted: dict[str, RebuildPlan] = {}
        problems: dict[str, tuple[str, ...]] = {}
        intact = 0
        for topic, qid in sorted(queues_in(keys, self.prefix)):
            where = f"{topic}/{qid}"
            try:
                if self.fetch(topic, qid) is not None:
                    intact += 1
                    continue
            except ManifestChunkError as exc:
                # the head is there, a chunk it references is not: rebuild the
                # segment list from the segment objects, under the same head
                plan = self.plan_recovery(topic, qid)
                if not plan.ok or plan.manifest is None:
                    problems[where] = (f"manifest chunk unreadable: {exc}",) + plan.problems
                    continue
                adopted[where] = plan
                if not dry_run:
                    self._replace_head(topic, qid, plan.manifest, exc)
                continue
            except TieredError as exc:
                problems[where] = (f"manifest unreadable: {exc}; move it aside and run repair again "
                                   "to rebuild it from the segments",)
                continue
            plan = self.plan_recovery(topic, qid)
            if not plan.ok:
                problems[where] = plan.problems
            elif plan.manifest is not None:
                adopted[where] = plan
                if not dry_run:
                    self.recover(topic, qid)
        return RepairReport(adopted=adopted, problems=problems, intact=intact)

    def _replace_head(self, topic: str, queue_id: int, rebuilt: Manifest, cause: TieredError) -> Manifest:
        """Commit ``rebuilt`` (from the segment objects) over a head whose
        chunks are lost, keeping what only the head knows: pending deletes and
        gaps recorded after the last segment. Conditional on the head read
        here, so a writer that committed meanwhile wins."""
        key = f"{queue_prefix(self.cluster, self.broker, topic, queue_id)}/{MANIFEST}"
        data, etag = self.store.get_with_etag(key)
        doc = Manifest.document(data, key)
        head = Manifest.from_dict({**doc, "chunks": [], "segments": []}, key)
        m = replace(rebuilt, pending_deletes=head.pending_deletes)
        for gap in sorted(head.gaps, key=lambda g: g.q_start):
            if gap.q_start == m.next_offset:
                m = m.with_gap(gap)
        m = replace(m, generation=head.generation + 1, writer=self.writer, updated_ms=self.clock.now_ms())
        m.check()
        m, body = self._store_chunks(topic, queue_id, None, m)
        etag = self.store.put_if_match(key, body, etag)
        entry = _Entry(m, etag, True)
        self._entries[(topic, queue_id)] = entry
        self.broken.pop((topic, queue_id), None)
        self._persist(topic, queue_id, entry, body)
        self.recorder.recovery("manifest_rebuilt", topic)
        log.warning("manifest of %s/%s had a lost or damaged chunk (%s); rebuilt from %d segment objects, "
                    "archive continues at %d", topic, queue_id, cause, len(rebuilt.segments), m.next_offset,
                    extra={"topic": topic, "queue": queue_id, "key": key})
        return m

    def history_for(self, topic: str, queue_id: int, start: int) -> str:
        return history_id(self.identity, self.cluster, self.broker, topic, queue_id, start)

    def descriptor(self, topic: str, queue_id: int, history: str, seg: Segment,
                   gaps_before: tuple[Gap, ...], carried: Carried | None = None) -> Descriptor:
        return Descriptor(cluster=self.cluster, broker=self.broker, topic=topic, queue_id=queue_id,
                          history=history, segment=seg, gaps_before=gaps_before,
                          chunks=carried.span if carried is not None else None)

    # --- writing -----------------------------------------------------------------

    def append(self, topic: str, queue_id: int, base: Manifest | None, parts: SegmentParts) -> Manifest:
        """Archive a built segment that continues ``base`` (None: the queue's
        first): its objects, packed for its layout (v2 with the manifest
        chunks this commit seals, its descriptor, its upload's checksum), then
        the manifest naming it, written conditionally. Returns the committed
        manifest; ConflictError when the archive no longer ends where
        ``base`` did (nothing committed: the objects are rewritten alike by
        the next attempt, or collected by the cleaner). A v2 segment's
        records buffer, a bytearray, becomes its object: not read again."""
        # a queue the cache does not know is looked up before its first
        # object is written: a lookup after it would adopt that object
        # into a manifest rebuilt from the bucket (``current``)
        self.current(topic, queue_id)
        seg = parts.segment
        history = (base.history if base is not None and base.history
                   else self.history_for(topic, queue_id, base.first_offset if base is not None else seg.q_start))
        gaps = base.gaps_before(seg.q_start) if base is not None else ()
        carried = (carry(base, seg, parts.compression, topic, queue_id, self._chunks.loader(topic, queue_id))
                   if seg.layout == 2 else None)
        desc = self.descriptor(topic, queue_id, history, seg, gaps, carried)
        seg = upload(self.store, parts, desc, carried)
        return self.commit(topic, queue_id, segment_change(topic, queue_id, base, seg, history), carried=carried)

    def append_gap(self, topic: str, queue_id: int, base: Manifest | None, gap: Gap) -> Manifest:
        """Record ``gap`` (offsets never to be archived) where ``base`` ends,
        conditionally; returns the committed manifest, ConflictError as ``append``."""
        history = self.history_for(topic, queue_id, gap.q_start)
        return self.commit(topic, queue_id, gap_change(topic, queue_id, base, gap, history))

    def commit(
        self,
        topic: str,
        queue_id: int,
        change: Callable[[Manifest | None], Manifest],
        *,
        attempts: int = 5,
        carried: Carried | None = None,
    ) -> Manifest:
        """Apply ``change`` to the current manifest and write it conditionally.

        ``change`` gets the manifest (None for a queue's first commit) and
        returns the new one; it raises ConflictError when it no longer applies,
        and returns its argument itself when the change is already there (a
        commit whose response was lost, then re-read): nothing is written then.
        ``carried``: chunks already written inside a segment object (``append``);
        a chunk the commit needs that is not among them is written on its own.
        """
        key = f"{queue_prefix(self.cluster, self.broker, topic, queue_id)}/{MANIFEST}"
        for _ in range(attempts):
            base = self.current(topic, queue_id)
            entry = self._entries[(topic, queue_id)]
            new = change(base)
            if base is not None and new is base:
                return base
            new = replace(new, generation=(base.generation if base else 0) + 1, writer=self.writer,
                          updated_ms=self.clock.now_ms())
            new.check()
            new, head = self._store_chunks(topic, queue_id, base, new, carried)
            try:
                if base is None:
                    etag = self.store.put_if_absent(key, head)
                else:
                    etag = self.store.put_if_match(key, head, entry.etag or "")
            except (PreconditionFailedError, ObjectNotFoundError):
                # another writer, our own write whose response was lost, or a
                # manifest deleted under a stale cache: re-read and re-apply
                log.info("manifest %s changed under us; re-reading", key)
                self.fetch(topic, queue_id)
                continue
            committed = _Entry(new, etag, True)
            self._chunks.forget(topic, queue_id, base, new)
            self._entries[(topic, queue_id)] = committed
            self._persist(topic, queue_id, committed, head)
            self._catalog.changed((topic, queue_id))
            return new
        raise ConflictError(f"{key}: manifest kept changing under us; will retry next round")

    def _store_chunks(self, topic: str, queue_id: int, base: Manifest | None, new: Manifest,
                      carried: Carried | None = None) -> tuple[Manifest, bytes]:
        """Write the chunks ``new`` needs beyond ``base``'s: none for those
        ``carried`` in the segment object just written, a plain PUT of an
        immutable, content-named object for any other, before the head that
        names them (a crash in between leaves an orphan, never a dangling
        reference); return ``new`` with its chunk references and the head's bytes."""
        qp = queue_prefix(self.cluster, self.broker, topic, queue_id)
        load = self._chunks.loader(topic, queue_id)
        places = carried.places if carried is not None else {}
        plan = chunks.plan(base.chunks if base else (), base.segments if base else (), new.segments,
                           topic, queue_id, load, place=(lambda name, body: places.get(name)) if places else None,
                           gone=chunks.going(base, new))
        for name, body in plan.writes:
            if name not in plan.placed:
                self.store.put(chunk_key(qp, name), body)
            self._chunks.save(topic, queue_id, name, body)
        for name, chunk in plan.made.items():
            self._chunks.remember(topic, queue_id, name, chunk)
        new = self._chunks.stored_in(new, plan.refs, load)
        head = json.dumps(new.head_dict(plan.refs, plan.tail, carried=_carrying(new)), separators=(",", ":"),
                          sort_keys=True)
        return new, head.encode("utf-8")

    # --- catalog -----------------------------------------------------------------

    def catalog(self) -> Catalog:
        entries = tuple(sorted((CatalogEntry.of(m) for m in self.manifests().values()),
                               key=lambda e: (e.topic, e.queue_id)))
        return Catalog(self.cluster, self.broker, entries, self.clock.now_ms(), retention=dict(self.retention or {}))

    def record_retention(self, table: dict[str, tuple[float, str]]) -> None:
        """Each topic's effective retention, written with the next catalog
        (the dispatcher, which reads the broker's topics.json, calls this)."""
        self.retention = {**(self.retention or {}), **table}

    def refresh_catalog(self, *, last: bool = False) -> str | None:
        """Write the catalog when it is due (tiered/archive/catalog.py: when it
        would be wrong, or its ranges are older than the refresh interval and
        a commit changed them); no request otherwise. Returns why it was
        written, None when it was not. A failed write raises, and the next
        call writes it again. ``last``: this process makes no later call (a
        one-shot pass), so changed ranges are written now."""
        with self._catalog_lock:
            why = self._catalog.due(lambda k: self.cached(*k), lambda: bool(self.manifests()), self.retention,
                                    self.clock.now_ms(), last=last)
            if why is not None:
                self._write_catalog(self._catalog.taking())
                log.debug("catalog written: %s", why)
            return why

    def _write_catalog(self, taken: set[QueueKey]) -> None:
        # serialised (the caller holds _catalog_lock), so a catalog computed
        # earlier never lands after a newer one
        try:
            if self.retention is None:
                # a process that never learnt retention (the cleaner alone)
                # keeps what the dispatcher recorded
                try:
                    self.retention = dict(self.read_catalog().retention)
                except (ObjectNotFoundError, CorruptRecordError):
                    self.retention = {}
            catalog = self.catalog()
            data = catalog.to_bytes()
            self.store.put(f"{self.prefix}/{CATALOG}", data)
        except BaseException:
            self._catalog.failed(taken)
            raise
        self._catalog.written(catalog, data)

    def read_catalog(self) -> Catalog:
        key = f"{self.prefix}/{CATALOG}"
        return Catalog.from_bytes(self.store.get(key), key)

    def describe(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "queues": len(self._entries), "loaded": self.loaded}
