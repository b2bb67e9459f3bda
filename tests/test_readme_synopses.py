"""Every shell line of README.md and the documentation site names what exists (issue 45 item 23).

Some ``sh`` blocks are synopses (``[--replace]`` marks an option), marked
``<!-- not run: ... -->`` and so not run by ``test_readme_examples.py``, which runs
every other block. What every line promises is checked here, marked or not:
each ``trtet-store`` line parses with the CLI's own parser, with its optional
parts and without them; each ``make`` target is in the Makefile; each test file
a command names is in ``tests/``.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from trtet_store.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def shell_lines(markdown: str) -> list[str]:
    """The commands of every ``sh`` block: continuations joined, comments dropped."""
    lines = []
    for block in re.findall(r"^```sh\n(.*?)^```$", markdown, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(shlex.join(words))
    return lines


# The synopses' placeholders (argparse metavars) and a value a reader would give.
PLACEHOLDERS = {"URL": "http://127.0.0.1:8333", "N": "4"}


def variants(words: list[str]) -> list[list[str]]:
    """A synopsis with every ``[...]`` part, and with none."""
    full, bare, optional = [], [], False
    for w in words:
        opens, closes = w.startswith("["), w.endswith("]")
        w = w.removeprefix("[").removesuffix("]")
        if re.fullmatch(r"[A-Z]+", w):
            w = PLACEHOLDERS[w]  # a KeyError names a placeholder this test does not know
        optional = optional or opens
        full.append(w)
        if not optional:
            bare.append(w)
        if closes:
            optional = False
    return [full, bare] if full != bare else [full]


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINES = [line for page in PAGES for line in shell_lines(page.read_text())]
CLI_LINES = [line for line in LINES if line.startswith("trtet-store ")]
MAKE_TARGETS = set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def test_the_readme_has_the_synopses_this_checks() -> None:
    assert len(CLI_LINES) >= 7 and any(line.startswith("make ") for line in LINES)


@pytest.mark.parametrize("line", CLI_LINES)
def test_each_trtet_store_line_parses_with_the_cli(line: str) -> None:
    for argv in variants(shlex.split(line)[1:]):
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            try:
                build_parser().parse_args(argv)
            except SystemExit as exc:
                pytest.fail(f"docs: `trtet-store {shlex.join(argv)}` does not parse "
                            f"(exit {exc.code}): {said.getvalue().strip()}")


@pytest.mark.parametrize("line", [line for line in LINES if line.startswith("make ")])
def test_each_make_line_names_a_target_and_test_files_that_exist(line: str) -> None:
    words = shlex.split(line)
    targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
    assert set(targets) <= MAKE_TARGETS, (line, sorted(MAKE_TARGETS))
    named = [w for arg in words for w in arg.split() if w.startswith("tests/")]
    assert [w for w in named if not (ROOT / w).is_file()] == [], line


def test_each_test_file_a_command_names_exists() -> None:
    named = [w for line in LINES for arg in shlex.split(line) for w in arg.split()
             if w.startswith("tests/")]
    assert len(named) >= 10
    assert [w for w in named if not (ROOT / w).is_file()] == []
