"""Manifest chunks: a commit that does not grow with the queue's history.

The manifest stays the one commit point (a single conditional write of
``{queue}/manifest.json``, docs/design.md section 3), but from format 3.0 it is a
bounded *head*: next offset, gaps, history, writer fields, the segments not
yet sealed into a chunk (the *tail*, 1 to ``CHUNK_SEGMENTS`` of them), and
references to immutable chunks holding every older segment, as an Iceberg
manifest list references manifests.

A level-0 chunk holds up to ``CHUNK_SEGMENTS`` segment entries; a level-L
chunk holds ``CHUNK_FANOUT`` references of level L-1 (a run of that many
same-level references in the head is folded into one). So a head holds at
most ``CHUNK_SEGMENTS`` segments and about ``CHUNK_FANOUT`` references per
level: every commit writes O(1) bytes, never O(history). The newest segment
always stays inline: a commit seals the tail once it has reached
``CHUNK_SEGMENTS`` *before* the segment it adds (one commit in
``CHUNK_SEGMENTS`` seals a level-0 chunk, one in ``CHUNK_SEGMENTS *
CHUNK_FANOUT`` also a level-1 chunk, and so on), so what a commit seals is
always older than the segment it commits.

Where a chunk is stored (``ChunkRef.at``):

- *carried* (format 4.0, layout v2): the dispatcher's commit puts the chunks
  it seals inside the object of the segment it commits (a section of that
  object, tiered/archive/segmeta.py), and the head names that section, so a
  segment costs two requests, its object and the head, however long the
  history. The carrier is newer than every segment its chunks describe, so
  prefix expiry never deletes a carrier while one of its chunks still
  describes a kept segment (the cleaner's plan checks it), and a merge that
  replaces a carrier rewrites the chunks it still needs as objects of their
  own first (``plan``'s ``gone``);
- *standalone* (format 3.0; layout v1, the cleaner's and a repair's
  commits, a commit that lost its race): the object
  ``{queue}/manifest/chunk-L{level}-{qFirst:020d}-{qEnd:020d}-{sha16}.json``,
  written (plain PUT) before the head that references it.

A chunk's bytes depend only on its content, and its name carries their
hash: a retried write is idempotent, a name never holds two contents, and a
level-0 chunk moved from its carrier to an object of its own keeps its name.
A crash between the write of a chunk (or its carrier) and the head commit
leaves an unreferenced object: an orphan, collected after the grace period
like an uploaded segment whose commit never happened.

Changes other than appends keep what still holds. Expiry drops references
whose segments are all gone and raises the ``skip`` of the one that is
partly gone (no chunk rewritten). A merge that replaced segments inside a
chunk expands the higher-level references on the way to it and rewrites
only the level-0 chunk it changed (``plan`` below): O(levels x fanout)
references, never the history.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tiered.archive import layout
from tiered.archive.manifest import (FORMAT_VERSION_CARRIED, FORMAT_VERSION_CHUNKED, ChunkRef, Manifest, Segment,
                                     check_version, segment_doc, segment_of)
from tiered.errors import ManifestChunkError

CHUNK_DIR = "manifest"
CHUNK_SEGMENTS = 16  # segments per level-0 chunk (the head's tail holds fewer)
CHUNK_FANOUT = 8  # same-level references folded into one chunk a level up


def chunk_key(queue_prefix: str, name: str) -> str:
    return f"{queue_prefix}/{CHUNK_DIR}/{name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk:
    """The parsed content of one chunk object: segments (level 0) or
    references (level > 0)."""

    level: int
    segments: tuple[Segment, ...] = ()
    refs: tuple[ChunkRef, ...] = ()

    @property
    def total(self) -> int:
        return len(self.segments) if self.level == 0 else sum(r.live for r in self.refs)


def encode(topic: str, queue_id: int, chunk: Chunk, q_first: int, q_end: int) -> tuple[str, bytes]:
    """(name, bytes) of a chunk. Only content goes in (no clock, no writer),
    so the same chunk always gets the same name and bytes. A chunk whose
    references name a carried chunk is format 4.0 (a 3.x reader refuses it)."""
    carried = chunk.level > 0 and any(r.carried for r in chunk.refs)
    doc: dict[str, Any] = {"format_version": FORMAT_VERSION_CARRIED if carried else FORMAT_VERSION_CHUNKED,
                           "topic": topic, "queue_id": queue_id, "level": chunk.level}
    if chunk.level == 0:
        doc["segments"] = [segment_doc(s) for s in chunk.segments]
    else:
        doc["chunks"] = [r.to_dict() for r in chunk.refs]
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")
    digest = hashlib.sha256(body).hexdigest()[:16]
    return f"chunk-L{chunk.level}-{q_first:020d}-{q_end:020d}-{digest}.json", body


def span(name: str) -> tuple[int, int]:
    """[qFirst, qEnd) of the segments a chunk describes, from its name."""
    parts = name.split("-")
    return int(parts[2]), int(parts[3])


def decode(data: bytes, source: str, ref: ChunkRef, topic: str, queue_id: int, offset: int = 0) -> Chunk:
    """The chunk ``ref`` names, read from ``source`` (at ``offset`` in it);
    ManifestChunkError unless it is exactly what the reference promises (its
    hash, queue, level and number of segments)."""
    digest = ref.name.rsplit("-", 1)[-1].removesuffix(".json")
    if hashlib.sha256(data).hexdigest()[:16] != digest:
        raise ManifestChunkError(source, offset, f"manifest chunk {ref.name} does not match the hash in its name")
    try:
        doc = json.loads(data)
        check_version(doc, source)
        if (doc["topic"], int(doc["queue_id"]), int(doc["level"])) != (topic, queue_id, ref.level):
            raise ValueError(f"it describes {doc['topic']}/{doc['queue_id']} level {doc['level']}")
        if ref.level == 0:
            chunk = Chunk(level=0, segments=tuple(segment_of(s) for s in doc["segments"]))
        else:
            chunk = Chunk(level=ref.level, refs=tuple(ChunkRef.of(r) for r in doc["chunks"]))
            if any(r.level != ref.level - 1 for r in chunk.refs):
                raise ValueError("a child reference of the wrong level")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ManifestChunkError(source, offset, f"malformed manifest chunk: {exc}") from None
    if chunk.total != ref.total:
        raise ManifestChunkError(source, offset, f"manifest chunk holds {chunk.total} segments, its reference "
                                                 f"promises {ref.total}")
    return chunk


def children(chunk: Chunk, skip: int) -> list[ChunkRef]:
    """The references of a level > 0 chunk with the parent's ``skip``
    pushed down to them."""
    out = []
    for r in chunk.refs:
        if skip >= r.live:
            skip -= r.live
            continue
        out.append(replace(r, skip=r.skip + skip) if skip else r)
        skip = 0
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkPlan:
    """How a manifest's segments are stored: ``refs`` hold
    ``segments[:tail]``, the head the rest; ``writes`` are the new chunks
    (name, bytes), each before any chunk that references it; those in
    ``placed`` (name -> ``ChunkRef.at``) are carried in a segment object,
    the others are objects of their own."""

    refs: tuple[ChunkRef, ...]
    tail: int
    writes: tuple[tuple[str, bytes], ...]
    made: dict[str, Chunk]  # name -> content of each write (for the caller's cache)
    placed: dict[str, str] = field(default_factory=dict)


#: Decides where a new chunk goes: (name, bytes) -> ``ChunkRef.at``, or None
#: for an object of its own.
Place = Callable[[str, bytes], str | None]


def _dropped(prev: Sequence[Segment], segments: Sequence[Segment]) -> int:
    """How many leading segments of ``prev`` are gone (expired), when the
    new list starts with one of them; 0 when it does not (then nothing is
    assumed and references are matched one by one)."""
    if not segments:
        return len(prev)
    i = bisect.bisect_left(prev, segments[0].q_start, key=_q_start)
    return i if i < len(prev) and prev[i] == segments[0] else 0


def _q_start(s: Segment) -> int:
    return s.q_start


class _Planner:
    def __init__(self, topic: str, queue_id: int, segments: Sequence[Segment], size: int, fanout: int,
                 load: Callable[[ChunkRef], Chunk], place: Place | None, gone: frozenset[str]) -> None:
        self.topic, self.queue_id = topic, queue_id
        self.segments = segments
        self.size, self.fanout = size, fanout
        self.load, self.place, self.gone = load, place, gone
        self.out: list[tuple[ChunkRef, int, int]] = []  # reference, [a, b) in segments
        self.writes: list[tuple[str, bytes]] = []
        self.made: dict[str, Chunk] = {}
        self.placed: dict[str, str] = {}
        self._touches: dict[str, bool] = {}

    def find(self, seg: Segment, lo: int) -> int | None:
        # segments are in queue-offset order (Manifest.check): no list of starts built per commit
        j = bisect.bisect_left(self.segments, seg.q_start, lo, key=_q_start)
        return j if j < len(self.segments) and self.segments[j].q_start == seg.q_start else None

    def touches_gone(self, ref: ChunkRef) -> bool:
        """Whether the chunk ``ref`` names, or one below it, is carried by an
        object about to go (a merged or expired segment's)."""
        if not self.gone:
            return False
        key = f"{ref.name}@{ref.at}"
        hit = self._touches.get(key)
        if hit is None:
            hit = ref.at is not None and layout.object_of(ref.at) in self.gone
            if not hit and ref.level > 0:
                hit = any(self.touches_gone(k) for k in self.load(ref).refs)
            self._touches[key] = hit
        return hit

    def write(self, chunk: Chunk, a: int, b: int) -> ChunkRef:
        name, body = encode(self.topic, self.queue_id, chunk, self.segments[a].q_start, self.segments[b - 1].q_end)
        at = self.place(name, body) if self.place is not None else None
        self.writes.append((name, body))
        self.made[name] = chunk
        if at is not None:
            self.placed[name] = at
        return ChunkRef(name=name, level=chunk.level, total=chunk.total, at=at)

    def seal(self, a: int, b: int) -> None:
        """segments[a:b] into level-0 chunks of up to ``size``."""
        for i in range(a, b, self.size):
            j = min(i + self.size, b)
            self.out.append((self.write(Chunk(level=0, segments=tuple(self.segments[i:j])), i, j), i, j))

    def fold(self) -> None:
        """Fold every run of ``fanout`` same-level references into one chunk
        a level up, until there is none."""
        i = 0
        while i + self.fanout <= len(self.out):
            run = self.out[i:i + self.fanout]
            if len({r.level for r, _, _ in run}) != 1:
                i += 1
                continue
            a, b = run[0][1], run[-1][2]
            parent = self.write(Chunk(level=run[0][0].level + 1, refs=tuple(r for r, _, _ in run)), a, b)
            self.out[i:i + self.fanout] = [(parent, a, b)]
            i = 0


def plan(
    prev_refs: Sequence[ChunkRef],
    prev_segments: Sequence[Segment],
    segments: Sequence[Segment],
    topic: str,
    queue_id: int,
    load: Callable[[ChunkRef], Chunk],
    *,
    size: int = CHUNK_SEGMENTS,
    fanout: int = CHUNK_FANOUT,
    place: Place | None = None,
    gone: frozenset[str] = frozenset(),
) -> ChunkPlan:
    """The chunks that store ``segments``, reusing those of the previous
    commit (``prev_refs`` holding a prefix of ``prev_segments``) wherever
    they still hold exactly what they did and are not stored in an object
    of ``gone`` (objects the commit stops referencing: what they carry is
    written again, elsewhere). ``load`` reads a chunk (cached: chunks are
    immutable); ``place`` says where each new chunk goes (default: objects
    of their own). The newest segment is never sealed. Pure but for
    ``load`` and ``place``."""
    p = _Planner(topic, queue_id, segments, size, fanout, load, place, gone)
    d = _dropped(prev_segments, segments)
    work: deque[tuple[ChunkRef, int]] = deque()
    at = 0
    for r in prev_refs:
        work.append((r, at))
        at += r.live
    pos = 0  # segments[:pos] are stored by p.out
    while work:
        ref, a = work.popleft()
        b = a + ref.live
        if b <= d:
            continue  # expired whole: no longer referenced
        if a < d:
            ref, a = replace(ref, skip=ref.skip + d - a), d
        live = prev_segments[a:b]
        j = p.find(live[0], pos) if live else None
        if j is not None and tuple(segments[j:j + len(live)]) == tuple(live) and not p.touches_gone(ref):
            p.seal(pos, j)  # segments that replaced a changed chunk's
            p.out.append((ref, j, j + len(live)))
            pos = j + len(live)
        elif ref.level > 0:
            kids, start = [], a
            for k in children(load(ref), ref.skip):
                kids.append((k, start))
                start += k.live
            work.extendleft(reversed(kids))
        # a changed level-0 chunk, or one whose carrier goes, is dropped: what
        # it still holds is sealed anew (the same content: the same name)
    # the newest segment stays inline: whatever is sealed is older than the
    # segment a dispatcher commit adds, the one that may carry it
    tail = pos + max(0, len(segments) - pos - 1) // size * size
    p.seal(pos, tail)
    p.fold()
    return ChunkPlan(refs=tuple(r for r, _, _ in p.out), tail=tail, writes=tuple(p.writes), made=p.made,
                     placed=p.placed)


@dataclass(frozen=True, slots=True, kw_only=True)
class Carried:
    """Manifest chunks a segment object carries (``append.carry``): their
    bytes, where they start in the object as stored, and each one's place
    (chunk name -> ``ChunkRef.at``)."""

    body: bytes = b""
    at: int = 0
    places: dict[str, str] = field(default_factory=dict)

    @property
    def span(self) -> tuple[int, int] | None:
        """(offset, length) for the segment's descriptor; None: carries none."""
        return (self.at, len(self.body)) if self.body else None


def stored_in(queue_prefix: str, ref: ChunkRef) -> str:
    """The stored object holding the chunk ``ref`` names."""
    return layout.object_of(ref.at) if ref.at is not None else chunk_key(queue_prefix, ref.name)


def going(base: Manifest | None, new: Manifest) -> frozenset[str]:
    """Objects a commit stops referencing for good: those of the segments it
    expires, and those it puts into (or takes out of, to delete now) the
    pending deletes: merged runs. A chunk carried by one is written again
    elsewhere. Never a walk over the history: appends give none."""
    if base is None:
        return frozenset()
    out: set[str] = set()
    if base.pending_deletes != new.pending_deletes:
        old, now = set(base.pending_deletes), set(new.pending_deletes)
        for p in old.symmetric_difference(now):
            out.update(p.keys)
    if new.segments and base.segments and base.segments[0] != new.segments[0]:
        first = new.segments[0].q_start
        for s in base.segments:
            if s.q_end > first:
                break
            out.update(s.keys())
    elif base.segments and not new.segments:
        out.update(k for s in base.segments for k in s.keys())
    return frozenset(out)


def reachable(refs: Sequence[ChunkRef], load: Callable[[ChunkRef], Chunk]) -> list[ChunkRef]:
    """Every chunk reference ``refs`` reach (the references and all below)."""
    out: list[ChunkRef] = []
    stack = list(refs)
    while stack:
        r = stack.pop()
        out.append(r)
        if r.level > 0:
            stack.extend(load(r).refs)
    return out


def flatten(refs: Sequence[ChunkRef], load: Callable[[ChunkRef], Chunk]) -> tuple[Segment, ...]:
    """The segments ``refs`` hold, in order, skips applied."""
    out: list[Segment] = []

    def walk(r: ChunkRef) -> None:
        c = load(r)
        if r.level == 0:
            out.extend(c.segments[r.skip:])
            return
        for k in children(c, r.skip):
            walk(k)

    for r in refs:
        walk(r)
    return tuple(out)
