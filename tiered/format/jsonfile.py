"""JSON files persisted the broker's way: write X.tmp, move X to X.bak,
rename X.tmp to X. A reader whose X is missing, empty or unparsable falls
back to X.bak. Used for the broker's config/*.json and our manifest cache.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from tiered.errors import CorruptRecordError

log = logging.getLogger(__name__)


def write_json(path: Path, obj: Any, *, fsync: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    bak = path.with_name(path.name + ".bak")
    data = json.dumps(obj, indent=2, sort_keys=True).encode("utf-8")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    if path.exists():
        os.replace(path, bak)
    os.replace(tmp, path)
    if fsync:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _load(path: Path) -> Any:
    data = path.read_bytes()
    if not data.strip():
        raise ValueError("empty")
    return json.loads(data)


def read_json(path: Path) -> Any | None:
    """The content of ``path``, else of ``path.bak``; None when neither exists.

    Raises CorruptRecordError (naming the file) when a file exists but
    neither it nor its backup parses.
    """
    bak = path.with_name(path.name + ".bak")
    first_error: str | None = None
    for candidate in (path, bak):
        try:
            doc = _load(candidate)
        except FileNotFoundError:
            continue
        except (ValueError, UnicodeDecodeError, OSError, RecursionError) as exc:  # deep nesting: RecursionError
            first_error = first_error or f"{candidate.name}: {type(exc).__name__}"
            continue
        if candidate is bak:
            # the backup is one write older: say so, since what was lost may matter
            log.warning("%s: %s; read its backup %s instead", path, first_error or "missing", bak.name)
        return doc
    if first_error is None:
        return None
    raise CorruptRecordError(str(path), 0, f"unparsable JSON and no usable backup ({first_error})")
