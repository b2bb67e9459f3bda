"""The manifest format (trtet_store/remote/manifest.py): round trip and every refusal."""

from __future__ import annotations

import json

import pytest

from trtet_store.remote.errors import ManifestError
from trtet_store.remote.manifest import (
    Manifest,
    ObjectEntry,
    PartEntry,
    PieceEntry,
    crc64nvme_b64,
    crc64nvme_int,
    manifest_key,
)

MiB = 1 << 20


def _manifest() -> Manifest:
    size = 100 + 12 * MiB
    pieces = (PieceEntry(0, 100, "inline", "0" * 32, (7,)),
              PieceEntry(100, 12 * MiB, "file", "a" * 32, tuple(range(12))))
    parts = (PartEntry(1, 0, 8 * MiB, "etag1", crc64nvme_b64(1), "1" * 32),
             PartEntry(2, 8 * MiB, size - 8 * MiB, "etag2", crc64nvme_b64(2), "2" * 32))
    pte = ObjectEntry("m.pte", "models/m.pte", size, "e-2", crc64nvme_b64(3), 8 * MiB, parts,
                      pieces)
    ptd = ObjectEntry("m.ptd", "models/m.ptd", 0, "e", crc64nvme_b64(0), 8 * MiB,
                      (PartEntry(1, 0, 0, "x", crc64nvme_b64(0), "3" * 32),), ())
    return Manifest("m.pte", MiB, (pte, ptd))


def test_round_trip_is_canonical():
    m = _manifest()
    data = m.to_json()
    again = Manifest.from_json(data)
    assert again == m and again.to_json() == data
    assert again.object("m.ptd").key == "models/m.ptd"
    assert again.object("m.pte").piece_at(100 + 5 * MiB).kind == "file"
    assert manifest_key("models/m.pte") == "models/m.pte.trtet.json"
    assert crc64nvme_int(crc64nvme_b64(2**64 - 1)) == 2**64 - 1


def _mutate(path, value):
    def change(doc):
        target = doc
        for step in path[:-1]:
            target = target[step]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return change


_DELETE = object()

BAD = {
    "version": _mutate(["version"], 2),
    "format": _mutate(["format"], "other"),
    "missing objects": _mutate(["objects"], _DELETE),
    "program not first": _mutate(["program"], "m.ptd"),
    "name is a path": _mutate(["objects", 1, "name"], "../m.ptd"),
    "key without name": _mutate(["objects", 1, "key"], "models/other"),
    "duplicate names": _mutate(["objects", 1, "name"], "m.pte"),
    "piece gap": _mutate(["objects", 0, "pieces", 1, "offset"], 101),
    "pieces short": _mutate(["objects", 0, "size"], 100 + 12 * MiB + 1),
    "piece kind": _mutate(["objects", 0, "pieces", 0, "kind"], "blob"),
    "piece digest": _mutate(["objects", 0, "pieces", 0, "xxh3"], "xyz"),
    "chunk count": _mutate(["objects", 0, "pieces", 1, "chunks"], [1, 2]),
    "chunk type": _mutate(["objects", 0, "pieces", 0, "chunks"], [-1]),
    "part unequal": _mutate(["objects", 0, "parts", 0, "size"], 7 * MiB),
    "part number": _mutate(["objects", 0, "parts", 1, "number"], 3),
    "part size small": _mutate(["objects", 0, "part_size"], 4 * MiB),
    "part crc": _mutate(["objects", 0, "parts", 0, "crc64nvme"], "AAAA"),
    "object crc": _mutate(["objects", 0, "crc64nvme"], "not base64!"),
    "part md5": _mutate(["objects", 0, "parts", 0, "md5"], "zz"),
    "bool size": _mutate(["objects", 1, "size"], False),
    "empty etag": _mutate(["objects", 0, "etag"], ""),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_refusals(case):
    doc = json.loads(_manifest().to_json())
    BAD[case](doc)
    with pytest.raises(ManifestError):
        Manifest.from_json(json.dumps(doc))


def test_not_json():
    with pytest.raises(ManifestError, match="not JSON"):
        Manifest.from_json(b"{")
    with pytest.raises(ManifestError):
        Manifest.from_json(b"[]")


def test_the_remote_layer_imports_nothing_heavy_and_only_io_s_public_face():
    """boto3 in s3.py alone and lazily; export/ only from upload/program.py, lazily; io's face
    only; the shared floor imports neither half, upload/ and download/ never each other, and
    only the tier (above both) imports them both."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, trtet_store.remote, trtet_store.remote.upload.send, "
            "trtet_store.remote.download.receive, trtet_store.cli.publish, trtet_store.cli.fetch;"
            "heavy = [m for m in ('boto3', 'botocore', 'torch', 'executorch') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
    root = Path(__file__).resolve().parent.parent / "trtet_store" / "remote"
    modules = sorted(root.rglob("*.py"))
    names = {p.relative_to(root).with_suffix("").as_posix() for p in modules}
    assert {"upload/send", "upload/program", "download/receive", "download/staging", "s3",
            "errors", "manifest"} <= names
    for path in modules:
        name = path.relative_to(root).with_suffix("").as_posix()
        half = name.split("/")[0] if "/" in name else None
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
            elif isinstance(node, ast.Import):
                mod = node.names[0].name
            else:
                continue
            if mod.startswith(("boto3", "botocore")):
                assert name == "s3", (name, mod)
            if mod.startswith("trtet_store.export"):
                assert name == "upload/program", (name, mod)
            if mod.startswith("trtet_store.inspector"):
                # the one tooling module the product calls: which .ptd a .pte needs
                assert mod == "trtet_store.inspector.neighbours", (name, mod)
            if mod.startswith("trtet_store.io"):
                assert mod == "trtet_store.io", (name, mod)  # the public face only
            if mod.startswith("trtet_store.cache.tier"):
                assert half == "tier", f"{name} imports {mod}"  # nothing below uses the tier
            if half != "tier" and mod.startswith(("trtet_store.remote.upload",
                                                  "trtet_store.remote.download")):
                # The floor imports no half, and the halves never each other; the
                # shared tier (remote/tier/) sits above both and uses both.
                other = mod.split(".")[2]
                assert half == other, f"{name} imports {mod}"
