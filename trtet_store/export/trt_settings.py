"""Which keyword arguments the TensorRT compiler knows, and refusing the others by name.

``compile_and_save`` and ``export`` pass their ``**compile_settings`` to
``torch_tensorrt.dynamo.compile``, which takes the fields of its
``CompilationSettings`` dataclass and a few keywords of its own. A misspelt
setting must not fall through silently (``compile()`` swallows unknown
keywords in its ``**kwargs``), so it is refused before anything is built, with
a :class:`TypeError` naming the closest known keyword.

Where torch_tensorrt is installed the lists are read from it
(``dataclasses.fields(CompilationSettings)`` and ``compile``'s keyword-only
parameters); elsewhere (CPU machines, where TensorRT cannot be installed) from
the lists below, restated from Torch-TensorRT's sources:
``py/torch_tensorrt/dynamo/_settings.py`` (class ``CompilationSettings``) and
``py/torch_tensorrt/dynamo/_compiler.py`` (def ``compile``) of
github.com/pytorch/TensorRT at commit d7f2062810 (2026-08-22, version.txt
2.14.0a0). ``tests/test_export_keywords.py`` checks them against
the installed dataclass wherever torch_tensorrt imports.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: ``CompilationSettings`` fields (Torch-TensorRT 2.14.0a0, d7f2062810).
COMPILATION_SETTINGS_FIELDS = (
    "workspace_size", "min_block_size", "torch_executed_ops", "pass_through_build_failures",
    "max_aux_streams", "version_compatible", "optimization_level", "truncate_double",
    "use_complex_decomposition", "use_fast_partitioner", "enable_experimental_decompositions",
    "device", "require_full_compilation", "disable_tf32", "assume_dynamic_shape_support",
    "sparse_weights", "engine_capability", "num_avg_timing_iters", "dla_sram_size",
    "dla_local_dram_size", "dla_global_dram_size", "dryrun", "hardware_compatible",
    "timing_cache_path", "lazy_engine_init", "cache_built_engines", "reuse_cached_engines",
    "use_fp32_acc", "refit_identical_engine_weights", "strip_engine_weights",
    "immutable_weights", "enable_weight_streaming", "enable_cross_compile_for_windows",
    "tiling_optimization_level", "l2_limit_for_tiling", "use_distributed_mode_trace",
    "offload_module_to_cpu", "enable_autocast", "autocast_low_precision_type",
    "autocast_excluded_nodes", "autocast_excluded_ops", "autocast_max_output_threshold",
    "autocast_max_depth_of_reduction", "autocast_calibration_dataloader",
    "enable_resource_partitioning", "cpu_memory_budget", "dynamically_allocate_resources",
    "decompose_attention", "disabled_constant_fold_exclusions", "attn_bias_is_causal",
    "fallback_data_dependent_ops",
)

#: Keyword-only parameters of ``torch_tensorrt.dynamo.compile`` that are not
#: settings fields (it turns them into settings itself), less the inputs we pass.
COMPILE_ONLY_KEYWORDS = (
    "use_python_runtime", "torch_executed_modules", "engine_cache_dir", "engine_cache_size",
    "custom_engine_cache",
)

#: What ``compile`` passes itself and so must not come from the caller.
_OURS = frozenset({"arg_inputs", "kwarg_inputs", "inputs"})


def known_settings() -> frozenset[str]:
    """Every keyword the TensorRT compiler takes as a setting (see the module docstring)."""
    try:
        import dataclasses
        import inspect

        from torch_tensorrt.dynamo import compile as trt_compile
        from torch_tensorrt.dynamo._settings import CompilationSettings
    except ImportError:
        return frozenset(COMPILATION_SETTINGS_FIELDS) | frozenset(COMPILE_ONLY_KEYWORDS)
    fields = {f.name for f in dataclasses.fields(CompilationSettings)}
    keywords = {p.name for p in inspect.signature(trt_compile).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return frozenset(fields | keywords) - _OURS


def refuse_unknown(function: str, given: Iterable[str], known: Iterable[str],
                   why: str = "") -> None:
    """Raise ``TypeError`` for the first of ``given`` not in ``known``, naming the closest known."""
    known = sorted(set(known))
    for name in given:
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(f"{function}() got an unexpected keyword argument {name!r}{why}{hint}")


def check_compile_settings(function: str, backend: str, settings: Iterable[str],
                           parameters: Iterable[str]) -> None:
    """Refuse, before anything is built, what neither ``function`` nor the compiler knows.

    ``parameters`` are ``function``'s own keywords (suggested for a misspelt
    one). With ``backend="tensorrt"`` a setting must be one the TensorRT
    compiler knows; with another backend no compile setting means anything.

    Raises
    ------
    TypeError
        Naming the keyword and the closest known one.
    """
    settings = list(settings)
    if not settings:
        return
    parameters = set(parameters) - {"compile_settings"}
    if backend != "tensorrt":
        strays = [s for s in settings if s not in known_settings()]
        refuse_unknown(function, strays, parameters)
        raise TypeError(f"{function}() got compile settings {sorted(settings)} with "
                        f"backend={backend!r}: they are for the TensorRT compiler "
                        "(backend='tensorrt') and would be ignored")
    refuse_unknown(function, settings, known_settings() | parameters,
                   why=" (neither its own nor a TensorRT compile setting)")
