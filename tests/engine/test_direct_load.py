"""A DiT read straight into place holds exactly what `from_pretrained` gives, or says why it cannot."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from omni_console.engine.engine import Engine, EngineState
from omni_console.engine.loading.direct_load import build_deferred, read_locations
from omni_console.engine.loading.loader import load_component, load_dtype
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.model_dir.weights import ModelDirError
from omni_console.engine.options import EngineOptions
from omni_console.offload.deferred_weights import DeferredWeights
from omni_console.offload.events import EventBus, LogEvent
from omni_console.offload.policy import build_policy

sys.path.insert(0, str(Path(__file__).parent))
from load_checks import assert_same_module, cut_short  # noqa: E402

FAMILIES = ["demo_model_dir", "sd3_model_dir", "pixart_model_dir", "wan_model_dir", "ltx_model_dir",
            "cogvideox_model_dir"]


def _dit(root: Path):
    return next(c for c in discover_model(root).components if c.role == "dit")


def _direct(info) -> tuple[torch.nn.Module | None, str, DeferredWeights]:
    weights = DeferredWeights(threads=3)
    module, why = build_deferred(info, load_dtype(info), weights)
    if module is not None:
        weights.materialize_module(module)
        assert weights.pending == 0
    return module, why, weights


@pytest.mark.parametrize("fixture", FAMILIES)
def test_every_family_dit_reads_straight_into_place_exactly(fixture: str, request: pytest.FixtureRequest) -> None:
    info = _dit(request.getfixturevalue(fixture))
    direct, why, weights = _direct(info)
    assert direct is not None, why
    assert weights.bytes_read == info.nbytes
    assert_same_module(direct, load_component(info))
    weights.close()


def _to_bf16(root: Path, folder: str) -> None:
    for file in (root / folder).glob("*.safetensors"):
        tensors = load_file(str(file))
        save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}, str(file))


def test_bf16_checkpoint_keeps_fp32_modules_in_float32_like_diffusers(wan_model_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "wan"
    shutil.copytree(wan_model_dir, root)
    _to_bf16(root, "transformer")
    info = _dit(root)
    direct, why, _ = _direct(info)
    assert direct is not None, why
    plain = load_component(info)
    dtypes = {t.dtype for t in plain.parameters()}
    assert dtypes == {torch.bfloat16, torch.float32}  # Wan keeps some modules in float32: converted on read
    assert_same_module(direct, plain)


def _rewrite(root: Path, change) -> None:
    for file in (root / "transformer").glob("*.safetensors"):
        save_file(change(load_file(str(file))), str(file))


def test_renamed_tensor_falls_back_and_says_which(demo_model_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "demo"
    shutil.copytree(demo_model_dir, root)
    victim = next(iter(load_file(str(next((root / "transformer").glob("*.safetensors"))))))
    _rewrite(root, lambda t: {("old_" + k if k == victim else k): v for k, v in t.items()})
    module, why, _ = _direct(_dit(root))
    assert module is None and victim in why


def test_quantized_config_falls_back(demo_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    from omni_console.engine.model_dir import quant_layouts

    monkeypatch.setattr(quant_layouts, "_installed", lambda module: True)  # discovery: as if bitsandbytes were
    root = tmp_path / "demo"
    shutil.copytree(demo_model_dir, root)
    config = root / "transformer" / "config.json"
    data = json.loads(config.read_text())
    data["quantization_config"] = {"quant_method": "bitsandbytes"}
    config.write_text(json.dumps(data))
    module, why, _ = _direct(_dit(root))
    assert module is None and "quantized" in why


def test_engine_load_reads_the_dit_in_place_and_reports_it(demo_model_dir: Path) -> None:
    bus = EventBus()
    events = bus.subscribe()
    engine = Engine(demo_model_dir, device="cpu", bus=bus)
    report = engine.load(build_policy(mode="dlo"))
    lines = [e.message for e in events.drain() if isinstance(e, LogEvent)]
    assert lines and not any("from_pretrained" in line for line in lines)
    assert report.phases["read"] > 0
    engine.close()


def test_a_file_truncated_after_discovery_fails_the_load_and_releases(demo_model_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "demo"
    shutil.copytree(demo_model_dir, root)
    engine = Engine(root, device="cpu")
    file = cut_short(root, "transformer")
    with pytest.raises(ModelDirError, match=f"{file.name}.*outside the file"):
        engine.load(build_policy(mode="dlo"))
    assert engine.state == EngineState.FAILED and engine.placement is None


def _header_file(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_read_locations_gives_each_tensors_byte_range(tmp_path: Path) -> None:
    file = tmp_path / "w.safetensors"
    save_file({"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)},
              str(file))
    found = read_locations(file)
    raw = file.read_bytes()
    a = found["a"]
    assert (a.dtype, a.shape, a.nbytes) == (torch.float32, (2, 3), 24)
    assert torch.equal(torch.frombuffer(bytearray(raw[a.offset:a.offset + a.nbytes]), dtype=torch.float32),
                       torch.arange(6, dtype=torch.float32))
    assert found["b"].dtype == torch.bfloat16


@pytest.mark.parametrize("header", [
    b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 64]}}',  # past the end of the file
    b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}',  # wrong size for its shape
    b'{"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 4]}}',
    b'{"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}',
    b'{"a": {"dtype": "F32"}}',
    b'[1, 2]',
    b'{not json',
])
def test_hostile_headers_are_one_model_dir_error(tmp_path: Path, header: bytes) -> None:
    with pytest.raises(ModelDirError):
        read_locations(_header_file(tmp_path / "w.safetensors", header, b"\0" * 16))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=64))
def test_any_header_bytes_give_locations_or_one_error(tmp_path_factory: pytest.TempPathFactory, header: bytes,
                                                      data: bytes) -> None:
    path = _header_file(tmp_path_factory.mktemp("h") / "w.safetensors", header, data)
    try:
        found = read_locations(path)
    except ModelDirError:
        return
    size = path.stat().st_size
    for t in found.values():
        assert 8 + len(header) <= t.offset and t.offset + t.nbytes <= size


@pytest.mark.slow
@pytest.mark.parametrize("direct_read,batch_bytes,live,aux,read_ahead,shared", [
    (True, 1, False, False, None, False), (True, 1, True, False, 0, False), (True, 1, False, False, 1, False),
    (False, 2 << 30, False, False, None, False), (True, 2 << 30, True, True, None, False),
    (True, 1, False, True, 0, True), (True, 1, True, True, None, True)])
def test_outputs_match_plain_diffusers_however_the_blocks_were_read(demo_model_dir: Path, direct_read,
                                                                    batch_bytes, live, aux, read_ahead,
                                                                    shared) -> None:
    import diffusers
    import numpy as np
    from test_engine import oracle_image, request_for

    req = request_for("flux")
    expected = oracle_image(demo_model_dir, diffusers.FluxPipeline, req)
    options = EngineOptions(direct_read=direct_read, live_replan=live, aux_in_place=aux,
                            batch_bytes=batch_bytes,  # 1: every block is a batch of its own
                            read_ahead_batches=read_ahead,
                            share_readers=shared)  # the DiT and the encoders on one reader pool
    engine = Engine(demo_model_dir, device="cpu", options=options)
    engine.load(build_policy({"text_encoder": False}, 1))
    assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    if live:
        engine.replan(build_policy({"text_encoder": False}, 0))
        assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    engine.close()


@pytest.mark.slow
def test_classes_imported_before_the_load_are_not_imported_again(demo_model_dir: Path) -> None:
    cold = Engine(demo_model_dir, device="cpu")
    report = cold.load(build_policy(mode="dlo"))
    assert report.milestones["classes_imported"] <= report.milestones["dits_built"]
    cold.close()
    prepared = Engine(demo_model_dir, device="cpu")
    assert prepared.prepare() >= 0 and prepared.prepare() == 0.0  # once
    report = prepared.load(build_policy(mode="dlo"))
    assert "classes_imported" not in report.milestones
    prepared.close()


@pytest.mark.slow
def test_collection_is_paused_during_the_load_and_resumes_after(demo_model_dir: Path, monkeypatch) -> None:
    import gc

    from omni_console.engine import engine as engine_mod

    seen: list[bool] = []
    real = engine_mod.start_loading

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_mod, "start_loading", spy)
    engine = Engine(demo_model_dir, device="cpu")
    assert gc.isenabled()
    engine.load(build_policy(mode="dlo"))
    assert seen == [False] and gc.isenabled()
    engine.unload()
    truncated = Engine(demo_model_dir, device="cpu")
    monkeypatch.setattr(engine_mod, "start_loading", lambda *a, **k: (_ for _ in ()).throw(ModelDirError("x")))
    with pytest.raises(ModelDirError):
        truncated.load(build_policy(mode="dlo"))
    assert gc.isenabled()
    engine.close()
