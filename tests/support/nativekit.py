"""The native core for the tests that compare it with its Python twin."""

from __future__ import annotations

from types import ModuleType

import pytest

from tiered import native


def need_native() -> ModuleType:
    """``tiered.native.core``; the test skipped, saying why, where the install
    built none, or failed where the environment requires it (CI sets
    ``TIERED_TEST_REQUIRE_NATIVE=1``)."""
    if native.core is None:
        if native.required():
            pytest.fail(f"{native.REQUIRE_ENV}=1 and {native.describe()}")
        pytest.skip(f"{native.describe()}; this test needs the core ({native.REQUIRE_ENV}=1 fails it instead)")
    return native.core
