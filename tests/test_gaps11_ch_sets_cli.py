"""``trtet-store publish-set --dry-run --gc-grace HOURS`` (cli/sets.py, sets/publish.py's dry run):
the dry run's prune plan uses the grace given, in hours, as the real run does.

A blob no manifest names, uploaded a moment ago by another client (boto3 on SeaweedFS:
a concurrent publisher's upload, not committed yet), is younger than any grace above a
few seconds: the plan keeps it and says why ("younger than 3600 s" for ``--gc-grace 1``,
86400 s by default); nothing is listed to prune, and the bucket is unchanged (listing and
ETags). ``--gc-grace 0`` lists it to prune (it is prunable: only the grace keeps it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sets_helpers import write, xxh

from trtet_store.cli import main


def _listing(s3: Any) -> dict[str, str]:
    got = s3.client.list_objects_v2(Bucket=s3.bucket)
    return {o["Key"]: o["ETag"] for o in got.get("Contents", [])}


def test_publish_set_dry_run_plans_the_prune_with_the_grace_given(
        s3env: Any, tmp_path: Path, capsys: Any) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    pte = write(tmp_path / "src" / "model.pte", 5000, 1)
    argv = ["publish-set", url, "--member", "a", os.fspath(pte), "--journal-dir",
            os.fspath(s3env.journal_dir), "--endpoint-url", s3env.endpoint.url,
            "--no-progress"]
    assert main(argv) == 0
    theirs = write(tmp_path / "theirs.bin", 3000, 7)
    name = xxh(theirs)
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"rel/blobs/{name}",
                            Body=theirs.read_bytes())
    capsys.readouterr()
    before = _listing(s3env)

    for flags, seconds in ((["--gc-grace", "1"], 3600), ([], 86400)):
        assert main([*argv, "--replace", "--dry-run", *flags]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].endswith("would remove 0 blob(s) no member names any more, prune 0 "
                               "no manifest names"), out
        assert f"  kept blobs/{name}: younger than {seconds} s" in out, out
        assert _listing(s3env) == before

    assert main([*argv, "--replace", "--dry-run", "--gc-grace", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"  blobs/{name}: would be pruned" in out, out
    assert _listing(s3env) == before


def test_publish_set_needs_reach_each_member_s_metadata(s3env: Any, tmp_path: Path,
                                                        capsys: Any) -> None:
    """``--needs NAME KEY=VALUE,...`` (cli/sets.py ``_needs``): every key reaches the member it
    names, in the committed set manifest's metadata: ``version_compatible=false`` is false
    (left out), ``true`` true; ``cc`` is compute_capability; keys take ``-`` for ``_`` and
    spaces around. A value that is not true/false is refused (2) before any request."""
    import json

    url = f"s3://{s3env.bucket}/rel/"
    a = write(tmp_path / "a" / "model.pte", 3000, 1)
    b = write(tmp_path / "b" / "model.pte", 3001, 2)
    base = ["publish-set", url, "--member", "a", os.fspath(a), "--member", "b", os.fspath(b),
            "--journal-dir", os.fspath(s3env.journal_dir), "--endpoint-url",
            s3env.endpoint.url, "--no-progress"]
    assert main([*base, "--needs", "a", "version_compatible=yes,cc=8.9"]) == 2
    err = capsys.readouterr().err
    assert "version_compatible is true or false" in err and len(err.splitlines()) == 1, err
    assert _listing(s3env) == {}

    assert main([*base, "--needs", "a", "cc=8.9, tensorrt=10.3.0,version_compatible=False",
                 "--needs", "b", "compute-capability=8.0,tensorrt=10.3.0,executorch=1.5.1,"
                 "version-compatible=TRUE,hardware_compatibility=ampere_plus"]) == 0
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                             Key="rel/trtet-set.json")["Body"].read())
    assert doc["members"]["a"]["metadata"] == {"compute_capability": "8.9",
                                               "tensorrt": "10.3.0"}
    assert doc["members"]["b"]["metadata"] == {
        "compute_capability": "8.0", "tensorrt": "10.3.0", "executorch": "1.5.1",
        "version_compatible": True, "hardware_compatibility": "ampere_plus"}


def test_fetch_set_interrupted_says_the_same_fetch_set_to_run_again(
        s3env: Any, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """``trtet-store fetch-set`` stopped by Ctrl-C (cli/sets.py ``cmd_fetch_set``) exits 130
    with one line naming the very fetch-set to run again (``fetch_set_command``: --member,
    --store, --link, --endpoint-url as given); that command, run, finishes the member and
    downloads only the blob the store still lacks."""
    import shlex

    import trtet_store.sets.store as store_mod

    url = f"s3://{s3env.bucket}/rel/"
    pte = write(tmp_path / "src" / "a" / "model.pte", 70_000, 1)
    ptd = write(tmp_path / "src" / "a" / "weights.ptd", 90_000, 2)
    assert main(["publish-set", url, "--member", "a", os.fspath(pte), os.fspath(ptd),
                 "--journal-dir", os.fspath(s3env.journal_dir), "--endpoint-url",
                 s3env.endpoint.url, "--no-progress"]) == 0
    out, store = tmp_path / "out", tmp_path / "blobs"
    real = store_mod.ContentStore.download
    calls = []

    def download(self: Any, *args: Any, **kwargs: Any) -> int:
        calls.append(args[3])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(store_mod.ContentStore, "download", download)
    capsys.readouterr()
    argv = ["fetch-set", url, os.fspath(out), "--member", "a", "--store", os.fspath(store),
            "--link", "--endpoint-url", s3env.endpoint.url, "--no-progress"]
    assert main(argv) == 130
    err = capsys.readouterr().err.splitlines()
    again = shlex.join(["trtet-store", "fetch-set", url, os.fspath(out), "--member", "a",
                        "--store", os.fspath(store), "--link", "--endpoint-url",
                        s3env.endpoint.url])
    assert err == [f"trtet-store fetch-set: interrupted; what was downloaded is kept: run "
                   f"`{again}` to continue"], err
    monkeypatch.setattr(store_mod.ContentStore, "download", real)
    assert main([*shlex.split(again)[1:], "--json"]) == 0
    import json
    report = json.loads(capsys.readouterr().out)
    assert report["bytes_downloaded"] == 90_000, report  # only the blob still missing
    assert (out / "model.pte").read_bytes() == pte.read_bytes()
    assert (out / "weights.ptd").read_bytes() == ptd.read_bytes()


def test_publish_set_journal_dir_is_where_the_blob_journals_go(
        s3env: Any, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """``publish-set --journal-dir DIR`` reaches each blob's upload (``PublishConfig``): the
    resumable journals are made there, and nothing under the default
    (``$XDG_STATE_HOME/trtet_store/publish``)."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", os.fspath(state))
    journals = tmp_path / "journals"
    url = f"s3://{s3env.bucket}/rel/"
    pte = write(tmp_path / "src" / "model.pte", 6 * 1024 * 1024 + 5, 1)  # two parts
    assert main(["publish-set", url, "--member", "a", os.fspath(pte), "--journal-dir",
                 os.fspath(journals), "--endpoint-url", s3env.endpoint.url,
                 "--no-progress"]) == 0
    assert journals.is_dir(), "the journal directory given was never used"
    assert not state.exists() or not any(state.rglob("*")), sorted(state.rglob("*"))


def test_fetch_set_store_and_link_reach_the_fetch(s3env: Any, tmp_path: Path,
                                                  capsys: Any) -> None:
    """``fetch-set --store DIR --link`` (cli/sets.py ``cmd_fetch_set``): the blobs go into
    the store given (none beside the destination, the default), and the member's files
    are hard links to them (one inode, read-only 0444)."""
    import stat

    url = f"s3://{s3env.bucket}/rel/"
    pte = write(tmp_path / "src" / "model.pte", 7000, 1)
    ptd = write(tmp_path / "src" / "w.ptd", 9000, 2)
    assert main(["publish-set", url, "--member", "a", os.fspath(pte), os.fspath(ptd),
                 "--journal-dir", os.fspath(s3env.journal_dir), "--endpoint-url",
                 s3env.endpoint.url, "--no-progress"]) == 0
    machine = tmp_path / "machine"
    machine.mkdir()
    out, store = machine / "out", machine / "my-store"
    assert main(["fetch-set", url, os.fspath(out), "--member", "a", "--store",
                 os.fspath(store), "--link", "--endpoint-url", s3env.endpoint.url,
                 "--no-progress"]) == 0
    assert sorted(os.listdir(machine)) == ["my-store", "out"]  # no .trtet-blobs beside
    for placed, src in ((out / "model.pte", pte), (out / "w.ptd", ptd)):
        st = os.lstat(placed)
        blob = store / xxh(src)
        assert placed.read_bytes() == src.read_bytes()
        assert (st.st_dev, st.st_ino) == (os.lstat(blob).st_dev, os.lstat(blob).st_ino)
        assert stat.S_IMODE(st.st_mode) == 0o444 and st.st_nlink == 2


def test_publish_set_gc_grace_nan_inf_and_negative_are_usage_errors(
        s3env: Any, tmp_path: Path, capsys: Any) -> None:
    """``--gc-grace`` (hours) NaN, -NaN, inf, -0.5: refused as a usage error (2), one line
    naming the flag in hours, before any request (the bucket stays empty); ``-0`` is 0."""
    url = f"s3://{s3env.bucket}/rel/"
    pte = write(tmp_path / "src" / "model.pte", 3000, 1)
    argv = ["publish-set", url, "--member", "a", os.fspath(pte), "--journal-dir",
            os.fspath(s3env.journal_dir), "--endpoint-url", s3env.endpoint.url,
            "--no-progress"]
    for bad in ("nan", "-nan", "inf", "-0.5"):
        assert main([*argv, f"--gc-grace={bad}"]) == 2, bad
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "--gc-grace must be a number of hours >= 0" in err[0], err
        assert _listing(s3env) == {}
    assert main([*argv, "--gc-grace=-0"]) == 0
    assert "rel/trtet-set.json" in _listing(s3env)


def test_fetch_set_compute_capability_and_tensorrt_win_over_the_detected_machine(
        s3env: Any, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """``fetch-set --compute-capability X.Y`` / ``--tensorrt V`` (cli/sets.py
    ``cmd_fetch_set``) say what the machine is instead of asking it: each flag given wins
    over ``Machine.detect`` (here a GPU of 9.0 with TensorRT 10.3.0), the other fact is
    the detected one; without a flag the detected machine picks."""
    import json

    from trtet_store.sets.machine import Machine

    url = f"s3://{s3env.bucket}/rel/"
    members = {n: write(tmp_path / "src" / n / "model.pte", 3000 + i, i)
               for i, n in enumerate(("sm89", "sm90", "sm90-trt11"))}
    argv = ["publish-set", url, "--journal-dir", os.fspath(s3env.journal_dir),
            "--endpoint-url", s3env.endpoint.url, "--no-progress",
            "--needs", "sm89", "cc=8.9,tensorrt=10.3.0", "--needs", "sm90",
            "cc=9.0,tensorrt=10.3.0", "--needs", "sm90-trt11", "cc=9.0,tensorrt=11.0.0"]
    for name, pte in members.items():
        argv += ["--member", name, os.fspath(pte)]
    assert main(argv) == 0
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: Machine("9.0", "10.3.0")))
    capsys.readouterr()
    for flags, want in (([], "sm90"), (["--compute-capability", "8.9"], "sm89"),
                        (["--tensorrt", "11.0.0"], "sm90-trt11")):
        out = tmp_path / f"out-{want}"
        assert main(["fetch-set", url, os.fspath(out), *flags, "--endpoint-url",
                     s3env.endpoint.url, "--no-progress", "--json"]) == 0, flags
        report = json.loads(capsys.readouterr().out)
        assert report["member"] == want and report["picked"], (flags, report["member"])
        assert (out / "model.pte").read_bytes() == members[want].read_bytes()
