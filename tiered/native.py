"""The native core (``tiered._native``, built from tiered/_native.c), loaded
once, here, and nowhere else.

It checks a run of CommitLog records (a CRC per record) and copies them into
their segments, where numpy cannot: no library computes a CRC per row. Every
function has a Python twin (tiered.format.batch), with the same answers, that
an install built without a C compiler runs instead; docs/development.md
("Native code") has the figures either way. ``TIERED_TEST_REQUIRE_NATIVE=1`` turns
the tests that need the core from skipped into failed where it is absent (CI).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from types import ModuleType

from zlib_ng.zlib_ng import crc32

log = logging.getLogger(__name__)

REQUIRE_ENV = "TIERED_TEST_REQUIRE_NATIVE"


def source_digest(directory: Path = Path(__file__).parent) -> str | None:
    """setup.py's digest of the core's C sources in ``directory``; None where
    they are not there (an installed package holds the built core only)."""
    paths = sorted([*directory.glob("_native*.c"), *directory.glob("_native*.h")], key=lambda p: p.name)
    if not paths:
        return None
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _load() -> tuple[ModuleType | None, str]:
    """The core, self-tested, and why it is (not) loaded."""
    try:
        from tiered import _native
    except ImportError as exc:
        return None, f"not built ({exc})"
    digest = source_digest()
    if digest is not None and getattr(_native, "sources", None) != digest:
        # an editable install whose C sources changed since the build: its
        # functions may lack one or take other arguments
        return None, (f"{_native.__file__} was built from other sources than tiered/_native*.c; "
                      "rebuild it (pip install -e ., or python setup.py build_ext --inplace)")
    probe = bytes(range(256)) * 5
    if (_native.crc32(probe) != crc32(probe) or _native.crc32(b"123456789") != 0xCBF43926
            or _native.crc32_combine(crc32(probe[:100]), crc32(probe[100:]), 1180) != crc32(probe)):
        return None, f"its crc32 ({_native.crc_library}) disagrees with zlib's"
    return _native, f"loaded from {_native.__file__} (CRC-32: {_native.crc_library})"


core, reason = _load()


def loaded() -> bool:
    return core is not None


def required() -> bool:
    """Whether this environment asks for the core (CI: ``TIERED_TEST_REQUIRE_NATIVE=1``)."""
    return os.environ.get(REQUIRE_ENV, "") == "1"


def describe() -> str:
    """One line for ``tiered --version`` and the start-up log."""
    return f"native core: {reason}" if core is not None else f"native core: {reason}; running the Python path"


def log_status() -> None:
    """Said once at start-up: the Python path is several times slower."""
    log.info(describe(), extra={"native_core": core is not None})
