"""Queue locks of orderly consumers (LOCK_BATCH_MQ, UNLOCK_BATCH_MQ), as the
broker's ``RebalanceLockManager`` keeps them: per group, a queue is held by
one client id until it unlocks it or does not renew the lock for 60 s
(``rocketmq.broker.rebalance.lockMaxLiveTime``). Kept in memory only, as
on a broker: orderly clients lock again every 20 s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from tiered.errors import BadRequestError

LOCK_MAX_LIVE_MS = 60_000

Queue = tuple[str, str, int]  # topic, broker name, queue id


@dataclass(frozen=True, kw_only=True)
class LockRequest:
    group: str
    client: str
    queues: tuple[Queue, ...]


def parse_body(body: bytes) -> LockRequest:
    """A ``LockBatchRequestBody`` / ``UnlockBatchRequestBody`` (JSON)."""
    try:
        doc = json.loads(body)
        queues = tuple((str(q["topic"]), str(q["brokerName"]), int(q["queueId"])) for q in doc.get("mqSet") or ())
        return LockRequest(group=str(doc["consumerGroup"]), client=str(doc["clientId"]), queues=queues)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadRequestError(f"lock request body: {type(exc).__name__}: {exc}") from None


def locked_body(queues: list[Queue]) -> bytes:
    """A ``LockBatchResponseBody``: the queues this client holds now."""
    rows = [{"brokerName": b, "queueId": q, "topic": t} for t, b, q in queues]
    return json.dumps({"lockOKMQSet": rows}).encode()


class QueueLocks:
    def __init__(self, now_ms: Callable[[], int], live_ms: int = LOCK_MAX_LIVE_MS) -> None:
        self.now_ms = now_ms
        self.live_ms = live_ms
        self._held: dict[str, dict[Queue, tuple[str, int]]] = {}  # group -> queue -> (client, last renewal)

    def lock(self, req: LockRequest) -> list[Queue]:
        """The queues of ``req`` its client holds now: free, expired or its own."""
        now = self.now_ms()
        held = self._held.setdefault(req.group, {})
        out = []
        for queue in dict.fromkeys(req.queues):
            owner = held.get(queue)
            if owner is None or owner[0] == req.client or now - owner[1] > self.live_ms:
                held[queue] = (req.client, now)
                out.append(queue)
        return out

    def unlock(self, req: LockRequest) -> None:
        """Release the queues of ``req`` its client holds (others' stay held)."""
        held = self._held.get(req.group, {})
        for queue in req.queues:
            if queue in held and held[queue][0] == req.client:
                del held[queue]
