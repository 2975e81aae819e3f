"""The class index kept across processes: a second `plan` looks up no export table (it re-reads only the
module each cached class names, to confirm it), a cache file that is not exactly what we write is ignored,
and a well-formed but false answer (a poisoned file) is recomputed: it never widens what `plan` accepts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from omni_console.engine.errors import ModelDirError
from omni_console.engine.model_dir import class_index, class_index_cache, init_layout, installed_source
from omni_console.engine.model_dir.trusted_classes import check_component, check_pipeline


@pytest.fixture()
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder and a process that has read nothing yet (as a new `plan` starts)."""
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path))
    _new_process()
    yield tmp_path
    _new_process()


def _new_process() -> None:
    class_index_cache.forget_loaded()
    for cached in (class_index.find_class, class_index.find_pipeline_package_class, init_layout.init_layout):
        cached.cache_clear()


def _no_export_lookups(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("looked up the export tables although the answer was cached")

    monkeypatch.setattr(class_index, "_exporting_module", refuse)


def _ask() -> tuple:
    return (check_pipeline("FluxPipeline", "model_index.json"),
            check_component("transformers", "T5TokenizerFast", "tokenizer_2"),
            check_component("diffusers", "FluxTransformer2DModel", "transformer"),
            class_index.exports("transformers", "EvilTokenizer"),
            init_layout.init_layout("FluxTransformer2DModel"))


def test_second_process_looks_up_no_export_table(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch):
    first = _ask()
    assert first[0].kind == "pipeline" and first[1].kind == "loadable" and first[2].kind == "weights"
    assert first[3] is False and "transformer_blocks" in first[4].order
    (index,) = (fresh_cache / "class_index").iterdir()
    _new_process()
    _no_export_lookups(monkeypatch)
    assert _ask() == first
    assert index.stat().st_size < class_index_cache.MAX_INDEX_BYTES


def test_a_refusal_is_still_a_refusal_from_the_cache(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch):
    for _ in range(2):
        with pytest.raises(ModelDirError, match="transformers has no class 'EvilTokenizer'"):
            check_component("transformers", "EvilTokenizer", "tokenizer")
        with pytest.raises(ModelDirError, match="is a pipeline; nested pipelines are refused"):
            check_component("diffusers", "FluxPipeline", "nested")
        _new_process()
        _no_export_lookups(monkeypatch)


@pytest.mark.parametrize("entry", [
    {"find|diffusers|FluxPipeline": {"module": "os.path", "kind": "weights", "is_class": True}},  # outside diffusers
    {"find|diffusers|FluxPipeline": {"module": "diffusers.x", "kind": "code", "is_class": True}},  # unknown kind
    {"find|diffusers|FluxPipeline": {"module": "diffusers.x", "kind": "weights", "is_class": 1}},
    {"find|diffusers|FluxPipeline": {"module": "diffusers..x", "kind": "weights", "is_class": True}},
    {"exports|transformers|EvilTokenizer": "yes"},
    {"exports|evil|EvilTokenizer": True},
    {"package_class|stable_diffusion|X": {"module": "diffusers.models.x", "kind": "weights", "is_class": True}},
    {"layout|diffusers|FluxTransformer2DModel": {"order": ["a.b"], "counts": []}},
    {"other|diffusers|FluxPipeline": None},
])
def test_a_forged_entry_discards_the_file(fresh_cache: Path, entry: dict):
    """One entry that is not what we write (a module outside the package, a made-up kind, a non-bool) and
    the whole file is ignored: FluxPipeline is read from diffusers' source again, a pipeline."""
    path = class_index_cache.index_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": class_index_cache.INDEX_VERSION,
                                "entries": {"exports|diffusers|FluxPipeline": True, **entry}}))
    ref = check_pipeline("FluxPipeline", "model_index.json")
    assert (ref.module, ref.kind) == ("diffusers.pipelines.flux.pipeline_flux", "pipeline")
    assert class_index.exports("transformers", "EvilTokenizer") is False


def test_a_symlink_or_fifo_is_never_read(fresh_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    path = class_index_cache.index_path()
    path.parent.mkdir(parents=True)
    forged = tmp_path_factory.mktemp("elsewhere") / "forged.json"
    forged.write_text(json.dumps({"version": class_index_cache.INDEX_VERSION,
                                  "entries": {"exports|transformers|EvilTokenizer": True}}))
    path.symlink_to(forged)
    assert class_index.exports("transformers", "EvilTokenizer") is False
    path.unlink()
    os.mkfifo(path)
    class_index_cache.forget_loaded()
    assert class_index.exports("transformers", "EvilTokenizer") is False  # the open does not block


def test_another_installation_has_another_file(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch):
    """A new diffusers (version or a reinstall's `__init__.py` time) never sees the old answers."""
    before = class_index_cache.index_path()
    key = class_index_cache._package_key("diffusers")
    monkeypatch.setattr(class_index_cache, "_package_key",
                        lambda lib: (*key[:3], key[3] + 1) if lib == "diffusers" else ("transformers",))
    assert class_index_cache.index_path() != before
    assert installed_source.package_root("diffusers") is not None


def _poison(entries: dict) -> None:
    """A cache file of exactly the shape we write, whose answers are false."""
    path = class_index_cache.index_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": class_index_cache.INDEX_VERSION, "entries": entries}))
    _new_process()


FLUX_MODULE = "diffusers.pipelines.flux.pipeline_flux"


def test_a_poisoned_answer_never_widens_what_is_accepted(fresh_cache: Path):
    _poison({"find|diffusers|EvilPipeline": {"module": FLUX_MODULE, "kind": "pipeline", "is_class": True},
             "find|diffusers|FluxPipeline": {"module": FLUX_MODULE, "kind": "weights", "is_class": True},
             "exports|transformers|EvilTokenizer": True,
             "find|transformers|EvilFast": {"module": "transformers.models.t5.modeling_t5", "kind": "other",
                                            "is_class": False},
             "exports|transformers|EvilFast": True,
             "package_class|flux|EvilClass": {"module": FLUX_MODULE, "kind": "weights", "is_class": True},
             "layout|diffusers|FluxTransformer2DModel": {"order": ["transformer_blocks"], "counts": []}})
    with pytest.raises(ModelDirError, match="EvilPipeline"):
        check_pipeline("EvilPipeline", "model_index.json")
    with pytest.raises(ModelDirError, match="is a pipeline; nested pipelines are refused"):
        check_component("diffusers", "FluxPipeline", "nested")
    assert class_index.exports("transformers", "EvilTokenizer") is False
    assert class_index.exports("transformers", "EvilFast") is False
    assert class_index.find_pipeline_package_class("flux", "EvilClass") is None
    layout = init_layout.init_layout("FluxTransformer2DModel")
    assert layout is not None and {c.key for c in layout.counts} >= {"num_layers", "num_single_layers"}
    assert "single_transformer_blocks" in layout.order
    entries = json.loads(class_index_cache.index_path().read_text())["entries"]  # the false answers are replaced
    assert entries["find|diffusers|FluxPipeline"]["kind"] == "pipeline"
    assert entries["exports|transformers|EvilFast"] is False


def test_plan_refuses_what_a_poisoned_cache_would_admit(fresh_cache: Path, demo_model_dir: Path, tmp_path: Path,
                                                         capsys):
    from test_hostile_dirs import copy_model, edit_json

    from omni_console.console.cli import main

    root = copy_model(demo_model_dir, tmp_path)
    edit_json(root / "model_index.json", lambda doc: doc.update(_class_name="EvilPipeline"))
    edit_json(root / "tokenizer" / "tokenizer_config.json", lambda doc: doc.update(tokenizer_class="EvilTokenizer"))
    _poison({"find|diffusers|EvilPipeline": {"module": FLUX_MODULE, "kind": "pipeline", "is_class": True},
             "exports|diffusers|EvilPipeline": True, "exports|transformers|EvilTokenizer": True})
    assert main(["plan", "--model", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "EvilPipeline" in err and "Traceback" not in err, err
