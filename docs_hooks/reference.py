"""mkdocs hook: the reference pages made at build time from the code, so they cannot go stale.

``<!-- cli-reference -->`` in a page becomes every ``trtet-store`` command's help, as
its argparse parser prints it (``trtet_store.cli.build_parser``, walked to every
subcommand); ``<!-- api-reference -->`` becomes a mkdocstrings block (``::: module.name``)
for each name of ``trtet_store.__all__``, found in the module that defines it, which
mkdocstrings renders from the docstrings. Neither imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI_MARKER = "<!-- cli-reference -->"
API_MARKER = "<!-- api-reference -->"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps no public list of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, str]]:
    """(command, its help) of ``parser`` and every subcommand under it, in order."""
    found = [(name, parser.format_help())]
    for sub, child in _subparsers(parser).items():
        found += _walk(child, f"{name} {sub}")
    return found


def cli_reference() -> str:
    """Every command's help, as markdown: one section and one text block each."""
    sys.path.insert(0, str(ROOT))
    os.environ["COLUMNS"] = "100"  # argparse wraps to it: the same page on every machine
    from trtet_store.cli import build_parser

    out = []
    for name, text in _walk(build_parser(), "trtet-store"):
        level = "##" if name.count(" ") <= 1 else "###"
        out.append(f"{level} `{name}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(out)


def api_reference() -> str:
    """A mkdocstrings block for each public name, under the module that defines it."""
    sys.path.insert(0, str(ROOT))
    import trtet_store

    out = []
    for name in trtet_store.__all__:  # griffe follows trtet_store's imports to each
        out.append(f"::: trtet_store.{name}\n    options:\n      heading_level: 2\n")
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs'
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, api_reference())
    return markdown
