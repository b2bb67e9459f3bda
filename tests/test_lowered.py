"""tests/lowered.py: a program lowered once per run, a fresh copy per caller."""

from __future__ import annotations

import pytest

pytest.importorskip("executorch.exir")

import lowered  # noqa: E402
import programs  # noqa: E402


def test_each_caller_gets_its_own_copy_of_one_lowering_and_the_same_rng_state():
    import torch

    first = lowered.portable_linear_program(hidden=16)
    after_first = torch.rand(4)
    second = lowered.portable_linear_program(hidden=16)
    assert torch.equal(torch.rand(4), after_first)  # the global RNG, as a fresh lowering
    assert second is not first and second.manager is not first.manager
    assert second.manager.buffer == first.manager.buffer
    assert second.manager._tensor_data is not first.manager._tensor_data
    # A caller that mutates its program leaves the next caller's alone.
    first.manager._tensor_data.clear()
    with torch.no_grad():
        first.module.l1.weight.zero_()
    third = lowered.portable_linear_program(hidden=16)
    assert list(third.manager._tensor_data) == list(second.manager._tensor_data) != []
    assert torch.equal(third.module.l1.weight, second.module.l1.weight)
    assert third.module.l1.weight.abs().sum() > 0
    # And it is the program a fresh lowering makes.
    fresh = programs.portable_linear_program(hidden=16)
    assert fresh.manager.buffer == third.manager.buffer
