"""cli/recover.py _store_fetches: ``os.path.lexists(store / STAGING_DIR)``: a dangling link
planted at the set store's staging directory is said, not passed over as "no staging
directory" (a gap hunt: the store's tests planted a link to a directory, which a check
that follows links also sees).
"""

from __future__ import annotations

import os

from attacker import NOBODY, as_nobody
from test_recover_set_store_unsafe import check_left_alone, members
from test_recover_set_store_unsafe import top as top  # the fixture  # noqa: PLC0414

from trtet_store.io import STAGING_DIR
from trtet_store.sets.store import STORE_DIR


def test_a_dangling_link_at_the_store_s_staging_directory_is_said(top, capsys):
    dest = members(top)
    store = dest.parent / STORE_DIR
    store.mkdir(mode=0o755)
    os.chmod(store, 0o777)
    as_nobody(lambda: os.symlink("/nonexistent/staging", store / STAGING_DIR))
    os.chmod(store, 0o755)
    assert (store / STAGING_DIR).lstat().st_uid == NOBODY
    check_left_alone(capsys, dest, store, "link")
    assert os.readlink(store / STAGING_DIR) == "/nonexistent/staging"
