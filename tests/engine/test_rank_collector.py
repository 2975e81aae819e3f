"""A rank process and the garbage collector (engine/ranks/rank_process.py)."""

from __future__ import annotations


def test_a_rank_keeps_its_loaded_model_out_of_full_collections_until_it_unloads():
    """A full collection inside a step stalls that rank, and every rank waits for the slowest at each collective:
    what a load built is frozen for the collector while loaded, and collectable again after the unload."""
    import gc

    from omni_console.engine.ranks.rank_process import _run

    class Loaded:
        def load(self, policy):
            self.pipe = [object() for _ in range(100)]
            return "report"

        def unload(self):
            self.pipe = None

    engine = Loaded()
    try:
        assert _run(engine, "load", None, None) == "report"
        assert gc.get_freeze_count() > len(engine.pipe)
        _run(engine, "unload", None, None)
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
