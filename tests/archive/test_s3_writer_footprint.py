"""A writer's S3 requests go through boto3 alone: reads of whole objects
(identity, catalog, manifests, chunks), writes, conditional writes, lists and
deletes never start s3fs (its event loop thread and aiohttp stack, ~12 MiB
of a dispatcher's resident memory, measured), not even to translate a 404.
Checked in a fresh interpreter: this one has s3fs loaded by other tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.s3

SCRIPT = r"""
import json, sys
from tiered.archive.storage import S3Options, open_store
from tiered.errors import ObjectNotFoundError, PreconditionFailedError
store = open_store(sys.argv[2], s3=S3Options(endpoint_url=sys.argv[1]))
store.put("q/seg", b"x" * 1000)
etag = store.put_if_absent("q/manifest.json", b"v1")
try:
    store.put_if_absent("q/manifest.json", b"v1")
    raise SystemExit("a second create-only write succeeded")
except PreconditionFailedError:
    pass
store.put_if_match("q/manifest.json", b"v2", etag)
got = [store.get("q/seg") == b"x" * 1000, store.get("q/manifest.json") == b"v2"]
try:
    store.get("q/missing")
except ObjectNotFoundError:
    got.append(True)
got.append([o.key for o in store.list_keys("q/")] == ["q/manifest.json", "q/seg"])
store.delete_many(["q/seg"])
got.append(store.head("q/seg") is None)
print(json.dumps({"ok": got, "s3fs": "s3fs" in sys.modules, "aiohttp": "aiohttp" in sys.modules}))
"""


def test_a_writer_never_loads_s3fs(moto_endpoint: str, s3_url: str) -> None:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "test"),
           "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
           "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, moto_endpoint, s3_url], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc == {"ok": [True] * 5, "s3fs": False, "aiohttp": False}
