"""What a fetch fetches: the manifest beside the program, or a plain object's HEAD.

A manifest's names are checked as a closed set before any object is asked
for, and every object it names is HEADed at its ETag: still the version the
manifest names, with the manifest's size and full-object CRC64NVME. A
plain object (no manifest) is described by its HEAD, verified only when it
has a full-object checksum.

With trusted keys (``fetch(trusted_keys=...)``) the manifest is a signed
root: before anything else is read from it (its names, a HEAD, a byte of an
object), a trusted key's signature must verify over it, and it must name
every object and every chunk of each piece by sha256
(:func:`program_refusal`); else :class:`ProgramSignatureError`. A program
without a manifest is refused the same way. The specs then carry
``signed=True``: each range downloaded, resumed or reused is checked by its
chunks' sha256 as well as their xxh3.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtet_store.remote.download.plan import ObjectSpec
from trtet_store.remote.download.reader import Reader
from trtet_store.remote.errors import (
    FetchVerificationError,
    ManifestError,
    ObjectChangedError,
    ObjectNotFoundError,
    ProgramSignatureError,
)
from trtet_store.remote.filenames import check_program_names
from trtet_store.remote.jsondoc import loads
from trtet_store.remote.manifest import (
    MANIFEST_MAX_BYTES,
    SIGNATURE_DOMAIN,
    Manifest,
    is_sha256,
    manifest_key,
)
from trtet_store.remote.signing import signed_problem

# The fetch's logger, as before this step left receive.py.
log = logging.getLogger("trtet_store.remote.download.receive")


def _sha256_problem(doc: Any) -> str | None:
    """Why the parsed manifest ``doc`` does not name all its bytes by sha256, or None."""
    objects = doc.get("objects") if isinstance(doc, dict) else None
    ok = isinstance(objects, list) and bool(objects)
    for o in objects if ok else ():
        pieces = o.get("pieces") if isinstance(o, dict) else None
        ok = ok and is_sha256(o.get("sha256")) and isinstance(pieces, list) and all(
            isinstance(p, dict) and isinstance(p.get("sha256"), list)
            and isinstance(p.get("chunks"), list) and len(p["sha256"]) == len(p["chunks"])
            and all(is_sha256(h) for h in p["sha256"]) for p in pieces)
    if ok:
        return None
    return ("names its objects by xxh3 only (no sha256 for each object and chunk): not "
            "trusted; publish it again with the signing key")


def program_refusal(doc: Any, trusted: Mapping[str, Any]) -> str | None:
    """Why no key of ``trusted`` vouches for the parsed program manifest ``doc``, or None."""
    return signed_problem(doc, trusted, SIGNATURE_DOMAIN, what="programs",
                          digests_problem=_sha256_problem(doc),
                          changed=": the manifest was changed after it was signed")


def describe(reader: Reader, bucket: str, key: str, dest: Path,
             names: list[str] | None, trusted: Mapping[str, Any] | None = None
             ) -> tuple[bool, str, list[ObjectSpec], str | None]:
    """``(from a manifest, version, specs, why unverified)``: the manifest's, or a plain HEAD's.

    ``names``: the exact names the manifest must name (``fetch(names=)``), or
    None for a program's closed set. Every object the manifest names is
    HEADed at its ETag, its size and CRC64NVME checked against the manifest's.
    ``trusted``: ``{key id: PublicKey}``; the manifest must be signed by one
    (see the module doc), else :class:`ProgramSignatureError`, before a HEAD.
    """
    mkey = manifest_key(key)
    where = f"s3://{bucket}/{mkey}"
    try:
        raw, etag = reader.get_small(mkey)
    except ObjectNotFoundError:
        if trusted is not None:
            raise ProgramSignatureError(
                f"{where}: the program is refused: it has no manifest, so nothing signed "
                "names its bytes (only programs signed by the trusted keys are fetched); "
                "nothing downloaded") from None
        return (False, *_plain(reader, bucket, key, dest))
    try:
        if len(raw) > MANIFEST_MAX_BYTES:
            raise ManifestError(f"manifest is {len(raw)} bytes, more than the "
                                f"{MANIFEST_MAX_BYTES} a manifest may be")
        try:
            doc = loads(raw, "manifest")
        except ValueError as exc:
            raise ManifestError(str(exc)) from None
        if trusted is not None:
            why = program_refusal(doc, trusted)
            if why is not None:
                raise ProgramSignatureError(f"{where}: the program is refused: {why}; "
                                            "nothing downloaded")
        manifest = Manifest.from_dict(doc)
    except ManifestError as exc:
        exc.args = (f"{where}: {exc}",)  # its class kept (FileNameError)
        raise
    # A closed set of names, before any HEAD or GET of an object (filenames.py).
    check_program_names([o.name for o in manifest.objects], f"s3://{bucket}/{mkey}",
                        expected=names)
    specs = [ObjectSpec.from_entry(e, manifest.chunk_size, signed=trusted is not None)
             for e in manifest.objects]
    prefix = key.rpartition("/")[0]
    for s in specs:
        if s.key.rpartition("/")[0] != prefix:
            raise ManifestError(f"s3://{bucket}/{mkey}: object {s.key!r} is not beside "
                                f"the program {key!r}")
    if specs[0].key != key:
        raise ManifestError(f"s3://{bucket}/{mkey} is the manifest of {specs[0].key!r}, "
                            f"not of {key!r}")
    for s in specs:
        head = reader.head(s.key, s.etag)
        theirs = head.crc64nvme
        if head.size != s.size or (theirs and theirs != s.checksum[1]):
            raise FetchVerificationError(
                f"s3://{bucket}/{s.key}: HeadObject says {head.size} "
                f"bytes, CRC64NVME {theirs}; the manifest says {s.size} bytes, "
                f"{s.checksum[1]}")
    return True, etag, specs, None


def _plain(reader: Reader, bucket: str, key: str,
           dest: Path) -> tuple[str, list[ObjectSpec], str | None]:
    head = reader.head(key)
    etag = head.etag
    checksum, why = None, None
    kind = head.checksum_type or "FULL_OBJECT"
    for algorithm in ("crc64nvme", "crc32c", "crc32"):
        value = getattr(head, algorithm)
        if value and kind == "FULL_OBJECT":
            checksum = (algorithm, value)
            break
    if checksum is None:
        why = ("the object has no full-object checksum (uploaded without one, or with a "
               "composite multipart checksum): its bytes could not be verified")
        log.warning("s3://%s/%s: %s", bucket, key, why)
    spec = ObjectSpec(dest.name, key, head.size, etag, checksum)
    return etag, [spec], why


def wait_for_new_version(reader: Reader, url: str, key: str, old: str,
                         timeout: float) -> None:
    """Wait (bounded) until the manifest names another version than ``old``.

    A publish replaces the data objects first and the manifest last: in
    between, the old manifest names objects that are gone.
    """
    deadline = time.monotonic() + timeout
    delay = 0.1
    while time.monotonic() < deadline:
        try:
            _, etag = reader.get_small(manifest_key(key))
        except ObjectNotFoundError:
            etag = None
        if etag != old:
            return
        time.sleep(delay)
        delay = min(delay * 2, 2.0)
    raise ObjectChangedError(f"{url}: its objects changed, but its manifest did not "
                             f"within {timeout:.0f} s (a publish in progress, or one that "
                             "died before writing its manifest); try again later", key)
