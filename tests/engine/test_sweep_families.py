"""Families diffusers 0.42 ships that no earlier family test covered, each built as diffusers' own fast test
builds it and compared with plain `DiffusionPipeline.from_pretrained(dir)` + `__call__`: bit-identical under the
six policies of `test_new_families` (streamed with 0 or 1 resident blocks, all resident, spread placement,
resident mode, encoders streamed layer by layer).

Where a family needs an optional package CI lacks (torchvision for OmniGen's processor and Cosmos' transformer,
cosmos_guardrail for Cosmos' pipeline), the comparison runs with `optional_stand_ins`, and a test without them
asserts the one-line refusal before load, where plain diffusers fails after loading.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_new_families import PROMPT, assert_bit_identical
from tiny_families_others import IMAGE_FAMILIES, OTHER_GENERATION, OTHER_MAKERS
from tiny_families_qwen import QWEN_GENERATION, QWEN_MAKERS

from omni_console.engine.demo.demo_model import atomic_build, save_pipeline
from omni_console.engine.engine import Engine

GENERATION = {**QWEN_GENERATION, **OTHER_GENERATION}
MAKERS = {**{family: (*entry, None) for family, entry in QWEN_MAKERS.items()}, **OTHER_MAKERS}
NEEDS_STAND_INS = {"omnigen", "cosmos"}


def build_sweep_family(family: str, path: Path, seed: int = 0) -> Path:
    """Write `family` to `path` (atomically; an identical earlier build is kept)."""
    make, layout, rewrite = MAKERS[family]

    def build(tmp: Path) -> None:
        save_pipeline(make(seed), tmp, class_names=layout)
        if rewrite is not None:
            rewrite(tmp)

    return atomic_build(Path(path), build, {"family": family, "seed": seed})


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("sweep-families")
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_sweep_family(family, root / family)
        return built[family]

    return get


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import numpy as np
    from PIL import Image

    ramp = np.linspace(0, 255, 32, dtype=np.uint8)
    pixels = np.stack([np.tile(ramp, (32, 1)), np.tile(ramp[:, None], (1, 32)), np.full((32, 32), 90, np.uint8)], -1)
    path = tmp_path_factory.mktemp("inputs") / "first-frame.png"
    Image.fromarray(pixels, "RGB").save(path)
    return path


def test_every_family_has_a_generation_and_a_maker():
    assert set(GENERATION) == set(MAKERS)


@pytest.mark.slow  # six loads and requests each
@pytest.mark.parametrize("family", sorted(MAKERS))
def test_family_runs_bit_identical_to_plain_diffusers(family, sweep_dir, image, monkeypatch):
    from optional_stand_ins import stand_in_for_cosmos_guardrail, stand_in_for_torchvision

    if family in NEEDS_STAND_INS:
        stand_in_for_torchvision(monkeypatch)
        stand_in_for_cosmos_guardrail(monkeypatch)
    path = sweep_dir(family)
    assert_bit_identical(path, family, GENERATION, {}, image if family in IMAGE_FAMILIES else None)
    for denoiser in Engine(path, device="cpu").model.denoisers:  # a UNet's lists are its blocks' units
        assert denoiser.role == "unet" or all(len(b.block_bytes) >= 2 for b in denoiser.block_lists), denoiser


def test_glm_image_as_save_pretrained_names_it_loads_transformers_own_classes(sweep_dir):
    """`["glm_image", "GlmImageProcessor"]` is what diffusers writes and loads (its package re-exports
    transformers' class): the engine resolves it to that class, never to anything else the package holds."""
    import json

    import transformers

    from omni_console.engine.model_dir.trusted_classes import component_class

    path = sweep_dir("glm_image_saved")
    index = json.loads((path / "model_index.json").read_text())
    assert index["processor"] == ["glm_image", "GlmImageProcessor"]
    model = Engine(path, device="cpu").model
    processor = model.component("processor")
    assert processor.library == "transformers"
    assert component_class("glm_image", "GlmImageProcessor", "here") is transformers.GlmImageProcessor


@pytest.mark.parametrize(("library", "name"), [
    ("glm_image", "GlmImagePipelineOutput"),  # the package's own, not a component class
    ("glm_image", "T5EncoderModel"),  # imported by its pipeline module, not re-exported by the package
    ("glm_image", "GlmImageProcessorX"),
    ("stable_diffusion", "CLIPTextModel"),
])
def test_a_pipeline_package_name_resolves_only_to_what_it_re_exports_from_transformers(library, name):
    from omni_console.engine.errors import ModelDirError
    from omni_console.engine.model_dir.trusted_classes import check_component

    with pytest.raises(ModelDirError):
        check_component(library, name, "model_index.json: 'processor'")


def _run(path: Path, out: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, list[str], list[str]]:
    from omni_console.console.cli import main

    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    capsys.readouterr()
    code = main(["run", "--model", str(path), "--prompt", PROMPT, "--steps", "1", "--height", "32", "--width", "32",
                 "--output", str(out)])
    return code, loads, capsys.readouterr().err.strip().splitlines()


def _without(monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> None:
    import importlib

    monkeypatch.delattr(importlib.import_module(module), name, raising=False)


def test_omnigen_without_torchvision_is_refused_before_load(sweep_dir, tmp_path, monkeypatch, capsys):
    path = sweep_dir("omnigen")
    _without(monkeypatch, "diffusers.pipelines.omnigen.pipeline_omnigen", "OmniGenMultiModalProcessor")
    code, loads, err = _run(path, tmp_path / "o.png", monkeypatch, capsys)
    assert code == 2 and loads == [] and len(err) == 1 and not (tmp_path / "o.png").exists()
    assert err[0].endswith("OmniGenPipeline uses OmniGenMultiModalProcessor, which needs torchvision: not installed "
                           "(pip install torchvision); plain diffusers fails alike, after loading")


def test_cosmos_without_its_guardrail_or_torchvision_is_refused_before_load(sweep_dir, tmp_path, monkeypatch,
                                                                             capsys):
    """The pipeline builds `CosmosSafetyChecker` in `__init__` (diffusers' stand-in raises without
    cosmos_guardrail); its transformer resizes a mask with torchvision in every forward."""
    import diffusers.pipelines.cosmos.pipeline_cosmos2_text2image as cosmos_pipeline
    from optional_stand_ins import stand_in_for_cosmos_guardrail

    path = sweep_dir("cosmos")
    _without(monkeypatch, "diffusers.models.transformers.transformer_cosmos", "transforms")
    stand_in = cosmos_pipeline.CosmosSafetyChecker
    if stand_in.__module__ == cosmos_pipeline.__name__:  # diffusers' raising stand-in: no cosmos_guardrail here
        code, loads, err = _run(path, tmp_path / "c.png", monkeypatch, capsys)
        assert code == 2 and loads == [] and len(err) == 1
        assert err[0].endswith("Cosmos2TextToImagePipeline uses CosmosSafetyChecker, which needs cosmos_guardrail: "
                               "not installed (pip install cosmos_guardrail); plain diffusers fails alike, after "
                               "loading")
    stand_in_for_cosmos_guardrail(monkeypatch)
    code, loads, err = _run(path, tmp_path / "c.png", monkeypatch, capsys)
    assert code == 2 and loads == [] and len(err) == 1 and not (tmp_path / "c.png").exists()
    assert err[0].endswith("transformer (CosmosTransformer3DModel) uses transforms, which needs torchvision: not "
                           "installed (pip install torchvision); plain diffusers fails alike, after loading")


def test_optional_package_uses_are_read_from_diffusers_own_source():
    """Names bound only when a package is installed and used without asking again, in pipelines and in model
    classes; a module that asks `is_<package>_available()` where it uses the name needs nothing."""
    import importlib.util

    from omni_console.engine.running.pipeline_needs import _unguarded_names

    def needs(module: str) -> set[tuple[str, str, bool]]:
        path = Path(importlib.util.find_spec(module).origin)
        return {(g.name, g.package, g.stand_in) for g in _unguarded_names(path)}

    assert needs("diffusers.pipelines.omnigen.pipeline_omnigen") == {
        ("OmniGenMultiModalProcessor", "torchvision", False)}
    assert needs("diffusers.models.transformers.transformer_cosmos") == {("transforms", "torchvision", False)}
    assert needs("diffusers.pipelines.cosmos.pipeline_cosmos2_text2image") == {
        ("CosmosSafetyChecker", "cosmos_guardrail", True)}
    assert needs("diffusers.pipelines.prx.pipeline_prx") == {("ftfy", "ftfy", False)}
    for module in ("stable_diffusion_xl.pipeline_stable_diffusion_xl", "pixart_alpha.pipeline_pixart_sigma",
                   "wan.pipeline_wan", "flux.pipeline_flux"):
        assert needs(f"diffusers.pipelines.{module}") == set(), module


def test_class_conditional_dit_runs_without_a_prompt_as_diffusers_does(tmp_path, capsys):
    """DiT's call takes `class_labels` and no prompt: `run` (whose prompt has a default) passes none, and the
    image is plain diffusers' for the same labels, steps and seed."""
    import numpy as np
    import torch
    from diffusers import DiffusionPipeline
    from PIL import Image
    from tiny_families_others import make_dit_pipeline

    from omni_console.console.cli import main

    path = tmp_path / "dit"
    save_pipeline(make_dit_pipeline(0), path)
    out = tmp_path / "dit.png"
    code = main(["run", "--model", str(path), "--steps", "2", "--seed", "4", "--param", "class_labels=[7]",
                 "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    plain = pipe(class_labels=[7], num_inference_steps=2, generator=torch.Generator().manual_seed(4)).images[0]
    assert np.array_equal(np.asarray(Image.open(out)), np.asarray(plain))


@pytest.mark.parametrize(("package", "name", "accepted"), [
    ("kolors", "ChatGLMTokenizer", True),  # Kolors' tokenizer config names its own package's class
    (None, "ChatGLMTokenizer", False),  # anywhere else it is no transformers class
    ("kolors", "EvilTokenizer", False),
    ("kolors", "KolorsPipeline", False),  # the package's pipeline is no tokenizer
])
def test_a_tokenizer_class_may_name_its_components_own_package_class(package, name, accepted, tmp_path):
    from omni_console.engine.errors import ModelDirError
    from omni_console.engine.model_dir.config_checks import check_config_document

    path = tmp_path / "tokenizer_config.json"
    try:
        check_config_document(path, {"tokenizer_class": name}, package=package)
    except ModelDirError as refused:
        assert not accepted and "is not a transformers class" in str(refused)
    else:
        assert accepted


@pytest.mark.parametrize(("extra", "line"), [
    ((), "--steps 2: Ideogram4Pipeline's default guidance_schedule has 48 values, one per step (ask for 48 steps, "
         "give --param guidance_schedule=[...] with 2 values, or a constant --guidance)"),
    (("--param", "guidance_schedule=[3,2,1]"), "--steps 2: --param guidance_schedule has 3 values, one per step "
                                               "(give 3 steps)"),
])
def test_ideogram4_steps_its_guidance_schedule_does_not_fit_are_refused_before_load(extra, line, sweep_dir, tmp_path,
                                                                                     monkeypatch, capsys):
    from omni_console.console.cli import main

    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    capsys.readouterr()
    code = main(["run", "--model", str(sweep_dir("ideogram4")), "--prompt", PROMPT, "--steps", "2", "--height", "16",
                 "--width", "16", "--max-sequence-length", "64", *extra, "--output", str(tmp_path / "i.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and loads == [] and len(err) == 1 and err[0].endswith(line), err


@pytest.mark.slow  # a load, a request and a plain pipeline call
def test_ideogram4_constant_guidance_replaces_its_schedule_as_its_docstring_says(sweep_dir, tmp_path, capsys):
    """`--guidance 3` is `guidance_scale=3, guidance_schedule=None` (plain diffusers refuses both set)."""
    import numpy as np
    import torch
    from diffusers import DiffusionPipeline
    from PIL import Image

    from omni_console.console.cli import main

    path, out = sweep_dir("ideogram4"), tmp_path / "i.png"
    code = main(["run", "--model", str(path), "--prompt", PROMPT, "--steps", "2", "--height", "16", "--width", "16",
                 "--guidance", "3", "--max-sequence-length", "64", "--seed", "2", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    plain = pipe(prompt=PROMPT, num_inference_steps=2, height=16, width=16, guidance_scale=3.0, guidance_schedule=None,
                 max_sequence_length=64, generator=torch.Generator().manual_seed(2)).images[0]
    assert np.array_equal(np.asarray(Image.open(out)), np.asarray(plain))


def test_unconditional_ddpm_is_planned_at_its_own_size_and_runs_as_diffusers_does(tmp_path, capsys):
    """A pixel-space UNet with no VAE renders its sample size (8x8 here), not 8x that; `run` sends no prompt."""
    import numpy as np
    import torch
    from diffusers import DiffusionPipeline
    from PIL import Image
    from tiny_families_others import make_ddpm_pipeline

    from omni_console.console.cli import main
    from omni_console.engine.model_dir.discovery import discover_model
    from omni_console.engine.planning.model_configs import default_size

    path = tmp_path / "ddpm"
    save_pipeline(make_ddpm_pipeline(0), path)
    size = default_size(discover_model(path))
    assert (size.height, size.width) == (8, 8)
    out = tmp_path / "ddpm.png"
    assert main(["run", "--model", str(path), "--steps", "3", "--seed", "5", "--output", str(out)]) == 0, \
        capsys.readouterr().err
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    plain = pipe(num_inference_steps=3, generator=torch.Generator().manual_seed(5)).images[0]
    assert np.array_equal(np.asarray(Image.open(out)), np.asarray(plain)) and Image.open(out).size == (8, 8)


def test_a_prompt_for_a_pipeline_that_takes_none_is_refused_before_load(tmp_path, monkeypatch, capsys):
    from tiny_families_others import make_ddpm_pipeline

    from omni_console.console.cli import main

    path = tmp_path / "ddpm"
    save_pipeline(make_ddpm_pipeline(0), path)
    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    capsys.readouterr()
    code = main(["run", "--model", str(path), "--prompt", "a fox", "--steps", "2", "--output", str(tmp_path / "d.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and loads == [] and len(err) == 1, err
    assert err[0].endswith("--prompt: DDPMPipeline takes no prompt (it is not text-conditioned)")
