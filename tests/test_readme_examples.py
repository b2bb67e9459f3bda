"""Every Python and shell example of README.md and the documentation site runs as written.

Each page (README.md, every ``docs/**/*.md``) runs on its own, parsed by Sybil: its
Python blocks in one namespace and its ``sh`` blocks in ``bash -euo pipefail``, in
the page's order, in one fresh directory, as a reader of that page would run them
in one session and one terminal. Nothing of the reader's is injected: each page
makes its model, its inputs and its files in its own first blocks.

What the pages say the reader brings, the harness brings, and nothing more:

- TensorRT's build: pages that compile with TensorRT say to run them under the stub
  builder without a GPU; their Python blocks run inside ``installed(FakeBuilder(...),
  refitter=FakeRefitter())`` (1 MiB engines, a CPU tail for the hybrid example).
  Pages whose own blocks install it (README.md and getting-started.md: the quick
  start) run without it.
- ``s3://models`` and ``s3://team-bucket``: buckets of the session's SeaweedFS, found
  the way boto3 finds an endpoint (``AWS_ENDPOINT_URL``, ``AWS_*`` keys), emptied first.
- ``HOME``, ``XDG_CACHE_HOME``, ``XDG_STATE_HOME``, ``XDG_CONFIG_HOME``: under the
  page's directory; ``python`` and ``trtet-store`` on ``PATH`` (this venv), this tree
  first on ``PYTHONPATH``.

A block that cannot run here is marked in the markdown, on the line before its
fence: ``<!-- not run: REASON -->`` (it needs a GPU, a bucket or server you name, or
is a synopsis with ``[--options]``; ``test_readme_synopses.py`` parses every
``trtet-store`` line of those). A block preceded by ``<!-- skip: next if(...) -->``
is skipped where the installed ExecuTorch cannot run it. Every ``python`` and ``sh``
block is run, skipped by its directive, or marked: the counts must add up, so an
unmarked block that cannot run fails here, and so does code under any other fence
language (``py``, ``bash``, ``console``, or a bare fence holding a command).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unittest
from pathlib import Path
from typing import Any

import pytest
from versions import _runtime_loads_ptd

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
BUCKETS = ("models", "team-bucket")
NOT_RUN = re.compile(r"^<!-- not run: (?P<reason>[^>]*\S) -->$")
FENCE = re.compile(r"^```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
RUN_LANGUAGES = {"python", "sh"}
#: Fence languages that hold code this test would not run: use ``python`` or ``sh``.
CODE_LANGUAGES = {"py", "python3", "bash", "shell", "console", "zsh", "pycon"}
#: A bare fence is text (a table, a tree); one whose first line is a command is not.
COMMAND = re.compile(r"^\s*(\$ |trtet-store |make |python|import |from \w+ import |sudo )")


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


def _marker_before(text: str, start: int) -> str | None:
    """The ``not run`` reason on the line right before the fence at ``start``, if any."""
    before = text[:start].rstrip("\n").rsplit("\n", 1)[-1]
    m = NOT_RUN.match(before.strip())
    return m.group("reason") if m else None


def fences(page: Path) -> list[tuple[int, str, str, str | None]]:
    """Each fenced block: (line, language, body, ``not run`` reason or None)."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group("lang"), m.group("body"),
             _marker_before(text, m.start())) for m in FENCE.finditer(text)]


def _shell_env(page_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    for var in list(env):
        if var.startswith("TRTET_"):
            del env[var]
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture
def docs_machine(here_fs: Path, s3: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The reader's machine: a working directory, a home, an S3 endpoint with two buckets."""
    monkeypatch.chdir(here_fs)
    home = here_fs / ".home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    # Publish journals (keyed by bucket and key) go under XDG_STATE_HOME: the buckets
    # here have fixed names, and make test-all runs two suites side by side.
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".state"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.endpoint.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.endpoint.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3.endpoint.region)
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    for var in [v for v in os.environ if v.startswith("TRTET_")]:
        monkeypatch.delenv(var)
    existing = _buckets(s3.client)
    for bucket in BUCKETS:
        if bucket in existing:
            for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for obj in page.get("Contents", []):
                    s3.client.delete_object(Bucket=bucket, Key=obj["Key"])
        else:
            s3.client.create_bucket(Bucket=bucket)
    return here_fs


def _buckets(client: Any) -> set[str]:
    return {b["Name"] for b in client.list_buckets().get("Buckets", [])}


class _Runner:
    """Sybil evaluators for one page: Python in one namespace, ``sh`` in bash; marks honoured."""

    def __init__(self, page: Path) -> None:
        from sybil.evaluators.python import PythonEvaluator

        self.page = page
        self.python = PythonEvaluator()
        self.ran: list[int] = []
        self.not_run: list[int] = []

    def _marked(self, example: Any) -> bool:
        if _marker_before(example.document.text, example.start) is not None:
            self.not_run.append(example.line)
            return True
        return False

    def run_python(self, example: Any) -> None:
        if not self._marked(example):
            self.python(example)
            self.ran.append(example.line)

    def run_sh(self, example: Any) -> None:
        if self._marked(example):
            return
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", str(example.parsed)],
                              cwd=os.getcwd(), env=_shell_env(Path.cwd()),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"the shell block exits {done.returncode}:\n"
                               f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
        self.ran.append(example.line)


def _stub() -> Any:
    from trtet_store.testing.stub_tensorrt import FakeBuilder, FakeRefitter, installed

    # cpu_tail: the stub leaves a linear layer after its engines, as a partial
    # TensorRT compile does, so the hybrid example has XNNPACK work and a cpu.ptd.
    return installed(FakeBuilder(engine_sizes=(1 << 20,), cpu_tail=8), refitter=FakeRefitter())


def run_page(page: Path, *, stub: bool) -> _Runner:
    """Run every block of ``page`` in the current directory; raise naming the first that fails."""
    import contextlib

    from sybil import Sybil
    from sybil.parsers.markdown import CodeBlockParser, SkipParser

    runner = _Runner(page)
    document = Sybil(parsers=[
        CodeBlockParser(language="python", evaluator=runner.run_python),
        CodeBlockParser(language="sh", evaluator=runner.run_sh),
        SkipParser(),
    ]).parse(page)
    document.namespace["executorch_runtime_loads_ptd"] = _runtime_loads_ptd()
    skipped: list[int] = []
    with _stub() if stub else contextlib.nullcontext():
        for example in document:
            try:
                example.evaluate()
            except unittest.SkipTest:
                skipped.append(example.line)
            except Exception as exc:
                raise AssertionError(
                    f"{_rel(page)} line {example.line}: the example fails as written: "
                    f"{type(exc).__name__}: {exc}") from exc
    runner.skipped = skipped  # type: ignore[attr-defined]
    return runner


def check_counts(page: Path, runner: _Runner) -> None:
    """Every python/sh block ran, was skipped by its directive, or is marked ``not run``."""
    blocks = fences(page)
    runnable = [line for line, lang, _, _ in blocks if lang in RUN_LANGUAGES]
    marked = [line for line, lang, _, why in blocks if lang in RUN_LANGUAGES and why]
    # Sybil reports the line of the block's first code line; the fence is the line before.
    accounted = sorted(line for line in
                       runner.ran + runner.not_run + runner.skipped)  # type: ignore[attr-defined]
    assert accounted == runnable, (
        f"{_rel(page)}: python/sh blocks at lines {runnable}, but run, skipped or marked: "
        f"{accounted}")
    assert sorted(runner.not_run) == marked, (_rel(page), marked)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_block_is_python_sh_or_text(page: Path) -> None:
    """Code is under a fence this test runs; every ``not run`` marker sits on a block."""
    text = page.read_text()
    for line, lang, body, _ in fences(page):
        assert lang not in CODE_LANGUAGES, (
            f"{_rel(page)} line {line}: a ```{lang} block; use ```python or ```sh "
            "so that it runs (or mark it <!-- not run: REASON -->)")
        first = next((x for x in body.splitlines() if x.strip()), "")
        assert lang or not COMMAND.match(first), (
            f"{_rel(page)} line {line}: a bare fence holding a command ({first!r}); "
            "use ```sh (or ```text for output)")
    fenced = {m.start() for m in FENCE.finditer(text)}
    for m in re.finditer(r"^<!-- not run:.*$", text, re.M):
        after = m.end() + 1
        assert after in fenced, (
            f"{_rel(page)} line {text.count(chr(10), 0, m.start()) + 1}: "
            "a <!-- not run: REASON --> marker not right before a fence")
        assert NOT_RUN.match(m.group(0)), m.group(0)


def installs_its_own_stub(page: Path) -> bool:
    """A page whose own blocks install the stub (the quick start) runs without the harness's."""
    return any(lang in RUN_LANGUAGES and not why
               and ("installed(FakeBuilder(" in body or "TRTET_STUB_TENSORRT=1 " in body)
               for _, lang, body, why in fences(page))


#: Pages with a block to run (the others' blocks are all marked, checked above).
RUN_PAGES = [p for p in PAGES if any(lang in RUN_LANGUAGES and not why
                                     for _, lang, _, why in fences(p))]


def test_the_pages_this_runs() -> None:
    """The README's quick start and the guides are among them: nothing went unparsed."""
    names = {_rel(p) for p in RUN_PAGES}
    assert {"README.md", "docs/getting-started.md", "docs/guides/save.md"} <= names, names
    # The quick start shows the stub itself, so it runs without the harness's: a quick
    # start that forgot it fails here, as it would for a reader without a GPU.
    assert {_rel(p) for p in RUN_PAGES if installs_its_own_stub(p)} == {
        "README.md", "docs/getting-started.md"}


#: What each page's examples say they write (checked where none of its blocks was skipped).
WRITTEN = {
    "README.md": ["model.pte"],
    "docs/getting-started.md": ["model.pte", "cli.pte"],
    "docs/guides/save.md": ["out/model.pte", "model.pte", "cpu.ptd", "out/data.bin",
                            "out/llm.pte", "out/hybrid.pte"],
    "docs/guides/formats.md": ["model.safetensors", "ckpt", "w.safetensors",
                               "out/model.onnx", "out/model.onnx.data"],
    "docs/guides/fetch.md": ["deploy/model.pte", "data/model.pte"],
    "docs/guides/sets.md": ["deploy-set"],
    "docs/guides/refit.md": ["a.pte", "b.pte"],
    "docs/guides/versions.md": ["out/hybrid"],
    "docs/security.md": [".home/.config/trtet_store/ci.key",
                         ".home/.config/trtet_store/ci.key.pub"],
}


@pytest.mark.parametrize("page", RUN_PAGES, ids=_rel)
def test_every_example_runs_as_written(page: Path, docs_machine: Path) -> None:
    runner = run_page(page, stub=not installs_its_own_stub(page))
    print(f"{_rel(page)}: ran lines {runner.ran}; not run (marked) {runner.not_run}; "
          f"skipped {runner.skipped}")  # type: ignore[attr-defined]
    check_counts(page, runner)
    if not runner.skipped:  # type: ignore[attr-defined]
        missing = [n for n in WRITTEN.get(_rel(page), []) if not (docs_machine / n).exists()]
        assert missing == [], f"{_rel(page)}: its examples did not write {missing}"


def test_the_readmes_links_name_files_that_exist() -> None:
    """README.md links into docs/ (outside the site, so mkdocs cannot check them)."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10
    assert [x for x in links if "://" not in x and not (ROOT / x).exists()] == []


def test_the_harness_fails_a_typo_a_failing_command_and_counts_the_marks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner itself, on small pages: a planted typo and a failing command fail; a mark skips.

    No torch, no server: what a page's run proves rests on these three behaviours.
    """
    monkeypatch.chdir(tmp_path)
    typo = tmp_path / "typo.md"
    typo.write_text("```python\nanswer = 42\n```\n\n```python\nprint(answr)\n```\n")
    with pytest.raises(AssertionError, match=r"typo.md line 5: .*NameError: name 'answr'"):
        run_page(typo, stub=False)
    failing = tmp_path / "failing.md"
    failing.write_text("```sh\necho made > made.txt\nno-such-command-here\necho after\n```\n")
    with pytest.raises(AssertionError, match=r"failing.md line 1: .*exits 127"):
        run_page(failing, stub=False)
    assert (tmp_path / "made.txt").read_text() == "made\n"  # it ran, in this directory
    marked = tmp_path / "marked.md"
    marked.write_text("```sh\ntouch ran.txt\n```\n\n<!-- not run: needs TensorRT -->\n"
                      "```sh\nexit 1\n```\n\n```python\nimport os\n```\n")
    runner = run_page(marked, stub=False)
    assert (runner.ran, runner.not_run, runner.skipped) == ([1, 10], [6], [])  # type: ignore
    check_counts(marked, runner)
    assert (tmp_path / "ran.txt").exists()
    # A block the runner did not account for fails the count.
    runner.ran.remove(10)
    with pytest.raises(AssertionError, match=r"blocks at lines \[1, 6, 10\]"):
        check_counts(marked, runner)


def test_the_readme_is_its_first_screen() -> None:
    """At most 250 lines: what it is, install, the quick start, the two commands, security."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for heading in ("## Install", "## Quick start", "## The two commands", "## Security"):
        assert f"\n{heading}\n" in text, heading
    assert "make demo" in text and "make test-all" in text and "trtet-store verify" in text
