# syntax=docker/dockerfile:1
#
# tiered: RocketMQ tiered-storage archival sidecar.
#
# Targets:
#   runtime (default)  slim Python image, `tiered serve` as the entrypoint; no
#       pyspark/pyarrow (~175 MB of packages: python bench/image_size.py).
#       docker build -t rocketmq-tiered:0.1.0 .
#   spark              runtime + the `spark` extra + a Java 17 runtime for
#       `tiered sql` / `tiered export`.
#       docker build --target spark -t rocketmq-tiered:0.1.0-spark .
#
# Both run as the unprivileged user `tiered` (uid/gid 10001) and work with a
# read-only root filesystem as long as /tmp and the state directory
# (/var/lib/tiered) are writable volumes, as the Helm chart mounts them.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

################################################################################
# build: the sidecar's virtualenv: the package and its runtime dependencies
# only, at the versions constraints.txt pins (the tested set). No pyspark or
# pyarrow: they belong to the `spark` extra (bench/image_size.py measures it).
################################################################################
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/tiered
WORKDIR /src

# A C compiler and the CRC libraries for the native core (tiered/_native.c, an
# optional extension: without it the sidecar runs its Python path, slower). In
# this stage only: the final images get the built module, not the compiler.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libisal-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*

# Dependencies first, in their own layer: it is rebuilt only when
# pyproject.toml or constraints.txt change, not on every source edit.
COPY pyproject.toml constraints.txt ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
 && /opt/tiered/bin/pip install -c constraints.txt -r /tmp/requirements.txt

# Then the package itself (.dockerignore lets only the sources through).
COPY . ./
RUN /opt/tiered/bin/pip install --no-deps . \
 && /opt/tiered/bin/tiered --help > /dev/null

################################################################################
# build-spark: the same virtualenv plus the `spark` extra (pyspark, pyarrow).
################################################################################
FROM build AS build-spark

RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["spark"]))' \
        > /tmp/spark-requirements.txt \
 && /opt/tiered/bin/pip install -c constraints.txt -r /tmp/spark-requirements.txt \
 && /opt/tiered/bin/python -c 'import pyspark, pyarrow'

################################################################################
# base: what both final images share.
################################################################################
FROM ${PYTHON_IMAGE} AS base

ARG UID=10001
ARG GID=10001

ENV PATH=/opt/tiered/bin:${PATH} \
    VIRTUAL_ENV=/opt/tiered \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/tiered

# ISA-L: the native core's CRC-32, linked in the build stage
RUN apt-get update \
 && apt-get install -y --no-install-recommends libisal2 \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid "${GID}" tiered \
 && useradd --system --uid "${UID}" --gid "${GID}" --home-dir /home/tiered --create-home \
        --shell /usr/sbin/nologin tiered \
 && install -d -o "${UID}" -g "${GID}" -m 0750 /var/lib/tiered /etc/tiered

WORKDIR /home/tiered
VOLUME ["/var/lib/tiered"]
# /metrics, /healthz (liveness: the scheduler loop is alive) and /readyz
# (standalone readiness; the chart never probes it, see its README).
EXPOSE 9464

################################################################################
# spark: Java for the Spark jobs (`tiered sql`, `tiered export`).
################################################################################
FROM base AS spark

# pyspark 4 needs Java 17 or newer; Debian bookworm ships 17. The man1
# directory works around the JRE postinst failing on slim images.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java

# After Java: a source edit rebuilds only this layer, not the JRE's.
COPY --from=build-spark /opt/tiered /opt/tiered

ENV JAVA_HOME=/opt/java \
    PYSPARK_PYTHON=/opt/tiered/bin/python \
    SPARK_LOCAL_DIRS=/tmp

USER 10001:10001
ENTRYPOINT ["tiered"]
CMD ["--help"]

################################################################################
# runtime (default target): the sidecar.
################################################################################
FROM base AS runtime

COPY --from=build /opt/tiered /opt/tiered

USER 10001:10001
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=4)"]
ENTRYPOINT ["tiered", "serve"]
CMD ["--config", "/etc/tiered/config.yaml"]
