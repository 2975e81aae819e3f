"""Two experts (Wan 2.2 A14B) in the console: the idle expert's blocks are shown as the idle expert's, not as
blocks waiting on the host for their turn in this forward, and the running expert is named.

- live residency panel (pilot): the running expert's blocks one row each as usual; the idle expert's one
  `idle expert` row naming the running one; after a switch the two change places;
- the plan screen's block lists and `plan`'s DiT block rows: an `expert` column (running / idle) and a
  caption saying what idle means.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from app_helpers import load, make_app, screen_text, until
from tiny_families_experts import build_tiny_wan22_a14b

from omni_console.console.cli import main
from omni_console.engine.engine import Engine
from omni_console.offload.policy import build_policy


@pytest.fixture(scope="module")
def wan22_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_wan22_a14b(tmp_path_factory.mktemp("models") / "wan22-a14b", seed=0)


@pytest.mark.slow
async def test_the_idle_experts_blocks_show_as_idle_with_the_running_expert_named(wan22_dir, tmp_path, wan_loadable):
    engine = Engine(wan22_dir, device="cpu")
    app = make_app(engine, tmp_path, build_policy({}, 1))
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.pause()
            blocks = app.plan_screen.blocks
            assert [(r[0], r[-1]) for r in blocks.rows if r[1] == "blocks"] == [
                ("transformer", "running"), ("transformer_2", "idle")]
            await load(pilot, app)
            live = app.live_screen
            await until(pilot, lambda: bool(live.residency.rows))
            rows = {r.name: r.state for r in live.residency.rows}
            assert rows["transformer_2 blocks (3; transformer running)"] == "idle_expert"
            assert not any(name.startswith("transformer_2.blocks.") for name in rows)  # not three "host" rows
            assert rows["transformer.blocks.0"] == "resident"
            assert {rows["transformer.blocks.1"], rows["transformer.blocks.2"]} <= {"host", "device"}
            assert rows["transformer_2 (non-block modules)"] == "resident"
            await until(pilot, lambda: "idle expert" in screen_text(app))  # the state column's words

            engine.placement.experts.switch_to(1, "boundary")  # what the boundary step does inside a request
            idle = "transformer blocks (3; transformer_2 running)"  # the engine's snapshot reaches the panel
            await until(pilot, lambda: any(r.name == idle for r in live.residency.rows))
            swapped = {r.name: r.state for r in live.residency.rows}
            assert swapped["transformer blocks (3; transformer_2 running)"] == "idle_expert"
            assert swapped["transformer_2.blocks.0"] == "resident"
            assert not any(name.startswith("transformer.blocks.") for name in swapped)
            engine.placement.experts.restore()
    finally:
        app.shutdown()
        engine.close()


def test_plan_rows_say_which_expert_runs_and_which_is_idle(wan22_dir, capsys):
    assert main(["plan", "--model", str(wan22_dir), "--resident-layers", "1"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("DiT\tblock list"))
    assert header.split("\t")[-1] == "expert"
    rows = [line.split("\t") for line in out.splitlines() if line.startswith("transformer")]
    assert [(r[0], r[-1]) for r in rows if r[1] == "blocks"] == [("transformer", "running"), ("transformer_2", "idle")]
    assert "transformer_2 is idle, its blocks parked in host memory, until the boundary step" in out


def test_a_single_dit_plan_has_no_expert_column(demo_model_dir, capsys):
    assert main(["plan", "--model", str(demo_model_dir)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("DiT\tblock list"))
    assert "expert" not in header and "idle" not in out
