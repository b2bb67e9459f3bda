"""export/record_check.py record_problem / load_record: states no test set up (gap hunt 3).

- ``_string_problem``: every key of the closed name set (``_NAME_KEYS``: ``name``,
  ``parameter_name``, ``buffer_name``, ``tensor_constant_name``, ``custom_obj_name``,
  ``user_input_name``, ``fqn``) is held to a plain name wherever it sits in the program
  (a key dropped from the set would let a quote through to torch's generated code);
- ``expr_str``: a character the tokenizer has no token for (``.``, ``;``) is "not
  arithmetic" (``if m is None``), and a name that starts with ``_`` (``__builtins__``)
  is named, never taken as a symbol;
- ``load_record``: a surprise inside the check (an exception) is a one-line refusal,
  control characters and newlines gone, at most 300 characters of it, and the record
  never loaded.

On a real ``torch.export`` archive (torch's own writer, in-process), as the other record
tests (tests/test_gaps_io_records.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from records_helpers import exported_archive
from test_tier_no_code import archive, members_of

from trtet_store.export import record_check
from trtet_store.export.record_check import UnsafeRecordError, load_record, record_problem

NAME_KEYS = ("name", "parameter_name", "buffer_name", "tensor_constant_name",
             "custom_obj_name", "user_input_name", "fqn")
BAD = "b'); import os; ('"


@pytest.fixture(scope="module")
def plain() -> bytes:
    return exported_archive(weighted=False)


def _with_program(record: bytes, edit) -> bytes:
    m = members_of(record)
    doc = json.loads(m["models/model.json"])
    edit(doc)
    return archive({**m, "models/model.json": json.dumps(doc).encode()})


def _with_expr(record: bytes, expr: str) -> bytes:
    return _with_program(record, lambda d: d["graph_module"]["graph"]["sym_int_values"].update(
        {"s0": {"as_expr": {"expr_str": expr, "hint": None}}}))


def test_record_problem_holds_every_name_key_to_a_plain_name(plain: bytes) -> None:
    """record_check.py ``_NAME_KEYS``: each key of the closed set, planted in the program
    with a quote in its value, is refused by its own name (not by another rule)."""
    assert record_problem(plain) is None
    for key in NAME_KEYS:
        ok = record_problem(_with_program(plain, lambda d, key=key: d["graph_module"].update(
            {"extra_names": [{key: "layer_1.weight"}]})))
        assert ok is None, (key, ok)  # a plain dotted name is data
        said = record_problem(_with_program(plain, lambda d, key=key: d["graph_module"].update(
            {"extra_names": [{key: BAD}]})))
        assert said == f"its program's {key} {BAD!r} is not a plain name", (key, said)


@pytest.mark.parametrize("expr", ["s0.real", "s0; s1", "s0 @ s1", "s0 $ 2"])
def test_record_problem_refuses_an_expression_with_no_token(plain: bytes, expr: str) -> None:
    """record_check.py _string_problem: ``if m is None`` (the tokenizer's ``_TOKEN``
    matches nothing at a ``.``, ``;``, ``@``, ``$``): refused as not arithmetic, in one
    line, never an exception out of the check."""
    said = record_problem(_with_expr(plain, expr))
    assert said == f"its program's expression {expr!r} is not arithmetic", said
    assert record_problem(_with_expr(plain, "Max(s0, 2*u12) // 3")) is None


@pytest.mark.parametrize("word", ["__builtins__", "_s0", "_"])
def test_record_problem_names_a_word_starting_with_an_underscore(plain: bytes,
                                                                word: str) -> None:
    """record_check.py _string_problem: ``word[0].isalpha() or word[0] == "_"``: a name
    that starts with ``_`` is held to the sympy set and the symbol pattern like any other."""
    said = record_problem(_with_expr(plain, f"s0 + {word}"))
    assert said == f"its program's expression {f's0 + {word}'!r} names {word!r}", said


def test_load_record_turns_a_surprise_of_the_check_into_a_one_line_refusal(
        plain: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """record_check.py load_record: ``except Exception`` around ``record_problem``: the
    reason is one line (``\\n`` and control characters replaced), at most 300 characters,
    and ``torch.export.load`` is never reached."""
    import torch

    path = tmp_path / "record.pt2"
    path.write_bytes(plain)
    loads: list[object] = []
    monkeypatch.setattr(torch.export, "load", lambda *a, **k: loads.append(a))

    def surprised(program):
        raise RuntimeError("a reader's\nsurprise\x1b[2J\r" + "x" * 1000)

    monkeypatch.setattr(record_check, "_program_problem", surprised)
    with pytest.raises(UnsafeRecordError) as caught:
        load_record(path)
    problem = caught.value.problem
    assert problem.startswith("it could not be checked (RuntimeError: a reader's surprise"), \
        problem
    assert "\n" not in str(caught.value) and "\x1b" not in problem and "\r" not in problem
    assert len(problem) == 300, len(problem)
    assert loads == []  # never loaded
