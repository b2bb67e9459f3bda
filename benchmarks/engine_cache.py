#!/usr/bin/env python3
"""The engine cache: cold compile_and_save (miss) against warm (hit), and Torch-TensorRT's own.

Per filesystem (a dedicated sparse loop image, as root), alternating the
methods, ``--repeat`` runs each:

- ``cold``: ``compile_and_save(..., engine_cache=cache)`` on an emptied cache:
  the (stubbed) build stages the engines, they enter the cache, the save
  consumes the staged engines;
- ``warm``: the same call on the filled cache: no build, each engine placed
  from the cache (a clone on XFS, a copy on ext4), then the save;
- ``upstream``: torch-tensorrt 2.14.0's ``DiskEngineCache`` from its wheel
  (``trtet_store.testing.upstream_engine_cache``: its code unchanged, imports
  stubbed) with the same engine bytes: ``insert`` (``pack`` + ``save``) in one
  process, ``check`` (``load`` + ``unpack``) in a fresh one, as a later
  compile would;
- ``adapter``: the same two steps through our ``for_torch_tensorrt`` adapter
  (upstream's ``insert``/``check`` over our ``save``/``load``);
- ``refit`` (issue 46): on an emptied cache, export A with
  ``immutable_weights=False`` (not measured: a build, kept under its full key
  and as the structure entry), change every weight, export B (measured: no
  build, each engine refit by the stub's ``FakeRefitter``, which streams the
  structure engine's bytes behind a header, so its time is a lower bound);
  ``refit-again`` is B once more (a clone hit: no refit, no build).

The shared tier (issue 37), on one SeaweedFS server
(``trtet_store.testing.s3server``, started here, its data under ``/tmp``),
every request through a counting loopback proxy
(``trtet_store.testing.proxy.CountingProxy``: the bytes downloaded and
uploaded are the proxy's counts, headers included, not the client's report):

- ``remote-refit`` (issue 46 item 5): machine A (a cache directory) exports
  with ``immutable_weights=False`` on an empty bucket prefix (not measured:
  a build, published with its structure entry); every weight changed;
  machine B (another, empty cache directory) exports (measured): the tier
  has no full entry of B's weights, so B downloads A's structure entry into
  its cache and refits each engine: no build (the bytes downloaded are the
  structure entry's, once);
- ``publish``: ``compile_and_save`` on an empty cache with
  ``EngineCache(remote=...)`` and an empty bucket prefix: the cold build, then
  its entry published (what the first machine of a team pays);
- ``remote-hit``: ``compile_and_save`` on an emptied local cache whose bucket
  prefix holds the entry another cache directory (another machine) built and
  published before the runs: the entry downloaded into the local cache
  (fetch's machinery: ranged GETs, checksums verified), then placed as a
  local hit (a clone on XFS, a copy on ext4);
- ``pull``: ``cache.pull([key])`` alone on the emptied local cache (the
  tier's fetch into the cache, no export);
- ``download``: boto3's ``download_file`` of the same entry's objects (the
  tier's bucket layout, ``<prefix><key>/<attempt>/<name>``) into a directory
  on the same filesystem, default ``TransferConfig``, nothing verified: what
  a plain S3 client pays for the bytes;
- ``s3-docs``: Torch-TensorRT's documented ``S3EngineCache`` example
  (``put_object``/``get_object`` of upstream's pickled entry,
  ``docsrc/tutorials/resource_memory/engine_cache.rst``; only an
  ``endpoint_url`` added), over upstream's ``insert`` (``pack`` + ``put_object``)
  in one process and ``check`` (``get_object`` + ``unpack``) in a fresh one.

Measured (see :class:`Costs`): wall time; bytes the process wrote
(``/proc/self/io`` write_bytes); bytes the loop device read and wrote
(``/sys/block/<loop>/stat``, every file under the mount dropped from the page
cache before the method and a ``syncfs`` after it, so reads are real and
writes counted); peak extra disk (``statvfs`` polled); peak RSS above the
process's RSS before the method (``VmHWM`` reset by ``/proc/self/clear_refs``;
for upstream/adapter/s3-docs, run in children, each child's own, the engines
in memory before an insert, as torch-tensorrt holds them); bytes on disk
after. ``--engine-mib 256,1024,4096`` runs every method at each size in turn
and ends with the warm hit's time and reads per size. The stubbed TensorRT
build (``trtet_store.testing.stub_tensorrt``) takes the time of writing
pseudo-random bytes, not hours: ``cold`` is a lower bound. Medians and
fastest runs, and their ratios.

    sudo .venv/bin/python benchmarks/engine_cache.py                      # 2 x 1 GiB, 5 runs
    sudo .venv/bin/python benchmarks/engine_cache.py --engine-mib 64 --repeat 2
    sudo .venv/bin/python benchmarks/engine_cache.py \\
        --methods cold,warm,publish,remote-hit,pull,download,s3-docs \\
        --out benchmarks/engine_cache_remote.md
    sudo .venv/bin/python benchmarks/engine_cache.py --methods cold,warm --engine-mib 256,1024,4096
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trtet_store.bench import measure
from trtet_store.io import bytes_digested
from trtet_store.io.units import MiB, format_mib

HERE = Path(__file__).resolve()


def fake_engine(size: int, seed: int) -> bytes:
    """The bytes ``stub_tensorrt.stage_fake_engine(store, size, seed)`` stages (same generator)."""
    import xxhash

    out = bytearray(size)
    rnd = xxhash.xxh3_128(seed=seed)
    pos = 0
    while pos < size:
        rnd.update(b"more")
        n = min(size - pos, MiB)
        out[pos:pos + n] = (rnd.digest() * (n // 16 + 1))[:n]
        pos += n
    return bytes(out)


def disk_usage(path: Path) -> int:
    """Bytes allocated under ``path`` (st_blocks), as ``du`` counts them."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


class Costs:
    """What one method cost besides its wall time: bytes written and read, peak RSS.

    - ``bytes_written``: ``write_bytes`` of ``/proc/self/io`` (this process's
      dirtied pages; a child's are not in it);
    - ``dev_read``, ``dev_written``: the loop device's sectors read and
      written (``/sys/block/<loop>/stat``) from entry to a ``syncfs`` at exit:
      every reader and writer of the benchmark's filesystem, children and the
      kernel's writeback included, and nothing of other filesystems (the S3
      server keeps its data under ``/tmp``). On entry every file under the
      mount is synced and dropped from the page cache (``POSIX_FADV_DONTNEED``
      per file, not a global ``drop_caches`` that would slow the machine's
      other work), so a read is a real read of the device;
    - ``peak_rss``: this process's ``VmHWM`` after resetting it
      (``/proc/self/clear_refs``, 5) on entry, minus ``VmRSS`` then: the
      growth over the process's baseline (its imports done), per method in
      one process. A method run in children reports the children's own;
    - ``digested``: the bytes io digested in this process meanwhile
      (``trtet_store.io.bytes_digested``): a warm hit's should be 0, a miss's
      and a remote hit's one per engine byte (issue 42).
    """

    def __init__(self, mnt: Path) -> None:
        self.mnt = mnt
        self.figures: dict[str, int] = {}

    def __enter__(self) -> Costs:
        measure.drop_file_pages(self.mnt)
        self._dev = measure.device_io(self.mnt)
        self._written = measure.bytes_written()
        measure.reset_peak_rss()
        self._rss = measure.current_rss_bytes()
        self._digested = bytes_digested()
        return self

    def __exit__(self, *exc: object) -> None:
        measure.syncfs(self.mnt)
        dev = measure.device_io(self.mnt)
        self.figures = {"bytes_written": measure.bytes_written() - self._written,
                        "peak_rss": measure.peak_rss_bytes() - self._rss,
                        "digested": bytes_digested() - self._digested}
        if dev is not None and self._dev is not None:
            self.figures["dev_read"] = dev[0] - self._dev[0]
            self.figures["dev_written"] = dev[1] - self._dev[1]


# -- upstream's cache and our adapter, each step in a child process --------------------------

def s3_engine_cache_class(base: type) -> type:
    """Torch-TensorRT's documented ``S3EngineCache``, on ``base`` (upstream's ``BaseEngineCache``).

    As ``docsrc/tutorials/resource_memory/engine_cache.rst`` shows it (2.14):
    ``save`` is one ``put_object`` of the pickled entry, ``load`` one
    ``get_object(...)["Body"].read()``, a missing key is a miss. The only
    change: ``endpoint_url`` (and path-style addressing, as the test server
    wants), so it reaches the benchmark's server through the counting proxy.
    """

    class S3EngineCache(base):
        def __init__(self, bucket: str, prefix: str = "trt_engines/", *,
                     endpoint_url: str | None = None) -> None:
            import boto3
            from botocore.config import Config

            self.s3 = boto3.client("s3", endpoint_url=endpoint_url,
                                   config=Config(s3={"addressing_style": "path"}))
            self.bucket = bucket
            self.prefix = prefix

        def save(self, hash: str, blob: bytes) -> None:  # noqa: A002  (upstream's names)
            key = f"{self.prefix}{hash}/blob.bin"
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=blob)

        def load(self, hash: str) -> bytes | None:  # noqa: A002
            key = f"{self.prefix}{hash}/blob.bin"
            try:
                resp = self.s3.get_object(Bucket=self.bucket, Key=key)
                return resp["Body"].read()
            except self.s3.exceptions.NoSuchKey:
                return None

    return S3EngineCache


def _upstream_cache(kind: str, directory: str, bound: int):
    from trtet_store.testing import upstream_engine_cache as uec

    mod = uec.load()
    if kind == "upstream":
        return mod.DiskEngineCache(directory, bound), uec
    if kind == "s3-docs":  # the bucket, prefix and endpoint come from the parent's environment
        cls = s3_engine_cache_class(mod.BaseEngineCache)
        return cls(os.environ["TRTET_BENCH_BUCKET"], os.environ["TRTET_BENCH_PREFIX"],
                   endpoint_url=os.environ["TRTET_BENCH_ENDPOINT"]), uec
    from trtet_store.cache import BlobCache

    with uec.as_torch_tensorrt(mod):
        from trtet_store.export.trt_engine_cache import for_torch_tensorrt

        return for_torch_tensorrt(BlobCache(directory, max_bytes=bound),
                                  tensorrt_version="10.14.1", compute_capability="sm_90"), uec


def child(kind: str, step: str, directory: str, size: int, engines: int) -> dict:
    """One step (``save`` or ``load``) of ``kind`` (``upstream`` or ``adapter``), measured here."""
    import xxhash

    bound = engines * (size + MiB) + 64 * MiB
    cache, uec = _upstream_cache(kind, directory, bound)
    hashes = [f"{i:064x}" * 3 for i in range(engines)]
    if step == "save":
        entries = [(fake_engine(size, i), [f"input_{i}"], [f"output_{i}"],
                    [uec.Input((2, 16))], uec.CompilationSettings(), False, False, {})
                   for i in range(engines)]
    measure.reset_peak_rss()
    base = measure.current_rss_bytes()
    written = measure.bytes_written()
    start = time.monotonic()
    if step == "save":
        for h, e in zip(hashes, entries, strict=True):
            cache.insert(h, e)
        got = []
    else:
        got = [cache.check(h) for h in hashes]
    seconds = time.monotonic() - start
    peak = measure.peak_rss_bytes() - base
    written = measure.bytes_written() - written
    if step == "load":  # each engine came back whole (checked after the timing)
        want = [xxhash.xxh3_128_hexdigest(fake_engine(size, i)) for i in range(engines)]
        assert [g is not None and xxhash.xxh3_128_hexdigest(g[0]) for g in got] == want, \
            f"{kind}: an engine did not come back"
    return {"seconds": seconds, "peak_rss_extra": peak, "bytes_written": written}


def run_child(kind: str, step: str, directory: Path, size: int, engines: int,
              env: dict[str, str] | None = None) -> dict:
    with measure.PeakDiskMonitor(directory.parent) as mon:
        done = subprocess.run([sys.executable, os.fspath(HERE), "--child", kind, step,
                               os.fspath(directory), str(size), str(engines)],
                              capture_output=True, text=True, timeout=3600,
                              env=None if env is None else {**os.environ, **env})
    if done.returncode:
        raise RuntimeError(f"{kind} {step} failed: {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["peak_extra_disk"] = mon.peak_extra_bytes
    return out


def upstream_run(kind: str, mnt: Path, size: int, engines: int) -> dict:
    """Save in one process, load in a fresh one; the cache directory removed afterwards."""
    import shutil

    directory = mnt / f"{kind}-cache"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700)
    with Costs(mnt) as costs:
        save = run_child(kind, "save", directory, size, engines)
        on_disk = disk_usage(directory)
        load = run_child(kind, "load", directory, size, engines)
    shutil.rmtree(directory)
    return {**device_figures(costs), "save_s": save["seconds"], "load_s": load["seconds"],
            "seconds": save["seconds"] + load["seconds"],
            "save_rss": save["peak_rss_extra"], "load_rss": load["peak_rss_extra"],
            "bytes_written": save["bytes_written"] + load["bytes_written"],
            "peak_extra_disk": max(save["peak_extra_disk"], load["peak_extra_disk"]),
            "on_disk": on_disk}


def device_figures(costs: Costs) -> dict[str, int]:
    """The device's figures of a method run in children (theirs are in their own rows)."""
    return {k: v for k, v in costs.figures.items() if k.startswith("dev_")}


# -- compile_and_save through the cache, in this process ----------------------------------------

def compile_run(cache, mnt: Path, size: int, engines: int, *, cold: bool,
                built: int | None = None, proxy=None, outcome: str | None = None) -> dict:
    """One ``compile_and_save`` through ``cache``; ``cold``: on an emptied cache (it builds).

    With ``proxy`` (a remote tier behind it): the bytes it forwarded during the
    call, and each engine's outcome must be ``outcome`` (``"remote-hit"``, or
    ``"miss"`` published).
    """
    import torch

    import trtet_store
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    if cold:
        cache.clear()
        settle(mnt)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    inputs = (torch.randn(2, 16),)
    out = mnt / "model.pte"
    builder = FakeBuilder(engine_sizes=(size,) * engines)
    with installed(builder), Costs(mnt) as costs:
        if proxy is not None:
            proxy.reset()
        start = time.monotonic()
        # As before this issue: the time includes the monitor's sync at its exit (the
        # bytes a run wrote reach the disk within its time).
        with measure.PeakDiskMonitor(mnt) as mon:
            report = trtet_store.compile_and_save(module, inputs, out, engine_cache=cache)
        seconds = time.monotonic() - start
        traffic = proxy.counts() if proxy is not None else None
    events = getattr(report, "engine_cache", None) or []
    outcomes = sorted({f"{e.outcome}:{e.placement}" for e in events})
    want = built if built is not None else (engines if cold else 0)
    built = len(builder.built)
    assert built == want, f"{'cold' if cold else 'warm'} run built {built}, not {want}"
    if outcome is not None:
        got = [e.outcome for e in events]
        assert got == [outcome] * engines, f"wanted {outcome} for each engine, got {got}: " \
            f"{[getattr(e, 'reason', None) for e in events]}"
        if outcome == "miss":
            assert all(getattr(e, "published", None) for e in events), \
                f"not published: {[getattr(e, 'publish_reason', None) for e in events]}"
    out.unlink()
    res = {"seconds": seconds, **costs.figures,
           "peak_extra_disk": mon.peak_extra_bytes, "built": built,
           "outcomes": ",".join(outcomes), "on_disk": disk_usage(cache.directory)}
    if traffic is not None:
        res["downloaded"] = traffic["downstream"]
        res["uploaded"] = traffic["upstream"]
        # what the cache says it received (the events' count), beside the proxy's
        res["reported_downloaded"] = sum(getattr(e, "downloaded", None) or 0 for e in events)
    return res


# -- new weights, same engine: a refit (issue 46) --------------------------------------------

def _measured_export(module, inputs, out: Path, cache, mnt: Path, builder, refitter,
                     **settings) -> tuple[dict, object]:
    """One ``compile_and_save`` through ``cache`` with the stub seams, its costs measured."""
    import trtet_store
    from trtet_store.testing.stub_tensorrt import installed

    with installed(builder, refitter=refitter), Costs(mnt) as costs:
        start = time.monotonic()
        with measure.PeakDiskMonitor(mnt) as mon:
            report = trtet_store.compile_and_save(module, inputs, out, engine_cache=cache,
                                                  **settings)
        seconds = time.monotonic() - start
    out.unlink()
    events = getattr(report, "engine_cache", None) or []
    return {"seconds": seconds, **costs.figures, "peak_extra_disk": mon.peak_extra_bytes,
            "outcomes": ",".join(sorted({f"{e.outcome}:{e.placement}" for e in events})),
            "on_disk": disk_usage(cache.directory)}, report


def refit_run(mnt: Path, size: int, engines: int) -> tuple[dict, dict]:
    """Export A (refittable settings, not measured), change every weight, export B, B again.

    On a cache of its own (``refit-cache``, room for two builds: A's full
    entry and its structure entry, the same bytes, and B's), removed at the
    end, so the cold and warm methods' cache is left as it was. Returns the
    figures of B (must refit every engine and build none) and of B again
    (must hit: no refit, no build).
    """
    import torch

    from trtet_store import EngineCache
    from trtet_store.testing.stub_tensorrt import FakeBuilder, FakeRefitter

    cache = EngineCache(mnt / "refit-cache", max_bytes=2 * engines * size + 256 * MiB,
                        min_free=0)
    cache.clear()
    settle(mnt)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    inputs = (torch.randn(2, 16),)
    builder, refitter = FakeBuilder(engine_sizes=(size,) * engines), FakeRefitter()
    settings = {"immutable_weights": False}
    _measured_export(module, inputs, mnt / "a.pte", cache, mnt, builder, refitter, **settings)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)  # a fine-tune that changed every weight
    settle(mnt)
    b, report = _measured_export(module, inputs, mnt / "b.pte", cache, mnt, builder, refitter,
                                 **settings)
    assert len(builder.built) == engines and len(refitter.refits) == engines, \
        f"B built {len(builder.built) - engines}, refit {len(refitter.refits)}: " \
        f"{[(e.outcome, e.reason) for e in report.engine_cache]}"
    b.update(built=0, refits=len(refitter.refits),
             refit_written=sum(e.written or 0 for e in report.engine_cache),
             refit_seconds=sum(e.seconds or 0.0 for e in report.engine_cache))
    settle(mnt)
    again, report = _measured_export(module, inputs, mnt / "b.pte", cache, mnt, builder,
                                     refitter, **settings)
    outcomes = [e.outcome for e in report.engine_cache]
    assert outcomes == ["hit"] * engines and len(refitter.refits) == engines, outcomes
    again.update(built=0, refits=0)
    cache.clear()  # room for the next run's methods; measured above ("on disk after")
    return b, again


# -- the shared tier (issue 37) ------------------------------------------------------------

class Remote:
    """The benchmark's S3 server, a bucket on it, and the counting proxy every client goes through.

    ``client`` talks to the server directly (setup and cleanup, not counted).
    """

    def __init__(self, server, proxy) -> None:
        self.server = server
        self.proxy = proxy
        self.client = server.endpoint.client()
        self.bucket = server.new_bucket("bench")

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def cache(self, directory: Path, prefix: str, bound: int):
        """An ``EngineCache`` in ``directory`` on ``prefix`` of the bucket, through the proxy."""
        from trtet_store import EngineCache

        return EngineCache(directory, max_bytes=bound, min_free=0, remote=self.url(prefix),
                           endpoint_url=self.proxy.endpoint_url)

    def objects(self, prefix: str) -> list[str]:
        keys = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def remove(self, prefix: str) -> None:
        """Every object under ``prefix`` (and any multipart upload left open there)."""
        for key in self.objects(prefix):
            self.client.delete_object(Bucket=self.bucket, Key=key)
        for up in self.client.list_multipart_uploads(
                Bucket=self.bucket, Prefix=prefix).get("Uploads", []):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"],
                                               UploadId=up["UploadId"])


def fresh_dir(path: Path) -> Path:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    return path


def publish_run(remote: Remote, mnt: Path, size: int, engines: int, bound: int) -> dict:
    """A cold build on an empty cache and an empty bucket prefix: built, then published."""
    import shutil
    import uuid

    prefix = f"publish-{uuid.uuid4().hex[:8]}/"
    directory = fresh_dir(mnt / "publish-cache")
    cache = remote.cache(directory, prefix, bound)
    settle(mnt)
    res = compile_run(cache, mnt, size, engines, cold=False, built=engines, proxy=remote.proxy,
                      outcome="miss")
    res["bucket_objects"] = len(remote.objects(prefix))
    shutil.rmtree(directory)
    remote.remove(prefix)
    return res


def remote_refit_run(remote: Remote, mnt: Path, size: int, engines: int, bound: int) -> dict:
    """Machine A builds and publishes (with its structure entry); B exports a fine-tune:
    B downloads the structure entry and refits, building nothing (``remote-refit``)."""
    import shutil
    import uuid

    import torch

    from trtet_store.testing.stub_tensorrt import FakeBuilder, FakeRefitter

    prefix = f"refit-{uuid.uuid4().hex[:8]}/"
    a = remote.cache(fresh_dir(mnt / "refit-a"), prefix, 2 * bound)
    b = remote.cache(fresh_dir(mnt / "refit-b"), prefix, 2 * bound)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    inputs = (torch.randn(2, 16),)
    builder, refitter = FakeBuilder(engine_sizes=(size,) * engines), FakeRefitter()
    settings = {"immutable_weights": False}
    try:
        _measured_export(module, inputs, mnt / "a.pte", a, mnt, builder, refitter, **settings)
        with torch.no_grad():
            for p in module.parameters():
                p.add_(1.0)  # a fine-tune that changed every weight
        settle(mnt)
        remote.proxy.reset()
        res, report = _measured_export(module, inputs, mnt / "b.pte", b, mnt, builder,
                                       refitter, **settings)
        traffic = remote.proxy.counts()
        outcomes = [e.outcome for e in report.engine_cache]
        assert outcomes == ["refit"] * engines and len(builder.built) == engines, \
            f"B: {[(e.outcome, e.reason) for e in report.engine_cache]}"
        res.update(downloaded=traffic["downstream"], uploaded=traffic["upstream"],
                   reported_downloaded=sum(e.downloaded or 0 for e in report.engine_cache),
                   built=0, refits=len(refitter.refits))
    finally:
        for cache in (a, b):
            shutil.rmtree(cache.directory, ignore_errors=True)
        remote.remove(prefix)
    return res


def remote_hit_run(cache, remote: Remote, mnt: Path, size: int, engines: int) -> dict:
    """An emptied local cache, the entry in the bucket: downloaded, then placed as a hit."""
    cache.clear()
    settle(mnt)
    res = compile_run(cache, mnt, size, engines, cold=False, proxy=remote.proxy,
                      outcome="remote-hit")
    cache.clear()  # room for the next run's methods; measured above ("on disk after")
    return res


def pull_run(cache, key: str, remote: Remote, mnt: Path) -> dict:
    """``cache.pull([key])`` alone on an emptied local cache: the tier's fetch into the cache."""
    cache.clear()
    settle(mnt)
    with Costs(mnt) as costs:
        remote.proxy.reset()
        start = time.monotonic()
        with measure.PeakDiskMonitor(mnt) as mon:
            pulled = cache.pull([key])
        seconds = time.monotonic() - start
        traffic = remote.proxy.counts()
    assert [k for k, _n in pulled] == [key] and pulled[0][1] > 0, f"pull gave {pulled}"
    on_disk = disk_usage(cache.directory)
    cache.clear()
    return {"seconds": seconds, **costs.figures,
            "peak_extra_disk": mon.peak_extra_bytes, "downloaded": traffic["downstream"],
            "uploaded": traffic["upstream"],
            "reported_downloaded": pulled[0][1], "on_disk": on_disk}


def download_run(remote: Remote, objects: list[str], mnt: Path) -> dict:
    """boto3's ``download_file`` of the entry's objects (the tier's layout), through the proxy.

    Its default ``TransferConfig`` (ranged GETs on 10 threads above 8 MiB),
    into a fresh directory on the benchmark's filesystem, then a ``syncfs``
    within the time (as every method's bytes reach the disk within its
    time); nothing is verified or digested, nothing enters a cache.
    """
    import shutil

    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=remote.proxy.endpoint_url,
                          config=Config(s3={"addressing_style": "path"}))
    directory = fresh_dir(mnt / "boto3-download")
    settle(mnt)
    with Costs(mnt) as costs:
        remote.proxy.reset()
        start = time.monotonic()
        with measure.PeakDiskMonitor(mnt) as mon:
            for i, key in enumerate(objects):
                client.download_file(remote.bucket, key, os.fspath(directory / f"{i}"))
        seconds = time.monotonic() - start
        traffic = remote.proxy.counts()
    on_disk = disk_usage(directory)
    shutil.rmtree(directory)
    return {"seconds": seconds, **costs.figures, "peak_extra_disk": mon.peak_extra_bytes,
            "downloaded": traffic["downstream"], "uploaded": traffic["upstream"],
            "on_disk": on_disk}


def s3_docs_run(remote: Remote, mnt: Path, size: int, engines: int) -> dict:
    """The docs' ``S3EngineCache``: insert in one process, check in a fresh one; objects removed."""
    import shutil
    import uuid

    prefix = f"docs-{uuid.uuid4().hex[:8]}/"
    directory = fresh_dir(mnt / "s3-docs-cache")  # holds nothing: its parent is watched
    env = {"TRTET_BENCH_BUCKET": remote.bucket, "TRTET_BENCH_PREFIX": prefix,
           "TRTET_BENCH_ENDPOINT": remote.proxy.endpoint_url}
    remote.proxy.reset()
    with Costs(mnt) as costs:
        save = run_child("s3-docs", "save", directory, size, engines, env)
        sent = remote.proxy.reset()
        load = run_child("s3-docs", "load", directory, size, engines, env)
        got = remote.proxy.reset()
    objects = remote.objects(prefix)
    assert len(objects) == engines, f"the docs' cache left {objects}"
    remote.remove(prefix)
    shutil.rmtree(directory)
    return {**device_figures(costs), "save_s": save["seconds"], "load_s": load["seconds"],
            "seconds": save["seconds"] + load["seconds"],
            "save_rss": save["peak_rss_extra"], "load_rss": load["peak_rss_extra"],
            "bytes_written": save["bytes_written"] + load["bytes_written"],
            "peak_extra_disk": max(save["peak_extra_disk"], load["peak_extra_disk"]),
            "uploaded": sent["upstream"] + got["upstream"],
            "downloaded": sent["downstream"] + got["downstream"],
            "load_downloaded": got["downstream"], "on_disk": 0}


def settle(mnt: Path) -> None:
    """Let the last run's frees finish before the next baseline.

    XFS frees a removed file's blocks in the background (inode GC) for
    seconds after ``rmtree``, and its free space moves meanwhile: measured
    here, 128 MiB came back over 5 s, and a warm run started before then
    showed a 64 MiB "peak" it did not take. Wait for 2 s of stable free space.
    """
    measure.quiesce(mnt, polls=20, interval=0.1, timeout=60)


# -- the table -------------------------------------------------------------------------------

LOCAL = ("cold", "warm", "upstream", "adapter", "refit", "refit-again")
REMOTE = ("publish", "remote-hit", "remote-refit", "pull", "download", "s3-docs")
METHODS = LOCAL + REMOTE


def order(run: int, methods: list[str]) -> list[str]:
    """Alternate the order each run; a warm run always finds the build the last cold one cached."""
    return list(methods) if run % 2 == 0 else list(reversed(methods))


def summarize(fstype: str, engines: str, runs: dict[str, list[dict]]) -> list[str]:
    lines = []
    remote = any(runs[m] for m in REMOTE)

    def med(m: str, k: str) -> float:
        return statistics.median(r[k] for r in runs[m])

    def best(m: str, k: str) -> float:
        return min(r[k] for r in runs[m])

    def mib(m: str, k: str) -> str:
        return format_mib(med(m, k)) if k in runs[m][0] else "-"

    for m in METHODS:
        if not runs[m]:
            continue
        rss = (f"{format_mib(med(m, 'save_rss'))} / {format_mib(med(m, 'load_rss'))}"
               if "save_rss" in runs[m][0] else mib(m, "peak_rss"))
        split = (f" (save {med(m, 'save_s'):.2f} + load {med(m, 'load_s'):.2f})"
                 if "save_s" in runs[m][0] else "")
        note = runs[m][0].get("outcomes", "")
        traffic = ""
        if remote:
            traffic = "".join(f" {mib(m, k)} |" for k in ("downloaded", "uploaded"))
        lines.append(f"| {fstype} | {engines} | {m}{f' ({note})' if note else ''} "
                     f"| {med(m, 'seconds'):.2f}{split} | {best(m, 'seconds'):.2f} |{traffic} "
                     f"{mib(m, 'bytes_written')} | {mib(m, 'dev_written')} "
                     f"| {mib(m, 'dev_read')} | {mib(m, 'digested')} "
                     f"| {format_mib(med(m, 'peak_extra_disk'))} "
                     f"| {rss} | {format_mib(med(m, 'on_disk'))} |")
    return lines


def header(remote: bool) -> list[str]:
    cols = ["filesystem", "engines", "method", "wall s (median)", "fastest s"]
    if remote:
        cols += ["downloaded (proxy)", "uploaded (proxy)"]
    cols += ["written (process)", "written (device)", "read (device)", "digested",
             "peak extra disk",
             "peak RSS extra (save / load)", "on disk after"]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def by_size(warm: dict[tuple[str, int], list[dict]]) -> list[str]:
    """The warm hit at each engine size, per filesystem: time, reads, and the time's ratio
    to the smallest size's (medians, fastest in brackets)."""
    lines = ["| filesystem | engines | warm hit s (median) | fastest s | read (device) "
             "| written (device) | x smallest size (medians) | x smallest (fastest) |",
             "|---|---|---|---|---|---|---|---|"]
    for fstype in dict.fromkeys(f for f, _ in warm):
        sizes = sorted(mib for f, mib in warm if f == fstype and warm[(f, mib)])
        if not sizes:
            continue
        base = warm[(fstype, sizes[0])]
        m0 = statistics.median(r["seconds"] for r in base)
        b0 = min(r["seconds"] for r in base)
        for mib in sizes:
            rs = warm[(fstype, mib)]
            med = statistics.median(r["seconds"] for r in rs)
            fast = min(r["seconds"] for r in rs)
            read = statistics.median(r.get("dev_read", 0) for r in rs)
            wrote = statistics.median(r.get("dev_written", 0) for r in rs)
            lines.append(f"| {fstype} | {mib} MiB | {med:.2f} | {fast:.2f} | {format_mib(read)} "
                         f"| {format_mib(wrote)} | {med / m0:.2f}x | {fast / b0:.2f}x |")
    return lines


#: Wall-time ratios printed: (numerator, denominator, which time of each).
RATIOS = (("cold", "warm", "seconds"), ("upstream", "adapter", "seconds"),
          ("cold", "remote-hit", "seconds"), ("remote-hit", "warm", "seconds"),
          ("publish", "cold", "seconds"), ("s3-docs", "remote-hit", "seconds"),
          ("s3-docs", "pull", "load_s"), ("remote-hit", "download", "seconds"),
          ("remote-hit", "pull", "seconds"), ("pull", "download", "seconds"))


def ratios(fstype: str, runs: dict[str, list[dict]]) -> str:
    """Wall-time ratios of medians and of fastest runs (``load_s``: the docs' check alone)."""
    out = []
    for a, b, key in RATIOS:
        if runs[a] and runs[b]:
            ka = key if key in runs[a][0] else "seconds"
            med = [statistics.median(r[k] for r in runs[m]) for m, k in ((a, ka), (b, "seconds"))]
            best = [min(r[k] for r in runs[m]) for m, k in ((a, ka), (b, "seconds"))]
            name = f"{a} check" if ka == "load_s" else a
            out.append(f"{name}/{b} {med[0] / med[1]:.2f}x (medians), "
                       f"{best[0] / best[1]:.2f}x (fastest)")
    return f"{fstype}: " + ("; ".join(out) or "(no pair of methods to compare)")


def overhead(runs: dict[str, list[dict]], engine_bytes: int) -> str:
    """Per remote method, the median bytes it moved beyond the engines' own bytes.

    What remains is the entry's record, the pointer and manifest JSON, HTTP
    headers (and, for the docs' cache, the pickle's framing): a figure near
    0 says each engine byte crossed the wire once.
    """
    out = []
    for m, key in (("remote-hit", "downloaded"), ("pull", "downloaded"),
                   ("download", "downloaded"),
                   ("s3-docs", "load_downloaded"), ("publish", "uploaded"),
                   ("s3-docs", "uploaded")):
        if runs[m] and key in runs[m][0]:
            extra = statistics.median(r[key] for r in runs[m]) - engine_bytes
            out.append(f"{m} {'down' if 'down' in key else 'up'} {extra:+.0f}")
    return ", ".join(out)


def remote_setup(remote: Remote, mnt: Path, size: int, engines: int, bound: int,
                 fstype: str):
    """Machine A builds and publishes under ``hits-<fs>/``; machine B's cache, emptied, to pull it.

    Returns machine B's cache, the entry's key and its objects' keys in the
    bucket (``<prefix><key>/<attempt>/<name>``, what ``download`` fetches).
    Machine A's directory is removed (another machine's disk).
    """
    import shutil

    prefix = f"hits-{fstype}-{size // MiB}/"
    remote.remove(prefix)
    a = fresh_dir(mnt / "machine-a")
    res = compile_run(remote.cache(a, prefix, bound), mnt, size, engines, cold=False,
                      built=engines, proxy=remote.proxy, outcome="miss")
    print(f"  {fstype} setup: machine A built and published in {res['seconds']:.2f} s, "
          f"uploaded {format_mib(res['uploaded'])}", file=sys.stderr, flush=True)
    shutil.rmtree(a)
    b = remote.cache(fresh_dir(mnt / "machine-b"), prefix, bound)
    entries = b.remote_entries()
    assert len(entries) == 1, f"the bucket holds {[e.key for e in entries]} under {prefix}"
    objects = [f"{prefix}{entries[0].attempt}{f['name']}" for f in entries[0].files]
    return b, entries[0].key, objects


def working_tree() -> str:
    """``HEAD <short>`` and the tracked files changed in the working tree (what a run used)."""
    root = os.fspath(HERE.parent.parent)
    head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "-C", root, "status", "--short", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.splitlines()
    return f"HEAD {head}" + (f" + uncommitted changes to {', '.join(d[3:] for d in dirty)}"
                             if dirty else "")


def engine_sizes(text: str) -> list[int]:
    """``--engine-mib``: one size or several, comma-separated (MiB per engine)."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes in MiB, comma-separated: {text!r}") from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"sizes must be positive: {text!r}")
    return sizes


def run_size(remote: Remote | None, factory, fstype: str, mib: int, engines: int,
             methods: list[str], repeat: int) -> dict[str, list[dict]]:
    """Every method at one engine size on a fresh filesystem, alternating, ``repeat`` runs."""
    from trtet_store import EngineCache

    size = mib * MiB
    bound = engines * size + 256 * MiB
    # Staging + cache + program (cold, ext4: three copies at the peak), the other
    # methods' caches (each emptied after its run) and machine B's, plus room to spare.
    mnt = factory.make(fstype, 6 * engines * mib + 1024)
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    label = f"{fstype} {engines} x {mib} MiB"
    try:
        cache = EngineCache(mnt / "engine-cache", max_bytes=bound, min_free=0)
        if remote is not None and {"remote-hit", "pull", "download"} & set(methods):
            machine_b, key, objects = remote_setup(remote, mnt, size, engines, bound, fstype)
        for r in range(repeat):
            for m in order(r, methods):
                if (m == "warm" and "cold" not in methods) or m == "refit-again":
                    continue  # (refit-again is measured by refit's run)
                settle(mnt)
                if m in ("cold", "warm"):
                    res = compile_run(cache, mnt, size, engines, cold=m == "cold")
                elif m == "refit":
                    res, again = refit_run(mnt, size, engines)
                    runs["refit-again"].append(again)
                elif m in ("upstream", "adapter"):
                    res = upstream_run(m, mnt, size, engines)
                elif m == "publish":
                    res = publish_run(remote, mnt, size, engines, bound)
                elif m == "remote-hit":
                    res = remote_hit_run(machine_b, remote, mnt, size, engines)
                elif m == "remote-refit":
                    res = remote_refit_run(remote, mnt, size, engines, bound)
                elif m == "pull":
                    res = pull_run(machine_b, key, remote, mnt)
                elif m == "download":
                    res = download_run(remote, objects, mnt)
                else:
                    res = s3_docs_run(remote, mnt, size, engines)
                runs[m].append(res)
                traffic = (f", down {format_mib(res['downloaded'])} up "
                           f"{format_mib(res['uploaded'])}" if "downloaded" in res else "")
                print(f"  {label} run {r} {m}: {res['seconds']:.2f} s, wrote "
                      f"{format_mib(res['bytes_written'])} (device "
                      f"{format_mib(res.get('dev_written', 0))}), read from disk "
                      f"{format_mib(res.get('dev_read', 0))}, peak extra disk "
                      f"{format_mib(res['peak_extra_disk'])}{traffic}"
                      + (f", peak RSS +{format_mib(res['peak_rss'])}" if "peak_rss" in res
                         else "")
                      + (f" (cache says {format_mib(res['reported_downloaded'])})"
                         if "reported_downloaded" in res else ""),
                      file=sys.stderr, flush=True)
    finally:
        factory.release(mnt)
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        kind, step, directory, size, engines = argv[1:6]
        print(json.dumps(child(kind, step, directory, int(size), int(engines))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", default="xfs,ext4")
    p.add_argument("--engine-mib", type=engine_sizes, default=[1024],
                   help="MiB per engine; several, comma-separated (256,1024,4096), run one "
                   "after another in this run, with the warm hit's figures per size at the end")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="runs of each method (>= 5 for the "
                   "README's table; fewer to try it)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated, of {','.join(METHODS)}")
    p.add_argument("--out", type=Path, help="also write the table (markdown) to this file")
    p.add_argument("--put-scaling", type=int, metavar="N",
                   help="instead: a put's cost against the entry count (put_scaling)")
    args = p.parse_args(argv)
    if args.put_scaling:
        return put_scaling(args.put_scaling, args.filesystems.split(","))
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    tree_start = working_tree()
    methods = [m for m in METHODS if m in args.methods.split(",")]
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        p.error(f"unknown methods {sorted(unknown)}; known: {','.join(METHODS)}")
    from trtet_store.testing.loopfs import FilesystemFactory

    measure.return_freed_buffers()  # each peak RSS sees only what is live in its method
    remote_methods = [m for m in methods if m in REMOTE]
    lines = [f"{args.engines} x {','.join(map(str, args.engine_mib))} MiB stubbed engines, "
             f"{args.repeat} runs each, alternating; medians (fastest)",
             *header(bool(remote_methods))]
    for line in lines:
        print(line, flush=True)
    notes: list[str] = []
    warm: dict[tuple[str, int], list[dict]] = {}
    with contextlib.ExitStack() as stack:
        remote = None
        if remote_methods:
            from trtet_store.testing.proxy import CountingProxy
            from trtet_store.testing.s3server import running_server

            server = stack.enter_context(running_server("trtet-bench-s3-"))
            proxy = stack.enter_context(CountingProxy.for_url(server.endpoint.url))
            os.environ.update(server.endpoint.environ())  # boto3's credentials, children too
            for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                        "AWS_SESSION_TOKEN"):
                os.environ.pop(var, None)
            remote = Remote(server, proxy)
        factory = stack.enter_context(FilesystemFactory())
        for mib in args.engine_mib:
            for fstype in args.filesystems.split(","):
                runs = run_size(remote, factory, fstype, mib, args.engines, methods,
                                args.repeat)
                warm[(fstype, mib)] = runs["warm"]
                for line in summarize(fstype, f"{args.engines} x {mib} MiB", runs):
                    print(line, flush=True)
                    lines.append(line)
                notes.append(f"{args.engines} x {mib} MiB " + ratios(fstype, runs))
                over = overhead(runs, args.engines * mib * MiB)
                if over:
                    notes.append(f"{fstype}, {args.engines} x {mib} MiB: bytes through the "
                                 f"proxy beyond the engines' {args.engines * mib * MiB} (median "
                                 f"run): {over}")
    tail = ["", "Wall-time ratios:", *(f"- {line}" for line in notes)]
    if any(warm.values()):
        tail += ["", "The warm hit by engine size:", *by_size(warm)]
    for line in tail:
        print(line)
    if args.out is not None:
        tree_end = working_tree()
        command = " ".join(["benchmarks/engine_cache.py", *argv])
        args.out.write_text("\n".join([
            f"Command: `sudo .venv/bin/python {command}`", "",
            f"Run {started} - {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; the "
            f"working tree at the start: {tree_start}; at the end: {tree_end}", "",
            *lines, *tail]) + "\n")
    return 0


def put_scaling(n: int, filesystems: list[str], size: int = 4096) -> int:
    """A put's cost against the entry count (issue 42 item 4): medians, in ms.

    On each filesystem (a loop image, as root), one ``BlobCache`` process:
    ``n`` puts of distinct ``size``-byte entries (the first 100 and the last
    100 timed), 100 gets, then 20 puts into the full cache (each evicts one)
    and 20 ``prune`` calls that each evict one. Uses only the public face,
    so the same command times another release (``PYTHONPATH`` at its tree).

        sudo .venv/bin/python benchmarks/engine_cache.py --put-scaling 2000 --filesystems ext4
    """
    import random

    from trtet_store.cache import BlobCache
    from trtet_store.testing.loopfs import FilesystemFactory

    def ms(times: list[float]) -> str:
        return f"{statistics.median(times) * 1e3:.2f}"

    rng = random.Random(0)
    print(f"{n} entries of {size} bytes; median ms: first 100 puts, last 100 puts, get, "
          "a put that evicts 1, a prune that evicts 1")
    with FilesystemFactory() as factory:
        for fstype in filesystems:
            mnt = factory.make(fstype, max(300 if fstype == "xfs" else 64,
                                           (n + 200) * (size + 8192) // MiB * 2))
            try:
                src = mnt / "src"
                src.mkdir()
                cache = BlobCache(mnt / "cache", max_bytes=(n + 100) * size, min_free=0)
                puts = []
                for i in range(n):
                    path = src / f"{i}"
                    path.write_bytes(rng.randbytes(size))
                    t = time.perf_counter()
                    assert cache.put(f"k{i:06d}", path).stored
                    puts.append(time.perf_counter() - t)
                gets = []
                for i in rng.sample(range(n), 100):
                    t = time.perf_counter()
                    hit = cache.get(f"k{i:06d}")
                    gets.append(time.perf_counter() - t)
                    assert hit is not None
                    hit.close()
                full = BlobCache(mnt / "cache", max_bytes=n * size, min_free=0)
                evicting = []
                for i in range(n, n + 20):
                    path = src / f"{i}"
                    path.write_bytes(rng.randbytes(size))
                    t = time.perf_counter()
                    done = full.put(f"k{i:06d}", path)
                    evicting.append(time.perf_counter() - t)
                    assert done.stored and len(done.evicted) == 1, done
                prunes = []
                for j in range(20):
                    t = time.perf_counter()
                    gone = full.prune((n - 1 - j) * size)
                    prunes.append(time.perf_counter() - t)
                    assert len(gone) == 1, gone
                print(f"{fstype}: {ms(puts[:100])}, {ms(puts[-100:])}, {ms(gets)}, "
                      f"{ms(evicting)}, {ms(prunes)}", flush=True)
            finally:
                factory.release(mnt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
