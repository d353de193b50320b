"""Manifest chunks (tiered/archive/chunks.py): the commit point stays one
conditional write of manifest.json, but the head is bounded and older
segments live in immutable chunk objects. These tests check the planning
logic on its own, the exact round trip through a real store, reading every
old manifest form, and what an older reader does with a chunked head."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from chunkkit import assert_older_readers_refuse
from tiered.archive import chunks
from tiered.archive.chunks import CHUNK_DIR, CHUNK_FANOUT, CHUNK_SEGMENTS, Chunk, ManifestChunkError
from tiered.archive.coldtier import ColdTier
from tiered.archive.manifest import MANIFEST, ChunkRef, Manifest, Segment, queue_prefix, segment_keys
from tiered.archive.storage import FileStore
from tiered.clock import ManualClock

CLUSTER, BROKER, TOPIC, QID = "C", "b", "Orders", 3
PREFIX = queue_prefix(CLUSTER, BROKER, TOPIC, QID)
HEAD = f"{PREFIX}/{MANIFEST}"


def seg(i: int, *, layout: int = 1, messages: int = 2, created: int = 1000) -> Segment:
    """Segment ``i`` of a queue whose segments hold ``messages`` records of 100 bytes."""
    q, cl = i * messages, i * messages * 100
    if layout == 1:
        cl_key, cq_key, ix_key = segment_keys(PREFIX, cl, cl + messages * 100, q, q + messages)
        bloom: str | None = "AAEC" * 8
    else:
        obj = f"{PREFIX}/segment/{q:020d}-{q + messages:020d}"
        cl_key, cq_key, ix_key, bloom = f"{obj}#0-{messages * 100}", f"{obj}#{messages * 100}-9", None, None
    return Segment(q_start=q, q_end=q + messages, cl_start=cl, cl_end=cl + messages * 100,
                   min_store_ms=5 + i, max_store_ms=6 + i, min_born_ms=4 + i, max_born_ms=6 + i,
                   commitlog_key=cl_key, consumequeue_key=cq_key, index_key=ix_key, commitlog_crc=i,
                   consumequeue_crc=i + 1, created_ms=created, bloom=bloom, stored_bytes=0 if layout == 1 else 77)


class Loader:
    """Chunks held in memory (the planning logic is pure but for reading chunks)."""

    def __init__(self) -> None:
        self.chunks: dict[str, Chunk] = {}
        self.reads = 0

    def add(self, plan: chunks.ChunkPlan) -> None:
        self.chunks.update(plan.made)

    def __call__(self, ref: ChunkRef) -> Chunk:
        self.reads += 1
        return self.chunks[ref.name]


def grow(n: int, loader: Loader) -> tuple[tuple[Segment, ...], chunks.ChunkPlan, list[chunks.ChunkPlan]]:
    """Append ``n`` segments one commit at a time; every plan made on the way."""
    segments: tuple[Segment, ...] = ()
    plan = chunks.ChunkPlan(refs=(), tail=0, writes=(), made={})
    plans = []
    for i in range(n):
        new = segments + (seg(i),)
        plan = chunks.plan(plan.refs, segments, new, TOPIC, QID, loader)
        loader.add(plan)
        plans.append(plan)
        segments = new
    return segments, plan, plans


def test_appends_seal_a_chunk_every_16_segments_and_fold_every_8_chunks() -> None:
    loader = Loader()
    segments, plan, plans = grow(300, loader)
    # every commit: the head holds 1 to CHUNK_SEGMENTS inline segments, the
    # newest always among them (what a commit seals is older than what it adds)
    assert all(1 <= i + 1 - p.tail <= CHUNK_SEGMENTS for i, p in enumerate(plans))
    assert [i for i, p in enumerate(plans) if p.writes][:2] == [CHUNK_SEGMENTS, 2 * CHUNK_SEGMENTS]
    levels = [name.split("-")[1] for p in plans for name, _ in p.writes]
    assert levels.count("L0") == 300 // CHUNK_SEGMENTS == 18
    assert levels.count("L1") == 18 // CHUNK_FANOUT == 2
    assert "L2" not in levels
    # 300 = 2 x 128 (two level-1 chunks) + 2 x 16 (level-0) + a tail of 12
    assert [(r.level, r.total, r.skip) for r in plan.refs] == [(1, 128, 0), (1, 128, 0), (0, 16, 0), (0, 16, 0)]
    assert plan.tail == 288
    assert chunks.flatten(plan.refs, loader) == segments[:288]
    # one commit in 16 writes one level-0 chunk; a fold adds its level-1 chunk
    assert max(len(p.writes) for p in plans) == 2
    assert sum(1 for p in plans if p.writes) == 18


def test_a_chunk_name_is_its_content_so_a_retried_write_is_idempotent() -> None:
    loader = Loader()
    segments, plan, _ = grow(33, loader)  # two chunks sealed (the newest segment stays inline)
    again = chunks.plan((), (), segments, TOPIC, QID, loader)
    assert [n for n, _ in again.writes] == [n for n, _ in chunks.plan((), (), segments, TOPIC, QID, loader).writes]
    changed = chunks.plan((), (), (replace(segments[0], created_ms=1),) + segments[1:], TOPIC, QID, loader)
    assert changed.writes[0][0] != again.writes[0][0]
    assert changed.writes[1] == again.writes[1]  # the second chunk holds the same segments
    name, body = again.writes[0]
    assert name.startswith(f"chunk-L0-{0:020d}-{32:020d}-") and name.endswith(".json")
    assert json.loads(body)["format_version"] == "3.0"


def test_expiry_raises_a_skip_and_writes_no_chunk() -> None:
    loader = Loader()
    segments, plan, _ = grow(300, loader)
    loader.reads = 0
    kept = segments[150:]
    after = chunks.plan(plan.refs, segments, kept, TOPIC, QID, loader)
    assert after.writes == ()
    assert loader.reads == 0  # nothing expanded: the first level-1 chunk is dropped, the second skipped into
    assert [(r.level, r.total, r.skip) for r in after.refs] == [(1, 128, 22), (0, 16, 0), (0, 16, 0)]
    assert chunks.flatten(after.refs, loader) + kept[after.tail:] == kept
    # everything expired: no reference left
    assert chunks.plan(plan.refs, segments, (), TOPIC, QID, loader).refs == ()


def test_a_merge_rewrites_only_the_chunk_it_changed() -> None:
    loader = Loader()
    segments, plan, _ = grow(300, loader)
    a, b = segments[40], segments[43]
    merged = replace(a, q_end=b.q_end, cl_end=b.cl_end, commitlog_key="merged", created_ms=9)
    new = segments[:40] + (merged,) + segments[44:]
    after = chunks.plan(plan.refs, segments, new, TOPIC, QID, loader)
    loader.add(after)
    assert chunks.flatten(after.refs, loader) + new[after.tail:] == new
    # the first level-1 chunk is expanded into its eight level-0 chunks; only
    # the one holding segments 32..47 is rewritten (13 segments now), then the
    # eight are folded again: two chunks written, never the history
    written = [json.loads(b) for _, b in after.writes]
    assert [(d["level"], len(d.get("segments", d.get("chunks")))) for d in written] == [(0, 13), (1, 8)]
    assert [(r.level, r.total) for r in after.refs] == [(1, 125), (1, 128), (0, 16), (0, 16)]
    assert after.refs[1:] == plan.refs[1:]


def commit_segments(cold: ColdTier, segments: tuple[Segment, ...]) -> Manifest:
    def change(current: Manifest | None) -> Manifest:
        m = current or Manifest.empty(TOPIC, QID, 0, history="h1")
        for s in segments[len(m.segments):]:
            m = m.with_segment(s)
        return m
    return cold.commit(TOPIC, QID, change)


@pytest.mark.parametrize("layout", [1, 2])
def test_a_chunked_manifest_round_trips_exactly(tmp_path, layout: int) -> None:
    store = FileStore(str(tmp_path / "cold"))
    cold = ColdTier(store, CLUSTER, BROKER, writer="w", clock=ManualClock())
    segments = tuple(seg(i, layout=layout) for i in range(40))
    for n in range(1, 41):
        written = commit_segments(cold, segments[:n])
    doc = json.loads(store.get(HEAD))
    assert doc["format_version"] == "3.0"
    assert [r["name"].split("-")[1] for r in doc["chunks"]] == ["L0", "L0"]
    assert len(doc["segments"]) == 8
    fresh = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, QID)
    # (the writer's in-memory version is what it started with, as before chunks)
    assert fresh == replace(written, format_version=fresh.format_version) and fresh.segments == segments
    assert fresh.to_bytes() == written.to_bytes()  # the whole form, byte for byte
    assert fresh.format_version == ("2.0" if layout == 2 else "1.1")
    assert [s.bloom for s in fresh.segments] == [s.bloom for s in segments]
    assert set(fresh.chunk_keys) == {f"{PREFIX}/{CHUNK_DIR}/{r['name']}" for r in doc["chunks"]}
    assert fresh.chunk_keys and set(fresh.chunk_keys) <= fresh.referenced_keys()
    assert {o.key for o in store.list_keys(f"{PREFIX}/{CHUNK_DIR}/")} == set(fresh.chunk_keys)


def test_an_older_reader_refuses_a_chunked_head_loudly(tmp_path, monkeypatch) -> None:
    store = FileStore(str(tmp_path / "cold"))
    commit_segments(ColdTier(store, CLUSTER, BROKER, clock=ManualClock()), tuple(seg(i) for i in range(20)))
    # read without its chunks the head would look like a 4-segment manifest: refused
    assert_older_readers_refuse(store.get(HEAD), HEAD, monkeypatch, major=3)


@pytest.mark.parametrize("layout,version", [(1, "1.1"), (2, "2.0")])
def test_whole_manifests_written_the_old_way_are_read_and_continued(tmp_path, layout: int, version: str) -> None:
    store = FileStore(str(tmp_path / "cold"))
    segments = tuple(seg(i, layout=layout) for i in range(41))
    old = Manifest(topic=TOPIC, queue_id=QID, next_offset=80, cl_next=8000, generation=7, segments=segments[:40],
                   writer="old", updated_ms=5, history="h1", format_version=version)
    store.put(HEAD, old.to_bytes())  # the whole-manifest serialization, as tiered wrote it before chunks
    assert json.loads(store.get(HEAD))["format_version"] == version and "chunks" not in json.loads(store.get(HEAD))
    cold = ColdTier(store, CLUSTER, BROKER, writer="w", clock=ManualClock())
    assert cold.fetch(TOPIC, QID) == old
    m = commit_segments(cold, segments)
    assert m.generation == 8 and m.segments == segments
    doc = json.loads(store.get(HEAD))
    assert doc["format_version"] == "3.0" and len(doc["chunks"]) == 2 and len(doc["segments"]) == 9
    assert ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, QID) == replace(m, format_version=version)


def test_a_lost_or_damaged_chunk_is_a_typed_error_naming_the_object(tmp_path) -> None:
    store = FileStore(str(tmp_path / "cold"))
    commit_segments(ColdTier(store, CLUSTER, BROKER, clock=ManualClock()), tuple(seg(i) for i in range(40)))
    first, second = sorted(o.key for o in store.list_keys(f"{PREFIX}/{CHUNK_DIR}/"))
    body = store.get(second)
    store.put(second, body.replace(b'"commitlog_crc":17', b'"commitlog_crc":18'))
    reader = ColdTier(store, CLUSTER, BROKER)
    with pytest.raises(ManifestChunkError, match="hash in its name") as err:
        reader.fetch(TOPIC, QID)
    assert err.value.source == second and (TOPIC, QID) in reader.broken
    store.put(second, body)
    store.delete_many([first])
    with pytest.raises(ManifestChunkError, match="missing") as err:
        ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, QID)
    assert err.value.source == first


def test_the_local_cache_keeps_the_head_and_copies_of_its_chunks(tmp_path) -> None:
    store = FileStore(str(tmp_path / "cold"))
    gets: list[str] = []
    raw_get = store._raw_get

    def get(key: str, start: int | None, end: int | None) -> bytes:
        gets.append(key)
        return raw_get(key, start, end)

    store._raw_get = get  # type: ignore[method-assign]
    state = tmp_path / "state"
    cold = ColdTier(store, CLUSTER, BROKER, state_dir=state, writer="w", clock=ManualClock())
    cold.load()
    segments = tuple(seg(i) for i in range(40))
    for n in range(1, 41):
        commit_segments(cold, segments[:n])
    cache_dir = state / "manifests" / CLUSTER / BROKER
    doc = json.loads((cache_dir / f"{TOPIC}.{QID}.json").read_bytes())
    # the committed head, not the whole manifest: the local write is as small as the bucket's
    assert doc["manifest"] == json.loads(store.get(HEAD))
    copies = {p.name: p.read_bytes() for p in (cache_dir / "_chunks" / f"{TOPIC}.{QID}").iterdir()}
    assert copies == {k.rsplit("/", 1)[1]: store.get(k) for k in cold.cached(TOPIC, QID).chunk_keys}
    # a restart reads the chunks from the local copies: no chunk GET
    gets.clear()
    again = ColdTier(store, CLUSTER, BROKER, state_dir=state, writer="w", clock=ManualClock())
    again.load()
    assert again.cached(TOPIC, QID) == cold.cached(TOPIC, QID)
    assert again.cached(TOPIC, QID).chunk_keys == cold.cached(TOPIC, QID).chunk_keys
    assert not [k for k in gets if f"/{CHUNK_DIR}/" in k]
    # a torn copy fails its hash and is read from the bucket (and copied again)
    first = sorted(copies)[0]
    (cache_dir / "_chunks" / f"{TOPIC}.{QID}" / first).write_bytes(b"{torn")
    third = ColdTier(store, CLUSTER, BROKER, state_dir=state, writer="w", clock=ManualClock())
    third.load()
    assert third.cached(TOPIC, QID) == cold.cached(TOPIC, QID)
    assert [k for k in gets if f"/{CHUNK_DIR}/" in k] == [f"{PREFIX}/{CHUNK_DIR}/{first}"]
    assert (cache_dir / "_chunks" / f"{TOPIC}.{QID}" / first).read_bytes() == copies[first]
    # expiry past the first chunk drops its local copy
    third.commit(TOPIC, QID, lambda m: replace(m, segments=m.segments[20:]))
    assert sorted(p.name for p in (cache_dir / "_chunks" / f"{TOPIC}.{QID}").iterdir()) == sorted(copies)[1:]


def carrier_of(i: int) -> str:
    return f"{PREFIX}/segment/carrier-{i}"


def grow_carried(n: int, loader: Loader) -> tuple[tuple[Segment, ...], chunks.ChunkPlan]:
    """As ``grow``, every commit's chunks placed in the object of the
    segment it adds, one after the other (what the dispatcher's upload does)."""
    segments: tuple[Segment, ...] = ()
    plan = chunks.ChunkPlan(refs=(), tail=0, writes=(), made={})
    for i in range(n):
        new = segments + (seg(i),)
        at = [100]

        def place(name: str, body: bytes, i: int = i) -> str:
            at[0] += len(body)
            return f"{carrier_of(i)}#{at[0] - len(body)}+{len(body)}"

        plan = chunks.plan(plan.refs, segments, new, TOPIC, QID, loader, place=place)
        loader.add(plan)
        segments = new
    return segments, plan


def test_carried_chunks_name_their_carrier_which_is_newer_than_what_they_describe() -> None:
    loader = Loader()
    segments, plan = grow_carried(300, loader)
    reached = chunks.reachable(plan.refs, loader)
    assert len(reached) == 18 + 2 and all(r.carried for r in reached)
    for r in reached:
        carrier = int(r.at.split("#")[0].rsplit("-", 1)[1])
        first, end = chunks.span(r.name)
        # the carrier is the segment whose commit sealed it: right after what it describes
        assert segments[carrier].q_start == end
    # a level-1 chunk names its children where they are carried (format 4.0); a level-0 chunk's
    # bytes are its segments only (3.0), the same wherever it is stored
    [l1] = [r for r in plan.refs if r.level == 1][:1]
    name, body = chunks.encode(TOPIC, QID, loader.chunks[l1.name], 0, chunks.span(l1.name)[1])
    assert name == l1.name and json.loads(body)["format_version"] == "4.0"
    assert all("in" in c for c in json.loads(body)["chunks"])
    l0 = reached[-1]
    assert json.loads(chunks.encode(TOPIC, QID, loader.chunks[l0.name], *chunks.span(l0.name))[1])[
        "format_version"] == "3.0"
    assert chunks.flatten(plan.refs, loader) == segments[:plan.tail]


def test_a_chunk_whose_carrier_goes_is_written_again_elsewhere_under_its_name() -> None:
    loader = Loader()
    segments, plan = grow_carried(300, loader)
    level0 = [r for r in chunks.reachable(plan.refs, loader) if r.level == 0]
    victim = next(r for r in level0 if chunks.span(r.name)[0] == 32 * 2)  # segments 32..47, carried by 48
    gone = frozenset({victim.at.split("#")[0]})
    assert gone == {carrier_of(48)}
    loader.reads = 0
    after = chunks.plan(plan.refs, segments, segments, TOPIC, QID, loader, gone=gone)
    loader.add(after)
    # the chunk keeps its name (its content is the same), now an object of its own; its parent,
    # which named the old place, is written again; nothing else
    assert [n for n, _ in after.writes] == [victim.name, after.refs[0].name] and not after.placed
    assert after.refs[0].name != plan.refs[0].name and after.refs[1:] == plan.refs[1:]
    reached = chunks.reachable(after.refs, loader)
    assert not any(r.at and r.at.split("#")[0] in gone for r in reached)
    assert [r for r in reached if r.name == victim.name] == [replace(victim, at=None)]
    assert chunks.flatten(after.refs, loader) == segments[:after.tail] and after.tail == plan.tail
    # nothing goes: nothing is written, whatever the references hold
    assert chunks.plan(plan.refs, segments, segments, TOPIC, QID, loader).writes == ()


def test_a_head_sealed_by_the_older_rule_is_continued() -> None:
    """tiered 3.0 sealed as soon as 16 segments were inline, leaving none:
    such a head goes on, the newest segment now always inline."""
    loader = Loader()
    segments = tuple(seg(i) for i in range(34))
    # what 3.0 wrote for 32 segments: two chunks and an empty tail (the same
    # chunks the present rule seals once a 33rd segment is there)
    sealed = chunks.plan((), (), segments[:33], TOPIC, QID, loader)
    loader.add(sealed)
    assert sealed.tail == 32 and len(sealed.refs) == 2
    for n in (33, 34):
        nxt = chunks.plan(sealed.refs, segments[:32], segments[:n], TOPIC, QID, loader)
        assert nxt.writes == () and nxt.refs == sealed.refs and nxt.tail == 32
        assert chunks.flatten(nxt.refs, loader) + segments[32:n] == segments[:n]
