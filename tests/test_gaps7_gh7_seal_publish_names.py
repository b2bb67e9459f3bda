"""publish_set holds every member's file names to the closed set (check_member_files)
before a byte of any member is read or a request sent past the bucket check: a member
whose program is a dotfile is refused with nothing digested and nothing in the bucket,
even when another member listed before it is fine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write

from trtet_store.io import bytes_digested
from trtet_store.remote.errors import FileNameError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set


def test_a_bad_name_is_refused_before_any_member_is_read(s3env: Any, tmp_path: Path) -> None:
    good = write(tmp_path / "a" / "model.pte", 3 * 1024 * 1024, 1)
    bad = write(tmp_path / "b" / ".bashrc", 4096, 2)
    digested = bytes_digested()
    with pytest.raises(FileNameError) as caught:
        publish_set({"a": [good], "b": [bad]}, f"s3://{s3env.bucket}/rel/",
                    endpoint_url=s3env.endpoint.url,
                    config=PublishConfig(journal_dir=s3env.journal_dir))
    assert "'.bashrc'" in str(caught.value) and "member 'b'" in str(caught.value)
    assert bytes_digested() == digested  # nothing read, not even member a
    assert s3env.client.list_objects_v2(Bucket=s3env.bucket).get("KeyCount", 0) == 0
