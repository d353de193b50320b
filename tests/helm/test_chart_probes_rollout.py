"""The chart's probes and rollouts, rendered by the real Helm SDK and
validated by kubernetes-validate (strict).

* The tiered container never has a readiness probe: Kubernetes marks the
  whole pod NotReady when any container is, so a sidecar probe that fails on
  S3, the lease or the store would take the broker out of its Services.
  Liveness and startup probe /healthz with timings that tolerate a slow
  start and a slow scrape.
* A chart version bump leaves the broker pod template byte-for-byte
  unchanged (no restart of every broker on upgrade); a real config change
  does change it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from test_helm_chart import (
    CHART, EXAMPLE, NAMESPACE, RELEASE, SCENARIOS, load_values, one, parse, render, tiered_pods, validate_builtin,
)

pytestmark = pytest.mark.helm

# Scenarios that render a pod running tiered (the others render none).
POD_SCENARIOS = ("sidecar-s3-monitoring", "irsa")


@pytest.fixture(scope="module")
def chart() -> Any:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


def _tiered(docs: list[dict[str, Any]]) -> dict[str, Any]:
    ((workload, _, container),) = tiered_pods(docs)
    validate_builtin(workload)
    return container


def _parent_docs(tmp_path: Path, *, subchart_version: str | None = None) -> list[dict[str, Any]]:
    """The attach-mode example chart with this chart vendored (optionally re-versioned)."""
    parent = tmp_path / "broker-with-tiered"
    shutil.copytree(EXAMPLE, parent)
    _copy_chart(parent / "charts" / "rocketmq-tiered", version=subchart_version)
    if subchart_version:
        meta = yaml.safe_load((parent / "Chart.yaml").read_text())
        meta["dependencies"][0]["version"] = subchart_version
        (parent / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    with helm_python.Chart.load(parent) as loaded:
        return render(loaded, {})


def _copy_chart(dst: Path, *, version: str | None = None, app_version: str | None = None) -> Path:
    shutil.copytree(CHART, dst)
    meta = yaml.safe_load((dst / "Chart.yaml").read_text())
    if version:
        meta["version"] = version
    if app_version:
        meta["appVersion"] = app_version
    (dst / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return dst


# --------------------------------------------------------------------------
# probes
# --------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", POD_SCENARIOS)
def test_sidecar_has_no_readiness_probe(chart: Any, scenario: str) -> None:
    docs = render(chart, load_values(SCENARIOS[scenario]))
    tiered = _tiered(docs)
    assert "readinessProbe" not in tiered
    assert tiered["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "tiered-metrics"}
    assert tiered["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "tiered-metrics"}
    # /readyz (which does depend on S3, the lease and the store) is probed by nothing
    sts = one(docs, "StatefulSet")
    for container in sts["spec"]["template"]["spec"]["containers"]:
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert container.get(probe, {}).get("httpGet", {}).get("path") != "/readyz", (container["name"], probe)


def test_attach_example_sidecar_has_no_readiness_probe(tmp_path: Path) -> None:
    tiered = _tiered(_parent_docs(tmp_path))
    assert "readinessProbe" not in tiered
    assert {tiered["livenessProbe"]["httpGet"]["path"], tiered["startupProbe"]["httpGet"]["path"]} == {"/healthz"}


def test_default_probe_timings_are_sane(chart: Any) -> None:
    tiered = _tiered(render(chart, load_values(SCENARIOS["irsa"])))
    live, start = tiered["livenessProbe"], tiered["startupProbe"]
    assert (live["periodSeconds"], live["timeoutSeconds"], live["failureThreshold"]) == (20, 5, 3)
    assert (start["periodSeconds"], start["timeoutSeconds"], start["failureThreshold"]) == (5, 5, 60)
    for probe in (live, start):
        # a probe that times out must not overlap the next one
        assert probe["timeoutSeconds"] <= probe["periodSeconds"]
        assert probe.get("successThreshold", 1) == 1  # the only value Kubernetes accepts here
    # one slow answer (GC, a scrape) never restarts tiered: a minute of failures does
    assert live["failureThreshold"] >= 3 and live["periodSeconds"] * live["failureThreshold"] >= 60
    # a slow start (store scan, manifest cache rebuilt from the bucket) gets minutes, not seconds
    assert start["periodSeconds"] * start["failureThreshold"] >= 300
    # the startup probe gates liveness, so liveness needs no initial delay
    assert "initialDelaySeconds" not in live


def test_probe_values_flow_into_the_container(chart: Any) -> None:
    values = load_values(SCENARIOS["irsa"]) | {
        "probes": {"liveness": {"periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 4},
                   "startup": {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 90}},
    }
    tiered = _tiered(render(chart, values))
    assert {k: tiered["livenessProbe"][k] for k in ("periodSeconds", "timeoutSeconds", "failureThreshold")} == {
        "periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 4}
    assert tiered["startupProbe"]["failureThreshold"] == 90


@pytest.mark.parametrize(
    "probes",
    [
        {"readiness": {"periodSeconds": 10}},
        {"liveness": {"successThreshold": 2}},
        {"startup": {"successThreshold": 3}},
        {"liveness": {"periodSeconds": 0}},
    ],
    ids=["readiness", "liveness-success-threshold", "startup-success-threshold", "zero-period"],
)
def test_schema_refuses_readiness_and_invalid_probes(chart: Any, probes: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        chart.render({"probes": probes}, name=RELEASE, namespace=NAMESPACE)


# --------------------------------------------------------------------------
# rollouts: chart version vs configuration
# --------------------------------------------------------------------------


def _render_dir(path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm_python.Chart.load(path) as loaded:
        return render(loaded, values)


@pytest.mark.parametrize("scenario", POD_SCENARIOS)
def test_chart_version_bump_keeps_the_broker_pod_template(tmp_path: Path, scenario: str) -> None:
    values = load_values(SCENARIOS[scenario])
    old = _render_dir(_copy_chart(tmp_path / "old"), values)
    new = _render_dir(_copy_chart(tmp_path / "new", version="0.2.0", app_version="0.2.0"), values)
    old_sts, new_sts = one(old, "StatefulSet"), one(new, "StatefulSet")
    # the bump took effect (objects' labels carry it) ...
    assert old_sts["metadata"]["labels"]["helm.sh/chart"] == "rocketmq-tiered-0.1.0"
    assert new_sts["metadata"]["labels"]["helm.sh/chart"] == "rocketmq-tiered-0.2.0"
    assert one(new, "ConfigMap", "-broker")["metadata"]["labels"]["app.kubernetes.io/version"] == "0.2.0"
    # ... and the pod template, whose change restarts every broker, did not move
    assert new_sts["spec"]["template"] == old_sts["spec"]["template"]
    assert new_sts["spec"]["selector"] == old_sts["spec"]["selector"]
    assert new_sts["spec"]["volumeClaimTemplates"] == old_sts["spec"]["volumeClaimTemplates"]


def test_chart_version_bump_keeps_the_attach_example_pod_template(tmp_path: Path) -> None:
    old = one(_parent_docs(tmp_path / "old"), "StatefulSet")
    new_docs = _parent_docs(tmp_path / "new", subchart_version="0.2.0")
    assert one(new_docs, "ConfigMap", "-config")["metadata"]["labels"]["helm.sh/chart"] == "tiered-0.2.0"  # the alias
    assert one(new_docs, "StatefulSet")["spec"]["template"] == old["spec"]["template"]


def _annotations(docs: list[dict[str, Any]]) -> dict[str, str]:
    return one(docs, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]


def test_config_changes_roll_the_brokers(chart: Any) -> None:
    values = load_values(SCENARIOS["irsa"])
    base = _annotations(render(chart, values))
    assert set(base) >= {"checksum/broker-config", "checksum/tiered-config"}
    broker_change = _annotations(render(chart, values | {
        "broker": values["broker"] | {"config": "deleteWhen=03\nfileReservedTime=48\n"}}))
    assert broker_change["checksum/broker-config"] != base["checksum/broker-config"]
    assert broker_change["checksum/tiered-config"] == base["checksum/tiered-config"]
    tiered_change = _annotations(render(chart, values | {"dispatch": {"interval": "45s"}}))
    assert tiered_change["checksum/tiered-config"] != base["checksum/tiered-config"]
    assert tiered_change["checksum/broker-config"] == base["checksum/broker-config"]
    # a label-only change (commonLabels reach the ConfigMaps' metadata) does not roll anything
    labelled = _annotations(render(chart, values | {"commonLabels": {"team": "messaging"}}))
    assert labelled == base


def test_broker_checksum_covers_exactly_the_configmap_data(chart: Any) -> None:
    """The annotation hashes what the broker reads (broker.conf, run-broker.sh):
    the same data gives the same hash under another release name, and the
    ConfigMap's data is what the template renders."""
    values = load_values(SCENARIOS["irsa"])
    docs = render(chart, values)
    other_docs = parse(chart.render(values, name="other", namespace=NAMESPACE))
    other_cm = one(other_docs, "ConfigMap", "-broker")
    assert other_cm["data"] == one(docs, "ConfigMap", "-broker")["data"]
    assert _annotations(other_docs)["checksum/broker-config"] == _annotations(docs)["checksum/broker-config"]
    assert set(one(docs, "ConfigMap", "-broker")["data"]) == {"broker.conf", "run-broker.sh"}
