"""The top face: the verbs, what a user constructs, the errors a caller handles; lazy.

``io``'s internals live on ``trtet_store.io``; their old top-level names still
resolve for one release, each access warning where they went.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import trtet_store
import trtet_store.io

MOVED = ["Blob", "BlobChangedError", "BlobInUseError", "IncompleteJournal", "JournalError",
         "Orphan", "SourceChangedError", "StuckJournalError", "UnsafeDirectoryError",
         "UnsafeLockFileError", "WriteReport"]


def test_the_options_and_remote_error_are_on_the_face_and_load_neither_torch_nor_boto3():
    code = (
        "import sys, trtet_store\n"
        "for n in ('LoweringOptions', 'FetchConfig', 'PublishConfig', 'RemoteError'):\n"
        "    assert n in trtet_store.__all__, n\n"
        "    getattr(trtet_store, n)\n"
        "from trtet_store.remote.errors import RemoteError\n"
        "assert trtet_store.RemoteError is RemoteError\n"
        "heavy = sorted(m for m in ('torch', 'executorch', 'boto3', 'botocore') "
        "if m in sys.modules)\n"
        "assert heavy == [], heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_io_internals_are_not_on_the_face_and_their_old_names_warn():
    assert not set(MOVED) & set(trtet_store.__all__)
    for name in MOVED:
        with pytest.warns(DeprecationWarning, match=rf"trtet_store.{name} is io's: import it "
                                                    rf"from trtet_store.io"):
            assert getattr(trtet_store, name) is getattr(trtet_store.io, name)
    with pytest.raises(AttributeError, match="no attribute 'Orphans'"):
        trtet_store.Orphans  # noqa: B018


def test_every_name_of_the_face_resolves_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in trtet_store.__all__:
            assert getattr(trtet_store, name) is not None, name
