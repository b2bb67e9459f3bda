"""``trtet-store bench``: ``--fs-size tight`` sizes small payloads (the move's step scaled to
them), and ``bench --help`` and the documentation say the same of ``--filesystem auto``.

Before: ``bench --payload-size 64M --fs-size tight`` failed "payloads too small for a tight
filesystem: a move's needs (198.0 MiB) are not well below the payload size"; ``bench --help``
said "auto: ext4 as root, else here" where the README said "ext4, then XFS (one table each)".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trtet_store.bench.config import BenchConfig
from trtet_store.bench.where import space_needed
from trtet_store.io.units import MiB

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("payload_size", "chunk"), [(64 * MiB, 8 * MiB), (16 * MiB, 2 * MiB),
                                                     (512 * MiB, 64 * MiB)])
def test_tight_sizes_small_payloads(payload_size, chunk) -> None:
    config = BenchConfig(payload_size=payload_size, payloads=2, fs_size="tight")
    payload = config.total_payload_bytes
    low, high = space_needed(config)
    assert config.effective_chunk_size == chunk
    assert payload + 3 * chunk < low < high < 2 * payload  # fits once and a move, not twice
    # fit keeps the writer's default step
    assert BenchConfig(payload_size=payload_size, payloads=2).effective_chunk_size == 64 * MiB


def test_tight_with_a_step_too_large_says_what_to_change() -> None:
    from trtet_store.bench.where import BenchError

    config = BenchConfig(payload_size=64 * MiB, payloads=2, fs_size="tight",
                         chunk_size=64 * MiB)
    with pytest.raises(BenchError) as info:
        space_needed(config)
    assert str(info.value) == (
        "payloads too small for a tight filesystem: a move's needs (198.0 MiB, with a 64.0 MiB "
        "step) are not well below the payloads (128.0 MiB): give larger payloads, a smaller "
        "--chunk-size, or --fs-size fit")


def test_bench_help_and_the_docs_agree_on_auto(capsys) -> None:
    from trtet_store.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    said = re.search(r"auto: [^)]*\) as root, else here", text)
    assert said and said.group(0) == "auto: ext4, then XFS (a table each) as root, else here"
    for page in ("docs/benchmarks.md", "benchmarks/README.md"):
        row = next(x for x in (ROOT / page).read_text().splitlines()
                   if x.startswith("| `--filesystem` | `auto` |"))
        assert said.group(0) in row, (page, row)
