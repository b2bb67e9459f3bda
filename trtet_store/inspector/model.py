"""The findings: :class:`Problem`, :class:`Inspection` (one file), :class:`VerifyResult`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def show_bytes(b: bytes) -> str:
    try:
        text = b.decode("ascii")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return text
    return "0x" + b.hex()


def jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (bytes, bytearray)):
        return show_bytes(bytes(obj))
    if isinstance(obj, Path):
        return os.fspath(obj)
    return obj


@dataclass
class Problem:
    """One finding of a check.

    Attributes:
        severity: ``error`` (the runtime would refuse the file or read out of
            bounds) or ``warning`` (unusual, still loads).
        message: What is wrong, with the numbers.
    """

    severity: str
    message: str

    def to_json(self) -> dict[str, str]:
        """A JSON-ready dict."""
        return {"severity": self.severity, "message": self.message}


@dataclass
class Inspection:
    """The layout of one file.

    Attributes:
        path: The file.
        kind: ``pte``, ``ptd`` or ``unknown``.
        file_size: Its length in bytes.
        header: Header fields by name (identifier, root offset, sizes, offsets).
        segments: One dict per segment: ``index``, ``offset`` (relative to the
            segment base), ``size``, ``absolute_offset``, ``end``,
            ``page_aligned``, ``used_by``.
        named_data: One dict per key: ``key``, ``segment_index``,
            ``absolute_offset``, ``size`` (and ``tensor_layout`` in a ``.ptd``).
        delegates: One dict per delegate (``.pte``): ``plan``, ``index``,
            ``id``, ``location``, ``data_index``, ``size``, ``absolute_offset``,
            ``compile_specs``, and ``tensorrt`` (header and metadata) for a
            TensorRT blob.
        plans: One dict per execution plan (``.pte``): name, inputs, outputs,
            operators, instruction and value counts.
        program: Other program-level fields (``version``, constant and mutable segments).
        external_tensors: Fully qualified names of tensors the ``.pte`` expects
            in a ``.ptd`` (emitter external constants).
        problems: What the structural checks found.
    """

    path: Path
    kind: str
    file_size: int
    header: dict[str, Any] = field(default_factory=dict)
    segments: list[dict[str, Any]] = field(default_factory=list)
    named_data: list[dict[str, Any]] = field(default_factory=list)
    delegates: list[dict[str, Any]] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    program: dict[str, Any] = field(default_factory=dict)
    external_tensors: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    #: Per external tensor, the ``scalar_type`` and ``sizes`` the program
    #: expects of it (a ``.ptd``'s ``tensor_layout`` must match).
    external_layouts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def errors(self) -> list[Problem]:
        """The problems of severity ``error``."""
        return [p for p in self.problems if p.severity == "error"]

    def error(self, message: str) -> None:
        """Record an error."""
        self.problems.append(Problem("error", message))

    def warn(self, message: str) -> None:
        """Record a warning."""
        self.problems.append(Problem("warning", message))

    @property
    def keys(self) -> set[str]:
        """The named-data keys of this file."""
        return {d["key"] for d in self.named_data}

    def wanted_keys(self) -> list[tuple[str, str]]:
        """``(what, key)`` of every datum this ``.pte`` reads by name: engine keys, then tensors."""
        wanted = []
        for d in self.delegates:
            key = (d.get("tensorrt", {}).get("metadata") or {}).get("engine_key")
            if key:
                wanted.append((f"delegate {d['index']} ({d['id']}) engine_key", key))
        return wanted + [("external tensor", name) for name in self.external_tensors]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (bytes shown as text or hex)."""
        return jsonable(
            {
                "path": os.fspath(self.path),
                "kind": self.kind,
                "file_size": self.file_size,
                "header": self.header,
                "program": self.program,
                "plans": self.plans,
                "segments": self.segments,
                "named_data": self.named_data,
                "delegates": self.delegates,
                "external_tensors": self.external_tensors,
                "problems": [p.to_json() for p in self.problems],
            }
        )




@dataclass
class VerifyResult:
    """The outcome of :func:`verify`.

    Attributes:
        files: The inspection of every file checked (the main file first).
        problems: Cross-file and runtime problems (each file's own are in its inspection).
        runtime: What the runtime load did (``--run``): ``loaded``, ``methods``
            (name -> ``loaded``, ``skipped: ...`` or the error), or None.
        engines: Every TensorRT engine whose bytes were read, one dict each:
            ``delegate``, ``file``, ``layout``, ``key`` (named), ``offset``,
            ``size``, ``xxh3_128`` (and ``sha256`` where its key is one),
            ``expected`` (True/False against ``engine_digests``, None when not
            given). No digest of an inline engine is stored in the file, so
            this list is what a user compares with the digests of the build.
        external_data: What a ``.pte`` needs from ``.ptd`` files, or None
            when it needs nothing: ``needed`` (one dict per key: ``what``,
            ``key``, ``found_in``, and ``sha256`` for an XNNPACK weight, whose
            key it must equal), ``files`` (one dict per ``.ptd`` looked
            at: ``path``, ``how`` (``given`` or ``next to it``),
            ``holds`` (how many needed keys), ``matches``), ``complete``.
    """

    files: list[Inspection]
    problems: list[Problem] = field(default_factory=list)
    runtime: dict[str, Any] | None = None
    engines: list[dict[str, Any]] = field(default_factory=list)
    external_data: dict[str, Any] | None = None

    @property
    def all_problems(self) -> list[Problem]:
        """Every problem, each file's and the cross-file ones."""
        return [p for ins in self.files for p in ins.problems] + self.problems

    @property
    def ok(self) -> bool:
        """True when no check found an error."""
        return not any(p.severity == "error" for p in self.all_problems)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "ok": self.ok,
            "files": [
                {
                    "path": os.fspath(i.path),
                    "kind": i.kind,
                    "problems": [p.to_json() for p in i.problems],
                }
                for i in self.files
            ],
            "problems": [p.to_json() for p in self.problems],
            "runtime": self.runtime,
            "engines": jsonable(self.engines),
            "external_data": jsonable(self.external_data),
        }
