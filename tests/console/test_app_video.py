"""Pilot tests of a video pipeline in the console (tiny Wan on CPU): the dialog shows the fields the
pipeline takes and refuses what it cannot render before anything starts, a video is saved as .mp4 with
every frame under a new name, and the live screen says how many frames, the latent size and where the
request's time went — all at 80x24 next to the panels that were there before."""

from __future__ import annotations

import json
import re

import av
import pytest
from app_helpers import finish, load, make_app, screen_text, until
from PIL import Image
from textual.widgets import Input

from omni_console.console import outputs
from omni_console.console.generate_form import RequestForm
from omni_console.console.request_defaults import CPU_FRAMES
from omni_console.console.screens import GenerateDialog
from omni_console.console.widgets.request_phases import describe_phases, format_latent
from omni_console.engine.engine import Engine
from omni_console.engine.errors import ConfigError
from omni_console.engine.events import RequestPhases
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.runner import GenerateRequest

pytestmark = pytest.mark.slow  # end to end (generates videos in the app): .ci/run runs it, `pytest -q` skips it

PINNED_TIME = 1_700_000_000.0
SMALL_TERMINAL = (80, 24)
VIDEO_ONLY_FIELDS = {"frames"}


@pytest.fixture
def wan_engine(wan_model_dir, wan_loadable):
    engine = Engine(wan_model_dir, device="cpu")
    yield engine
    engine.close()


@pytest.fixture
def wan_app(wan_engine, tmp_path):
    app = make_app(wan_engine, tmp_path)
    yield app
    app.shutdown()


async def open_dialog(pilot, app) -> GenerateDialog:
    await pilot.press("g")
    # the screen is pushed before its fields are mounted: under load a query can come in between
    await until(pilot, lambda: isinstance(app.screen, GenerateDialog) and bool(app.screen.query("#seed")))
    return app.screen


def fill(dialog: GenerateDialog, **values: str) -> None:
    for field_id, text in values.items():
        dialog.query_one(f"#{field_id}", Input).value = text


def wan_vae_config(model_dir) -> dict:
    return json.loads((model_dir / "vae" / "config.json").read_text())


def expected_latent(model_dir, frames: int, height: int, width: int) -> tuple[int, ...]:
    """What a Wan VAE makes of the request: 4k+1 frames → k+1 latent frames, 8x smaller per side."""
    config = wan_vae_config(model_dir)
    temporal = 2 ** sum(bool(d) for d in config["temperal_downsample"])
    spatial = 2 ** (len(config["dim_mult"]) - 1)
    return (1, config["z_dim"], (frames - 1) // temporal + 1, height // spatial, width // spatial)


async def test_the_dialog_shows_a_frames_field_for_wan_and_not_for_the_demo_flux(wan_app, app):
    async with wan_app.run_test(size=SMALL_TERMINAL) as pilot:
        await pilot.pause()
        await load(pilot, wan_app)
        dialog = await open_dialog(pilot, wan_app)
        wan_fields = set(dialog.field_ids)
        assert {"prompt", "negative_prompt", "steps", "size", "frames", "seed", "guidance",
                "max_sequence_length"} <= wan_fields
        assert "image" not in wan_fields  # text-to-video: no conditioning image
        # the pipeline's own defaults (its call signature) are the placeholders; on a CPU the first request
        # is prefilled small (console/request_defaults.py: 4k+1 frames for Wan, the smallest count >= 9)
        frames = dialog.query_one("#frames", Input)
        assert frames.value == str(CPU_FRAMES) and frames.placeholder == "81 (pipeline default)"
        assert dialog.query_one("#steps", Input).placeholder == "50 (pipeline default)"
        assert dialog.query_one("#size", Input).placeholder == "832x480 (pipeline default)"
        text = screen_text(wan_app)
        for label in ("prompt", "negative", "steps", "size", "frames", "seed", "guidance", "max seq len",
                      "Generate", "Cancel"):
            assert label in text, f"{label!r} not visible at 80x24:\n{text}"
    async with app.run_test(size=SMALL_TERMINAL) as pilot:
        await pilot.pause()
        await load(pilot, app)
        dialog = await open_dialog(pilot, app)
        flux_fields = set(dialog.field_ids)
        assert not flux_fields & VIDEO_ONLY_FIELDS and "image" not in flux_fields
        assert {"prompt", "negative_prompt", "steps", "size", "seed", "guidance", "max_sequence_length"} <= flux_fields
        assert "frames" not in screen_text(app)
        assert dialog.query_one("#steps", Input).value == "2"  # the demo's working defaults stay prefilled


async def test_five_frames_are_saved_as_an_mp4_next_to_earlier_files_and_the_live_screen_tells_the_phases(
        wan_app, wan_engine, wan_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "now", lambda: PINNED_TIME)
    out = tmp_path / "out"
    out.mkdir()
    stem = outputs.output_stem(1, PINNED_TIME)
    earlier = {f"{stem}.mp4": b"an earlier video", f"{stem}.png": b"an earlier image"}
    for name, data in earlier.items():
        (out / name).write_bytes(data)
    async with wan_app.run_test(size=SMALL_TERMINAL) as pilot:
        await pilot.pause()
        await load(pilot, wan_app)
        dialog = await open_dialog(pilot, wan_app)
        fill(dialog, prompt="a red cube spinning", frames="5", steps="2", size="32x32", max_sequence_length="32")
        await pilot.press("enter")
        await finish(pilot, wan_app.last_command["generate"], lambda: not wan_app.generating)
        result = wan_app.last_command["generate"].result()
        # the latent line comes with the result, the phase times with the RequestPhases event after it
        await until(pilot, lambda: "5 frames · latent" in screen_text(wan_app)
                    and re.search(r"VAE decode [\d.]+ s", screen_text(wan_app)) is not None)
        text = screen_text(wan_app)

        assert result.is_video and len(result.frames) == 5
        assert result.latent_shape == expected_latent(wan_model_dir, 5, 32, 32)
        assert f"request 1: 5 frames · latent {format_latent(result.latent_shape)}" in text
        for phase in ("text encoding", "denoise", "VAE decode"):
            assert re.search(rf"{phase} [\d.]+ s \(\d+%\)", text), f"{phase} time not shown:\n{text}"
        assert "VAE decode peak" not in text  # CPU: no device allocator peak to report
        # the status line, the first panels and the footer stay on screen under the two new lines
        for kept in ("engine ready", "GPU memory", "host memory", "g generate"):
            assert kept in text, f"{kept!r} pushed off the 80x24 screen:\n{text}"
        assert wan_app.notices[-1][0].startswith("video saved: ")

    saved = wan_app.last_output
    assert saved is not None and saved.parent == out.resolve()
    assert saved.name == f"{stem}-2.mp4"  # the earlier file kept its name
    for name, data in earlier.items():
        assert (out / name).read_bytes() == data, f"{name} was replaced"
    assert sorted(p.name for p in out.iterdir()) == sorted([*earlier, saved.name])  # no scratch left behind
    with av.open(str(saved)) as container:
        stream = container.streams.video[0]
        decoded = list(container.decode(stream))
        assert len(decoded) == 5
        assert (decoded[0].width, decoded[0].height) == (32, 32)
        assert float(stream.average_rate) == pytest.approx(wan_engine.fps)


async def test_a_frame_count_wan_cannot_render_is_refused_in_the_dialog_and_nothing_starts(wan_app, tmp_path):
    async with wan_app.run_test(size=SMALL_TERMINAL) as pilot:
        await pilot.pause()
        await load(pilot, wan_app)
        dialog = await open_dialog(pilot, wan_app)
        fill(dialog, frames="6", steps="2", size="32x32", max_sequence_length="32")
        await pilot.press("enter")
        await pilot.pause()
        assert wan_app.screen is dialog
        assert dialog.error.startswith("frames 6: WanPipeline renders 4k+1 frames")
        assert "e.g. 5 or 9" in dialog.error
        assert "frames 6: WanPipeline renders 4k+1" in screen_text(wan_app)  # inline, under the fields
        fill(dialog, frames="5", size="40x32")  # then a size the pipeline would silently change
        await pilot.press("enter")
        await pilot.pause()
        assert wan_app.screen is dialog and dialog.error.startswith("width 40: WanPipeline needs a multiple of 16")
        assert "generate" not in wan_app.last_command and not wan_app.generating
        assert wan_app.engine.state.value == "ready"
    assert not (tmp_path / "out").exists()


async def test_a_bad_text_length_for_flux_is_an_inline_line_naming_the_field(app, tmp_path):
    async with app.run_test(size=SMALL_TERMINAL) as pilot:
        await pilot.pause()
        await load(pilot, app)
        dialog = await open_dialog(pilot, app)
        fill(dialog, max_sequence_length="0")
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is dialog and dialog.error == "max sequence length 0: must be at least 1"
        assert "generate" not in app.last_command
    assert not (tmp_path / "out").exists()


async def test_the_phase_lines_fit_80_columns_and_leave_the_panels_in_place(app):
    """A Wan2.1-14B-size request as the engine reports it on CUDA, fed through the bus."""
    event = RequestPhases(request_id=3, frames=81, latent_shape=(1, 16, 21, 60, 104),
                          phases={"text_encoding": 2.5, "denoise": 812.25, "vae_decode": 95.75},
                          vae_decode_peak_bytes=31_400_000_000)
    async with app.run_test(size=SMALL_TERMINAL) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await until(pilot, lambda: "g generate" in screen_text(app))  # the footer is drawn
        before = screen_text(app).splitlines()
        assert app.live_screen.phases.text == ""  # no video request yet: no lines taken
        app.engine.bus.publish(event)
        app.drain_events()
        await pilot.pause()
        after = screen_text(app)
        head, times = describe_phases(event)
        assert head in after and times in after, after
        assert head == "request 3: 81 frames · latent 1×16×21×60×104 · VAE decode peak 31.4 GB"
        total = sum(event.phases.values())
        for label, key in (("text encoding", "text_encoding"), ("denoise", "denoise"), ("VAE decode", "vae_decode")):
            match = re.search(rf"{label} ([\d.]+) s \((\d+)%\)", times)
            assert match is not None, times
            assert float(match.group(1)) == pytest.approx(event.phases[key], rel=0.005)
            assert abs(int(match.group(2)) - 100 * event.phases[key] / total) <= 0.5
        assert max(len(head), len(times)) <= SMALL_TERMINAL[0] - 2  # one terminal line each, with padding
        # the status line, the request line, the first panels and the footer are all still on screen
        for kept in ("engine ready", "no request yet", "GPU memory", "host memory", "policy (vLLM-Omni)",
                     "g generate"):
            assert any(kept in line for line in before), "\n".join(before)
            assert kept in after, f"{kept!r} pushed off the 80x24 screen:\n{after}"


def test_an_image_request_hides_the_phase_lines_and_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    from omni_console.console.widgets.request_phases import is_video

    image = RequestPhases(request_id=1, frames=1, latent_shape=(1, 16, 8, 8), phases={"denoise": 1.0})
    assert not is_video(image)

    def broken_writer(frames, target, *, fps, audio=None):
        target.path.write_bytes(b"half a video")
        raise OSError("No space left on device")

    monkeypatch.setattr("omni_console.engine.running.outputs.write_result", broken_writer)  # served by the door
    (tmp_path / "keep.mp4").write_bytes(b"earlier")
    with pytest.raises(OSError, match="No space left"):
        outputs.save_video([object()] * 5, tmp_path, 2, fps=16.0, when=PINNED_TIME)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.mp4"]
    assert (tmp_path / "keep.mp4").read_bytes() == b"earlier"


def test_an_image_to_video_dialog_has_an_image_field_checked_before_anything_starts(ltx_i2v_model_dir, tmp_path):
    model = discover_model(ltx_i2v_model_dir)
    form = RequestForm.for_model(model, GenerateRequest(prompt="a boat"), GenerateRequest)
    assert {"image", "frames", "negative_prompt", "max_sequence_length"} <= {f.id for f in form.fields()}
    values = {f.id: f.value for f in form.fields()}
    missing = tmp_path / "missing.png"
    with pytest.raises(ConfigError, match=r"^image .*missing\.png: no such file$"):
        form.build({**values, "image": str(missing)})
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("not a picture")
    with pytest.raises(ConfigError, match=r"^image .*notes\.png: not an image PIL can read"):
        form.build({**values, "image": str(not_an_image)})
    picture = tmp_path / "first-frame.png"
    Image.new("RGB", (32, 32), (10, 20, 30)).save(picture)
    request = form.build({**values, "image": str(picture), "frames": "9"})
    assert request.image == picture and request.frames == 9
    with pytest.raises(ConfigError, match=r"^frames 5: LTXImageToVideoPipeline renders 8k\+1 frames"):
        form.build({**values, "image": str(picture), "frames": "5"})
