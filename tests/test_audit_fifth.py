"""Audit, fifth round: states three planted bugs passed every test with.

- A build record's weights entry is data only when its config says
  ``"use_pickle": false``: no key, or ``0``, ``"false"``, ``null``, is refused
  as asking to be unpickled.
- A build record lacking one of the archive's fixed members is refused with
  ``"it lacks <name>"``.
- A signed set's blob is checked against the sha256 its store seal keeps only
  when that seal is read under the one rule: a seal too large for it, or one
  swapped for a link or a FIFO after the store's own ``sealed()`` check, is
  not believed; the blob is read once instead (and a FIFO does not hang).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import xxhash
from records_helpers import exported_archive
from test_tier_no_code import archive, members_of

from trtet_store.io.digests import file_identity
from trtet_store.sets.signed import SetSignatureError, check_blobs
from trtet_store.sets.store import ContentStore

# --- build records: a real torch.export archive, in-process -----------------------------------


@pytest.fixture(scope="module")
def weighted() -> bytes:
    """A real torch.export archive of a module with a weight (torch.export.save)."""
    return exported_archive(weighted=True)


_CONFIG = "data/weights/model_weights_config.json"
_NO_KEY = object()


@pytest.mark.parametrize("use_pickle", [_NO_KEY, 0, "false", None, [], "False"],
                         ids=["no key", "0", "'false'", "null", "[]", "'False'"])
def test_a_weight_entry_whose_use_pickle_is_not_an_explicit_false_is_refused(
        weighted: bytes, use_pickle: Any) -> None:
    from trtet_store.export.record_check import record_problem

    assert record_problem(weighted) is None  # the record as torch wrote it
    m = members_of(weighted)
    config = json.loads(m[_CONFIG])
    fqn, meta = sorted(config["config"].items())[0]
    assert meta["use_pickle"] is False  # torch writes an explicit false
    if use_pickle is _NO_KEY:
        del meta["use_pickle"]
    else:
        meta["use_pickle"] = use_pickle
    m[_CONFIG] = json.dumps(config).encode()
    said = record_problem(archive(m))
    assert said == f"its weights entry {fqn!r} asks to be unpickled (use_pickle)", said

    # the control: the same rewrite with the explicit false is data
    meta["use_pickle"] = False
    m[_CONFIG] = json.dumps(config).encode()
    assert record_problem(archive(m)) is None


def bare_archive(members: dict[str, bytes]) -> bytes:
    """A zip torch's archive reader reads, holding exactly ``members`` (and the writer's own
    ``.data/version``, ``byteorder``, ``.data/serialization_id``): unlike
    ``PT2ArchiveWriter``, nothing adds an ``archive_format`` or ``archive_version``."""
    import torch

    buf = io.BytesIO()
    w = torch._C.PyTorchFileWriter(buf)
    w.set_min_version(6)
    for name, data in members.items():
        w.write_record(name, data, len(data))
    w.write_end_of_file()
    return buf.getvalue()


def all_members(record: bytes) -> dict[str, bytes]:
    from torch.export.pt2_archive._package import PT2ArchiveReader

    with PT2ArchiveReader(io.BytesIO(record)) as r:
        return {n: r.read_bytes(n) for n in r.get_file_names()
                if n not in (".data/version", "byteorder", ".data/serialization_id")}


@pytest.mark.parametrize("member", [
    "archive_version", "models/model.json", _CONFIG,
    "data/constants/model_constants_config.json", "data/sample_inputs/model.pt"])
def test_a_record_lacking_a_fixed_member_is_refused(weighted: bytes, member: str) -> None:
    """(Without ``archive_format`` torch's reader itself refuses the zip: not covered here.)"""
    from trtet_store.export.record_check import record_problem

    m = all_members(weighted)
    assert member in m
    assert record_problem(bare_archive(m)) is None  # rewritten whole: still data
    del m[member]
    said = record_problem(bare_archive(m))
    assert said == f"it lacks {member}", said


# --- a signed set's blob and its store seal ---------------------------------------------------

BLOB = b"the set's engine bytes\n" * 100
WRONG = b"other bytes under the blob's name\n" * 70
X = xxhash.xxh3_128(BLOB).hexdigest()
SIGNED = hashlib.sha256(BLOB).hexdigest()  # what the signed set says X's sha256 is


def forged_seal(cas: ContentStore, pad: int = 0) -> bytes:
    """A seal of the blob now under X's name (its identity: sealed() believes it) that
    says its sha256 is the signed one, though its bytes are others."""
    st = os.lstat(cas.path(X))
    doc = {"xxh3": X, "size": st.st_size, "identity": list(file_identity(st)),
           "sha256": SIGNED}
    return json.dumps(doc).encode() + b" " * pad


def store_with_wrong_bytes(tmp_path: Path) -> ContentStore:
    cas = ContentStore(tmp_path / "store")
    cas.path(X).write_bytes(WRONG)
    os.makedirs(cas.seal_path(X).parent, mode=0o700, exist_ok=True)
    return cas


def refused_and_removed(cas: ContentStore, err: Any) -> None:
    assert f"blob {X}: its sha256 is None, the signed set says {SIGNED}" in str(err.value)
    assert not cas.path(X).exists()
    assert not os.path.lexists(cas.seal_path(X))


def test_a_seal_over_the_seal_limit_is_not_believed(tmp_path: Path) -> None:
    """The store's own check (64 KiB) takes a 5000-byte seal as the blob's; the sha256
    read keeps to 4096 bytes, so the forged sha256 is not used: the blob is read."""
    cas = store_with_wrong_bytes(tmp_path)
    cas.seal_path(X).write_bytes(forged_seal(cas, pad=5000))
    assert cas.sealed(X)  # the identity check alone takes it
    with pytest.raises(SetSignatureError) as err:
        check_blobs(cas, [X], {X: SIGNED}, "s3://b/set")
    refused_and_removed(cas, err)


class SwappedAfterCheck(ContentStore):
    """A store whose seal is swapped (by another process of ours, say) for ``swap`` right
    after the first ``sealed()`` check passes, and put back before the second one: the
    window between the store's check and the sha256's read, made deterministic."""

    def __init__(self, root: Path, swap: Any) -> None:
        super().__init__(root)
        self.swap = swap
        self.calls = 0
        self.saved: bytes | None = None

    def sealed(self, digest: str) -> bool:
        self.calls += 1
        seal = self.seal_path(digest)
        if self.calls == 2 and self.saved is not None:  # put the real seal back
            os.unlink(seal)
            seal.write_bytes(self.saved)
        ok = super().sealed(digest)
        if self.calls == 1 and ok:
            self.saved = seal.read_bytes()
            os.unlink(seal)
            self.swap(seal)
        return ok


def test_a_seal_swapped_for_a_link_to_a_forged_seal_is_not_believed(tmp_path: Path) -> None:
    forged = tmp_path / "forged.json"
    cas = SwappedAfterCheck(tmp_path / "store", lambda seal: seal.symlink_to(forged))
    cas.path(X).write_bytes(WRONG)
    os.makedirs(cas.seal_path(X).parent, mode=0o700, exist_ok=True)
    # the real seal: the blob's identity, with no sha256 (it was never read for one)
    st = os.lstat(cas.path(X))
    cas.seal_path(X).write_bytes(json.dumps(
        {"xxh3": X, "size": st.st_size, "identity": list(file_identity(st))}).encode())
    forged.write_bytes(forged_seal(cas))
    before = forged.read_bytes()
    assert ContentStore(cas.root).sealed(X)  # the real seal is the blob's (no swap here)
    with pytest.raises(SetSignatureError) as err:
        check_blobs(cas, [X], {X: SIGNED}, "s3://b/set")
    assert cas.calls == 1  # swapped after the check; the link refused, the blob read
    refused_and_removed(cas, err)
    assert forged.read_bytes() == before  # the link's target untouched


def test_a_seal_that_is_a_link_to_a_forged_seal_is_not_believed(tmp_path: Path) -> None:
    """The plain state: the seal is a link, the whole time, to a forged seal."""
    cas = store_with_wrong_bytes(tmp_path)
    forged = tmp_path / "forged.json"
    forged.write_bytes(forged_seal(cas))
    before = forged.read_bytes()
    cas.seal_path(X).symlink_to(forged)
    with pytest.raises(SetSignatureError) as err:
        check_blobs(cas, [X], {X: SIGNED}, "s3://b/set")
    refused_and_removed(cas, err)
    assert forged.read_bytes() == before


def _fifo_case(tmp_path: Path, swapped: bool) -> None:
    def make_fifo(seal: Path) -> None:
        os.mkfifo(seal, 0o600)

    if swapped:
        cas: ContentStore = SwappedAfterCheck(tmp_path / "store", make_fifo)
        cas.path(X).write_bytes(WRONG)
        os.makedirs(cas.seal_path(X).parent, mode=0o700, exist_ok=True)
        cas.seal_path(X).write_bytes(forged_seal(cas))
    else:
        cas = store_with_wrong_bytes(tmp_path)
        make_fifo(cas.seal_path(X))
    seal = cas.seal_path(X)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            check_blobs(cas, [X], {X: SIGNED}, "s3://b/set")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=1.5)
    hung = t.is_alive()
    if hung:  # let the blocked open go: a writer opens and closes the FIFO
        fd = os.open(seal, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(timeout=1.0)
    assert not hung, "check_blobs hung opening a FIFO seal"
    assert outcome and isinstance(outcome[0], SetSignatureError), outcome
    assert f"blob {X}: its sha256 is None, the signed set says {SIGNED}" in str(outcome[0])
    assert not cas.path(X).exists()


def test_a_fifo_seal_neither_hangs_nor_is_believed(tmp_path: Path) -> None:
    _fifo_case(tmp_path, swapped=False)


def test_a_seal_swapped_for_a_fifo_neither_hangs_nor_is_believed(tmp_path: Path) -> None:
    _fifo_case(tmp_path, swapped=True)
