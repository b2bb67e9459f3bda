"""Read the layout of ``.pte`` and ``.ptd`` files, and check it, without reading payloads.

:func:`inspect_file` parses the fixed headers itself (the ``.pte`` extended
header ``eh00``, the ``.ptd`` header ``FH01``) and hands the flatbuffer region,
and only that, to ExecuTorch's own deserializers (``exir/_serialize``: the
Program flatbuffer through the generated Python classes, the FlatTensor
through ``flatc``). Delegate blobs are read only as far as their headers: a
TensorRT delegate blob (``TR01``/``TR02``, see
``shared/reference/tensorrt-delegate.md``) is decoded into its header and
metadata, and the engine's layout (inline or named), file offset and alignment
reported. Payload bytes are never read, so inspecting a file of tens of
gigabytes costs a few reads.

:func:`verify` adds the structural checks the runtime makes (magic, versions,
offsets in bounds, segments within the file, indices in range), the checks of
torch-tensorrt's own blob parser and of the blob's metadata against what the
runtime reads of it (``trt_metadata``), each engine's digest (all of them
listed in the result), what a ``.pte`` needs from ``.ptd`` files (engine keys,
external tensors, XNNPACK's weight keys) and which ``.ptd`` holds it (``--data``
or those next to it, their layouts and XNNPACK weight digests checked), and
optionally loads the program with the ExecuTorch runtime and runs each method.

Every finding is a :class:`Problem` with a severity; an ``error`` means the
runtime would refuse the file (or read garbage), a ``warning`` means
something unusual that still loads.

Modules: ``model`` (the findings), ``common`` (constants, byte helpers),
``read`` (:func:`inspect_file`), ``pte`` and ``ptd`` (one reader per format),
``trt_metadata`` (the TensorRT metadata check), ``verify``, ``runtime_probe``
(the child process of ``--run``), ``text``.
"""

from trtet_store.inspector.model import Inspection, Problem, VerifyResult
from trtet_store.inspector.read import inspect_file
from trtet_store.inspector.text import format_inspection, format_verify
from trtet_store.inspector.verify import verify

__all__ = [
    "Inspection",
    "Problem",
    "VerifyResult",
    "format_inspection",
    "format_verify",
    "inspect_file",
    "verify",
]
