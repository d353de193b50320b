"""The floors bench/dispatch.py measures the dispatcher against, in the same
run: ``cp -r`` (+ ``sync``) of the CommitLog, an O_DIRECT writer of the same
bytes, and the S3 servers (a fresh moto per run, one SeaweedFS with a fresh
bucket per run)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


@contextlib.contextmanager
def moto_server(bucket: str) -> Iterator[str]:
    """A fresh moto server in its own process, with ``bucket``: every moto
    phase gets its own, as moto slows down with what it already holds."""
    code = ("import sys, time\nfrom moto.server import ThreadedMotoServer\n"
            "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); s.start()\n"
            "h, p = s.get_host_and_port(); print(f'http://{h}:{p}', flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        endpoint = proc.stdout.readline().strip()
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


@contextlib.contextmanager
def seaweed_servers(work: Path) -> Iterator[Callable[[str], contextlib.AbstractContextManager[tuple[str, str]]]]:
    """One real SeaweedFS (tests/support/seaweed.py; ``weed`` from the test
    extra) for the phase, a fresh bucket for each run."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from seaweed import SeaweedS3

    import boto3

    server = SeaweedS3(work / "seaweedfs", access_key=os.environ["AWS_ACCESS_KEY_ID"],
                       secret_key=os.environ["AWS_SECRET_ACCESS_KEY"]).start()
    count = iter(range(1 << 30))

    @contextlib.contextmanager
    def bucket(name: str) -> Iterator[tuple[str, str]]:
        client = boto3.client("s3", endpoint_url=server.endpoint)
        fresh = f"{name}-{next(count)}"
        client.create_bucket(Bucket=fresh)
        try:
            yield server.endpoint, fresh
        finally:  # every run on a server holding as little as the first did
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=fresh):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    client.delete_objects(Bucket=fresh, Delete={"Objects": keys})
            client.delete_bucket(Bucket=fresh)
    try:
        yield bucket
    finally:
        server.stop()
        shutil.rmtree(work / "seaweedfs", ignore_errors=True)


@contextlib.contextmanager
def moto_servers(work: Path) -> Iterator[Callable[[str], contextlib.AbstractContextManager[tuple[str, str]]]]:
    """A fresh moto server for each run, as moto slows down with what it holds."""
    @contextlib.contextmanager
    def bucket(name: str) -> Iterator[tuple[str, str]]:
        with moto_server(name) as endpoint:
            yield endpoint, name
    yield bucket


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / MiB / seconds if seconds > 0 else float("inf")


def measure_cp(work: Path, nbytes: int, repeat: int, object_bytes: int) -> dict[str, float]:
    """cp of the same CommitLog files, and once more made durable the way the
    dispatcher makes its objects durable: the best of ``repeat`` runs each;
    and the O_DIRECT reference (``measure_direct``)."""
    # Durable: an fsync of each copied file and of the directories holding
    # their names (``sync FILE... DIR...``, as file:// objects are made
    # durable), files never written before (a fresh directory), nothing else
    # flushed (a bare ``sync`` also flushes whatever other processes left
    # dirty, or nothing at all when the copy already reached the disk)
    dest = work / "cp-dest"
    cl_dir = work / "store" / "commitlog"
    cp_s = float("inf")
    for _ in range(repeat):
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        started = time.perf_counter()
        subprocess.run(["cp", "-r", str(cl_dir), str(dest)], check=True)
        cp_s = min(cp_s, time.perf_counter() - started)
    cp_sync_s = float("inf")
    for _ in range(repeat):
        shutil.rmtree(dest)
        dest.mkdir()
        subprocess.run(["sync", "-f", str(dest)], check=True)  # the deletes, not timed
        started = time.perf_counter()
        subprocess.run(["sh", "-c", f"cp -r '{cl_dir}' '{dest}' && sync '{dest}'/commitlog/* '{dest}/commitlog' '{dest}'"], check=True)
        cp_sync_s = min(cp_sync_s, time.perf_counter() - started)
    shutil.rmtree(dest)
    # the same bytes for every rate: the records (cp also copies the written
    # part of the last, preallocated file; its sparse tail costs it nothing)
    cp_mbps = mbps(nbytes, cp_s)
    cp_sync_mbps = mbps(nbytes, cp_sync_s)
    return {"cp_s": cp_s, "cp_sync_s": cp_sync_s, "cp_mbps": cp_mbps, "cp_sync_mbps": cp_sync_mbps,
            **measure_direct(work, nbytes, repeat, object_bytes)}


def measure_direct(work: Path, nbytes: int, repeat: int, object_bytes: int) -> dict[str, float]:
    """A reference, not the goal's floor: what a writer around the page cache
    can do at best on this disk. The same bytes read from the CommitLog
    files (page cache warm) into one page-aligned buffer, written as objects
    of the segment size with O_DIRECT (the last partial page buffered),
    each file fsynced, then their directory: as the dispatcher's file://
    objects are made durable, with nothing else to do. Wall and CPU, each
    the best of ``repeat``; NaN where the file system refuses O_DIRECT."""
    import mmap

    dest = work / "direct-dest"
    files = sorted((work / "store" / "commitlog").iterdir())
    best_s = best_cpu = float("inf")
    buf = mmap.mmap(-1, object_bytes)  # anonymous: starts at a page
    view = memoryview(buf)
    try:
        for _ in range(repeat):
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            subprocess.run(["sync", "-f", str(dest)], check=True)  # the deletes, not timed
            started, cpu = time.perf_counter(), time.process_time()
            left, index = nbytes, 0
            srcs = iter(files)
            src, at = os.open(next(srcs), os.O_RDONLY), 0
            try:
                while left:
                    n = filled = min(object_bytes, left)
                    while filled:  # across CommitLog files, as segments span them
                        got = os.preadv(src, [view[n - filled:n]], at)
                        if not got:
                            os.close(src)
                            src, at = os.open(next(srcs), os.O_RDONLY), 0
                            continue
                        filled -= got
                        at += got
                    fd = os.open(dest / f"{index:08d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
                    try:
                        head = n - n % 4096
                        if head:
                            os.write(fd, view[:head])
                        if head < n:
                            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                            os.write(fd, view[head:n])
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    left -= n
                    index += 1
            finally:
                os.close(src)
            dirfd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dirfd)
            os.close(dirfd)
            best_s = min(best_s, time.perf_counter() - started)
            best_cpu = min(best_cpu, time.process_time() - cpu)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        best_s = best_cpu = float("nan")  # no O_DIRECT here
    finally:
        view.release()
        buf.close()
        shutil.rmtree(dest, ignore_errors=True)
    return {"direct_s": best_s, "direct_cpu": best_cpu, "direct_mbps": mbps(nbytes, best_s)}
