"""One clean pass: decide (a pure plan), then act.

A pass reads the retention policy (the broker's topics.json on local disk,
configuration), plans from the manifests cached in the ``ColdTier``, and
executes the plan. A pass in which nothing has expired, nothing is due for
merging or deferred deletion, and no orphan scan is due makes no
object-store request at all. The orphan scan (one LIST of the broker
prefix) runs on its own slower cadence, ``orphan_scan_interval``, and on the
first pass of a process.

The pass holds no state that matters for correctness: everything it decides
is re-derived from the manifests each time, so any interval (1 s or a day)
and any crash point is safe. The interval only bounds how late expired data
goes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tiered.cleaner.execute import Executor
from tiered.cleaner.orphans import collect_orphans
from tiered.cleaner.plan import CleanPlan, PlanOptions, make_plan
from tiered.cleaner.report import CleanReport
from tiered.cleaner.retention import RetentionPolicy, load_retention
from tiered.clock import Clock, SystemClock
from tiered.archive.coldtier import ColdTier
from tiered.config import CleanerSettings, RetentionSettings
from tiered.errors import ConfigError, CorruptRecordError, FencedError, ObjectNotFoundError
from tiered.archive.lease import LeaseManager
from tiered.store.localstore import LocalStore
from tiered.recorder import NullRecorder, Recorder

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CleanOptions(PlanOptions):
    orphan_scan_interval_ms: int = 6 * 3_600_000
    # how long a pass waits, after the other queues, for one the dispatcher holds
    lock_wait_ms: int = 120_000

    @classmethod
    def from_settings(cls, s: CleanerSettings) -> CleanOptions:
        return cls(
            skew_tolerance_ms=int(s.skew_tolerance * 1000), orphan_grace_ms=int(s.orphan_grace * 1000),
            merge=s.merge, merge_target_bytes=s.merge_target_bytes,
            merge_min_bytes=min(s.merge_min_bytes, s.merge_target_bytes),
            orphan_scan_interval_ms=int(s.orphan_scan_interval * 1000),
        )


class Cleaner:
    def __init__(
        self,
        cold: ColdTier,
        *,
        local: LocalStore | None = None,
        retention: RetentionSettings | None = None,
        options: CleanOptions | None = None,
        lease: LeaseManager | None = None,
        recorder: Recorder | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.cold = cold
        self.local = local
        self.retention = retention or RetentionSettings()
        self.options = options or CleanOptions()
        self.lease = lease
        self.recorder: Recorder = recorder or NullRecorder()
        self.clock = clock or SystemClock()
        self._last_orphan_scan_ms: int | None = None
        self._skew_seen: set[tuple[str, int, int, int, str]] = set()
        self._lease_checked = False

    # --- pieces ------------------------------------------------------------------

    def start(self, *, take_lease: bool = True) -> None:
        """Take the write lease (if any) and load the manifest cache. When the
        cleaner shares its ColdTier with a dispatcher, the dispatcher's start
        has done this already."""
        epoch = self.lease.acquire().epoch if self.lease is not None and take_lease else 0
        self.cold.load(epoch)

    def _before_write(self) -> None:
        """Before the first write of a pass, prove we still hold the lease (one
        GET); after that, renew only when due. Manifest commits are conditional
        anyway: this makes a fenced writer stop before it writes at all."""
        if self.lease is None:
            return
        if self._lease_checked:
            self.lease.ensure()
        else:
            self.lease.check()
            self._lease_checked = True

    def retention_policy(self) -> RetentionPolicy:
        """Re-read every pass: a changed reserve.time applies from the next pass.
        Without a store, the retention the dispatcher recorded in the catalog."""
        if self.local is not None:
            return load_retention(self.retention, self.local)
        try:
            recorded = self.cold.read_catalog().retention
        except ObjectNotFoundError:
            recorded = {}
        except CorruptRecordError as exc:
            raise ConfigError(f"cannot read the recorded retention ({exc}); expiring nothing") from None
        return load_retention(self.retention, None, recorded)

    def plan(self, now_ms: int | None = None, *, merge: bool | None = None) -> CleanPlan:
        """The plan for the cached manifests at ``now_ms``. Raises ConfigError
        when the broker's topics.json is unreadable."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        return make_plan(self.cold.manifests(), self.retention_policy().for_topic, now, self.options, merge=merge)

    def orphan_scan_due(self, now_ms: int) -> bool:
        last = self._last_orphan_scan_ms
        return last is None or now_ms - last >= self.options.orphan_scan_interval_ms

    # --- the pass ----------------------------------------------------------------

    def run_pass(self, *, dry_run: bool = False, orphans: bool | None = None, merge: bool | None = None,
                 topics: Callable[[str], bool] | None = None, last: bool = False) -> CleanReport:
        """One pass. ``orphans``: None = when due, True/False = force. ``merge``:
        None = as configured. ``topics``: only the topics it accepts (an
        operator's ``clean --topic``; orphans, of no topic, are then left).
        ``last``: no pass follows in this process (``tiered clean --once``),
        so the catalog is written now if the pass changed its ranges.
        Never raises for data or storage problems: they are logged, counted
        and returned in the report."""
        started = time.perf_counter()
        now = self.clock.now_ms()
        report = CleanReport(now, dry_run)
        self._lease_checked = False
        try:
            if not self.cold.loaded:
                self.start(take_lease=not dry_run)
            policy: RetentionPolicy | None = None
            try:
                policy = self.retention_policy()
                retention = policy.for_topic
            except ConfigError as exc:
                retention = None
                report.errors["retention"] = str(exc)
                log.error("retention unknown; nothing expires this pass", extra={"error": str(exc)})
            for (topic, qid), why in sorted(self.cold.broken.items()):
                if topics is not None and not topics(topic):
                    continue
                # its objects are never touched while its manifest cannot be read
                report.errors[f"{topic}/{qid}"] = f"manifest unreadable, queue left alone: {why}"
                self.recorder.queue_error("clean", topic, qid)
            manifests = self.cold.manifests()
            if topics is not None:
                manifests = {k: m for k, m in manifests.items() if topics(k[0])}
                orphans = False
            plan = make_plan(manifests, retention, now, self.options, merge=merge)
            report.plan = plan
            if policy is not None:
                for topic in sorted({t for t, _q in manifests if policy.for_topic(t) is None}):
                    report.retention_unknown[topic] = policy.unknown_reason(topic)
                    log.warning("retention of %s unknown; its archive is kept", topic, extra={"topic": topic})
            self._report_skew(plan)
            if not dry_run:
                Executor(self.cold, self.recorder, self.clock, orphan_grace_ms=self.options.orphan_grace_ms,
                         lock_wait_s=self.options.lock_wait_ms / 1000,
                         before_write=self._before_write).run(plan, report)
            if orphans if orphans is not None else self.orphan_scan_due(now):
                if not dry_run:
                    self._last_orphan_scan_ms = now
                collect_orphans(self.cold, self.clock.now_ms(), self.options.orphan_grace_ms, report,
                                self.recorder, dry_run=dry_run, before_write=self._before_write)
            if not dry_run:
                try:
                    # as the dispatcher does (tiered/archive/catalog.py): expiry and
                    # merges only raise what it says, so its ranges are refreshed
                    # at most every dispatch.catalog_refresh (or now, by the last pass)
                    self.cold.refresh_catalog(last=last)
                except FencedError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the catalog is a hint; the next pass writes it again
                    report.errors["_catalog.json"] = f"{type(exc).__name__}: {exc}"
        except FencedError as exc:
            report.fenced = str(exc)
            log.error("clean pass stopped: %s", exc)
        except Exception as exc:  # noqa: BLE001 - the job's edge: log, count, next pass retries
            report.errors["pass"] = f"{type(exc).__name__}: {exc}"
            log.exception("clean pass failed")
        finally:
            report.seconds = time.perf_counter() - started
            self.recorder.round_finished("clean", report.seconds, report.ok, self.clock.now_ms() / 1000)
        if report.committed or report.orphans or report.errors:
            log.info("clean pass done", extra={
                "expired_segments": report.expired_segments, "expired_bytes": report.expired_bytes,
                "merged_segments": report.merged_segments, "orphans": len(report.orphans),
                "busy": len(report.busy), "errors": len(report.errors), "dry_run": dry_run})
        return report

    def _report_skew(self, plan: CleanPlan) -> None:
        """Each skewed segment once per process: a counter and a log line."""
        for qp, sk in plan.skewed:
            s = sk.segment
            key = (qp.topic, qp.queue_id, s.q_start, s.q_end, sk.verdict.value)
            if key in self._skew_seen:
                continue
            self._skew_seen.add(key)
            self.recorder.skew_detected(qp.topic, qp.queue_id)
            log.warning("segment kept: its store timestamps are %s", "in the future" if sk.verdict.value == "future"
                        else "not real times", extra={
                            "topic": qp.topic, "queue": qp.queue_id, "offset": s.q_start, "end_offset": s.q_end,
                            "min_store_ms": s.min_store_ms, "max_store_ms": s.max_store_ms,
                            "now_ms": plan.now_ms})
