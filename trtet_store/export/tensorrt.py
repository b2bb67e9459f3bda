"""TensorRT lowering: engines staged as owned blobs, delegated to ExecuTorch as named data.

The TensorRT build is one function, :func:`build_engines` (the seam): module
and inputs in; an ExportedProgram whose engines are ``trtet_store::trt_engine``
placeholder nodes, and the engines as :class:`~trtet_store.io.Blob` s, out.
Each engine is streamed into the blob store as soon as it is built and its
in-memory copy dropped. Everything after the seam is ordinary ExecuTorch
lowering: :class:`TensorRTPartitioner` claims the placeholder nodes,
:class:`TensorRTBackend` emits the delegate blob (header and metadata only,
``engine_key`` set, engine size 0) and hands the engine over as file-backed
named data, so no engine byte passes through ``processed_bytes``.
"""

from __future__ import annotations

import importlib.util
import logging
import operator
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, final

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult

from trtet_store.export import trt_blob
from trtet_store.io import Blob, BlobStore

if TYPE_CHECKING:
    from torch.export import ExportedProgram

log = logging.getLogger("trtet_store.tensorrt")

BACKEND_ID = "TensorRTBackend"
OP_NAMESPACE = "trtet_store"
OP_NAME = "trt_engine"
ENGINE_ALIGNMENT = 16
EXTERNAL_SPEC = "external_engine_data"
STREAMING_SPEC = "weight_streaming_budget"


class TensorRTUnavailableError(RuntimeError):
    """The TensorRT backend was asked for where Torch-TensorRT or CUDA is missing."""


@dataclass
class Engine:
    """A built engine, staged in a blob store, and what the runtime needs to bind it.

    Attributes
    ----------
    engine_id : str
        Names the engine in its placeholder node.
    blob : Blob
        The serialized engine.
    metadata : trt_blob.BlobMetadata
        I/O bindings, device, platform; ``engine_key`` is filled in at preprocess.
    outputs : list of (shape, dtype)
        Output specs, for the placeholder's shape function.
    """

    engine_id: str
    blob: Blob
    metadata: trt_blob.BlobMetadata
    outputs: list[tuple[tuple[int, ...], torch.dtype]]

    @property
    def key(self) -> str:
        """The named-data key: derived from the content digest, stable across runs."""
        return f"{self.blob.digest}_trt_engine"


@dataclass
class BuildResult:
    """What the seam returns."""

    exported_program: ExportedProgram
    engines: list[Engine] = field(default_factory=list)


# Engines by id while a lowering runs. Preprocess sees only a deep copy of
# each partition, so the blob travels by name, not by reference.
_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def register_engine(blob: Blob, metadata: trt_blob.BlobMetadata,
                    outputs: list[tuple[tuple[int, ...], torch.dtype]]) -> Engine:
    """Make ``blob`` known to the placeholder op and the backend under a fresh id."""
    engine = Engine(uuid.uuid4().hex, blob, metadata, outputs)
    with _engines_lock:
        _engines[engine.engine_id] = engine
    return engine


def unregister_engines(engines: list[Engine]) -> None:
    with _engines_lock:
        for e in engines:
            _engines.pop(e.engine_id, None)


def lookup_engine(engine_id: str) -> Engine:
    try:
        return _engines[engine_id]
    except KeyError:
        raise RuntimeError(f"engine {engine_id} is not registered: was it built in this "
                           "process, by trtet_store.export.tensorrt.build_engines?") from None


# -- the placeholder op --------------------------------------------------------------

_lib = torch.library.Library(OP_NAMESPACE, "DEF")
_lib.define(f"{OP_NAME}(Tensor[] inputs, str engine_id) -> Tensor[]")


@torch.library.impl(_lib, OP_NAME, "CompositeExplicitAutograd")
def _trt_engine_eager(inputs: list[torch.Tensor], engine_id: str) -> list[torch.Tensor]:
    raise RuntimeError("a TensorRT engine placeholder cannot run eagerly; run the exported "
                       "program with the ExecuTorch TensorRT runtime")


@torch.library.register_fake(f"{OP_NAMESPACE}::{OP_NAME}")
def _trt_engine_fake(inputs: list[torch.Tensor], engine_id: str) -> list[torch.Tensor]:
    engine = lookup_engine(engine_id)
    device = inputs[0].device if inputs else torch.device("meta")
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in engine.outputs]


def trt_engine_op() -> Any:
    """The placeholder op overload a builder puts in the graph."""
    return getattr(getattr(torch.ops, OP_NAMESPACE), OP_NAME).default


def _is_engine_node(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return (node.op == "call_function" and schema is not None
            and schema.name == f"{OP_NAMESPACE}::{OP_NAME}")


# -- partitioner and backend ------------------------------------------------------------

class TensorRTPartitioner(Partitioner):
    """Claims each engine placeholder (and its output getters) as its own partition.

    Parameters
    ----------
    compile_specs : list of CompileSpec, optional
        Passed to every partition. ``target_device`` defaults to ``cuda:<device_id>``
        of each engine.
    external_engine_data : str, optional
        Put engines in ``<name>.ptd`` instead of the ``.pte``.
    weight_streaming_budget_per_engine : int, optional
        Bytes of engine weights that may stay resident on the GPU, per engine.
    """

    def __init__(self, compile_specs: list[CompileSpec] | None = None, *,
                 external_engine_data: str | None = None,
                 weight_streaming_budget_per_engine: int | None = None) -> None:
        super().__init__()
        self.compile_specs = list(compile_specs or [])
        if external_engine_data is not None:
            self.compile_specs.append(CompileSpec(EXTERNAL_SPEC, external_engine_data.encode()))
        if weight_streaming_budget_per_engine is not None:
            budget = int(weight_streaming_budget_per_engine)
            if not 0 <= budget < 2**63:
                raise ValueError(f"weight_streaming_budget_per_engine must be in [0, 2**63), "
                                 f"got {budget}")
            self.compile_specs.append(CompileSpec(STREAMING_SPEC, str(budget).encode()))

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        tags: dict[str, DelegationSpec] = {}
        for i, node in enumerate(n for n in exported_program.graph_module.graph.nodes
                                 if _is_engine_node(n)):
            tag = f"tensorrt_{i}"
            node.meta["delegation_tag"] = tag
            for user in node.users:
                user.meta["delegation_tag"] = tag
            specs = list(self.compile_specs)
            if not any(s.key == "target_device" for s in specs):
                device = lookup_engine(node.args[1]).metadata.device_id
                specs.append(CompileSpec("target_device", f"cuda:{device}".encode()))
            tags[tag] = DelegationSpec(BACKEND_ID, specs)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)


@final
class TensorRTBackend(BackendDetails):
    """Emits the TensorRT delegate blob without the engine, and the engine as named data."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram,
                   compile_specs: list[CompileSpec]) -> PreprocessResult:
        from executorch.exir._serialize._named_data_store import NamedDataStore

        from trtet_store.export.executorch import add_blob_as_named_data

        nodes = [n for n in edge_program.graph_module.graph.nodes if _is_engine_node(n)]
        if len(nodes) != 1:
            raise RuntimeError(f"a TensorRT partition holds exactly one engine, found "
                               f"{len(nodes)}")
        engine = lookup_engine(nodes[0].args[1])
        specs = {s.key: bytes(s.value) for s in compile_specs}
        external = specs.get(EXTERNAL_SPEC)
        store = NamedDataStore()
        add_blob_as_named_data(store, engine.key, engine.blob, alignment=ENGINE_ALIGNMENT,
                               external_tag=external.decode() if external else None)
        metadata = _with_key(engine.metadata, engine.key)
        log.info("engine %s: %d bytes as named data %r in %s", engine.engine_id,
                 engine.blob.size, engine.key,
                 f"{external.decode()}.ptd" if external else "the .pte")
        return PreprocessResult(processed_bytes=trt_blob.encode(metadata),
                                data_store_output=store.get_named_data_store_output())


def _with_key(metadata: trt_blob.BlobMetadata, key: str) -> trt_blob.BlobMetadata:
    from dataclasses import replace

    return replace(metadata, engine_key=key)


# -- the seam: building engines with Torch-TensorRT ----------------------------------------

def check_available() -> None:
    """Raise :class:`TensorRTUnavailableError` naming what is missing and how to get it."""
    if importlib.util.find_spec("torch_tensorrt") is None:
        raise TensorRTUnavailableError(
            "backend='tensorrt' needs Torch-TensorRT, which is not installed: "
            "pip install 'trtet-store[tensorrt]' on a machine with an NVIDIA GPU and CUDA "
            "(or use backend='xnnpack' to export for CPU)")
    if not torch.cuda.is_available():
        raise TensorRTUnavailableError(
            "backend='tensorrt' needs a CUDA device, and torch sees none "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); run on a "
            "machine with an NVIDIA GPU and a CUDA build of torch, or use backend='xnnpack'")


def build_engines(exported_program: ExportedProgram, arg_inputs: tuple,
                  kwarg_inputs: dict | None, store: BlobStore,
                  settings: dict[str, Any]) -> BuildResult:
    """Compile with Torch-TensorRT's dynamo path; stage each engine in ``store`` as it is built.

    This is the one function CPU tests replace. It needs torch_tensorrt and a
    CUDA device, and runs only where both exist.
    """
    import torch_tensorrt  # noqa: F401 - registers the tensorrt ops
    from torch_tensorrt.dynamo import compile as trt_compile
    from torch_tensorrt.dynamo.runtime._TorchTensorRTModule import (
        DEVICE_IDX,
        ENGINE_IDX,
        HW_COMPATIBLE_IDX,
        INPUT_BINDING_NAMES_IDX,
        OUTPUT_BINDING_NAMES_IDX,
        SERIALIZED_METADATA_IDX,
        TARGET_PLATFORM_IDX,
    )

    compiled = trt_compile(exported_program, arg_inputs=arg_inputs, kwarg_inputs=kwarg_inputs,
                           **settings)
    engines: list[Engine] = []
    for name, sub in list(compiled.named_children()):
        info = getattr(sub, "engine", None)
        if info is None:
            continue
        state = list(sub.engine.__getstate__()[0])
        with store.writer() as w:
            w.write(state[ENGINE_IDX])
        state[ENGINE_IDX] = None  # drop the in-memory engine as soon as it is staged
        inputs = [s for s in str(state[INPUT_BINDING_NAMES_IDX]).split("%") if s]
        outputs = [s for s in str(state[OUTPUT_BINDING_NAMES_IDX]).split("%") if s]
        example_out = [n for n in compiled.graph.nodes if n.op == "call_module"
                       and n.target == name][0].meta.get("val")
        vals = example_out if isinstance(example_out, (list, tuple)) else [example_out]
        metadata = trt_blob.BlobMetadata(
            io_bindings=tuple([trt_blob.IOBinding(n) for n in inputs]
                              + [trt_blob.IOBinding(n, is_input=False) for n in outputs]),
            hardware_compatible=str(state[HW_COMPATIBLE_IDX]) == "1",
            device_id=int(str(state[DEVICE_IDX]).split("%")[0] or 0),
            serialized_metadata=str(state[SERIALIZED_METADATA_IDX] or ""),
            target_platform=str(state[TARGET_PLATFORM_IDX] or ""))
        engine = register_engine(w.blob, metadata,
                                 [(tuple(v.shape), v.dtype) for v in vals if v is not None])
        engines.append(engine)
        _replace_submodule_with_placeholder(compiled, name, engine)
        delattr(compiled, name)
        log.info("engine %s of %s: %d bytes staged at %s", engine.engine_id, name,
                 engine.blob.size, engine.blob.path)
    exported = torch.export.export(compiled, arg_inputs, kwarg_inputs or {}, strict=False)
    return BuildResult(exported, engines)


def _replace_submodule_with_placeholder(gm: torch.fx.GraphModule, name: str,
                                        engine: Engine) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_module" or node.target != name:
            continue
        with graph.inserting_before(node):
            call = graph.call_function(trt_engine_op(), (list(node.args), engine.engine_id))
            outs = [graph.call_function(operator.getitem, (call, i))
                    for i in range(len(engine.outputs))]
        if len(outs) == 1 and not isinstance(node.meta.get("val"), (list, tuple)):
            node.replace_all_uses_with(outs[0])
        else:
            for user in list(node.users):
                if user.target is operator.getitem:
                    user.replace_all_uses_with(outs[user.args[1]])
                    graph.erase_node(user)
        graph.erase_node(node)
    graph.lint()
    gm.recompile()
