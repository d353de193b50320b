"""Manifest chunks carried in segment objects (layout v2, manifest format
4.0, tiered/archive/chunks.py) on their bad days, on file:// and S3: a
carrier lost, truncated or damaged; a crash between the carrier's upload and
the head commit; a start from the bucket alone; compressed carriers; older
readers; and 3.0 archives (standalone chunks) continued."""

from __future__ import annotations

import json
import subprocess

import pytest

from chunkkit import Recording, assert_older_readers_refuse, carried_docs, orphan_pass
from dispatchkit import BROKER, CLUSTER, CountingRecorder, archive_all, assert_exact, new_dispatcher, new_writer, produce
from tiered.archive import coldtier, layout, segmeta
from tiered.archive.chunks import CHUNK_DIR, CHUNK_SEGMENTS, Carried, ManifestChunkError
from tiered.archive.coldtier import ColdTier
from tiered.archive.manifest import CATALOG, MANIFEST, queue_prefix
from tiered.archive.storage import ObjectStore
from tiered.errors import CorruptRecordError
from tiered.ops.status import queue_status
from tiered.ops.verify import verify
from tiered.store.localstore import LocalStore

TOPIC = "Carried"
HEAD = f"{queue_prefix(CLUSTER, BROKER, TOPIC, 0)}/{MANIFEST}"


def dispatcher(store: ObjectStore, local: LocalStore, state, clock, **kw):  # noqa: ANN001, ANN003, ANN201
    kw.setdefault("layout", 2)
    return new_dispatcher(store, local, state, clock, upload_bytes=1, max_delay_ms=0, segment_bytes=1, **kw)



def archived(tmp_path, open_cold, cold_url, clock, n: int, *, queues: int = 1, **kw):  # noqa: ANN001, ANN003, ANN202
    """``n`` one-record segments per queue, archived in layout v2."""
    w = new_writer(tmp_path / "store")
    for qid in range(queues):
        produce(w, TOPIC, qid, n, clock=clock, body_size=60)
    store = open_cold(cold_url)
    rec = Recording(store)
    local = LocalStore(tmp_path / "store")
    d = dispatcher(store, local, tmp_path / "state", clock, **kw)
    archive_all(d, local, [(TOPIC, q) for q in range(queues)])
    return w, local, store, rec, d


def carriers(store: ObjectStore) -> list[tuple[str, int, int]]:
    """(object, offset, length) of each chunk the head references directly."""
    return [layout.split(c["in"]) for c in json.loads(store.get(HEAD))["chunks"]]  # type: ignore[misc]



def test_a_crash_between_the_carrier_upload_and_the_head_commit_loses_nothing(
        cold_url, open_cold, tmp_path, clock) -> None:
    w, local, store, rec, d = archived(tmp_path, open_cold, cold_url, clock, CHUNK_SEGMENTS)
    assert not rec.carried and "chunks" not in json.loads(store.get(HEAD))
    produce(w, TOPIC, 0, 3, clock=clock, body_size=60, seed=1)
    rec.crash_after_chunk = True  # the 17th commit seals the first 16 segments, carried by the 17th object
    local.refresh()
    result = d.run_round()
    assert not result.ok and "access denied" in result.errors[f"{TOPIC}/0"]
    [(carrier, section)] = rec.carried
    assert carrier.split("/segment/")[1].startswith(f"{CHUNK_SEGMENTS:020d}-")
    assert [doc["level"] for doc in carried_docs(section)] == [0]
    # the old head still reads: 16 inline segments, no chunk
    before = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert before.next_offset == CHUNK_SEGMENTS and before.chunk_keys == ()
    assert json.loads(store.get(HEAD))["format_version"] == "2.0"
    # the carrier is an orphan like any uncommitted upload
    assert orphan_pass(store) == [carrier] and store.head(carrier) is None
    # the retry rewrites the same key with the same chunk: its bytes depend only on the committed head
    d2 = dispatcher(store, local, tmp_path / "state", clock)
    archive_all(d2, local, [(TOPIC, 0)])
    w.close()
    again = [s for k, s in rec.carried[1:] if k == carrier]
    assert again == [section]
    assert carriers(store) == [layout.split(layout.section_key(carrier, *_span(store, carrier)))]
    assert_exact(store, local, [(TOPIC, 0)])
    assert orphan_pass(store) == []


def _span(store: ObjectStore, obj: str) -> tuple[int, int]:
    desc = segmeta.parse(store.get(obj), obj)
    assert desc is not None and desc.chunks is not None
    return desc.chunks


def test_a_lost_carrier_stops_its_queue_only_and_repair_rebuilds_it(cold_url, open_cold, tmp_path, clock) -> None:
    n = 2 * CHUNK_SEGMENTS + 1  # the newest segment carries the chunk of segments 16..31
    w, local, store, rec, d = archived(tmp_path, open_cold, cold_url, clock, n, queues=2)
    old = d.cold.cached(TOPIC, 0)
    [(first, _, _), (lost, at, _)] = carriers(store)
    assert lost == old.segments[-1].keys()[0] and first == old.segments[CHUNK_SEGMENTS].keys()[0]
    store.delete_many([lost])
    produce(w, TOPIC, 1, 2, clock=clock, body_size=60, seed=2)
    counting = CountingRecorder()
    d2 = dispatcher(store, local, tmp_path / "state-new", clock, recorder=counting)
    local.refresh()
    result = d2.run_round()
    # only that queue stops, with the object named; counted and logged as today for a lost chunk
    assert set(result.errors) == {f"{TOPIC}/0"} and lost in result.errors[f"{TOPIC}/0"], result.errors
    assert "missing" in result.errors[f"{TOPIC}/0"]
    assert counting.corrupt[(TOPIC, 0)] == 1 and d2.cold.cached(TOPIC, 1).next_offset == n + 2
    with pytest.raises(ManifestChunkError) as err:
        ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert (err.value.source, err.value.offset) == (lost, at)
    rows = {(r.topic, r.queue_id): r for r in queue_status(ColdTier(store, CLUSTER, BROKER), local)}
    assert lost in (rows[(TOPIC, 0)].problem or "") and rows[(TOPIC, 1)].problem is None
    # repair rebuilds from the segment objects: everything but the lost newest segment
    report = ColdTier(store, CLUSTER, BROKER, writer="repair").repair()
    assert report.ok and set(report.adopted) == {f"{TOPIC}/0"} and report.intact == 1
    m = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert m.segments == old.segments[:-1] and m.next_offset == n - 1
    assert json.loads(store.get(HEAD))["format_version"] == "3.0"  # a repair's chunks are objects of their own
    # the broker still has the lost segment's record: the dispatcher archives it again
    d3 = dispatcher(store, local, tmp_path / "state-3", clock)
    archive_all(d3, local, [(TOPIC, 0), (TOPIC, 1)])
    w.close()
    assert_exact(store, local, [(TOPIC, 0), (TOPIC, 1)])


def test_a_truncated_carrier_is_named_and_repair_adopts_once_it_is_moved_aside(
        cold_url, open_cold, tmp_path, clock) -> None:
    n = 2 * CHUNK_SEGMENTS + 1
    w, local, store, _, d = archived(tmp_path, open_cold, cold_url, clock, n)
    [_, (carrier, at, length)] = carriers(store)
    data = store.get(carrier)
    store.put(carrier, data[:at + length // 2])  # cut inside the carried chunk
    with pytest.raises(ManifestChunkError, match="truncated") as err:
        ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert (err.value.source, err.value.offset) == (carrier, at)
    store.put(carrier, data[:at - 5])  # cut before it: the range lies past the object's end
    with pytest.raises(ManifestChunkError, match="truncated") as err:
        ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert err.value.source == carrier
    # the truncated object has lost its descriptor: repair names it and adopts nothing ...
    report = ColdTier(store, CLUSTER, BROKER, writer="repair").repair()
    assert not report.ok and any(carrier in p for p in report.problems[f"{TOPIC}/0"])
    assert store.head(HEAD) is not None and json.loads(store.get(HEAD))["format_version"] == "4.0"
    # ... until an operator moves it aside; then the rest is adopted and the dispatcher goes on
    store.delete_many([carrier])
    report = ColdTier(store, CLUSTER, BROKER, writer="repair").repair()
    assert report.ok and set(report.adopted) == {f"{TOPIC}/0"}
    archive_all(dispatcher(store, local, tmp_path / "state-new", clock), local, [(TOPIC, 0)])
    w.close()
    assert_exact(store, local, [(TOPIC, 0)])


def test_a_damaged_carried_chunk_is_refused_by_its_hash_and_repair_rebuilds(
        cold_url, open_cold, tmp_path, clock) -> None:
    n = 2 * CHUNK_SEGMENTS + 4
    w, local, store, _, d = archived(tmp_path, open_cold, cold_url, clock, n)
    old = d.cold.cached(TOPIC, 0)
    [(carrier, at, length), _] = carriers(store)
    data = bytearray(store.get(carrier))
    section = bytes(data[at:at + length])
    i = section.index(b'"commitlog_crc":') + len(b'"commitlog_crc":')
    data[at + i] = ord("9") if data[at + i] != ord("9") else ord("8")  # a digit: still JSON, another chunk
    store.put(carrier, bytes(data))
    with pytest.raises(ManifestChunkError, match="hash in its name") as err:
        ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert (err.value.source, err.value.offset) == (carrier, at)
    # the segment itself is intact (records, entries, descriptor): repair rebuilds the whole list
    report = ColdTier(store, CLUSTER, BROKER, writer="repair").repair()
    assert report.ok and set(report.adopted) == {f"{TOPIC}/0"}
    m = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert m.segments == old.segments and not any("/segment/" in k for k in m.chunk_keys)
    assert verify(ColdTier(store, CLUSTER, BROKER), local).ok
    w.close()


def test_a_fresh_writer_reads_carried_chunks_from_the_bucket_alone(cold_url, open_cold, tmp_path, clock) -> None:
    n = 3 * CHUNK_SEGMENTS + 3
    w, local, store, _, d = archived(tmp_path, open_cold, cold_url, clock, n)
    old = d.cold.cached(TOPIC, 0)
    store.delete_many([f"{CLUSTER}/{BROKER}/{CATALOG}"])  # no catalog either: a LIST finds the queue
    counting = CountingRecorder()
    fresh = open_cold(cold_url, recorder=counting)
    ranged: list[tuple[str, int | None]] = []
    raw_get = fresh._raw_get

    def get(key: str, start: int | None, end: int | None) -> bytes:
        ranged.append((key, start))
        return raw_get(key, start, end)

    fresh._raw_get = get  # type: ignore[method-assign]
    d2 = dispatcher(fresh, local, tmp_path / "state-new", clock)
    d2.start()
    assert d2.cold.cached(TOPIC, 0).to_bytes() == old.to_bytes()  # (the writer's in-memory version aside)
    assert d2.cold.cached(TOPIC, 0).chunk_keys == old.chunk_keys
    # the three chunks: one ranged GET each, of the segment objects that carry them
    chunk_reads = [(k, s) for k, s in ranged if "/segment/" in k]
    assert sorted(chunk_reads) == sorted((o, a) for o, a, _ in carriers(store))
    produce(w, TOPIC, 0, CHUNK_SEGMENTS, clock=clock, body_size=60, seed=3)
    archive_all(d2, local, [(TOPIC, 0)])
    w.close()
    assert_exact(store, local, [(TOPIC, 0)])
    assert not [k for k in (o.key for o in store.list_keys(f"{CLUSTER}/{BROKER}/")) if f"/{CHUNK_DIR}/" in k]


def test_a_compressed_carrier_keeps_its_chunks_outside_the_frame(tmp_path, open_cold, clock) -> None:
    url = f"file://{tmp_path / 'cold'}"
    w, local, store, rec, d = archived(tmp_path, open_cold, url, clock, CHUNK_SEGMENTS + 1, compression="zstd")
    w.close()
    [(carrier, at, length)] = carriers(store)
    assert carrier.endswith(".zst") and at == layout.CARRIED_AT_ZSTD
    data = store.get(carrier)
    # a zstd skippable frame in front: the chunk is plain bytes a ranged GET reads ...
    magic, size = layout.SKIPPABLE.unpack_from(data, 0)
    assert magic == layout.SKIPPABLE_MAGIC and size == length
    assert [doc["level"] for doc in carried_docs(data[at:at + length])] == [0]
    assert rec.carried == [(carrier, data[at:at + length])]
    # ... and every zstd decoder skips it: the payload is the segment, its descriptor says where the chunk is
    payload = layout.decompress(data, carrier)
    seg = d.cold.cached(TOPIC, 0).segments[-1]
    assert payload[:seg.nbytes] == layout.read_part(store, seg.commitlog_key)
    desc = segmeta.parse(payload, carrier)
    assert desc is not None and desc.chunks == (at, length) and desc.segment.q_start == seg.q_start
    # the zstd tool (installed by the README's test command) decodes it alone
    out = subprocess.run(["zstd", "-d", "-c", "-q"], input=data, capture_output=True, check=True)
    assert out.stdout == payload
    assert_exact(store, local, [(TOPIC, 0)])
    assert verify(ColdTier(store, CLUSTER, BROKER), local).ok


def test_older_readers_refuse_carriers_and_their_heads_loudly(tmp_path, open_cold, clock, monkeypatch) -> None:
    w, local, store, _, _ = archived(tmp_path, open_cold, f"file://{tmp_path / 'cold'}", clock, CHUNK_SEGMENTS + 1)
    w.close()
    [(carrier, _, _)] = carriers(store)
    assert_older_readers_refuse(store.get(HEAD), HEAD, monkeypatch, major=4)
    monkeypatch.setattr(segmeta, "DESCRIPTOR_VERSION", 2)  # a tiered before carriers, rebuilding from objects
    with pytest.raises(CorruptRecordError, match="descriptor version 3 is newer"):
        segmeta.parse(store.get(carrier), carrier)
    monkeypatch.undo()
    # an object that carries nothing keeps descriptor 2: readable by those versions
    first = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0).segments[0].keys()[0]
    assert json.loads(_descriptor_bytes(store.get(first)))["descriptor"] == 2


def _descriptor_bytes(obj: bytes) -> bytes:
    length, _, _ = segmeta.FOOTER.unpack_from(obj, len(obj) - segmeta.FOOTER.size)
    return obj[len(obj) - segmeta.FOOTER.size - length:len(obj) - segmeta.FOOTER.size]


@pytest.mark.parametrize("first_layout", [1, 2])
def test_a_3_0_archive_with_standalone_chunks_is_read_and_continued(
        cold_url, open_cold, tmp_path, clock, first_layout: int, monkeypatch) -> None:  # noqa: ANN001
    """A 3.0 head (standalone chunks: layout v1's, or a v2 archive written
    before carriers, here committed without carrying) goes on in layout v2:
    new chunks are carried, the old ones stay where they are."""
    w = new_writer(tmp_path / "store")
    produce(w, TOPIC, 0, 2 * CHUNK_SEGMENTS + 1, clock=clock, body_size=60)
    store = open_cold(cold_url)
    local = LocalStore(tmp_path / "store")
    d = dispatcher(store, local, tmp_path / "state", clock, layout=first_layout)
    with monkeypatch.context() as patch:
        if first_layout == 2:
            patch.setattr(coldtier, "carry", lambda *a, **k: Carried())  # as a 3.0 tiered wrote v2
        archive_all(d, local, [(TOPIC, 0)])
    doc = json.loads(store.get(HEAD))
    assert doc["format_version"] == "3.0" and all("in" not in c for c in doc["chunks"])
    standalone = {o.key for o in store.list_keys(f"{queue_prefix(CLUSTER, BROKER, TOPIC, 0)}/{CHUNK_DIR}/")}
    assert len(standalone) == 2
    produce(w, TOPIC, 0, 7 * CHUNK_SEGMENTS, clock=clock, body_size=60, seed=1)
    d2 = dispatcher(store, local, tmp_path / "state", clock)
    archive_all(d2, local, [(TOPIC, 0)])
    w.close()
    doc = json.loads(store.get(HEAD))
    assert doc["format_version"] == "4.0"
    m = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert m.to_bytes() == d2.cold.cached(TOPIC, 0).to_bytes() and len(m.segments) == 9 * CHUNK_SEGMENTS + 1
    # the eight level-0 chunks folded into one level-1 chunk, carried; it names the two old ones in place
    [top] = [c for c in doc["chunks"] if c["level"] == 1]
    assert "in" in top and {k for k in m.chunk_keys if f"/{CHUNK_DIR}/" in k} == standalone
    assert_exact(store, local, [(TOPIC, 0)])
    assert verify(ColdTier(store, CLUSTER, BROKER), local).ok
