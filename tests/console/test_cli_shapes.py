"""Sizes and frame counts as the pipeline really renders them, checked through the CLI before anything loads.

Flux Kontext scales every request to `max_area` pixels (64x64 became 1024x1024 with exit 0); AuraFlow's
learned position table holds `pos_embed_max_size` patches in all (so 512 px failed after load); CogVideoX
renders 8 frames although it was refused as "8k+1". Each rule is also checked against plain diffusers:
what the engine refuses is what diffusers would change or fail on, what it accepts diffusers renders as asked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import one_error_line
from PIL import Image
from tiny_families import FAMILY_GENERATION
from tiny_families_shapes import AURAFLOW_POS_EMBED, build_tiny_auraflow, build_tiny_flux_kontext

from omni_console.console.cli import main
from omni_console.engine.errors import ConfigError
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.call_options import check_call
from omni_console.engine.running.frame_counts import frames_rule
from omni_console.engine.running.request_checks import size_rule
from omni_console.engine.running.runner import GenerateRequest


@pytest.fixture(scope="module")
def kontext_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_flux_kontext(tmp_path_factory.mktemp("models") / "flux-kontext", seed=0)


@pytest.fixture(scope="module")
def auraflow_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_auraflow(tmp_path_factory.mktemp("models") / "auraflow", seed=0)


def plain(path: Path, **kwargs):
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe(prompt="a fox", num_inference_steps=1, generator=torch.Generator().manual_seed(0), output_type="np",
                **kwargs)


# --- Flux Kontext: max_area ----------------------------------------------------------------------

@pytest.mark.parametrize("command", ["plan", "run"])
def test_kontext_size_it_would_change_is_refused_before_load(kontext_dir, tmp_path, capsys, loads, command):
    extra = ["--output", str(tmp_path / "out.png"), "--prompt", "a fox"] if command == "run" else []
    assert main([command, "--model", str(kontext_dir), "--height", "64", "--width", "64", *extra]) == 2
    line = one_error_line(capsys)
    assert "--height 64 --width 64: FluxKontextPipeline would render 1024x1024" in line
    assert "max_area = 1048576 pixels" in line and "--param max_area=4096 to render 64x64" in line
    assert loads == [] and not (tmp_path / "out.png").exists()


def test_kontext_renders_the_size_asked_for_with_its_area(kontext_dir, tmp_path, capsys):
    out = tmp_path / "kontext.png"
    code = main(["run", "--model", str(kontext_dir), "--height", "64", "--width", "48", "--steps", "1",
                 "--max-sequence-length", "32", "--param", "max_area=3072", "--prompt", "a fox", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    with Image.open(out) as image:
        assert image.size == (48, 64)


def test_kontext_refusal_names_the_size_diffusers_renders(kontext_dir):
    model = discover_model(kontext_dir)
    request = GenerateRequest(prompt="a fox", height=64, width=32, params={"max_area": 96 * 48})
    with pytest.raises(ConfigError) as refused:
        check_call(model, request)
    rendered = plain(kontext_dir, height=64, width=32, max_area=96 * 48, max_sequence_length=32).images[0]
    height, width = rendered.shape[:2]
    assert (height, width) != (64, 32)
    assert f"would render {width}x{height}" in str(refused.value)


# --- AuraFlow: a position table of pos_embed_max_size patches in all ----------------------------

def test_auraflow_cap_is_the_position_tables_grid(auraflow_dir, sd3_model_dir):
    rule = size_rule(discover_model(auraflow_dir))
    side = int(AURAFLOW_POS_EMBED ** 0.5)  # 16 patches per side, of 2 latent cells, of 8 pixels
    assert (rule.height_multiple, rule.max_height, rule.max_width) == (16, side * 2 * 8, side * 2 * 8)
    sd3 = size_rule(discover_model(sd3_model_dir))  # SD3's pos_embed_max_size counts patches per side
    assert sd3.max_height == 16 * 2 * 8


@pytest.mark.slow
def test_auraflow_cap_is_where_diffusers_stops(auraflow_dir):
    cap = size_rule(discover_model(auraflow_dir)).max_height
    assert plain(auraflow_dir, height=cap, width=cap, max_sequence_length=16).images.shape[1:3] == (cap, cap)
    with pytest.raises(Exception):  # noqa: B017  one multiple more fails inside the transformer
        plain(auraflow_dir, height=cap + 16, width=cap, max_sequence_length=16)


@pytest.mark.parametrize("flags,words", [
    (["--height", "512", "--width", "512"], "--height 512: AuraFlowPipeline takes at most 256 (the transformer's "
                                            "position embeddings end there)"),
    (["--height", "256", "--width", "272"], "--width 272: AuraFlowPipeline takes at most 256"),
    ([], "--height: AuraFlowPipeline's default 1024 is more than it takes (at most 256"),
])
def test_auraflow_sizes_past_its_table_exit_2_before_load(auraflow_dir, tmp_path, capsys, loads, flags, words):
    out = tmp_path / "out.png"
    assert main(["run", "--model", str(auraflow_dir), *flags, "--prompt", "a fox", "--output", str(out)]) == 2
    assert words in one_error_line(capsys)
    assert loads == []
    if flags:
        assert main(["plan", "--model", str(auraflow_dir), *flags]) == 2
        assert words in one_error_line(capsys)


def test_auraflow_plan_at_its_cap_is_fine(auraflow_dir, capsys):
    assert main(["plan", "--model", str(auraflow_dir), "--height", "256", "--width", "256"]) == 0
    assert "AuraFlowPipeline" in capsys.readouterr().out


# --- frames: as diffusers renders them -----------------------------------------------------------

def test_cogvideox_eight_frames_is_accepted_and_thirteen_refused(cogvideox_model_dir, tmp_path, capsys, loads):
    assert main(["plan", "--model", str(cogvideox_model_dir), "--frames", "8", "--max-sequence-length", "16"]) == 0
    capsys.readouterr()
    out = tmp_path / "v.mp4"
    assert main(["run", "--model", str(cogvideox_model_dir), "--frames", "13", "--max-sequence-length", "16",
                 "--prompt", "a fox", "--output", str(out)]) == 2
    line = one_error_line(capsys)
    assert "--frames 13: CogVideoXPipeline renders 8k or 8k+1 frames" in line and "e.g. 9 or 16" in line
    assert main(["plan", "--model", str(cogvideox_model_dir), "--frames", "13"]) == 2
    assert "renders 8k or 8k+1 frames" in one_error_line(capsys)
    assert loads == []


FRAME_FAMILIES = {  # fixture: frame counts to render with plain diffusers
    "cogvideox_model_dir": (1, 4, 5, 8, 9, 12, 13, 16, 17),
    "ltx_model_dir": (1, 5, 8, 9, 10, 17),
    "wan_model_dir": (1, 3, 4, 5, 6, 9),
}


@pytest.mark.slow  # one plain pipeline call per frame count
@pytest.mark.parametrize("fixture", list(FRAME_FAMILIES))
def test_frame_rule_is_what_diffusers_renders(request, fixture, wan_loadable):
    path: Path = request.getfixturevalue(fixture)
    family = {"cogvideox_model_dir": "cogvideox", "ltx_model_dir": "ltx", "wan_model_dir": "wan"}[fixture]
    gen = FAMILY_GENERATION[family]
    rule = frames_rule(discover_model(path))
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    for frames in FRAME_FAMILIES[fixture]:
        video = pipe(prompt="a fox", num_inference_steps=1, height=gen["height"], width=gen["width"],
                     num_frames=frames, max_sequence_length=gen["max_sequence_length"], output_type="np",
                     generator=torch.Generator().manual_seed(0)).frames[0]
        assert (len(video) == frames) == rule.accepts(frames), (family, frames, len(video))


def test_plan_without_a_size_imports_no_torch(demo_model_dir):
    """The size checks need the pipeline's call signature (torch, diffusers): only when a size is given."""
    import subprocess
    import sys

    code = ("import sys; from omni_console.console.cli import main; code = main(['plan', '--model', sys.argv[1]]); "
            "print(code, 'torch' in sys.modules, 'diffusers' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code, str(demo_model_dir)], capture_output=True, text=True,
                         timeout=120)
    assert run.stdout.strip().splitlines()[-1] == "0 False False", run.stderr[-2000:]
