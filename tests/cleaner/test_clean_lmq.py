"""The cleaner over an LMQ queue (a store writer's multi-dispatch): its
segments of copies merge as any queue's, and it expires on its own retention."""

from __future__ import annotations

from pathlib import Path

from clean_support import Rig

from tiered.cleaner import CleanOptions
from tiered.config import RetentionSettings

ROOM = "%LMQ%room"


def _round(rig: Rig, n: int) -> None:
    for _ in range(n):
        stamp = rig.clock.now_ms()
        rig.writer.put_multi("Chat", 0, b"hello " * 8, [ROOM], keys=["k"], store_timestamp=stamp,
                             born_timestamp=stamp)
    rig.dispatch()
    rig.advance(20)


def test_lmq_segments_merge_and_expire_on_their_own(tmp_path: Path) -> None:
    rig = Rig(tmp_path, options=CleanOptions(merge=True, merge_min_bytes=1 << 20, merge_target_bytes=4 << 20,
                                             merge_fanin=4, orphan_grace_ms=600_000),
              retention=RetentionSettings(default_hours=24, topics={ROOM: 1}))
    for _ in range(6):
        _round(rig, 3)
    assert len(rig.manifest(ROOM).segments) == 6
    parent = rig.archive("Chat")
    rep = rig.clean(orphans=False)
    assert rep.ok, rep.errors
    assert [(s.q_start, s.q_end) for s in rig.manifest(ROOM).segments] == [(0, 18)]
    # the merged LMQ segment holds the parent's records, byte for byte, at the LMQ offsets
    assert rig.archive(ROOM) == parent and len(parent) == 18
    rig.advance(2 * 3600)
    rep = rig.clean(orphans=False)
    assert rep.ok and rig.manifest(ROOM).segments == () and rig.manifest(ROOM).next_offset == 18
    assert rig.archive("Chat") == parent  # the parent keeps its own (24 h) retention
    rig.close()
