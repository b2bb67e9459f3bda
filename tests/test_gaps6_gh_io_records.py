"""export/record_check.py record_problem: a member whose name only begins like a payload's
(a gap hunt: no test planted one). An archive_format other than pt2 is refused by
torch's own reader first ("not a torch.export archive").
"""

from __future__ import annotations

import pytest
from records_helpers import exported_archive
from test_tier_no_code import archive, members_of

from trtet_store.export.record_check import record_problem


@pytest.fixture(scope="module")
def weighted() -> bytes:
    return exported_archive(weighted=True)


@pytest.mark.parametrize("name", ["data/weights/weight_0.pkl", "data/constants/tensor_1/x.pt"])
def test_a_member_named_like_a_payload_only_at_its_start_is_refused(weighted, name) -> None:
    """record_check.py: ``_PAYLOAD.fullmatch(n)`` (a prefix match would take
    ``weight_0.pkl`` for a raw payload)."""
    assert record_problem(weighted) is None
    got = record_problem(archive({**members_of(weighted), name: b"x"}))
    assert got == f"it holds {name!r}, which a build record never has", got

