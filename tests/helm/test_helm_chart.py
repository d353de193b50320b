"""The Helm chart, rendered for real: the Go Helm SDK (helm_python) renders
and lints it, kubernetes-validate checks every manifest against the newest
Kubernetes schema it bundles (strict: unknown fields fail), and tiered's
own settings loader and HTTP server check the config and the probes.

Scenarios are the chart-testing values files in helm/rocketmq-tiered/ci/
plus the chart defaults; the attach-mode example chart in helm/examples/
is rendered as a parent chart with this chart as its dependency.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import helm_python
import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rocketmq-tiered"
EXAMPLE = ROOT / "helm" / "examples" / "broker-with-tiered"
INVALID_VALUES = Path(__file__).resolve().parent / "values"
RELEASE, NAMESPACE = "mq", "messaging"

SCENARIOS: dict[str, Path | None] = {
    "defaults": None,
    "sidecar-s3-monitoring": CHART / "ci" / "sidecar-s3-monitoring-values.yaml",
    "attach": CHART / "ci" / "attach-values.yaml",
    "irsa": CHART / "ci" / "irsa-values.yaml",
}

# CRDs: kubernetes-validate bundles no schema for them; they are checked by
# the explicit structural schemas below instead. Any other kind without a
# bundled schema fails the test.
SERVICEMONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")
PROMETHEUSRULE = ("monitoring.coreos.com/v1", "PrometheusRule")

# Metric names of the service contract (used when metrics/ has no alert file).
CONTRACT_METRICS = {
    "tiered_archived_messages_total", "tiered_archived_bytes_total",
    "tiered_archive_lag_messages", "tiered_archive_lag_seconds", "tiered_gaps_total",
    "tiered_corrupt_records_total", "tiered_last_success_timestamp_seconds",
    "tiered_object_store_requests_total", "tiered_cleaner_deleted_segments_total",
}

CREDENTIAL_ENV = re.compile(r"(SECRET|PASSWORD|TOKEN|ACCESS_KEY|CREDENTIAL)", re.IGNORECASE)
# AWS access key ids and 40-character secret keys, as they would appear if inlined.
AWS_KEY_MATERIAL = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b|(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")


# --------------------------------------------------------------------------
# rendering helpers
# --------------------------------------------------------------------------


def k8s_version() -> str:
    """Newest Kubernetes version whose schemas kubernetes-validate bundles."""
    return kv.latest_version()


def load_values(path: Path | None) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {} if path else {}


def parse(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Manifests of a render (NOTES.txt and empty templates left out)."""
    docs = []
    for template, text in sorted(rendered.items()):
        if not template.endswith((".yaml", ".yml")):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def render(chart: helm_python.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    return parse(chart.render(values, name=RELEASE, namespace=NAMESPACE))


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) of every workload."""
    for doc in docs:
        if doc["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "Job"):
            yield doc, doc["spec"]["template"]
        elif doc["kind"] == "CronJob":
            yield doc, doc["spec"]["jobTemplate"]["spec"]["template"]


def tiered_pods(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(workload, pod template, tiered container) of every pod running `tiered serve`."""
    out = []
    for workload, template in pod_specs(docs):
        for container in template["spec"]["containers"]:
            if container["name"] == "tiered":
                out.append((workload, template, container))
    return out


def config_map_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(one(docs, "ConfigMap", "-config")["data"]["config.yaml"])


def validate_builtin(doc: dict[str, Any]) -> None:
    kv.validate(doc, k8s_version(), strict=True)


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def rendered(chart: helm_python.Chart) -> dict[str, list[dict[str, Any]]]:
    return {name: render(chart, load_values(path)) for name, path in SCENARIOS.items()}


@pytest.fixture(scope="module")
def raw_rendered(chart: helm_python.Chart) -> dict[str, str]:
    return {
        name: "\n".join(chart.render(load_values(path), name=RELEASE, namespace=NAMESPACE).values())
        for name, path in SCENARIOS.items()
    }


@pytest.fixture(scope="module")
def parent_chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The attach-mode example with this chart vendored as its dependency,
    as `helm dependency build` would leave it."""
    parent = tmp_path_factory.mktemp("attach") / "broker-with-tiered"
    shutil.copytree(EXAMPLE, parent)
    shutil.copytree(CHART, parent / "charts" / "rocketmq-tiered")
    return parent


@pytest.fixture(scope="module")
def parent_docs(parent_chart_dir: Path) -> list[dict[str, Any]]:
    with helm_python.Chart.load(parent_chart_dir) as parent:
        return render(parent, {})


# --------------------------------------------------------------------------
# lint and Kubernetes schema validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict_is_clean(scenario: str) -> None:
    report = helm_python.lint(CHART, load_values(SCENARIOS[scenario]), strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    # strict: warnings count as failures (severity 2 = warning, 3 = error).
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_strict_attach_example_is_clean(parent_chart_dir: Path) -> None:
    report = helm_python.lint(parent_chart_dir, None, strict=True, with_subcharts=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_values_that_break_the_schema() -> None:
    report = helm_python.lint(CHART, {"cold": {"url": "gs://elsewhere"}}, strict=True)
    assert report["errors"] or [m for m in report["messages"] if m["severity"] >= 2]


EXPECTED_KINDS = {
    "defaults": {"ConfigMap", "ServiceAccount"},
    "sidecar-s3-monitoring": {
        "ConfigMap", "ServiceAccount", "Service", "StatefulSet", "PodDisruptionBudget",
        "NetworkPolicy", "CronJob", "ServiceMonitor", "PrometheusRule",
    },
    "attach": {"ConfigMap", "ServiceAccount", "Service", "NetworkPolicy", "ServiceMonitor", "PrometheusRule"},
    "irsa": {"ConfigMap", "ServiceAccount", "Service", "StatefulSet", "PodDisruptionBudget"},
}


def test_validates_against_the_newest_bundled_kubernetes() -> None:
    major, minor = (int(x) for x in k8s_version().split(".")[:2])
    assert (major, minor) >= (1, 33), k8s_version()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_validates_strictly(scenario: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered[scenario]
    assert {d["kind"] for d in docs} == EXPECTED_KINDS[scenario]
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key == SERVICEMONITOR:
            jsonschema.validate(doc, SERVICEMONITOR_SCHEMA)
        elif key == PROMETHEUSRULE:
            jsonschema.validate(doc, PROMETHEUSRULE_SCHEMA)
        else:
            validate_builtin(doc)  # SchemaNotFoundError for an unknown kind fails too
        assert doc["metadata"]["name"]


def test_attach_example_manifests_validate_strictly(parent_docs: list[dict[str, Any]]) -> None:
    assert {d["kind"] for d in parent_docs} >= {"StatefulSet", "ConfigMap", "ServiceAccount", "Service"}
    for doc in parent_docs:
        if (doc["apiVersion"], doc["kind"]) == SERVICEMONITOR:
            jsonschema.validate(doc, SERVICEMONITOR_SCHEMA)
        else:
            validate_builtin(doc)


def test_strict_validation_can_fail(rendered: dict[str, list[dict[str, Any]]]) -> None:
    sts = copy.deepcopy(one(rendered["sidecar-s3-monitoring"], "StatefulSet"))
    validate_builtin(sts)
    sts["spec"]["template"]["spec"]["containers"][1]["readOnlyRootFs"] = True  # a typo
    with pytest.raises(kv.ValidationError):
        validate_builtin(sts)
    with pytest.raises(kv.SchemaNotFoundError):
        validate_builtin({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


# --------------------------------------------------------------------------
# ServiceMonitor / PrometheusRule / dashboard (CRDs and monitoring files)
# --------------------------------------------------------------------------

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_METADATA = {
    "type": "object",
    "required": ["name", "namespace", "labels"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _LABELS},
}

# The subset of the monitoring.coreos.com/v1 CRD schemas the chart uses,
# closed (additionalProperties: false) so that a misspelt field fails.
SERVICEMONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object", "additionalProperties": False, "required": ["matchLabels"],
                    "properties": {"matchLabels": _LABELS},
                },
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}, "any": {"type": "boolean"}},
                },
                "endpoints": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object", "additionalProperties": False, "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": {"type": "object"}},
                            "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                },
            },
        },
    },
}

PROMETHEUSRULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": {
            "type": "object", "required": ["groups"], "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "rules": {
                                "type": "array", "minItems": 1,
                                "items": {
                                    "type": "object", "required": ["expr"], "additionalProperties": False,
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": _DURATION,
                                        "keep_firing_for": _DURATION,
                                        "labels": _LABELS,
                                        "annotations": _LABELS,
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_servicemonitor_scrapes_the_metrics_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for scenario in ("sidecar-s3-monitoring", "attach"):
        docs = rendered[scenario]
        monitor = one(docs, "ServiceMonitor")
        service = one(docs, "Service", "-metrics")
        labels = service["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["path"] == "/metrics"
        # tiered exports no job/instance label: the scrape's own ones are the truth.
        assert endpoint["honorLabels"] is False
    sidecar_monitor = one(rendered["sidecar-s3-monitoring"], "ServiceMonitor")
    assert sidecar_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_servicemonitor_schema_rejects_a_misspelt_field(rendered: dict[str, list[dict[str, Any]]]) -> None:
    monitor = copy.deepcopy(one(rendered["attach"], "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["honorLabel"] = True
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, SERVICEMONITOR_SCHEMA)


def test_servicemonitor_needs_a_pod_selector_in_attach_mode(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmRenderError, match="attach.podSelector"):
        chart.render({"metrics": {"serviceMonitor": {"enabled": True}}}, name=RELEASE, namespace=NAMESPACE)


def test_prometheusrule_carries_the_alert_rules_file(rendered: dict[str, list[dict[str, Any]]]) -> None:
    rule = one(rendered["sidecar-s3-monitoring"], "PrometheusRule")
    chart_rules = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert rule["spec"]["groups"] == chart_rules["groups"]
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and len(alerts) == len(set(alerts))
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_dashboard_configmap_is_discoverable_and_exact(rendered: dict[str, list[dict[str, Any]]]) -> None:
    dashboard = one(rendered["sidecar-s3-monitoring"], "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "RocketMQ"}
    source = (CHART / "files" / "dashboards" / "tiered.json").read_text()
    assert dashboard["data"]["tiered.json"] == source
    assert json.loads(dashboard["data"]["tiered.json"])["panels"]


@pytest.mark.parametrize(
    ("chart_copy", "source"),
    [("files/alerts.yaml", "metrics/alerts.yaml"), ("files/dashboards/tiered.json", "metrics/dashboards/tiered.json")],
)
def test_chart_copies_equal_the_metrics_sources(chart_copy: str, source: str) -> None:
    copied, original = CHART / chart_copy, ROOT / source
    if original.exists():
        assert copied.read_bytes() == original.read_bytes(), (
            f"{copied.relative_to(ROOT)} differs from {source}: run helm/sync-chart-files.sh"
        )
    else:
        # No source yet: the chart's own copy must only use contract metrics.
        names = set(re.findall(r"(?<![A-Za-z0-9_:])tiered_[A-Za-z0-9_:]*", copied.read_text()))
        assert names and names <= CONTRACT_METRICS | {n.removesuffix("_bucket") for n in names}


# --------------------------------------------------------------------------
# the tiered container: store mount, probes, config, security, secrets
# --------------------------------------------------------------------------


def all_tiered_pods(rendered: dict[str, list[dict[str, Any]]], parent_docs: list[dict[str, Any]]):
    pods = [(name, *p) for name, docs in rendered.items() for p in tiered_pods(docs)]
    pods += [("attach-example", *p) for p in tiered_pods(parent_docs)]
    return pods


def test_tiered_runs_in_sidecar_and_attach_renders(rendered, parent_docs) -> None:
    where = {name for name, *_ in all_tiered_pods(rendered, parent_docs)}
    assert where == {"sidecar-s3-monitoring", "irsa", "attach-example"}


def test_store_is_mounted_read_only_in_the_sidecar(rendered, parent_docs) -> None:
    for scenario, workload, template, tiered in all_tiered_pods(rendered, parent_docs):
        values = load_values(SCENARIOS.get(scenario)) if scenario in SCENARIOS else {}
        store_volume = values.get("store", {}).get("volumeName") or (
            "broker-store" if scenario == "attach-example" else "store"
        )
        store_mounts = [m for m in tiered["volumeMounts"] if m["name"] == store_volume]
        assert store_mounts, f"{scenario}: tiered does not mount {store_volume}"
        assert all(m.get("readOnly") is True for m in store_mounts), scenario
        # The broker in the same pod writes the same volume.
        broker = next(c for c in template["spec"]["containers"] if c["name"] == "broker")
        broker_mount = next(m for m in broker["volumeMounts"] if m["name"] == store_volume)
        assert not broker_mount.get("readOnly")
        assert broker_mount["mountPath"] == store_mounts[0]["mountPath"]
        # Everything tiered may write is an emptyDir.
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        for mount in tiered["volumeMounts"]:
            if not mount.get("readOnly"):
                assert "emptyDir" in volumes[mount["name"]], (scenario, mount)


def test_state_dir_is_on_an_emptydir(rendered) -> None:
    docs = rendered["sidecar-s3-monitoring"]
    state_dir = config_map_config(docs)["state_dir"]
    ((_, template, tiered),) = tiered_pods(docs)
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    holder = [m for m in tiered["volumeMounts"] if (state_dir + "/").startswith(m["mountPath"].rstrip("/") + "/")]
    assert holder and "emptyDir" in volumes[holder[0]["name"]]
    assert volumes[holder[0]["name"]]["emptyDir"]["sizeLimit"] == "1Gi"


def test_sidecar_security_context(rendered, parent_docs) -> None:
    for scenario, workload, template, tiered in all_tiered_pods(rendered, parent_docs):
        sc = tiered["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
        assert template["spec"]["securityContext"]["fsGroup"] == 3000  # the broker's group


def test_probes_point_at_the_real_endpoint(rendered, parent_docs) -> None:
    """Probe paths are served by tiered's real metrics server, on the port
    the rendered config makes it listen on."""
    from prometheus_client import CollectorRegistry

    from tiered.metrics.server import MetricsServer
    from tiered.config import MetricsSettings

    pods = all_tiered_pods(rendered, parent_docs)
    paths = set()
    for scenario, workload, template, tiered in pods:
        ports = {p["name"]: p["containerPort"] for p in tiered["ports"]}
        assert tiered["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert "readinessProbe" not in tiered  # see test_chart_probes_rollout.py
        assert tiered["startupProbe"]["httpGet"]["path"] == "/healthz"
        for probe in ("livenessProbe", "startupProbe"):
            port = tiered[probe]["httpGet"]["port"]
            assert ports[port] == MetricsSettings().port == 9464, (scenario, probe)
            paths.add(tiered[probe]["httpGet"]["path"])
    for docs in (rendered["sidecar-s3-monitoring"], rendered["irsa"]):
        assert config_map_config(docs)["metrics"]["port"] == 9464

    with MetricsServer(CollectorRegistry(), host="127.0.0.1", port=0, ready=lambda: (True, "ready")) as server:
        for path in sorted(paths):
            with urllib.request.urlopen(server.url + path, timeout=5) as response:
                assert response.status == 200, path
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(server.url + "/health", timeout=5)
        assert missing.value.code == 404


def test_metrics_port_flows_everywhere(chart: helm_python.Chart) -> None:
    values = load_values(SCENARIOS["sidecar-s3-monitoring"])
    values["metrics"]["port"] = 9555
    docs = render(chart, values)
    assert config_map_config(docs)["metrics"]["port"] == 9555
    ((_, _, tiered),) = tiered_pods(docs)
    assert {p["name"]: p["containerPort"] for p in tiered["ports"]} == {"tiered-metrics": 9555}
    service = one(docs, "Service", "-metrics")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(9555, "tiered-metrics")]
    policy = one(docs, "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": 9555, "protocol": "TCP"}]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rendered_config_is_accepted_by_tiered(scenario: str, rendered, tmp_path: Path) -> None:
    from tiered.config import load_settings

    path = tmp_path / "config.yaml"
    path.write_text(one(rendered[scenario], "ConfigMap", "-config")["data"]["config.yaml"])
    settings = load_settings(path)  # unknown keys and bad values raise ConfigError
    assert settings.metrics.host == "0.0.0.0"
    assert str(settings.state_dir) == "/var/lib/tiered/state"
    assert settings.s3.access_key_id is None and settings.s3.secret_access_key is None
    if scenario == "sidecar-s3-monitoring":
        assert settings.cold_url == "s3://rocketmq-archive/prod"
        assert settings.cluster == "prod-cluster"
        assert settings.s3.endpoint_url == "https://minio.storage.svc:9000"
        assert (settings.s3.region, settings.s3.addressing, settings.s3.checksum_mode) == (
            "us-east-1", "path", "when_required",
        )
        assert settings.retention.default_hours == 168
        assert settings.retention.topics == {"OrderEvents": 720, "%DLQ%billing": 2160}
        assert settings.dispatch.interval == 30 and settings.dispatch.parallelism == 8
        assert settings.cleaner.interval == 1800
        assert settings.topics.exclude == ["BenchmarkTest*", "tmp-*"]
        assert settings.log.format == "json"


def test_broker_name_is_the_pod_name_unless_set(chart: helm_python.Chart, rendered) -> None:
    ((_, _, tiered),) = tiered_pods(rendered["irsa"])
    env = {e["name"]: e for e in tiered["env"]}
    assert env["TIERED_BROKER"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    values = load_values(SCENARIOS["irsa"]) | {"brokerName": "broker-a"}
    docs = render(chart, values)
    ((workload, _, tiered),) = tiered_pods(docs)
    assert "env" not in tiered  # no empty `env:` either
    validate_builtin(workload)
    assert config_map_config(docs)["broker"] == "broker-a"


def test_config_change_rolls_the_pods(chart: helm_python.Chart, rendered) -> None:
    docs = rendered["irsa"]
    sts = one(docs, "StatefulSet")
    annotation = sts["spec"]["template"]["metadata"]["annotations"]["checksum/tiered-config"]
    content = one(docs, "ConfigMap", "-config")["data"]["config.yaml"]
    assert annotation == hashlib.sha256(content.removesuffix("\n").encode()).hexdigest()
    changed = render(chart, load_values(SCENARIOS["irsa"]) | {"retention": {"defaultHours": 24}})
    assert one(changed, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]["checksum/tiered-config"] != annotation


def test_grace_period_outlasts_graceful_shutdown(chart: helm_python.Chart, rendered) -> None:
    for scenario in ("sidecar-s3-monitoring", "irsa"):
        docs = rendered[scenario]
        shutdown = config_map_config(docs)["shutdown_timeout"]
        for workload, template in pod_specs(docs):
            assert template["spec"]["terminationGracePeriodSeconds"] > shutdown
    too_short = load_values(SCENARIOS["irsa"]) | {"terminationGracePeriodSeconds": 30}
    with pytest.raises(helm_python.HelmRenderError, match="terminationGracePeriodSeconds"):
        chart.render(too_short, name=RELEASE, namespace=NAMESPACE)


def test_default_resources_are_bounded(rendered) -> None:
    for scenario in ("sidecar-s3-monitoring", "irsa"):
        for workload, template in pod_specs(rendered[scenario]):
            for container in template["spec"]["containers"]:
                resources = container["resources"]
                assert resources["requests"]["cpu"] and resources["requests"]["memory"], container["name"]
                assert resources["limits"]["memory"], container["name"]


# --------------------------------------------------------------------------
# credentials
# --------------------------------------------------------------------------


def containers(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for _, template in pod_specs(docs):
        yield from template["spec"]["containers"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_secret_material_is_inlined(scenario: str, rendered, raw_rendered) -> None:
    docs = rendered[scenario]
    assert of_kind(docs, "Secret") == []
    assert not AWS_KEY_MATERIAL.search(raw_rendered[scenario])
    config = config_map_config(docs)
    assert not {"access_key_id", "secret_access_key", "session_token"} & set(config["s3"])
    for container in containers(docs):
        for env in container.get("env", []):
            if CREDENTIAL_ENV.search(env["name"]):
                assert "value" not in env, (scenario, env["name"])
                assert env["valueFrom"]["secretKeyRef"]["name"]


def test_existing_secret_is_referenced_not_copied(rendered) -> None:
    for scenario, keys in (
        ("sidecar-s3-monitoring", ("accessKeyId", "secretAccessKey")),
        ("attach", ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")),
    ):
        pods = list(pod_specs(rendered[scenario]))
        for container in containers(rendered[scenario]):
            if container["name"] not in ("tiered", "export"):
                continue
            env = {e["name"]: e for e in container["env"]}
            for var, key in zip(("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), keys):
                assert env[var]["valueFrom"]["secretKeyRef"] == {"name": "tiered-s3-credentials", "key": key}
        if scenario == "sidecar-s3-monitoring":
            assert len(pods) == 2  # broker StatefulSet and export CronJob


def test_irsa_uses_the_service_account_and_no_keys(rendered) -> None:
    docs = rendered["irsa"]
    account = one(docs, "ServiceAccount")
    role = "arn:aws:iam::123456789012:role/rocketmq-tiered"
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == role
    assert account["automountServiceAccountToken"] is False
    ((_, template, tiered),) = tiered_pods(docs)
    assert template["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert not {e["name"] for e in tiered["env"]} & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    s3 = config_map_config(docs)["s3"]
    assert (s3["sse"], s3["region"]) == ("aws:kms", "eu-central-1")


# --------------------------------------------------------------------------
# values schema
# --------------------------------------------------------------------------

INVALID = {
    "inline access key": {"s3": {"accessKeyId": "AKIAIOSFODNN7EXAMPLE"}},
    "inline secret key": {"s3": {"secretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}},
    "literal credential env": {"extraEnv": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]},
    "literal tiered credential env": {"extraEnv": [{"name": "TIERED_S3__SECRET_ACCESS_KEY", "value": "x"}]},
    "unknown top-level key": {"coldUrl": "s3://bucket/prefix"},
    "unknown nested key": {"retention": {"default_hours": 24}},
    "unsupported scheme": {"cold": {"url": "gs://bucket/prefix"}},
    "bad duration": {"dispatch": {"interval": "20 seconds"}},
    "bad size": {"dispatch": {"uploadBytes": "lots"}},
    "non-positive retention": {"retention": {"topics": {"OrderEvents": 0}}},
    "bad log format": {"log": {"format": "xml"}},
    "port out of range": {"metrics": {"port": 70000}},
    "string for bool": {"broker": {"enabled": "yes"}},
}


@pytest.mark.parametrize("values", INVALID.values(), ids=INVALID.keys())
def test_schema_rejects_invalid_values(chart: helm_python.Chart, values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(values)
    with pytest.raises(helm_python.HelmValuesError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("path", sorted(INVALID_VALUES.glob("*.yaml")), ids=lambda p: p.name)
def test_invalid_values_files_are_rejected(chart: helm_python.Chart, path: Path) -> None:
    values = load_values(path)
    with pytest.raises(helm_python.HelmValuesError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    report = helm_python.lint(CHART, values, strict=True)
    assert report["errors"] or [m for m in report["messages"] if m["severity"] >= 2]


def test_there_are_invalid_values_files() -> None:
    assert len(list(INVALID_VALUES.glob("*.yaml"))) >= 2


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_valid_values_pass_the_schema(chart: helm_python.Chart, scenario: str) -> None:
    chart.validate_schema(load_values(SCENARIOS[scenario]))


def test_credential_env_by_reference_is_allowed(chart: helm_python.Chart) -> None:
    ref = {"secretKeyRef": {"name": "s3", "key": "token"}}
    chart.validate_schema({"extraEnv": [{"name": "AWS_SESSION_TOKEN", "valueFrom": ref}, {"name": "A", "value": "b"}]})


# --------------------------------------------------------------------------
# modes, labels, disruption budget, network policy
# --------------------------------------------------------------------------


def test_sidecar_mode_needs_a_name_server(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmRenderError, match="broker.namesrvAddr"):
        chart.render({"broker": {"enabled": True}}, name=RELEASE, namespace=NAMESPACE)


def test_broker_statefulset(rendered) -> None:
    docs = rendered["sidecar-s3-monitoring"]
    sts = one(docs, "StatefulSet")
    spec = sts["spec"]
    assert spec["replicas"] == 3
    headless = one(docs, "Service", "-broker")
    assert spec["serviceName"] == headless["metadata"]["name"] and headless["spec"]["clusterIP"] == "None"
    broker = spec["template"]["spec"]["containers"][0]
    assert broker["image"].startswith("apache/rocketmq:")
    env = {e["name"]: e.get("value") for e in broker["env"]}
    assert env["NAMESRV_ADDR"].startswith("rocketmq-namesrv-0")
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "store"
    assert claim["spec"]["resources"]["requests"]["storage"] == "500Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    conf = one(docs, "ConfigMap", "-broker")["data"]["broker.conf"]
    assert "brokerClusterName=prod-cluster" in conf and "storePathRootDir=/home/rocketmq/store" in conf
    assert "checksum/broker-config" in spec["template"]["metadata"]["annotations"]
    pull = [{"name": "regcred"}, {"name": "mirror-credentials"}]
    assert spec["template"]["spec"]["imagePullSecrets"] == pull


def test_pdb_only_with_the_broker_statefulset(rendered) -> None:
    for scenario in ("defaults", "attach"):
        assert of_kind(rendered[scenario], "PodDisruptionBudget") == []
    for scenario in ("sidecar-s3-monitoring", "irsa"):
        docs = rendered[scenario]
        pdb = one(docs, "PodDisruptionBudget")
        sts = one(docs, "StatefulSet")
        assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
        assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_labels_follow_helm_conventions(scenario: str, rendered) -> None:
    for doc in rendered[scenario]:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "rocketmq-tiered"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "rocketmq-tiered-0.1.0"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
    for workload, template in pod_specs(rendered[scenario]):
        selector = workload["spec"].get("selector", {}).get("matchLabels", {})
        assert selector.items() <= template["metadata"]["labels"].items()
        # no chart version on pods: a chart-only upgrade must not restart brokers
        assert "helm.sh/chart" not in template["metadata"]["labels"]


def test_metrics_service_selects_the_pods_running_tiered(rendered) -> None:
    docs = rendered["sidecar-s3-monitoring"]
    service = one(docs, "Service", "-metrics")
    ((_, template, _),) = tiered_pods(docs)
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert one(rendered["attach"], "Service", "-metrics")["spec"]["selector"] == {"app": "rocketmq", "component": "broker"}
    assert of_kind(rendered["defaults"], "Service") == []


def test_network_policy_lets_scrapes_and_broker_traffic_in(rendered) -> None:
    docs = rendered["sidecar-s3-monitoring"]
    policy = one(docs, "NetworkPolicy")
    ((_, template, _),) = tiered_pods(docs)
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    metrics_rule, broker_rule = policy["spec"]["ingress"]
    assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert sorted(p["port"] for p in broker_rule["ports"]) == [10909, 10911, 10912]
    assert "from" not in broker_rule
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert {p["port"] for p in policy["spec"]["egress"][0]["ports"]} == {53}


def test_export_cronjob_uses_the_spark_image(rendered) -> None:
    job = one(rendered["sidecar-s3-monitoring"], "CronJob")
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "rocketmq-tiered:0.1.0-spark"
    assert container["command"] == ["tiered"] and container["args"][0] == "export"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {m["mountPath"]: "emptyDir" in volumes[m["name"]] for m in container["volumeMounts"]} == {
        "/etc/tiered": False, "/var/lib/tiered": True, "/tmp": True,
    }
    assert job["spec"]["concurrencyPolicy"] == "Forbid"


def test_attach_templates_match_the_subchart_objects(parent_docs) -> None:
    sts = one(parent_docs, "StatefulSet")
    template = sts["spec"]["template"]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    config_map = one(parent_docs, "ConfigMap", "-config")
    assert volumes["tiered-config"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert template["spec"]["serviceAccountName"] == one(parent_docs, "ServiceAccount")["metadata"]["name"]
    content = config_map["data"]["config.yaml"]
    assert template["metadata"]["annotations"]["checksum/tiered-config"] == hashlib.sha256(
        content.removesuffix("\n").encode()
    ).hexdigest()
    # every mount of the sidecar resolves to a volume of the user's pod
    ((_, _, tiered),) = tiered_pods(parent_docs)
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    assert {m["name"] for m in tiered["volumeMounts"]} <= set(volumes) | claims
    assert yaml.safe_load(content)["cold_url"] == "s3://rocketmq-archive/example"
    service = one(parent_docs, "Service", "-metrics")
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()


# --------------------------------------------------------------------------
# chart hygiene
# --------------------------------------------------------------------------

FREE_FORM = {
    "resources", "podSecurityContext", "securityContext", "broker.resources", "broker.securityContext",
    "exportJob.resources", "metrics.dashboard.labels", "probes.liveness", "probes.startup",
    "replay.resources", "replay.probes.liveness", "replay.probes.readiness",
}


def value_keys(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = prefix + key
        if isinstance(value, dict) and value and path not in FREE_FORM:
            yield from value_keys(value, path + ".")
        else:
            yield path


def test_readme_lists_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    documented = set(re.findall(r"^\| `([^`]+)` \|", (CHART / "README.md").read_text(), re.MULTILINE))
    keys = set(value_keys(values))
    assert keys - documented == set(), "values missing from README.md"
    assert documented - keys == set(), "README.md documents values that do not exist"


def test_schema_covers_every_value(chart: helm_python.Chart) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert set(values) <= set(schema["properties"])


def test_image_tags_follow_the_app_version() -> None:
    import tomllib

    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart_meta["appVersion"] == project["version"]
    assert values["image"]["tag"] == chart_meta["appVersion"]
    assert values["exportJob"]["image"]["tag"] == chart_meta["appVersion"] + "-spark"
    assert chart_meta["name"] == CHART.name


def test_notes_explain_the_mode(chart: helm_python.Chart) -> None:
    notes = chart.render({}, name=RELEASE, namespace=NAMESPACE)["rocketmq-tiered/templates/NOTES.txt"]
    assert "Attach mode" in notes and "rocketmq-tiered.sidecar" in notes and "WARNING" in notes
    values = load_values(SCENARIOS["irsa"])
    notes = chart.render(values, name=RELEASE, namespace=NAMESPACE)["rocketmq-tiered/templates/NOTES.txt"]
    assert "Sidecar mode" in notes and "eks.amazonaws.com/role-arn" in notes and "WARNING" not in notes


def test_export_cronjob_runs_a_valid_tiered_export(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The CronJob's command line parses against the real `tiered export` command."""
    import typer.main

    from tiered.cli import app

    job = one(rendered["sidecar-s3-monitoring"], "CronJob")
    container = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["tiered"]
    args = container["args"]
    assert args[:2] == ["export", "--config"] and args[args.index("--to") + 1] == "s3://analytics-lake/rocketmq"
    group = typer.main.get_command(app)
    ctx = group.make_context("tiered", list(args), resilient_parsing=False)
    name, cmd, rest = group.resolve_command(ctx, list(args))
    sub = cmd.make_context(name, rest, parent=ctx)
    assert sub.params["to"] == "s3://analytics-lake/rocketmq" and sub.params["engine"] == "spark"


def test_export_cronjob_requires_a_target(chart: helm_python.Chart) -> None:
    with pytest.raises(Exception, match="exportJob.to"):
        render(chart, {"exportJob": {"enabled": True}})


# --------------------------------------------------------------------------
# replay: `tiered replay` as its own Deployment and Service
# --------------------------------------------------------------------------

REPLAY_VALUES = {"replay": {"enabled": True, "broker": "broker-a", "start": ["audit-g=latest"],
                            "acl": {"existingSecret": "replay-acl", "key": "acl.yml"}}}


def replay_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "replay"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_replay_is_off_by_default(scenario: str, rendered) -> None:
    assert replay_objects(rendered[scenario]) == []
    assert not [d for d in rendered[scenario] if "replay" in d["metadata"]["name"]]


def test_replay_renders_a_deployment_and_service(chart: helm_python.Chart) -> None:
    values = load_values(SCENARIOS["sidecar-s3-monitoring"]) | REPLAY_VALUES
    docs = render(chart, values)
    replay = replay_objects(docs)
    assert sorted(d["kind"] for d in replay) == ["Deployment", "Service"]
    for doc in replay:
        validate_builtin(doc)
    deployment, service = one(replay, "Deployment", "-replay"), one(replay, "Service", "-replay")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ((_, _, sidecar),) = tiered_pods(docs)
    assert container["image"] == sidecar["image"]  # the same image as serve
    assert container["command"] == ["tiered", "replay"]
    assert container["args"] == [
        "--config", "/etc/tiered/config.yaml", "--listen", "$(POD_IP):9876", "--follow-interval", "10s",
        "--max-connections", "4096", "--broker", "broker-a", "--acl", "/etc/tiered-replay-acl/plain_acl.yml",
        "--start", "audit-g=latest"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # the same S3 credentials as the sidecar, by reference
    assert [e for e in container["env"] if e["name"].startswith("AWS_")] == [
        e for e in sidecar["env"] if e["name"].startswith("AWS_")] != []
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"remoting": 9876, "replay-metrics": 9464}
    assert (container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]) == (
        {"path": "/healthz", "port": "replay-metrics"}, {"path": "/readyz", "port": "replay-metrics"})
    assert container["resources"]["limits"]["memory"] == "512Mi"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["replay-acl"] == {"name": "replay-acl", "mountPath": "/etc/tiered-replay-acl", "readOnly": True}
    assert mounts["tiered-config"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["replay-acl"]["secret"] == {"secretName": "replay-acl", "defaultMode": 0o400,
                                               "items": [{"key": "acl.yml", "path": "plain_acl.yml"}]}
    assert volumes["tiered-config"]["configMap"]["name"] == one(docs, "ConfigMap", "-config")["metadata"]["name"]
    # the Service selects exactly the replay pods, on both ports
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    broker_pod = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= broker_pod.items()
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("remoting", 9876, "remoting"), ("replay-metrics", 9464, "replay-metrics")]
    assert of_kind(docs, "Secret") == []  # the ACL is referenced, never rendered


def test_replay_without_an_acl_mounts_none(chart: helm_python.Chart) -> None:
    docs = render(chart, {"replay": {"enabled": True, "port": 10876, "maxConnections": 10}})
    deployment = one(replay_objects(docs), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--acl" not in container["args"] and "--broker" not in container["args"]
    assert container["args"][2:8] == ["--listen", "$(POD_IP):10876", "--follow-interval", "10s",
                                      "--max-connections", "10"]
    assert "replay-acl" not in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for doc in replay_objects(docs):
        validate_builtin(doc)


@pytest.mark.parametrize("bad", [
    {"replay": {"enabled": True, "acl": {"secret": "x"}}},
    {"replay": {"enabled": True, "port": 0}},
    {"replay": {"enabled": True, "start": ["no-equals-sign"]}},
])
def test_schema_rejects_bad_replay_values(chart: helm_python.Chart, bad: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError, match="/replay"):
        chart.render(bad, name=RELEASE, namespace=NAMESPACE)


def test_the_rendered_replay_command_runs(chart: helm_python.Chart, tmp_path: Path) -> None:
    """The Deployment's args and the chart's config file, run by the real
    `tiered replay` (the pod IP as loopback, the archive a local one): it
    serves with the ACL, so a request without credentials is refused."""
    import os
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from replaykit import BROKER, CLUSTER, Raw, make_archive

    archived = make_archive(tmp_path / "archive")
    docs = render(chart, {"cluster": CLUSTER, "cold": {"url": archived.cold_url},
                          "replay": {"enabled": True, "broker": BROKER, "acl": {"existingSecret": "replay-acl"}}})
    (container,) = one(docs, "Deployment", "-replay")["spec"]["template"]["spec"]["containers"]
    config = yaml.safe_load(one(docs, "ConfigMap", "-config")["data"]["config.yaml"])
    config["state_dir"] = str(tmp_path / "state")
    config["metrics"] |= {"host": "127.0.0.1", "port": 0}  # free ports: tests run side by side
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "plain_acl.yml").write_text(
        "accounts:\n  - {accessKey: replayReader, secretKey: s3cretValue42, defaultTopicPerm: SUB}\n")
    args = [a.replace("/etc/tiered/config.yaml", str(tmp_path / "config.yaml"))
             .replace("/etc/tiered-replay-acl/plain_acl.yml", str(tmp_path / "plain_acl.yml"))
             .replace("$(POD_IP):9876", "127.0.0.1:0") for a in container["args"]]
    proc = subprocess.Popen([sys.executable, "-m", "tiered.cli", *container["command"][1:], *args],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("tiered replay: serving on "):
                break
        address = lines[-1].rsplit(" ", 1)[1].strip()
        assert not [x for x in lines if "WARNING" in x], lines
        raw = Raw(address)
        try:
            assert raw.call(30, {"topic": "Orders", "queueId": "0"}).code == 16  # NO_PERMISSION
        finally:
            raw.close()
    finally:
        proc.terminate()
        proc.wait(30)
