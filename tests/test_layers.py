"""The package's layers stay put (issue 41 item 5): an ``ast`` walk of every import.

Every ``import`` and ``from ... import`` in ``trtet_store/`` counts, at module
level or inside a function, except under ``if TYPE_CHECKING:`` (annotations
only, never run). Relative imports are resolved; ``from pkg import name``
counts as an import of the module ``pkg.name`` where that is a file, else of
``pkg``.

- No file circle: no two files reach each other through imports.
- ``cache/`` (but not ``cache/tier/``) imports only ``trtet_store.io``'s face
  and ``cache.*``: the local cache knows files and bytes, no S3, no TensorRT.
- ``cache/tier/`` may use the remote floor and its halves, never ``export``.
- ``export/`` never imports ``remote``: engines reach the bucket through the cache.
- ``sets/`` imports only ``trtet_store.io``'s face, ``remote`` and ``sets.*``.
- The one documented edge from ``remote`` to ``export``: ``remote/upload/program.py``
  (``publish`` of an unsaved program lowers it through ``export``).

The rooms already composed rather than cut into files (``cache/``, its tier too;
the rest follows) keep three structural rules (issue 52), in place of a line cap:
no circle even through annotation-only imports, no method typed ``self: SomeClass``
(a class cut into files), and no private attribute read on another object.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "trtet_store"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under an ``if TYPE_CHECKING:`` (its body, not its else)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skipped.update(id(n) for n in ast.walk(child))
    return skipped


def imports_of(path: Path, modules: set[str], *, annotations: bool = False) -> set[str]:
    """The trtet_store modules ``path`` imports (TYPE_CHECKING ones only with ``annotations``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = set() if annotations else _type_checking_nodes(tree)
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in modules else base)
    return {m for m in out if m == "trtet_store" or m.startswith("trtet_store.")}


def import_graph(*, annotations: bool = False) -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules, annotations=annotations) & modules
            for p in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_walk_sees_function_level_imports_and_skips_type_checking(tmp_path: Path) -> None:
    """The walker itself: a function-level import counts, a TYPE_CHECKING one does not."""
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from trtet_store.remote import s3\n"
              "def f():\n    from ..io import fs\n    import trtet_store.export.lowering\n")
    path = PACKAGE / "cache" / "_probe_for_the_walker.py"
    path.write_text(source)
    try:
        got = imports_of(path, {m for m in import_graph()})
    finally:
        path.unlink()
    assert got == {"trtet_store.io.fs", "trtet_store.export.lowering"}


def test_no_file_circle(graph: dict[str, set[str]]) -> None:
    assert circles(graph) == []


def test_the_local_cache_imports_only_io_s_face_and_itself(graph: dict[str, set[str]]) -> None:
    bad = {m: sorted(i for i in imports if not (i == "trtet_store.io"
                                                or _within(i, "trtet_store.cache")))
           for m, imports in graph.items()
           if _within(m, "trtet_store.cache") and not _within(m, "trtet_store.cache.tier")}
    assert {m: b for m, b in bad.items() if b} == {}


def test_the_tier_uses_remote_and_never_export(graph: dict[str, set[str]]) -> None:
    bad = {m: sorted(i for i in imports if _within(i, "trtet_store.export"))
           for m, imports in graph.items() if _within(m, "trtet_store.cache.tier")}
    assert {m: b for m, b in bad.items() if b} == {}


def test_export_never_imports_remote(graph: dict[str, set[str]]) -> None:
    bad = {m: sorted(i for i in imports if _within(i, "trtet_store.remote"))
           for m, imports in graph.items() if _within(m, "trtet_store.export")}
    assert {m: b for m, b in bad.items() if b} == {}


def test_remote_reaches_export_only_through_publish_of_an_unsaved_program(
        graph: dict[str, set[str]]) -> None:
    edges = sorted(m for m, imports in graph.items() if _within(m, "trtet_store.remote")
                   and any(_within(i, "trtet_store.export") for i in imports))
    assert edges == ["trtet_store.remote.upload.program"]


def test_the_set_room_uses_only_io_s_face_remote_and_itself(graph: dict[str, set[str]]) -> None:
    """``sets/`` (issue 47) rides io's face and remote; never export, cache or the CLI."""
    bad = {m: sorted(i for i in imports if not (i == "trtet_store.io"
                                                or _within(i, "trtet_store.remote")
                                                or _within(i, "trtet_store.sets")))
           for m, imports in graph.items() if _within(m, "trtet_store.sets")}
    assert {m: b for m, b in bad.items() if b} == {}
    assert any(_within(m, "trtet_store.sets") for m in graph)


# -- the composed rooms (issue 52): cache/, sets/, remote/; no circle anywhere ------------

#: The rooms held to the structural rules (no ``self: Class`` method, no private
#: attribute read across objects); the import-circle rule holds for the whole package.
COMPOSED = ("trtet_store.cache", "trtet_store.sets", "trtet_store.remote")


def _composed_files() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if any(_within(module_name(p), room) for room in COMPOSED)]


def test_no_circle_counting_annotation_only_imports() -> None:
    """A ``TYPE_CHECKING`` import is an edge too: no circle anywhere in the package."""
    assert circles(import_graph(annotations=True)) == []


def test_no_method_typed_with_its_class() -> None:
    """``def f(self: SomeClass)``: a class cut into files (mixins); none in a composed room."""
    typed = [f"{p.relative_to(PACKAGE)}:{n.lineno} {n.name}"
             for p in _composed_files() for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.args.args
             and n.args.args[0].arg == "self" and n.args.args[0].annotation is not None]
    assert typed == []


def private_reads(path: Path) -> list[str]:
    """``x._name`` where ``x`` is not ``self``/``cls`` (nor an imported module): another
    object's private attribute, an API between files that no checker sees."""
    tree = ast.parse(path.read_text())
    modules = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
               if isinstance(n, ast.Import) for a in n.names}
    return [f"{path.relative_to(PACKAGE)}:{n.lineno} {ast.unparse(n)}" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr.startswith("_")
            and not n.attr.startswith("__")
            and not (isinstance(n.value, ast.Name) and n.value.id in {"self", "cls", *modules})]


def test_private_reads_are_seen(tmp_path: Path) -> None:
    path = PACKAGE / "cache" / "_probe_for_private_reads.py"
    path.write_text("import sys\nclass A:\n    def f(self, tier):\n"
                    "        return self._a, tier._lease(1), sys._getframe, tier.__class__\n")
    try:
        got = private_reads(path)
    finally:
        path.unlink()
    assert got == ["cache/_probe_for_private_reads.py:4 tier._lease"]


def test_no_private_attribute_read_across_objects() -> None:
    assert [r for p in _composed_files() for r in private_reads(p)] == []
