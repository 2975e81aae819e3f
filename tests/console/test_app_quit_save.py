"""Pilot tests: images never replace earlier files, q never waits for a stuck step, and a cancelled or
failed request says so (status line, event log) instead of saving a half-denoised image."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path

import pytest
from app_helpers import finish, load, make_app, screen_text, until
from PIL import Image

from omni_console.console import outputs, request_outcome
from omni_console.console.headless import default_request
from omni_console.console.widgets import format_event
from omni_console.engine.engine import EngineState, GenerateResult
from omni_console.engine.events import StepTiming
from omni_console.engine.running.runner import StepClock

PINNED_TIME = 1_700_000_000.0  # every name this test's run makes carries this second


def png_bytes(path) -> bytes:
    Image.new("RGB", (2, 2), (255, 0, 0)).save(path, format="PNG")
    return path.read_bytes()


async def generate(pilot, app, steps: int = 2):
    future = app.start_generate(default_request(app.engine, prompt="a red cube", steps=steps))
    assert future is not None
    await finish(pilot, future, lambda: not app.generating)
    return future


@pytest.mark.slow
async def test_two_generations_keep_every_image_of_a_previous_run(app, tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "now", lambda: PINNED_TIME)
    out = tmp_path / "out"
    out.mkdir()
    stem = outputs.output_stem(1, PINNED_TIME)
    # a previous run: the old names, and this run's own first name (same second, same request number)
    old = {name: png_bytes(out / name) for name in ("request-1.png", "request-2.png", f"{stem}.png",
                                                     f"{stem}-2.png")}
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await generate(pilot, app)
        first = app.last_output
        await generate(pilot, app)
        second = app.last_output
    for name, data in old.items():
        assert (out / name).read_bytes() == data, f"{name} was replaced"
    new = sorted(set(p.name for p in out.iterdir()) - set(old))
    assert new == sorted([f"{stem}-3.png", f"{outputs.output_stem(2, PINNED_TIME)}.png"])
    assert {first.name, second.name} == set(new)
    for name in new:
        with Image.open(out / name) as image:
            assert image.size == (64, 64)
    assert app.notices[-1] == (f"image saved: {second}", "information")


def test_save_image_never_opens_an_existing_file_and_removes_only_its_own_half_written_file(tmp_path):
    class BrokenImage:
        def save(self, handle, format):  # noqa: A002 - PIL's keyword
            handle.write(b"half")
            raise OSError("No space left on device")

    stem = outputs.output_stem(7, PINNED_TIME)
    (tmp_path / f"{stem}.png").write_bytes(b"earlier")
    with pytest.raises(OSError, match="No space left"):
        outputs.save_image(BrokenImage(), tmp_path, 7, when=PINNED_TIME)
    assert [p.name for p in tmp_path.iterdir()] == [f"{stem}.png"]
    assert (tmp_path / f"{stem}.png").read_bytes() == b"earlier"
    assert re.fullmatch(r"\d{8}-\d{6}-request-7", stem)


@pytest.mark.slow
async def test_q_during_a_stuck_step_exits_within_two_seconds_and_the_release_follows(app, engine, monkeypatch):
    entered, unstick = threading.Event(), threading.Event()

    def stuck_pipeline(*_args, **_kwargs):  # a kernel that ignores cancel for up to a minute
        entered.set()
        unstick.wait(60)
        raise RuntimeError("unstuck")

    monkeypatch.setattr("omni_console.engine.running.generation.run_pipeline", stuck_pipeline)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause()
            await load(pilot, app)
            app.start_generate(default_request(engine, prompt="forever", steps=2))
            assert await asyncio.to_thread(entered.wait, 30)
            start = time.monotonic()
            press = asyncio.create_task(pilot.press("q"))  # the pilot's own wait after a key is not the app's
            while app.return_value is None and time.monotonic() - start < 10:
                await asyncio.sleep(0.02)
            exited = time.monotonic() - start
            assert app.return_value == 0
            press.cancel()
        assert exited < 2.0, f"the app exited {exited:.2f} s after q"
        assert time.monotonic() - start < 2.0, f"run_test ended {time.monotonic() - start:.2f} s after q"
        assert engine.state == EngineState.RUNNING  # the step is still in its kernel: not waited for
        assert app.worker._cancel.is_set()  # but it was told to cancel
    finally:
        unstick.set()
    assert app.worker.join(timeout=30)
    assert engine.state == EngineState.UNLOADED and engine.placement is None  # released right after


@pytest.mark.slow
async def test_a_cancelled_request_saves_nothing_and_says_after_how_many_steps(app, tmp_path, monkeypatch):
    first_step = threading.Event()
    real_step_end = StepClock.on_step_end

    def step_end_waiting_for_escape(self, pipe, step, timestep, kwargs):
        if step == 0:
            first_step.set()
            assert self.cancel.wait(30)  # the operator presses esc during the first step
        return real_step_end(self, pipe, step, timestep, kwargs)

    monkeypatch.setattr(StepClock, "on_step_end", step_end_waiting_for_escape)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        future = app.start_generate(default_request(app.engine, prompt="a red cube", steps=4))
        assert await asyncio.to_thread(first_step.wait, 30)
        await pilot.press("escape")
        await finish(pilot, future, lambda: not app.generating)
        await pilot.pause()
        said = "request 1 cancelled after 1/4 steps; nothing saved"
        assert app.notices[-1] == (said, "warning")
        assert said in app.live_screen.gen_text
        assert any(said in line for line in app.live_screen.staging.lines)
        assert said in screen_text(app)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert app.last_output is None


@pytest.mark.slow
async def test_a_cancel_stops_inside_the_step_so_even_save_partial_keeps_nothing(engine, tmp_path, monkeypatch):
    monkeypatch.setattr(StepClock, "on_step_end", cancel_at_first_step(StepClock.on_step_end))
    app = make_app(engine, tmp_path, save_partial=True)
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.pause()
            await load(pilot, app)
            await generate(pilot, app, steps=3)
            assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
            assert app.last_output is None
            assert app.notices[-1] == ("request 1 cancelled after 1/3 steps; nothing saved", "warning")
    finally:
        app.shutdown()


@pytest.mark.slow
async def test_escape_during_a_long_step_ends_the_request_within_2_s(app, tmp_path):
    """A step of six 1 s blocks (6 s): esc lands at the next block, not at the step's end (the engine is
    idle again within 2 s of the key, measured on its thread; the app's own drain adds its 0.1 s tick)."""
    in_step = threading.Event()

    def slow_block(*_args):
        in_step.set()
        time.sleep(1.0)

    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        dit = app.engine.pipe.transformer
        handles = [b.register_forward_pre_hook(slow_block)
                   for b in [*dit.transformer_blocks, *dit.single_transformer_blocks]]
        ended: list[float] = []
        cancelled: list[float] = []
        real_cancel = app.worker.cancel
        app.worker.cancel = lambda: (cancelled.append(time.monotonic()), real_cancel())  # esc's action ran
        try:
            future = app.start_generate(default_request(app.engine, prompt="a red cube", steps=4))
            future.add_done_callback(lambda _f: ended.append(time.monotonic()))
            assert await asyncio.to_thread(in_step.wait, 60)
            await pilot.press("escape")
            await finish(pilot, future, lambda: not app.generating)
        finally:
            for handle in handles:
                handle.remove()
        # from the key's action to the engine's end (a loaded machine can delay the key itself; the
        # key→frame time is benchmarks/console_watched.py's)
        assert ended[0] - cancelled[0] < 2.0, f"the request ended {ended[0] - cancelled[0]:.2f} s after esc"
        assert app.engine.state == EngineState.READY and app.last_output is None
        assert app.notices[-1] == ("request 1 cancelled after 0/4 steps; nothing saved", "warning")
        # nothing of the cancelled request is kept: the next request runs whole and is saved
        await generate(pilot, app, steps=2)
        assert app.last_output is not None and app.last_output.exists()


def cancel_at_first_step(real_step_end):
    def step_end(self, pipe, step, timestep, kwargs):
        self.cancel.set()
        return real_step_end(self, pipe, step, timestep, kwargs)
    return step_end


@pytest.mark.slow
async def test_a_failed_request_is_in_the_event_log_not_only_a_toast(app, tmp_path, monkeypatch):
    def failing_pipeline(*_args, **_kwargs):
        raise RuntimeError("CUDA error: an illegal memory access (injected)")

    monkeypatch.setattr("omni_console.engine.running.generation.run_pipeline", failing_pipeline)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await generate(pilot, app)
        await pilot.pause()
        reason = "RuntimeError: CUDA error: an illegal memory access (injected)"
        assert app.notices[-1] == (f"request failed: {reason}", "error")
        log = "\n".join(app.live_screen.staging.lines)
        assert f"ERROR request 1: failed: {reason}" in log
        await until(pilot, lambda: "ERROR request 1: failed" in screen_text(app))
    assert not (tmp_path / "out").exists()


def test_outcome_lines_for_a_full_disk_a_cancel_and_a_success():
    def result(done: int, total: int) -> GenerateResult:
        steps = [StepTiming(request_id=4, step=i + 1, total_steps=total, wall_s=0.5, stall_s=0.0, h2d_bytes=0)
                 for i in range(done)]
        return GenerateResult(4, Image.new("RGB", (2, 2)), 2.0, steps)

    full = request_outcome.finished(result(3, 3), None, "OSError: No space left on device")
    assert (full.notice, full.severity) == ("image not saved: OSError: No space left on device", "warning")
    assert format_event(full.log).endswith("ERROR request 4: image not saved: OSError: No space left on device")
    cut = request_outcome.finished(result(2, 5), None, None)
    assert cut.notice == "request 4 cancelled after 2/5 steps; nothing saved" and cut.severity == "warning"
    assert not request_outcome.should_save(result(2, 5), save_partial=False)
    assert request_outcome.should_save(result(2, 5), save_partial=True)
    ok = request_outcome.finished(result(3, 3), Path("/out/x.png"), None)
    assert ok.notice == "image saved: /out/x.png" and ok.log is None
    assert ok.status.startswith("request 4: 3 steps in ")
