"""Garbage answers from storage are transient errors (issue 12, item 11).

A proxy in front of the S3 server under test spoils chosen answers: a 200
whose body is garbage or cut short, a response without an ETag, a body that
fails its checksum. Each is translated once, in s3store.py, into the typed
retriable ``BadResponseError``: retried, counted, and never a traceback.
"""

from __future__ import annotations

import pytest
from dispatchkit import CountingRecorder, new_writer, produce
from faultproxy import FaultProxy, Request
from s3proxies import MangleProxy, SpoilProxy
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


# --- answers that are not S3's (issue 31, item 4) ------------------------------

STORE_CALLS = [
    # (HTTP method spoiled, store op counted, the store call, what it must return)
    ("GET", "get", lambda s: s.get("q/seg"), DATA),
    ("GET", "get", lambda s: s.get_with_etag("q/seg")[0], DATA),
    ("GET", "get", lambda s: s.get_range("q/seg", 100, 4100), DATA[100:4100]),
    ("HEAD", "head", lambda s: s.head("q/seg").size, len(DATA)),
    ("GET", "list", lambda s: [o.key for o in s.list_keys("q/")], ["q/seg"]),
    ("GET", "list", lambda s: s.list_dirs(""), ["q"]),
    ("PUT", "put", lambda s: (s.put("q/seg", DATA), s.get("q/seg"))[1], DATA),
]


@pytest.mark.parametrize("kind", ["html", "strip_etag"])
@pytest.mark.parametrize(("method", "op", "call", "expected"), STORE_CALLS,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(STORE_CALLS)])
def test_an_answer_that_is_not_s3s_is_retried_and_counted(moto_endpoint, s3_bucket, kind, method, op, call,
                                                           expected):
    """A 200 HTML page without ETag (the server never saw the request), or
    the server's answer without its ETag: a BadResponseError, retried and
    counted like a 500, never data. A list's answer has no ETag to lose."""
    _seed(moto_endpoint, s3_bucket)

    def first(req: Request, n: int) -> str | None:
        return kind if n == 0 and req.method == method and ("q/seg" in req.path or "list-type" in req.path) else None

    with SpoilProxy(moto_endpoint, html=0, strip_etag=0, force=first) as proxy:
        store = _store(proxy.url, s3_bucket, CountingRecorder())
        store.capabilities()  # the probe's own PUTs before counting
        rec = store.recorder = CountingRecorder()
        assert call(store) == expected
    if kind == "strip_etag" and op == "list":
        assert proxy.spoiled == [] and rec.retries[op] == 0  # nothing to strip: the answer is used
        return
    assert [(k, m) for k, m, _ in proxy.spoiled] == [(kind, method)]
    assert rec.retries[op] == 1
    assert rec.requests[(op, "error")] == 1 and rec.requests[(op, "ok")] == 1


def test_an_html_page_on_every_attempt_ends_in_the_typed_error(moto_endpoint, s3_bucket):
    _seed(moto_endpoint, s3_bucket)
    with SpoilProxy(moto_endpoint, html=1.0, strip_etag=0, max_in_a_row=99) as proxy:
        rec = CountingRecorder()
        with pytest.raises(BadResponseError) as err:
            _store(proxy.url, s3_bucket, rec, attempts=3).get("q/seg")
    assert err.value.retriable
    assert str(err.value) == ("get q/seg: bad response: an HTML page (text/html; charset=utf-8) where S3 answers "
                              "XML or the object's bytes")
    assert rec.retries["get"] == 2 and rec.requests[("get", "error")] == 3


def test_a_ranged_answer_of_other_bytes_is_a_bad_response(real_moto_endpoint):
    """A range answered with the whole object (a server or proxy dropping the
    Range header) is not the bytes asked for: retried, then exact. On moto
    whatever server the S3 tests run on: dropping a signed header is refused
    (SignatureDoesNotMatch) by a server that checks signatures."""
    import uuid

    import boto3

    moto_endpoint, s3_bucket = real_moto_endpoint, f"tiered-range-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=s3_bucket)
    _seed(moto_endpoint, s3_bucket)
    dropped: list[str] = []

    class DropRange(FaultProxy):
        def forward(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
            if not dropped and any(n.lower() == "range" for n, _ in req.headers):
                dropped.append(req.key)
                req = Request(req.method, req.path, [(n, v) for n, v in req.headers if n.lower() != "range"],
                              req.body)
            return super().forward(req)

    with DropRange(moto_endpoint) as proxy:
        rec = CountingRecorder()
        assert _store(proxy.url, s3_bucket, rec).get_range("q/seg", 100, 4100) == DATA[100:4100]
    assert dropped == ["arch/q/seg"]
    assert rec.retries["get"] == 1 and rec.requests[("get", "error")] == 1


def test_a_well_formed_answer_that_fails_its_own_check_is_corruption(moto_endpoint, s3_bucket, s3_client):
    """S3's own answer (with its ETag) holding something that is not an
    identity object: corrupt data, named with the object, not retried."""
    from tiered.archive.coldtier import ColdTier
    from tiered.errors import CorruptRecordError

    s3_client.put_object(Bucket=s3_bucket, Key="arch/DefaultCluster/vm/_identity.json",
                         Body=_PORTAL_PAGE, ContentType="text/plain")
    rec = CountingRecorder()
    with pytest.raises(CorruptRecordError) as err:
        ColdTier(_store(moto_endpoint, s3_bucket, rec), "DefaultCluster", "vm").check_identity()
    assert str(err.value) == 'DefaultCluster/vm/_identity.json @ 0: the bucket identity object is not {"id": ...}'
    assert rec.retries["get"] == 0


_PORTAL_PAGE = b"<html><body>Please sign in</body></html>"
_METADATA = ("/_identity.json", "/_lease.json", "/_catalog.json", "/manifest.json")


def _first_reads_spoiled(spoiled: list[tuple[str, str, str]]):  # noqa: ANN202
    """The first read of each identity, lease, catalog and manifest object
    answered with an HTML page, the next ones without their ETag until one
    had an ETag to strip (a read on a new archive may be a 404)."""
    def force(req: Request, n: int) -> str | None:
        if req.method != "GET" or "list-type" in req.path or not req.key.endswith(_METADATA):
            return None
        if n == 0:
            return "html"
        return None if ("strip_etag", "GET", req.key) in spoiled else "strip_etag"
    return force


@pytest.mark.moto_only  # the spoiled reads assume moto's answers (SeaweedFS's differ)
def test_dispatch_rounds_through_answers_that_are_not_s3s(moto_endpoint, s3_bucket, tmp_path):
    """A proxy answering ~15 % of the requests with an HTML page and ~10 %
    without their ETag (seeded: the same requests in every run), the first
    reads of every metadata object spoiled besides: four dispatch rounds
    (the last two by a sidecar with a new state directory, which reads the
    catalog) exit 0, the archive is exact, and verify through the proxy
    agrees."""
    from dispatchkit import assert_exact

    from tiered.store.localstore import LocalStore

    store_dir = tmp_path / "store"
    queues = [("Portal", 0), ("Portal", 1), ("Lobby", 0)]
    url = f"s3://{s3_bucket}/arch"
    runner = CliRunner()
    spoiled: list[tuple[str, str, str]] = []
    with SpoilProxy(moto_endpoint, seed=31, force=_first_reads_spoiled(spoiled)) as proxy, \
            new_writer(store_dir) as w:
        proxy.spoiled = spoiled
        env = {"TIERED_S3__ENDPOINT_URL": proxy.url,
               "TIERED_LOG__LEVEL": "ERROR", "TIERED_DISPATCH__RETRY__BASE_DELAY": "0.001",
               "TIERED_DISPATCH__RETRY__MAX_DELAY": "0.01", "TIERED_CLUSTER": "PortalCluster",
               "TIERED_BROKER": "portal-a"}
        for rnd in range(4):
            # from round 2 on, a sidecar with a new state directory (a new
            # pod): it loads the archive from the catalog and the manifests
            env["TIERED_STATE_DIR"] = str(tmp_path / f"state{rnd // 2}")
            for topic, qid in queues:
                produce(w, topic, qid, 40, seed=rnd)
            w.flush()
            res = runner.invoke(app, ["dispatch", "--store", str(store_dir), "--cold", url, "--once", "--all"],
                                env=env)
            assert res.exit_code == 0, f"round {rnd}: {res.output}"
            assert "Traceback" not in res.output
        res = runner.invoke(app, ["verify", "--store", str(store_dir), "--cold", url], env=env)
        assert res.exit_code == 0, res.output
    names = {(kind, method, key.rsplit("/", 1)[-1]) for kind, method, key in spoiled}
    for name in ("_identity.json", "_lease.json", "_catalog.json", "manifest.json"):
        assert {("html", "GET", name), ("strip_etag", "GET", name)} <= names, (name, sorted(names))
    # the seeded shares spoiled writes (applied or not) and listings too
    kinds = {(kind, method, "object" if key else "list") for kind, method, key in spoiled}
    assert {("html", "PUT", "object"), ("strip_etag", "PUT", "object"), ("html", "GET", "list")} <= kinds, kinds
    direct = open_store(url, s3=S3Options(endpoint_url=moto_endpoint), retry=FAST)
    counts = assert_exact(direct, LocalStore(store_dir), queues, cluster="PortalCluster", broker="portal-a")
    assert counts == {q: 160 for q in queues}
