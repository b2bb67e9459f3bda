"""TensorRT lowering: engines staged as owned blobs, placed inline in their delegate segments.

The TensorRT build is one function, :func:`build_engines` (the seam): module
and inputs in; an ExportedProgram whose engines are ``trtet_store::trt_engine``
placeholder nodes, and the engines as :class:`~trtet_store.io.Blob` s, out.
Each engine is streamed into the blob store as soon as it is built and its
in-memory copy dropped; its state record (the list torch-tensorrt 2.14.0's
engine objects serialize to) is read by :func:`engine_state`, before staging, so
an engine the ExecuTorch runtime cannot run is refused before it costs disk.
Everything after the seam is ordinary ExecuTorch lowering:
:class:`TensorRTPartitioner` claims the placeholder nodes and
:class:`TensorRTBackend` emits the delegate blob the released runtime
(torch-tensorrt-executorch-runtime 0.1.0) parses, with upstream's preprocess
semantics: input bindings in delegate-argument order, output order checked,
``aliased_io`` carried (magic ``TR02``).

Where the engine goes
---------------------
Inline (the default, what the released runtime reads): the delegate's segment
is the whole upstream blob, header, metadata, padding, engine. ExecuTorch wants
``processed_bytes`` as ``bytes``, so preprocess returns the blob's head and a
token naming the staged engine (:data:`~trtet_store.export.trt_blob.STAGED_ENGINE_MARKER`
and a ticket for that very blob: two live exports with identical engines each
place their own); when the program is serialized, the token is replaced
by the engine file itself (``_executorch_private.expand_delegate_segments``), so
the engine is placed by clone, insert, move or copy like any payload and never
read into memory. The head pads the engine to a page (``io.units.PAGE``) within
the blob, so in a page-aligned segment (``segment_alignment=4096``) every
engine starts on a page of the file. Identical blobs (same engine, same
bindings) are one segment, as ExecuTorch does for any identical delegate data.

Named (``external_engine_data="name"``): the engine goes to ``name.ptd`` as
named data under ``engine_key`` and the blob in the ``.pte`` has engine size 0.
Newer Torch-TensorRT sources read this layout; no released runtime does yet.
It needs executorch 1.5 (``FileBackedData``).
"""

from __future__ import annotations

import importlib.util
import logging
import operator
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, final

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult

from trtet_store.export import trt_blob
from trtet_store.export.engine_state import (
    EngineState,
    UnsupportedEngineError,
    engine_state,
    state_layout,
)
from trtet_store.io import Blob, BlobStore
from trtet_store.io.units import PAGE

if TYPE_CHECKING:
    from torch.export import ExportedProgram

log = logging.getLogger("trtet_store.tensorrt")

BACKEND_ID = "TensorRTBackend"
OP_NAMESPACE = "trtet_store"
OP_NAME = "trt_engine"
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
    state : EngineState
        Bindings (in engine order), aliasing, device, platform.
    outputs : list of (shape, dtype)
        Output specs, for the placeholder's shape function.
    """

    engine_id: str
    blob: Blob
    state: EngineState
    outputs: list[tuple[tuple[int, ...], torch.dtype]]

    @property
    def key(self) -> str:
        """The named-data key: derived from the content digest, stable across runs."""
        return f"{self.blob.digest}_trt_engine"


@dataclass
class BuildResult:
    """What the seam returns.

    ``record`` is the build record of :mod:`~trtet_store.export.engine_reuse`,
    held here so that it lives (a blob nobody holds is released) until the
    export is done.
    """

    exported_program: ExportedProgram
    engines: list[Engine] = field(default_factory=list)
    record: Blob | None = None


# Engines by id while a lowering runs. Preprocess sees only a deep copy of
# each partition, so the blob travels by name, not by reference.
_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def register_engine(blob: Blob, state: EngineState,
                    outputs: list[tuple[tuple[int, ...], torch.dtype]], *,
                    engine_id: str | None = None) -> Engine:
    """Make ``blob`` known to the placeholder op and the backend, under a fresh id by default.

    ``engine_id`` names it as a recorded program's placeholders do (see
    :mod:`trtet_store.export.engine_reuse`).
    """
    if len(state.output_names) != len(outputs):
        raise UnsupportedEngineError(
            f"engine {blob.path}: {len(state.output_names)} output bindings "
            f"{list(state.output_names)} for {len(outputs)} outputs")
    engine = Engine(engine_id or uuid.uuid4().hex, blob, state, outputs)
    with _engines_lock:
        _engines[engine.engine_id] = engine
    return engine


def unregister_engines(engines: list[Engine]) -> None:
    """Forget ``engines``; an id registered since by another engine object stays.

    A reused build registers its engines under the recorded ids, which an
    earlier export's engines had: that export's finalizer (run whenever the
    garbage collector gets to its program) must not unregister the new ones.
    """
    with _engines_lock:
        for e in engines:
            if _engines.get(e.engine_id) is e:
                del _engines[e.engine_id]


def lookup_engine(engine_id: str) -> Engine:
    try:
        return _engines[engine_id]
    except KeyError:
        raise RuntimeError(f"engine {engine_id} is not registered: was it built in this "
                           "process, by trtet_store.export.tensorrt.build_engines?") from None


# Staged engines by ticket, from preprocess until the program is serialized; the
# serialized program then holds each blob through its segment.
_inline: dict[str, Blob] = {}
_TOKEN_SIZE = len(trt_blob.STAGED_ENGINE_MARKER) + 32  # an xxh3-128 hex ticket


def _ticket(blob: Blob) -> str:
    """Names ``blob`` itself, not only its bytes.

    A digest alone would let a program expand with another live export's
    identical engine (another store's blob) and consume it: that export
    could then not be written. The same blob always gets the same ticket, so
    ExecuTorch still merges identical delegate segments into one.
    """
    import xxhash

    return xxhash.xxh3_128_hexdigest(
        f"{blob.digest}\0{os.fspath(blob.path)}\0{id(blob)}".encode())


def _inline_processed_bytes(metadata: trt_blob.BlobMetadata, blob: Blob) -> bytes:
    from trtet_store.export import _executorch_private as priv

    ticket = _ticket(blob)
    with _engines_lock:
        for stale in [t for t, b in _inline.items() if b.closed]:
            del _inline[stale]
        _inline[ticket] = blob
    priv.expand_delegate_segments(_expand_inline_engine)
    head = trt_blob.prefix(metadata, blob.size, alignment=PAGE)
    return head + trt_blob.STAGED_ENGINE_MARKER + ticket.encode()


def _expand_inline_engine(raw: bytes) -> tuple[bytes, Blob] | None:
    """The head and staged engine of a delegate segment made by :class:`TensorRTBackend`."""
    token = raw[-_TOKEN_SIZE:]
    if raw[:4] not in (trt_blob.MAGIC, trt_blob.MAGIC_ALIASED_IO) or not token.startswith(
            trt_blob.STAGED_ENGINE_MARKER):
        return None
    ticket = token[len(trt_blob.STAGED_ENGINE_MARKER):].decode()
    head = raw[:-_TOKEN_SIZE]
    with _engines_lock:
        blob = _inline.get(ticket)
    if blob is None or blob.closed:
        raise RuntimeError(f"staged TensorRT engine {ticket} was released before the program "
                           "was serialized: keep its BlobStore open until to_executorch()")
    header = trt_blob.BlobHeader.from_bytes(head)
    if header.engine_offset != len(head) or header.engine_size != blob.size:
        raise RuntimeError(f"delegate blob head of engine {blob.path} does not describe "
                           f"{blob.size} engine bytes at offset {len(head)}")
    return head, blob


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
        Put engines in ``<name>.ptd`` as named data instead of inline in their
        delegates in the ``.pte``. No released TensorRT runtime reads this
        layout yet (torch-tensorrt-executorch-runtime 0.1.0 reads inline
        engines only); it needs executorch 1.5.
    weight_streaming_budget_per_engine : int, optional
        Bytes of engine weights that may stay resident on the GPU, per engine.

    Raises
    ------
    FileBackedDataUnavailableError
        ``external_engine_data`` with executorch 1.4.
    """

    def __init__(self, compile_specs: list[CompileSpec] | None = None, *,
                 external_engine_data: str | None = None,
                 weight_streaming_budget_per_engine: int | None = None) -> None:
        super().__init__()
        self.compile_specs = list(compile_specs or [])
        if external_engine_data is not None:
            from trtet_store.export import _executorch_private as priv
            from trtet_store.export.named_data import ptd_file_name

            ptd_file_name(external_engine_data)
            priv._file_backed_class()  # named engines are file-backed named data
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
                device = lookup_engine(node.args[1]).state.device_id
                specs.append(CompileSpec("target_device", f"cuda:{device}".encode()))
            tags[tag] = DelegationSpec(BACKEND_ID, specs)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)


@final
class TensorRTBackend(BackendDetails):
    """Emits the delegate blob torch-tensorrt-executorch-runtime parses, engine inline or named."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram,
                   compile_specs: list[CompileSpec]) -> PreprocessResult:
        nodes = [n for n in edge_program.graph_module.graph.nodes if _is_engine_node(n)]
        if len(nodes) != 1:
            raise RuntimeError(f"a TensorRT partition holds exactly one engine, found "
                               f"{len(nodes)}")
        node = nodes[0]
        engine = lookup_engine(node.args[1])
        inputs = delegate_input_order(edge_program, node, engine.state.input_names)
        check_output_order(edge_program, node, engine.state.output_names)
        metadata = trt_blob.BlobMetadata(
            io_bindings=tuple([trt_blob.IOBinding(n) for n in inputs]
                              + [trt_blob.IOBinding(n, is_input=False)
                                 for n in engine.state.output_names]),
            aliased_io=engine.state.aliased_io,
            hardware_compatible=engine.state.hardware_compatible,
            device_id=engine.state.device_id,
            serialized_metadata=engine.state.serialized_metadata,
            target_platform=engine.state.target_platform)
        external = {s.key: bytes(s.value) for s in compile_specs}.get(EXTERNAL_SPEC)
        if external is None:
            log.info("engine %s: %d bytes inline in its delegate segment (from %s)",
                     engine.engine_id, engine.blob.size, engine.blob.path)
            return PreprocessResult(processed_bytes=_inline_processed_bytes(metadata,
                                                                            engine.blob))
        return _named_engine(engine, metadata, external.decode())


def _named_engine(engine: Engine, metadata: trt_blob.BlobMetadata,
                  tag: str) -> PreprocessResult:
    from dataclasses import replace

    from trtet_store.export import _executorch_private as priv
    from trtet_store.export.named_data import add_blob_as_named_data

    store = priv.named_data_store()
    add_blob_as_named_data(store, engine.key, engine.blob, alignment=trt_blob.ENGINE_ALIGNMENT,
                           external_tag=tag)
    log.info("engine %s: %d bytes as named data %r in %s.ptd", engine.engine_id,
             engine.blob.size, engine.key, tag)
    return PreprocessResult(
        processed_bytes=trt_blob.encode(replace(metadata, engine_key=engine.key)),
        data_store_output=store.get_named_data_store_output())


def delegate_input_order(edge_program: ExportedProgram, node: torch.fx.Node,
                         names: Sequence[str]) -> list[str]:
    """Input binding names in the order of the delegate's runtime arguments.

    The runtime binds argument ``i`` to input name ``i``, and lowering may put the
    partition's placeholders in another order than the engine's inputs. The
    engine node lists its input nodes in binding order, so each name goes to the
    position of its node among the partition's placeholders.

    Raises
    ------
    ValueError
        The names do not match the engine node's inputs, or an input is not a
        placeholder of the partition.
    """
    inputs = list(node.args[0])
    if len(inputs) != len(names):
        raise ValueError(f"TensorRT engine node {node.name}: {len(names)} input binding "
                         f"names {list(names)} for {len(inputs)} inputs")
    position = {p: i for i, p in enumerate(
        n for n in edge_program.graph_module.graph.nodes if n.op == "placeholder")}
    strays = [n for n in inputs if n not in position]
    if strays:
        raise ValueError(f"TensorRT engine node {node.name}: inputs "
                         f"{[getattr(n, 'name', n) for n in strays]} are not arguments of "
                         "the delegate, so their binding order is unknown")
    return [name for _, name in sorted(zip((position[n] for n in inputs), names,
                                           strict=True))]


def check_output_order(edge_program: ExportedProgram, node: torch.fx.Node,
                       names: Sequence[str]) -> None:
    """Check that the delegate's output ``i`` is the engine's output ``i``.

    The runtime binds output ``i`` to output name ``i``; that holds only while
    the partition returns ``getitem(engine, i)`` in index order (or, for one
    output, the engine node itself).

    Raises
    ------
    ValueError
        Naming the order found.
    """
    output = next(n for n in edge_program.graph_module.graph.nodes if n.op == "output")
    returned = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) \
        else [output.args[0]]
    if returned == [node] and len(names) == 1:
        return
    indices = [r.args[1] if isinstance(r, torch.fx.Node) and r.op == "call_function"
               and r.target is operator.getitem and r.args[0] is node else None
               for r in returned]
    if indices != list(range(len(names))):
        raise ValueError(
            f"TensorRT delegate of {node.name}: its outputs are engine outputs {indices} "
            f"(None: not an engine output), expected {list(range(len(names)))}; the runtime "
            "binds output i to output binding i, so it would return the wrong tensors")


# -- the seam: building engines with Torch-TensorRT ----------------------------------------

#: How to try the TensorRT path without a GPU, the end of every
#: :class:`TensorRTUnavailableError` (the stub builder of :mod:`trtet_store.testing.stub_tensorrt`).
STUB_HINT = ("; to try it without a GPU, build with the stub TensorRT builder (pseudo-random "
             "engines, not runnable): TRTET_STUB_TENSORRT=1 for the trtet-store command, or "
             "in Python `with trtet_store.testing.stub_tensorrt.installed("
             "trtet_store.testing.stub_tensorrt.FakeBuilder()):` around the call")


def check_available() -> None:
    """Raise :class:`TensorRTUnavailableError` naming what is missing and how to get it.

    Each message ends with :data:`STUB_HINT`: how to try the path with the stub builder.
    """
    if importlib.util.find_spec("torch_tensorrt") is None:
        raise TensorRTUnavailableError(
            "backend='tensorrt' needs Torch-TensorRT, which is not installed: "
            "pip install 'trtet-store[tensorrt]' on a machine with an NVIDIA GPU and CUDA "
            "(or use backend='xnnpack' to export for CPU)" + STUB_HINT)
    if not torch.cuda.is_available():
        raise TensorRTUnavailableError(
            "backend='tensorrt' needs a CUDA device, and torch sees none "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); run on a "
            "machine with an NVIDIA GPU and a CUDA build of torch, or use backend='xnnpack'"
            + STUB_HINT)


def build_engines(exported_program: ExportedProgram, arg_inputs: tuple,
                  kwarg_inputs: dict | None, store: BlobStore,
                  settings: dict[str, Any]) -> BuildResult:
    """Compile with Torch-TensorRT's dynamo path; stage each engine in ``store`` as it is built.

    This is the one function CPU tests replace. It needs torch_tensorrt and a
    CUDA device, and runs only where both exist.
    """
    import torch_tensorrt  # noqa: F401 - registers the tensorrt ops
    from torch_tensorrt.dynamo import compile as trt_compile

    compiled = trt_compile(exported_program, arg_inputs=arg_inputs, kwarg_inputs=kwarg_inputs,
                           **settings)
    return stage_compiled(compiled, arg_inputs, kwarg_inputs, store)


class RefitError(RuntimeError):
    """A refit whose engine must not be used: a weight left unset, or TensorRT refused it.

    The caller builds instead (issue 46): a refit's result is all or nothing.
    """


def refittable(settings: dict[str, Any]) -> bool:
    """Whether a build with these compile settings makes an engine that may be refit.

    Torch-TensorRT's meaning (``dynamo/_settings.py``): ``immutable_weights``
    defaults to True (weights baked in, no refit); an engine built with
    ``refit_identical_engine_weights=True`` may only be refit with the very
    weights it was built with (TensorRT calls anything else "unpredictable"),
    so it is never refit with other weights.
    """
    return settings.get("immutable_weights", True) is False and \
        settings.get("refit_identical_engine_weights", False) is not True


def refit_engine(engine_path: os.PathLike | str, exported_program: ExportedProgram,
                 arg_inputs: tuple, kwarg_inputs: dict | None, settings: dict[str, Any],
                 writer: Any) -> None:
    """Refit the refittable engine at ``engine_path`` with ``exported_program``'s weights.

    This is the refit seam beside :func:`build_engines` (CPU tests replace
    it with :class:`~trtet_store.testing.stub_tensorrt.FakeRefitter`). It
    needs tensorrt, torch_tensorrt and a CUDA device, and is not run here:
    written against TensorRT's ``trt.Refitter`` and Torch-TensorRT's
    ``dynamo._refit.construct_refit_mapping`` (the interpreter's map from
    the engine's weight names to the new tensors, as
    ``_refit_single_trt_engine_with_gm`` uses it), for a program lowered to
    one engine. The refit engine is serialized with ``INCLUDE_REFIT`` (it
    stays refittable) and written to ``writer`` (a store writer).

    Raises
    ------
    RefitError
        The engine does not deserialize, a weight of the engine has no new
        value (the refitter's missing weights are not empty), or
        ``refit_cuda_engine()`` returned False. Nothing was written then.
    """
    import dataclasses as _dc

    import tensorrt as trt
    import torch_tensorrt  # noqa: F401 - registers the tensorrt ops
    from torch_tensorrt.dynamo._refit import construct_refit_mapping
    from torch_tensorrt.dynamo._settings import CompilationSettings

    logger = trt.Logger(trt.Logger.WARNING)
    with open(engine_path, "rb") as f:
        # TensorRT deserializes from memory: the one copy a refit holds.
        engine = trt.Runtime(logger).deserialize_cuda_engine(f.read())
    if engine is None:
        raise RefitError(f"TensorRT could not deserialize the engine {os.fspath(engine_path)}")
    known = {f.name for f in _dc.fields(CompilationSettings)}
    compile_settings = CompilationSettings(**{k: v for k, v in settings.items() if k in known})
    inputs = [*arg_inputs, *(kwarg_inputs or {}).values()]
    mapping = construct_refit_mapping(exported_program.module(), inputs, compile_settings)
    refitter = trt.Refitter(engine, logger)
    for name in refitter.get_all_weights():
        if name not in mapping:
            continue  # left unset: get_missing_weights says so below
        weight, dtype = mapping[name]
        refitter.set_named_weights(name, trt.Weights(dtype, weight.ctypes.data, weight.size),
                                   trt.TensorLocation.HOST)
    missing = list(refitter.get_missing_weights())
    if missing:
        raise RefitError(f"{len(missing)} weight(s) of the engine have no new value: "
                         f"{missing[:5]}")
    if not refitter.refit_cuda_engine():
        raise RefitError("TensorRT's refit_cuda_engine() returned False")
    config = engine.create_serialization_config()
    config.flags &= ~(1 << int(trt.SerializationFlag.EXCLUDE_WEIGHTS))
    config.flags |= 1 << int(trt.SerializationFlag.INCLUDE_REFIT)
    writer.write(memoryview(engine.serialize_with_config(config)))


def check_refit(engine_path: os.PathLike | str, exported_program: ExportedProgram
                ) -> str | None:
    """Why the engine a refit wrote at ``engine_path`` must not be used, or None.

    The seam's second half (the stub's checks the header it writes: the
    refit took these very weights). For the real TensorRT the refit's own
    checks are the ones that count (:func:`refit_engine` raises when a
    weight is left unset or ``refit_cuda_engine()`` is False, and the engine
    it writes is TensorRT's own serialization): here only an empty engine is
    refused, so that the check costs no read of the engine's bytes (the
    store's writer digested them as they were written).
    """
    if os.stat(engine_path).st_size == 0:
        return "the refit wrote an empty engine"
    return None


#: Torch-TensorRT's modules that hold an engine (C++ and Python runtimes).
_TRT_MODULE_CLASSES = ("TorchTensorRTModule", "PythonTorchTensorRTModule")


def has_engines(module: torch.nn.Module) -> bool:
    """Whether ``module`` was compiled by Torch-TensorRT (holds TensorRT engine submodules)."""
    return any(type(m).__name__ in _TRT_MODULE_CLASSES and getattr(m, "engine", None)
               is not None for m in module.modules())


def has_engine_nodes(program: ExportedProgram) -> bool:
    """Whether ``program`` calls Torch-TensorRT engines (``tensorrt::execute_engine``)."""
    return any(getattr(getattr(n.target, "_schema", None), "name", "").startswith("tensorrt::")
               for n in program.graph_module.graph.nodes if n.op == "call_function")


def stage_compiled(compiled: torch.fx.GraphModule, arg_inputs: tuple,
                   kwarg_inputs: dict | None, store: BlobStore) -> BuildResult:
    """Stage the engines of a module Torch-TensorRT compiled; none is rebuilt.

    Each TensorRT submodule's state is read with torch_tensorrt's own
    ``get_engine_info_from_state`` (metadata only) and checked before its bytes
    are staged; the bytes come from the engine's tensor accessor where the
    runtime has one. The submodule is then replaced by a placeholder node and
    the module exported again.
    """
    from torch_tensorrt.executorch._export_utils import get_engine_info_from_state

    engines: list[Engine] = []
    for name, sub in list(compiled.named_children()):
        trt_engine = getattr(sub, "engine", None)
        if trt_engine is None:
            continue
        state = engine_state(get_engine_info_from_state(trt_engine, metadata_only=True),
                             name=name)
        with store.writer() as w:
            w.write(_serialized_engine(trt_engine))  # dropped once written
        example_out = [n for n in compiled.graph.nodes if n.op == "call_module"
                       and n.target == name][0].meta.get("val")
        vals = example_out if isinstance(example_out, (list, tuple)) else [example_out]
        engine = register_engine(w.blob, state,
                                 [(tuple(v.shape), v.dtype) for v in vals if v is not None])
        engines.append(engine)
        _replace_submodule_with_placeholder(compiled, name, engine)
        delattr(compiled, name)
        log.info("engine %s of %s: %d bytes staged at %s", engine.engine_id, name,
                 engine.blob.size, engine.blob.path)
    exported = torch.export.export(compiled, tuple(arg_inputs), kwarg_inputs or {},
                                   strict=False)
    return BuildResult(exported, engines)


def _serialized_engine(trt_engine: Any) -> memoryview:
    """The engine's bytes, through its tensor accessor where the runtime has one."""
    tensor_of = getattr(trt_engine, "serialized_engine_tensor", None)
    if tensor_of is not None:
        tensor = tensor_of().cpu().contiguous().view(torch.uint8)
        return memoryview(tensor.numpy())
    raw = trt_engine.__getstate__()
    record = list(raw[0] if isinstance(raw, tuple) else raw)
    engine = record[state_layout()[0]["ENGINE_IDX"]]
    if isinstance(engine, str):
        import base64

        engine = base64.b64decode(engine)
    return memoryview(engine)


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
