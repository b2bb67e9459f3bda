"""Peak disk of compile_and_save with an ETRecord: ETRecord first then move, vs program first.

The TensorRT build is stubbed at its one seam (trtet_store.testing.stub_tensorrt: random
engine bytes streamed into the blob store, as the real builder does);
everything after it is real. Both orderings run in one process on a fresh
ext4 loop filesystem each (as root), or in a temp directory on the current
filesystem otherwise.

    .venv/bin/python benchmarks/etrecord_order.py [--engine-mib 256]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from pathlib import Path

import torch

import trtet_store
from trtet_store.bench.measure import PeakDiskMonitor
from trtet_store.export import tensorrt as trt
from trtet_store.io.units import MiB
from trtet_store.testing.loopfs import FilesystemFactory
from trtet_store.testing.stub_tensorrt import FakeBuilder, linear_relu


def etrecord_first(directory: Path, builder: FakeBuilder) -> dict:
    """What compile_and_save does: the ETRecord before any engine moves, then a consuming save."""
    module, inputs = linear_relu()
    with PeakDiskMonitor(directory) as mon:
        report = trtet_store.compile_and_save(module, inputs, directory / "m.pte",
                                              generate_etrecord=True,
                                              progress=lambda d, t: mon.sample())
    return {"order": "etrecord first, then move (trtet_store)",
            "placements": report.placements, "peak_extra": mon.peak_extra_bytes,
            "etrecord_bytes": report.etrecord.stat().st_size}


def program_first(directory: Path, builder: FakeBuilder) -> dict:
    """The upstream order: the program first, copying (the ETRecord may still read the
    engines), then the ETRecord, then the staged engines are released."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig
    from executorch.exir import to_edge_transform_and_lower as lower

    module, inputs = linear_relu()
    store = trtet_store.BlobStore(directory / ".trtet-staging")
    with PeakDiskMonitor(directory) as mon:
        built = builder(torch.export.export(module, inputs), inputs, None, store, {})
        mon.sample()
        edge = lower(built.exported_program, partitioner=[trt.TensorRTPartitioner()],
                     compile_config=EdgeCompileConfig(_check_ir_validity=False),
                     generate_etrecord=True)
        program = edge.to_executorch(ExecutorchBackendConfig(segment_alignment=4096))
        reports = trtet_store.save_program(program, directory / "m.pte", consume=False,
                                           progress=lambda d, t: mon.sample())
        program.get_etrecord().save(os.fspath(directory / "m_etrecord.bin"))
        mon.sample()
        trt.unregister_engines(built.engines)
        store.close()
    return {"order": "program first (copy), then ETRecord",
            "placements": [p.placement for r in reports for p in r.placements],
            "peak_extra": mon.peak_extra_bytes,
            "etrecord_bytes": (directory / "m_etrecord.bin").stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-mib", type=int, default=256)
    args = parser.parse_args()
    trt.check_available = lambda: None  # the stub stands in for TensorRT and CUDA
    rows = []
    for run in (etrecord_first, program_first):
        builder = FakeBuilder(engine_sizes=(args.engine_mib * MiB,))
        trt.build_engines = builder
        with contextlib.ExitStack() as stack:
            if os.geteuid() == 0:
                factory = stack.enter_context(FilesystemFactory())
                directory = factory.make("ext4", args.engine_mib * 3 + 128)
                where = "dedicated ext4 loop filesystem"
            else:
                directory = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=".")))
                where = "temp directory on the current filesystem (not root)"
            # The engine is staged inside the measured window in both orders,
            # so the peak counts it once: extra beyond it is what matters.
            row = run(directory, builder)
            row["where"] = where
            rows.append(row)
    engine = args.engine_mib * MiB
    print(f"engine: {args.engine_mib} MiB (staged during the run; counted in each peak)")
    print(f"{'order':44} {'placements':18} {'peak extra':>12} {'beyond engine':>14}")
    for r in rows:
        beyond = (r["peak_extra"] - engine) / MiB
        print(f"{r['order']:44} {','.join(r['placements']):18} "
              f"{r['peak_extra'] / MiB:10.1f} M {beyond:12.1f} M   ({r['where']}; "
              f"ETRecord {r['etrecord_bytes']} B)")
    print(f"ratio program-first / etrecord-first peak: "
          f"{rows[1]['peak_extra'] / rows[0]['peak_extra']:.2f}")


if __name__ == "__main__":
    main()
