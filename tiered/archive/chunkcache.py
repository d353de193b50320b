"""The manifest chunks a ``ColdTier`` has read or written: held in memory
and, for a writer, copied under its state directory, so a restart reads a
long history from local disk, not the bucket. Chunks are immutable and
named by their content, so a copy is either exactly the bucket's or fails
its hash and is read again from the bucket (tiered/archive/chunks.py).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from tiered.archive import chunks, layout
from tiered.archive.chunks import chunk_key
from tiered.archive.manifest import ChunkRef, Manifest, queue_prefix
from tiered.archive.storage import ObjectStore
from tiered.errors import ManifestChunkError, ObjectNotFoundError, StorageError

Loader = Callable[[ChunkRef], chunks.Chunk]


def cache_name(topic: str, queue_id: int) -> str:
    """The name of a queue's file in a local cache directory."""
    return f"{urllib.parse.quote(topic, safe='')}.{queue_id}.json"


def prefetch(refs: tuple[ChunkRef, ...], load: Loader) -> None:
    """Read the chunks under ``refs`` level by level, in parallel (a
    reader of a long history waits for a few round trips, not one per chunk)."""
    frontier = list(refs)
    while frontier:
        if len(frontier) > 1:
            with ThreadPoolExecutor(min(8, len(frontier))) as pool:
                got = list(pool.map(load, frontier))
        else:
            got = [load(frontier[0])]
        frontier = [k for c in got for k in c.refs]


class ChunkCache:
    """Chunks of one ``{cluster}/{broker}`` prefix; local copies under
    ``cache_dir`` (None: in memory only, readers and the CLI)."""

    def __init__(self, store: ObjectStore, cluster: str, broker: str, cache_dir: Path | None) -> None:
        self.store = store
        self.cluster = cluster
        self.broker = broker
        self.cache_dir = cache_dir
        self._chunks: dict[str, chunks.Chunk] = {}  # key -> content; chunks are immutable

    def _local(self, topic: str, queue_id: int) -> Path | None:
        """Where the local cache keeps copies of a queue's chunk objects
        (the bucket's bytes: immutable, checked by their hash when read)."""
        if self.cache_dir is None:
            return None
        return self.cache_dir / "_chunks" / cache_name(topic, queue_id).removesuffix(".json")

    def save(self, topic: str, queue_id: int, name: str, body: bytes) -> None:
        """Keep a local copy of a chunk's bytes as stored."""
        folder = self._local(topic, queue_id)
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}.tmp"
        tmp.write_bytes(body)  # no fsync: a torn copy fails its hash and is read from the bucket
        tmp.replace(folder / name)

    def remember(self, topic: str, queue_id: int, name: str, chunk: chunks.Chunk) -> None:
        """Hold a chunk just made by a commit, so no later load reads it."""
        self._chunks[chunk_key(queue_prefix(self.cluster, self.broker, topic, queue_id), name)] = chunk

    def prune(self, manifests: Iterable[Manifest]) -> None:
        """Drop local copies none of ``manifests`` reaches (after a rebuild)."""
        root = self.cache_dir / "_chunks" if self.cache_dir is not None else None
        if root is None or not root.is_dir():
            return
        keep = {(self._local(m.topic, m.queue_id), name) for m in manifests for name in m.chunk_names}
        for path in root.glob("*/*"):
            if (path.parent, path.name) not in keep:
                path.unlink(missing_ok=True)

    def forget(self, topic: str, queue_id: int, old: Manifest | None, new: Manifest | None) -> None:
        """Drop cached chunks (in memory and local copies) the queue's new
        manifest no longer reaches."""
        if old is not None and old.chunk_names:
            keep = set(new.chunk_names) if new is not None else set()
            local = self._local(topic, queue_id)
            qp = queue_prefix(self.cluster, self.broker, topic, queue_id)
            for name in old.chunk_names:
                if name not in keep:
                    self._chunks.pop(chunk_key(qp, name), None)
                    if local is not None:
                        (local / name).unlink(missing_ok=True)

    def stored_in(self, m: Manifest, refs: tuple[ChunkRef, ...], load: Loader) -> Manifest:
        """``m`` with its chunk references and, for every chunk they reach,
        its name and the stored object holding it (its own, or its carrier)."""
        qp = queue_prefix(self.cluster, self.broker, m.topic, m.queue_id)
        reached = chunks.reachable(refs, load)
        return replace(m, chunks=refs, chunk_names=tuple(r.name for r in reached),
                       chunk_keys=tuple(chunks.stored_in(qp, r) for r in reached))

    def loader(self, topic: str, queue_id: int) -> Loader:
        """Loads a queue's chunk by its reference: from memory, the local
        copy, else the bucket (its own object, or a range of its carrier)."""
        qp = queue_prefix(self.cluster, self.broker, topic, queue_id)
        local = self._local(topic, queue_id)

        def load(ref: ChunkRef) -> chunks.Chunk:
            key = chunk_key(qp, ref.name)  # the cache's key: a chunk's name is its content, wherever stored
            chunk = self._chunks.get(key)
            if chunk is None and local is not None:
                try:
                    chunk = chunks.decode((local / ref.name).read_bytes(), key, ref, topic, queue_id)
                except (OSError, ManifestChunkError):
                    chunk = None  # no local copy, or a torn one: the bucket has it
            if chunk is None:
                data = self._read_carried(qp, ref) if ref.carried else self._read_standalone(key)
                source, offset = (key, 0) if ref.at is None else (layout.object_of(ref.at), layout.split(ref.at)[1])
                chunk = chunks.decode(data, source, ref, topic, queue_id, offset)
                self.save(topic, queue_id, ref.name, data)
            if key not in self._chunks:
                self._chunks[key] = chunk
            elif chunk.total != ref.total or chunk.level != ref.level:
                raise ManifestChunkError(key, 0, f"manifest chunk holds {chunk.total} segments at level "
                                                 f"{chunk.level}; its reference promises {ref.total} at {ref.level}")
            return chunk
        return load

    def _read_standalone(self, key: str) -> bytes:
        try:
            return self.store.get(key)
        except ObjectNotFoundError:
            raise ManifestChunkError(key, 0, "manifest chunk missing; `tiered repair` rebuilds the "
                                             "manifest from the segment objects") from None

    def _read_carried(self, qp: str, ref: ChunkRef) -> bytes:
        """A carried chunk's bytes: one ranged GET of its carrier, a segment
        object of the queue. A carrier that is gone or shorter than the
        reference says is a ManifestChunkError naming it (a HEAD tells a
        store's refusal of a range past the end from any other failure)."""
        obj, at, length = layout.split(ref.at or "")
        end = at + (length or 0)
        if not obj.startswith(f"{qp}/segment/"):
            raise ManifestChunkError(obj, at, f"manifest chunk {ref.name} is placed in an object that is not "
                                              f"one of its queue's segments")
        what = f"the segment object carrying manifest chunk {ref.name}"
        repair = "; `tiered repair` rebuilds the manifest from the segment objects"
        try:
            data = self.store.get_range(obj, at, end)
        except ObjectNotFoundError:
            raise ManifestChunkError(obj, at, f"{what} is missing{repair}") from None
        except StorageError:
            info = self.store.head(obj)
            if info is None:
                raise ManifestChunkError(obj, at, f"{what} is missing{repair}") from None
            if info.size < end:
                raise ManifestChunkError(obj, at, f"{what} is truncated ({info.size} bytes, the chunk ends at "
                                                  f"{end}){repair}") from None
            raise
        if len(data) != end - at:
            raise ManifestChunkError(obj, at, f"{what} is truncated ({at + len(data)} bytes, the chunk ends at "
                                              f"{end}){repair}")
        return data
