"""The errors a publish (and a fetch) raises on purpose: one base, :class:`RemoteError`.

Each message says what happened and what to do. Every refusal listed here is
raised with nothing visible under the key and no multipart upload left open,
except :class:`UploadKeptError`, which keeps the upload (and its journal) so
that the next publish resumes it.
"""

from __future__ import annotations


class RemoteError(Exception):
    """Base of every error :mod:`trtet_store.remote` raises on purpose."""


class ManifestError(RemoteError, ValueError):
    """A manifest that cannot be read: bad JSON, another format version, or inconsistent."""


class NotARegularFileError(RemoteError, ValueError):
    """A publish source that is not a regular file (a FIFO, a device, a directory, a socket).

    Refused before it is opened (a FIFO is never opened, so nothing blocks)
    and before anything is sent.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class FileNameError(ManifestError):
    """A file name no program may have (see :mod:`trtet_store.remote.filenames`).

    A program's files are its own name and plain ``.ptd`` names: no leading
    dot, no path, no control character, none of trtet_store's own names.
    ``publish`` refuses such a name before any request; ``fetch`` refuses a
    manifest that holds one before any byte is downloaded, with nothing
    created. A ``ManifestError``: a manifest that names one is not a program.

    Attributes
    ----------
    name : str
        The name refused.
    """

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name


class RemoteURLError(RemoteError, ValueError):
    """A destination that is not ``s3://bucket/key``."""


class BucketNotFoundError(RemoteError):
    """The bucket does not exist (or the endpoint is not the one that holds it)."""


class AccessDeniedError(RemoteError, PermissionError):
    """The server refused the credentials or the signature, or denied the call."""


class ConflictError(RemoteError):
    """Another writer changed the key since we looked: no reader takes what we wrote.

    Nothing of ours was made visible, or only a manifest that names versions the
    other writer has replaced since, which readers refuse.

    Attributes
    ----------
    key : str
        The object (or manifest) whose conditional write was refused, or that
        another writer replaced.
    """

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class KeyExistsError(ConflictError):
    """The key already holds an object and ``replace=True`` was not asked for."""

    @classmethod
    def of(cls, bucket: str, existing: list[str]) -> KeyExistsError:
        """The refusal of a publish whose ``existing`` keys of ``bucket`` are there (one
        message for the publish and for the CLI's check before a build)."""
        return cls(f"{', '.join(f's3://{bucket}/{k}' for k in existing)} already exist; "
                   "pass replace=True (--replace) to publish a new version", existing[0])


class OwnedByOtherProgramError(KeyExistsError):
    """The key is named by another program's manifest: no publish replaces it, ``replace`` or not.

    ExecuTorch names ``.ptd`` files by tag (``cpu.ptd``), not by program, so
    two programs published under one prefix would share keys; replacing one
    breaks the other. Publish the program under a prefix of its own.

    Attributes
    ----------
    key : str
        The object (or manifest) the publish would have written.
    owner : str
        ``s3://bucket/key`` of the program whose manifest names ``key``.
    """

    def __init__(self, message: str, key: str, owner: str) -> None:
        super().__init__(message, key)
        self.owner = owner


class ConditionalWritesUnsupportedError(RemoteError):
    """The server does not honour ``If-None-Match: *`` or ``If-Match`` on PutObject.

    Found out by the shared tier's probe (:mod:`trtet_store.cache.tier.probe`)
    before its first write to an endpoint and bucket: a second create-only
    write of one key was not refused (412), or an ``If-Match`` write created
    a missing key. There, "the first writer wins" would silently become "the
    last writer wins", so the tier publishes nothing and claims no lease;
    its reads still work.

    Attributes
    ----------
    endpoint : str or None
        The server.
    bucket : str
    """

    def __init__(self, message: str, endpoint: str | None = None, bucket: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.bucket = bucket


class PartSizeError(RemoteError, ValueError):
    """A part size outside S3's limits, or one that cannot cover the object in 10,000 parts."""


class UploadKeptError(RemoteError):
    """The publish stopped after parts were sent; the upload and its journal are kept.

    Run the same publish again (or ``trtet-store publish --resume``) to send
    only what is missing, or abort it (``trtet-store publish --abort``).

    Attributes
    ----------
    key : str
        The object being uploaded.
    upload_id : str
        The multipart upload kept open.
    journal : str or None
        The local journal that records it.
    """

    def __init__(self, message: str, key: str, upload_id: str, journal: str | None) -> None:
        super().__init__(message)
        self.key = key
        self.upload_id = upload_id
        self.journal = journal


class ChecksumMismatchError(UploadKeptError):
    """The server kept refusing a part's checksum (BadDigest), or its object's checksum differs."""


class EndpointUnreachableError(RemoteError):
    """No connection could be made to the endpoint (a wrong host or port, a server down).

    Not a network blip: botocore's own attempts all failed to connect, so the
    message names the ``host:port`` tried and asks to check the endpoint.

    Attributes
    ----------
    address : str
        ``host:port`` that refused or never answered.
    """

    def __init__(self, message: str, address: str) -> None:
        super().__init__(message)
        self.address = address

    @classmethod
    def from_botocore(cls, exc: BaseException, what: str) -> EndpointUnreachableError:
        """The error for botocore's ``EndpointConnectionError`` ``exc`` during ``what``."""
        from urllib.parse import urlsplit

        url = str(getattr(exc, "kwargs", {}).get("endpoint_url", ""))
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = f"{parts.hostname}:{port}" if parts.hostname else url or "the endpoint"
        cause = getattr(exc, "kwargs", {}).get("error")
        why = f" ({cause})" if cause else ""
        return cls(f"{what}: could not connect to {address}{why}; check the endpoint URL "
                   "(--endpoint-url, AWS_ENDPOINT_URL) and that the server is running", address)

class ObjectNotFoundError(RemoteError, FileNotFoundError):
    """No object (and no manifest) under the key."""


class ObjectChangedError(RemoteError):
    """The program was replaced while it was fetched (a GET's ``If-Match`` failed, 412).

    Raised when ``if_replaced="error"``, or when it kept changing through every
    restart allowed. Nothing local changed; no byte of two versions was mixed.
    """

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class FetchVerificationError(RemoteError):
    """Downloaded bytes did not match the manifest's digests or the object's checksum.

    A range is fetched again when its bytes do not match their chunk digests;
    this is raised when that kept failing, or when the full-object checksum
    (computed as the bytes streamed) differs from the manifest's or
    HeadObject's. The local files are untouched.
    """


class ProgramSignatureError(FetchVerificationError):
    """With trusted keys: a program no trusted key vouches for (its manifest unsigned, signed
    by another key, changed after signing, or naming its bytes by xxh3 only; nothing
    downloaded), or bytes whose sha256 is not the signed one (nothing placed)."""


class FetchInterruptedError(RemoteError):
    """The network failed more times than the retries allow; the fetch can resume.

    Attributes
    ----------
    resume : str
        The command that continues it, downloading only what is missing.
    reason : str
        What failed, without the command (a caller that continues it another
        way says its own).
    """

    def __init__(self, message: str, resume: str = "") -> None:
        super().__init__(message + (f"; run `{resume}` to continue" if resume else ""))
        self.resume = resume
        self.reason = message


class MissingDataError(RemoteError):
    """A program without a manifest that reads data from ``.ptd`` files: alone, it cannot load.

    Raised before anything local is written (``program_only=True`` fetches it
    anyway); what was downloaded is dropped with the fetch's staging area, so
    a refusal leaves no file behind.

    Attributes
    ----------
    ptd_files : list of str
        The ``.ptd`` objects beside the program on the server that hold keys it
        reads (empty when none does, or they could not be listed).
    keys : list of str
        The named-data keys the program reads from ``.ptd`` files.
    """

    def __init__(self, message: str, ptd_files: list[str], keys: list[str]) -> None:
        super().__init__(message)
        self.ptd_files = ptd_files
        self.keys = keys
