"""``trtet-store publish-set`` and ``fetch-set`` against the real SeaweedFS server."""

from __future__ import annotations

import json
import os

from trtet_store.cli import main
from trtet_store.io.units import MiB


def test_publish_set_and_fetch_set_say_what_was_shared(s3env, here_fs, capsys):
    src = here_fs / "src"
    for d in ("sm80", "sm89"):
        (src / d).mkdir(parents=True)
        (src / d / "model.pte").write_bytes(os.urandom(MiB + 7))
    (src / "cpu.ptd").write_bytes(os.urandom(3 * MiB))
    url = f"s3://{s3env.bucket}/rel/v1/"
    common = ["--endpoint-url", s3env.endpoint.url, "--no-progress"]
    argv = ["publish-set", url, "--member", "sm80", str(src / "sm80" / "model.pte"),
            str(src / "cpu.ptd"), "--member", "sm89", str(src / "sm89" / "model.pte"),
            str(src / "cpu.ptd"), "--needs", "sm80", "cc=8.0,tensorrt=10.3.0",
            "--needs", "sm89", "cc=8.9,tensorrt=10.3.0", "--journal-dir",
            str(s3env.journal_dir), *common]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 member(s), 8.0 MiB of files in 5.0 MiB distinct" in out, out
    assert "  sm89: model.pte, cpu.ptd" in out
    # Again, with --replace and --json: everything present, nothing sent.
    assert main([*argv, "--replace", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bytes_uploaded"] == 0 and report["bytes_present"] == 5 * MiB + 14
    assert main(argv) == 1
    assert "KeyExistsError" in capsys.readouterr().err

    out_dir = here_fs / "deploy"
    assert main(["fetch-set", url, str(out_dir), "--compute-capability", "8.9",
                 "--tensorrt", "10.3.0", *common]) == 0
    line = capsys.readouterr().out
    assert "member sm89 (picked for this machine)" in line and "downloaded 4.0 MiB" in line
    assert "by move" in line, line  # ext4: the downloaded blobs moved into place
    assert (out_dir / "model.pte").read_bytes() == (src / "sm89" / "model.pte").read_bytes()
    # No member for this machine: one line listing them, nothing created.
    assert main(["fetch-set", url, str(here_fs / "none"), "--compute-capability", "7.5",
                 "--tensorrt", "10.3.0", *common]) == 1
    err = capsys.readouterr().err
    assert err.startswith("trtet-store fetch-set: NoMemberFitsError") or "no member fits" in err
    assert "sm80: needs a GPU of compute capability 8.0" in err and "--member" in err
    assert not (here_fs / "none").exists()
    # --member wins, and --json says how each byte got there.
    assert main(["fetch-set", url, str(here_fs / "b"), "--member", "sm80", "--json",
                 *common]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["member"] == "sm80" and report["bytes_in_store"] == 3 * MiB
    assert report["bytes_downloaded"] == MiB + 7
    assert sum(report["placed"].values()) == 4 * MiB + 7
    # ext4: the shared blobs copied from the first fetch's files (references), then moved in
    assert set(report["placed"]) == {"move"}
    assert main(["fetch-set", url, str(here_fs / "c"), "--member", "sm75", *common]) == 1
    assert "no member 'sm75'" in capsys.readouterr().err


def test_bad_set_arguments_are_one_line_and_exit_2(s3env, here_fs, capsys):
    url = f"s3://{s3env.bucket}/rel/v1/"
    pte = here_fs / "model.pte"
    pte.write_bytes(b"x" * 100)
    assert main(["publish-set", url, "--member", "a", str(pte), "--needs", "b", "cc=8.9",
                 "--endpoint-url", s3env.endpoint.url]) == 2
    assert "--needs b: no --member b" in capsys.readouterr().err
    assert main(["publish-set", url, "--member", "a", str(pte), "--needs", "a", "gpu=8.9",
                 "--endpoint-url", s3env.endpoint.url]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main(["publish-set", url, "--member", "a", "--endpoint-url",
                 s3env.endpoint.url]) == 2
    assert "give its .pte" in capsys.readouterr().err
    assert main(["fetch-set", url, str(here_fs / "d"), "--compute-capability", "sm89"]) == 2
    assert "must be like '8.9'" in capsys.readouterr().err
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket).get("Contents", [])
    assert listed == []
