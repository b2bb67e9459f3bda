"""LoweringOptions refuses TensorRT's ``compile_specs`` with ``backend="xnnpack"``.

XNNPACK's partitioner never sees ``compile_specs`` (they are the TensorRT partitioner's):
accepted, they would be ignored without a word, and a program built without what the
caller asked for. They are refused when the options are made, whichever way they are
made: the object, ``dataclasses.replace`` of a TensorRT one, or export's old keywords
(``lowering_of``, what ``export`` and ``compile_and_save`` call before anything is
built). No torch: the refusal comes before any lowering.
"""

from __future__ import annotations

import dataclasses

import pytest

from trtet_store.export.options import LoweringOptions, lowering_of

SPECS = [object()]  # what the caller would pass: the TensorRT partitioner's compile specs
WORDS = r"compile_specs are for the TensorRT partitioner \(backend='tensorrt'\)"


@pytest.mark.parametrize("specs", [SPECS, [], {"forward": SPECS}, {"forward": None}])
def test_compile_specs_with_xnnpack_are_refused_when_made(specs) -> None:
    with pytest.raises(ValueError, match=WORDS):
        LoweringOptions(backend="xnnpack", compile_specs=specs)
    trt = LoweringOptions(backend="tensorrt", compile_specs=specs)  # where they belong
    assert trt.compile_specs is specs
    with pytest.raises(ValueError, match=WORDS):
        dataclasses.replace(trt, backend="xnnpack")


def test_exports_old_keywords_refuse_them_too() -> None:
    with pytest.raises(ValueError, match=WORDS):
        lowering_of(None, "export", {"backend": "xnnpack", "compile_specs": SPECS}, ())
    with pytest.raises(ValueError, match=WORDS):
        lowering_of(None, "compile_and_save", {"compile_specs": {"forward": SPECS},
                                               "backend": "xnnpack"}, ())
    options, settings = lowering_of(None, "export", {"backend": "xnnpack"}, ())
    assert options.backend == "xnnpack" and options.compile_specs is None and settings == {}
