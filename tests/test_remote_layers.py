"""remote/'s two halves never import each other (DESIGN: one floor under upload/, download/).

An ``ast`` walk of every module under ``trtet_store/remote/upload/`` and
``trtet_store/remote/download/``: each ``import``, ``from ... import`` (a
relative one resolved against the module's package) and
``importlib.import_module("...")`` with a literal name, at module level or
inside a function, counts; only what sits under ``if TYPE_CHECKING:`` does
not (it never runs). The walk itself is checked on planted sources, so a
form it missed could not pass unseen.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REMOTE = ROOT / "trtet_store" / "remote"
HALVES = {"upload": "trtet_store.remote.download", "download": "trtet_store.remote.upload"}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(package: str, level: int, module: str | None) -> str:
    """The absolute name of ``from <level dots><module> import ...`` inside ``package``."""
    if level == 0:
        return module or ""
    parts = package.split(".")
    base = parts[:len(parts) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imports_of(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import that can run in ``source``.

    ``module`` is the dotted name of the file (``trtet_store.remote.upload.send``);
    for ``from X import a`` both ``X`` and ``X.a`` are listed (``a`` may be a module).
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the else branch does run
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(package, node.level, node.module)
            found.append((node.lineno, base))
            found.extend((node.lineno, f"{base}.{a.name}" if base else a.name)
                         for a in node.names if a.name != "*")
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (node.func.attr if isinstance(node.func, ast.Attribute)
                   else node.func.id) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            name = node.args[0].value
            if name.startswith("."):
                level = len(name) - len(name.lstrip("."))
                name = _resolve(package, level, name.lstrip(".") or None)
            found.append((node.lineno, name))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def _reaches(name: str, other: str) -> bool:
    return name == other or name.startswith(other + ".")


def _crossings(half: str) -> list[str]:
    other = HALVES[half]
    out = []
    for path in sorted((REMOTE / half).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        is_package = path.name == "__init__.py"
        module = ".".join(rel.parent.parts if is_package else rel.parts)
        for line, name in imports_of(path.read_text(), module, is_package=is_package):
            if _reaches(name, other):
                text = path.read_text().splitlines()[line - 1].strip()
                out.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    return sorted(set(out))  # a line once, though ``from X import a`` names X and X.a


@pytest.mark.parametrize("half", sorted(HALVES))
def test_a_half_of_remote_never_imports_the_other(half):
    modules = sorted((REMOTE / half).rglob("*.py"))
    assert len(modules) >= 8, modules  # the walk saw the half, not an empty folder
    assert _crossings(half) == []


def test_importing_either_half_loads_nothing_of_the_other():
    """At run time too: every module of one half imported, none of the other is loaded."""
    for half, other in HALVES.items():
        names = sorted(p.stem for p in (REMOTE / half).glob("*.py") if p.stem != "__init__")
        code = (f"import sys\nfor n in {names!r}:\n"
                f"    __import__('trtet_store.remote.{half}.' + n)\n"
                f"print(sorted(m for m in sys.modules if m.startswith({other!r})))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, cwd=ROOT).stdout
        assert out.strip() == "[]", (half, out)


PLANTED = {
    "absolute": ("from trtet_store.remote.download.receive import fetch\n", True),
    "absolute, in a function": ("def f():\n    import trtet_store.remote.download.plan\n",
                                True),
    "the package by name": ("from trtet_store.remote import download\n", True),
    "relative": ("from ..download import receive\n", True),
    "relative, in a method": ("class C:\n    def m(self):\n"
                              "        from ..download.staging import Staging\n", True),
    "import_module": ("import importlib\n"
                      "importlib.import_module('trtet_store.remote.download.receive')\n",
                      True),
    "under TYPE_CHECKING": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from trtet_store.remote.download.plan import Run\n", False),
    "in TYPE_CHECKING's else": ("import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n"
                                "    from ..download import plan\n", True),
    "the floor": ("from trtet_store.remote.manifest import Manifest\n"
                  "from .. import errors\n", False),
    "its own half": ("from . import parts\nfrom .parts import Part\n", False),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_the_walk_sees_every_form_of_import(case):
    source, crosses = PLANTED[case]
    names = [n for _, n in imports_of(source, "trtet_store.remote.upload.planted")]
    assert any(_reaches(n, HALVES["upload"]) for n in names) == crosses, names
