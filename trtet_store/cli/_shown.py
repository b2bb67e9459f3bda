"""How the CLI shows a name that came from data (a manifest, a directory, a bucket).

A name is printed as it is when every character of it is printable; any
other (a newline, a tab, an escape sequence, a C1 control, a line
separator, an undecodable byte) is shown quoted the way Python's ``repr``
quotes it, so one name is always one piece of one line and cannot rewrite
the terminal. Publish and fetch refuse such names anyway
(:mod:`trtet_store.remote.filenames`); files already on a disk may have them.
"""

from __future__ import annotations

import os

__all__ = ["shown"]


def shown(name: os.PathLike | str) -> str:
    """``name`` as one printable piece of a line: itself, or ``repr``-quoted.

    Parameters
    ----------
    name : str or path-like
        A file name, path or key.

    Returns
    -------
    str
        ``name`` when it is printable (``str.isprintable``), else ``repr(name)``.
    """
    text = os.fspath(name)
    return text if text.isprintable() else repr(text)
