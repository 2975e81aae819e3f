"""Snapshot tests: the live screen's preview panel in half-block cells at 80x24 and 160x48 — a step preview
(a fixed latent through the Flux factors) and a video output (its middle frame over a strip of frames)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_snapshots import SIZES, settle_live, stable_app, stable_engine  # noqa: F401 - the fixture

from omni_console.console.output_frames import OutputFrames
from omni_console.engine import events
from omni_console.engine.running.latent_rgb_table import LATENT_RGB


def fixed_latent() -> np.ndarray:
    """16 channels of 16x16: smooth waves, so the picture has structure (deterministic, no RNG)."""
    y, x = np.mgrid[0:16, 0:16].astype(np.float32) / 15.0
    return np.stack([np.sin((c + 1) * x * 2.0) * np.cos((16 - c) * y) for c in range(16)]).astype(np.float32)


def fixed_video() -> OutputFrames:
    frames = []
    for index in range(9):
        image = np.zeros((32, 48, 3), np.uint8)
        image[..., 0] = np.linspace(0, 255, 48, dtype=np.uint8)[None, :]
        image[..., 1] = index * 28
        image[8:24, 4 + index * 4:12 + index * 4, 2] = 255  # a square moving right
        frames.append(Image.fromarray(image, "RGB"))
    strip = tuple(frames[i] for i in (0, 2, 4, 6, 8))
    return OutputFrames(Path("20260301-142501-request-1.mp4"), frames[4], strip, 9)


async def in_view(pilot) -> None:
    """At 80x24 the columns stack and scroll: the panel is scrolled to, as the operator would (PgDn)."""
    await pilot.pause()
    pilot.app.live_screen.preview.scroll_visible(animate=False, top=True)
    await pilot.pause()


async def settle_step(pilot) -> None:
    await settle_live(pilot)
    factors, bias = LATENT_RGB["flux"]
    pilot.app.live_screen.show_step_preview(events.StepPreview(
        request_id=1, step=3, total_steps=28, latent=fixed_latent(), factors=factors, bias=bias,
        latent_format="flux"))
    await in_view(pilot)


async def settle_video(pilot) -> None:
    await settle_live(pilot)
    pilot.app.live_screen.preview.show_frames(fixed_video())
    await in_view(pilot)


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("state", ["step", "video"])
def test_preview_panel_snapshot(snap_compare, stable_engine, tmp_path, size, state):  # noqa: F811 - the fixture
    app = stable_app(stable_engine, tmp_path, "omni-dark")
    try:
        assert snap_compare(app, terminal_size=size, run_before=settle_step if state == "step" else settle_video)
    finally:
        app.shutdown()
