"""tiered.native: the one loader of the native core, what it says about it,
and the tests' rule for it (skipped where absent, failed where required)."""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from tiered import native

from nativekit import need_native

# an install without the extension, played by refusing its import
_HIDDEN = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "tiered._native":
            raise ImportError("no compiler at install", name=name)
sys.meta_path.insert(0, Hide())
from tiered import native
from tiered.format import batch, keyindex
from tiered.store import preads
print(native.core is None, batch._native is None, keyindex._native is None, preads._native is None)
print(native.describe())
"""


def test_without_the_extension_every_user_runs_the_python_path() -> None:
    out = subprocess.run([sys.executable, "-c", _HIDDEN], capture_output=True, text=True, timeout=120, check=True)
    flags, said = out.stdout.splitlines()
    assert flags == "True True True True"
    assert said == "native core: not built (no compiler at install); running the Python path"


def test_the_core_loaded_is_the_one_every_user_holds() -> None:
    from tiered.format import batch, keyindex
    from tiered.store import preads

    core = need_native()
    assert batch._native is core
    assert keyindex._native is core and preads._native is core
    assert native.loaded() and native.describe() == f"native core: loaded from {core.__file__} (CRC-32: {core.crc_library})"


def test_start_up_says_at_info_whether_it_loaded(caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with caplog.at_level(logging.INFO, logger="tiered.native"):
        native.log_status()
        monkeypatch.setattr(native, "core", None)
        monkeypatch.setattr(native, "reason", "not built (gone)")
        native.log_status()
    said = [(r.levelno, r.getMessage(), r.native_core) for r in caplog.records if r.name == "tiered.native"]
    assert said[1] == (logging.INFO, "native core: not built (gone); running the Python path", False)
    assert said[0][0] == logging.INFO and len(said) == 2


def test_a_test_needing_the_core_skips_where_absent_and_fails_where_required(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "core", None)
    monkeypatch.setattr(native, "reason", "not built (gone)")
    monkeypatch.delenv(native.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="running the Python path"):
        need_native()
    monkeypatch.setenv(native.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="TIERED_TEST_REQUIRE_NATIVE=1 and native core: not built"):
        need_native()


def test_a_dispatcher_made_for_the_service_says_at_info_whether_the_core_loaded(
        tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    from dispatchkit import new_writer
    from tiered.cli.wiring import make_dispatcher
    from tiered.config import Settings
    from tiered.store.localstore import LocalStore

    sd = tmp_path / "store"
    with new_writer(sd):
        pass
    settings = Settings(store=sd, cold_url=f"file://{tmp_path / 'cold'}", state_dir=tmp_path / "state")
    with caplog.at_level(logging.INFO, logger="tiered.native"):
        make_dispatcher(settings, LocalStore(sd))
    said = [(r.levelno, r.getMessage(), r.native_core) for r in caplog.records if r.name == "tiered.native"]
    assert said == [(logging.INFO, native.describe(), native.loaded())]


def test_the_core_was_built_from_the_sources_beside_it() -> None:
    core = need_native()
    assert core.sources == native.source_digest() and len(core.sources) == 64


def test_a_core_built_from_other_sources_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install whose C sources changed after its build (a function
    added, an argument more) runs the Python path and says why, instead of
    failing at the first call of what changed."""
    need_native()
    here = Path(native.__file__).parent
    for path in [*here.glob("_native*.c"), *here.glob("_native*.h")]:
        (tmp_path / path.name).write_bytes(path.read_bytes())
    real = native.source_digest
    assert real(tmp_path) == real()  # the same files, the same digest
    (tmp_path / "_native.c").write_bytes((tmp_path / "_native.c").read_bytes() + b"\n/* changed */\n")
    monkeypatch.setattr(native, "source_digest", functools.partial(real, tmp_path))
    core, reason = native._load()
    assert core is None and "was built from other sources than tiered/_native*.c; rebuild it" in reason
    assert real(tmp_path / "nowhere") is None  # an installed package: no sources, nothing to compare
