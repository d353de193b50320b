"""The name server's answer to GET_ROUTEINFO_BY_TOPIC (``TopicRouteData``).

Replay is its own name server: the route names one broker, the archived
one, at replay's own address, with every archived queue readable and none
writable (``PermName.PERM_READ``), as a broker topic made read-only is.
``brokerAddrs`` keys are broker ids (0 = master); fastjson writes them as
bare numbers, every client also reads the quoted form written here.
"""

from __future__ import annotations

import json

from tiered.replay.protocol import PERM_READ


def route_body(*, cluster: str, broker: str, address: str, queues: int) -> bytes:
    doc: dict[str, object] = {
        "orderTopicConf": None,
        "queueDatas": [{"brokerName": broker, "readQueueNums": queues, "writeQueueNums": queues,
                        "perm": PERM_READ, "topicSysFlag": 0}],
        "brokerDatas": [{"cluster": cluster, "brokerName": broker, "brokerAddrs": {"0": address},
                         "enableActingMaster": False}],
        "filterServerTable": {},
    }
    return json.dumps(doc, separators=(",", ":")).encode()
