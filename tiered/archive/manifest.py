"""The cold-tier layout and the per-queue manifest, the commit point.

Layout under the cold-tier root (docs/design.md section 3)::

    {cluster}/{broker}/_catalog.json                       queues and ranges, one GET for readers
    {cluster}/{broker}/_lease.json                         single-writer lease
    {cluster}/{broker}/{topic}/{qid}/manifest.json         the commit point (a bounded head, chunks.py)
    .../{topic}/{qid}/manifest/chunk-...json                     manifest chunks stored on their own (3.0)
    .../{topic}/{qid}/segment/{qStart}-{qEnd}.{clStart}-{clEnd}  layout v2: one object a segment
                                                                 (layout.py), carrying chunks (4.0)
    layout v1, still read:
    .../{topic}/{qid}/commitlog/{clStart:020d}-{clEnd:020d}      records, byte-identical
    .../{topic}/{qid}/consumequeue/{qStart:020d}-{qEnd:020d}     20-byte entries -> cold CommitLog
    .../{topic}/{qid}/index/{qStart:020d}-{qEnd:020d}            key index

Object names carry start AND end offsets: a retried upload of the same
range writes the same key with the same bytes, while a merged segment (same
start, longer range) gets a new name, so no object is ever rewritten with
different content and a reader holding an older manifest keeps reading the
objects it names.

A manifest lists segments (contiguous in queue offsets and in the queue's own
cold CommitLog byte space) and recorded gaps; ``next_offset`` is the first
queue offset not yet archived and survives the expiry of every segment.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from tiered.errors import CorruptRecordError, FormatVersionError

FORMAT_MAJOR = 4
# 1.1: manifests carry a history id, ConsumeQueue objects a descriptor trailer
FORMAT_VERSION = "1.1"
# 2.0: segments in layout v2 (one object each, tiered/archive/layout.py). A manifest
# is written as 2.0 only when it holds a v2 segment, so a 1.x reader refuses
# it loudly instead of misreading a section key as an object.
FORMAT_VERSION_V2 = "2.0"
# 3.0: the manifest is a bounded head that references immutable manifest
# chunks (tiered/archive/chunks.py). Written only when it references one, so
# a 2.x reader refuses it loudly instead of seeing only the head's tail.
FORMAT_VERSION_CHUNKED = "3.0"
# 4.0: a chunk the head reaches is carried inside a segment object (a section
# of it, tiered/archive/chunks.py), not an object of its own. Written only
# then, so a 3.x reader refuses it loudly instead of looking for a chunk
# object that was never written; a head whose chunks are all standalone stays 3.0.
FORMAT_VERSION_CARRIED = "4.0"

MANIFEST = "manifest.json"
CATALOG = "_catalog.json"
LEASE = "_lease.json"
IDENTITY = "_identity.json"


def history_id(identity: str, cluster: str, broker: str, topic: str, queue_id: int, start: int) -> str:
    """The id of the archive history a queue starts at ``start`` (see
    tiered/archive/segmeta.py). Derived, not random: a retried upload after a crash
    writes the same descriptor, while a history restarted elsewhere (another
    start offset, another bucket identity) gets another id."""
    raw = f"{identity}\x00{cluster}\x00{broker}\x00{topic}\x00{queue_id}\x00{start}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


def broker_prefix(cluster: str, broker: str) -> str:
    return f"{cluster}/{broker}"


# Broker-level objects live beside the topic folders: a topic of the same
# name gets its folder escaped with "~" (no RocketMQ topic contains "~" or "."),
# so neither hides the other on a file system.
_RESERVED = frozenset({CATALOG, LEASE, IDENTITY})
_ESCAPE = "~"


def topic_dir(topic: str) -> str:
    return _ESCAPE + topic if topic in _RESERVED or topic.startswith(_ESCAPE) else topic


def topic_of_dir(name: str) -> str:
    return name[len(_ESCAPE):] if name.startswith(_ESCAPE) else name


def queue_prefix(cluster: str, broker: str, topic: str, queue_id: int) -> str:
    return f"{cluster}/{broker}/{topic_dir(topic)}/{queue_id}"


def segment_keys(prefix: str, cl_start: int, cl_end: int, q_start: int, q_end: int) -> tuple[str, str, str]:
    """(commitlog, consumequeue, index) object keys of a segment."""
    return (
        f"{prefix}/commitlog/{cl_start:020d}-{cl_end:020d}",
        f"{prefix}/consumequeue/{q_start:020d}-{q_end:020d}",
        f"{prefix}/index/{q_start:020d}-{q_end:020d}",
    )


def check_version(doc: dict[str, Any], what: str) -> None:
    version = str(doc.get("format_version", ""))
    try:
        major = int(version.split(".", 1)[0])
    except ValueError:
        raise CorruptRecordError(what, 0, f"no valid format_version ({version!r})") from None
    if major > FORMAT_MAJOR:
        raise FormatVersionError(
            f"{what} has format version {version}; this tiered reads up to {FORMAT_MAJOR}.x: upgrade tiered"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """One sealed, immutable upload: records [q_start, q_end) at cold
    CommitLog bytes [cl_start, cl_end)."""

    q_start: int
    q_end: int
    cl_start: int
    cl_end: int
    min_store_ms: int
    max_store_ms: int
    min_born_ms: int
    max_born_ms: int
    commitlog_key: str
    consumequeue_key: str
    index_key: str | None
    commitlog_crc: int
    consumequeue_crc: int
    created_ms: int
    bloom: str | None = None  # base64 bloom filter of the segment's keys (layout v1 only)
    # bytes the segment's object takes in the bucket (layout v2; 0: not
    # recorded): with zstd, nbytes / stored_bytes is the compression ratio.
    # Known only once the object is packed, so its own descriptor holds 0.
    stored_bytes: int = 0
    # A BatchCQ queue's segment: q_start/q_end number its BatchConsumeQueue
    # entries (one record each), msg_start/msg_end the queue offsets of the
    # messages inside them, as RocketMQ counts them (docs/batchcq.md).
    # None for any other queue.
    msg_start: int | None = None
    msg_end: int | None = None

    @property
    def batch(self) -> bool:
        return self.msg_start is not None

    @property
    def messages(self) -> int:
        return self.q_end - self.q_start

    @property
    def nbytes(self) -> int:
        return self.cl_end - self.cl_start

    def keys(self) -> tuple[str, ...]:
        """The stored objects of the segment: three in layout v1, one in v2
        (whose parts are sections of it, tiered/archive/layout.py)."""
        return tuple(dict.fromkeys(k.partition("#")[0] for k in (self.commitlog_key, self.consumequeue_key,
                                                                 self.index_key) if k))

    @property
    def layout(self) -> int:
        return 2 if "#" in self.consumequeue_key else 1


_SEGMENT_FIELDS = tuple(f.name for f in fields(Segment))


_OPTIONAL_FIELDS = ("msg_start", "msg_end")  # written only when set: other queues' documents do not change


def segment_doc(s: Segment) -> dict[str, Any]:
    d = {f: getattr(s, f) for f in _SEGMENT_FIELDS}
    for name in _OPTIONAL_FIELDS:
        if d[name] is None:
            del d[name]
    return d


def segment_of(d: dict[str, Any]) -> Segment:
    # fields added by a newer minor version are ignored, not fatal
    return Segment(**{k: v for k, v in d.items() if k in _SEGMENT_FIELDS})


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkRef:
    """A head's reference to an immutable manifest chunk
    (tiered/archive/chunks.py): level 0 holds segments, level L > 0 holds
    references of level L - 1. The chunk yields ``total`` segments; this
    reference drops the first ``skip`` of them (expired), so expiry needs no
    chunk rewrite.

    Where it is stored: the object ``{queue}/manifest/{name}`` (format 3.0),
    or, with ``at``, bytes of a segment object that carried it
    (``{object}#{offset}+{length}``, offsets in the object as stored, so one
    ranged GET reads it, compressed object or not; format 4.0). Either way
    ``name`` carries the hash of the chunk's bytes."""

    name: str
    level: int
    total: int
    skip: int = 0
    at: str | None = None

    @property
    def live(self) -> int:
        return self.total - self.skip

    @property
    def carried(self) -> bool:
        return self.at is not None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "level": self.level, "total": self.total, "skip": self.skip}
        if self.at is not None:
            d["in"] = self.at
        return d

    @classmethod
    def of(cls, d: dict[str, Any]) -> ChunkRef:
        at = d.get("in")
        ref = cls(name=str(d["name"]), level=int(d["level"]), total=int(d["total"]), skip=int(d.get("skip", 0)),
                  at=None if at is None else str(at))
        if ref.level < 0 or not 0 <= ref.skip < ref.total or "/" in ref.name or not ref.name:
            raise ValueError(f"bad chunk reference {d!r}")
        if ref.at is not None:
            obj, sep, where = ref.at.partition("#")
            offset, plus, length = where.partition("+")
            if not (obj and sep and plus and offset.isdigit() and length.isdigit() and int(length) > 0):
                raise ValueError(f"bad chunk location {ref.at!r} (want object#offset+length)")
        return ref


@dataclass(frozen=True, slots=True)
class Gap:
    """Offsets [q_start, q_end) that will never be in the archive, and why:
    ``expired_locally`` (the broker deleted them first) or ``quarantined``
    (a corrupt record moved aside by explicit configuration)."""

    q_start: int
    q_end: int
    reason: str
    recorded_ms: int
    detail: str = ""


_GAP_FIELDS = tuple(f.name for f in fields(Gap))


@dataclass(frozen=True, slots=True)
class PendingDelete:
    """Objects replaced by a merge, deleted once ``after_ms`` has passed so a
    reader that loaded the previous manifest still finds them."""

    keys: tuple[str, ...]
    after_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    topic: str
    queue_id: int
    next_offset: int
    cl_next: int
    generation: int = 0
    segments: tuple[Segment, ...] = ()
    gaps: tuple[Gap, ...] = ()
    pending_deletes: tuple[PendingDelete, ...] = ()
    writer: str = ""
    updated_ms: int = 0
    format_version: str = FORMAT_VERSION
    # id of this archive history; "" for manifests written before 1.1
    history: str = ""
    # How the committed head stores ``segments`` (format 3.0): references to
    # immutable chunks holding a prefix of them, and every chunk object those
    # reach. Storage detail, not content: equality ignores them, and the next
    # commit re-derives them from ``segments`` (tiered/archive/chunks.py).
    # ``chunk_keys[i]`` is the stored object holding the chunk ``chunk_names[i]``
    # (its own object, or the segment object that carried it: a carrier
    # stays referenced while a chunk it holds is).
    chunks: tuple[ChunkRef, ...] = field(default=(), compare=False)
    chunk_keys: tuple[str, ...] = field(default=(), compare=False)
    chunk_names: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def empty(cls, topic: str, queue_id: int, start_offset: int, history: str = "") -> Manifest:
        return cls(topic=topic, queue_id=queue_id, next_offset=start_offset, cl_next=0, history=history)

    def gaps_before(self, q_start: int) -> tuple[Gap, ...]:
        """Recorded gaps between the segment before ``q_start`` and ``q_start``."""
        prev_end = max((s.q_end for s in self.segments if s.q_end <= q_start), default=-1)
        return tuple(g for g in self.gaps if g.q_start >= prev_end and g.q_end <= q_start)

    @property
    def first_offset(self) -> int:
        """First queue offset the archive still covers (segment or gap)."""
        starts = [s.q_start for s in self.segments[:1]] + [g.q_start for g in self.gaps[:1]]
        return min(starts) if starts else self.next_offset

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    @property
    def messages(self) -> int:
        return sum(s.messages for s in self.segments)

    @property
    def compression_ratio(self) -> float | None:
        """Record bytes per stored byte over the segments that record their
        stored size (layout v2); None when none does."""
        stored = sum(s.stored_bytes for s in self.segments)
        return sum(s.nbytes for s in self.segments if s.stored_bytes) / stored if stored else None

    @property
    def min_store_ms(self) -> int | None:
        return min((s.min_store_ms for s in self.segments), default=None)

    @property
    def max_store_ms(self) -> int | None:
        return max((s.max_store_ms for s in self.segments), default=None)

    def referenced_keys(self) -> set[str]:
        keys = {k for s in self.segments for k in s.keys()}
        keys.update(k for p in self.pending_deletes for k in p.keys)
        keys.update(self.chunk_keys)
        return keys

    def with_segment(self, seg: Segment) -> Manifest:
        if seg.q_start != self.next_offset or seg.cl_start != self.cl_next:
            raise ValueError(
                f"segment [{seg.q_start},{seg.q_end}) @ {seg.cl_start} does not continue "
                f"the archive at {self.next_offset} @ {self.cl_next}"
            )
        return replace(self, segments=self.segments + (seg,), next_offset=seg.q_end, cl_next=seg.cl_end)

    def with_gap(self, gap: Gap) -> Manifest:
        if gap.q_start != self.next_offset or gap.q_end <= gap.q_start:
            raise ValueError(f"gap [{gap.q_start},{gap.q_end}) does not continue the archive at {self.next_offset}")
        return replace(self, gaps=self.gaps + (gap,), next_offset=gap.q_end)

    def segment_for(self, queue_offset: int) -> Segment | None:
        lo, hi = 0, len(self.segments)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.segments[mid].q_end <= queue_offset:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.segments) and self.segments[lo].q_start <= queue_offset:
            return self.segments[lo]
        return None

    def check(self) -> None:
        """Raise ValueError unless segments and gaps tile the covered range
        contiguously and segments are contiguous in cold CommitLog bytes."""
        ranges = sorted([(s.q_start, s.q_end) for s in self.segments] + [(g.q_start, g.q_end) for g in self.gaps])
        expect = ranges[0][0] if ranges else self.next_offset
        for start, end in ranges:
            if start != expect or end <= start:
                raise ValueError(f"{self.topic}/{self.queue_id}: range [{start},{end}) breaks contiguity at {expect}")
            expect = end
        if expect != self.next_offset:
            raise ValueError(f"{self.topic}/{self.queue_id}: covered range ends at {expect}, next_offset {self.next_offset}")
        for a, b in zip(self.segments, self.segments[1:]):
            if b.cl_start != a.cl_end:
                raise ValueError(f"{self.topic}/{self.queue_id}: cold CommitLog hole at {a.cl_end}")
        if self.segments and self.segments[-1].cl_end > self.cl_next:
            raise ValueError(f"{self.topic}/{self.queue_id}: cl_next behind the last segment")

    # --- JSON ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The whole manifest, every segment inline (format 1.1 / 2.0): the
        local cache's form, and what a head without chunks is."""
        return self.head_dict((), 0)

    def head_dict(self, refs: tuple[ChunkRef, ...], tail: int, *, carried: bool = False) -> dict[str, Any]:
        """The manifest as a head: ``refs`` stand for ``segments[:tail]``,
        the rest is inline. Format 3.0 when it references a chunk, 4.0 when
        a chunk it reaches is ``carried`` in a segment object."""
        # Field by field, not asdict(self): that deep-copies every segment.
        if refs:
            # (no walk over the history on a chunked commit)
            version = FORMAT_VERSION_CARRIED if carried else FORMAT_VERSION_CHUNKED
        else:
            version = FORMAT_VERSION_V2 if any(s.layout == 2 for s in self.segments) else self.format_version
        d = {
            "topic": self.topic, "queue_id": self.queue_id, "next_offset": self.next_offset,
            "cl_next": self.cl_next, "generation": self.generation, "writer": self.writer,
            "updated_ms": self.updated_ms, "history": self.history, "format_version": version,
            "segments": [segment_doc(s) for s in self.segments[tail:]],
            "gaps": [asdict(g) for g in self.gaps],
            "pending_deletes": [{"keys": list(p.keys), "after_ms": p.after_ms} for p in self.pending_deletes],
        }
        if refs:
            d["chunks"] = [r.to_dict() for r in refs]
        return d

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True).encode("utf-8")

    @staticmethod
    def chunk_refs(d: dict[str, Any], source: str = MANIFEST) -> tuple[ChunkRef, ...]:
        """The chunk references of a head document (none in 1.x / 2.0)."""
        try:
            return tuple(ChunkRef.of(r) for r in d.get("chunks", []))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(source, 0, f"malformed chunk reference: {exc}") from None

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = MANIFEST,
                  prefix: tuple[Segment, ...] | None = None) -> Manifest:
        """A manifest from its document. A head that references chunks needs
        the segments they hold, in order, as ``prefix`` (ColdTier resolves
        them): without it, it is refused rather than read as its tail alone."""
        check_version(d, source)
        if d.get("chunks") and prefix is None:
            raise CorruptRecordError(source, 0, "a chunked manifest (format 3.0 or later) read without its chunks")
        try:
            segments = (prefix or ()) + tuple(segment_of(s) for s in d.get("segments", []))
            version = str(d["format_version"])
            if version.startswith(("3.", "4.")):
                # 3.x / 4.x name how the head is stored, not what it holds: in memory
                # the manifest has the 1.x/2.0 version its content calls for
                version = FORMAT_VERSION_V2 if any(s.layout == 2 for s in segments) else FORMAT_VERSION
            return cls(
                topic=d["topic"], queue_id=int(d["queue_id"]), next_offset=int(d["next_offset"]),
                cl_next=int(d["cl_next"]), generation=int(d["generation"]),
                segments=segments,
                gaps=tuple(Gap(**{k: v for k, v in g.items() if k in _GAP_FIELDS}) for g in d.get("gaps", [])),
                pending_deletes=tuple(PendingDelete(tuple(p["keys"]), int(p["after_ms"]))
                                      for p in d.get("pending_deletes", [])),
                writer=d.get("writer", ""), updated_ms=int(d.get("updated_ms", 0)),
                format_version=version,
                history=str(d.get("history", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(source, 0, f"malformed manifest: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def document(data: bytes, source: str = MANIFEST) -> dict[str, Any]:
        """The JSON object of a manifest (whole or head), its version checked."""
        try:
            d = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptRecordError(source, 0, f"manifest is not JSON ({type(exc).__name__})") from None
        if not isinstance(d, dict):
            raise CorruptRecordError(source, 0, "manifest is not a JSON object")
        check_version(d, source)
        return d

    @classmethod
    def from_bytes(cls, data: bytes, source: str = MANIFEST) -> Manifest:
        """A whole manifest (1.x, 2.0, or a head without chunks); a head with
        chunks is read by ColdTier, which resolves them."""
        return cls.from_dict(cls.document(data, source), source)


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogEntry:
    topic: str
    queue_id: int
    first_offset: int
    next_offset: int
    segments: int
    nbytes: int
    min_store_ms: int | None
    max_store_ms: int | None
    generation: int

    @classmethod
    def of(cls, m: Manifest) -> CatalogEntry:
        return cls(topic=m.topic, queue_id=m.queue_id, first_offset=m.first_offset, next_offset=m.next_offset,
                   segments=len(m.segments), nbytes=m.nbytes, min_store_ms=m.min_store_ms, max_store_ms=m.max_store_ms,
                   generation=m.generation)


@dataclass(frozen=True)
class Catalog:
    """Per-broker list of archived queues. A hint for discovery and status:
    the manifests stay the truth (a reader prunes segments by manifests)."""

    cluster: str
    broker: str
    queues: tuple[CatalogEntry, ...] = field(default=())
    updated_ms: int = 0
    format_version: str = FORMAT_VERSION
    # topic -> (hours, source): each topic's effective retention as the
    # dispatcher, which reads the broker's topics.json, last saw it
    retention: dict[str, tuple[float, str]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        d = {"cluster": self.cluster, "broker": self.broker, "updated_ms": self.updated_ms,
             "format_version": self.format_version, "queues": [asdict(q) for q in self.queues],
             "retention": {t: {"hours": h, "source": src} for t, (h, src) in sorted(self.retention.items())}}
        return json.dumps(d, separators=(",", ":"), sort_keys=True).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, source: str = CATALOG) -> Catalog:
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptRecordError(source, 0, f"catalog is not a JSON object ({type(exc).__name__})") from None
        check_version(d, source)
        try:
            return cls(d["cluster"], d["broker"], tuple(CatalogEntry(**q) for q in d.get("queues", [])),
                       int(d.get("updated_ms", 0)), d["format_version"],
                       {str(t): (float(r["hours"]), str(r["source"])) for t, r in d.get("retention", {}).items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(source, 0, f"malformed catalog: {type(exc).__name__}") from None
