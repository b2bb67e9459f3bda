"""``trtet-store compile-and-save --method NAME=MODULE.py:FACTORY`` given twice with one NAME
is refused (trtet_store/cli/sources.py, ``compile_source``; cli.sources): the first method
would otherwise be silently replaced by the second, and a program built without it.

The refusal comes before the second factory is even loaded (``made_by`` never runs it), and
before anything is built or written: compile_and_save is never called, OUT is not written.
"""

from __future__ import annotations

import pytest

from trtet_store.cli import main

pytestmark = pytest.mark.executorch(reason="compile-and-save --method exports with torch")

FACTORY = '''\
import pathlib

import torch


def make():
    pathlib.Path(__file__).with_name("{marker}").write_text("ran")
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4).eval(), (torch.randn(1, 4),)
'''


@pytest.fixture
def handed(monkeypatch):
    """compile_and_save replaced by a recorder that builds nothing (it must not be reached)."""
    import trtet_store

    calls: list[tuple] = []

    def recording(source, inputs, out, **kwargs):
        calls.append((source, inputs, out))
        raise RuntimeError("compile_and_save reached")

    monkeypatch.setattr(trtet_store, "compile_and_save", recording)
    return calls


def test_compile_and_save_refuses_a_method_given_twice(handed, here_fs, monkeypatch,
                                                        capsys) -> None:
    """--method fwd=a.py:make --method fwd=b.py:make: refused in one line naming 'fwd';
    b.py's factory never ran, nothing compiled, OUT not written."""
    monkeypatch.chdir(here_fs)
    (here_fs / "a.py").write_text(FACTORY.format(marker="a-ran"))
    (here_fs / "b.py").write_text(FACTORY.format(marker="b-ran"))
    (here_fs / "out").mkdir()
    code = main(["compile-and-save", "--method", "fwd=a.py:make", "--method", "fwd=b.py:make",
                 "out/p.pte", "--no-progress"])
    err = capsys.readouterr().err
    assert "--method 'fwd' given twice" in err, err
    assert code != 0
    assert not (here_fs / "b-ran").exists()  # the second factory was never run
    assert handed == []
    assert list((here_fs / "out").iterdir()) == []


def test_compile_and_save_takes_two_distinct_methods(handed, here_fs, monkeypatch,
                                                     capsys) -> None:
    """The control: two different names are both handed on (each factory ran once)."""
    monkeypatch.chdir(here_fs)
    (here_fs / "a.py").write_text(FACTORY.format(marker="a-ran"))
    (here_fs / "b.py").write_text(FACTORY.format(marker="b-ran"))
    (here_fs / "out").mkdir()
    code = main(["compile-and-save", "--method", "fwd=a.py:make", "--method", "bwd=b.py:make",
                 "out/p.pte", "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0 and "compile_and_save reached" in err, err
    [(source, inputs, _)] = handed
    assert sorted(source) == ["bwd", "fwd"] and inputs is None
    assert (here_fs / "a-ran").exists() and (here_fs / "b-ran").exists()
