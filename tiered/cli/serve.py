"""``tiered serve``: the dispatcher and the cleaner in one process, one HTTP port.

The sidecar composes the parts once: one ObjectStore (so every request is
counted once), one ColdTier (so the dispatcher and the cleaner share one
manifest cache and one per-queue lock), one lease, one PrometheusRecorder.

Health: ``/healthz`` (liveness) answers 200 while the scheduler loop beats
(a heartbeat job on an executor of its own, so a long round cannot delay
it), 503 once the last beat is older than ``LIVENESS_INTERVALS`` dispatch
intervals. It never asks the object store, the lease or the store: those
problems are metrics (``tiered_object_store_up``, ``tiered_lease_held``,
``tiered_queue_stuck``), because a probe failing on them would take the
broker's pod out of service or restart a sidecar that a restart cannot
help. ``/readyz`` says whether this sidecar can write, for standalone use.

Shutdown (SIGTERM/SIGINT): stop scheduling, let the running round finish
for up to ``shutdown_timeout``, then leave. Nothing is ever half-committed:
a manifest write is the commit and is atomic, so an upload abandoned at the
deadline leaves at worst an orphan object, collected later.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor as APThreadPool
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from tiered.metrics import MetricsServer, PrometheusRecorder
from tiered.cli.app import app, fail
from tiered.cli.common import BrokerModeOpt, BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, StoreOpt, settings_from
from tiered.cli.wiring import cold_tier, lease, make_cleaner, make_dispatcher, object_store, setup_logging
from tiered.clock import Clock, SystemClock
from tiered.config import Settings
from tiered.store.consumeroffsets import ConsumerPosition, archived_ranges, store_positions
from tiered.errors import TieredError
from tiered.store.localstore import LocalStore

log = logging.getLogger("tiered.serve")

#: The scheduler is dead once its heartbeat is older than this many dispatch intervals.
LIVENESS_INTERVALS = 3
#: ... but never less than this, so a sub-second test interval does not flap.
LIVENESS_MIN_S = 30.0
#: Seconds between heartbeats at most (a long dispatch interval still beats often).
HEARTBEAT_MAX_S = 5.0
#: Seconds between object-store probes at least (one HEAD of the lease object).
PROBE_MIN_S = 10.0


class Sidecar:
    def __init__(self, settings: Settings, *, clock: Clock | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        if settings.store is None:
            raise TieredError("store: required (--store DIR)")
        self.settings = settings
        self.clock = clock or SystemClock()
        self.registry = registry or CollectorRegistry()
        self.recorder = PrometheusRecorder(self.registry, per_queue=settings.metrics.per_queue)
        self.store = object_store(settings, self.recorder)
        self.local = LocalStore(settings.store, broker_mode=settings.broker_mode)
        # tiered_consumer_offset_in_archive_only is computed at scrape time, from its own
        # LocalStore: the dispatcher's is used by the job thread only
        self._positions_local = LocalStore(settings.store, broker_mode=settings.broker_mode)
        self._positions_lock = threading.Lock()
        self.recorder.consumers.source = self.consumer_positions
        self.cold = cold_tier(settings, self.store, writer=True, clock=self.clock, recorder=self.recorder)
        self.lease = lease(settings, self.store, self.clock)
        self.dispatcher = make_dispatcher(settings, self.local, self.recorder, self.clock, store=self.store,
                                          cold=self.cold, lease_manager=self.lease)
        self.cleaner = make_cleaner(settings, self.cold, self.local, lease_manager=self.lease,
                                    recorder=self.recorder, clock=self.clock)
        # The heartbeat and the probe run on executors of their own: a round
        # or a probe hanging on the object store never delays the heartbeat.
        self.scheduler = BackgroundScheduler(
            executors={"default": APThreadPool(2), "heartbeat": APThreadPool(1), "probe": APThreadPool(1)},
            timezone="UTC")
        self.scheduler.add_listener(self._job_event, EVENT_JOB_ERROR | EVENT_JOB_MISSED)
        self.server = MetricsServer(self.registry, host=settings.metrics.host, port=settings.metrics.port,
                                    ready=self.ready, alive=self.alive)
        self._started = threading.Event()
        self._start_error: str | None = "not started"
        self._last_round_error: str | None = None
        self._busy = threading.Lock()
        self._beat: float | None = None  # monotonic time of the scheduler's last heartbeat
        self._created = self.clock.monotonic()
        self._lease_held = False
        self.liveness_s = max(LIVENESS_MIN_S, LIVENESS_INTERVALS * settings.dispatch.interval)

    # --- health --------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        """Ready when the store is readable, the cold tier answered (lease taken,
        manifest cache loaded) and this sidecar still holds the write lease."""
        store = self.settings.store
        if store is None or not os.access(store / "consumequeue", os.R_OK):
            return False, "store not readable"
        if self._start_error is not None:
            return False, f"cold tier not ready: {self._start_error}"
        if not self.cold.loaded:
            return False, "manifest cache not loaded"
        if self._last_round_error is not None:
            return False, f"not writing: {self._last_round_error}"
        return True, "ready"

    def alive(self) -> tuple[bool, str]:
        """Liveness: the scheduler loop beat within ``liveness_s`` (counted
        from creation until the first beat)."""
        last = self._beat if self._beat is not None else self._created
        age = self.clock.monotonic() - last
        if age > self.liveness_s:
            return False, f"scheduler stalled: no heartbeat for {age:.0f}s (limit {self.liveness_s:.0f}s)"
        return True, "alive" if self._beat is not None else "starting"

    def consumer_positions(self) -> list[ConsumerPosition]:
        """Committed consumer offsets against the local store and the cached manifests."""
        with self._positions_lock:
            self._positions_local.refresh()
            return store_positions(self._positions_local, archived_ranges(self.cold.manifests()))

    def heartbeat(self) -> None:
        self._beat = self.clock.monotonic()

    def probe_store(self) -> None:
        """One cheap request (HEAD of the lease object) so that
        ``tiered_object_store_up`` is fresh even when nothing else asks; its
        outcome is recorded by the store's own metrics.

        A held lease is also renewed here once half its TTL is gone: rounds
        renew it only before they write, so without this an idle sidecar's
        lease would lapse in the bucket while it still counted itself the
        holder, and another writer could take the prefix unnoticed."""
        if self.lease.lease is not None:
            try:
                self.lease.ensure()
            except TieredError as exc:  # fenced or unreachable: the gauges below say so
                log.warning("lease renewal failed: %s", exc)
        try:
            self.store.head(self.lease.key)
        except TieredError as exc:
            log.warning("object-store probe failed: %s", exc)
        self._note_lease()

    def _note_lease(self) -> None:
        """Lease gauges and changes, from what the lease manager holds (no
        request). A lease past its expiry is not held, whatever we last wrote:
        any other sidecar may take it from then on."""
        lease = self.lease.lease
        held = lease is not None and lease.expires_ms > self.clock.now_ms()
        if held != self._lease_held:
            self.recorder.lease_change("acquired" if held else "lost")
            self._lease_held = held
        self.recorder.lease_state(held, lease.expires_ms / 1000 if lease is not None else None)

    # --- jobs ----------------------------------------------------------------

    def dispatch_round(self) -> None:
        with self._busy:
            # Also before the first start and while the object store is down:
            # the round reports lag and a failed round either way.
            result = self.dispatcher.run_round()
            if self.dispatcher.started:
                self._start_error = None
                self._started.set()
            elif not self._started.is_set():
                self._start_error = result.fenced or result.errors.get("start") or "not started"
            self._note_lease()
            self._last_round_error = result.fenced
            if result.segments or result.gaps or result.errors:
                log.info("dispatch round", extra={"segments": result.segments, "messages": result.messages,
                                                  "bytes": result.nbytes, "errors": len(result.errors),
                                                  "seconds": round(result.seconds, 3)})

    def clean_pass(self) -> None:
        if not self._started.is_set():
            return  # nothing to clean before the lease is held and the cache loaded
        self.cleaner.run_pass()

    def _job_event(self, event: JobExecutionEvent) -> None:
        if event.code == EVENT_JOB_MISSED:
            log.warning("scheduled run missed", extra={"job": event.job_id})
        elif event.exception is not None:
            if event.job_id in ("dispatch", "clean"):  # the heartbeat and the probe are no rounds
                self.recorder.round_finished(event.job_id, 0.0, False, self.clock.now_ms() / 1000)
            log.error("job failed: %s: %s", type(event.exception).__name__, event.exception,
                      extra={"job": event.job_id})

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self.server.start()
        s = self.settings
        common: dict[str, Any] = {"max_instances": 1, "coalesce": True, "replace_existing": True}
        self.heartbeat()
        self.scheduler.add_job(self.heartbeat, "interval", seconds=min(HEARTBEAT_MAX_S, s.dispatch.interval),
                               id="heartbeat", executor="heartbeat", misfire_grace_time=None, **common)
        self.scheduler.add_job(self.probe_store, "interval", seconds=max(PROBE_MIN_S, s.dispatch.interval),
                               id="probe", executor="probe", misfire_grace_time=None, **common)
        self.scheduler.add_job(self.dispatch_round, "interval", seconds=s.dispatch.interval, id="dispatch",
                               misfire_grace_time=max(1, int(s.dispatch.interval)),
                               next_run_time=_now(), **common)
        if s.cleaner.enabled:
            # first pass soon after start: a sidecar restarted more often than its
            # interval must still clean
            first = _now() + timedelta(seconds=min(s.cleaner.interval, 60.0))
            self.scheduler.add_job(self.clean_pass, "interval", seconds=s.cleaner.interval, id="clean",
                                   misfire_grace_time=max(1, int(s.cleaner.interval)), next_run_time=first,
                                   **common)
        self.scheduler.start()

    def stop(self, timeout: float) -> bool:
        """Stop scheduling, wait up to ``timeout`` for running work. True if it finished."""
        if self.scheduler.running:
            self.scheduler.pause()
        done = threading.Event()

        def _shutdown() -> None:
            if self.scheduler.running:
                self.scheduler.shutdown(wait=True)
            done.set()

        threading.Thread(target=_shutdown, name="tiered-shutdown", daemon=True).start()
        finished = done.wait(timeout)
        if finished:
            try:
                self.lease.release()
            except TieredError as exc:
                log.warning("could not release the write lease: %s", exc)
            self.recorder.lease_state(False, None)  # released, not lost: no change counted
        self.server.stop()
        return finished


def _now() -> datetime:
    return datetime.now(timezone.utc)


def run_sidecar(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT; exit code 0 on a clean or bounded stop."""
    try:
        sidecar = Sidecar(settings)
    except TieredError as exc:
        print(f"tiered: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        sidecar.start()
    except OSError as exc:
        print(f"tiered: cannot listen on {settings.metrics.host}:{settings.metrics.port}: {exc.strerror}",
              file=sys.stderr)
        return 2
    log.info("serving", extra={"metrics_url": sidecar.server.url, "store": str(settings.store),
                               "broker": settings.broker, "cluster": settings.cluster})
    while not stop.wait(1.0):
        pass
    log.info("stopping: waiting up to %.0fs for running uploads", settings.shutdown_timeout)
    started = time.monotonic()
    finished = sidecar.stop(settings.shutdown_timeout)
    if not finished:
        log.warning("shutdown timeout after %.1fs: abandoning in-flight uploads (nothing was committed half-way)",
                    time.monotonic() - started)
        logging.shutdown()
        os._exit(0)  # worker threads would otherwise be joined at exit, past the bound
    log.info("stopped")
    return 0


@app.command()
def serve(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None,
    cluster: ClusterOpt = None, broker: BrokerOpt = None,
    metrics_port: Annotated[Optional[int], typer.Option("--metrics-port", help="HTTP port for /metrics, /healthz, /readyz.")] = None,
    state_dir: Annotated[Optional[Path], typer.Option("--state-dir", help="Local state (manifest cache).")] = None,
    broker_mode: BrokerModeOpt = None,
) -> None:
    """Run the sidecar: dispatcher + cleaner on their intervals, metrics and health over HTTP."""
    settings = settings_from(config, store=store, cold_url=cold, cluster=cluster, broker=broker,
                             **{"metrics.port": metrics_port, "state_dir": state_dir, "broker_mode": broker_mode})
    if settings.store is None:
        fail("invalid configuration: store: required (--store DIR, TIERED_STORE or 'store:' in the file)", 2)
    setup_logging(settings.log.format, settings.log.level)
    raise typer.Exit(run_sidecar(settings))
