"""tiered: a tiered-storage archival sidecar for Apache RocketMQ.

Data flow (DESIGN.md section 1):

    store (codec, localstore) -> dispatcher -> cold tier (storage, manifest)
                                             -> cleaner / reader / spark
"""

__version__ = "0.1.0"
