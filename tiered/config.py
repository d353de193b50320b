"""Typed configuration, loaded once: flags > TIERED_* env > YAML file > defaults.

Nested keys use ``__`` in the environment: ``TIERED_S3__ENDPOINT_URL``,
``TIERED_DISPATCH__INTERVAL``. Durations accept seconds (``20``, ``0.5``) or
a number with a unit (``500ms``, ``20s``, ``5m``, ``1h``, ``3d``); retentions
accept hours (``72``), a duration (``36h``, ``7d``) or ``forever``. Secrets are
``SecretStr``: they print as ``**********`` in reprs, errors and logs.

Defaults never depend on the working directory: the local state lives in
``$XDG_STATE_HOME/tiered`` (``~/.local/state/tiered``), the default
``file://`` archive in ``$XDG_DATA_HOME/tiered/cold``
(``~/.local/share/tiered/cold``).
"""

from __future__ import annotations

import math
import os
import re
import socket
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError, field_validator,
                      model_validator)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from tiered.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(value: Any) -> float:
    """Seconds from ``20``, ``"20s"``, ``"5m"``, ``"1h"``, ``"500ms"``."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '20s'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"not a duration: {value!r} (use e.g. 20, '20s', '5m', '1h', '7d')")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise ValueError(f"a duration must be finite and at most {MAX_DURATION_S // 86400:.0f} days")
    if seconds <= 0:
        raise ValueError("a duration must be > 0")
    return seconds


# ~100 years: beyond it a value is a typo (1e400), and timers overflow
MAX_DURATION_S = 100 * 365 * 86400.0
# "forever" as hours: finite so that arithmetic and JSON catalogs stay plain
# numbers (10^9 h is ~114,000 years, 3.6e15 ms: far inside an int64)
FOREVER_HOURS = 1e9


def parse_retention_hours(value: Any) -> float:
    """Hours from ``72`` (a bare number is hours), ``"36h"``, ``"7d"``, ``"90m"``, or ``"forever"``."""
    if isinstance(value, str) and value.strip().lower() in ("forever", "never", "infinite"):
        return FOREVER_HOURS
    if isinstance(value, bool):
        raise ValueError("a retention is hours, a duration like '7d', or 'forever'")
    if isinstance(value, (int, float)):
        hours = float(value)
        if not math.isfinite(hours):
            raise ValueError("a retention must be finite: use 'forever' to keep data without expiry")
    else:
        text = str(value).strip()
        try:
            hours = float(text) if _DURATION.match(text) and text[-1:].isdigit() else parse_duration(text) / 3600
        except ValueError:
            raise ValueError(f"not a retention: {value!r} (use e.g. 72, '36h', '7d', 'forever')") from None
        if not math.isfinite(hours):
            raise ValueError("a retention must be finite: use 'forever' to keep data without expiry")
    if hours <= 0:
        raise ValueError("a retention must be > 0")
    return min(hours, FOREVER_HOURS)


Duration = Annotated[float, BeforeValidator(parse_duration)]
RetentionHours = Annotated[float, BeforeValidator(parse_retention_hours)]

_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1 << 20, "mb": 1 << 20,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
_SIZE = re.compile(r"^\s*([0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any) -> int:
    """Bytes from ``1048576``, ``"64MiB"``, ``"512k"``."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a string like '64MiB'")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value))
        if not match or match.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"not a size: {value!r} (use e.g. 1048576, '64MiB')")
        size = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if size <= 0:
        raise ValueError("a size must be > 0")
    return size


Size = Annotated[int, BeforeValidator(parse_size)]


class _Section(BaseModel):
    # each field's docstring is its description: docs/configuration.md is made of them
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class S3Settings(_Section):
    """An s3:// cold tier: where it is, how to reach it, who to be."""

    endpoint_url: str | None = None
    """The S3 endpoint of a self-hosted store (MinIO, SeaweedFS, Ceph); else `AWS_ENDPOINT_URL_S3`, else AWS S3."""
    region: str | None = None
    """The region; else the AWS chain's (`AWS_REGION`, the profile)."""
    addressing: Literal["auto", "path", "virtual"] = "auto"
    """`path` (`http://host/bucket/key`, what most self-hosted stores want), `virtual`
    (`http://bucket.host/key`), or botocore's choice."""
    sse: Literal["none", "AES256", "aws:kms"] = "none"
    """Server-side encryption asked for on every object written."""
    sse_kms_key_id: str | None = None
    """The KMS key of `sse: aws:kms` (else the bucket's default key)."""
    checksum_mode: Literal["when_supported", "when_required"] = "when_supported"
    """`when_required` for stores that reject the CRC checksums newer botocore sends."""
    access_key_id: SecretStr | None = None
    """With `secret_access_key` (both or neither); else the AWS credentials chain. Never printed."""
    secret_access_key: SecretStr | None = None
    """See `access_key_id`. Never printed."""
    session_token: SecretStr | None = None
    """Of temporary credentials, with the key pair. Never printed."""
    profile: str | None = None
    """A named profile of `~/.aws/config` and `~/.aws/credentials` (else `AWS_PROFILE`, else the default chain)."""
    max_attempts: int = Field(default=5, ge=1, le=20)
    """Attempts per S3 request, the first included; the backoff between them is `dispatch.retry`'s."""
    connect_timeout: Duration = 10.0
    """Of each connection to the store."""
    read_timeout: Duration = 60.0
    """Of each answer from the store."""

    @model_validator(mode="after")
    def _pairs(self) -> S3Settings:
        # half a key pair would silently fall back to another identity of the
        # AWS chain (or fail deep inside botocore): refuse it here
        if (self.access_key_id is None) != (self.secret_access_key is None):
            given, missing = (("access_key_id", "secret_access_key") if self.secret_access_key is None
                              else ("secret_access_key", "access_key_id"))
            raise ValueError(f"s3.{given} is set but s3.{missing} is not: give both or neither")
        if self.session_token is not None and self.access_key_id is None:
            raise ValueError("s3.session_token needs s3.access_key_id and s3.secret_access_key")
        return self


class FileSettings(_Section):
    """A file:// cold tier."""

    direct_writes: bool = True
    """Segment objects written around the page cache (O_DIRECT); false: through it, as every other object."""


class RetrySettings(_Section):
    """Retries of a failed write, with exponential backoff and jitter."""

    attempts: int = Field(default=6, ge=1, le=100)
    """Attempts of each write to a file:// tier, the first included (an S3 tier: `s3.max_attempts`)."""
    base_delay: Duration = 0.2
    """The first backoff; each next one doubles, up to `max_delay`."""
    max_delay: Duration = 20.0
    """The longest backoff."""


#: dispatch keys that no longer do anything -> why: accepted with a warning
REMOVED_DISPATCH_KEYS = {
    "single_pass": "every round builds its segments in one CommitLog pass",
    "build_processes": "segments are built in the dispatcher process, by the CommitLog pass",
}


class DispatchSettings(_Section):
    """The dispatcher: when and how the broker's queues are archived."""

    interval: Duration = 20.0
    """Time between two archive rounds of `tiered serve`."""
    upload_bytes: Size = 16 << 20
    """A queue's segment is uploaded once this much is pending ..."""
    max_delay: Duration = 60.0
    """... or once its oldest pending message is this old; `verify` calls a record older than this and not
    archived missing."""
    segment_bytes: Size = 32 << 20
    """The largest segment (object) one upload carries; memory is about parallelism x this."""
    start_position: str = "earliest"
    """Where a queue never archived starts: `earliest`, `latest`, or a time (`2026-11-01T00:00:00Z`)."""
    parallelism: int = Field(default=4, ge=1, le=64)
    """Uploads at a time."""
    round_budget: Duration = 15.0
    """A round starts no new segment of a queue after this; the next round goes on."""
    identity_check: Duration = Field(default=60.0, gt=0)
    """In a row of idle rounds the bucket identity is read at most this often (a round that writes always
    reads it first): a new or emptied bucket is noticed within it."""
    quarantine_corrupt: bool = False
    """A corrupt local record is committed as a one-offset gap (`quarantined`, counted) and its queue goes on,
    instead of stopping there."""
    key_index: bool = True
    """Each segment carries a bloom-filtered index of its KEYS and UNIQ_KEY (`tiered find --key`)."""
    pass_bytes: Size | None = Field(default=None, gt=0)
    """Record bytes the passes hold at a time: two waves of half of it (one uploading, the next built);
    null: parallelism x segment_bytes. More means fewer CommitLog walks over many queues, for more memory."""
    pass_threads: int | None = Field(default=None, ge=1, le=64)
    """Threads checking and copying the pass's CommitLog windows; null: the cores this process may run on, at
    most 8."""
    layout: int = Field(default=2, ge=1, le=2)
    """Segment layout written: 2 (one object per segment) or 1 (three objects, readable by tiered before
    2.0). Both are always read."""
    compression: Literal["none", "zstd"] = "none"
    """`zstd` compresses each segment object whole (layout 2 only)."""
    catalog_refresh: Duration = 300.0
    """The catalog's ranges lag the manifests by at most this; what a reader needs from it (the queues, the
    retention) is written at once."""
    retry: RetrySettings = RetrySettings()
    """Retries of failed writes."""

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        # keys of removed features: a file that still sets them keeps loading
        if isinstance(data, dict) and any(k in data for k in REMOVED_DISPATCH_KEYS):
            data = dict(data)
            for key in [k for k in REMOVED_DISPATCH_KEYS if k in data]:
                del data[key]
                # a FutureWarning: shown by default, and the CLI prints it as its own warning
                warnings.warn(f"dispatch.{key} is deprecated and ignored: {REMOVED_DISPATCH_KEYS[key]}; "
                              "remove it from the configuration", FutureWarning, stacklevel=2)
        return data

    @field_validator("compression")
    @classmethod
    def _compression(cls, value: str, info: Any) -> str:
        if value != "none" and info.data.get("layout") == 1:
            raise ValueError("compression needs dispatch.layout 2")
        return value

    @field_validator("start_position")
    @classmethod
    def _start(cls, value: str) -> str:
        from tiered.timeparse import parse_time_ms

        if value not in ("earliest", "latest"):
            parse_time_ms(value)
        return value


class CleanerSettings(_Section):
    """The cleaner: expiry, merges and orphans."""

    enabled: bool = True
    """Whether `tiered serve` runs it."""
    interval: Duration = 3600.0
    """Time between two cleaner passes of `tiered serve`."""
    orphan_grace: Duration = 3600.0
    """An object no manifest names is deleted only once it is this old (a write in flight is not an orphan)."""
    orphan_scan_interval: Duration = 6 * 3600.0
    """Orphans are looked for (a listing of the bucket) at most this often, so a pass with nothing expired
    makes no request."""
    skew_tolerance: Duration = 300.0
    """Store timestamps up to this far ahead of the sidecar's clock count as real; a segment stamped further
    ahead is never expired, and is reported."""
    merge: bool = True
    """Small adjacent segments are merged into bigger objects."""
    merge_target_bytes: Size = 256 << 20
    """The size a merge aims at."""
    merge_min_bytes: Size = 16 << 20
    """Adjacent segments smaller than this are merged (a merged run reaches at least this)."""


class RetentionSettings(_Section):
    """How long archived messages are kept: hours (`72`), a duration (`36h`, `7d`) or `forever`. A topic's
    `reserve.time` attribute in the broker's `topics.json` wins over these."""

    default_hours: RetentionHours = 72.0
    """Of every topic not named in `topics`."""
    topics: dict[str, RetentionHours] = Field(default_factory=dict)
    """Per topic (`{Orders: 24, Audit: forever}`)."""


class TopicSettings(_Section):
    """Which topics are archived: shell patterns (`Order*`)."""

    include: list[str] = Field(default_factory=lambda: ["*"])
    """Topics archived."""
    exclude: list[str] = Field(default_factory=list)
    """Topics left out, even when included."""
    include_system: bool = False
    """Also the broker's system topics (delay levels, timer wheel, transaction half/op: docs/system-topics.md)."""


class MetricsSettings(_Section):
    """The `/metrics`, `/healthz` and `/readyz` endpoint."""

    host: str = "0.0.0.0"
    """Address it listens on."""
    port: int = Field(default=9464, ge=0, le=65535)
    """Port it listens on (0: a free one)."""
    per_queue: bool = True
    """Lag and archive series per queue (false: per topic, for brokers of many queues)."""


class LogSettings(_Section):
    """Log lines on stderr."""

    format: Literal["json", "text"] = "text"
    """`json` for one JSON object per line."""
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """The least severe level written."""


MIN_LEASE_TTL_S = 10.0


def default_broker() -> str:
    """The host name, as RocketMQ's ``brokerName`` default."""
    return socket.gethostname()


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    # the XDG spec: a relative value is invalid and must be ignored
    return Path(value) if value and os.path.isabs(value) else Path.home() / fallback


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/tiered`` (``~/.local/state/tiered``), never the working directory."""
    return _xdg("XDG_STATE_HOME", ".local/state") / "tiered"


def default_cold_url() -> str:
    """``file://$XDG_DATA_HOME/tiered/cold`` (``~/.local/share/tiered/cold``)."""
    return f"file://{_xdg('XDG_DATA_HOME', '.local/share') / 'tiered' / 'cold'}"


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIERED_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    store: Path | None = None
    """The broker's store directory (`storePathRootDir`), read only."""
    cold_url: str = Field(default_factory=default_cold_url)
    """The archive: `s3://BUCKET/PREFIX` or `file:///PATH`."""
    state_dir: Path = Field(default_factory=default_state_dir)
    """Local state: the manifest cache and where queues not yet archived start."""
    cluster: str = "DefaultCluster"
    """First part of the archive's key prefix, as RocketMQ's `brokerClusterName`."""
    broker: str = Field(default_factory=default_broker)
    """Second part of the key prefix, as RocketMQ's `brokerName`."""
    broker_mode: Literal["auto", "default", "controller", "dledger"] = "auto"
    """How the broker replicates: only in controller mode does the archive wait at the checkpoint's confirm
    offset; `auto` tells the mode from the store (docs/brokermode.md)."""
    instance_id: str | None = None
    """Who holds the write lease; null: host name and store path."""
    lease_ttl: Duration = 120.0
    """How long the write lease lasts unrenewed; at least 10 s and 3 x `dispatch.interval`."""
    force_takeover: bool = False
    """Take the write lease from another writer, or replace an unreadable lease object, without waiting for
    it to expire (the other writer stops at its next check)."""
    shutdown_timeout: Duration = 30.0
    """How long `tiered serve` waits for running uploads after SIGTERM before it exits."""
    s3: S3Settings = S3Settings()
    """An s3:// archive."""
    file: FileSettings = FileSettings()
    """A file:// archive."""
    dispatch: DispatchSettings = DispatchSettings()
    """The dispatcher."""
    cleaner: CleanerSettings = CleanerSettings()
    """The cleaner."""
    retention: RetentionSettings = RetentionSettings()
    """Retention, recorded in the catalog for a cleaner without the store."""
    topics: TopicSettings = TopicSettings()
    """Topics archived."""
    metrics: MetricsSettings = MetricsSettings()
    """The metrics and probes endpoint."""
    log: LogSettings = LogSettings()
    """Logging."""

    @field_validator("cluster", "broker")
    @classmethod
    def _key_part(cls, value: str) -> str:
        if not value or "/" in value or value in (".", ".."):
            raise ValueError("must be a non-empty name without '/'")
        return value

    @field_validator("cold_url")
    @classmethod
    def _cold_url(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else "file"
        if scheme not in ("file", "s3", "s3a", "memory"):
            raise ValueError(f"unsupported scheme {scheme!r}: use file:// or s3://")
        if scheme in ("s3", "s3a"):
            bucket = value.split("://", 1)[1].split("/", 1)[0]
            if not _BUCKET.match(bucket) or ".." in bucket:
                raise ValueError(f"{bucket!r} is not an S3 bucket name (3-63 characters: lower-case letters, "
                                 f"digits, '.', '-'); use s3://BUCKET/PREFIX")
        return value

    @model_validator(mode="after")
    def _fencing(self) -> Settings:
        # A lease that can expire between two rounds of a busy writer lets a
        # second writer in: fencing would be off without anyone choosing it.
        floor = max(MIN_LEASE_TTL_S, 3 * self.dispatch.interval)
        if self.lease_ttl < floor:
            raise ValueError(f"lease_ttl: {self.lease_ttl:g} s is too short; it must be at least "
                             f"{floor:g} s ({MIN_LEASE_TTL_S:g} s, and 3 x dispatch.interval)")
        return self

    def writer_identity(self) -> str:
        """Who holds the write lease: configured, else host name + store path."""
        if self.instance_id:
            return self.instance_id
        store = str(self.store.resolve()) if self.store else "-"
        return f"{socket.gethostname()}:{store}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = os.environ.get("_TIERED_CONFIG_FILE")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if yaml_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)


def _error_line(exc: ValidationError, *, flags: dict[str, Any], config_file: str | Path | None,
                file_data: Any) -> str:
    """One line: the key, where its value came from, and what is wrong."""
    from tiered.configsources import source_of

    err = exc.errors()[0]
    msg = err["msg"].removeprefix("Value error, ")
    loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    if not loc:  # a rule across keys (or a section's own rule): the message names them
        return f"invalid configuration: {msg}"
    key = ".".join(str(p) for p in loc)
    source = source_of(loc, flags=flags, config_file=config_file, file_data=file_data)
    where = "" if source == "default" else f" ({source})"
    return f"invalid configuration: {key}{where}: {msg}"


def _read_yaml(config_file: str | Path) -> Any:
    import yaml

    from tiered.configsources import yaml_problem

    path = Path(config_file)
    if not path.is_file():
        raise ConfigError(f"invalid configuration: --config: no such file {config_file}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"invalid configuration: {config_file}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"invalid configuration: {config_file}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid configuration: {yaml_problem(config_file, exc)}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"invalid configuration: {config_file}: the top level must be a mapping of settings "
                          f"(found {type(data).__name__})")
    return data


def load_settings(config_file: str | Path | None = None, **flags: Any) -> Settings:
    """Load settings once. ``flags`` are the command-line values (None = not given).

    Raises ConfigError with one line naming the key, where its value came
    from (flag, environment variable, file and line) and what is wrong; the
    offending value is not echoed (it may be a secret).
    """
    given = {k: v for k, v in flags.items() if v is not None}
    overrides = _nest(given)
    file_data = _read_yaml(config_file) if config_file is not None else None
    previous = os.environ.get("_TIERED_CONFIG_FILE")
    try:
        if config_file is not None:
            os.environ["_TIERED_CONFIG_FILE"] = str(config_file)
        else:
            os.environ.pop("_TIERED_CONFIG_FILE", None)
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_error_line(exc, flags=given, config_file=config_file, file_data=file_data)) from None
    except (OSError, ValueError) as exc:  # unreadable or unparsable YAML
        raise ConfigError(f"invalid configuration: {config_file}: {type(exc).__name__}") from None
    finally:
        if previous is None:
            os.environ.pop("_TIERED_CONFIG_FILE", None)
        else:
            os.environ["_TIERED_CONFIG_FILE"] = previous


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"metrics.port": 1}`` -> ``{"metrics": {"port": 1}}``."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out
