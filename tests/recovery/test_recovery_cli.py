"""Bad days, end to end through the CLI on real files and the moto server:
a lost manifest, objects nothing accounts for, ``tiered repair``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiered.archive import segmeta
from tiered.cli import app
from tiered.archive.coldtier import ColdTier
from tiered.archive.manifest import Manifest, queue_prefix
from tiered.archive.storage import ObjectStore, S3Options, open_store
from tiered.store.storewriter import StoreWriter

PREFIX = "C/b"


@pytest.fixture
def env(tmp_path: Path, cold_url: str, request: pytest.FixtureRequest) -> dict[str, str]:
    e = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "C", "TIERED_BROKER": "b",
         "TIERED_LOG__LEVEL": "WARNING", "TIERED_CLEANER__ORPHAN_GRACE": "0.001s",
         # these tests hand-edit layout v1 objects (still read and rebuilt); layout v2
         # recovery: tests/archive/test_layout_v2.py
         "TIERED_DISPATCH__LAYOUT": "1"}
    if cold_url.startswith("s3://"):
        e["TIERED_S3__ENDPOINT_URL"] = request.getfixturevalue("moto_endpoint")
    return e


@pytest.fixture
def objects(cold_url: str, moto_endpoint: str) -> ObjectStore:
    return open_store(cold_url, s3=S3Options(endpoint_url=moto_endpoint))


def invoke(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout if "--json" in args else result.output


def produce(w: StoreWriter, topic: str, n: int, start: int = 0) -> None:
    now = time.time_ns() // 1_000_000
    for i in range(start, start + n):
        w.put(topic, 0, f"{topic}-{i}".encode() * 20, keys=[f"k{i}"], store_timestamp=now - 1000 + i)


def problem_of(status_table: str, topic: str, queue: int) -> str:
    """The PROBLEM cell of a queue's row in ``tiered status``'s table (off a
    terminal: one line per row); log lines on stderr may come before it."""
    lines = status_table.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("TOPIC") and "PROBLEM" in ln)
    at = lines[head].index("PROBLEM")
    return next(ln[at:] for ln in lines[head + 1:] if ln.split()[:2] == [topic, str(queue)])


def dispatch(env: dict[str, str], store: Path, cold_url: str) -> tuple[int, str]:
    return invoke(env, "dispatch", "--once", "--all", "--store", str(store), "--cold", cold_url)


def manifest(objects: ObjectStore, topic: str) -> Manifest:
    m = ColdTier(objects, "C", "b").fetch(topic, 0)  # a chunked head is read with its chunks
    assert m is not None
    return m


def data_keys(objects: ObjectStore, topic: str) -> set[str]:
    return {o.key for o in objects.list_keys(f"{PREFIX}/{topic}/0/") if not o.key.endswith("manifest.json")}


def three_segments(store_writer: Callable[..., StoreWriter], env: dict[str, str],
                   cold_url: str) -> tuple[StoreWriter, Path]:
    w = store_writer()
    store = w.root
    for batch in range(3):
        produce(w, "T", 5, batch * 5)
        produce(w, "U", 2, batch * 2)
        w.flush()
        assert dispatch(env, store, cold_url)[0] == 0
    return w, store


@pytest.mark.parametrize("lose_cache", [False, True])
def test_lost_manifest_is_rebuilt_and_archiving_continues(
        tmp_path: Path, cold_url: str, env: dict[str, str], objects: ObjectStore, lose_cache: bool,
        store_writer) -> None:  # noqa: ANN001
    w, store = three_segments(store_writer, env, cold_url)
    before = manifest(objects, "T")
    assert len(before.segments) == 3 and before.history
    objects.delete_many([f"{PREFIX}/T/0/manifest.json"])  # a lifecycle rule, a hand, a partial restore
    if lose_cache:
        import shutil

        shutil.rmtree(tmp_path / "state")
    produce(w, "T", 4, 15)
    w.flush()
    code, out = dispatch({**env, "TIERED_LOG__LEVEL": "INFO"}, store, cold_url)
    assert code == 0, out
    # with the cache intact the new segment is uploaded before the commit finds
    # the manifest gone, and is adopted too; without it, the rebuild comes first
    assert f"manifest of T/0 was missing; rebuilt from {3 if lose_cache else 4} segment objects" in out
    after = manifest(objects, "T")
    # history kept: the same three segments, then the new one, never a restart at the local minimum
    assert after.segments[:3] == before.segments and after.history == before.history
    assert [(s.q_start, s.q_end) for s in after.segments] == [(0, 5), (5, 10), (10, 15), (15, 19)]
    # the cleaner keeps every object (nothing is an orphan), verify is exact
    keys = data_keys(objects, "T")
    code, out = invoke(env, "clean", "--cold", cold_url, "--store", str(store), "--once")
    assert code == 0, out
    assert data_keys(objects, "T") == keys
    code, out = invoke(env, "verify", "--store", str(store), "--cold", cold_url)
    assert code == 0 and "records 25" in out, out
    w.close()


def test_unaccountable_objects_stop_only_their_queue(
        store_writer, cold_url: str, env: dict[str, str], objects: ObjectStore) -> None:
    w, store = three_segments(store_writer, env, cold_url)
    m = manifest(objects, "T")
    # segment 2 of T becomes an object from before descriptors, then the manifest is lost
    seg = m.segments[1]
    objects.put(seg.consumequeue_key, objects.get(seg.consumequeue_key)[:seg.messages * 20])
    objects.delete_many([f"{PREFIX}/T/0/manifest.json"])
    keys = data_keys(objects, "T")
    content = {k: objects.get(k) for k in keys}
    produce(w, "T", 2, 15)
    produce(w, "U", 2, 6)
    w.flush()
    code, out = dispatch(env, store, cold_url)
    assert code == 1
    assert "T/0" in out and "no manifest accounts for" in out and seg.consumequeue_key in out
    # nothing there is altered or deleted (the cached manifest let the next
    # segment upload before its commit found the manifest gone), none committed
    assert {k: objects.get(k) for k in keys} == content
    assert objects.head(f"{PREFIX}/T/0/manifest.json") is None
    assert manifest(objects, "U").next_offset == 8  # the healthy queue went on
    code, out = invoke(env, "clean", "--cold", cold_url, "--store", str(store), "--once")
    assert keys <= data_keys(objects, "T") and "keep T/0" in out
    code, out = invoke(env, "repair", "--cold", cold_url)
    assert code == 1 and f"cannot adopt T/0: {seg.consumequeue_key}: written before segment descriptors" in out
    w.close()


def test_repair_rebuilds_on_demand_and_dry_run_writes_nothing(
        store_writer, cold_url: str, env: dict[str, str], objects: ObjectStore) -> None:
    w, store = three_segments(store_writer, env, cold_url)
    lost = {t: manifest(objects, t) for t in ("T", "U")}
    objects.delete_many([f"{PREFIX}/T/0/manifest.json", f"{PREFIX}/U/0/manifest.json"])
    code, out = invoke(env, "repair", "--cold", cold_url, "--dry-run")
    assert code == 0, out
    assert "would rebuild T/0: 3 segments, offsets [0,15)" in out and "would rebuild U/0: 3 segments" in out
    assert objects.head(f"{PREFIX}/T/0/manifest.json") is None
    code, out = invoke(env, "repair", "--cold", cold_url, "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["ok"] and sorted(report["adopted"]) == ["T/0", "U/0"] and report["problems"] == {}
    for topic, m in lost.items():
        rebuilt = manifest(objects, topic)
        assert rebuilt.segments == m.segments and rebuilt.next_offset == m.next_offset
        assert rebuilt.history == m.history
    code, out = invoke(env, "repair", "--cold", cold_url)
    assert code == 0 and "0 manifests rebuilt, 2 intact" in out
    code, out = invoke(env, "verify", "--store", str(store), "--cold", cold_url)
    assert code == 0, out
    w.close()


def test_another_history_is_never_collected_as_orphans(
        store_writer, cold_url: str, env: dict[str, str], objects: ObjectStore) -> None:
    """The old failure: a manifest restarted afresh while older segments of
    another history remain. The cleaner keeps them and says so."""
    w, store = three_segments(store_writer, env, cold_url)
    old = manifest(objects, "T")
    # plant the objects of a foreign history: same queue, offsets before ours
    foreign = {}
    for seg in old.segments:
        cq = objects.get(seg.consumequeue_key)
        desc = segmeta.parse(cq, seg.consumequeue_key)
        assert desc is not None
        moved = seg.__class__(**{**{f: getattr(seg, f) for f in seg.__dataclass_fields__},
                                 "consumequeue_key": seg.consumequeue_key.replace("/consumequeue/0", "/consumequeue/9")})
        foreign[moved.consumequeue_key] = segmeta.attach(cq[:seg.messages * 20], segmeta.Descriptor(
            cluster="C", broker="b", topic="T", queue_id=0, history="0" * 32, segment=moved))
    for key, data in foreign.items():
        objects.put(key, data)
    code, out = invoke(env, "clean", "--cold", cold_url, "--store", str(store), "--once", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["orphans"] == [] and sorted(report["unaccounted"]["T/0"]) == sorted(foreign)
    assert all(objects.head(k) is not None for k in foreign)
    w.close()


def test_an_emptied_bucket_is_noticed_and_everything_archived_again(
        store_writer, cold_url: str, env: dict[str, str], objects: ObjectStore) -> None:
    w, store = three_segments(store_writer, env, cold_url)
    ident = json.loads(objects.get(f"{PREFIX}/_identity.json"))["id"]
    objects.delete_many([o.key for o in objects.list_keys("")])  # emptied (or recreated) under us
    code, out = dispatch({**env, "TIERED_LOG__LEVEL": "INFO"}, store, cold_url)
    assert code == 0, out
    assert "not the one the local state describes" in out
    assert json.loads(objects.get(f"{PREFIX}/_identity.json"))["id"] != ident
    assert manifest(objects, "T").next_offset == 15 and manifest(objects, "U").next_offset == 6
    code, out = invoke(env, "verify", "--store", str(store), "--cold", cold_url)
    assert code == 0 and "records 21" in out, out
    w.close()


def test_verify_names_overdue_unarchived_queues_and_missing_prefixes(
        store_writer, cold_url: str, env: dict[str, str]) -> None:
    w, store = three_segments(store_writer, env, cold_url)
    now = time.time_ns() // 1_000_000
    for i in range(3):
        w.put("Never", 0, b"never archived", store_timestamp=now - 600_000 + i)
        w.put("T", 0, b"archive ends before me", store_timestamp=now - 600_000 + i)
        w.put("Young", 0, b"within the max delay", store_timestamp=now + i)
    w.flush()
    code, out = invoke(env, "verify", "--store", str(store), "--cold", cold_url)
    assert code == 1, out
    assert "NOT ARCHIVED: Never/0: 3 messages from offset 0 not archived" in out and "never archived" in out
    assert "NOT ARCHIVED: T/0: 3 messages from offset 15 not archived" in out and "archive ends at offset 15" in out
    assert "Young/0" not in out.split("NOT ARCHIVED")[-1] and "within the max delay): Young/0" not in out
    assert out.rstrip().endswith("FAILED")
    code, out = invoke(env, "verify", "--store", str(store), "--cold", cold_url, "--json")
    report = json.loads(out)
    assert sorted(report["pending"]) == ["Never/0", "T/0"] and not report["ok"]
    # once archived, all is well again
    assert dispatch(env, store, cold_url)[0] == 0
    assert invoke(env, "verify", "--store", str(store), "--cold", cold_url)[0] == 0
    # a broker with no archive under the URL is named, with the ones that exist
    code, out = invoke(env, "verify", "--store", str(store), "--cold", cold_url, "--broker", "nope")
    assert code == 1 and "NO ARCHIVE: nothing under C/nope" in out and "prefixes there: C/b" in out
    w.close()


ODD_TOPICS = ["_catalog.json", "manifest.json", "_lease.json", "_identity.json", "t" * 127]


def test_topics_named_like_internal_files_or_127_long_break_nothing(
        store_writer, cold_url: str, env: dict[str, str], objects: ObjectStore) -> None:
    with store_writer() as w:
        store = w.root
        for topic in ODD_TOPICS:
            produce(w, topic, 3)
    code, out = dispatch(env, store, cold_url)
    assert code == 0, out
    for topic in ODD_TOPICS:
        assert manifest(objects, topic).next_offset == 3
    code, out = invoke(env, "verify", "--store", str(store), "--cold", cold_url)
    assert code == 0 and "queues 5" in out and "records 15" in out, out
    code, out = invoke(env, "status", "--store", str(store), "--cold", cold_url, "--json")
    assert code == 0, out
    assert sorted(json.loads(line)["topic"] for line in out.splitlines()) == sorted(ODD_TOPICS)
    code, out = invoke(env, "clean", "--cold", cold_url, "--store", str(store), "--once", "--json")
    assert code == 0 and json.loads(out)["orphans"] == [], out
    for topic in ODD_TOPICS:
        code, out = invoke(env, "cat", "--cold", cold_url, "--topic", topic, "--queue", "0", "--json")
        assert code == 0 and out.count("\n") >= 3, (topic, out)
    objects.delete_many([f"{queue_prefix('C', 'b', '_catalog.json', 0)}/manifest.json"])
    code, out = invoke(env, "repair", "--cold", cold_url)
    assert code == 0 and "rebuilt _catalog.json/0: 1 segments" in out, out
    assert invoke(env, "verify", "--store", str(store), "--cold", cold_url)[0] == 0


def test_stale_temporary_files_of_a_file_cold_tier_are_removed(tmp_path: Path, env: dict[str, str],
                                                               store_writer) -> None:  # noqa: ANN001
    cold_url = f"file://{tmp_path / 'cold'}"
    w, store = three_segments(store_writer, env, cold_url)
    qdir = tmp_path / "cold" / PREFIX / "T" / "0" / "commitlog"
    stale, fresh = qdir / ".00-01.123.456.tmp", qdir / ".00-02.123.457.tmp"
    stale.write_bytes(b"half an object")
    fresh.write_bytes(b"a write in flight")
    old = time.time() - 7200
    import os

    os.utime(stale, (old, old))
    code, out = invoke({**env, "TIERED_CLEANER__ORPHAN_GRACE": "1h"}, "clean", "--cold", cold_url, "--once")
    assert code == 0, out
    assert f"delete temporary file of an interrupted write {PREFIX}/T/0/commitlog/.00-01.123.456.tmp" in out
    assert not stale.exists() and fresh.exists()
    assert invoke(env, "verify", "--store", str(store), "--cold", cold_url)[0] == 0
    w.close()


@pytest.mark.parametrize("damage", ["garbage", "foreign", "future"])
def test_a_bad_manifest_stops_only_its_queue(
        tmp_path: Path, cold_url: str, env: dict[str, str], objects: ObjectStore, damage: str, store_writer) -> None:
    w, store = three_segments(store_writer, env, cold_url)
    key = f"{PREFIX}/T/0/manifest.json"
    if damage == "garbage":
        objects.put(key, b"\x00not a manifest")
    elif damage == "foreign":
        objects.put(key, objects.get(f"{PREFIX}/U/0/manifest.json"))
    else:
        doc = json.loads(objects.get(key))
        doc["format_version"] = "9.0"
        objects.put(key, json.dumps(doc).encode())
    bad = objects.get(key)
    produce(w, "T", 2, 15)
    produce(w, "U", 2, 6)
    w.flush()
    import shutil

    shutil.rmtree(tmp_path / "state")  # the cache is rebuilt from the bucket: the bad manifest is read
    code, out = dispatch(env, store, cold_url)
    assert code == 1 and "T/0" in out, out
    assert manifest(objects, "U").next_offset == 8  # the other queue went on
    assert objects.get(key) == bad  # never overwritten
    code, out = invoke(env, "clean", "--cold", cold_url, "--store", str(store), "--once")
    # named whether the cleaner met it loading its cache or in the orphan scan; nothing deleted
    assert code == 1 and "ERROR T/0" in out and "manifest" in out, out
    code, out = invoke(env, "status", "--store", str(store), "--cold", cold_url)
    assert code == 1 and problem_of(out, "T", 0).startswith("manifest unreadable"), out
    w.close()


@pytest.mark.parametrize("damage", ["zeroed", "truncated", "past_end"])
def test_corrupt_local_data_is_loud_and_the_queue_waits(
        store_writer, cold_url: str, env: dict[str, str], objects: ObjectStore, damage: str) -> None:
    import struct

    with store_writer() as w:
        store = w.root
        produce(w, "T", 10)
        produce(w, "U", 10)
    cq = store / "consumequeue" / "T" / "0" / ("0" * 20)
    data = bytearray(cq.read_bytes())
    if damage == "zeroed":
        data[3 * 20:6 * 20] = bytes(60)
        where, stop = f"{cq} @ 60: ConsumeQueue entry 3 is zero while entries up to 10 are written", 3
    elif damage == "truncated":
        data = data[:5 * 20 + 7]
        where, stop = f"{cq} @ 100: ConsumeQueue file ends inside entry 5 (107 bytes): truncated", 5
    else:
        struct.pack_into(">qiq", data, 4 * 20, 10**7, 100, 0)
        where, stop = "@ 10000000: record of queue offset 4 is missing", 4
    cq.write_bytes(bytes(data))
    code, out = dispatch(env, store, cold_url)
    assert code == 1 and where in out.replace("\n", ""), out
    assert manifest(objects, "U").next_offset == 10  # every other queue goes on
    m = manifest(objects, "T") if stop else None
    assert m is not None and m.next_offset == stop and not m.gaps  # waits there: nothing skipped
    code, out = dispatch(env, store, cold_url)  # and says so every time
    assert code == 1 and where in out.replace("\n", "")
    assert manifest(objects, "T").next_offset == stop
    code, out = invoke(env, "status", "--store", str(store), "--cold", cold_url, "--json")
    assert code == 1
    rows = {json.loads(line)["topic"]: json.loads(line) for line in out.splitlines()}
    assert rows["U"]["problem"] is None and "corrupt local data" in rows["T"]["problem"]
    assert where.split(": ", 1)[-1][:30] in rows["T"]["problem"]


def test_a_local_store_behind_its_archive_is_reported_never_archived_backwards(
        store_writer, cold_url: str, env: dict[str, str], objects: ObjectStore) -> None:
    w, store = three_segments(store_writer, env, cold_url)
    w.close()
    import shutil

    shutil.rmtree(store)  # the broker's disk replaced: offsets start again
    with store_writer() as w2:
        produce(w2, "T", 4)
        produce(w2, "U", 8)
    before = manifest(objects, "T")
    code, out = dispatch(env, store, cold_url)
    assert code == 1, out
    flat = out.replace("\n", "")
    assert "T/0: the local store ends at offset 4 but the archive already holds offsets up to 15" in flat
    assert manifest(objects, "T") == before  # never rewritten backwards
    assert manifest(objects, "U").next_offset == 8  # U's new records continue its archive at 6
    code, out = invoke(env, "status", "--store", str(store), "--cold", cold_url)
    assert code == 1 and "the local store ends at offset 4" in out.replace("\n", "")


def test_a_lost_manifest_chunk_stops_its_queue_and_repair_rebuilds_it(
        tmp_path: Path, cold_url: str, env: dict[str, str], objects: ObjectStore, store_writer) -> None:
    """A head whose chunk (tiered/archive/chunks.py) is gone: status and
    dispatch name the chunk and exit 1, the other queue goes on; `tiered
    repair` rebuilds the segment list from the segment objects."""
    w = store_writer()
    store = w.root
    for batch in range(20):  # 20 segments: one chunk of 16 and a head holding 4
        produce(w, "T", 2, batch * 2)
        w.flush()
        assert dispatch(env, store, cold_url)[0] == 0
    before = manifest(objects, "T")
    [chunk] = before.chunk_keys
    objects.delete_many([chunk])
    produce(w, "T", 2, 40)
    produce(w, "U", 3)
    w.flush()
    import shutil

    shutil.rmtree(tmp_path / "state")  # the cache is rebuilt from the bucket: the head's chunk is looked for
    code, out = dispatch(env, store, cold_url)
    assert code == 1 and "T/0" in out and chunk in out, out
    assert manifest(objects, "U").next_offset == 3  # the other queue went on
    shutil.rmtree(tmp_path / "state")  # status rebuilds the cache too: it logs the chunk, then the table
    code, out = invoke(env, "status", "--store", str(store), "--cold", cold_url)
    assert "Logging error" not in out and "manifest unreadable; queue T/0 stopped" in out, out
    assert code == 1 and problem_of(out, "T", 0).startswith("manifest unreadable") and chunk in out, out
    code, out = invoke(env, "repair", "--cold", cold_url, "--dry-run", "--json")
    assert code == 0 and sorted(json.loads(out)["adopted"]) == ["T/0"], out
    assert objects.head(chunk) is None  # a dry run writes nothing
    code, out = invoke(env, "repair", "--cold", cold_url)
    assert code == 0 and "rebuilt T/0: 20 segments, offsets [0,40)" in out, out
    rebuilt = manifest(objects, "T")
    assert rebuilt.segments == before.segments and rebuilt.history == before.history
    assert dispatch(env, store, cold_url)[0] == 0
    assert manifest(objects, "T").next_offset == 42
    code, out = invoke(env, "verify", "--store", str(store), "--cold", cold_url)
    assert code == 0, out
    w.close()
