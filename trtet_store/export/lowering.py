"""export(): a model (or several methods) to an ExecuTorch Edge program, engines staged.

The same keyword arguments as ``torch_tensorrt.executorch.export`` (Torch-TensorRT
2.14.0), with the same meaning and refusals, plus ours: ``backend``, ``store``,
``external_engine_data``. The difference is where engines live: upstream decodes
each engine into a byte buffer the returned program owns (so a multi-gigabyte
engine is resident twice); here every engine is a blob staged in ``store`` as
it is built and the program holds only its length, so ``to_executorch()`` and
:func:`trtet_store.save_program` (``consume=True``) place it without copying.

Everything a caller can get wrong is checked before anything is built or
written: unknown keywords and compile settings (a ``TypeError`` naming the
closest known one), method names, per-method option mappings,
``constant_methods`` keys and values, partitioners shared across methods while
their specs name one. The caller's programs are never changed:
``external_weights`` tags a copy.

Methods of one build (the same fingerprint, see
:mod:`~trtet_store.export.engine_reuse`) are built once and share its
engines; an engine found identical by digest to one already staged in this
call is released at once and the first one shared.
"""

from __future__ import annotations

import inspect
import logging
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executorch.exir import EdgeProgramManager
    from torch.export import ExportedProgram

    from trtet_store.export.options import LoweringOptions
    from trtet_store.io import BlobStore

log = logging.getLogger("trtet_store.export")

DEFAULT_METHOD = "forward"


def export(
    source: Any,
    *,
    inputs: Sequence[Any] | None = None,
    arg_inputs: Sequence[Any] | None = None,
    kwarg_inputs: Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
    lowering: LoweringOptions | None = None,
    store: BlobStore | None = None,
    engine_cache: Any = None,
    engine_cache_timeout: float | None = None,
    **keywords: Any,
) -> EdgeProgramManager:
    """Lower ``source`` to an ExecuTorch Edge program, each TensorRT engine staged in ``store``.

    Also ``trtet_store.export_program`` (the top-level ``trtet_store.export`` is
    this subpackage, so the function has a second name there).

    Parameters
    ----------
    source : nn.Module, GraphModule, ExportedProgram or mapping of str to ExportedProgram
        A module (exported with the example inputs, then built), a module
        already compiled by Torch-TensorRT (its engines are taken from its
        TensorRT submodules, not rebuilt), an ExportedProgram (built from its
        own example inputs), or one ExportedProgram per method of the ``.pte``
        (``{"prefill": ep1, "decode": ep2}``).
    inputs, arg_inputs : sequence, optional
        Example positional inputs for a module source (the same argument; give one).
    kwarg_inputs : mapping, optional
        Example keyword inputs for a module source.
    dynamic_shapes : optional
        Passed to ``torch.export.export`` for a module source.
    lowering : LoweringOptions, optional
        How it is lowered: backend, passes, partitioners, specs, the ``.ptd``
        layout (see :class:`~trtet_store.LoweringOptions`). Its fields are
        still accepted as keywords; one given beside ``lowering`` with
        another value is a ``TypeError``.
    store : BlobStore, optional
        Where engines are staged. Default: the per-user default store; put it
        on the output's filesystem so that engines can be moved or cloned.
    engine_cache : EngineCache or bool, optional
        A :class:`trtet_store.EngineCache` (``True``: the default one, per
        user). A build found there is not built: its engines are cloned from
        the cache into ``store`` (copied where they share no reflink
        filesystem). A build made here enters it before the program is
        saved; a cache that cannot take it never fails the export (logged,
        and in the program's ``trtet_cache`` events). One build per key at a
        time across processes: the others wait and take the hit.
    engine_cache_timeout : float, optional
        Seconds to wait for another process building the same engines;
        default: until it finishes or dies. ``CacheWaitTimeout`` past it.
    **keywords
        Torch-TensorRT compile settings (and the old lowering keywords).

    Returns
    -------
    executorch.exir.EdgeProgramManager
        ExecuTorch's own. Its engines stay staged (and registered) as long as
        it lives. ``to_executorch(config)`` then
        ``trtet_store.save_program(program, path, consume=True)`` writes it.

    Raises
    ------
    ValueError, TypeError
        A bad argument, before anything is built or staged; ``TypeError`` for a
        keyword neither this function nor the TensorRT compiler knows, and for
        compile settings with ``backend="xnnpack"``.
    ExportError
        A ``constant_methods`` value ExecuTorch cannot emit, before anything is built.
    TensorRTUnavailableError
        ``backend="tensorrt"`` needs a build and Torch-TensorRT or CUDA is missing.

    Warns
    -----
    UserWarning
        The store's directory holds staged engines of other builds that no
        export has taken (a crashed or failed one's): disk nobody uses.
    """
    from trtet_store.export.options import lowering_of

    opts, compile_settings = lowering_of(lowering, "export", keywords,
                                         inspect.signature(export).parameters)
    backend, external_engine_data = opts.backend, opts.external_engine_data
    if inputs is not None and arg_inputs is not None:
        raise ValueError("give inputs or arg_inputs, not both (they are the same argument)")
    args = inputs if inputs is not None else arg_inputs
    check_inputs_tuple(args, "inputs" if inputs is not None else "arg_inputs")
    external_weights = opts.external_weights
    if backend != "tensorrt" and external_weights is None:
        external_weights = external_engine_data
    methods = _methods(source, args, kwarg_inputs, dynamic_shapes, opts.retrace)
    names = tuple(methods)
    extra = _per_method(opts.partitioners, names, "partitioners")
    _refuse_misnamed_partitioners(extra)
    specs = _per_method(opts.compile_specs, names, "compile_specs")
    _check_constant_methods(opts.constant_methods, names)
    passes = _per_method_passes(opts.transform_passes, names)
    from trtet_store.export import tensorrt

    if backend == "tensorrt" and any(m.needs_build for m in methods.values()):
        tensorrt.check_available()
    from trtet_store.export import engine_cache as cache_mod

    if backend != "tensorrt" and engine_cache not in (None, False):
        raise ValueError("engine_cache applies to backend='tensorrt' (it caches TensorRT "
                         "builds)")
    cache = cache_mod.resolve(engine_cache) if backend == "tensorrt" else None
    if engine_cache_timeout is not None and not engine_cache_timeout >= 0:  # NaN too
        raise ValueError(f"engine_cache_timeout must be >= 0 seconds or None, got "
                         f"{engine_cache_timeout}")

    # Checked here, before a build: a bad budget or named layout must cost nothing.
    partitioner_for = {name: _first_partitioner(backend, specs[name], external_engine_data,
                                                opts.weight_streaming_budget_per_engine)
                       for name in names}
    own_store = store is None
    if store is None:
        from trtet_store.io import BlobStore

        store = BlobStore()
    fingerprints = _fingerprints(methods, backend, compile_settings)
    _warn_abandoned(store, set(fingerprints.values()))
    keep: list[Any] = []
    events: list[Any] = []  # the engine cache's, per engine
    engines: list[tensorrt.Engine] = []
    programs: dict[str, ExportedProgram] = {}
    try:
        by_fingerprint: dict[str, Any] = {}
        by_digest: dict[str, Any] = {}
        for name, method in methods.items():
            program = method.program
            if backend == "tensorrt":
                built = _engines_of(method, store, compile_settings, fingerprints.get(name),
                                    by_fingerprint, by_digest, cache=cache,
                                    cache_timeout=engine_cache_timeout, events=events)
                engines += [e for e in built.engines if all(e is not x for x in engines)]
                keep.append(built.record)
                program = built.exported_program
            if external_weights is not None:
                program = _tag_external_weights(program, external_weights)
            programs[name] = program
        edge = _lower(programs, single=not isinstance(source, Mapping), passes=passes,
                      partitioners={n: [partitioner_for[n], *extra[n]] for n in names},
                      constant_methods=opts.constant_methods,
                      compile_config=opts.compile_config, backend=backend,
                      generate_etrecord=opts.generate_etrecord)
    except BaseException:
        # What was built survives the failure: kept in the caller's store, or
        # left as orphans of our own, for the next export of the same build.
        from trtet_store.export import engine_reuse

        engine_reuse.keep(store, [*(e.blob for e in engines), *keep], own_store=own_store)
        tensorrt.unregister_engines(engines)
        if own_store:
            store.close()
        raise
    # The engines (and build records) live as long as the program that names them.
    edge.trtet_staged = (engines, keep)
    edge.trtet_cache = events
    weakref.finalize(edge, tensorrt.unregister_engines, list(engines))
    return edge


def _fingerprints(methods: dict[str, _Method], backend: str,
                  settings: dict[str, Any]) -> dict[str, str]:
    """The build fingerprint of each method TensorRT has to build (before any build)."""
    if backend != "tensorrt":
        return {}
    from trtet_store.export import engine_reuse

    return {name: engine_reuse.build_fingerprint(m.program, m.args, m.kwargs, settings)
            for name, m in methods.items() if m.compiled is None}


def _warn_abandoned(store: BlobStore, mine: set[str]) -> None:
    """Say (``warnings.warn``, seen without logging set up) what other builds left staged."""
    if store.directory is None:
        return
    from trtet_store.export import engine_reuse

    lines = engine_reuse.abandoned(store, exclude=mine)
    if lines:
        warnings.warn(
            f"{store.directory} keeps staged engines that no export has taken, of "
            f"{len(lines)} build(s) (a crashed or failed export's): " + "; ".join(lines) + ". Run "
            "that export again to reuse them, or remove them with "
            f"BlobStore({str(store.directory)!r}).remove_orphans() (`trtet-store recover "
            "DIR` lists them)", UserWarning, stacklevel=3)


class _Method:
    """One method to lower: its program, and how its engines are obtained."""

    def __init__(self, program: Any, args: tuple, kwargs: dict, *, needs_build: bool,
                 compiled: Any = None) -> None:
        self.program = program
        self.args = args
        self.kwargs = kwargs
        self.needs_build = needs_build
        self.compiled = compiled  # a Torch-TensorRT compiled module, engines inside


def check_inputs_tuple(args: Any, what: str = "inputs") -> None:
    """Refuse example inputs that are not a tuple (or list) of the positional inputs.

    A bare tensor is the usual slip (``inputs=x`` for ``inputs=(x,)``): without
    this it fails deep in the export as "Boolean value of Tensor with more than
    one value is ambiguous", or is split into its rows.

    Raises
    ------
    TypeError
        ``args`` is neither None, a tuple nor a list.
    """
    if args is None or isinstance(args, (tuple, list)):
        return
    name = type(args).__name__
    raise TypeError(f"{what} must be a tuple of the positional example inputs, got a {name}: "
                    "for one input give a tuple of one, (x,) not x")


def _methods(source: Any, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
             dynamic_shapes: Any, retrace: bool | None) -> dict[str, _Method]:
    import torch
    from torch.export import ExportedProgram

    from trtet_store.export import tensorrt

    input_options = (args is not None or kwargs is not None or dynamic_shapes is not None
                     or retrace is True)
    if isinstance(source, ExportedProgram):
        if input_options:
            raise ValueError("inputs, arg_inputs, kwarg_inputs, dynamic_shapes and "
                             "retrace=True are invalid for an already exported program")
        return {DEFAULT_METHOD: _from_exported(source, DEFAULT_METHOD)}
    if isinstance(source, Mapping):
        if input_options:
            raise ValueError("a method mapping takes only exported programs: per-method "
                             "inputs, dynamic_shapes and retrace are not supported")
        if not source:
            raise ValueError("the method mapping is empty")
        seen: dict[int, str] = {}
        out = {}
        for name, program in source.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"method name {name!r} is not a Python identifier")
            if not isinstance(program, ExportedProgram):
                raise TypeError(f"method {name!r}: a method mapping takes ExportedProgram "
                                f"values, got {type(program).__name__}")
            if id(program) in seen:
                raise ValueError(f"methods {seen[id(program)]!r} and {name!r} are the same "
                                 "ExportedProgram object; export each method on its own")
            seen[id(program)] = name
            out[name] = _from_exported(program, name)
        return out
    if isinstance(source, torch.nn.Module):
        call_args = tuple(args or ())
        call_kwargs = dict(kwargs or {})
        if not call_args and not call_kwargs:
            raise ValueError(f"a {type(source).__name__} source needs example inputs "
                             "(inputs/arg_inputs, kwarg_inputs)")
        compiled = source if tensorrt.has_engines(source) else None
        program = torch.export.export(source, call_args, call_kwargs,
                                      dynamic_shapes=dynamic_shapes, strict=False)
        return {DEFAULT_METHOD: _Method(program, call_args, call_kwargs,
                                        needs_build=compiled is None, compiled=compiled)}
    raise TypeError(f"source must be an nn.Module, a GraphModule, an ExportedProgram or a "
                    f"mapping of method names to ExportedPrograms, got {type(source).__name__}")


def _from_exported(program: ExportedProgram, name: str) -> _Method:
    from trtet_store.export import tensorrt

    if tensorrt.has_engine_nodes(program):
        raise ValueError(
            f"method {name!r}: this ExportedProgram already holds Torch-TensorRT engines "
            "(tensorrt::execute_engine); pass the compiled module itself (its engines are "
            "staged from its TensorRT submodules) or the program before compilation")
    example = getattr(program, "example_inputs", None)
    if example is None:
        raise ValueError(f"method {name!r}: the ExportedProgram has no example inputs to "
                         "build its engines with; export it with torch.export.export")
    args, kwargs = example
    return _Method(program, tuple(args), dict(kwargs or {}), needs_build=True)


def _engines_of(method: _Method, store: BlobStore, settings: dict[str, Any],
                fingerprint: str | None, by_fingerprint: dict[str, Any],
                by_digest: dict[str, Any], *, cache: Any = None,
                cache_timeout: float | None = None, events: list[Any] | None = None) -> Any:
    """The method's build: made earlier in this call, cached, an earlier export's, or new."""
    from trtet_store.export import engine_reuse, tensorrt

    if method.compiled is not None:
        built = tensorrt.stage_compiled(method.compiled, method.args, method.kwargs, store)
    elif fingerprint in by_fingerprint:
        # The same build as an earlier method's: its engines, a fresh program naming them.
        first = by_fingerprint[fingerprint]
        from trtet_store.export.record_check import load_record

        program = load_record(first.record.path)
        log.info("build %s: same as an earlier method's, its %d engine(s) shared",
                 fingerprint, len(first.engines))
        return tensorrt.BuildResult(program, first.engines, first.record)
    elif cache is not None:
        from trtet_store.export import engine_build, engine_refit

        built, found = engine_build.build_cached(
            cache, lambda **timing: engine_reuse.build_or_reuse(
                method.program, method.args, method.kwargs, store, {**settings, **timing},
                fingerprint=fingerprint),
            store, fingerprint, timeout=cache_timeout,
            refit=engine_refit.source(method.program, method.args, method.kwargs, settings),
            settings=settings)
        if events is not None:
            events += found
        by_fingerprint[fingerprint] = built
    else:
        built = engine_reuse.build_or_reuse(method.program, method.args, method.kwargs, store,
                                            settings, fingerprint=fingerprint)
        by_fingerprint[fingerprint] = built
    for engine in built.engines:
        first_blob = by_digest.setdefault(engine.blob.digest, engine.blob)
        if first_blob is not engine.blob:
            # Identical bytes staged twice: keep the first, release this copy now.
            log.info("engine %s: identical to %s (digest %s), its copy released",
                     engine.engine_id, first_blob.path, engine.blob.digest)
            duplicate, engine.blob = engine.blob, first_blob
            duplicate.close()
    return built


def _per_method(value: Any, names: tuple[str, ...], option: str) -> dict[str, list[Any]]:
    """A per-method list from a sequence (every method) or a mapping (refusing unknown names)."""
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"{option} names methods that do not exist: {unknown} "
                             f"(methods: {list(names)})")
        out = {}
        for name in names:
            item = value.get(name)
            if item is not None and (not isinstance(item, Sequence)
                                     or isinstance(item, (str, bytes))):
                raise TypeError(f"{option}[{name!r}] must be a sequence or None")
            out[name] = list(item or ())
        return out
    if value is not None and (not isinstance(value, Sequence) or isinstance(value, (str, bytes))):
        raise TypeError(f"{option} must be a sequence, or a mapping of method name to sequence")
    return {name: list(value or ()) for name in names}


def _per_method_passes(passes: Any, names: tuple[str, ...]) -> Any:
    if not isinstance(passes, Mapping):
        return passes
    unknown = sorted(set(passes) - set(names))
    if unknown:
        raise ValueError(f"transform_passes names methods that do not exist: {unknown} "
                         f"(methods: {list(names)})")
    # ExecuTorch dispatches per-method passes on a real dict holding every method.
    return {name: list(passes.get(name, ())) for name in names} if passes else None


def _declared_method(partitioner: Any) -> str | None:
    spec = getattr(partitioner, "delegation_spec", None)
    for cs in getattr(spec, "compile_specs", None) or ():
        if getattr(cs, "key", None) == "method_name":
            value = cs.value
            return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)
    return None


def _refuse_misnamed_partitioners(per_method: dict[str, list[Any]]) -> None:
    for name, parts in per_method.items():
        for part in parts:
            declared = _declared_method(part)
            if declared is not None and declared != name:
                raise ValueError(
                    f"partitioners[{name!r}] holds a {type(part).__name__} whose compile specs "
                    f"name method {declared!r}: its delegates would look up the wrong method "
                    f"at run time. Give {name!r} its own instance, built for {name!r}")


#: The range of a program's int values (ExecuTorch's ``Int`` is a 64-bit ``long``).
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _check_constant_methods(constant_methods: Mapping[str, Any] | None,
                            names: tuple[str, ...]) -> None:
    if constant_methods is None:
        return
    bad = [k for k in constant_methods if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise ValueError(f"constant_methods keys must be Python identifiers: {bad}")
    clash = sorted(set(constant_methods) & set(names))
    if clash:
        raise ValueError(f"constant_methods {clash} would replace methods of the program")
    import executorch.extension.pytree as ex_pytree
    import torch
    from executorch.exir.error import ExportError, ExportErrorType

    # What ExecuTorch's emitter (_emit_prim_getters) emits; it refuses the rest
    # only in to_executorch(), after every engine is built.
    emittable = (float, bool, int, str, torch.dtype, torch.layout, torch.Tensor)
    for method, value in constant_methods.items():
        try:
            leaves, _ = ex_pytree.tree_flatten(value)
        except Exception as exc:  # a container the emitter's pytree does not know
            raise ExportError(ExportErrorType.NOT_SUPPORTED,
                              f"constant_methods[{method!r}]: {exc}") from exc
        for leaf in leaves:
            if not isinstance(leaf, emittable):
                raise ExportError(
                    ExportErrorType.NOT_SUPPORTED,
                    f"constant_methods[{method!r}] holds a {type(leaf).__name__}, which "
                    "ExecuTorch cannot emit (bool, int, float, str, torch.dtype, "
                    "torch.layout, torch.Tensor, and lists, tuples and dicts of them)")
            if isinstance(leaf, int) and not isinstance(leaf, bool) and \
                    not INT64_MIN <= leaf <= INT64_MAX:
                # The program stores an int as int64: serialization refused it only in
                # to_executorch(), after every engine was built, without naming it.
                raise ExportError(
                    ExportErrorType.NOT_SUPPORTED,
                    f"constant_methods[{method!r}] holds the int {leaf}, outside int64 "
                    f"[{INT64_MIN}, {INT64_MAX}], which is how a program stores an int; "
                    "pass it as a float, a str or a tensor")


def _first_partitioner(backend: str, specs: list[Any], external: str | None,
                       budget: int | None) -> Any:
    if backend == "tensorrt":
        from trtet_store.export import tensorrt

        return tensorrt.TensorRTPartitioner(specs, external_engine_data=external,
                                            weight_streaming_budget_per_engine=budget)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


def _tag_external_weights(program: ExportedProgram, tag: str) -> ExportedProgram:
    """A copy of ``program`` with every parameter and constant marked for ``<tag>.ptd``.

    The copy shares the weight tensors (no weight byte is copied) but not the
    graph: the tags go into the copy's node metadata, never into the
    caller's program, whose next save must not need a ``.ptd``.
    """
    import copy

    import torch
    from executorch.exir.passes.external_constants_pass import is_param_node

    shared = [*program.state_dict.values(), *program.constants.values()]
    memo = {id(t): t for t in shared if isinstance(t, torch.Tensor)}
    tagged = copy.deepcopy(program, memo)
    for node in tagged.graph_module.graph.nodes:
        if node.op == "placeholder" and is_param_node(tagged, node):
            node.meta["custom"] = {**node.meta.get("custom", {}), "delegate_constant_tag": tag}
    return tagged


def _lower(programs: dict[str, ExportedProgram], *, single: bool, passes: Any,
           partitioners: dict[str, list[Any]], constant_methods: Mapping[str, Any] | None,
           compile_config: Any, backend: str, generate_etrecord: bool) -> EdgeProgramManager:
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    if compile_config is None and backend == "tensorrt":
        compile_config = EdgeCompileConfig(_check_ir_validity=False)
    if single:
        ((name, program),) = programs.items()
        return to_edge_transform_and_lower(
            program, transform_passes=passes, partitioner=partitioners[name],
            constant_methods=dict(constant_methods) if constant_methods else None,
            compile_config=compile_config, generate_etrecord=generate_etrecord)
    return to_edge_transform_and_lower(
        programs, transform_passes=passes, partitioner=partitioners,
        constant_methods=dict(constant_methods) if constant_methods else None,
        compile_config=compile_config, generate_etrecord=generate_etrecord)
