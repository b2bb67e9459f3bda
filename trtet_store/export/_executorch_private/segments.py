"""Staged engines inside delegate segments: the serializer's extraction, wrapped."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trtet_store.export._executorch_private.core import (
    EngineView,
    _cord_module,
    _fail,
    _program_module,
    cord_pieces,
)

if TYPE_CHECKING:  # pragma: no cover
    from executorch.exir._serialize._cord import Cord

    from trtet_store.io.blobstore import Blob


# --- staged engines inside delegate segments --------------------------------------



def cord_with_view(head: bytes, blob: Blob) -> Cord:
    """A Cord of ``head`` followed by ``blob``'s bytes, as an :class:`EngineView`."""
    cord = _cord_module().Cord(head)
    view = EngineView(blob)
    # Cord.append takes only bytes, Cords and (1.5) FileBackedData.
    cord._buffers.append(view)
    cord._byte_size += len(view)
    return cord


#: Turns one delegate segment's bytes into (bytes before the engine, staged engine blob),
#: or None for a segment it does not know.
SegmentExpander = Callable[[bytes], "tuple[bytes, Blob] | None"]


def expand_delegate_segments(expander: SegmentExpander) -> None:
    """Have ExecuTorch's serializer expand delegate segments that ``expander`` recognises.

    ``_extract_delegate_segments`` is wrapped (once per process): after it has
    moved every delegate's processed bytes into a segment, deduplicated, each
    new segment that is one ``bytes`` piece is offered to every expander, and a
    hit becomes ``head + EngineView(blob)``. The segment table and the extended
    header are computed afterwards from the segment's length, so offsets and
    sizes in the ``.pte`` describe the expanded segment. Idempotent.
    """
    mod = _program_module()
    extract = mod._extract_delegate_segments
    expanders: list[SegmentExpander] | None = getattr(extract, "_trtet_expanders", None)
    if expanders is None:
        original = extract
        expanders = []

        def extract(program: Any, segments: list[Any]) -> None:
            start = len(segments)
            original(program, segments)
            for segment in segments[start:]:
                data = getattr(segment, "data", None)
                if data is None:
                    raise _fail("AlignedData.data", "missing")
                pieces = cord_pieces(data)
                if len(pieces) != 1 or not isinstance(pieces[0], bytes):
                    continue
                for expand in expanders:
                    hit = expand(pieces[0])
                    if hit is not None:
                        segment.data = cord_with_view(*hit)
                        break

        extract._trtet_expanders = expanders  # type: ignore[attr-defined]
        extract.__wrapped__ = original  # type: ignore[attr-defined]
        mod._extract_delegate_segments = extract
    if expander not in expanders:
        expanders.append(expander)


def engine_views(cords: list[Cord]) -> list[EngineView]:
    """Every :class:`EngineView` in ``cords``."""
    return [p for c in cords for p in cord_pieces(c) if isinstance(p, EngineView)]
