"""The closed set of a set member's file names (``check_member_files``), each rule on its own.

The program is a plain ``<name>.pte``: a hidden one, one that is only the
suffix, or one of another suffix is refused; the other files are plain
``.ptd`` names; no name twice. The refusal is one line naming the file.
"""

from __future__ import annotations

import pytest

from trtet_store.remote.errors import FileNameError
from trtet_store.sets.manifest import check_member_files, member_file_problem


@pytest.mark.parametrize("names,said", [
    ([".model.pte", "w.ptd"], "the program's name '.model.pte' starts with a dot"),
    ([".pte", "w.ptd"], "the program's name '.pte' starts with a dot"),
    (["model.ptd", "w.ptd"], "the program's name 'model.ptd' is not a .pte name"),
    (["model.pte", "w.ptd", "w.ptd"], "names a file twice"),
    ([], "has no files"),
])
def test_a_member_outside_the_closed_set_is_refused_in_one_line(names: list, said: str) -> None:
    with pytest.raises(FileNameError) as caught:
        check_member_files(names, "set member 'a'")
    assert said in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_a_plain_member_passes() -> None:
    check_member_files(["model.pte", "cpu.ptd", "foundation.ptd"], "set member 'a'")
    assert member_file_problem("m.pte", program=True) is None
    assert member_file_problem("x.pte", program=False) is not None  # a .pte is no data file
