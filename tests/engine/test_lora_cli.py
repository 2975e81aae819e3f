"""`run --lora` end to end: the PNG written is the one plain diffusers renders with the LoRA set up the same way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lora_writers import write_peft_lora
from PIL import Image

from omni_console.console.cli import main
from omni_console.engine.running.runner import GenerateRequest

PROMPT = "a lighthouse on a cliff at dusk"


def plain_png(path: Path, lora: Path, scale: float, mode: str) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(lora), adapter_name="a")
    if mode == "merge":
        pipe.fuse_lora(lora_scale=scale)
    else:
        pipe.set_adapters(["a"], [scale])
    request = GenerateRequest(prompt=PROMPT, steps=2, height=64, width=64, seed=5, guidance=3.5, max_sequence_length=32)
    return np.asarray(pipe(**request.call_kwargs(pipe)).images[0])


@pytest.mark.slow  # two runs of the demo and two plain pipelines
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_run_with_a_lora_writes_the_image_diffusers_renders(demo_model_dir: Path, tmp_path: Path, mode: str, capsys):
    lora = write_peft_lora(tmp_path / "l.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.(to_|add_)|ff", seed=9)
    out = tmp_path / "out.png"
    code = main(["run", "--model", str(demo_model_dir), "--device", "cpu", "--prompt", PROMPT, "--steps", "2",
                 "--height", "64", "--width", "64", "--seed", "5", "--guidance", "3.5", "--max-sequence-length", "32",
                 "--lora", f"{lora}:0.6", "--lora-mode", mode,
                 "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    assert np.array_equal(np.asarray(Image.open(out)), plain_png(demo_model_dir, lora, 0.6, mode))
