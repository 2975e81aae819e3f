"""--lora in the plan: device bytes in the forecast and the budget, each mode's cost per step, auto's choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lora_writers import write_peft_lora
from safetensors import safe_open

from omni_console.console.cli import main
from omni_console.engine.api import RequestSize, checks, models, planner
from omni_console.engine.errors import ConfigError
from omni_console.engine.planning.documents import PlanDocument
from omni_console.offload.units import format_bytes

ITEMSIZE = {"float32": 4, "float64": 8}
PATTERN = r"attn\.to_|ff\."


def _lora(tmp_path: Path, model: Path, rank: int) -> Path:
    return write_peft_lora(tmp_path / f"r{rank}.safetensors", model / "transformer", "transformer",
                           pattern=PATTERN, rank=rank, seed=rank)


def _pairs(path: Path) -> list[tuple[int, int, int]]:
    """(rank, in, out) of each A/B pair in the file, read from its tensors."""
    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())  # noqa: SIM118 (not a dict)
        out = []
        for k in keys:
            if k.endswith(".lora_A.weight"):
                a = f.get_slice(k).get_shape()
                b = f.get_slice(k.replace(".lora_A.", ".lora_B.")).get_shape()
                out.append((a[0], a[1], b[0]))
    return out


def _plan_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["plan", "--device", "cpu", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_lora_figures_move_with_rank_and_are_in_the_forecast(demo_model_dir: Path, tmp_path: Path, capsys):
    model = str(demo_model_dir)
    docs = {r: _plan_json(capsys, "--model", model, "--lora", str(_lora(tmp_path, demo_model_dir, r)),
                          "--lora-mode", "sidecar") for r in (4, 16)}
    plain = _plan_json(capsys, "--model", model)
    dtype = next(c for c in plain["components"] if c["name"] == "transformer")["dtypes"][0]
    width = ITEMSIZE.get(dtype, 2)
    for rank, doc in docs.items():
        PlanDocument.model_validate(doc)  # the schema holds the LoRA keys
        lora = doc["lora"]
        pairs = _pairs(tmp_path / f"r{rank}.safetensors")
        assert lora["ab_bytes"] == sum(r * (i + o) for r, i, o in pairs) * width
        assert lora["merge_scratch_bytes"] == max(i * o for _, i, o in pairs) * width
        assert lora["chosen"] == "sidecar" and lora["device_bytes"] == lora["ab_bytes"]
        assert doc["forecast"]["lora_device_bytes"] == lora["device_bytes"]
        assert doc["forecast"]["device_resident_bytes"] - plain["forecast"]["device_resident_bytes"] == \
            lora["device_bytes"]
        assert doc["forecast"]["peak_device_weight_bytes"] - plain["forecast"]["peak_device_weight_bytes"] == \
            lora["device_bytes"]
    assert docs[16]["lora"]["ab_bytes"] == 4 * docs[4]["lora"]["ab_bytes"]
    assert docs[16]["lora"]["sidecar_flops_per_step"] == pytest.approx(4 * docs[4]["lora"]["sidecar_flops_per_step"])
    assert docs[16]["lora"]["merge_flops_per_step"] == pytest.approx(4 * docs[4]["lora"]["merge_flops_per_step"])
    assert plain["lora"] is None and plain["loras"] is None

    capsys.readouterr()
    assert main(["plan", "--model", model, "--device", "cpu", "--lora", str(tmp_path / "r16.safetensors"),
                 "--lora-mode", "merge"]) == 0
    out = capsys.readouterr().out
    lora = docs[16]["lora"]
    assert (f"LoRA mode merge: B·A added into each streamed block's slot as it arrives; resident modules merged "
            f"once at load ({format_bytes(lora['ab_bytes'])} of A/B + {format_bytes(lora['merge_scratch_bytes'])} "
            "B·A scratch on the device, in the forecast)") in out
    assert "LoRA cost per step: sidecar " in out and ", merge " in out


def test_merge_costs_only_streamed_blocks(demo_model_dir: Path, tmp_path: Path, capsys):
    lora = str(_lora(tmp_path, demo_model_dir, 8))
    streamed = _plan_json(capsys, "--model", str(demo_model_dir), "--lora", lora)
    blocks = streamed["forecast"]["num_streamed_blocks"] + streamed["forecast"]["num_resident_blocks"]
    resident = _plan_json(capsys, "--model", str(demo_model_dir), "--lora", lora, "--resident-layers", str(blocks))
    assert streamed["lora"]["merge_flops_per_step"] > 0
    assert resident["lora"]["merge_flops_per_step"] == 0  # merged once at load, nothing per step
    assert resident["lora"]["sidecar_flops_per_step"] == streamed["lora"]["sidecar_flops_per_step"]
    assert resident["lora"]["chosen"] == "merge"  # auto: nothing per step beats any sidecar


def test_auto_picks_sidecar_at_few_tokens_and_merge_at_many(demo_model_dir: Path, tmp_path: Path, capsys):
    lora = str(_lora(tmp_path, demo_model_dir, 8))
    small, large = (_plan_json(capsys, "--model", str(demo_model_dir), "--lora", lora, "--height", str(side),
                               "--width", str(side))["lora"] for side in (64, 1024))
    pairs = _pairs(Path(lora))
    # the sidecar grows with the tokens, the merge with the streamed weights only
    assert large["sidecar_flops_per_step"] > 16 * small["sidecar_flops_per_step"] * 0.9
    assert large["merge_flops_per_step"] == small["merge_flops_per_step"]
    forwards = small["merge_flops_per_step"] / sum(2 * r * i * o for r, i, o in pairs)
    assert forwards == round(forwards) >= 1  # B·A of every layer once per forward (all blocks streamed)
    for doc in (small, large):
        cheaper = "sidecar" if doc["sidecar_flops_per_step"] < doc["merge_flops_per_step"] else "merge"
        assert doc["chosen"] == cheaper and doc["why"] == f"auto: {cheaper}, the smaller forecast step"
        assert doc["device_bytes"] == doc["ab_bytes"] + (doc["merge_scratch_bytes"] if cheaper == "merge" else 0)
    assert (small["chosen"], large["chosen"]) == ("sidecar", "merge")


def test_a_budget_that_fits_without_lora_plans_fewer_resident_blocks_with_it(demo_model_dir: Path, tmp_path: Path):
    model = models.discover_model(demo_model_dir, None)
    loras = checks.check_loras(model, ((str(_lora(tmp_path, demo_model_dir, 16)), 1.0),))
    modules = [m for f in loras for m in f.modules]
    policy = planner.build_policy(mode="dlo")
    size, device = RequestSize(height=64, width=64), "NVIDIA H100 80GB HBM3"
    every = model.num_dit_blocks

    def resident(budget: int, lora: bool) -> int:
        try:  # a slow link (1 kB/s) makes every resident block worth its room
            planned = planner.plan_for(model, policy, budget, size, device, bandwidth=1e3,
                                       lora_modules=modules if lora else (), lora_mode="sidecar")
        except ConfigError:  # nothing fits
            return -1
        return planned.plan.forecast.num_resident_blocks

    low, high = 2**20, 2**40
    assert resident(high, False) == every
    while high - low > 1:  # the smallest budget that keeps every block resident without the LoRA
        mid = (low + high) // 2
        low, high = (low, mid) if resident(mid, False) == every else (mid, high)
    assert 0 <= resident(high, True) < every
    planned = planner.plan_for(model, policy, high, size, device, bandwidth=1e3, lora_modules=modules,
                               lora_mode="sidecar")
    assert planned.plan.forecast.lora_device_bytes == planned.lora.ab_bytes > 0
    assert resident(high + planned.lora.ab_bytes, True) == every


def test_the_vllm_omni_export_names_its_lora_arguments_or_says_what_it_cannot(demo_model_dir: Path, tmp_path: Path,
                                                                             capsys):
    one, two = (str(_lora(tmp_path, demo_model_dir, r)) for r in (4, 8))
    doc = _plan_json(capsys, "--model", str(demo_model_dir), "--lora", f"{one}:0.7", "--lora-mode", "sidecar")
    assert doc["lora"]["vllm_omni"] == (f"Omni(..., lora_path={tmp_path}); per request: LoRARequest("
                                        f"lora_name='lora0', lora_int_id=1, lora_path={tmp_path}) with lora_scale=0.7")
    assert len(doc["lora"]["vllm_omni_gaps"]) == 1 and "PEFT adapter folder" in doc["lora"]["vllm_omni_gaps"][0]
    doc = _plan_json(capsys, "--model", str(demo_model_dir), "--lora", one, "--lora", two, "--lora-mode", "merge")
    gaps = doc["lora"]["vllm_omni_gaps"]
    assert any("2 LoRAs at once" in g for g in gaps) and any("merge on upload has no vLLM-Omni spelling" in g
                                                            for g in gaps)


def test_auto_decides_by_the_forecast_step_with_two_experts(tmp_path: Path):
    """Two experts are no special case: merge follows the expert switch, so auto picks the smaller step, as for
    one DiT (merge at the pipeline's default size, where a forward's tokens are many; sidecar at a tiny one)."""
    from tiny_families_experts import build_tiny_wan22_a14b

    root = build_tiny_wan22_a14b(tmp_path / "wan22", seed=0)
    model = models.discover_model(root, None)
    lora = write_peft_lora(tmp_path / "w.safetensors", root / "transformer", "transformer",
                           pattern=r"blocks\.\d+\.attn1", seed=1)
    modules = [m for f in checks.check_loras(model, ((str(lora), 1.0),)) for m in f.modules]
    for size, chosen in ((RequestSize(), "merge"), (RequestSize(height=32, width=32, frames=5), "sidecar")):
        planned = planner.plan_for(model, planner.build_policy(mode="dlo"), None, size, "cpu",
                                   lora_modules=modules, lora_mode="auto")
        lora_modes = planned.lora
        assert planned.plan.experts and lora_modes.chosen == chosen, size
        assert (lora_modes.merge_flops < lora_modes.sidecar_flops) == (chosen == "merge")
        assert lora_modes.why == f"auto: {chosen}, the smaller forecast step"


def test_auto_runs_the_sidecar_where_merge_would_write_fp8_storage(demo_model_dir: Path, tmp_path: Path):
    """fp8 resident blocks upcast per forward: merge is refused (one line, before load), auto plans the sidecar."""
    from omni_console.engine.engine import Engine
    from omni_console.engine.options import EngineOptions
    from omni_console.offload.errors import PolicyError

    lora = write_peft_lora(tmp_path / "m.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.(to_|add_)", seed=1)  # one auto merges where it may (the smaller step)
    policy = planner.build_policy({}, 2, stream_dtype="float8_e4m3fn", upcast_resident="off")
    for mode in ("auto", "merge"):
        engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(lora), 1.0),), lora_mode=mode))
        try:
            if mode == "merge":
                with pytest.raises(PolicyError, match="^--lora-mode merge with fp8 resident blocks upcast per forward"):
                    engine.make_plan(policy)
                continue
            assert engine.lora_modes(engine.make_plan(planner.build_policy({}, 2))).chosen == "merge"
            modes = engine.lora_modes(engine.make_plan(policy))
            assert (modes.chosen, modes.why) == ("sidecar", "auto: sidecar (fp8 resident blocks upcast per forward "
                                                            "cannot be merged into)")
        finally:
            engine.close()
