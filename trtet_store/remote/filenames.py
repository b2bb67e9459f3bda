"""The file names a published program may have: a closed set, checked by publish and fetch.

A manifest names the files a fetch writes beside its destination, and
anyone who can write the bucket can write a manifest. So the names are not
taken as they come; a program's files are:

- the program's own name (object 0; locally it goes to the path the caller
  gives, so only a plain name is asked of it), and
- ``.ptd`` names (ExecuTorch names them ``<tag>.ptd``): a plain file name
  ending in ``.ptd``, without a leading dot.

No name holds a path separator (``/``, ``\\``), a control character (C0,
DEL, C1: a newline would split a line of output, an escape rewrite the
terminal), a line or paragraph separator (U+2028, U+2029), a format
character (Unicode category Cf: the bidirectional overrides and isolates
U+202A-U+202E and U+2066-U+2069 that make a name show as another,
the marks U+200E/U+200F/U+061C, zero-width characters, a
byte-order mark) or an undecodable byte (a lone surrogate, as
``os.fsdecode`` makes of one), and none is one of
trtet_store's own names beside a destination (``.trtet-staging``, a lock
``.<name>.trtet-lock``, a journal, a temp file; every one starts with a
dot) or a manifest (``*.trtet.json``). A caller that publishes and
fetches files of its own naming (the shared tier: ``record``, ``e0``)
gives the exact names it expects instead of the ``.ptd`` rule.

:func:`name_problem` is the rule; :func:`check_program_names` applies it to
a program's names (publish, before any request; fetch, as soon as the
manifest is read); :func:`check_destination` refuses, from the manifest
alone and before any byte is downloaded, names that cannot be written at
the destination (a directory there, the destination's own name twice).
Standard library only.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import unicodedata
from collections.abc import Sequence
from pathlib import Path

from trtet_store.remote.errors import FileNameError

#: What a program's data files end with.
DATA_SUFFIX = ".ptd"
#: The Unicode categories no name may hold a character of: controls (Cc: C0, DEL,
#: C1), format characters (Cf: bidirectional overrides and isolates, directional
#: marks, zero-width characters, which make a name show as another), the line and
#: paragraph separators a terminal or a log reader may break a line at (Zl, Zp),
#: and surrogates (Cs: a lone one is an undecodable byte).
_UNSHOWABLE = {"Cc": "a control character", "Cf": "a format character that can reorder "
               "or hide what is shown", "Zl": "a line separator",
               "Zp": "a paragraph separator", "Cs": "an undecodable byte"}


def _unshowable(name: str) -> str | None:
    """Why ``name`` cannot be shown as one plain piece of a line, or None."""
    for ch in name:
        what = _UNSHOWABLE.get(unicodedata.category(ch))
        if what is not None:
            label = unicodedata.name(ch, "")
            return (f"holds a control character (U+{ord(ch):04X}"
                    f"{' ' + label if label else ''}: {what})")
    return None
#: trtet_store's own names beside a destination and in a prefix (io.names and
#: remote.manifest make them): every internal file starts with ``.trtet-`` or
#: is ``.<name>.trtet-<suffix>``; manifests end in ``.trtet.json``.
_INTERNAL = re.compile(r"^\.trtet-|^\..*\.trtet-|\.trtet-(lock|journal)$|\.trtet\.json$")


def name_problem(name: object, *, program: bool = False) -> str | None:
    """Why ``name`` cannot be a file of a program, or None when it can.

    Parameters
    ----------
    name : str
        The file name (as a manifest or a publish names it).
    program : bool
        The name is the program's own (object 0): only a plain name, not one
        of trtet_store's own, is asked of it. Otherwise it must be a
        ``.ptd`` name without a leading dot.

    Returns
    -------
    str or None
        The reason, worded to follow the quoted name ("... is not a plain
        file name"), or None.
    """
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a file name"
    if name in ("", ".", ".."):
        return "is not a file name"
    if "/" in name or "\\" in name:
        return "is a path, not a plain file name"
    why = _unshowable(name)
    if why is not None:
        return why
    if _INTERNAL.search(name):
        return "is one of trtet_store's own names (staging, lock, journal, manifest)"
    if program:
        return None
    if name.startswith("."):
        return "starts with a dot (a hidden file, never a program's data)"
    if not name.endswith(DATA_SUFFIX) or name == DATA_SUFFIX:
        return f"is not a {DATA_SUFFIX} name"
    return None


def plain_name_problem(name: object) -> str | None:
    """Why ``name`` is no plain, showable file name (the floor every manifest is held to)."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a file name"
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        return "is not a plain file name (a path, empty, '.' or '..')"
    return _unshowable(name)


def check_program_names(names: Sequence[str], where: str, *,
                        expected: Sequence[str] | None = None) -> None:
    """Refuse a program whose file names are not in the closed set.

    Parameters
    ----------
    names : sequence of str
        The program's file names, the program's own first.
    where : str
        What names them, for the message (``s3://b/k.trtet.json``, ``publish
        s3://b/k``).
    expected : sequence of str, optional
        The exact names a caller of its own naming expects, in order (the
        shared tier's ``record``, ``e0``): then the ``.ptd`` rule is theirs,
        and only the names' being these, each plain and none of
        trtet_store's own, is checked.

    Raises
    ------
    FileNameError
        The first name outside the set, quoted, and what to do.
    """
    if expected is not None:
        for name in expected:
            why = name_problem(name, program=True)
            if why is not None:
                raise FileNameError(f"{where}: the expected file name {name!r} {why}", name)
        if list(names) != list(expected):
            odd = next((n for n in names if n not in expected), names[0] if names else "")
            raise FileNameError(f"{where} names the files {list(names)!r}, not the "
                                f"{list(expected)!r} expected", odd)
        return
    for i, name in enumerate(names):
        why = name_problem(name, program=i == 0)
        if why is not None:
            what = "the program's name" if i == 0 else "a file name"
            raise FileNameError(
                f"{where}: {what} {name!r} {why}; a program's files are its own name and "
                f"plain {DATA_SUFFIX} names (no leading dot, no path, no control, format or "
                f"line-separator character)",
                name)


def check_destination(dest: Path, names: Sequence[str], where: str) -> None:
    """Refuse, before anything is downloaded, names that cannot be written beside ``dest``.

    ``dest`` is the program's local path (``names[0]`` goes there); every
    other name goes to ``dest.parent / name``. Looked at with ``lstat``: a
    name there that is a symbolic link is fine (the write replaces the
    link itself, never its target); one that is a directory is not.

    Raises
    ------
    FileNameError
        A data file's name is the destination's own (it would be written twice).
    IsADirectoryError
        ``dest`` (followed, as the write follows it) or a data file's name
        there is a directory.
    """
    if os.path.isdir(dest):
        raise IsADirectoryError(errno.EISDIR, f"cannot fetch {where} to {dest}: it is a "
                                "directory; give the program's file name", os.fspath(dest))
    for name in names[1:]:
        if name == dest.name:
            raise FileNameError(f"{where} names {name!r}, the destination's own name, as one "
                                f"of its data files; fetch it to another name than {dest}",
                                name)
        path = dest.parent / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, f"cannot fetch {where}: its file {name!r} "
                                    f"is a directory at {path}; move it away or fetch into "
                                    "another directory", os.fspath(path))
