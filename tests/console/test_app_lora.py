"""The console's LoRA panel (`--lora`): it lists the files, toggles and scales them, and each request carries
the set the panel showed when it was submitted (a queued one keeps it), rendered as plain diffusers renders it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest
from app_helpers import finish, hold_first_step, load, make_app, screen_text, until
from lora_writers import write_peft_lora
from PIL import Image
from textual.widgets import Input

from omni_console.console.cli import main
from omni_console.console.key_help import help_sections
from omni_console.console.lora_set import LoraSet, lora_text
from omni_console.console.screens import GenerateDialog, HistoryScreen
from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.offload.policy import build_policy


def two_loras(demo_model_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    a = write_peft_lora(tmp_path / "a.safetensors", demo_model_dir / "transformer", "transformer",
                        pattern=r"attn\.to_|ff", seed=4)
    b = write_peft_lora(tmp_path / "b.safetensors", demo_model_dir / "transformer", "transformer",
                        pattern=r"attn\.(to_|add_)", seed=7)
    return a, b


def plain_png(path: Path, request, loras: tuple[tuple[str, float], ...]) -> np.ndarray:
    """What plain diffusers renders for `request` with these LoRAs loaded and set (PEFT, as sidecar applies)."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    names = [f"plain{i}" for i in range(len(loras))]
    for (file, _), name in zip(loras, names, strict=True):
        pipe.load_lora_weights(file, adapter_name=name)
    if loras:
        pipe.set_adapters(names, [scale for _, scale in loras])
    return np.asarray(pipe(**request.call_kwargs(pipe)).images[0])


def test_lora_set_edits_and_the_request_text():
    lora_set = LoraSet((("x/a.safetensors", 0.6), ("b.safetensors", 1.0)), "merge")
    assert lora_set.rescale(0.1).scale == 0.7
    assert lora_set.rescale(-0.1).scale == 0.6
    lora_set.move(1)
    assert lora_set.toggle().on is False
    assert lora_set.request_loras() == (("x/a.safetensors", 0.6),)
    lora_set.move(1)  # wraps to the first
    assert lora_set.selected == 0
    assert lora_text(lora_set.request_loras()) == "LoRA a×0.6"
    assert lora_text(()) == "LoRA off" and lora_text(None) == ""
    assert LoraSet(()).toggle() is None and not LoraSet(())


def test_help_lists_the_lora_keys_only_when_started_with_lora():
    def live_rows(lora_keys: bool) -> str:
        sections = dict(help_sections([], "ctrl+p", lambda b: b.key, lora_keys=lora_keys))
        return "\n".join(f"{key} {text}" for key, text in sections["live screen (after load)"])

    assert "LoRA" not in live_rows(False)
    rows = live_rows(True)
    for key, words in (("l", "on / off"), ("full_stop", "scale +0.1"), ("comma", "scale -0.1"), ("j", "next LoRA")):
        assert re.search(rf"{key}\b.*{re.escape(words)}", rows), rows


def test_console_refuses_a_missing_lora_in_one_line_before_load(demo_model_dir: Path, tmp_path: Path, capsys):
    assert main(["console", "--model", str(demo_model_dir), "--lora", str(tmp_path / "none.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none.safetensors" in err and err.startswith("omni-console: error:"), err


def test_console_refuses_lora_with_a_rank_group_in_one_line(demo_model_dir: Path, tmp_path: Path, capsys):
    lora = str(tmp_path / "a.safetensors")
    assert main(["console", "--model", str(demo_model_dir), "--gpus", "2", "--lora", lora]) == 2
    assert capsys.readouterr().err.strip() == ("omni-console: error: --lora with --gpus N > 1: the rank group does not "
                                               "apply LoRAs yet (one GPU does)")


@pytest.mark.slow  # one load, three requests, two plain pipelines
async def test_the_panel_sets_the_next_requests_loras_and_a_queued_one_keeps_its_set(
        demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    a, b = two_loras(demo_model_dir, tmp_path)
    started = ((str(a), 0.6), (str(b), 1.0))
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=started, lora_mode="sidecar"))
    ran: list = []
    generate = engine.generate
    monkeypatch.setattr(engine, "generate", lambda request, *args, **kw: ran.append(request) or generate(
        request, *args, **kw))  # records what each request carried; the engine runs it
    app = make_app(engine, tmp_path, build_policy({}, 0))
    app.lora_set = LoraSet(started, "sidecar")
    in_first_step, release = hold_first_step(monkeypatch)  # the first request holds until the second is queued
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await load(pilot, app)
            text = screen_text(app)
            assert "LoRA · mode sidecar" in text
            assert re.search(r"▶ on  ×0\.6\s+a\.safetensors", text) and re.search(r"on  ×1\s+b\.safetensors", text)
            await pilot.press("full_stop", "j", "l")  # a to 0.7, select b, b off
            text = screen_text(app)
            assert re.search(r"  on  ×0\.7\s+a\.safetensors", text) and re.search(r"▶ off ×1\s+b\.safetensors", text)

            async def submit() -> None:
                await pilot.press("g")
                await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
                app.screen.query_one("#steps", Input).value = "2"
                app.screen.query_one("#prompt", Input).value = "a red cube"
                await pilot.press("enter")
                await until(pilot, lambda: not isinstance(app.screen, GenerateDialog))

            await submit()
            assert await asyncio.to_thread(in_first_step.wait, 30)
            await submit()  # queued behind the first: with the set it was submitted with
            assert "LoRA a×0.7" in screen_text(app)  # the queue's row
            release.set()
            await pilot.press("l")  # b on again: from the next request
            third = app.last_command["generate"]
            await submit()
            assert app.last_command["generate"] is not third
            await finish(pilot, app.last_command["generate"], lambda: not app.generating and len(ran) == 3)
            app.action_history()
            await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
            await pilot.pause()
            shown = screen_text(app)
            assert shown.count("LoRA a×0.7 b×1") == 1 and shown.count("LoRA a×0.7") == 3, shown
        first, second, last = (request.loras for request in ran)
        assert first == second == ((str(a), 0.7),) and last == ((str(a), 0.7), (str(b), 1.0))
        outputs = sorted((tmp_path / "out").iterdir(), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        assert len(outputs) == 3
        assert np.array_equal(np.asarray(Image.open(outputs[0])), plain_png(demo_model_dir, ran[0], first))
        assert np.array_equal(np.asarray(Image.open(outputs[2])), plain_png(demo_model_dir, ran[2], last))
    finally:
        app.shutdown()
        engine.close()


@pytest.mark.slow  # one load, two requests
async def test_the_panel_title_follows_the_mode_auto_resolves_after_a_switch(demo_model_dir: Path, tmp_path: Path):
    """`--lora-mode auto` decides per set: a switch that makes the engine merge where it ran the sidecar (or back)
    shows in the panel's title once the engine applied it."""
    a, b = two_loras(demo_model_dir, tmp_path)
    started = ((str(a), 0.6), (str(b), 1.0))
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=started, lora_mode="auto"))
    policy = build_policy({}, 0)
    plan = engine.make_plan(policy)  # the forecast step decides: both at once as a sidecar, b alone merged
    assert engine.lora_modes(plan).chosen == "sidecar" and engine.lora_modes(plan, engine.loras[1:]).chosen == "merge"
    app = make_app(engine, tmp_path, policy)
    app.lora_set = LoraSet(started, "auto")
    app.lora_chosen_mode = "sidecar"  # as the console's start sets it from the plan

    async def run_one() -> None:
        before = app.last_command.get("generate")
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
        app.screen.query_one("#steps", Input).value = "1"
        await pilot.press("enter")
        await until(pilot, lambda: app.last_command.get("generate") is not before)
        await finish(pilot, app.last_command["generate"], lambda: not app.generating)
        await pilot.pause()

    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await load(pilot, app)
            assert "LoRA · mode auto (sidecar) · next request" in screen_text(app)
            await pilot.press("l")  # a off: b alone from the next request
            assert "LoRA · mode auto (sidecar) · next request" in screen_text(app)  # not applied yet
            await run_one()
            assert "LoRA · mode auto (merge) · next request" in screen_text(app)
            await pilot.press("l")  # a on again
            await run_one()
            assert "LoRA · mode auto (sidecar) · next request" in screen_text(app)
        assert engine.options.loras == started
    finally:
        app.shutdown()
        engine.close()
