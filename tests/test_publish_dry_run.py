"""``trtet-store publish-set --dry-run`` and ``publish --replace --dry-run`` print the
sweeps' plan and send, commit and delete nothing, on the real S3 server.

A set is published, then replaced by one whose member ``b`` has other bytes, with a
killed publish's blob left under ``blobs/`` (no manifest names it) and ``--gc-grace 0``:
the dry run names the replaced blob the clean-up removes and the orphan the prune
removes, and keeps the blobs the new set names, saying why; the bucket's listing, each
key with its ETag, is the same after; the real run then removes exactly those. A
program's ``--replace`` that drops one of its ``.ptd`` files: the same, for the
replaced version's objects.
"""

from __future__ import annotations

import json
import os

import xxhash

from trtet_store.cli import main


def _listing(s3env) -> dict[str, str]:
    pages = s3env.client.get_paginator("list_objects_v2").paginate(Bucket=s3env.bucket)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def test_a_publish_set_dry_run_prints_the_plan_and_changes_nothing(s3env, tmp_path,
                                                                   capsys) -> None:
    src = tmp_path / "src"
    for d in ("a", "b", "b2"):
        (src / d).mkdir(parents=True)
    a, cpu, b, b2 = (os.urandom(70_000 + i) for i in range(4))
    (src / "a" / "model.pte").write_bytes(a)
    (src / "cpu.ptd").write_bytes(cpu)
    (src / "b" / "model.pte").write_bytes(b)
    (src / "b2" / "model.pte").write_bytes(b2)
    url = f"s3://{s3env.bucket}/rel/"
    common = ["--endpoint-url", s3env.endpoint.url, "--no-progress", "--journal-dir",
              str(s3env.journal_dir)]

    def argv(b_dir: str) -> list[str]:
        return ["publish-set", url, "--member", "a", str(src / "a" / "model.pte"),
                str(src / "cpu.ptd"), "--member", "b", str(src / b_dir / "model.pte"),
                *common]

    assert main(argv("b")) == 0
    orphan = xxhash.xxh3_128(b"a killed publish's blob").hexdigest()
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"rel/blobs/{orphan}",
                            Body=b"a killed publish's blob")
    capsys.readouterr()
    before = _listing(s3env)
    digest = {k: xxhash.xxh3_128(v).hexdigest() for k, v in
              (("a", a), ("cpu", cpu), ("b", b), ("b2", b2))}
    assert f"rel/blobs/{digest['b']}" in before and f"rel/blobs/{orphan}" in before

    again = [*argv("b2"), "--replace", "--gc-grace", "0"]
    assert main([*again, "--dry-run"]) == 0
    plan = capsys.readouterr().out.splitlines()
    assert _listing(s3env) == before  # nothing sent, committed, deleted or rewritten
    assert plan[0] == (f"{url}: dry run, nothing sent, committed or deleted: would remove 1 "
                       "blob(s) no member names any more, prune 1 no manifest names")
    assert plan[1:3] == [f"  blobs/{digest['b']}: would be removed",
                         f"  blobs/{orphan}: would be pruned"]
    assert plan[3:] == sorted(f"  kept blobs/{digest[k]}: named by the set"
                              for k in ("a", "cpu"))

    assert main([*again, "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and dry["manifest_etag"] == "" and dry["bytes_uploaded"] == 0
    assert _listing(s3env) == before

    assert main([*again, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert not done["dry_run"]
    assert (done["removed"], done["pruned"]) == (dry["removed"], dry["pruned"])
    after = _listing(s3env)
    gone = {k for k in before if k.startswith(("rel/blobs/" + digest["b"],
                                               "rel/blobs/" + orphan))}
    assert gone and not gone & set(after), after
    for k in ("a", "cpu"):  # what the plan kept is kept, the same version
        key = f"rel/blobs/{digest[k]}"
        assert after[key] == before[key]


def test_a_publish_replace_dry_run_prints_the_plan_and_changes_nothing(s3env, tmp_path,
                                                                       capsys) -> None:
    pte, a, b = (tmp_path / n for n in ("model.pte", "a.ptd", "b.ptd"))
    for i, f in enumerate((pte, a, b)):
        f.write_bytes(os.urandom(50_000 + i))
    url = f"s3://{s3env.bucket}/prog/model.pte"
    common = ["--endpoint-url", s3env.endpoint.url, "--no-progress", "--journal-dir",
              str(s3env.journal_dir)]
    assert main(["publish", str(pte), str(a), str(b), url, *common]) == 0
    pte.write_bytes(os.urandom(50_000))  # the new version: another program, no b.ptd
    capsys.readouterr()
    before = _listing(s3env)
    assert "prog/b.ptd" in before

    again = ["publish", str(pte), str(a), url, "--replace", *common]
    assert main([*again, "--dry-run"]) == 0
    plan = capsys.readouterr().out.splitlines()
    assert _listing(s3env) == before  # nothing sent, committed, deleted or rewritten
    assert plan == [f"{url}: dry run, nothing sent or deleted: would remove 1 object(s) of "
                    "the replaced version that the new one does not name",
                    f"  s3://{s3env.bucket}/prog/b.ptd: would be removed"]
    assert main([*again, "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["removed"] == ["prog/b.ptd"] and _listing(s3env) == before
    assert main(["publish", str(pte), str(a), url, "--dry-run", *common]) == 2  # no --replace
    assert _listing(s3env) == before

    assert main(again) == 0
    after = _listing(s3env)
    assert set(before) - set(after) == set(dry["removed"]), after
    assert after["prog/a.ptd"] == before["prog/a.ptd"]  # the same bytes: kept as it was


def test_a_dry_run_with_abort_list_or_resume_is_refused_and_aborts_nothing(s3env, tmp_path,
                                                                             capsys) -> None:
    """``publish --abort URL --dry-run`` once aborted the upload for real: the pair is a
    usage error now, refused before any request, the open upload still there."""
    key = "p/model.pte"
    url = f"s3://{s3env.bucket}/{key}"
    upload = s3env.client.create_multipart_upload(Bucket=s3env.bucket, Key=key)["UploadId"]
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"x" * 1000)
    common = ["--endpoint-url", s3env.endpoint.url, "--no-progress", "--journal-dir",
              str(s3env.journal_dir), "--dry-run"]
    capsys.readouterr()
    for argv in (["publish", "--abort", url], ["publish", "--list", f"s3://{s3env.bucket}/"],
                 ["publish", "--resume", str(pte), url]):
        assert main([*argv, *common]) == 2, argv
        assert "does not go with --list, --abort or --resume" in capsys.readouterr().err
    uploads = s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [(key, upload)]
    assert _listing(s3env) == {}
    s3env.client.abort_multipart_upload(Bucket=s3env.bucket, Key=key, UploadId=upload)
