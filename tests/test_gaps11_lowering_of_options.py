"""options.lowering_of: the compile settings left after the lowering options are judged
against the LOWERING's backend, whichever way it came (``lowering=LoweringOptions(backend=
"xnnpack")`` or the old ``backend=`` keyword): a TensorRT setting with XNNPACK is refused
by name before anything is exported, never silently ignored. And the old keywords are taken
out of the settings handed on (a lowering field never reaches Torch-TensorRT).
"""

from __future__ import annotations

import pytest

from trtet_store.export.options import LoweringOptions, lowering_of


def test_lowering_of_judges_settings_by_the_lowering_objects_backend() -> None:
    with pytest.raises(TypeError, match=r"compile settings \['min_block_size'\] with "
                                        r"backend='xnnpack'"):
        lowering_of(LoweringOptions(backend="xnnpack"), "export", {"min_block_size": 2}, ())
    with pytest.raises(TypeError, match=r"compile settings \['min_block_size'\] with "
                                        r"backend='xnnpack'"):
        lowering_of(None, "export", {"backend": "xnnpack", "min_block_size": 2}, ())


def test_lowering_of_hands_on_only_the_compile_settings() -> None:
    options, settings = lowering_of(None, "compile_and_save", {
        "backend": "tensorrt", "external_engine_data": "eng", "generate_etrecord": True,
        "min_block_size": 2}, ("path",))
    assert settings == {"min_block_size": 2}
    assert (options.backend, options.external_engine_data, options.generate_etrecord) == \
        ("tensorrt", "eng", True)
    given = LoweringOptions(external_weights="w")
    options, settings = lowering_of(given, "export", {"min_block_size": 3}, ())
    assert options is given or options == given
    assert settings == {"min_block_size": 3}


@pytest.mark.executorch(reason="compile_and_save and export import torch")
def test_compile_and_save_and_export_refuse_a_tensorrt_setting_with_an_xnnpack_lowering(
        tmp_path) -> None:
    import trtet_store
    from trtet_store.testing.stub_tensorrt import linear_relu

    module, inputs = linear_relu()
    xnn = LoweringOptions(backend="xnnpack")
    with pytest.raises(TypeError, match="backend='xnnpack'"):
        trtet_store.compile_and_save(module, inputs, tmp_path / "m.pte", lowering=xnn,
                                     min_block_size=2)
    with pytest.raises(TypeError, match="backend='xnnpack'"):
        trtet_store.export.export(module, inputs=inputs, lowering=xnn, min_block_size=2)
    assert list(tmp_path.iterdir()) == []
