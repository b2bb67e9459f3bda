"""Real ``torch.export`` archives, made in-process, as the package's build records are.

The record-check tests rewrite these archives' members to set up each hostile state;
one maker serves them all.
"""

from __future__ import annotations

import io


def exported_archive(*, weighted: bool) -> bytes:
    """The bytes of ``torch.export.save`` of a small module: ``relu(x) + 1``, or, with
    ``weighted``, ``relu(Linear(3, 2)(x))`` (a weight and a bias in the archive)."""
    import torch

    class Plain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) + 1

    class Weighted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x))

    buf = io.BytesIO()
    module = Weighted() if weighted else Plain()
    torch.export.save(torch.export.export(module, (torch.randn(2, 3),)), buf)
    return buf.getvalue()
