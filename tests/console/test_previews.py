"""Previews in the console: latent→RGB on the console's side, half-block cells, `--preview` resolution, the
output reader (image and video), the router keeping only the newest step preview, and the live screen
showing step previews and the output of a real (demo model) request."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from app_helpers import finish, load, make_app, screen_text
from PIL import Image
from rich.console import Console

from omni_console.console.event_router import LIGHT_UI_S, EventRouter
from omni_console.console.latent_rgb import latent_to_rgb
from omni_console.console.output_frames import read_output, spread, strip_and_middle
from omni_console.console.preview_mode import HALFBLOCK, OFF, SIXEL, resolve_preview
from omni_console.console.widgets.halfblock import UPPER_HALF, HalfBlockImage, fit_cells
from omni_console.console.widgets.preview_panel import PREVIEW_OFF
from omni_console.engine import events
from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest


def test_latent_to_rgb_is_the_factors_matrix_product_mapped_to_bytes():
    latent = np.zeros((2, 1, 2), np.float32)
    latent[:, 0, 0] = (1.0, 0.5)
    latent[:, 0, 1] = (-1.0, 0.0)
    factors = ((0.5, 0.0, -0.5), (0.0, 1.0, 0.0))
    rgb = latent_to_rgb(latent, factors, (0.0, 0.0, 0.25))
    # pixel 0: (0.5, 0.5, -0.25) -> ((x + 1) / 2) * 255 ; pixel 1: (-0.5, 0.0, 0.75)
    assert rgb.tolist() == [[[191, 191, 96], [64, 128, 223]]]
    with pytest.raises(ValueError):
        latent_to_rgb(np.zeros((3, 2, 2), np.float32), factors, (0, 0, 0))


def rendered(image, width: int, height: int) -> list[list]:
    console = Console(width=width, height=height, color_system="truecolor", file=io.StringIO(), legacy_windows=False)
    lines = console.render_lines(HalfBlockImage(image), console.options.update(height=height), pad=False)
    return [[s for s in line if s.text] for line in lines]


def test_half_blocks_carry_the_upper_pixel_as_foreground_and_the_lower_as_background():
    pixels = np.array([[[255, 0, 0], [0, 255, 0]], [[0, 0, 255], [255, 255, 255]]], np.uint8)
    lines = rendered(pixels, 2, 1)
    assert len(lines) == 1 and [s.text for s in lines[0]] == [UPPER_HALF, UPPER_HALF]
    first, second = lines[0]
    assert first.style.color.triplet == (255, 0, 0) and first.style.bgcolor.triplet == (0, 0, 255)
    assert second.style.color.triplet == (0, 255, 0) and second.style.bgcolor.triplet == (255, 255, 255)


def test_half_blocks_fit_the_space_keeping_the_aspect():
    assert fit_cells(64, 64, 80, 10) == (20, 10)  # 10 rows are 20 pixels: 20 cells wide
    assert fit_cells(128, 64, 20, 24) == (20, 5)
    assert fit_cells(8, 8, 0, 5) == (0, 0)
    lines = rendered(np.zeros((64, 64, 3), np.uint8), 80, 10)
    assert len(lines) == 10 and all(len(line) == 20 for line in lines)


@pytest.mark.parametrize("env,tty,expected", [
    ({"TERM": "xterm-kitty"}, True, SIXEL),
    ({"TERM": "xterm-kitty", "TMUX": "/tmp/tmux-0/default,1,0"}, True, HALFBLOCK),
    ({"TERM": "dumb"}, True, HALFBLOCK),
    ({"TERM": "xterm-256color"}, False, HALFBLOCK),
])
def test_auto_asks_for_pixels_only_on_a_terminal_outside_tmux(env, tty, expected):
    asked = []

    class Stream:
        def isatty(self) -> bool:
            return tty

    def detect() -> str:
        asked.append(True)
        return SIXEL

    assert resolve_preview("auto", env, Stream(), detect) == expected
    assert bool(asked) == (expected == SIXEL)  # no query at all otherwise


def test_halfblock_and_off_never_ask_the_terminal():
    def detect() -> str:
        raise AssertionError("queried")

    assert resolve_preview("halfblock", {"TERM": "xterm"}, None, detect) == HALFBLOCK
    assert resolve_preview("off", {"TERM": "xterm"}, None, detect) == OFF


def test_an_image_output_is_its_own_preview(tmp_path):
    path = tmp_path / "out.png"
    Image.new("RGB", (32, 16), (10, 200, 30)).save(path)
    frames = read_output(path)
    assert not frames.is_video and frames.main.size == (32, 16) and frames.main.getpixel((0, 0)) == (10, 200, 30)
    assert strip_and_middle(frames) is frames.main


def test_a_video_output_shows_its_middle_frame_and_a_strip(tmp_path):
    import av

    path = tmp_path / "out.mp4"
    shades = [int(v) for v in np.linspace(0, 240, 9)]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for shade in shades:
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), shade, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    frames = read_output(path)
    assert frames.frame_count == 9 and len(frames.strip) == 5
    assert abs(frames.main.getpixel((16, 16))[0] - shades[4]) <= 8  # the middle frame (lossy codec)
    assert [abs(f.getpixel((16, 16))[0] - shades[i]) <= 8 for f, i in zip(frames.strip, spread(9), strict=True)] \
        == [True] * 5
    sheet = strip_and_middle(frames)
    assert sheet.width == 32 and sheet.height > 32


def test_spread_takes_first_middle_and_last():
    assert spread(9) == [0, 2, 4, 6, 8]
    assert spread(3) == [0, 1, 2]


class Recorder:
    """The LiveView the router drives, recording the step previews it is handed."""

    telemetry_ready = True

    def __init__(self) -> None:
        self.previews: list[events.StepPreview] = []

    def show_step_preview(self, event: events.StepPreview) -> None:
        self.previews.append(event)

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def preview(step: int, t: float) -> events.StepPreview:
    return events.StepPreview(t=t, request_id=1, step=step, total_steps=4, latent=np.zeros((4, 2, 2), np.float32),
                              factors=((0.0, 0.0, 0.0),) * 4, latent_format="sd15")


def test_the_first_step_preview_is_drawn_within_one_step_of_its_end():
    """Fake clock: step 1 ends at 10 s, steps take 0.5 s; its preview is drawn at the first flush after it
    (the light group, at most LIGHT_UI_S later), before step 2 ends."""
    now = [10.0]
    router = EventRouter(on_cpu=True, history=10, clock=lambda: now[0])
    live = Recorder()
    router.start_load(live)
    step_s = 0.5
    router.route([events.StepTiming(t=now[0], request_id=1, step=1, total_steps=4, wall_s=step_s, stall_s=0.0),
                  preview(1, now[0])], loading=False)
    while not live.previews:
        router.flush(busy=True)
        now[0] += 0.05
    assert live.previews[0].step == 1
    assert now[0] - 10.0 <= min(step_s, LIGHT_UI_S + 0.05)


def test_only_the_newest_step_preview_is_drawn_when_the_ui_is_behind():
    now = [0.0]
    router = EventRouter(on_cpu=True, history=10, clock=lambda: now[0])
    live = Recorder()
    router.start_load(live)
    router.flush(busy=True, force=True)
    router.route([preview(1, 0.0), preview(2, 0.0), preview(3, 0.0)], loading=False)
    now[0] += LIGHT_UI_S
    router.flush(busy=True)
    assert [p.step for p in live.previews] == [3]
    assert router.previews_dropped == 2


@pytest.fixture
def preview_engine(demo_model_dir):
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(step_previews=True))
    yield engine
    engine.close()


async def test_live_screen_shows_step_previews_then_the_output(preview_engine, tmp_path):
    """The output is handed to the panel in the same UI turn that takes the request's outcome (no timer in
    between: zero on a fake clock), and read and drawn off that turn within 0.5 s (real time, CPU)."""
    app = make_app(preview_engine, tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            await load(pilot, app)
            live = app.live_screen
            panel = live.preview
            assert not panel.display  # nothing to show yet: the screen looks as before
            app.start_generate(GenerateRequest(prompt="a red cube", steps=3, height=64, width=64, seed=1,
                                               extra={"guidance_scale": 3.5, "max_sequence_length": 32}))
            await finish(pilot, app.last_command["generate"], lambda: not app.generating)
            assert app.notices[-1][0].startswith("image saved:")
            assert panel.output_path == app.last_output  # handed over with the outcome, in the same turn
            deadline = asyncio.get_running_loop().time() + 10
            while panel.output is None and asyncio.get_running_loop().time() < deadline:
                await pilot.pause(0.01)
            assert panel.step_previews >= 1  # the newest of each flush; older ones may be dropped
            [output] = (tmp_path / "out").iterdir()
            assert panel.output is not None and panel.output.path == output
            assert f"output · {output.name} · image" in screen_text(app)
            assert UPPER_HALF in screen_text(app)
            [delay] = panel.output_delays
            assert delay < 0.5, f"the output preview took {delay:.3f} s to read and draw"
            await pilot.press("i")
            assert PREVIEW_OFF in screen_text(app)
    finally:
        app.shutdown()


@pytest.mark.parametrize("protocol", ["tgp", "sixel"])
async def test_auto_draws_an_output_with_the_terminals_pixel_protocol(tmp_path, protocol):
    """Where `--preview auto` found Sixel or Kitty graphics, an output is textual-image's widget for it (a
    fresh one per output); the next step preview is half-block cells again."""
    from textual.app import App
    from textual_image.widget import SixelImage, TGPImage

    from omni_console.console.output_frames import OutputFrames
    from omni_console.console.widgets.preview_panel import PreviewPanel

    panel = PreviewPanel(protocol=protocol)

    class Host(App):
        def compose(self):
            yield panel

    async with Host().run_test(size=(80, 24)) as pilot:
        panel.show_frames(OutputFrames(tmp_path / "a.png", Image.new("RGB", (16, 16), (255, 0, 0))))
        await pilot.pause()
        first = panel.pixels
        assert isinstance(first, TGPImage if protocol == "tgp" else SixelImage)
        panel.show_frames(OutputFrames(tmp_path / "b.png", Image.new("RGB", (16, 16), (0, 255, 0))))
        await pilot.pause()
        assert panel.pixels is not first and len(panel.children) == 1
        panel.show_step(preview(1, 0.0))
        await pilot.pause()
        assert panel.pixels is None and not panel.children and isinstance(panel.body, HalfBlockImage)


def test_a_16_bit_depth_map_previews_as_its_gradient_not_as_white(tmp_path):
    """A Marigold depth PNG is 16-bit grayscale: the preview shows its high byte (PIL's RGB conversion would clip
    every value above 255 to white)."""
    depth = (np.linspace(0, 1, 64, dtype=np.float32)[None, :].repeat(8, 0) * 65535).astype(np.uint16)
    path = tmp_path / "depth.png"
    Image.fromarray(depth).save(path)
    pixels = np.asarray(read_output(path).main)[..., 0].astype(int)
    assert pixels[0, 0] <= 5 and pixels[0, -1] >= 250 and 100 <= pixels[0, pixels.shape[1] // 2] <= 160
