"""Kandinsky 5 T2I end to end, built as diffusers' own fast test builds it (`tiny_families_kandinsky`).

Its tokenizer is a Qwen2-VL processor, which transformers 5 builds with a video processor, and builds that
only with torchvision. Without torchvision plain diffusers cannot load the pipeline at all (an `ImportError`
whose first line is empty): the engine refuses it before load, in one line naming torchvision and the
part that needs it, where it used to start loading and fail with "load failed: ImportError: ". With
torchvision, it runs bit-identical to plain diffusers under every policy, and `run` writes the image.
It renders only its listed sizes; 1024x1024 costs a tiny model about 4 s on this CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_families_kandinsky import KANDINSKY5_GENERATION, build_tiny_kandinsky5_t2i

PROMPT = "a red fox running in the snow"


def _torchvision_builds_it() -> bool:
    from transformers import Qwen2VLProcessor

    from omni_console.engine.model_dir.missing_backends import processor_missing

    return processor_missing(Qwen2VLProcessor) is None


@pytest.fixture(scope="module")
def k5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_kandinsky5_t2i(tmp_path_factory.mktemp("k5") / "kandinsky5")


def _run(path: Path, out: Path, *extra: str) -> int:
    from omni_console.console.cli import main

    gen = KANDINSKY5_GENERATION
    return main(["run", "--model", str(path), "--prompt", PROMPT, "--height", str(gen["height"]), "--width",
                 str(gen["width"]), "--steps", str(gen["num_inference_steps"]), "--max-sequence-length",
                 str(gen["max_sequence_length"]), "--seed", "7", "--output", str(out), *extra])


@pytest.mark.slow  # builds the family (diffusers' imports)
def test_without_torchvision_it_is_refused_before_load_as_plain_diffusers_fails(k5, tmp_path, capsys):
    if _torchvision_builds_it():
        pytest.skip("torchvision is installed: the family runs (the test below)")
    capsys.readouterr()
    out = tmp_path / "fox.png"
    assert _run(k5, out) == 2
    captured = capsys.readouterr()
    assert captured.err == ("omni-console: error: tokenizer: transformers.Qwen2VLProcessor needs torchvision (pip "
                            "install torchvision) for its video_processor, which is not installed (transformers "
                            "cannot build it without it; plain diffusers fails alike)\n")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    from diffusers import DiffusionPipeline

    with pytest.raises(ImportError, match="Torchvision"):  # the line is true: plain diffusers cannot load it
        DiffusionPipeline.from_pretrained(k5, local_files_only=True)


@pytest.mark.slow  # six loads and requests at 1024x1024, and a CLI run
def test_kandinsky5_t2i_runs_as_diffusers_runs_it(k5, tmp_path):
    if not _torchvision_builds_it():
        pytest.skip("needs torchvision (transformers builds Qwen2-VL's processor only with it)")
    from diffusers import DiffusionPipeline
    from test_new_families import policies

    from omni_console.engine.engine import Engine
    from omni_console.engine.running.call_options import check_call
    from omni_console.engine.running.request_checks import check_request
    from omni_console.engine.running.runner import GenerateRequest

    gen = dict(KANDINSKY5_GENERATION)
    request = GenerateRequest(prompt=PROMPT, steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                              width=gen.pop("width"), seed=7, guidance=3.0, negative_prompt="blurry",
                              max_sequence_length=gen.pop("max_sequence_length"), output_type="np")
    pipe = DiffusionPipeline.from_pretrained(k5, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    expected = np.asarray(pipe(**request.call_kwargs(pipe)).image)
    assert float(expected.std()) > 0
    engine = Engine(k5, device="cpu")
    check_request(engine.model, request)
    check_call(engine.model, request)
    try:
        for policy in policies(engine):
            engine.load(policy)
            result = engine.generate(request)
            engine.unload()
            assert np.array_equal(np.asarray(result.image)[None].reshape(expected.shape), expected), policy
    finally:
        engine.close()
    out = tmp_path / "fox.png"
    assert _run(k5, out) == 0 and out.is_file()


@pytest.mark.slow  # builds the family (diffusers' imports)
def test_its_qwen_text_is_not_held_to_the_clip_tokenizers_77_tokens(k5):
    """Its Qwen tokenizer names no limit of its own (Qwen2.5-VL's is 131,072), its CLIP tokenizer 77: the
    text length was refused above 77 ("the pipeline's tokenizers take at most 77 tokens"), though only the
    Qwen text takes `max_sequence_length` (CLIP's is always cut at 77)."""
    from omni_console.engine.errors import ConfigError
    from omni_console.engine.model_dir.discovery import discover_model
    from omni_console.engine.running.call_options import call_signature
    from omni_console.engine.running.request_limits import MAX_TEXT_TOKENS, check_limits
    from omni_console.engine.running.runner import GenerateRequest

    model = discover_model(k5)
    signature = call_signature(model.pipeline_class)
    labels = {"max_sequence_length": "--max-sequence-length"}
    check_limits(model, GenerateRequest(prompt=PROMPT, max_sequence_length=512), labels, signature)  # its default
    with pytest.raises(ConfigError, match=f"tokenizers take at most {MAX_TEXT_TOKENS} tokens"):
        check_limits(model, GenerateRequest(prompt=PROMPT, max_sequence_length=MAX_TEXT_TOKENS + 1), labels,
                     signature)
