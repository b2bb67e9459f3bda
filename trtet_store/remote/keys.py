"""ed25519 keys for signed documents in a bucket: key files, key ids, one signature's check.

Key files are the standard PEM forms (``openssl genpkey -algorithm ed25519``
makes the same): the private key PKCS#8, file mode 0600, made with
``O_CREAT | O_EXCL | O_NOFOLLOW`` (never over an existing file or through a
link); the public key SubjectPublicKeyInfo, beside it as ``<path>.pub``. A
key file is read under io's one rule for files read back (a regular file
owned by you or root, not a link, size-capped, read from the checked
descriptor). A key's id is ``ed25519:`` + the first 16 hex digits of sha256
of its 32 raw bytes. The ``cryptography`` package (the ``sign`` extra) is
imported only when a key is made or loaded.

:func:`signature_problem` is the one check of a ``{"key", "ed25519"}``
signature for every signed document: the shared tier's pointers and leases
and a set manifest each sign their own payload and call it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtet_store.io import NotOursError, open_ours, read_fd_capped

__all__ = ["KeyFileError", "PublicKey", "SigningKey", "SigningUnavailableError", "keygen",
           "load_public_key", "load_signing_key", "signature_problem"]

#: Key files are read whole: a PEM ed25519 key is about 120 bytes.
_KEY_FILE_LIMIT = 64 << 10


class SigningUnavailableError(ImportError):
    """Keys were asked for and the ``cryptography`` package is not installed."""


class KeyFileError(ValueError):
    """A key file that cannot be used: not an ed25519 PEM key, open to other users, or not
    ours (another user's file, a link, not a regular file: "... is not ours: owned by uid
    1001, not by uid 0; left alone")."""


def _crypto() -> Any:
    """The ``cryptography`` modules we use, or a SigningUnavailableError saying what to install."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise SigningUnavailableError(
            f"signed shared-tier entries need the cryptography package ({exc}): "
            "pip install 'trtet-store[sign]'") from None

    class _Mods:
        pass

    mods = _Mods()
    mods.InvalidSignature = InvalidSignature
    mods.serialization = serialization
    mods.ed25519 = ed25519
    return mods


def _key_id(raw: bytes) -> str:
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class PublicKey:
    """An ed25519 public key: ``key_id`` names it in pointers; ``raw`` its 32 bytes."""

    key_id: str
    raw: bytes
    source: str = ""

    def verifies(self, signature: bytes, data: bytes) -> bool:
        """Whether ``signature`` is this key's over ``data``."""
        c = _crypto()
        try:
            c.ed25519.Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, data)
        except c.InvalidSignature:
            return False
        return True


class SigningKey:
    """An ed25519 private key loaded from its file (:func:`load_signing_key`)."""

    def __init__(self, private: Any, source: str) -> None:
        c = _crypto()
        self._private = private
        raw = private.public_key().public_bytes(c.serialization.Encoding.Raw,
                                                c.serialization.PublicFormat.Raw)
        self.public = PublicKey(_key_id(raw), raw, source)
        self.source = source

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def __repr__(self) -> str:
        return f"SigningKey({self.source!r}, key_id={self.key_id!r})"


def _create(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file ``path`` (never an existing one, never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    try:
        os.fchmod(fd, mode)  # exactly this mode, whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def keygen(path: os.PathLike | str) -> PublicKey:
    """Write a new ed25519 key pair: the private key at ``path`` (0600), the public at ``.pub``.

    Neither file may exist: nothing is ever overwritten (``O_EXCL``), and a
    link at either name is refused the same way.

    Returns
    -------
    PublicKey
        The new public key (its ``key_id`` is what pointers will name).

    Raises
    ------
    FileExistsError
        ``path`` or ``path.pub`` exists (nothing written).
    SigningUnavailableError
        ``cryptography`` is not installed.
    """
    c = _crypto()
    path = Path(path)
    public_path = Path(f"{os.fspath(path)}.pub")
    if os.path.lexists(public_path):
        raise FileExistsError(f"{public_path} exists: keygen never overwrites a key; pick "
                              "another PATH or remove it")
    private = c.ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(c.serialization.Encoding.PEM,
                                c.serialization.PrivateFormat.PKCS8,
                                c.serialization.NoEncryption())
    pub = private.public_key()
    try:
        _create(path, pem, 0o600)
    except FileExistsError:
        raise FileExistsError(f"{path} exists: keygen never overwrites a key; pick another "
                              "PATH or remove it") from None
    try:
        _create(public_path, pub.public_bytes(c.serialization.Encoding.PEM,
                                              c.serialization.PublicFormat.SubjectPublicKeyInfo),
                0o644)
    except BaseException:
        os.unlink(path)  # ours, made just now: no half a pair
        raise
    raw = pub.public_bytes(c.serialization.Encoding.Raw, c.serialization.PublicFormat.Raw)
    return PublicKey(_key_id(raw), raw, os.fspath(public_path))


def _read_key_file(path: os.PathLike | str, what: str, refuse_mode: int) -> bytes:
    """The bytes of a key file, under the one rule for files we read back to decide something.

    Opened with ``O_NOFOLLOW | O_NONBLOCK`` (a link is refused, a FIFO never
    waited on), checked on that descriptor: a regular file owned by us or
    by root (an administrator's), at most a key file's size; then refused
    when its mode lets others do ``refuse_mode``; read from that descriptor.
    """
    try:
        with open_ours(path, limit=_KEY_FILE_LIMIT, allow_root=True, what=what) as fd:
            st = os.fstat(fd)
            if st.st_mode & refuse_mode:
                raise KeyFileError(
                    f"{what} {os.fspath(path)} has mode {stat.S_IMODE(st.st_mode):04o}: other "
                    f"users could {'read' if refuse_mode & 0o044 else 'replace'} it; "
                    f"chmod {'600' if refuse_mode & 0o044 else 'go-w'} it")
            return read_fd_capped(fd, _KEY_FILE_LIMIT, path, what)
    except NotOursError as exc:
        raise KeyFileError(str(exc)) from None


def load_signing_key(path: os.PathLike | str) -> SigningKey:
    """The ed25519 private key in the PEM file ``path`` (from :func:`keygen` or openssl).

    Raises
    ------
    KeyFileError
        Not an unencrypted ed25519 PEM private key, or readable or writable
        by group or others (as ssh refuses such a key).
    FileNotFoundError
    SigningUnavailableError
    """
    c = _crypto()
    data = _read_key_file(path, "signing key", 0o077)
    try:
        key = c.serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"signing key {os.fspath(path)}: not an unencrypted PEM private "
                           f"key ({exc})") from None
    if not isinstance(key, c.ed25519.Ed25519PrivateKey):
        raise KeyFileError(f"signing key {os.fspath(path)} is a {type(key).__name__}, not "
                           "ed25519 (make one with `trtet-store cache keygen PATH`)")
    return SigningKey(key, os.fspath(path))


def load_public_key(path: os.PathLike | str) -> PublicKey:
    """The ed25519 public key in the PEM file ``path`` (a ``.pub`` from :func:`keygen`).

    Raises
    ------
    KeyFileError
        Not an ed25519 PEM public key, or writable by group or others (who
        could swap in their own key).
    FileNotFoundError
    SigningUnavailableError
    """
    c = _crypto()
    data = _read_key_file(path, "trusted key", 0o022)
    try:
        key = c.serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"trusted key {os.fspath(path)}: not a PEM public key ({exc})"
                           ) from None
    if not isinstance(key, c.ed25519.Ed25519PublicKey):
        raise KeyFileError(f"trusted key {os.fspath(path)} is a {type(key).__name__}, not "
                           "ed25519")
    raw = key.public_bytes(c.serialization.Encoding.Raw, c.serialization.PublicFormat.Raw)
    return PublicKey(_key_id(raw), raw, os.fspath(path))


def signature_problem(sig: Any, trusted: Mapping[str, PublicKey], data: bytes, *,
                      changed: str = "") -> str | None:
    """Why the one signature ``sig`` does not vouch for ``data``, or None when it does.

    The one check of a ``{"key", "ed25519"}`` signature, for every signed
    document (the tier's pointers, its leases, a set manifest): the field's
    form, a key among ``trusted`` (by key id), base64, 64 bytes, and an
    ed25519 verification over ``data``. ``changed`` is appended to "does not
    verify" (what a failed verification means for that document).
    """
    if not (isinstance(sig, dict) and isinstance(sig.get("key"), str)
            and isinstance(sig.get("ed25519"), str)):
        return "its signature field is not {'key', 'ed25519'}"
    key = trusted.get(sig["key"])
    if key is None:
        return (f"signed by {sig['key'][:40]!r}, not one of the trusted keys "
                f"({', '.join(sorted(trusted)) or 'none'})")
    try:
        raw = base64.b64decode(sig["ed25519"], validate=True)
    except (binascii.Error, ValueError):
        return f"its signature by {key.key_id} is not base64"
    if len(raw) != 64 or not key.verifies(raw, data):
        return f"its signature by {key.key_id} does not verify{changed}"
    return None
