"""Four checks a planted-bug audit found no test held, each held here by the state it is for.

- An in-order digest's sha256 is None until every byte was added (a partial
  file's hash is never a whole file's).
- A journal of ours whose *second* output lies in a directory not ours
  (uid 65534's, or one anyone writes to) is not replayed, though that
  output's temp file is named for it and the token.
- A store blob without a sealed sha256 is read once; when its bytes are not
  its name (xxh3-128), the sha256 read is not trusted even if it is the one
  the signed set names: refused and removed.
- A build record whose weights config names a file the archive lacks is
  refused before torch loads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
import xxhash
from records_helpers import exported_archive
from test_audit_journal_plans import NEW, OLD, interrupted, refused
from test_audit_journal_plans import here as here  # the fixture  # noqa: PLC0414
from test_journal_plants import T1, journal_text, state
from test_tier_no_code import archive, members_of

from trtet_store import recover
from trtet_store.io.digests import InOrderDigest
from trtet_store.io.journal import DONE, UNPUBLISHING, OutputPlan, Plan
from trtet_store.io.names import journal_path, temp_path
from trtet_store.sets.signed import SetSignatureError, check_blobs
from trtet_store.sets.store import ContentStore

NOBODY = 65534

# --- an in-order digest's sha256 -------------------------------------------------------------


def test_an_in_order_digest_gives_no_sha256_until_every_byte_is_in() -> None:
    data = bytes(range(256)) * 64
    d = InOrderDigest(len(data), sha256=True)
    assert d.add(0, data[:5000])
    assert d.sha256() is None and d.digest() is None  # part of the file
    assert d.add(5000, data[5000:])
    assert d.sha256() == hashlib.sha256(data).hexdigest()
    assert d.digest() == xxhash.xxh3_128(data).hexdigest()


def test_an_in_order_digest_given_the_later_range_first_gives_none_until_complete() -> None:
    data = b"the file's bytes\n" * 500
    cut = 3000
    d = InOrderDigest(len(data), sha256=True)
    quit_, added = threading.Event(), []
    later = threading.Thread(target=lambda: added.append(d.add(cut, data[cut:], quit_)))
    later.start()  # waits for the earlier bytes
    try:
        later.join(0.3)
        assert later.is_alive()
        assert d.sha256() is None and d.digest() is None  # nothing digested yet
        assert d.add(0, data[:cut])
        later.join(5)
        assert not later.is_alive() and added == [True]
        assert d.sha256() == hashlib.sha256(data).hexdigest()
    finally:  # a failure above must not leave the thread waiting forever
        quit_.set()
        later.join(5)

    stop = threading.Event()
    stop.set()
    e = InOrderDigest(len(data), sha256=True)
    assert e.add(cut, data[cut:], stop) is False  # stopped while waiting: nothing digested
    assert e.add(0, data[:cut])
    assert e.sha256() is None  # the later range never came


# --- a journal's second output outside any directory of ours -------------------------------


def theirs(here: Path, kind: str) -> Path:
    """A directory beside the journal that is not ours: uid 65534's own (0755), or one
    anyone writes to (1777, like /tmp)."""
    d = here / kind
    d.mkdir()
    if kind == "nobodys":
        os.chown(d, NOBODY, NOBODY)
        os.chmod(d, 0o755)
    else:
        os.chmod(d, 0o1777)
    return d


@pytest.mark.parametrize("at", [UNPUBLISHING, DONE])
@pytest.mark.parametrize("kind", ["nobodys", "shared"])
def test_a_journal_whose_second_output_is_in_a_directory_not_ours_is_not_replayed(
        here, kind, at, caplog) -> None:
    """The first output is the journal's own (model.pte, interrupted); the second names
    a file in a directory not ours, with its temp file named for it and the token.
    Unpublishing would rename that file to its temp name and delete it; a finished write
    would move the temp over it. Refused as not ours; nothing there changes."""
    dest, _other = interrupted(here)
    their = theirs(here, kind)
    victim = their / "report.pte"
    victim.write_bytes(b"uid 65534's program\n" * 30)
    temp_path(victim, T1).write_bytes(NEW)
    for p in (victim, temp_path(victim, T1)):
        os.chown(p, NOBODY, NOBODY)
        os.chmod(p, 0o644)
    outputs = [OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)),
                          backup=None, size=len(NEW)),
               OutputPlan(dest=os.fspath(victim), temp=os.fspath(temp_path(victim, T1)),
                          backup=None, size=len(NEW))]
    path = journal_path(dest, T1)
    path.write_bytes(journal_text(Plan(token=T1, outputs=outputs), at))  # root's own
    before = state(their)
    refused(here, path,
            f"its plan names {victim}, outside {here} and any directory of ours", caplog)
    assert state(their) == before
    assert victim.read_bytes() == b"uid 65534's program\n" * 30
    assert victim.stat().st_uid == NOBODY


def test_the_same_journal_with_its_second_output_in_a_directory_of_ours_is_replayed(
        here) -> None:
    """The control: the second output in the staging directory of ours (0700) is acted
    on, so the refusal above is the directory check's."""
    dest, _other = interrupted(here)
    second = here / ".trtet-staging" / "report.pte"
    second.write_bytes(OLD)
    temp_path(second, T1).write_bytes(NEW)
    outputs = [OutputPlan(dest=os.fspath(p), temp=os.fspath(temp_path(p, T1)), backup=None,
                          size=len(NEW)) for p in (dest, second)]
    path = journal_path(dest, T1)
    path.write_bytes(journal_text(Plan(token=T1, outputs=outputs), DONE))
    (outcome,) = recover(here)
    assert outcome.journal == path and outcome.action != "not ours", outcome
    assert not path.exists()


# --- a store blob read for its sha256 --------------------------------------------------------


def test_a_changed_store_blob_is_refused_though_its_sha256_is_the_signed_one(
        tmp_path: Path) -> None:
    """The set's blob is X (the xxh3-128 of its bytes); the store holds other bytes under
    X's name, with no seal. The signed set's sha256 for X is those other bytes' (as a
    set signed over the changed bytes would say): the read's sha256 matches, but its
    xxh3-128 is not X, so the blob is not X and is refused and removed."""
    blob = b"the set's engine bytes\n" * 100
    wrong = b"other bytes under the blob's name\n" * 70
    x = xxhash.xxh3_128(blob).hexdigest()
    cas = ContentStore(tmp_path / "store")
    cas.path(x).write_bytes(wrong)
    assert not cas.seal_path(x).exists()
    with pytest.raises(SetSignatureError) as err:
        check_blobs(cas, [x], {x: hashlib.sha256(wrong).hexdigest()}, "s3://b/set")
    assert f"blob {x}: its sha256 is None" in str(err.value)
    assert not cas.path(x).exists() and not cas.seal_path(x).exists()

    # the control: the right bytes, unsealed, read once and kept
    cas.path(x).write_bytes(blob)
    check_blobs(cas, [x], {x: hashlib.sha256(blob).hexdigest()}, "s3://b/set")
    assert cas.path(x).read_bytes() == blob


# --- a weights config naming a file the archive lacks ----------------------------------------


@pytest.fixture(scope="module")
def weighted() -> bytes:
    """A real torch.export archive of a module with a weight, in-process."""
    return exported_archive(weighted=True)


@pytest.mark.parametrize("how", ["renamed member", "other path_name"])
def test_a_weight_entry_naming_a_file_the_archive_lacks_is_refused(weighted: bytes,
                                                                    how: str) -> None:
    from trtet_store.export.record_check import record_problem

    assert record_problem(weighted) is None  # the record as torch wrote it
    m = members_of(weighted)
    config_name = "data/weights/model_weights_config.json"
    config = json.loads(m[config_name])
    fqn, meta = sorted(config["config"].items())[0]
    assert meta["path_name"].startswith("weight_")
    held = f"data/weights/{meta['path_name']}"
    assert held in m
    if how == "renamed member":  # the entry stays; the file it names is gone
        m["data/weights/weight_999"] = m.pop(held)
        assert all(e["path_name"] != "weight_999" for e in config["config"].values())
    else:  # the entry names another valid-looking file, which the archive lacks
        meta["path_name"] = "weight_999"
        m[config_name] = json.dumps(config).encode()
    said = record_problem(archive(m))
    assert said == f"its weights entry {fqn!r} is not a raw tensor of the archive", said
