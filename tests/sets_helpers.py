"""What the artifact-set tests share (issue 47): seeded files and their blob names.

The counting proxy in front of the test server is the ``proxy`` fixture of
``tests/conftest.py``.
"""

from __future__ import annotations

import random
from pathlib import Path

import xxhash


def write(path: Path, size: int, seed: int) -> Path:
    """``size`` seeded random bytes at ``path`` (its folders made); the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def xxh(path: Path) -> str:
    """The file's blob name: the xxh3-128 hex of its bytes."""
    return xxhash.xxh3_128(path.read_bytes()).hexdigest()
