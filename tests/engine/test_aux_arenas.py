"""Encoders and VAEs read into arenas of their own: built over them exactly as `from_pretrained` builds
them, page-locked beside their build, and staged from them as they are."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from omni_console.engine.engine import Engine, EngineState
from omni_console.engine.loading.loader import load_component, load_dtype
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.model_dir.weights import ModelDirError
from omni_console.engine.options import EngineOptions
from omni_console.offload.deferred_weights import DeferredWeights
from omni_console.offload.policy import build_policy

sys.path.insert(0, str(Path(__file__).parent))
from load_checks import assert_same_module, cut_short  # noqa: E402


def _encoders(root: Path):
    return [c for c in discover_model(root).components if c.library == "transformers" and c.files]


@pytest.mark.parametrize("fixture", ["demo_model_dir", "sd3_model_dir", "wan_model_dir"])
def test_transformers_encoders_built_over_an_arena_equal_from_pretrained(fixture: str,
                                                                         request: pytest.FixtureRequest) -> None:
    from omni_console.engine.loading.arena_load import load_into_arena

    encoders = _encoders(request.getfixturevalue(fixture))
    assert encoders
    for info in encoders:
        model, arena, _ = load_into_arena(info, load_dtype(info), DeferredWeights(3), pin=False)
        assert_same_module(model, load_component(info))
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

    from omni_console.engine.loading import arena_load
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
    assert_same_module(model, load_component(info))
    arena.close()


def test_a_failed_encoder_build_closes_its_arena_only_after_the_page_locking_ends(
        wan_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from omni_console.engine.loading import arena_load
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
    from omni_console.engine.loading.arena_load import load_into_arena

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
    assert_same_module(model, plain)
    arena.close()


@pytest.mark.slow
def test_encoders_built_beside_the_dit_reads_equal_the_ordered_load(demo_model_dir: Path) -> None:
    """The CUDA load order (encoders and VAE built on a worker while the blocks are read) gives the
    same modules, dtypes and bytes as building everything in order, and says when each part ended."""
    ordered = Engine(demo_model_dir, device="cpu", options=EngineOptions(aux_in_place=False))
    overlapped = Engine(demo_model_dir, device="cpu", options=EngineOptions(aux_in_place=True))
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

    from omni_console.engine.loading.loader import start_loading

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
    assert_same_module(vae, plain)
    for a in arenas.values():
        a.close()


@pytest.mark.slow
@pytest.mark.parametrize(("component", "says"), [("text_encoder", ""), ("transformer", ".*outside the file")])
def test_a_component_failing_while_read_into_arenas_fails_the_load_and_releases(
        demo_model_dir: Path, tmp_path: Path, component: str, says: str) -> None:
    """An encoder failing beside the DiT's reads, or the DiT failing with the encoders read into arenas."""
    root = tmp_path / "demo"
    shutil.copytree(demo_model_dir, root)
    engine = Engine(root, device="cpu", options=EngineOptions(aux_in_place=True))
    file = cut_short(root, component)
    with pytest.raises(ModelDirError, match=f"{file.name}{says}"):
        engine.load(build_policy(mode="dlo"))
    assert engine.state == EngineState.FAILED and engine.placement is None and engine.pipe is None
    assert not [t for t in threading.enumerate() if t.name.startswith(("component-load", "arena-register"))]
