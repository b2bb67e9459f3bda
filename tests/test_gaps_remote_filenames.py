"""The name rules' first lines: what is not a string, empty, ``.``, ``..``, a backslash path.

The Unicode categories are held by tests/test_remote_filenames_unicode.py;
these are the checks before them, for both rules (a program's files, and
the plain-name floor every manifest is held to), and the caller that names
the files it expects.
"""

from __future__ import annotations

import pytest

from trtet_store.remote.errors import FileNameError
from trtet_store.remote.filenames import check_program_names, name_problem, plain_name_problem


@pytest.mark.parametrize("name,said", [
    (None, "is a NoneType, not a file name"), (b"m.pte", "is a bytes, not a file name"),
    ("", "is not a file name"), (".", "is not a file name"), ("..", "is not a file name"),
    ("a\\b.ptd", "is a path, not a plain file name"),
    ("a/b.ptd", "is a path, not a plain file name"),
])
def test_a_name_that_is_no_plain_file_name(name: object, said: str) -> None:
    assert name_problem(name) == said
    assert name_problem(name, program=True) == said


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\\b", "/", "\\"])
def test_the_plain_name_floor_refuses_paths_and_dots(name: str) -> None:
    assert plain_name_problem(name) == "is not a plain file name (a path, empty, '.' or '..')"
    assert plain_name_problem(7) == "is a int, not a file name"
    assert plain_name_problem("..a") is None and plain_name_problem("a..") is None


def test_expected_names_are_held_to_the_rule_and_to_their_order() -> None:
    with pytest.raises(FileNameError) as caught:
        check_program_names(["m.pte"], "here", expected=["../m.pte"])
    assert str(caught.value).startswith("here: the expected file name '../m.pte' is a path")
    with pytest.raises(FileNameError) as caught:
        check_program_names(["m.pte", "b.ptd", "a.ptd"], "here",
                            expected=["m.pte", "a.ptd", "b.ptd"])
    assert str(caught.value).startswith("here names the files ['m.pte', 'b.ptd', 'a.ptd'], "
                                        "not the ['m.pte', 'a.ptd', 'b.ptd'] expected")
    check_program_names(["m.pte", "a.ptd"], "here", expected=["m.pte", "a.ptd"])
