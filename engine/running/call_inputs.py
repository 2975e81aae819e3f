"""Inputs a pipeline call needs, and numbers it must never get — checked before load.

- A pipeline whose `__call__` has a parameter without a default (WanAnimate: `pose_video`,
  `face_video`) fails only after every weight has loaded when the request leaves it out: refused,
  naming each one and how (or that it cannot) be given here. So does an image-conditioned pipeline
  whose `image` defaults to None but that cannot run without one (diffusers names them: `…Img2Img…`,
  `…ImageToVideo…`, `…I2V…` but not text-or-image `…TI2V…`, `…InstructPix2Pix…`, `…Edit…`, `…Upscale…`, …;
  an inpainting or fill one needs its `mask_image` too, LTX-2's second stages a first stage's `video`).
- A non-finite number in a `--param` value: `param_syntax.check_finite`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping

from ..errors import ConfigError

_NEEDS_IMAGE = re.compile(r"Img2Img|ImageToVideo|Image2Video|(?<!T)I2V|I2I|Inpaint|Pix2Pix|Depth2Img|Upscale|"
                          r"ImageVariation|PaintByExample|Edit|Layered|Fill")
"""diffusers' names for pipelines that condition on an image, with or without a default of None for it."""
_NEEDS_MASK = re.compile(r"Inpaint|Fill")
_NEEDS_VIDEO = re.compile(r"LatentUpsample|TemporalRefine")
"""Second-stage video pipelines (LTX-2's latent upsampler and temporal refiner) run on a first stage's video."""


def _needed(pipeline: str, signature: Mapping[str, inspect.Parameter]) -> set[str]:
    """Parameters with a default that the pipeline still cannot run without (None is not an image)."""
    needed = set()
    if _NEEDS_IMAGE.search(pipeline) and "image" in signature:
        needed.add("image")
    if _NEEDS_MASK.search(pipeline) and "mask_image" in signature:
        needed.add("mask_image")
    if _NEEDS_VIDEO.search(pipeline):  # the first stage's video, or its latents (LTX-2 DFR's temporal refiner)
        needed |= {"video"} & set(signature) or {"latents", "keyframes_latents"} & set(signature)
    return needed


def _passable(parameter: inspect.Parameter) -> bool:
    """Whether a `--param` JSON value can be what the parameter takes (a video or a PIL image cannot)."""
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        return True
    text = str(annotation)
    return not any(word in text for word in ("Image", "Tensor", "ndarray", "PipelineImageInput"))


def check_required_inputs(pipeline: str, signature: Mapping[str, inspect.Parameter], given: set[str],
                          names: Mapping[str, str]) -> None:
    """Refuse a request that leaves out a parameter the pipeline's call has no default for.

    `given`: the pipeline keywords the request sets (its options and params)."""
    needed = _needed(pipeline, signature)
    missing = [name for name, p in signature.items()
               if (p.default is inspect.Parameter.empty or name in needed) and name not in given and name != "prompt"]
    if not missing:
        return
    hints = []
    for name in missing:
        if name == "image":
            hints.append(f"{name} (pass {names['image']} FILE)")
        elif _passable(signature[name]):
            hints.append(f"{name} (pass {names['param']} {name}=VALUE)")
        else:
            hints.append(f"{name} (cannot be given here)")
    tail = "; not supported here" if any("cannot" in hint for hint in hints) else ""
    why = "it cannot run without" if set(missing) <= needed else "its call has no default for"
    raise ConfigError(f"{pipeline} needs {', '.join(hints)}: {why} {'them' if len(missing) > 1 else 'it'}{tail}")
