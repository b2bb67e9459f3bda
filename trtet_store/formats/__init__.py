"""Other exporters' formats on the blob store: safetensors, ONNX with external data.

Each adapter is a header and a piece list handed to :func:`trtet_store.io.write_files`
(see docs/embedding.md). They use only :mod:`trtet_store.io`'s public face and
never import :mod:`trtet_store.export`; torch, numpy and onnx load inside the
functions that need them, so importing this package is cheap.
"""

from trtet_store.formats.tensors import StagedTensor

__all__ = ["StagedTensor"]
