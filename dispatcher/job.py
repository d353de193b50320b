"""The dispatcher as an APScheduler 3.x interval job.

``max_instances=1`` keeps rounds from overlapping (and each queue is also
locked, so a round and a clean never work on one queue at once);
``coalesce`` folds missed runs into one; errors and misses are logged by
the scheduler listener the service installs.
"""

from __future__ import annotations

from datetime import datetime, timezone

from apscheduler.schedulers.base import BaseScheduler

from tiered.dispatcher.round import Dispatcher

JOB_ID = "dispatch"


def schedule(scheduler: BaseScheduler, dispatcher: Dispatcher, interval_s: float, *, start_now: bool = True) -> None:
    scheduler.add_job(
        dispatcher.run_round, "interval", seconds=interval_s, id=JOB_ID, name="tiered dispatch",
        max_instances=1, coalesce=True, misfire_grace_time=max(1, int(interval_s)),
        next_run_time=datetime.now(timezone.utc) if start_now else None, replace_existing=True,
    )
