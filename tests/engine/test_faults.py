"""Faults mid-request: the engine fails one request cleanly and the next one is exact.

Run on the CPU in the suite and on the GPU machine (`-m cuda`): an out-of-memory while staging an
encoder is retried once by the stager, then the text-encoding phase once by the request's OOM guard,
and then fails with memory released; an exception inside a streamed DiT
block's hook mid-forward leaves the engine ready with device and pinned memory at their level
before the request, and the next request is bit-identical to a clean run; NVML failing mid-run
turns the NVML group to "unavailable: reason" without disturbing the run.
"""

from __future__ import annotations

import gc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omni_console.console.telemetry_text import format_unavailable
from omni_console.engine.engine import Engine, EngineState
from omni_console.engine.events import OomStepDown
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import OomRetry, TelemetryEvent
from omni_console.offload.pinned import pinned_bytes_held
from omni_console.offload.policy import build_policy
from omni_console.offload.telemetry import NvmlSource, TelemetrySampler

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
]
REQUEST = GenerateRequest(prompt="a red fox", steps=2, height=64, width=64, seed=5,
                          extra={"max_sequence_length": 32})


def _device_level(device: str) -> tuple[int, int]:
    """(allocated device bytes, pinned bytes held) after collecting garbage."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(), pinned_bytes_held()
    return 0, pinned_bytes_held()


@pytest.fixture
def clean_image(demo_model_dir: Path, device: str) -> np.ndarray:
    engine = Engine(demo_model_dir, device=device)
    engine.load(build_policy({}, 1))
    image = np.asarray(engine.generate(REQUEST).image)
    engine.close()
    return image


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_oom_while_staging_is_retried_once_then_fails_with_memory_released(demo_model_dir: Path, device: str,
                                                                           clean_image: np.ndarray):
    engine = Engine(demo_model_dir, device=device)
    sub = engine.bus.subscribe()
    engine.load(build_policy({}, 1))
    stager = engine.placement.stagers["text_encoder_2"]
    calls = []

    def out_of_memory(nbytes: int, dev: torch.device) -> torch.Tensor:
        calls.append(nbytes)
        raise torch.OutOfMemoryError(f"injected: cannot allocate {nbytes} bytes")

    level = _device_level(device)
    working = stager.allocate
    stager.allocate = out_of_memory
    with pytest.raises(torch.OutOfMemoryError, match="again in text encoding .text_encoder_2.*injected"):
        engine.generate(REQUEST)
    events = sub.drain()
    retries = [e for e in events if isinstance(e, OomRetry)]
    assert [r.attempt for r in retries] == [1, 1] and retries[0].component == "text_encoder_2"
    # the stager's own retry, then the request's phase retried once (engine/running/oom_guard.py), again with one
    assert len(calls) == 4
    assert [e.phase for e in events if isinstance(e, OomStepDown)] == ["text_encoding"]
    assert engine.state == EngineState.READY and not stager.loaded
    assert _device_level(device) == level
    stager.allocate = working  # the fault is gone: the next request is exact
    assert np.array_equal(np.asarray(engine.generate(REQUEST).image), clean_image)
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_exception_in_a_streamed_block_hook_leaves_engine_ready_and_next_request_exact(
        demo_model_dir: Path, device: str, clean_image: np.ndarray):
    engine = Engine(demo_model_dir, device=device)
    engine.load(build_policy({}, 1))
    streamer = engine.placement.streamer
    engine.generate(REQUEST)  # the scheduler keeps its timesteps and sigmas on the device between requests
    level = _device_level(device)
    block = engine.pipe.transformer.single_transformer_blocks[1]  # mid-forward: streamed, not the first
    fired = []

    def fail_once(_module, _args, _kwargs):
        if not fired:
            fired.append(True)
            raise RuntimeError("injected fault in a streamed block hook")

    handle = block.register_forward_pre_hook(fail_once, with_kwargs=True, prepend=True)
    with pytest.raises(RuntimeError, match="injected fault"):
        engine.generate(REQUEST)
    handle.remove()
    assert fired and engine.state == EngineState.READY
    assert _device_level(device) == level
    assert streamer.attached
    assert np.array_equal(np.asarray(engine.generate(REQUEST).image), clean_image)
    assert _device_level(device) == level
    engine.close()


class _FailingNvml:
    """Delegates to a working NVML until `lost` is set, then every device call raises."""

    NVML_PCIE_UTIL_RX_BYTES, NVML_PCIE_UTIL_TX_BYTES = 0, 1

    def __init__(self, real=None) -> None:
        self.real, self.lost = real, False

    def __getattr__(self, name: str):
        if name.startswith("nvmlDevice") and name != "nvmlDeviceGetHandleByIndex":
            def call(*args, **kwargs):
                if self.lost:
                    raise RuntimeError("GPU is lost")
                if self.real is not None:
                    return getattr(self.real, name)(*args, **kwargs)
                return _FAKE[name](*args, **kwargs)
            return call
        if self.real is not None:
            return getattr(self.real, name)
        return _FAKE.get(name, lambda *a, **k: None)


_FAKE = {
    "nvmlDeviceGetHandleByIndex": lambda i: object(),
    "nvmlDeviceGetName": lambda h: "Fake GPU",
    "nvmlDeviceGetMemoryInfo": lambda h, version=None: SimpleNamespace(total=100, used=40, free=60, reserved=1),
    "nvmlDeviceGetPcieThroughput": lambda h, which: 1,
    "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=1, memory=1),
}


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_nvml_failing_mid_run_turns_its_group_unavailable_and_the_run_goes_on(
        demo_model_dir: Path, device: str, clean_image: np.ndarray):
    real = None
    if device == "cuda":
        import pynvml

        real = pynvml
    nvml = _FailingNvml(real)
    engine = Engine(demo_model_dir, device=device)
    sub = engine.bus.subscribe()
    sampler = TelemetrySampler(NvmlSource(0, nvml=nvml, pcie=False), bus=engine.bus, hz=50)
    engine.load(build_policy({}, 1))
    first = sampler.sample_now(publish=True)
    assert first.nvml.unavailable is None and first.nvml.total
    forwards = []

    def lose_the_gpu_in_step_two(_module, _args):
        forwards.append(1)
        if len(forwards) == 2:
            nvml.lost = True
            sampler.sample_now(publish=True)  # a sample lands while the request runs

    handle = engine.pipe.transformer.register_forward_pre_hook(lose_the_gpu_in_step_two)
    sampler.start()
    result = engine.generate(REQUEST)
    sampler.stop()
    handle.remove()
    assert np.array_equal(np.asarray(result.image), clean_image)
    groups = [e.snapshot.nvml for e in sub.drain() if isinstance(e, TelemetryEvent)]
    assert groups[0].unavailable is None
    assert groups[-1].unavailable is not None and "GPU is lost" in groups[-1].unavailable
    assert "unavailable: " in format_unavailable(groups[-1].unavailable)
    engine.close()
