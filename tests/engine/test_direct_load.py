"""A DiT read straight into place holds exactly what `from_pretrained` gives, or says why it cannot."""

from __future__ import annotations

import json
import shutil
import struct
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from omni_console.engine.direct_load import build_deferred, read_locations
from omni_console.engine.discovery import discover_model
from omni_console.engine.engine import Engine, EngineState
from omni_console.engine.loader import load_component, load_dtype
from omni_console.engine.weights import ModelDirError
from omni_console.offload.deferred_weights import DeferredWeights
from omni_console.offload.events import EventBus, LogEvent
from omni_console.offload.policy import build_policy

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


def _assert_same_module(direct: torch.nn.Module, plain: torch.nn.Module) -> None:
    ours, theirs = dict(direct.named_parameters()), dict(plain.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, t in theirs.items():
        assert ours[name].dtype == t.dtype, name
        assert torch.equal(ours[name], t), name
        assert not ours[name].requires_grad
    buffers, their_buffers = dict(direct.named_buffers()), dict(plain.named_buffers())
    assert buffers.keys() == their_buffers.keys()
    for name, t in their_buffers.items():  # non-persistent ones (rotary tables) are computed, not read
        assert buffers[name].dtype == t.dtype and torch.equal(buffers[name], t), name
    config = getattr(plain.config, "to_dict", lambda: dict(plain.config))()  # transformers or diffusers
    assert getattr(direct.config, "to_dict", lambda: dict(direct.config))() == config
    assert not direct.training


@pytest.mark.parametrize("fixture", FAMILIES)
def test_every_family_dit_reads_straight_into_place_exactly(fixture: str, request: pytest.FixtureRequest) -> None:
    info = _dit(request.getfixturevalue(fixture))
    direct, why, weights = _direct(info)
    assert direct is not None, why
    assert weights.bytes_read == info.nbytes
    _assert_same_module(direct, load_component(info))
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
    _assert_same_module(direct, plain)


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


def test_quantized_config_falls_back(demo_model_dir: Path, tmp_path: Path) -> None:
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
    file = max((root / "transformer").glob("*.safetensors"), key=lambda p: p.stat().st_size)
    with open(file, "r+b") as handle:
        handle.truncate(file.stat().st_size - 4096)
    with pytest.raises(ModelDirError, match=f"{file.name}.*outside the file"):
        engine.load(build_policy(mode="dlo"))
    assert engine.state == EngineState.FAILED and engine.placement is None


def test_a_dit_failing_while_the_encoders_are_read_fails_the_load_and_releases(
        demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_console.engine import loader

    monkeypatch.setattr(loader, "OTHERS_DURING_DIT_BUILD", True)
    root = tmp_path / "demo"
    shutil.copytree(demo_model_dir, root)
    engine = Engine(root, device="cpu", aux_in_place=True)
    file = max((root / "transformer").glob("*.safetensors"), key=lambda p: p.stat().st_size)
    with open(file, "r+b") as handle:
        handle.truncate(file.stat().st_size - 4096)
    with pytest.raises(ModelDirError, match=f"{file.name}.*outside the file"):
        engine.load(build_policy(mode="dlo"))
    assert engine.state == EngineState.FAILED and engine.placement is None and engine.pipe is None
    assert not [t for t in threading.enumerate() if t.name.startswith(("component-load", "arena-register"))]


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


@pytest.mark.parametrize("direct_read,batch_bytes,live,aux,read_ahead,shared", [
    (True, 1, False, False, None, False), (True, 1, True, False, 0, False), (True, 1, False, False, 1, False),
    (False, 2 << 30, False, False, None, False), (True, 2 << 30, True, True, None, False),
    (True, 1, False, True, 0, True), (True, 1, True, True, None, True)])
def test_outputs_match_plain_diffusers_however_the_blocks_were_read(demo_model_dir: Path, monkeypatch, direct_read,
                                                                    batch_bytes, live, aux, read_ahead,
                                                                    shared) -> None:
    import diffusers
    import numpy as np
    from test_engine import oracle_image, request_for

    from omni_console.engine import loader
    from omni_console.offload import arena_fill

    monkeypatch.setattr(arena_fill, "BATCH_BYTES", batch_bytes)  # 1: every block is a batch of its own
    monkeypatch.setattr(arena_fill, "READ_AHEAD_BATCHES", read_ahead)
    monkeypatch.setattr(loader, "SHARE_READERS", shared)  # the DiT and the encoders on one reader pool
    req = request_for("flux")
    expected = oracle_image(demo_model_dir, diffusers.FluxPipeline, req)
    engine = Engine(demo_model_dir, device="cpu", direct_read=direct_read, live_replan=live, aux_in_place=aux)
    engine.load(build_policy({"text_encoder": False}, 1))
    assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    if live:
        engine.replan(build_policy({"text_encoder": False}, 0))
        assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    engine.close()


def _encoders(root: Path):
    return [c for c in discover_model(root).components if c.library == "transformers" and c.files]


@pytest.mark.parametrize("fixture", ["demo_model_dir", "sd3_model_dir", "wan_model_dir"])
def test_transformers_encoders_built_over_an_arena_equal_from_pretrained(fixture: str,
                                                                         request: pytest.FixtureRequest) -> None:
    from omni_console.engine.arena_load import load_into_arena

    encoders = _encoders(request.getfixturevalue(fixture))
    assert encoders
    for info in encoders:
        model, arena, _ = load_into_arena(info, load_dtype(info), DeferredWeights(3), pin=False)
        _assert_same_module(model, load_component(info))
        base, end = arena.tensor.data_ptr(), arena.tensor.data_ptr() + arena.nbytes
        in_place = [p for p in model.parameters() if base <= p.data_ptr() < end]
        assert len(in_place) == len(list(model.parameters()))  # built over the arena, not copied
        arena.close()


class _Recorded:
    """A stand-in for the construction lock that notes when transformers starts building (and can fail)."""

    def __init__(self, order: list[str], fail: bool = False, on_enter: threading.Event | None = None) -> None:
        self.order, self.fail, self.on_enter = order, fail, on_enter

    def __enter__(self) -> None:
        self.order.append("build")
        if self.on_enter is not None:
            self.on_enter.set()
        if self.fail:
            raise RuntimeError("construction failed")

    def __exit__(self, *exc: object) -> None:
        return None


def test_an_encoder_arena_is_page_locked_on_the_registrar_before_its_model_is_built(
        wan_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large encoder takes about as long to build as to page-lock: the page-locking starts on the
    registrar once the bytes are in, not after the build (which held up the DiT's registrations)."""
    from concurrent.futures import ThreadPoolExecutor

    from omni_console.engine import arena_load
    from omni_console.offload.pinned import HostArena

    order: list[str] = []

    class Registrar(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            order.append("submitted")
            return super().submit(fn, *args, **kwargs)

    pin = HostArena.pin
    monkeypatch.setattr(HostArena, "pin", lambda self: (order.append("pin"), pin(self))[1])
    monkeypatch.setattr(arena_load, "MODEL_CONSTRUCTION", _Recorded(order))
    info = _encoders(wan_model_dir)[0]
    with Registrar(1) as registrar:
        model, arena, pinning = arena_load.load_into_arena(info, load_dtype(info), DeferredWeights(2), pin=False,
                                                           registrar=registrar)
        assert pinning is not None
        pinning.result()
    assert order[0] == "submitted" and sorted(order[1:]) == ["build", "pin"]  # beside the build, not after it
    assert arena.pinned == torch.cuda.is_available()
    _assert_same_module(model, load_component(info))
    arena.close()


def test_a_failed_encoder_build_closes_its_arena_only_after_the_page_locking_ends(
        wan_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from omni_console.engine import arena_load
    from omni_console.offload.pinned import HostArena

    order: list[str] = []
    submitted = threading.Event()

    def slow_pin(self: HostArena) -> bool:
        submitted.wait(5)
        threading.Event().wait(0.2)  # still page-locking when the build fails
        order.append("pinned")
        return False

    close = HostArena.close
    monkeypatch.setattr(HostArena, "pin", slow_pin)
    monkeypatch.setattr(HostArena, "close", lambda self: (order.append("closed"), close(self))[1])
    monkeypatch.setattr(arena_load, "MODEL_CONSTRUCTION", _Recorded(order, fail=True, on_enter=submitted))
    info = _encoders(wan_model_dir)[0]
    with ThreadPoolExecutor(1) as registrar, pytest.raises(RuntimeError, match="construction failed"):
        arena_load.load_into_arena(info, load_dtype(info), DeferredWeights(2), pin=False, registrar=registrar)
    assert order[:3] == ["build", "pinned", "closed"]  # the build failed first, the arena closed last


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_t5_keeps_transformers_dtype_rules(wan_model_dir: Path, tmp_path: Path, dtype: torch.dtype) -> None:
    from omni_console.engine.arena_load import load_into_arena

    root = tmp_path / "wan"
    shutil.copytree(wan_model_dir, root)
    info = _encoders(root)[0]
    for file in info.folder.glob("*.safetensors"):
        tensors = load_file(str(file))
        save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}, str(file))
    info = _encoders(root)[0]
    model, arena, _ = load_into_arena(info, load_dtype(info), DeferredWeights(2), pin=False)
    plain = load_component(info)
    assert {t.dtype for t in plain.parameters()} >= {dtype}
    _assert_same_module(model, plain)
    arena.close()


@pytest.mark.parametrize("during_dit_build", [False, True])
def test_encoders_built_beside_the_dit_reads_equal_the_ordered_load(demo_model_dir: Path, during_dit_build: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA load order (encoders and VAE built on a worker while the blocks are read, or already
    while the DiT is built) gives the same modules, dtypes and bytes as building everything in order,
    and says when each part ended."""
    from omni_console.engine import loader

    monkeypatch.setattr(loader, "OTHERS_DURING_DIT_BUILD", during_dit_build)
    ordered = Engine(demo_model_dir, device="cpu", aux_in_place=False)
    overlapped = Engine(demo_model_dir, device="cpu", aux_in_place=True)
    bus_lines = overlapped.bus.subscribe()
    ordered.load(build_policy(mode="dlo"))
    report = overlapped.load(build_policy(mode="dlo"))
    try:
        assert not any("from_pretrained" in getattr(e, "message", "") for e in bus_lines.drain())
        m = report.milestones
        assert {"dits_built", "dit_blocks_read", "dits_placed", "others_built", "pipeline_built"} <= set(m)
        assert m["dits_built"] <= m["dit_blocks_read"] <= m["dits_placed"] <= report.seconds
        for info in ordered.model.components:
            a, b = getattr(ordered.pipe, info.name), getattr(overlapped.pipe, info.name)
            if not isinstance(a, torch.nn.Module):
                continue
            sa, sb = a.state_dict(), b.state_dict()
            assert sa.keys() == sb.keys(), info.name
            for key in sa:
                assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), f"{info.name}.{key}"
    finally:
        ordered.close()
        overlapped.close()


def test_a_vae_read_beside_the_dit_reads_is_read_into_an_arena_that_is_its_master(demo_model_dir: Path) -> None:
    """A diffusers VAE (or encoder) built on the worker is read into one arena, page-locked on the
    registrar: placement uses it as the staged master instead of copying every weight at the end."""
    from concurrent.futures import ThreadPoolExecutor

    from omni_console.engine.loader import start_loading

    model = discover_model(demo_model_dir)
    arenas: dict = {}
    weights = DeferredWeights(2, share_readers=True)
    with ThreadPoolExecutor(1) as registrar, ThreadPoolExecutor(1) as others_on:
        loading = start_loading(model, weights=weights, aux_in_place=True, host_arenas=arenas, registrar=registrar,
                                others_on=others_on)
        weights.materialize_module(loading.dits["transformer"])
        pipe = loading.finish()
    weights.close()
    assert "vae" in arenas and "transformer" not in arenas and len(loading.pinning) == len(arenas)
    # the DiT's weights: views of one mapping (never written where its blocks are), not a tensor each
    dit = pipe.transformer
    assert len({t.untyped_storage().data_ptr() for t in [*dit.parameters(), *dit.buffers()] if t.numel()}) == 1
    arena = arenas["vae"]
    base, end = arena.tensor.data_ptr(), arena.tensor.data_ptr() + arena.nbytes
    vae = pipe.vae
    assert all(base <= t.data_ptr() < end for t in [*vae.parameters(), *vae.buffers()] if t.numel())
    plain = load_component(next(i for i in model.components if i.name == "vae"))
    _assert_same_module(vae, plain)
    for a in arenas.values():
        a.close()


def test_an_encoder_failing_beside_the_dit_reads_fails_the_load_and_releases(demo_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    root = tmp_path / "demo"
    shutil.copytree(demo_model_dir, root)
    engine = Engine(root, device="cpu", aux_in_place=True)
    file = max((root / "text_encoder").glob("*.safetensors"), key=lambda p: p.stat().st_size)
    with open(file, "r+b") as handle:
        handle.truncate(file.stat().st_size - 4096)
    with pytest.raises(ModelDirError, match=f"{file.name}"):
        engine.load(build_policy(mode="dlo"))
    assert engine.state == EngineState.FAILED and engine.placement is None and engine.pipe is None
    assert not [t for t in threading.enumerate() if t.name.startswith(("component-load", "arena-register"))]


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
