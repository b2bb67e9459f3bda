"""``trtet-store publish-set`` (``cmd_publish_set`` in cli/sets.py): a ``--member`` given twice
is refused, exit 2, before anything is read or sent.

argparse's ``action="append"`` keeps both ``--member a ...`` occurrences; a dict
of members by name would keep the second and silently leave the first one's
files out of the set. The refusal names the flag; the bucket stays empty
(listed by another boto3 client on SeaweedFS), and the same files under two
names publish both (the refusal is about the name, not the files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write

from trtet_store.cli import main
from trtet_store.sets import SET_KEY


def _keys(s3env: Any) -> list[str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket).get("Contents", [])
    return sorted(o["Key"] for o in listed)


def test_publish_set_refuses_a_member_given_twice_and_sends_nothing(
        s3env: Any, here_fs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"s3://{s3env.bucket}/rel/v1/"
    first = write(here_fs / "one" / "model.pte", 5000, 1)
    ptd = write(here_fs / "one" / "weights.ptd", 6000, 2)
    second = write(here_fs / "two" / "model.pte", 5001, 3)
    common = ["--endpoint-url", s3env.endpoint.url, "--no-progress",
              "--journal-dir", str(s3env.journal_dir)]
    rc = main(["publish-set", url, "--member", "a", str(first), str(ptd),
               "--member", "a", str(second), "--needs", "a", "cc=8.9", *common])
    err = capsys.readouterr().err
    assert rc == 2, f"publish-set took --member a twice (rc {rc}): {err}"
    assert "--member a given twice" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert _keys(s3env) == [], "something was sent for a refused publish-set"
    # Two names, the same files: both members published.
    assert main(["publish-set", url, "--member", "a", str(first), str(ptd),
                 "--member", "b", str(second), *common]) == 0
    capsys.readouterr()
    assert f"rel/v1/{SET_KEY}" in _keys(s3env)
