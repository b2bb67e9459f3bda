"""export/_executorch_private/core.py: ``_import_without_torch`` and the pure-Python
``flat_tensor_from_flatbuffer``, in a fresh interpreter where torch is not imported.

The Program deserializer's module is imported with the heavy packages as empty stand-ins,
which are taken out of ``sys.modules`` again; a ``.ptd`` header is read by
``read_flat_tensor`` with ExecuTorch's ScalarType enum; torch is never imported.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys
import flatbuffers
from trtet_store.export._executorch_private import core

m = core._import_without_torch("executorch.exir._serialize._flatbuffer_program")
assert hasattr(m, "_flatbuffer_to_program"), m
left = [p for p in core._HEAVY_PACKAGES if p in sys.modules]
assert left == [], left

b = flatbuffers.Builder(0)
key = b.CreateString("w")
b.StartVector(4, 1, 4)
b.PrependInt32(5)
sizes = b.EndVector()
b.StartObject(3)
b.PrependInt8Slot(0, 6, 0)
b.PrependUOffsetTRelativeSlot(1, sizes, 0)
layout = b.EndObject()
b.StartObject(3)
b.PrependUOffsetTRelativeSlot(0, key, 0)
b.PrependUOffsetTRelativeSlot(2, layout, 0)
nd = b.EndObject()
b.StartVector(4, 1, 4)
b.PrependUOffsetTRelative(nd)
nds = b.EndVector()
b.StartObject(3)
b.PrependUint32Slot(0, 1, 0)
b.PrependUOffsetTRelativeSlot(2, nds, 0)
b.Finish(b.EndObject())
ft = core.flat_tensor_from_flatbuffer(bytes(b.Output()))
t = ft.named_data[0].tensor_layout
assert type(t.scalar_type).__name__ == "ScalarType" and int(t.scalar_type) == 6, t
assert (ft.version, ft.named_data[0].key, t.sizes) == (1, "w", [5])
assert [p for p in core._HEAVY_PACKAGES if p in sys.modules] == []
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""


def test_the_program_reader_and_a_ptd_header_come_without_torch() -> None:
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                       timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
