"""boto3's ``download_file`` against ``trtet_store.fetch``, then a delta update, on one S3 server.

A program of a small header and two engines of ``--engine-size`` random
bytes (default 1 GiB each) is published with ``trtet_store.publish`` to a
SeaweedFS ``weed mini`` on loopback. Then, alternating, ``--repeat`` times
each: boto3 ``download_file`` (s3transfer's defaults) and ``trtet_store.fetch``
into an empty directory, measuring wall time (with an ``fsync`` of the
result for both, since fetch's write is durable) and peak extra disk
(statvfs polled). Then a new version in which the second engine changed is
published, and ``fetch`` updates a copy of the first version in place,
``--repeat`` times: bytes downloaded and wall time.

The downloads land on a dedicated loop filesystem (``--filesystem ext4`` or
``xfs``, as root; its peak disk is ours alone), or in a directory under
/var/tmp (``here``, shared with whatever else runs)::

    sudo .venv/bin/python benchmarks/fetch.py [--engine-size 1G] [--repeat 5] \
        [--filesystem ext4|xfs|here]

The S3 server is started with :mod:`trtet_store.testing.s3server` (the one
launcher of ``weed mini`` on free ports, which the tests' fixtures use too).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trtet_store
from trtet_store.bench.config import size_arg
from trtet_store.bench.measure import PeakDiskMonitor
from trtet_store.testing.s3server import running_server

MiB = 1 << 20


def write_program(path: Path, engine_size: int, seeds: tuple[int, int]) -> None:
    """A 64 KiB header, then two page-aligned engines of random bytes, streamed to ``path``."""
    with open(path, "wb") as f:
        f.write(os.urandom(64 * 1024))
        for seed in seeds:
            rnd = __import__("random").Random(seed)
            left = engine_size
            while left:
                n = min(64 * MiB, left)
                f.write(rnd.randbytes(n))
                left -= n


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(directory: Path, fn) -> tuple[float, int]:
    with PeakDiskMonitor(directory) as mon:
        t0 = time.monotonic()
        fn()
        seconds = time.monotonic() - t0
    return seconds, mon.peak_extra_bytes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine-size", type=size_arg, default=1 << 30)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--filesystem", choices=("ext4", "xfs", "here"),
                   default="ext4" if os.geteuid() == 0 else "here")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trtet-fetch-bench-", dir="/var/tmp"))
    factory = None
    stack = contextlib.ExitStack()
    try:
        if args.filesystem == "here":
            target = work
        else:
            from trtet_store.testing.loopfs import FilesystemFactory

            factory = FilesystemFactory()
            # The old and the new program side by side, plus room for the moves.
            target = factory.make(args.filesystem, 4 * args.engine_size // MiB + 1024)
        server = stack.enter_context(running_server())
        ep = server.endpoint
        os.environ.update(ep.environ())
        client = ep.client(read_timeout=300)
        bucket = server.new_bucket("bench")
        url = f"s3://{bucket}/model.pte"
        src = work / "src"
        src.mkdir()
        write_program(src / "model.pte", args.engine_size, (1, 2))
        total = os.path.getsize(src / "model.pte")
        trtet_store.publish(src / "model.pte", url, endpoint_url=ep.url,
                            journal_dir=work / "journal")
        out = target / "out"
        rows: dict[str, list[tuple[float, int]]] = {"boto3 download_file": [],
                                                    "trtet_store.fetch": []}
        for _ in range(args.repeat):
            for name in rows:
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                dest = out / "model.pte"
                if name.startswith("boto3"):
                    def run(dest=dest):
                        client.download_file(bucket, "model.pte", os.fspath(dest))
                        fsync_file(dest)
                else:
                    def run(dest=dest):
                        trtet_store.fetch(url, dest, endpoint_url=ep.url)
                seconds, peak = timed(out, run)
                rows[name].append((seconds, peak))
        print(f"\nfetch of one object, header + 2 x {args.engine_size / MiB:.0f} MiB engines "
              f"({total / MiB:.0f} MiB), {args.repeat} alternating runs, on "
              f"{_fstype(target)}")
        print(f"{'method':<22} {'median s':>9} {'min s':>7} {'max s':>7} {'peak extra disk':>16}")
        med = {}
        for name, runs in rows.items():
            secs = [s for s, _ in runs]
            med[name] = statistics.median(secs)
            print(f"{name:<22} {med[name]:>9.2f} {min(secs):>7.2f} {max(secs):>7.2f} "
                  f"{max(pk for _, pk in runs) / MiB:>12.1f} MiB")
        print(f"ratio of medians fetch / download_file: "
              f"{med['trtet_store.fetch'] / med['boto3 download_file']:.2f}x")
        # The delta update: the second engine changed.
        write_program(src / "model.pte", args.engine_size, (1, 3))
        trtet_store.publish(src / "model.pte", url, endpoint_url=ep.url, replace=True,
                            journal_dir=work / "journal")
        v1 = work / "v1.pte"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        write_program(v1, args.engine_size, (1, 2))
        deltas = []
        for _ in range(args.repeat):
            shutil.copyfile(v1, out / "model.pte")
            fsync_file(out / "model.pte")
            result = {}

            def run(result=result):
                result["r"] = trtet_store.fetch(url, out / "model.pte", endpoint_url=ep.url)
            seconds, peak = timed(out, run)
            r = result["r"]
            deltas.append((seconds, r.bytes_downloaded, r.bytes_reused, dict(r.reused_by),
                           peak))
        secs = [d[0] for d in deltas]
        print(f"\ndelta update (second engine changed), {args.repeat} runs: median "
              f"{statistics.median(secs):.2f} s (min {min(secs):.2f}, max {max(secs):.2f}); "
              f"downloaded {deltas[0][1] / MiB:.1f} MiB = {deltas[0][1] / total:.1%} of the "
              f"program; reused {deltas[0][2] / MiB:.1f} MiB by "
              f"{', '.join(f'{k} {v / MiB:.1f} MiB' for k, v in deltas[0][3].items())}; "
              f"peak extra disk {max(d[4] for d in deltas) / MiB:.1f} MiB")
    finally:
        stack.close()
        if factory is not None:
            factory.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _fstype(path: Path) -> str:
    best, kind = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if os.fspath(path).startswith(mnt) and len(mnt) > len(best):
                best, kind = mnt, fstype
    return kind


if __name__ == "__main__":
    sys.exit(main())
