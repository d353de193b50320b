"""Session-scoped real components: a moto S3 server on 127.0.0.1 (port 0),
a fresh bucket per test, stores written in the broker's format, and a real
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

# Plain helper modules (dispatchkit, faultproxy...) shared by every test folder.
_HELPERS = str(Path(__file__).resolve().parent / "helpers")
if _HELPERS not in sys.path:
    sys.path.insert(0, _HELPERS)

# Credentials for moto only; set before any boto client is built.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing-key-id")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing-secret-key")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_PROFILE", None)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A real S3 HTTP endpoint (moto) on 127.0.0.1, on a free port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    """A fresh, empty bucket (S3 naming rules: lower case, 3+ chars)."""
    import boto3

    name = f"tiered-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_client(moto_endpoint: str):  # noqa: ANN201 - a boto3 client
    import boto3

    return boto3.client("s3", endpoint_url=moto_endpoint)


@pytest.fixture
def s3_url(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/archive"


@pytest.fixture
def s3_options(moto_endpoint: str):  # noqa: ANN201
    from tiered.storage import S3Options

    return S3Options(endpoint_url=moto_endpoint)


@pytest.fixture(params=["file", "s3"])
def cold_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The cold tier, once on file:// and once on the moto server."""
    if request.param == "file":
        return f"file://{tmp_path / 'cold'}"
    return request.getfixturevalue("s3_url")


@pytest.fixture
def open_cold(moto_endpoint: str):  # noqa: ANN201
    """open_cold(url, **kw) -> ObjectStore for file:// or the moto s3:// URL, with fast retries."""
    from tiered.storage import RetryPolicy, S3Options, open_store

    def _open(url: str, **kw):  # noqa: ANN202
        kw.setdefault("retry", RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.01))
        return open_store(url, s3=S3Options(endpoint_url=moto_endpoint), **kw)

    return _open


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
