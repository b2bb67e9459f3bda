"""Issue 34 item 19: the docs' pinned_version example loads the files the hybrid example writes.

It loaded ``w.ptd`` where the hybrid example writes ``cpu.ptd``. Read from the
pages themselves (docs/guides/save.md's hybrid example, docs/guides/versions.md's
reader): the versioned save, the link and both names the reader opens must
agree; then the same pattern runs for real (XNNPACK, which runs here, writing
its weights to ``cpu.ptd``) and the runtime loads the pinned set.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from versions import needs_ptd_runtime

import trtet_store
from trtet_store.io import pinned_version
from trtet_store.testing.stub_tensorrt import linear_relu

GUIDES = Path(__file__).resolve().parent.parent / "docs" / "guides"


def _block_after(page: str, heading: str) -> str:
    text = (GUIDES / page).read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_example_names_the_files_its_save_writes():
    hybrid = _block_after("save.md", "## Several methods, hybrid programs")
    tag = re.search(r'"out/hybrid\.pte",.*?external_weights="(\w+)"', hybrid, re.S).group(1)
    reader = _block_after("versions.md", "# Versions for concurrent readers")
    save = re.search(r'compile_and_save\(.*?"out/(\w+)\.pte",(.*?)\)\n', reader, re.S)
    stem, options = save.group(1), save.group(2)
    assert "versioned=True" in options and f'external_weights="{tag}"' in options
    pinned = re.search(r'pinned_version\("out/(\w+)"\)', reader).group(1)
    pte, ptd = re.search(r'v / "([\w.]+)"\), data_path=str\(v / "([\w.]+)"\)', reader).groups()
    assert (pinned, pte, ptd) == (stem, f"{stem}.pte", f"{tag}.ptd")


@needs_ptd_runtime
def test_the_pattern_loads_the_pinned_set(here_fs):
    from executorch.runtime import Runtime

    module, inputs = linear_relu()
    out = here_fs / "out"
    out.mkdir()
    trtet_store.compile_and_save(module, inputs, out / "hybrid.pte", versioned=True,
                                 backend="xnnpack", external_engine_data="cpu")
    with pinned_version(out / "hybrid") as v:
        program = Runtime.get().load_program(os.fspath(v / "hybrid.pte"),
                                             data_path=os.fspath(v / "cpu.ptd"))
        (got,) = program.load_method("forward").execute(list(inputs))
    torch.testing.assert_close(got, module(*inputs))
