"""Real small ExecuTorch 1.5.1 programs for tests and benchmarks.

Builders:
    xnnpack_linear_program(...) -> BuiltProgram
        A two-layer MLP lowered to XNNPACK; with ``external_tag`` its weights go
        to ``<tag>.ptd`` (XNNPACK's delegate external constants). Runs on the
        ExecuTorch runtime shipped in the wheel.
    portable_linear_program(...) -> BuiltProgram
        The same MLP on portable kernels with ``external_constants=True``
        (emitter constants in ``_default_external_constant.ptd``).
    named_data_program(entries, ...) -> ExecutorchProgramManager
        A one-delegate program of a test backend whose ``preprocess`` puts the
        given named data (bytes, ``FileBackedData`` or our ``Blob``) into the
        ``.pte`` or into ``.ptd`` files by ``external_tag``. The backend is not
        registered in the runtime, so ``load_program`` works but
        ``load_method`` fails (error 0x20, NotFound).
    standard_entries(directory, size) -> StandardPayloads
        Several file-backed payloads in the ``.pte`` and two ``.ptd`` files:
        aliases of one buffer, mixed alignments, a user file, a ``move_from``
        file and a ``cleanup=True`` file.
    write_payload_file(path, size, seed) -> Path

Helpers:
    concat(pieces) -> bytes           the bytes a piece list stands for
    executorch_outputs(program, dir)  ExecuTorch's own save + write_tensor_data_to_file

Sizes default to a few MiB; pass ``size`` of a few hundred MiB for the long variants.
"""

from __future__ import annotations

import os
import random
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, final

from trtet_store.io.units import MiB

# --- XNNPACK / portable ------------------------------------------------------------


@dataclass
class BuiltProgram:
    """A lowered program with the eager module and inputs it came from."""

    manager: Any  # ExecutorchProgramManager
    module: Any  # torch.nn.Module, eval mode
    inputs: tuple[Any, ...]
    ptd_tags: list[str] = field(default_factory=list)


def _mlp(in_features: int, hidden: int, out_features: int, seed: int) -> Any:
    import torch

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = torch.nn.Linear(in_features, hidden)
            self.l2 = torch.nn.Linear(hidden, out_features)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.l2(torch.relu(self.l1(x)))

    torch.manual_seed(seed)
    return MLP().eval()


def xnnpack_linear_program(
    *,
    in_features: int = 64,
    hidden: int = 256,
    out_features: int = 8,
    external_tag: str | None = "model",
    segment_alignment: int = 128,
    seed: int = 0,
) -> BuiltProgram:
    """An MLP lowered to XNNPACK, weights in ``<external_tag>.ptd`` (or in the ``.pte``).

    Weight bytes are about ``4 * hidden * (in_features + out_features)``: the
    default is ~73 KiB; ``in_features=hidden=1024`` gives ~4 MiB.
    """
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import (
        delegate_external_constants_pass_unlifted,
    )

    module = _mlp(in_features, hidden, out_features, seed)
    inputs = (torch.randn(2, in_features, generator=torch.Generator().manual_seed(seed + 1)),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, inputs)
        if external_tag is not None:
            unlifted = ep.module()
            delegate_external_constants_pass_unlifted(unlifted, gen_tag_fn=lambda _n: external_tag)
            ep = torch.export.export(unlifted, inputs)
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        manager = edge.to_executorch(ExecutorchBackendConfig(segment_alignment=segment_alignment))
    return BuiltProgram(manager, module, inputs, [external_tag] if external_tag else [])


def portable_linear_program(
    *,
    in_features: int = 64,
    hidden: int = 256,
    out_features: int = 8,
    seed: int = 0,
    segment_alignment: int = 128,
) -> BuiltProgram:
    """The MLP on portable kernels, constants externalized by the emitter."""
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge

    module = _mlp(in_features, hidden, out_features, seed)
    inputs = (torch.randn(2, in_features, generator=torch.Generator().manual_seed(seed + 1)),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, inputs)
        manager = to_edge(ep).to_executorch(
            ExecutorchBackendConfig(external_constants=True, segment_alignment=segment_alignment)
        )
    return BuiltProgram(manager, module, inputs, list(manager._tensor_data))


# --- a test backend carrying named data ---------------------------------------------


@dataclass
class NamedEntry:
    """One named-data registration made by the test backend's ``preprocess``.

    ``data`` is ``bytes``, an ExecuTorch ``FileBackedData`` or a trtet_store
    ``Blob`` (registered with ``add_blob_as_named_data``).
    """

    key: str
    data: Any
    alignment: int = 1
    external_tag: str | None = None


_PENDING: dict[str, list[NamedEntry]] = {}
TEST_BACKEND_ID = "TrtetNamedDataTestBackend"


def _backend_class() -> type:
    """Define the test backend once (``to_backend`` finds it by class name)."""
    global _BACKEND
    if _BACKEND is not None:
        return _BACKEND
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

    @final
    class TrtetNamedDataTestBackend(BackendDetails):
        @staticmethod
        def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
            from trtet_store.export.executorch import add_blob_as_named_data
            from trtet_store.io.blobstore import Blob

            token = next(c.value.decode() for c in compile_specs if c.key == "trtet_token")
            store = NamedDataStore()
            for e in _PENDING[token]:
                if isinstance(e.data, Blob):
                    add_blob_as_named_data(
                        store, e.key, e.data, alignment=e.alignment, external_tag=e.external_tag
                    )
                else:
                    store.add_named_data(
                        e.key, e.data, alignment=e.alignment, external_tag=e.external_tag
                    )
            return PreprocessResult(
                processed_bytes=b"TRTETTEST:" + token.encode(),
                data_store_output=store.get_named_data_store_output(),
            )

    _BACKEND = TrtetNamedDataTestBackend
    return _BACKEND


_BACKEND: type | None = None


def named_data_program(
    entries: list[NamedEntry], *, segment_alignment: int = 128, **backend_config: Any
) -> Any:
    """A program whose one delegate carries ``entries`` as named data.

    The entries' objects are referenced, not copied: the ``FileBackedData``
    objects end up in the program's Cords.
    """
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.backend.canonical_partitioners.all_node_partitioner import (
        AllNodePartitioner,
    )
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    _backend_class()

    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 + 1

    token = uuid.uuid4().hex
    _PENDING[token] = list(entries)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(Double(), (torch.randn(3),))
            part = AllNodePartitioner(TEST_BACKEND_ID, [CompileSpec("trtet_token", token.encode())])
            edge = to_edge(ep).to_backend(part)
            return edge.to_executorch(
                ExecutorchBackendConfig(segment_alignment=segment_alignment, **backend_config)
            )
    finally:
        del _PENDING[token]



# A model factory file for the CLI's `FILE:make` argument: a small MLP, seeded.
MODEL_FACTORY = """\
import torch

def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), \\
        (torch.randn(2, 16),)
"""


def write_model_factory(directory: os.PathLike | str) -> Path:
    """Write :data:`MODEL_FACTORY` as ``directory/model.py``; pass ``f"{path}:make"`` to the CLI."""
    path = Path(directory) / "model.py"
    path.write_text(MODEL_FACTORY)
    return path

def write_payload_file(path: os.PathLike | str, size: int, seed: int = 0) -> Path:
    """Write ``size`` pseudo-random bytes (deterministic in ``seed``) to ``path``."""
    rng = random.Random(seed)
    p = Path(path)
    with open(p, "wb") as f:
        left = size
        while left:
            n = min(left, 16 * MiB)
            f.write(rng.randbytes(n))
            left -= n
    return p


@dataclass
class StandardPayloads:
    """The payloads of :func:`standard_entries` and who owns which file."""

    entries: list[NamedEntry]
    user: Any  # FileBackedData over a user file (no cleanup)
    moved: Any  # FileBackedData.move_from: owned by ExecuTorch
    cleanup: Any  # FileBackedData(cleanup=True): owned by ExecuTorch
    user_path: Path
    ptd_tags: tuple[str, ...] = ("weights_a", "w2.ptd")


def standard_entries(directory: os.PathLike | str, size: int = 4 * MiB) -> StandardPayloads:
    """Three file-backed payloads of about ``size``, ``size/2``, ``size/3`` bytes.

    - ``user`` (the user's file, no cleanup): ``big0`` (align 64) and its
      alias ``big0_alias`` (align 4096) in the ``.pte``, ``big0_ext`` in
      ``weights_a.ptd`` (align 16): one buffer in two files;
    - ``moved`` (``move_from``): ``big1`` in ``weights_a.ptd`` (align 16);
    - ``cleanup`` (``cleanup=True``): ``big2`` (align 4096) and ``big2_alias``
      (align 1) in ``w2.ptd``;
    - small in-memory entries in each file, aligned 1 and 16.
    """
    from executorch.exir._serialize._cord import FileBackedData

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    user_path = write_payload_file(d / "user_payload.bin", size, seed=1)
    user = FileBackedData(os.fspath(user_path))
    moved = FileBackedData.move_from(
        os.fspath(write_payload_file(d / "to_move.bin", size // 2 + 3, seed=2))
    )
    cleanup = FileBackedData(
        os.fspath(write_payload_file(d / "owned.bin", size // 3 + 1, seed=3)), cleanup=True
    )
    entries = [
        NamedEntry("big0", user, 64),
        NamedEntry("big0_alias", user, 4096),
        NamedEntry("small", b"s" * 10, 1),
        NamedEntry("big1", moved, 16, "weights_a"),
        NamedEntry("big0_ext", user, 16, "weights_a"),
        NamedEntry("tiny_ext", b"t" * 33, 16, "weights_a"),
        NamedEntry("big2", cleanup, 4096, "w2.ptd"),
        NamedEntry("big2_alias", cleanup, 1, "w2.ptd"),
    ]
    return StandardPayloads(entries, user, moved, cleanup, user_path)


# --- helpers -----------------------------------------------------------------------


def concat(pieces: list[Any]) -> bytes:
    """The bytes a piece list stands for (reads Blob / ExternalFile paths)."""
    out = bytearray()
    for p in pieces:
        if isinstance(p, (bytes, bytearray, memoryview)):
            out += p
        else:
            with open(p.path, "rb") as f:
                data = f.read()
            assert len(data) == p.size, f"{p!r}: file has {len(data)} bytes"
            out += data
    return bytes(out)


def executorch_outputs(program: Any, directory: os.PathLike | str) -> dict[str, bytes]:
    """Run ExecuTorch's own ``save`` and ``write_tensor_data_to_file`` into ``directory``.

    Returns file name -> bytes for every file written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    program.save(os.fspath(d / "program.pte"))
    if program._tensor_data:
        program.write_tensor_data_to_file(os.fspath(d))
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}
