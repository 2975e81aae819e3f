"""fp8 checkpoints with scales (engine/model_dir/quant_layouts.py): what the installed diffusers / transformers load
from a folder is loaded as they load it; what they cannot load, or would load wrongly, is refused
before anything loads, in one line (`plan` exits 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from test_engine import request_for
from test_hostile_dirs import assert_refused

from omni_console.engine.engine import Engine
from omni_console.engine.errors import ConfigError
from omni_console.engine.model_dir import quant_layouts
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.model_dir.quant_layouts import check_fp8_device
from omni_console.engine.planning.plan import make_plan
from omni_console.offload.errors import PolicyError
from omni_console.offload.policy import build_policy

FP8 = torch.float8_e4m3fn


def _rewrite(folder: Path, quantize, config: dict | None) -> None:
    """Each 2-D linear weight of `folder` (blocks and layers only) replaced by `quantize(name, w)`'s tensors;
    `config`: the quantization_config written into config.json (None: none)."""
    for f in folder.glob("*.safetensors"):
        out = {}
        for k, v in load_file(f).items():
            layer = k.removesuffix(".weight")
            if k.endswith(".weight") and v.ndim == 2 and ("blocks" in k or ".layer." in k) and "norm" not in k:
                out.update(quantize(layer, v))
            else:
                out[k] = v
        save_file(out, f, metadata={"format": "pt"})
    if config is not None:
        doc = json.loads((folder / "config.json").read_text())
        doc["quantization_config"] = config
        (folder / "config.json").write_text(json.dumps(doc))


def per_row(layer: str, w: torch.Tensor, scale_name: str = "weight_scale") -> dict[str, torch.Tensor]:
    """BFL's fp8r: an E4M3 weight and a float32 scale per output row."""
    s = (w.float().abs().amax(dim=1) / 448).clamp(min=1e-12)
    return {f"{layer}.weight": (w.float() / s[:, None]).clamp(-448, 448).to(FP8), f"{layer}.{scale_name}": s}


def per_tensor_inv(layer: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' fine-grained fp8 with one scale per tensor (`weight_scale_inv`, multiplied back)."""
    s = (w.float().abs().amax() / 448).clamp(min=1e-12)
    return {f"{layer}.weight": (w.float() / s).clamp(-448, 448).to(FP8), f"{layer}.weight_scale_inv": s.reshape(1)}


def copy_with(demo: Path, out: Path, component: str, quantize, config: dict | None) -> Path:
    shutil.copytree(demo, out)
    _rewrite(out / component, quantize, config)
    return out


def test_scales_without_a_quantization_config_are_refused(demo_model_dir: Path, tmp_path: Path, capsys):
    """diffusers itself would drop the scales (unexpected keys) and compute with the unscaled fp8 values."""
    root = copy_with(demo_model_dir, tmp_path / "m", "transformer", per_row, None)
    model = diffusers.FluxTransformer2DModel.from_pretrained(root / "transformer", local_files_only=True)
    name = "transformer_blocks.0.attn.to_q"
    stored = {k: v for f in (root / "transformer").glob("*.safetensors") for k, v in load_file(f).items()}
    assert stored[f"{name}.weight"].dtype == FP8
    assert torch.equal(model.get_submodule(name).weight, stored[f"{name}.weight"].float())  # scale dropped
    assert_refused(root, capsys, "transformer", "scale tensors", "no quantization_config", "weight_scale")


@pytest.mark.parametrize("scale_name", ["scale_weight", "weight_scale_inv", "input_scale"])
def test_every_scale_spelling_is_seen(tmp_path: Path, scale_name: str):
    class T:
        def __init__(self, name: str, dtype: str) -> None:
            self.name, self.dtype = name, dtype

    fp8 = [T("a.weight", "float8_e4m3fn"), T(f"a.{scale_name}", "float32")]
    plain = [T("b.weight", "bfloat16"), T(f"b.{scale_name}", "float32")]  # not an fp8 weight's
    assert quant_layouts.scaled_fp8_weights(fp8 + plain) == [f"a.{scale_name}"]


@pytest.mark.parametrize("config,fragment", [
    ({"quant_method": "bfl"}, "only through from_single_file"),
    ({"quant_method": "gguf", "compute_dtype": "bfloat16"}, "only through from_single_file"),
    ({"quant_method": "modelopt", "quant_type": "FP8"}, "nvidia-modelopt package, which is not installed"),
    ({"quant_method": "quanto", "weights_dtype": "float8"}, "optimum-quanto package, which is not installed"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "not a quantization method diffusers loads"),
])
def test_diffusers_layouts_it_cannot_load_are_refused_before_load(demo_model_dir: Path, tmp_path: Path, capsys,
                                                                   config: dict, fragment: str):
    """Each refusal is true: the installed diffusers fails to load the very folder."""
    module = config.get("quant_method")
    if module in ("modelopt", "quanto") and quant_layouts._installed(quant_layouts.DIFFUSERS_PACKAGES[module][0]):
        pytest.skip(f"{module}'s package is installed here")
    root = copy_with(demo_model_dir, tmp_path / "m", "transformer", per_row, config)
    with pytest.raises(Exception):  # noqa: B017 - each library fails its own way (TypeError, ImportError, ...)
        diffusers.FluxTransformer2DModel.from_pretrained(root / "transformer", local_files_only=True)
    assert_refused(root, capsys, str(root / "transformer"), fragment)


def test_a_quantized_dit_is_not_streamed(demo_model_dir: Path, tmp_path: Path, monkeypatch):
    """A quantizer the library can load replaces the DiT's layers: DLO refuses it, resident mode plans it."""
    root = copy_with(demo_model_dir, tmp_path / "m", "transformer", per_row,
                     {"quant_method": "torchao", "quant_type": "float8_weight_only"})
    monkeypatch.setattr(quant_layouts, "_installed", lambda module: True)
    model = discover_model(root)
    assert model.component("transformer").quant_method == "torchao"
    with pytest.raises(PolicyError, match="quantized .'torchao'.*--mode resident"):
        make_plan(model, build_policy({}, 0))
    assert make_plan(model, build_policy(None, 0, "resident")).components


def test_transformers_layouts_other_than_fine_grained_fp8_are_refused(demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_with(demo_model_dir, tmp_path / "m", "text_encoder_2", per_tensor_inv,
                     {"quant_method": "compressed-tensors"})
    assert_refused(root, capsys, "text_encoder_2", "fine-grained fp8", "'compressed-tensors'")


@pytest.mark.slow
def test_a_fine_grained_fp8_encoder_runs_as_the_plain_pipeline(demo_model_dir: Path, tmp_path: Path):
    """transformers' `"quant_method": "fp8"` T5 (per-tensor `weight_scale_inv`): built by transformers as the
    plain pipeline builds it (on a CPU dequantized at load, on a GPU kept fp8), staged or resident, the
    image bit-identical to plain diffusers loading that folder."""
    root = copy_with(demo_model_dir, tmp_path / "m", "text_encoder_2", per_tensor_inv,
                     {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": None})
    info = discover_model(root).component("text_encoder_2")
    assert info.quant_method == "fp8" and "float8_e4m3fn" in info.dtypes
    req = request_for("flux")
    pipe = diffusers.FluxPipeline.from_pretrained(root, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe.text_encoder_2, transformers.T5EncoderModel)
    expected = np.asarray(pipe(**req.call_kwargs(pipe)).images[0])
    plain = diffusers.FluxPipeline.from_pretrained(demo_model_dir, local_files_only=True)
    plain.set_progress_bar_config(disable=True)
    assert not np.array_equal(expected, np.asarray(plain(**req.call_kwargs(plain)).images[0]))  # the scales count
    engine = Engine(root, device="cpu")
    for comps in ({}, {"text_encoder_2": False}):
        engine.load(build_policy(comps, 1))
        assert np.array_equal(np.asarray(engine.generate(req).image), expected), comps
        engine.unload()
    engine.close()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_fine_grained_fp8_encoder_on_an_fp8_gpu_is_refused_before_load(demo_model_dir: Path, tmp_path: Path):
    """On a GPU of compute capability 8.9+ transformers keeps the encoder's fp8 weights and runs them with a
    kernel it fetches from the Hub at the first forward: offline that fails after the whole load, so it is
    one line before load; an older GPU dequantizes at load, as on a CPU."""
    root = copy_with(demo_model_dir, tmp_path / "m", "text_encoder_2", per_tensor_inv,
                     {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": None})
    if torch.cuda.get_device_capability() < (8, 9):
        Engine(root, device="cuda").close()  # dequantized at load: nothing to refuse
        return
    with pytest.raises(ConfigError, match="text_encoder_2: transformers runs fine-grained fp8 layers on this GPU"):
        Engine(root, device="cuda")


def test_the_fp8_device_check_refuses_only_where_transformers_keeps_fp8(demo_model_dir: Path, tmp_path: Path):
    root = copy_with(demo_model_dir, tmp_path / "m", "text_encoder_2", per_tensor_inv,
                     {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": None})
    components = discover_model(root).components
    check_fp8_device(components, None)  # a CPU
    check_fp8_device(components, (8, 6))  # an A100-class GPU: transformers dequantizes at load
    with pytest.raises(ConfigError, match="never touches the network"):
        check_fp8_device(components, (9, 0))
    check_fp8_device(discover_model(demo_model_dir).components, (9, 0))  # plain weights: nothing to refuse
