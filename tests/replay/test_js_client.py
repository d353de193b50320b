"""ali-ons (npm ``ali-ons@3.12.0``, a pure JavaScript 4.x client) against
``tiered replay``: a push consumer that starts from a timestamp.

ali-ons asks the broker for the group's offset; on "not found" it looks the
time up with SEARCH_OFFSET_BY_TIMESTAMP (29) and starts there. The driver,
``tests/replay/js/consume_from_time.js``, prints each message as a JSON
line. .ci/test installs ali-ons (``npm ci --prefix tests/replay/js``) and
sets TIERED_TEST_REQUIRE_JS=1, so there a missing install fails instead of
skipping.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from replaykit import T0, Archived, Replay

JS = Path(__file__).resolve().parent / "js"
DRIVER = JS / "consume_from_time.js"
pytestmark = pytest.mark.timeout(90, method="thread")


def _missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (JS / "node_modules" / "ali-ons" / "package.json").exists():
        return "ali-ons is not installed: npm ci --prefix tests/replay/js"
    return None


@pytest.fixture(scope="module", autouse=True)
def node() -> None:
    reason = _missing()
    if reason is not None:
        if os.environ.get("TIERED_TEST_REQUIRE_JS") == "1":
            pytest.fail(f"TIERED_TEST_REQUIRE_JS=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def replay(archived: Archived) -> Iterator[Replay]:
    with Replay(archived.cold_url, "--start", "js-from-time=client") as r:
        yield r


def consume(address: str, topic: str, group: str, timestamp: str, count: int) -> tuple[list[dict], dict]:
    """The messages ali-ons received, and its last line ({"done": n} or {"timeout": n})."""
    # ali-ons reads consumeTimestamp in the local time zone
    out = subprocess.run(["node", str(DRIVER), address, topic, group, timestamp, str(count)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "TZ": "UTC"}, cwd=JS)
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert out.returncode == 0 and lines, out.stderr
    return lines[:-1], lines[-1]


def seen(msgs: list[dict]) -> list[tuple]:
    return sorted((m["queueId"], m["queueOffset"], m["storeTimestamp"], m["tags"], base64.b64decode(m["body"]))
                  for m in msgs)


def test_ali_ons_from_a_timestamp_starts_at_the_first_record_stored_at_or_after_it(archived: Archived,
                                                                                  replay: Replay) -> None:
    # 2023-11-14 22:14:00 UTC is T0 + 40 s: message 40's store time exactly. RocketMQ 5.x's
    # lower boundary (the default) is the first offset stored at or after the time.
    since = T0 + 40_000
    want = [(e.queue_id, e.queue_offset, e.store_ms, e.tags, e.body)
            for (topic, _, _), e in archived.messages.items() if topic == "Orders" and e.store_ms >= since]
    assert len(want) == 20
    msgs, last = consume(replay.address, "Orders", "js-from-time", "20231114221400", len(want))
    assert last == {"done": len(want)}
    assert all(m["topic"] == "Orders" for m in msgs)
    assert seen(msgs) == sorted(want)


def test_without_client_start_a_new_group_starts_at_the_earliest_record(archived: Archived, replay: Replay) -> None:
    """Replay's default for a new group (the point of a replay) answers the
    offset query, so ali-ons' consumeTimestamp is not asked."""
    want = [(e.queue_id, e.queue_offset, e.store_ms, e.tags, e.body)
            for (topic, _, _), e in archived.messages.items() if topic == "Audit"]
    msgs, last = consume(replay.address, "Audit", "js-default", "20231114221400", len(want))
    assert last == {"done": len(want)}
    assert seen(msgs) == sorted(want)
