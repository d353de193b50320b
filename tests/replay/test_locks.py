"""Orderly consumers' queue locks: the broker's RebalanceLockManager rules."""

from __future__ import annotations

import json

import pytest

from tiered.errors import BadRequestError
from tiered.replay.locks import LockRequest, QueueLocks, locked_body, parse_body

A = ("Orders", "broker-x", 0)
B = ("Orders", "broker-x", 1)


def req(client: str, *queues, group: str = "g") -> LockRequest:  # noqa: ANN002
    return LockRequest(group=group, client=client, queues=queues)


def test_a_queue_is_held_by_one_client_until_unlocked_or_expired() -> None:
    now = [1_000]
    locks = QueueLocks(lambda: now[0], live_ms=60_000)
    assert locks.lock(req("c1", A, B)) == [A, B]
    assert locks.lock(req("c2", A, B)) == []
    assert locks.lock(req("c2", A, group="other")) == [A]  # groups are apart
    now[0] += 30_000
    assert locks.lock(req("c1", A)) == [A]  # renewed
    now[0] += 40_000  # B not renewed for 70 s: expired; A renewed 40 s ago
    assert locks.lock(req("c2", A, B)) == [B]
    locks.unlock(req("c1", B))  # not c1's any more: no effect
    assert locks.lock(req("c1", B)) == []
    locks.unlock(req("c1", A))
    assert locks.lock(req("c2", A)) == [A]


def test_bodies_as_the_java_client_writes_them() -> None:
    body = json.dumps({"consumerGroup": "g", "clientId": "10.0.0.1@7", "onlyThisBroker": False,
                       "mqSet": [{"topic": "Orders", "brokerName": "broker-x", "queueId": 1}]}).encode()
    assert parse_body(body) == LockRequest(group="g", client="10.0.0.1@7", queues=(B,))
    assert json.loads(locked_body([B])) == {"lockOKMQSet": [{"brokerName": "broker-x", "queueId": 1,
                                                             "topic": "Orders"}]}
    for bad in (b"{", b"[]", b'{"consumerGroup":"g"}', b'{"consumerGroup":"g","clientId":"c","mqSet":[{}]}'):
        with pytest.raises(BadRequestError):
            parse_body(bad)
