"""Class checks without importing: `plan` imports neither torch, diffusers nor transformers, and the
import-free verdict on a class name is the one the real, imported class gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_console.engine.errors import ModelDirError
from omni_console.engine.model_dir.trusted_classes import check_component, check_pipeline, holds_weights

HEAVY = ("torch", "diffusers", "transformers")

PROBE = r"""
import sys
from omni_console.console.cli import main
code = main(["plan", "--model", sys.argv[1]])
print("IMPORTED", [m for m in {heavy!r} if m in sys.modules], code)
"""


def _fixture_classes(*roots: Path) -> set[tuple[str, str]]:
    found = set()
    for root in roots:
        index = json.loads((root / "model_index.json").read_text())
        found |= {tuple(v) for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and v[0]}
    return found


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["demo_model_dir", "sd3_model_dir", "pixart_model_dir", "wan_model_dir"])
def test_plan_imports_no_heavy_library(fixture: str, request: pytest.FixtureRequest):
    """The plan of every fixture model is printed without importing torch, diffusers or transformers."""
    root = request.getfixturevalue(fixture)
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), str(root)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "IMPORTED [] 0", out.stdout[-500:]


EXTRA = [("transformers", n) for n in ("T5TokenizerFast", "CLIPTokenizerFast", "AutoTokenizer", "AutoModel",
                                       "CLIPImageProcessor", "CLIPProcessor", "PreTrainedTokenizerFast",
                                       "Qwen2_5_VLForConditionalGeneration", "CLIPConfig", "pipeline",
                                       "Trainer", "PreTrainedModel", "EvilTokenizer")] + \
        [("diffusers", n) for n in ("AutoModel", "ConfigMixin", "VaeImageProcessor", "DiffusionPipeline",
                                    "FluxPipeline", "UniPCMultistepScheduler", "ModelMixin", "EMAModel")]


def _imported_kind(library: str, name: str) -> str:
    """What the real class is, by importing it: the rules the loader applies to the imported class."""
    import importlib

    module = importlib.import_module(library)
    try:
        cls = getattr(module, name)
    except AttributeError:
        return "unknown"
    if not isinstance(cls, type):
        return "not a class"
    diffusers = importlib.import_module("diffusers")
    if issubclass(cls, (diffusers.DiffusionPipeline, diffusers.ModularPipeline, diffusers.ModularPipelineBlocks)):
        return "pipeline"
    transformers = importlib.import_module("transformers")
    loadable = (diffusers.ModelMixin, diffusers.SchedulerMixin, diffusers.AutoModel, transformers.PreTrainedModel,
                transformers.PreTrainedTokenizerBase, transformers.ProcessorMixin, transformers.ImageProcessingMixin,
                transformers.FeatureExtractionMixin, transformers.BaseVideoProcessor)
    auto = cls.__module__.startswith("transformers.models.auto.") and cls.__name__.startswith("Auto")
    if not (auto or issubclass(cls, loadable)):
        return "other"
    return "weights" if holds_weights(cls) else "loadable"


def _quick_kind(library: str, name: str) -> str:
    try:
        return check_component(library, name, "where").kind
    except ModelDirError as exc:
        message = str(exc)
        return ("unknown" if "has no class" in message else "not a class" if "is not a " + library in message
                else "pipeline" if "nested pipelines" in message else "other")


def test_import_free_kinds_match_the_imported_classes(demo_model_dir, sd3_model_dir, pixart_model_dir,
                                                      wan_model_dir):
    """For each class name, reading the packages' files and importing the class give the same kind
    (unknown, not a class, pipeline, holds weights, loadable, other)."""
    names = sorted(_fixture_classes(demo_model_dir, sd3_model_dir, pixart_model_dir, wan_model_dir) | set(EXTRA))
    assert len(names) > 20
    kinds = {(library, name): (_quick_kind(library, name), _imported_kind(library, name)) for library, name in names}
    assert {k: v for k, v in kinds.items() if v[0] != v[1]} == {}
    assert {quick for quick, _ in kinds.values()} >= {"unknown", "not a class", "pipeline", "weights", "loadable",
                                                       "other"}
    assert check_pipeline("FluxPipeline", "w").kind == "pipeline"
    with pytest.raises(ModelDirError, match="not a diffusers pipeline"):
        check_pipeline("AutoencoderKL", "w")
