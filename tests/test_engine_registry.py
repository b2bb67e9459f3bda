"""An earlier export's finalizer never unregisters the engines a reused build registered.

A reused build (export/engine_reuse.py) registers its engines under the ids the
recorded program names, which the interrupted export's engines had. That
export's program unregisters its engines in a ``weakref.finalize``, run
whenever the garbage collector reaches it, possibly in the middle of the next
export's lowering (CI saw `engine ... is not registered` in
test_compile_and_publish). The state is set up here directly: two engine
objects under one id, the older one unregistered.
"""

from __future__ import annotations

from trtet_store.export import tensorrt


def test_unregistering_an_old_engine_keeps_a_new_one_of_the_same_id() -> None:
    old = tensorrt.Engine("same-id-as-recorded", None, None, [])
    new = tensorrt.Engine("same-id-as-recorded", None, None, [])
    with tensorrt._engines_lock:
        tensorrt._engines[old.engine_id] = old
        tensorrt._engines[new.engine_id] = new  # the reuse re-registers the recorded id
    try:
        tensorrt.unregister_engines([old])  # the earlier export's finalizer
        assert tensorrt.lookup_engine("same-id-as-recorded") is new
        tensorrt.unregister_engines([new])
        assert "same-id-as-recorded" not in tensorrt._engines
    finally:
        tensorrt._engines.pop("same-id-as-recorded", None)
