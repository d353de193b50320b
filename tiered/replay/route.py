"""The name server's answer to GET_ROUTEINFO_BY_TOPIC (``TopicRouteData``).

Replay is its own name server: the route names each archived broker that
holds the topic, at the address replay serves that broker on, with every
archived queue readable and none writable (``PermName.PERM_READ``), as a
broker topic made read-only is. ``brokerAddrs`` keys are broker ids
(0 = master); fastjson writes them as bare numbers, every client also reads
the quoted form written here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tiered.replay.protocol import PERM_READ


@dataclass(frozen=True, kw_only=True)
class RouteBroker:
    """One broker of a topic's route: where it is served, how many queues it has."""

    cluster: str
    broker: str
    address: str
    queues: int


def route_body(brokers: list[RouteBroker]) -> bytes:
    doc: dict[str, object] = {
        "orderTopicConf": None,
        "queueDatas": [{"brokerName": b.broker, "readQueueNums": b.queues, "writeQueueNums": b.queues,
                        "perm": PERM_READ, "topicSysFlag": 0} for b in brokers],
        "brokerDatas": [{"cluster": b.cluster, "brokerName": b.broker, "brokerAddrs": {"0": b.address},
                         "enableActingMaster": False} for b in brokers],
        "filterServerTable": {},
    }
    return json.dumps(doc, separators=(",", ":")).encode()
