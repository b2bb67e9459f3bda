"""The shared tier's settings (``trtet_store.cache.tier.store``: ``RemoteTier.__init__``)
refuse NaN (and -NaN) for ``lease_ttl``, ``poll`` and ``connect_timeout`` as they refuse 0
and negatives, before any request: NaN slips past a ``value <= 0`` check, and a NaN ttl
never expires (``unchanged > NaN`` is false: a waiter would never take a dead lease over)
while the holder's renewal thread waits ``NaN / 3`` s. The endpoint is a closed port: no
request could be answered.
"""

from __future__ import annotations

import math

import pytest

from trtet_store.cache.tier import RemoteTier

DEAD = "http://127.0.0.1:9"


@pytest.mark.parametrize("name", ["lease_ttl", "poll", "connect_timeout"])
@pytest.mark.parametrize("value", [math.nan, -math.nan, 0.0, -1.0], ids=["nan", "minus-nan",
                                                                          "zero", "negative"])
def test_a_setting_that_is_not_a_positive_number_of_seconds_is_refused(name: str,
                                                                       value: float) -> None:
    with pytest.raises(ValueError, match=f"{name} must be more than 0 seconds") as refused:
        RemoteTier("s3://bucket/p", endpoint_url=DEAD, **{name: value})
    assert "\n" not in str(refused.value)
