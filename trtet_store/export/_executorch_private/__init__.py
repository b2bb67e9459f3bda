"""The one place that touches ExecuTorch internals (written against executorch 1.4.1 and 1.5.1).

Everything trtet_store needs from ExecuTorch that is not public API goes through
this module, so that a future ExecuTorch that renames something breaks here,
loudly, and :func:`check_private_api` says which attribute moved.

Private attributes used (executorch 1.4.1 and 1.5.1 unless said)
-----------------------------------------------------------------
``ExecutorchProgramManager._pte_data`` : ``Cord``
    The serialized ``.pte``, built eagerly in ``__init__`` by
    ``serialize_for_executorch``; ``save``/``write_to_file`` write exactly it.
``ExecutorchProgramManager._tensor_data`` : ``dict[str, Cord]``
    One serialized ``.ptd`` per external tag; ``write_tensor_data_to_file``
    writes each to ``outdir/<tag>[.ptd]``.
``Cord._buffers`` : ``list[bytes | FileBackedData]``
    The pieces of a Cord in file order (``Cord.append`` flattens nested Cords).
    ``Cord._byte_size`` is their total length (``len(cord)``).
``executorch.exir._serialize._program._extract_delegate_segments(program, segments)``
    Moves each delegate's ``processed_bytes`` into an ``AlignedData`` segment
    (``.data`` a Cord), identical blobs once. Wrapped by
    :func:`expand_delegate_segments` so that a TensorRT delegate's segment is
    its blob header followed by the staged engine file (an :class:`EngineView`).
``FileBackedData`` (1.5.1 only; 1.4.1 has no file-backed Cord pieces)
    ``_path`` (the file), ``_size`` (read through ``len``), ``_sha256``,
    ``_finalizer`` (a ``weakref.finalize`` when it owns its file: ``cleanup=True``
    or ``move_from``) and the staticmethod ``_remove`` it calls.
``executorch.exir._serialize._named_data_store.NamedDataStore``
    The store a backend's ``preprocess`` returns as ``data_store_output``
    (:func:`named_data_store`).
``executorch.exir._serialize._flatbuffer_program._flatbuffer_to_program(bytes)``
    A ``.pte``'s Program flatbuffer as ExecuTorch's dataclasses (:func:`program_from_flatbuffer`).
``executorch.extension.flat_tensor.serialize.serialize._deserialize_to_flat_tensor(bytes)``
    A ``.ptd``'s FlatTensor flatbuffer, the same way (:func:`flat_tensor_from_flatbuffer`).
``weakref.finalize._registry`` (CPython stdlib)
    Enumerated to find *every* live finalizer that would remove a path, including
    the one of an original ``FileBackedData`` when we only hold a deep copy (a
    deep-copied ``weakref.finalize`` is a dead no-op; the original stays armed).

One attribute of ours is set on ``FileBackedData`` objects: ``_trtet_blob``, a
:class:`_BlobRef` holding the :class:`~trtet_store.io.blobstore.Blob` that owns
the file. It keeps the blob alive as long as ExecuTorch holds the payload and
lets the adapter recognise its own files without a store lookup.

Modules: ``core`` (versions, errors, programs and Cords, the deserializers,
:class:`EngineView`), ``file_backed`` (``FileBackedData``), ``segments`` (the
wrapped delegate-segment extraction), ``check`` (:func:`check_private_api`).
"""

from typing import TYPE_CHECKING

from trtet_store.export._executorch_private.check import check_private_api
from trtet_store.export._executorch_private.core import (
    TESTED_EXECUTORCH,
    EngineView,
    ExecutorchPrivateAPIError,
    FileBackedDataUnavailableError,
    cord_pieces,
    executorch_version,
    flat_tensor_from_flatbuffer,
    has_file_backed_data,
    named_data_store,
    program_from_flatbuffer,
    ptd_cords,
    pte_cord,
)
from trtet_store.export._executorch_private.file_backed import (
    _file_backed_class,
    _finalizers_removing,
    attached_blob,
    disarm_finalizers,
    file_backed_owns_file,
    file_backed_path,
    is_file_backed,
    new_file_backed_data,
    return_from_blob,
    set_known_sha256,
    transfer_to_blob,
)
from trtet_store.export._executorch_private.segments import (
    SegmentExpander,
    cord_with_view,
    engine_views,
    expand_delegate_segments,
)

if TYPE_CHECKING:  # pragma: no cover - for annotations elsewhere in export/
    from executorch.exir._serialize._cord import Cord as Cord
    from executorch.exir._serialize._cord import FileBackedData as FileBackedData

__all__ = [
    "TESTED_EXECUTORCH",
    "EngineView",
    "ExecutorchPrivateAPIError",
    "FileBackedDataUnavailableError",
    "SegmentExpander",
    "_file_backed_class",
    "_finalizers_removing",
    "attached_blob",
    "check_private_api",
    "cord_pieces",
    "cord_with_view",
    "disarm_finalizers",
    "engine_views",
    "executorch_version",
    "expand_delegate_segments",
    "file_backed_owns_file",
    "file_backed_path",
    "flat_tensor_from_flatbuffer",
    "has_file_backed_data",
    "is_file_backed",
    "named_data_store",
    "new_file_backed_data",
    "program_from_flatbuffer",
    "ptd_cords",
    "pte_cord",
    "return_from_blob",
    "set_known_sha256",
    "transfer_to_blob",
]
