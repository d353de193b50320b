"""Installed size of the sidecar image's virtualenv, measured without a Docker engine.

    python bench/image_size.py              # the runtime image's /opt/tiered
    python bench/image_size.py --spark      # also the spark image's (+ the `spark` extra)
    python bench/image_size.py --keep DIR   # build into DIR and leave it there

Runs the Dockerfile's `build` stage (and, with --spark, its `build-spark`
stage) in a fresh virtualenv on this machine: ``python -m venv``, then
``pip install -c constraints.txt -r <project.dependencies>``, then
``pip install --no-deps .`` from a copy of the build context. The commands
are the Dockerfile's own (BUILD_STEPS, SPARK_STEPS; tests/helm checks that
the Dockerfile runs exactly these). Prints the virtualenv's apparent size
(what an image layer holds) and its disk usage (``du``), the largest
installed packages, and whether pyspark or pyarrow got in.

Goal: the runtime virtualenv at most 250 MB (GOAL_BYTES). The final image
adds the python:3.11-slim base (about 130 MB, the same for every build).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from benchdocs import add_option, recorded

ROOT = Path(__file__).resolve().parents[1]
GOAL_BYTES = 250 * 1000 * 1000
VENV = "/opt/tiered"
# The Dockerfile's install commands, verbatim (with the image's venv path).
BUILD_STEPS = (
    f"python -m venv {VENV}",
    f"{VENV}/bin/pip install -c constraints.txt -r /tmp/requirements.txt",
    f"{VENV}/bin/pip install --no-deps .",
)
SPARK_STEPS = (f"{VENV}/bin/pip install -c constraints.txt -r /tmp/spark-requirements.txt",)
# Only what the .dockerignore allowlist lets into the context matters to pip.
CONTEXT = ("pyproject.toml", "setup.py", "README.md", "constraints.txt", "LICENSE", "NOTICE")
QUERY_SIDE = ("pyspark", "pyarrow")


@dataclass(frozen=True, kw_only=True)
class VenvSize:
    path: Path
    apparent_bytes: int
    disk_bytes: int
    largest: tuple[tuple[str, int], ...]
    query_side_installed: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "path": str(self.path), "apparent_bytes": self.apparent_bytes, "disk_bytes": self.disk_bytes,
            "largest": dict(self.largest), "query_side_installed": list(self.query_side_installed),
        }


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def packages() -> list[str]:
    """The source folders `pip install .` ships: tiered and the folders
    pyproject's package-dir installs inside it (tiered.dispatcher...)."""
    return ["tiered", *_setuptools()["package-dir"].values()]


def modules() -> list[str]:
    """The single-file modules it ships (pyproject's py-modules)."""
    return [f"{name}.py" for name in _setuptools()["py-modules"]]


def requirements(extra: str | None = None) -> list[str]:
    """What the Dockerfile's `python -c 'import tomllib ...'` writes to its requirements file."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["optional-dependencies"][extra] if extra else project["dependencies"])


def copy_context(dst: Path) -> Path:
    """The build context the Dockerfile sees: sources and metadata, no caches."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in (*CONTEXT, *modules()):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dst / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.py[cod]", "*.so", "*.egg-info", ".pytest_cache")
    for pkg in packages():
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=ignore, symlinks=True)  # tiered/dispatcher stays a link
    return dst


def _run(step: str, *, venv: Path, context: Path, reqs: Path) -> None:
    args = step.replace(VENV, str(venv)).replace("/tmp/requirements.txt", str(reqs / "requirements.txt"))
    args = args.replace("/tmp/spark-requirements.txt", str(reqs / "spark-requirements.txt"))
    argv = args.split()
    if argv[0] == "python":
        argv[0] = sys.executable
    # As in the build stage; pip still compiles the .pyc files it installs.
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(argv, cwd=context, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{step!r} failed with exit {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def build(venv: Path, *, spark: bool = False, workdir: Path | None = None) -> Path:
    """Build the image's virtualenv at ``venv`` the way the Dockerfile does."""
    with tempfile.TemporaryDirectory(prefix="tiered-image-") as tmp:
        base = Path(workdir or tmp)
        context = copy_context(base / "src")
        reqs = base / "reqs"
        reqs.mkdir(exist_ok=True)
        (reqs / "requirements.txt").write_text("\n".join(requirements()) + "\n")
        (reqs / "spark-requirements.txt").write_text("\n".join(requirements("spark")) + "\n")
        for step in BUILD_STEPS + (SPARK_STEPS if spark else ()):
            _run(step, venv=venv, context=context, reqs=reqs)
    return venv


def _apparent(path: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames + dirnames:
            st = os.lstat(os.path.join(dirpath, name))
            total += st.st_size
    return total


def measure(venv: Path) -> VenvSize:
    du = subprocess.run(["du", "-s", "--block-size=1", str(venv)], capture_output=True, text=True, check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    sizes = sorted(((p.name, _apparent(p)) for p in site.iterdir() if p.is_dir()), key=lambda x: -x[1])
    installed = tuple(name for name in QUERY_SIDE if (site / name).exists())
    return VenvSize(path=venv, apparent_bytes=_apparent(venv), disk_bytes=int(du.stdout.split()[0]),
                    largest=tuple(sizes[:8]), query_side_installed=installed)


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def _report(label: str, size: VenvSize, *, goal: bool) -> None:
    verdict = f" (goal <= {_mb(GOAL_BYTES)}: {'met' if size.apparent_bytes <= GOAL_BYTES else 'MISSED'})" if goal else ""
    print(f"{label}: {_mb(size.apparent_bytes)} apparent, {_mb(size.disk_bytes)} du{verdict}")
    print("  largest: " + ", ".join(f"{name} {_mb(n)}" for name, n in size.largest))
    print(f"  pyspark/pyarrow installed: {', '.join(size.query_side_installed) or 'no'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spark", action="store_true", help="also measure the spark image's virtualenv")
    ap.add_argument("--keep", type=Path, help="build here and keep the virtualenvs")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_option(ap)
    args = ap.parse_args()
    with recorded(args, "image_size"), tempfile.TemporaryDirectory(prefix="tiered-image-size-") as tmp:
        out = Path(args.keep or tmp)
        results = {"runtime": measure(build(out / "runtime"))}
        if args.spark:
            results["spark"] = measure(build(out / "spark", spark=True))
        if args.json:
            print(json.dumps({k: v.as_dict() for k, v in results.items()}, indent=2))
        else:
            print(f"cores: {os.cpu_count()}; python {sys.version.split()[0]}")
            _report("runtime image /opt/tiered", results["runtime"], goal=True)
            if "spark" in results:
                _report("spark image /opt/tiered", results["spark"], goal=False)
        runtime = results["runtime"]
        return 0 if runtime.apparent_bytes <= GOAL_BYTES and not runtime.query_side_installed else 1


if __name__ == "__main__":
    sys.exit(main())
