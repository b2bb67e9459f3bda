"""The site's reference pages are made from the code at build time (docs_hooks/reference.py):
the CLI page holds every command's own ``--help``, the API page a mkdocstrings block for
every public name. ``make docs`` (mkdocs --strict) renders them; this holds what goes in.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from docs_hooks import reference  # noqa: E402


def test_the_cli_page_holds_every_commands_help(monkeypatch) -> None:
    from trtet_store.cli import build_parser, main

    monkeypatch.setenv("COLUMNS", "100")
    page = reference.cli_reference()
    commands = reference._walk(build_parser(), "trtet-store")
    names = [name for name, _ in commands]
    assert {"trtet-store", "trtet-store inspect", "trtet-store compile-and-save",
            "trtet-store recover", "trtet-store cache pull", "trtet-store fetch-set"} <= set(names)
    for name, _text in commands:
        argv = name.split()[1:] + ["--help"]
        with contextlib.redirect_stdout(io.StringIO()) as out, \
                contextlib.suppress(SystemExit):
            main(argv)
        assert f"`{name}`\n\n```text\n{out.getvalue().rstrip()}\n```" in page, name
    assert "--discard-parts" in page and "--refittable" in page


def test_the_api_page_names_every_public_name() -> None:
    import trtet_store

    page = reference.api_reference()
    assert [x.split()[1] for x in page.splitlines() if x.startswith(":::")] == \
        [f"trtet_store.{n}" for n in trtet_store.__all__]


def test_the_site_uses_the_hook_and_lists_the_reference_pages() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert "hooks:\n  - docs_hooks/reference.py" in config and "mkdocstrings:" in config
    for page in ("reference/api.md", "reference/cli.md", "reference/formats.md"):
        assert f": {page}" in config and (ROOT / "docs" / page).is_file()
    assert reference.CLI_MARKER in (ROOT / "docs/reference/cli.md").read_text()
    assert reference.API_MARKER in (ROOT / "docs/reference/api.md").read_text()
    pins = (ROOT / "requirements-dev.txt").read_text()
    assert "mkdocstrings==" in pins and "mkdocstrings-python==" in pins
