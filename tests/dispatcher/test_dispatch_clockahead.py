"""A broker whose clock runs ahead of ours delays an age-triggered upload by
at most max_delay, instead of until its own future timestamps come due."""

from __future__ import annotations

from pathlib import Path

from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions
from tiered.clock import ManualClock
from tiered.archive.coldtier import ColdTier
from tiered.store.localstore import LocalStore
from tiered.archive.storage import open_store


def test_future_stamped_messages_are_uploaded_after_max_delay(tmp_path: Path, store_writer) -> None:  # noqa: ANN001
    clock = ManualClock(1_700_000_000_000)
    with store_writer(cq_entries_per_file=100) as w:
        for i in range(5):  # the broker's clock is a day ahead
            w.put("Ahead", 0, b"x" * 10, store_timestamp=clock.now_ms() + 86_400_000 + i)
    cold = ColdTier(open_store(str(tmp_path / "cold")), "C", "b", state_dir=tmp_path / "state", clock=clock)
    d = Dispatcher(LocalStore(tmp_path / "store"), cold, clock=clock,
                   options=DispatchOptions(archive=ArchiveOptions(upload_bytes=1 << 30, max_delay_ms=60_000),
                                           parallelism=1))
    assert d.run_round().messages == 0  # first seen now: not due yet
    clock.advance(59)
    assert d.run_round().messages == 0
    clock.advance(1)
    assert d.run_round().messages == 5  # due a max_delay after we first saw it, not a day later
    assert cold.cached("Ahead", 0).next_offset == 5
