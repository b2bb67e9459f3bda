"""cli/cache.py _keys_as_listed: ``cache pull``'s keys, whole or as a prefix of one entry.

The listing is a remote tier's (``listing()`` -> entries, damaged; ``url``); here a
stand-in tier that records whether it was listed, since the rule is over its keys only:

- every key whole (a 32-digit digest in it): taken as given, the bucket never listed;
- a prefix (or the 8-digit short form ``cache list --remote`` shows) naming one entry:
  that entry's whole key;
- a prefix naming several: refused, naming at most 8 of them (", ..." past 8);
- a key that is itself an entry's whole key is that entry, though longer keys start
  with it.
"""

from __future__ import annotations

import types

import pytest

from trtet_store.cli.cache import _keys_as_listed

H = "0123456789abcdef0123"  # 20 hex digits: a key that is not "whole" by the 32-digit rule


class Tier:
    url = "s3://bucket/cache"

    def __init__(self, keys: list[str]) -> None:
        self.keys, self.listed = keys, 0

    def listing(self):
        self.listed += 1
        return [types.SimpleNamespace(key=k) for k in self.keys], []


def test_whole_keys_are_taken_as_given_and_the_bucket_is_not_listed() -> None:
    whole = "trtet-" + "ab" * 16 + "-sm_90"
    tier = Tier([whole + ".e0", whole + ".e1"])  # both start with the given key
    assert _keys_as_listed(tier, [whole]) == [whole]
    assert tier.listed == 0


def test_a_prefix_naming_one_entry_is_that_entry() -> None:
    one, other = f"trtet-{H}-sm_90", "trtet-fedcba98765432100000-sm_90"
    tier = Tier([one, other])
    assert _keys_as_listed(tier, ["trtet-0123"]) == [one]
    assert _keys_as_listed(tier, [f"trtet-{H[:8]}-sm_90"]) == [one]  # the short form
    assert _keys_as_listed(tier, ["no-such-key"]) == ["no-such-key"]  # left to pull
    assert tier.listed == 3


def test_an_entrys_own_key_is_that_entry_though_longer_keys_start_with_it() -> None:
    base = f"trtet-{H}-sm_90"
    tier = Tier([base, base + ".e1"])
    assert _keys_as_listed(tier, [base]) == [base]


@pytest.mark.parametrize("n", [2, 8, 9])
def test_an_ambiguous_prefix_is_refused_naming_at_most_eight(n: int) -> None:
    keys = [f"trtet-{H}{i:x}-sm_90" for i in range(n)]
    with pytest.raises(ValueError) as got:
        _keys_as_listed(Tier(keys), ["trtet-0123"])
    msg = str(got.value)
    assert msg.startswith(f"'trtet-0123' names {n} entries of s3://bucket/cache: "), msg
    assert msg.count("trtet-01234567") == min(n, 8), msg
    assert (", ..." in msg) == (n > 8), msg
