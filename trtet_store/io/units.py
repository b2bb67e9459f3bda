"""Sizes: the one place for ``MiB``, alignment arithmetic, and sizes parsed and formatted."""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
#: The page: block-aligned offsets (what clone and insert place) are multiples of it.
PAGE = 4096


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def format_mib(n: int) -> str:
    """``n`` bytes in MiB with one decimal, as messages print sizes."""
    return f"{n / MiB:.1f} MiB"


# Binary units, case-insensitive: K, KB and KiB all mean 1024.
_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": KiB,
    "kib": KiB,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
    "t": TiB,
    "tb": TiB,
    "tib": TiB,
}


def parse_size(text: str | int) -> int:
    """Parse a byte size such as ``512M``, ``1.5GiB``, ``4096`` or ``16 MiB``.

    Units are binary (``K``/``KB``/``KiB`` all mean 1024), case-insensitive.

    Args:
        text: The size, or an int (returned as is).

    Returns:
        The size in bytes.

    Raises:
        ValueError: If the text is not a size, or is negative.
    """
    if isinstance(text, int):
        value = text
    else:
        s = text.strip().lower().replace(" ", "")
        i = len(s)
        while i and not (s[i - 1].isdigit() or s[i - 1] == "."):
            i -= 1
        number, unit = s[:i], s[i:]
        if not number or unit not in _UNITS:
            raise ValueError(f"not a size: {text!r} (examples: 512M, 1GiB, 4096)")
        try:
            value = (
                int(float(number) * _UNITS[unit]) if "." in number else int(number) * _UNITS[unit]
            )
        except ValueError:
            raise ValueError(f"not a size: {text!r}") from None
    if value < 0:
        raise ValueError(f"a size cannot be negative: {text!r}")
    return value


def format_size(n: float | None, *, signed: bool = False) -> str:
    """Format a byte count with a binary unit, e.g. ``512.0 MiB``.

    Args:
        n: Bytes, or None (formatted as ``-``).
        signed: Prefix positive values with ``+``.

    Returns:
        The text.
    """
    if n is None:
        return "-"
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    a = abs(n)
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if a >= div:
            return f"{sign}{a / div:.1f} {unit}"
    return f"{sign}{int(a)} B"
