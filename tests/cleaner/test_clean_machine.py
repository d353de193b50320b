"""A hypothesis state machine over produce / dispatch / clean (with merges) /
advance the clock / broker local expiry / crash at any storage request and
restart, asserting the invariants of docs/design.md section 5 after every step:

1. every queue's archive holds exactly the broker's records, in order,
   byte-identical, no duplicate, no hole except a recorded gap, and a gap
   only where the broker lost the data before it was archived;
2./3. a crash at any request followed by a restart loses nothing and
   duplicates nothing; archiving resumes from the first uncommitted offset;
4. the cleaner never deletes data younger than its retention, never leaves
   a manifest naming a missing object, never loses a queue's progress; a
   reader of a superseded manifest finds its objects until their deferred
   deletion is due.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from clean_support import BROKER, CLUSTER, PREFIX, Rig, read_archive
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tiered.cleaner import CleanOptions
from tiered.clock import ManualClock
from tiered.archive.coldtier import ColdTier
from tiered.config import RetentionSettings
from tiered.archive.manifest import Manifest

QUEUES = (("A", 0), ("B", 0), ("B", 1))
CL_FILE = 8192


class Crash(BaseException):
    """kill -9: not an Exception, so no handler in the code under test sees it."""


class CleanMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="clean-machine-"))
        # real time, so object mtimes (the store's clock) and the sim clock agree on orphan ages
        self.clock = ManualClock(time.time_ns() // 1_000_000)
        self.rig = Rig(
            self.tmp, clock=self.clock, commitlog_file_size=CL_FILE, upload_bytes=1,
            retention=RetentionSettings(default_hours=1),
            options=CleanOptions(merge=True, merge_min_bytes=4096, merge_target_bytes=8192, merge_fanin=2,
                                 orphan_grace_ms=600_000, orphan_scan_interval_ms=1_800_000,
                                 skew_tolerance_ms=300_000),
        )
        self.rig.writer.set_topic_attribute("A", "reserve.time", "2")
        self._install_faults()
        self.fault: tuple[int, str] | None = None
        self.requests = 0
        self.lost: dict[tuple[str, int], set[int]] = {}
        self.seen_next: dict[tuple[str, int], int] = {}

    def teardown(self) -> None:
        self.rig.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- crash injection at the storage interface ---------------------------------

    def _install_faults(self) -> None:
        store = self.rig.objects
        for name in ("_raw_get", "_raw_get_etag", "_raw_put", "_raw_put_if", "_raw_head", "_raw_list",
                     "_raw_delete"):
            inner = getattr(store, name)

            def wrapped(*a, _inner=inner, **k):  # noqa: ANN002, ANN003, ANN202
                self._tick("before")
                out = _inner(*a, **k)
                self._tick("after")
                return out

            setattr(store, name, wrapped)

    def _tick(self, when: str) -> None:
        if self.fault is None:
            return
        if when == "before":
            self.requests += 1
        n, at = self.fault
        if self.requests == n and at == when:
            self.fault = None
            raise Crash

    # --- rules ---------------------------------------------------------------------------

    @rule(queue=st.sampled_from(QUEUES), n=st.integers(1, 6))
    def produce(self, queue: tuple[str, int], n: int) -> None:
        self.rig.produce(*queue, n, body=os.urandom(40))

    @rule(queue=st.sampled_from(QUEUES), n=st.integers(1, 4))
    def produce_and_dispatch(self, queue: tuple[str, int], n: int) -> None:
        self.rig.produce(*queue, n, body=os.urandom(40))
        self.dispatch()

    @rule(queue=st.sampled_from(QUEUES), hours=st.sampled_from([1, 30]))
    def produce_future_stamped(self, queue: tuple[str, int], hours: int) -> None:
        self.rig.produce(*queue, 1, ts=self.clock.now_ms() + hours * 3_600_000)

    @rule()
    def dispatch(self) -> None:
        result = self.rig.dispatch()
        if result.gaps:
            event("dispatch recorded a gap")
        if result.ok and not self.rig.dispatcher._failures:
            for (topic, qid), produced in self.rig.produced.items():
                m = self.rig.cold.cached(topic, qid)
                assert m is not None and m.next_offset == max(produced) + 1, (topic, qid, m, result)

    @rule(merge=st.booleans(), orphans=st.sampled_from([None, True]), dry_run=st.booleans())
    def clean(self, merge: bool, orphans: bool | None, dry_run: bool) -> None:
        before = sorted(o.key for o in self.rig.objects.list_keys(PREFIX + "/")) if dry_run else None
        report = self.rig.clean(merge=merge, orphans=orphans, dry_run=dry_run)
        assert report.fenced is None
        assert not {k: v for k, v in report.errors.items() if "Crash" in v}
        for what, n in (("expired", report.expired_segments), ("merged", report.merged_segments),
                        ("collected orphans", len(report.orphans)), ("pending deleted", report.deleted_objects)):
            if n and not dry_run:
                event(f"clean {what}")
        if dry_run:
            assert sorted(o.key for o in self.rig.objects.list_keys(PREFIX + "/")) == before, "a dry run changed the bucket"

    @rule(seconds=st.sampled_from([1, 20, 60, 700, 1800, 3600, 7200]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(hours=st.sampled_from([0.25, 1, 2, 3]), merge=st.booleans())
    def age_then_clean(self, hours: float, merge: bool) -> None:
        self.clock.advance(hours * 3600)
        self.clean(merge=merge, orphans=True, dry_run=False)

    @precondition(lambda self: len(self._commitlog_files()) >= 2)
    @rule()
    def broker_deletes_oldest_commitlog(self) -> None:
        files = self._commitlog_files()
        oldest = files[0]
        start = int(oldest.name)
        for key, phys in self.rig.physical.items():
            self.lost.setdefault(key, set()).update(o for o, p in phys.items() if start <= p < start + CL_FILE)
        oldest.unlink()

    @rule(job=st.sampled_from(["dispatch", "clean", "clean_merge", "none"]), n=st.integers(1, 12),
          at=st.sampled_from(["before", "after"]), lose_cache=st.booleans())
    def crash_and_restart(self, job: str, n: int, at: str, lose_cache: bool) -> None:
        self.fault, self.requests = (n, at), 0
        try:
            if job == "dispatch":
                self.rig.dispatch()
            elif job == "clean":
                self.rig.clean(merge=False, orphans=True)
            elif job == "clean_merge":
                self.rig.clean(merge=True)
        except Crash:
            event(f"crashed during {job}")
        self.fault = None
        self.rig.restart(lose_cache=lose_cache)

    def _commitlog_files(self) -> list[Path]:
        d = self.tmp / "store" / "commitlog"
        files = sorted(p for p in d.iterdir() if p.name.isdigit())
        return files[:-1] + files[-1:] if files else []

    # --- invariants (docs/design.md section 5) --------------------------------------------

    @invariant()
    def archive_is_exact_and_retention_respected(self) -> None:
        reader = ColdTier(self.rig.objects, CLUSTER, BROKER, clock=self.clock)
        reader.rebuild(use_catalog=False)
        manifests = reader.manifests()
        now = self.clock.now_ms()
        policy = self.rig.cleaner.retention_policy()
        for key, last in self.seen_next.items():
            m = manifests.get(key)
            assert m is not None, f"{key}: the manifest disappeared"
            assert m.next_offset >= last, f"{key}: progress went back {last} -> {m.next_offset}"
        for (topic, qid), m in manifests.items():
            self.seen_next[(topic, qid)] = m.next_offset
            self._check_queue(m, now, policy.for_topic(topic).ms)

    def _check_queue(self, m: Manifest, now: int, retention_ms: int) -> None:
        key = (m.topic, m.queue_id)
        m.check()  # segments and gaps tile [first, next) contiguously
        produced = self.rig.produced.get(key, {})
        archive = read_archive(self.rig.objects, m)  # every named object exists, CRCs hold
        for off, raw in archive.items():
            assert off in produced and produced[off][0] == raw, f"{key} offset {off} differs from the broker"
        gapped = {o for g in m.gaps for o in range(g.q_start, g.q_end)}
        lost = self.lost.get(key, set())
        assert gapped <= lost, f"{key}: gap over data the broker still had: {sorted(gapped - lost)[:5]}"
        for off, (_raw, ts) in produced.items():
            if off >= m.next_offset or off in gapped:
                continue
            if ts >= now - retention_ms and off >= m.first_offset:
                assert off in archive, f"{key}: offset {off} (young) is missing"
            if ts >= now - retention_ms and off not in lost:
                # young data the broker still has is archived and still there
                assert off in archive, f"{key}: young offset {off} deleted or skipped"
        for p in m.pending_deletes:
            if p.after_ms > now:
                for k in p.keys:
                    assert self.rig.objects.head(k) is not None, f"{k} deleted before its grace period"


CleanMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_clean_machine = CleanMachine.TestCase
