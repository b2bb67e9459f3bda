#!/usr/bin/env python3
"""TensorRT timing caches through the tier: machine B's first build, cold against warm.

Beside ``benchmarks/engine_cache.py``. One SeaweedFS server
(``trtet_store.testing.s3server``, started here), every request through a
counting loopback proxy (``trtet_store.testing.proxy.CountingProxy``). Each
run, on a fresh bucket prefix:

- machine A (a cache directory) exports the model (not measured): a build
  that publishes its engine entry and its timing entry;
- ``cold``: machine B (another, empty cache directory) exports the same
  layers with new weights (a full build: the tier cannot serve A's engine) on
  a prefix that holds no timing entry;
- ``warm``: the same export by another empty machine B on A's prefix: the
  timing entry is fetched (verified) and the build starts warm.

The stubbed TensorRT build (``FakeBuilder``) charges ``--tactic-ms`` per
tactic its timing cache lacks, ``--tactics-per-layer`` per operator of an
MLP of ``--layers`` layers, and writes ``--engine-mib`` of engine: the ratio
is the stub's cost model, not a TensorRT figure. Reported: the medians of
B's export wall time, their ratio (one run), and the bytes moved for the
timing entry (the entry's size, and the proxy's download count of B's whole
export, headers included).

    .venv/bin/python benchmarks/timing_cache.py --repeat 5
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


def model(layers: int, seed: int):
    import torch

    torch.manual_seed(seed)
    mods = []
    for i in range(layers):  # each layer its own width: its own tactics
        mods += [torch.nn.Linear(64 + 8 * i, 64 + 8 * (i + 1)), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods).eval(), (torch.randn(4, 64),)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tactics-per-layer", type=int, default=16)
    p.add_argument("--tactic-ms", type=float, default=20.0)
    p.add_argument("--engine-mib", type=int, default=4)
    p.add_argument("--out", type=Path, help="also write the table (markdown) to this file")
    args = p.parse_args(argv)

    import trtet_store
    from trtet_store.testing.proxy import CountingProxy
    from trtet_store.testing.s3server import running_server
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    def builder() -> FakeBuilder:
        return FakeBuilder(keep_timing=True, engine_sizes=(args.engine_mib << 20,),
                           tactic_seconds=args.tactic_ms / 1000,
                           tactics_per_layer=args.tactics_per_layer)

    runs: dict[str, list[dict]] = {"cold": [], "warm": []}
    base = Path(tempfile.mkdtemp(prefix="trtet-bench-timing-", dir="/var/tmp"))
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(running_server("trtet-bench-s3-"))
        proxy = stack.enter_context(CountingProxy.for_url(server.endpoint.url))
        os.environ.update(server.endpoint.environ())
        bucket = server.new_bucket("bench")

        def cache(name: str, prefix: str):
            return trtet_store.EngineCache(base / name, max_bytes=1 << 34, min_free=0,
                                           remote=f"s3://{bucket}/{prefix}",
                                           endpoint_url=proxy.endpoint_url)

        def export(name: str, c, seed: int) -> tuple[float, int, object, FakeBuilder]:
            module, inputs = model(args.layers, seed)
            b = builder()
            down0 = proxy.downstream
            start = time.perf_counter()
            with installed(b):
                report = trtet_store.compile_and_save(module, inputs, base / f"{name}.pte",
                                                      engine_cache=c, store=base / f"s-{name}")
            seconds = time.perf_counter() - start
            down = proxy.downstream - down0
            return seconds, down, report.engine_cache[0], b

        for run in range(args.repeat):
            export(f"A{run}", cache(f"A{run}", f"p{run}"), 0)  # machine A: builds, publishes
            entry = sum(e.size for e in cache(f"A{run}", f"p{run}").entries()
                        if e.metadata.get("kind") == "trtet_store.tensorrt.timing")
            order = ("cold", "warm") if run % 2 == 0 else ("warm", "cold")
            for method in order:
                prefix = f"p{run}" if method == "warm" else f"empty{run}"
                s, down, event, b = export(f"B{method}{run}", cache(f"B{method}{run}", prefix),
                                           1)
                runs[method].append({"seconds": s, "downloaded": down, "entry": entry,
                                     "timed": b.timed[0], "line": event.timing_cache})
            for name in list(base.iterdir()):
                if name.name.startswith(("A", "B", "s-")):
                    shutil.rmtree(name, ignore_errors=True) if name.is_dir() else name.unlink()
    shutil.rmtree(base, ignore_errors=True)

    cold = statistics.median(r["seconds"] for r in runs["cold"])
    warm = statistics.median(r["seconds"] for r in runs["warm"])
    lines = [
        f"timing cache through the tier: {args.layers} layers x 2 ops x "
        f"{args.tactics_per_layer} tactics, {args.tactic_ms:g} ms a tactic the cache lacks, "
        f"{args.engine_mib} MiB engine, {args.repeat} runs each",
        "",
        "| machine B's first build | median s | fastest s | tactics timed | timing entry "
        "bytes | downloaded (proxy, whole export) |",
        "|---|---|---|---|---|---|",
    ]
    for method in ("cold", "warm"):
        rs = runs[method]
        lines.append(f"| {method} | {statistics.median(r['seconds'] for r in rs):.2f} | "
                     f"{min(r['seconds'] for r in rs):.2f} | {rs[0]['timed']} | "
                     f"{rs[0]['entry'] if method == 'warm' else 0} | "
                     f"{statistics.median(r['downloaded'] for r in rs):.0f} |")
    lines += ["", f"cold / warm (ratio of medians): {cold / warm:.2f}x",
              f"warm line: {runs['warm'][0]['line']}"]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
