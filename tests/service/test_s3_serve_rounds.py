"""`tiered serve` for several rounds with lease renewals, then an exact verify:
on the S3 server under test (moto; SeaweedFS in CI's second pass), and
through the RGW-like proxy (If-Match compared byte for byte, bare ETag only,
Content-MD5 instead of CRC32), where every commit after the first failed
with 412 before the probe learned the bare form."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import boto3
import pytest
from s3proxies import RgwIfMatchProxy

from tiered.archive.coldtier import ColdTier
from tiered.store.localstore import LocalStore
from tiered.archive.storage import S3Options, open_store
from tiered.ops.verify import verify
# a test module beside this one (pytest puts this folder on the path)
from test_service_serve import BROKER, CLUSTER, free_port, metrics_text, samples, serve, serve_env, wait_for  # noqa: F401

BATCHES, PER_BATCH = 4, 50


def _lease(client, bucket: str) -> dict:  # noqa: ANN001
    body = client.get_object(Bucket=bucket, Key=f"archive/{CLUSTER}/{BROKER}/_lease.json")["Body"].read()
    return json.loads(body)


@pytest.mark.parametrize("via", ["server", "rgw"])
def test_serve_rounds_with_lease_renewals_verify_exactly(via, tmp_path, store_writer, serve,  # noqa: ANN001, F811
                                                         request):  # noqa: ANN001
    endpoint = request.getfixturevalue("moto_endpoint" if via == "server" else "real_moto_endpoint")
    bucket = request.getfixturevalue("s3_bucket") if via == "server" else _bucket(endpoint)
    proxy = RgwIfMatchProxy(endpoint).start() if via == "rgw" else None
    try:
        _run(tmp_path, store_writer, serve, proxy.url if proxy else endpoint, endpoint, bucket)
    finally:
        if proxy is not None:
            proxy.stop()
    if proxy is not None:
        # the probe's two quoted tries (a stale tag, the current tag); never one after it
        assert proxy.refused_quoted == 2 and set(proxy.refused_keys) == {proxy.refused_keys[0]}
        assert "/_probe-" in proxy.refused_keys[0]


def _bucket(endpoint: str) -> str:
    import uuid

    name = f"tiered-serve-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


def _run(tmp_path: Path, store_writer, serve, url: str, direct: str, bucket: str) -> None:  # noqa: ANN001, F811
    port = free_port()
    client = boto3.client("s3", endpoint_url=direct)
    env = serve_env(tmp_path, TIERED_S3__ENDPOINT_URL=url, TIERED_LEASE_TTL="10", TIERED_DISPATCH__INTERVAL="0.5",
                    TIERED_LOG__LEVEL="WARNING")
    with store_writer() as w:
        store = w.root
        w.put("Rounds", 0, b"first", keys=["k0"])
        proc = serve(["--store", str(store), "--cold", f"s3://{bucket}/archive", "--metrics-port", str(port)], env)

        def archived(n: int):  # noqa: ANN202
            def check() -> bool:
                text = metrics_text(proc, port)
                return text is not None and samples(text, "tiered_archived_messages_total").get(
                    'tiered_archived_messages_total{topic="Rounds"}') == n
            return check

        wait_for(archived(1))
        first = _lease(client, bucket)
        expiries = {first["expires_ms"]}
        produced = 1
        # rounds of new messages until the lease was renewed twice (TTL 10 s:
        # renewed before a write once less than half of it is left)
        rounds = 0
        while len(expiries) < 3:
            rounds += 1
            assert rounds <= 200, f"no second renewal in {rounds} rounds: {sorted(expiries)}"
            for i in range(PER_BATCH):
                w.put("Rounds", i % 2, bytes([produced % 251]) * 300, keys=[f"k{produced}"])
                produced += 1
            wait_for(archived(produced))
            lease = _lease(client, bucket)
            assert (lease["owner"], lease["epoch"]) == (first["owner"], first["epoch"])  # renewed, not retaken
            expiries.add(lease["expires_ms"])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, Path(proc.err_path).read_text()
    assert "412" not in Path(proc.err_path).read_text()
    cold = ColdTier(open_store(f"s3://{bucket}/archive", s3=S3Options(endpoint_url=direct)), CLUSTER, BROKER)
    report = verify(cold, LocalStore(store))
    assert report.ok, report.problems
    assert report.records == produced
    cold.rebuild(use_catalog=False)
    manifests = cold.manifests()
    assert sum(m.messages for m in manifests.values()) == produced
    assert sum(len(m.segments) for m in manifests.values()) >= 3  # several rounds, each a commit
