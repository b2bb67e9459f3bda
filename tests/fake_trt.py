"""A stand-in for the TensorRT build, for machines without a GPU.

It replaces exactly one function, ``trtet_store.export.tensorrt.build_engines``
(the seam): the real module is exported, run eagerly for its output specs,
and replaced by a chain of engine placeholder nodes; the "engines" are large
random byte strings streamed into the blob store, as the real builder does.
Everything after the seam runs for real.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import xxhash

from trtet_store.export import trt_blob
from trtet_store.export.tensorrt import BuildResult, register_engine, trt_engine_op


@dataclass
class FakeBuilder:
    """Callable with the seam's signature; records what it built."""

    engine_sizes: tuple[int, ...] = (4 << 20,)
    built: list = field(default_factory=list)  # (engine, xxh3-128 of the bytes written)
    seed: int = 0

    def __call__(self, exported_program, arg_inputs, kwarg_inputs, store, settings):
        out = exported_program.module()(*arg_inputs, **(kwarg_inputs or {}))
        engines = []
        for i, size in enumerate(self.engine_sizes):
            h = xxhash.xxh3_128()
            with store.writer() as w:
                left = size
                rnd = xxhash.xxh3_128(seed=self.seed + i)
                while left:
                    rnd.update(b"more")
                    n = min(left, 1 << 20)
                    part = (rnd.digest() * (n // 16 + 1))[:n]
                    w.write(part)
                    h.update(part)
                    left -= n
            metadata = trt_blob.BlobMetadata(
                io_bindings=(trt_blob.IOBinding("input_0"),
                             trt_blob.IOBinding("output_0", is_input=False)),
                device_id=0, target_platform="linux_x86_64",
                serialized_metadata=f"fake-engine-{i}")
            engine = register_engine(w.blob, metadata, [(tuple(out.shape), out.dtype)])
            engines.append(engine)
            self.built.append((engine, h.hexdigest()))
        ids = [e.engine_id for e in engines]
        op = trt_engine_op()

        class Engines(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                y = x
                for engine_id in ids:
                    y = op([y], engine_id)[0]
                return y

        return BuildResult(torch.export.export(Engines(), tuple(arg_inputs), strict=False),
                           engines)


def linear_relu() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The small model every TensorRT test compiles."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    return module, (torch.randn(2, 16),)
