"""The cold tier as the dispatcher uses it: the local manifest cache (lost,
corrupt, stale after a crash), the catalog, format versions, and the S3
options (encryption, checksum mode, the standard AWS settings)."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from dispatchkit import BROKER, CLUSTER, CountingRecorder, assert_exact, new_dispatcher, new_writer, produce
from dispatchkit import read_manifest
from tiered.cli import app
from tiered.archive.coldtier import ColdTier
from tiered.errors import FormatVersionError
from tiered.store.localstore import LocalStore
from tiered.archive.manifest import CATALOG, Catalog, Manifest
from tiered.archive.storage import S3Options, open_store

QUEUES = [("Cache", 0), ("Cache", 1)]


def _round(d, w, clock, n=10):  # noqa: ANN001, ANN202
    for q in QUEUES:
        produce(w, *q, n, clock=clock)
    r = d.run_round()
    assert r.ok, r.errors
    return r


@pytest.mark.parametrize("damage", ["lost", "corrupt"])
def test_cache_lost_or_corrupt_is_rebuilt_from_the_bucket(damage, cold_url, open_cold, tmp_path, clock):
    store = open_cold(cold_url)
    w = new_writer(tmp_path / "store")
    local = LocalStore(tmp_path / "store")
    kw = dict(upload_bytes=1, max_delay_ms=0, segment_bytes=1500)
    d = new_dispatcher(store, local, tmp_path / "state", clock, **kw)
    _round(d, w, clock)
    cache = tmp_path / "state" / "manifests"
    if damage == "lost":
        shutil.rmtree(cache)
    else:
        for f in cache.rglob("*.json*"):
            f.write_bytes(b"{not json")
    rec = CountingRecorder()
    d2 = new_dispatcher(open_cold(cold_url, recorder=rec), LocalStore(tmp_path / "store"), tmp_path / "state",
                        clock, recorder=rec, **kw)
    d2.start()
    assert rec.requests[("get", "ok")] >= 1  # the manifests were read back
    _round(d2, w, clock)
    w.close()
    assert_exact(store, local, QUEUES)
    # and the rebuilt cache is good again: a further restart trusts it
    rec3 = CountingRecorder()
    d3 = new_dispatcher(open_cold(cold_url, recorder=rec3), LocalStore(tmp_path / "store"), tmp_path / "state",
                        clock, recorder=rec3, **kw)
    d3.start()
    # the lease and the bucket identity only
    assert rec3.total_requests("list") == 0 and rec3.requests[("get", "ok")] == 2


def test_stale_cache_after_a_crash_continues_without_duplicates(cold_url, open_cold, tmp_path, clock):
    """A crash between the manifest write and the cache update leaves the
    cache one commit behind the bucket: the next commit's precondition fails,
    the manifest is re-read, and archiving continues from it."""
    store = open_cold(cold_url)
    w = new_writer(tmp_path / "store")
    local = LocalStore(tmp_path / "store")
    kw = dict(upload_bytes=1, max_delay_ms=0, segment_bytes=1500)
    d = new_dispatcher(store, local, tmp_path / "state", clock, **kw)
    _round(d, w, clock)
    shutil.copytree(tmp_path / "state", tmp_path / "state-before")
    _round(d, w, clock)
    shutil.rmtree(tmp_path / "state")
    shutil.copytree(tmp_path / "state-before", tmp_path / "state")  # the cache as it was before the commits
    d2 = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, **kw)
    r = _round(d2, w, clock)
    assert r.messages == 20
    w.close()
    assert_exact(store, local, QUEUES)


def test_catalog_lists_the_archived_queues(tmp_path, clock):
    from tiered.archive.storage import FileStore

    store = FileStore(str(tmp_path / "cold"))
    with new_writer(tmp_path / "store") as w:
        for q in QUEUES:
            produce(w, *q, 7, clock=clock)
    d = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, upload_bytes=1,
                       max_delay_ms=0)
    d.run_round()
    cat = Catalog.from_bytes(store.get(f"{CLUSTER}/{BROKER}/{CATALOG}"))
    assert [(q.topic, q.queue_id, q.first_offset, q.next_offset) for q in cat.queues] == [
        ("Cache", 0, 0, 7), ("Cache", 1, 0, 7)]
    assert all(q.min_store_ms == clock.now_ms() for q in cat.queues)
    # a reader finds every queue with one GET
    rec = CountingRecorder()
    reader = ColdTier(FileStore(str(tmp_path / "cold"), recorder=rec), CLUSTER, BROKER)
    reader.rebuild()
    assert set(reader.manifests()) == set(QUEUES)
    assert rec.total_requests("list") == 0


def test_a_newer_major_format_is_refused_clearly(tmp_path, clock):
    from tiered.archive.storage import FileStore

    store = FileStore(str(tmp_path / "cold"))
    with new_writer(tmp_path / "store") as w:
        produce(w, *QUEUES[0], 5, clock=clock)
    d = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, upload_bytes=1,
                       max_delay_ms=0)
    d.run_round()
    key = f"{CLUSTER}/{BROKER}/Cache/0/manifest.json"
    doc = json.loads(store.get(key))
    doc["format_version"] = "5.0"
    store.put(key, json.dumps(doc).encode())
    with pytest.raises(FormatVersionError, match="format version 5.0.*upgrade tiered"):
        Manifest.from_bytes(store.get(key), key)
    cat_key = f"{CLUSTER}/{BROKER}/{CATALOG}"
    cat = json.loads(store.get(cat_key))
    cat["format_version"] = "5.1"
    store.put(cat_key, json.dumps(cat).encode())
    with pytest.raises(FormatVersionError, match="5.1"):
        Catalog.from_bytes(store.get(cat_key), cat_key)
    # the CLI says so in one line and fails
    env = {"TIERED_STATE_DIR": str(tmp_path / "state2"), "TIERED_CLUSTER": CLUSTER, "TIERED_BROKER": BROKER,
           "TIERED_LOG__LEVEL": "WARNING"}
    res = CliRunner().invoke(app, ["verify", "--store", str(tmp_path / "store"), "--cold",
                                   f"file://{tmp_path / 'cold'}"], env=env)
    assert res.exit_code == 1 and "format version 5.0" in res.stdout and "upgrade tiered" in res.stdout
    res = CliRunner().invoke(app, ["dispatch", "--store", str(tmp_path / "store"), "--cold",
                                   f"file://{tmp_path / 'cold'}", "--once"], env=env)
    assert res.exit_code == 1 and "upgrade tiered" in res.output


@pytest.mark.s3
@pytest.mark.moto_only  # SSE-KMS keys come from moto's KMS emulation
@pytest.mark.parametrize("sse", ["AES256", "aws:kms"])
def test_server_side_encryption_on_every_object(sse, moto_endpoint, s3_bucket, s3_client, tmp_path, clock):
    kms_key = None
    if sse == "aws:kms":
        import boto3

        kms_key = boto3.client("kms", endpoint_url=moto_endpoint).create_key()["KeyMetadata"]["KeyId"]
    opts = S3Options(endpoint_url=moto_endpoint, sse=sse, sse_kms_key_id=kms_key, addressing="path",
                     checksum_mode="when_required", region="us-east-1")
    store = open_store(f"s3://{s3_bucket}/enc", s3=opts)
    with new_writer(tmp_path / "store") as w:
        produce(w, *QUEUES[0], 5, clock=clock)
    d = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, upload_bytes=1,
                       max_delay_ms=0)
    assert d.run_round().ok
    objects = s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="enc/")["Contents"]
    kinds = {o["Key"].rsplit("/", 2)[-2] if "/segment/" in o["Key"] else o["Key"].rsplit("/", 1)[-1]
             for o in objects}
    assert {"segment", "manifest.json", "_lease.json", "_catalog.json"} <= kinds  # layout v2: one object a segment
    for o in objects:  # data (s3fs) and conditional writes (boto3) alike
        head = s3_client.head_object(Bucket=s3_bucket, Key=o["Key"])
        assert head["ServerSideEncryption"] == sse, o["Key"]
        if kms_key:
            assert kms_key in head["SSEKMSKeyId"]
    assert_exact(store, LocalStore(tmp_path / "store"), [QUEUES[0]])


@pytest.mark.s3
def test_standard_aws_settings_reach_both_clients(moto_endpoint, s3_bucket, monkeypatch, tmp_path, clock):
    """No endpoint in our options: AWS_ENDPOINT_URL_S3 and the AWS credential
    chain (environment here) are honoured by s3fs and boto3 alike."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    store = open_store(f"s3://{s3_bucket}/std")
    with new_writer(tmp_path / "store") as w:
        produce(w, *QUEUES[0], 5, clock=clock)
    d = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, upload_bytes=1,
                       max_delay_ms=0)
    assert d.run_round().ok
    assert read_manifest(store, *QUEUES[0]).next_offset == 5
    assert "secret" not in repr(S3Options(secret_access_key="secret", access_key_id="id"))


@pytest.mark.parametrize("addressing", ["path", "virtual"])
def test_addressing_style_and_checksum_mode_reach_the_clients(addressing):
    store = open_store("s3://some-bucket/p", s3=S3Options(endpoint_url="https://s3.example.com", region="eu-west-1",
                                                          addressing=addressing, checksum_mode="when_required"))
    config = store.client.meta.config
    assert config.s3["addressing_style"] == addressing
    assert config.request_checksum_calculation == "when_required"
    assert config.response_checksum_validation == "when_required"
    assert store.client.meta.region_name == "eu-west-1"
    fs_config = store.fs.config_kwargs
    assert fs_config["s3"]["addressing_style"] == addressing
    assert fs_config["request_checksum_calculation"] == "when_required"


def _ops(rec: CountingRecorder) -> dict[str, int]:
    return {op: rec.total_requests(op) for op in ("get", "list", "put", "put_if_absent", "put_if_match")}


def test_a_first_round_over_an_empty_bucket_asks_nothing_per_new_queue(cold_url, open_cold, tmp_path, clock):
    """The start lists the whole prefix (no cache, no catalog): a queue with
    nothing in that listing is known to be new, without a GET of its
    manifest and a LIST of its objects. Two requests per segment: the
    object and the manifest."""
    queues = [("Fresh", q) for q in range(3)]
    w = new_writer(tmp_path / "store")
    for q in queues:
        produce(w, *q, 5, clock=clock)
    rec = CountingRecorder()
    store = open_cold(cold_url, recorder=rec)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0, layout=2)
    d.start()
    assert rec.total_requests("list") == 1  # the prefix, once
    before = _ops(rec)
    r = d.run_round()
    assert r.ok and r.segments == 3, r.errors
    made = {op: n - before[op] for op, n in _ops(rec).items()}
    # identity and lease read once; 3 objects + the catalog; 3 first manifests
    assert made == {"get": 2, "list": 0, "put": 4, "put_if_absent": 3, "put_if_match": 0}
    w.close()
    assert_exact(store, local, queues)


def test_a_queue_in_the_start_listing_is_still_recovered_from_its_objects(cold_url, open_cold, tmp_path, clock):
    """A queue whose manifest is lost but whose segment is in the bucket is
    in the start's listing: it is looked up and rebuilt, never taken as new."""
    w = new_writer(tmp_path / "store")
    produce(w, "Lost", 0, 6, clock=clock)
    store = open_cold(cold_url)
    kw = dict(upload_bytes=1, max_delay_ms=0, layout=2)
    d = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, **kw)
    assert d.run_round().ok
    store.delete_many([f"{CLUSTER}/{BROKER}/Lost/0/manifest.json", f"{CLUSTER}/{BROKER}/{CATALOG}"])
    shutil.rmtree(tmp_path / "state")
    produce(w, "Lost", 0, 4, clock=clock)
    rec = CountingRecorder()
    d2 = new_dispatcher(open_cold(cold_url, recorder=rec), LocalStore(tmp_path / "store"), tmp_path / "state",
                        clock, recorder=rec, **kw)
    r = d2.run_round()
    assert r.ok and r.messages == 4, r.errors  # the 6 archived before are adopted, not archived again
    assert rec.total_requests("list") == 2  # the prefix at start, then the queue's objects to rebuild from
    w.close()
    assert_exact(store, LocalStore(tmp_path / "store"), [("Lost", 0)])


def test_a_new_queue_after_a_start_from_the_cache_is_looked_up(cold_url, open_cold, tmp_path, clock):
    """A start from the local cache lists nothing: a queue the cache does
    not know is looked up in the bucket before anything is written for it."""
    w = new_writer(tmp_path / "store")
    produce(w, "Old", 0, 3, clock=clock)
    store = open_cold(cold_url)
    kw = dict(upload_bytes=1, max_delay_ms=0, layout=2)
    assert new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, **kw).run_round().ok
    produce(w, "New", 0, 3, clock=clock)
    rec = CountingRecorder()
    d2 = new_dispatcher(open_cold(cold_url, recorder=rec), LocalStore(tmp_path / "store"), tmp_path / "state",
                        clock, recorder=rec, **kw)
    d2.start()
    assert rec.total_requests("list") == 0
    assert d2.run_round().ok
    assert rec.requests[("get", "not_found")] >= 1 and rec.total_requests("list") == 1  # New/0, looked up
    w.close()
    assert_exact(store, LocalStore(tmp_path / "store"), [("Old", 0), ("New", 0)])


def test_the_cache_holds_the_head_as_committed_and_no_stale_backup(tmp_path, clock):
    from tiered.archive.storage import FileStore

    store = FileStore(str(tmp_path / "cold"))
    w = new_writer(tmp_path / "store")
    produce(w, "Cache", 0, 4, clock=clock)
    kw = dict(upload_bytes=1, max_delay_ms=0, layout=2)
    assert new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, **kw).run_round().ok
    key = f"{CLUSTER}/{BROKER}/Cache/0/manifest.json"
    cached = tmp_path / "state" / "manifests" / CLUSTER / BROKER / "Cache.0.json"
    doc = json.loads(cached.read_bytes())
    assert doc["manifest"] == json.loads(store.get(key))  # the bytes the commit wrote, as committed
    assert doc["etag"] == store.get_with_etag(key)[1]
    assert not list(cached.parent.glob("Cache.0.json.*"))  # no backup, no temp file left
    # a backup an older version left behind is dropped at load: a torn cache
    # file is rebuilt from the bucket, never read from an older backup
    stale = cached.with_name("Cache.0.json.bak")
    stale.write_bytes(cached.read_bytes().replace(b'"next_offset":4', b'"next_offset":1'))
    cached.write_bytes(b"{torn")
    produce(w, "Cache", 0, 3, clock=clock)
    d2 = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, **kw)
    d2.start()
    assert not stale.exists()
    assert d2.cold.cached("Cache", 0).next_offset == 4
    r = d2.run_round()
    assert r.ok and r.messages == 3, r.errors
    w.close()
    assert_exact(store, LocalStore(tmp_path / "store"), [("Cache", 0)])
