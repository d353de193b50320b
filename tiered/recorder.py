"""What the core reports while it works, as a small injected object.

The core (``tiered``, ``dispatcher``, ``cleaner``) calls these methods and
never imports prometheus; ``metrics.PrometheusRecorder`` implements them
against a ``CollectorRegistry``. ``NullRecorder`` keeps the core testable
without a metrics server. Labels are low-cardinality: topic, queue id, op,
outcome, job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Recorder(Protocol):
    # dispatcher
    def archived(self, topic: str, queue_id: int, messages: int, nbytes: int) -> None: ...

    def lag(self, topic: str, queue_id: int, messages: int, nbytes: int, seconds: float) -> None: ...

    def gap(self, topic: str, queue_id: int, messages: int) -> None: ...

    def corrupt_record(self, topic: str, queue_id: int) -> None: ...

    def quarantined(self, topic: str, queue_id: int) -> None: ...

    def queue_error(self, job: str, topic: str, queue_id: int) -> None: ...

    # a queue stopped (reason: corrupt_local_data | store_behind | manifest |
    # unaccounted_objects | error) or moving again (None)
    def queue_stuck(self, topic: str, queue_id: int, reason: str | None) -> None: ...

    # the queue committed (an upload or a recorded gap) at now_s
    def queue_committed(self, topic: str, queue_id: int, now_s: float) -> None: ...

    # the CommitLog offset the archive waits at (controller mode's confirm
    # offset), None where the broker mode binds nothing; once per round
    def confirm_offset(self, offset: int | None) -> None: ...

    # a queue left for the next pass because the other job held it all along
    def skipped_busy(self, job: str, topic: str, queue_id: int) -> None: ...

    # recovery: event is manifest_rebuilt | bucket_identity_changed
    def recovery(self, event: str, topic: str = "") -> None: ...

    # both jobs; job is "dispatch" or "clean"
    def round_finished(self, job: str, seconds: float, ok: bool, now_s: float) -> None: ...

    # object store; op is get|put|put_if_absent|delete|list|head|copy
    def store_request(self, op: str, outcome: str, seconds: float) -> None: ...

    def store_retry(self, op: str) -> None: ...

    # cold tier shape, refreshed after each commit
    def cold_tier(self, topic: str, queue_id: int, nbytes: int, segments: int, oldest_store_ms: int | None) -> None: ...

    # cleaner
    def cleaner_deleted(self, topic: str, segments: int, nbytes: int) -> None: ...

    def orphans_collected(self, objects: int) -> None: ...

    def merged(self, topic: str, segments: int) -> None: ...

    def skew_detected(self, topic: str, queue_id: int) -> None: ...

    def forget_queue(self, topic: str, queue_id: int) -> None: ...

    # what the last store survey did not understand, per kind (survey.KINDS)
    def store_layout(self, counts: Mapping[str, int]) -> None: ...


class NullRecorder:
    """Records nothing. The default wherever no recorder is handed in."""

    def archived(self, topic: str, queue_id: int, messages: int, nbytes: int) -> None:
        pass

    def lag(self, topic: str, queue_id: int, messages: int, nbytes: int, seconds: float) -> None:
        pass

    def gap(self, topic: str, queue_id: int, messages: int) -> None:
        pass

    def corrupt_record(self, topic: str, queue_id: int) -> None:
        pass

    def quarantined(self, topic: str, queue_id: int) -> None:
        pass

    def queue_error(self, job: str, topic: str, queue_id: int) -> None:
        pass

    def queue_stuck(self, topic: str, queue_id: int, reason: str | None) -> None:
        pass

    def queue_committed(self, topic: str, queue_id: int, now_s: float) -> None:
        pass

    def confirm_offset(self, offset: int | None) -> None:
        pass

    def skipped_busy(self, job: str, topic: str, queue_id: int) -> None:
        pass

    def recovery(self, event: str, topic: str = "") -> None:
        pass

    def round_finished(self, job: str, seconds: float, ok: bool, now_s: float) -> None:
        pass

    def store_request(self, op: str, outcome: str, seconds: float) -> None:
        pass

    def store_retry(self, op: str) -> None:
        pass

    def cold_tier(self, topic: str, queue_id: int, nbytes: int, segments: int, oldest_store_ms: int | None) -> None:
        pass

    def cleaner_deleted(self, topic: str, segments: int, nbytes: int) -> None:
        pass

    def orphans_collected(self, objects: int) -> None:
        pass

    def merged(self, topic: str, segments: int) -> None:
        pass

    def skew_detected(self, topic: str, queue_id: int) -> None:
        pass

    def forget_queue(self, topic: str, queue_id: int) -> None:
        pass

    def store_layout(self, counts: Mapping[str, int]) -> None:
        pass
