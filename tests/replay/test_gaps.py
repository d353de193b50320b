"""Replay of a queue whose archive has a recorded gap and an expired first
segment, on file:// and on the S3 server: the C++ client gets every record
the archive holds, the pull statuses move it past what is gone."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dispatchkit import BROKER, CLUSTER, expire_below, new_dispatcher, new_writer, produce
from replaykit import Raw, Replay
from tiered.archive.coldtier import ColdTier
from tiered.clock import ManualClock
from tiered.query.reader import Archive, QueueRef
from tiered.store.localstore import LocalStore

rocketmq = pytest.importorskip("rocketmq.client", reason="the RocketMQ C++ client wheel (x86_64 Linux)")

pytestmark = pytest.mark.timeout(120, method="thread")


def gapped_archive(store, tmp_path: Path) -> tuple[dict[int, tuple[bytes, int]], int, tuple[int, int]]:  # noqa: ANN001
    """(offset -> (body, size) of every record the archive holds, first kept offset,
    the gap) of queue Gapped/0: the broker deleted records before they were
    archived, then the cleaner expired the first segment."""
    sd = tmp_path / "gstore"
    clock = ManualClock(1_700_000_000_000)
    w = new_writer(sd)
    produce(w, "Gapped", 0, 40, clock=clock, body_size=300)
    d = new_dispatcher(store, LocalStore(sd), tmp_path / "gstate", clock, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=4000)
    assert d.run_round().ok
    ref = QueueRef(CLUSTER, BROKER, "Gapped", 0)
    archived_to = Archive(store).manifest(ref).next_offset
    for step in range(20):
        produce(w, "Gapped", 0, 20, clock=clock, body_size=300, seed=step)
    w.flush()
    snapshot = {i.queue_offset: (i.record.body_bytes(), i.record.size) for i in LocalStore(sd).iter_queue("Gapped", 0, 0)}
    expire_below(sd, sorted(int(f.name) for f in (sd / "commitlog").iterdir())[3])
    assert d.run_round().ok
    w.close()
    m = Archive(store).manifest(ref)
    (gap,) = m.gaps
    assert gap.q_start == archived_to  # the records never archived
    first = m.segments[0]
    ColdTier(store, CLUSTER, BROKER).commit("Gapped", 0, lambda cur: replace(cur, segments=cur.segments[1:]))
    kept = {o: b for o, b in snapshot.items() if not gap.q_start <= o < gap.q_end and not first.q_start <= o < first.q_end}
    return kept, first.q_end, (gap.q_start, gap.q_end)


def test_gaps_and_expired_segments_are_stepped_over(cold_url: str, open_cold, tmp_path: Path,  # noqa: ANN001
                                                    request: pytest.FixtureRequest) -> None:
    kept, first_kept, (gap_start, gap_end) = gapped_archive(open_cold(cold_url), tmp_path)
    assert first_kept < gap_start  # the gap lies inside what is kept
    env = {"TIERED_S3__ENDPOINT_URL": request.getfixturevalue("moto_endpoint")} if cold_url.startswith("s3") else {}
    with Replay(cold_url, env=env) as replay:
        raw = Raw(replay.address)
        assert raw.call(31, {"topic": "Gapped", "queueId": "0"}).ext["offset"] == str(first_kept)
        ext = {"consumerGroup": "g", "topic": "Gapped", "queueId": "0", "maxMsgNums": "4", "sysFlag": "0"}
        moved = raw.call(11, {**ext, "queueOffset": "0"})
        assert (moved.code, moved.remark, moved.ext["nextBeginOffset"]) == (21, "OFFSET_TOO_SMALL", str(first_kept))
        inside = raw.call(11, {**ext, "queueOffset": str(gap_start + 1)})
        assert inside.code == 0 and int(inside.ext["nextBeginOffset"]) == gap_end + 4
        raw.close()

        consumer = rocketmq.PullConsumer("gap-g")
        consumer.offset_table = {}
        consumer.set_namesrv_addr(replay.address)
        consumer.start()
        try:
            got = {m.queue_offset: (m.body, m.store_size) for m in consumer.pull("Gapped")}
        finally:
            consumer.shutdown()
    # the Python wrapper reads a body as a C string: it ends at the first NUL byte
    assert got == {o: (body.split(b"\0", 1)[0], size) for o, (body, size) in kept.items()}
