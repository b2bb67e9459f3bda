"""cli/recover.py ``cmd_recover`` / ``_parts``: with ``--json`` stdout is the JSON alone.

``trtet-store recover DIR --json`` prints the recovery outcomes as JSON on stdout; the
lines that name a killed run's half-written ``.part`` (and, with ``--discard-parts``,
what was removed) go to stderr, so ``recover --json | jq`` keeps working beside a
killed build. The part is a real killed child's (tests/test_recover_parts.py's
``_killed_run``); a running store's part stays untouched.
"""

from __future__ import annotations

import json

from test_recover_parts import _killed_run

from trtet_store.cli import main


def test_cmd_recover_json_keeps_the_parts_lines_off_stdout(tmp_path, capsys) -> None:
    from trtet_store.io import BlobStore

    out = tmp_path / "out"
    staging = out / ".trtet-staging"
    running = BlobStore(staging)
    live = running.directory / f"{running.token}-cachedef.blob.part"
    live.write_bytes(b"y" * 4096)
    part = _killed_run(staging)
    try:
        capsys.readouterr()
        assert main(["recover", str(out), "--json"]) == 0
        said = capsys.readouterr()
        assert json.loads(said.out) == []  # the JSON alone
        assert f"{part}: 384.0 MiB half-written by a killed run" in said.err
        assert "--discard-parts" in said.err
        assert part.exists()

        assert main(["recover", str(out), "--json", "--discard-parts"]) == 0
        said = capsys.readouterr()
        assert json.loads(said.out) == []
        assert "1 half-written file(s) of killed runs removed (384.0 MiB)" in said.err
        assert not part.exists() and live.read_bytes() == b"y" * 4096
    finally:
        running.close()


def test_cmd_recover_json_keeps_the_set_stores_download_lines_off_stdout(s3env, here_fs):
    """_store_fetches: with --json, the killed fetch-set's download in the set store beside
    DIR is named (and, with --discard-fetches, discarded) on stderr; stdout is the JSON."""
    from sets_helpers import write, xxh
    from test_recover_set_store import OWN, SHARED, recover_cli
    from test_sets_kill import run_child

    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.sets import publish_set

    url = f"s3://{s3env.bucket}/relj/"
    shared = write(here_fs / "src" / "foundation.ptd", SHARED, 3)
    pte = write(here_fs / "src" / "a" / "model.pte", OWN, 4)
    publish_set({"a": [pte, shared]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    machine = here_fs / "machine"
    machine.mkdir()
    dest = machine / "a"
    child = run_child({"op": "fetch", "phase": "download", "url": url, "member": "a",
                       "dest": str(dest), "endpoint": s3env.endpoint.url, "after": 4})
    assert child.stdout.strip() == "killed", child.stderr[-2000:]
    done = recover_cli(dest, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert "interrupted download of a killed fetch-set in the set store" in done.stderr
    assert xxh(shared) in done.stderr
    done = recover_cli(dest, "--json", "--discard-fetches")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert "discarded the set store's download of blob" in done.stderr
