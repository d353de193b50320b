"""The cold tier's storage contract, over fsspec.

Every object-store call goes through ``ObjectStore._call``: one place that
times it, reports it to the recorder (op, outcome), translates errors into
``StorageError`` (``retriable`` set from the cause) and retries retriable
ones with capped, jittered backoff. Client libraries' own retry loops are
turned off so every retry is seen and counted here.

``FileStore`` serves ``file://`` (the embedded default); ``S3Store`` serves
``s3://`` through s3fs, with boto3 for what fsspec cannot do: conditional
writes (``IfNoneMatch``/``IfMatch``), batched deletes, and single PUTs of a
buffer without copying it (s3fs copies a body several times while sending).
Before its first write to a bucket, ``S3Store`` runs the capability probe of
``tiered.archive.s3probe`` (the If-Match form the server takes, the upload checksum
it verifies; a store ignoring conditional writes is refused). An answer that
cannot be used (no ETag, garbage or truncated body, a checksum mismatch) is a
``BadResponseError``: retried and counted like a 500.

Keys are relative to the store's root URL and use ``/``.
"""

from __future__ import annotations

import base64
import builtins  # ObjectStore.list shadows the builtin inside the class
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from zlib_ng.zlib_ng import crc32

from tiered.archive.dirsync import Directories
from tiered.archive.filewrite import FileWriter
from tiered.errors import (
    BadResponseError,
    ConfigError,
    CredentialsMissingError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)
from tiered.recorder import NullRecorder, Recorder

if TYPE_CHECKING:
    from tiered.archive.s3probe import Capabilities

log = logging.getLogger(__name__)

T = TypeVar("T")
DELETE_BATCH = 1000
_SINGLE_PUT_LIMIT = 5 << 30  # S3's largest single PUT
_POOL = 64  # connections kept per client: dispatch.parallelism's upper bound


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 20.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**attempt)]."""
        return rng.uniform(0, min(self.max_delay, self.base_delay * (2 ** attempt)))


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime_ms: int
    etag: str | None = None


@dataclass(frozen=True)
class S3Options:
    """Everything needed to rebuild an S3 client anywhere (Spark executors
    included). Secrets are held here and never rendered: ``repr`` hides them."""

    endpoint_url: str | None = None
    region: str | None = None
    addressing: str = "auto"
    sse: str = "none"
    sse_kms_key_id: str | None = None
    checksum_mode: str = "when_supported"
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    profile: str | None = None  # a named AWS profile; None: AWS_PROFILE or the default chain
    extra: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    def put_kwargs(self) -> dict[str, str]:
        if self.sse == "AES256":
            return {"ServerSideEncryption": "AES256"}
        if self.sse == "aws:kms":
            out = {"ServerSideEncryption": "aws:kms"}
            if self.sse_kms_key_id:
                out["SSEKMSKeyId"] = self.sse_kms_key_id
            return out
        return {}


class ObjectStore:
    """A small object-store contract: get, ranged get, put, conditional put,
    head, list, batched delete. Subclasses implement the ``_raw_*`` methods;
    this class adds timing, metrics, error translation and retries."""

    scheme = "file"

    def __init__(self, root: str, *, retry: RetryPolicy | None = None, recorder: Recorder | None = None) -> None:
        self.root = root.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.recorder: Recorder = recorder or NullRecorder()
        self._rng = random.Random()
        self._sleep: Callable[[float], None] = time.sleep

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.root}"

    # --- the one wrapper -----------------------------------------------------

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        attempt = 0
        while True:
            started = time.perf_counter()
            try:
                result = fn()
            except Exception as exc:  # translated right here, once
                err = self._translate(op, key, exc)
                self.recorder.store_request(op, err.outcome, time.perf_counter() - started)
                if not err.retriable or attempt + 1 >= self.retry.attempts:
                    if err is exc:
                        raise
                    raise err from exc
                self.recorder.store_retry(op)
                delay = self.retry.delay(attempt, self._rng)
                log.warning("retrying %s %s in %.2fs after: %s", op, key, delay, err)
                self._sleep(delay)
                attempt += 1
                continue
            self.recorder.store_request(op, "ok", time.perf_counter() - started)
            return result

    def _translate(self, op: str, key: str, exc: Exception) -> StorageError:
        if isinstance(exc, StorageError):
            return exc
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFoundError(op, key)
        if isinstance(exc, FileExistsError):
            return PreconditionFailedError(op, key, "object exists")
        if isinstance(exc, PermissionError):
            return StorageError(op, key, "access denied", retriable=False)
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return StorageError(op, key, "timeout", retriable=True, outcome="timeout")
        if isinstance(exc, (ConnectionError, OSError)):
            code = getattr(exc, "errno", None)
            if code in (errno.ENOSPC, errno.EROFS, errno.EACCES):
                return StorageError(op, key, os.strerror(code), retriable=False)
            if code == errno.EBUSY:
                return StorageError(op, key, "throttled", retriable=True, outcome="throttled")
            return StorageError(op, key, type(exc).__name__, retriable=True)
        name = type(exc).__name__
        # botocore / aiohttp transport errors: connection resets, read timeouts
        if any(s in name for s in ("Timeout", "Connection", "Endpoint", "ClientError", "IncompleteRead",
                                   "ResponseParser", "HTTPClient", "Payload", "ProtocolError")):
            if "Timeout" in name:
                return StorageError(op, key, "timeout", retriable=True, outcome="timeout")
            return StorageError(op, key, name, retriable=True)
        raise exc

    # --- the contract --------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self._call("get", key, lambda: self._raw_get(key, None, None))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object."""
        return self._call("get", key, lambda: self._raw_get(key, start, end))

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return self._call("get", key, lambda: self._raw_get_etag(key))

    def put(self, key: str, data: bytes, *, crc: int | None = None) -> None:
        """Write ``key`` (whole, or not at all). No ETag: only the conditional
        writes need one, and a file store would have to hash the data for it.
        ``crc``: the data's CRC-32 when the caller has it already (a segment's,
        kept as its records were copied in): a store whose server checks the
        upload against a CRC-32 sends this one instead of reading the data
        again for it, and a server that checks refuses the upload when it is
        wrong (the data changed since it was computed); a file store has no
        use for it."""
        self._before_write()
        if crc is None:
            self._call("put", key, lambda: self._raw_put(key, data))
        else:
            self._call("put", key, lambda: self._raw_put(key, data, crc))

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Create ``key``; PreconditionFailedError when it exists."""
        self._before_write()
        return self._call("put_if_absent", key, lambda: self._raw_put_if(key, data, None))

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace ``key`` only if its current ETag is ``etag``."""
        self._before_write()
        return self._call("put_if_match", key, lambda: self._raw_put_if(key, data, etag))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            return self._call("head", key, lambda: self._raw_head(key))
        except ObjectNotFoundError:
            return None

    def list_keys(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under ``prefix`` (recursive), fresh (no listing cache)."""
        return self._call("list", prefix, lambda: self._raw_list(prefix))

    def list_dirs(self, prefix: str = "") -> list[str]:
        """Sorted names of the "directories" right under ``prefix`` (one
        delimiter listing where the store has one, never a recursive one)."""
        prefix = prefix.strip("/")
        return self._call("list", prefix or "/", lambda: self._raw_list_dirs(prefix))

    def _raw_list_dirs(self, prefix: str) -> list[str]:
        # any store: derived from a full listing (slow, but correct)
        plen = len(prefix) + 1 if prefix else 0
        return sorted({o.key[plen:].split("/", 1)[0] for o in self._raw_list(prefix + "/" if prefix else "")
                       if "/" in o.key[plen:]})

    def delete_many(self, keys: Iterable[str]) -> int:
        """Delete keys in batches of up to 1000; missing keys count as deleted.
        Returns the number of requests made."""
        keys = list(dict.fromkeys(keys))
        requests = 0
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i:i + DELETE_BATCH]
            self._call("delete", batch[0], lambda: self._raw_delete(batch))  # noqa: B023 - called at once
            requests += 1
        return requests

    def leftovers(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """Debris of writes that never finished (a crash mid-write) under
        ``prefix``, for the orphan pass to remove after its grace period;
        ``delete_many`` takes their keys. None on a store without any."""
        return []

    # --- implementation hooks --------------------------------------------------

    def _before_write(self) -> None:
        """Run before every write, outside the retry loop: the S3 store's
        capability probe. Nothing to check on a local directory."""

    def _raw_get(self, key: str, start: int | None, end: int | None) -> bytes:
        raise NotImplementedError

    def _raw_get_etag(self, key: str) -> tuple[bytes, str]:
        raise NotImplementedError

    def _raw_put(self, key: str, data: bytes, crc: int | None = None) -> None:
        raise NotImplementedError

    def _raw_put_if(self, key: str, data: bytes, etag: str | None) -> str:
        raise NotImplementedError

    def _raw_head(self, key: str) -> ObjectInfo:
        raise NotImplementedError

    def _raw_list(self, prefix: str) -> builtins.list[ObjectInfo]:
        raise NotImplementedError

    def _raw_delete(self, keys: builtins.list[str]) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_rng", None)
        state.pop("_sleep", None)
        state["recorder"] = NullRecorder()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._rng = random.Random()
        self._sleep = time.sleep


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class FileStore(ObjectStore):
    """``file://`` objects: written to a temp name, fsynced, renamed into place
    and the directory fsynced, so a reader never sees half an object, a crash
    leaves none, and an object a manifest names survives a power loss.

    A segment object's bytes are written around the page cache
    (tiered/archive/filewrite.py); ``direct=False``, or a file system
    refusing O_DIRECT, writes everything through the cache."""

    scheme = "file"

    def __init__(self, root: str, *, direct: bool = True, **kw: Any) -> None:
        super().__init__(os.path.abspath(root), **kw)
        self._writer = FileWriter(self.root, direct=direct)
        self._tls = threading.local()
        # directory fsyncs shared by the writer threads, and the directories
        # known to exist (tiered/archive/dirsync.py)
        self._dirs = Directories(Path(self.root))

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad object key {key!r}")
        return Path(self.root) / key

    def _raw_get(self, key: str, start: int | None, end: int | None) -> bytes:
        with open(self._path(key), "rb") as fh:
            if start is None:
                return fh.read()
            fh.seek(start)
            return fh.read(max(0, (end or 0) - start))

    def _raw_get_etag(self, key: str) -> tuple[bytes, str]:
        data = self._path(key).read_bytes()
        return data, _md5(data)

    @staticmethod
    def _tmp_name(path: Path) -> Path:
        return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")

    def _write_tmp(self, path: Path, data: bytes) -> Path:
        tmp = self._tmp_name(path)
        # a directory this process has not made durable yet (another
        # process made it, maybe dying before syncing it) is walked once
        made: list[Path] = [] if self._dirs.known(path.parent) else self._dirs.prepare(path.parent)
        try:
            try:
                self._writer.write(tmp, data)
            except FileNotFoundError:
                # the directory is created on the first write into it only: a
                # mkdir per object costs as much as the write itself (measured
                # at 1,000 queues: 5,000 mkdir calls for 2,000 objects)
                made = self._dirs.prepare(path.parent)
                self._writer.write(tmp, data)
        except BaseException:
            # the temp file of a failed write (half written, maybe) goes at
            # once; one a crash leaves is the orphan pass's (``leftovers``)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        finally:
            # The new directories are made durable after the file, still before
            # its rename names it: the file's fsync has usually committed their
            # entries on a journaling file system already, so these are cheap.
            # Also when the write failed: a later write into them opens them
            # without making them again, and would never sync them.
            self._dirs.settle(made)
        return tmp

    @property
    def direct(self) -> bool:
        """Whether big page-aligned objects are written with O_DIRECT (no more
        once the file system refused it)."""
        return self._writer.direct

    def _raw_put(self, key: str, data: bytes, crc: int | None = None) -> None:
        path = self._path(key)
        os.replace(self._write_tmp(path, data), path)
        # the object is durable once its name is: a manifest committed after
        # this call may name it, so the rename must survive a power loss
        self._dirs.sync(path.parent)

    def _raw_put_if(self, key: str, data: bytes, etag: str | None) -> str:
        path = self._path(key)
        tmp = self._write_tmp(path, data)
        try:
            if etag is None:
                os.link(tmp, path)  # atomic create-if-absent: FileExistsError if present
                self._dirs.sync(path.parent)
                return _md5(data)
            while True:
                fd = os.open(path, os.O_RDONLY)  # FileNotFoundError: no such object
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    held = os.fstat(fd)
                    # the file may have been replaced while we waited for the lock
                    if held.st_ino != os.stat(path).st_ino:
                        continue
                    current = _md5(os.pread(fd, held.st_size, 0))
                    if current != etag:
                        raise PreconditionFailedError("put_if_match", key)
                    os.replace(tmp, path)
                    self._dirs.sync(path.parent)
                    return _md5(data)
                finally:
                    os.close(fd)
        finally:
            # linked (its name stays), refused, or already renamed into place
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _raw_head(self, key: str) -> ObjectInfo:
        st = self._path(key).stat()
        return ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000)

    def _raw_list(self, prefix: str) -> list[ObjectInfo]:
        base = Path(self.root)
        top = base / prefix if prefix else base
        if prefix.endswith("/") and not top.is_dir():
            # keys under "x/" are files under directory x: none without it (a
            # queue archived for the first time must not walk its 999 siblings)
            return []
        start = top if top.is_dir() else top.parent
        out: list[ObjectInfo] = []
        for dirpath, dirs, files in os.walk(start):
            # only directories that can hold keys with the prefix: listing one
            # queue must not walk its 999 siblings
            rel = os.path.relpath(dirpath, base)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            dirs[:] = [d for d in dirs if (rel + d + "/").startswith(prefix) or prefix.startswith(rel + d + "/")
                       or (rel + d).startswith(prefix)]
            for name in files:
                if name.startswith("."):
                    continue  # temp files of writes in flight
                full = Path(dirpath) / name
                key = full.relative_to(base).as_posix()
                if not key.startswith(prefix):
                    continue
                try:
                    st = full.stat()
                except FileNotFoundError:
                    continue
                out.append(ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000))
        out.sort(key=lambda o: o.key)
        return out

    def leftovers(self, prefix: str = "") -> list[ObjectInfo]:
        """Temporary files of writes a crash interrupted (``_write_tmp``): a
        walk of the local directory tree, not a request, so it is not counted."""
        base = Path(self.root)
        top = base / prefix if prefix else base
        out: list[ObjectInfo] = []
        for dirpath, _dirs, files in os.walk(top if top.is_dir() else top.parent):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    full = Path(dirpath) / name
                    try:
                        st = full.stat()
                    except FileNotFoundError:
                        continue
                    out.append(ObjectInfo(full.relative_to(base).as_posix(), st.st_size,
                                          st.st_mtime_ns // 1_000_000))
        return out

    def _raw_list_dirs(self, prefix: str) -> list[str]:
        base = Path(self.root) / prefix if prefix else Path(self.root)
        try:
            return sorted(e.name for e in os.scandir(base) if e.is_dir() and not e.name.startswith("."))
        except FileNotFoundError:
            return []

    def _raw_delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink()
            except FileNotFoundError:
                pass

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._tls = threading.local()
        self._dirs = Directories(Path(self.root))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_tls", None)
        state.pop("_dirs", None)
        return state


class S3Store(ObjectStore):
    """``s3://bucket/prefix`` through s3fs; boto3 for conditional writes and
    batched deletes. Clients are built lazily per process, so the store
    pickles to Spark executors and survives fork."""

    scheme = "s3"

    def __init__(self, root: str, options: S3Options | None = None, **kw: Any) -> None:
        super().__init__(root, **kw)
        self.options = options or S3Options()
        bucket, _, prefix = self.root.partition("/")
        if len(bucket) < 3:
            raise ValueError("an S3 URL needs a bucket name of 3+ characters")
        if (self.options.access_key_id is None) != (self.options.secret_access_key is None):
            # botocore would sign with half a key pair and fail far from here
            raise ConfigError("s3.access_key_id and s3.secret_access_key: set both or neither (neither: the AWS "
                              "credential chain: environment, profile, web identity, instance metadata)")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._fs: Any = None
        self._client: Any = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _botocore_config(self) -> dict[str, Any]:
        o = self.options
        cfg: dict[str, Any] = {
            "connect_timeout": o.connect_timeout,
            "read_timeout": o.read_timeout,
            "retries": {"total_max_attempts": 1, "mode": "standard"},  # no retry in botocore: retries are ours
            # one pooled connection per upload thread (dispatch.parallelism is
            # at most 64): past botocore's default of 10, every extra request
            # opened a new connection (a TLS handshake) and dropped it after
            "max_pool_connections": _POOL,
            "request_checksum_calculation": o.checksum_mode,
            "response_checksum_validation": o.checksum_mode,
        }
        if o.addressing != "auto":
            cfg["s3"] = {"addressing_style": o.addressing}
        return cfg

    @property
    def fs(self) -> Any:
        self._check_pid()
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    import s3fs

                    o = self.options
                    client_kwargs: dict[str, Any] = {}
                    if o.region:
                        client_kwargs["region_name"] = o.region
                    if o.endpoint_url:
                        client_kwargs["endpoint_url"] = o.endpoint_url
                    self._fs = s3fs.S3FileSystem(
                        key=o.access_key_id, secret=o.secret_access_key, token=o.session_token, profile=o.profile,
                        client_kwargs=client_kwargs, config_kwargs=self._botocore_config(),
                        s3_additional_kwargs=o.put_kwargs(), use_listings_cache=False,
                        skip_instance_cache=True, **dict(o.extra),
                    )
                    self._fs.retries = 1  # class attribute in s3fs; every retry is ours
        return self._fs

    @property
    def client(self) -> Any:
        self._check_pid()
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import boto3
                    from botocore.config import Config

                    o = self.options
                    session = boto3.session.Session(
                        aws_access_key_id=o.access_key_id, aws_secret_access_key=o.secret_access_key,
                        aws_session_token=o.session_token, region_name=o.region, profile_name=o.profile,
                    )
                    client = session.client(
                        "s3", endpoint_url=o.endpoint_url, config=Config(**self._botocore_config()),
                    )
                    client.meta.events.register("before-sign.s3.PutObject", _checksum_is_ours)
                    self._client = client
        return self._client

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # forked: clients and their loops do not survive
            self._fs = None
            self._client = None
            self._pid = os.getpid()
            self._lock = threading.Lock()

    def _before_write(self) -> None:
        self.capabilities()

    def capabilities(self) -> Capabilities:
        """What this bucket honours (If-Match form, upload checksum); probed on
        the first write in this process, ConditionalWritesUnsupportedError
        when conditional writes are not honoured."""
        from tiered.archive.s3probe import capabilities

        return capabilities(self)

    def _translate(self, op: str, key: str, exc: Exception) -> StorageError:
        bad = _bad_response(op, key, exc)
        if bad is not None:
            return bad
        if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            from tiered.archive.s3probe import endpoint_name

            return CredentialsMissingError(op, key, endpoint_name(self))
        if type(exc).__name__ == "ProfileNotFound":
            return StorageError(op, key, f"AWS profile {self.options.profile or os.environ.get('AWS_PROFILE')!r} "
                                "is in neither ~/.aws/config nor ~/.aws/credentials", retriable=False)
        response = getattr(exc, "response", None)
        if isinstance(response, dict) and "Error" in response:
            code = str(response["Error"].get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFoundError(op, key)
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict") or status in (409, 412):
                return PreconditionFailedError(op, key)
            if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "503") or status == 503:
                return StorageError(op, key, "throttled", retriable=True, outcome="throttled")
            if status >= 500 or code in ("InternalError", "RequestTimeout", "500"):
                return StorageError(op, key, f"server error {code}", retriable=True)
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
                return StorageError(op, key, f"access denied ({code})", retriable=False)
            return StorageError(op, key, f"S3 error {code}", retriable=False)
        transport = _transport_error(exc)
        if transport is not None:
            return StorageError(op, key, transport[0], retriable=True, outcome=transport[1])
        return super()._translate(op, key, exc)

    def _path(self, key: str) -> str:
        return f"{self.bucket}/{self._full(key)}"

    def _raw_get(self, key: str, start: int | None, end: int | None) -> bytes:
        if start is None:
            # boto3, as the writes: a writer's reads (identity, catalog,
            # manifests, chunks) never start s3fs's event loop thread and its
            # aiohttp stack (~12 MiB per process, measured), and it is one GET
            # (s3fs may HEAD for the size first, a request the recorder never sees)
            resp = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
            return bytes(resp["Body"].read())
        return self.fs.cat_file(self._path(key), start=start, end=end)

    def _raw_get_etag(self, key: str) -> tuple[bytes, str]:
        resp = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
        return resp["Body"].read(), _etag("get", key, resp)

    def _raw_put(self, key: str, data: bytes, crc: int | None = None) -> None:
        if len(data) < _SINGLE_PUT_LIMIT:
            # boto3, not s3fs: s3fs's put holds ~3 extra copies of a bytearray body
            # while it sends (measured: +88 MiB for 32 MiB), which would break the
            # dispatcher's memory bound of parallelism x segment size; boto3 sends
            # the caller's buffer as it is, and is ~15% faster doing it.
            self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data, **self.options.put_kwargs(),
                                   **self._checksum(data, crc))
        else:
            self.fs.pipe_file(self._path(key), data)  # multipart beyond a single PUT's limit

    def _checksum(self, data: bytes, crc: int | None = None) -> dict[str, str]:
        """The checksum the store verifies the upload against, the one the
        probe found it honours: CRC32 (``crc`` when the caller has it, else
        computed here: zlib-ng, ~5x what botocore's zlib does) instead of by
        botocore, else Content-MD5 (Ceph RGW ignores CRC32 but checks MD5).
        Where it verifies neither (moto), CRC32 all the same, as before there
        was a probe: harmless."""
        mode = self.capabilities().upload_checksum
        if mode == "crc32" or (mode == "none" and self.options.checksum_mode == "when_supported"):
            value = crc if crc is not None else crc32(data)
            return {"ChecksumCRC32": base64.b64encode(value.to_bytes(4, "big")).decode("ascii")}
        if mode == "md5":
            from tiered.archive.s3probe import content_md5

            return {"ContentMD5": content_md5(data)}
        return {}

    def _raw_put_if(self, key: str, data: bytes, etag: str | None) -> str:
        # If-Match in the form the server accepts: Ceph RGW compares the
        # header with its bare ETag byte for byte, so a quoted tag never matches
        cond = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": self.capabilities().if_match(etag)}
        resp = self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data,
                                      **self.options.put_kwargs(), **self._checksum(data), **cond)
        return _etag(op_of(etag), key, resp)

    def _raw_head(self, key: str) -> ObjectInfo:
        resp = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        return ObjectInfo(key, resp["ContentLength"], int(resp["LastModified"].timestamp() * 1000),
                          _etag("head", key, resp))

    def _raw_list(self, prefix: str) -> list[ObjectInfo]:
        full = self._full(prefix)
        out: list[ObjectInfo] = []
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            for obj in page.get("Contents", []):
                out.append(ObjectInfo(obj["Key"][strip:], obj["Size"],
                                      int(obj["LastModified"].timestamp() * 1000), (obj.get("ETag") or "").strip('"') or None))
        return out

    def _raw_list_dirs(self, prefix: str) -> list[str]:
        full = self._full(prefix + "/" if prefix else "")
        names: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full,
                                                                          Delimiter="/"):
            names.extend(p["Prefix"][len(full):].rstrip("/") for p in page.get("CommonPrefixes", []))
        return sorted(names)

    def _raw_delete(self, keys: list[str]) -> None:
        resp = self.client.delete_objects(
            Bucket=self.bucket, Delete={"Objects": [{"Key": self._full(k)} for k in keys], "Quiet": True}
        )
        errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            first = errors[0]
            raise StorageError("delete", first.get("Key", "?"), f"{len(errors)} keys not deleted ({first.get('Code')})",
                               retriable=True)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_fs"] = None
        state["_client"] = None
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._lock = threading.Lock()
        self._pid = os.getpid()


def _checksum_is_ours(request: Any, **_: Any) -> None:
    """Tell botocore's signer that the x-amz-checksum-crc32 header we
    computed (``S3Store._checksum``) is the request's checksum, as one it
    computed itself would be: over https it then sends the body as
    UNSIGNED-PAYLOAD (TLS plus a checksum the store verifies), not hashed
    whole with SHA-256 first (~0.5 CPU-s per GB); over plain http it still
    signs the payload, the one integrity check such a link has."""
    checksum = request.context.setdefault("checksum", {})
    if "x-amz-checksum-crc32" in request.headers and not checksum.get("request_algorithm"):
        checksum["request_algorithm"] = {"algorithm": "crc32", "in": "header", "name": "x-amz-checksum-crc32"}


def op_of(etag: str | None) -> str:
    return "put_if_absent" if etag is None else "put_if_match"


def _etag(op: str, key: str, resp: dict[str, Any]) -> str:
    """The ETag of a response; a response without one is a bad answer (a
    proxy or node misbehaving), retried, never a KeyError."""
    etag = str(resp.get("ETag") or "").strip('"')
    if not etag:
        raise BadResponseError(op, key, "no ETag header")
    return etag


def _bad_response(op: str, key: str, exc: Exception) -> BadResponseError | None:
    """A 200 whose body cannot be used: unparsable (garbage XML), cut short
    (fewer bytes than Content-Length), or failing the checksum botocore
    verifies. Each is the same typed, retriable error, so it is retried and
    counted like a 500 instead of ending in a traceback."""
    try:
        from botocore import exceptions as bx
        from botocore.parsers import ResponseParserError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return None
    if isinstance(exc, bx.FlexibleChecksumError):
        return BadResponseError(op, key, "checksum mismatch")
    if isinstance(exc, bx.IncompleteReadError):
        return BadResponseError(op, key, "truncated body")
    if isinstance(exc, ResponseParserError):
        return BadResponseError(op, key, "unparsable body")
    if isinstance(exc, bx.ResponseStreamingError):
        return BadResponseError(op, key, "truncated body")
    aiohttp = _aiohttp()
    if aiohttp is None:
        return None
    if isinstance(exc, aiohttp.ClientPayloadError):
        return BadResponseError(op, key, "truncated body")
    return None


def _aiohttp() -> Any:
    """aiohttp when something in this process loaded it (s3fs does), else
    None: an exception cannot be one of its types before it is imported, and
    a writer that never used s3fs must not load it to translate a 404."""
    return sys.modules.get("aiohttp")


def _transport_error(exc: Exception) -> tuple[str, str] | None:
    """(reason, outcome) when ``exc`` is a transport failure of botocore or
    aiohttp (connection refused or reset, read timeout, truncated body):
    always retriable, whatever the request was."""
    try:
        from botocore import exceptions as bx
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return None
    name = type(exc).__name__
    if isinstance(exc, (bx.ReadTimeoutError, bx.ConnectTimeoutError)):
        return name, "timeout"
    if isinstance(exc, (bx.HTTPClientError, bx.IncompleteReadError, bx.ResponseStreamingError)):
        return name, "error"
    aiohttp = _aiohttp()
    if aiohttp is None:
        return None
    if isinstance(exc, (aiohttp.ServerTimeoutError, aiohttp.ConnectionTimeoutError)):
        return name, "timeout"
    if isinstance(exc, aiohttp.ClientError):
        return name, "error"
    return None


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
