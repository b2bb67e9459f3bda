"""The benchmark's program: an ExecuTorch backend whose delegates carry staged payloads."""

from __future__ import annotations

import random
import struct
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from trtet_store.bench.config import BACKEND_ID, LAYOUTS, PTD_TAG, BenchConfig
from trtet_store.io.units import PAGE, MiB

_PENDING: list[tuple[str, Any, str | None]] = []
_BUILD_LOCK = threading.Lock()
_BACKEND: type | None = None


def _backend() -> type:
    """Define the benchmark's backend once (``to_backend`` finds it by class name)."""
    global _BACKEND
    if _BACKEND is not None:
        return _BACKEND
    from typing import final

    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

    from trtet_store.export import _executorch_private as priv
    from trtet_store.export import trt_blob
    from trtet_store.export.executorch import add_blob_as_named_data
    from trtet_store.io import Blob

    @final
    class TrtetBenchBackend(BackendDetails):
        """One delegate per payload; the payload is named data, the blob a TR01 header."""

        @staticmethod
        def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
            specs = {c.key: c.value.decode() for c in compile_specs}
            key, blob, tag = _PENDING[int(specs["engine_index"])]
            store = priv.named_data_store()
            if isinstance(blob, Blob):
                add_blob_as_named_data(store, key, blob, alignment=16, external_tag=tag)
            else:  # ExecuTorch's own FileBackedData (e.g. move_from), registered as is
                store.add_named_data(key, blob, alignment=16, external_tag=tag)
            meta = trt_blob.BlobMetadata(
                io_bindings=(
                    trt_blob.IOBinding("x", "float32", (4,), True),
                    trt_blob.IOBinding("output", "float32", (4,), False),
                ),
                target_platform="benchmark (no engine: payload bytes are random)",
                engine_key=key,
            )
            return PreprocessResult(
                processed_bytes=trt_blob.encode(meta),
                data_store_output=store.get_named_data_store_output(),
            )

    _BACKEND = TrtetBenchBackend
    return _BACKEND


def build_program(
    blobs: Sequence[Any], *, layout: str = "split", segment_alignment: int = PAGE
) -> Any:
    """A real ExecuTorch program with one delegate per blob, each blob file-backed named data.

    The module is a chain of ``x * 2.0`` steps, each lowered by its own
    partition to the benchmark backend (as Torch-TensorRT makes one partition
    per engine). Each delegate's blob is a TensorRT-format header (``TR01``)
    whose ``engine_key`` names its payload; the payload is registered with
    :func:`trtet_store.export.executorch.add_blob_as_named_data`, so ExecuTorch
    only ever sees its length. The runtime can load the program but not its
    methods (the backend exists only at export time).

    Args:
        blobs: Live :class:`~trtet_store.io.Blob` payloads, or ExecuTorch's own
            ``FileBackedData`` (registered with ``add_named_data`` as is).
        layout: ``split`` (blob *i* in the ``.pte`` when *i* is even, else in
            ``engines.ptd``), ``pte`` or ``ptd``.
        segment_alignment: ExecuTorch's segment alignment.

    Returns:
        The ``ExecutorchProgramManager``.
    """
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.backend.partitioner import (
        DelegationSpec,
        Partitioner,
        PartitionResult,
    )

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    _backend()
    n = len(blobs)

    def tag_of(i: int) -> str | None:
        if layout == "pte" or (layout == "split" and i % 2 == 0):
            return None
        return PTD_TAG

    entries = [(f"engine{i}_trt_engine", b, tag_of(i)) for i, b in enumerate(blobs)]

    class PerStepPartitioner(Partitioner):
        def partition(self, exported_program: Any) -> Any:
            tags = {}
            i = 0
            for node in exported_program.graph_module.graph.nodes:
                if node.op != "call_function":
                    continue
                tag = f"trtet_bench_{i}"
                node.meta["delegation_tag"] = tag
                tags[tag] = DelegationSpec(
                    BACKEND_ID,
                    [CompileSpec("engine_index", str(i).encode())],
                )
                i += 1
            return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    class Chain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(n):
                x = x * 2.0
            return x

    # preprocess runs inside to_backend and finds its payload here; no token
    # goes into the program, so equal payloads give byte-identical outputs.
    with _BUILD_LOCK:
        _PENDING[:] = entries
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ep = torch.export.export(Chain(), (torch.randn(4),))
                edge = to_edge(ep).to_backend(PerStepPartitioner())
                config = ExecutorchBackendConfig(segment_alignment=segment_alignment)
                return edge.to_executorch(config)
        finally:
            _PENDING.clear()


def stage_payloads(
    store: Any, config: BenchConfig, seed: int, progress: Callable[[int], None] | None
) -> list[Any]:
    """Write ``config.payloads`` payloads of random-looking bytes as blobs of ``store``.

    A 16 MiB pseudo-random block (from ``seed``) is reused with each chunk's
    first 16 bytes made unique (payload, chunk, seed), so payloads differ
    (ExecuTorch's dedup fingerprint is the first 32 bytes) without generating
    gigabytes of randomness, and the same seed gives the same bytes (outputs
    of different stagings can be compared).
    """
    block = bytearray(random.Random(seed).randbytes(min(16 * MiB, config.payload_size)))
    blobs = []
    done = 0
    for i in range(config.payloads):
        left = config.payload_size
        k = 0
        with store.writer() as w:
            while left:
                n = min(left, len(block))
                if n >= 16:
                    block[:16] = struct.pack("<IQI", i, k, seed & 0xFFFFFFFF)
                w.write(memoryview(block)[:n])
                left -= n
                k += 1
                done += n
                if progress:
                    progress(done)
        blobs.append(w.blob)
    return blobs
