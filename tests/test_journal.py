"""The journal's plan encoding: Plan.to_json and Plan.from_json are inverses.

As ExecuTorch tests its headers (to_bytes/from_bytes): a plan written by
one version is what recovery reads back, field for field.
"""

from __future__ import annotations

import json

import pytest

from trtet_store.io.journal import (
    VERSION,
    InlinePlan,
    OutputPlan,
    PayloadPlan,
    Plan,
    digest_of_chunks,
)


def _plan() -> Plan:
    return Plan(
        token="0123456789abcdef",
        outputs=[
            OutputPlan(
                dest="/d/m.pte", temp="/d/.m.pte.trtet-0123456789abcdef.tmp",
                backup="/d/.m.pte.trtet-0123456789abcdef.old", size=12288,
                inline=[InlinePlan(0, 4096, 2**64 - 1)],
                payloads=[
                    PayloadPlan("/s/a-0.blob", 4096, 4096, "move", "same filesystem", 1 << 20,
                                [1, 2**63], step=1 << 20, consumed=True,
                                identity=[2049, 12, 4096, 10**18, 10**18 + 1]),
                    PayloadPlan("/u/ü weights.bin", 8192, 4096, "copy", "user file", 1 << 20,
                                None),
                ]),
            OutputPlan(dest="/d/m.ptd", temp="/d/.m.ptd.trtet-0123456789abcdef.tmp",
                       backup=None, size=0),
        ],
        pins=["/s/.trtet-pin-0123456789abcdef"],
    )


def test_a_plan_survives_its_encoding() -> None:
    plan = _plan()
    text = plan.to_json()
    assert "\n" not in text  # one line of the journal
    assert Plan.from_json(text) == plan
    assert Plan.from_json(text).to_json() == text


def test_an_empty_plan_survives_its_encoding() -> None:
    plan = Plan(token="f" * 16, outputs=[])
    assert Plan.from_json(plan.to_json()) == plan


def test_another_version_or_shape_is_refused() -> None:
    raw = json.loads(_plan().to_json())
    raw["version"] = VERSION + 1
    with pytest.raises(ValueError, match="journal version"):
        Plan.from_json(json.dumps(raw))
    with pytest.raises(ValueError, match="not a JSON object"):
        Plan.from_json("[]")


def test_a_zero_copy_plan_records_one_digest_of_its_chunk_digests() -> None:
    """A clone or an insert never reads its payload: the journal keeps one digest of the
    chunk digests, so its plan line does not grow with the payload (16 GiB: 16,384 digests)."""
    lines = {}
    for n in (256, 16384):
        digests = [(i * 0x9E3779B97F4A7C15) % 2**64 for i in range(n)]
        for placement in ("clone", "insert", "move"):
            plan = Plan(token="f" * 16, outputs=[OutputPlan(
                dest="/d/m.ptd", temp="/d/t", backup=None, size=n << 20,
                payloads=[PayloadPlan("/s/a.blob", 4096, n << 20, placement, "r", 1 << 20,
                                      digests)])])
            text = plan.to_json()
            back = Plan.from_json(text).outputs[0].payloads[0]
            if placement == "move":  # read as it goes: every chunk's digest is kept
                assert back.chunk_digests == digests and back.chunks_digest is None
            else:
                assert back.chunk_digests is None
                assert back.chunks_digest == digest_of_chunks(digests)
                assert Plan.from_json(text).to_json() == text
            lines[n, placement] = len(text)
    for placement in ("clone", "insert"):
        assert lines[16384, placement] - lines[256, placement] < 16  # a longer size field
        assert lines[16384, placement] < 1024
    assert lines[16384, "move"] > 300_000
    assert digest_of_chunks([1, 2]) != digest_of_chunks([2, 1])
