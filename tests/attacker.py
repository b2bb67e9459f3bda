"""The other user of the security tests, and what "nothing changed" is checked against.

The attacker is a real other uid: :func:`as_nobody` runs a function in a
forked child that drops to uid/gid 65534 (no supplementary groups) first, as
an unprivileged account that can write a shared directory would act. The
victim's side is compared before and after by :func:`tree` (every entry under
a directory, links not followed) or :func:`listing` (one directory's entries).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from crash_dying import in_child
from digests import file_digest

#: The attacker's uid and gid (``nobody``).
NOBODY = 65534


def as_nobody(fn: Callable[[], object]) -> None:
    """Run ``fn`` in a child process as uid/gid 65534; fail unless it returns normally."""
    def child() -> None:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
        fn()

    assert in_child(child) == 0


@contextlib.contextmanager
def reachable_dir(prefix: str, mode: int = 0o755) -> Iterator[Path]:
    """A fresh directory under /tmp that uid 65534 can reach (tmp_path's parents are 0700),
    of ``mode`` (0o1777: a shared one), removed with all in it afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(path, mode)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def shared_dir(parent: Path, name: str = "shared") -> Path:
    """A mode 1777 directory under ``parent``, like /tmp: anyone creates, only owners remove."""
    shared = parent / name
    shared.mkdir()
    os.chmod(shared, 0o1777)
    return shared


def _entry(p: Path) -> str:
    return ("-> " + os.readlink(p) if p.is_symlink() else "dir" if p.is_dir()
            else file_digest(p))


def tree(directory: Path) -> dict[str, str]:
    """Every entry under ``directory`` (links not followed): a digest, a link's target, or 'dir'."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            p = Path(root, name)
            out[os.fspath(p.relative_to(directory))] = _entry(p)
    return out


def listing(directory: Path) -> dict[str, str]:
    """The entries of ``directory`` itself (hidden ones too), each as :func:`tree` gives it."""
    return {p.name: _entry(p) for p in sorted(directory.iterdir())}
