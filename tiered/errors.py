"""Every error tiered raises, under one root.

Decisions read attributes, never class names:

- ``retriable`` (read by the retry wrapper): an error that may succeed when
  tried again (a throttled or failed request) says so; an error in the data
  never does.
- ``transport``: the object store's request failed (the store is down or
  misbehaving), not the queue; a queue failing so is not stuck.
- ``stuck_reason``: the ``tiered_queue_stuck`` reason of a queue stopped by
  this error; None when the queue is not stopped by its own data or archive
  (a lost race, a store failure), which the round retries with back-off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class TieredError(Exception):
    """Root of every error this package raises on purpose."""

    retriable: bool = False
    transport: bool = False
    stuck_reason: str | None = "error"


def stuck_reason(exc: BaseException) -> str | None:
    """The ``tiered_queue_stuck`` reason of a queue that failed with ``exc``:
    None for a transport failure or a lost race, "error" for anything that
    is not ours (a bug)."""
    if not isinstance(exc, TieredError):
        return "error"
    return None if exc.transport else exc.stuck_reason


class CorruptRecordError(TieredError):
    """Malformed bytes in a CommitLog, ConsumeQueue or cold object.

    ``source`` names the file or object, ``offset`` the byte offset in it at
    which the bad data starts.
    """

    stuck_reason = "corrupt_local_data"

    def __init__(self, source: str, offset: int, reason: str) -> None:
        self.source = source
        self.offset = offset
        self.reason = reason
        super().__init__(f"{source} @ {offset}: {reason}")


class NotWrittenYetError(TieredError):
    """The bytes asked for are not (completely) written yet: a torn tail.

    Kept apart from corruption: a broker appending concurrently produces
    this condition all the time and it resolves itself on the next round.
    """

    def __init__(self, source: str, offset: int, reason: str = "not written yet") -> None:
        self.source = source
        self.offset = offset
        super().__init__(f"{source} @ {offset}: {reason}")


class ExpiredLocallyError(TieredError):
    """The broker deleted the local file holding these offsets (retention)."""

    def __init__(self, topic: str, queue_id: int, offset: int, next_available: int | None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.next_available = next_available
        super().__init__(
            f"{topic}/{queue_id} offset {offset} expired locally; "
            f"next available offset {next_available}"
        )


class StoreBehindError(TieredError):
    """The local store ends before what the archive already holds (a broker
    disk replaced, offsets reset): never skipped, never archived backwards."""

    stuck_reason = "store_behind"

    def __init__(self, topic: str, queue_id: int, local_end: int, archived_end: int) -> None:
        self.topic, self.queue_id = topic, queue_id
        self.local_end, self.archived_end = local_end, archived_end
        super().__init__(
            f"{topic}/{queue_id}: the local store ends at offset {local_end} but the archive already holds "
            f"offsets up to {archived_end} (broker disk replaced or offsets reset?); nothing is archived "
            f"for this queue until the broker's offsets pass {archived_end}")


class ConfigError(TieredError):
    """A configuration value or a broker config file that cannot be used."""


class AclFileError(ConfigError):
    """A RocketMQ ACL file (``tiered replay --acl``) that cannot be used:
    ``path`` names the file, ``reason`` the entry and what is wrong with it,
    never a secret of it."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"--acl {path}: {reason}")


class FormatVersionError(TieredError):
    """A manifest or catalog written by a newer, incompatible format version."""

    stuck_reason = "manifest"


class StorageError(TieredError):
    """An object-store request failed. ``retriable`` is set per instance;
    ``outcome`` is the metric label: error, throttled, timeout, not_found,
    precondition_failed."""

    transport = True

    def __init__(self, op: str, key: str, reason: str, *, retriable: bool, outcome: str = "error") -> None:
        self.op = op
        self.key = key
        self.retriable = retriable
        self.outcome = outcome
        super().__init__(f"{op} {key}: {reason}")


class ObjectNotFoundError(StorageError):
    def __init__(self, op: str, key: str) -> None:
        super().__init__(op, key, "no such object", retriable=False, outcome="not_found")


class PreconditionFailedError(StorageError):
    """A conditional write lost: someone else wrote the object first."""

    def __init__(self, op: str, key: str, reason: str = "precondition failed") -> None:
        super().__init__(op, key, reason, retriable=False, outcome="precondition_failed")


class FencedError(TieredError):
    """Another sidecar holds the write lease for this broker prefix."""


class NothingUnderUrlError(TieredError):
    """Nothing at all under a cold-tier URL a reading command was given: a
    mistyped bucket or prefix, which must not pass for an empty archive.
    ``url`` is the URL as shown (without credentials)."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(f"no archive at {url} (nothing under it: check the bucket and prefix)")


class BadResponseError(StorageError):
    """The store answered, but with something unusable: a 200 whose body is
    garbage or cut short, a write answered without an ETag, a body that fails
    its checksum. Transient by nature (a proxy or a node misbehaving once), so
    retried like a 500 and counted."""

    def __init__(self, op: str, key: str, reason: str) -> None:
        super().__init__(op, key, f"bad response: {reason}", retriable=True)


class ConditionalWritesUnsupportedError(StorageError):
    """The capability probe found a store that does not honour conditional
    writes (ignores ``If-Match`` / ``If-None-Match`` or answers 501/400):
    manifest commits and the write lease would be unsafe there, so nothing is
    written. There is deliberately no switch to write anyway."""

    def __init__(self, endpoint: str, bucket: str, key: str, finding: str) -> None:
        self.endpoint = endpoint
        self.bucket = bucket
        self.finding = finding
        super().__init__("probe", key, "", retriable=False)
        self.args = (
            f"{endpoint} bucket {bucket}: conditional writes are not honoured ({finding}); tiered writes "
            f"nothing to this store (see the README's 'Supported object stores' table)",)

    def __str__(self) -> str:
        return str(self.args[0])


class CredentialsMissingError(StorageError):
    """No credentials anywhere in the AWS chain: names the places looked at."""

    def __init__(self, op: str, key: str, endpoint: str) -> None:
        super().__init__(
            op, key,
            f"no S3 credentials found for {endpoint}: set s3.access_key_id and s3.secret_access_key, "
            "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or a profile (AWS_PROFILE, ~/.aws/credentials), "
            "or web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, as IRSA sets them), "
            "or run where instance metadata serves a role", retriable=False)


class UnsupportedStoreError(ConfigError):
    """A broker store tiered cannot read (a RocksDB ConsumeQueue, a DLedger
    CommitLog): refused at start-up, exit 2, rather than archiving nothing.
    ``store_type`` and ``directory`` name what was found where."""

    def __init__(self, store_type: str, directory: str, message: str) -> None:
        self.store_type = store_type
        self.directory = directory
        super().__init__(message)


class ConflictError(TieredError):
    """The manifest changed under us in a way the change cannot be re-applied
    to: a lost race, tried again next round, not a stuck queue."""

    retriable = True
    stuck_reason = None


class ManifestChunkError(CorruptRecordError):
    """A chunk a committed head references is missing or damaged. The queue
    stops (its segments cannot be listed); ``tiered repair`` rebuilds the
    manifest from the segment objects."""

    stuck_reason = "manifest"


class UnaccountedObjectsError(TieredError):
    """A queue's bucket objects cannot be turned into a manifest safely."""

    stuck_reason = "unaccounted_objects"

    def __init__(self, where: str, problems: tuple[str, ...]) -> None:
        self.where = where
        self.problems = problems
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        super().__init__(f"{where}: the bucket holds objects no manifest accounts for; nothing is written "
                         f"for this queue until `tiered repair` or an operator resolves them: "
                         f"{'; '.join(problems[:3])}{more}")


class SpoiledAnswerError(TieredError):
    """Raised inside botocore by the S3 store's answer check, where the
    request's key is unknown; the store translates it to a
    ``BadResponseError``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, kw_only=True)
class BodyDecompressError(TieredError, ValueError):
    """A body flagged compressed that does not decompress."""

    codec: str
    reason: str

    def __str__(self) -> str:
        return f"body does not decompress as {self.codec}: {self.reason}"


class BadProperties(TieredError, ValueError):
    """Properties of record ``record`` are not UTF-8, from byte ``at`` of them."""

    def __init__(self, record: int, at: int) -> None:
        super().__init__(f"properties of record {record} are not valid UTF-8 at byte {at}")
        self.record = record
        self.at = at


class BadRecordsError(TieredError):
    """Records of a columnar batch fail a check: ``mask`` (a boolean array)
    marks them, ``reasons`` pairs masks with what is wrong. Caught by the
    batch decoder, which skips or reports those rows."""

    def __init__(self, mask: Any, reasons: list[tuple[Any, str]]) -> None:
        self.mask = mask
        self.reasons = reasons
        super().__init__(reasons[0][1] if reasons else "bad records")


class OptionError(TieredError, ValueError):
    """A data source option that cannot be used (names the option, never its value
    when it is a secret)."""


class NoArchiveError(TieredError, ValueError):
    """The URL has no archive under it (no cluster/broker prefixes)."""


class ExportError(TieredError):
    """The export cannot go on (state changed by another export, a task failed)."""

    retriable = True


class TargetNotEmptyError(TieredError):
    """The restore target exists and holds something: nothing was written."""

    def __init__(self, path: str, entries: list[str]) -> None:
        shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
        super().__init__(f"{path}: not empty ({shown}); restore writes only into an empty or new directory")
        self.path = path


class RestoreCheckError(TieredError):
    """The restored store differs from the archive (named queue and offset)."""


class BadFrameError(TieredError):
    """A remoting frame that cannot be decoded (``tiered replay``): the
    connection that sent it is closed, as a RocketMQ broker closes it."""


class BadRequestError(TieredError):
    """A decoded request whose header fields are missing or malformed:
    answered with ``code`` (a RocketMQ response code) and the message."""

    def __init__(self, message: str, *, code: int = 1) -> None:
        self.code = code
        super().__init__(message)
