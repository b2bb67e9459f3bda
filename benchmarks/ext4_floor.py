#!/usr/bin/env python3
"""Where the bytes of a cached export go on ext4 (no clone): per step, a cold build and a warm hit.

Issue 42, item 5: on ext4 a cold ``compile_and_save`` of 2 x 1 GiB through the
engine cache wrote 5,120 MiB (the floor: the cache's copy and the
program's, 4,096 MiB) and a warm hit 3,072 MiB (the floor: the program's
copy, 2,048 MiB). Both are at their floor now: a warm hit's save copies
straight from the cached file, and a cold build's engines enter the cache by
hard link (``cache put`` writes only records) and the save copies them once
from there (``program write``: one copy). This runs both on a dedicated ext4 loop (as root) and
counts the loop device's sectors written and read (``/sys/block/<loop>/stat``)
around each step, after a ``syncfs`` at both ends of the step, so every byte
a step dirtied is counted in that step (the syncs change the time, not the
bytes). The steps are wrapped where the export calls them:

- ``build``: the stub builder writing an engine into the staging store
  (``stub_tensorrt.stage_fake_engine``);
- ``cache put``: ``BlobCache.put`` (an engine, then the build's record);
- ``stage hit``: a hit's engine placed into the staging store
  (``engine_build.stage_hit``: a clone, else a copy);
- ``program write``: ``save_program(..., consume=True)`` (each engine by
  insert, move or copy, then the program's headers, fsyncs, the rename);
- ``rest``: everything else of the call (lookups, records, metadata, the
  staging directory's own files, the final flush).

    sudo .venv/bin/python benchmarks/ext4_floor.py                   # 2 x 1 GiB
    sudo .venv/bin/python benchmarks/ext4_floor.py --engine-mib 64
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from trtet_store.bench import measure
from trtet_store.io.units import MiB, format_mib


class Steps:
    """Device bytes written and read per named step (nested steps count in the outer only)."""

    def __init__(self, mnt: Path) -> None:
        self.mnt = mnt
        self.written: dict[str, int] = {}
        self.read: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self._depth = 0

    def dev(self) -> tuple[int, int]:
        measure.syncfs(self.mnt)
        got = measure.device_io(self.mnt)
        if got is None:
            raise SystemExit(f"{self.mnt} is not a block device's mount: run as root")
        return got

    def wrap(self, name: str, fn):
        def counted(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            before = self.dev()
            try:
                return fn(*args, **kwargs)
            finally:
                after = self.dev()
                self._depth -= 1
                self.read[name] = self.read.get(name, 0) + after[0] - before[0]
                self.written[name] = self.written.get(name, 0) + after[1] - before[1]
                self.calls[name] = self.calls.get(name, 0) + 1
        return counted


@contextlib.contextmanager
def instrumented(steps: Steps):
    """Wrap the steps where the export calls them; restored on exit."""
    from trtet_store.cache import store as cache_store
    from trtet_store.export import engine_build
    from trtet_store.export import executorch as et_adapter
    from trtet_store.testing import stub_tensorrt

    patches = [(stub_tensorrt, "stage_fake_engine", "build"),
               (cache_store.BlobCache, "put", "cache put"),
               (engine_build, "stage_hit", "stage hit"),
               (et_adapter, "save_program", "program write")]
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    try:
        for obj, attr, name in patches:
            setattr(obj, attr, steps.wrap(name, getattr(obj, attr)))
        yield
    finally:
        for obj, attr, fn in saved:
            setattr(obj, attr, fn)


def one_call(cache, mnt: Path, size: int, engines: int) -> dict:
    """One ``compile_and_save`` through ``cache``, its bytes per step (and in all)."""
    import torch

    import trtet_store
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    inputs = (torch.randn(2, 16),)
    out = mnt / "model.pte"
    steps = Steps(mnt)
    measure.drop_file_pages(mnt)
    total0 = steps.dev()
    with installed(FakeBuilder(engine_sizes=(size,) * engines)), instrumented(steps):
        report = trtet_store.compile_and_save(module, inputs, out, engine_cache=cache)
    total1 = steps.dev()
    out.unlink()
    events = getattr(report, "engine_cache", None) or []
    return {"steps": steps, "written": total1[1] - total0[1], "read": total1[0] - total0[0],
            "outcomes": ",".join(f"{e.outcome}:{e.placement}" for e in events)}


def table(name: str, res: dict, floor: int) -> list[str]:
    steps: Steps = res["steps"]
    lines = [f"{name} ({res['outcomes']}): written {format_mib(res['written'])}, floor "
             f"{format_mib(floor)}, read {format_mib(res['read'])}",
             "| step | calls | written (device) | read (device) |", "|---|---|---|---|"]
    for step in ("build", "cache put", "stage hit", "program write"):
        if step in steps.calls:
            lines.append(f"| {step} | {steps.calls[step]} | {format_mib(steps.written[step])} "
                         f"| {format_mib(steps.read[step])} |")
    rest_w = res["written"] - sum(steps.written.values())
    rest_r = res["read"] - sum(steps.read.values())
    lines.append(f"| rest | | {format_mib(rest_w)} | {format_mib(rest_r)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine-mib", type=int, default=1024)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--filesystem", default="ext4")
    args = p.parse_args(argv)
    from trtet_store import EngineCache
    from trtet_store.testing.loopfs import FilesystemFactory

    size = args.engine_mib * MiB
    engine_bytes = args.engines * size
    with FilesystemFactory() as factory:
        mnt = factory.make(args.filesystem, 4 * args.engines * args.engine_mib + 1024)
        try:
            cache = EngineCache(mnt / "engine-cache", max_bytes=engine_bytes + 256 * MiB,
                                min_free=0)
            cold = one_call(cache, mnt, size, args.engines)
            warm = one_call(cache, mnt, size, args.engines)
        finally:
            factory.release(mnt)
    print(f"{args.filesystem}, {args.engines} x {args.engine_mib} MiB stubbed engines, loop "
          "device sectors per step (syncfs around each)")
    for line in [*table("cold", cold, 2 * engine_bytes), "",
                 *table("warm", warm, engine_bytes)]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
