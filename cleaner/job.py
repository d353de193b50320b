"""The cleaner as an APScheduler 3.x interval job.

``max_instances=1`` keeps passes from overlapping whatever the interval (a
pass longer than the interval just delays the next one); ``coalesce`` folds
missed runs into one; ``misfire_grace_time`` lets a late run still happen.
Nothing in a pass depends on the interval: every decision is re-derived from
the manifests and the clock, so 1 s and 1 day are equally correct.

The first pass runs ``first_run_s`` after scheduling (default: the interval,
capped at 60 s), so a process that restarts more often than the interval
still cleans.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from apscheduler.schedulers.base import BaseScheduler

from tiered.cleaner.clean import Cleaner

JOB_ID = "clean"


def schedule(
    scheduler: BaseScheduler, cleaner: Cleaner, interval_s: float, *, first_run_s: float | None = None
) -> None:
    if interval_s <= 0:
        raise ValueError("the cleaner interval must be > 0 seconds")
    delay = min(interval_s, 60.0) if first_run_s is None else max(0.0, first_run_s)
    scheduler.add_job(
        cleaner.run_pass, "interval", seconds=interval_s, id=JOB_ID, name="tiered clean",
        max_instances=1, coalesce=True, misfire_grace_time=max(1, int(interval_s)),
        next_run_time=datetime.now(timezone.utc) + timedelta(seconds=delay), replace_existing=True,
    )
