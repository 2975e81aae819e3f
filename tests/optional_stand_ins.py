"""Stand-ins for optional packages some diffusers families need and CI does not install, faithful where the tiny
families' text-prompt path touches them, and set only for the test that asks (a `monkeypatch`).

- torchvision: OmniGen's processor builds image transforms it never calls for a text prompt; Cosmos' transformer
  resizes its padding mask with `transforms.functional.resize(..., NEAREST)`, which for a tensor torchvision runs
  as `F.interpolate(mode="nearest")`.
- cosmos_guardrail: diffusers' Cosmos tests hand the pipeline a `DummyCosmosSafetyChecker` that passes every prompt
  and frame (the real guardrail is a package and gigabytes of weights).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import SimpleNamespace

import torch


class _UncalledTransform:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, value):
        raise AssertionError("a torchvision transform stand-in was called: the test path uses images")


def _resize(image: torch.Tensor, size, interpolation="nearest", **_) -> torch.Tensor:
    assert interpolation == "nearest", interpolation
    batched = image if image.ndim == 4 else image[None]
    out = torch.nn.functional.interpolate(batched, size=list(size), mode="nearest")
    return out if image.ndim == 4 else out[0]


TRANSFORMS = SimpleNamespace(
    Compose=_UncalledTransform, Lambda=_UncalledTransform, ToTensor=_UncalledTransform,
    Normalize=_UncalledTransform, InterpolationMode=SimpleNamespace(NEAREST="nearest"),
    functional=SimpleNamespace(resize=_resize))
"""What the families above use of `torchvision.transforms`."""


def stand_in_for_torchvision(monkeypatch) -> None:
    """Without torchvision: its transforms in OmniGen's processor and Cosmos' transformer, and the processor
    class OmniGen's pipeline binds only when torchvision is installed."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    processor = importlib.import_module("diffusers.pipelines.omnigen.processor_omnigen")
    monkeypatch.setattr(processor, "transforms", TRANSFORMS, raising=False)
    pipeline = importlib.import_module("diffusers.pipelines.omnigen.pipeline_omnigen")
    monkeypatch.setattr(pipeline, "OmniGenMultiModalProcessor", processor.OmniGenMultiModalProcessor, raising=False)
    cosmos = importlib.import_module("diffusers.models.transformers.transformer_cosmos")
    monkeypatch.setattr(cosmos, "transforms", TRANSFORMS, raising=False)


def dummy_cosmos_safety_checker_class() -> type:
    """diffusers' tests/pipelines/cosmos/cosmos_guardrail.py `DummyCosmosSafetyChecker`."""
    from diffusers.configuration_utils import ConfigMixin
    from diffusers.models.modeling_utils import ModelMixin

    class DummyCosmosSafetyChecker(ModelMixin, ConfigMixin):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("_device_tracker", torch.zeros(1, dtype=torch.float32), persistent=False)

        def check_text_safety(self, prompt: str) -> bool:
            return True

        def check_video_safety(self, frames):
            return frames

        @property
        def device(self) -> torch.device:
            return self._device_tracker.device

        @property
        def dtype(self) -> torch.dtype:
            return self._device_tracker.dtype

    return DummyCosmosSafetyChecker


_DUMMY: list[type] = []


def stand_in_for_cosmos_guardrail(monkeypatch) -> type:
    """The guardrail Cosmos' pipelines build when the directory has none, as if cosmos_guardrail were installed."""
    if not _DUMMY:
        _DUMMY.append(dummy_cosmos_safety_checker_class())
    module = importlib.import_module("diffusers.pipelines.cosmos.pipeline_cosmos2_text2image")
    monkeypatch.setattr(module, "CosmosSafetyChecker", _DUMMY[0])
    return _DUMMY[0]
