"""The public face: a name is a module or a function, never both."""

from __future__ import annotations

import subprocess
import sys


def test_remote_publish_and_fetch_are_the_functions_after_the_lazy_face_loaded() -> None:
    # A fresh interpreter: the lazy faces load on first access, and a submodule of the same
    # name as a function would replace the function in the package once imported.
    code = (
        "import trtet_store\n"
        "trtet_store.publish, trtet_store.fetch\n"
        "from trtet_store import remote\n"
        "import trtet_store.remote.upload.send, trtet_store.remote.download.receive\n"
        "assert callable(remote.publish) and callable(remote.fetch), (remote.publish,)\n"
        "assert remote.publish is trtet_store.publish and remote.fetch is trtet_store.fetch\n"
        "assert callable(trtet_store.publish) and callable(trtet_store.fetch)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_only_the_face_lives_at_the_package_root() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "trtet_store"
    # __main__.py is the face too: `python -m trtet_store` is the CLI.
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py", "__main__.py"]
    assert sorted(p.name for p in (root / "remote").glob("*.py")) == [
        "__init__.py", "checksum.py", "errors.py", "filenames.py", "jsondoc.py", "keyconfig.py",
        "keys.py", "manifest.py", "report.py", "s3.py", "signing.py", "sweep.py", "url.py"]
