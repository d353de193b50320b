"""The archived brokers one replay process serves, each at its own address.

A pull names a topic and a queue id but not a broker, so two archived
brokers holding the same topic cannot share an address: each gets a
listener of its own, and the route (answered by every listener, the first
one being the name server clients are given) names each broker that holds
the topic at its address, as a name server lists the brokers of a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered.archive.storage import ObjectStore
from tiered.errors import TieredError
from tiered.query.reader import discover
from tiered.replay.route import RouteBroker
from tiered.replay.source import ArchiveSource


def pick_brokers(store: ObjectStore, cluster: str | None, broker: str | None) -> list[tuple[str, str]]:
    """The archived (cluster, broker) pairs to serve: the one named, or every
    one under the root (narrowed to ``cluster`` when given). Broker names
    must be unique, as in one name server's route."""
    if cluster and broker:
        return [(cluster, broker)]
    found = discover(store, cluster, broker)
    if not found:
        raise TieredError("no archived broker found under the root")
    names = [b for _, b in found]
    twice = sorted({b for b in names if names.count(b) > 1})
    if twice:
        raise TieredError(f"broker name(s) {', '.join(twice)} archived in several clusters: a route names a "
                          "broker once; choose one with --cluster and --broker")
    return found


def listen_ports(port: int, count: int) -> list[int]:
    """The port of each served broker: ``port`` for the first (and the name
    server), consecutive ports for the others; port 0 gives each a free one."""
    if port == 0:
        return [0] * count
    if port + count - 1 > 65535:
        raise ValueError(f"--listen port {port}: {count} brokers need ports up to {port + count - 1}")
    return [port + i for i in range(count)]


@dataclass(frozen=True, kw_only=True)
class Served:
    source: ArchiveSource
    address: str


class Registry:
    """Every served broker and its address, in the order they were started."""

    def __init__(self) -> None:
        self.served: list[Served] = []

    def add(self, source: ArchiveSource, address: str) -> None:
        self.served.append(Served(source=source, address=address))

    def route(self, topic: str) -> list[RouteBroker]:
        """The brokers holding ``topic`` (empty when none does)."""
        out = []
        for s in self.served:
            queues = s.source.topics.get(topic)
            if queues is not None:
                out.append(RouteBroker(cluster=s.source.cluster, broker=s.source.broker, address=s.address,
                                       queues=queues))
        return out
