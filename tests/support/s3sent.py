"""What an S3 store sends as its uploads' checksums, and what the storage
module (tiered/archive/s3store.py) computes a CRC-32 of: for the tests of precomputed CRCs
(``ObjectStore.put(crc=)``), at the storage interface and in a round."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import boto3
import pytest

import tiered.archive.s3store as s3store


def b64(crc: int) -> str:
    """A CRC-32 as the x-amz-checksum-crc32 header carries it."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


def sent_checksums(store: Any) -> list[tuple[str, str | None]]:
    """(URL path, x-amz-checksum-crc32) of every PutObject the store's
    client sends from now on, each request going on to the server as it is."""
    sent: list[tuple[str, str | None]] = []

    def record(request: Any, **_: Any) -> None:
        value = request.headers.get("x-amz-checksum-crc32")
        sent.append((request.url.split("?")[0], value.decode() if isinstance(value, bytes) else value))

    store.client.meta.events.register("before-send.s3.PutObject", record)
    return sent


def computed_crcs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of everything tiered/archive/s3store.py computes a CRC-32 of from now on."""
    lengths: list[int] = []
    real = s3store.crc32
    monkeypatch.setattr(s3store, "crc32", lambda data, *a: lengths.append(len(data)) or real(data, *a))
    return lengths


def new_bucket(endpoint: str) -> str:
    name = f"tiered-crc-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name
