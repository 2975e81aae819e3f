"""Snapshot of the live screen started with two `--lora` files (one switched off with the panel's keys), at
80x24 and 160x48: the LoRA panel under the queue, its mode in the title. Without --lora the live screen
snapshots (test_snapshots.py) have no panel. Regenerate with `--snapshot-update` and look at the SVGs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from app_helpers import make_app
from lora_writers import write_peft_lora
from test_snapshots import SIZES, settle_live

from omni_console.console.lora_set import LoraSet
from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_live_screen_with_the_lora_panel_snapshot(snap_compare, demo_model_dir, tmp_path, monkeypatch, size):
    shutil.copytree(demo_model_dir, tmp_path / "demo-flux")
    monkeypatch.chdir(tmp_path)
    files = [write_peft_lora(tmp_path / name, demo_model_dir / "transformer", "transformer", pattern=r"attn\.to_",
                             seed=seed) for name, seed in (("detail.safetensors", 1), ("style.safetensors", 2))]
    loras = ((files[0].name, 0.8), (files[1].name, 1.0))
    engine = Engine(Path("demo-flux"), device="cpu", options=EngineOptions(loras=loras, lora_mode="merge"))
    app = make_app(engine, tmp_path, theme="omni-dark")
    app.lora_set = LoraSet(loras, "merge")

    async def settle(pilot) -> None:
        await settle_live(pilot)
        await pilot.press("j", "l", "comma")  # style: off, scale 0.9
        pilot.app.clear_notifications()
        await pilot.pause()

    try:
        assert snap_compare(app, terminal_size=size, run_before=settle)
    finally:
        app.shutdown()
        engine.close()
