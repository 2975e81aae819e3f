"""Which role a pipeline component plays, from the model's own declarations.

The rules, in order (first match wins), using the component name from `model_index.json` and the
class it declares:
1. No weights (tokenizers, schedulers, processors, feature extractors) → `other`.
2. `vae`: the name starts with `vae` or ends with `_vae`, or the class is an autoencoder
   (`Autoencoder*`, `*VAE*`, `VQModel`).
3. `dit`: a diffusers class named `*Transformer*Model` (Flux, SD3, PixArt, Sana, Wan, HunyuanVideo,
   CogVideoX, LTX, …), or the name is one of the upstream DiT names (`transformer`, `transformer_2`,
   `dit`) with a diffusers model class.
4. `unet`: a diffusers class named `UNet*Model` (SD1.5, SD2, SDXL's `UNet2DConditionModel`, …) or
   `*UNetModel` (DreamLite's `DreamLiteUNetModel`, a `UNet2DConditionModel` with its own blocks).
5. `encoder`: the name starts with `text_encoder`/`image_encoder` or equals `mllm`, or the class is
   a transformers encoder (`*TextModel*`, `*EncoderModel`, `*VisionModel*`, `*Encoder`).
6. Anything else with weights (a controlnet, an adapter) → `other`: placed on the device with the
   pipeline, not staged and not streamed.

The pipeline's denoiser — a `dit` or a `unet` (`DENOISER_ROLES`) — is what DLO streams block by block;
the UNet keeps its own role name so that the plan, `plan --json` and the console never call it a DiT
(vLLM-Omni's DLO streams DiTs only: engine/planning/export.py says so in the plan's gaps).
"""

from __future__ import annotations

import re
from typing import Literal

Role = Literal["dit", "unet", "encoder", "vae", "other"]
DENOISER_ROLES: tuple[Role, ...] = ("dit", "unet")
"""Roles whose block lists DLO streams (never part of the `dlo_offload_components` map)."""

_DIT_NAMES = {"transformer", "transformer_2", "dit", "sr_dit"}
_VAE_CLASS = re.compile(r"^Autoencoder|VAE|^VQModel$", re.IGNORECASE)
_DIT_CLASS = re.compile(r"Transformer.*Model$")
_UNET_CLASS = re.compile(r"^UNet.*Model$|UNetModel$")  # DreamLite's `DreamLiteUNetModel` too
_ENCODER_CLASS = re.compile(r"TextModel|EncoderModel$|VisionModel|Encoder$|ForConditionalGeneration$|Model$")


def classify(name: str, library: str | None, class_name: str | None, has_weights: bool) -> Role:
    """Role of one component (rules in the module docstring)."""
    cls = class_name or ""
    if not has_weights:
        return "other"
    if name.startswith("vae") or name.endswith("_vae") or _VAE_CLASS.search(cls):
        return "vae"
    if library == "diffusers" and (_DIT_CLASS.search(cls) or name in _DIT_NAMES):
        return "dit"
    if library == "diffusers" and _UNET_CLASS.search(cls):
        return "unet"
    if name.startswith(("text_encoder", "image_encoder")) or name == "mllm":
        return "encoder"
    if library == "transformers" and _ENCODER_CLASS.search(cls):
        return "encoder"
    return "other"
