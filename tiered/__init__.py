"""tiered: a tiered-storage archival sidecar for Apache RocketMQ.

Data flow (docs/design.md section 1), one subpackage per stage:

    store/ (the broker's files) -> format/ (records as bytes)
      -> dispatcher -> archive/ (objects, manifests, lease) -> cleaner
                                                        -> query/ (reader, Spark, export)

ops/ holds what spans the stages (status, verify, restore); cli/ wires them.
"""

__version__ = "0.1.0"
