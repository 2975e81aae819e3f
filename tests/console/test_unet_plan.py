"""An SDXL UNet in the plan as a DiT is shown: `plan` (piped), `plan --json`, and the plan screen's component
row and block list — named a UNet, one block list per down/mid/up block (its children the units) in execution
order, and the vLLM-Omni gap said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from app_helpers import make_app, screen_text
from tiny_families_unet import build_tiny_sdxl

from omni_console.console.cli import main
from omni_console.console.widgets.plan_blocks import BlockListPanel
from omni_console.console.widgets.plan_table import ComponentTable
from omni_console.engine.engine import Engine
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.offload.policy import build_policy

BLOCKS_HEADER = ["UNet", "block list", "count", "bytes/block", "largest", "total", "resident", "streamed"]


@pytest.fixture(scope="module")
def sdxl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_sdxl(tmp_path_factory.mktemp("models") / "sdxl")


def _rows(out: str, header: list[str]) -> list[list[str]]:
    for block in out.strip("\n").split("\n\n"):
        lines = block.split("\n")
        if lines[0].split("\t") == header:
            return [line.split("\t") for line in lines[1:]]
    raise AssertionError(f"no table with header {header}")


def test_piped_plan_lists_the_unet_blocks_in_execution_order(sdxl_dir: Path, capsys):
    assert main(["plan", "--model", str(sdxl_dir), "--resident-layers", "2", "--placement", "spread"]) == 0
    out = capsys.readouterr().out
    unet = discover_model(sdxl_dir).component("unet")
    component = next(r for r in _rows(out, ["component", "role", "class", "dtype", "size", "blocks", "residency",
                                            "why"]) if r[0] == "unet")
    assert component[1:3] == ["unet", "UNet2DConditionModel"]
    assert component[5:] == ["20 (3+4+3+7+3)", "streamed by DLO", "dlo"]
    rows = _rows(out, BLOCKS_HEADER)
    assert [(r[1], r[2]) for r in rows[:5]] == [("down_blocks.0", "3"), ("down_blocks.1", "4"), ("mid_block", "3"),
                                                ("up_blocks.0", "7"), ("up_blocks.1", "3")]
    # spread keeps 2 of 20 units resident: units 0 and 10 (the first of down_blocks.0 and of up_blocks.0)
    assert [(r[6], r[7]) for r in rows[:5]] == [("1", "2"), ("0", "4"), ("0", "3"), ("1", "6"), ("0", "3")]
    assert rows[5][1] == "(non-block modules: resident)"
    assert [b.attr for b in unet.block_lists] == ["down_blocks.0", "down_blocks.1", "mid_block", "up_blocks.0",
                                                  "up_blocks.1"]
    assert "streamed per UNet forward (18 blocks)" in out and "resident UNet blocks (spread)\t2 of 20" in out
    assert "DiT" not in out.split("vLLM-Omni equivalent")[0]  # the UNet is never called a DiT before the export
    assert "note: vLLM-Omni's layerwise offload streams a DiT's blocks only" in out


def test_plan_json_has_the_unet_blocks_and_says_vllm_omni_cannot_stream_them(sdxl_dir: Path, capsys):
    assert main(["plan", "--model", str(sdxl_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    unet = next(c for c in doc["components"] if c["name"] == "unet")
    info = discover_model(sdxl_dir).component("unet")
    assert (unet["role"], unet["residency"], unet["why"], unet["resident_layers"]) == ("unet", "streamed", "dlo", 0)
    assert [(b["attr"], b["units"], b["bytes_per_block"]) for b in unet["block_lists"]] == [
        (b.attr, list(b.items), list(b.block_bytes)) for b in info.block_lists]
    assert unet["block_lists"][2]["units"] == ["resnets.0", "attentions.0", "resnets.1"]  # the mid block's calls
    assert unet["non_block_bytes"] == info.non_block_bytes
    forecast = doc["forecast"]
    sizes = [n for b in info.block_lists for n in b.block_bytes]
    assert forecast["num_streamed_blocks"] == 20 and forecast["streaming_slots"] == 2
    assert forecast["streamed_bytes_per_forward"] == sum(sizes)
    assert forecast["largest_streamed_block_bytes"] == max(sizes)  # the ring's slot: the largest (an attention)
    assert forecast["peak_device_weight_bytes"] == (forecast["device_resident_bytes"] + 2 * max(sizes)
                                                    + forecast["largest_staged_bytes"])
    vllm = doc["vllm_omni"]
    assert vllm["exact"] is False
    assert any("no spelling for streaming the UNet 'unet' (20 units in 5 down/mid/up blocks)" in gap
               for gap in vllm["gaps"])


def test_resident_mode_plan_has_no_unet_gap(sdxl_dir: Path, capsys):
    assert main(["plan", "--model", str(sdxl_dir), "--json", "--mode", "resident"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert next(c for c in doc["components"] if c["name"] == "unet")["residency"] == "resident"
    assert doc["vllm_omni"]["gaps"] == [] and doc["vllm_omni"]["exact"] is True


async def test_plan_screen_shows_the_unet_row_and_its_block_list(sdxl_dir: Path, tmp_path: Path):
    engine = Engine(sdxl_dir, device="cpu")
    app = make_app(engine, tmp_path, build_policy({}, 1))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            table = app.screen.query_one(ComponentTable)
            row = [str(cell) for cell in table.get_row("unet")]
            assert row[:6] == ["unet", "streamed by DLO (1 resident)", "DLO", "unet", "7.9 MB", "20 (3+4+3+7+3)"]
            blocks = app.screen.query_one(BlockListPanel)
            assert blocks.border_title.startswith("UNet block lists")
            assert [(r[1], r[2], r[6], r[7]) for r in blocks.rows[:3]] == [
                ("down_blocks.0", "3", "1", "2"), ("down_blocks.1", "4", "0", "4"), ("mid_block", "3", "0", "3")]
            text = screen_text(app)
            assert "UNet block lists" in text and "mid_block" in text
            assert "streamed per UNet forward" in text and "UNet blocks; the copies add" in text
            assert "DiT" not in text  # the UNet's blocks are never called a DiT's on the screen
            await pilot.press("+")
            await pilot.pause()
            assert [(r[6], r[7]) for r in blocks.rows[:3]] == [("2", "1"), ("0", "4"), ("0", "3")]
            await pilot.press("m", "m")  # resident, then back to dlo: the notice names the UNet's blocks
            await pilot.pause()
            assert app.notices[-1][0].startswith("mode=dlo: UNet blocks streamed")
    finally:
        app.shutdown()
        engine.close()


def test_vram_budget_plans_the_unet_blocks_and_names_them(sdxl_dir: Path, capsys):
    """A budget between the all-streamed peak and the whole model keeps some UNet blocks resident; one below
    the all-streamed peak is refused naming it (the ring's 2 slots of the largest block set that peak)."""
    info = discover_model(sdxl_dir).component("unet")
    sizes = [n for b in info.block_lists for n in b.block_bytes]
    assert main(["plan", "--model", str(sdxl_dir), "--json", "--vram-budget", "6MB"]) == 0
    doc = json.loads(capsys.readouterr().out)
    unet = next(c for c in doc["components"] if c["name"] == "unet")
    assert 0 < unet["resident_layers"] < len(sizes)
    assert doc["forecast"]["peak_device_weight_bytes"] <= 6_000_000
    assert any(line.startswith(f"UNet: {unet['resident_layers']} of {len(sizes)} blocks resident")
               for line in doc["auto_plan"]["reasons"]), doc["auto_plan"]["reasons"]
    assert main(["plan", "--model", str(sdxl_dir), "--vram-budget", "2MB"]) == 2
    err = capsys.readouterr().err
    assert "nothing fits in 2.0 MB" in err and "every block streamed through 2 slots" in err
