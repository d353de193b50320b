"""A dispatcher process for the crash tests: loops rounds until killed.

    python crash_driver.py STORE COLD_URL STATE_DIR [ENDPOINT]

Prints ``ready`` once its imports are done (the test kills it at random
moments after that), ``round N`` after each round. With
``CRASH_AFTER_DATA=1`` it kills itself with SIGKILL right after the data
objects of its first segment were written and before the manifest commit:
a deterministic orphan.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    store_dir, cold_url, state_dir = sys.argv[1:4]
    endpoint = sys.argv[4] if len(sys.argv) > 4 else None
    layout = int(os.environ.get("CRASH_LAYOUT", "1"))  # 2: one zstd object per segment

    from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions
    from tiered.archive.coldtier import ColdTier
    from tiered.archive.lease import LeaseManager
    from tiered.store.localstore import LocalStore
    from tiered.archive.storage import RetryPolicy, S3Options, open_store

    store = open_store(cold_url, s3=S3Options(endpoint_url=endpoint),
                       retry=RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.01))
    if os.environ.get("CRASH_AFTER_DATA") == "1":
        raw_put_if = store._raw_put_if

        def crash_before_commit(key, data, etag):  # noqa: ANN001, ANN202
            if key.endswith("manifest.json"):
                os.kill(os.getpid(), signal.SIGKILL)
            return raw_put_if(key, data, etag)

        store._raw_put_if = crash_before_commit  # type: ignore[method-assign]
    cold = ColdTier(store, "TestCluster", "broker-a", state_dir=Path(state_dir), writer="crash-driver")
    lease = LeaseManager(store, "TestCluster/broker-a", "crash-driver")
    d = Dispatcher(LocalStore(store_dir), cold, lease=lease, options=DispatchOptions(
        archive=ArchiveOptions(upload_bytes=1, max_delay_ms=0, segment_bytes=1500, layout=layout,
                       compression="zstd" if layout == 2 else "none"),
        parallelism=2, round_budget_s=0.05))
    print("ready", flush=True)
    n = 0
    while True:
        r = d.run_round()
        n += 1
        print(f"round {n} segments {r.segments} errors {len(r.errors)} fenced {r.fenced}", flush=True)
        if not r.segments:
            time.sleep(0.005)  # idle: do not spin


if __name__ == "__main__":
    main()
