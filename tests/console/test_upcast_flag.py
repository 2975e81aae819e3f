"""`--upcast-resident` in `plan` (text and JSON): the resident blocks kept in the compute dtype, their bytes
in the device figures, and bad values refused in one line with exit 2 before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_console.console.cli import main

FP8 = ("--stream-dtype", "float8_e4m3fn")


def _json(capsys, model: Path, *extra: str) -> dict:
    assert main(["plan", "--model", str(model), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_shows_the_blocks_kept_upcast(demo_model_dir: Path, capsys):
    fp8 = _json(capsys, demo_model_dir, *FP8, "--resident-layers", "3")
    up = _json(capsys, demo_model_dir, *FP8, "--resident-layers", "3", "--upcast-resident", "2")
    assert fp8["policy"]["upcast_resident"] == "auto" and fp8["forecast"]["upcast_block_indices"] == []
    assert up["policy"]["upcast_resident"] == 2 and up["forecast"]["upcast_block_indices"] == [0, 1]
    f0, f1 = fp8["forecast"], up["forecast"]
    assert f1["device_resident_bytes"] > f0["device_resident_bytes"]  # at the compute dtype
    assert f1["pinned_host_bytes"] == f0["pinned_host_bytes"]  # the host keeps fp8
    assert any("--upcast-resident" in gap for gap in up["vllm_omni"]["gaps"])
    assert main(["plan", "--model", str(demo_model_dir), *FP8, "--resident-layers", "3", "--upcast-resident", "2"]) == 0
    text = capsys.readouterr().out
    assert "kept upcast" in text and "2 of 3" in text


@pytest.mark.parametrize("flags,words", [
    (("--upcast-resident", "some"), "auto, off or a number"),
    (("--upcast-resident", "-1"), ">= 0"),
    (("--resident-layers", "2", "--upcast-resident", "1"), "needs fp8 storage"),
    (("--mode", "resident", *FP8, "--upcast-resident", "1"), "mode=dlo"),
])
def test_bad_values_exit_2_in_one_line(demo_model_dir: Path, capsys, flags, words):
    assert main(["plan", "--model", str(demo_model_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_the_consoles_forecast_rows_show_the_blocks_kept_upcast(demo_model_dir: Path):
    from omni_console.console.plan_context import LinkInfo
    from omni_console.console.widgets.plan_forecast import forecast_rows
    from omni_console.engine.model_dir.discovery import discover_model
    from omni_console.engine.planning.plan import make_plan
    from omni_console.offload.policy import build_policy

    model = discover_model(demo_model_dir)
    link = LinkInfo(is_cuda=False)
    fp8 = forecast_rows(make_plan(model, build_policy({}, 3, stream_dtype=FP8[1])), link)
    up = forecast_rows(make_plan(model, build_policy({}, 3, stream_dtype=FP8[1], upcast_resident=2)), link)
    assert not any(r[0] == "kept upcast" for r in fp8)
    assert [r[1] for r in up if r[0] == "kept upcast"] == ["2 of 3"]
