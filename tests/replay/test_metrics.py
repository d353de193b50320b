"""``tiered_replay_*`` metrics and the probes of a running replay."""

from __future__ import annotations

import struct
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from replaykit import make_archive, Raw, Replay, local_raw
from tiered.replay.frame import Command, encode

pytestmark = pytest.mark.timeout(120)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("tiered_replay_") and not s.name.endswith("_created")}


def test_requests_messages_bytes_connections_and_bad_frames_are_counted(tmp_path: Path) -> None:
    archived = make_archive(tmp_path)
    want = local_raw(archived.root, "Orders", 2)
    with Replay(archived.cold_url) as replay:
        assert urllib.request.urlopen(f"{replay.metrics_url}/healthz", timeout=10).status == 200
        raw = Raw(replay.address)
        assert raw.call(105, {"topic": "Orders"}).code == 0
        pull = {"consumerGroup": "g", "topic": "Orders", "queueId": "2", "maxMsgNums": "5", "sysFlag": "0"}
        found = raw.call(11, {**pull, "queueOffset": "0"})
        assert found.body == b"".join(want[:5])
        assert raw.call(11, {**pull, "queueOffset": str(len(want))}).code == 19
        assert raw.call(10, {"topic": "Orders"}).code == 16
        assert raw.call(36, {"group": "g", "offset": "0", "delayLevel": "0"}).code == 16
        raw.send(encode(Command(code=15, opaque=9, flag=2, ext={"consumerGroup": "g", "topic": "Orders",
                                                                  "queueId": "0", "commitOffset": "1"})))
        assert raw.call(9999).code == 3
        bad = Raw(replay.address)
        bad.send(struct.pack(">i", -1))
        assert bad.closed()
        bad.close()
        got = scrape(replay.metrics_url)
        raw.close()
    assert got == {
        ("tiered_replay_connections", ()): 1.0,
        ("tiered_replay_bad_frames_total", ()): 1.0,
        ("tiered_replay_requests_total", (("outcome", "success"), ("request", "route"))): 1.0,
        ("tiered_replay_requests_total", (("outcome", "success"), ("request", "pull"))): 1.0,
        ("tiered_replay_requests_total", (("outcome", "not_found"), ("request", "pull"))): 1.0,
        ("tiered_replay_requests_total", (("outcome", "no_permission"), ("request", "send"))): 1.0,
        ("tiered_replay_requests_total", (("outcome", "no_permission"), ("request", "send_back"))): 1.0,
        ("tiered_replay_requests_total", (("outcome", "success"), ("request", "update_offset"))): 1.0,
        ("tiered_replay_requests_total", (("outcome", "not_supported"), ("request", "other"))): 1.0,
        ("tiered_replay_messages_total", ()): 5.0,
        ("tiered_replay_bytes_total", ()): float(sum(map(len, want[:5]))),
        ("tiered_replay_held_pulls", ()): 0.0,
        ("tiered_replay_refused_connections_total", ()): 0.0,
        # the one-way commit of offset 1 on queue 0: the rest of that queue is behind
        ("tiered_replay_group_lag_messages", (("group", "g"), ("topic", "Orders"))):
            float(len(local_raw(archived.root, "Orders", 0)) - 1),
    }
