"""Issue 34 item 7: the safetensors dtype order, every pair of dtypes, deterministically.

``save_file`` sorts tensors by dtype, descending in the order of safetensors'
Rust enum, then by name. A Hypothesis draw met both float8 types in about
one run of three; here every pair of the dtypes torch can hold is laid out
both ways round (the names agreeing with, then against, the dtype order)
and compared byte for byte with ``safetensors.torch.save``.
"""

from __future__ import annotations

import itertools

import torch
from safetensors.torch import load_file
from safetensors.torch import save as reference_bytes
from test_formats_safetensors import DTYPES, random_tensor

from trtet_store.formats import safetensors as sf
from trtet_store.formats import tensors as tensor_formats

#: The safetensors dtypes no torch dtype maps to (so no reference can be written).
NO_TORCH_DTYPE = {"F6_E2M3", "F6_E3M2"}


def _ours(tensors: dict[str, torch.Tensor]) -> bytes:
    pieces, _ = sf.build_layout(tensors)
    return b"".join(bytes(p) for p in pieces)


def test_every_torch_dtype_is_covered():
    codes = {tensor_formats.describe_all({"t": random_tensor(d, (2,), 0)})[0].dtype
             for d in DTYPES}
    assert codes == set(tensor_formats.DTYPES) - NO_TORCH_DTYPE


def test_every_pair_of_dtypes_is_ordered_as_safetensors_orders_it():
    wrong = []
    for first, second in itertools.combinations_with_replacement(DTYPES, 2):
        for names in (("a", "b"), ("b", "a")):  # the name order with, then against, the dtypes
            tensors = {names[0]: random_tensor(first, (2,), 1),
                       names[1]: random_tensor(second, (2,), 2)}
            ours, theirs = _ours(tensors), reference_bytes(tensors)
            if ours != theirs:
                wrong.append(f"{first} as {names[0]!r}, {second} as {names[1]!r}")
    assert not wrong, f"{len(wrong)} layouts differ from safetensors': {wrong[:6]}"


def test_all_dtypes_in_one_file_through_the_writer(tmp_path):
    # Names in the reverse of the dtype order: only the dtype order puts them right.
    tensors = {f"{len(DTYPES) - i:02d}": random_tensor(d, (3, 2), i)
               for i, d in enumerate(DTYPES)}
    sf.save_file(tensors, tmp_path / "all.safetensors")
    assert (tmp_path / "all.safetensors").read_bytes() == reference_bytes(tensors)
    back = load_file(tmp_path / "all.safetensors")
    assert all(torch.equal(back[k].view(torch.uint8), v.view(torch.uint8))
               for k, v in tensors.items())
