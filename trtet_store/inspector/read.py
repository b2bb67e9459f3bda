"""inspect_file(): one file's layout, without reading payloads."""

from __future__ import annotations

import os
from pathlib import Path

from trtet_store.inspector.common import (
    HEAD_BYTES,
    PTD_IDENTIFIER,
    PTE_IDENTIFIER,
    read_at,
    show_bytes,
)
from trtet_store.inspector.model import Inspection
from trtet_store.inspector.ptd import inspect_ptd
from trtet_store.inspector.pte import inspect_pte


def inspect_file(path: os.PathLike | str) -> Inspection:
    """Read the layout of a ``.pte`` or ``.ptd`` and check its structure.

    The kind is told by the file identifier (bytes 4..8: ``ET??`` or
    ``FT??``), not the name. Reads the head, the flatbuffer region and
    delegate blob headers; never a payload.

    Args:
        path: The file.

    Returns:
        The layout, with :attr:`Inspection.problems` filled in. A file that
        cannot be parsed is returned with errors, not raised.

    Raises:
        FileNotFoundError: The file does not exist.
        IsADirectoryError: It is a directory.
    """
    p = Path(path)
    size = os.stat(p).st_size
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a directory")
    with open(p, "rb") as f:
        head = read_at(f, 0, HEAD_BYTES)
        ins = Inspection(p, "unknown", size)
        if len(head) < 8:
            ins.error(f"file has {size} bytes: too short for a flatbuffer (8 bytes at least)")
            return ins
        ident = head[4:8]
        if ident[:2] == b"ET":
            ins.kind = "pte"
            inspect_pte(f, head, ins)
        elif ident[:2] == b"FT":
            ins.kind = "ptd"
            inspect_ptd(f, head, ins)
        else:
            ins.header["file_identifier"] = ident
            ins.error(
                f"file identifier {show_bytes(ident)!r} at bytes 4..8 is neither a .pte "
                f"({PTE_IDENTIFIER.decode()}) nor a .ptd ({PTD_IDENTIFIER.decode()})"
            )
    return ins
