"""Quantized checkpoints: which fp8-with-scale layouts a component folder may hold, judged before any load.

What the installed libraries load from a folder (diffusers 0.42.1, transformers 5.x, read from their
`quantizers/` code and checked by tests/engine/test_quant_layouts.py):
- diffusers builds a quantizer from `config.json`'s `quantization_config` by its `quant_method`. `bfl`
  (fp8r: an F8_E4M3 weight with a float32 per-row `weight_scale`; nvfp4) and `gguf` are read only through
  `from_single_file`: from a folder their config classes refuse the `quant_method` key itself. The others
  (`modelopt`, `torchao`, `quanto`, `sdnq`, `bitsandbytes`, `auto-round`, `nunchaku_lite`) need a package
  of their own, and replace the model's layers with the quantizer's; omni-console streams plain tensors
  only, so a quantized DiT or UNet is refused for DLO (`mode=resident` is plain diffusers' load).
- transformers' fine-grained fp8 (`"quant_method": "fp8"` / `"mxfp8"`: F8_E4M3 weights with
  `weight_scale_inv`, per tensor or per block) needs only accelerate: on a GPU of compute capability
  8.9 or more it keeps the fp8 bytes and their scales in its `FP8Linear` layers, elsewhere it dequantizes
  them at load. An encoder so quantized is built by transformers' own `from_pretrained`, and is staged or
  kept resident as transformers left it, exactly as the plain pipeline holds it.
- scale tensors beside fp8 weights with no `quantization_config` (ComfyUI's `scale_weight`, a stray
  `weight_scale`): both libraries would drop the scales as unexpected keys and compute with the unscaled
  fp8 values, silently wrong, so such a folder is refused.

Torch-free (discovery runs in `plan`, which imports no torch); package presence is asked of
`importlib.util.find_spec`, which imports nothing but parent packages.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelDirError
from ..plain_text import shown

SCALE_SUFFIXES = ("weight_scale", "weight_scale_inv", "weight_scale_2", "scale_weight", "input_scale")
"""Names of per-tensor / per-row / per-block scale tensors sitting beside a quantized `weight`."""

FP8_DTYPES = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})

DIFFUSERS_SINGLE_FILE_ONLY = ("bfl", "gguf")
DIFFUSERS_PACKAGES = {"modelopt": ("modelopt", "nvidia-modelopt"), "torchao": ("torchao", "torchao"),
                      "quanto": ("optimum.quanto", "optimum-quanto"), "sdnq": ("sdnq", "sdnq"),
                      "bitsandbytes": ("bitsandbytes", "bitsandbytes"), "auto-round": ("auto_round", "auto-round"),
                      "nunchaku_lite": ("nunchaku", "nunchaku")}
TRANSFORMERS_FP8 = ("fp8", "mxfp8")


def quant_method(config: dict[str, Any], where: Path) -> str | None:
    """The component's `quantization_config` method (None: not quantized), as the libraries name it."""
    q = config.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ModelDirError(f"{where}: 'quantization_config' must be an object, got {type(q).__name__}")
    if q.get("load_in_8bit") is True or q.get("load_in_4bit") is True:
        return "bitsandbytes"
    method = q.get("quant_method")
    if not isinstance(method, str) or not method:
        raise ModelDirError(f"{where}: 'quantization_config' has no 'quant_method' (the libraries refuse it)")
    return method


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing or broken
        return False


def loadable_reason(library: str | None, method: str) -> str | None:
    """Why the installed library cannot load a `method`-quantized component from a folder (None: it can)."""
    if library == "diffusers":
        if method in DIFFUSERS_SINGLE_FILE_ONLY:
            return (f"diffusers reads a {shown(method)} quantization_config only through from_single_file, not from a "
                    "folder's config.json")
        if method == "bitsandbytes_4bit" or method == "bitsandbytes_8bit":
            method = "bitsandbytes"
        if method not in DIFFUSERS_PACKAGES:
            return (f"{shown(method)} is not a quantization method diffusers loads (it knows "
                    f"{', '.join(sorted((*DIFFUSERS_SINGLE_FILE_ONLY, *DIFFUSERS_PACKAGES)))})")
        module, package = DIFFUSERS_PACKAGES[method]
        if not _installed(module):
            return f"diffusers loads {shown(method)} checkpoints through the {package} package, which is not installed"
        return None
    if library == "transformers":
        if method not in TRANSFORMERS_FP8:
            return (f"omni-console loads transformers encoders quantized with fine-grained fp8 "
                    f"({', '.join(repr(m) for m in TRANSFORMERS_FP8)}) only, not {shown(method)}")
        if not _installed("accelerate"):
            return "transformers loads fp8 checkpoints through the accelerate package, which is not installed"
        return None
    return f"a {library} component with a quantization_config is not loaded by omni-console"


def scaled_fp8_weights(tensors: Iterable[Any]) -> list[str]:
    """Scale tensors that sit beside an fp8 `weight` of the same layer (`TensorInfo`s: `name`, `dtype`)."""
    dtypes = {t.name: t.dtype for t in tensors}
    out: list[str] = []
    for name in dtypes:
        layer, _, leaf = name.rpartition(".")
        if leaf in SCALE_SUFFIXES and dtypes.get(f"{layer}.weight" if layer else "weight") in FP8_DTYPES:
            out.append(name)
    return sorted(out)


def check_quantization(folder: Path, library: str | None, config: dict[str, Any], tensors: Iterable[Any]) -> str | None:
    """Refuse (ModelDirError, one line) a quantized folder the installed libraries cannot load exactly;
    return its quantization method (None: plain weights)."""
    tensors = list(tensors)
    method = quant_method(config, folder / "config.json")
    if method is None:
        scales = scaled_fp8_weights(tensors)
        if scales:
            raise ModelDirError(
                f"{folder}: {len(scales)} fp8 weights carry scale tensors (e.g. {scales[0]}) but config.json has no "
                "quantization_config: diffusers/transformers would drop the scales and compute with wrong weights")
        return None
    why = loadable_reason(library, method)
    if why is not None:
        raise ModelDirError(f"{folder}: {why}")
    return method


FP8_KERNEL_CAPABILITY = (8, 9)
"""From this CUDA compute capability on, transformers keeps fine-grained fp8 layers in fp8 (`FP8Linear`)."""


def check_fp8_device(components: Iterable[Any], capability: tuple[int, int] | None) -> None:
    """Refuse before load (one line) a fine-grained fp8 encoder on a GPU where transformers keeps it fp8:
    its `FP8Linear` layers run a Triton kernel that transformers fetches from the Hugging Face Hub at the
    first forward (`kernels-community/finegrained-fp8`, through the `kernels` package), and omni-console
    never touches the network, so the request would fail after the whole load. On a CPU, or an older GPU,
    transformers dequantizes at load and runs offline. `components`: `ComponentInfo`s."""
    if capability is None or tuple(capability) < FP8_KERNEL_CAPABILITY:
        return
    for c in components:
        if c.library == "transformers" and c.quant_method in TRANSFORMERS_FP8:
            raise ConfigError(
                f"{c.name}: transformers runs fine-grained fp8 layers on this GPU (compute capability "
                f"{capability[0]}.{capability[1]}) with a kernel it downloads from the Hugging Face Hub, and "
                "omni-console never touches the network: use --device cpu, or the encoder without its "
                "quantization_config")
