"""The Dockerfile and its build context, checked without a Docker engine:
the stages and their users and entrypoints, agreement with the chart
(uid, port, image tags), and what the .dockerignore allowlist lets into
the context (every package file, nothing local)."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CHART = ROOT / "helm" / "rocketmq-tiered"


def stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            match = re.match(r"(\S+)\s+AS\s+(\S+)$", args.strip(), re.IGNORECASE)
            assert match, f"every stage is named: FROM {args}"
            current = match.group(2)
            out[current] = [("FROM", match.group(1))]
        elif current is not None:
            out[current].append((instruction, args.strip()))
    return out


def last(stage: list[tuple[str, str]], instruction: str) -> str | None:
    values = [args for ins, args in stage if ins == instruction]
    return values[-1] if values else None


def effective(name: str, all_stages: dict[str, list[tuple[str, str]]], instruction: str) -> str | None:
    """An instruction's value in a stage, inherited through FROM <stage>."""
    while name in all_stages:
        value = last(all_stages[name], instruction)
        if value is not None:
            return value
        name = all_stages[name][0][1]
    return None


def test_targets_and_default() -> None:
    all_stages = stages()
    assert list(all_stages) == ["build", "build-spark", "base", "spark", "runtime"]
    # `docker build .` builds the last stage: the slim sidecar image.
    assert list(all_stages)[-1] == "runtime"
    assert all_stages["build-spark"][0] == ("FROM", "build")
    assert all_stages["spark"][0] == ("FROM", "base")
    assert all_stages["runtime"][0] == ("FROM", "base")
    assert "slim" in re.search(r"ARG PYTHON_IMAGE=(\S+)", DOCKERFILE.read_text()).group(1)


@pytest.mark.parametrize("target", ["runtime", "spark"])
def test_final_images_run_as_a_numeric_non_root_user(target: str) -> None:
    user = effective(target, stages(), "USER")
    assert user and re.fullmatch(r"[0-9]+(:[0-9]+)?", user), user
    uid = int(user.split(":")[0])
    assert uid != 0
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart_values["securityContext"]["runAsUser"] == uid
    assert chart_values["securityContext"]["runAsGroup"] == int(user.split(":")[1])


def test_entrypoints() -> None:
    all_stages = stages()
    assert json.loads(effective("runtime", all_stages, "ENTRYPOINT")) == ["tiered", "serve"]
    assert json.loads(effective("runtime", all_stages, "CMD")) == ["--config", "/etc/tiered/config.yaml"]
    assert json.loads(effective("spark", all_stages, "ENTRYPOINT")) == ["tiered"]


def test_spark_target_has_java_and_runtime_does_not() -> None:
    all_stages = stages()
    spark_runs = " ".join(args for ins, args in all_stages["spark"] if ins == "RUN")
    assert re.search(r"openjdk-(1[7-9]|2[0-9])-jre-headless", spark_runs)
    assert "JAVA_HOME=" in (effective("spark", all_stages, "ENV") or "")
    runtime_and_base = all_stages["runtime"] + all_stages["base"]
    assert not any("jre" in args or "jdk" in args for _, args in runtime_and_base)


def test_port_matches_the_chart_and_service() -> None:
    from tiered.config import MetricsSettings

    base = stages()["base"]
    assert last(base, "EXPOSE") == str(MetricsSettings().port)
    assert yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]["port"] == MetricsSettings().port
    assert f"127.0.0.1:{MetricsSettings().port}/healthz" in (last(stages()["runtime"], "HEALTHCHECK") or "")


def test_package_is_installed_with_pip_from_the_context() -> None:
    runs = [args for ins, args in stages()["build"] if ins == "RUN"]
    assert any("pip install --no-deps ." in args for args in runs)
    assert any("-r /tmp/requirements.txt" in args for args in runs)
    # each final image gets its own virtualenv: the sidecar's has no Spark
    all_stages = stages()
    assert ("COPY", "--from=build /opt/tiered /opt/tiered") in all_stages["runtime"]
    assert ("COPY", "--from=build-spark /opt/tiered /opt/tiered") in all_stages["spark"]
    assert not any(ins == "COPY" and "/opt/tiered" in args for ins, args in all_stages["base"])


def test_installs_are_pinned_by_the_constraints() -> None:
    """Every pip install of a dependency goes through constraints.txt, which
    the build context carries; the sidecar's requirements are the project's
    dependencies alone, the spark image's add the `spark` extra."""
    all_stages = stages()
    assert ("COPY", "pyproject.toml constraints.txt ./") in all_stages["build"]
    for stage in ("build", "build-spark"):
        for args in (a for ins, a in all_stages[stage] if ins == "RUN" and "pip install" in a):
            for command in re.findall(r"pip install [^&]*", args):
                assert "--no-deps" in command or "-c constraints.txt" in command, command
    build_runs = " ".join(a for ins, a in all_stages["build"] if ins == "RUN")
    assert '["project"]["dependencies"]' in build_runs and "optional-dependencies" not in build_runs
    spark_runs = " ".join(a for ins, a in all_stages["build-spark"] if ins == "RUN")
    assert '["optional-dependencies"]["spark"]' in spark_runs
    assert in_context("constraints.txt", ignore_rules())


# --------------------------------------------------------------------------
# .dockerignore: Docker's rules are "last matching pattern wins", a pattern
# that matches a directory covers everything below it, `*` does not cross
# `/`, `**` does, and `!` re-includes.
# --------------------------------------------------------------------------


def ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex, i = regex + pattern[i : end + 1], end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((include, re.compile(regex + r"\Z")))
    return rules


def in_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for include, regex in rules:
        if any(regex.match(prefix) for prefix in prefixes):
            included = include
    return included


def test_dockerignore_matcher_understands_the_rules() -> None:
    rules = [(False, re.compile(r"[^/]*\Z")), (True, re.compile(r"pkg\Z")), (False, re.compile(r"(?:.*/)?__pycache__\Z"))]
    assert in_context("pkg/a.py", rules) and not in_context("other/a.py", rules)
    assert not in_context("pkg/__pycache__/a.pyc", rules)


def test_context_ships_every_package_file_and_nothing_local() -> None:
    rules = ignore_rules()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    folders = ["tiered", *setuptools["package-dir"].values()]  # tiered.dispatcher... live at the top
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    needed = {"pyproject.toml", "setup.py", "constraints.txt", project["project"]["readme"]}
    needed |= {f"{module}.py" for module in setuptools["py-modules"]}
    needed |= {f for f in tracked if f.split("/")[0] in folders}
    assert len(needed) > 5
    for path in sorted(needed):
        if (ROOT / path).exists():
            assert in_context(path, rules), f"{path} is needed by `pip install .` but .dockerignore drops it"
    for path in (".venv/bin/python", ".git/config", "tests/helm/test_helm_chart.py", "helm/rocketmq-tiered/values.yaml",
                 "tiered/__pycache__/config.cpython-311.pyc", "bench/run.py", ".env", "secrets/aws.json"):
        assert not in_context(path, rules), f"{path} must not reach the build context"
