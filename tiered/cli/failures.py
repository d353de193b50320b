"""Exit codes, and the one place an exception becomes a message and a code.

====  ==========================================================================
code  meaning
====  ==========================================================================
0     done, nothing to report
1     findings: verify differences, status problems, a queue that stopped,
      nothing found by ``find`` -- or an unexpected error
2     usage or configuration: a bad flag, config key, config file, local path
3     the object store is unreachable or refused (connection, timeout,
      credentials missing or rejected, access denied, no such bucket)
====  ==========================================================================

A traceback is printed only with ``tiered --debug``; otherwise one or two
lines name what is wrong. Messages never carry a secret: they are built
from exception texts that are themselves secret-free (see errors.py) and
from the store's URL and endpoint.
"""

from __future__ import annotations

import errno
import traceback
from dataclasses import dataclass
from typing import NoReturn

OK, FINDINGS, USAGE, STORAGE = 0, 1, 2, 3


@dataclass(frozen=True, kw_only=True)
class StoreContext:
    """Where the command's object store is: named in storage errors."""

    url: str
    endpoint: str | None


_store: StoreContext | None = None


def note_store(url: str, endpoint: str | None) -> None:
    """Called when the command opens its cold tier: a later storage error names it."""
    global _store
    _store = StoreContext(url=url, endpoint=endpoint)


def reset() -> None:
    global _store
    _store = None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _full_key(key: str) -> str:
    """``s3://bucket/prefix/key`` for a key relative to the store root."""
    if _store is None or not key:
        return key
    if key == "/":  # a listing of the store's root (ObjectStore.list_dirs)
        return f"{_store.url.rstrip('/')}/"
    if key.startswith(("s3://", "file://", "/")):
        return key
    return f"{_store.url.rstrip('/')}/{key}"


def _where() -> str:
    if _store is None:
        return ""
    return f" (endpoint {_store.endpoint})" if _store.endpoint else ""


def _botocore_credentials(exc: BaseException) -> str | None:
    try:
        from botocore import exceptions as bx
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return None
    if isinstance(exc, bx.NoCredentialsError):
        return ("no S3 credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                "s3.access_key_id / s3.secret_access_key), a profile, or a web identity")
    if isinstance(exc, bx.PartialCredentialsError):
        return f"incomplete S3 credentials: {_first_line(str(exc))}"
    if isinstance(exc, bx.EndpointConnectionError):
        return f"cannot connect: {_first_line(str(exc))}"
    if isinstance(exc, bx.ClientError):
        err = getattr(exc, "response", {}).get("Error", {})
        return f"refused: {err.get('Code', '?')} {err.get('Message', '')}".rstrip()
    return None


def _storage_reason(exc: BaseException) -> str:
    """The underlying cause of a storage error, in one line."""
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        found = _botocore_credentials(cur)
        if found:
            return found
        cur = cur.__cause__ or cur.__context__
    cause = exc.__cause__
    return _first_line(str(cause)) if cause is not None else ""


def classify(exc: BaseException) -> tuple[int, str]:
    """(exit code, one- or two-line message) for an exception no command handled."""
    from tiered.errors import (ConditionalWritesUnsupportedError, ConfigError, CredentialsMissingError, FencedError,
                               StorageError, TieredError)

    if isinstance(exc, ConfigError):
        return USAGE, str(exc)
    if isinstance(exc, StorageError) and _is_unavailable(exc):
        what = f"{exc.op} {_full_key(exc.key)}"
        # the refusal names the endpoint and bucket itself: kept whole
        whole = isinstance(exc, ConditionalWritesUnsupportedError) or ": " not in str(exc)
        head = str(exc) if whole else str(exc).split(": ", 1)[1]
        # a typed credentials error already names every place looked at
        reason = "" if isinstance(exc, CredentialsMissingError) else _storage_reason(exc)
        line = f"storage error{_where()}: {what}: {head}"
        return STORAGE, line + (f"\n  cause: {reason}" if reason and reason not in head else "")
    boto = _botocore_credentials(exc)
    if boto is not None:
        target = _store.url if _store else "the object store"
        return STORAGE, f"storage error{_where()}: {target}: {boto}"
    if isinstance(exc, FencedError):
        return FINDINGS, str(exc)
    if isinstance(exc, TieredError):
        return FINDINGS, str(exc)
    if isinstance(exc, PermissionError) or (isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES)):
        return USAGE, f"{exc.filename or ''}: not writable or readable ({exc.strerror})".lstrip(": ")
    if isinstance(exc, OSError):
        name = f"{exc.filename}: " if exc.filename else ""
        return USAGE, f"{name}{exc.strerror or type(exc).__name__}"
    return FINDINGS, (f"unexpected {type(exc).__name__}: {_first_line(str(exc)) or '-'}\n"
                      f"  run with --debug for the traceback")


def _is_unavailable(exc: BaseException) -> bool:
    """A storage error meaning the store could not be used (unreachable,
    refused, throttled to death); a missing object or a lost conditional
    write is an answer about the data, not an outage."""
    from tiered.errors import ObjectNotFoundError, PreconditionFailedError, StorageError

    return isinstance(exc, StorageError) and not isinstance(exc, (ObjectNotFoundError, PreconditionFailedError))


def code_for(exc: BaseException, default: int = FINDINGS) -> int:
    """The exit code for an error a command caught: storage and configuration
    keep their codes, anything else is the command's ``default``."""
    from tiered.errors import ConfigError

    if _is_unavailable(exc):
        return STORAGE
    if isinstance(exc, ConfigError):
        return USAGE
    return default


def fail_with(exc: BaseException, default: int = FINDINGS, prefix: str = "") -> NoReturn:
    """Exit for an error a command caught; storage errors name the store."""
    import typer

    from tiered.cli.output import error

    code = code_for(exc, default)
    message = classify(exc)[1] if _is_unavailable(exc) else str(exc)
    error(prefix + message)
    raise typer.Exit(code)


def report(exc: BaseException, *, debug: bool) -> int:
    """Print ``exc`` for the operator; the exit code."""
    from tiered.cli.output import error

    code, message = classify(exc)
    if debug:
        traceback.print_exception(exc)
        message = message.replace("\n  run with --debug for the traceback", "")
    error(message)
    return code

