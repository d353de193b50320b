"""The cleaner on layout v2 archives: expiry deletes a prefix of segment
objects, a merge of v2 segments writes one v2 object that reads back the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from clean_support import BROKER, CLUSTER, Rig

from tiered.cleaner import CleanOptions
from tiered.archive import layout
from tiered.config import RetentionSettings
from tiered.archive.manifest import queue_prefix


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_merge_and_expiry_of_v2_segments(tmp_path: Path, cold_url: str, open_cold, compression: str) -> None:  # noqa: ANN001
    rig = Rig(tmp_path, store=open_cold(cold_url), upload_bytes=1, layout=2, compression=compression,
              retention=RetentionSettings(default_hours=1),
              options=CleanOptions(merge=True, merge_min_bytes=1 << 20, merge_target_bytes=4 << 20, merge_fanin=4,
                                   orphan_grace_ms=600_000))
    try:
        for _ in range(4):
            rig.produce("T", 0, 3)
            rig.dispatch()
            rig.advance(20)
        before = rig.manifest("T")
        assert len(before.segments) == 4 and {s.layout for s in before.segments} == {2}
        rep = rig.clean(orphans=False)
        assert rep.ok and rep.merged_segments == 4
        m = rig.manifest("T")
        (merged,) = m.segments
        assert merged.layout == 2 and (merged.q_start, merged.q_end) == (0, 12) and merged.bloom is None
        obj = merged.keys()[0]
        assert layout.compressed(obj) == (compression == "zstd") and "/segment/" in obj
        assert merged.stored_bytes == next(o.size for o in rig.objects.list_keys(obj))
        assert rig.archive("T") == rig.expected("T")
        # newer data, then the merged segment expires: only its object goes, the newer one stays
        rig.advance(2 * 3600)
        rig.produce("T", 0, 2)
        rig.dispatch()
        rep = rig.clean(orphans=False)
        assert rep.ok
        m = rig.manifest("T")
        assert [(s.q_start, s.q_end) for s in m.segments] == [(12, 14)] and m.first_offset == 12
        prefix = queue_prefix(CLUSTER, BROKER, "T", 0)
        left = sorted(o.key for o in rig.objects.list_keys(prefix + "/segment/"))
        # the merged-away originals wait for the deferred delete; the expired merged object is gone
        assert obj not in left and m.segments[0].keys()[0] in left
        assert rig.archive("T") == {q: v for q, v in rig.expected("T").items() if q >= 12}
    finally:
        rig.close()
