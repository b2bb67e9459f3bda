"""The TensorRT delegate blob's JSON metadata, checked against what the runtime needs of it.

torch-tensorrt's Python parser (``TensorRTBlobMetadata.from_json``) reads every
field with a default, so a corrupted key (``io_bindings`` -> ``io_bineings``)
still parses: it gives an engine with no bindings, which the runtime cannot
bind to the delegate's arguments. The C++ backend is stricter but small: it
walks ``io_bindings``, then ``aliased_io``, then searches forward from there
for each scalar by its key, so a scalar that is missing, misspelled or placed
before the arrays silently keeps its default (see
``shared/reference/tensorrt-delegate.md``). Every such field is therefore
checked here by name, type and place; a field this module does not know is
only a warning (newer writers may add fields after the arrays).
"""

from __future__ import annotations

import json
from typing import Any

#: The fields every writer (torch-tensorrt's ``serialize_engine`` and ours) emits, in order.
REQUIRED = ("io_bindings", "aliased_io", "hardware_compatible", "device_id",
            "serialized_metadata", "target_platform")
#: Written only for an engine kept as named data; always last.
OPTIONAL_LAST = "engine_key"
_BINDING_FIELDS = {"name": str, "dtype": str, "shape": list, "is_input": bool}
_ALIAS_FIELDS = ("output", "input", "kind")
_ALIAS_KINDS = ("kv_cache_update", "user")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing duplicate keys: the two parsers would pick different ones."""
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"key {k!r} appears twice")
        seen[k] = v
    return seen


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_metadata(raw: bytes, magic: bytes) -> tuple[dict[str, Any] | None, list[str],
                                                      list[str]]:
    """Decode and check one blob's metadata.

    Parameters
    ----------
    raw : bytes
        The metadata bytes (the header's metadata offset and size).
    magic : bytes
        The blob's magic: ``TR02`` exactly when ``aliased_io`` is not empty.

    Returns
    -------
    tuple
        ``(metadata, errors, warnings)``: the decoded object (None when it is
        not a JSON object) and one message per finding.
    """
    errors: list[str] = []
    warnings: list[str] = []
    try:
        meta = json.loads(raw, object_pairs_hook=_pairs)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, [f"TensorRT metadata is not valid JSON: {exc}"], []
    if not isinstance(meta, dict):
        return None, [f"TensorRT metadata is a JSON {type(meta).__name__}, not an object"], []
    keys = list(meta)
    for k in REQUIRED:
        if k not in meta:
            errors.append(f"TensorRT metadata has no {k!r} field (the runtime reads it by "
                          "that name): corrupted or not written by a TensorRT exporter")
    unknown = [k for k in keys if k not in REQUIRED and k != OPTIONAL_LAST]
    if unknown:
        warnings.append(f"TensorRT metadata has fields the runtime does not read: {unknown}")
    known = [k for k in keys if k in REQUIRED or k == OPTIONAL_LAST]
    expected = [k for k in (*REQUIRED, OPTIONAL_LAST) if k in meta]
    if known != expected:
        errors.append(f"TensorRT metadata fields in the order {known}; the C++ parser finds "
                      f"them only in the order {expected} (a scalar before the arrays is "
                      "silently left at its default)")
    bindings = (_check_bindings(meta["io_bindings"], errors, warnings) if "io_bindings" in meta
                else None)
    if "aliased_io" in meta:
        _check_aliases(meta["aliased_io"], bindings, magic, errors)
    for name, ok, what in (("hardware_compatible", lambda v: isinstance(v, bool), "a boolean"),
                           ("device_id", lambda v: _is_int(v) and v >= 0,
                            "a non-negative integer"),
                           ("serialized_metadata", lambda v: isinstance(v, str), "a string"),
                           ("target_platform", lambda v: isinstance(v, str), "a string")):
        if name in meta and not ok(meta[name]):
            errors.append(f"TensorRT metadata {name!r} is {meta[name]!r}, not {what}")
    if OPTIONAL_LAST in meta and not (isinstance(meta[OPTIONAL_LAST], str)
                                      and meta[OPTIONAL_LAST]):
        errors.append(f"TensorRT metadata 'engine_key' is {meta[OPTIONAL_LAST]!r}, not a "
                      "non-empty string")
    return meta, errors, warnings


def _check_bindings(bindings: Any, errors: list[str],
                    warnings: list[str]) -> dict[str, bool] | None:
    """Check ``io_bindings``; return ``{name: is_input}`` when it is a list."""
    if not isinstance(bindings, list):
        errors.append(f"TensorRT metadata 'io_bindings' is {type(bindings).__name__}, not a list")
        return None
    names: dict[str, bool] = {}
    seen_output = False
    for i, b in enumerate(bindings):
        if not isinstance(b, dict):
            errors.append(f"io_bindings[{i}] is {b!r}, not an object")
            continue
        for field, kind in _BINDING_FIELDS.items():
            if field not in b:
                errors.append(f"io_bindings[{i}] has no {field!r}")
            elif not isinstance(b[field], kind) or (kind is str and field == "name"
                                                     and not b[field]):
                errors.append(f"io_bindings[{i}] {field!r} is {b[field]!r}")
        extra = sorted(set(b) - set(_BINDING_FIELDS))
        if extra:  # upstream's parser drops them; a newer writer may add some
            warnings.append(f"io_bindings[{i}] has fields the runtime does not read: {extra}")
        shape = b.get("shape")
        if isinstance(shape, list) and not all(_is_int(d) for d in shape):
            errors.append(f"io_bindings[{i}] shape {shape!r} is not a list of integers")
        name, is_input = b.get("name"), b.get("is_input")
        if not isinstance(name, str) or not isinstance(is_input, bool):
            continue
        if name in names:
            errors.append(f"io_bindings name {name!r} appears twice")
        names[name] = is_input
        if is_input and seen_output:
            errors.append(f"io_bindings[{i}] {name!r} is an input after an output (inputs "
                          "come first, in delegate-argument order)")
        seen_output = seen_output or not is_input
    if not any(v is False for v in names.values()):
        errors.append("TensorRT metadata 'io_bindings' names no output: the engine's results "
                      "cannot be bound")
    return names


def _check_aliases(aliases: Any, bindings: dict[str, bool] | None, magic: bytes,
                   errors: list[str]) -> None:
    if not isinstance(aliases, list):
        errors.append(f"TensorRT metadata 'aliased_io' is {type(aliases).__name__}, not a list")
        return
    for i, a in enumerate(aliases):
        if not isinstance(a, dict) or set(a) - set(_ALIAS_FIELDS) or not all(
                isinstance(a.get(f), str) for f in ("output", "input")):
            errors.append(f"aliased_io[{i}] is {a!r}, not {{output, input, kind}}")
            continue
        if a.get("kind", "kv_cache_update") not in _ALIAS_KINDS:
            errors.append(f"aliased_io[{i}] kind {a['kind']!r} is not one of {_ALIAS_KINDS}")
        if bindings is not None:
            if bindings.get(a["output"]) is not False:
                errors.append(f"aliased_io[{i}] output {a['output']!r} is not an output binding")
            if bindings.get(a["input"]) is not True:
                errors.append(f"aliased_io[{i}] input {a['input']!r} is not an input binding")
    want = b"TR02" if aliases else b"TR01"
    if magic != want:
        errors.append(f"magic {magic.decode(errors='replace')!r} with "
                      f"{len(aliases)} aliased_io entries: must be {want.decode()} (an "
                      "older parser would bind aliased outputs to their own memory)")
