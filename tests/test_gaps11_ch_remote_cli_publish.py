"""cli/publish.py ``cmd_publish`` / ``_abort`` / ``_list``: misused modes are refused first.

``publish --abort`` and ``publish --list`` take only the URL: given files too
(``publish --abort model.pte s3://B/K``, a publish line with --abort added) it is a
one-line error before any request, and the open multipart upload at the key is still
there (an abort would give up someone's interrupted upload). ``--resume`` with
nothing to resume says so and sends nothing. Real SeaweedFS.
"""

from __future__ import annotations

from trtet_store.cli import main


def _uploads(s3env) -> list[tuple[str, str]]:
    got = s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", [])
    return [(u["Key"], u["UploadId"]) for u in got]


def test_cmd_publish_abort_or_list_with_files_is_refused_and_aborts_nothing(
        s3env, tmp_path, capsys) -> None:
    key = "ab/model.pte"
    url = f"s3://{s3env.bucket}/{key}"
    upload = s3env.client.create_multipart_upload(Bucket=s3env.bucket, Key=key)["UploadId"]
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"x" * 1000)
    common = ["--endpoint-url", s3env.endpoint.url, "--no-progress", "--journal-dir",
              str(s3env.journal_dir)]
    try:
        capsys.readouterr()
        assert main(["publish", "--abort", str(pte), url, *common]) == 1
        assert "--abort takes only s3://BUCKET/KEY" in capsys.readouterr().err
        assert main(["publish", "--list", str(pte), url, *common]) == 1
        assert "--list takes only s3://BUCKET[/PREFIX]" in capsys.readouterr().err
        assert _uploads(s3env) == [(key, upload)]  # not aborted

        assert main(["publish", "--resume", str(pte), url, *common]) == 1
        assert f"--resume: no interrupted publish of {url} to resume" in \
            capsys.readouterr().err
        assert _uploads(s3env) == [(key, upload)]
        assert s3env.client.list_objects_v2(Bucket=s3env.bucket).get("Contents", []) == []

        # The URL alone: --abort gives it up (the refusal above was the files, not --abort).
        assert main(["publish", "--abort", url, *common]) == 0
        assert _uploads(s3env) == []
    finally:
        if _uploads(s3env):
            s3env.client.abort_multipart_upload(Bucket=s3env.bucket, Key=key, UploadId=upload)
