"""``--acl`` reloaded when the file changes, as the broker's AclFileWatchService
reloads ``plain_acl.yml``; a file that no longer parses keeps the rules read
before it."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from replaykit import Archived, Raw, Replay
from tiered.errors import AclFileError, BadRequestError
from tiered.replay import protocol as p
from tiered.replay.acl import sign
from tiered.replay.aclfile import REJECTED, RELOADED, WATCH_S, AclFile, watch
from tiered.replay.frame import Command

pytestmark = pytest.mark.timeout(120)

READER, READER_SECRET = "replayReader", "s3cretValue42"
OTHER, OTHER_SECRET = "otherReader", "otherSecret43"
BASE = f"""
accounts:
  - accessKey: {READER}
    secretKey: {READER_SECRET}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [Orders=SUB]
"""
WITH_OTHER = BASE + f"""
  - accessKey: {OTHER}
    secretKey: {OTHER_SECRET}
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
"""


def _pull(access: str, secret: str, topic: str = "Orders") -> Command:
    ext = {"consumerGroup": "g", "topic": topic, "queueId": "0", "queueOffset": "0", "maxMsgNums": "1",
           "sysFlag": "0"}
    return Command(code=p.PULL_MESSAGE, ext=sign(ext, b"", access, secret))


def _refusal(acl: AclFile, cmd: Command) -> str | None:
    """None when ``cmd`` may run, else the reason it is refused."""
    try:
        acl.check(cmd, "127.0.0.1")
        return None
    except BadRequestError as exc:
        assert exc.code == p.NO_PERMISSION
        return str(exc)


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(BASE)
    acl = AclFile(path)
    assert acl.reload_if_changed() is None  # nothing changed: nothing parsed, nothing counted
    assert _refusal(acl, _pull(OTHER, OTHER_SECRET)) == f"No acl config for {OTHER}"
    path.write_text(WITH_OTHER)  # a new account
    assert acl.reload_if_changed() == RELOADED
    assert _refusal(acl, _pull(OTHER, OTHER_SECRET)) is None
    assert acl.reload_if_changed() is None
    path.write_text(BASE)  # the account revoked
    assert acl.reload_if_changed() == RELOADED
    assert _refusal(acl, _pull(OTHER, OTHER_SECRET)) == f"No acl config for {OTHER}"
    assert _refusal(acl, _pull(READER, READER_SECRET)) is None
    path.write_text(BASE.replace("Orders=SUB", "Orders=DENY"))  # a topic denied
    assert acl.reload_if_changed() == RELOADED
    assert _refusal(acl, _pull(READER, READER_SECRET)) == "No permission for topic:Orders"


@pytest.mark.parametrize(("broken", "reason"), [
    (BASE + "  - [\n", "ParserError"),
    (BASE.replace("topicPerms: [Orders=SUB]", "topicPerms: [Orders]"), "topicPerms entry 'Orders'"),
    (BASE + "    whiteRemoteAddress: 1050::*\n", "whiteRemoteAddress '1050::*'"),
    (BASE.replace(f"accessKey: {READER}", "accessKey: short"), "accessKey must be longer"),
    ("", "no data"),  # RocketMQ skips an empty file it reloads, keeping what it had
    (None, "FileNotFoundError"),  # gone, perhaps for a moment while it is replaced
])
def test_a_broken_file_keeps_the_old_rules(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                           broken: str | None, reason: str) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(WITH_OTHER)
    acl = AclFile(path)
    caplog.set_level(logging.INFO, logger="tiered.replay.aclfile")
    if broken is None:
        path.unlink()
    else:
        path.write_text(broken)
    assert acl.reload_if_changed() == REJECTED
    assert _refusal(acl, _pull(OTHER, OTHER_SECRET)) is None  # the rules read before still apply
    assert _refusal(acl, _pull(READER, READER_SECRET)) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"--acl {path}: " in warnings[0] and reason in warnings[0]
    assert READER_SECRET not in warnings[0] and OTHER_SECRET not in warnings[0]
    assert acl.reload_if_changed() is None  # the same broken file is reported once
    path.write_text(BASE)
    assert acl.reload_if_changed() == RELOADED
    assert _refusal(acl, _pull(OTHER, OTHER_SECRET)) == f"No acl config for {OTHER}"


def test_an_unusable_file_at_start_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    with pytest.raises(AclFileError) as info:
        AclFile(path)
    assert (info.value.path, info.value.reason) == (str(path), "FileNotFoundError")


def test_the_watch_reloads_on_its_timer_and_counts_outcomes(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(BASE)
    acl = AclFile(path)
    outcomes: list[str] = []
    # each sleep of the watch makes the next change, then the watch reads the file
    changes: list[Callable[[], object]] = [lambda: path.write_text(WITH_OTHER), lambda: None,
                                           lambda: path.write_text("accounts: 5\n"), lambda: path.write_text(BASE)]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if not changes:
            raise asyncio.CancelledError
        changes.pop(0)()

    async def run(fn: Callable[[], str | None]) -> str | None:
        return fn()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(watch(acl, run, outcomes.append, sleep=sleep))
    assert outcomes == [RELOADED, REJECTED, RELOADED]
    assert slept == [WATCH_S] * 5


def test_a_failing_reload_does_not_stop_the_watch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(BASE)
    acl = AclFile(path)
    calls: list[int] = []

    async def sleep(seconds: float) -> None:
        if len(calls) == 2:
            raise asyncio.CancelledError

    def run(fn: Callable[[], str | None]) -> Awaitable[str | None]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        path.write_text(WITH_OTHER)

        async def done() -> str | None:
            return fn()
        return done()

    outcomes: list[str] = []
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(watch(acl, run, outcomes.append, sleep=sleep))
    assert outcomes == [RELOADED] and "not reloaded" in caplog.text


# --- end to end: the running server sees the change ------------------------------------------------------


def _counted(metrics_url: str, outcome: str) -> bool:
    text = urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10).read().decode()
    return f'tiered_replay_acl_reloads_total{{outcome="{outcome}"}} 1.0' in text


def _until(what: Callable[[], bool]) -> None:
    """Wait for ``what`` (the watch reads the file every WATCH_S)."""
    deadline = time.monotonic() + 6 * WATCH_S
    while not what():
        assert time.monotonic() < deadline, "not seen"
        time.sleep(0.2)


def test_the_server_serves_a_changed_file_and_keeps_serving_a_broken_one(archived: Archived, tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(BASE)
    with Replay(archived.cold_url, "--acl", str(path)) as replay:
        raw = Raw(replay.address)
        try:
            def code(access: str, secret: str, topic: str = "Orders") -> int:
                return int(raw.call(p.PULL_MESSAGE, _pull(access, secret, topic).ext).code)

            assert code(OTHER, OTHER_SECRET, "Audit") == p.NO_PERMISSION
            path.write_text(WITH_OTHER)
            _until(lambda: code(OTHER, OTHER_SECRET, "Audit") == p.SUCCESS)
            assert _counted(replay.metrics_url, "reloaded")
            path.write_text(WITH_OTHER + "  - [\n")
            _until(lambda: _counted(replay.metrics_url, "rejected"))
            assert code(OTHER, OTHER_SECRET, "Audit") == p.SUCCESS  # the old rules stay
            assert code(READER, READER_SECRET, "Audit") == p.NO_PERMISSION
        finally:
            raw.close()
    warned = [line for line in replay.lines if "ACL file not reloaded" in line]
    assert len(warned) == 1 and str(path) in warned[0] and "ParserError" in warned[0]
    assert not [line for line in replay.lines if READER_SECRET in line or OTHER_SECRET in line]


def test_a_directory_of_acl_files_is_merged_as_the_broker_merges_conf_acl(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Every .yml/.yaml under the directory (PlainPermissionManager.getAllAclFiles):
    accounts of all, a repeated access key from the first file only, an empty
    file skipped; a Kubernetes Secret volume's dot-named copies not read twice."""
    acl_dir = tmp_path / "acl"
    (acl_dir / "team").mkdir(parents=True)
    (acl_dir / "a.yml").write_text(BASE)
    (acl_dir / "team" / "b.yaml").write_text(f"""
globalWhiteRemoteAddresses: ["10.1.2.*"]
accounts:
  - accessKey: {OTHER}
    secretKey: {OTHER_SECRET}
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: {READER}
    secretKey: not-the-first-files-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
""")
    (acl_dir / "empty.yml").write_text("")
    (acl_dir / "notes.txt").write_text("not an ACL file")
    (acl_dir / "..data").mkdir()  # a Secret volume's real files; the names above link into it
    (acl_dir / "..data" / "a.yml").write_text(WITH_OTHER.replace(OTHER_SECRET, "stale"))
    with caplog.at_level(logging.WARNING, logger="tiered.replay.aclfile"):
        acl = AclFile(acl_dir)
    assert sorted(acl.acl.accounts) == [OTHER, READER]
    assert _refusal(acl, _pull(READER, READER_SECRET, topic="Other")) == "No default permission for topic:Other"  # a.yml's
    assert _refusal(acl, _pull(OTHER, OTHER_SECRET, topic="Other")) is None  # b.yaml's
    white = Command(code=p.PULL_MESSAGE, ext={"consumerGroup": "g", "topic": "Orders", "queueId": "0"})
    assert _refusal(acl, white) is not None
    acl.check(white, "10.1.2.9")  # b.yaml's global white address: no credentials needed
    logged = caplog.text
    assert "repeated" in logged and "empty.yml has no data" in logged
    assert "not-the-first-files-secret" not in logged and READER_SECRET not in logged

    assert acl.reload_if_changed() is None
    (acl_dir / "c.yml").write_text(BASE.replace(READER, "thirdReader"))  # a new file is a change
    assert acl.reload_if_changed() == RELOADED and "thirdReader" in acl.acl.accounts
    (acl_dir / "team" / "b.yaml").write_text("accounts: [\n")  # one broken file keeps every rule before
    assert acl.reload_if_changed() == REJECTED and OTHER in acl.acl.accounts
    (acl_dir / "team" / "b.yaml").unlink()
    assert acl.reload_if_changed() == RELOADED and OTHER not in acl.acl.accounts
