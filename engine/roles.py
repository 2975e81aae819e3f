"""Which role a pipeline component plays, from the model's own declarations.

The rules, in order (first match wins), using the component name from `model_index.json` and the
class it declares:
1. No weights (tokenizers, schedulers, processors, feature extractors) → `other`.
2. `vae`: the name starts with `vae` or ends with `_vae`, or the class is an autoencoder
   (`Autoencoder*`, `*VAE*`, `VQModel`).
3. `dit`: a diffusers class named `*Transformer*Model` (Flux, SD3, PixArt, Sana, Wan, HunyuanVideo,
   CogVideoX, LTX, …), or the name is one of the upstream DiT names (`transformer`, `transformer_2`,
   `dit`) with a diffusers model class.
4. `encoder`: the name starts with `text_encoder`/`image_encoder` or equals `mllm`, or the class is
   a transformers encoder (`*TextModel*`, `*EncoderModel`, `*VisionModel*`, `*Encoder`).
5. Anything else with weights (a UNet, a controlnet, an adapter) → `other`: placed on the device
   with the pipeline, not staged and not streamed (DLO streams DiT blocks only).
"""

from __future__ import annotations

import re
from typing import Literal

Role = Literal["dit", "encoder", "vae", "other"]

_DIT_NAMES = {"transformer", "transformer_2", "dit", "sr_dit"}
_VAE_CLASS = re.compile(r"^Autoencoder|VAE|^VQModel$", re.IGNORECASE)
_DIT_CLASS = re.compile(r"Transformer.*Model$")
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
    if name.startswith(("text_encoder", "image_encoder")) or name == "mllm":
        return "encoder"
    if library == "transformers" and _ENCODER_CLASS.search(cls):
        return "encoder"
    return "other"
