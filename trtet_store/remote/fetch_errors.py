"""The errors a fetch raises on purpose, under :class:`~trtet_store.remote.errors.RemoteError`.

A disk too small is the storage engine's own
:class:`~trtet_store.io.InsufficientSpaceError`; access denied and a missing
bucket are :mod:`trtet_store.remote.errors`' own. Whatever a fetch raises,
the local files are as they were; what it had downloaded is kept for the next
fetch of the same destination, except where the error says it was dropped.
"""

from __future__ import annotations

from trtet_store.remote.errors import RemoteError


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


class FetchInterruptedError(RemoteError):
    """The network failed more times than the retries allow; the fetch can resume.

    Attributes
    ----------
    resume : str
        The command that continues it, downloading only what is missing.
    """

    def __init__(self, message: str, resume: str = "") -> None:
        super().__init__(message + (f"; run `{resume}` to continue" if resume else ""))
        self.resume = resume


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
