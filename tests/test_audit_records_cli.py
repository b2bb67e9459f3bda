"""Checks a planted-bug audit found no test for: a record naming one member twice, a
program key holding a control character, and the CLI's spelling of an error fail() prints.

Each test sets up the one state its check exists for, with everything else valid (a
record torch wrote, edited only where the check looks; a publish refused only because
the key exists), so that only that check can refuse or translate.
"""

from __future__ import annotations

import io
import json
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
from records_helpers import exported_archive
from test_tier_no_code import archive, members_of

from trtet_store.cli import main


@pytest.fixture(scope="module")
def record() -> bytes:
    """A real torch.export archive (as the package's build records are), in-process."""
    return exported_archive(weighted=False)


# --- an archive naming one member twice -------------------------------------------------------


def test_an_archive_naming_one_member_twice_is_refused(record: bytes) -> None:
    """A zip with two ``models/model.json`` entries: torch's reader (the checker's and
    ``torch.export.load``'s) takes the first, Python's zipfile the last, so the program
    one reader checked is not the one another reads. The second copy calls
    ``builtins.exec``; the first is torch's own. Refused for the duplicate alone."""
    from torch.export.pt2_archive._package import PT2ArchiveReader

    from trtet_store.export.record_check import record_problem

    assert record_problem(record) is None  # the record as torch wrote it is data
    model = json.loads(members_of(record)["models/model.json"])
    model["graph_module"]["graph"]["nodes"][-1]["target"] = "builtins.exec"
    evil = json.dumps(model).encode()
    assert record_problem(archive({**members_of(record), "models/model.json": evil}))

    src = zipfile.ZipFile(io.BytesIO(record))
    (program,) = [i.filename for i in src.infolist() if i.filename.endswith("/models/model.json")]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns "Duplicate name", and writes it
        for info in src.infolist():
            z.writestr(info.filename, src.read(info))
        z.writestr(program, evil)
    hostile = out.getvalue()

    with PT2ArchiveReader(io.BytesIO(hostile)) as r:
        names = r.get_file_names()
        assert names.count("models/model.json") == 2
        seen_by_torch = r.read_bytes("models/model.json")
    seen_by_zipfile = zipfile.ZipFile(io.BytesIO(hostile)).read(program)
    assert seen_by_torch == members_of(record)["models/model.json"]  # the clean copy
    assert seen_by_zipfile == evil  # another reader sees the hostile one
    said = record_problem(hostile)
    assert said == "an archive naming one member twice", said


# --- a program key holding a control character ------------------------------------------------


@pytest.mark.parametrize("key", ["x\rimport os", "\x1b[2Jcleared", "nul\x00"])
def test_a_program_key_with_a_control_character_is_refused(record: bytes, key: str) -> None:
    """A key (not a value) of a node's metadata holds a control character: every value
    stays data, so only the key rule refuses it, naming the key with ``?`` for it."""
    from trtet_store.export.record_check import _CONTROL, record_problem

    base = members_of(record)
    model = json.loads(base["models/model.json"])
    node = model["graph_module"]["graph"]["nodes"][-1]
    node.setdefault("metadata", {})[key] = "1"
    hostile = archive({**base, "models/model.json": json.dumps(model).encode()})
    plain = json.loads(json.dumps(model))
    del plain["graph_module"]["graph"]["nodes"][-1]["metadata"][key]
    plain["graph_module"]["graph"]["nodes"][-1]["metadata"]["plain_key"] = "1"
    assert record_problem(archive({**base, "models/model.json": json.dumps(plain).encode()})) \
        is None  # the same edit with a plain key is data
    said = record_problem(hostile)
    assert said == f"its program has the key {_CONTROL.sub('?', key)!r}", said


# --- the CLI's spelling of an error fail() prints ---------------------------------------------


def test_a_cli_publish_refusal_spells_the_flag(s3env: Any, tmp_path: Path, capsys) -> None:
    """``trtet-store publish`` to a key a bucket writer already filled, without
    ``--replace``: the API says ``pass replace=True (--replace)``; the CLI's line (through
    fail()) says ``pass --replace``. The object is left as the writer put it."""
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"ours")
    s3env.client.put_object(Bucket=s3env.bucket, Key="cli/model.pte", Body=b"theirs")
    url = f"s3://{s3env.bucket}/cli/model.pte"
    assert main(["publish", str(pte), url, "--endpoint-url", s3env.endpoint.url,
                 "--journal-dir", str(s3env.journal_dir), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    line = err.rstrip("\n")
    assert line == (f"trtet-store publish: KeyExistsError: {url} already exist; "
                    "pass --replace to publish a new version"), line
    assert "replace=True" not in line and "if_exists" not in line, line
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="cli/model.pte")["Body"].read()
    assert got == b"theirs"
    keys = [o["Key"] for o in s3env.client.list_objects_v2(Bucket=s3env.bucket)
            .get("Contents", [])]
    assert keys == ["cli/model.pte"], keys
