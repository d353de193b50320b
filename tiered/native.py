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

import logging
import os
from types import ModuleType

from zlib_ng.zlib_ng import crc32

log = logging.getLogger(__name__)

REQUIRE_ENV = "TIERED_TEST_REQUIRE_NATIVE"


def _load() -> tuple[ModuleType | None, str]:
    """The core, self-tested, and why it is (not) loaded."""
    try:
        from tiered import _native
    except ImportError as exc:
        return None, f"not built ({exc})"
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
