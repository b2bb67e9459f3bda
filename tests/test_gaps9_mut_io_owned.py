"""io/owned.py open_ours / ours_problem with no size cap (``limit=None``, the default).

``if limit is not None and st.st_size > limit``: a caller that caps nothing (it reads
the descriptor its own way) still gets the owner and kind checks, and a file of any size
of ours opens; another user's is refused as before.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from attacker import NOBODY

from trtet_store.io import NotOursError, open_ours, ours_problem


def test_no_limit_checks_owner_and_kind_but_no_size(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB, sparse
    with open_ours(big) as fd:
        assert os.fstat(fd).st_size == 3 << 30
    assert ours_problem(os.stat(big)) is None
    os.chown(big, NOBODY, NOBODY)
    with pytest.raises(NotOursError, match=f"owned by uid {NOBODY}"), open_ours(big):
        pass
    assert os.stat(big).st_size == 3 << 30 and os.stat(big).st_uid == NOBODY
