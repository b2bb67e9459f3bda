"""Sizes: the one place for ``MiB``, alignment arithmetic and size formatting."""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
#: The page: block-aligned offsets (what clone and insert place) are multiples of it.
PAGE = 4096


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def format_mib(n: int) -> str:
    """``n`` bytes in MiB with one decimal, as messages print sizes."""
    return f"{n / MiB:.1f} MiB"
