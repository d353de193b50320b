"""The cold tier's storage: ``open_store`` opens the store of a URL.

The contract (``ObjectStore``, its retries, metrics and error translation)
is tiered/archive/objectstore.py; ``FileStore`` (``file://``, the embedded
default) tiered/archive/filestore.py; ``S3Store`` (``s3://``)
tiered/archive/s3store.py. Their public names are importable from here.
"""

from __future__ import annotations

from tiered.archive.filestore import FileStore
from tiered.archive.objectstore import DELETE_BATCH, ObjectInfo, ObjectStore, RetryPolicy
from tiered.archive.s3store import S3Options, S3Store
from tiered.recorder import Recorder

__all__ = ["DELETE_BATCH", "FileStore", "ObjectInfo", "ObjectStore", "RetryPolicy", "S3Options", "S3Store",
           "open_store"]


def open_store(
    url: str,
    *,
    s3: S3Options | None = None,
    retry: RetryPolicy | None = None,
    recorder: Recorder | None = None,
    direct: bool = True,
) -> ObjectStore:
    """The store for a cold-tier URL: ``file:///path``, a plain path, or
    ``s3://bucket/prefix``. ``direct``: a file store's O_DIRECT writes."""
    if "://" not in url:
        return FileStore(url, direct=direct, retry=retry, recorder=recorder)
    scheme, rest = url.split("://", 1)
    if scheme == "file":
        return FileStore(rest or "/", direct=direct, retry=retry, recorder=recorder)
    if scheme in ("s3", "s3a"):
        return S3Store(rest, s3, retry=retry, recorder=recorder)
    raise ValueError(f"unsupported cold-tier URL scheme {scheme!r}")
