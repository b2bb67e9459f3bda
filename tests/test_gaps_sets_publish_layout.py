"""A renewed blob's layout: a part count no ETag to avoid has, so a pinned delete is refused.

A clean-up or prune deletes a blob with ``If-Match`` of the ETag it read;
a publish that names the blob again renews it with another ETag. The same
bytes in the same parts give the same ETag, so the renewal picks a part
size whose multipart count (``...-<count>``) none of the avoided ETags
ends with, or None: one PutObject (an ETag without ``-``). Each case below
is a size at a part boundary, where a count off by one repeats the
avoided ETag.
"""

from __future__ import annotations

import pytest

from trtet_store.sets.publish import _layout_avoiding

MiB = 1 << 20


def _count(size: int, part: int) -> int:
    return max(1, -(-size // part))


def _counts(avoid: set[str]) -> set[int]:
    return {int(e.rpartition("-")[2]) for e in avoid}


@pytest.mark.parametrize("size", [3 * MiB, 5 * MiB, 5 * MiB + 1, 8 * MiB, 8 * MiB + 1,
                                  12 * MiB, 100 * MiB])
def test_the_part_count_chosen_is_none_the_avoided_etags_have(size: int) -> None:
    first = _layout_avoiding(size, set())
    assert first is not None
    avoid = {f"0123456789abcdef0123456789abcdef-{_count(size, first)}"}
    second = _layout_avoiding(size, avoid)
    if second is not None:
        assert _count(size, second) not in _counts(avoid), (size, first, second)
        avoid.add(f"fedcba9876543210fedcba9876543210-{_count(size, second)}")
        third = _layout_avoiding(size, avoid)
        assert third is None or _count(size, third) not in _counts(avoid), (size, third)


def test_a_blob_of_one_part_whose_one_part_etag_is_avoided_goes_up_by_putobject() -> None:
    assert _layout_avoiding(3 * MiB, {"abc-1"}) is None
    assert _layout_avoiding(5 * MiB + 1, {"abc-1"}) == 5 * MiB  # two parts of 5 MiB
    assert _count(5 * MiB + 1, 5 * MiB) == 2


def test_an_etag_without_a_part_count_avoids_no_layout() -> None:
    """A PutObject's ETag (no ``-``), or a dash without digits after it, says no count."""
    default = _layout_avoiding(12 * MiB, set())
    for etag in ("d41d8cd98f00b204e9800998ecf8427e", "abc-", "abc-x2", "-2"):
        assert _layout_avoiding(12 * MiB, {etag}) == default, etag
    assert _layout_avoiding(12 * MiB, {f"abc-{_count(12 * MiB, default)}"}) != default
