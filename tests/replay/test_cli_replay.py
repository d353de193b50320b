"""``tiered replay``'s command line: which archived broker it serves, and
the addresses it refuses to advertise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replaykit import BROKER, CLUSTER, Raw, Replay, archive, write
from tiered.archive.storage import open_store
from tiered.cli import app

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory: pytest.TempPathFactory) -> str:
    base = tmp_path_factory.mktemp("two")
    write(base / "store", 0, 10)
    store = open_store(f"file://{base / 'cold'}")
    archive(base / "store", store, base / "state-a")
    archive(base / "store", store, base / "state-b", broker="broker-y")
    return f"file://{base / 'cold'}"


def invoke(*args: str):  # noqa: ANN201
    return CliRunner().invoke(app, ["replay", *args], env={"COLUMNS": "200"})


def test_one_broker_name_in_two_clusters_needs_one_named(two_brokers: str, tmp_path: Path) -> None:
    """A route names a broker once (every archived broker of the URL is
    served otherwise: tests/replay/test_multi_broker.py)."""
    base = Path(two_brokers.removeprefix("file://")).parent
    cold = tmp_path / "cold"
    archive(base / "store", open_store(f"file://{cold}"), tmp_path / "state-a")
    archive(base / "store", open_store(f"file://{cold}"), tmp_path / "state-b", cluster="OtherCluster")
    result = invoke("--cold", f"file://{cold}")
    assert result.exit_code == 1
    assert f"broker name(s) {BROKER} archived in several clusters" in result.output
    assert "choose one with --cluster and --broker" in result.output


def test_the_named_broker_is_the_one_served(two_brokers: str) -> None:
    with Replay(two_brokers, "--cluster", CLUSTER, "--broker", "broker-y") as replay:
        raw = Raw(replay.address)
        route = json.loads(raw.call(105, {"topic": "Orders"}).body)
        raw.close()
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-y"]


def test_a_broker_with_nothing_archived_is_refused(two_brokers: str) -> None:
    result = invoke("--cold", two_brokers, "--cluster", CLUSTER, "--broker", "nobody")
    assert result.exit_code == 1 and "nobody has no archived queue to replay" in result.output


@pytest.mark.parametrize("listen", ["0.0.0.0:9876", "[::]:9876", "localhost", "127.0.0.1:99999"])
def test_listen_addresses_clients_cannot_be_sent_to(two_brokers: str, listen: str) -> None:
    result = invoke("--cold", two_brokers, "--listen", listen)
    assert result.exit_code == 2 and "--listen" in result.output


def test_nothing_under_the_url(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = invoke("--cold", f"file://{tmp_path / 'empty'}")
    assert result.exit_code == 1


@pytest.mark.parametrize("host,warned", [("127.0.0.1", False), ("127.3.4.5", False), ("::1", False),
                                         ("localhost", False), ("10.1.2.3", True), ("replay.example", True),
                                         ("fe80::1", True)])
def test_a_listen_address_off_loopback_is_warned_about(host: str, warned: bool) -> None:
    from tiered.cli.replay import exposure_warning

    warning = exposure_warning(host)
    assert (warning is not None) == warned
    if warned:
        assert host in warning and "checks no credentials" in warning


@pytest.mark.parametrize("value", ["nogroup", "g=", "=latest", "g=yesterday", "../x=latest"])
def test_bad_start_values(two_brokers: str, value: str) -> None:
    result = invoke("--cold", two_brokers, "--broker", BROKER, "--cluster", CLUSTER, "--start", value)
    assert result.exit_code == 2 and "--start" in result.output


def test_where_a_group_without_a_committed_offset_starts(two_brokers: str) -> None:
    from datetime import datetime, timezone

    from replaykit import T0

    # Orders queue 0 holds messages 0, 3, 6, 9 stored at T0 + i seconds
    at = datetime.fromtimestamp((T0 + 3500) / 1000, tz=timezone.utc).isoformat()
    with Replay(two_brokers, "--cluster", CLUSTER, "--broker", BROKER, "--start", "late-g=latest",
                "--start", f"time-g={at}", "--start", "early-g=earliest", "--start", "client-g=client") as replay:
        raw = Raw(replay.address)

        def query(group: str) -> str:
            resp = raw.call(14, {"consumerGroup": group, "topic": "Orders", "queueId": "0"})
            assert resp.code == 0
            return resp.ext["offset"]

        assert [query(g) for g in ("late-g", "time-g", "early-g", "other-g")] == ["4", "2", "0", "0"]
        raw.call(15, {"consumerGroup": "late-g", "topic": "Orders", "queueId": "0", "commitOffset": "1"})
        assert query("late-g") == "1"  # a committed offset wins
        # client: "not found", so the client's consumeFromWhere decides (tests/replay/test_js_client.py)
        asked = {"consumerGroup": "client-g", "topic": "Orders", "queueId": "0"}
        assert raw.call(14, asked).code == 22
        raw.call(15, {**asked, "commitOffset": "3"})
        assert query("client-g") == "3"
        raw.close()


@pytest.mark.parametrize("value", ["x", "-1s", "10y"])
def test_bad_follow_intervals(two_brokers: str, value: str) -> None:
    result = invoke("--cold", two_brokers, "--broker", BROKER, "--cluster", CLUSTER, "--follow-interval", value)
    assert result.exit_code == 2 and "--follow-interval" in result.output


def test_a_fixed_snapshot_holds_a_suspended_pull_briefly(two_brokers: str) -> None:
    """--follow-interval 0: nothing can arrive, the pull is held as by a broker
    without long polling (shortPollingTimeMills) however long it asks."""
    with Replay(two_brokers, "--cluster", CLUSTER, "--broker", BROKER, "--follow-interval", "0") as replay:
        raw = Raw(replay.address)
        max_offset = raw.call(30, {"topic": "Orders", "queueId": "0"}).ext["offset"]
        held = raw.call(11, {"consumerGroup": "g", "topic": "Orders", "queueId": "0", "queueOffset": max_offset,
                             "maxMsgNums": "32", "sysFlag": "2", "suspendTimeoutMillis": "600000"})
        assert (held.code, held.remark) == (19, "OFFSET_OVERFLOW_ONE")  # answered within the socket's 15 s
        raw.close()


def test_healthz_fails_once_the_event_loop_stops_beating() -> None:
    from tiered.cli.replay import LIVENESS_S, Liveness

    now = [100.0]
    liveness = Liveness(lambda: now[0])
    assert liveness.alive() == (True, "ok")
    now[0] += LIVENESS_S + 1
    assert liveness.alive() == (False, f"event loop silent for {LIVENESS_S + 1:.0f}s")
