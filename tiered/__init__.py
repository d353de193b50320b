"""tiered: a tiered-storage archival sidecar for Apache RocketMQ.

Data flow (docs/design.md section 1), one subpackage per stage:

    store/ (the broker's files) -> format/ (records as bytes)
      -> dispatcher -> archive/ (objects, manifests, lease) -> cleaner
                                                        -> query/ (reader, Spark, export)

ops/ holds what spans the stages (status, verify, restore); cli/ wires them.
"""

import os

# numpy's OpenBLAS starts a thread per core at import, which spins after a
# call; tiered does no linear algebra, and those threads cost a round 6 %
# of its CPU (bench/dispatch.py). Set before anything imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
