"""The dispatcher as an APScheduler 3.x interval job: rounds run on the
interval, never two at once."""

from __future__ import annotations

import threading

from apscheduler.events import EVENT_JOB_MAX_INSTANCES
from apscheduler.schedulers.background import BackgroundScheduler

from dispatchkit import new_dispatcher, new_writer, produce, read_manifest
from tiered.dispatcher.job import JOB_ID, schedule
from tiered.store.localstore import LocalStore
from tiered.archive.storage import FileStore


def test_scheduled_rounds_never_overlap(tmp_path, clock):
    with new_writer(tmp_path / "store") as w:
        produce(w, "Sched", 0, 5, clock=clock)
    store = FileStore(str(tmp_path / "cold"))
    d = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, upload_bytes=1,
                       max_delay_ms=0)
    active = {"now": 0, "max": 0, "rounds": 0}
    lock = threading.Lock()
    first_running, release_first, enough = threading.Event(), threading.Event(), threading.Event()
    run_round = d._run_round

    def observed_round():  # noqa: ANN202
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
            active["rounds"] += 1
            n = active["rounds"]
        try:
            if n == 1:
                first_running.set()
                # hold the first round over several intervals: the scheduler must not start another
                release_first.wait(10)
            return run_round()
        finally:
            with lock:
                active["now"] -= 1
            if n >= 4:
                enough.set()

    d._run_round = observed_round  # type: ignore[method-assign]
    scheduler = BackgroundScheduler(timezone="UTC")
    skipped = threading.Event()
    scheduler.add_listener(lambda event: skipped.set(), EVENT_JOB_MAX_INSTANCES)
    schedule(scheduler, d, 0.05)
    job = scheduler.get_job(JOB_ID)
    assert job.max_instances == 1 and job.coalesce
    scheduler.start()
    try:
        assert first_running.wait(10)
        # the next run comes due while the first round is held: the scheduler skips it
        assert skipped.wait(10)
        assert active["rounds"] == 1
        release_first.set()
        assert enough.wait(10), "the job stopped running after a long round"
    finally:
        scheduler.shutdown(wait=True)
    assert active["max"] == 1
    assert read_manifest(store, "Sched", 0).next_offset == 5
