"""cli/__init__.py _negative_values_joined: an optional-value option before a positional.

``--engine-cache`` takes an optional directory; written right before compile-and-save's
positional (``m.py:make`` or ``out.pte``) it is given without its value
(``--engine-cache=``) and the token stays positional; before a directory it keeps it as
its value; as the last word it is left as it is (never an IndexError). Each operand of
``if args[i] in _OPTIONAL_VALUES and i + 1 < len(args) and _positional(args[i + 1])``.
"""

from __future__ import annotations

import pytest

from trtet_store.cli import _negative_values_joined


@pytest.mark.parametrize(("argv", "want"), [
    (["compile-and-save", "--engine-cache", "m.py:make", "a.pte"],
     ["compile-and-save", "--engine-cache=", "m.py:make", "a.pte"]),
    (["compile-and-save", "--engine-cache", "out.pte", "--no-progress"],
     ["compile-and-save", "--engine-cache=", "out.pte", "--no-progress"]),
    # a directory after it is its value
    (["compile-and-save", "--engine-cache", "/cache/dir", "m.py:make", "a.pte"],
     ["compile-and-save", "--engine-cache", "/cache/dir", "m.py:make", "a.pte"]),
    # the last word: nothing after it to look at
    (["compile-and-save", "m.py:make", "a.pte", "--engine-cache"],
     ["compile-and-save", "m.py:make", "a.pte", "--engine-cache"]),
    # another option before a positional is no optional-value option
    (["compile-and-save", "--no-progress", "m.py:make", "a.pte"],
     ["compile-and-save", "--no-progress", "m.py:make", "a.pte"]),
    (["cache", "gc", "--older-than", "-1d"], ["cache", "gc", "--older-than=-1d"]),
])
def test_an_optional_value_option_before_a_positional_is_given_no_value(argv, want) -> None:
    assert _negative_values_joined(argv) == want
    assert _negative_values_joined(want) == want  # already joined: left as it is
