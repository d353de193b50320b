"""Prometheus metrics for tiered: the recorder the core reports through,
the HTTP endpoint that serves it, and the alert rules and dashboard built on
its metric names (``alerts.yaml``, ``dashboards/tiered.json``).

The core never imports this package: the CLI's composition root builds a
``PrometheusRecorder`` and hands it to the jobs as a ``tiered.recorder.Recorder``.
"""

from tiered.metrics.recorder import ALL_QUEUES, JOBS, OPS, OUTCOMES, PrometheusRecorder
from tiered.metrics.server import MetricsServer

__all__ = ["ALL_QUEUES", "JOBS", "OPS", "OUTCOMES", "MetricsServer", "PrometheusRecorder"]
