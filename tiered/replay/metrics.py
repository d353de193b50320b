"""``tiered_replay_*`` Prometheus metrics of a running ``tiered replay``.

Label values come from a fixed set, never from what a client sends: a
request code replay does not know is counted as ``other``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from tiered.replay import protocol as p

REQUESTS = {
    p.GET_ROUTEINFO_BY_TOPIC: "route", p.HEART_BEAT: "heartbeat", p.UNREGISTER_CLIENT: "unregister",
    p.GET_CONSUMER_LIST_BY_GROUP: "consumer_list", p.LOCK_BATCH_MQ: "lock", p.UNLOCK_BATCH_MQ: "unlock",
    p.PULL_MESSAGE: "pull", p.QUERY_CONSUMER_OFFSET: "query_offset", p.UPDATE_CONSUMER_OFFSET: "update_offset",
    p.SEARCH_OFFSET_BY_TIMESTAMP: "search_offset", p.GET_MAX_OFFSET: "max_offset", p.GET_MIN_OFFSET: "min_offset",
    p.GET_EARLIEST_MSG_STORETIME: "earliest_time", p.SEND_MESSAGE: "send", p.SEND_MESSAGE_V2: "send",
    p.SEND_BATCH_MESSAGE: "send", p.CONSUMER_SEND_MSG_BACK: "send_back",
}
OUTCOMES = {
    p.SUCCESS: "success", p.SYSTEM_ERROR: "error", p.REQUEST_CODE_NOT_SUPPORTED: "not_supported",
    p.NO_PERMISSION: "no_permission", p.TOPIC_NOT_EXIST: "no_topic", p.PULL_NOT_FOUND: "not_found",
    p.PULL_OFFSET_MOVED: "offset_moved", p.QUERY_NOT_FOUND: "not_found", p.INVALID_PARAMETER: "invalid",
}


class ReplayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.connections = Gauge("tiered_replay_connections", "Open client connections.", registry=r)
        self.bad_frames = Counter("tiered_replay_bad_frames",
                                  "Connections closed on a frame that could not be decoded.", registry=r)
        self._requests = Counter("tiered_replay_requests", "Requests answered, by request and outcome.",
                                 ["request", "outcome"], registry=r)
        self._children: dict[tuple[str, str], Any] = {}
        self.messages = Counter("tiered_replay_messages", "Archived messages served by pulls.", registry=r)
        self.bytes = Counter("tiered_replay_bytes", "Stored record bytes served by pulls.", registry=r)
        self.refused = Counter("tiered_replay_refused_connections",
                               "Connections closed at once: the cap on open connections was reached.", registry=r)
        self.held = Gauge("tiered_replay_held_pulls", "Pulls held until records arrive or they time out.",
                          registry=r)
        # outcome: reloaded, or rejected (the file changed but cannot be used: the rules before it stay)
        self.acl_reloads = Counter("tiered_replay_acl_reloads", "Changes of the --acl file, by outcome.",
                                   ["outcome"], registry=r)

    def request(self, request_code: int, response_code: int) -> None:
        # the labelled child kept (by label: a client's made-up codes add none):
        # looking it up costs more than the count
        labels = REQUESTS.get(request_code, "other"), OUTCOMES.get(response_code, "other")
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._requests.labels(*labels)
        child.inc()
