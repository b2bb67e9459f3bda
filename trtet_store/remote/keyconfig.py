"""Where a tier's keys come from: the argument, else the environment, else a config file.

As boto3 takes its settings, each one separately, first found wins:

1. the argument (``signing_key=``, ``trusted_keys=``; the CLI's
   ``--signing-key``, ``--trusted-key``);
2. ``TRTET_SIGNING_KEY=PATH``, ``TRTET_TRUSTED_KEYS=PATH[:PATH...]``
   (an empty variable, or one naming no file such as ``:``, counts as unset);
3. the ``[trtet_store]`` section of the config file: ``$TRTET_CONFIG_FILE``,
   else ``$XDG_CONFIG_HOME/trtet_store/config`` (``~/.config/trtet_store/config``)::

       [trtet_store]
       signing_key = ~/.config/trtet_store/ci.key
       trusted_keys = ci.pub:/etc/trtet_store/team.pub

   (``~`` expanded; a relative path is relative to the config file's
   directory). A relative ``XDG_CONFIG_HOME`` is ignored, as the XDG spec
   says. The config file and every key file are read under the one rule for
   files we read back (:func:`trtet_store.io.open_ours`): a regular file
   owned by us or by root, not a link, never a FIFO waited on, size-capped;
   anything else is refused in one line ("config file ... is not ours: owned
   by uid 1001, not by uid 0; left alone"), as is a config file others can
   write, since it names whom to trust.

None anywhere: no signing, and every entry accepted (as before keys).
"""

from __future__ import annotations

import configparser
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtet_store.io import NotOursError, open_ours, read_fd_capped
from trtet_store.remote.keys import (
    KeyFileError,
    PublicKey,
    SigningKey,
    load_public_key,
    load_signing_key,
)

__all__ = ["ENV_CONFIG_FILE", "ENV_SIGNING_KEY", "ENV_TRUSTED_KEYS", "SECTION", "config_file",
           "resolve_keys", "resolve_signing", "resolve_trusted"]

ENV_SIGNING_KEY = "TRTET_SIGNING_KEY"
ENV_TRUSTED_KEYS = "TRTET_TRUSTED_KEYS"
ENV_CONFIG_FILE = "TRTET_CONFIG_FILE"
SECTION = "trtet_store"
#: A config file is a few lines; more is not one.
_CONFIG_LIMIT = 1 << 20


def config_file() -> Path:
    """The config file's path (it need not exist)."""
    given = os.environ.get(ENV_CONFIG_FILE)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base or not os.path.isabs(base):  # the XDG spec ignores relative values
        base = os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "trtet_store" / "config"


def _config() -> tuple[dict[str, str], Path]:
    """The ``[trtet_store]`` section's values (none when there is no file), and its path."""
    path = config_file()
    try:
        with open_ours(path, limit=_CONFIG_LIMIT, allow_root=True, what="config file") as fd:
            st = os.fstat(fd)
            if st.st_mode & 0o022:
                raise KeyFileError(f"config file {path} (uid {st.st_uid}, mode "
                                   f"{stat.S_IMODE(st.st_mode):04o}) can be written by another "
                                   "user, and it names whom to trust; chmod go-w it")
            data = read_fd_capped(fd, _CONFIG_LIMIT, path, "config file")
    except FileNotFoundError:
        return {}, path
    except NotOursError as exc:
        raise KeyFileError(str(exc)) from None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(data.decode("utf-8"), source=os.fspath(path))
    except UnicodeDecodeError as exc:
        raise KeyFileError(f"config file {path} is not UTF-8 ({exc})") from None
    except configparser.Error as exc:
        raise KeyFileError(f"config file {path}: {exc}".replace("\n", " ")) from None
    if not parser.has_section(SECTION):
        return {}, path
    known = {"signing_key", "trusted_keys"}
    unknown = sorted(set(parser[SECTION]) - known)
    if unknown:
        raise KeyFileError(f"config file {path}: [{SECTION}] has {unknown}; it knows "
                           f"{sorted(known)}")
    return dict(parser[SECTION]), path


def _paths(text: str, base: Path | None) -> list[Path]:
    out = []
    for part in text.split(os.pathsep):
        part = part.strip()
        if part:
            p = Path(part).expanduser()
            out.append(base / p if base is not None and not p.is_absolute() else p)
    return out


def resolve_keys(signing_key: Any = None, trusted_keys: Any = None
                 ) -> tuple[SigningKey | None, dict[str, PublicKey] | None]:
    """``(signing key or None, {key id: public key} or None)``, loaded (see the module doc).

    Parameters
    ----------
    signing_key : path-like or SigningKey, optional
    trusted_keys : sequence of path-like or PublicKey, optional
        Not empty (an empty list would refuse every entry: pass None to
        accept unsigned ones).

    Raises
    ------
    KeyFileError, FileNotFoundError, SigningUnavailableError
        A key or the config file cannot be used.
    TypeError, ValueError
        An argument of another type; an empty ``trusted_keys``.
    """
    return resolve_signing(signing_key), resolve_trusted(trusted_keys)


def _load_trusted(trusted_keys: Any) -> dict[str, PublicKey] | None:
    trusted: dict[str, PublicKey] | None = None
    if trusted_keys is not None:
        if isinstance(trusted_keys, (str, bytes, os.PathLike, PublicKey)) or \
                not isinstance(trusted_keys, Sequence):
            raise TypeError(f"trusted_keys must be a list of public key files, not "
                            f"{trusted_keys!r}")
        if not trusted_keys:
            raise ValueError("trusted_keys is empty: no entry could be accepted; pass None "
                             "to accept unsigned entries, or the public key files to trust")
        trusted = {}
        for k in trusted_keys:
            if not isinstance(k, PublicKey):
                if not isinstance(k, (str, os.PathLike)):
                    raise TypeError(f"each trusted key is a public key file, not {k!r}")
                k = load_public_key(k)
            trusted[k.key_id] = k
    return trusted


def key_files(keys: Any) -> list[str]:
    """The files the given keys were read from, for a command to repeat: a path as given, a
    loaded key's ``source``; a key read from no file is left out."""
    files = []
    for key in keys or ():
        path = getattr(key, "source", key)
        if path and isinstance(path, (str, os.PathLike)):
            files.append(os.fspath(path))
    return files


def resolve_trusted(trusted_keys: Any = None) -> dict[str, PublicKey] | None:
    """``{key id: public key}`` or None: :func:`resolve_keys`'s second half alone."""
    if trusted_keys is None:
        text = os.environ.get(ENV_TRUSTED_KEYS)
        base = None
        if not text or not _paths(text, None):  # empty, or naming no file (":"): unset
            config, path = _config()
            text = config.get("trusted_keys") or None
            base = path.parent
        if text is not None:
            trusted_keys = _paths(text, base) or None
    return _load_trusted(trusted_keys)


def resolve_signing(signing_key: Any = None) -> SigningKey | None:
    """The signing key or None: :func:`resolve_keys`'s first half alone."""
    if signing_key is None:
        text = os.environ.get(ENV_SIGNING_KEY)
        base = None
        if not text or not _paths(text, None):  # empty, or naming no file (" "): unset
            config, path = _config()
            text = config.get("signing_key") or None
            base = path.parent
        if text is not None:
            found = _paths(text, base)
            signing_key = found[0] if found else None
    if signing_key is not None and not isinstance(signing_key, SigningKey):
        if not isinstance(signing_key, (str, os.PathLike)):
            raise TypeError(f"signing_key must be a path to an ed25519 private key, not "
                            f"{type(signing_key).__name__}")
        signing_key = load_signing_key(signing_key)
    return signing_key
