"""Builds the parts from one Settings object: the composition root's toolbox."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from tiered import native
from tiered.clock import Clock, SystemClock
from tiered.archive.coldtier import ColdTier
from tiered.config import Settings
from tiered.errors import ConfigError
from tiered.archive.lease import LeaseManager
from tiered.archive.manifest import broker_prefix
from tiered.store.localstore import LocalStore
from tiered.recorder import NullRecorder, Recorder
from tiered.archive.storage import ObjectStore, RetryPolicy, S3Options, open_store

if TYPE_CHECKING:
    from tiered.cleaner import Cleaner
    from tiered.dispatcher import Dispatcher, TopicFilter


def s3_options(settings: Settings) -> S3Options:
    s3 = settings.s3

    def secret(v: object) -> str | None:
        return v.get_secret_value() if v is not None else None  # type: ignore[attr-defined]

    return S3Options(
        endpoint_url=s3.endpoint_url, region=s3.region, addressing=s3.addressing, sse=s3.sse,
        sse_kms_key_id=s3.sse_kms_key_id, checksum_mode=s3.checksum_mode,
        access_key_id=secret(s3.access_key_id), secret_access_key=secret(s3.secret_access_key),
        session_token=secret(s3.session_token), connect_timeout=s3.connect_timeout, read_timeout=s3.read_timeout,
        profile=s3.profile,
    )


def is_s3(url: str) -> bool:
    return url.split("://", 1)[0] in ("s3", "s3a") if "://" in url else False


def object_store(settings: Settings, recorder: Recorder | None = None) -> ObjectStore:
    """The cold tier's store. Attempts per request: ``s3.max_attempts`` on S3,
    ``dispatch.retry.attempts`` on file://; the backoff is dispatch.retry's."""
    from tiered.cli import failures

    r = settings.dispatch.retry
    attempts = settings.s3.max_attempts if is_s3(settings.cold_url) else r.attempts
    failures.note_store(settings.cold_url, settings.s3.endpoint_url if is_s3(settings.cold_url) else None)
    return open_store(settings.cold_url, s3=s3_options(settings), direct=settings.file.direct_writes,
                      retry=RetryPolicy(attempts, r.base_delay, r.max_delay), recorder=recorder or NullRecorder())


def shown_url(url: str) -> str:
    """``url`` for a message: a password in it (``scheme://user:secret@host``)
    and a query string (a signature) never reach the terminal or a log."""
    from urllib.parse import urlsplit, urlunsplit

    if "://" not in url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.split(':', 1)[0]}:***@{host}" if ":" in user else netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", parts.fragment))


def archive_store(settings: Settings) -> ObjectStore:
    """The cold tier's store for a command that reads an archive (status, ls,
    verify, cat, find, sql, export): NothingUnderUrlError (exit 1) when nothing
    at all is under the URL, so a mistyped bucket or prefix does not read as an
    empty, healthy archive. Every archive key starts ``<cluster>/``: one
    delimiter listing of the root decides. A URL holding only other clusters'
    or brokers' archives passes: a wrong --cluster/--broker is the command's
    to report (verify lists the prefixes there)."""
    from tiered.errors import NothingUnderUrlError

    store = object_store(settings)
    if not store.list_dirs():
        raise NothingUnderUrlError(shown_url(settings.cold_url))
    return store


def writable_state_dir(settings: Settings) -> Path:
    """The state directory, created; ConfigError (exit 2) naming it when it cannot be written."""
    path = Path(settings.state_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"invalid configuration: state_dir: {path} is not writable ({exc.strerror}); "
                          f"set state_dir in the config file or TIERED_STATE_DIR") from None
    return path


def cold_tier(settings: Settings, store: ObjectStore, *, writer: bool, clock: Clock | None = None,
              recorder: Recorder | None = None) -> ColdTier:
    if writer:
        writable_state_dir(settings)
    return ColdTier(store, settings.cluster, settings.broker,
                    state_dir=Path(settings.state_dir) if writer else None,
                    writer=settings.writer_identity() if writer else "", clock=clock or SystemClock(),
                    recorder=recorder, catalog_refresh_s=settings.dispatch.catalog_refresh)


def lease(settings: Settings, store: ObjectStore, clock: Clock | None = None) -> LeaseManager:
    return LeaseManager(store, broker_prefix(settings.cluster, settings.broker), settings.writer_identity(),
                        ttl_s=settings.lease_ttl, clock=clock, force=settings.force_takeover)


def utc_iso_ms(created: float) -> str:
    """``2026-11-25T03:04:05.678Z``: UTC, ISO 8601, milliseconds (what log pipelines parse)."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(created, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the structured fields (topic, queue, offset...)."""

    _STD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

    def format(self, record: logging.LogRecord) -> str:
        import json

        out = {"time": utc_iso_ms(record.created), "level": record.levelname,
               "logger": record.name, "message": record.getMessage()}
        for k, v in vars(record).items():
            if k not in self._STD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    _STD = JsonFormatter._STD

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return utc_iso_ms(record.created)

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extra = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in self._STD and not k.startswith("_"))
        return f"{base} {extra}" if extra else base


class StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a record comes, not as it was when
    logging was set up: a CLI run inside another program (a test runner, a
    notebook) swaps stderr between commands, and a closed stream loses the line."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def setup_logging(fmt: str, level: str) -> None:
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "s3fs", "aiobotocore", "urllib3", "apscheduler.executors", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def topic_filter(settings: Settings) -> TopicFilter:
    """The topics the dispatcher archives (and so verify and status answer for)."""
    from tiered.dispatcher import TopicFilter

    return TopicFilter(tuple(settings.topics.include), tuple(settings.topics.exclude),
                       settings.topics.include_system, frozenset({settings.cluster, settings.broker}))


def make_dispatcher(
    settings: Settings,
    local: LocalStore,
    recorder: Recorder | None = None,
    clock: Clock | None = None,
    on_bytes: Callable[[int], None] = lambda n: None,
    *,
    store: ObjectStore | None = None,
    cold: ColdTier | None = None,
    lease_manager: LeaseManager | None = None,
) -> Dispatcher:
    """A Dispatcher from settings; the service passes its shared store, cold
    tier and lease so the dispatcher and the cleaner see one manifest cache."""
    from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions, PassOptions

    store = store or object_store(settings, recorder)
    cold = cold or cold_tier(settings, store, writer=True, clock=clock, recorder=recorder)
    # the Python path is several times slower: said at start-up, once the
    # configuration (the state directory) is known to be good
    native.log_status()
    d = settings.dispatch
    options = DispatchOptions(
        archive=ArchiveOptions(upload_bytes=d.upload_bytes, max_delay_ms=int(d.max_delay * 1000),
                               segment_bytes=d.segment_bytes, start_position=d.start_position,
                               quarantine_corrupt=d.quarantine_corrupt, key_index=d.key_index,
                               layout=d.layout, compression=d.compression,
                               commit_pass=PassOptions(threads=d.pass_threads)),
        parallelism=d.parallelism, round_budget_s=d.round_budget, failure_backoff_s=d.interval,
        retention=settings.retention, pass_bytes=d.pass_bytes, identity_check_s=d.identity_check,
    )
    return Dispatcher(local, cold, lease=lease_manager or lease(settings, store, clock),
                      topic_filter=topic_filter(settings),
                      options=options, recorder=recorder, clock=clock, on_bytes=on_bytes)


def make_cleaner(
    settings: Settings,
    cold: ColdTier,
    local: LocalStore | None,
    *,
    lease_manager: LeaseManager | None = None,
    recorder: Recorder | None = None,
    clock: Clock | None = None,
) -> Cleaner:
    """The cleaner for ``settings``; shares ``cold`` (and its per-queue locks)
    with the dispatcher when both run in one process."""
    from tiered.cleaner import CleanOptions, Cleaner

    return Cleaner(cold, local=local, retention=settings.retention, options=CleanOptions.from_settings(settings.cleaner),
                   lease=lease_manager, recorder=recorder, clock=clock)
