"""A build record is loaded only when its archive is data: no pickle, no code, from anywhere.

A build record (:mod:`.engine_record`) is a ``torch.export`` archive: the
program with its engine placeholders. ``torch.export.load`` runs code for
several things an archive may hold: a weight or constant marked
``use_pickle`` (``torch.load(weights_only=False)``), a custom or opaque object
(``torch._C._pickle_load_obj``, ``pickle.loads``), a legacy ``.pt`` payload,
sample inputs that ``weights_only`` refuses (it falls back to
``weights_only=False``), an AOTInductor library (dlopen), a symbolic shape
(``sympy.sympify``, which is ``eval``), a node target it resolves by
``getattr`` from ``torch`` and later calls, guard code it compiles, and
strings it pastes into the Python source it generates (``\\r`` ends a
comment there; a quote ends a ``getattr`` name). A record comes from this
machine's cache, from a staging store, or from the shared tier, which anyone
who can write the bucket can fill.

The choice (issue 51, "no code from a bucket"): every record, wherever it
comes from, passes :func:`record_problem` before ``torch.export.load`` sees
it, and is then loaded from the very bytes that were checked (never the
path again). The check is an allowlist of what ``torch.export.save`` writes
for the records this package makes, read with torch's own archive reader (so
a zip that two readers would see differently cannot pass one and feed the
other):

- members: the archive's fixed files, ``models/model.json``, the two payload
  configs, ``data/sample_inputs/model.pt``, and raw ``weight_<n>`` /
  ``tensor_<n>`` payloads; anything else (``custom_obj_*``,
  ``opaque_obj_*``, legacy ``model.pt``, ``extra/``, AOTInductor) is refused;
- payload configs: no entry with ``use_pickle``, every one a raw tensor
  with its ``tensor_meta``, named ``weight_<n>`` / ``tensor_<n>``;
- sample inputs: loaded here with ``torch.load(weights_only=True)`` (the
  safe unpickler), so torch's own first try cannot fail into its fallback;
- the program's JSON: node targets only ``torch.ops.<namespace>.<op>[.<overload>]``
  (never ``torch.ops``'s own methods), ``_operator.<name>`` or ``math.<name>``;
  symbolic expressions only of symbols (``s0``, ``Symbol('s0', integer=True)``),
  numbers, operators and sympy's shape functions; no guard code; no custom
  objects; names and module paths only letters, digits, ``_`` and ``.``; no
  control character but tab and newline in any string.

The alternative, a second record format (the graph as our own data, weights
as raw tensors), would invalidate every cache and every shared tier in use;
the allowlist keeps them working: every record this package wrote passes it
unchanged. A record refused is a miss (built here), said in one line
(:class:`UnsafeRecordError`, ``"the build record ... is refused, never
loaded: ..."``), never an exception out of an export and never code run.
``EngineCache(remote=...)`` without ``trusted_keys`` thus takes only records
that pass this check; with trusted keys, only those signed by one of them,
and then this check too. A bucket writer without a trusted key can still put
a program of their choosing (as data) and their engine bytes into your
``.pte``: use trusted keys for a bucket others can write.
"""

from __future__ import annotations

import io
import json
import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.export import ExportedProgram

__all__ = ["MAX_RECORD_BYTES", "UnsafeRecordError", "load_record", "record_problem"]

#: The most bytes a record may have to be read (it is the program with placeholders:
#: KiB; a partial compile's CPU weights add their size).
MAX_RECORD_BYTES = 4 << 30

_MODEL = "model"
_FIXED = frozenset({"archive_format", "archive_version", "byteorder", ".data/version",
                    ".data/serialization_id", f"models/{_MODEL}.json",
                    f"data/weights/{_MODEL}_weights_config.json",
                    f"data/constants/{_MODEL}_constants_config.json",
                    f"data/sample_inputs/{_MODEL}.pt"})
_PAYLOAD = re.compile(r"data/(weights/weight|constants/tensor)_[0-9]{1,9}")
_CONFIGS = (("weights", f"data/weights/{_MODEL}_weights_config.json", "weight_"),
            ("constants", f"data/constants/{_MODEL}_constants_config.json", "tensor_"))

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_TARGET = re.compile(rf"torch\.ops\.{_IDENT}\.{_IDENT}(\.{_IDENT})?|_operator\.{_IDENT}"
                     rf"|math\.{_IDENT}")
_DOTTED = re.compile(r"[A-Za-z0-9_.]*")
_NAME_KEYS = frozenset({"name", "parameter_name", "buffer_name", "tensor_constant_name",
                        "custom_obj_name", "user_input_name", "fqn"})
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_TOKEN = re.compile(r"\s+|[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|[A-Za-z_][A-Za-z0-9_]*|\*\*|//"
                    r"|[<>=!]=|[-+*/%(),<>&|~=]|'[a-z]{1,3}[0-9]{1,9}'")
#: Names a symbolic expression may use besides symbols (``s0``, ``u3``, ...): sympy's
#: shape functions (those the deserializer gives sympify) and its logic and numbers.
_SYMPY = frozenset({
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
    "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
    "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
    "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "Max", "Min", "Abs", "Eq", "Ne",
    "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "floor", "ceiling", "oo", "True", "False",
    "true", "false", "Integer", "Rational", "Float", "Piecewise", "Pow", "sqrt",
    # srepr's form, as torch writes a symbol: Symbol('s77', positive=True, integer=True)
    "Symbol", "Add", "Mul", "positive", "negative", "nonnegative", "nonpositive", "integer",
    "real", "finite", "zero", "nonzero", "even", "odd"})
_SYMBOL = re.compile(r"[a-z]{1,3}[0-9]{1,9}")


class UnsafeRecordError(ValueError):
    """A build record that asks for more than data (pickle, custom objects, code): refused.

    Raised before ``torch.export.load`` sees the record; the caller treats it
    as a miss (built here). ``path`` is the record's file; the message is one
    line saying what was asked for.
    """

    def __init__(self, path: os.PathLike | str, problem: str) -> None:
        super().__init__(f"the build record {os.fspath(path)} is refused, never loaded: "
                         f"{problem}")
        self.path = os.fspath(path)
        self.problem = problem


def load_record(path: os.PathLike | str) -> ExportedProgram:
    """The program of the record at ``path``: read once, checked, loaded from those bytes.

    Raises
    ------
    UnsafeRecordError
        The record holds more than data (:func:`record_problem`).
    OSError
        It cannot be read.
    """
    import torch

    with open(path, "rb") as f:
        data = f.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise UnsafeRecordError(path, f"larger than {MAX_RECORD_BYTES} bytes")
    try:
        problem = record_problem(data)
    except Exception as exc:  # a reader's surprise is a refusal, never a load
        problem = f"it could not be checked ({type(exc).__name__}: {exc})"
        problem = _CONTROL.sub(" ", problem.replace("\n", " "))[:300]
    if problem is not None:
        raise UnsafeRecordError(path, problem)
    return torch.export.load(io.BytesIO(data))


def record_problem(data: bytes) -> str | None:
    """Why the record ``data`` may not be given to ``torch.export.load``, or None (data only)."""
    import torch
    from torch.export.pt2_archive._package import PT2ArchiveReader

    try:
        reader = PT2ArchiveReader(io.BytesIO(data))
    except Exception as exc:  # not a zip torch reads: it would not load either
        return f"not a torch.export archive ({type(exc).__name__})"
    with reader:
        names = reader.get_file_names()
        if len(set(names)) != len(names):
            return "an archive naming one member twice"
        extra = sorted(n for n in names if n not in _FIXED and not _PAYLOAD.fullmatch(n))
        if extra:
            return f"it holds {_said(extra[0])}, which a build record never has"
        missing = sorted(_FIXED - set(names) - {"byteorder", ".data/version",
                                                ".data/serialization_id"})
        if missing:
            return f"it lacks {missing[0]}"
        if reader.read_string("archive_format") != "pt2":
            return "its archive_format is not pt2"
        for what, config, prefix in _CONFIGS:
            problem = _payload_problem(what, _json(reader.read_bytes(config)), prefix, names)
            if problem is not None:
                return problem
        try:
            torch.load(io.BytesIO(reader.read_bytes(f"data/sample_inputs/{_MODEL}.pt")),
                       weights_only=True)
        except Exception as exc:
            return (f"its sample inputs are not plain tensors (weights_only refuses them: "
                    f"{type(exc).__name__})")
        return _program_problem(_json(reader.read_bytes(f"models/{_MODEL}.json")))


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _said(name: str) -> str:
    return repr(_CONTROL.sub("?", name[:80]))


def _payload_problem(what: str, config: Any, prefix: str, names: list[str]) -> str | None:
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        return f"its {what} config is not a JSON object of entries"
    for fqn, meta in entries.items():
        if not isinstance(meta, dict):
            return f"its {what} entry {_said(fqn)} is not an object"
        if meta.get("use_pickle") is not False:
            return f"its {what} entry {_said(fqn)} asks to be unpickled (use_pickle)"
        path = meta.get("path_name")
        if not (isinstance(path, str) and path.startswith(prefix)
                and _PAYLOAD.fullmatch(f"data/{what}/{path}")
                and f"data/{what}/{path}" in names):
            return f"its {what} entry {_said(fqn)} is not a raw tensor of the archive"
        if not isinstance(meta.get("tensor_meta"), dict):
            return f"its {what} entry {_said(fqn)} has no tensor_meta"
    return None


def _program_problem(program: Any) -> str | None:
    if not isinstance(program, dict):
        return "its program is not a JSON object"
    if program.get("guards_code"):
        return "its program carries guard code"
    stack: list[tuple[Any, Any]] = [(None, program)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str) or _CONTROL.search(k):
                    return f"its program has the key {_said(str(k))}"
                if k in ("as_custom_obj", "as_custom_objs") or (
                        k == "custom_obj_values" and v):
                    return "its program holds a custom object"
                stack.append((k, v))
        elif isinstance(value, list):
            stack.extend((key, v) for v in value)
        elif isinstance(value, str):
            problem = _string_problem(key, value)
            if problem is not None:
                return problem
    return None


def _string_problem(key: Any, value: str) -> str | None:
    if _CONTROL.search(value):
        return f"its program's {key} {_said(value)} holds a control character"
    if key == "target":
        if not _TARGET.fullmatch(value) or "__" in value or _torch_ops_method(value):
            return f"its program calls {_said(value)}, not an operator"
    elif key in _NAME_KEYS:
        if not _DOTTED.fullmatch(value):
            return f"its program's {key} {_said(value)} is not a plain name"
    elif key == "expr_str":
        pos = 0
        while pos < len(value):
            m = _TOKEN.match(value, pos)
            if m is None:
                return f"its program's expression {_said(value)} is not arithmetic"
            word = m.group()
            if (word[0].isalpha() or word[0] == "_") and word not in _SYMPY \
                    and not _SYMBOL.fullmatch(word):
                return f"its program's expression {_said(value)} names {_said(word)}"
            pos = m.end()
    return None


def _torch_ops_method(target: str) -> bool:
    """Whether ``torch.ops.<x>...`` reaches an attribute of torch.ops or of a namespace
    or packet object (``load_library``, ``import_module``, ...) instead of an operator."""
    import torch

    parts = target.split(".")
    if parts[:2] != ["torch", "ops"]:
        return False
    ns = parts[2]
    if hasattr(type(torch.ops), ns) or ns in ("loaded_libraries", "_dir"):
        return True
    if len(parts) > 3 and parts[3] in ("name", "_dir"):  # a namespace's own attributes
        return True
    levels = [type(torch.ops.aten), type(torch.ops.aten.add)]
    return any(hasattr(cls, name) for cls, name in zip(levels, parts[3:], strict=False))
