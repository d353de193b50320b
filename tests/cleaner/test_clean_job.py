"""The cleaner as an APScheduler 3.x interval job (no scheduler thread, no sleeping)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from clean_support import Rig

from tiered.cleaner.job import JOB_ID, schedule


@pytest.mark.parametrize("interval_s", [1, 20, 60, 3600, 86400])
def test_job_settings_for_any_interval(tmp_path: Path, interval_s: int) -> None:
    rig = Rig(tmp_path)
    scheduler = BackgroundScheduler(timezone="UTC")
    before = datetime.now(timezone.utc)
    schedule(scheduler, rig.cleaner, interval_s)
    job = scheduler.get_job(JOB_ID)
    assert job.func == rig.cleaner.run_pass
    assert job.trigger.interval == timedelta(seconds=interval_s)
    assert job.max_instances == 1 and job.coalesce is True
    assert job.misfire_grace_time == max(1, interval_s)
    # the first pass comes within a minute even for long intervals (restarts must not starve it)
    first = job.next_run_time
    assert before <= first <= before + timedelta(seconds=min(interval_s, 60) + 5)
    job.func()  # what the scheduler calls: one pass, never raising
    assert rig.recorder.rounds[-1] == ("clean", True)
    rig.close()


def test_interval_must_be_positive(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    with pytest.raises(ValueError):
        schedule(BackgroundScheduler(timezone="UTC"), rig.cleaner, 0)
    rig.close()
