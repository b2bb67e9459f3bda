"""Signed shared-tier entries: ed25519 key files, a pointer's signatures, and their check.

A signed pointer names every file of its entry by size, xxh3-128 and sha256,
so a signature over the pointer's fields (:meth:`RemoteEntry.record`)
vouches for every byte a reader will accept through a cryptographic digest
(as a Nix binary cache's fingerprint holds the content's sha256): with
trusted keys the tier checks each downloaded file's sha256, taken in the
download's own pass over the bytes, against the very pointer whose
signature it checked. xxh3 is not second-preimage resistant, so it alone
never carries a signature. What is signed is :data:`DOMAIN` followed by the
record as canonical JSON (sorted keys, no spaces, ASCII), recomputed by the
reader from the fields it parsed and will use; the pointer stores
``"signature": {"key": <key id>, "ed25519": <base64>}``, or a list of such
when several keys signed it. An entry is accepted when one signature by a
trusted key verifies (signatures by other keys are ignored); a signature
that does not verify counts for nothing, and an entry no trusted signature
vouches for is a miss. A writer of the bucket who changes the pointer (its
files' sizes and digests, its metadata, anything) cannot make a signature
that a trusted key verifies.

Entries signed by versions before sha256 (``.../cache-entry-signature/1``,
files named by xxh3-128 only) are refused by a reader with trusted keys, in
one line ("names its files by xxh3-128 only ..."): publish them again with
the signing key (``trtet-store cache push``, or the next build).

Key files are the standard PEM forms (``openssl genpkey -algorithm ed25519``
makes the same): the private key PKCS#8, file mode 0600, made with
``O_CREAT | O_EXCL | O_NOFOLLOW`` (never over an existing file or through a
link); the public key SubjectPublicKeyInfo, beside it as ``<path>.pub``. A
key's id is ``ed25519:`` + the first 16 hex digits of sha256 of its 32 raw
bytes. The ``cryptography`` package (the ``sign`` extra) is imported only
when a key is made or loaded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtet_store.cache.tier.entry import RemoteEntry, TierEntryError
from trtet_store.io import NotOursError, open_ours, read_fd_capped

__all__ = ["DOMAIN", "MAX_SIGNATURES", "KeyFileError", "PublicKey", "SigningKey",
           "SigningUnavailableError", "TierSignatureError", "keygen", "load_public_key",
           "load_signing_key", "payload", "refusal", "sign_entry", "unnamed_by_sha256",
           "claimed_keys", "verified_by"]

#: What a signature covers starts with this, so that it means nothing elsewhere
#: (``/2``: every file named by sha256 too; ``/1`` named them by xxh3-128 only).
DOMAIN = b"trtet-store/cache-entry-signature/2\n"
#: Key files are read whole: a PEM ed25519 key is about 120 bytes.
_KEY_FILE_LIMIT = 64 << 10


class SigningUnavailableError(ImportError):
    """Keys were asked for and the ``cryptography`` package is not installed."""


class KeyFileError(ValueError):
    """A key file that cannot be used: not an ed25519 PEM key, open to other users, or not
    ours (another user's file, a link, not a regular file: "... is not ours: owned by uid
    1001, not by uid 0; left alone")."""


class TierSignatureError(TierEntryError):
    """An entry the tier's trusted keys do not vouch for: never served.

    Attributes
    ----------
    reason : str
        Why: not signed, signed by a key not trusted, or a signature that
        does not verify (the pointer changed after it was signed).
    """

    def __init__(self, message: str, key: str, reason: str) -> None:
        super().__init__(message, key)
        self.reason = reason


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


def payload(entry: RemoteEntry) -> bytes:
    """What a signature of ``entry`` covers: :data:`DOMAIN` + its record as canonical JSON."""
    return DOMAIN + json.dumps(entry.record(), sort_keys=True, separators=(",", ":"),
                               ensure_ascii=True).encode("ascii")


#: Signatures one pointer may carry (each costs a verification).
MAX_SIGNATURES = 8


def unnamed_by_sha256(entry: RemoteEntry) -> list[str]:
    """The names of ``entry``'s files its pointer does not name by sha256."""
    return [f["name"] for f in entry.files if "sha256" not in f]


def sign_entry(entry: RemoteEntry, key: SigningKey) -> None:
    """Add ``key``'s signature over :func:`payload` to ``entry`` (call last, before the put).

    Every file must be named by sha256 (``ValueError`` otherwise: a
    signature over xxh3-128 alone vouches for nothing). A second key's
    signature is added beside the first (a list); the same key's replaces
    its own.
    """
    missing = unnamed_by_sha256(entry)
    if missing:
        raise ValueError(f"entry {entry.key}: files {missing} are not named by sha256; a "
                         "signature needs it (xxh3-128 is not a cryptographic digest)")
    sig = {"key": key.key_id,
           "ed25519": base64.b64encode(key.sign(payload(entry))).decode("ascii")}
    others = [s for s in entry.signatures()
              if not (isinstance(s, dict) and s.get("key") == key.key_id)]
    entry.signature = [*others, sig] if others else sig


def _one(sig: Any, entry: RemoteEntry, trusted: Mapping[str, PublicKey]) -> str | None:
    """Why the one signature ``sig`` does not vouch for ``entry``, or None when it does."""
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
    if len(raw) != 64 or not key.verifies(raw, payload(entry)):
        return (f"its signature by {key.key_id} does not verify: the pointer was changed "
                "after it was signed")
    return None


def claimed_keys(entry: RemoteEntry) -> list[str]:
    """The key ids ``entry``'s signatures claim, unchecked (what a bucket writer can write)."""
    return [str(s["key"])[:40] for s in entry.signatures()[:MAX_SIGNATURES]
            if isinstance(s, dict) and isinstance(s.get("key"), str)]


def verified_by(entry: RemoteEntry, trusted: Mapping[str, PublicKey]) -> str | None:
    """The id of the first of ``trusted`` whose signature vouches for ``entry``, or None."""
    if refusal(entry, trusted) is not None:
        return None
    return next(s["key"] for s in entry.signatures() if _one(s, entry, trusted) is None)


def refusal(entry: RemoteEntry, trusted: Mapping[str, PublicKey]) -> str | None:
    """Why ``entry`` is not vouched for by one of ``trusted`` (by key id), or None.

    One of: not signed; a file not named by sha256 (an entry signed before
    sha256, over xxh3-128 only); a signature field that is not ``{"key",
    "ed25519"}``; signed by a key not trusted; a signature that does not
    verify (the pointer was changed after signing: its files, metadata,
    anything). With several signatures, one by a trusted key that verifies
    is enough; else the reason is the first trusted signer's, or the first's.
    """
    sigs = entry.signatures()
    if not sigs:
        return "not signed (this cache accepts only entries signed by its trusted keys)"
    missing = unnamed_by_sha256(entry)
    if missing:
        return (f"names its files by xxh3-128 only ({', '.join(missing)} without sha256: "
                "signed by a version before sha256, or not signed over the content); not "
                "trusted: publish it again with the signing key")
    if len(sigs) > MAX_SIGNATURES:
        return f"carries {len(sigs)} signatures, more than the {MAX_SIGNATURES} read"
    reasons = [_one(sig, entry, trusted) for sig in sigs]
    if any(r is None for r in reasons):
        return None
    by_trusted = [r for sig, r in zip(sigs, reasons, strict=True)
                  if isinstance(sig, dict) and sig.get("key") in trusted]
    return (by_trusted or reasons)[0]
