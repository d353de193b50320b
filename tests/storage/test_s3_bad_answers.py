"""Garbage answers from storage are transient errors (issue 12, item 11).

A proxy in front of the S3 server under test spoils chosen answers: a 200
whose body is garbage or cut short, a response without an ETag, a body that
fails its checksum. Each is translated once, in storage.py, into the typed
retriable ``BadResponseError``: retried, counted, and never a traceback.
"""

from __future__ import annotations

import pytest
from dispatchkit import CountingRecorder, new_writer, produce
from faultproxy import Request
from s3proxies import MangleProxy
from typer.testing import CliRunner

from tiered.cli import app
from tiered.errors import BadResponseError
from tiered.archive.storage import ObjectStore, RetryPolicy, S3Options, open_store

FAST = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.01)
DATA = bytes(range(256)) * 64  # 16 KiB


def _once(kind: str, method: str, match: str):  # noqa: ANN202
    """Spoil the first answer to ``method`` on a key containing ``match``."""
    done: list[bool] = []

    def mangle(req: Request) -> str | None:
        if not done and req.method == method and match in req.path:
            done.append(True)
            return kind
        return None
    return mangle


def _store(endpoint: str, bucket: str, rec: CountingRecorder, attempts: int = 4) -> ObjectStore:
    return open_store(f"s3://{bucket}/arch", s3=S3Options(endpoint_url=endpoint), recorder=rec,
                      retry=RetryPolicy(attempts=attempts, base_delay=0.001, max_delay=0.01))


def _seed(endpoint: str, bucket: str) -> str:
    return open_store(f"s3://{bucket}/arch", s3=S3Options(endpoint_url=endpoint), retry=FAST).put_if_absent(
        "q/seg", DATA)


CASES = [
    # (kind, HTTP method spoiled, the store call, what it must return)
    ("truncated", "GET", lambda s: s.get("q/seg"), DATA),
    ("truncated", "GET", lambda s: s.get_with_etag("q/seg")[0], DATA),
    ("truncated", "GET", lambda s: s.get_range("q/seg", 100, 4100), DATA[100:4100]),
    ("bad_checksum", "GET", lambda s: s.get_with_etag("q/seg")[0], DATA),
    ("no_etag", "GET", lambda s: s.get_with_etag("q/seg")[0], DATA),
    ("no_etag", "HEAD", lambda s: s.head("q/seg").size, len(DATA)),
    ("garbage", "GET", lambda s: [o.key for o in s.list_keys("q/")], ["q/seg"]),
]


@pytest.mark.parametrize(("kind", "method", "call", "expected"), CASES,
                         ids=[f"{k}-{i}" for i, (k, *_rest) in enumerate(CASES)])
def test_a_spoiled_answer_is_retried_and_counted(moto_endpoint, s3_bucket, kind, method, call, expected):
    etag = _seed(moto_endpoint, s3_bucket)
    match = "list-type" if kind == "garbage" else "q/seg"
    with MangleProxy(moto_endpoint, _once(kind, method, match)) as proxy:
        rec = CountingRecorder()
        store = _store(proxy.url, s3_bucket, rec)
        assert call(store) == expected
        assert proxy.mangled[kind] == 1
        op = "list" if kind == "garbage" else ("head" if method == "HEAD" else "get")
        assert rec.retries[op] == 1
        assert rec.requests[(op, "error")] == 1 and rec.requests[(op, "ok")] == 1
        assert store.get_with_etag("q/seg") == (DATA, etag)


def test_a_write_answered_without_etag_is_retried_then_typed(moto_endpoint, s3_bucket):
    """The write landed, its answer had no ETag: the retry finds the object
    written (412 for If-None-Match) and says so with the typed error a
    conditional write's caller already handles (read back and compare)."""
    from tiered.errors import PreconditionFailedError

    _seed(moto_endpoint, s3_bucket)  # the probe ran on this bucket already
    with MangleProxy(moto_endpoint, _once("no_etag", "PUT", "q/new")) as proxy:
        rec = CountingRecorder()
        store = _store(proxy.url, s3_bucket, rec)
        with pytest.raises(PreconditionFailedError):
            store.put_if_absent("q/new", b"payload")
        assert store.get("q/new") == b"payload"
    assert rec.retries["put_if_absent"] == 1 and rec.requests[("put_if_absent", "error")] == 1


def test_every_attempt_spoiled_ends_in_the_typed_error(moto_endpoint, s3_bucket):
    _seed(moto_endpoint, s3_bucket)
    with MangleProxy(moto_endpoint, lambda r: "truncated" if r.method == "GET" else None) as proxy:
        rec = CountingRecorder()
        with pytest.raises(BadResponseError) as err:
            _store(proxy.url, s3_bucket, rec, attempts=3).get_with_etag("q/seg")
    assert err.value.retriable and str(err.value) == "get q/seg: bad response: truncated body"
    assert rec.retries["get"] == 2 and rec.requests[("get", "error")] == 3


@pytest.mark.moto_only  # the spoiled-answer counts assume moto's request pattern (SeaweedFS differs)
def test_dispatch_and_verify_through_spoiled_answers(moto_endpoint, s3_bucket, tmp_path):
    """Every fifth answer spoiled, of every kind: the CLI archives exactly,
    exits 0, and prints no traceback."""
    with new_writer(tmp_path / "store") as w:
        for q in range(3):
            produce(w, "Spoiled", q, 60)
    kinds = ["no_etag", "garbage", "truncated", "bad_checksum"]
    seen = {"n": 0, "spoiled": 0}

    def mangle(req: Request) -> str | None:
        seen["n"] += 1
        if seen["n"] % 5:
            return None
        # the kinds this answer can take, in turn (a first round makes few
        # GETs and LISTs: a kind drawn regardless of the request would
        # seldom meet one)
        fits = [k for k in kinds
                # only parsed bodies can be garbage; an object's bytes are checked by CRC
                if (k != "garbage" or "list-type" in req.path)
                and (k not in ("truncated", "bad_checksum") or req.method == "GET")]
        seen["spoiled"] += 1
        return fits[seen["spoiled"] % len(fits)]

    with MangleProxy(moto_endpoint, mangle) as proxy:
        env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_S3__ENDPOINT_URL": proxy.url,
               "TIERED_LOG__LEVEL": "ERROR", "TIERED_DISPATCH__RETRY__BASE_DELAY": "0.001",
               "TIERED_DISPATCH__RETRY__MAX_DELAY": "0.01"}
        url = f"s3://{s3_bucket}/arch"
        runner = CliRunner()
        res = runner.invoke(app, ["dispatch", "--store", str(tmp_path / "store"), "--cold", url, "--once", "--all"],
                            env=env)
        assert res.exit_code == 0, res.output
        assert "Traceback" not in res.output
        res = runner.invoke(app, ["verify", "--store", str(tmp_path / "store"), "--cold", url], env=env)
        assert res.exit_code == 0, res.output
        assert "Traceback" not in res.output
    assert sum(proxy.mangled.values()) >= 4, proxy.mangled
