"""The remote tree after issue 35: each name defined once, each module with its own logger."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

REMOTE = Path(__file__).resolve().parent.parent / "trtet_store" / "remote"


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out.add(node.module or "")
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_index_and_unfinished_stand_alone_with_their_own_logger() -> None:
    # send.py imports them; they never import send.py (for its log or anything else).
    for name in ("index", "unfinished"):
        path = REMOTE / "upload" / f"{name}.py"
        assert not any("upload.send" in m for m in _imports(path)), name
        module = importlib.import_module(f"trtet_store.remote.upload.{name}")
        assert module.log.name == f"trtet_store.remote.upload.{name}"


def test_the_face_takes_the_moved_names_from_their_new_modules() -> None:
    import trtet_store.remote as remote
    from trtet_store.remote import report
    from trtet_store.remote.upload import unfinished

    for name in ("abort", "list_uploads", "pending", "interrupted"):
        assert getattr(remote, name) is getattr(unfinished, name), name
    assert remote.FetchReport is report.FetchReport
    # Moved, not copied: the old modules no longer define them.
    receive = (REMOTE / "download" / "receive.py").read_text()
    send = (REMOTE / "upload" / "send.py").read_text()
    for cls in ("FetchProgress", "FetchedObject", "FetchReport"):
        assert f"class {cls}" not in receive, cls
    assert "class PublishProgress" not in send
    for fn in ("def list_uploads", "def pending", "def interrupted", "def abort",
               "class Interrupted", "INDEX_PREFIX =", "def _index_lookup", "def _update_index"):
        assert fn not in send, fn


def test_remote_defines_no_unit_or_staging_name_of_its_own() -> None:
    # MiB and the staging directory come from io (io.units, io.names) through its face.
    found = []
    for path in sorted(REMOTE.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"(KiB|MiB|GiB|STAGING_DIR)\s*=", line):
                found.append(f"{path.relative_to(REMOTE)}:{n}: {line}")
    assert found == []
